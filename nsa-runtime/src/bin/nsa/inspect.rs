//! `nsa inspect <id>`: where the source is, what ptxas said, PTX/SASS on request.

use crate::compile::Caches;
use clap::Args;
use nsa_kernels::{render, KernelSpec, Target, Toolchain};
use nsa_runtime::jit::nvrtc::NvrtcCompiler;
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
        Error::InvalidArgument { field: "id", value: args.id.clone(), expected: format!("one of: {}", ids.join(", ")) }
    })?;
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
    println!("resources: {:?}", cached.image.resources);
    println!("launch:    {} threads a block, {} bytes dynamic smem", spec.block_threads(), spec.dynamic_smem_bytes());
    if args.source {
        println!("\n{}", kernel.source);
    }
    if args.ptx {
        if spec.target.toolchain() != Toolchain::Nvrtc {
            return Err(Error::InvalidArgument {
                field: "--ptx",
                value: spec.id(),
                expected: format!("a kernel of an NVIDIA target (this one is for {}; use --source)", spec.target),
            });
        }
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
