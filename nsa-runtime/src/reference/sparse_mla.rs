//! Sparse MLA attention on the CPU (spec §8.1): f64 math over the cache as the
//! decode kernel dequantizes it (FlashMLA's decode rounding, spec §2.3).

use super::fp8::e4m3_to_f32;
use super::kv_cache::{f32_to_bf16, fp8_scale};
use half::bf16;
use nsa_kernels::layout::*;

/// An FP8-656 cache as the decode kernel addresses it: slot `page · page_size +
/// offset` lives at byte `page · page_stride + offset · 656`.
#[derive(Clone, Copy, Debug)]
pub struct PagedFp8<'a> {
    pub bytes: &'a [u8],
    pub page_size: usize,
    pub page_stride: usize,
}

impl PagedFp8<'_> {
    /// Slots the cache holds (whole pages).
    pub fn num_slots(&self) -> usize {
        let page_bytes = self.page_size * FP8_TOKEN_BYTES;
        if self.bytes.len() < page_bytes {
            return 0;
        }
        ((self.bytes.len() - page_bytes) / self.page_stride + 1) * self.page_size
    }

    pub fn record(&self, slot: usize) -> &[u8] {
        let at = slot / self.page_size * self.page_stride + slot % self.page_size * FP8_TOKEN_BYTES;
        &self.bytes[at..at + FP8_TOKEN_BYTES]
    }

    /// The token at `slot` as f32 (576 values), dequantized like the decode kernel.
    pub fn token(&self, slot: usize) -> Vec<f32> {
        decode_dequant(self.record(slot))
    }
}

/// The scale the decode kernel multiplies by: bf16(scale), computed as
/// bf16(scale · 2¹¹²) · 2⁻¹¹² below 2¹⁵ (the same value for every normal scale;
/// the kernel's factor), else bf16(scale).
pub fn decode_scale(scale: f32) -> f32 {
    const TWO_112: f32 = 5.192_297e33;
    if scale < 32768.0 {
        ((f32_to_bf16(scale * TWO_112).to_f32() as f64) / TWO_112 as f64) as f32
    } else {
        f32_to_bf16(scale).to_f32()
    }
}

/// One 656-byte record as the decode kernel sees it: `bf16(e4m3 · decode_scale)`
/// (the product is exact in f32, so this is one bf16 rounding), rope copied.
pub fn decode_dequant(record: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(BF16_TOKEN_ELEMS);
    for d in 0..KV_LORA_RANK {
        let s = decode_scale(fp8_scale(record, d / FP8_TILE));
        out.push(f32_to_bf16(e4m3_to_f32(record[d]) * s).to_f32());
    }
    for r in 0..ROPE_DIM {
        let at = FP8_ROPE_OFFSET + 2 * r;
        out.push(bf16::from_bits(u16::from_le_bytes([record[at], record[at + 1]])).to_f32());
    }
    out
}

/// The valid slots of one index row: the first `len` entries, skipping −1 and
/// anything outside the cache (duplicates stay: each counts once per occurrence).
pub fn valid_slots(indices: &[i32], len: usize, num_slots: usize) -> Vec<usize> {
    indices[..len.min(indices.len())]
        .iter()
        .filter(|&&s| s >= 0 && (s as usize) < num_slots)
        .map(|&s| s as usize)
        .collect()
}

/// One query row's attention for every head: `q` is `[heads, 576]`, `keys` the
/// valid tokens (576 each). Returns (`out [heads, 512]`, `lse [heads]` natural log);
/// no key gives out 0 and lse +inf.
pub fn attend(q: &[f32], heads: usize, keys: &[&[f32]], sm_scale: f32) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![0.0f32; heads * KV_LORA_RANK];
    let mut lse = vec![f32::INFINITY; heads];
    if keys.is_empty() {
        return (out, lse);
    }
    let mut s = vec![0.0f64; keys.len()];
    for h in 0..heads {
        let qh = &q[h * BF16_TOKEN_ELEMS..(h + 1) * BF16_TOKEN_ELEMS];
        for (j, k) in keys.iter().enumerate() {
            let dot: f64 = qh.iter().zip(k.iter()).map(|(&a, &b)| a as f64 * b as f64).sum();
            s[j] = sm_scale as f64 * dot;
        }
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let mut l = 0.0f64;
        let mut o = vec![0.0f64; KV_LORA_RANK];
        for (j, k) in keys.iter().enumerate() {
            let p = (s[j] - m).exp();
            l += p;
            for (od, &kd) in o.iter_mut().zip(&k[..KV_LORA_RANK]) {
                *od += p * kd as f64;
            }
        }
        for (d, od) in o.iter().enumerate() {
            out[h * KV_LORA_RANK + d] = (od / l) as f32;
        }
        lse[h] = (m + l.ln()) as f32;
    }
    (out, lse)
}
