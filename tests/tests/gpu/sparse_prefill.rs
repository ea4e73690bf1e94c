//! Sparse MLA prefill on the GPU against the CPU reference (included by gpu.rs).
//! Tolerances: nsa_runtime::verify::attention (module docs).

use super::{assert_all, rt};
use nsa_kernels::spec::PREFILL_HEADS;
use nsa_runtime::ops::sparse_prefill::PrefillShape;
use nsa_runtime::verify::attention::IndexPattern;
use nsa_runtime::verify::sparse_prefill::{run, KvSource, PrefillCase};

fn shape(s_q: usize, heads: u32, topk: u32, d_qk: u32) -> PrefillShape {
    PrefillShape { s_q, heads, topk, d_qk }
}

#[test]
fn every_head_count_topk_and_width() {
    let rt = rt();
    let mut checks = Vec::new();
    let mut seed = 1500;
    for heads in PREFILL_HEADS {
        for topk in [64, 576, 2048] {
            for d_qk in [576, 512] {
                seed += 1;
                let c = PrefillCase::new(shape(62, heads, topk, d_qk), 577, IndexPattern::Holes, seed);
                checks.push(run(&rt, &c).unwrap());
            }
        }
    }
    assert_all(&checks);
}

#[test]
fn query_and_kv_lengths() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, (s_q, s_kv, heads)) in
        [(1, 64, 128), (1, 32768, 16), (62, 64, 64), (62, 32768, 128), (4096, 577, 16), (4096, 32768, 32)]
            .into_iter()
            .enumerate()
    {
        let mut c = PrefillCase::new(shape(s_q, heads, 2048, 576), s_kv, IndexPattern::Holes, 1600 + i as u64);
        c.check_rows = 16;
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

/// Rows without any valid index (out 0, max_logits −inf, lse +inf), indices ≥ s_kv
/// or below −1 (masked, spec §8.2), per-query lengths, duplicates, strided rows.
#[test]
fn invalid_rows_masked_indices_lengths_and_duplicates() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, heads) in [16u32, 128].into_iter().enumerate() {
        let base = shape(40, heads, 2048, 576);
        let seed = 1700 + 10 * i as u64;
        checks.push(run(&rt, &PrefillCase::new(base, 3000, IndexPattern::AllInvalid, seed)).unwrap());
        checks.push(run(&rt, &PrefillCase::new(base, 3000, IndexPattern::Duplicates, seed + 1)).unwrap());
        let mut c = PrefillCase::new(base, 3000, IndexPattern::Full, seed + 2);
        c.lengths = true; // every 5th query 0, others anywhere in 0..=topk
        c.out_of_range = true;
        checks.push(run(&rt, &c).unwrap());
        let mut c = PrefillCase::new(base, 3000, IndexPattern::Holes, seed + 3);
        c.row_pad = 64;
        c.out_of_range = true;
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

/// The FP8-cache path: the prefix dequantized into the ragged buffer, then prefill.
#[test]
fn fp8_ragged_path() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, (s_q, s_kv, heads)) in [(62, 577, 16), (300, 5000, 128), (1, 64, 64)].into_iter().enumerate() {
        let mut c = PrefillCase::new(shape(s_q, heads, 2048, 576), s_kv, IndexPattern::Holes, 1800 + i as u64);
        c.source = KvSource::Fp8Ragged;
        c.lengths = i == 1;
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

/// s_q = 0 launches nothing and succeeds.
#[test]
fn empty_batch() {
    let rt = rt();
    let c = PrefillCase::new(shape(0, 64, 2048, 576), 100, IndexPattern::Holes, 1900);
    assert_all(&[run(&rt, &c).unwrap()]);
}
