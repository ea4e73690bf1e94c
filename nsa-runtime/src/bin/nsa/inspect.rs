//! `nsa inspect <id>`: where the source is, what ptxas said, PTX/SASS on request.

use clap::Args;
use nsa_kernels::config::closest_names;
use nsa_kernels::{render, KernelSpec, Target, Toolchain};
use nsa_runtime::cache::prebuild::Caches;
use nsa_runtime::jit::nvrtc::NvrtcCompiler;
use nsa_runtime::jit::ResourceUsage;
use nsa_runtime::{Error, Result};

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Kernel id, as `nsa list` prints it (e.g. kv_store.fp8_656.sm_90a).
    pub id: String,
    /// Print the PTX (NVIDIA targets).
    #[arg(long)]
    pub ptx: bool,
    /// Print the SASS (needs `cuobjdump` or `nvdisasm` from a CUDA toolkit on PATH).
    #[arg(long)]
    pub sass: bool,
    /// Print the rendered source.
    #[arg(long)]
    pub source: bool,
}

pub fn run(args: InspectArgs) -> Result<()> {
    let spec = KernelSpec::from_id(&args.id).ok_or_else(|| {
        let ids: Vec<String> = Target::ALL.into_iter().flat_map(KernelSpec::all_for).map(|s| s.id()).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        Error::InvalidArgument {
            field: "id",
            value: args.id.clone(),
            expected: format!(
                "a kernel id; the closest are {}; `nsa list` prints a config's whole set (with --preset/--config)",
                closest_names(&args.id, &ids, 5).join(", ")
            ),
        }
    })?;
    // Refuse what cannot be done before printing anything.
    if spec.target.toolchain() != Toolchain::Nvrtc {
        for (flag, asked) in [("--ptx", args.ptx), ("--sass", args.sass)] {
            if asked {
                return Err(Error::InvalidArgument {
                    field: if flag == "--ptx" { "--ptx" } else { "--sass" },
                    value: spec.id(),
                    expected: format!("a kernel of an NVIDIA target (this one is for {}; use --source)", spec.target),
                });
            }
        }
    }
    let kernel = render(&spec)?;
    let cached = Caches::for_specs(&[spec])?.get(&spec)?;
    println!("id:        {}", kernel.id);
    println!("symbol:    {}", kernel.symbol);
    println!("template:  templates/{}", spec.template());
    match &cached.source_path {
        Some(p) => println!("source:    {}", p.display()),
        None => println!("source:    (no writable disk cache; use --source)"),
    }
    println!("key:       {}", cached.key_digest);
    println!("image:     {} bytes ({:?})", cached.image.bytes.len(), cached.image.kind);
    println!("resources: {}", describe_resources(&cached.image.resources));
    println!("launch:    {} threads a block, {} bytes dynamic smem", spec.block_threads(), spec.dynamic_smem_bytes());
    if args.source {
        println!("\n{}", kernel.source);
    }
    if args.ptx {
        println!("\n{}", NvrtcCompiler::new()?.ptx(&kernel)?);
    }
    if args.sass {
        let dir = tempfile::tempdir().map_err(Error::io(std::env::temp_dir()))?;
        let cubin = dir.path().join(format!("{}.cubin", kernel.id));
        std::fs::write(&cubin, &cached.image.bytes).map_err(Error::io(&cubin))?;
        let out = ["cuobjdump", "nvdisasm"]
            .iter()
            .find_map(|tool| {
                let flag = if *tool == "cuobjdump" { "-sass" } else { "-c" };
                std::process::Command::new(tool).arg(flag).arg(&cubin).output().ok().filter(|o| o.status.success())
            })
            .ok_or_else(|| {
                Error::Other("--sass needs cuobjdump or nvdisasm (CUDA toolkit) on PATH; neither ran".into())
            })?;
        println!("\n{}", String::from_utf8_lossy(&out.stdout));
    }
    Ok(())
}

/// "64 registers, 1024 bytes static smem, no spills" (what ptxas reported).
fn describe_resources(r: &ResourceUsage) -> String {
    let known = |v: Option<u32>, what: &str| v.map_or(format!("{what} not reported"), |v| format!("{v} {what}"));
    let spills = match (r.spill_store_bytes, r.spill_load_bytes) {
        (Some(0), Some(0)) => "no spills".to_string(),
        (Some(s), Some(l)) => format!("spills: {s} bytes stored, {l} bytes loaded"),
        _ => "spills not reported".to_string(),
    };
    format!("{}, {}, {spills}", known(r.registers, "registers"), known(r.smem_bytes, "bytes static smem"))
}
