//! GPU-vs-CPU-reference checks, shared by `nsa verify` and the GPU test target.

use crate::ops::kv_cache::{self, MlaCacheMut};
use crate::ops::Rows;
use crate::reference::kv_cache as reference;
use crate::runtime::Runtime;
use crate::testdata;
use crate::{Error, Result};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::{KernelFamily, KernelSpec, KvCacheFormat};
use std::sync::Arc;

/// Outcome of one check: how many items (tokens) differed from the reference.
#[derive(Clone, Debug)]
pub struct Check {
    pub kernel: String,
    pub case: String,
    pub items: usize,
    pub mismatches: usize,
    pub first_mismatch: Option<String>,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.mismatches == 0
    }
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = if self.passed() { "ok" } else { "FAILED" };
        write!(
            f,
            "{verdict:6} {:40} {:28} {:>8} items, {} mismatches",
            self.kernel, self.case, self.items, self.mismatches
        )?;
        if let Some(m) = &self.first_mismatch {
            write!(f, " (first: {m})")?;
        }
        Ok(())
    }
}

/// Copies `data` to the device; empty inputs get a one-element allocation so the
/// caller can still take an empty view of it.
pub fn upload<T: DeviceRepr + Copy + Default>(stream: &Arc<CudaStream>, data: &[T]) -> Result<CudaSlice<T>> {
    let padded;
    let src = if data.is_empty() {
        padded = [T::default()];
        &padded[..]
    } else {
        data
    };
    stream.clone_htod(src).map_err(Error::driver("uploading test data"))
}

pub fn download<T: DeviceRepr + Default + Copy>(
    stream: &Arc<CudaStream>,
    data: &CudaSlice<T>,
    len: usize,
) -> Result<Vec<T>> {
    let mut v = stream.clone_dtoh(data).map_err(Error::driver("downloading results"))?;
    v.truncate(len);
    Ok(v)
}

fn compare_rows<T: PartialEq + std::fmt::Debug>(
    got: &[T],
    want: &[T],
    row_len: usize,
    what: &str,
) -> (usize, Option<String>) {
    let mut bad = 0;
    let mut first = None;
    for (r, (g, w)) in got.chunks(row_len).zip(want.chunks(row_len)).enumerate() {
        if g != w {
            bad += 1;
            if first.is_none() {
                let i = g.iter().zip(w).position(|(a, b)| a != b).unwrap_or(0);
                first = Some(format!("{what} {r}, element {i}: gpu {:?} vs reference {:?}", g[i], w[i]));
            }
        }
    }
    (bad, first)
}

fn id(rt: &Runtime, family: KernelFamily) -> String {
    KernelSpec::new(family, rt.target()).id()
}

/// Pool size for `n` tokens: room for every token plus untouched rows.
fn pool_for(n: usize) -> usize {
    n + n / 3 + 64
}

/// Stores `n` adversarial tokens (strided views of `[n, 576]` rows) at random slots
/// of a sentinel-filled cache and compares every cache byte with the reference.
pub fn store_mla(rt: &Runtime, format: KvCacheFormat, n: usize, seed: u64) -> Result<Check> {
    let stream = rt.gpu().stream();
    let rows = testdata::mla_rows(n, seed);
    let pool = pool_for(n);
    let loc = testdata::distinct_slots(n, pool, seed ^ 1);
    let d_rows = upload(stream, &rows)?;
    let d_loc = upload(stream, &loc)?;
    let (nope, rope) = latent_views(&d_rows, n);
    let (nope_h, rope_h) = split_rows(&rows);
    let loc_view = d_loc.slice(0..n);
    let (mismatches, first_mismatch) = match format {
        KvCacheFormat::Fp8 => {
            let mut want = vec![0xa5u8; pool * FP8_TOKEN_BYTES];
            let mut d_cache = upload(stream, &want)?;
            kv_cache::store_mla(rt, &nope, &rope, &loc_view, &mut MlaCacheMut::Fp8(d_cache.slice_mut(0..)))?;
            reference::store_fp8(&nope_h, &rope_h, &loc, &mut want);
            let got = download(stream, &d_cache, want.len())?;
            compare_rows(&got, &want, FP8_TOKEN_BYTES, "slot")
        }
        KvCacheFormat::Bf16 => {
            let mut want = vec![bf16::from_bits(0xa5a5); pool * BF16_TOKEN_ELEMS];
            let mut d_cache = upload(stream, &want)?;
            kv_cache::store_mla(rt, &nope, &rope, &loc_view, &mut MlaCacheMut::Bf16(d_cache.slice_mut(0..)))?;
            reference::store_bf16(&nope_h, &rope_h, &loc, &mut want);
            let got = download(stream, &d_cache, want.len())?;
            let (g, w): (Vec<u16>, Vec<u16>) =
                (got.iter().map(|v| v.to_bits()).collect(), want.iter().map(|v| v.to_bits()).collect());
            compare_rows(&g, &w, BF16_TOKEN_ELEMS, "slot")
        }
    };
    Ok(Check {
        kernel: id(rt, KernelFamily::KvStore { format }),
        case: format!("n={n} strided, pool={pool}"),
        items: n,
        mismatches,
        first_mismatch,
    })
}

/// `k_nope` and `k_rope` as strided views of `n` uploaded `[n, 576]` rows.
pub fn latent_views(rows: &CudaSlice<bf16>, n: usize) -> (Rows<'_, bf16>, Rows<'_, bf16>) {
    let nope = Rows { data: rows.slice(0..), count: n, width: KV_LORA_RANK, stride: BF16_TOKEN_ELEMS };
    let rope =
        Rows { data: rows.slice(KV_LORA_RANK.min(rows.len())..), count: n, width: ROPE_DIM, stride: BF16_TOKEN_ELEMS };
    (nope, rope)
}

/// Stores `n` tokens' latents (`format`) and indexer keys at distinct random slots
/// in one step-store launch and compares both caches with the reference stores,
/// bit for bit (bytes no token owns included).
pub fn store_step(rt: &Runtime, format: KvCacheFormat, n: usize, seed: u64) -> Result<Check> {
    let stream = rt.gpu().stream();
    let rows = testdata::mla_rows(n, seed);
    let keys = testdata::indexer_rows(n, seed ^ 7);
    // One pool of slots for both caches: whole indexer pages.
    let pool = pool_for(n).div_ceil(INDEXER_PAGE_TOKENS) * INDEXER_PAGE_TOKENS;
    let loc = testdata::distinct_slots(n, pool, seed ^ 1);
    let (d_rows, d_keys, d_loc) = (upload(stream, &rows)?, upload(stream, &keys)?, upload(stream, &loc)?);
    let (nope, rope) = latent_views(&d_rows, n);
    let index_k = Rows { data: d_keys.slice(0..), count: n, width: INDEXER_HEAD_DIM, stride: INDEXER_HEAD_DIM };
    let (nope_h, rope_h) = split_rows(&rows);
    let loc_view = d_loc.slice(0..n);
    let mut want_index = vec![0xa5u8; pool / INDEXER_PAGE_TOKENS * INDEXER_PAGE_BYTES];
    let mut d_index = upload(stream, &want_index)?;
    reference::store_indexer_k(&keys, &loc, &mut want_index);
    let (bad_latent, first_latent) = match format {
        KvCacheFormat::Fp8 => {
            let mut want = vec![0xa5u8; pool * FP8_TOKEN_BYTES];
            let mut d_cache = upload(stream, &want)?;
            let mut cache = MlaCacheMut::Fp8(d_cache.slice_mut(0..));
            kv_cache::store_step(rt, &nope, &rope, &index_k, &loc_view, &mut cache, &mut d_index.slice_mut(0..))?;
            reference::store_fp8(&nope_h, &rope_h, &loc, &mut want);
            compare_rows(&download(stream, &d_cache, want.len())?, &want, FP8_TOKEN_BYTES, "latent slot")
        }
        KvCacheFormat::Bf16 => {
            let mut want = vec![bf16::from_bits(0xa5a5); pool * BF16_TOKEN_ELEMS];
            let mut d_cache = upload(stream, &want)?;
            let mut cache = MlaCacheMut::Bf16(d_cache.slice_mut(0..));
            kv_cache::store_step(rt, &nope, &rope, &index_k, &loc_view, &mut cache, &mut d_index.slice_mut(0..))?;
            reference::store_bf16(&nope_h, &rope_h, &loc, &mut want);
            let got = download(stream, &d_cache, want.len())?;
            let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
            compare_rows(&bits(&got), &bits(&want), BF16_TOKEN_ELEMS, "latent slot")
        }
    };
    let got_index = download(stream, &d_index, want_index.len())?;
    let (bad_index, first_index) = compare_rows(&got_index, &want_index, INDEXER_PAGE_BYTES, "indexer page");
    Ok(Check {
        kernel: id(rt, KernelFamily::StepStore { format }),
        case: format!("n={n} strided, pool={pool}"),
        items: n,
        mismatches: bad_latent + bad_index,
        first_mismatch: first_latent.or(first_index),
    })
}

/// Splits `[n, 576]` rows into dense nope `[n, 512]` and rope `[n, 64]`.
pub fn split_rows(rows: &[bf16]) -> (Vec<bf16>, Vec<bf16>) {
    let mut nope = Vec::with_capacity(rows.len() / BF16_TOKEN_ELEMS * KV_LORA_RANK);
    let mut rope = Vec::with_capacity(rows.len() / BF16_TOKEN_ELEMS * ROPE_DIM);
    for r in rows.chunks(BF16_TOKEN_ELEMS) {
        nope.extend_from_slice(&r[..KV_LORA_RANK]);
        rope.extend_from_slice(&r[KV_LORA_RANK..]);
    }
    (nope, rope)
}

/// Builds a cache in `format` (FP8 with the reference quantizer), reads `n` slots
/// back as bf16 rows (repeats included, plus −1 and out-of-pool entries when
/// `with_rejects`) on the GPU and compares every output element with the reference,
/// bit for bit.
pub fn dequant(rt: &Runtime, format: KvCacheFormat, n: usize, seed: u64, with_rejects: bool) -> Result<Check> {
    let stream = rt.gpu().stream();
    let tokens = n.max(1);
    let pool = pool_for(tokens);
    let rows = testdata::mla_rows(tokens, seed);
    let slots = testdata::distinct_slots(tokens, pool, seed ^ 2);
    let mut rng = testdata::rng(seed ^ 3);
    let mut idx: Vec<i32> = (0..n).map(|_| rand::Rng::random_range(&mut rng, 0..pool as i32)).collect();
    if with_rejects && n >= 2 {
        idx[0] = -1;
        idx[n - 1] = pool as i32;
    }
    let d_idx = upload(stream, &idx)?;
    let mut d_out = upload(stream, &vec![bf16::from_bits(0xa5a5); n * BF16_TOKEN_ELEMS])?;
    let mut out = d_out.slice_mut(0..n * BF16_TOKEN_ELEMS);
    let want = match format {
        KvCacheFormat::Fp8 => {
            let (nope_h, rope_h) = split_rows(&rows);
            let mut cache = vec![0u8; pool * FP8_TOKEN_BYTES];
            reference::store_fp8(&nope_h, &rope_h, &slots, &mut cache);
            let d_cache = upload(stream, &cache)?;
            kv_cache::dequant_fp8(rt, &d_cache.slice(0..), &d_idx.slice(0..n), &mut out)?;
            reference::dequant_fp8(&cache, &idx).0
        }
        KvCacheFormat::Bf16 => {
            // Unwritten slots hold a pattern, so a row read from the wrong slot differs.
            let mut cache = vec![bf16::from_bits(0x3c5a); pool * BF16_TOKEN_ELEMS];
            for (t, &s) in slots.iter().enumerate() {
                cache[s as usize * BF16_TOKEN_ELEMS..][..BF16_TOKEN_ELEMS]
                    .copy_from_slice(&rows[t * BF16_TOKEN_ELEMS..][..BF16_TOKEN_ELEMS]);
            }
            let d_cache = upload(stream, &cache)?;
            kv_cache::gather_bf16(rt, &d_cache.slice(0..), &d_idx.slice(0..n), &mut out)?;
            reference::gather_bf16(&cache, &idx).0
        }
    };
    let got: Vec<u16> = download(stream, &d_out, n * BF16_TOKEN_ELEMS)?.iter().map(|v| v.to_bits()).collect();
    let want: Vec<u16> = want.iter().map(|v| v.to_bits()).collect();
    let (mismatches, first_mismatch) = compare_rows(&got, &want, BF16_TOKEN_ELEMS, "row");
    Ok(Check {
        kernel: id(rt, KernelFamily::KvDequant { format }),
        case: format!("n={n}{}", if with_rejects { " with -1/out-of-pool" } else { "" }),
        items: n,
        mismatches,
        first_mismatch,
    })
}

/// Stores `n` indexer keys at random slots of a sentinel-filled paged cache and
/// compares every page byte with the reference.
pub fn store_indexer(rt: &Runtime, n: usize, seed: u64) -> Result<Check> {
    let stream = rt.gpu().stream();
    let keys = testdata::indexer_rows(n, seed);
    let pages = pool_for(n).div_ceil(INDEXER_PAGE_TOKENS);
    let loc = testdata::distinct_slots(n, pages * INDEXER_PAGE_TOKENS, seed ^ 4);
    let mut want = vec![0xa5u8; pages * INDEXER_PAGE_BYTES];
    let d_keys = upload(stream, &keys)?;
    let d_loc = upload(stream, &loc)?;
    let mut d_cache = upload(stream, &want)?;
    let k = Rows { data: d_keys.slice(0..), count: n, width: INDEXER_HEAD_DIM, stride: INDEXER_HEAD_DIM };
    kv_cache::store_indexer_k(rt, &k, &d_loc.slice(0..n), &mut d_cache.slice_mut(0..))?;
    reference::store_indexer_k(&keys, &loc, &mut want);
    let got = download(stream, &d_cache, want.len())?;
    let (mismatches, first_mismatch) = compare_rows(&got, &want, INDEXER_PAGE_BYTES, "page");
    Ok(Check {
        kernel: id(rt, KernelFamily::IndexerKStore),
        case: format!("n={n}, pages={pages}"),
        items: n,
        mismatches,
        first_mismatch,
    })
}

/// Builds a paged indexer cache with the reference store, gathers `n` slots (repeats
/// included, plus −1 and out-of-pool entries when `with_rejects`) on the GPU and
/// compares keys and scales with the reference gather, bit for bit.
pub fn gather_indexer(rt: &Runtime, n: usize, seed: u64, with_rejects: bool) -> Result<Check> {
    let stream = rt.gpu().stream();
    let tokens = n.max(1);
    let pages = pool_for(tokens).div_ceil(INDEXER_PAGE_TOKENS);
    let pool = pages * INDEXER_PAGE_TOKENS;
    let mut rng = testdata::rng(seed ^ 6);
    // Random bytes under the stored keys: slots never stored are not zero either.
    let mut cache: Vec<u8> = (0..pages * INDEXER_PAGE_BYTES).map(|_| rand::Rng::random(&mut rng)).collect();
    let stored = testdata::indexer_rows(tokens, seed);
    reference::store_indexer_k(&stored, &testdata::distinct_slots(tokens, pool, seed ^ 5), &mut cache);
    let mut slots: Vec<i32> = (0..n).map(|_| rand::Rng::random_range(&mut rng, 0..pool as i32)).collect();
    if with_rejects && n >= 2 {
        slots[0] = -1;
        slots[n - 1] = pool as i32;
    }
    let d_cache = upload(stream, &cache)?;
    let d_slots = upload(stream, &slots)?;
    let mut d_keys = upload(stream, &vec![0xa5u8; n * INDEXER_HEAD_DIM])?;
    let mut d_scales = upload(stream, &vec![f32::from_bits(0xa5a5_a5a5); n])?;
    kv_cache::gather_indexer_k(
        rt,
        &d_cache.slice(0..),
        &d_slots.slice(0..n),
        &mut d_keys.slice_mut(0..n * INDEXER_HEAD_DIM),
        &mut d_scales.slice_mut(0..n),
    )?;
    let got_keys = download(stream, &d_keys, n * INDEXER_HEAD_DIM)?;
    let got_scales: Vec<u32> = download(stream, &d_scales, n)?.iter().map(|v| v.to_bits()).collect();
    let (want_keys, want_scales, _) = reference::gather_indexer_k(&cache, &slots);
    let want_scales: Vec<u32> = want_scales.iter().map(|v| v.to_bits()).collect();
    let (bad_keys, first_key) = compare_rows(&got_keys, &want_keys, INDEXER_HEAD_DIM, "key row");
    let (bad_scales, first_scale) = compare_rows(&got_scales, &want_scales, 1, "scale");
    Ok(Check {
        kernel: id(rt, KernelFamily::IndexerKGather),
        case: format!("n={n}, pages={pages}{}", if with_rejects { " with -1/out-of-pool" } else { "" }),
        items: n,
        mismatches: bad_keys + bad_scales,
        first_mismatch: first_key.or(first_scale),
    })
}

/// Every check of the KV cache family at each size in `sizes`.
pub fn kv_cache_suite(rt: &Runtime, sizes: &[usize], seed: u64) -> Result<Vec<Check>> {
    let mut checks = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let s = seed.wrapping_add(i as u64 * 1000);
        checks.push(store_mla(rt, KvCacheFormat::Fp8, n, s)?);
        checks.push(store_mla(rt, KvCacheFormat::Bf16, n, s + 1)?);
        checks.push(dequant(rt, KvCacheFormat::Fp8, n, s + 2, false)?);
        checks.push(dequant(rt, KvCacheFormat::Bf16, n, s + 5, n > 1)?);
        checks.push(store_indexer(rt, n, s + 3)?);
        checks.push(gather_indexer(rt, n, s + 4, n > 1)?);
    }
    Ok(checks)
}

/// Device time per call of `f` over `iters` calls, between two events.
pub(crate) fn device_us(rt: &Runtime, iters: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let stream = rt.gpu().stream();
    let event = || {
        stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(crate::Error::driver("recording an event"))
    };
    let start = event()?;
    for _ in 0..iters {
        f()?;
    }
    let end = event()?;
    end.synchronize().map_err(crate::Error::driver("waiting for the timed calls"))?;
    Ok(start.elapsed_ms(&end).map_err(crate::Error::driver("reading event time"))? as f64 * 1e3 / iters as f64)
}

pub mod attention;
pub mod dense;
pub mod indexer;
pub mod layer;
pub mod metadata;
pub mod mha;
pub mod sparse_decode;
pub mod sparse_prefill;
pub mod topk;
