//! Every class of inconsistent batch description is rejected on the host with an
//! error naming the field, the value and what is allowed.

mod metadata_util;

use metadata_util::Table;
use nsa_runtime::metadata::{
    CpRank, ExtendBatch, ExtendPlan, GraphCapacity, GraphMode, GraphState, MetadataBuilder, MetadataParams,
    MultiStepGraphs, ReqToToken, Requests,
};
use nsa_runtime::Error;

const TOPK: u32 = 2048;

/// Asserts `r` is an `InvalidArgument` on `field` whose value and expectation
/// contain the given fragments, and that the message shows all three.
#[track_caller]
fn expect_err<T: std::fmt::Debug>(r: nsa_runtime::Result<T>, field: &str, value: &str, expected: &str) {
    match r {
        Err(e @ Error::InvalidArgument { .. }) => {
            let Error::InvalidArgument { field: f, value: v, expected: x } = &e else { unreachable!() };
            assert_eq!(*f, field, "{e}");
            assert!(v.contains(value), "value {v:?} lacks {value:?}");
            assert!(x.contains(expected), "expected {x:?} lacks {expected:?}");
            let msg = e.to_string();
            assert!(msg.contains(field) && msg.contains(v.as_str()) && msg.contains(x.as_str()), "{msg}");
        }
        other => panic!("expected an error on `{field}`, got {other:?}"),
    }
}

fn table() -> Table {
    Table::paged(4, 256, 64, None)
}

fn reqs<'a>(rpi: &'a [i32], lens: &'a [i32]) -> Requests<'a> {
    Requests { req_pool_indices: rpi, seq_lens: lens }
}

// ---------------------------------------------------------------- lengths of different sizes

#[test]
fn mismatched_lengths() {
    let t = table();
    let b = t.builder(TOPK, 2);
    expect_err(b.decode(&t.view(), reqs(&[0, 1, 2], &[5, 6])), "req_pool_indices", "3 entries", "2 entries");
    expect_err(b.target_verify(&t.view(), reqs(&[0], &[5, 6])), "req_pool_indices", "1 entries", "as `seq_lens`");
    expect_err(b.draft_extend(&t.view(), reqs(&[0, 1], &[5, 6]), &[1]), "extend_lens", "1 entries", "2 entries");
    let plan = ExtendPlan::default();
    let batch = ExtendBatch { req_pool_indices: &[0, 1], seq_lens: &[5, 6], extend_lens: &[5], prefix_lens: None };
    expect_err(b.extend(&t.view(), batch, plan), "extend_lens", "1 entries", "2 entries");
    let batch =
        ExtendBatch { req_pool_indices: &[0, 1], seq_lens: &[5, 6], extend_lens: &[1, 2], prefix_lens: Some(&[4]) };
    expect_err(b.extend(&t.view(), batch, plan), "prefix_lens", "1 entries", "2 entries");
}

#[test]
fn ragged_req_to_token() {
    expect_err(ReqToToken::new(&[0; 10], 4), "req_to_token", "10 entries with width 4", "whole number of rows");
    expect_err(ReqToToken::new(&[], 0), "req_to_token", "width 0", "non-zero width");
}

// ---------------------------------------------------------------- extend > seq len, negative lengths

#[test]
fn extend_longer_than_seq_len() {
    let t = table();
    let b = t.builder(TOPK, 2);
    expect_err(
        b.draft_extend(&t.view(), reqs(&[0, 1], &[5, 6]), &[2, 7]),
        "extend_lens",
        "extend_lens[1] = 7",
        "seq_lens[1] = 6",
    );
    let batch =
        ExtendBatch { req_pool_indices: &[0, 1], seq_lens: &[5, 6], extend_lens: &[9, 1], prefix_lens: Some(&[0, 5]) };
    expect_err(
        b.extend(&t.view(), batch, ExtendPlan::default()),
        "extend_lens",
        "extend_lens[0] = 9",
        "seq_lens[0] = 5",
    );
    // Draft-extend v2 extends by D = 2: a request of length 1 cannot.
    expect_err(b.draft_extend_v2(&t.view(), reqs(&[0, 1], &[5, 1])), "seq_lens", "seq_lens[1] = 1", "at least D = 2");
}

#[test]
fn prefix_plus_extend_must_equal_seq_len() {
    let t = table();
    let b = t.builder(TOPK, 0);
    let batch =
        ExtendBatch { req_pool_indices: &[0, 1], seq_lens: &[6, 3], extend_lens: &[2, 3], prefix_lens: Some(&[3, 0]) };
    expect_err(
        b.extend(&t.view(), batch, ExtendPlan::default()),
        "prefix_lens",
        "prefix_lens[0] = 3 with extend_lens[0] = 2",
        "seq_lens[0] = 6",
    );
    let batch = ExtendBatch { req_pool_indices: &[0, 1], seq_lens: &[6, 3], extend_lens: &[2, 3], prefix_lens: None };
    expect_err(b.extend(&t.view(), batch, ExtendPlan::default()), "extend_lens", "extend_lens[0] = 2", "pure prefill");
}

#[test]
fn negative_lengths() {
    let t = table();
    let b = t.builder(TOPK, 0);
    expect_err(b.decode(&t.view(), reqs(&[0, 1], &[5, -1])), "seq_lens", "seq_lens[1] = -1", "≥ 0");
    expect_err(b.draft_extend(&t.view(), reqs(&[0], &[5]), &[-2]), "extend_lens", "extend_lens[0] = -2", "≥ 0");
    let batch = ExtendBatch { req_pool_indices: &[0], seq_lens: &[5], extend_lens: &[5], prefix_lens: Some(&[-2]) };
    expect_err(b.extend(&t.view(), batch, ExtendPlan::default()), "prefix_lens", "prefix_lens[0] = -2", "≥ 0");
}

// ---------------------------------------------------------------- table rows, widths, slots, page size

#[test]
fn request_row_outside_the_table() {
    let t = table();
    let b = t.builder(TOPK, 0);
    expect_err(b.decode(&t.view(), reqs(&[0, 4], &[5, 6])), "req_pool_indices", "req_pool_indices[1] = 4", "0..4");
    expect_err(b.decode(&t.view(), reqs(&[-1], &[5])), "req_pool_indices", "= -1", "a row of req_to_token");
}

#[test]
fn seq_len_wider_than_the_table() {
    let t = table();
    expect_err(t.builder(TOPK, 0).decode(&t.view(), reqs(&[0], &[257])), "seq_lens", "257", "width 256");
    // Verify adds D: 255 + 2 > 256.
    expect_err(t.builder(TOPK, 2).target_verify(&t.view(), reqs(&[0], &[255])), "seq_lens", "257", "width 256");
}

#[test]
fn slot_outside_the_pool() {
    let mut t = table();
    t.data[256 + 3] = t.pool_slots as i32; // row 1, position 3
    let b = t.builder(TOPK, 0);
    let pool = t.pool_slots.to_string();
    expect_err(
        b.decode(&t.view(), reqs(&[1], &[10])),
        "req_to_token",
        &format!("slot {pool} at row 1"),
        &format!("0..{pool}"),
    );
    // Positions past the request's length are not read, hence not checked.
    assert!(b.decode(&t.view(), reqs(&[1], &[3])).is_ok());
    t.data[256 + 3] = -5;
    expect_err(b.decode(&t.view(), reqs(&[1], &[10])), "req_to_token", "slot -5", "a slot in 0..");
}

#[test]
fn page_size_mismatch() {
    // A table laid out for page size 1 (arbitrary slots) given to a page-64 builder.
    let slots: Vec<i32> = (0..128).map(|p| (p * 7) % 128).collect();
    let t = ReqToToken::new(&slots, 128).unwrap();
    let b = MetadataBuilder::new(MetadataParams {
        page_size: 64,
        topk: TOPK,
        draft_tokens: 0,
        pool_slots: 1 << 16,
        cp: None,
    })
    .unwrap();
    expect_err(
        b.decode(&t, reqs(&[0], &[10])),
        "req_to_token",
        "slot 7 at row 0 (request 0), position 1",
        "page_size 64",
    );
    // A page-aligned table whose page starts mid-page.
    let mut t64 = table();
    for s in &mut t64.data[..64] {
        *s += 1;
    }
    let b = t64.builder(TOPK, 0);
    expect_err(b.decode(&t64.view(), reqs(&[0], &[10])), "req_to_token", "position 0", "offset 0 of its page");

    // Graph states of different page sizes cannot share replays.
    let t1 = Table::paged(2, 64, 1, None);
    let t2 = Table::paged(2, 64, 64, None);
    let cap = GraphCapacity { max_bs: 2, max_tokens: 2, max_context_len: 64 };
    let mut a = GraphState::new(t1.params(TOPK, 0), GraphMode::Decode, cap).unwrap();
    let mut c = GraphState::new(t2.params(TOPK, 0), GraphMode::Decode, cap).unwrap();
    let e = c.replay_decode(&t2.view(), reqs(&[0], &[5])).unwrap();
    expect_err(a.copy_replay_from(&c, e), "page_size", "64", "1 (the destination's page size)");
}

// ---------------------------------------------------------------- parameters

#[test]
fn bad_parameters() {
    let p = MetadataParams { page_size: 64, topk: TOPK, draft_tokens: 0, pool_slots: 1 << 16, cp: None };
    expect_err(MetadataBuilder::new(MetadataParams { page_size: 0, ..p }), "page_size", "0", "≥ 1");
    expect_err(MetadataBuilder::new(MetadataParams { topk: 0, ..p }), "topk", "0", "≥ 1");
    expect_err(
        MetadataBuilder::new(MetadataParams { cp: Some(CpRank { rank: 2, size: 2 }), ..p }),
        "cp",
        "rank 2 of size 2",
        "0..size",
    );
    expect_err(CpRank::new(0, 0), "cp", "size 0", "size ≥ 1");
    let t = table();
    let b = t.builder(TOPK, 0);
    expect_err(b.target_verify(&t.view(), reqs(&[0], &[5])), "draft_tokens", "0", "D ≥ 1");
    expect_err(b.draft_extend_v2(&t.view(), reqs(&[0], &[5])), "draft_tokens", "0", "draft-extend v2");
}

// ---------------------------------------------------------------- CUDA-graph capacity

#[test]
fn graph_capacity_errors() {
    let t = table();
    let cap = GraphCapacity { max_bs: 2, max_tokens: 4, max_context_len: 256 };
    // Verify with D = 3 needs max_bs × 3 = 6 rows.
    expect_err(GraphState::new(t.params(TOPK, 3), GraphMode::TargetVerify, cap), "max_tokens", "4", "max_bs × 3 = 6");
    expect_err(GraphState::new(t.params(TOPK, 0), GraphMode::DraftExtend, cap), "draft_tokens", "0", "D ≥ 1");
    expect_err(MultiStepGraphs::new(t.params(TOPK, 0), cap, 0), "speculative_num_steps", "0", "at least 1");

    let mut g = GraphState::new(t.params(TOPK, 2), GraphMode::DraftExtend, cap).unwrap();
    // bs > capacity, at capture and at replay.
    expect_err(g.capture(&[1, 1, 1]), "bs", "3", "max_bs = 2");
    expect_err(g.replay_draft_extend(&t.view(), reqs(&[0, 1, 2], &[5, 5, 5]), &[1, 1, 1]), "bs", "3", "max_bs = 2");
    // Σ accept lengths beyond the bs × D rows of the captured graph.
    expect_err(
        g.replay_draft_extend(&t.view(), reqs(&[0], &[9]), &[3]),
        "extend_lens",
        "Σ extend_lens = 3",
        "bs × D = 2",
    );
    // Wrong replay for the state's mode.
    expect_err(g.replay_decode(&t.view(), reqs(&[0], &[5])), "mode", "decode", "draft_extend");
    // Longer than the graph's page-table width.
    let wide = Table::paged(1, 512, 64, None);
    let mut d = GraphState::new(wide.params(TOPK, 0), GraphMode::Decode, cap).unwrap();
    expect_err(d.replay_decode(&wide.view(), reqs(&[0], &[300])), "seq_lens", "300", "max_context_len = 256");
    // A slot outside the pool at replay.
    let mut bad = table();
    bad.data[5] = bad.pool_slots as i32 + 64;
    let mut g = GraphState::new(bad.params(TOPK, 0), GraphMode::Decode, cap).unwrap();
    expect_err(g.replay_decode(&bad.view(), reqs(&[0], &[10])), "req_to_token", "position 5", "KV pool");
}

#[test]
fn int32_overflow_is_reported() {
    // Σ seq lens beyond i32 (rows are long and numerous, page size 1 keeps it cheap).
    let width = 1 << 20;
    let data = vec![0i32; width];
    let t = ReqToToken::new(&data, width).unwrap();
    let b = MetadataBuilder::new(MetadataParams { page_size: 1, topk: TOPK, draft_tokens: 0, pool_slots: 1, cp: None })
        .unwrap();
    let lens = vec![width as i32; 2100];
    let rpi = vec![0; 2100];
    expect_err(b.decode(&t, reqs(&rpi, &lens)), "seq_lens", "Σ KV lengths", "2^31-1");
}
