//! Lightning-indexer logits (spec §6.2, §6.3): PAGED over the indexer K cache for
//! decode / verify / draft-extend (next_n query rows per request), RAGGED over
//! gathered keys with per-row `[ks, ke)` for extend, and the byte budget of the
//! extend logits buffer (§6.3 memory guard).

use super::{check_aligned, check_count_fits_i32, check_len, invalid};
use crate::runtime::Runtime;
use crate::Result;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr};
use nsa_kernels::layout::{INDEXER_HEAD_DIM, INDEXER_PAGE_BYTES, INDEXER_PAGE_TOKENS};
use nsa_kernels::spec::{indexer_wg_kernel, IndexerLayout, INDEXER_WG_RAGGED_ROWS};
use nsa_kernels::KernelFamily;

/// Keys one CTA step covers (one indexer page).
const BLOCK_KEYS: usize = 64;
/// At most this many 64-key blocks per CTA (longer rows get more CTAs).
const MAX_BLOCKS_PER_CTA: usize = 16;
/// The same for the warp-group kernel's RAGGED units (extend): a CTA loads its four
/// Q tiles and fills its copy ring once for this many blocks.
const MAX_BLOCKS_PER_CTA_RAGGED_WG: usize = 64;

/// The query side shared by both layouts: `rows` query rows of `heads` × 128 e4m3
/// bytes and their folded head weights (`weights = gate · 64^-0.5 · q_scale ·
/// 128^-0.5`, spec §6.1 step 6).
#[derive(Debug)]
pub struct IndexerQuery<'a> {
    pub heads: u32,
    /// `[rows, heads, 128]` e4m3 bytes.
    pub q: CudaView<'a, u8>,
    /// `[rows, heads]` f32.
    pub weights: CudaView<'a, f32>,
}

impl IndexerQuery<'_> {
    pub fn rows(&self) -> usize {
        self.weights.len() / self.heads.max(1) as usize
    }

    fn check(&self) -> Result<usize> {
        if self.heads == 0 || self.heads % 16 != 0 || self.heads > 64 {
            return Err(invalid("heads", self.heads.to_string(), "a multiple of 16 up to 64 (index_n_heads)"));
        }
        let rows = self.rows();
        check_len("weights", self.weights.len(), rows * self.heads as usize, "rows × heads")?;
        check_len("q", self.q.len(), rows * self.heads as usize * INDEXER_HEAD_DIM, "rows × heads × 128")?;
        Ok(rows)
    }
}

/// The paged keys: the indexer K cache (`[pages, 8448]` bytes, spec §2.5), each
/// request's page row and context length. Query row `b · next_n + j` sees keys
/// `s < context_lens[b] − next_n + j + 1` (capped at `table_width · 64`).
#[derive(Debug)]
pub struct PagedIndexerKeys<'a> {
    pub cache: CudaView<'a, u8>,
    /// `[batch, table_width]` page ids (the real page table).
    pub block_table: CudaView<'a, i32>,
    pub table_width: usize,
    /// `[batch]`.
    pub context_lens: CudaView<'a, i32>,
    /// Query rows per request (1–4: MTP draft tokens).
    pub next_n: usize,
}

/// The ragged keys: `[num_keys, 128]` e4m3 bytes and `[num_keys]` f32 scales; query
/// row t sees keys `[ks[t], ke[t])`.
#[derive(Debug)]
pub struct RaggedIndexerKeys<'a> {
    pub keys: CudaView<'a, u8>,
    pub scales: CudaView<'a, f32>,
    pub ks: CudaView<'a, i32>,
    pub ke: CudaView<'a, i32>,
}

/// The output: `[rows, stride]` f32. Entries a row does not see are left as they
/// were (top-k never reads past a row's length), or set to −inf in the columns
/// `[0, fill_width)` (as DeepGEMM's `clean_logits`), by the logits kernel itself.
#[derive(Debug)]
pub struct LogitsOut<'a, 'b> {
    pub data: &'a mut CudaViewMut<'b, f32>,
    pub stride: usize,
    pub fill_width: usize,
}

impl<'a, 'b> LogitsOut<'a, 'b> {
    /// Rows `stride` f32 apart; unseen entries left as they were.
    pub fn new(data: &'a mut CudaViewMut<'b, f32>, stride: usize) -> Self {
        Self { data, stride, fill_width: 0 }
    }

    /// Also sets the entries of columns `[0, width)` a row does not see to −inf.
    pub fn fill_unseen(self, width: usize) -> Self {
        Self { fill_width: width, ..self }
    }
}

/// Mirrors `nsa::indexer::Params` (indexer_logits.cuh) field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct IndexerLogitsParams {
    q: u64,
    weights: u64,
    keys: u64,
    key_scales: u64,
    block_table: u64,
    lengths: u64,
    ks: u64,
    ke: u64,
    logits: u64,
    logits_stride: i64,
    num_keys: i64,
    rows: i32,
    next_n: i32,
    table_width: i32,
    blocks_per_cta: i32,
    chunks: i32,
    fill_width: i64,
}
// SAFETY: plain old data with the C layout the kernel declares.
unsafe impl DeviceRepr for IndexerLogitsParams {}

/// 64-key blocks per CTA and CTAs per row (or per request, for the warp-group
/// kernel) for `rows` units of at most `max_keys` keys: a pure function of the shape
/// (CUDA-graph capturable), aiming at ≥ 8 CTAs per SM with at most `max_per_cta`
/// blocks each.
pub fn split_rows(rows: usize, max_keys: usize, sm_count: u32, max_per_cta: usize) -> (usize, usize) {
    let blocks = max_keys.div_ceil(BLOCK_KEYS).max(1);
    let want_ctas = 8 * sm_count.max(1) as usize;
    let per_cta = (rows * blocks).div_ceil(want_ctas).clamp(1, max_per_cta.max(1));
    (per_cta, blocks.div_ceil(per_cta))
}

/// f32 bytes of a `[rows, keys]` logits buffer: what an extend call allocates.
pub fn logits_bytes(rows: usize, keys: usize) -> usize {
    4 * rows * keys
}

/// Query rows per extend chunk so that one chunk's logits fit `budget_bytes`
/// (spec §6.3 memory guard as a caller-given budget); an error names the budget
/// when not even one row fits.
pub fn ragged_chunk_rows(total_rows: usize, keys: usize, budget_bytes: usize) -> Result<usize> {
    crate::reference::indexer::ragged_chunk_rows(total_rows, keys, budget_bytes).ok_or_else(|| {
        invalid(
            "logits budget",
            format!("{budget_bytes} bytes"),
            format!("at least one row of {keys} f32 logits ({} bytes)", logits_bytes(1, keys)),
        )
    })
}

fn check_out(out: &LogitsOut<'_, '_>, rows: usize, width: usize) -> Result<()> {
    if out.stride < width || out.stride % 4 != 0 {
        return Err(invalid(
            "logits.stride",
            out.stride.to_string(),
            format!("a multiple of 4 of at least {width} (the widest row)"),
        ));
    }
    if out.fill_width > out.stride {
        return Err(invalid(
            "logits.fill_width",
            out.fill_width.to_string(),
            format!("at most the row stride {} (columns set to -inf where a row sees no key)", out.stride),
        ));
    }
    let need = if rows == 0 { 0 } else { (rows - 1) * out.stride + width.max(out.fill_width) };
    if out.data.len() < need {
        return Err(invalid(
            "logits",
            format!("{} f32", out.data.len()),
            format!("at least {need} f32 ({rows} rows of stride {})", out.stride),
        ));
    }
    Ok(())
}

/// The query-row units the kernel gives a CTA each (times the chunks of keys): the
/// warp-group kernel reads each key block once for a request's next_n rows (PAGED)
/// or for 4 consecutive rows (RAGGED); the mma.sync kernel serves one row.
fn units(heads: u32, layout: IndexerLayout, rows: usize, next_n: usize, rt: &Runtime) -> usize {
    if !indexer_wg_kernel(heads, rt.target()) {
        return rows;
    }
    match layout {
        IndexerLayout::Paged => rows / next_n.max(1),
        IndexerLayout::Ragged => rows.div_ceil(INDEXER_WG_RAGGED_ROWS as usize),
    }
}

fn launch(
    rt: &Runtime,
    heads: u32,
    layout: IndexerLayout,
    units: usize,
    params: IndexerLogitsParams,
    field: &'static str,
) -> Result<()> {
    let kernel = rt.kernel(KernelFamily::IndexerLogits { heads, layout })?;
    let ctas = units * params.chunks as usize;
    check_count_fits_i32("CTAs (rows or requests × chunks)", ctas)?;
    let mut args = rt.args();
    args.arg(&params);
    rt.launch(&kernel, args, ctas, field, "a page id below the cache's page count")
}

/// PAGED logits (decode / target-verify / draft-extend, spec §6.2).
pub fn paged_logits(
    rt: &Runtime,
    query: &IndexerQuery<'_>,
    keys: &PagedIndexerKeys<'_>,
    out: LogitsOut<'_, '_>,
) -> Result<()> {
    let rows = query.check()?;
    let stream = rt.gpu().stream();
    if !(1..=4).contains(&keys.next_n) {
        return Err(invalid("next_n", keys.next_n.to_string(), "1..=4 query rows per request"));
    }
    let batch = keys.context_lens.len();
    check_len("rows", rows, batch * keys.next_n, "context_lens.len() × next_n query rows")?;
    check_len("block_table", keys.block_table.len(), batch * keys.table_width, "batch × table_width")?;
    if keys.cache.len() % INDEXER_PAGE_BYTES != 0 {
        return Err(invalid(
            "cache",
            format!("{} bytes", keys.cache.len()),
            format!("a whole number of {INDEXER_PAGE_BYTES}-byte indexer pages"),
        ));
    }
    let max_keys = keys.table_width * INDEXER_PAGE_TOKENS;
    check_out(&out, rows, max_keys)?;
    if rows == 0 || (max_keys == 0 && out.fill_width == 0) {
        return Ok(());
    }
    check_aligned("q", &query.q, 16, stream)?;
    check_aligned("cache", &keys.cache, 16, stream)?;
    check_count_fits_i32("table_width", keys.table_width)?;
    let units = units(query.heads, IndexerLayout::Paged, rows, keys.next_n, rt);
    let (per_cta, chunks) = split_rows(units, max_keys, rt.gpu().caps().sm_count, MAX_BLOCKS_PER_CTA);
    let (q, _g1) = query.q.device_ptr(stream);
    let (weights, _g2) = query.weights.device_ptr(stream);
    let (cache, _g3) = keys.cache.device_ptr(stream);
    let (table, _g4) = keys.block_table.device_ptr(stream);
    let (lens, _g5) = keys.context_lens.device_ptr(stream);
    let (logits, _g6) = out.data.device_ptr_mut(stream);
    let params = IndexerLogitsParams {
        q,
        weights,
        keys: cache,
        block_table: table,
        lengths: lens,
        logits,
        logits_stride: out.stride as i64,
        num_keys: (keys.cache.len() / INDEXER_PAGE_BYTES * INDEXER_PAGE_TOKENS) as i64,
        rows: rows as i32,
        next_n: keys.next_n as i32,
        table_width: keys.table_width as i32,
        blocks_per_cta: per_cta as i32,
        chunks: chunks as i32,
        fill_width: out.fill_width as i64,
        ..Default::default()
    };
    launch(rt, query.heads, IndexerLayout::Paged, units, params, "block_table")
}

/// RAGGED logits (extend, spec §6.3): `[rows, num_keys]` (row stride `out.stride`).
pub fn ragged_logits(
    rt: &Runtime,
    query: &IndexerQuery<'_>,
    keys: &RaggedIndexerKeys<'_>,
    out: LogitsOut<'_, '_>,
) -> Result<()> {
    let rows = query.check()?;
    let stream = rt.gpu().stream();
    let num_keys = keys.scales.len();
    check_len("keys", keys.keys.len(), num_keys * INDEXER_HEAD_DIM, "scales.len() × 128")?;
    check_len("ks", keys.ks.len(), rows, "one entry per query row")?;
    check_len("ke", keys.ke.len(), rows, "one entry per query row")?;
    check_out(&out, rows, num_keys)?;
    if rows == 0 || (num_keys == 0 && out.fill_width == 0) {
        return Ok(());
    }
    check_aligned("q", &query.q, 16, stream)?;
    check_aligned("keys", &keys.keys, 16, stream)?;
    let units = units(query.heads, IndexerLayout::Ragged, rows, 1, rt);
    let cap =
        if indexer_wg_kernel(query.heads, rt.target()) { MAX_BLOCKS_PER_CTA_RAGGED_WG } else { MAX_BLOCKS_PER_CTA };
    let (per_cta, chunks) = split_rows(units, num_keys, rt.gpu().caps().sm_count, cap);
    let (q, _g1) = query.q.device_ptr(stream);
    let (weights, _g2) = query.weights.device_ptr(stream);
    let (k, _g3) = keys.keys.device_ptr(stream);
    let (scales, _g4) = keys.scales.device_ptr(stream);
    let (ks, _g5) = keys.ks.device_ptr(stream);
    let (ke, _g6) = keys.ke.device_ptr(stream);
    let (logits, _g7) = out.data.device_ptr_mut(stream);
    let params = IndexerLogitsParams {
        q,
        weights,
        keys: k,
        key_scales: scales,
        ks,
        ke,
        logits,
        logits_stride: out.stride as i64,
        num_keys: num_keys as i64,
        rows: rows as i32,
        next_n: 1,
        blocks_per_cta: per_cta as i32,
        chunks: chunks as i32,
        fill_width: out.fill_width as i64,
        ..Default::default()
    };
    launch(rt, query.heads, IndexerLayout::Ragged, units, params, "ks")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_into_enough_ctas() {
        // (rows, keys, SMs) → (blocks per CTA, CTAs per row)
        assert_eq!(split_rows(1, 131_072, 132, 16), (2, 1024));
        assert_eq!(split_rows(128, 65_536, 132, 16), (16, 64));
        assert_eq!(split_rows(4096, 32_768, 132, 16), (16, 32));
        assert_eq!(split_rows(1024, 32_768, 132, 64), (64, 8));
        assert_eq!(split_rows(3, 10, 132, 64), (1, 1));
        assert_eq!(split_rows(0, 0, 132, 16), (1, 1));
    }

    #[test]
    fn extend_chunks_fit_the_budget() {
        assert_eq!(logits_bytes(4096, 32_768), 512 << 20);
        assert_eq!(ragged_chunk_rows(4096, 32_768, 128 << 20).unwrap(), 1024);
        assert_eq!(ragged_chunk_rows(10, 32_768, 1 << 30).unwrap(), 10);
        let err = ragged_chunk_rows(10, 32_768, 1000).unwrap_err().to_string();
        assert!(err.contains("`logits budget`") && err.contains("131072 bytes"), "{err}");
    }
}
