//! Launchers of exact top-k (fused PAGED / RAGGED / plain) and the unfused
//! page-table transform (spec §7).

use super::{check_count_fits_i32, invalid};
use crate::runtime::Runtime;
use crate::Result;
use cudarc::driver::CudaSlice;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr};
use half::bf16;
use nsa_kernels::spec::TOPK_CLUSTER_SIZES;
use nsa_kernels::spec::TOPK_PAGE_SIZES;
use nsa_kernels::{KernelFamily, KernelSpec, Target, TopkEntries, TopkLayout, TopkScore};

/// A score type top-k reads: f32 or bf16 (exact either way: a bf16's f32 value is
/// exact, so the choice is that of the widened scores).
pub trait TopkScoreElem: DeviceRepr + Copy + Default + std::fmt::Debug {
    const SCORE: TopkScore;
}
impl TopkScoreElem for f32 {
    const SCORE: TopkScore = TopkScore::F32;
}
impl TopkScoreElem for bf16 {
    const SCORE: TopkScore = TopkScore::Bf16;
}

/// Scores (f32, or bf16 with `T = bf16`) and per-row extents: row b's candidates
/// are `scores[b * row_stride + row_starts[b] ..][.. lengths[b]]`.
#[derive(Debug)]
pub struct TopkScores<'a, T = f32> {
    pub scores: &'a CudaView<'a, T>,
    /// Elements between rows; 0 lets every row read the same scores.
    pub row_stride: usize,
    /// Readable elements per row; `row_starts[b] + lengths[b]` beyond it rejects row b.
    pub row_capacity: usize,
    pub lengths: &'a CudaView<'a, i32>,
    /// `None`: every row starts at 0.
    pub row_starts: Option<&'a CudaView<'a, i32>>,
}

/// A page table `[rows, stride]` of which the first `width` columns are valid.
#[derive(Debug)]
pub struct PageTable<'a> {
    pub table: &'a CudaView<'a, i32>,
    pub rows: usize,
    pub stride: usize,
    pub width: usize,
    /// Positions per entry. 1: a `page_table_1` (spec §2.1), whose entries are
    /// slots. P > 1 (fused top-k only): a table of pages (spec §2.2, the
    /// `real_page_table` at the cache's page size), and position p's slot is
    /// `table[p / P] · P + p % P`, the slot of the page_table_1 it expands to, read
    /// from a table P times smaller; an entry < 0 (no page) gives −1, as its
    /// page_table_1 entries would. Slots are i32: every `entry · P + P − 1` must fit.
    /// Rows of more than `width · page_size` keys are rejected. The page size is a
    /// launch parameter: one kernel serves every page size.
    pub page_size: usize,
    /// `Some(cu)` (`rows + 1` entries): score/token row b uses table row i with
    /// `cu[i] <= b < cu[i+1]` (prefill). `None`: row b uses table row b (decode).
    pub cu_seqlens_q: Option<&'a CudaView<'a, i32>>,
}

/// What top-k writes for each chosen position.
#[derive(Debug)]
pub enum TopkOutput<'a> {
    /// Relative positions.
    Plain,
    /// Physical slots from the page table (spec §7.3).
    Paged(PageTable<'a>),
    /// Positions plus `offsets[b]` (spec §7.4).
    Ragged { offsets: &'a CudaView<'a, i32> },
}

impl TopkOutput<'_> {
    /// What this output's entries are (one of [`TopkEntries::CALLS`]); each plan
    /// maps it to the kind its kernel compiles ([`TopkPlan::family`]).
    pub fn entries(&self) -> TopkEntries {
        match self {
            TopkOutput::Plain | TopkOutput::Ragged { .. } => TopkEntries::Positions,
            TopkOutput::Paged(t) if t.page_size == 1 => TopkEntries::Table1,
            TopkOutput::Paged(_) => TopkEntries::Pages,
        }
    }
}

/// Mirrors `nsa::topk::Params` (topk.cuh) field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct TopkParams {
    scores: u64,
    lengths: u64,
    row_starts: u64,
    page_table: u64,
    cu_seqlens_q: u64,
    offsets: u64,
    out: u64,
    row_stride: i64,
    table_stride: i64,
    rows: i32,
    row_capacity: i32,
    table_rows: i32,
    table_width: i32,
    page_size: i32,
    page_shift: i32,
    page_magic: u64,
}
// SAFETY: plain old data with the C layout the kernel declares.
unsafe impl DeviceRepr for TopkParams {}

/// `(magic, shift)` with `pos / page_size == (pos * magic) >> shift` for every
/// `pos < 2^31` (page_size >= 2: magic = ⌊2^(31 + l) / page_size⌋ + 1, l = ⌈log2
/// page_size⌉; magic ≤ 2^32, so the product fits 64 bits): the kernels' division by
/// a table of pages' run-time page size. `(0, 0)` for 0 and 1 (nothing to divide).
pub fn page_divisor(page_size: u32) -> (u64, i32) {
    if page_size < 2 {
        return (0, 0);
    }
    let l = u32::BITS - (page_size - 1).leading_zeros();
    let shift = 31 + l;
    ((1u64 << shift) / page_size as u64 + 1, shift as i32)
}

/// Mirrors `nsa::topk::Split` (topk.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SplitParams {
    state: u64,
    cand_idx: u64,
    cand_key: u64,
    chunk: i32,
    chunks: i32,
    cand_cap: i32,
    _pad: i32,
}
// SAFETY: as above.
unsafe impl DeviceRepr for SplitParams {}

/// State words per row of the split path (`kStateWords` in topk.cuh).
const SPLIT_STATE_WORDS: usize = 2;

/// Device scratch of the split top-k path for up to `rows` rows. Allocated zeroed
/// once; every call leaves it zero again, so calls need no memset and can be
/// captured in a CUDA graph.
#[derive(Debug)]
pub struct TopkWorkspace {
    rows: usize,
    state: CudaSlice<u32>,
    cand_idx: CudaSlice<u32>,
    cand_key: CudaSlice<u32>,
}

impl TopkWorkspace {
    /// Bytes a workspace for `rows` rows takes on `target`: (2 + 2 × list) × 4 per
    /// row (list: 8192 keys on NVIDIA, 2048 on gfx942).
    pub fn bytes_for(rows: usize, target: Target) -> usize {
        rows * 4 * (SPLIT_STATE_WORDS + 2 * split_list(target))
    }

    pub fn new(rt: &Runtime, rows: usize) -> Result<Self> {
        let stream = rt.gpu().stream();
        let cap = split_list(rt.target());
        let alloc = |n: usize| {
            stream.alloc_zeros::<u32>(n.max(1)).map_err(crate::Error::driver("allocating the top-k workspace"))
        };
        Ok(TopkWorkspace {
            rows,
            state: alloc(rows * SPLIT_STATE_WORDS)?,
            cand_idx: alloc(rows * cap)?,
            cand_key: alloc(rows * cap)?,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// Keys per row of the split path's list on `target`.
fn split_list(target: Target) -> usize {
    let split = KernelFamily::TopkSplit { k: 1, score: TopkScore::F32, entries: TopkEntries::Positions };
    KernelSpec::new(split, target).topk_split_list() as usize
}

/// Whether the split path's list on `target` can take what the sample filter keeps
/// from rows of up to `row_capacity` keys for top-`k`: the whole row, or an expected
/// count within 3/4 of the list (the rule the one-block filter declines by; topk.cuh
/// `Sample::expected_kept`). Otherwise nearly every long row overflows the list and
/// its last block runs the histogram path over it alone, after the other blocks'
/// passes: slower than one block per row (gfx942 at k = 2048: a 2048-key list).
pub fn split_list_suffices(target: Target, k: u32, row_capacity: usize) -> bool {
    let list = split_list(target);
    row_capacity <= list || sample_expected_kept(list, k as usize, row_capacity) <= list * 3 / 4
}

/// Keys the sample filter with a `list`-key list is expected to keep from an n-key
/// row (n > list): mirrors `Sample<kCap>::expected_kept<K>` in topk.cuh (a test
/// pins the two together on the CPU emulator's build of the header).
pub fn sample_expected_kept(list: usize, k: usize, n: usize) -> usize {
    const RUN: usize = 8;
    let runs_max = list.min(8192) / RUN;
    let sectors = if runs_max < 2 { runs_max } else { 1 << runs_max.ilog2() };
    let expected = (sectors * k).div_ceil(n);
    let sqrt = expected.isqrt() + usize::from(expected.isqrt().pow(2) < expected);
    let runs = (expected + 4 * sqrt + 4).min(sectors);
    runs * n / sectors
}

/// How one top-k call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopkPlan {
    /// One block per row.
    Single(TopkLayout),
    /// Few long rows: each row spread over `chunks` blocks of `chunk` scores, one launch.
    Split { chunk: usize, chunks: usize },
    /// Few long rows: each row over a cluster of `size` CTAs (sm_90+), one launch;
    /// one kernel serves every size (a launch attribute).
    Cluster { size: u32 },
}

impl TopkPlan {
    /// The kernel this plan launches for top-`k` of `score`s writing `entries`
    /// (`deterministic` applies to one block per row only). The plans of many rows
    /// (throughput layout, split) serve both PAGED forms from one kernel
    /// ([`TopkEntries::merged`]); the others have a kernel per form.
    pub fn family(self, k: u32, deterministic: bool, score: TopkScore, entries: TopkEntries) -> KernelFamily {
        match self {
            TopkPlan::Single(layout) => {
                KernelFamily::TopK { k, deterministic, layout, score, entries: layout.entries(entries) }
            }
            TopkPlan::Split { .. } => KernelFamily::TopkSplit { k, score, entries: entries.merged() },
            TopkPlan::Cluster { .. } => KernelFamily::TopkCluster { k, score, entries },
        }
    }
}

/// Cluster size for `rows` rows on `sm_count` SMs: the largest whose clusters all
/// run at once (one CTA per SM), at least the smallest.
pub fn cluster_size(rows: usize, sm_count: u32) -> u32 {
    let at_once = |c: u32| rows * c as usize <= sm_count as usize;
    TOPK_CLUSTER_SIZES.into_iter().rev().find(|&c| at_once(c)).unwrap_or(TOPK_CLUSTER_SIZES[0])
}

/// The plan for `rows` rows of up to `row_capacity` scores on `sm_count` SMs, and
/// why. Pure, so a server can log it and tests can pin it. The cluster path needs a
/// target with thread-block `clusters`, the split path a [`TopkWorkspace`]; both are
/// unordered, so deterministic calls never take them.
pub fn choose_plan(
    rows: usize,
    row_capacity: usize,
    sm_count: u32,
    deterministic: bool,
    workspace: bool,
    clusters: bool,
) -> (TopkPlan, &'static str) {
    // Clusters, measured on an H100 (2026-12-07, f32 scores, k 2048, µs): they pay
    // only for long rows and few of them: 1 × 64K cluster of 8 14.8 against 15.5 in
    // one block, 4 × 64K 14.6 against 15.2, 4 × 128K 15.1 against 18.8; but 1 × 32K
    // 14.1 against 13.1, 16 × 64K 25.8 against 15.7, 16 × 128K 25.9 against 19.4.
    let sms = sm_count as usize;
    let spread = |sms_per_row: usize, min_row: usize| {
        !deterministic && rows > 0 && sms_per_row * rows <= sms && row_capacity >= min_row
    };
    if clusters && spread(CLUSTER_SMS_PER_ROW, CLUSTER_MIN_ROW) {
        let size = cluster_size(rows, sm_count);
        return (TopkPlan::Cluster { size }, "few long rows: each row over a cluster of CTAs, one launch");
    }
    // Rows past the one-block filter's reach fall back to its histogram path (several
    // passes over the row); a cluster's joined list still takes them. Measured on an
    // H100 (2026-12-06), 64 × 512K at k 2048: clusters of 2 88.7 µs, one block per
    // row 180.3 µs. Only while every cluster of 2 runs at once.
    if clusters && !deterministic && rows > 0 && row_capacity > ONE_BLOCK_FILTER_MAX_ROW && 2 * rows <= sms {
        let size = cluster_size(rows, sm_count);
        return (TopkPlan::Cluster { size }, "rows too long for one block's filter: each row over a cluster of CTAs");
    }
    // The split path serves targets without clusters; its bounds were measured on an
    // H200 (December 2026): 1 × 128K split 16.6 µs against 18.7 in one block, 64 ×
    // 128K 29.2 against 20.1.
    if !clusters && workspace && spread(SPLIT_SMS_PER_ROW, SPLIT_MIN_ROW) {
        return (
            split_plan(rows, row_capacity, sm_count),
            "few long rows: each row spread over many blocks, one launch",
        );
    }
    let (layout, why) = choose_layout(rows, row_capacity, sm_count);
    (TopkPlan::Single(layout), why)
}

/// The split path's chunking for `rows` rows: split blocks are half size, two per
/// SM, and each row gets its share of them (at least one), in chunks of at least
/// SPLIT_MIN_CHUNK keys.
pub fn split_plan(rows: usize, row_capacity: usize, sm_count: u32) -> TopkPlan {
    let blocks_per_row = (2 * sm_count as usize / rows.max(1)).max(1);
    let chunk = row_capacity.div_ceil(blocks_per_row).next_multiple_of(1024).max(SPLIT_MIN_CHUNK);
    let chunks = row_capacity.div_ceil(chunk);
    TopkPlan::Split { chunk, chunks }
}

/// Rows longer than this are past the one-block (latency) kernel's sample filter at
/// k 2048 (`sample_expected_kept` over its 8192-key list above 3/4 of it; a test pins
/// it): they run its histogram path.
pub const ONE_BLOCK_FILTER_MAX_ROW: usize = 262_144;

/// Rows shorter than this stay in one block rather than spread over a cluster (its
/// per-CTA phases would cost more than the row).
pub const CLUSTER_MIN_ROW: usize = 49_152;
/// Rows take clusters only while the GPU has this many SMs per row (4 rows on an H100).
pub const CLUSTER_SMS_PER_ROW: usize = 32;
/// Rows shorter than this stay in one block rather than split over blocks (targets
/// without clusters).
pub const SPLIT_MIN_ROW: usize = 16_384;
/// Rows are split over blocks only while the GPU has this many SMs per row.
pub const SPLIT_SMS_PER_ROW: usize = 8;
/// Batches of at most SHORT_ROW_MAX_ROWS rows of at most SHORT_ROW_MAX keys run in
/// 512-thread (throughput) blocks: measured faster there (H100, 2026-12-07, µs: 1 ×
/// 16K 9.8 against 11.6 in a 1024-thread block, 16 × 16K 10.7 against 12.6, 1 × 24K
/// 12.3 against 12.9; at 32K the 1024-thread block leads, 13.1 against 13.3). In the
/// layer (indexer logits, PDL) the top-k of 32 and 128 such rows took 31.5 and 30.5
/// µs in them against 18.1 and 20.3 in 1024-thread blocks, so larger batches keep those.
pub const SHORT_ROW_MAX: usize = 24_576;
/// See SHORT_ROW_MAX.
pub const SHORT_ROW_MAX_ROWS: usize = 16;
/// Keys per split block at least: below this the per-block sample dominates.
pub const SPLIT_MIN_CHUNK: usize = 1024;

/// Mirrors `nsa::index_transform::Params` (index_transform.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct TransformParams {
    idx: u64,
    page_table: u64,
    cu_seqlens_q: u64,
    out: u64,
    table_stride: i64,
    rows: i32,
    table_rows: i32,
    table_width: i32,
}
// SAFETY: as above.
unsafe impl DeviceRepr for TransformParams {}

const ROW_EXPECTED: &str =
    "row_starts[b] + lengths[b] <= row_capacity, lengths[b] <= the page-table width × page size (PAGED), \
     and b covered by cu_seqlens_q (PAGED prefill); the row was written as all -1";

/// `rows` rows of `width` elements, `stride` apart, fit in `len` elements.
fn check_rows_fit(field: &'static str, len: usize, rows: usize, stride: usize, width: usize) -> Result<()> {
    let need = if rows == 0 { 0 } else { (rows - 1) * stride + width };
    if len < need {
        return Err(invalid(
            field,
            format!("{len} elements"),
            format!("at least {need} for {rows} rows of {width} with stride {stride}"),
        ));
    }
    Ok(())
}

fn check_page_table(t: &PageTable<'_>) -> Result<()> {
    let page_size_ok = t.page_size == 1 || u32::try_from(t.page_size).is_ok_and(|p| TOPK_PAGE_SIZES.contains(&p));
    if !page_size_ok {
        return Err(invalid(
            "page_table.page_size",
            t.page_size.to_string(),
            format!(
                "1 (a page_table_1 of slots) or the KV cache's page size, {} to {} (a table of page ids)",
                TOPK_PAGE_SIZES.start(),
                TOPK_PAGE_SIZES.end()
            ),
        ));
    }
    if t.width > t.stride {
        return Err(invalid("page_table.width", t.width.to_string(), format!("at most the stride {}", t.stride)));
    }
    check_rows_fit("page_table", t.table.len(), t.rows, t.stride, t.width)?;
    if let Some(cu) = t.cu_seqlens_q {
        if cu.len() != t.rows + 1 {
            return Err(invalid(
                "cu_seqlens_q",
                format!("length {}", cu.len()),
                format!("page_table.rows + 1 = {}", t.rows + 1),
            ));
        }
    }
    check_count_fits_i32("page_table.rows", t.rows)?;
    check_count_fits_i32("page_table.width", t.width)?;
    Ok(())
}

/// The top-k layout for a batch of `rows` rows of up to `row_capacity` keys on a GPU
/// with `sm_count` SMs, and why. One 1024-thread block per row caches the row in
/// shared memory but takes a whole SM; with at least two rows per SM, 512-thread
/// blocks (two per SM) keep HBM busier, and a few rows of up to SHORT_ROW_MAX keys
/// finish sooner in them. Pure, so a server can log it and tests can pin it.
pub fn choose_layout(rows: usize, row_capacity: usize, sm_count: u32) -> (TopkLayout, &'static str) {
    if rows >= 2 * sm_count as usize {
        (TopkLayout::Throughput, "at least two rows per SM: two 512-thread blocks share each SM")
    } else if rows <= SHORT_ROW_MAX_ROWS && row_capacity <= SHORT_ROW_MAX {
        (TopkLayout::Throughput, "a few short rows: one 512-thread block per row (measured faster than 1024 threads)")
    } else {
        (TopkLayout::Latency, "fewer than two rows per SM: one 1024-thread block per row, row cached in shared memory")
    }
}

/// Exact top-`k` of every row into `out` (`[rows, k]`, −1 padded, valid entries
/// first). `deterministic`: ties go to the lowest positions and each row is sorted.
/// The plan follows [`choose_plan`]: few long rows go over thread-block clusters
/// where the target has them, otherwise over the split path, which is only taken
/// with a `workspace` large enough for the batch and a split list that can take the
/// rows' filtered keys ([`split_list_suffices`]).
pub fn topk<T: TopkScoreElem>(
    rt: &Runtime,
    k: u32,
    deterministic: bool,
    scores: &TopkScores<'_, T>,
    output: &TopkOutput<'_>,
    out: &mut CudaViewMut<'_, i32>,
    workspace: Option<&mut TopkWorkspace>,
) -> Result<()> {
    let rows = scores.lengths.len();
    let fits =
        workspace.as_ref().is_some_and(|w| rows <= w.rows) && split_list_suffices(rt.target(), k, scores.row_capacity);
    let sms = rt.gpu().caps().sm_count;
    let clusters = rt.target().has_clusters();
    let (plan, _) = choose_plan(rows, scores.row_capacity, sms, deterministic, fits, clusters);
    topk_with_plan(rt, k, deterministic, plan, scores, output, out, workspace)
}

/// [`topk`] on the plan the caller chose (benchmarks, tests). The split and cluster
/// plans are unordered: `deterministic` takes one block per row; the split plan
/// needs a `workspace`.
#[allow(clippy::too_many_arguments)]
pub fn topk_with_plan<T: TopkScoreElem>(
    rt: &Runtime,
    k: u32,
    deterministic: bool,
    plan: TopkPlan,
    scores: &TopkScores<'_, T>,
    output: &TopkOutput<'_>,
    out: &mut CudaViewMut<'_, i32>,
    workspace: Option<&mut TopkWorkspace>,
) -> Result<()> {
    check_plan(deterministic, plan, workspace.is_some())?;
    match (plan, workspace) {
        (TopkPlan::Cluster { size }, _) => topk_cluster(rt, k, size, scores, output, out),
        (TopkPlan::Split { chunk, chunks }, Some(ws)) => topk_split(rt, k, chunk, chunks, scores, output, out, ws),
        (TopkPlan::Single(layout), _) => topk_with_layout(rt, k, deterministic, layout, scores, output, out),
        (TopkPlan::Split { .. }, None) => unreachable!("check_plan: the split plan has a workspace"),
    }
}

/// What [`topk_with_plan`] rejects before any launch: a deterministic call on an
/// unordered plan, and the split plan without a workspace.
fn check_plan(deterministic: bool, plan: TopkPlan, workspace: bool) -> Result<()> {
    if deterministic && !matches!(plan, TopkPlan::Single(_)) {
        return Err(invalid(
            "plan",
            format!("{plan:?}"),
            "TopkPlan::Single for deterministic top-k (the split and cluster plans are unordered)",
        ));
    }
    if matches!(plan, TopkPlan::Split { .. }) && !workspace {
        return Err(invalid("workspace", "None", "a TopkWorkspace for the split plan (TopkWorkspace::new)"));
    }
    Ok(())
}

/// [`topk`] with the layout chosen by the caller (benchmarks, tests).
pub fn topk_with_layout<T: TopkScoreElem>(
    rt: &Runtime,
    k: u32,
    deterministic: bool,
    layout: TopkLayout,
    scores: &TopkScores<'_, T>,
    output: &TopkOutput<'_>,
    out: &mut CudaViewMut<'_, i32>,
) -> Result<()> {
    let family = TopkPlan::Single(layout).family(k, deterministic, T::SCORE, output.entries());
    launch_one(rt, k, family, 1, scores, output, out)
}

/// Checks the arguments and launches `family`, one kernel with `blocks_per_row`
/// blocks for each row.
fn launch_one<T: TopkScoreElem>(
    rt: &Runtime,
    k: u32,
    family: KernelFamily,
    cluster: u32,
    scores: &TopkScores<'_, T>,
    output: &TopkOutput<'_>,
    out: &mut CudaViewMut<'_, i32>,
) -> Result<()> {
    let rows = check_topk_args(k, scores, output, out)?;
    if rows == 0 {
        return Ok(());
    }
    let kernel = rt.kernel(family)?;
    with_params(rt, scores, output, out, |params| {
        let params = {
            let mut a = rt.args();
            a.arg(&params);
            a
        };
        rt.launch_clustered(&kernel, params, rows * cluster as usize, cluster, "lengths", ROW_EXPECTED)
    })
}

/// Each row over a cluster of `cluster` CTAs (one of `TOPK_CLUSTER_SIZES`; sm_90+),
/// unordered like the split path.
pub fn topk_cluster<T: TopkScoreElem>(
    rt: &Runtime,
    k: u32,
    cluster: u32,
    scores: &TopkScores<'_, T>,
    output: &TopkOutput<'_>,
    out: &mut CudaViewMut<'_, i32>,
) -> Result<()> {
    if !TOPK_CLUSTER_SIZES.contains(&cluster) {
        return Err(invalid("cluster", cluster.to_string(), format!("one of {TOPK_CLUSTER_SIZES:?}")));
    }
    if !rt.target().has_clusters() {
        return Err(invalid(
            "target",
            rt.target().to_string(),
            "an NVIDIA target (thread-block clusters need sm_90+); use topk_with_layout",
        ));
    }
    let family = TopkPlan::Cluster { size: cluster }.family(k, false, T::SCORE, output.entries());
    launch_one(rt, k, family, cluster, scores, output, out)
}

/// The split path: each row over `chunks` blocks of `chunk` scores, one launch.
#[allow(clippy::too_many_arguments)]
pub fn topk_split<T: TopkScoreElem>(
    rt: &Runtime,
    k: u32,
    chunk: usize,
    chunks: usize,
    scores: &TopkScores<'_, T>,
    output: &TopkOutput<'_>,
    out: &mut CudaViewMut<'_, i32>,
    workspace: &mut TopkWorkspace,
) -> Result<()> {
    let rows = check_topk_args(k, scores, output, out)?;
    if rows > workspace.rows {
        return Err(invalid(
            "workspace",
            format!("{} rows", workspace.rows),
            format!("at least {rows} rows (TopkWorkspace::new)"),
        ));
    }
    if chunk == 0 || chunks == 0 || chunk * chunks < scores.row_capacity {
        return Err(invalid(
            "chunk",
            format!("{chunk} × {chunks}"),
            format!("chunks covering row_capacity {}", scores.row_capacity),
        ));
    }
    if rows == 0 {
        return Ok(());
    }
    let kernel = rt.kernel(TopkPlan::Split { chunk, chunks }.family(k, false, T::SCORE, output.entries()))?;
    let stream = rt.gpu().stream();
    let (st, _s1) = workspace.state.device_ptr_mut(stream);
    let (ci, _s2) = workspace.cand_idx.device_ptr_mut(stream);
    let (ck, _s3) = workspace.cand_key.device_ptr_mut(stream);
    let split = SplitParams {
        state: st,
        cand_idx: ci,
        cand_key: ck,
        chunk: check_count_fits_i32("chunk", chunk)?,
        chunks: check_count_fits_i32("chunks", chunks)?,
        cand_cap: split_list(rt.target()) as i32,
        _pad: 0,
    };
    with_params(rt, scores, output, out, |params| {
        let params = {
            let mut a = rt.args();
            a.arg(&params).arg(&split);
            a
        };
        rt.launch(&kernel, params, rows * chunks, "lengths", ROW_EXPECTED)
    })
}

/// Host checks shared by every top-k entry point; returns the row count.
fn check_topk_args<T: TopkScoreElem>(
    k: u32,
    scores: &TopkScores<'_, T>,
    output: &TopkOutput<'_>,
    out: &CudaViewMut<'_, i32>,
) -> Result<usize> {
    let rows = scores.lengths.len();
    if k == 0 {
        return Err(invalid("k", "0", "at least 1"));
    }
    if out.len() != rows * k as usize {
        return Err(invalid("out", format!("length {}", out.len()), format!("rows × k = {rows} × {k}")));
    }
    // Stride 0 shares one row among all (read-only, so overlap is harmless).
    if scores.row_stride != 0 && scores.row_capacity > scores.row_stride && rows > 1 {
        return Err(invalid(
            "row_capacity",
            scores.row_capacity.to_string(),
            format!("at most row_stride {} (or a row stride of 0: every row reads the same scores)", scores.row_stride),
        ));
    }
    check_rows_fit("scores", scores.scores.len(), rows, scores.row_stride, scores.row_capacity)?;
    if let Some(s) = scores.row_starts {
        if s.len() != rows {
            return Err(invalid("row_starts", format!("length {}", s.len()), format!("one per row ({rows})")));
        }
    }
    match output {
        TopkOutput::Paged(t) => check_page_table(t)?,
        TopkOutput::Ragged { offsets } if offsets.len() != rows => {
            return Err(invalid("offsets", format!("length {}", offsets.len()), format!("one per row ({rows})")));
        }
        _ => {}
    }
    check_count_fits_i32("lengths", rows)?;
    check_count_fits_i32("row_capacity", scores.row_capacity)?;
    Ok(rows)
}

/// Builds the kernel parameters (holding the device-pointer guards for the launch)
/// and runs `launch` with them.
fn with_params<T: TopkScoreElem>(
    rt: &Runtime,
    scores: &TopkScores<'_, T>,
    output: &TopkOutput<'_>,
    out: &mut CudaViewMut<'_, i32>,
    launch: impl FnOnce(TopkParams) -> Result<()>,
) -> Result<()> {
    let rows = scores.lengths.len();
    let (table_stride, table_rows, table_width, page_size) = match output {
        TopkOutput::Paged(t) => (t.stride as i64, t.rows as i32, t.width as i32, t.page_size as i32),
        _ => (0, 0, 0, 0),
    };
    let (page_magic, page_shift) = page_divisor(page_size as u32);
    let stream = rt.gpu().stream();
    let (scores_ptr, _s1) = scores.scores.device_ptr(stream);
    let (lengths_ptr, _s2) = scores.lengths.device_ptr(stream);
    let (starts_ptr, _s3) = match scores.row_starts {
        Some(v) => {
            let (p, s) = v.device_ptr(stream);
            (p, Some(s))
        }
        None => (0, None),
    };
    let (table_ptr, cu_ptr, offsets_ptr, _s4) = match output {
        TopkOutput::Paged(t) => {
            let (tp, s) = t.table.device_ptr(stream);
            let cu = t.cu_seqlens_q.map(|c| c.device_ptr(stream));
            (tp, cu.as_ref().map_or(0, |c| c.0), 0, Some((s, cu.map(|c| c.1))))
        }
        TopkOutput::Ragged { offsets } => {
            let (op, s) = offsets.device_ptr(stream);
            (0, 0, op, Some((s, None)))
        }
        TopkOutput::Plain => (0, 0, 0, None),
    };
    let (out_ptr, _s5) = out.device_ptr_mut(stream);
    let params = TopkParams {
        scores: scores_ptr,
        lengths: lengths_ptr,
        row_starts: starts_ptr,
        page_table: table_ptr,
        cu_seqlens_q: cu_ptr,
        offsets: offsets_ptr,
        out: out_ptr,
        row_stride: scores.row_stride as i64,
        table_stride,
        rows: rows as i32,
        row_capacity: scores.row_capacity as i32,
        table_rows,
        table_width,
        page_size,
        page_shift,
        page_magic,
    };
    launch(params)
}

/// Unfused transform (spec §7.7): `out[t, j] = table[row(t), idx[t, j]]` for
/// `idx >= 0`, else −1; `idx` and `out` are `[rows, k]`. Positions at or past the
/// table width are rejected (written as −1).
pub fn page_table_transform(
    rt: &Runtime,
    k: u32,
    idx: &CudaView<'_, i32>,
    table: &PageTable<'_>,
    out: &mut CudaViewMut<'_, i32>,
) -> Result<()> {
    if k == 0 || idx.len() % k as usize != 0 {
        return Err(invalid("idx", format!("length {}", idx.len()), format!("a multiple of k = {k}")));
    }
    if out.len() != idx.len() {
        return Err(invalid("out", format!("length {}", out.len()), format!("the length of idx ({})", idx.len())));
    }
    check_page_table(table)?;
    if table.page_size != 1 {
        return Err(invalid(
            "page_table.page_size",
            table.page_size.to_string(),
            "1: the unfused transform reads a page_table_1 (spec §7.7); pass a table of pages to the fused PAGED top-k",
        ));
    }
    let rows = idx.len() / k as usize;
    let num_rows = check_count_fits_i32("idx rows", rows)?;
    if rows == 0 {
        return Ok(());
    }
    let kernel = rt.kernel(KernelFamily::IndexTransform { k })?;
    let stream = rt.gpu().stream();
    let (idx_ptr, _s1) = idx.device_ptr(stream);
    let (table_ptr, _s2) = table.table.device_ptr(stream);
    let cu = table.cu_seqlens_q.map(|c| c.device_ptr(stream));
    let (out_ptr, _s3) = out.device_ptr_mut(stream);
    let params = TransformParams {
        idx: idx_ptr,
        page_table: table_ptr,
        cu_seqlens_q: cu.as_ref().map_or(0, |c| c.0),
        out: out_ptr,
        table_stride: table.stride as i64,
        rows: num_rows,
        table_rows: table.rows as i32,
        table_width: table.width as i32,
    };
    let params = {
        let mut a = rt.args();
        a.arg(&params);
        a
    };
    rt.launch(&kernel, params, rows * k as usize, "idx", "a position below the page-table width; written as -1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_list_rule() {
        // The kernels' arithmetic (Sample<kCap>): 8192-key list, k = 2048, n = 131072:
        // 1024 runs, 16 expected, 36 taken, 4608 keys kept of 6144 allowed.
        assert_eq!(sample_expected_kept(8192, 2048, 131_072), 4608);
        assert!(split_list_suffices(Target::Sm90a, 2048, 131_072));
        assert!(!split_list_suffices(Target::Sm90a, 2048, 1 << 20), "14336 expected, over 6144");
        // gfx942's 2048-key list: 256 runs, 16 taken at n = 131072, 8192 kept.
        assert_eq!(sample_expected_kept(2048, 2048, 131_072), 8192);
        assert!(!split_list_suffices(Target::Gfx942, 2048, 131_072));
        assert!(!split_list_suffices(Target::Gfx942, 512, 131_072));
        assert!(split_list_suffices(Target::Gfx942, 512, 16_384), "1536 expected, at the bound");
        assert!(split_list_suffices(Target::Gfx942, 2048, 2048), "the whole row fits");
    }

    #[test]
    fn page_divisor_divides_every_position() {
        use rand::Rng;
        let mut rng = crate::testdata::rng(7);
        let random: Vec<u32> = (0..500).map(|_| rng.random_range(2..=65_536)).collect();
        let sizes = (2..=4096u32).chain([4097, 32_767, 32_768, 65_535, 65_536]).chain(random);
        for p in sizes {
            let (magic, shift) = page_divisor(p);
            let edges = [0u32, 1, p - 1, p, p + 1, i32::MAX as u32, i32::MAX as u32 - p, i32::MAX as u32 - 1];
            for pos in edges.into_iter().chain((0..64).map(|_| rng.random_range(0..=i32::MAX as u32))) {
                assert_eq!(((pos as u64 * magic) >> shift) as u32, pos / p, "page size {p}, position {pos}");
            }
        }
        assert_eq!(page_divisor(1), (0, 0));
    }

    #[test]
    fn each_plan_launches_its_own_family_with_every_knob() {
        let (k, s, e) = (1024, TopkScore::Bf16, TopkEntries::Pages);
        let slots = TopkEntries::Slots;
        let single = TopkPlan::Single(TopkLayout::Throughput).family(k, true, s, e);
        let layout = TopkLayout::Throughput;
        assert_eq!(single, KernelFamily::TopK { k, deterministic: true, layout, score: s, entries: slots });
        let layout = TopkLayout::Latency;
        let single = TopkPlan::Single(layout).family(k, true, s, TopkEntries::Table1);
        assert_eq!(
            single,
            KernelFamily::TopK { k, deterministic: true, layout, score: s, entries: TopkEntries::Table1 }
        );
        let split = TopkPlan::Split { chunk: 4096, chunks: 3 }.family(k, false, s, TopkEntries::Positions);
        assert_eq!(split, KernelFamily::TopkSplit { k, score: s, entries: TopkEntries::Positions });
        let split = TopkPlan::Split { chunk: 4096, chunks: 3 }.family(k, false, s, TopkEntries::Table1);
        assert_eq!(split, KernelFamily::TopkSplit { k, score: s, entries: slots });
        let cluster = TopkPlan::Cluster { size: 4 }.family(k, false, TopkScore::F32, e);
        assert_eq!(cluster, KernelFamily::TopkCluster { k, score: TopkScore::F32, entries: e });
    }

    #[test]
    fn plans_a_call_cannot_run_are_errors() {
        let split = TopkPlan::Split { chunk: 1024, chunks: 2 };
        let err = check_plan(true, TopkPlan::Cluster { size: 8 }, false).unwrap_err().to_string();
        assert!(err.contains("`plan`") && err.contains("deterministic"), "{err}");
        assert!(check_plan(true, split, true).is_err());
        let err = check_plan(false, split, false).unwrap_err().to_string();
        assert!(err.contains("`workspace`") && err.contains("TopkWorkspace::new"), "{err}");
        assert!(check_plan(true, TopkPlan::Single(TopkLayout::Latency), false).is_ok());
        assert!(check_plan(false, split, true).is_ok());
        assert!(check_plan(false, TopkPlan::Cluster { size: 2 }, false).is_ok());
    }

    #[test]
    fn plan_table() {
        let split = |rows, cap| matches!(choose_plan(rows, cap, 132, false, true, false).0, TopkPlan::Split { .. });
        assert!(split(1, 131_072));
        assert!(split(16, 131_072));
        assert!(!split(17, 131_072), "64-row batches measured faster unsplit");
        assert!(!split(1, 8192), "short rows stay in one block");
        assert_eq!(choose_plan(16, 131_072, 132, false, true, false).0, TopkPlan::Split { chunk: 8192, chunks: 16 });
        assert_eq!(choose_plan(1, 131_072, 132, false, true, false).0, TopkPlan::Split { chunk: 1024, chunks: 128 });
        assert!(!matches!(choose_plan(1, 131_072, 132, true, true, false).0, TopkPlan::Split { .. }), "deterministic");
        assert!(!matches!(choose_plan(1, 131_072, 132, false, false, false).0, TopkPlan::Split { .. }), "no workspace");
        match choose_plan(1, 131_072, 132, false, true, false).0 {
            TopkPlan::Split { chunk, chunks } => assert!(chunk * chunks >= 131_072 && chunk % 1024 == 0),
            other => panic!("{other:?}"),
        }
        assert_eq!(choose_plan(2048, 32_768, 132, false, true, false).0, TopkPlan::Single(TopkLayout::Throughput));
        // With clusters, few long rows take them (no workspace needed); the rest as above.
        let with = |rows, cap, det| choose_plan(rows, cap, 132, det, false, true).0;
        assert_eq!(with(1, 131_072, false), TopkPlan::Cluster { size: 8 });
        assert_eq!(with(4, 65_536, false), TopkPlan::Cluster { size: 8 });
        assert_eq!(with(5, 131_072, false), TopkPlan::Single(TopkLayout::Latency));
        assert_eq!(with(16, 131_072, false), TopkPlan::Single(TopkLayout::Latency));
        assert_eq!(with(64, 131_072, false), TopkPlan::Single(TopkLayout::Latency));
        assert_eq!(with(1, 32_768, false), TopkPlan::Single(TopkLayout::Latency), "one block up to 48K keys");
        assert_eq!(with(1, 16_448, false), TopkPlan::Single(TopkLayout::Throughput), "short rows: 512 threads");
        assert_eq!(with(16, 16_384, false), TopkPlan::Single(TopkLayout::Throughput), "short rows: 512 threads");
        assert_eq!(with(32, 16_384, false), TopkPlan::Single(TopkLayout::Latency), "32 rows: 1024 threads");
        assert_eq!(with(1, 131_072, true), TopkPlan::Single(TopkLayout::Latency), "deterministic");
        assert_eq!(with(2048, 32_768, false), TopkPlan::Single(TopkLayout::Throughput));
        // Rows past the one-block filter's reach take clusters while clusters of 2 all fit.
        assert_eq!(with(64, 524_288, false), TopkPlan::Cluster { size: 2 });
        assert_eq!(with(66, 262_145, false), TopkPlan::Cluster { size: 2 });
        assert_eq!(with(64, 262_144, false), TopkPlan::Single(TopkLayout::Latency));
        assert_eq!(with(67, 524_288, false), TopkPlan::Single(TopkLayout::Latency));
        assert_eq!(with(64, 524_288, true), TopkPlan::Single(TopkLayout::Latency), "deterministic");
    }

    /// Past the constant (and the 42 lengths right after it, where the sample's
    /// rounding still fits), the latency kernel's filter never takes a k-2048 row: its
    /// sample keeps more than 3/4 of its 8192-key list. From 202,984 keys on it
    /// already declines some lengths.
    #[test]
    fn one_block_filter_reach() {
        let (list, k) = (8192, 2048);
        assert!(sample_expected_kept(list, k, ONE_BLOCK_FILTER_MAX_ROW) <= list * 3 / 4);
        assert!(sample_expected_kept(list, k, 202_984) > list * 3 / 4);
        for n in (ONE_BLOCK_FILTER_MAX_ROW + 43..=1 << 20).step_by(97) {
            assert!(sample_expected_kept(list, k, n) > list * 3 / 4, "{n}");
        }
    }

    #[test]
    fn cluster_size_table() {
        for (rows, want) in [(1, 8), (16, 8), (17, 4), (33, 4), (34, 2), (64, 2), (66, 2), (67, 2), (2048, 2)] {
            assert_eq!(cluster_size(rows, 132), want, "{rows} rows");
        }
    }

    #[test]
    fn layout_table() {
        let (long, short) = (32_768, SHORT_ROW_MAX);
        for (rows, cap, sms, want) in [
            (0, long, 132, TopkLayout::Latency),
            (1, long, 132, TopkLayout::Latency),
            (64, long, 132, TopkLayout::Latency),
            (263, long, 132, TopkLayout::Latency),
            (264, long, 132, TopkLayout::Throughput),
            (2048, long, 132, TopkLayout::Throughput),
            (300, long, 148, TopkLayout::Throughput),
            (1, short, 132, TopkLayout::Throughput),
            (16, short, 132, TopkLayout::Throughput),
            (17, short, 132, TopkLayout::Latency),
            (1, short + 1, 132, TopkLayout::Latency),
        ] {
            assert_eq!(choose_layout(rows, cap, sms).0, want, "{rows} rows of {cap} on {sms} SMs");
        }
    }
}
