//! CUDA-graph state (spec §9): init values, capture per mode, replay per mode against
//! the eager builders, stale-data semantics, the fused-copy table and the multi-step
//! draft backend; replay never reallocates.

mod metadata_util;

use metadata_util::{arange, cu, Table};
use nsa_runtime::metadata::graph::SEQ_LEN_FILL;
use nsa_runtime::metadata::{
    GraphCapacity, GraphMode, GraphState, MultiStepGraphs, NsaMetadata, ReplayExtent, Requests,
};

const TOPK: u32 = 2048;

fn state(t: &Table, mode: GraphMode, d: u32, max_bs: usize, max_tokens: usize) -> GraphState {
    let cap = GraphCapacity { max_bs, max_tokens, max_context_len: t.width };
    GraphState::new(t.params(TOPK, d), mode, cap).unwrap()
}

/// What replay wrote equals the eager metadata of the same batch.
fn assert_replay_matches(g: &GraphState, e: ReplayExtent, md: &NsaMetadata) {
    assert_eq!(e.bs, md.bs());
    assert_eq!(e.rows, md.page_table_1.rows);
    assert_eq!(e.size, md.num_tokens());
    assert_eq!(e.page_cols, md.max_seq_len_k);
    assert_eq!(&g.cache_seqlens()[..e.bs], &md.cache_seqlens[..]);
    assert_eq!(&g.cu_seqlens_k()[..=e.bs], &md.cu_seqlens_k[..]);
    assert_eq!(&g.nsa_seqlens_expanded()[..e.size], &md.nsa_seqlens_expanded[..]);
    assert_eq!(&g.nsa_cache_seqlens()[..e.size], &md.nsa_cache_seqlens[..]);
    assert_eq!(&g.nsa_cu_seqlens_k()[..=e.size], &md.nsa_cu_seqlens_k[..]);
    assert_eq!(&g.cu_seqlens_q()[..=e.size], &md.nsa_cu_seqlens_q[..]);
    for r in 0..e.rows {
        assert_eq!(&g.page_table_1().row(r)[..e.page_cols], md.page_table_1.row(r), "page row {r}");
        if md.page_size > 1 {
            assert_eq!(&g.real_table().row(r)[..e.real_cols], md.real_table().row(r), "real row {r}");
        }
    }
}

// ---------------------------------------------------------------- §9.1 init

#[test]
fn init_values_9_1() {
    for page in [64, 1] {
        let t = Table::paged(4, 256, page, None);
        let g = state(&t, GraphMode::TargetVerify, 2, 3, 6);
        assert_eq!(g.cache_seqlens(), [SEQ_LEN_FILL; 3]);
        assert_eq!(g.cu_seqlens_k(), [0; 4]);
        assert_eq!(g.cu_seqlens_q(), arange(7));
        assert_eq!((g.page_table_1().rows, g.page_table_1().width), (6, 256));
        assert!(g.page_table_1().data.iter().all(|&s| s == 0));
        let real = g.real_table();
        if page == 1 {
            assert!(std::ptr::eq(real, g.page_table_1())); // aliased
        } else {
            assert_eq!((real.rows, real.width), (6, 4));
        }
        assert_eq!(g.shape(3).max_seq_len_k, 256);
    }
}

// ---------------------------------------------------------------- §9.2 capture

#[test]
fn capture_decode_9_2() {
    let t = Table::paged(4, 256, 64, None);
    let mut g = state(&t, GraphMode::Decode, 0, 4, 4);
    let shape = g.capture(&[1, 1, 1]).unwrap();
    assert_eq!((shape.bs, shape.rows, shape.max_seq_len_k, shape.max_seq_len_q), (3, 3, 256, 1));
    assert_eq!(&g.cache_seqlens()[..3], [1, 1, 1]);
    assert_eq!(&g.cu_seqlens_k()[..4], [0, 1, 2, 3]);
    assert_eq!(&g.nsa_cache_seqlens()[..3], [1, 1, 1]);
    assert_eq!(&g.nsa_cu_seqlens_k()[..4], [0, 1, 2, 3]);
    // Decode: expanded aliases cache_seqlens.
    assert!(std::ptr::eq(g.nsa_seqlens_expanded(), g.cache_seqlens()));
}

#[test]
fn capture_verify_and_draft_extend_add_d_9_2() {
    let t = Table::paged(4, 256, 64, None);
    for mode in [GraphMode::TargetVerify, GraphMode::DraftExtend, GraphMode::DraftExtendV2] {
        let mut g = state(&t, mode, 3, 2, 6);
        let shape = g.capture(&[1, 1]).unwrap();
        assert_eq!((shape.bs, shape.rows), (2, 6), "{mode:?}");
        assert_eq!(&g.cache_seqlens()[..2], [4, 4]);
        assert_eq!(&g.nsa_seqlens_expanded()[..6], [2, 3, 4, 2, 3, 4]);
        assert_eq!(g.nsa_cu_seqlens_k(), cu(&[2, 3, 4, 2, 3, 4]));
    }
}

// ---------------------------------------------------------------- §9.3 replay

#[test]
fn replay_decode_matches_eager_and_keeps_stale_data() {
    for page in [64, 1] {
        let t = Table::paged(6, 256, page, None);
        let b = t.builder(TOPK, 0);
        let mut g = state(&t, GraphMode::Decode, 0, 4, 4);
        g.capture(&[1, 1, 1]).unwrap();
        let reqs = Requests { req_pool_indices: &[5, 0, 3], seq_lens: &[5, 130, 64] };
        let e = g.replay_decode(&t.view(), reqs).unwrap();
        assert_eq!(
            e,
            ReplayExtent { bs: 3, rows: 3, size: 3, page_cols: 130, real_cols: if page == 1 { 0 } else { 3 } }
        );
        assert_replay_matches(&g, e, &b.decode(&t.view(), reqs).unwrap());
        assert_eq!(g.cache_seqlens()[3], SEQ_LEN_FILL); // past bs: untouched

        // A shorter batch: columns past its max_len and rows past its bs keep old values.
        let before = g.page_table_1().clone();
        let short = Requests { req_pool_indices: &[2, 1], seq_lens: &[3, 10] };
        let e2 = g.replay_decode(&t.view(), short).unwrap();
        assert_replay_matches(&g, e2, &b.decode(&t.view(), short).unwrap());
        assert_eq!(&g.page_table_1().row(0)[10..130], &before.row(0)[10..130]);
        assert_eq!(g.page_table_1().row(2), before.row(2));
        assert_eq!(g.cache_seqlens()[2], 64);
        assert_eq!(g.last_replay(), Some(e2));
    }
}

#[test]
fn replay_target_verify_matches_eager() {
    for page in [64, 1] {
        let t = Table::paged(3, 128, page, None);
        let b = t.builder(TOPK, 3);
        let mut g = state(&t, GraphMode::TargetVerify, 3, 2, 6);
        g.capture(&[1, 1]).unwrap();
        let reqs = Requests { req_pool_indices: &[1, 2], seq_lens: &[10, 4] };
        let e = g.replay_target_verify(&t.view(), reqs).unwrap();
        assert_eq!((e.bs, e.rows, e.size, e.page_cols), (2, 6, 6, 13));
        assert_eq!(&g.cache_seqlens()[..2], [13, 7]);
        assert_eq!(&g.nsa_seqlens_expanded()[..6], [11, 12, 13, 5, 6, 7]);
        assert_replay_matches(&g, e, &b.target_verify(&t.view(), reqs).unwrap());
    }
}

#[test]
fn replay_draft_extend_uneven_accept_lengths_leaves_stale_tail() {
    for page in [64, 1] {
        let t = Table::paged(2, 64, page, None);
        let b = t.builder(TOPK, 3);
        let mut g = state(&t, GraphMode::DraftExtend, 3, 2, 6);
        g.capture(&[1, 1]).unwrap(); // expanded [2,3,4,2,3,4], nsa_cu [0,2,5,9,11,14,18]
        let reqs = Requests { req_pool_indices: &[0, 1], seq_lens: &[12, 6] };
        let e = g.replay_draft_extend(&t.view(), reqs, &[2, 1]).unwrap();
        assert_eq!((e.bs, e.rows, e.size, e.page_cols), (2, 3, 3, 12));
        assert_eq!(&g.cache_seqlens()[..2], [12, 6]); // no +D on replay
        assert_eq!(&g.extend_lens()[..2], [2, 1]);
        assert_replay_matches(&g, e, &b.draft_extend(&t.view(), reqs, &[2, 1]).unwrap());
        // Rows 3..6 of the captured graph keep capture-time values.
        assert_eq!(g.nsa_seqlens_expanded(), [11, 12, 6, 2, 3, 4]);
        assert_eq!(g.nsa_cu_seqlens_k(), [0, 11, 23, 29, 11, 14, 18]);
    }
}

#[test]
fn replay_draft_extend_v2_uses_d() {
    let t = Table::paged(2, 64, 64, None);
    let b = t.builder(TOPK, 2);
    let mut g = state(&t, GraphMode::DraftExtendV2, 2, 2, 4);
    g.capture(&[1, 1]).unwrap();
    let reqs = Requests { req_pool_indices: &[1, 0], seq_lens: &[12, 6] };
    let e = g.replay_draft_extend_v2(&t.view(), reqs).unwrap();
    assert_eq!(&g.nsa_seqlens_expanded()[..4], [11, 12, 5, 6]);
    assert_eq!(&g.extend_lens()[..2], [2, 2]);
    assert_replay_matches(&g, e, &b.draft_extend_v2(&t.view(), reqs).unwrap());
}

#[test]
fn replay_bs1_and_empty() {
    let t = Table::paged(2, 64, 64, None);
    let mut g = state(&t, GraphMode::Decode, 0, 2, 2);
    let e = g.replay_decode(&t.view(), Requests { req_pool_indices: &[1], seq_lens: &[7] }).unwrap();
    assert_eq!((e.bs, e.page_cols, e.real_cols), (1, 7, 1));
    let e = g.replay_decode(&t.view(), Requests { req_pool_indices: &[], seq_lens: &[] }).unwrap();
    assert_eq!(e, ReplayExtent::default());
    assert_eq!(g.cache_seqlens()[0], 7);
}

#[test]
fn replay_never_reallocates() {
    let t = Table::paged(8, 512, 64, None);
    for (mode, d, per_req) in [
        (GraphMode::Decode, 0, 1),
        (GraphMode::TargetVerify, 3, 3),
        (GraphMode::DraftExtend, 3, 3),
        (GraphMode::DraftExtendV2, 3, 3),
    ] {
        let mut g = state(&t, mode, d, 4, 4 * per_req);
        let before = g.allocation_fingerprint();
        g.capture(&[1, 1, 1, 1]).unwrap();
        for (n, lens) in [(4, [500, 3, 64, 100]), (1, [9, 0, 0, 0]), (3, [65, 128, 129, 0]), (0, [0; 4])] {
            let reqs = Requests { req_pool_indices: &[7, 2, 5, 0][..n], seq_lens: &lens[..n] };
            match mode {
                GraphMode::Decode => g.replay_decode(&t.view(), reqs),
                GraphMode::TargetVerify => g.replay_target_verify(&t.view(), reqs),
                GraphMode::DraftExtend => g.replay_draft_extend(&t.view(), reqs, &[3, 1, 2, 0][..n]),
                GraphMode::DraftExtendV2 => g.replay_draft_extend_v2(&t.view(), reqs),
            }
            .unwrap_or_else(|e| panic!("{mode:?} bs {n}: {e}"));
            assert_eq!(g.allocation_fingerprint(), before, "{mode:?} bs {n}");
        }
    }
}

// ---------------------------------------------------------------- §9.4–9.6

#[test]
fn fused_copy_table_copies_only_the_extent() {
    let t = Table::paged(4, 256, 64, None);
    let mut src = state(&t, GraphMode::DraftExtend, 2, 2, 4);
    let mut dst = state(&t, GraphMode::DraftExtend, 2, 2, 4);
    src.capture(&[1, 1]).unwrap();
    dst.capture(&[5, 5]).unwrap(); // different stale values
    let reqs = Requests { req_pool_indices: &[3, 1], seq_lens: &[100, 70] };
    let e = src.replay_draft_extend(&t.view(), reqs, &[1, 2]).unwrap();
    dst.copy_replay_from(&src, e).unwrap();
    assert_eq!(&dst.cache_seqlens()[..2], &src.cache_seqlens()[..2]);
    assert_eq!(&dst.nsa_seqlens_expanded()[..3], [100, 69, 70]);
    assert_eq!(dst.nsa_seqlens_expanded()[3], 7); // dst's own capture value (5 + 2)
    assert_eq!(&dst.nsa_cu_seqlens_k()[..4], &src.nsa_cu_seqlens_k()[..4]);
    for r in 0..3 {
        assert_eq!(&dst.page_table_1().row(r)[..100], &src.page_table_1().row(r)[..100]);
        assert_eq!(&dst.real_table().row(r)[..2], &src.real_table().row(r)[..2]);
    }
    assert_eq!(dst.last_replay(), Some(e));
}

#[test]
fn multi_step_draft_backends_receive_identical_metadata() {
    let t = Table::paged(4, 256, 64, None);
    let cap = GraphCapacity { max_bs: 4, max_tokens: 4, max_context_len: 256 };
    let mut ms = MultiStepGraphs::new(t.params(TOPK, 0), cap, 4).unwrap();
    assert_eq!(ms.states().len(), 3);
    assert_eq!(ms.capture(&[1, 1, 1]).unwrap().map(|s| s.rows), Some(3));
    let mut direct = GraphState::new(t.params(TOPK, 0), GraphMode::Decode, cap).unwrap();
    direct.capture(&[1, 1, 1]).unwrap();
    let fingerprints: Vec<_> = ms.states().iter().map(GraphState::allocation_fingerprint).collect();
    for (rpi, lens) in [([0, 1, 2], [10, 200, 64]), ([3, 3, 0], [1, 2, 3])] {
        let reqs = Requests { req_pool_indices: &rpi, seq_lens: &lens };
        let e = ms.replay(&t.view(), reqs).unwrap().unwrap();
        let de = direct.replay_decode(&t.view(), reqs).unwrap();
        assert_eq!(e, de);
        for s in ms.states() {
            assert_eq!(s.cache_seqlens(), direct.cache_seqlens());
            assert_eq!(s.cu_seqlens_k(), direct.cu_seqlens_k());
            assert_eq!(s.page_table_1(), direct.page_table_1());
            assert_eq!(s.real_table(), direct.real_table());
            assert_eq!(s.nsa_cache_seqlens(), direct.nsa_cache_seqlens());
            assert_eq!(s.nsa_cu_seqlens_k(), direct.nsa_cu_seqlens_k());
        }
    }
    let after: Vec<_> = ms.states().iter().map(GraphState::allocation_fingerprint).collect();
    assert_eq!(after, fingerprints);

    // One step: no draft backends, nothing to replay.
    let mut one = MultiStepGraphs::new(t.params(TOPK, 0), cap, 1).unwrap();
    assert!(one.states().is_empty());
    assert_eq!(one.replay(&t.view(), Requests { req_pool_indices: &[0], seq_lens: &[1] }).unwrap(), None);
}
