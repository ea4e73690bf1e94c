//! Runs the KV store family of the example models end to end on GPU 0 through the
//! typed entry points (`M::kernels(&rt)`, `MlaCache<'_, M::KvFormat>`), and compares
//! every cache byte and dequantized element with the CPU reference. Exits 1 on any
//! mismatch. Needs an NVIDIA GPU (sm_90a or sm_100a) and NVRTC:
//!
//! ```text
//! bash .ci/env.sh cargo run --release -p nsa-example-model
//! ```

use cudarc::driver::CudaSlice;
use half::bf16;
use nsa_example_model::{DeepSeekV32Bf16, DeepSeekV32Tp8};
use nsa_runtime::kernels::layout::*;
use nsa_runtime::model::{format, Fp8Cache, KvFormat, MlaCache, ModelKernels, NsaModel};
use nsa_runtime::ops::Rows;
use nsa_runtime::reference::kv_cache as reference;
use nsa_runtime::testdata;
use nsa_runtime::verify::{download, split_rows, upload, Check};
use nsa_runtime::{Result, Runtime};
use std::process::ExitCode;

/// Token counts: empty, one, a partial block, many blocks, more than 64K.
const SIZES: [usize; 5] = [0, 1, 7, 1000, 70_001];

/// The CPU reference of each cache format's store, and how to compare its elements.
trait Reference: KvFormat {
    fn store(nope: &[bf16], rope: &[bf16], loc: &[i32], cache: &mut [Self::Elem]);
    fn sentinel() -> Self::Elem;
    fn bits(e: Self::Elem) -> u16;
}

impl Reference for format::Fp8 {
    fn store(nope: &[bf16], rope: &[bf16], loc: &[i32], cache: &mut [u8]) {
        reference::store_fp8(nope, rope, loc, cache);
    }
    fn sentinel() -> u8 {
        0xa5
    }
    fn bits(e: u8) -> u16 {
        e.into()
    }
}

impl Reference for format::Bf16 {
    fn store(nope: &[bf16], rope: &[bf16], loc: &[i32], cache: &mut [bf16]) {
        reference::store_bf16(nope, rope, loc, cache);
    }
    fn sentinel() -> bf16 {
        bf16::from_bits(0xa5a5)
    }
    fn bits(e: bf16) -> u16 {
        e.to_bits()
    }
}

/// Rows (slots, output rows) whose bits differ, and the first of them.
fn compare<T: Copy>(got: &[T], want: &[T], row_len: usize, bits: impl Fn(T) -> u16) -> (usize, Option<String>) {
    let rows = got.chunks(row_len).zip(want.chunks(row_len)).enumerate();
    let bad: Vec<usize> =
        rows.filter(|(_, (g, w))| g.iter().zip(w.iter()).any(|(a, b)| bits(*a) != bits(*b))).map(|(r, _)| r).collect();
    (bad.len(), bad.first().map(|r| format!("row {r}")))
}

/// Element type of model `M`'s MLA cache.
type Elem<M> = <<M as NsaModel>::KvFormat as KvFormat>::Elem;

fn pool_for(n: usize) -> usize {
    n + n / 3 + 64
}

/// One MLA store's outcome: the check, and the cache on the device and the host.
struct Stored<E> {
    check: Check,
    device: CudaSlice<E>,
    host: Vec<E>,
}

/// The model's MLA store into a sentinel-filled cache of its own format, against
/// the reference.
fn store_mla<M: NsaModel>(kernels: &ModelKernels<'_, M>, n: usize, seed: u64) -> Result<Stored<Elem<M>>>
where
    M::KvFormat: Reference,
{
    let rt = kernels.runtime();
    let stream = rt.gpu().stream();
    let rows = testdata::mla_rows(n, seed);
    let pool = pool_for(n);
    let loc = testdata::distinct_slots(n, pool, seed ^ 1);
    let (d_rows, d_loc) = (upload(stream, &rows)?, upload(stream, &loc)?);
    // Strided views into [n, 576] rows, as a model's fused projection output is.
    let nope = Rows { data: d_rows.slice(0..), count: n, width: KV_LORA_RANK, stride: BF16_TOKEN_ELEMS };
    let rope = Rows {
        data: d_rows.slice(KV_LORA_RANK.min(d_rows.len())..),
        count: n,
        width: ROPE_DIM,
        stride: BF16_TOKEN_ELEMS,
    };
    let per_token = <M::KvFormat as KvFormat>::ELEMS_PER_TOKEN;
    let mut want = vec![<M::KvFormat as Reference>::sentinel(); pool * per_token];
    let mut d_cache = upload(stream, &want)?;
    {
        let mut cache = MlaCache::<M::KvFormat>::new(d_cache.slice_mut(0..want.len()))?;
        kernels.store_mla(&nope, &rope, &d_loc.slice(0..n), &mut cache)?;
    }
    let (nope_h, rope_h) = split_rows(&rows);
    <M::KvFormat as Reference>::store(&nope_h, &rope_h, &loc, &mut want);
    let got = download(stream, &d_cache, want.len())?;
    let (mismatches, first_mismatch) = compare(&got, &want, per_token, <M::KvFormat as Reference>::bits);
    let check = Check {
        kernel: format!("{}::store_mla", M::NAME),
        case: format!("n={n} strided, pool={pool}"),
        items: n,
        mismatches,
        first_mismatch,
    };
    Ok(Stored { check, device: d_cache, host: want })
}

/// Gathers slots of an FP8 cache (repeats, −1 and an out-of-pool slot included)
/// through the FP8-only entry point.
fn dequant<M: NsaModel<KvFormat = format::Fp8>>(
    kernels: &ModelKernels<'_, M>,
    d_cache: &mut CudaSlice<u8>,
    cache_h: &[u8],
    n: usize,
) -> Result<Check> {
    let stream = kernels.runtime().gpu().stream();
    let pool = cache_h.len() / FP8_TOKEN_BYTES;
    let mut idx: Vec<i32> = (0..n).map(|i| ((i * 7919) % pool) as i32).collect();
    if n >= 2 {
        idx[0] = -1;
        idx[n - 1] = pool as i32;
    }
    let d_idx = upload(stream, &idx)?;
    let mut d_out = upload(stream, &vec![bf16::from_bits(0xa5a5); n * BF16_TOKEN_ELEMS])?;
    let len = cache_h.len();
    let cache = Fp8Cache::new(d_cache.slice_mut(0..len))?;
    kernels.dequant_fp8(&cache, &d_idx.slice(0..n), &mut d_out.slice_mut(0..n * BF16_TOKEN_ELEMS))?;
    let got = download(stream, &d_out, n * BF16_TOKEN_ELEMS)?;
    let want = reference::dequant_fp8(cache_h, &idx).0;
    let (mismatches, first_mismatch) = compare(&got, &want, BF16_TOKEN_ELEMS, bf16::to_bits);
    Ok(Check {
        kernel: format!("{}::dequant_fp8", M::NAME),
        case: format!("n={n} with repeats, -1 and out-of-pool"),
        items: n,
        mismatches,
        first_mismatch,
    })
}

fn store_indexer<M: NsaModel>(kernels: &ModelKernels<'_, M>, n: usize, seed: u64) -> Result<Check> {
    let stream = kernels.runtime().gpu().stream();
    let keys = testdata::indexer_rows(n, seed);
    let pages = pool_for(n).div_ceil(INDEXER_PAGE_TOKENS);
    let loc = testdata::distinct_slots(n, pages * INDEXER_PAGE_TOKENS, seed ^ 4);
    let mut want = vec![0xa5u8; pages * INDEXER_PAGE_BYTES];
    let (d_keys, d_loc) = (upload(stream, &keys)?, upload(stream, &loc)?);
    let mut d_cache = upload(stream, &want)?;
    let k = Rows { data: d_keys.slice(0..), count: n, width: INDEXER_HEAD_DIM, stride: INDEXER_HEAD_DIM };
    kernels.store_indexer_k(&k, &d_loc.slice(0..n), &mut d_cache.slice_mut(0..want.len()))?;
    reference::store_indexer_k(&keys, &loc, &mut want);
    let got = download(stream, &d_cache, want.len())?;
    let (mismatches, first_mismatch) = compare(&got, &want, INDEXER_PAGE_BYTES, u16::from);
    Ok(Check {
        kernel: format!("{}::store_indexer_k", M::NAME),
        case: format!("n={n}, pages={pages}"),
        items: n,
        mismatches,
        first_mismatch,
    })
}

fn header<M: NsaModel>(kernels: &ModelKernels<'_, M>) {
    let ids: Vec<String> = kernels.specs().iter().map(|s| s.id()).collect();
    println!("{}: {} → kernels [{}]", M::NAME, M::config().summary(), ids.join(", "));
}

fn run(rt: &Runtime) -> Result<Vec<Check>> {
    let mut checks = Vec::new();

    let fp8 = DeepSeekV32Tp8::kernels(rt)?;
    header(&fp8);
    for (i, &n) in SIZES.iter().enumerate() {
        let seed = 100 + i as u64;
        let mut stored = store_mla(&fp8, n, seed)?;
        checks.push(stored.check);
        checks.push(dequant(&fp8, &mut stored.device, &stored.host, n)?);
        checks.push(store_indexer(&fp8, n, seed + 50)?);
    }

    let bf16_model = DeepSeekV32Bf16::kernels(rt)?;
    header(&bf16_model);
    for (i, &n) in SIZES.iter().enumerate() {
        let seed = 200 + i as u64;
        checks.push(store_mla(&bf16_model, n, seed)?.check);
        checks.push(store_indexer(&bf16_model, n, seed + 50)?);
    }
    Ok(checks)
}

fn main() -> ExitCode {
    let rt = match Runtime::new(0) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nsa-example-model needs an NVIDIA GPU (sm_90a or sm_100a) and NVRTC: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("GPU: {:?} (target {})", rt.gpu().caps(), rt.target());
    match run(&rt) {
        Ok(checks) => {
            for c in &checks {
                println!("{c}");
            }
            let failed = checks.iter().filter(|c| !c.passed()).count();
            println!("{} passed, {failed} failed", checks.len() - failed);
            if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
