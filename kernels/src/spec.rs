//! [`KernelSpec`]: one value per kernel variant. Its id, entry symbol, template,
//! template context and launch geometry are derived by its family's module
//! (`families/`), through [`crate::families::rules`].

use crate::families::{self, rules};
use crate::target::Target;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::fmt;

use crate::config::KvCacheFormat;
pub use crate::families::attention::{
    attend_smem_bytes, decode_f8_smem_bytes, prefill_ring_smem_bytes, sparse_head_tile, sparse_mla_head_tile,
    sparse_prefill_head_tile, wg_smem_bytes, DECODE_BLOCK_TOKENS, DECODE_HEADS, PREFILL_DQK, PREFILL_HEADS,
    WG_HEAD_TILE,
};
pub use crate::families::dense::{
    dense_scalar_smem_bytes, dense_smem_bytes, dense_wg_smem_bytes, mha_kernel, DenseKernel, DENSE_HEAD_DIMS,
    DENSE_ROWS, DENSE_SCALAR_ROWS, DENSE_WG_KEYS, DENSE_WG_ROWS, MHA_HEAD_DIMS,
};
pub use crate::families::indexer::{
    indexer_wg_kernel, IndexerLayout, INDEXER_WG_HEADS, INDEXER_WG_RAGGED_ROWS, INDEXER_WG_SMEM_BYTES,
};
pub use crate::families::kv::step_store_blocks;
pub use crate::families::metadata::{MetadataMode, METADATA_MAX_BATCH};
pub use crate::families::topk::{
    TopkEntries, TopkLayout, TopkScore, TopkTransform, TOPK_CLUSTER_SIZES, TOPK_PAGE_SIZES,
};

/// The kernel families and the knobs that change their generated code.
///
/// A knob that does not change the code is not a knob: the store kernels address
/// rows by slot, so the MLA page size is not part of their spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "snake_case")]
pub enum KernelFamily {
    /// Write new tokens' latent + rope into the MLA cache (quantizing for FP8).
    KvStore { format: KvCacheFormat },
    /// Read MLA cache rows by slot out as contiguous bf16 576: FP8-656 records
    /// dequantized, bf16 rows copied (the prefix of a dense or RAGGED prefill).
    KvDequant { format: KvCacheFormat },
    /// Quantize indexer keys into the 132-byte, 64-token-page indexer cache.
    IndexerKStore,
    /// Gather indexer keys and scales by slot into ragged rows (spec §6.3 "Gather K").
    IndexerKGather,
    /// Both stores of a step in one launch: [`KvStore`](Self::KvStore) and
    /// [`IndexerKStore`](Self::IndexerKStore) at the same slots, each over its own
    /// part of the grid.
    StepStore { format: KvCacheFormat },
    /// Exact top-k of f32 or bf16 scores per row, with the output transform fused in:
    /// positions (plain or RAGGED) or slots (PAGED), the launch parameters naming the
    /// rest (offsets, page table, page size).
    TopK {
        k: u32,
        deterministic: bool,
        layout: TopkLayout,
        #[serde(default)]
        score: TopkScore,
        #[serde(default)]
        entries: TopkEntries,
    },
    /// Unfused page-table transform of top-k positions (spec §7.7).
    IndexTransform { k: u32 },
    /// CUDA-graph metadata replay (spec §9.3, §9.6): one launch rewrites every
    /// length, cumulative sum, `page_table_1` row and real-page-table row of a
    /// graph state in place (and of every step backend of a multi-step state: the
    /// step count is a launch argument, as are top-k and D, which only enter as
    /// values). The page size is a constant (divisions, the real-table stride).
    MetadataReplay { page_size: u32, mode: MetadataMode },
    /// Split top-k: few long rows, each spread over many blocks in one launch; each
    /// row's last block cuts the top k from the keys its blocks kept.
    TopkSplit {
        k: u32,
        #[serde(default)]
        score: TopkScore,
        #[serde(default)]
        entries: TopkEntries,
    },
    /// Exact top-k with each row spread over a thread-block cluster (sm_90+ only):
    /// one launch, the row read once, the CTAs' lists joined through distributed
    /// shared memory. The cluster size is a launch attribute (one of
    /// `TOPK_CLUSTER_SIZES`), so one kernel serves every size.
    TopkCluster {
        k: u32,
        #[serde(default)]
        score: TopkScore,
        #[serde(default)]
        entries: TopkEntries,
    },
    /// Sparse MLA decode over the FP8-656 cache (spec §8.3): heads, top-k and page
    /// size are constants (the page size turns the slot split into shifts or a
    /// multiply). The query tokens per request (s_q) are not: every query row
    /// carries its own index list, so s_q only changes the row count and the plan.
    SparseDecode { heads: u32, topk: u32, page_size: u32 },
    /// Merges the split-KV partials of [`KernelFamily::SparseDecode`].
    SparseDecodeCombine { heads: u32 },
    /// Sparse MLA prefill over bf16 KV rows (spec §8.2): heads, top-k and the Q/K
    /// width `d_qk` (576 = latent + rope, or 512 without rope) are constants. One
    /// CTA per (query token, head tile); no batch dimension (indices carry it).
    /// `paired`: the warp-group kernel whose two consumer groups take alternate
    /// 64-token blocks (sm_90a, 17+ heads; opt-in, `ops::sparse_prefill::Kernel`).
    SparsePrefill { heads: u32, topk: u32, d_qk: u32, paired: bool },
    /// Lightning-indexer logits (spec §6.2, §6.3) over FP8 keys: PAGED from the
    /// indexer cache (decode / verify / draft-extend, page size 64 fixed by the
    /// cache layout) or RAGGED from gathered keys with per-row [ks, ke) (extend).
    /// The index head count is a constant (dim 128 is fixed by the cache).
    IndexerLogits { heads: u32, layout: IndexerLayout },
    /// Dense causal attention over variable-length sequences (the MHA one-shot
    /// prefill, spec §5.1): per-head q/k of `d_qk` and v of `d_v` values, the head
    /// count a constant. One CTA per (query rows of a sequence, head).
    DensePrefill { heads: u32, d_qk: u32, d_v: u32, kernel: DenseKernel },
}

/// One kernel variant for one target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KernelSpec {
    #[serde(flatten)]
    pub family: KernelFamily,
    pub target: Target,
}

impl KernelSpec {
    pub fn new(family: KernelFamily, target: Target) -> Self {
        KernelSpec { family, target }
    }

    /// Whether the kernel may be launched with programmatic dependent launch (PDL):
    /// every kernel waits for the previous kernel of its stream at its top
    /// (`wait_prior_grids`, before it reads anything), and the NVIDIA targets have it.
    pub fn waits_for_prior_grids(&self) -> bool {
        self.target.has_pdl()
    }

    /// Family name, the first component of the id.
    pub fn family_name(&self) -> &'static str {
        rules(&self.family).name(self)
    }

    /// Human-readable id, e.g. `kv_store.fp8_656.sm_90a`. Unique per variant.
    pub fn id(&self) -> String {
        let mut parts = vec![self.family_name().to_string()];
        parts.extend(rules(&self.family).knobs(self));
        parts.push(self.target.arch().into());
        parts.join(".")
    }

    /// The `extern "C"` entry point: the id with `.` spelled `__` (ids never hold `__`).
    pub fn symbol(&self) -> String {
        format!("nsa_{}", self.id().replace('.', "__"))
    }

    /// File name of the rendered source.
    pub fn source_name(&self) -> String {
        format!("{}.cu", self.id())
    }

    /// The thin template this family renders from.
    pub fn template(&self) -> &'static str {
        rules(&self.family).template(self)
    }

    /// Threads per block the kernel is compiled for (`__launch_bounds__`) and launched with.
    pub fn block_threads(&self) -> u32 {
        rules(&self.family).block_threads(self)
    }

    /// Dynamic shared memory per block, in bytes (0 for most families).
    pub fn dynamic_smem_bytes(&self) -> u32 {
        rules(&self.family).dynamic_smem_bytes(self)
    }

    /// Keys the split top-k path's list holds per row (in the workspace and in each
    /// block's shared memory).
    pub fn topk_split_list(&self) -> u32 {
        families::topk::split_list(self.target)
    }

    /// Candidate capacity of the top-k kernels' histogram path.
    pub fn topk_candidates(&self) -> u32 {
        families::topk::candidates(self)
    }

    /// Work items one block handles (tokens; top-k rows; transform elements); the
    /// launcher's grid is `ceil(items / tokens_per_block)`.
    pub fn tokens_per_block(&self) -> u32 {
        rules(&self.family).tokens_per_block(self)
    }

    /// Heads per CTA of this sparse MLA family on this spec's target:
    /// [`sparse_prefill_head_tile`] for prefill, [`sparse_mla_head_tile`] otherwise.
    pub fn sparse_mla_head_tile(&self, heads: u32) -> Option<u32> {
        families::attention::head_tile(self, heads)
    }

    /// Whether a sparse MLA family of `heads` heads is the warp-group (wgmma) kernel.
    pub fn wg_kernel(&self, heads: u32) -> bool {
        families::attention::wg_kernel(self, heads)
    }

    /// Whether this is the raw-record decode kernel (16-head tiles on sm_90a).
    pub fn decode_f8_kernel(&self, heads: u32) -> bool {
        families::attention::decode_f8_kernel(self, heads)
    }

    /// Everything the template may read. Templates are strict: a name missing here
    /// fails rendering.
    pub fn context(&self) -> Value {
        let mut ctx = Map::new();
        ctx.insert("id".into(), json!(self.id()));
        ctx.insert("symbol".into(), json!(self.symbol()));
        ctx.insert("arch".into(), json!(self.target.arch()));
        ctx.insert("arch_header".into(), json!(self.target.arch_header()));
        ctx.insert("block_threads".into(), json!(self.block_threads()));
        rules(&self.family).context(self, &mut ctx);
        Value::Object(ctx)
    }

    /// The representative variants of every family for `target` (compile-all and
    /// snapshot matrix), family module by family module: the store, dequant and
    /// gather kernels; top-k (every path, transform and score type at k 2048, k 512
    /// and 1024 too) and the index transform; metadata replay of every mode at page
    /// sizes 64 and 1; on NVIDIA, sparse decode (+ combine) and prefill over their
    /// head counts, top-k values, page sizes and widths, and indexer logits (paged,
    /// ragged) at 64 heads. Sparse MLA and the indexer logits have no ROCm variant
    /// yet (mma.sync). Each module's `representatives` lists its own.
    pub fn all_for(target: Target) -> Vec<KernelSpec> {
        families::ALL
            .iter()
            .flat_map(|f| f.representatives(target))
            .map(|family| KernelSpec::new(family, target))
            .collect()
    }

    /// The variant whose [`id`](Self::id) is `id` (any knob values, not only
    /// those of [`all_for`](Self::all_for)).
    pub fn from_id(id: &str) -> Option<KernelSpec> {
        let parts: Vec<&str> = id.split('.').collect();
        let (&arch, rest) = parts.split_last()?;
        let (&family, knobs) = rest.split_first()?;
        let target: Target = arch.parse().ok()?;
        let family = families::ALL.iter().find_map(|f| f.parse(family, knobs))?;
        let spec = KernelSpec::new(family, target);
        (spec.id() == id && families::rules(&family).exists(&spec)).then_some(spec)
    }
}

impl fmt::Display for KernelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel waits for the previous grid at its top, so PDL launches are safe
    /// for all of them, and only where the target has PDL.
    #[test]
    fn every_kernel_waits_at_its_top_and_pdl_is_nvidia_only() {
        for target in Target::NVIDIA.into_iter().chain([Target::Gfx942]) {
            for spec in KernelSpec::all_for(target) {
                let rendered = crate::render(&spec).unwrap().source;
                // The kernel's body: after the `{` that ends its signature.
                let kernel = &rendered[rendered.find("NSA_KERNEL").expect("a kernel")..];
                let body = kernel[kernel.find(") {").expect("a kernel body") + 3..].trim_start();
                assert!(
                    body.starts_with("nsa::wait_prior_grids();"),
                    "{}: the kernel's first statement is not wait_prior_grids",
                    spec.id()
                );
                assert_eq!(spec.waits_for_prior_grids(), target != Target::Gfx942, "{}", spec.id());
            }
        }
    }
}
