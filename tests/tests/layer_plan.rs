//! Table tests of the per-step layer plan (host only): which indexer, transform
//! and attention variant each batch gets, the ragged key layout, chunking under
//! the logits budget, and the errors for batches the layer does not run.

use nsa_kernels::{KvCacheFormat, NsaConfig, Target};
use nsa_runtime::layer::{ragged_keys, AttentionStage, IndexerStage, LayerConfig, StepDecisions};
use nsa_runtime::metadata::{
    decide, AttnImpl, BatchSummary, Dispatch, DispatchPolicy, ExtendBatch, ForwardMode, MetadataBuilder,
    MetadataParams, NsaMetadata, PrefillBackend, ReqToToken, Requests, TransformMethod,
};
use nsa_runtime::ops::LaunchTarget;

const H200: LaunchTarget = LaunchTarget { target: Target::Sm90a, sm_count: 132 };

fn cfg(kv: KvCacheFormat, page_size: u32, heads: u32) -> LayerConfig {
    let mut m = NsaConfig::preset("deepseek-v3.2").unwrap();
    m.kv_cache = kv;
    m.page_size = page_size;
    m.num_q_heads = heads;
    LayerConfig::new(m).unwrap()
}

fn policy(c: &LayerConfig, backend: PrefillBackend, force_mla: bool) -> DispatchPolicy {
    DispatchPolicy {
        compute_capability: (9, 0),
        kv_cache: c.model.kv_cache,
        prefill_backend: backend,
        topk: c.model.topk,
        max_chunk_capacity: 1 << 20,
        cp_enabled: false,
        force_mla,
    }
}

/// `rows` requests, each on its own run of pages (page `r * per_row + p / page`).
fn table(rows: usize, width: usize, page: usize) -> Vec<i32> {
    let per_row = width.div_ceil(page);
    (0..rows).flat_map(|r| (0..width).map(move |p| ((r * per_row + p / page) * page + p % page) as i32)).collect()
}

struct Step {
    md: NsaMetadata,
    dispatch: Dispatch,
}

fn step(c: &LayerConfig, mode: ForwardMode, seq: &[i32], ext: &[i32], backend: PrefillBackend) -> Step {
    let page = c.model.page_size as usize;
    let width = (*seq.iter().max().unwrap_or(&1) as usize + 4).next_multiple_of(page);
    let rows = seq.len().max(1);
    let data = table(rows, width, page);
    let t = ReqToToken::new(&data, width).unwrap();
    let rpi: Vec<i32> = (0..seq.len() as i32).collect();
    let params = MetadataParams { draft_tokens: 2, ..MetadataParams::from_config(&c.model, rows * width + page) };
    let b = MetadataBuilder::new(params).unwrap();
    let tokens: i32 = ext.iter().sum();
    let summary = BatchSummary { mode, seq_lens: seq, extend_num_tokens: tokens as usize };
    let dispatch = decide(&policy(c, backend, true), Some(&summary));
    let reqs = Requests { req_pool_indices: &rpi, seq_lens: seq };
    let md = match mode {
        ForwardMode::Decode => b.decode(&t, reqs).unwrap(),
        ForwardMode::TargetVerify => b.target_verify(&t, reqs).unwrap(),
        ForwardMode::DraftExtend => b.draft_extend(&t, reqs, ext).unwrap(),
        ForwardMode::Extend => {
            let prefix: Vec<i32> = seq.iter().zip(ext).map(|(s, e)| s - e).collect();
            let batch =
                ExtendBatch { req_pool_indices: &rpi, seq_lens: seq, extend_lens: ext, prefix_lens: Some(&prefix) };
            b.extend(&t, batch, dispatch.extend_plan()).unwrap()
        }
        other => panic!("{other:?}"),
    };
    Step { md, dispatch }
}

fn decide_step(c: &LayerConfig, s: &Step) -> StepDecisions {
    let keys = StepDecisions::needs_keys(c, &s.md, &s.dispatch).then(|| ragged_keys(&s.md).unwrap());
    StepDecisions::new(c, &s.md, &s.dispatch, keys.map_or(0, |k| k.num_keys()), H200).unwrap()
}

#[test]
fn stages_per_batch() {
    let fp8 = cfg(KvCacheFormat::Fp8, 64, 128);
    let bf16 = cfg(KvCacheFormat::Bf16, 64, 16);
    let fp8_p1 = cfg(KvCacheFormat::Fp8, 1, 16);
    let auto = PrefillBackend::Auto;
    let sparse = PrefillBackend::Fixed(AttnImpl::FlashMlaSparse);

    // Decode, long rows, page 64: PAGED logits over 3 pages of the longest row.
    let d = decide_step(&fp8, &step(&fp8, ForwardMode::Decode, &[4000, 100, 2100], &[1, 1, 1], auto));
    assert_eq!(d.indexer, IndexerStage::Paged { table_width: 4004usize.div_ceil(64) });
    assert!(matches!(d.attention, AttentionStage::Decode(p) if p.shape.batch == 3 && p.shape.s_q == 1));
    assert_eq!((d.transform, d.chunks.len(), d.logits_stride), (TransformMethod::Paged, 1, 63 * 64));

    // Every row ≤ top-k: no logits; bf16 cache reads the pool with the prefill kernel.
    let d = decide_step(&bf16, &step(&bf16, ForwardMode::TargetVerify, &[100, 2046], &[], auto));
    assert_eq!(d.indexer, IndexerStage::Skip);
    assert!(matches!(d.attention, AttentionStage::PrefillPaged(s) if s.s_q == 4 && s.heads == 16));
    assert_eq!(d.needs.logits, 2048, "top-k reads no scores; one shared row is enough");

    // Page size 1: index-K pages are not table pages, so keys are gathered by slot.
    let d = decide_step(&fp8_p1, &step(&fp8_p1, ForwardMode::Decode, &[3000, 5000], &[1, 1], auto));
    assert!(matches!(d.indexer, IndexerStage::Gathered { num_keys: 8000, chunk_rows: 2, .. }), "{:?}", d.indexer);
    assert_eq!(d.needs.gathered_keys, 8000);

    // Extend on Hopper with FP8: flashmla_kv (decode kernel), PAGED, gathered logits.
    let d = decide_step(&fp8, &step(&fp8, ForwardMode::Extend, &[3000, 2500], &[10, 20], auto));
    assert!(matches!(d.indexer, IndexerStage::Gathered { num_keys: 5500, .. }));
    assert!(matches!(d.attention, AttentionStage::Decode(_)));
    assert_eq!(d.transform, TransformMethod::Paged);

    // Forcing flashmla_sparse: RAGGED, dequantized keys.
    let d = decide_step(&fp8, &step(&fp8, ForwardMode::Extend, &[3000, 2500], &[10, 20], sparse));
    assert_eq!(d.transform, TransformMethod::Ragged);
    assert!(matches!(d.attention, AttentionStage::PrefillRagged(s) if s.s_q == 30));
    assert_eq!(d.needs.ragged_kv, 5500 * 576);
    assert!(d.explain(&fp8).iter().any(|l| l.contains("RAGGED")), "{:?}", d.explain(&fp8));
}

#[test]
fn ragged_keys_match_the_metadata_offsets() {
    let c = cfg(KvCacheFormat::Fp8, 64, 16);
    let s = step(&c, ForwardMode::Extend, &[130, 70, 5], &[3, 70, 2], PrefillBackend::Fixed(AttnImpl::FlashMlaSparse));
    let k = ragged_keys(&s.md).unwrap();
    assert_eq!(Some(&k.slots), s.md.page_table_1_flattened.as_ref());
    assert_eq!(Some(&k.ks), s.md.topk_indices_offset.as_ref());
    let ranges = s.md.indexer.as_ref().unwrap();
    assert_eq!((&k.ks, &k.ke), (&ranges.ks, &ranges.ke));
    // Token 0 is position 127 of request 0: it sees keys [0, 128).
    assert_eq!((k.ks[0], k.ke[0], k.ks[3], k.ke[3], k.ks[73], k.ke[74]), (0, 128, 130, 131, 200, 205));

    // Verify: rows per token, each request's keys once.
    let v = step(&c, ForwardMode::TargetVerify, &[10, 20], &[], PrefillBackend::Auto);
    let k = ragged_keys(&v.md).unwrap();
    assert_eq!(k.num_keys(), 12 + 22);
    assert_eq!((k.ks, k.ke), (vec![0, 0, 12, 12], vec![11, 12, 33, 34]));
}

#[test]
fn extend_logits_are_chunked_under_the_budget() {
    let mut c = cfg(KvCacheFormat::Bf16, 64, 16);
    c.logits_budget_bytes = 100 * 4 * 6000;
    let s = step(&c, ForwardMode::Extend, &[3000, 3000], &[500, 300], PrefillBackend::Auto);
    let d = decide_step(&c, &s);
    let IndexerStage::Gathered { chunk_rows, .. } = d.indexer else { panic!("{:?}", d.indexer) };
    assert_eq!(chunk_rows, 100);
    assert_eq!(d.chunks.len(), 8);
    assert_eq!(d.chunks.last(), Some(&(700..800)));
    assert!(d.needs.logits * 4 <= c.logits_budget_bytes);
    c.logits_budget_bytes = 1000;
    let keys = ragged_keys(&s.md).unwrap();
    let err = StepDecisions::new(&c, &s.md, &s.dispatch, keys.num_keys(), H200).unwrap_err().to_string();
    assert!(err.contains("`logits budget`"), "{err}");
}

#[test]
fn batches_the_layer_does_not_run_are_named() {
    let c = cfg(KvCacheFormat::Bf16, 64, 16);
    let mut s = step(&c, ForwardMode::Extend, &[100], &[100], PrefillBackend::Auto);
    s.dispatch = decide(
        &policy(&c, PrefillBackend::Auto, false),
        Some(&BatchSummary { mode: ForwardMode::Extend, seq_lens: &[100], extend_num_tokens: 100 }),
    );
    assert!(s.dispatch.use_mha);
    let err = StepDecisions::new(&c, &s.md, &s.dispatch, 100, H200).unwrap_err().to_string();
    // The error points at the MHA one-shot entry.
    assert!(err.contains("`dispatch.use_mha`") && err.contains("plan_mha") && err.contains("force_mla"), "{err}");

    let other = cfg(KvCacheFormat::Bf16, 32, 16);
    let s = step(&c, ForwardMode::Decode, &[100], &[1], PrefillBackend::Auto);
    let err = StepDecisions::new(&other, &s.md, &s.dispatch, 0, H200).unwrap_err().to_string();
    assert!(err.contains("`metadata.page_size/topk`") && err.contains("64/2048"), "{err}");
}

#[test]
fn graph_bound_decisions_do_not_depend_on_lengths() {
    let c = cfg(KvCacheFormat::Fp8, 64, 128);
    let d = StepDecisions::for_graph(&c, ForwardMode::TargetVerify, 24, 9000, H200).unwrap();
    assert_eq!(d.indexer, IndexerStage::Paged { table_width: 9000usize.div_ceil(64) });
    assert_eq!((d.rows, d.transform, d.chunks.len()), (24, TransformMethod::Paged, 1));
    assert!(matches!(d.attention, AttentionStage::Decode(p) if p.shape.batch == 24));
    let bf16 = cfg(KvCacheFormat::Bf16, 64, 16);
    let d = StepDecisions::for_graph(&bf16, ForwardMode::Decode, 8, 4096, H200).unwrap();
    assert!(matches!(d.attention, AttentionStage::PrefillPaged(s) if s.s_q == 8));
    let p1 = cfg(KvCacheFormat::Fp8, 1, 16);
    let err = StepDecisions::for_graph(&p1, ForwardMode::Decode, 8, 4096, H200).unwrap_err().to_string();
    assert!(err.contains("`page_size`") && err.contains("eager"), "{err}");
}

/// The split top-k workspace is sized for exactly the top-k calls that take the split
/// plan: few long rows on a target without thread-block clusters (≤ SMs / 8 rows of
/// ≥ 16K keys, not deterministic) whose split list can take the filtered keys;
/// sm_90a spreads such rows over clusters instead.
#[test]
fn split_topk_workspace_follows_the_plan() {
    let c = cfg(KvCacheFormat::Fp8, 64, 16);
    let mi300 = LaunchTarget { target: Target::Gfx942, sm_count: 304 };
    let split_rows = |c: &LayerConfig, rows, width, gpu| {
        StepDecisions::for_graph(c, ForwardMode::Decode, rows, width, gpu).unwrap().needs.topk_split_rows
    };
    assert_eq!(split_rows(&c, 8, 131_072, H200), 0, "clusters: no workspace");
    assert_eq!(split_rows(&c, 8, 131_072, mi300), 0, "gfx942's 2048-key list cannot take top-2048's filtered keys");
    let mut k512 = c.clone();
    k512.model.topk = 512;
    assert_eq!(split_rows(&k512, 8, 16_384, mi300), 8);
    assert_eq!(split_rows(&k512, 38, 16_384, mi300), 38, "8 x 38 <= 304 SMs");
    assert_eq!(split_rows(&k512, 39, 16_384, mi300), 0, "too many rows to spread");
    assert_eq!(split_rows(&k512, 8, 8192, mi300), 0, "short rows stay in one block");
    assert_eq!(split_rows(&k512, 8, 131_072, mi300), 0, "a row too long for the list");
    let mut det = k512.clone();
    det.deterministic_topk = true;
    assert_eq!(split_rows(&det, 8, 16_384, mi300), 0, "deterministic rows are never split");
}

#[test]
fn workspace_bytes_count_every_buffer() {
    use nsa_kernels::Target;
    use nsa_runtime::layer::WorkspaceNeeds;
    use nsa_runtime::ops::topk::TopkWorkspace;
    let n = WorkspaceNeeds {
        logits: 10,
        indices: 20,
        topk_split_rows: 2,
        decode_partials: 30,
        max_logits: 40,
        gathered_keys: 5,
        ragged_kv: 7,
    };
    let want = 4 * (10 + 20 + 30 + 40) + 5 * 132 + 2 * 7 + TopkWorkspace::bytes_for(2, Target::Sm90a);
    assert_eq!(n.bytes(Target::Sm90a), want);
    let m = n.max(WorkspaceNeeds { logits: 99, ..Default::default() });
    assert_eq!((m.logits, m.indices), (99, 20));
}

#[test]
fn batch_invariant_decode_splits_do_not_follow_the_batch() {
    let mut c = cfg(KvCacheFormat::Fp8, 64, 128);
    let splits = |c: &LayerConfig, rows| match StepDecisions::for_graph(c, ForwardMode::Decode, rows, 4096, H200)
        .unwrap()
        .attention
    {
        AttentionStage::Decode(p) => p.splits,
        other => panic!("{other:?}"),
    };
    // The default fills the GPU: many splits for one row, none for many rows.
    assert!(splits(&c, 1) > splits(&c, 256), "{} vs {}", splits(&c, 1), splits(&c, 256));
    c.batch_invariant = true;
    let fixed = splits(&c, 1);
    for rows in [2, 7, 32, 200, 1024] {
        assert_eq!(splits(&c, rows), fixed, "{rows} rows");
    }
    assert!(c.deterministic_ties(), "batch invariance implies deterministic top-k");
    let d = StepDecisions::for_graph(&c, ForwardMode::Decode, 8, 4096, H200).unwrap();
    assert!(d.explain(&c).iter().any(|l| l.contains("deterministic ties")), "{:?}", d.explain(&c));
}

#[test]
fn a_context_parallel_rank_plans_its_share_of_the_tokens() {
    use nsa_runtime::metadata::CpRank;
    let c = cfg(KvCacheFormat::Fp8, 64, 16);
    let (seq, ext) = ([3000, 2500], [300, 200]);
    let width = 3008;
    let data = table(2, width, 64);
    let t = ReqToToken::new(&data, width).unwrap();
    let prefix: Vec<i32> = seq.iter().zip(&ext).map(|(s, e)| s - e).collect();
    let batch =
        ExtendBatch { req_pool_indices: &[0, 1], seq_lens: &seq, extend_lens: &ext, prefix_lens: Some(&prefix) };
    let summary = BatchSummary { mode: ForwardMode::Extend, seq_lens: &seq, extend_num_tokens: 500 };
    let dispatch = decide(&policy(&c, PrefillBackend::Auto, true), Some(&summary));
    let mut rows = 0;
    for rank in 0..3 {
        let params = MetadataParams {
            cp: Some(CpRank::new(rank, 3).unwrap()),
            ..MetadataParams::from_config(&c.model, 2 * width + 64)
        };
        let md = MetadataBuilder::new(params).unwrap().extend(&t, batch, dispatch.extend_plan()).unwrap();
        assert!(md.bs_idx.is_some());
        let s = Step { md, dispatch: dispatch.clone() };
        let d = decide_step(&c, &s);
        assert_eq!(d.rows, s.md.num_tokens());
        rows += d.rows;
    }
    assert_eq!(rows, 500, "the ranks' rows cover every token once");
}
