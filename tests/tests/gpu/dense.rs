//! Dense causal varlen attention (MHA one-shot prefill) on the GPU against the CPU
//! reference (included by gpu.rs). Tolerance: nsa_runtime::verify::dense.

use super::{assert_all, rt};
use nsa_kernels::spec::DenseKernel;
use nsa_kernels::{KvCacheFormat, NsaConfig, Target};
use nsa_runtime::verify::dense::{run, run_on, DenseCase, GraphReplays};
use nsa_runtime::verify::mha::{self, MhaCase};

/// Every dense kernel `target` runs (the warp-group one on sm_90a as well, and the
/// scalar one gfx942 takes).
fn kernels(target: Target) -> Vec<DenseKernel> {
    DenseKernel::ALL.into_iter().filter(|k| k.runs_on(target)).collect()
}

/// Sequences of (query rows, key rows) mixing the lengths around the 64-row tiles and
/// 64-key blocks; `prefix` adds that many keys before each sequence's new tokens.
fn mixed(count: usize, prefix: usize) -> Vec<(usize, usize)> {
    const LENS: [usize; 7] = [1, 2, 63, 64, 65, 1000, 2048];
    (0..count).map(|i| LENS[(i * 5 + 3) % LENS.len()]).map(|l| (l, l + prefix)).collect()
}

#[test]
fn every_head_count_and_head_shape() {
    let rt = rt();
    let mut checks = Vec::new();
    for kernel in kernels(rt.target()) {
        for (heads, d_qk) in [(8, 192), (16, 192), (32, 192), (64, 192), (128, 192), (16, 128), (128, 128)] {
            let seqs = vec![(1, 1), (65, 65), (200, 330)];
            let case = DenseCase { heads, d_qk, d_v: 128, seqs, seed: 4000 + heads as u64, kernel };
            checks.push(run(&rt, &case).unwrap());
        }
    }
    assert_all(&checks);
}

#[test]
fn mixed_lengths_with_and_without_prefixes() {
    let rt = rt();
    let mut checks = Vec::new();
    for kernel in kernels(rt.target()) {
        for (count, prefix) in [(1, 0), (7, 0), (7, 100), (64, 0), (16, 2048)] {
            let seqs = mixed(count, prefix);
            let case = DenseCase { heads: 16, d_qk: 192, d_v: 128, seqs, seed: 4100 + count as u64, kernel };
            checks.push(run(&rt, &case).unwrap());
        }
    }
    assert_all(&checks);
}

#[test]
fn rows_without_keys_empty_sequences_and_an_empty_batch() {
    let rt = rt();
    // Fewer keys than rows: the first rows see nothing (zeros, +inf lse); empty
    // sequences between others; no sequence at all.
    let mut checks = Vec::new();
    for kernel in kernels(rt.target()) {
        let seqs = vec![(70, 30), (0, 0), (5, 0), (3, 9), (200, 0)];
        let uneven = DenseCase { heads: 8, d_qk: 192, d_v: 128, seqs, seed: 4200, kernel };
        let empty = DenseCase { heads: 8, d_qk: 192, d_v: 128, seqs: vec![], seed: 4201, kernel };
        checks.extend([run(&rt, &uneven).unwrap(), run(&rt, &empty).unwrap()]);
    }
    assert_all(&checks);
}

/// The warp-group kernel's persistent CTAs take tiles from a counter that each
/// launch leaves zero: eager launches of several shapes on one runtime, and a
/// captured launch replayed twice (outputs poisoned between), each within the
/// reference's tolerance.
#[test]
fn tile_counter_across_launches_and_graph_replays() {
    let rt = rt();
    let mut checks = Vec::new();
    for kernel in kernels(rt.target()) {
        for (heads, seqs) in [(16, mixed(7, 0)), (8, vec![(300, 300)]), (128, vec![(1, 1)]), (16, mixed(9, 64))] {
            let case = DenseCase { heads, d_qk: 192, d_v: 128, seqs, seed: 4300 + heads as u64, kernel };
            checks.push(run_on(&GraphReplays(&rt), &case).unwrap());
            checks.push(run(&rt, &case).unwrap());
        }
    }
    assert_all(&checks);
}

/// The layer's MHA one-shot path: stores, latent rows read back from either cache
/// format (prefixes included), and dense attention over q/k/v expanded from them.
#[test]
fn layer_mha_one_shot_on_both_cache_formats() {
    let rt = rt();
    let model = |heads: u32, kv_cache: KvCacheFormat| NsaConfig {
        num_q_heads: heads,
        kv_cache,
        targets: vec![rt.target()],
        ..NsaConfig::preset("deepseek-v3.2").unwrap()
    };
    let cases = [
        MhaCase {
            model: model(16, KvCacheFormat::Fp8),
            requests: vec![(0, 300), (700, 200), (1000, 48), (0, 1)],
            seed: 4300,
            check_rows: None,
            timing_iters: 0,
        },
        MhaCase {
            model: model(16, KvCacheFormat::Bf16),
            requests: vec![(0, 65), (1500, 548)],
            seed: 4301,
            check_rows: None,
            timing_iters: 0,
        },
        MhaCase {
            model: model(128, KvCacheFormat::Fp8),
            requests: vec![(0, 1000)],
            seed: 4302,
            check_rows: None,
            timing_iters: 0,
        },
        // 16 prompts of 1K tokens at 128 heads, too large for the CPU's expansion:
        // random k/v, each request's first and last 8 rows checked.
        MhaCase {
            model: model(128, KvCacheFormat::Fp8),
            requests: vec![(0, 1024); 16],
            seed: 4303,
            check_rows: Some(8),
            timing_iters: 0,
        },
    ];
    let mut checks = Vec::new();
    for case in &cases {
        checks.extend(mha::run(&rt, case).unwrap().checks);
    }
    assert_all(&checks);
}
