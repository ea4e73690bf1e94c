//! Offline HIP compile of every gfx942 kernel with clang (no GPU, no ROCm needed).
//!
//! Missing clang is a failure with the install hint, not a skip, unless
//! `NSA_SKIP_HIP=1` is set (then each test prints a loud SKIPPED line and returns).

use nsa_kernels::{render, KernelSpec, OutputKind, Target};
use nsa_runtime::jit::clang_hip::{self, ClangHipCompiler};
use nsa_runtime::jit::Compiler;
use nsa_runtime::Error;
use std::process::Command;

fn compiler() -> Option<ClangHipCompiler> {
    match ClangHipCompiler::new() {
        Ok(c) => Some(c),
        Err(e) if std::env::var("NSA_SKIP_HIP").as_deref() == Ok("1") => {
            eprintln!("\n!!!!!!!! SKIPPED: HIP offline compile tests (NSA_SKIP_HIP=1): {e} !!!!!!!!\n");
            None
        }
        Err(e) => panic!(
            "clang for HIP/gfx942 not available: {e}\n\
             (install it, e.g. `apt-get install clang-19 lld-19`, or set NSA_SKIP_HIP=1 to skip these tests)"
        ),
    }
}

/// Independent of the compiler's own check: raw header bytes, and llvm-readelf when present.
fn assert_amdgpu_elf_exporting(bytes: &[u8], symbol: &str, id: &str) {
    assert!(!bytes.is_empty(), "{id}: empty image");
    assert_eq!(&bytes[..4], b"\x7fELF", "{id}: not an ELF file");
    assert_eq!(bytes[4], 2, "{id}: not ELF64");
    let machine = u16::from_le_bytes([bytes[18], bytes[19]]);
    assert_eq!(machine, clang_hip::EM_AMDGPU, "{id}: ELF machine is not AMDGPU");
    let e_type = u16::from_le_bytes([bytes[16], bytes[17]]);
    assert_eq!(e_type, 3, "{id}: not a linked (ET_DYN) code object");
    assert!(bytes.windows(symbol.len()).any(|w| w == symbol.as_bytes()), "{id}: symbol `{symbol}` not in the image");

    let info = clang_hip::inspect_code_object(bytes).unwrap_or_else(|e| panic!("{id}: {e}"));
    assert_eq!(info.mach(), clang_hip::EF_AMDGPU_MACH_GFX942, "{id}: not gfx942");
    assert!(info.exports_kernel(symbol), "{id}: `{symbol}` not exported: {:?}", info.exports);

    for readelf in ["llvm-readelf-19", "llvm-readelf"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.hsaco");
        std::fs::write(&path, bytes).unwrap();
        let Ok(out) = Command::new(readelf).arg("-h").arg("--dyn-syms").arg(&path).output() else {
            continue;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{id}: {readelf} failed: {text}");
        assert!(text.contains("EM_AMDGPU"), "{id}: {readelf}: machine is not AMDGPU:\n{text}");
        assert!(text.contains("gfx942"), "{id}: {readelf}: not gfx942:\n{text}");
        let exported = text.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 8 && f[7] == symbol && f[3] == "FUNC" && f[4] == "GLOBAL"
        });
        assert!(exported, "{id}: {readelf}: `{symbol}` not a global function:\n{text}");
        break;
    }
}

#[test]
fn every_gfx942_kernel_compiles_to_an_amdgpu_code_object() {
    let Some(cc) = compiler() else { return };
    println!("using {} ({})", cc.clang_path().display(), cc.identity().version);
    let specs = KernelSpec::all_for(Target::Gfx942);
    assert!(!specs.is_empty());
    for spec in specs {
        let kernel = render(&spec).unwrap_or_else(|e| panic!("{e}"));
        let image = cc.compile(&kernel).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(image.kind, OutputKind::HsaCodeObject);
        assert_amdgpu_elf_exporting(&image.bytes, &spec.symbol(), &spec.id());
        let r = image.resources;
        assert!(r.registers.is_some_and(|v| v > 0), "{}: no VGPR count parsed:\n{}", spec, image.log);
        assert_eq!(r.spill_store_bytes, Some(0), "{spec}: uses scratch:\n{}", image.log);
        println!(
            "{spec}: {} bytes, VGPRs {:?}, LDS {:?}, scratch/lane {:?}",
            image.bytes.len(),
            r.registers,
            r.smem_bytes,
            r.spill_store_bytes
        );
    }
}

#[test]
fn images_do_not_depend_on_the_temp_dir() {
    let Some(cc) = compiler() else { return };
    let spec = KernelSpec::all_for(Target::Gfx942)[0];
    let kernel = render(&spec).unwrap();
    let a = cc.compile(&kernel).unwrap();
    let b = cc.compile(&kernel).unwrap();
    assert_eq!(a.bytes, b.bytes, "two compiles of {spec} differ");
    assert_eq!(a.log, b.log, "logs of two compiles of {spec} differ");
    let opts = cc.options(Target::Gfx942);
    assert!(opts.iter().any(|o| o == "--offload-arch=gfx942"));
    assert!(
        !opts.iter().any(|o| o.contains(&*std::env::temp_dir().to_string_lossy())),
        "options hold a temp path: {opts:?}"
    );
    assert_eq!(cc.identity().name, "clang-hip");
}

#[test]
fn a_broken_kernel_reports_a_compile_error_with_the_dumped_source() {
    let Some(cc) = compiler() else { return };
    let spec = KernelSpec::all_for(Target::Gfx942)[0];
    let mut kernel = render(&spec).unwrap();
    kernel.id = "hip_offline_test.broken".into();
    kernel.source.push_str("\nthis_is_not_valid_cxx;\n");
    match cc.compile(&kernel) {
        Err(Error::Compile { id, source_path, log, options, .. }) => {
            assert_eq!(id, "hip_offline_test.broken");
            let dumped =
                std::fs::read_to_string(&source_path).unwrap_or_else(|e| panic!("dumped source {source_path}: {e}"));
            assert_eq!(dumped, kernel.source);
            assert!(log.contains("this_is_not_valid_cxx"), "log: {log}");
            assert!(log.contains(&source_path), "log does not point at the dump: {log}");
            assert!(options.contains(&source_path), "options: {options}");
        }
        Err(e) => panic!("expected Error::Compile, got {e}"),
        Ok(_) => panic!("a broken kernel compiled"),
    }
}

#[test]
fn nvidia_targets_are_refused() {
    let Some(cc) = compiler() else { return };
    let spec = KernelSpec::all_for(Target::Sm90a)[0];
    let kernel = render(&spec).unwrap();
    assert!(cc.compile(&kernel).is_err());
}
