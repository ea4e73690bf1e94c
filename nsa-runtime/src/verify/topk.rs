//! Top-k checks against the CPU reference (set equality under any tie-break, exact
//! equality in deterministic mode), for every output transform: on the GPU, or on
//! any other [`TopkDevice`] (the tests' CPU emulation of the kernels).

use super::{download, upload, Check};
use crate::ops::topk::{self, PageTable, TopkOutput, TopkPlan, TopkScoreElem, TopkScores};
use crate::reference::topk::{check_row, topk_deterministic};
use crate::runtime::Runtime;
use crate::testdata::{self, ScorePattern};
use crate::Result;
use cudarc::driver::{CudaView, CudaViewMut};
use half::bf16;
use nsa_kernels::{KernelFamily, KernelSpec, Target, TopkEntries, TopkLayout, TopkScore, TopkTransform};
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
    /// PAGED only: the table's width in entries (`None`: enough for each request's
    /// longest row). Rows of more keys than the table holds are rejected: all −1.
    pub table_width: Option<usize>,
    pub path: TopkPath,
    /// The scores' type: bf16 cases round the pattern's values to bf16 (which turns
    /// near-equal values into ties), and the reference sees the rounded values.
    pub score: TopkScore,
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

/// A top-k kernel as a case launches it: its family, and the CTAs per row of the
/// cluster kernel (a launch attribute; 1 for the other families).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopkKernel {
    pub family: KernelFamily,
    pub cluster: u32,
}

impl TopkKernel {
    /// The kernel's id on `target`, with the cluster size where it has one.
    pub fn name(&self, target: Target) -> String {
        let id = KernelSpec::new(self.family, target).id();
        match self.family {
            KernelFamily::TopkCluster { .. } => format!("{id} (clusters of {})", self.cluster),
            _ => id,
        }
    }
}

/// Value outside every row's window: a kernel that reads past its window picks it.
const POISON: f32 = 1e30;

/// Where top-k cases run: the GPU ([`Runtime`]), or the test suite's CPU emulation
/// of the same kernels. Cases, inputs and checks are shared; only the launch differs.
pub trait TopkDevice {
    fn target(&self) -> Target;
    /// SMs the launch plans are made for.
    fn sm_count(&self) -> u32;
    /// Runs `kernel` (a top-k family and its cluster size) over `inputs` and
    /// returns its `rows × k` output. The split path runs twice on one workspace,
    /// which must come back zeroed (the second run reads it).
    fn topk(&self, kernel: TopkKernel, inputs: &TopkInputs) -> Result<Vec<i32>>;
    /// The unfused page-table transform of `idx` (`rows × k`).
    fn page_table_transform(&self, k: u32, idx: &[i32], table: &HostPageTable) -> Result<Vec<i32>>;
}

/// A page table in host memory (see [`PageTable`]).
#[derive(Clone, Debug)]
pub struct HostPageTable {
    pub table: Vec<i32>,
    pub rows: usize,
    /// Stride and width (equal here), in entries.
    pub width: usize,
    /// Positions per entry (see [`PageTable::page_size`]).
    pub page_size: usize,
    /// `Some`: prefill form (rows grouped into requests).
    pub cu_seqlens_q: Option<Vec<i32>>,
}

impl HostPageTable {
    /// The slot of relative position `pos` in table row `row` (spec §2.1, §2.2); −1
    /// where the entry is < 0 (no page).
    pub fn slot(&self, row: usize, pos: usize) -> i32 {
        let p = self.page_size;
        match self.table[row * self.width + pos / p] {
            entry if entry < 0 => -1,
            entry => entry * p as i32 + (pos % p) as i32,
        }
    }

    /// The device view of this table.
    fn view<'a>(&self, table: &'a CudaView<'a, i32>, cu: &'a CudaView<'a, i32>) -> PageTable<'a> {
        PageTable {
            table,
            rows: self.rows,
            stride: self.width,
            width: self.width,
            page_size: self.page_size,
            cu_seqlens_q: self.cu_seqlens_q.is_some().then_some(cu),
        }
    }
}

/// A case's inputs in host memory, as a launch takes them.
#[derive(Clone, Debug)]
pub struct TopkInputs {
    pub k: u32,
    pub transform: TopkTransform,
    pub score: TopkScore,
    /// `[rows, row_stride]`, poisoned outside each row's window; values of `score`'s
    /// type (bf16: exactly representable, so [`TopkInputs::scores_bf16`] is lossless).
    pub scores: Vec<f32>,
    pub row_stride: usize,
    pub row_capacity: usize,
    pub lengths: Vec<i32>,
    /// `None`: every row starts at 0.
    pub row_starts: Option<Vec<i32>>,
    /// PAGED only.
    pub table: Option<HostPageTable>,
    /// RAGGED only: one per row.
    pub offsets: Vec<i32>,
    /// Each row's candidates (what the reference sees).
    row_values: Vec<Vec<f32>>,
}

impl TopkInputs {
    pub fn new(case: &TopkCase) -> TopkInputs {
        let mut rng = testdata::rng(case.seed);
        let rows = case.lengths.len();
        let starts: Vec<i32> = (0..rows).map(|_| if case.row_starts { rng.random_range(0..=37) } else { 0 }).collect();
        let capacity = (0..rows).map(|b| starts[b] + case.lengths[b].max(0)).max().unwrap_or(0).max(1) as usize;
        let stride = capacity + 3; // rows start at every alignment
        let round = |v: f32| match case.score {
            TopkScore::F32 => v,
            TopkScore::Bf16 => bf16::from_f32(v).to_f32(),
        };
        let mut scores = vec![round(POISON); rows * stride];
        let mut row_values = Vec::with_capacity(rows);
        for b in 0..rows {
            let n = case.lengths[b].max(0) as usize;
            let values: Vec<f32> = testdata::score_row(case.pattern, n, &mut rng).into_iter().map(round).collect();
            scores[b * stride + starts[b] as usize..][..n].copy_from_slice(&values);
            row_values.push(values);
        }
        let (table, offsets) = match case.transform {
            TopkTransform::Paged | TopkTransform::Pages(_) => {
                let page_size = case.transform.page_size().expect("a PAGED transform") as usize;
                let cu: Vec<i32> = if case.grouped { group_rows(rows, &mut rng) } else { (0..=rows as i32).collect() };
                let requests = cu.len() - 1;
                let positions = (0..requests)
                    .map(|i| (cu[i]..cu[i + 1]).map(|b| case.lengths[b as usize].max(0)).max().unwrap_or(0))
                    .max()
                    .unwrap_or(0)
                    .max(1) as usize;
                let width = case.table_width.unwrap_or(positions.div_ceil(page_size));
                // Each table row is a distinct shuffled run of entries (slots, or pages of
                // slots), so slots invert to positions.
                let mut table = Vec::with_capacity(requests * width);
                for i in 0..requests {
                    let perm = testdata::distinct_slots(width, width, case.seed ^ (i as u64 + 7));
                    table.extend(perm.iter().map(|&p| (i * width) as i32 + p));
                }
                // Decode form: the identity grouping, passed as no cu_seqlens_q.
                let cu_seqlens_q = case.grouped.then_some(cu);
                (Some(HostPageTable { table, rows: requests, width, page_size, cu_seqlens_q }), vec![])
            }
            TopkTransform::Ragged => (None, (0..rows).map(|_| rng.random_range(0..1_000_000)).collect()),
            TopkTransform::Plain => (None, vec![]),
        };
        TopkInputs {
            k: case.k,
            transform: case.transform,
            score: case.score,
            scores,
            row_stride: stride,
            row_capacity: capacity,
            lengths: case.lengths.clone(),
            row_starts: case.row_starts.then_some(starts),
            table,
            offsets,
            row_values,
        }
    }

    pub fn rows(&self) -> usize {
        self.lengths.len()
    }

    /// The scores as bf16 (exact for bf16 cases).
    pub fn scores_bf16(&self) -> Vec<bf16> {
        self.scores.iter().map(|&v| bf16::from_f32(v)).collect()
    }

    /// Table row `i` serving score row `b` (decode form: row b).
    fn table_row_of(&self, b: usize) -> usize {
        match self.table.as_ref().and_then(|t| t.cu_seqlens_q.as_ref()) {
            Some(cu) => cu.partition_point(|&c| c <= b as i32) - 1,
            None => b,
        }
    }
}

/// The kernel `case` runs on a device with `sm_count` SMs.
pub fn case_kernel(case: &TopkCase, row_capacity: usize, sm_count: u32) -> TopkKernel {
    let entries = case.transform.entries();
    path_kernel(case.k, case.deterministic, case.path, case.score, entries, case.lengths.len(), row_capacity, sm_count)
}

/// The kernel of `path` writing `entries` for `rows` rows (one-block rows take the
/// layout `choose_layout` picks unless the path names one).
#[allow(clippy::too_many_arguments)]
fn path_kernel(
    k: u32,
    deterministic: bool,
    path: TopkPath,
    score: TopkScore,
    entries: TopkEntries,
    rows: usize,
    row_capacity: usize,
    sm_count: u32,
) -> TopkKernel {
    // The launcher's plans name the kernel (a kind of entry per plan).
    let (plan, cluster) = match path {
        TopkPath::Single(layout) => {
            (TopkPlan::Single(layout.unwrap_or_else(|| topk::choose_layout(rows, row_capacity, sm_count).0)), 1)
        }
        TopkPath::Split => (TopkPlan::Split { chunk: CHECK_SPLIT_CHUNK, chunks: 1 }, 1),
        TopkPath::Cluster(size) => (TopkPlan::Cluster { size }, size),
    };
    let family = plan.family(k, deterministic, score, entries);
    TopkKernel { family, cluster }
}

/// Chunk of the split path in these checks: rows of up to 1M keys span many blocks.
pub const CHECK_SPLIT_CHUNK: usize = 4096;

/// Runs `case` on `dev` and checks every row against the CPU reference.
pub fn run_on(dev: &impl TopkDevice, case: &TopkCase) -> Result<Check> {
    let inputs = TopkInputs::new(case);
    let kernel = case_kernel(case, inputs.row_capacity, dev.sm_count());
    let out = dev.topk(kernel, &inputs)?;
    Ok(check_output(case, &inputs, &out, kernel.name(dev.target())))
}

/// Runs `case` on the GPU and checks every row against the CPU reference.
pub fn run(rt: &Runtime, case: &TopkCase) -> Result<Check> {
    run_on(rt, case)
}

impl TopkDevice for Runtime {
    fn target(&self) -> Target {
        Runtime::target(self)
    }

    fn sm_count(&self) -> u32 {
        self.gpu().caps().sm_count
    }

    fn topk(&self, kernel: TopkKernel, inputs: &TopkInputs) -> Result<Vec<i32>> {
        match inputs.score {
            TopkScore::F32 => topk_on_gpu(self, kernel, inputs, &inputs.scores),
            TopkScore::Bf16 => topk_on_gpu(self, kernel, inputs, &inputs.scores_bf16()),
        }
    }

    fn page_table_transform(&self, k: u32, idx: &[i32], table: &HostPageTable) -> Result<Vec<i32>> {
        let stream = self.gpu().stream();
        let d_idx = upload(stream, idx)?;
        let d_table = upload(stream, &table.table)?;
        let d_cu = upload(stream, table.cu_seqlens_q.as_deref().unwrap_or(&[]))?;
        let mut d_out = upload(stream, &vec![i32::MIN; idx.len()])?;
        let (tv, cv) = (d_table.slice(0..), d_cu.slice(0..));
        let pt = table.view(&tv, &cv);
        topk::page_table_transform(self, k, &d_idx.slice(0..idx.len()), &pt, &mut d_out.slice_mut(0..idx.len()))?;
        download(stream, &d_out, idx.len())
    }
}

/// [`TopkDevice::topk`] on the GPU over `scores` (the inputs' scores as `T`).
fn topk_on_gpu<T: TopkScoreElem>(
    rt: &Runtime,
    kernel: TopkKernel,
    inputs: &TopkInputs,
    scores: &[T],
) -> Result<Vec<i32>> {
    let stream = rt.gpu().stream();
    let rows = inputs.rows();
    let k = inputs.k as usize;
    let no_table = HostPageTable { table: vec![], rows: 0, width: 0, page_size: 1, cu_seqlens_q: None };
    let t = inputs.table.as_ref().unwrap_or(&no_table);
    let d_scores = upload(stream, scores)?;
    let d_lengths = upload(stream, &inputs.lengths)?;
    let d_starts = upload(stream, inputs.row_starts.as_deref().unwrap_or(&[]))?;
    let d_table = upload(stream, &t.table)?;
    let d_cu = upload(stream, t.cu_seqlens_q.as_deref().unwrap_or(&[]))?;
    let d_offsets = upload(stream, &inputs.offsets)?;
    let mut d_out = upload(stream, &vec![i32::MIN; rows * k])?;
    let scores_view = d_scores.slice(0..);
    let lengths_view = d_lengths.slice(0..rows);
    let starts_view = d_starts.slice(0..inputs.row_starts.as_ref().map_or(0, Vec::len));
    let table_view = d_table.slice(0..t.table.len());
    let cu_view = d_cu.slice(0..t.cu_seqlens_q.as_ref().map_or(0, Vec::len));
    let offsets_view = d_offsets.slice(0..inputs.offsets.len());
    let input = TopkScores {
        scores: &scores_view,
        row_stride: inputs.row_stride,
        row_capacity: inputs.row_capacity,
        lengths: &lengths_view,
        row_starts: inputs.row_starts.is_some().then_some(&starts_view),
    };
    let output = match inputs.transform {
        TopkTransform::Plain => TopkOutput::Plain,
        TopkTransform::Ragged => TopkOutput::Ragged { offsets: &offsets_view },
        TopkTransform::Paged | TopkTransform::Pages(_) => TopkOutput::Paged(t.view(&table_view, &cu_view)),
    };
    let mut out_view = d_out.slice_mut(0..rows * k);
    let mut ws = match kernel.family {
        KernelFamily::TopkSplit { .. } => Some(topk::TopkWorkspace::new(rt, rows)?),
        _ => None,
    };
    // The split path twice: its second run reads the workspace the first left.
    for _ in 0..if ws.is_some() { 2 } else { 1 } {
        launch_kernel(rt, kernel, inputs.k, &input, &output, &mut out_view, ws.as_mut())?;
    }
    download(stream, &d_out, rows * k)
}

/// Checks a top-k output (`rows × k`) of `case` against the CPU reference.
pub fn check_output(case: &TopkCase, inputs: &TopkInputs, out: &[i32], kernel: String) -> Check {
    let rows = inputs.rows();
    let k = case.k as usize;
    // Slot → relative position, per table row.
    let inverse: Vec<HashMap<i32, i32>> = match &inputs.table {
        Some(t) => {
            (0..t.rows).map(|i| (0..t.width * t.page_size).map(|p| (t.slot(i, p), p as i32)).collect()).collect()
        }
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
                TopkTransform::Ragged => Some(v - inputs.offsets[b]),
                TopkTransform::Paged | TopkTransform::Pages(_) => inverse[inputs.table_row_of(b)].get(&v).copied(),
            })
            .collect();
        let row_values = &inputs.row_values[b];
        let past_table = inputs.table.as_ref().is_some_and(|t| case.lengths[b] > (t.width * t.page_size) as i32);
        let verdict = if past_table {
            match got.iter().position(|&v| v != -1) {
                None => Ok(()),
                Some(j) => Err(format!("a row past its table must be all -1; entry {j} is {}", got[j])),
            }
        } else if case.deterministic {
            let want: Vec<Option<i32>> = topk_deterministic(row_values, k).into_iter().map(Some).collect();
            if positions == want {
                Ok(())
            } else {
                let j = positions.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                Err(format!("entry {j}: got {:?}, want {:?}", positions[j], want[j]))
            }
        } else {
            check_row(row_values, k, &positions)
        };
        if let Err(e) = verdict {
            mismatches += 1;
            first_mismatch.get_or_insert_with(|| format!("row {b} (n={}): {e}", case.lengths[b]));
        }
    }
    let n_desc = match (case.lengths.iter().min(), case.lengths.iter().max()) {
        (Some(lo), Some(hi)) if lo == hi => format!("n={lo}"),
        (Some(lo), Some(hi)) => format!("n={lo}..{hi}"),
        _ => "n=-".into(),
    };
    Check {
        kernel,
        case: format!(
            "{:?} rows={rows} {n_desc}{}{}",
            case.pattern,
            if case.row_starts { " starts" } else { "" },
            if case.grouped { " grouped" } else { "" }
        ),
        items: rows,
        mismatches,
        first_mismatch,
    }
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
    index_transform_on(rt, k, prefill, seed)
}

/// [`index_transform`] on any [`TopkDevice`].
pub fn index_transform_on(dev: &impl TopkDevice, k: u32, prefill: bool, seed: u64) -> Result<Check> {
    let mut rng = testdata::rng(seed);
    let k = k as usize;
    let (width, table_rows) = (k + 952, 3usize);
    let table = HostPageTable {
        table: (0..table_rows * width).map(|i| (i as i32) * 7 + 1).collect(),
        rows: table_rows,
        width,
        page_size: 1,
        // Rows 0-1 → request 0, 2-3 → 1, request 2 empty.
        cu_seqlens_q: prefill.then(|| vec![0, 2, 4, 4]),
    };
    let rows = if prefill { 5 } else { table_rows };
    let idx: Vec<i32> = (0..rows * k)
        .map(|_| if rng.random_range(0..10) == 0 { -1 } else { rng.random_range(0..width as i32) })
        .collect();
    let got = dev.page_table_transform(k as u32, &idx, &table)?;
    let mut mismatches = 0;
    let mut first_mismatch = None;
    for t in 0..rows {
        let trow = match &table.cu_seqlens_q {
            Some(cu) => cu.windows(2).position(|w| w[0] <= t as i32 && (t as i32) < w[1]),
            None => Some(t),
        };
        let want: Vec<i32> = idx[t * k..][..k]
            .iter()
            .map(|&p| match trow {
                Some(r) if p >= 0 => table.table[r * width + p as usize],
                _ => -1,
            })
            .collect();
        if got[t * k..][..k] != want[..] {
            mismatches += 1;
            first_mismatch.get_or_insert_with(|| format!("row {t}"));
        }
    }
    Ok(Check {
        kernel: KernelSpec::new(KernelFamily::IndexTransform { k: k as u32 }, dev.target()).id(),
        case: format!("{} rows={rows}", if prefill { "prefill" } else { "decode" }),
        items: rows,
        mismatches,
        first_mismatch,
    })
}

/// PAGED over a table of pages whose entry 1 of every row is −1 (no page), on
/// `case`'s path (decode form): each chosen position in that page comes out as the
/// slot −1, the rest as with the whole table. Compared as sets against a run on
/// the whole table, which must itself choose positions in that page.
pub fn page_holes_on(dev: &impl TopkDevice, case: &TopkCase) -> Result<Check> {
    let page_size = case.transform.page_size().unwrap_or(0) as i32;
    assert!(page_size > 1 && !case.grouped, "page_holes_on takes a decode-form table of pages");
    let mut inputs = TopkInputs::new(case);
    let kernel = case_kernel(case, inputs.row_capacity, dev.sm_count());
    let whole = dev.topk(kernel, &inputs)?;
    let t = inputs.table.as_mut().expect("PAGED inputs carry a table");
    let holes: Vec<i32> = (0..t.rows).map(|r| std::mem::replace(&mut t.table[r * t.width + 1], -1)).collect();
    let holed = dev.topk(kernel, &inputs)?;
    let k = case.k as usize;
    let (mut mismatches, mut first_mismatch, mut in_hole) = (0, None, 0);
    for (b, &hole) in holes.iter().enumerate() {
        let mut want: Vec<i32> =
            whole[b * k..][..k].iter().map(|&s| if s >= 0 && s / page_size == hole { -1 } else { s }).collect();
        in_hole += want.iter().zip(&whole[b * k..][..k]).filter(|(w, s)| w != s).count();
        let mut got = holed[b * k..][..k].to_vec();
        want.sort_unstable();
        got.sort_unstable();
        if got != want {
            mismatches += 1;
            first_mismatch.get_or_insert_with(|| format!("row {b} (n={})", case.lengths[b]));
        }
    }
    if in_hole == 0 {
        mismatches += 1;
        first_mismatch.get_or_insert_with(|| "no row chose a position in page 1: the case tests nothing".into());
    }
    Ok(Check {
        kernel: kernel.name(dev.target()),
        case: format!("page 1 missing, {in_hole} chosen positions in it"),
        items: holes.len(),
        mismatches,
        first_mismatch,
    })
}

/// Launches top-k kernel `kernel` on its plan; the split path (chunks of
/// CHECK_SPLIT_CHUNK) needs `ws`.
fn launch_kernel<T: TopkScoreElem>(
    rt: &Runtime,
    kernel: TopkKernel,
    k: u32,
    input: &TopkScores<'_, T>,
    output: &TopkOutput<'_>,
    out: &mut CudaViewMut<'_, i32>,
    ws: Option<&mut topk::TopkWorkspace>,
) -> Result<()> {
    let family = kernel.family;
    let (plan, deterministic) = match family {
        KernelFamily::TopK { layout, deterministic, .. } => (TopkPlan::Single(layout), deterministic),
        KernelFamily::TopkCluster { .. } => (TopkPlan::Cluster { size: kernel.cluster }, false),
        KernelFamily::TopkSplit { .. } => {
            let chunks = input.row_capacity.div_ceil(CHECK_SPLIT_CHUNK);
            (TopkPlan::Split { chunk: CHECK_SPLIT_CHUNK, chunks }, false)
        }
        other => unreachable!("{other:?} is not a top-k family"),
    };
    // The launcher picks the kernel from the inputs: it must be the one asked for.
    let launched = plan.family(k, deterministic, T::SCORE, output.entries());
    if launched != family {
        let expected = format!("{launched:?}, the kernel of these scores and this output");
        return Err(crate::error::invalid("family", format!("{family:?}"), expected));
    }
    topk::topk_with_plan(rt, k, deterministic, plan, input, output, out, ws)
}

/// Rows of `n` scores back to back, from position 0.
fn packed_rows<'a>(scores: &'a CudaView<'a, f32>, n: usize, lengths: &'a CudaView<'a, i32>) -> TopkScores<'a> {
    TopkScores { scores, row_stride: n, row_capacity: n, lengths, row_starts: None }
}

/// Top-k of `rows` rows of `n` Gaussian scores, then the unfused page-table
/// transform of its positions, back to back, `rounds` times on fresh scores. With PDL
/// on ([`Runtime::set_pdl`]) each kernel may start while the one before it runs, so
/// the transform reads the positions only if it waits for the top-k: they start as
/// a sentinel, which it would turn into −1. Checks the positions (set equality) and
/// that every slot is the table's entry for its position.
pub fn topk_then_transform(rt: &Runtime, k: u32, rows: usize, n: usize, rounds: usize, seed: u64) -> Result<Check> {
    let stream = rt.gpu().stream();
    let mut rng = testdata::rng(seed);
    let ku = k as usize;
    // Decode form: table row b serves score row b; slot = 3 · (b · n + position) + 1.
    let table: Vec<i32> = (0..rows * n).map(|i| 3 * i as i32 + 1).collect();
    let d_table = upload(stream, &table)?;
    let d_lengths = upload(stream, &vec![n as i32; rows])?;
    let (table_view, lengths_view) = (d_table.slice(0..), d_lengths.slice(0..rows));
    let pt = PageTable { table: &table_view, rows, stride: n, width: n, page_size: 1, cu_seqlens_q: None };
    let mut mismatches = 0;
    let mut first_mismatch = None;
    for round in 0..rounds {
        let scores: Vec<f32> =
            (0..rows).flat_map(|_| testdata::score_row(ScorePattern::Gaussian, n, &mut rng)).collect();
        let d_scores = upload(stream, &scores)?;
        let mut d_pos = upload(stream, &vec![-7i32; rows * ku])?;
        let mut d_slots = upload(stream, &vec![i32::MIN; rows * ku])?;
        let scores_view = d_scores.slice(0..);
        let input = packed_rows(&scores_view, n, &lengths_view);
        // No copy or synchronisation between the two launches.
        topk::topk(rt, k, false, &input, &TopkOutput::Plain, &mut d_pos.slice_mut(0..rows * ku), None)?;
        topk::page_table_transform(rt, k, &d_pos.slice(0..rows * ku), &pt, &mut d_slots.slice_mut(0..rows * ku))?;
        let pos = download(stream, &d_pos, rows * ku)?;
        let slots = download(stream, &d_slots, rows * ku)?;
        for b in 0..rows {
            let got = &pos[b * ku..][..ku];
            let positions: Vec<Option<i32>> = got.iter().map(|&p| Some(p)).collect();
            let verdict = check_row(&scores[b * n..][..n], ku, &positions).and_then(|()| {
                match got.iter().zip(&slots[b * ku..][..ku]).position(|(&p, &s)| s != table[b * n + p as usize]) {
                    None => Ok(()),
                    Some(j) => {
                        Err(format!("entry {j}: slot {}, want {}", slots[b * ku + j], table[b * n + got[j] as usize]))
                    }
                }
            });
            if let Err(e) = verdict {
                mismatches += 1;
                first_mismatch.get_or_insert_with(|| format!("round {round} row {b}: {e}"));
            }
        }
    }
    let (plan, _) = topk::choose_plan(rows, n, rt.gpu().caps().sm_count, false, false, rt.target().has_clusters());
    Ok(Check {
        kernel: format!("{plan:?} then {}", KernelSpec::new(KernelFamily::IndexTransform { k }, rt.target()).id()),
        case: format!("rows={rows} n={n} rounds={rounds}{}", if rt.pdl() { " pdl" } else { "" }),
        items: rows * rounds,
        mismatches,
        first_mismatch,
    })
}

/// The other direction: the page-table transform writes the lengths a top-k then
/// reads, back to back. The transform gathers `n` for each of `TRANSFORM_ROWS × k`
/// entries over a zeroed buffer, and the top-k takes its lengths from the buffer's
/// last `rows` entries, which the transform's last blocks write: a top-k that does
/// not wait for it under PDL sees zeros and writes rows of −1. Two rounds: the first
/// also compiles the kernels (a launch after a compile follows a finished kernel).
pub fn transform_then_topk(rt: &Runtime, k: u32, rows: usize, n: usize, path: TopkPath, seed: u64) -> Result<Check> {
    const TRANSFORM_ROWS: usize = 2048;
    let stream = rt.gpu().stream();
    let mut rng = testdata::rng(seed);
    let ku = k as usize;
    let entries = TRANSFORM_ROWS * ku;
    assert!(rows <= entries, "the transform writes every row's length");
    // One request: every transform row reads table row 0, whose every slot is n.
    let width = 4096;
    let d_table = upload(stream, &vec![n as i32; width])?;
    let d_cu = upload(stream, &[0, TRANSFORM_ROWS as i32])?;
    let idx: Vec<i32> = (0..entries).map(|_| rng.random_range(0..width as i32)).collect();
    let d_idx = upload(stream, &idx)?;
    let (table_view, cu_view) = (d_table.slice(0..), d_cu.slice(0..2));
    let pt =
        PageTable { table: &table_view, rows: 1, stride: width, width, page_size: 1, cu_seqlens_q: Some(&cu_view) };
    let sm_count = rt.gpu().caps().sm_count;
    let kernel = path_kernel(k, false, path, TopkScore::F32, TopkEntries::Positions, rows, n, sm_count);
    // Made before the transform: its zeroing copy must not sit between the launches.
    let mut ws = if path == TopkPath::Split { Some(topk::TopkWorkspace::new(rt, rows)?) } else { None };
    let mut mismatches = 0;
    let mut first_mismatch = None;
    for round in 0..2 {
        let scores: Vec<f32> =
            (0..rows).flat_map(|_| testdata::score_row(ScorePattern::Gaussian, n, &mut rng)).collect();
        let d_scores = upload(stream, &scores)?;
        let mut d_lengths = upload(stream, &vec![0i32; entries])?;
        let mut d_out = upload(stream, &vec![i32::MIN; rows * ku])?;
        // No copy or synchronisation between the two launches.
        topk::page_table_transform(rt, k, &d_idx.slice(0..entries), &pt, &mut d_lengths.slice_mut(0..entries))?;
        let (scores_view, lengths_view) = (d_scores.slice(0..), d_lengths.slice(entries - rows..entries));
        let input = packed_rows(&scores_view, n, &lengths_view);
        let mut out_view = d_out.slice_mut(0..rows * ku);
        launch_kernel(rt, kernel, k, &input, &TopkOutput::Plain, &mut out_view, ws.as_mut())?;
        let out = download(stream, &d_out, rows * ku)?;
        for b in 0..rows {
            let positions: Vec<Option<i32>> = out[b * ku..][..ku].iter().map(|&p| Some(p)).collect();
            if let Err(e) = check_row(&scores[b * n..][..n], ku, &positions) {
                mismatches += 1;
                first_mismatch.get_or_insert_with(|| format!("round {round} row {b}: {e}"));
            }
        }
    }
    let transform = KernelSpec::new(KernelFamily::IndexTransform { k }, rt.target()).id();
    Ok(Check {
        kernel: format!("{transform} then {}", kernel.name(rt.target())),
        case: format!("rows={rows} n={n}{}", if rt.pdl() { " pdl" } else { "" }),
        items: 2 * rows,
        mismatches,
        first_mismatch,
    })
}
