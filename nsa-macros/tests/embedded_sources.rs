//! `#[nsa(embed_sources)]`: the kernels rendered at compile time (inside the proc
//! macro) are byte-identical to what the runtime renders, for every spec of the set.

use nsa_macros::NsaKernels;
use nsa_runtime::kernels::{render, KernelSpec};
use nsa_runtime::NsaModel;

/// FP8 cache: store, dequant and indexer store, for every target there is.
#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", targets("sm_90a", "sm_100a", "gfx942"), embed_sources)]
struct Fp8Everywhere;

/// bf16 cache (no dequant kernel).
#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2-tp8", kv_cache = "bf16", targets("sm_90a", "gfx942"), embed_sources)]
struct Bf16Model;

/// Without the flag nothing is embedded.
#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2")]
struct NotEmbedded;

fn assert_identical<M: NsaModel>() {
    let specs: Vec<KernelSpec> = M::kernel_specs();
    let ids: Vec<String> = specs.iter().map(KernelSpec::id).collect();
    let embedded: Vec<&str> = M::EMBEDDED_SOURCES.iter().map(|s| s.id).collect();
    assert_eq!(embedded, ids, "{}: one embedded source per spec, in kernel-set order", M::NAME);
    for spec in &specs {
        let runtime = render(spec).unwrap();
        let embedded = M::embedded_source(spec).unwrap();
        assert_eq!(embedded.symbol, runtime.symbol, "{}", runtime.id);
        assert_eq!(embedded.source_name, runtime.source_name, "{}", runtime.id);
        assert!(embedded.source.as_bytes() == runtime.source.as_bytes(), "{}: embedded source differs", runtime.id);
    }
}

#[test]
fn fp8_sources_are_byte_identical() {
    assert_identical::<Fp8Everywhere>();
    assert_eq!(Fp8Everywhere::EMBEDDED_SOURCES.len(), Fp8Everywhere::kernel_specs().len());
}

#[test]
fn bf16_sources_are_byte_identical() {
    assert_identical::<Bf16Model>();
}

#[test]
fn nothing_embedded_without_the_flag() {
    assert!(NotEmbedded::EMBEDDED_SOURCES.is_empty());
    assert!(NotEmbedded::kernel_specs().iter().all(|s| NotEmbedded::embedded_source(s).is_none()));
}
