//! CPU reference of top-k selection (spec §7) and a checker for GPU output.
//!
//! Order: scores compare by an IEEE total order in which every NaN sits below
//! −inf (a NaN is never chosen ahead of a number); −0 < +0. Rows of n ≤ k
//! candidates return 0..n in order. Longer rows return exactly k positions; ties
//! at the k-th value may be broken any way, except in deterministic mode, where the
//! lowest positions win and the output is sorted by position.

/// Order-preserving key of a score (larger score → larger key; NaN → 0).
pub fn order_key(f: f32) -> u32 {
    let b = f.to_bits();
    if f.is_nan() {
        0
    } else if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The deterministic top-k of `row` (its first `n` values): positions sorted
/// ascending, ties to the lowest position, `-1` padded to `k`.
pub fn topk_deterministic(row: &[f32], k: usize) -> Vec<i32> {
    let n = row.len();
    let mut out: Vec<i32> = if n <= k {
        (0..n as i32).collect()
    } else {
        let mut idx: Vec<u32> = (0..n as u32).collect();
        // Descending key, then ascending position: the first k are the winners.
        let rank = |&i: &u32| (std::cmp::Reverse(order_key(row[i as usize])), i);
        idx.select_nth_unstable_by_key(k - 1, rank);
        let mut chosen: Vec<i32> = idx[..k].iter().map(|&i| i as i32).collect();
        chosen.sort_unstable();
        chosen
    };
    out.resize(k, -1);
    out
}

/// Checks one output row of a (possibly non-deterministic) top-k against `row`:
/// `positions` are the relative positions the kernel chose (after undoing any
/// transform; `None` where the transform could not be undone).
pub fn check_row(row: &[f32], k: usize, positions: &[Option<i32>]) -> Result<(), String> {
    let n = row.len();
    if positions.len() != k {
        return Err(format!("row has {} entries, expected {k}", positions.len()));
    }
    let valid = n.min(k);
    if n <= k {
        for (j, p) in positions.iter().enumerate() {
            let want = if j < n { Some(j as i32) } else { Some(-1) };
            if *p != want {
                return Err(format!("short row (n={n}): entry {j} is {p:?}, expected {want:?}"));
            }
        }
        return Ok(());
    }
    let mut chosen = Vec::with_capacity(valid);
    for (j, p) in positions.iter().enumerate() {
        match p {
            Some(p) if *p >= 0 && (*p as usize) < n => chosen.push(*p as usize),
            other => return Err(format!("entry {j} is {other:?}, not a position in 0..{n}")),
        }
    }
    let mut seen = chosen.clone();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("position {} chosen twice", w[0]));
    }
    // Same multiset of keys as the true top-k: any tie-break is then acceptable.
    let mut got: Vec<u32> = chosen.iter().map(|&p| order_key(row[p])).collect();
    let mut all: Vec<u32> = row.iter().map(|&v| order_key(v)).collect();
    all.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
    let mut want = all[..k].to_vec();
    got.sort_unstable();
    want.sort_unstable();
    if got != want {
        let miss = want.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "not the top-{k} set: {} of the {k} keys differ (first at rank {miss}: got key {:#x}, want {:#x})",
            got.iter().zip(&want).filter(|(a, b)| a != b).count(),
            got[miss],
            want[miss]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_is_total_with_nan_lowest() {
        let xs = [f32::NAN, f32::NEG_INFINITY, -f32::MAX, -1.0, -0.0, 0.0, 1e-45, 1.0, f32::MAX, f32::INFINITY];
        for w in xs.windows(2) {
            assert!(order_key(w[0]) < order_key(w[1]), "{} !< {}", w[0], w[1]);
        }
        assert_eq!(order_key(-f32::NAN), 0);
    }

    #[test]
    fn deterministic_reference() {
        let row = [1.0, 5.0, 5.0, 3.0, 5.0, f32::NAN];
        assert_eq!(topk_deterministic(&row, 2), vec![1, 2]);
        assert_eq!(topk_deterministic(&row, 4), vec![1, 2, 3, 4]);
        assert_eq!(topk_deterministic(&row[..3], 4), vec![0, 1, 2, -1]);
        assert_eq!(topk_deterministic(&[], 2), vec![-1, -1]);
    }

    #[test]
    fn checker_accepts_any_tie_break_and_rejects_wrong_sets() {
        let row = [1.0, 5.0, 5.0, 3.0, 5.0];
        assert!(check_row(&row, 2, &[Some(4), Some(1)]).is_ok());
        assert!(check_row(&row, 2, &[Some(4), Some(3)]).is_err());
        assert!(check_row(&row, 2, &[Some(4), Some(4)]).is_err());
        assert!(check_row(&row, 2, &[Some(4), None]).is_err());
        assert!(check_row(&row[..2], 3, &[Some(0), Some(1), Some(-1)]).is_ok());
        assert!(check_row(&row[..2], 3, &[Some(1), Some(0), Some(-1)]).is_err());
    }
}
