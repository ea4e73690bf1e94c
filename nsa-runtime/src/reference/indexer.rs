//! CPU reference of the lightning-indexer logits (spec §6): the oracle for the
//! lightning-indexer logits kernels.
//!
//! For query row t and key s:
//! `logit[t, s] = Σ_h weights[t, h] · max(0, k_scale[s] · Σ_d q[t, h, d] · k[s, d])`
//! with q and k e4m3 bytes (decoded exactly) and the q scale already folded into
//! `weights` (§6.1 step 6). Sums are taken in f64 and rounded once, so the
//! reference is the exact value up to one rounding; GPU kernels accumulating in f32
//! are compared with a relative tolerance. Entries a row may not see are
//! `f32::NEG_INFINITY` (the kernels leave them unspecified; top-k never reads them).
//!
//! The sm_90a kernel multiplies with Hopper's FP8 warp-group MMA, as DeepGEMM's
//! kernel (the one the reference backend calls) does. Those tensor cores do not
//! accumulate in full f32: each 32-deep step aligns its products to the largest
//! exponent and keeps about 14 significant bits (DeepSeek-V3 report, §3.3.2). Its
//! logits are therefore checked against the spread of [`logit_and_spread`] ×
//! [`FP8_WGMMA_REL_ERR`] on top of the f32 tolerance.

use super::fp8::e4m3_to_f32;
use nsa_kernels::layout::{INDEXER_HEAD_DIM, INDEXER_PAGE_BYTES, INDEXER_PAGE_TOKENS};

/// Indexer heads of DeepSeek V3.2.
pub const INDEX_HEADS: usize = 64;
/// `64^-0.5 · 128^-0.5`: the gate and softmax scales folded into the weights.
pub const WEIGHT_SCALE: f32 = 0.125 * 0.088_388_35;

/// `weights[t, h] = gate[t, h] · 64^-0.5 · q_scale[t, h] · 128^-0.5` (§6.1 step 6).
pub fn fold_weights(gate: &[f32], q_scale: &[f32]) -> Vec<f32> {
    assert_eq!(gate.len(), q_scale.len());
    gate.iter().zip(q_scale).map(|(g, s)| g * WEIGHT_SCALE * s).collect()
}

/// The index-K bytes and scale of `slot` in a paged indexer cache (§2.5).
pub fn index_k_at(cache: &[u8], slot: usize) -> (&[u8], f32) {
    let page = &cache[(slot / INDEXER_PAGE_TOKENS) * INDEXER_PAGE_BYTES..][..INDEXER_PAGE_BYTES];
    let off = slot % INDEXER_PAGE_TOKENS;
    let at = INDEXER_PAGE_TOKENS * INDEXER_HEAD_DIM + 4 * off;
    let scale = f32::from_le_bytes(page[at..at + 4].try_into().expect("4 bytes"));
    (&page[off * INDEXER_HEAD_DIM..][..INDEXER_HEAD_DIM], scale)
}

/// Error of a Hopper FP8 warp-group MMA head dot relative to `Σ_d |q_d · k_d|`: four
/// chained 32-deep steps, each truncating at about 2⁻¹³ of its largest addend
/// (every addend, the running sum included, is at most that sum): 4 · 2⁻¹³.
pub const FP8_WGMMA_REL_ERR: f32 = 1.0 / 2048.0;

/// One logit and its spread (`q` is `[64, 128]` e4m3 bytes of one query row,
/// `weights` its 64 gates); the spread `Σ_h |w_h| · k_scale · Σ_d |q_hd · k_d|`, in one pass:
/// the spread bounds the error of a logit whose head dots were accumulated with
/// limited precision (ReLU never widens it).
pub fn logit_and_spread(q: &[u8], weights: &[f32], k: &[u8], k_scale: f32) -> (f32, f32) {
    QueryRow::new(q, weights).logit_and_spread(k, k_scale)
}

/// One query row decoded once (e4m3 → f64), for the many keys it is scored against.
#[derive(Debug)]
pub struct QueryRow {
    q: Vec<f64>,
    weights: Vec<f64>,
}

impl QueryRow {
    /// `q`: `[heads, 128]` e4m3 bytes; `weights`: the `heads` gates.
    pub fn new(q: &[u8], weights: &[f32]) -> Self {
        assert_eq!(q.len(), weights.len() * INDEXER_HEAD_DIM);
        Self {
            q: q.iter().map(|&b| e4m3_to_f32(b) as f64).collect(),
            weights: weights.iter().map(|&w| w as f64).collect(),
        }
    }

    /// [`logit_and_spread`] of this row against key `k` (128 e4m3 bytes).
    pub fn logit_and_spread(&self, k: &[u8], k_scale: f32) -> (f32, f32) {
        let mut kf = [0.0f64; INDEXER_HEAD_DIM];
        for (d, &b) in kf.iter_mut().zip(k) {
            *d = e4m3_to_f32(b) as f64;
        }
        let scale = k_scale as f64;
        let (mut sum, mut spread) = (0.0f64, 0.0f64);
        for (qh, &w) in self.q.chunks_exact(INDEXER_HEAD_DIM).zip(&self.weights) {
            let (dot, abs) = qh.iter().zip(&kf).fold((0.0, 0.0), |(d, a), (&qv, &kv)| {
                let p = qv * kv;
                (d + p, a + p.abs())
            });
            sum += w * (scale * dot).max(0.0);
            spread += w.abs() * scale * abs;
        }
        (sum as f32, spread as f32)
    }
}

/// The keys a paged logits call reads: the indexer cache, each request's page row
/// (`block_table` `[B, width]`) and its context length.
#[derive(Clone, Copy, Debug)]
pub struct PagedKeys<'a> {
    pub cache: &'a [u8],
    pub block_table: &'a [i32],
    pub width: usize,
    pub context_lens: &'a [i32],
}

/// Paged logits (decode / verify / draft-extend, §6.2). Rows are `b · next_n + j`;
/// `q` is `[rows, 64, 128]` bytes, `weights` `[rows, 64]`. Query j of request b sees
/// keys `s < context_len − next_n + j + 1`. Output `[rows, max_context]`.
/// The second vector holds every entry's spread ([`logit_and_spread`]; 0 where not visible).
pub fn paged_logits(
    q: &[u8],
    weights: &[f32],
    keys: PagedKeys<'_>,
    next_n: usize,
    max_context: usize,
) -> (Vec<f32>, Vec<f32>) {
    let rows = keys.context_lens.len() * next_n;
    let row_q = INDEX_HEADS * INDEXER_HEAD_DIM;
    assert_eq!(q.len(), rows * row_q);
    assert_eq!(weights.len(), rows * INDEX_HEADS);
    let mut out = vec![f32::NEG_INFINITY; rows * max_context];
    let mut spread = vec![0.0f32; rows * max_context];
    for (b, &len) in keys.context_lens.iter().enumerate() {
        for j in 0..next_n {
            let row = b * next_n + j;
            let visible = (len as i64 - next_n as i64 + j as i64 + 1).clamp(0, max_context as i64) as usize;
            let query = QueryRow::new(&q[row * row_q..][..row_q], &weights[row * INDEX_HEADS..][..INDEX_HEADS]);
            for s in 0..visible {
                let page = keys.block_table[b * keys.width + s / INDEXER_PAGE_TOKENS] as usize;
                let (k, scale) = index_k_at(keys.cache, page * INDEXER_PAGE_TOKENS + s % INDEXER_PAGE_TOKENS);
                (out[row * max_context + s], spread[row * max_context + s]) = query.logit_and_spread(k, scale);
            }
        }
    }
    (out, spread)
}

/// Ragged logits (extend, §6.3): keys `k` `[S, 128]` bytes with scales `[S]`; row t
/// sees keys `[ks[t], ke[t])`. Output `[T, S]`.
/// The second vector holds every entry's spread ([`logit_and_spread`]; 0 where not visible).
pub fn ragged_logits(
    q: &[u8],
    weights: &[f32],
    k: &[u8],
    k_scale: &[f32],
    ks: &[i32],
    ke: &[i32],
) -> (Vec<f32>, Vec<f32>) {
    let (t_rows, s_keys) = (ks.len(), k_scale.len());
    let row_q = INDEX_HEADS * INDEXER_HEAD_DIM;
    assert_eq!((ke.len(), q.len(), k.len()), (t_rows, t_rows * row_q, s_keys * INDEXER_HEAD_DIM));
    let mut out = vec![f32::NEG_INFINITY; t_rows * s_keys];
    let mut spread = vec![0.0f32; t_rows * s_keys];
    for t in 0..t_rows {
        let (lo, hi) = (ks[t].max(0) as usize, (ke[t].max(0) as usize).min(s_keys));
        let query = QueryRow::new(&q[t * row_q..][..row_q], &weights[t * INDEX_HEADS..][..INDEX_HEADS]);
        for s in lo..hi.max(lo) {
            (out[t * s_keys + s], spread[t * s_keys + s]) =
                query.logit_and_spread(&k[s * INDEXER_HEAD_DIM..][..INDEXER_HEAD_DIM], k_scale[s]);
        }
    }
    (out, spread)
}

/// Query rows per chunk of the ragged logits so that one chunk's `[rows, S]` f32
/// block fits `budget_bytes` (§6.3 memory guard, as a caller-given budget).
/// `None` when not even one row fits: the caller must raise the budget.
pub fn ragged_chunk_rows(total_rows: usize, keys: usize, budget_bytes: usize) -> Option<usize> {
    let row_bytes = keys.max(1) * 4;
    let rows = budget_bytes / row_bytes;
    (rows > 0).then(|| rows.min(total_rows.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::fp8::f32_to_e4m3_satfinite as q8;

    fn one_hot_q(heads: usize, head: usize, value: f32) -> Vec<u8> {
        let mut q = vec![0u8; heads * INDEXER_HEAD_DIM];
        q[head * INDEXER_HEAD_DIM] = q8(value);
        q
    }

    #[test]
    fn relu_and_weights() {
        let mut k = vec![0u8; INDEXER_HEAD_DIM];
        k[0] = q8(2.0);
        let mut w = vec![0.0f32; INDEX_HEADS];
        w[3] = 0.5;
        // q·k = 1.5 · 2 = 3, × k_scale 0.25 = 0.75, × weight 0.5 = 0.375.
        assert_eq!(logit_and_spread(&one_hot_q(INDEX_HEADS, 3, 1.5), &w, &k, 0.25), (0.375, 0.375));
        // A negative dot product is cut by the ReLU before the weight.
        assert_eq!(logit_and_spread(&one_hot_q(INDEX_HEADS, 3, -1.5), &w, &k, 0.25), (0.0, 0.375));
        // Heads add up; a negative weight can make the logit negative.
        let mut q = one_hot_q(INDEX_HEADS, 3, 1.5);
        q[5 * INDEXER_HEAD_DIM] = q8(1.0);
        w[5] = -1.0;
        // The spread sums |w| |q k| over heads and dims: cancellation and ReLU do not shrink it.
        assert_eq!(logit_and_spread(&q, &w, &k, 0.25), (0.375 - 0.5, 0.375 + 0.5));
    }

    #[test]
    fn paged_rows_see_their_prefix_only() {
        // Two pages; request 0 uses pages [1, 0] (keys 0..63 on page 1).
        let mut cache = vec![0u8; 2 * INDEXER_PAGE_BYTES];
        let put = |cache: &mut Vec<u8>, slot: usize, v: f32| {
            let page = slot / INDEXER_PAGE_TOKENS;
            let off = slot % INDEXER_PAGE_TOKENS;
            cache[page * INDEXER_PAGE_BYTES + off * INDEXER_HEAD_DIM] = q8(v);
            let at = page * INDEXER_PAGE_BYTES + INDEXER_PAGE_TOKENS * INDEXER_HEAD_DIM + 4 * off;
            cache[at..at + 4].copy_from_slice(&1.0f32.to_le_bytes());
        };
        put(&mut cache, 64, 1.0); // key 0 of request 0
        put(&mut cache, 66, 3.0); // key 2
        let next_n = 2;
        let q: Vec<u8> = (0..next_n).flat_map(|_| one_hot_q(INDEX_HEADS, 0, 1.0)).collect();
        let w: Vec<f32> = (0..next_n)
            .flat_map(|_| {
                let mut w = vec![0.0; INDEX_HEADS];
                w[0] = 1.0;
                w
            })
            .collect();
        let keys = PagedKeys { cache: &cache, block_table: &[1, 0], width: 2, context_lens: &[3] };
        let (out, spread) = paged_logits(&q, &w, keys, next_n, 128);
        // Query 0 sees keys 0..2 (context 3, next_n 2), query 1 sees 0..3.
        assert_eq!(&out[..3], &[1.0, 0.0, f32::NEG_INFINITY]);
        assert_eq!(&out[128..131], &[1.0, 0.0, 3.0]);
        assert!(out[131..256].iter().all(|v| *v == f32::NEG_INFINITY));
        assert_eq!((spread[130], spread[131]), (3.0, 0.0), "spreads follow the logits, 0 where unseen");
    }

    #[test]
    fn ragged_rows_see_their_window() {
        let keys = 4;
        let k: Vec<u8> = (0..keys)
            .flat_map(|s| {
                let mut row = vec![0u8; INDEXER_HEAD_DIM];
                row[0] = q8(s as f32 + 1.0);
                row
            })
            .collect();
        let mut w = vec![0.0f32; INDEX_HEADS];
        w[0] = 2.0;
        let (out, spread) = ragged_logits(&one_hot_q(INDEX_HEADS, 0, 1.0), &w, &k, &[1.0; 4], &[1], &[3]);
        assert_eq!(out, vec![f32::NEG_INFINITY, 4.0, 6.0, f32::NEG_INFINITY]);
        assert_eq!(spread, vec![0.0, 4.0, 6.0, 0.0]);
    }

    #[test]
    fn folded_weights_and_chunks() {
        let w = fold_weights(&[2.0], &[0.5]);
        assert!((w[0] - 2.0 * 0.125 * 0.5 / 128f32.sqrt()).abs() < 1e-9);
        assert_eq!(ragged_chunk_rows(4096, 32768, 64 << 20), Some(512));
        assert_eq!(ragged_chunk_rows(100, 32768, 1 << 30), Some(100));
        assert_eq!(ragged_chunk_rows(100, 32768, 1000), None);
    }
}
