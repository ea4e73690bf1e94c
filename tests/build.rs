//! Builds the CPU emulation of the top-k kernels (`tests/emu/`): every top-k, split
//! and cluster variant (each writing positions and slots) and the page-table
//! transform for k = 512, 1024, 2048 (bf16 scores for 512 and 2048) of sm_90a
//! (32-lane warps) and gfx942 (64-lane wavefronts, no clusters), and the scalar dense
//! attention kernel (gfx942's) at both head shapes, and the KV cache's step store
//! and reads in both cache formats, rendered from the same
//! templates and headers as the GPU builds, compiled for the host against the
//! emulated arch layer (`nsa/emu/arch.cuh`) in place of the target's own.

use nsa_kernels::spec::{DenseKernel, DENSE_HEAD_DIMS};
use nsa_kernels::{render, KernelFamily, KernelSpec, KvCacheFormat, Target, TopkEntries, TopkLayout, TopkScore};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const EMU_ARCH: &str = "#include \"nsa/emu/arch.cuh\"";

/// How the launcher calls a kernel (its parameter list).
fn kind(family: KernelFamily) -> &'static str {
    match family {
        KernelFamily::TopkSplit { .. } => "kSplit",
        KernelFamily::IndexTransform { .. } => "kTransform",
        KernelFamily::DensePrefill { .. } => "kDense",
        KernelFamily::StepStore { format: KvCacheFormat::Fp8 } => "kStepStoreFp8",
        KernelFamily::StepStore { format: KvCacheFormat::Bf16 } => "kStepStoreBf16",
        KernelFamily::KvDequant { format: KvCacheFormat::Fp8 } => "kReadFp8",
        KernelFamily::KvDequant { format: KvCacheFormat::Bf16 } => "kReadBf16",
        KernelFamily::IndexerKGather => "kIndexerGather",
        _ => "kTopk",
    }
}

/// Every variant the top-k tests can launch on `target` (a superset of the
/// catalog's set; gfx942 has no clusters).
fn emulated_families(target: Target) -> Vec<KernelFamily> {
    let mut families = Vec::new();
    for k in [512, 1024, 2048] {
        // bf16 scores for the k the bf16 cases use (topk_cases::bf16_scores_every_path).
        let scores: &[TopkScore] = if k == 1024 { &[TopkScore::F32] } else { &TopkScore::ALL };
        for &score in scores {
            every_path(&mut families, target, k, score);
        }
        families.push(KernelFamily::IndexTransform { k });
    }
    // The scalar dense kernel at 3 heads (tests/tests/emu_dense.rs), both head shapes.
    for (d_qk, d_v) in DENSE_HEAD_DIMS {
        families.push(KernelFamily::DensePrefill { heads: EMU_DENSE_HEADS, d_qk, d_v, kernel: DenseKernel::Scalar });
    }
    // The KV cache's step store and reads, both cache formats (tests/tests/emu_kv.rs).
    for format in [KvCacheFormat::Fp8, KvCacheFormat::Bf16] {
        families.push(KernelFamily::StepStore { format });
        families.push(KernelFamily::KvDequant { format });
    }
    families.push(KernelFamily::IndexerKGather);
    families
}

/// Heads of the emulated dense kernels (`nsa_tests::emu::EMU_DENSE_HEADS`).
const EMU_DENSE_HEADS: u32 = 3;

/// One top-k variant on every path, in every kind of entry its plan compiles: one
/// block (both layouts, deterministic or not), split, and the cluster kernel where
/// `target` has clusters.
fn every_path(families: &mut Vec<KernelFamily>, target: Target, k: u32, score: TopkScore) {
    for deterministic in [false, true] {
        for layout in [TopkLayout::Latency, TopkLayout::Throughput] {
            for &entries in layout.kernel_entries() {
                families.push(KernelFamily::TopK { k, deterministic, layout, score, entries });
            }
        }
    }
    for entries in TopkEntries::MERGED {
        families.push(KernelFamily::TopkSplit { k, score, entries });
    }
    if target.has_clusters() {
        for entries in TopkEntries::CALLS {
            families.push(KernelFamily::TopkCluster { k, score, entries });
        }
    }
}

/// One emulated build: a target's kernels, compiled against the emulated arch layer
/// with that target's warp width.
struct Width {
    target: Target,
    arch_include: &'static str,
    lanes: u32,
    smem_fn: &'static str,
}

const WIDTHS: [Width; 2] = [
    Width {
        target: Target::Sm90a,
        arch_include: "#include \"nsa/cuda/arch.cuh\"",
        lanes: 32,
        smem_fn: "nsa_emu_smem_w32",
    },
    Width {
        target: Target::Gfx942,
        arch_include: "#include \"nsa/rocm/arch.cuh\"",
        lanes: 64,
        smem_fn: "nsa_emu_smem_w64",
    },
];

fn cpp_build(root: &Path) -> cc::Build {
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        // Emulation speed matters even in debug test builds (rows of 1M keys).
        .opt_level(2)
        .debug(false)
        // Shared memory is a thread_local array declared `extern` in the kernels; it
        // has no dynamic initialisation, and GCC's TLS wrapper for such declarations
        // calls a null init function in PIE builds (clang has no such flag or bug).
        .flag_if_supported("-fno-extern-tls-init")
        .flag_if_supported("-Wno-unknown-pragmas")
        .include(root.join("tests/emu"))
        .include(root.join("tests/emu/include"))
        .include(root.join("kernels/include"));
    build
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf();
    for dir in ["tests/emu", "kernels/include", "kernels/src", "templates"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("emu");
    std::fs::create_dir_all(&out).expect("creating OUT_DIR/emu");

    let mut decls = String::new();
    let mut table = String::new();
    let mut runtime = cpp_build(&root);
    for width in WIDTHS {
        let mut build = cpp_build(&root);
        let dense_smem_fn = format!("nsa_emu_dense_smem_w{}", width.lanes);
        build
            .define("NSA_EMU_WARP", width.lanes.to_string().as_str())
            .define("NSA_EMU_SMEM_FN", width.smem_fn)
            .define("NSA_EMU_DENSE_SMEM_FN", dense_smem_fn.as_str());
        if width.lanes == 64 {
            // The two widths' inline functions and templates must not merge at link time.
            build.define("nsa", "nsa_w64");
        }
        for family in emulated_families(width.target) {
            let spec = KernelSpec::new(family, width.target);
            let kind = kind(family);
            let kernel = render(&spec).unwrap_or_else(|e| panic!("rendering {}: {e}", spec.id()));
            let arch = width.arch_include;
            assert!(kernel.source.contains(arch), "{}: the source no longer includes {arch}", kernel.id);
            let source = kernel.source.replacen(arch, EMU_ARCH, 1);
            let path = out.join(format!("{}.cpp", kernel.id));
            write_if_changed(&path, &source);
            build.file(&path);
            let params: String = match kind {
                "kSplit" => "nsa::topk::Params, nsa::topk::Split, nsa::u32*".into(),
                "kTransform" => "nsa::index_transform::Params, nsa::u32*".into(),
                "kDense" => "nsa::dense::Params, nsa::u32*".into(),
                "kStepStoreFp8" | "kStepStoreBf16" => {
                    let cache = if kind == "kStepStoreFp8" { "nsa::u8*" } else { "nsa::u16*" };
                    format!(
                        "const nsa::u16*, nsa::i64, const nsa::u16*, nsa::i64, const nsa::u16*, nsa::i64, \
                         const nsa::i32*, nsa::i32, {cache}, nsa::i64, nsa::u8*, nsa::i64, nsa::u32*"
                    )
                }
                "kReadFp8" => "const nsa::u8*, nsa::i64, const nsa::i32*, nsa::i32, nsa::u16*, nsa::u32*".into(),
                "kReadBf16" => "const nsa::u16*, nsa::i64, const nsa::i32*, nsa::i32, nsa::u16*, nsa::u32*".into(),
                "kIndexerGather" => {
                    "const nsa::u8*, nsa::i64, const nsa::i32*, nsa::i32, nsa::u8*, float*, nsa::u32*".into()
                }
                _ => "nsa::topk::Params, nsa::u32*".into(),
            };
            writeln!(decls, "extern \"C\" void {}({params});", kernel.symbol).unwrap();
            let field = match kind {
                "kSplit" => "split",
                "kTransform" => "transform",
                "kDense" => "dense",
                "kStepStoreFp8" => "step_store_fp8",
                "kStepStoreBf16" => "step_store_bf16",
                "kReadFp8" => "read_fp8",
                "kReadBf16" => "read_bf16",
                "kIndexerGather" => "indexer_gather",
                _ => "topk",
            };
            let smem_fn = if kind == "kDense" { dense_smem_fn.as_str() } else { width.smem_fn };
            writeln!(
                table,
                "    {{\"{}\", {kind}, {}, {}, {{.{field} = &{}}}}},",
                kernel.id, width.lanes, smem_fn, kernel.symbol
            )
            .unwrap();
        }
        build.file(root.join("tests/emu/smem.cpp"));
        build.compile(&format!("nsa_emu_w{}", width.lanes));
    }
    let registry = format!(
        "// Generated by tests/build.rs: the emulated kernels by id.\n\
         #include \"kernels.h\"\n\n{decls}\nconst EmuKernel kEmuKernels[] = {{\n{table}}};\n\
         const unsigned long kEmuKernelCount = sizeof kEmuKernels / sizeof kEmuKernels[0];\n"
    );
    let registry_path = out.join("registry.cpp");
    write_if_changed(&registry_path, &registry);
    runtime.file(&registry_path);
    runtime.file(root.join("tests/emu/runtime.cpp"));
    runtime.file(root.join("tests/emu/launch.cpp"));
    runtime.file(root.join("tests/emu/selftest.cpp"));
    runtime.file(root.join("tests/emu/sample.cpp"));
    runtime.compile("nsa_emu");
}

/// Keeps unchanged sources' timestamps, so cc's objects stay comparable in logs.
fn write_if_changed(path: &Path, text: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}
