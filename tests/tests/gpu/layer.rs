//! The whole NSA layer (KV and indexer-K stores → logits → top-k → sparse MLA) on
//! the GPU against the whole-layer CPU reference (included by gpu.rs). Tolerances:
//! nsa_runtime::verify::layer (module docs).

use super::{assert_all, rt};
use nsa_kernels::{KvCacheFormat, NsaConfig};
use nsa_runtime::metadata::{AttnImpl, PrefillBackend};
use nsa_runtime::verify::layer::{run, LayerCase, LayerMode};
use nsa_runtime::verify::Check;

fn model(heads: u32, kv_cache: KvCacheFormat, page_size: u32) -> NsaConfig {
    let mut m = NsaConfig::preset("deepseek-v3.2").unwrap();
    m.num_q_heads = heads;
    m.kv_cache = kv_cache;
    m.page_size = page_size;
    m
}

fn run_all(cases: &[LayerCase]) -> Vec<Check> {
    let rt = rt();
    let mut checks = Vec::new();
    for case in cases {
        let report = run(&rt, case).unwrap_or_else(|e| panic!("{}: {e}", case.describe()));
        eprintln!("{}:\n{}", case.describe(), report.explain);
        checks.extend(report.checks);
    }
    checks
}

#[test]
fn every_mode_both_caches_heads_16_and_128() {
    let modes = [
        LayerMode::Decode,
        LayerMode::TargetVerify { draft: 2 },
        LayerMode::TargetVerify { draft: 4 },
        LayerMode::DraftExtend { draft: 3 },
        LayerMode::Extend { prefix: false },
        LayerMode::Extend { prefix: true },
    ];
    let mut cases = Vec::new();
    for (n, &mode) in modes.iter().enumerate() {
        for kv in [KvCacheFormat::Fp8, KvCacheFormat::Bf16] {
            for heads in [16, 128] {
                let extend = matches!(mode, LayerMode::Extend { .. });
                let (batch, context) = if extend { (3, 3000) } else { (5, 6000) };
                let seed = 7000 + 10 * n as u64 + heads as u64 + kv as u64;
                cases.push(LayerCase::new(model(heads, kv, 64), mode, batch, context, seed));
            }
        }
    }
    assert_all(&run_all(&cases));
}

#[test]
fn fp8_ragged_extend_and_chunked_logits() {
    let mut ragged =
        LayerCase::new(model(16, KvCacheFormat::Fp8, 64), LayerMode::Extend { prefix: true }, 3, 5000, 7100);
    ragged.prefill_backend = PrefillBackend::Fixed(AttnImpl::FlashMlaSparse);
    let mut chunked =
        LayerCase::new(model(16, KvCacheFormat::Bf16, 64), LayerMode::Extend { prefix: true }, 2, 4000, 7101);
    // About 40 rows per chunk: several chunks, each top-k on chunk-relative rows.
    chunked.logits_budget = Some(40 * 4 * 8000);
    let mut chunked_ragged = ragged.clone();
    chunked_ragged.logits_budget = Some(64 * 4 * 9000);
    chunked_ragged.seed = 7102;
    assert_all(&run_all(&[ragged, chunked, chunked_ragged]));
}

#[test]
fn page_sizes_other_than_64_and_short_batches() {
    let mut cases = Vec::new();
    for (i, page) in [1u32, 61].into_iter().enumerate() {
        for kv in [KvCacheFormat::Fp8, KvCacheFormat::Bf16] {
            let seed = 7200 + 10 * i as u64 + kv as u64;
            cases.push(LayerCase::new(model(32, kv, page), LayerMode::Decode, 4, 5000, seed));
            cases.push(LayerCase::new(model(32, kv, page), LayerMode::TargetVerify { draft: 3 }, 2, 3000, seed + 5));
        }
    }
    // Every token sees ≤ top-k keys: the indexer is skipped; bs = 1; and an empty batch.
    cases.push(LayerCase::new(model(64, KvCacheFormat::Fp8, 64), LayerMode::Decode, 1, 1500, 7300));
    cases.push(LayerCase::new(model(64, KvCacheFormat::Fp8, 64), LayerMode::Extend { prefix: false }, 2, 900, 7301));
    cases.push(LayerCase::new(model(64, KvCacheFormat::Fp8, 64), LayerMode::Decode, 0, 100, 7302));
    assert_all(&run_all(&cases));
}

#[test]
fn needle_in_32k_keys_lands_in_the_topk_and_dominates() {
    let mut cases = Vec::new();
    for (heads, kv) in [(16, KvCacheFormat::Fp8), (128, KvCacheFormat::Bf16)] {
        let mut decode = LayerCase::new(model(heads, kv, 64), LayerMode::Decode, 2, 32_768, 7400 + heads as u64);
        decode.needle = true;
        let mut verify = decode.clone();
        verify.mode = LayerMode::TargetVerify { draft: 2 };
        verify.seed += 1;
        cases.extend([decode, verify]);
    }
    let checks = run_all(&cases);
    assert!(checks.iter().any(|c| c.kernel == "layer: needle" && c.items > 0), "the needle was checked");
    assert_all(&checks);
}

#[test]
fn graph_capture_and_replay_equal_eager() {
    let mut cases = Vec::new();
    for (i, (heads, kv, mode)) in [
        (16, KvCacheFormat::Fp8, LayerMode::Decode),
        (128, KvCacheFormat::Fp8, LayerMode::TargetVerify { draft: 2 }),
        (64, KvCacheFormat::Bf16, LayerMode::DraftExtend { draft: 3 }),
    ]
    .into_iter()
    .enumerate()
    {
        let mut case = LayerCase::new(model(heads, kv, 64), mode, 6, 9000, 7500 + i as u64);
        case.graph_replays = true;
        cases.push(case);
    }
    let checks = run_all(&cases);
    assert_eq!(checks.iter().filter(|c| c.kernel == "layer: graph replay" && c.items == 3).count(), 3);
    assert_all(&checks);
}

#[test]
fn graph_bound_plans_follow_metadata_replays_across_steps() {
    use nsa_runtime::verify::layer::graph_steps;
    let rt = rt();
    let mut checks = Vec::new();
    for (i, (heads, kv, mode)) in [
        (128, KvCacheFormat::Fp8, LayerMode::Decode),
        (16, KvCacheFormat::Bf16, LayerMode::Decode),
        (32, KvCacheFormat::Fp8, LayerMode::TargetVerify { draft: 3 }),
    ]
    .into_iter()
    .enumerate()
    {
        // Request 0 stays below top-k (the short-row path), the others are longer.
        let case = LayerCase::new(model(heads, kv, 64), mode, 5, 6000, 7600 + i as u64);
        checks.push(graph_steps(&rt, &case, 6).unwrap_or_else(|e| panic!("{}: {e}", case.describe())));
    }
    assert_all(&checks);
}

#[test]
fn device_built_metadata_equals_host_metadata_in_every_mode() {
    let mut cases = Vec::new();
    let modes = [
        (LayerMode::Decode, 6, 7000),
        (LayerMode::TargetVerify { draft: 3 }, 4, 5000),
        (LayerMode::DraftExtend { draft: 3 }, 5, 5000),
        (LayerMode::DraftExtendV2 { draft: 2 }, 5, 5000),
        (LayerMode::Extend { prefix: false }, 3, 3000),
        (LayerMode::Extend { prefix: true }, 3, 4000),
    ];
    for (n, &(mode, batch, context)) in modes.iter().enumerate() {
        for kv in [KvCacheFormat::Fp8, KvCacheFormat::Bf16] {
            let mut case = LayerCase::new(model(32, kv, 64), mode, batch, context, 7700 + 10 * n as u64 + kv as u64);
            case.device_metadata = true;
            case.check_rows = 8;
            cases.push(case);
        }
    }
    // FP8 RAGGED extend; bf16 PAGED extend in several logits chunks; every token
    // within top-k (indexer skipped); an empty batch; pages of 1 (short rows only).
    let mut ragged =
        LayerCase::new(model(16, KvCacheFormat::Fp8, 64), LayerMode::Extend { prefix: true }, 3, 5000, 7790);
    ragged.prefill_backend = PrefillBackend::Fixed(AttnImpl::FlashMlaSparse);
    let mut chunked =
        LayerCase::new(model(16, KvCacheFormat::Bf16, 64), LayerMode::Extend { prefix: true }, 2, 4000, 7791);
    chunked.logits_budget = Some(40 * 4 * 8000);
    let short = LayerCase::new(model(16, KvCacheFormat::Fp8, 64), LayerMode::Decode, 3, 1500, 7792);
    let empty = LayerCase::new(model(16, KvCacheFormat::Fp8, 64), LayerMode::Decode, 0, 100, 7793);
    let pages_of_1 =
        LayerCase::new(model(16, KvCacheFormat::Bf16, 1), LayerMode::Extend { prefix: true }, 2, 1800, 7794);
    for mut case in [ragged, chunked, short, empty, pages_of_1] {
        case.device_metadata = true;
        cases.push(case);
    }
    let checks = run_all(&cases);
    let compared = checks.iter().filter(|c| c.kernel == "layer: device metadata").count();
    assert_eq!(compared, cases.len(), "every case compared its device-metadata step");
    assert_all(&checks);
}

#[test]
fn batch_invariant_layers_give_a_request_the_same_bits_in_any_batch() {
    use nsa_runtime::verify::layer::batch_invariance;
    let rt = rt();
    let mut checks = Vec::new();
    let mut ragged =
        LayerCase::new(model(16, KvCacheFormat::Fp8, 64), LayerMode::Extend { prefix: true }, 40, 2500, 7904);
    ragged.prefill_backend = PrefillBackend::Fixed(AttnImpl::FlashMlaSparse);
    for (case, sizes) in [
        (LayerCase::new(model(128, KvCacheFormat::Fp8, 64), LayerMode::Decode, 200, 3000, 7900), &[7, 200][..]),
        (LayerCase::new(model(64, KvCacheFormat::Bf16, 64), LayerMode::Decode, 200, 3000, 7901), &[7, 200]),
        (
            LayerCase::new(model(32, KvCacheFormat::Fp8, 64), LayerMode::TargetVerify { draft: 2 }, 200, 3000, 7902),
            &[7, 200],
        ),
        (
            LayerCase::new(model(16, KvCacheFormat::Fp8, 64), LayerMode::Extend { prefix: true }, 40, 2500, 7903),
            &[7, 40],
        ),
        (ragged, &[7, 40]),
    ] {
        let check = batch_invariance(&rt, &case, sizes, true).unwrap_or_else(|e| panic!("{}: {e}", case.describe()));
        eprintln!("{check}");
        checks.push(check);
    }
    assert_all(&checks);
    // The control: without the option, the decode split count follows the batch
    // (32 splits alone, 1 among 200 requests at 128 heads), and the bits change.
    let case = LayerCase::new(model(128, KvCacheFormat::Fp8, 64), LayerMode::Decode, 200, 3000, 7900);
    let control = batch_invariance(&rt, &case, &[200], false).unwrap();
    assert_eq!(control.mismatches, 1, "without batch invariance the batch changes the bits: {control}");
}

#[test]
fn dp_padded_batches_get_zeros_and_infinite_lse_in_padding_rows() {
    let mut cases = Vec::new();
    for (n, (mode, kv, pad)) in [
        (LayerMode::Decode, KvCacheFormat::Fp8, 3),
        (LayerMode::TargetVerify { draft: 2 }, KvCacheFormat::Bf16, 2),
        (LayerMode::DraftExtendV2 { draft: 2 }, KvCacheFormat::Fp8, 1),
        (LayerMode::Extend { prefix: true }, KvCacheFormat::Fp8, 5),
        (LayerMode::Extend { prefix: false }, KvCacheFormat::Bf16, 4),
    ]
    .into_iter()
    .enumerate()
    {
        let mut case = LayerCase::new(model(32, kv, 64), mode, 3, 4000, 8000 + n as u64);
        case.dp_pad = pad;
        case.check_rows = 8;
        cases.push(case);
    }
    let checks = run_all(&cases);
    assert_eq!(checks.iter().filter(|c| c.kernel == "layer: padding rows").count(), cases.len());
    assert_all(&checks);
}

#[test]
fn context_parallel_ranks_together_equal_the_whole_layer() {
    use nsa_runtime::verify::layer::cp_union;
    let rt = rt();
    let mut checks = Vec::new();
    let mut ragged =
        LayerCase::new(model(16, KvCacheFormat::Fp8, 64), LayerMode::Extend { prefix: true }, 3, 3000, 8101);
    ragged.prefill_backend = PrefillBackend::Fixed(AttnImpl::FlashMlaSparse);
    let cases = [
        LayerCase::new(model(16, KvCacheFormat::Fp8, 64), LayerMode::Extend { prefix: true }, 3, 3000, 8100),
        ragged,
        LayerCase::new(model(32, KvCacheFormat::Bf16, 64), LayerMode::Extend { prefix: false }, 3, 2500, 8102),
    ];
    for case in &cases {
        for cp in [2, 4] {
            let check = cp_union(&rt, case, cp).unwrap_or_else(|e| panic!("{} cp {cp}: {e}", case.describe()));
            eprintln!("{check}");
            checks.push(check);
        }
    }
    assert_all(&checks);
}
