//! Top-k GPU checks against the CPU reference (set equality under any tie-break,
//! exact equality in deterministic mode), for every output transform.

use super::{download, upload, Check};
use crate::ops::topk::{self, PageTable, TopkOutput, TopkScores};
use crate::reference::topk::{check_row, topk_deterministic};
use crate::runtime::Runtime;
use crate::testdata::{self, ScorePattern};
use crate::Result;
use nsa_kernels::{KernelFamily, KernelSpec, TopkLayout, TopkTransform};
use rand::Rng;
use std::collections::HashMap;

/// One top-k test: a batch of rows, how they are laid out, and the variant.
#[derive(Clone, Debug)]
pub struct TopkCase {
    pub k: u32,
    pub transform: TopkTransform,
    pub deterministic: bool,
    pub pattern: ScorePattern,
    /// Candidates per row (≤ 0: none).
    pub lengths: Vec<i32>,
    /// Random row starts (0..=37) instead of 0.
    pub row_starts: bool,
    /// PAGED only: rows grouped into requests through cu_seqlens_q (prefill form).
    pub grouped: bool,
    pub path: TopkPath,
    pub seed: u64,
}

/// Which top-k kernel a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopkPath {
    /// The single-block kernel with this layout (`None`: `choose_layout`'s).
    Single(Option<TopkLayout>),
    /// The split path (few long rows over many blocks; not deterministic). The
    /// call runs twice on one workspace, which must come back zeroed.
    Split,
    /// The cluster path with this many CTAs per row (not deterministic).
    Cluster(u32),
}

/// Value outside every row's window: a kernel that reads past its window picks it.
const POISON: f32 = 1e30;

pub fn run(rt: &Runtime, case: &TopkCase) -> Result<Check> {
    let stream = rt.gpu().stream();
    let mut rng = testdata::rng(case.seed);
    let rows = case.lengths.len();
    let k = case.k as usize;
    let starts: Vec<i32> = (0..rows).map(|_| if case.row_starts { rng.random_range(0..=37) } else { 0 }).collect();
    let capacity = (0..rows).map(|b| starts[b] + case.lengths[b].max(0)).max().unwrap_or(0).max(1) as usize;
    let stride = capacity + 3; // rows start at every alignment
    let mut scores = vec![POISON; rows * stride];
    let mut row_values = Vec::with_capacity(rows);
    for b in 0..rows {
        let n = case.lengths[b].max(0) as usize;
        let values = testdata::score_row(case.pattern, n, &mut rng);
        scores[b * stride + starts[b] as usize..][..n].copy_from_slice(&values);
        row_values.push(values);
    }

    // Output transform and its inverse (slot or offset position → relative position).
    let (table, cu, table_rows, width, offsets) = match case.transform {
        TopkTransform::Paged => {
            let cu: Vec<i32> = if case.grouped { group_rows(rows, &mut rng) } else { (0..=rows as i32).collect() };
            let requests = cu.len() - 1;
            let width = (0..requests)
                .map(|i| (cu[i]..cu[i + 1]).map(|b| case.lengths[b as usize].max(0)).max().unwrap_or(0))
                .max()
                .unwrap_or(0)
                .max(1) as usize;
            // Each table row is a distinct shuffled run of slots, so slots invert to positions.
            let mut table = Vec::with_capacity(requests * width);
            for i in 0..requests {
                let perm = testdata::distinct_slots(width, width, case.seed ^ (i as u64 + 7));
                table.extend(perm.iter().map(|&p| (i * width) as i32 + p));
            }
            (table, Some(cu), requests, width, vec![])
        }
        TopkTransform::Ragged => (vec![], None, 0, 0, (0..rows).map(|_| rng.random_range(0..1_000_000)).collect()),
        TopkTransform::Plain => (vec![], None, 0, 0, vec![]),
    };

    let d_scores = upload(stream, &scores)?;
    let d_lengths = upload(stream, &case.lengths)?;
    let d_starts = upload(stream, &starts)?;
    let d_table = upload(stream, &table)?;
    let d_cu = upload(stream, cu.as_deref().unwrap_or(&[]))?;
    let d_offsets = upload(stream, &offsets)?;
    let mut d_out = upload(stream, &vec![i32::MIN; rows * k])?;
    let scores_view = d_scores.slice(0..);
    let lengths_view = d_lengths.slice(0..rows);
    let starts_view = d_starts.slice(0..rows);
    let table_view = d_table.slice(0..table.len());
    let cu_view = d_cu.slice(0..cu.as_ref().map_or(0, Vec::len));
    let offsets_view = d_offsets.slice(0..offsets.len());
    let input = TopkScores {
        scores: &scores_view,
        row_stride: stride,
        row_capacity: capacity,
        lengths: &lengths_view,
        row_starts: case.row_starts.then_some(&starts_view),
    };
    let output = match case.transform {
        TopkTransform::Plain => TopkOutput::Plain,
        TopkTransform::Ragged => TopkOutput::Ragged { offsets: &offsets_view },
        TopkTransform::Paged => TopkOutput::Paged(PageTable {
            table: &table_view,
            rows: table_rows,
            stride: width,
            width,
            cu_seqlens_q: case.grouped.then_some(&cu_view),
        }),
    };
    let (k32, transform) = (case.k, case.transform);
    let family = match case.path {
        TopkPath::Single(layout) => {
            let layout = layout.unwrap_or_else(|| topk::choose_layout(rows, rt.gpu().caps().sm_count).0);
            KernelFamily::TopK { k: k32, transform, deterministic: case.deterministic, layout }
        }
        TopkPath::Split => KernelFamily::TopkSplit { k: k32, transform },
        TopkPath::Cluster(cluster) => KernelFamily::TopkCluster { k: k32, transform, cluster },
    };
    let mut out_view = d_out.slice_mut(0..rows * k);
    match family {
        KernelFamily::TopkSplit { .. } => {
            let mut ws = topk::TopkWorkspace::new(rt, rows)?;
            let chunk = 4096;
            for _ in 0..2 {
                topk::topk_split(rt, k32, chunk, capacity.div_ceil(chunk), &input, &output, &mut out_view, &mut ws)?;
            }
        }
        KernelFamily::TopkCluster { cluster, .. } => {
            topk::topk_cluster(rt, k32, cluster, &input, &output, &mut out_view)?
        }
        KernelFamily::TopK { layout, .. } => {
            topk::topk_with_layout(rt, k32, case.deterministic, layout, &input, &output, &mut out_view)?
        }
        _ => unreachable!("a top-k family"),
    }
    let out = download(stream, &d_out, rows * k)?;

    let inverse: Vec<HashMap<i32, i32>> = match &cu {
        Some(_) => (0..table_rows)
            .map(|i| table[i * width..][..width].iter().enumerate().map(|(p, &s)| (s, p as i32)).collect())
            .collect(),
        None => vec![],
    };
    let mut mismatches = 0;
    let mut first_mismatch = None;
    for b in 0..rows {
        let got = &out[b * k..][..k];
        let positions: Vec<Option<i32>> = got
            .iter()
            .map(|&v| match case.transform {
                _ if v == -1 => Some(-1),
                TopkTransform::Plain => Some(v),
                TopkTransform::Ragged => Some(v - offsets[b]),
                TopkTransform::Paged => {
                    let cu = cu.as_ref().expect("paged has cu");
                    let i = cu.partition_point(|&c| c <= b as i32) - 1;
                    inverse[i].get(&v).copied()
                }
            })
            .collect();
        let verdict = if case.deterministic {
            let want: Vec<Option<i32>> = topk_deterministic(&row_values[b], k).into_iter().map(Some).collect();
            if positions == want {
                Ok(())
            } else {
                let j = positions.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                Err(format!("entry {j}: got {:?}, want {:?}", positions[j], want[j]))
            }
        } else {
            check_row(&row_values[b], k, &positions)
        };
        if let Err(e) = verdict {
            mismatches += 1;
            first_mismatch.get_or_insert_with(|| format!("row {b} (n={}): {e}", case.lengths[b]));
        }
    }
    let spec = KernelSpec::new(family, rt.target());
    let n_desc = match (case.lengths.iter().min(), case.lengths.iter().max()) {
        (Some(lo), Some(hi)) if lo == hi => format!("n={lo}"),
        (Some(lo), Some(hi)) => format!("n={lo}..{hi}"),
        _ => "n=-".into(),
    };
    Ok(Check {
        kernel: spec.id(),
        case: format!(
            "{:?} rows={rows} {n_desc}{}{}",
            case.pattern,
            if case.row_starts { " starts" } else { "" },
            if case.grouped { " grouped" } else { "" }
        ),
        items: rows,
        mismatches,
        first_mismatch,
    })
}

/// cu_seqlens over `rows` rows split into requests of 1..=4 rows.
fn group_rows(rows: usize, rng: &mut impl Rng) -> Vec<i32> {
    let mut cu = vec![0i32];
    while (*cu.last().expect("non-empty") as usize) < rows {
        let next = (*cu.last().expect("non-empty") + rng.random_range(1..=4)).min(rows as i32);
        cu.push(next);
    }
    cu
}

/// The unfused page-table transform (spec §7.7) against the CPU: decode form (row
/// t uses table row t) or prefill form (rows grouped by `cu`, with rows past the
/// last request), random positions with −1 holes.
pub fn index_transform(rt: &Runtime, k: u32, prefill: bool, seed: u64) -> Result<Check> {
    let stream = rt.gpu().stream();
    let mut rng = testdata::rng(seed);
    let k = k as usize;
    let (width, table_rows) = (k + 952, 3usize);
    let table: Vec<i32> = (0..table_rows * width).map(|i| (i as i32) * 7 + 1).collect();
    let cu: Vec<i32> = vec![0, 2, 4, 4]; // rows 0-1 → request 0, 2-3 → 1, request 2 empty
    let rows = if prefill { 5 } else { table_rows };
    let idx: Vec<i32> = (0..rows * k)
        .map(|_| if rng.random_range(0..10) == 0 { -1 } else { rng.random_range(0..width as i32) })
        .collect();
    let d_idx = upload(stream, &idx)?;
    let d_table = upload(stream, &table)?;
    let d_cu = upload(stream, &cu)?;
    let mut d_out = upload(stream, &vec![i32::MIN; rows * k])?;
    let (tv, cv) = (d_table.slice(0..), d_cu.slice(0..));
    let pt = PageTable { table: &tv, rows: table_rows, stride: width, width, cu_seqlens_q: prefill.then_some(&cv) };
    topk::page_table_transform(rt, k as u32, &d_idx.slice(0..rows * k), &pt, &mut d_out.slice_mut(0..rows * k))?;
    let got = download(stream, &d_out, rows * k)?;
    let mut mismatches = 0;
    let mut first_mismatch = None;
    for t in 0..rows {
        let trow = if prefill { cu.windows(2).position(|w| w[0] <= t as i32 && (t as i32) < w[1]) } else { Some(t) };
        let want: Vec<i32> = idx[t * k..][..k]
            .iter()
            .map(|&p| match trow {
                Some(r) if p >= 0 => table[r * width + p as usize],
                _ => -1,
            })
            .collect();
        if got[t * k..][..k] != want[..] {
            mismatches += 1;
            first_mismatch.get_or_insert_with(|| format!("row {t}"));
        }
    }
    Ok(Check {
        kernel: KernelSpec::new(KernelFamily::IndexTransform { k: k as u32 }, rt.target()).id(),
        case: format!("{} rows={rows}", if prefill { "prefill" } else { "decode" }),
        items: rows,
        mismatches,
        first_mismatch,
    })
}
