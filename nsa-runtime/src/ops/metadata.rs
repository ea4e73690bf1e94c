//! Launcher of the CUDA-graph metadata capture/replay kernel (spec §9.2, §9.3, §9.6):
//! one launch rewrites a graph state's fixed-capacity buffers in place. Host checks
//! cover everything knowable without reading device memory; entries the kernel
//! finds bad (a negative length, a row outside `req_to_token`, a KV length past the
//! table, Σ accepted lengths past the graph's rows) make it write nothing and, with
//! [`DeviceChecks::Report`](crate::DeviceChecks::Report), fail the launch.

use super::{check_count_fits_i32, invalid};
use crate::runtime::Runtime;
use crate::Result;
use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DevicePtrMut, DeviceRepr};
use nsa_kernels::spec::{MetadataMode, METADATA_MAX_BATCH};
use nsa_kernels::KernelFamily;

/// Blocks of one launch at most; page-table rows past it are strided over the grid.
pub const MAX_GRID: usize = 1024;

/// Where every field of one step's graph state lives in the state buffer (in i32
/// elements, each field 16-byte aligned), and how far apart the steps are. An
/// extend layout ([`GraphLayout::extend`]) has one table row per request and the
/// ragged key layout; a graph layout one table row per query row and no keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphLayout {
    pub max_bs: usize,
    pub max_tokens: usize,
    /// Rows of `page_table_1` and the real table (`max_tokens`, extend: `max_bs`).
    pub table_rows: usize,
    /// Capacity of the ragged keys (extend; 0 otherwise).
    pub max_keys: usize,
    /// `page_table_1` row stride (`max_context_len`).
    pub width: usize,
    /// `real_page_table` row stride; 0 with page size 1 (aliased, no buffer).
    pub real_width: usize,
    pub page_size: u32,
    pub steps: usize,
    pub cache_seqlens: usize,
    pub cu_seqlens_k: usize,
    pub cu_seqlens_q: usize,
    pub page_table_1: usize,
    pub real_page_table: usize,
    pub seqlens_expanded: usize,
    pub nsa_cache_seqlens: usize,
    pub nsa_cu_seqlens_k: usize,
    pub extend_lens: usize,
    /// Extend: `slots` `[max_keys]`, `ks` and `ke` `[max_tokens]` (empty otherwise).
    pub slots: usize,
    pub ks: usize,
    pub ke: usize,
    /// Elements of one step (the step stride).
    pub step_len: usize,
}

impl GraphLayout {
    pub fn new(max_bs: usize, max_tokens: usize, width: usize, page_size: u32, steps: usize) -> Self {
        Self::with_rows(max_bs, max_tokens, max_tokens, 0, width, page_size, steps)
    }

    /// The layout of eager extend metadata built on the device (one step).
    pub fn extend(max_bs: usize, max_tokens: usize, max_keys: usize, width: usize, page_size: u32) -> Self {
        Self::with_rows(max_bs, max_tokens.max(max_bs), max_bs, max_keys, width, page_size, 1)
    }

    fn with_rows(
        max_bs: usize,
        max_tokens: usize,
        table_rows: usize,
        max_keys: usize,
        width: usize,
        page_size: u32,
        steps: usize,
    ) -> Self {
        let real_width = if page_size > 1 { width.div_ceil(page_size as usize) } else { 0 };
        let mut at = 0usize;
        let mut field = |len: usize| {
            let start = at;
            at = (at + len).next_multiple_of(4);
            start
        };
        let cache_seqlens = field(max_bs);
        let cu_seqlens_k = field(max_bs + 1);
        let cu_seqlens_q = field(max_tokens + 1);
        let page_table_1 = field(table_rows * width);
        let real_page_table = field(table_rows * real_width);
        let seqlens_expanded = field(max_tokens);
        let nsa_cache_seqlens = field(max_tokens);
        let nsa_cu_seqlens_k = field(max_tokens + 1);
        let extend_lens = field(max_bs);
        let keys = if max_keys > 0 { max_tokens } else { 0 };
        let slots = field(max_keys);
        let ks = field(keys);
        let ke = field(keys);
        let step_len = at;
        GraphLayout {
            max_bs,
            max_tokens,
            table_rows,
            max_keys,
            width,
            real_width,
            page_size,
            steps,
            cache_seqlens,
            cu_seqlens_k,
            cu_seqlens_q,
            page_table_1,
            real_page_table,
            seqlens_expanded,
            nsa_cache_seqlens,
            nsa_cu_seqlens_k,
            extend_lens,
            slots,
            ks,
            ke,
            step_len,
        }
    }

    /// Elements of the whole state (every step).
    pub fn total_len(&self) -> usize {
        self.step_len * self.steps
    }
}

/// The device inputs of one replay. `req_to_token` is `[rows, width]`, row-major.
#[derive(Debug)]
pub struct ReplayInputs<'a> {
    pub seq_lens: &'a CudaView<'a, i32>,
    pub req_pool_indices: &'a CudaView<'a, i32>,
    /// Draft-extend v1: the accepted lengths `E_i`; extend: the query lengths `E_i`;
    /// `None` in every other mode (v2: `D` each).
    pub extend_lens: Option<&'a CudaView<'a, i32>>,
    pub req_to_token: &'a CudaView<'a, i32>,
    pub req_to_token_width: usize,
}

/// Capture (lengths from `seq_lens`, real table from the resident rows) or replay.
#[derive(Debug)]
pub enum MetadataOp<'a> {
    Capture { seq_lens: &'a CudaView<'a, i32> },
    Replay(ReplayInputs<'a>),
}

/// The values of the batch that are launch arguments, not code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayScalars {
    pub bs: usize,
    /// `index_topk`: the NSA clip.
    pub topk: u32,
    /// `D` (ignored by decode).
    pub draft_tokens: u32,
}

/// Mirrors `nsa::metadata_replay::Params` (metadata_replay.cuh) field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Params {
    seq_lens: u64,
    req_pool_indices: u64,
    extend_lens: u64,
    req_to_token: u64,
    cache_seqlens: u64,
    cu_seqlens_k: u64,
    page_table_1: u64,
    real_page_table: u64,
    seqlens_expanded: u64,
    nsa_cache_seqlens: u64,
    nsa_cu_seqlens_k: u64,
    extend_lens_out: u64,
    cu_seqlens_q: u64,
    slots: u64,
    ks: u64,
    ke: u64,
    step_stride: i64,
    table_stride: i64,
    bs: i32,
    steps: i32,
    table_rows: i32,
    table_width: i32,
    width: i32,
    real_width: i32,
    max_rows: i32,
    topk: i32,
    draft_tokens: i32,
    capture: i32,
    grid: i32,
    max_keys: i32,
}
// SAFETY: plain old data with the C layout the kernel declares.
unsafe impl DeviceRepr for Params {}

const EXPECTED: &str = "seq_lens ≥ 0, req_pool_indices rows of req_to_token, KV lengths within the graph's and \
                        req_to_token's width, 0 ≤ extend_lens[i] ≤ seq_lens[i] (v2: seq_lens[i] ≥ D) and \
                        Σ extend_lens ≤ bs × D (extend: Σ extend_lens ≤ max_tokens and Σ seq_lens ≤ max_keys); \
                        nothing was written";

/// Columns of one extend work item (the kernel's `segment_cols` at page size 1 and 64).
const EXTEND_SEGMENT_COLS: usize = 8192;

fn check_len(field: &'static str, got: usize, bs: usize) -> Result<()> {
    if got != bs {
        return Err(invalid(field, format!("length {got}"), format!("one entry per request (bs = {bs})")));
    }
    Ok(())
}

/// Query rows a graph of `bs` requests is bound to.
/// (Extend has no graphs; its rows are bounded by the layout's `max_tokens`.)
pub fn graph_rows(mode: MetadataMode, bs: usize, draft_tokens: u32) -> usize {
    match mode {
        MetadataMode::Decode => bs,
        MetadataMode::Extend => usize::MAX,
        _ => bs * draft_tokens as usize,
    }
}

/// One launch of the metadata kernel of `mode` over `state` (laid out by `layout`):
/// every step of the state receives the same values. Never allocates, never synchronises
/// (unless device checks are reported).
pub fn metadata_replay(
    rt: &Runtime,
    mode: MetadataMode,
    op: &MetadataOp<'_>,
    scalars: ReplayScalars,
    layout: &GraphLayout,
    state: &mut CudaSlice<i32>,
) -> Result<()> {
    let ReplayScalars { bs, topk, draft_tokens } = scalars;
    if bs > layout.max_bs {
        return Err(invalid(
            "bs",
            bs.to_string(),
            format!("at most max_bs = {} (the CUDA-graph capacity)", layout.max_bs),
        ));
    }
    if bs > METADATA_MAX_BATCH as usize {
        return Err(invalid(
            "bs",
            bs.to_string(),
            format!("at most {METADATA_MAX_BATCH} requests per metadata replay"),
        ));
    }
    let extend = mode == MetadataMode::Extend;
    if !extend && mode != MetadataMode::Decode && draft_tokens == 0 {
        return Err(invalid("draft_tokens", "0", format!("D ≥ 1 for {} graphs", mode.tag())));
    }
    if layout.steps == 0 || (extend && layout.steps != 1) {
        return Err(invalid("steps", layout.steps.to_string(), "at least one step backend (extend: exactly one)"));
    }
    if extend != (layout.max_keys > 0) || (extend && layout.table_rows != layout.max_bs) {
        return Err(invalid(
            "layout",
            format!("{} rows per table, {} keys", layout.table_rows, layout.max_keys),
            format!("a {} layout (GraphLayout::{})", mode.tag(), if extend { "extend" } else { "new" }),
        ));
    }
    let max_rows = if extend { layout.max_tokens } else { graph_rows(mode, bs, draft_tokens) };
    if max_rows > layout.max_tokens {
        return Err(invalid(
            "bs",
            bs.to_string(),
            format!("at most max_tokens = {} query rows ({max_rows} needed)", layout.max_tokens),
        ));
    }
    if state.len() < layout.total_len() {
        return Err(invalid(
            "state",
            format!("{} elements", state.len()),
            format!("at least {} for the layout", layout.total_len()),
        ));
    }
    check_count_fits_i32("state", layout.total_len())?;
    let stream = rt.gpu().stream();
    let (seq_lens, rpi, extend, table, table_width) = match op {
        MetadataOp::Capture { .. } if extend => {
            return Err(invalid("op", "a capture", "a replay: extend metadata has no CUDA graphs"));
        }
        MetadataOp::Capture { seq_lens } => (*seq_lens, None, None, None, 0),
        MetadataOp::Replay(inp) => {
            check_len("req_pool_indices", inp.req_pool_indices.len(), bs)?;
            match (mode, inp.extend_lens) {
                (MetadataMode::Extend, None) => {
                    return Err(invalid("extend_lens", "none", "the query length of every request (extend)"));
                }
                (_, None) => {}
                (MetadataMode::DraftExtend | MetadataMode::Extend, Some(e)) => check_len("extend_lens", e.len(), bs)?,
                (_, Some(_)) => {
                    return Err(invalid("extend_lens", "given", format!("none for {} graphs", mode.tag())));
                }
            }
            let w = inp.req_to_token_width;
            if w == 0 || inp.req_to_token.len() % w != 0 {
                return Err(invalid(
                    "req_to_token",
                    format!("{} entries with width {w}", inp.req_to_token.len()),
                    "a whole number of rows of a non-zero width (max_context_len)",
                ));
            }
            (inp.seq_lens, Some(inp.req_pool_indices), inp.extend_lens, Some(inp.req_to_token), w)
        }
    };
    check_len("seq_lens", seq_lens.len(), bs)?;
    let table_rows = table.map_or(0, |t| t.len() / table_width);
    let table_rows = check_count_fits_i32("req_to_token rows", table_rows)?;
    let table_width = check_count_fits_i32("req_to_token width", table_width)?;

    let kernel = rt.kernel(KernelFamily::MetadataReplay { page_size: layout.page_size, mode })?;
    // Extend: (request, column segment) work items; a graph: one row per block.
    let work = if mode == MetadataMode::Extend { bs * layout.width.div_ceil(EXTEND_SEGMENT_COLS) } else { max_rows };
    let grid = work.clamp(1, MAX_GRID);
    let (seq_ptr, _s1) = seq_lens.device_ptr(stream);
    let rpi = rpi.map(|v| v.device_ptr(stream));
    let extend = extend.map(|v| v.device_ptr(stream));
    let table = table.map(|v| v.device_ptr(stream));
    let (base, _s2) = state.device_ptr_mut(stream);
    let at = |offset: usize| base + 4 * offset as u64;
    let params = Params {
        seq_lens: seq_ptr,
        req_pool_indices: rpi.as_ref().map_or(0, |p| p.0),
        extend_lens: extend.as_ref().map_or(0, |p| p.0),
        req_to_token: table.as_ref().map_or(0, |p| p.0),
        cache_seqlens: at(layout.cache_seqlens),
        cu_seqlens_k: at(layout.cu_seqlens_k),
        page_table_1: at(layout.page_table_1),
        real_page_table: if layout.page_size > 1 { at(layout.real_page_table) } else { 0 },
        seqlens_expanded: at(layout.seqlens_expanded),
        nsa_cache_seqlens: at(layout.nsa_cache_seqlens),
        nsa_cu_seqlens_k: at(layout.nsa_cu_seqlens_k),
        extend_lens_out: at(layout.extend_lens),
        cu_seqlens_q: at(layout.cu_seqlens_q),
        slots: at(layout.slots),
        ks: at(layout.ks),
        ke: at(layout.ke),
        step_stride: layout.step_len as i64,
        table_stride: table_width as i64,
        bs: bs as i32,
        steps: layout.steps as i32,
        table_rows,
        table_width,
        width: layout.width as i32,
        real_width: layout.real_width as i32,
        max_rows: max_rows as i32,
        topk: topk.min(i32::MAX as u32) as i32,
        draft_tokens: draft_tokens.min(i32::MAX as u32) as i32,
        capture: matches!(op, MetadataOp::Capture { .. }) as i32,
        grid: grid as i32,
        max_keys: layout.max_keys as i32,
    };
    let mut args = rt.args();
    args.arg(&params);
    rt.launch(&kernel, args, grid, "seq_lens", EXPECTED)
}
