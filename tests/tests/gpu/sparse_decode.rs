//! Sparse MLA decode on the GPU against the CPU reference (included by gpu.rs).
//! Tolerances: nsa_runtime::verify::sparse_decode (module docs).

use super::{assert_all, rt};
use nsa_kernels::spec::DECODE_HEADS;
use nsa_runtime::ops::sparse_decode::DecodeShape;
use nsa_runtime::verify::sparse_decode::{run, DecodeCase, IndexPattern};
use nsa_runtime::{DeviceChecks, Error};

fn shape(batch: usize, s_q: usize, heads: u32, topk: u32, page_size: u32) -> DecodeShape {
    DecodeShape { batch, s_q, heads, topk, page_size }
}

#[test]
fn every_head_count_and_topk() {
    let rt = rt();
    let mut checks = Vec::new();
    let mut seed = 500;
    for heads in DECODE_HEADS {
        for topk in [64, 576, 2048] {
            seed += 1;
            checks.push(run(&rt, &DecodeCase::new(shape(4, 2, heads, topk, 64), IndexPattern::Holes, seed)).unwrap());
        }
    }
    assert_all(&checks);
}

#[test]
fn batch_sizes_and_query_tokens() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, (batch, s_q, heads)) in
        [(1, 1, 128), (1, 3, 16), (4, 3, 64), (74, 2, 16), (74, 1, 128), (321, 1, 16), (321, 3, 8)]
            .into_iter()
            .enumerate()
    {
        let mut c = DecodeCase::new(shape(batch, s_q, heads, 2048, 64), IndexPattern::Holes, 600 + i as u64);
        c.slots = 32768;
        c.check_rows = 24;
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

#[test]
fn page_sizes_and_page_strides() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, page) in [1u32, 61, 64, 69].into_iter().enumerate() {
        for pad in [0usize, 48] {
            let mut c =
                DecodeCase::new(shape(3, 2, 16, 576, page), IndexPattern::Holes, 700 + 2 * i as u64 + pad as u64);
            c.page_pad = pad;
            c.slots = 5000;
            checks.push(run(&rt, &c).unwrap());
        }
    }
    assert_all(&checks);
}

#[test]
fn invalid_rows_lengths_and_duplicates() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, heads) in [16u32, 128].into_iter().enumerate() {
        let base = shape(6, 2, heads, 2048, 64);
        let seed = 800 + 10 * i as u64;
        checks.push(run(&rt, &DecodeCase::new(base, IndexPattern::AllInvalid, seed)).unwrap());
        checks.push(run(&rt, &DecodeCase::new(base, IndexPattern::Duplicates, seed + 1)).unwrap());
        let mut c = DecodeCase::new(base, IndexPattern::Full, seed + 2);
        c.lengths = true; // some rows 0, others anywhere in 0..=topk
        checks.push(run(&rt, &c).unwrap());
        let mut c = DecodeCase::new(base, IndexPattern::Holes, seed + 3);
        c.lengths = true;
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

/// FP8 scales of 2^15 and more take the kernel's two-multiply dequant path: the
/// raw-record kernel (16 heads) and the warp-group kernel with one and two head tiles.
#[test]
fn huge_fp8_scales() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, heads) in [16u32, 64, 128].into_iter().enumerate() {
        let mut c = DecodeCase::new(shape(3, 1, heads, 576, 64), IndexPattern::Full, 980 + i as u64);
        c.huge_scales = true;
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

/// Scores and tile scales that rise along each row: every kernel rescales its
/// running output many times mid-row (not only from the empty start).
#[test]
fn rising_scores_and_scales_rescale_the_output() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, (heads, splits)) in [(16u32, 1u32), (16, 4), (64, 1), (128, 1), (128, 3)].into_iter().enumerate() {
        let mut c = DecodeCase::new(shape(4, 1, heads, 2048, 64), IndexPattern::Full, 990 + i as u64);
        c.rising = true;
        c.splits = Some(splits); // 1: one CTA walks all 32 steps of a row
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

/// The split path (partials + combine) and the direct path agree with the reference
/// for every split count, including uneven last splits, a count the combine's
/// batches of loads do not divide, and the most a top-k of 4096 allows (64).
#[test]
fn every_split_count() {
    let rt = rt();
    let mut checks = Vec::new();
    let cases = [
        (32, 576, 1u32),
        (32, 576, 2),
        (32, 576, 3),
        (32, 576, 5),
        (32, 576, 9),
        (128, 2048, 32),
        (64, 4096, 21),
        (16, 4096, 64),
    ];
    for (i, (heads, topk, splits)) in cases.into_iter().enumerate() {
        let mut c = DecodeCase::new(shape(2, 1, heads, topk, 64), IndexPattern::Holes, 900 + i as u64);
        c.splits = Some(splits);
        c.lengths = i % 2 == 1;
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

/// An index past the cache is skipped (like −1) by default and reported once with
/// device checks on, naming the field, also at 128 heads where two head tiles read
/// it.
#[test]
fn out_of_cache_index_is_skipped_or_reported() {
    let mut rt = rt();
    for (i, heads) in [16u32, 128].into_iter().enumerate() {
        let mut c = DecodeCase::new(shape(2, 1, heads, 64, 64), IndexPattern::Full, 950 + i as u64);
        c.bad_index = true;
        let check = run(&rt, &c).unwrap();
        assert_all(&[check]);
        rt.set_checks(DeviceChecks::Report).unwrap();
        let err = run(&rt, &c);
        rt.set_checks(DeviceChecks::Skip).unwrap();
        match err {
            Err(Error::DeviceRejected { field, count, example, .. }) => {
                assert_eq!((field, count, example), ("indices", 1, 0), "{heads} heads");
            }
            other => panic!("expected a rejected index at {heads} heads, got {other:?}"),
        }
    }
}
