//! Property tests: random batches in every mode satisfy the invariants of spec §10
//! (monotone cu arrays, clip ≤ top-k, expanded lengths ending at the KV length,
//! ke − ks = expanded, real table = strided table / page, CP split preserving tokens),
//! and CUDA-graph replay writes what the eager builder computes.

mod metadata_util;

use metadata_util::{arange, cu, real_of, Table};
use nsa_runtime::metadata::{
    CpRank, ExtendBatch, ExtendPlan, ForwardMode, GraphCapacity, GraphMode, GraphState, MetadataBuilder, NsaMetadata,
    RealPageTable, Requests, TransformMethod,
};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::SeedableRng;

const ROWS: usize = 6;
const WIDTH: usize = 320;

/// A random batch: page size, top-k, D, a shuffled page-aligned table, and per-request
/// (row, seq len, extend len) with `extend ≤ seq` and `seq + D ≤ WIDTH`.
#[derive(Clone, Debug)]
struct Case {
    table: Table,
    topk: u32,
    d: u32,
    rpi: Vec<i32>,
    seq: Vec<i32>,
    ext: Vec<i32>,
}

impl Case {
    fn prefix(&self) -> Vec<i32> {
        self.seq.iter().zip(&self.ext).map(|(l, e)| l - e).collect()
    }
    fn reqs(&self) -> Requests<'_> {
        Requests { req_pool_indices: &self.rpi, seq_lens: &self.seq }
    }
}

fn case() -> impl Strategy<Value = Case> {
    let reqs = prop::collection::vec((0..ROWS as i32, 0..=(WIDTH as i32 - 4), any::<u16>()), 0..7);
    (prop_oneof![Just(1u32), Just(64u32)], prop_oneof![Just(4u32), Just(64), Just(2048)], 1..4u32, reqs, any::<u64>())
        .prop_map(|(page, topk, d, reqs, seed)| {
            let pages = ROWS * WIDTH.div_ceil(page as usize);
            let mut order: Vec<u32> = (1..=pages as u32).collect();
            order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
            let table = Table::paged(ROWS, WIDTH, page, Some(&order));
            let rpi = reqs.iter().map(|r| r.0).collect();
            let seq: Vec<i32> = reqs.iter().map(|r| r.1).collect();
            // Extend lengths biased towards small (chunked / draft) and full (prefill).
            let ext = reqs
                .iter()
                .map(|&(_, l, x)| match x % 3 {
                    0 => l,
                    1 => (x as i32 / 3) % (l.min(5) + 1),
                    _ => (x as i32 / 3) % (l + 1),
                })
                .collect();
            Case { table, topk, d, rpi, seq, ext }
        })
}

fn monotone_from_zero(v: &[i32]) -> bool {
    v.first() == Some(&0) && v.windows(2).all(|w| w[0] <= w[1])
}

/// Invariants every mode shares.
fn common(md: &NsaMetadata, c: &Case) -> Result<(), TestCaseError> {
    prop_assert_eq!(&md.cu_seqlens_k, &cu(&md.cache_seqlens));
    prop_assert!(monotone_from_zero(&md.cu_seqlens_k) && monotone_from_zero(&md.cu_seqlens_q));
    prop_assert_eq!(md.max_seq_len_k, md.cache_seqlens.iter().max().map_or(0, |&m| m as usize));
    // Clip.
    prop_assert_eq!(md.nsa_cache_seqlens.len(), md.nsa_seqlens_expanded.len());
    for (&n, &e) in md.nsa_cache_seqlens.iter().zip(&md.nsa_seqlens_expanded) {
        prop_assert!(n == e.min(c.topk as i32) && n <= c.topk as i32 && e >= 0);
    }
    prop_assert_eq!(&md.nsa_cu_seqlens_k, &cu(&md.nsa_cache_seqlens));
    prop_assert!(monotone_from_zero(&md.nsa_cu_seqlens_k));
    prop_assert_eq!(&md.nsa_cu_seqlens_q, &arange(md.nsa_cu_seqlens_k.len()));
    prop_assert_eq!(md.seq_lens_sum, c.seq.iter().map(|&l| l as usize).sum::<usize>());
    // Real table = strided table / page (or the alias).
    prop_assert_eq!(md.page_table_1.width, md.max_seq_len_k);
    if c.table.page == 1 {
        prop_assert_eq!(&md.real_page_table, &RealPageTable::Aliased);
    } else {
        let rows: Vec<&[i32]> = (0..md.page_table_1.rows).map(|r| md.page_table_1.row(r)).collect();
        prop_assert_eq!(&md.real_table().data, &real_of(&rows, md.max_seq_len_k, c.table.page));
        prop_assert_eq!(md.real_table().rows, md.page_table_1.rows);
    }
    Ok(())
}

/// Decode-like: request k owns `q_k` consecutive tokens whose lengths run up to its
/// KV length, and one page-table row each.
fn decode_like(md: &NsaMetadata, c: &Case, q: &[i32], kv_add: i32) -> Result<(), TestCaseError> {
    common(md, c)?;
    let expect_kv: Vec<i32> = c.seq.iter().map(|l| l + kv_add).collect();
    prop_assert_eq!(&md.cache_seqlens, &expect_kv);
    prop_assert_eq!(&md.nsa_extend_seq_lens, &q.to_vec());
    let t: usize = q.iter().map(|&n| n as usize).sum();
    prop_assert_eq!(&md.cu_seqlens_q, &arange(t + 1));
    prop_assert_eq!(md.page_table_1.rows, t);
    prop_assert_eq!(md.max_seq_len_q, 1);
    let mut tok = 0;
    for (k, &n) in q.iter().enumerate() {
        let seg = &md.nsa_seqlens_expanded[tok..tok + n as usize];
        let want: Vec<i32> = (expect_kv[k] - n + 1..=expect_kv[k]).collect();
        prop_assert_eq!(seg, &want[..], "request {}", k);
        for r in tok..tok + n as usize {
            prop_assert_eq!(md.page_table_1.row(r), &c.table.row(c.rpi[k] as usize)[..md.max_seq_len_k]);
        }
        tok += n as usize;
    }
    prop_assert!(md.indexer.is_none() && md.topk_indices_offset.is_none() && md.page_table_1_flattened.is_none());
    Ok(())
}

/// Extend (any CP rank): ranges, offsets, selected rows, flattened table.
fn extend(md: &NsaMetadata, c: &Case, plan: ExtendPlan) -> Result<(), TestCaseError> {
    common(md, c)?;
    let sel: Vec<usize> =
        md.bs_idx.as_ref().map_or((0..c.seq.len()).collect(), |b| b.iter().map(|&i| i as usize).collect());
    let kv: Vec<i32> = sel.iter().map(|&i| c.seq[i]).collect();
    prop_assert_eq!(&md.cache_seqlens, &kv);
    prop_assert_eq!(&md.indexer_seq_lens, &kv);
    prop_assert_eq!(md.nsa_extend_seq_lens.len(), sel.len());
    prop_assert_eq!(md.nsa_extend_seq_lens.iter().sum::<i32>() as usize, md.num_tokens());
    for (k, &i) in sel.iter().enumerate() {
        prop_assert_eq!(md.page_table_1.row(k), &c.table.row(c.rpi[i] as usize)[..md.max_seq_len_k]);
    }
    let r = md.indexer.as_ref().unwrap();
    prop_assert_eq!(r.ks.len(), md.num_tokens());
    let mut prev = (0, 0);
    for t in 0..md.num_tokens() {
        let b = r.token_to_batch_idx[t] as usize;
        prop_assert!(b < sel.len());
        prop_assert_eq!(r.ke[t] - r.ks[t], md.nsa_seqlens_expanded[t]);
        prop_assert_eq!(r.ks[t], md.cu_seqlens_k[b]);
        prop_assert!(r.ke[t] <= md.cu_seqlens_k[b + 1] && md.nsa_seqlens_expanded[t] >= 1);
        // Within a request, tokens come in order with growing visible lengths.
        prop_assert!((b, r.ke[t]) > prev);
        prev = (b, r.ke[t]);
    }
    match plan.transform {
        TransformMethod::Ragged => {
            let want: Vec<i32> = r.token_to_batch_idx.iter().map(|&b| md.cu_seqlens_k[b as usize]).collect();
            prop_assert_eq!(md.topk_indices_offset.as_ref(), Some(&want));
        }
        TransformMethod::Paged => prop_assert!(md.topk_indices_offset.is_none()),
    }
    let has_prefix = c.prefix().iter().any(|&p| p > 0);
    let flat_wanted = has_prefix && (plan.transform == TransformMethod::Ragged || plan.mha_fp8_dequant);
    prop_assert_eq!(md.page_table_1_flattened.is_some(), flat_wanted);
    if let Some(flat) = &md.page_table_1_flattened {
        let want: Vec<i32> =
            sel.iter().flat_map(|&i| c.table.row(c.rpi[i] as usize)[..c.seq[i] as usize].to_vec()).collect();
        prop_assert_eq!(flat, &want);
    }
    Ok(())
}

fn builder(c: &Case, cp: Option<CpRank>) -> MetadataBuilder {
    let mut p = c.table.params(c.topk, c.d);
    p.cp = cp;
    MetadataBuilder::new(p).unwrap()
}

proptest! {
    #[test]
    fn decode_invariants(c in case()) {
        let md = builder(&c, None).decode(&c.table.view(), c.reqs()).unwrap();
        prop_assert_eq!(md.mode, ForwardMode::Decode);
        decode_like(&md, &c, &vec![1; c.seq.len()], 0)?;
        prop_assert_eq!(&md.nsa_seqlens_expanded, &md.cache_seqlens);
    }

    #[test]
    fn target_verify_invariants(c in case()) {
        let md = builder(&c, None).target_verify(&c.table.view(), c.reqs()).unwrap();
        decode_like(&md, &c, &vec![c.d as i32; c.seq.len()], c.d as i32)?;
    }

    #[test]
    fn draft_extend_invariants(c in case()) {
        let md = builder(&c, None).draft_extend(&c.table.view(), c.reqs(), &c.ext).unwrap();
        decode_like(&md, &c, &c.ext, 0)?;
    }

    #[test]
    fn draft_extend_v2_invariants(c in case()) {
        let ok = c.seq.iter().all(|&l| l >= c.d as i32);
        let r = builder(&c, None).draft_extend_v2(&c.table.view(), c.reqs());
        prop_assert_eq!(r.is_ok(), ok);
        if let Ok(md) = r {
            decode_like(&md, &c, &vec![c.d as i32; c.seq.len()], 0)?;
        }
    }

    #[test]
    fn extend_invariants(c in case(), ragged in any::<bool>(), dequant in any::<bool>()) {
        let transform = if ragged { TransformMethod::Ragged } else { TransformMethod::Paged };
        let plan = ExtendPlan { transform, mha_fp8_dequant: dequant };
        let prefix = c.prefix();
        let batch = ExtendBatch { req_pool_indices: &c.rpi, seq_lens: &c.seq, extend_lens: &c.ext, prefix_lens: Some(&prefix) };
        let md = builder(&c, None).extend(&c.table.view(), batch, plan).unwrap();
        extend(&md, &c, plan)?;
        // Without CP every request is kept and every token sees its causal prefix.
        prop_assert_eq!(&md.nsa_extend_seq_lens, &c.ext);
        let mut want = Vec::new();
        for (&l, &e) in c.seq.iter().zip(&c.ext) {
            want.extend(l - e + 1..=l);
        }
        prop_assert_eq!(&md.nsa_seqlens_expanded, &want);
        if prefix.iter().any(|&p| p > 0) {
            prop_assert_eq!(&md.cu_seqlens_q, &cu(&c.ext));
        } else {
            prop_assert_eq!(&md.cu_seqlens_q, &md.cu_seqlens_k);
        }
    }

    #[test]
    fn cp_split_preserves_tokens(c in case(), size in 1..5u32) {
        let plan = ExtendPlan { transform: TransformMethod::Ragged, mha_fp8_dequant: false };
        let prefix = c.prefix();
        let batch = ExtendBatch { req_pool_indices: &c.rpi, seq_lens: &c.seq, extend_lens: &c.ext, prefix_lens: Some(&prefix) };
        let whole = builder(&c, None).extend(&c.table.view(), batch, plan).unwrap();
        let ranks: Vec<NsaMetadata> = (0..size)
            .map(|r| builder(&c, Some(CpRank::new(r, size).unwrap())).extend(&c.table.view(), batch, plan).unwrap())
            .collect();
        let mut per_request = vec![0; c.seq.len()];
        for (r, md) in ranks.iter().enumerate() {
            extend(md, &c, plan)?;
            // Rank r holds global tokens r, r + size, … of the whole batch.
            let mine: Vec<i32> = whole.nsa_seqlens_expanded.iter().skip(r).step_by(size as usize).copied().collect();
            prop_assert_eq!(&md.nsa_seqlens_expanded, &mine);
            let sel: Vec<usize> = md.bs_idx.as_ref().map_or((0..c.seq.len()).collect(), |b| b.iter().map(|&i| i as usize).collect());
            for (k, &i) in sel.iter().enumerate() {
                per_request[i] += md.nsa_extend_seq_lens[k];
            }
            if size > 1 && !c.ext.is_empty() && c.ext.iter().any(|&e| e > 0) {
                prop_assert!(md.bs_idx.is_some());
                prop_assert!(md.nsa_extend_seq_lens.iter().all(|&n| n > 0));
            }
        }
        prop_assert_eq!(&per_request, &c.ext);
        let total: usize = ranks.iter().map(NsaMetadata::num_tokens).sum();
        prop_assert_eq!(total, whole.num_tokens());
    }

    #[test]
    fn graph_replay_equals_eager(c in case(), mode_ix in 0..4usize, warm in case()) {
        let mode = [GraphMode::Decode, GraphMode::TargetVerify, GraphMode::DraftExtend, GraphMode::DraftExtendV2][mode_ix];
        let per_req = if mode == GraphMode::Decode { 1 } else { c.d as usize };
        let cap = GraphCapacity { max_bs: 6, max_tokens: 6 * per_req, max_context_len: WIDTH };
        let mut g = GraphState::new(c.table.params(c.topk, c.d), mode, cap).unwrap();
        g.capture(&[1; 6]).unwrap();
        let before = g.allocation_fingerprint();
        let b = builder(&c, None);
        let t = c.table.view();
        // Clamp accept lengths to D so they fit the captured rows.
        let accept: Vec<i32> = c.ext.iter().map(|&e| e.min(c.d as i32)).collect();
        // A first replay with another batch leaves stale data behind; it must not matter.
        let warm_reqs = Requests { req_pool_indices: &warm.rpi, seq_lens: &warm.seq };
        let warm_accept: Vec<i32> = warm.ext.iter().map(|&e| e.min(c.d as i32)).collect();
        let (e, md) = match mode {
            GraphMode::Decode => {
                let _ = g.replay_decode(&t, warm_reqs);
                (g.replay_decode(&t, c.reqs()), b.decode(&t, c.reqs()))
            }
            GraphMode::TargetVerify => {
                let _ = g.replay_target_verify(&t, warm_reqs);
                (g.replay_target_verify(&t, c.reqs()), b.target_verify(&t, c.reqs()))
            }
            GraphMode::DraftExtend => {
                let _ = g.replay_draft_extend(&t, warm_reqs, &warm_accept);
                (g.replay_draft_extend(&t, c.reqs(), &accept), b.draft_extend(&t, c.reqs(), &accept))
            }
            GraphMode::DraftExtendV2 => {
                let _ = g.replay_draft_extend_v2(&t, warm_reqs);
                (g.replay_draft_extend_v2(&t, c.reqs()), b.draft_extend_v2(&t, c.reqs()))
            }
        };
        prop_assert_eq!(e.is_ok(), md.is_ok());
        prop_assert_eq!(g.allocation_fingerprint(), before);
        let (Ok(e), Ok(md)) = (e, md) else { return Ok(()) };
        prop_assert_eq!((e.bs, e.rows, e.size, e.page_cols), (md.bs(), md.page_table_1.rows, md.num_tokens(), md.max_seq_len_k));
        prop_assert_eq!(&g.cache_seqlens()[..e.bs], &md.cache_seqlens[..]);
        prop_assert_eq!(&g.cu_seqlens_k()[..=e.bs], &md.cu_seqlens_k[..]);
        prop_assert_eq!(&g.nsa_seqlens_expanded()[..e.size], &md.nsa_seqlens_expanded[..]);
        prop_assert_eq!(&g.nsa_cache_seqlens()[..e.size], &md.nsa_cache_seqlens[..]);
        prop_assert_eq!(&g.nsa_cu_seqlens_k()[..=e.size], &md.nsa_cu_seqlens_k[..]);
        for r in 0..e.rows {
            prop_assert_eq!(&g.page_table_1().row(r)[..e.page_cols], md.page_table_1.row(r));
            if c.table.page > 1 {
                prop_assert_eq!(&g.real_table().row(r)[..e.real_cols], md.real_table().row(r));
            }
        }
    }
}
