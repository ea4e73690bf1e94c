//! GPU tests (NVIDIA; built only with `--features gpu`). Every kernel of the KV cache
//! family against the CPU reference, bit for bit. Without a GPU these tests FAIL:
//! they are a separate target precisely so that CI never counts them as passed.

use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::KvCacheFormat;
use nsa_runtime::ops::kv_cache::{self, MlaCacheMut};
use nsa_runtime::ops::Rows;
use nsa_runtime::reference::{fp8::e4m3_to_f32, kv_cache as reference};
use nsa_runtime::verify::{self, download, upload, Check};
use nsa_runtime::{DeviceChecks, Error, Runtime};
use std::sync::{Mutex, OnceLock};

#[path = "gpu/dense.rs"]
mod dense;
#[path = "gpu/indexer.rs"]
mod indexer;
#[path = "gpu/layer.rs"]
mod layer;
#[path = "gpu/metadata.rs"]
mod metadata;
#[path = "gpu/python_parity.rs"]
mod python_parity;
#[path = "gpu/serving.rs"]
mod serving;
#[path = "gpu/sparse_decode.rs"]
mod sparse_decode;
#[path = "gpu/sparse_prefill.rs"]
mod sparse_prefill;
#[path = "gpu/topk.rs"]
mod topk;

/// One runtime for the whole binary (tests run on threads; launches serialise on its stream).
pub(crate) fn rt() -> std::sync::MutexGuard<'static, Runtime> {
    static RT: OnceLock<Mutex<Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        let rt = Runtime::new(0).unwrap_or_else(|e| panic!("GPU tests need an NVIDIA GPU and NVRTC: {e}"));
        eprintln!("GPU: {:?}", rt.gpu().caps());
        Mutex::new(rt)
    })
    .lock()
    .unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn assert_all(checks: &[Check]) {
    for c in checks {
        eprintln!("{c}");
    }
    assert!(checks.iter().all(Check::passed), "some checks failed (see above)");
}

// Sizes hit: empty, one token, a partial block, many blocks, > 64K tokens.
const SIZES: [usize; 6] = [0, 1, 7, 9, 1000, 70_001];

#[test]
fn fp8_store_is_bit_exact() {
    let rt = rt();
    let checks: Vec<Check> =
        SIZES.iter().map(|&n| verify::store_mla(&rt, KvCacheFormat::Fp8, n, 11 + n as u64).unwrap()).collect();
    assert_all(&checks);
}

#[test]
fn bf16_store_is_bit_exact() {
    let rt = rt();
    let checks: Vec<Check> =
        SIZES.iter().map(|&n| verify::store_mla(&rt, KvCacheFormat::Bf16, n, 21 + n as u64).unwrap()).collect();
    assert_all(&checks);
}

#[test]
fn indexer_store_is_bit_exact() {
    let rt = rt();
    let checks: Vec<Check> = SIZES.iter().map(|&n| verify::store_indexer(&rt, n, 31 + n as u64).unwrap()).collect();
    assert_all(&checks);
}

#[test]
fn step_store_writes_both_caches_bit_exact_in_both_formats() {
    let rt = rt();
    let checks: Vec<Check> = [KvCacheFormat::Fp8, KvCacheFormat::Bf16]
        .into_iter()
        .flat_map(|f| SIZES.iter().map(move |&n| (f, n)))
        .map(|(format, n)| verify::store_step(&rt, format, n, 41 + n as u64).unwrap())
        .collect();
    assert_all(&checks);
}

#[test]
fn dequant_and_bf16_gather_are_bit_exact_with_repeats_and_rejects() {
    let rt = rt();
    let mut checks = Vec::new();
    for format in [KvCacheFormat::Fp8, KvCacheFormat::Bf16] {
        checks.extend(SIZES.iter().map(|&n| verify::dequant(&rt, format, n, 41 + n as u64, false).unwrap()));
        checks.push(verify::dequant(&rt, format, 513, 47, true).unwrap());
    }
    assert_all(&checks);
}

#[test]
fn indexer_gather_is_bit_exact_with_repeats_and_rejects() {
    let rt = rt();
    let mut checks: Vec<Check> =
        SIZES.iter().map(|&n| verify::gather_indexer(&rt, n, 51 + n as u64, false).unwrap()).collect();
    checks.push(verify::gather_indexer(&rt, 513, 57, true).unwrap());
    assert_all(&checks);
}

#[test]
fn kv_cache_suite_passes() {
    let rt = rt();
    assert_all(&verify::kv_cache_suite(&rt, &[1, 300], 61).unwrap());
}

/// dequant(quant(x)) is within the e4m3 bound for finite tokens:
/// |deq − x| ≤ |x|·(2⁻⁴ + 2⁻⁸) + scale·2⁻¹⁰ (half an e4m3 step, then bf16 rounding).
#[test]
fn dequant_of_quant_within_e4m3_bound() {
    let rt = rt();
    let stream = rt.gpu().stream().clone();
    let n = 4096;
    let rows: Vec<bf16> = {
        let mut r = nsa_runtime::testdata::rng(5);
        (0..n * BF16_TOKEN_ELEMS)
            .map(|_| {
                bf16::from_f32(
                    rand::Rng::random_range(&mut r, -20.0f32..20.0)
                        * rand::Rng::random_range(&mut r, 0.0f32..1.0).powi(4),
                )
            })
            .collect()
    };
    let loc: Vec<i32> = (0..n as i32).collect();
    let d_rows = upload(&stream, &rows).unwrap();
    let d_loc = upload(&stream, &loc).unwrap();
    let mut d_cache = upload(&stream, &vec![0u8; n * FP8_TOKEN_BYTES]).unwrap();
    let (nope, rope) = verify::latent_views(&d_rows, n);
    kv_cache::store_mla(&rt, &nope, &rope, &d_loc.slice(0..), &mut MlaCacheMut::Fp8(d_cache.slice_mut(0..))).unwrap();
    let mut d_out = upload(&stream, &vec![bf16::ZERO; n * BF16_TOKEN_ELEMS]).unwrap();
    kv_cache::dequant_fp8(&rt, &d_cache.slice(0..), &d_loc.slice(0..), &mut d_out.slice_mut(0..)).unwrap();
    let cache = download(&stream, &d_cache, n * FP8_TOKEN_BYTES).unwrap();
    let out = download(&stream, &d_out, n * BF16_TOKEN_ELEMS).unwrap();
    let mut worst = 0.0f32;
    for t in 0..n {
        let rec = &cache[t * FP8_TOKEN_BYTES..][..FP8_TOKEN_BYTES];
        for d in 0..BF16_TOKEN_ELEMS {
            let x = rows[t * BF16_TOKEN_ELEMS + d].to_f32();
            let y = out[t * BF16_TOKEN_ELEMS + d].to_f32();
            if d >= KV_LORA_RANK {
                assert_eq!(x.to_bits(), y.to_bits(), "rope must be copied exactly");
                continue;
            }
            let scale = reference::fp8_scale(rec, d / FP8_TILE);
            let bound = x.abs() * (1.0 / 16.0 + 1.0 / 256.0) + scale / 1024.0;
            worst = worst.max((y - x).abs() / bound.max(f32::MIN_POSITIVE));
            assert!((y - x).abs() <= bound, "token {t} dim {d}: x {x} deq {y} scale {scale}");
        }
    }
    eprintln!("worst error / bound = {worst:.3}");
    // The bound is tight enough to matter: some value uses most of it.
    assert!(worst > 0.5, "suspiciously small error: is the cache really FP8?");
    // And the scale is amax/448: the tile maximum decodes to 448·scale.
    let rec = &cache[..FP8_TOKEN_BYTES];
    let amax = reference::finite_amax(rows[..FP8_TILE].iter().map(|v| v.to_f32()));
    assert_eq!(reference::fp8_scale(rec, 0), amax / 448.0);
    assert!(rec[..FP8_TILE].iter().any(|&b| e4m3_to_f32(b).abs() == 448.0));
}

#[test]
fn rejected_slots_are_skipped_and_reported() {
    let mut rt = rt();
    let stream = rt.gpu().stream().clone();
    let n = 4;
    let pool = 8;
    let rows = nsa_runtime::testdata::mla_rows(n, 9);
    let loc = vec![2, -1, 8, 5];
    let d_rows = upload(&stream, &rows).unwrap();
    let d_loc = upload(&stream, &loc).unwrap();
    let sentinel = vec![0x5au8; pool * FP8_TOKEN_BYTES];
    for checks in [DeviceChecks::Skip, DeviceChecks::Report] {
        rt.set_checks(checks).unwrap();
        let mut d_cache = upload(&stream, &sentinel).unwrap();
        let (nope, rope) = verify::latent_views(&d_rows, n);
        let r =
            kv_cache::store_mla(&rt, &nope, &rope, &d_loc.slice(0..), &mut MlaCacheMut::Fp8(d_cache.slice_mut(0..)));
        match (checks, r) {
            (DeviceChecks::Skip, Ok(())) => {}
            (DeviceChecks::Report, Err(Error::DeviceRejected { count: 2, field: "loc", example, .. })) => {
                assert!(example == 1 || example == 2, "example {example}");
            }
            (c, other) => panic!("{c:?}: unexpected {other:?}"),
        }
        let got = download(&stream, &d_cache, sentinel.len()).unwrap();
        let (nope_h, rope_h) = verify::split_rows(&rows);
        let mut want = sentinel.clone();
        assert_eq!(reference::store_fp8(&nope_h, &rope_h, &loc, &mut want), 2);
        assert!(got == want, "{checks:?}: only slots 2 and 5 may change");
    }
    rt.set_checks(DeviceChecks::Skip).unwrap();
}

/// The step store skips each cache's bad slots on its own and reports each
/// rejected token once, whichever pool rejects it: with an 8-row latent pool,
/// -1 (outside both) and 8 (latent only; the 64-slot indexer page takes it); with
/// an 80-row latent pool, -1 and 100 (outside both) and 70 (indexer only).
#[test]
fn step_store_rejects_per_cache_and_reports_each_token_once() {
    let mut rt = rt();
    let stream = rt.gpu().stream().clone();
    for (pool, loc, rejected) in [(8, vec![2, -1, 8, 5], 2), (80, vec![2, -1, 70, 5, 100], 3)] {
        let n = loc.len();
        let rows = nsa_runtime::testdata::mla_rows(n, 9);
        let keys = nsa_runtime::testdata::indexer_rows(n, 10);
        let d_rows = upload(&stream, &rows).unwrap();
        let d_keys = upload(&stream, &keys).unwrap();
        let d_loc = upload(&stream, &loc).unwrap();
        let sentinel = vec![0x5au8; pool * FP8_TOKEN_BYTES];
        let index_sentinel = vec![0x5au8; INDEXER_PAGE_BYTES];
        let (nope_h, rope_h) = verify::split_rows(&rows);
        let mut want = sentinel.clone();
        let mut want_index = index_sentinel.clone();
        let latent_rejects = reference::store_fp8(&nope_h, &rope_h, &loc, &mut want);
        let index_rejects = reference::store_indexer_k(&keys, &loc, &mut want_index);
        assert!(latent_rejects <= rejected && index_rejects <= rejected, "pool {pool}");
        for checks in [DeviceChecks::Skip, DeviceChecks::Report] {
            rt.set_checks(checks).unwrap();
            let mut d_cache = upload(&stream, &sentinel).unwrap();
            let mut d_index = upload(&stream, &index_sentinel).unwrap();
            let (nope, rope) = verify::latent_views(&d_rows, n);
            let index_k = Rows { data: d_keys.slice(0..), count: n, width: INDEXER_HEAD_DIM, stride: INDEXER_HEAD_DIM };
            let r = kv_cache::store_step(
                &rt,
                &nope,
                &rope,
                &index_k,
                &d_loc.slice(0..),
                &mut MlaCacheMut::Fp8(d_cache.slice_mut(0..)),
                &mut d_index.slice_mut(0..),
            );
            match (checks, r) {
                (DeviceChecks::Skip, Ok(())) => {}
                (DeviceChecks::Report, Err(Error::DeviceRejected { count, field: "loc", example, .. })) => {
                    assert_eq!(count as usize, rejected, "pool {pool}: each rejected token once");
                    let slot = loc[example as usize];
                    assert!(slot < 0 || slot >= pool.min(64) as i32, "pool {pool}: example {example} (slot {slot})");
                }
                (c, other) => panic!("pool {pool}, {c:?}: unexpected {other:?}"),
            }
            assert!(download(&stream, &d_cache, sentinel.len()).unwrap() == want, "pool {pool}, {checks:?}: latents");
            let got_index = download(&stream, &d_index, index_sentinel.len()).unwrap();
            assert!(got_index == want_index, "pool {pool}, {checks:?}: indexer keys");
        }
    }
    rt.set_checks(DeviceChecks::Skip).unwrap();
}

/// The stand-alone indexer-K store skips and reports a negative slot and one past
/// its pages, and writes the others.
#[test]
fn indexer_store_rejects_and_reports_bad_slots() {
    let mut rt = rt();
    let stream = rt.gpu().stream().clone();
    let loc = vec![2, -1, 64, 5];
    let keys = nsa_runtime::testdata::indexer_rows(loc.len(), 11);
    let (d_keys, d_loc) = (upload(&stream, &keys).unwrap(), upload(&stream, &loc).unwrap());
    let sentinel = vec![0x5au8; INDEXER_PAGE_BYTES];
    let mut want = sentinel.clone();
    assert_eq!(reference::store_indexer_k(&keys, &loc, &mut want), 2);
    for checks in [DeviceChecks::Skip, DeviceChecks::Report] {
        rt.set_checks(checks).unwrap();
        let mut d_cache = upload(&stream, &sentinel).unwrap();
        let k = Rows { data: d_keys.slice(0..), count: loc.len(), width: INDEXER_HEAD_DIM, stride: INDEXER_HEAD_DIM };
        let r = kv_cache::store_indexer_k(&rt, &k, &d_loc.slice(0..), &mut d_cache.slice_mut(0..));
        match (checks, r) {
            (DeviceChecks::Skip, Ok(())) => {}
            (DeviceChecks::Report, Err(Error::DeviceRejected { count: 2, field: "loc", example, .. })) => {
                assert!(example == 1 || example == 2, "example {example}");
            }
            (c, other) => panic!("{c:?}: unexpected {other:?}"),
        }
        assert!(download(&stream, &d_cache, sentinel.len()).unwrap() == want, "{checks:?}: slots 2 and 5 only");
    }
    rt.set_checks(DeviceChecks::Skip).unwrap();
}

#[test]
fn rejected_gather_slots_are_zeroed_and_reported() {
    let mut rt = rt();
    let stream = rt.gpu().stream().clone();
    let cache: Vec<u8> = (0..INDEXER_PAGE_BYTES).map(|i| (i % 251) as u8 + 1).collect();
    let slots = vec![5, -1, 64, 63];
    let d_cache = upload(&stream, &cache).unwrap();
    let d_slots = upload(&stream, &slots).unwrap();
    let (want_keys, want_scales, rejected) = reference::gather_indexer_k(&cache, &slots);
    assert_eq!(rejected, 2);
    rt.set_checks(DeviceChecks::Report).unwrap();
    let mut d_keys = upload(&stream, &vec![0x5au8; 4 * INDEXER_HEAD_DIM]).unwrap();
    let mut d_scales = upload(&stream, &[1.0f32; 4]).unwrap();
    let r = kv_cache::gather_indexer_k(
        &rt,
        &d_cache.slice(0..),
        &d_slots.slice(0..),
        &mut d_keys.slice_mut(0..),
        &mut d_scales.slice_mut(0..),
    );
    rt.set_checks(DeviceChecks::Skip).unwrap();
    match r {
        Err(Error::DeviceRejected { count: 2, field: "slots", example, .. }) => {
            assert!(example == 1 || example == 2, "example {example}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(download(&stream, &d_keys, want_keys.len()).unwrap(), want_keys);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&download(&stream, &d_scales, 4).unwrap()), bits(&want_scales));
}

#[test]
fn host_checks_reject_bad_views_before_launch() {
    let rt = rt();
    let stream = rt.gpu().stream().clone();
    let d_rows = upload(&stream, &vec![bf16::ZERO; 4 * BF16_TOKEN_ELEMS]).unwrap();
    let d_loc = upload(&stream, &[0i32, 1, 2, 3]).unwrap();
    let mut d_cache = upload(&stream, &vec![0u8; 10 * FP8_TOKEN_BYTES]).unwrap();
    let rope = Rows { data: d_rows.slice(KV_LORA_RANK..), count: 4, width: ROPE_DIM, stride: BF16_TOKEN_ELEMS };
    let cases: Vec<(Rows<'_, bf16>, &str)> = vec![
        (Rows { data: d_rows.slice(0..), count: 4, width: KV_LORA_RANK, stride: 500 }, "k_nope"),
        (Rows { data: d_rows.slice(0..), count: 4, width: KV_LORA_RANK, stride: 580 }, "k_nope"),
        (Rows { data: d_rows.slice(0..), count: 3, width: KV_LORA_RANK, stride: BF16_TOKEN_ELEMS }, "k_nope.count"),
        (Rows { data: d_rows.slice(4..), count: 4, width: KV_LORA_RANK, stride: BF16_TOKEN_ELEMS }, "k_nope"),
    ];
    for (nope, field) in cases {
        let err =
            kv_cache::store_mla(&rt, &nope, &rope, &d_loc.slice(0..), &mut MlaCacheMut::Fp8(d_cache.slice_mut(0..)))
                .unwrap_err();
        match &err {
            Error::InvalidArgument { field: f, .. } => assert_eq!(*f, field, "{err}"),
            other => panic!("expected InvalidArgument for {field}, got {other}"),
        }
    }
    let nope = Rows { data: d_rows.slice(0..), count: 4, width: KV_LORA_RANK, stride: BF16_TOKEN_ELEMS };
    let err =
        kv_cache::store_mla(&rt, &nope, &rope, &d_loc.slice(0..), &mut MlaCacheMut::Fp8(d_cache.slice_mut(0..1000)))
            .unwrap_err();
    assert!(err.to_string().contains("656-byte"), "{err}");
}
