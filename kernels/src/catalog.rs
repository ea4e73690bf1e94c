//! Which kernels a configuration needs. Later families (top-k, indexer logits,
//! sparse MLA, metadata) add their specs here.

use crate::config::{KvCacheFormat, NsaConfig};
use crate::spec::{
    IndexerLayout, KernelFamily, KernelSpec, MetadataMode, TopkLayout, TopkScore, TopkTransform, TOPK_CLUSTER_SIZES,
};
use crate::target::Vendor;

/// The kernel set of `cfg`, for every target it lists, sorted and without repeats.
/// `cfg` should be validated first; this function does not re-check it.
pub fn kernel_set(cfg: &NsaConfig) -> Vec<KernelSpec> {
    // Every model has an indexer: its K store, and the gather feeding the ragged logits.
    let mut families =
        vec![KernelFamily::KvStore { format: cfg.kv_cache }, KernelFamily::IndexerKStore, KernelFamily::IndexerKGather];
    // Top-k: fused PAGED (decode/verify/draft-extend, extend without prefix) and
    // RAGGED (extend with prefix), plus the unfused path (plain + transform).
    let score = TopkScore::F32;
    for transform in TopkTransform::ALL {
        for layout in [TopkLayout::Latency, TopkLayout::Throughput] {
            families.push(KernelFamily::TopK { k: cfg.topk, transform, deterministic: false, layout, score });
        }
        families.push(KernelFamily::TopkSplit { k: cfg.topk, transform, score });
    }
    families.push(KernelFamily::IndexTransform { k: cfg.topk });
    if cfg.kv_cache == KvCacheFormat::Fp8 {
        // Prefill with a prefix reads the FP8 cache back as bf16 (spec §8.4).
        families.push(KernelFamily::KvDequant);
    }
    // CUDA-graph metadata replay (spec §9.3): decode (also the multi-step draft
    // backend), target-verify and draft-extend (v1 and v2) graphs.
    for mode in MetadataMode::ALL {
        families.push(KernelFamily::MetadataReplay { page_size: cfg.page_size, mode });
    }
    // Sparse MLA (NVIDIA only for now): prefill over bf16 rows (spec §8.2; the bf16
    // pool for PAGED, the dequantized prefix for RAGGED) for every format; decode
    // (spec §8.3) reads the FP8 cache.
    let d_qk = cfg.kv_lora_rank + cfg.qk_rope_head_dim;
    let mut sparse_mla = vec![KernelFamily::SparsePrefill { heads: cfg.num_q_heads, topk: cfg.topk, d_qk }];
    // Indexer logits (spec §6): FP8 warp-group MMA on sm_90a, mma.sync elsewhere; NVIDIA only for now.
    for layout in IndexerLayout::ALL {
        sparse_mla.push(KernelFamily::IndexerLogits { heads: cfg.index_n_heads, layout });
    }
    if cfg.kv_cache == KvCacheFormat::Fp8 {
        sparse_mla.push(KernelFamily::SparseDecode {
            heads: cfg.num_q_heads,
            topk: cfg.topk,
            page_size: cfg.page_size,
        });
        sparse_mla.push(KernelFamily::SparseDecodeCombine { heads: cfg.num_q_heads });
    }
    // Few long top-k rows go over thread-block clusters where the target has them
    // (`ops::topk::choose_plan`), at any size `cluster_size` may pick.
    let clustered: Vec<KernelFamily> = TopkTransform::ALL
        .into_iter()
        .flat_map(|transform| {
            TOPK_CLUSTER_SIZES.map(|cluster| KernelFamily::TopkCluster { k: cfg.topk, transform, cluster, score })
        })
        .collect();
    let mut specs: Vec<KernelSpec> = cfg
        .targets
        .iter()
        .flat_map(|t| {
            let nvidia = t.vendor() == Vendor::Nvidia;
            let extra = if nvidia { &sparse_mla[..] } else { &[][..] };
            let clusters = if t.has_clusters() { &clustered[..] } else { &[][..] };
            families.iter().chain(extra).chain(clusters).map(move |f| KernelSpec::new(*f, *t))
        })
        .collect();
    specs.sort();
    specs.dedup();
    specs
}
