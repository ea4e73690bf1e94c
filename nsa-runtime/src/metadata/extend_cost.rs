//! Which sparse path an FP8-cache extend batch takes, from nsa's own kernel costs:
//! the decode kernel reading the FP8 cache for every query row (PAGED), or the KV
//! of the batch dequantized to bf16 and the prefill kernel (RAGGED). The reference
//! decides this from FlashMLA's kernels (`flashmla_kv` on Hopper); in nsa the
//! prefill kernel costs about 0.75× the decode kernel per query row at 128 heads
//! but 1.2× at 16 heads, so the choice is made by estimate instead.
//!
//! The coefficients are nsa's figures on an H100 (2026-12-07, BENCHMARKS.md):
//! the decode kernel's per-row time inside a whole-layer extend of one 16K-token
//! prompt (`nsa bench --suite layer`: the rows of one request share their keys in
//! L2, so a row costs 0.64–0.81× what it does in the decode benchmark's distinct
//! requests), the prefill kernel's at s_q 4096 (`--suite prefill`, the same per
//! row inside the layer within 3%), the dequantize rate (`--suite kv`) and the
//! smallest call. They are used for every target: only their ratio decides, and
//! no other GPU has been measured.

/// Per-query-row µs of the sparse decode kernel (FP8 cache, top-k 2048) over the
/// rows of an extend, at (heads, µs): one 16K-token prompt at h16 / h128.
const DECODE_ROW_US: [(u32, f64); 2] = [(16, 6334.0 / 16384.0), (128, 26056.0 / 16384.0)];
/// Per-query-row µs of the sparse prefill kernel (bf16 KV, d_qk 576, top-k 2048):
/// s_q 4096 at h16 / h32 / h64 / h128.
const PREFILL_ROW_US: [(u32, f64); 4] =
    [(16, 2041.4 / 4096.0), (32, 2306.0 / 4096.0), (64, 2407.7 / 4096.0), (128, 4834.8 / 4096.0)];
/// The smallest call of either attention kernel (b1 decode at h16 and h128), µs.
const ATTENTION_FLOOR_US: f64 = 14.0;
/// Dequantizing one token (656-byte record in, 1152 bf16 bytes out): 1M tokens in 649 µs.
const DEQUANT_TOKEN_US: f64 = 649.0 / 1_048_576.0;
/// The smallest dequantize call, µs.
const DEQUANT_FLOOR_US: f64 = 5.0;

/// Piecewise-linear in the head count between the measured points, flat outside.
fn per_row(points: &[(u32, f64)], heads: u32) -> f64 {
    let h = heads as f64;
    let (first, last) = (points[0], points[points.len() - 1]);
    if heads <= first.0 {
        return first.1 * h / first.0 as f64;
    }
    if heads >= last.0 {
        return last.1 * h / last.0 as f64;
    }
    let i = points.iter().position(|p| p.0 >= heads).unwrap_or(points.len() - 1);
    let ((h0, c0), (h1, c1)) = (points[i - 1], points[i]);
    c0 + (c1 - c0) * (h - h0 as f64) / (h1 - h0) as f64
}

/// The two estimates for one extend batch, in µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExtendCosts {
    /// The decode kernel over every query row.
    pub decode_us: f64,
    /// Dequantizing the batch's KV (every request's prefix and new tokens).
    pub dequant_us: f64,
    /// The prefill kernel over every query row.
    pub prefill_us: f64,
}

impl ExtendCosts {
    /// `rows` query tokens of `heads` heads over `kv_tokens` KV tokens in all.
    pub fn estimate(heads: u32, rows: usize, kv_tokens: usize) -> Self {
        let attention = |points: &[(u32, f64)]| (per_row(points, heads) * rows as f64).max(ATTENTION_FLOOR_US);
        Self {
            decode_us: attention(&DECODE_ROW_US),
            dequant_us: (DEQUANT_TOKEN_US * kv_tokens as f64).max(DEQUANT_FLOOR_US),
            prefill_us: attention(&PREFILL_ROW_US),
        }
    }

    pub fn ragged_us(&self) -> f64 {
        self.dequant_us + self.prefill_us
    }

    /// Whether dequantize + prefill is estimated faster than the decode kernel.
    pub fn prefers_ragged(&self) -> bool {
        self.ragged_us() < self.decode_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_row_cost_follows_the_measured_points() {
        assert_eq!(per_row(&DECODE_ROW_US, 128), 26056.0 / 16384.0);
        assert_eq!(per_row(&DECODE_ROW_US, 16), 6334.0 / 16384.0);
        let mid = per_row(&DECODE_ROW_US, 96);
        assert!(mid > per_row(&DECODE_ROW_US, 64) && mid < per_row(&DECODE_ROW_US, 128));
        assert_eq!(per_row(&PREFILL_ROW_US, 8), per_row(&PREFILL_ROW_US, 16) / 2.0);
    }

    #[test]
    fn long_extends_take_the_prefill_kernel_and_short_ones_over_long_prefixes_do_not() {
        // One 16K-token prompt at 128 heads: ~26 ms of decode kernel against ~19 ms
        // (measured in the layer: 26.1 against 19.2 ms).
        let c = ExtendCosts::estimate(128, 16_384, 16_384);
        assert!(c.prefers_ragged() && c.decode_us > 1.3 * c.ragged_us(), "{c:?}");
        // At 16 heads the decode kernel wins the same prompt (6.3 against 7.5 ms).
        assert!(!ExtendCosts::estimate(16, 16_384, 16_384).prefers_ragged());
        // A 2K chunk over a 64K prefix: the dequantization is small beside the rows.
        assert!(ExtendCosts::estimate(128, 2_228, 65_536 + 2_228).prefers_ragged());
        // 16 new tokens over a 128K prefix: dequantizing 128K tokens costs more.
        let c = ExtendCosts::estimate(128, 16, 131_072 + 16);
        assert!(!c.prefers_ragged(), "{c:?}");
        // At 64 heads (between the measured points) a long prompt still takes the prefill kernel.
        assert!(ExtendCosts::estimate(64, 16_384, 16_384).prefers_ragged());
    }
}
