//! Dense causal attention over variable-length sequences on the CPU: the MHA
//! one-shot prefill (spec §5.1), f64 math. Each of the batch's sequences b has
//! `lq = cu_q[b+1] − cu_q[b]` query rows and `lk = cu_k[b+1] − cu_k[b]` key rows
//! (its prefix and its new tokens, `lk ≥ lq` when it has a prefix); query row i
//! sees keys `0 ..= lk − lq + i` of its own sequence (causal, aligned at the end).
//! Every head has its own q, k (`d_qk` values) and v (`d_v` values).

use crate::error::invalid;
use crate::Result;

/// Row-major inputs: `q` `[cu_q[B], heads, d_qk]`, `k` `[cu_k[B], heads, d_qk]`,
/// `v` `[cu_k[B], heads, d_v]` (bf16 values as f32).
#[derive(Clone, Copy, Debug)]
pub struct DenseBatch<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub cu_seqlens_q: &'a [i32],
    pub cu_seqlens_k: &'a [i32],
    pub heads: usize,
    pub d_qk: usize,
    pub d_v: usize,
    pub sm_scale: f32,
}

/// `out` `[rows, heads, d_v]`; `lse` `[rows, heads]` in natural log, +inf for a
/// row that sees no key (its `out` is 0), as the sparse kernels report it.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseOut {
    pub out: Vec<f32>,
    pub lse: Vec<f32>,
}

/// The sequences' `(q_start, lq, k_start, lk)`, checked against the tensors.
fn sequences(b: &DenseBatch<'_>) -> Result<Vec<(usize, usize, usize, usize)>> {
    let (cq, ck) = (b.cu_seqlens_q, b.cu_seqlens_k);
    if cq.is_empty() || cq.len() != ck.len() {
        return Err(invalid(
            "cu_seqlens_k",
            format!("{} entries", ck.len()),
            format!("as many as cu_seqlens_q ({}), batch + 1 ≥ 1", cq.len()),
        ));
    }
    for (name, cu) in [("cu_seqlens_q", cq), ("cu_seqlens_k", ck)] {
        if cu[0] != 0 || cu.windows(2).any(|w| w[1] < w[0]) {
            return Err(invalid(name, format!("{cu:?}"), "non-decreasing offsets from 0"));
        }
    }
    let (rows, keys) = (*cq.last().unwrap() as usize, *ck.last().unwrap() as usize);
    for (name, len, want) in [
        ("q", b.q.len(), rows * b.heads * b.d_qk),
        ("k", b.k.len(), keys * b.heads * b.d_qk),
        ("v", b.v.len(), keys * b.heads * b.d_v),
    ] {
        if len != want {
            return Err(invalid(name, format!("{len} values"), format!("{want} (the offsets' rows × heads × dims)")));
        }
    }
    Ok((0..cq.len() - 1)
        .map(|s| {
            let (q0, k0) = (cq[s] as usize, ck[s] as usize);
            (q0, cq[s + 1] as usize - q0, k0, ck[s + 1] as usize - k0)
        })
        .collect())
}

/// Causal varlen attention of every query row and head, the rows dealt round-robin
/// over the machine's cores (a 2K-token sequence is ~20 GFLOP at 16 heads).
pub fn dense_causal(b: &DenseBatch<'_>) -> Result<DenseOut> {
    dense_causal_rows(b, |_| true)
}

/// [`dense_causal`] of the query rows `wanted` accepts only; the others keep zeros
/// and +inf.
pub fn dense_causal_rows(b: &DenseBatch<'_>, wanted: impl Fn(usize) -> bool + Sync) -> Result<DenseOut> {
    let seqs = sequences(b)?;
    let rows = *b.cu_seqlens_q.last().unwrap() as usize;
    let (h, dv) = (b.heads, b.d_v);
    // (t, k0, visible) of each query row: keys k0 .. k0 + visible, none when the
    // sequence has fewer keys than rows before it.
    let mut work = Vec::with_capacity(rows);
    for (q0, lq, k0, lk) in seqs {
        for i in 0..lq {
            let visible = (lk as i64 - lq as i64 + i as i64 + 1).clamp(0, lk as i64) as usize;
            work.push((q0 + i, k0, visible));
        }
    }
    let mut out = DenseOut { out: vec![0.0; rows * h * dv], lse: vec![f32::INFINITY; rows * h] };
    if rows == 0 || h == 0 || dv == 0 {
        return Ok(out);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(rows);
    let mut shares: Vec<Vec<RowOut<'_>>> = (0..threads).map(|_| Vec::new()).collect();
    for (t, (o, l)) in out.out.chunks_mut(h * dv).zip(out.lse.chunks_mut(h)).enumerate() {
        shares[t % threads].push((t, o, l));
    }
    std::thread::scope(|scope| {
        for share in shares {
            let (work, wanted) = (&work, &wanted);
            scope.spawn(move || {
                for (t, o, l) in share {
                    let (row, k0, visible) = work[t];
                    debug_assert_eq!(row, t);
                    if visible > 0 && wanted(t) {
                        row_heads(b, t, k0, visible, o, l);
                    }
                }
            });
        }
    });
    Ok(out)
}

/// A query row's index, its `out` (heads × d_v) and its `lse` (heads).
type RowOut<'a> = (usize, &'a mut [f32], &'a mut [f32]);

/// Every head of query row `t` over keys `k0 .. k0 + visible` of its sequence.
fn row_heads(b: &DenseBatch<'_>, t: usize, k0: usize, visible: usize, out: &mut [f32], lse: &mut [f32]) {
    let (h, dq, dv) = (b.heads, b.d_qk, b.d_v);
    let scale = b.sm_scale as f64;
    let mut scores = Vec::with_capacity(visible);
    for head in 0..h {
        let q = &b.q[(t * h + head) * dq..][..dq];
        scores.clear();
        scores.extend((0..visible).map(|j| {
            let k = &b.k[((k0 + j) * h + head) * dq..][..dq];
            scale * q.iter().zip(k).map(|(&x, &y)| x as f64 * y as f64).sum::<f64>()
        }));
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut acc = vec![0.0f64; dv];
        let mut l = 0.0f64;
        for (j, &s) in scores.iter().enumerate() {
            let p = (s - m).exp();
            l += p;
            let v = &b.v[((k0 + j) * h + head) * dv..][..dv];
            for (a, &x) in acc.iter_mut().zip(v) {
                *a += p * x as f64;
            }
        }
        for (o, a) in out[head * dv..][..dv].iter_mut().zip(&acc) {
            *o = (a / l) as f32;
        }
        lse[head] = (m + l.ln()) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch<'a>(q: &'a [f32], k: &'a [f32], v: &'a [f32], cq: &'a [i32], ck: &'a [i32], d: usize) -> DenseBatch<'a> {
        DenseBatch { q, k, v, cu_seqlens_q: cq, cu_seqlens_k: ck, heads: 1, d_qk: d, d_v: d, sm_scale: 0.5 }
    }

    #[test]
    fn one_key_gives_its_value_and_score() {
        let (q, k, v) = ([1.0, 2.0], [3.0, -1.0], [7.0, 8.0]);
        let r = dense_causal(&batch(&q, &k, &v, &[0, 1], &[0, 1], 2)).unwrap();
        assert_eq!(r.out, vec![7.0, 8.0]);
        assert_eq!(r.lse, vec![0.5 * (3.0 - 2.0)]);
    }

    #[test]
    fn equal_scores_average_the_visible_values_causally_with_a_prefix() {
        // One sequence: 2 query rows over 4 keys (a 2-key prefix): row 0 sees keys
        // 0..=2, row 1 all 4. q = 0, so every score is 0.
        let q = [0.0; 2];
        let k = [1.0, 2.0, 3.0, 4.0];
        let v = [1.0, 2.0, 3.0, 100.0];
        let r = dense_causal(&batch(&q, &k, &v, &[0, 2], &[0, 4], 1)).unwrap();
        assert!((r.out[0] - 2.0).abs() < 1e-6 && (r.out[1] - 26.5).abs() < 1e-5, "{:?}", r.out);
        assert!((r.lse[0] - 3f32.ln()).abs() < 1e-6 && (r.lse[1] - 4f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn sequences_do_not_see_each_other_and_rows_without_keys_are_empty() {
        // Sequence 0: 1 row, 1 key. Sequence 1: 3 rows over 2 keys, so its first row
        // sees none (0 and +inf), the others 1 and 2 keys.
        let q = [1.0; 4];
        let k = [1.0, 1.0, 1.0];
        let v = [5.0, 1.0, 3.0];
        let r = dense_causal(&batch(&q, &k, &v, &[0, 1, 4], &[0, 1, 3], 1)).unwrap();
        assert_eq!(r.out[0], 5.0);
        assert_eq!((r.out[1], r.lse[1]), (0.0, f32::INFINITY));
        assert_eq!(r.out[2], 1.0);
        assert!((r.out[3] - 2.0).abs() < 1e-6);
    }

    #[test]
    fn heads_and_value_width_are_independent() {
        // 2 heads, d_qk 1, d_v 2: head 1's keys favour key 1 strongly.
        let b = DenseBatch {
            q: &[0.0, 10.0, 0.0, 10.0],
            k: &[0.0, 0.0, 0.0, 10.0],
            v: &[1.0, 1.0, 9.0, 9.0, 3.0, 3.0, -9.0, -9.0],
            cu_seqlens_q: &[0, 2],
            cu_seqlens_k: &[0, 2],
            heads: 2,
            d_qk: 1,
            d_v: 2,
            sm_scale: 1.0,
        };
        let r = dense_causal(&b).unwrap();
        // Row 0 sees key 0 only; row 1 both: head 0 averages, head 1 takes key 1.
        assert_eq!(&r.out[..4], &[1.0, 1.0, 9.0, 9.0]);
        assert!((r.out[4] - 2.0).abs() < 1e-6 && (r.out[6] + 9.0).abs() < 1e-3, "{:?}", r.out);
    }

    #[test]
    fn bad_offsets_and_lengths_name_the_argument() {
        let one = [0.0f32; 2];
        let err = |cq: &[i32], ck: &[i32]| dense_causal(&batch(&one, &one, &one, cq, ck, 2)).unwrap_err().to_string();
        assert!(err(&[0, 1], &[0, 1, 1]).contains("`cu_seqlens_k`"));
        assert!(err(&[1, 1], &[0, 1]).contains("`cu_seqlens_q`"));
        assert!(err(&[0, 1], &[0, 2]).contains("`k`"));
    }
}
