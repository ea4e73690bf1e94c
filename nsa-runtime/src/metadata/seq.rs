//! The small sequence computations every mode shares (spec §3.1, §2.2), writing
//! into caller-owned buffers so steady-state building does not allocate.
//!
//! Inputs are validated by the builders first (non-negative, sums within i32).

use super::host::PageTable;

/// `cu(lens)`: exclusive prefix sum with a leading 0, `lens.len() + 1` entries.
pub fn cu_into(lens: &[i32], out: &mut Vec<i32>) {
    out.clear();
    out.reserve(lens.len() + 1);
    let mut acc = 0i32;
    out.push(acc);
    for &l in lens {
        acc += l;
        out.push(acc);
    }
}

/// Writes `cu(lens)[1..]` into `out[..lens.len()]` (replay leaves element 0 alone).
pub fn cumsum_into_slice(lens: &[i32], out: &mut [i32]) {
    let mut acc = 0i32;
    for (o, &l) in out.iter_mut().zip(lens) {
        acc += l;
        *o = acc;
    }
}

/// `arange(n)`.
pub fn arange_into(n: usize, out: &mut Vec<i32>) {
    out.clear();
    out.extend(0..n as i32);
}

/// `min(x, topk)` per entry (`compute_nsa_seqlens`).
pub fn clip_into(x: &[i32], topk: u32, out: &mut Vec<i32>) {
    out.clear();
    out.extend(x.iter().map(|&v| clip(v, topk)));
}

pub fn clip(v: i32, topk: u32) -> i32 {
    v.min(topk.min(i32::MAX as u32) as i32)
}

/// Causal per-token KV lengths: for request i, `kv_i - q_i + 1 ..= kv_i` (its last
/// query token sees all `kv_i` tokens). Appends to `out`.
pub fn push_expanded(kv_len: i32, q_len: i32, out: &mut Vec<i32>) {
    out.extend(kv_len - q_len + 1..=kv_len);
}

/// Σ_{v=lo}^{hi} min(v, k) without iterating (0 when hi < lo); used to check that
/// `nsa_cu_seqlens_k` fits in i32 before building it.
pub fn clipped_sum(lo: i64, hi: i64, k: i64) -> i64 {
    if hi < lo {
        return 0;
    }
    let tri = |a: i64, b: i64| if b < a { 0 } else { (a + b) * (b - a + 1) / 2 };
    let below = tri(lo, hi.min(k));
    let above = (hi - lo.max(k + 1) + 1).max(0) * k;
    below + above
}

/// Columns of the real page table for `width` page-size-1 columns.
pub fn real_cols(width: usize, page_size: u32) -> usize {
    width.div_ceil(page_size as usize)
}

/// `_transform_table_1_to_real` on a block: for `rows` rows of `width` slots
/// (`src_stride` apart), `dst[r, c] = src[r, c * page] / page` (floor) for
/// `c < ceil(width / page)`, rows `dst_stride` apart.
pub fn transform_block(
    src: &[i32],
    src_stride: usize,
    rows: usize,
    width: usize,
    page_size: u32,
    dst: &mut [i32],
    dst_stride: usize,
) {
    let page = page_size as usize;
    let cols = real_cols(width, page_size);
    for r in 0..rows {
        let s = &src[r * src_stride..r * src_stride + width];
        let d = &mut dst[r * dst_stride..r * dst_stride + cols];
        for (c, out) in d.iter_mut().enumerate() {
            // Floor division, as torch's `//` (matters only for garbage negatives).
            *out = s[c * page].div_euclid(page_size as i32);
        }
    }
}

/// The real page table of a whole `page_table_1` (page size > 1), into `out`.
pub fn transform_into(table: &PageTable, page_size: u32, out: &mut PageTable) {
    let cols = real_cols(table.width, page_size);
    out.rows = table.rows;
    out.width = cols;
    out.data.clear();
    out.data.resize(table.rows * cols, 0);
    transform_block(&table.data, table.width, table.rows, table.width, page_size, &mut out.data, cols);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cu_of_empty_is_zero() {
        let mut v = vec![7];
        cu_into(&[], &mut v);
        assert_eq!(v, [0]);
        cu_into(&[2, 0, 3], &mut v);
        assert_eq!(v, [0, 2, 2, 5]);
    }

    #[test]
    fn clipped_sum_matches_a_loop() {
        for k in [1, 3, 7] {
            for lo in 0..12 {
                for hi in lo - 1..15 {
                    let want: i64 = (lo..=hi).map(|v: i64| v.min(k)).sum();
                    assert_eq!(clipped_sum(lo, hi, k), want, "lo {lo} hi {hi} k {k}");
                }
            }
        }
    }

    #[test]
    fn real_table_of_spec_2_2() {
        // Row [128..191, 640..] with W = 100 → [2, 10].
        let row: Vec<i32> = (128..192).chain(640..676).collect();
        let t = PageTable { rows: 1, width: 100, data: row };
        let mut out = PageTable::default();
        transform_into(&t, 64, &mut out);
        assert_eq!((out.rows, out.width, out.data), (1, 2, vec![2, 10]));
    }
}
