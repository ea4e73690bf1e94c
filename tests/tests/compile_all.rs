//! Compile-all: every NVIDIA variant of the snapshot matrix goes through NVRTC to a
//! CUBIN for sm_90a and sm_100a, with no GPU. Fails (never skips) without NVRTC:
//! run the tests through `bash .ci/env.sh`, which provisions it.

use nsa_kernels::{kernel_set, render, KernelSpec, NsaConfig, Target};
use nsa_runtime::jit::nvrtc::{function_spills, NvrtcCompiler};
use nsa_runtime::jit::Compiler;
use std::collections::BTreeSet;

fn matrix() -> BTreeSet<KernelSpec> {
    let mut specs = BTreeSet::new();
    for preset in ["deepseek-v3.2", "deepseek-v3.2-tp8"] {
        for cache in ["bf16", "fp8"] {
            let mut cfg = NsaConfig::preset(preset).unwrap();
            cfg.kv_cache = cache.parse().unwrap();
            specs.extend(kernel_set(&cfg));
        }
    }
    for target in Target::NVIDIA {
        specs.extend(KernelSpec::all_for(target));
    }
    specs
}

/// An ELF whose header says machine EM_CUDA (190).
fn assert_cubin(bytes: &[u8], id: &str) {
    assert!(bytes.len() > 64 && &bytes[..4] == b"\x7fELF", "{id}: not an ELF image");
    let machine = u16::from_le_bytes([bytes[18], bytes[19]]);
    assert_eq!(machine, 190, "{id}: ELF machine {machine} is not EM_CUDA");
}

#[test]
fn every_nvidia_variant_compiles_to_cubin() {
    let compiler = NvrtcCompiler::new().unwrap_or_else(|e| panic!("{e}"));
    let specs = matrix();
    assert!(specs.iter().any(|s| s.target == Target::Sm90a) && specs.iter().any(|s| s.target == Target::Sm100a));
    // NSA_COMPILE_ALL_DUMP=dir: also write each rendered source and CUBIN there
    // (`<id>.cu`, `<id>.cubin`), to compare two builds' SASS without a GPU.
    let dump = std::env::var_os("NSA_COMPILE_ALL_DUMP").map(std::path::PathBuf::from);
    if let Some(dir) = &dump {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    }
    let mut spills = Vec::new();
    for spec in specs {
        let kernel = render(&spec).unwrap();
        let image = compiler.compile(&kernel).unwrap_or_else(|e| panic!("{e}"));
        if let Some(dir) = &dump {
            std::fs::write(dir.join(format!("{}.cu", kernel.id)), &kernel.source).unwrap();
            std::fs::write(dir.join(format!("{}.cubin", kernel.id)), &image.bytes).unwrap();
        }
        assert_cubin(&image.bytes, &kernel.id);
        let symbol = kernel.symbol.as_bytes();
        assert!(image.bytes.windows(symbol.len()).any(|w| w == symbol), "{}: symbol missing", kernel.id);
        let r = image.resources;
        assert!(r.registers.is_some(), "{}: ptxas -v gave no register count:\n{}", kernel.id, image.log);
        // Spills of the entry function and of every callee compiled apart.
        let functions = function_spills(&image.log);
        assert!(!functions.is_empty(), "{}: ptxas -v gave no spill line:\n{}", kernel.id, image.log);
        if functions.iter().any(|f| f.store_bytes != 0 || f.load_bytes != 0) {
            spills.push(format!("{}: {functions:?}\n{}", kernel.id, image.log));
        }
        // C7512: ptxas serialized the wgmma chains (too few registers for them in
        // flight); the kernel still runs, several times slower.
        assert!(!image.log.contains("C7512"), "{}: wgmma serialized\n{}", kernel.id, image.log);
    }
    assert!(spills.is_empty(), "{} kernel(s) spill registers:\n{}", spills.len(), spills.join("\n"));
}

#[test]
fn compile_error_returns_log_options_and_dumped_source() {
    let compiler = NvrtcCompiler::new().unwrap_or_else(|e| panic!("{e}"));
    let spec = KernelSpec::all_for(Target::Sm90a)[0];
    let mut kernel = render(&spec).unwrap();
    kernel.source.push_str("\nthis_is_not_cuda;\n");
    let err = compiler.compile(&kernel).unwrap_err().to_string();
    assert!(err.contains("this_is_not_cuda"), "log missing: {err}");
    assert!(err.contains("--gpu-architecture=sm_90a"), "options missing: {err}");
    let path = err.lines().find_map(|l| l.strip_prefix("source dumped to: ")).expect("source path line");
    let dumped = std::fs::read_to_string(path).unwrap();
    assert!(dumped.contains("this_is_not_cuda"));
}
