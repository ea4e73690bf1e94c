//! The worked examples of spec §2.2, §3.2 and §4 (host metadata builders), plus the
//! edge cases: empty batch, bs = 1, requests shorter than top-k, page sizes 1 and 64.

mod metadata_util;

use metadata_util::{arange, cu, real_of, Table};
use nsa_runtime::metadata::{
    dp_padded_tokens, CpRank, DpPadding, ExtendBatch, ExtendPlan, ForwardMode, IndexerRanges, MetadataBuilder,
    MetadataParams, NsaMetadata, RealPageTable, Requests, TransformMethod,
};

const TOPK: u32 = 2048;

fn rows_of(md: &NsaMetadata) -> Vec<&[i32]> {
    (0..md.page_table_1.rows).map(|r| md.page_table_1.row(r)).collect()
}

/// Every page-table row of `md` is `t`'s row `want[i]` cut to `max_seq_len_k`.
fn assert_rows(md: &NsaMetadata, t: &Table, want: &[usize]) {
    assert_eq!(md.page_table_1.rows, want.len());
    assert_eq!(md.page_table_1.width, md.max_seq_len_k);
    for (r, &src) in want.iter().enumerate() {
        assert_eq!(md.page_table_1.row(r), &t.row(src)[..md.max_seq_len_k], "page row {r}");
    }
}

fn assert_real(md: &NsaMetadata, page: u32) {
    if page == 1 {
        assert_eq!(md.real_page_table, RealPageTable::Aliased);
        assert_eq!(md.real_table(), &md.page_table_1);
    } else {
        let real = md.real_table();
        assert_eq!(real.rows, md.page_table_1.rows);
        assert_eq!(real.width, md.max_seq_len_k.div_ceil(page as usize));
        assert_eq!(real.data, real_of(&rows_of(md), md.max_seq_len_k, page));
    }
}

// ---------------------------------------------------------------- §2.2

#[test]
fn real_page_table_example_2_2() {
    // Row [128..191, 640..675] (W = 100), page 64 → [2, 10].
    let row: Vec<i32> = (128..192).chain(640..676).collect();
    let b = MetadataBuilder::new(MetadataParams {
        page_size: 64,
        topk: TOPK,
        draft_tokens: 0,
        pool_slots: 1 << 20,
        cp: None,
    })
    .unwrap();
    let t = nsa_runtime::metadata::ReqToToken::new(&row, 100).unwrap();
    let md = b.decode(&t, Requests { req_pool_indices: &[0], seq_lens: &[100] }).unwrap();
    assert_eq!(md.real_table().data, [2, 10]);
}

// ---------------------------------------------------------------- §4.2 decode

#[test]
fn decode_example_4_2_page_64_and_1() {
    for page in [64, 1] {
        let t = Table::paged(4, 3072, page, None);
        let b = t.builder(TOPK, 0);
        let md = b.decode(&t.view(), Requests { req_pool_indices: &[2, 0], seq_lens: &[5, 3000] }).unwrap();
        assert_eq!(md.mode, ForwardMode::Decode);
        assert_eq!(md.cache_seqlens, [5, 3000]);
        assert_eq!(md.cu_seqlens_k, [0, 5, 3005]);
        assert_eq!(md.cu_seqlens_q, [0, 1, 2]);
        assert_eq!((md.max_seq_len_q, md.max_seq_len_k), (1, 3000));
        assert_eq!(md.nsa_seqlens_expanded, [5, 3000]);
        assert_eq!(md.nsa_cache_seqlens, [5, 2048]);
        assert_eq!(md.nsa_cu_seqlens_k, [0, 5, 2053]);
        assert_eq!(md.nsa_cu_seqlens_q, [0, 1, 2]);
        assert_eq!(md.nsa_extend_seq_lens, [1, 1]);
        assert_eq!(md.indexer_seq_lens, [5, 3000]);
        assert_eq!(md.seq_lens_sum, 3005);
        assert_rows(&md, &t, &[2, 0]);
        assert_real(&md, page);
        if page == 64 {
            assert_eq!((md.real_table().rows, md.real_table().width), (2, 47)); // ceil(3000/64)
        }
        assert_eq!(md.transform, TransformMethod::Paged);
        assert!(md.indexer.is_none() && md.topk_indices_offset.is_none() && md.page_table_1_flattened.is_none());
        assert_eq!(md.paged_schedule_lens(), Some(&[5, 3000][..]));
    }
}

#[test]
fn decode_bs1_shorter_than_topk() {
    let t = Table::paged(1, 256, 64, None);
    let md = t.builder(TOPK, 0).decode(&t.view(), Requests { req_pool_indices: &[0], seq_lens: &[100] }).unwrap();
    assert_eq!(md.nsa_cache_seqlens, [100]);
    assert_eq!(md.nsa_cu_seqlens_k, [0, 100]);
    assert_eq!((md.real_table().rows, md.real_table().width), (1, 2));
}

#[test]
fn empty_batch_in_every_mode() {
    let t = Table::paged(2, 128, 64, None);
    let b = t.builder(TOPK, 3);
    let none = Requests { req_pool_indices: &[], seq_lens: &[] };
    let plan = ExtendPlan { transform: TransformMethod::Ragged, mha_fp8_dequant: false };
    let all = [
        b.idle(),
        b.decode(&t.view(), none).unwrap(),
        b.target_verify(&t.view(), none).unwrap(),
        b.draft_extend(&t.view(), none, &[]).unwrap(),
        b.draft_extend_v2(&t.view(), none).unwrap(),
        b.extend(&t.view(), ExtendBatch::without_prefix(&[], &[]), plan).unwrap(),
    ];
    for md in &all {
        assert!(md.cache_seqlens.is_empty(), "{:?}", md.mode);
        assert_eq!(md.cu_seqlens_k, [0]);
        assert_eq!(md.cu_seqlens_q, [0]);
        assert_eq!(md.max_seq_len_k, 0);
        assert_eq!((md.page_table_1.rows, md.page_table_1.width), (0, 0));
        assert!(md.nsa_seqlens_expanded.is_empty() && md.nsa_cache_seqlens.is_empty());
        assert_eq!(md.nsa_cu_seqlens_k, [0]);
        assert_eq!(md.nsa_cu_seqlens_q, [0]);
        assert_eq!(md.seq_lens_sum, 0);
        assert_eq!(md.real_table().rows, 0);
    }
    assert_eq!(all[0].mode, ForwardMode::Idle);
    // Extend: empty indexer ranges (§4.6), not None; the ragged offsets exist and are empty.
    assert_eq!(all[5].indexer, Some(IndexerRanges::default()));
    assert_eq!(all[5].topk_indices_offset.as_deref(), Some(&[][..]));
}

// ---------------------------------------------------------------- §4.3 target verify

#[test]
fn target_verify_example_4_3() {
    for page in [64, 1] {
        let t = Table::paged(3, 128, page, None);
        let md = t
            .builder(TOPK, 3)
            .target_verify(&t.view(), Requests { req_pool_indices: &[1, 2], seq_lens: &[10, 4] })
            .unwrap();
        assert_eq!(md.mode, ForwardMode::TargetVerify);
        assert_eq!(md.cache_seqlens, [13, 7]);
        assert_eq!(md.cu_seqlens_k, [0, 13, 20]);
        assert_eq!(md.max_seq_len_k, 13);
        assert_eq!(md.max_seq_len_q, 1);
        assert_eq!(md.nsa_seqlens_expanded, [11, 12, 13, 5, 6, 7]);
        assert_eq!(md.cu_seqlens_q, arange(7));
        assert_eq!(md.nsa_cache_seqlens, md.nsa_seqlens_expanded);
        assert_eq!(md.nsa_cu_seqlens_k, cu(&[11, 12, 13, 5, 6, 7]));
        assert_eq!(md.nsa_extend_seq_lens, [3, 3]);
        assert_eq!(md.indexer_seq_lens, [10, 4]);
        assert_eq!(md.seq_lens_sum, 14);
        assert_rows(&md, &t, &[1, 1, 1, 2, 2, 2]);
        assert_real(&md, page);
        assert_eq!(md.paged_schedule_lens(), Some(&md.nsa_seqlens_expanded[..]));
    }
}

#[test]
fn target_verify_clips_each_draft_token() {
    let t = Table::paged(1, 4096, 64, None);
    let md =
        t.builder(TOPK, 3).target_verify(&t.view(), Requests { req_pool_indices: &[0], seq_lens: &[2046] }).unwrap();
    assert_eq!(md.nsa_seqlens_expanded, [2047, 2048, 2049]);
    assert_eq!(md.nsa_cache_seqlens, [2047, 2048, 2048]);
}

// ---------------------------------------------------------------- §4.4 draft extend

#[test]
fn draft_extend_v1_example_4_4_uneven_accept_lengths() {
    for page in [64, 1] {
        let t = Table::paged(2, 64, page, None);
        let md = t
            .builder(TOPK, 3)
            .draft_extend(&t.view(), Requests { req_pool_indices: &[0, 1], seq_lens: &[12, 6] }, &[2, 1])
            .unwrap();
        assert_eq!(md.mode, ForwardMode::DraftExtend);
        assert_eq!(md.cache_seqlens, [12, 6]); // not incremented
        assert_eq!(md.nsa_seqlens_expanded, [11, 12, 6]);
        assert_eq!(md.cu_seqlens_q, [0, 1, 2, 3]);
        assert_eq!(md.max_seq_len_k, 12);
        assert_eq!(md.nsa_extend_seq_lens, [2, 1]);
        assert_rows(&md, &t, &[0, 0, 1]);
        assert_real(&md, page);
    }
}

#[test]
fn draft_extend_v1_with_a_zero_and_a_long_accept() {
    let t = Table::paged(3, 64, 64, None);
    let md = t
        .builder(TOPK, 4)
        .draft_extend(&t.view(), Requests { req_pool_indices: &[0, 1, 2], seq_lens: &[9, 5, 20] }, &[4, 0, 1])
        .unwrap();
    assert_eq!(md.nsa_seqlens_expanded, [6, 7, 8, 9, 20]);
    assert_eq!(md.cu_seqlens_q, arange(6));
    assert_rows(&md, &t, &[0, 0, 0, 0, 2]);
}

#[test]
fn draft_extend_v2_repeats_by_d() {
    let t = Table::paged(2, 64, 64, None);
    let md = t
        .builder(TOPK, 2)
        .draft_extend_v2(&t.view(), Requests { req_pool_indices: &[1, 0], seq_lens: &[12, 6] })
        .unwrap();
    assert_eq!(md.mode, ForwardMode::DraftExtendV2);
    assert_eq!(md.cache_seqlens, [12, 6]);
    assert_eq!(md.nsa_seqlens_expanded, [11, 12, 5, 6]);
    assert_eq!(md.nsa_extend_seq_lens, [2, 2]);
    assert_rows(&md, &t, &[1, 1, 0, 0]);
    assert_eq!(md.paged_schedule_lens(), None);
}

// ---------------------------------------------------------------- §4.5 / §4.6 extend

fn ragged() -> ExtendPlan {
    ExtendPlan { transform: TransformMethod::Ragged, mha_fp8_dequant: false }
}

fn paged() -> ExtendPlan {
    ExtendPlan { transform: TransformMethod::Paged, mha_fp8_dequant: false }
}

#[test]
fn extend_with_prefix_example_4_6() {
    for page in [64, 1] {
        let t = Table::paged(2, 64, page, None);
        let batch = ExtendBatch {
            req_pool_indices: &[0, 1],
            seq_lens: &[6, 3],
            extend_lens: &[2, 3],
            prefix_lens: Some(&[4, 0]),
        };
        let md = t.builder(TOPK, 0).extend(&t.view(), batch, ragged()).unwrap();
        assert_eq!(md.mode, ForwardMode::Extend);
        assert_eq!(md.nsa_seqlens_expanded, [5, 6, 1, 2, 3]);
        let r = md.indexer.as_ref().unwrap();
        assert_eq!(r.ks, [0, 0, 6, 6, 6]);
        assert_eq!(r.ke, [5, 6, 7, 8, 9]);
        assert_eq!(r.token_to_batch_idx, [0, 0, 1, 1, 1]);
        assert_eq!(md.cu_seqlens_k, [0, 6, 9]);
        assert_eq!(md.topk_indices_offset.as_deref(), Some(&[0, 0, 6, 6, 6][..]));
        // A prefix: the query layout is cu(E), max E.
        assert_eq!(md.cu_seqlens_q, [0, 2, 5]);
        assert_eq!((md.max_seq_len_q, md.max_seq_len_k), (3, 6));
        // Prefix + RAGGED: the flattened table (prefix sharing path).
        let flat: Vec<i32> = t.row(0)[..6].iter().chain(&t.row(1)[..3]).copied().collect();
        assert_eq!(md.page_table_1_flattened.as_deref(), Some(&flat[..]));
        assert_eq!(md.nsa_extend_seq_lens, [2, 3]);
        assert_eq!(md.indexer_seq_lens, [6, 3]);
        assert_eq!(md.bs_idx, None);
        assert_rows(&md, &t, &[0, 1]);
        assert_real(&md, page);
        // Logits matrix 5×9: row t valid on [ks, ke), of length expanded[t].
        for (i, e) in md.nsa_seqlens_expanded.iter().enumerate() {
            assert_eq!(r.ke[i] - r.ks[i], *e);
        }
    }
}

#[test]
fn extend_with_prefix_paged_has_no_ragged_fields() {
    let t = Table::paged(2, 64, 64, None);
    let batch =
        ExtendBatch { req_pool_indices: &[0, 1], seq_lens: &[6, 3], extend_lens: &[2, 3], prefix_lens: Some(&[4, 0]) };
    let md = t.builder(TOPK, 0).extend(&t.view(), batch, paged()).unwrap();
    assert_eq!(md.transform, TransformMethod::Paged);
    assert!(md.topk_indices_offset.is_none());
    assert!(md.page_table_1_flattened.is_none());
    assert!(md.indexer.is_some());
    // MHA on fp8 with a prefix needs the flattened table for the dequant.
    let mha = ExtendPlan { transform: TransformMethod::Paged, mha_fp8_dequant: true };
    let md = t.builder(TOPK, 0).extend(&t.view(), batch, mha).unwrap();
    assert!(md.mha_fp8_dequant);
    assert_eq!(md.page_table_1_flattened.as_ref().map(Vec::len), Some(9));
}

#[test]
fn prefix_sharing_two_requests_on_the_same_prefix_pages() {
    // Requests 0 and 1 share their first 64-token page (same physical slots), then diverge.
    let page = 64;
    let mut t = Table::paged(2, 128, page, None);
    let shared: Vec<i32> = t.row(0)[..64].to_vec();
    t.data[128..192].copy_from_slice(&shared);
    let batch = ExtendBatch {
        req_pool_indices: &[0, 1],
        seq_lens: &[70, 66],
        extend_lens: &[6, 2],
        prefix_lens: Some(&[64, 64]),
    };
    let md = t.builder(TOPK, 0).extend(&t.view(), batch, ragged()).unwrap();
    let flat = md.page_table_1_flattened.as_ref().unwrap();
    assert_eq!(flat.len(), 136);
    assert_eq!(&flat[..64], &flat[70..134]); // the shared prefix appears once per request
    assert_eq!(md.nsa_seqlens_expanded, [65, 66, 67, 68, 69, 70, 65, 66]);
    assert_eq!(md.topk_indices_offset.as_deref(), Some(&[0, 0, 0, 0, 0, 0, 70, 70][..]));
    assert_eq!(md.real_table().row(0)[0], md.real_table().row(1)[0]);
}

#[test]
fn extend_without_prefix_reuses_the_kv_layout() {
    for page in [64, 1] {
        let t = Table::paged(2, 64, page, None);
        let md = t.builder(TOPK, 0).extend(&t.view(), ExtendBatch::without_prefix(&[1, 0], &[3, 2]), ragged()).unwrap();
        assert_eq!(md.cu_seqlens_k, [0, 3, 5]);
        assert_eq!(md.cu_seqlens_q, md.cu_seqlens_k);
        assert_eq!((md.max_seq_len_q, md.max_seq_len_k), (3, 3));
        assert_eq!(md.nsa_seqlens_expanded, [1, 2, 3, 1, 2]);
        let r = md.indexer.as_ref().unwrap();
        assert_eq!(r.ks, [0, 0, 0, 3, 3]);
        assert_eq!(r.ke, [1, 2, 3, 4, 5]);
        assert_eq!(md.topk_indices_offset.as_deref(), Some(&[0, 0, 0, 3, 3][..]));
        assert!(md.page_table_1_flattened.is_none()); // no prefix, no flattened table
        assert_rows(&md, &t, &[1, 0]);
        assert_real(&md, page);
    }
}

#[test]
fn extend_request_longer_than_topk() {
    let t = Table::paged(1, 128, 64, None);
    let md = t.builder(64, 0).extend(&t.view(), ExtendBatch::without_prefix(&[0], &[70]), paged()).unwrap();
    assert_eq!(md.nsa_seqlens_expanded, (1..=70).collect::<Vec<i32>>());
    let clipped: Vec<i32> = (1..=70).map(|v: i32| v.min(64)).collect();
    assert_eq!(md.nsa_cache_seqlens, clipped);
    assert_eq!(md.nsa_cu_seqlens_k, cu(&clipped));
}

// ---------------------------------------------------------------- §4.7 CP split

fn cp_builder(t: &Table, rank: u32, size: u32) -> MetadataBuilder {
    let mut p = t.params(TOPK, 0);
    p.cp = Some(CpRank::new(rank, size).unwrap());
    MetadataBuilder::new(p).unwrap()
}

#[test]
fn cp_split_example_4_7_two_ranks() {
    let t = Table::paged(2, 64, 64, None);
    let batch =
        ExtendBatch { req_pool_indices: &[0, 1], seq_lens: &[6, 3], extend_lens: &[2, 3], prefix_lens: Some(&[4, 0]) };
    let r0 = cp_builder(&t, 0, 2).extend(&t.view(), batch, ragged()).unwrap();
    assert_eq!(r0.nsa_extend_seq_lens, [1, 2]);
    assert_eq!(r0.bs_idx.as_deref(), Some(&[0, 1][..]));
    assert_eq!(r0.nsa_seqlens_expanded, [5, 1, 3]);
    let i0 = r0.indexer.as_ref().unwrap();
    assert_eq!(i0.ks, [0, 6, 6]);
    assert_eq!(i0.ke, [5, 7, 9]);
    assert_eq!(i0.token_to_batch_idx, [0, 1, 1]);
    assert_eq!(r0.cu_seqlens_q, [0, 1, 3]);
    assert_eq!(r0.max_seq_len_q, 2);
    assert_eq!(r0.topk_indices_offset.as_deref(), Some(&[0, 6, 6][..]));

    let r1 = cp_builder(&t, 1, 2).extend(&t.view(), batch, ragged()).unwrap();
    assert_eq!(r1.nsa_extend_seq_lens, [1, 1]);
    assert_eq!(r1.nsa_seqlens_expanded, [6, 2]);
    let i1 = r1.indexer.as_ref().unwrap();
    assert_eq!(i1.ks, [0, 6]);
    assert_eq!(i1.ke, [6, 8]);
    assert_eq!(i1.token_to_batch_idx, [0, 1]);
    // Both ranks keep both requests: full KV metadata.
    for md in [&r0, &r1] {
        assert_eq!(md.cache_seqlens, [6, 3]);
        assert_eq!(md.cu_seqlens_k, [0, 6, 9]);
        assert_eq!(md.seq_lens_sum, 9);
    }
}

#[test]
fn cp_split_example_4_7_unselected_request() {
    let t = Table::paged(2, 64, 64, None);
    let batch = ExtendBatch::without_prefix(&[0, 1], &[1, 5]);
    let md = cp_builder(&t, 1, 4).extend(&t.view(), batch, ragged()).unwrap();
    assert_eq!(md.bs_idx.as_deref(), Some(&[1][..]));
    assert_eq!(md.nsa_extend_seq_lens, [2]);
    assert_eq!(md.nsa_seqlens_expanded, [1, 5]);
    let r = md.indexer.as_ref().unwrap();
    assert_eq!(r.ks, [0, 0]);
    assert_eq!(r.ke, [1, 5]);
    assert_eq!(r.token_to_batch_idx, [0, 0]);
    // Per-rank KV metadata covers request 1 only.
    assert_eq!(md.cache_seqlens, [5]);
    assert_eq!(md.cu_seqlens_k, [0, 5]);
    assert_eq!(md.indexer_seq_lens, [5]);
    assert_eq!(md.max_seq_len_k, 5);
    assert_eq!(md.cu_seqlens_q, [0, 2]); // CP split: cu(E) even without a prefix
    assert_eq!(md.seq_lens_sum, 6);
    assert_rows(&md, &t, &[1]);
}

#[test]
fn cp_rank_without_tokens() {
    // T = 1 < cp size: rank 1 owns nothing.
    let t = Table::paged(1, 64, 64, None);
    let md = cp_builder(&t, 1, 2).extend(&t.view(), ExtendBatch::without_prefix(&[0], &[1]), ragged()).unwrap();
    assert_eq!(md.bs_idx.as_deref(), Some(&[][..]));
    assert!(md.cache_seqlens.is_empty() && md.nsa_seqlens_expanded.is_empty());
    assert_eq!((md.max_seq_len_q, md.max_seq_len_k), (1, 0));
    assert_eq!(md.indexer, Some(IndexerRanges::default()));
}

#[test]
fn cp_size_one_is_no_split() {
    let t = Table::paged(2, 64, 64, None);
    let batch = ExtendBatch::without_prefix(&[0, 1], &[3, 2]);
    let plain = t.builder(TOPK, 0).extend(&t.view(), batch, ragged()).unwrap();
    assert_eq!(cp_builder(&t, 0, 1).extend(&t.view(), batch, ragged()).unwrap(), plain);
}

// ---------------------------------------------------------------- §3.2 padding

#[test]
fn dp_padding_3_2() {
    // Ranks hold 5 and 9 tokens, attn CP size 2: rounded to 6 and 10.
    assert_eq!(dp_padded_tokens(&[5, 9], 0, 2, DpPadding::MaxLen, false).unwrap(), 10);
    assert_eq!(dp_padded_tokens(&[5, 9], 0, 2, DpPadding::SumLen, false).unwrap(), 6);
    assert_eq!(dp_padded_tokens(&[5, 9], 1, 2, DpPadding::MaxLen, true).unwrap(), 5);
    assert_eq!(dp_padded_tokens(&[7], 3, 1, DpPadding::SumLen, false).unwrap(), 7);
    assert_eq!(dp_padded_tokens(&[], 0, 1, DpPadding::MaxLen, false).unwrap(), 0);
    assert!(dp_padded_tokens(&[5, 9], 2, 1, DpPadding::SumLen, false).is_err());

    let t = Table::paged(2, 64, 64, None);
    let mut md =
        t.builder(TOPK, 0).decode(&t.view(), Requests { req_pool_indices: &[0, 1], seq_lens: &[5, 7] }).unwrap();
    md.pad_nsa_rows(4);
    assert_eq!(md.nsa_cache_seqlens, [5, 7, 0, 0]);
    assert_eq!(md.nsa_cu_seqlens_k, [0, 5, 12, 12, 12]);
    assert_eq!(md.nsa_cu_seqlens_q, arange(5));
    assert_eq!(md.nsa_seqlens_expanded, [5, 7]); // unpadded
    md.pad_nsa_rows(1); // fewer than present: no-op
    assert_eq!(md.nsa_cache_seqlens.len(), 4);
}

// ---------------------------------------------------------------- reuse

#[test]
fn build_decode_into_reuses_buffers() {
    let t = Table::paged(8, 512, 64, None);
    let b = t.builder(TOPK, 0);
    let mut md = NsaMetadata::default();
    let big = Requests { req_pool_indices: &[0, 1, 2, 3, 4, 5, 6, 7], seq_lens: &[500, 400, 300, 200, 100, 50, 20, 1] };
    md.build_decode_into(&b, &t.view(), big).unwrap();
    let ptrs = |m: &NsaMetadata| {
        (
            m.cache_seqlens.as_ptr(),
            m.page_table_1.data.as_ptr(),
            m.real_table().data.as_ptr(),
            m.nsa_cache_seqlens.as_ptr(),
            m.nsa_cu_seqlens_k.as_ptr(),
            m.cu_seqlens_q.as_ptr(),
        )
    };
    let before = ptrs(&md);
    for n in [3, 8, 1, 0, 5] {
        let reqs = Requests { req_pool_indices: &big.req_pool_indices[..n], seq_lens: &big.seq_lens[..n] };
        md.build_decode_into(&b, &t.view(), reqs).unwrap();
        assert_eq!(ptrs(&md), before, "bs {n} reallocated");
        assert_eq!(md, b.decode(&t.view(), reqs).unwrap());
    }
}

#[test]
fn failed_build_leaves_the_output_untouched() {
    let t = Table::paged(2, 64, 64, None);
    let b = t.builder(TOPK, 0);
    let mut md = b.decode(&t.view(), Requests { req_pool_indices: &[0, 1], seq_lens: &[5, 7] }).unwrap();
    let before = md.clone();
    let bad = Requests { req_pool_indices: &[0, 9], seq_lens: &[5, 7] };
    assert!(md.build_decode_into(&b, &t.view(), bad).is_err());
    assert_eq!(md, before);
}
