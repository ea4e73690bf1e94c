//! CPU reference of the KV store / quantize / dequantize family (spec §2.3–§2.5).
//!
//! Input policy (documented, and identical on the GPU):
//! * a tile's scale comes from its largest FINITE magnitude; NaN and ±inf are left out;
//! * MLA FP8: `scale = amax / 448` (no epsilon), `q = e4m3_satfinite(x * (1/scale))`;
//!   when 1/scale is not finite (an all-zero tile, or amax below ~1.3e-36, i.e. only
//!   subnormal-sized values) the tile stores scale 0 and uses 1/scale := 0, so finite
//!   values store 0x00 (dequantizing to exactly 0) and NaN/±inf store NaN;
//! * saturation: |x·inv| ≥ 448 and ±inf store ±448; NaN stores 0x7f/0xff (NaN);
//! * indexer K: `amax = max(finite amax, 1e-4)`, `scale = 2^ceil(log2(amax/448))`
//!   computed exactly on the bits (no log2 rounding), `q = e4m3_satfinite(x / scale)`;
//! * dequantized NaN is the canonical bf16 NaN 0x7fff (what PTX `cvt.rn.bf16.f32` writes);
//! * a slot outside the pool is rejected: nothing is written, the entry is counted.

use super::fp8::{e4m3_to_f32, f32_to_e4m3_satfinite, E4M3_MAX};
use super::indexer::index_k_at;
use half::bf16;
use nsa_kernels::layout::*;

/// Largest finite |x| (0 when none).
pub fn finite_amax(xs: impl IntoIterator<Item = f32>) -> f32 {
    xs.into_iter().map(f32::abs).filter(|a| a.is_finite()).fold(0.0, f32::max)
}

/// Quantizes one MLA token (512 latent + 64 rope, bf16) into the 656-byte record.
pub fn quantize_fp8_token(nope: &[bf16], rope: &[bf16]) -> [u8; FP8_TOKEN_BYTES] {
    assert_eq!((nope.len(), rope.len()), (KV_LORA_RANK, ROPE_DIM));
    let mut out = [0u8; FP8_TOKEN_BYTES];
    for (tile, chunk) in nope.chunks(FP8_TILE).enumerate() {
        let xs = chunk.iter().map(|v| v.to_f32());
        let (scale, inv) = fp8_tile_scale(finite_amax(xs.clone()));
        for (d, x) in xs.enumerate() {
            out[tile * FP8_TILE + d] = f32_to_e4m3_satfinite(x * inv);
        }
        let at = FP8_SCALES_OFFSET + 4 * tile;
        out[at..at + 4].copy_from_slice(&scale.to_le_bytes());
    }
    for (r, v) in rope.iter().enumerate() {
        let at = FP8_ROPE_OFFSET + 2 * r;
        out[at..at + 2].copy_from_slice(&v.to_bits().to_le_bytes());
    }
    out
}

/// `(scale, 1/scale)` of an MLA FP8 tile; `(0, 0)` when 1/scale is not finite.
pub fn fp8_tile_scale(amax: f32) -> (f32, f32) {
    let scale = amax / E4M3_MAX;
    let inv = 1.0 / scale;
    if inv.is_finite() {
        (scale, inv)
    } else {
        (0.0, 0.0)
    }
}

/// f32 → bf16 (round to nearest even) as the GPU does it: every NaN becomes the
/// canonical 0x7fff that PTX `cvt.rn.bf16.f32` writes.
pub fn f32_to_bf16(x: f32) -> bf16 {
    if x.is_nan() {
        bf16::from_bits(0x7fff)
    } else {
        bf16::from_f32(x)
    }
}

/// Scale `tile` of a 656-byte record.
pub fn fp8_scale(record: &[u8], tile: usize) -> f32 {
    let at = FP8_SCALES_OFFSET + 4 * tile;
    f32::from_le_bytes(record[at..at + 4].try_into().expect("4 bytes"))
}

/// Dequantizes one 656-byte record to bf16 576: `bf16(f32(q) * scale)`, rope copied.
pub fn dequantize_fp8_token(record: &[u8]) -> Vec<bf16> {
    dequantize_fp8_token_with(record, |scale| scale)
}

/// [`dequantize_fp8_token`] multiplying by `effective(scale)` instead of the stored
/// scale (the decode kernel rounds it to bf16 first).
pub fn dequantize_fp8_token_with(record: &[u8], effective: impl Fn(f32) -> f32) -> Vec<bf16> {
    assert_eq!(record.len(), FP8_TOKEN_BYTES);
    let mut out = Vec::with_capacity(BF16_TOKEN_ELEMS);
    for d in 0..KV_LORA_RANK {
        out.push(f32_to_bf16(e4m3_to_f32(record[d]) * effective(fp8_scale(record, d / FP8_TILE))));
    }
    for r in 0..ROPE_DIM {
        let at = FP8_ROPE_OFFSET + 2 * r;
        out.push(bf16::from_bits(u16::from_le_bytes([record[at], record[at + 1]])));
    }
    out
}

/// Quantizes one indexer key (128 bf16) to 128 e4m3 bytes and its power-of-two scale.
pub fn quantize_indexer_k(k: &[bf16]) -> ([u8; INDEXER_HEAD_DIM], f32) {
    assert_eq!(k.len(), INDEXER_HEAD_DIM);
    let xs = k.iter().map(|v| v.to_f32());
    let amax = finite_amax(xs.clone()).max(INDEXER_AMAX_FLOOR);
    let scale = ceil_pow2(amax / E4M3_MAX);
    let inv = 1.0 / scale;
    let mut q = [0u8; INDEXER_HEAD_DIM];
    for (d, x) in xs.enumerate() {
        q[d] = f32_to_e4m3_satfinite(x * inv);
    }
    (q, scale)
}

/// Smallest power of two ≥ v, for positive normal v.
pub fn ceil_pow2(v: f32) -> f32 {
    let b = v.to_bits();
    if b & 0x7f_ffff == 0 {
        v
    } else {
        f32::from_bits((b & 0x7f80_0000) + 0x80_0000)
    }
}

/// Number of entries a store/gather rejected because their slot was outside the pool.
pub type Rejected = usize;

fn slot_in_pool(slot: i32, pool_slots: usize) -> Option<usize> {
    usize::try_from(slot).ok().filter(|&s| s < pool_slots)
}

/// `set_mla_kv_buffer` for the FP8 cache: `nope` is `[n, 512]`, `rope` `[n, 64]`,
/// `cache` is `[pool_slots, 656]` bytes.
pub fn store_fp8(nope: &[bf16], rope: &[bf16], loc: &[i32], cache: &mut [u8]) -> Rejected {
    let pool = cache.len() / FP8_TOKEN_BYTES;
    let mut rejected = 0;
    for (t, &slot) in loc.iter().enumerate() {
        let Some(s) = slot_in_pool(slot, pool) else {
            rejected += 1;
            continue;
        };
        let rec = quantize_fp8_token(&nope[t * KV_LORA_RANK..][..KV_LORA_RANK], &rope[t * ROPE_DIM..][..ROPE_DIM]);
        cache[s * FP8_TOKEN_BYTES..][..FP8_TOKEN_BYTES].copy_from_slice(&rec);
    }
    rejected
}

/// `set_mla_kv_buffer` for the bf16 cache (`[pool_slots, 576]`): a bit-exact copy.
pub fn store_bf16(nope: &[bf16], rope: &[bf16], loc: &[i32], cache: &mut [bf16]) -> Rejected {
    let pool = cache.len() / BF16_TOKEN_ELEMS;
    let mut rejected = 0;
    for (t, &slot) in loc.iter().enumerate() {
        let Some(s) = slot_in_pool(slot, pool) else {
            rejected += 1;
            continue;
        };
        let row = &mut cache[s * BF16_TOKEN_ELEMS..][..BF16_TOKEN_ELEMS];
        row[..KV_LORA_RANK].copy_from_slice(&nope[t * KV_LORA_RANK..][..KV_LORA_RANK]);
        row[KV_LORA_RANK..].copy_from_slice(&rope[t * ROPE_DIM..][..ROPE_DIM]);
    }
    rejected
}

/// Gathers FP8 records `idx` and dequantizes them into `[n, 576]` bf16; a rejected
/// index yields a zero row.
pub fn dequant_fp8(cache: &[u8], idx: &[i32]) -> (Vec<bf16>, Rejected) {
    let pool = cache.len() / FP8_TOKEN_BYTES;
    let mut out = Vec::with_capacity(idx.len() * BF16_TOKEN_ELEMS);
    let mut rejected = 0;
    for &slot in idx {
        match slot_in_pool(slot, pool) {
            Some(s) => out.extend(dequantize_fp8_token(&cache[s * FP8_TOKEN_BYTES..][..FP8_TOKEN_BYTES])),
            None => {
                rejected += 1;
                out.extend(std::iter::repeat_n(bf16::ZERO, BF16_TOKEN_ELEMS));
            }
        }
    }
    (out, rejected)
}

/// Gathers bf16 cache rows `idx` (576 wide) into `[n, 576]`; a rejected index
/// yields a zero row.
pub fn gather_bf16(cache: &[bf16], idx: &[i32]) -> (Vec<bf16>, Rejected) {
    let pool = cache.len() / BF16_TOKEN_ELEMS;
    let mut out = Vec::with_capacity(idx.len() * BF16_TOKEN_ELEMS);
    let mut rejected = 0;
    for &slot in idx {
        match slot_in_pool(slot, pool) {
            Some(s) => out.extend_from_slice(&cache[s * BF16_TOKEN_ELEMS..][..BF16_TOKEN_ELEMS]),
            None => {
                rejected += 1;
                out.extend(std::iter::repeat_n(bf16::ZERO, BF16_TOKEN_ELEMS));
            }
        }
    }
    (out, rejected)
}

/// Stores indexer keys `k` (`[n, 128]` bf16) into the paged indexer cache
/// (`[pool_slots / 64, 8448]` bytes: 64 × 128 values, then 64 f32 scales).
pub fn store_indexer_k(k: &[bf16], loc: &[i32], cache: &mut [u8]) -> Rejected {
    let pool = cache.len() / INDEXER_PAGE_BYTES * INDEXER_PAGE_TOKENS;
    let mut rejected = 0;
    for (t, &slot) in loc.iter().enumerate() {
        let Some(s) = slot_in_pool(slot, pool) else {
            rejected += 1;
            continue;
        };
        let (q, scale) = quantize_indexer_k(&k[t * INDEXER_HEAD_DIM..][..INDEXER_HEAD_DIM]);
        let page = &mut cache[(s / INDEXER_PAGE_TOKENS) * INDEXER_PAGE_BYTES..][..INDEXER_PAGE_BYTES];
        let off = s % INDEXER_PAGE_TOKENS;
        page[off * INDEXER_HEAD_DIM..][..INDEXER_HEAD_DIM].copy_from_slice(&q);
        let at = INDEXER_PAGE_TOKENS * INDEXER_HEAD_DIM + 4 * off;
        page[at..at + 4].copy_from_slice(&scale.to_le_bytes());
    }
    rejected
}

/// Gathers the indexer keys of `slots` into ragged `[n, 128]` e4m3 bytes and `[n]`
/// scales (spec §6.3); a rejected slot yields a zero key and scale 0.
pub fn gather_indexer_k(cache: &[u8], slots: &[i32]) -> (Vec<u8>, Vec<f32>, Rejected) {
    let pool = cache.len() / INDEXER_PAGE_BYTES * INDEXER_PAGE_TOKENS;
    let mut keys = Vec::with_capacity(slots.len() * INDEXER_HEAD_DIM);
    let mut scales = Vec::with_capacity(slots.len());
    let mut rejected = 0;
    for &slot in slots {
        match slot_in_pool(slot, pool) {
            Some(s) => {
                let (k, scale) = index_k_at(cache, s);
                keys.extend_from_slice(k);
                scales.push(scale);
            }
            None => {
                rejected += 1;
                keys.extend(std::iter::repeat_n(0u8, INDEXER_HEAD_DIM));
                scales.push(0.0);
            }
        }
    }
    (keys, scales, rejected)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile_of(vals: &[f32]) -> Vec<bf16> {
        let mut nope: Vec<bf16> = vals.iter().map(|&v| bf16::from_f32(v)).collect();
        nope.resize(KV_LORA_RANK, bf16::ZERO);
        nope
    }

    #[test]
    fn spec_worked_example() {
        // amax 3.5 → scale 2^-7; 3.5 → 0x7e; 1.3 → bf16(1.3)=1.296875 → 166.0 → 160 (0x72).
        let nope = tile_of(&[3.5, 1.3]);
        let rope = vec![bf16::from_f32(0.25); ROPE_DIM];
        let rec = quantize_fp8_token(&nope, &rope);
        assert_eq!(fp8_scale(&rec, 0), 0.0078125);
        assert_eq!(&rec[512..516], &[0, 0, 0, 0x3c]);
        assert_eq!((rec[0], rec[1]), (0x7e, 0x72));
        assert_eq!(dequantize_fp8_token(&rec)[1].to_f32(), 1.25);
        // Tiles 1..3 are all zero: scale 0, bytes 0, dequant exactly 0.
        assert_eq!(fp8_scale(&rec, 1), 0.0);
        assert!(rec[128..512].iter().all(|&b| b == 0));
        assert_eq!(dequantize_fp8_token(&rec)[512].to_f32(), 0.25);
    }

    #[test]
    fn non_finite_policy() {
        let nope = tile_of(&[2.0, f32::NAN, f32::INFINITY, -f32::INFINITY, -1.0]);
        let rec = quantize_fp8_token(&nope, &[bf16::ZERO; ROPE_DIM]);
        assert_eq!(fp8_scale(&rec, 0), 2.0 / 448.0);
        assert_eq!(rec[0], 0x7e);
        assert_eq!(rec[1] & 0x7f, 0x7f);
        assert_eq!((rec[2], rec[3]), (0x7e, 0xfe));
    }

    #[test]
    fn tiny_tiles_are_stored_as_zero() {
        let nope = tile_of(&[1e-37, -3e-38, 0.0]);
        let rec = quantize_fp8_token(&nope, &[bf16::ZERO; ROPE_DIM]);
        assert_eq!(fp8_scale(&rec, 0), 0.0);
        assert!(rec[..128].iter().all(|&b| b & 0x7f == 0), "±0 only");
        assert_eq!(fp8_tile_scale(1e-30).0, 1e-30 / 448.0);
    }

    #[test]
    fn indexer_example_and_floor() {
        let mut k = vec![bf16::ZERO; INDEXER_HEAD_DIM];
        k[0] = bf16::from_f32(3.0);
        let (q, s) = quantize_indexer_k(&k);
        assert_eq!(s, 2f32.powi(-7));
        assert_eq!(e4m3_to_f32(q[0]), 384.0);
        let (q, s) = quantize_indexer_k(&[bf16::ZERO; INDEXER_HEAD_DIM]);
        assert_eq!(s, ceil_pow2(1e-4 / 448.0));
        assert!(q.iter().all(|&b| b == 0));
        assert_eq!(ceil_pow2(0.25), 0.25);
        assert_eq!(ceil_pow2(0.2500001), 0.5);
    }

    #[test]
    fn rejects_slots_outside_pool() {
        let nope = vec![bf16::ONE; 2 * KV_LORA_RANK];
        let rope = vec![bf16::ONE; 2 * ROPE_DIM];
        let mut cache = vec![0u8; 4 * FP8_TOKEN_BYTES];
        assert_eq!(store_fp8(&nope, &rope, &[3, 4], &mut cache), 1);
        assert_eq!(store_fp8(&nope, &rope, &[-1, 0], &mut cache), 1);
        let (rows, rej) = dequant_fp8(&cache, &[0, 7]);
        assert_eq!(rej, 1);
        assert!(rows[BF16_TOKEN_ELEMS..].iter().all(|v| v.to_f32() == 0.0));
    }

    #[test]
    fn indexer_gather_reads_back_the_store() {
        let k: Vec<bf16> = (0..2 * INDEXER_HEAD_DIM).map(|i| bf16::from_f32(i as f32 - 100.0)).collect();
        let mut cache = vec![0xa5u8; 2 * INDEXER_PAGE_BYTES];
        assert_eq!(store_indexer_k(&k, &[70, 3], &mut cache), 0);
        let (keys, scales, rej) = gather_indexer_k(&cache, &[3, -1, 70, 128, 3]);
        assert_eq!((rej, keys.len(), scales.len()), (2, 5 * INDEXER_HEAD_DIM, 5));
        let (q0, s0) = quantize_indexer_k(&k[..INDEXER_HEAD_DIM]);
        let (q1, s1) = quantize_indexer_k(&k[INDEXER_HEAD_DIM..]);
        assert_eq!(scales, [s1, 0.0, s0, 0.0, s1]);
        let rows: Vec<&[u8]> = keys.chunks(INDEXER_HEAD_DIM).collect();
        assert_eq!((rows[0], rows[2], rows[4]), (&q1[..], &q0[..], &q1[..]));
        assert!(rows[1].iter().chain(rows[3]).all(|&b| b == 0));
    }
}
