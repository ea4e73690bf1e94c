//! Rendering: thin tera templates + embedded device headers → one self-contained source.
//!
//! tera 1.x: the stable, widely deployed line; it already fails on undefined
//! variables, and our templates use nothing beyond substitution, so 2.x's new
//! syntax and API buy nothing here while 1.x keeps snapshots stable.

use crate::spec::KernelSpec;
use std::sync::OnceLock;

macro_rules! embed {
    ($($name:literal => $path:literal),* $(,)?) => { &[$(($name, include_str!($path))),*] };
}

/// Templates, by the name [`KernelSpec::template`] gives.
pub const TEMPLATES: &[(&str, &str)] = embed! {
    "kv_store.cu.tera" => "../../templates/kv_store.cu.tera",
    "step_store.cu.tera" => "../../templates/step_store.cu.tera",
    "kv_dequant.cu.tera" => "../../templates/kv_dequant.cu.tera",
    "indexer_k_store.cu.tera" => "../../templates/indexer_k_store.cu.tera",
    "indexer_k_gather.cu.tera" => "../../templates/indexer_k_gather.cu.tera",
    "topk.cu.tera" => "../../templates/topk.cu.tera",
    "topk_split.cu.tera" => "../../templates/topk_split.cu.tera",
    "topk_cluster.cu.tera" => "../../templates/topk_cluster.cu.tera",
    "index_transform.cu.tera" => "../../templates/index_transform.cu.tera",
    "metadata_replay.cu.tera" => "../../templates/metadata_replay.cu.tera",
    "sparse_decode.cu.tera" => "../../templates/sparse_decode.cu.tera",
    "sparse_decode_f8.cu.tera" => "../../templates/sparse_decode_f8.cu.tera",
    "sparse_decode_wg.cu.tera" => "../../templates/sparse_decode_wg.cu.tera",
    "sparse_decode_combine.cu.tera" => "../../templates/sparse_decode_combine.cu.tera",
    "sparse_prefill.cu.tera" => "../../templates/sparse_prefill.cu.tera",
    "sparse_prefill_wg.cu.tera" => "../../templates/sparse_prefill_wg.cu.tera",
    "sparse_prefill_pairs.cu.tera" => "../../templates/sparse_prefill_pairs.cu.tera",
    "indexer_logits.cu.tera" => "../../templates/indexer_logits.cu.tera",
    "indexer_logits_wg.cu.tera" => "../../templates/indexer_logits_wg.cu.tera",
    "dense_prefill.cu.tera" => "../../templates/dense_prefill.cu.tera",
    "dense_prefill_wg.cu.tera" => "../../templates/dense_prefill_wg.cu.tera",
    "dense_prefill_scalar.cu.tera" => "../../templates/dense_prefill_scalar.cu.tera",
};

/// Device headers, by the include name sources use. Passed to the compiler as
/// in-memory headers: nothing from a toolkit is ever included.
pub const HEADERS: &[(&str, &str)] = embed! {
    "nsa/common/types.cuh" => "../include/nsa/common/types.cuh",
    "nsa/common/numeric_soft.cuh" => "../include/nsa/common/numeric_soft.cuh",
    "nsa/common/status.cuh" => "../include/nsa/common/status.cuh",
    "nsa/common/block.cuh" => "../include/nsa/common/block.cuh",
    "nsa/common/segments.cuh" => "../include/nsa/common/segments.cuh",
    "nsa/cuda/arch.cuh" => "../include/nsa/cuda/arch.cuh",
    "nsa/cuda/mma.cuh" => "../include/nsa/cuda/mma.cuh",
    "nsa/cuda/wgmma.cuh" => "../include/nsa/cuda/wgmma.cuh",
    "nsa/cuda/cluster.cuh" => "../include/nsa/cuda/cluster.cuh",
    "nsa/cuda/bulk.cuh" => "../include/nsa/cuda/bulk.cuh",
    "nsa/rocm/arch.cuh" => "../include/nsa/rocm/arch.cuh",
    "nsa/kv/kv_cache.cuh" => "../include/nsa/kv/kv_cache.cuh",
    "nsa/topk/topk.cuh" => "../include/nsa/topk/topk.cuh",
    "nsa/topk/topk_cluster.cuh" => "../include/nsa/topk/topk_cluster.cuh",
    "nsa/topk/index_transform.cuh" => "../include/nsa/topk/index_transform.cuh",
    "nsa/metadata/metadata_replay.cuh" => "../include/nsa/metadata/metadata_replay.cuh",
    "nsa/attention/softmax.cuh" => "../include/nsa/attention/softmax.cuh",
    "nsa/attention/sparse_attend.cuh" => "../include/nsa/attention/sparse_attend.cuh",
    "nsa/attention/sparse_attend_wg.cuh" => "../include/nsa/attention/sparse_attend_wg.cuh",
    "nsa/attention/sparse_decode.cuh" => "../include/nsa/attention/sparse_decode.cuh",
    "nsa/attention/sparse_decode_wg.cuh" => "../include/nsa/attention/sparse_decode_wg.cuh",
    "nsa/attention/sparse_decode_f8.cuh" => "../include/nsa/attention/sparse_decode_f8.cuh",
    "nsa/attention/sparse_prefill.cuh" => "../include/nsa/attention/sparse_prefill.cuh",
    "nsa/attention/sparse_prefill_wg.cuh" => "../include/nsa/attention/sparse_prefill_wg.cuh",
    "nsa/attention/sparse_prefill_pairs.cuh" => "../include/nsa/attention/sparse_prefill_pairs.cuh",
    "nsa/attention/dense_common.cuh" => "../include/nsa/attention/dense_common.cuh",
    "nsa/attention/dense_prefill.cuh" => "../include/nsa/attention/dense_prefill.cuh",
    "nsa/attention/dense_prefill_scalar.cuh" => "../include/nsa/attention/dense_prefill_scalar.cuh",
    "nsa/attention/dense_prefill_wg.cuh" => "../include/nsa/attention/dense_prefill_wg.cuh",
    "nsa/indexer/indexer_logits.cuh" => "../include/nsa/indexer/indexer_logits.cuh",
    "nsa/indexer/indexer_logits_wg.cuh" => "../include/nsa/indexer/indexer_logits_wg.cuh",
};

/// blake3 over every embedded header (name and bytes), part of every cache key.
pub fn headers_digest() -> String {
    let mut h = blake3::Hasher::new();
    for (name, text) in HEADERS {
        for part in [name.as_bytes(), text.as_bytes()] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
    }
    h.finalize().to_hex().to_string()
}

/// A rendered kernel: its spec, source text and entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedKernel {
    pub spec: KernelSpec,
    pub id: String,
    pub symbol: String,
    pub source_name: String,
    pub source: String,
}

/// Rendering failed: a template bug, never a user error.
#[derive(Debug, thiserror::Error)]
#[error("rendering `{id}` from template `{template}` failed: {detail}")]
pub struct RenderError {
    pub id: String,
    pub template: &'static str,
    pub detail: String,
}

fn engine() -> &'static tera::Tera {
    static ENGINE: OnceLock<tera::Tera> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut t = tera::Tera::default();
        t.autoescape_on(vec![]);
        t.add_raw_templates(TEMPLATES.iter().copied()).expect("embedded templates parse (checked by tests)");
        t
    })
}

/// Renders `spec` into a self-contained source (includes resolve to [`HEADERS`]).
pub fn render(spec: &KernelSpec) -> Result<RenderedKernel, RenderError> {
    let err = |detail: String| RenderError { id: spec.id(), template: spec.template(), detail };
    let ctx = tera::Context::from_value(spec.context()).map_err(|e| err(chain(&e)))?;
    let source = engine().render(spec.template(), &ctx).map_err(|e| err(chain(&e)))?;
    Ok(RenderedKernel { spec: *spec, id: spec.id(), symbol: spec.symbol(), source_name: spec.source_name(), source })
}

/// Renders template `name` of [`TEMPLATES`] with an arbitrary context, through the
/// same engine as [`render`]. Only for tests of template strictness (a missing
/// variable must fail); kernels are rendered with [`render`].
#[doc(hidden)]
pub fn render_with_context(name: &str, context: serde_json::Value) -> Result<String, String> {
    let ctx = tera::Context::from_value(context).map_err(|e| chain(&e))?;
    engine().render(name, &ctx).map_err(|e| chain(&e))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
