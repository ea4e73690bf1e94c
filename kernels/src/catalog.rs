//! Which kernels a configuration needs. Later families (top-k, indexer logits,
//! sparse MLA, metadata) add their specs here.

use crate::config::{KvCacheFormat, NsaConfig};
use crate::spec::{
    mha_kernel, IndexerLayout, KernelFamily, KernelSpec, MetadataMode, TopkEntries, TopkLayout, TopkScore,
    MHA_HEAD_DIMS,
};
use crate::target::Vendor;

/// The kernel set of `cfg`, for every target it lists, sorted and without repeats.
/// `cfg` should be validated first; this function does not re-check it.
pub fn kernel_set(cfg: &NsaConfig) -> Vec<KernelSpec> {
    // Every model has an indexer: its K store, and the gather feeding the ragged
    // logits; the layer stores both keys of a step in one launch (the step store).
    let mut families = vec![
        KernelFamily::KvStore { format: cfg.kv_cache },
        KernelFamily::IndexerKStore,
        KernelFamily::IndexerKGather,
        KernelFamily::StepStore { format: cfg.kv_cache },
    ];
    // Top-k: per plan and score type, kernels writing slots (PAGED for
    // decode/verify/draft-extend and extend without prefix, from a page_table_1 or
    // from the table of pages: one kernel per form on the plans of few rows, one for
    // both on the others) and one writing positions (RAGGED for extend with prefix;
    // plain), plus the unfused page-table transform.
    families.extend(one_block_topk(cfg, false));
    for &score in topk_scores(cfg) {
        families.extend(TopkEntries::MERGED.map(|entries| KernelFamily::TopkSplit { k: cfg.topk, score, entries }));
    }
    families.push(KernelFamily::IndexTransform { k: cfg.topk });
    // Prefill with a prefix reads the cache back as bf16 rows: RAGGED sparse MLA on
    // the FP8 cache (spec §8.4) and MHA one-shot (the model expands the latent rows).
    families.push(KernelFamily::KvDequant { format: cfg.kv_cache });
    // Metadata built on the device (spec §9.3): the CUDA graphs of decode (also the
    // multi-step draft backend), target-verify and draft-extend (v1 and v2), and the
    // eager steps of every mode (extend included).
    for mode in MetadataMode::ALL {
        families.push(KernelFamily::MetadataReplay { page_size: cfg.page_size, mode });
    }
    // Sparse MLA (NVIDIA only for now): prefill over bf16 rows (spec §8.2; the bf16
    // pool for PAGED, the dequantized prefix for RAGGED) for every format; decode
    // (spec §8.3) reads the FP8 cache.
    let d_qk = cfg.kv_lora_rank + cfg.qk_rope_head_dim;
    let mut sparse_mla =
        vec![KernelFamily::SparsePrefill { heads: cfg.num_q_heads, topk: cfg.topk, d_qk, paired: false }];
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
    // (`ops::topk::choose_plan`); one kernel per kind of entry serves every cluster size.
    let clustered: Vec<KernelFamily> = topk_scores(cfg)
        .iter()
        .flat_map(|&score| TopkEntries::CALLS.map(|entries| KernelFamily::TopkCluster { k: cfg.topk, score, entries }))
        .collect();
    let mut specs: Vec<KernelSpec> = cfg
        .targets
        .iter()
        .flat_map(|t| {
            let nvidia = t.vendor() == Vendor::Nvidia;
            let extra = if nvidia { &sparse_mla[..] } else { &[][..] };
            let clusters = if t.has_clusters() { &clustered[..] } else { &[][..] };
            // MHA one-shot prefill (spec §5.1): dense attention over the expanded heads.
            let (d_qk, d_v) = MHA_HEAD_DIMS;
            let dense = KernelFamily::DensePrefill { heads: cfg.num_q_heads, d_qk, d_v, kernel: mha_kernel(*t) };
            families.iter().chain(extra).chain(clusters).copied().chain([dense]).map(move |f| KernelSpec::new(f, *t))
        })
        .collect();
    specs.sort();
    specs.dedup();
    specs
}

/// The score types `cfg`'s top-k kernels are generated for: f32 (the indexer's
/// logits), and bf16 where the config asks.
fn topk_scores(cfg: &NsaConfig) -> &'static [TopkScore] {
    if cfg.topk_bf16_scores {
        &TopkScore::ALL
    } else {
        &[TopkScore::F32]
    }
}

/// The one-block top-k kernels of `cfg`: every score type and layout, each in the
/// kinds of entry its layout compiles.
fn one_block_topk(cfg: &NsaConfig, deterministic: bool) -> impl Iterator<Item = KernelFamily> + '_ {
    topk_scores(cfg).iter().flat_map(move |&score| {
        [TopkLayout::Latency, TopkLayout::Throughput].into_iter().flat_map(move |layout| {
            layout.kernel_entries().iter().map(move |&entries| KernelFamily::TopK {
                k: cfg.topk,
                deterministic,
                layout,
                score,
                entries,
            })
        })
    })
}

/// The deterministic one-block top-k kernels of `cfg` (every transform, layout and
/// score type of the set), for every target it lists: what a layer with
/// deterministic top-k runs (`nsa compile --deterministic-topk` bakes them). Not in
/// [`kernel_set`]: the deterministic mode is a run-time choice.
pub fn deterministic_topk_set(cfg: &NsaConfig) -> Vec<KernelSpec> {
    let families: Vec<KernelFamily> = one_block_topk(cfg, true).collect();
    let mut specs: Vec<KernelSpec> =
        cfg.targets.iter().flat_map(|&t| families.iter().map(move |&f| KernelSpec::new(f, t))).collect();
    specs.sort();
    specs.dedup();
    specs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Target;

    fn bf16_ids(bf16_scores: bool) -> Vec<String> {
        let cfg = NsaConfig { topk_bf16_scores: bf16_scores, ..NsaConfig::preset("deepseek-v3.2").unwrap() };
        let is_bf16 = |f: &KernelFamily| match *f {
            KernelFamily::TopK { score, .. }
            | KernelFamily::TopkSplit { score, .. }
            | KernelFamily::TopkCluster { score, .. } => score == TopkScore::Bf16,
            _ => false,
        };
        kernel_set(&cfg).into_iter().filter(|s| is_bf16(&s.family)).map(|s| s.id()).collect()
    }

    #[test]
    fn deterministic_set_is_every_layout_and_apart_from_the_kernel_set() {
        let cfg = NsaConfig::preset("deepseek-v3.2").unwrap();
        let det = deterministic_topk_set(&cfg);
        // Per target: the latency layout writing positions and slots from either
        // table form (3), the throughput layout positions and slots (2).
        assert_eq!(det.len(), cfg.targets.len() * 5);
        assert!(det.iter().all(|s| matches!(s.family, KernelFamily::TopK { deterministic: true, .. })));
        let set = kernel_set(&cfg);
        assert!(det.iter().all(|s| !set.contains(s)), "the deterministic kernels are a run-time choice");
        let bf16 = NsaConfig { topk_bf16_scores: true, ..cfg.clone() };
        assert_eq!(deterministic_topk_set(&bf16).len(), 2 * det.len());
    }

    #[test]
    fn bf16_top_k_kernels_only_when_asked_for_on_every_plan() {
        assert!(bf16_ids(false).is_empty());
        let ids = bf16_ids(true);
        // Per target (sm_90a, sm_100a): the latency layout and the cluster plan writing
        // positions and slots from either table form (3 each), the throughput layout
        // and the split plan positions and slots (2 each).
        assert_eq!(ids.len(), 2 * (3 + 3 + 2 + 2), "{ids:?}");
        for id in [
            "topk.k2048.bf16.tput.sm_90a",
            "topk_split.k2048.bf16.slots.sm_100a",
            "topk_cluster.k2048.bf16.sm_90a",
            "topk.k2048.bf16.table1.sm_90a",
            "topk_cluster.k2048.bf16.pages.sm_100a",
        ] {
            assert!(ids.iter().any(|i| i == id), "{id} missing from {ids:?}");
        }
        let gfx = NsaConfig {
            targets: vec![Target::Gfx942],
            topk_bf16_scores: true,
            ..NsaConfig::preset("deepseek-v3.2").unwrap()
        };
        assert!(
            !kernel_set(&gfx).iter().any(|s| matches!(s.family, KernelFamily::TopkCluster { .. })),
            "no clusters on gfx942"
        );
    }

    #[test]
    fn the_top_k_kernels_do_not_depend_on_the_page_size() {
        let topk_ids = |page_size| {
            let cfg = NsaConfig { page_size, ..NsaConfig::preset("deepseek-v3.2").unwrap() };
            kernel_set(&cfg).into_iter().map(|s| s.id()).filter(|id| id.starts_with("topk")).collect::<Vec<_>>()
        };
        assert_eq!(topk_ids(1), topk_ids(64));
        assert_eq!(topk_ids(61), topk_ids(64));
    }
}
