//! Helpers shared by the sparse MLA checks (decode and prefill): row sampling, the
//! parallel reference, the index-row patterns and the tolerance comparison.
//!
//! Tolerances (stated once, used by every case): out within
//! `2⁻⁷·|ref| + 4·10⁻³·max(1, Σp|v|/Σp)` (the kernels round P to bf16 or f16 for the
//! PV product, an error that scales with the V values P weights, not with their
//! possibly cancelling sum, and round the output to bf16; the reference is f64),
//! lse and max_logits within `10⁻⁵·|ref| + 2·10⁻⁴` (f32 scores, ex2/lg2
//! approximations), empty rows exactly out 0, lse +inf, max_logits −inf.

use crate::reference::sparse_mla::Attention;
use crate::testdata;
use half::bf16;
use nsa_kernels::layout::KV_LORA_RANK;
use rand::rngs::StdRng;
use rand::Rng;

/// How the index rows of a case are filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexPattern {
    /// Distinct random rows/slots with random −1 holes (about 1 in 8).
    Holes,
    /// Distinct random rows/slots, no holes.
    Full,
    /// Every entry −1: out 0, lse +inf.
    AllInvalid,
    /// Entries drawn with repeats (each occurrence counts).
    Duplicates,
}

/// One index row of `k` entries over `0..pool` following `pattern`.
pub fn index_row(pattern: IndexPattern, k: usize, pool: usize, rng: &mut StdRng) -> Vec<i32> {
    let mut row = vec![-1i32; k];
    match pattern {
        IndexPattern::AllInvalid => {}
        IndexPattern::Duplicates => row.iter_mut().for_each(|v| *v = rng.random_range(0..pool.min(97)) as i32),
        IndexPattern::Full | IndexPattern::Holes => {
            let n = k.min(pool);
            row[..n].copy_from_slice(&testdata::distinct_slots(n, pool, rng.random()));
            if pattern == IndexPattern::Holes {
                row.iter_mut().filter(|_| rng.random_range(0..8) == 0).for_each(|v| *v = -1);
            }
        }
    }
    row
}

pub fn within(got: f32, want: f32, rel: f32, abs: f32) -> bool {
    if want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= rel * want.abs() + abs
}

/// `want` rows spread evenly over `0..rows`, first and last included.
pub fn sample_rows(rows: usize, want: usize) -> Vec<usize> {
    if rows <= want {
        return (0..rows).collect();
    }
    let mut v: Vec<usize> = (0..want).map(|i| i * (rows - 1) / (want - 1).max(1)).collect();
    v.dedup();
    v
}

/// `one(r)` for every picked row, on all cores, in order.
pub fn reference_rows<F>(picked: &[usize], one: F) -> Vec<Attention>
where
    F: Fn(usize) -> Attention + Sync,
{
    parallel_rows(picked, one)
}

/// `one(r)` for every picked row, on all cores, in order.
pub fn parallel_rows<T, F>(picked: &[usize], one: F) -> Vec<T>
where
    T: Send,
    F: Fn(usize) -> T + Sync,
{
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).min(picked.len().max(1));
    let chunk = picked.len().div_ceil(threads.max(1)).max(1);
    let one = &one;
    std::thread::scope(|scope| {
        let handles: Vec<_> = picked
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(|&r| one(r)).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("reference thread panicked")).collect()
    })
}

/// What the GPU wrote for every query row: `[rows, heads, 512]` out, `[rows, heads]`
/// lse and (prefill) max_logits.
#[derive(Debug)]
pub struct GpuAttention<'a> {
    pub heads: usize,
    pub out: &'a [bf16],
    pub lse: &'a [f32],
    pub max_logits: Option<&'a [f32]>,
}

/// Mismatching rows among `picked` (one count per row) and the first difference.
pub fn compare(gpu: &GpuAttention<'_>, picked: &[usize], want: &[Attention]) -> (usize, Option<String>) {
    let heads = gpu.heads;
    let mut mismatches = 0;
    let mut first = None;
    for (&r, w) in picked.iter().zip(want) {
        if let Some(b) = row_difference(gpu, r, w, heads) {
            mismatches += 1;
            first.get_or_insert(b);
        }
    }
    (mismatches, first)
}

fn row_difference(gpu: &GpuAttention<'_>, r: usize, w: &Attention, heads: usize) -> Option<String> {
    for h in 0..heads {
        let (gl, wl) = (gpu.lse[r * heads + h], w.lse[h]);
        if !within(gl, wl, 1e-5, 2e-4) {
            return Some(format!("row {r} head {h}: lse gpu {gl} vs reference {wl}"));
        }
        if let Some(m) = gpu.max_logits {
            let (gm, wm) = (m[r * heads + h], w.max_logits[h]);
            if !within(gm, wm, 1e-5, 2e-4) {
                return Some(format!("row {r} head {h}: max_logits gpu {gm} vs reference {wm}"));
            }
        }
        for d in 0..KV_LORA_RANK {
            let g = gpu.out[(r * heads + h) * KV_LORA_RANK + d].to_f32();
            let want = w.out[h * KV_LORA_RANK + d];
            let magnitude = w.out_magnitude[h * KV_LORA_RANK + d].max(1.0);
            if !within(g, want, 1.0 / 128.0, 4e-3 * magnitude) {
                return Some(format!("row {r} head {h} dim {d}: out gpu {g} vs reference {want}"));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparison_catches_each_output() {
        let want = Attention {
            out: vec![1.0; KV_LORA_RANK],
            lse: vec![2.0],
            max_logits: vec![1.5],
            out_magnitude: vec![1.0; KV_LORA_RANK],
        };
        let out = vec![bf16::from_f32(1.0); KV_LORA_RANK];
        let ok = GpuAttention { heads: 1, out: &out, lse: &[2.0], max_logits: Some(&[1.5]) };
        assert_eq!(compare(&ok, &[0], std::slice::from_ref(&want)).0, 0);
        let bad_max = GpuAttention { max_logits: Some(&[1.6]), ..ok };
        assert!(compare(&bad_max, &[0], std::slice::from_ref(&want)).1.unwrap().contains("max_logits"));
        let bad_lse = GpuAttention { lse: &[2.01], ..ok };
        assert!(compare(&bad_lse, &[0], std::slice::from_ref(&want)).1.unwrap().contains("lse"));
        let mut off = out.clone();
        off[7] = bf16::from_f32(1.05);
        let bad_out = GpuAttention { out: &off, ..ok };
        assert!(compare(&bad_out, &[0], std::slice::from_ref(&want)).1.unwrap().contains("dim 7"));
        // The same difference is rounding when P weighted V values of magnitude 100.
        let large_terms = Attention { out_magnitude: vec![100.0; KV_LORA_RANK], ..want.clone() };
        assert_eq!(compare(&bad_out, &[0], std::slice::from_ref(&large_terms)).0, 0);
        off[7] = bf16::from_f32(1.5);
        let far_out = GpuAttention { out: &off, ..ok };
        assert_eq!(compare(&far_out, &[0], std::slice::from_ref(&large_terms)).0, 1);
        assert!(!within(1.0, f32::INFINITY, 1.0, 1.0) && within(f32::INFINITY, f32::INFINITY, 0.0, 0.0));
    }

    #[test]
    fn samples_include_both_ends() {
        assert_eq!(sample_rows(3, 8), vec![0, 1, 2]);
        let s = sample_rows(100, 5);
        assert_eq!((s[0], *s.last().unwrap(), s.len()), (0, 99, 5));
    }
}
