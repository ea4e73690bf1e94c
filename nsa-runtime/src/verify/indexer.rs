//! Indexer logits on the GPU against the CPU reference (spec §6.2, §6.3).
//!
//! Tolerance ([`logit_tolerance`]): every visible entry within `2·10⁻⁵ · max|row| +
//! 10⁻⁶` of the f64 reference (the mma.sync kernel's products are exact, its f32
//! sums round; a wrong key, head, scale or window is off by O(|row|)), plus, for the
//! sm_90a warp-group kernel, `2⁻¹¹ · Σ_h |w_h| · k_scale · Σ_d |q_hd k_d|` for
//! Hopper's FP8 MMA accumulation (see `reference::indexer`). Entries a row does not
//! see must keep the sentinel the buffer was filled with, or be −inf when the call
//! fills them ([`run_filled`]).

use super::{download, upload, Check};
use crate::ops::indexer::{self, IndexerQuery, LogitsOut, PagedIndexerKeys, RaggedIndexerKeys};
use crate::reference::indexer::{paged_logits, ragged_logits, PagedKeys, FP8_WGMMA_REL_ERR};
use crate::runtime::Runtime;
use crate::testdata;
use crate::Result;
use nsa_kernels::layout::{INDEXER_HEAD_DIM, INDEXER_PAGE_BYTES, INDEXER_PAGE_TOKENS};
use nsa_kernels::spec::{indexer_wg_kernel, IndexerLayout};
use nsa_kernels::{KernelFamily, KernelSpec};
use rand::rngs::StdRng;
use rand::Rng;

const SENTINEL: f32 = -12345.0;

/// One indexer test case.
#[derive(Clone, Debug)]
pub enum IndexerCase {
    /// `context_lens.len()` requests of `next_n` query rows, pages shuffled in a
    /// cache of `pages` pages; `table_width` page ids per request.
    Paged { context_lens: Vec<i32>, next_n: usize, table_width: usize, pages: usize, seed: u64 },
    /// Query rows with windows `[ks, ke)` over `num_keys` keys.
    Ragged { ks: Vec<i32>, ke: Vec<i32>, num_keys: usize, seed: u64 },
}

/// A random finite e4m3 byte (no NaN code).
pub(crate) fn e4m3(rng: &mut StdRng) -> u8 {
    loop {
        let b: u8 = rng.random();
        if b & 0x7f != 0x7f {
            return b;
        }
    }
}

fn query(rows: usize, heads: usize, rng: &mut StdRng) -> (Vec<u8>, Vec<f32>) {
    let q = (0..rows * heads * INDEXER_HEAD_DIM).map(|_| e4m3(rng)).collect();
    let w = (0..rows * heads).map(|_| rng.random_range(-0.02f32..0.05)).collect();
    (q, w)
}

fn power_of_two_scale(rng: &mut StdRng) -> f32 {
    2f32.powi(rng.random_range(-12..-4))
}

/// How far a kernel's logit may lie from the reference: f32 accumulation relative
/// to the row's largest logit, plus, for the warp-group kernel, the bound of Hopper's
/// FP8 MMA accumulation (`spread`: the entry's spread, `reference::indexer::logit_and_spread`).
pub fn logit_tolerance(row_max: f32, spread: f32, wgmma: bool) -> f32 {
    2e-5 * row_max + 1e-6 + if wgmma { FP8_WGMMA_REL_ERR * spread } else { 0.0 }
}

/// Compares the visible entries of `got` with `want` (−inf in `want` = not visible:
/// `got` must hold `unseen` there); the padding `[width, stride)` of every row must
/// keep the sentinel (no call writes past a row's width, filling or not).
/// A mismatch report also names the worst entry as a multiple of its tolerance: a
/// rounding-level miss (a few times the tolerance) reads differently from a wrong
/// key or head (orders of magnitude).
fn compare(
    got: &[f32],
    want: &[f32],
    spreads: &[f32],
    wgmma: bool,
    unseen: f32,
    (rows, width, stride): (usize, usize, usize),
) -> (usize, Option<String>) {
    let mut bad = 0;
    let mut first = None;
    let mut worst = (0.0f32, 0, 0);
    for r in 0..rows {
        let w_row = &want[r * width..(r + 1) * width];
        let max = w_row.iter().filter(|v| v.is_finite()).fold(0.0f32, |m, v| m.max(v.abs()));
        let mut row_bad = false;
        for s in 0..width {
            let g = got[r * stride + s];
            let miss = if w_row[s] == f32::NEG_INFINITY {
                g != unseen
            } else {
                // A NaN from the GPU is an infinite miss.
                let ratio = (g - w_row[s]).abs() / logit_tolerance(max, spreads[r * width + s], wgmma);
                let ratio = if ratio.is_nan() { f32::INFINITY } else { ratio };
                if ratio > worst.0 {
                    worst = (ratio, r, s);
                }
                ratio > 1.0
            };
            if miss && !row_bad {
                row_bad = true;
                first.get_or_insert(format!("row {r} key {s}: gpu {g} vs reference {}", w_row[s]));
            }
        }
        if let Some(s) = (width..stride).find(|&s| got[r * stride + s] != SENTINEL) {
            if !row_bad {
                row_bad = true;
                first.get_or_insert(format!(
                    "row {r} column {s} (padding past width {width}): written {}",
                    got[r * stride + s]
                ));
            }
        }
        bad += row_bad as usize;
    }
    let first = first.map(|f| format!("{f}; worst: {:.3e} × tolerance at row {} key {}", worst.0, worst.1, worst.2));
    (bad, first)
}

/// Runs `case` with unseen entries left as they were (the sentinel).
pub fn run(rt: &Runtime, case: &IndexerCase, heads: u32) -> Result<Check> {
    run_with(rt, case, heads, false)
}

/// Runs `case` with the logits kernel filling every unseen entry of the row's
/// width with −inf (`LogitsOut::fill_unseen`); the padding past it keeps the sentinel.
pub fn run_filled(rt: &Runtime, case: &IndexerCase, heads: u32) -> Result<Check> {
    run_with(rt, case, heads, true)
}

fn run_with(rt: &Runtime, case: &IndexerCase, heads: u32, fill: bool) -> Result<Check> {
    let stream = rt.gpu().stream();
    let unseen = if fill { f32::NEG_INFINITY } else { SENTINEL };
    let h = heads as usize;
    let wgmma = indexer_wg_kernel(heads, rt.target());
    let (layout, rows, mismatches, first, what) = match case {
        IndexerCase::Paged { context_lens, next_n, table_width, pages, seed } => {
            let mut rng = testdata::rng(*seed);
            let batch = context_lens.len();
            let rows = batch * next_n;
            let mut cache = vec![0u8; pages * INDEXER_PAGE_BYTES];
            for p in 0..*pages {
                let page = &mut cache[p * INDEXER_PAGE_BYTES..(p + 1) * INDEXER_PAGE_BYTES];
                for b in page[..INDEXER_PAGE_TOKENS * INDEXER_HEAD_DIM].iter_mut() {
                    *b = e4m3(&mut rng);
                }
                for o in 0..INDEXER_PAGE_TOKENS {
                    let at = INDEXER_PAGE_TOKENS * INDEXER_HEAD_DIM + 4 * o;
                    page[at..at + 4].copy_from_slice(&power_of_two_scale(&mut rng).to_le_bytes());
                }
            }
            let table: Vec<i32> = (0..batch * table_width).map(|_| rng.random_range(0..*pages as i32)).collect();
            let (q, w) = query(rows, h, &mut rng);
            let width = table_width * INDEXER_PAGE_TOKENS;
            let stride = width.next_multiple_of(4) + 4;
            let d_q = upload(stream, &q)?;
            let d_w = upload(stream, &w)?;
            let d_cache = upload(stream, &cache)?;
            let d_table = upload(stream, &table)?;
            let d_lens = upload(stream, context_lens)?;
            let mut d_out = upload(stream, &vec![SENTINEL; rows * stride])?;
            let query = IndexerQuery { heads, q: d_q.slice(0..q.len()), weights: d_w.slice(0..w.len()) };
            let keys = PagedIndexerKeys {
                cache: d_cache.slice(0..cache.len()),
                block_table: d_table.slice(0..table.len()),
                table_width: *table_width,
                context_lens: d_lens.slice(0..batch),
                next_n: *next_n,
            };
            let mut view = d_out.slice_mut(0..rows * stride);
            indexer::paged_logits(
                rt,
                &query,
                &keys,
                LogitsOut::new(&mut view, stride).fill_unseen(if fill { width } else { 0 }),
            )?;
            let got = download(stream, &d_out, rows * stride)?;
            let pk = PagedKeys { cache: &cache, block_table: &table, width: *table_width, context_lens };
            let (want, spreads) = paged_logits(&q, &w, pk, *next_n, width);
            let (bad, first) = compare(&got, &want, &spreads, wgmma, unseen, (rows, width, stride));
            let what = format!("paged b{batch} next_n{next_n} width{table_width}{}", if fill { " filled" } else { "" });
            (IndexerLayout::Paged, rows, bad, first, what)
        }
        IndexerCase::Ragged { ks, ke, num_keys, seed } => {
            let mut rng = testdata::rng(*seed);
            let rows = ks.len();
            let keys: Vec<u8> = (0..num_keys * INDEXER_HEAD_DIM).map(|_| e4m3(&mut rng)).collect();
            let scales: Vec<f32> = (0..*num_keys).map(|_| power_of_two_scale(&mut rng)).collect();
            let (q, w) = query(rows, h, &mut rng);
            let stride = num_keys.next_multiple_of(4);
            let d_q = upload(stream, &q)?;
            let d_w = upload(stream, &w)?;
            let d_k = upload(stream, &keys)?;
            let d_s = upload(stream, &scales)?;
            let d_ks = upload(stream, ks)?;
            let d_ke = upload(stream, ke)?;
            let mut d_out = upload(stream, &vec![SENTINEL; rows * stride])?;
            let query = IndexerQuery { heads, q: d_q.slice(0..q.len()), weights: d_w.slice(0..w.len()) };
            let rk = RaggedIndexerKeys {
                keys: d_k.slice(0..keys.len()),
                scales: d_s.slice(0..*num_keys),
                ks: d_ks.slice(0..rows),
                ke: d_ke.slice(0..rows),
            };
            let mut view = d_out.slice_mut(0..rows * stride);
            indexer::ragged_logits(
                rt,
                &query,
                &rk,
                LogitsOut::new(&mut view, stride).fill_unseen(if fill { *num_keys } else { 0 }),
            )?;
            let got = download(stream, &d_out, rows * stride)?;
            let (want, spreads) = ragged_logits(&q, &w, &keys, &scales, ks, ke);
            let (bad, first) = compare(&got, &want, &spreads, wgmma, unseen, (rows, *num_keys, stride));
            (
                IndexerLayout::Ragged,
                rows,
                bad,
                first,
                format!("ragged t{rows} keys{num_keys}{}", if fill { " filled" } else { "" }),
            )
        }
    };
    Ok(Check {
        kernel: KernelSpec::new(KernelFamily::IndexerLogits { heads, layout }, rt.target()).id(),
        case: what,
        items: rows,
        mismatches,
        first_mismatch: first,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_counts_rows_with_a_miss_nan_and_unseen_writes_included() {
        // 2 rows × 3 keys at stride 4; row 0 does not see key 2. Row 0's tolerance is
        // 2e-5 · 100 + 1e-6.
        let want = [100.0, -50.0, f32::NEG_INFINITY, 10.0, 20.0, 30.0];
        let ok = [100.001, -50.0, SENTINEL, SENTINEL, 10.0, 20.0, 30.0, SENTINEL];
        let spreads = [0.0; 6];
        assert_eq!(compare(&ok, &want, &spreads, false, SENTINEL, (2, 3, 4)), (0, None));
        let with = |at: usize, v: f32| {
            let mut g = ok;
            g[at] = v;
            compare(&g, &want, &spreads, false, SENTINEL, (2, 3, 4))
        };
        let (bad, first) = with(4, f32::NAN);
        assert_eq!(bad, 1);
        assert!(first.unwrap().contains("row 1 key 0"));
        assert_eq!(with(2, 5.0).0, 1, "an entry the row does not see was written");
        let (bad, first) = with(0, 100.01);
        assert_eq!(bad, 1);
        // 0.01 off is about 5 tolerances; the report names it.
        let first = first.unwrap();
        assert!(first.contains("worst: 4.99") && first.contains("at row 0 key 0"), "{first}");
        // The warp-group kernel's allowance: 2^-11 of a spread of 40 is ~0.0195.
        let mut g = ok;
        g[0] = 100.01;
        let wide = [40.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        assert_eq!(compare(&g, &want, &wide, true, SENTINEL, (2, 3, 4)).0, 0);
        assert_eq!(compare(&g, &want, &wide, false, SENTINEL, (2, 3, 4)).0, 1);
    }

    #[test]
    fn filled_calls_need_neg_inf_where_unseen_and_keep_the_padding() {
        let want = [100.0, -50.0, f32::NEG_INFINITY, 10.0, 20.0, 30.0];
        let spreads = [0.0; 6];
        let filled = [100.0, -50.0, f32::NEG_INFINITY, SENTINEL, 10.0, 20.0, 30.0, SENTINEL];
        assert_eq!(compare(&filled, &want, &spreads, false, f32::NEG_INFINITY, (2, 3, 4)), (0, None));
        let (bad, first) = compare(&filled, &want, &spreads, false, SENTINEL, (2, 3, 4));
        assert_eq!(bad, 1, "{first:?}");
        let mut spilled = filled;
        spilled[7] = f32::NEG_INFINITY;
        let (bad, first) = compare(&spilled, &want, &spreads, false, f32::NEG_INFINITY, (2, 3, 4));
        assert_eq!(bad, 1);
        assert!(first.unwrap().contains("row 1 column 3"));
    }
}
