//! Sparse MLA attention on the CPU (spec §8.1): f64 math over the cache as the
//! decode kernel dequantizes it (FlashMLA's decode rounding, spec §2.3, or the
//! raw-record kernel's exact products).

use super::fp8::e4m3_to_f32;
use super::kv_cache::{dequantize_fp8_token_with, f32_to_bf16, fp8_scale};
use nsa_kernels::layout::*;
use nsa_kernels::{KernelFamily, KernelSpec};

/// How a decode kernel turns a record's e4m3 values into the K/V rows it multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeDequant {
    /// FlashMLA's decode rounding, `bf16(e4m3 · bf16(scale))` per value: the kernels
    /// that dequantize into a bf16 K/V tile.
    Bf16Rounded,
    /// `e4m3 · bf16(scale)` exactly (12 significant bits, exact in f32): the
    /// raw-record kernel, which applies the scale to the products instead of the
    /// values. It differs from FlashMLA's by at most one bf16 rounding per value.
    Exact,
}

impl DecodeDequant {
    /// The rounding of the kernel `spec` names (a sparse-decode spec).
    pub fn of(spec: &KernelSpec) -> DecodeDequant {
        match spec.family {
            KernelFamily::SparseDecode { heads, .. } if spec.decode_f8_kernel(heads) => DecodeDequant::Exact,
            _ => DecodeDequant::Bf16Rounded,
        }
    }
}

/// An FP8-656 cache as the decode kernel addresses it: slot `page · page_size +
/// offset` lives at byte `page · page_stride + offset · 656`.
#[derive(Clone, Copy, Debug)]
pub struct PagedFp8<'a> {
    pub bytes: &'a [u8],
    pub page_size: usize,
    pub page_stride: usize,
    pub dequant: DecodeDequant,
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
        match self.dequant {
            DecodeDequant::Bf16Rounded => decode_dequant(self.record(slot)),
            DecodeDequant::Exact => exact_dequant(self.record(slot)),
        }
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
    dequantize_fp8_token_with(record, decode_scale).iter().map(|v| v.to_f32()).collect()
}

/// One 656-byte record as the raw-record kernel sees it: `e4m3 · decode_scale`
/// without rounding, rope copied.
pub fn exact_dequant(record: &[u8]) -> Vec<f32> {
    let nope = (0..KV_LORA_RANK).map(|d| e4m3_to_f32(record[d]) * decode_scale(fp8_scale(record, d / FP8_TILE)));
    let rope = (0..ROPE_DIM).map(|r| {
        let at = FP8_ROPE_OFFSET + 2 * r;
        f32::from_bits((u16::from_le_bytes([record[at], record[at + 1]]) as u32) << 16)
    });
    nope.chain(rope).collect()
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

/// One query row's attention for every head (spec §8.1), natural-log statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    /// `[heads, 512]`; 0 when no key is valid.
    pub out: Vec<f32>,
    /// `[heads]` `ln Σ_j exp(s_j)`; +inf when no key is valid.
    pub lse: Vec<f32>,
    /// `[heads]` `max_j s_j`; −inf when no key is valid.
    pub max_logits: Vec<f32>,
    /// `[heads, 512]` `Σ_j p_j·|v_j,d| / Σ_j p_j`: the scale of the terms `out` sums,
    /// which bounds the error of rounding P (the comparison's tolerance); 0 when no
    /// key is valid.
    pub out_magnitude: Vec<f32>,
}

/// `q` is `[heads, d_qk]`, `keys` the valid tokens (at least `d_qk` values each,
/// the first 512 also V), `s_j = sm_scale · q·k_j[..d_qk]`, all in f64.
pub fn attend(q: &[f32], heads: usize, d_qk: usize, keys: &[&[f32]], sm_scale: f32) -> Attention {
    let mut a = Attention {
        out: vec![0.0f32; heads * KV_LORA_RANK],
        lse: vec![f32::INFINITY; heads],
        max_logits: vec![f32::NEG_INFINITY; heads],
        out_magnitude: vec![0.0f32; heads * KV_LORA_RANK],
    };
    if keys.is_empty() {
        return a;
    }
    let mut s = vec![0.0f64; keys.len()];
    for h in 0..heads {
        let qh = &q[h * d_qk..(h + 1) * d_qk];
        for (j, k) in keys.iter().enumerate() {
            let dot: f64 = qh.iter().zip(&k[..d_qk]).map(|(&a, &b)| a as f64 * b as f64).sum();
            s[j] = sm_scale as f64 * dot;
        }
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let mut l = 0.0f64;
        let mut o = vec![0.0f64; KV_LORA_RANK];
        let mut mag = vec![0.0f64; KV_LORA_RANK];
        for (j, k) in keys.iter().enumerate() {
            let p = (s[j] - m).exp();
            l += p;
            for ((od, md), &kd) in o.iter_mut().zip(mag.iter_mut()).zip(&k[..KV_LORA_RANK]) {
                *od += p * kd as f64;
                *md += p * (kd as f64).abs();
            }
        }
        for (d, (od, md)) in o.iter().zip(&mag).enumerate() {
            a.out[h * KV_LORA_RANK + d] = (od / l) as f32;
            a.out_magnitude[h * KV_LORA_RANK + d] = (md / l) as f32;
        }
        a.lse[h] = (m + l.ln()) as f32;
        a.max_logits[h] = m as f32;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::kv_cache::{dequantize_fp8_token, quantize_fp8_token};
    use half::bf16;

    #[test]
    fn one_key_and_two_equal_keys() {
        let heads = 2;
        let q: Vec<f32> = (0..heads * BF16_TOKEN_ELEMS).map(|i| ((i % 7) as f32 - 3.0) / 8.0).collect();
        let k: Vec<f32> = (0..BF16_TOKEN_ELEMS).map(|i| ((i % 5) as f32 - 2.0) / 4.0).collect();
        let a1 = attend(&q, heads, BF16_TOKEN_ELEMS, &[&k], 0.5);
        let a2 = attend(&q, heads, BF16_TOKEN_ELEMS, &[&k, &k], 0.5);
        let (o1, l1, o2, l2) = (&a1.out, &a1.lse, &a2.out, &a2.lse);
        for h in 0..heads {
            let s: f64 = q[h * BF16_TOKEN_ELEMS..][..BF16_TOKEN_ELEMS]
                .iter()
                .zip(&k)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>()
                * 0.5;
            assert!((l1[h] as f64 - s).abs() < 1e-5, "one key: lse = score");
            assert!((a1.max_logits[h] as f64 - s).abs() < 1e-5, "one key: max = score");
            assert_eq!(a1.max_logits[h], a2.max_logits[h], "a duplicate does not move the max");
            assert!((l2[h] as f64 - (s + 2f64.ln())).abs() < 1e-5, "a duplicate counts twice");
            assert_eq!(&o1[h * KV_LORA_RANK..][..KV_LORA_RANK], &k[..KV_LORA_RANK]);
            assert_eq!(&o2[h * KV_LORA_RANK..][..KV_LORA_RANK], &k[..KV_LORA_RANK]);
        }
    }

    #[test]
    fn out_magnitude_weighs_absolute_values_not_their_sum() {
        // q = 0: every key scores 0, so P is uniform over k and -k; out cancels to 0
        // while the terms it sums keep their size |k|.
        let q = vec![0.0f32; BF16_TOKEN_ELEMS];
        let k: Vec<f32> = (0..BF16_TOKEN_ELEMS).map(|i| (i % 9) as f32 - 4.0).collect();
        let neg: Vec<f32> = k.iter().map(|v| -v).collect();
        let a = attend(&q, 1, BF16_TOKEN_ELEMS, &[&k, &neg], 0.1);
        assert!(a.out.iter().all(|&v| v == 0.0));
        let abs: Vec<f32> = k[..KV_LORA_RANK].iter().map(|v| v.abs()).collect();
        assert_eq!(a.out_magnitude, abs);
        assert!(attend(&q, 1, BF16_TOKEN_ELEMS, &[], 0.1).out_magnitude.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn no_key_gives_zero_and_plus_infinity() {
        let a = attend(&vec![1.0; 3 * BF16_TOKEN_ELEMS], 3, BF16_TOKEN_ELEMS, &[], 0.1);
        assert!(a.out.iter().all(|&v| v == 0.0));
        assert!(a.lse.iter().all(|&v| v == f32::INFINITY));
        assert!(a.max_logits.iter().all(|&v| v == f32::NEG_INFINITY));
    }

    #[test]
    fn no_rope_width_ignores_the_rope_dims() {
        // Keys differ only in the rope dims: with d_qk 512 they score the same.
        let q = vec![0.25f32; 2 * KV_LORA_RANK];
        let mut k1 = vec![0.5f32; BF16_TOKEN_ELEMS];
        let k2 = k1.clone();
        k1[KV_LORA_RANK..].iter_mut().for_each(|v| *v = 9.0);
        let a = attend(&q, 2, KV_LORA_RANK, &[&k1, &k2], 0.3);
        let s = 0.3 * 0.25 * 0.5 * KV_LORA_RANK as f64;
        assert!((a.max_logits[1] as f64 - s).abs() < 1e-5);
        assert!((a.lse[0] as f64 - (s + 2f64.ln())).abs() < 1e-5);
    }

    #[test]
    fn valid_slots_skip_padding_and_out_of_cache_but_keep_duplicates() {
        assert_eq!(valid_slots(&[3, -1, 3, 99, 7, 5], 5, 10), vec![3, 3, 7]);
        assert_eq!(valid_slots(&[1, 2], 0, 10), Vec::<usize>::new());
    }

    #[test]
    fn decode_scale_is_bf16_of_the_scale() {
        for s in [0.0f32, 1e-3, 0.0078125, 0.01234, 1.0, 3.3, 40000.0, 1e20] {
            assert_eq!(decode_scale(s), f32_to_bf16(s).to_f32(), "{s}");
        }
    }

    #[test]
    fn decode_dequant_matches_the_dequant_kernel_when_scales_are_bf16_exact() {
        // amax 3.5 → scale 2^-7: bf16(scale) = scale, so both roundings agree.
        let nope: Vec<bf16> = (0..KV_LORA_RANK).map(|i| bf16::from_f32(3.5 * ((i % 9) as f32 - 4.0) / 4.0)).collect();
        let rope: Vec<bf16> = (0..ROPE_DIM).map(|i| bf16::from_f32(i as f32)).collect();
        let rec = quantize_fp8_token(&nope, &rope);
        let a: Vec<f32> = dequantize_fp8_token(&rec).iter().map(|v| v.to_f32()).collect();
        assert_eq!(decode_dequant(&rec), a);
    }

    #[test]
    fn exact_dequant_is_the_unrounded_decode_value() {
        // amax 3.3 → scale 3.3/448, not a bf16 value: the products need rounding.
        let nope: Vec<bf16> = (0..KV_LORA_RANK).map(|i| bf16::from_f32(3.3 * ((i % 13) as f32 - 6.0) / 6.0)).collect();
        let rope: Vec<bf16> = (0..ROPE_DIM).map(|i| bf16::from_f32(0.5 * i as f32)).collect();
        let rec = quantize_fp8_token(&nope, &rope);
        let (exact, rounded) = (exact_dequant(&rec), decode_dequant(&rec));
        let mut differ = 0;
        for d in 0..KV_LORA_RANK {
            let want = e4m3_to_f32(rec[d]) as f64 * decode_scale(fp8_scale(&rec, d / FP8_TILE)) as f64;
            assert_eq!(exact[d] as f64, want, "dim {d}: the product is exact in f32");
            assert_eq!(rounded[d], f32_to_bf16(exact[d]).to_f32(), "dim {d}: FlashMLA rounds it once");
            differ += usize::from(rounded[d] != exact[d]);
        }
        assert!(differ > 0, "the case must exercise the rounding");
        assert_eq!(exact[KV_LORA_RANK..], rounded[KV_LORA_RANK..], "rope copied");
    }
}
