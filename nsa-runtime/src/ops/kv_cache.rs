//! Launchers of the KV store / quantize / dequantize family (spec §2.3–§2.5).

use super::{check_aligned, check_count_fits_i32, check_len, invalid, Rows};
use crate::runtime::{KernelArgs, Runtime};
use crate::Result;
use cudarc::driver::{CudaView, CudaViewMut, DeviceRepr};
use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::spec::step_store_blocks;
use nsa_kernels::{KernelFamily, KvCacheFormat};

const SLOT_EXPECTED: &str = "a slot in 0..pool_slots (the cache holds pool_slots rows)";
const STEP_SLOT_EXPECTED: &str =
    "a slot inside both caches' pools (the KV cache's rows and the index-K cache's pages × 64)";

/// The MLA latent cache of one layer, `[pool_slots, token]` in either format.
#[derive(Debug)]
pub enum MlaCacheMut<'a> {
    /// `[pool_slots, 576]` bf16.
    Bf16(CudaViewMut<'a, bf16>),
    /// `[pool_slots, 656]` bytes.
    Fp8(CudaViewMut<'a, u8>),
}

impl MlaCacheMut<'_> {
    pub fn format(&self) -> KvCacheFormat {
        match self {
            MlaCacheMut::Bf16(_) => KvCacheFormat::Bf16,
            MlaCacheMut::Fp8(_) => KvCacheFormat::Fp8,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            MlaCacheMut::Bf16(v) => 2 * v.len(),
            MlaCacheMut::Fp8(v) => v.len(),
        }
    }
}

/// `set_mla_kv_buffer`: writes token `t` (`k_nope` row t, `k_rope` row t) into
/// cache row `loc[t]`, quantizing for FP8. `k_nope` rows are 512 wide, `k_rope` 64.
pub fn store_mla(
    rt: &Runtime,
    k_nope: &Rows<'_, bf16>,
    k_rope: &Rows<'_, bf16>,
    loc: &CudaView<'_, i32>,
    cache: &mut MlaCacheMut<'_>,
) -> Result<()> {
    let n = loc.len();
    let pool_slots = check_mla_store(rt, k_nope, k_rope, n, cache)?;
    let num = check_count_fits_i32("loc", n)?;
    let kernel = rt.kernel(KernelFamily::KvStore { format: cache.format() })?;
    let (ns, rs) = (k_nope.stride as i64, k_rope.stride as i64);
    let mut args = rt.args();
    args.buf(&k_nope.data).arg(&ns).buf(&k_rope.data).arg(&rs).buf(loc).arg(&num);
    push_mla_cache(&mut args, cache);
    args.arg(&pool_slots);
    rt.launch(&kernel, args, n, "loc", SLOT_EXPECTED)
}

/// Both stores of a step in one launch: [`store_mla`] into `cache` and
/// [`store_indexer_k`] of `index_k` into `index_cache`, at the same slots `loc`,
/// with the same checks and results as the two calls.
pub fn store_step(
    rt: &Runtime,
    k_nope: &Rows<'_, bf16>,
    k_rope: &Rows<'_, bf16>,
    index_k: &Rows<'_, bf16>,
    loc: &CudaView<'_, i32>,
    cache: &mut MlaCacheMut<'_>,
    index_cache: &mut CudaViewMut<'_, u8>,
) -> Result<()> {
    let n = loc.len();
    let pool_slots = check_mla_store(rt, k_nope, k_rope, n, cache)?;
    let index_pool_slots = check_indexer_store(rt, index_k, n, index_cache, STEP_STORE_INDEXER_NAMES)?;
    let num = check_count_fits_i32("loc", n)?;
    let kernel = rt.kernel(KernelFamily::StepStore { format: cache.format() })?;
    let (ns, rs, is) = (k_nope.stride as i64, k_rope.stride as i64, index_k.stride as i64);
    let mut args = rt.args();
    args.buf(&k_nope.data).arg(&ns).buf(&k_rope.data).arg(&rs).buf(&index_k.data).arg(&is).buf(loc).arg(&num);
    push_mla_cache(&mut args, cache);
    args.arg(&pool_slots).buf(index_cache).arg(&index_pool_slots);
    rt.launch(&kernel, args, step_store_blocks(n), "loc", STEP_SLOT_EXPECTED)
}

/// Checks the rows and the cache of an MLA store of `n` tokens; the pool's slots.
fn check_mla_store(
    rt: &Runtime,
    k_nope: &Rows<'_, bf16>,
    k_rope: &Rows<'_, bf16>,
    n: usize,
    cache: &MlaCacheMut<'_>,
) -> Result<i64> {
    let stream = rt.gpu().stream();
    check_len("k_nope.width", k_nope.width, KV_LORA_RANK, "kv_lora_rank")?;
    check_len("k_rope.width", k_rope.width, ROPE_DIM, "qk_rope_head_dim")?;
    check_len("k_nope.count", k_nope.count, n, "one row per entry of loc")?;
    check_len("k_rope.count", k_rope.count, n, "one row per entry of loc")?;
    k_nope.check("k_nope", stream)?;
    k_rope.check("k_rope", stream)?;
    let format = cache.format();
    let token_bytes = format.token_bytes();
    if cache.bytes() % token_bytes != 0 {
        return Err(invalid(
            "cache",
            format!("{} bytes", cache.bytes()),
            format!("a whole number of {token_bytes}-byte {} rows", format.tag()),
        ));
    }
    match cache {
        MlaCacheMut::Bf16(c) => check_aligned("cache", c, 16, stream)?,
        MlaCacheMut::Fp8(c) => check_aligned("cache", c, 16, stream)?,
    }
    Ok((cache.bytes() / token_bytes) as i64)
}

fn push_mla_cache<'a>(args: &mut KernelArgs<'a>, cache: &'a MlaCacheMut<'_>) {
    match cache {
        MlaCacheMut::Bf16(c) => args.buf(c),
        MlaCacheMut::Fp8(c) => args.buf(c),
    };
}

/// Gathers FP8 cache rows `idx` and dequantizes them into `out` (`[idx.len(), 576]` bf16).
/// A slot outside the pool yields a zero row.
pub fn dequant_fp8(
    rt: &Runtime,
    cache: &CudaView<'_, u8>,
    idx: &CudaView<'_, i32>,
    out: &mut CudaViewMut<'_, bf16>,
) -> Result<()> {
    if cache.len() % FP8_TOKEN_BYTES != 0 {
        return Err(invalid(
            "cache",
            format!("{} bytes", cache.len()),
            format!("a whole number of {FP8_TOKEN_BYTES}-byte rows"),
        ));
    }
    read_rows(rt, KvCacheFormat::Fp8, cache, cache.len() / FP8_TOKEN_BYTES, idx, out)
}

/// Gathers bf16 cache rows `idx` (576 wide) into `out` (`[idx.len(), 576]`).
/// A slot outside the pool yields a zero row.
pub fn gather_bf16(
    rt: &Runtime,
    cache: &CudaView<'_, bf16>,
    idx: &CudaView<'_, i32>,
    out: &mut CudaViewMut<'_, bf16>,
) -> Result<()> {
    if cache.len() % BF16_TOKEN_ELEMS != 0 {
        return Err(invalid(
            "cache",
            format!("{} values", cache.len()),
            format!("a whole number of {BF16_TOKEN_ELEMS}-value rows"),
        ));
    }
    read_rows(rt, KvCacheFormat::Bf16, cache, cache.len() / BF16_TOKEN_ELEMS, idx, out)
}

/// The `kv_dequant.<format>` launch over a cache of `pool` rows.
fn read_rows<T: DeviceRepr>(
    rt: &Runtime,
    format: KvCacheFormat,
    cache: &CudaView<'_, T>,
    pool: usize,
    idx: &CudaView<'_, i32>,
    out: &mut CudaViewMut<'_, bf16>,
) -> Result<()> {
    let stream = rt.gpu().stream();
    let n = idx.len();
    check_len("out", out.len(), n * BF16_TOKEN_ELEMS, "idx.len() × 576")?;
    check_aligned("cache", cache, 16, stream)?;
    check_aligned("out", out, 16, stream)?;
    let pool_slots = pool as i64;
    let num = check_count_fits_i32("idx", n)?;
    let kernel = rt.kernel(KernelFamily::KvDequant { format })?;
    let mut args = rt.args();
    args.buf(cache).arg(&pool_slots).buf(idx).arg(&num).buf(out);
    rt.launch(&kernel, args, n, "idx", SLOT_EXPECTED)
}

/// Quantizes indexer keys (`k` rows of 128 bf16) into the paged indexer cache
/// (`[pages, 8448]` bytes) at slots `loc`.
pub fn store_indexer_k(
    rt: &Runtime,
    k: &Rows<'_, bf16>,
    loc: &CudaView<'_, i32>,
    cache: &mut CudaViewMut<'_, u8>,
) -> Result<()> {
    let n = loc.len();
    let pool_slots = check_indexer_store(rt, k, n, cache, INDEXER_STORE_NAMES)?;
    let num = check_count_fits_i32("loc", n)?;
    let ks = k.stride as i64;
    let kernel = rt.kernel(KernelFamily::IndexerKStore)?;
    let mut args = rt.args();
    args.buf(&k.data).arg(&ks).buf(loc).arg(&num).buf(cache).arg(&pool_slots);
    rt.launch(&kernel, args, n, "loc", SLOT_EXPECTED)
}

/// The argument names an indexer-K store's errors use: the keys, their width and
/// count, and the cache.
type IndexerStoreNames = [&'static str; 4];
const INDEXER_STORE_NAMES: IndexerStoreNames = ["k", "k.width", "k.count", "cache"];
const STEP_STORE_INDEXER_NAMES: IndexerStoreNames = ["index_k", "index_k.width", "index_k.count", "index_cache"];

/// Checks the keys and the cache of an indexer-K store of `n` tokens; the pool's slots.
fn check_indexer_store(
    rt: &Runtime,
    k: &Rows<'_, bf16>,
    n: usize,
    cache: &CudaViewMut<'_, u8>,
    [k_name, width_name, count_name, cache_name]: IndexerStoreNames,
) -> Result<i64> {
    let stream = rt.gpu().stream();
    check_len(width_name, k.width, INDEXER_HEAD_DIM, "index_head_dim")?;
    check_len(count_name, k.count, n, "one row per entry of loc")?;
    k.check(k_name, stream)?;
    let pool_slots = check_indexer_cache(cache_name, cache.len())?;
    check_aligned(cache_name, cache, 16, stream)?;
    Ok(pool_slots)
}

/// Checks that an indexer cache of `bytes` is whole pages; the pool's slots.
fn check_indexer_cache(field: &'static str, bytes: usize) -> Result<i64> {
    if bytes % INDEXER_PAGE_BYTES != 0 {
        return Err(invalid(
            field,
            format!("{bytes} bytes"),
            format!("a whole number of {INDEXER_PAGE_BYTES}-byte pages (64 tokens × 132 bytes)"),
        ));
    }
    Ok((bytes / INDEXER_PAGE_BYTES * INDEXER_PAGE_TOKENS) as i64)
}

/// Gathers the indexer keys of `slots` out of the paged indexer cache (`[pages, 8448]`
/// bytes) into ragged `keys` (`[n, 128]` e4m3 bytes) and `scales` (`[n]`) for the
/// extend logits (spec §6.3). A slot outside the pool yields a zero key and scale 0.
pub fn gather_indexer_k(
    rt: &Runtime,
    cache: &CudaView<'_, u8>,
    slots: &CudaView<'_, i32>,
    keys: &mut CudaViewMut<'_, u8>,
    scales: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    let stream = rt.gpu().stream();
    let n = slots.len();
    let pool_slots = check_indexer_cache("cache", cache.len())?;
    check_len("keys", keys.len(), n * INDEXER_HEAD_DIM, "slots.len() × 128")?;
    check_len("scales", scales.len(), n, "one scale per entry of slots")?;
    check_aligned("cache", cache, 16, stream)?;
    check_aligned("keys", keys, 16, stream)?;
    let num = check_count_fits_i32("slots", n)?;
    let kernel = rt.kernel(KernelFamily::IndexerKGather)?;
    let mut args = rt.args();
    args.buf(cache).arg(&pool_slots).buf(slots).arg(&num).buf(keys).buf(scales);
    rt.launch(&kernel, args, n, "slots", SLOT_EXPECTED)
}
