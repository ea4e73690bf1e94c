//! Lightning-indexer logits over DLPack tensors: PAGED over the indexer K cache
//! (decode, verify, draft-extend) and RAGGED over gathered keys (extend).

use crate::device::{launch_stream, runtime, RestoreContext};
use crate::error::IntoPy;
use crate::tensor::{import, same_device, DType, Tensor};
use nsa_runtime::kernels::layout::{INDEXER_HEAD_DIM, INDEXER_PAGE_TOKENS, INDEXER_TOKEN_BYTES};
use nsa_runtime::ops::indexer::{self as ops, IndexerQuery, LogitsOut, PagedIndexerKeys, RaggedIndexerKeys};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// PAGED logits: `q` `(batch, next_n, heads, 128)` e4m3 against request b's keys
/// in `kv_cache` (`(pages, 64, 1, 132)` bytes: a page's 64 × 128 e4m3 keys, then
/// their 64 f32 scales) through `block_table` `(batch, width)` int32, weighted by
/// `weights` `(batch × next_n, heads)` f32 and summed over heads after a ReLU.
/// Row `b · next_n + j` of `out` (`(rows, ≥ width × 64)` f32, row stride a
/// multiple of 4) gets its first `context_lens[b] − next_n + j + 1` entries; the
/// rest are left as they were, or −inf in the columns `[0, fill_width)`.
#[pyfunction]
#[pyo3(signature = (q, kv_cache, weights, context_lens, block_table, out, *, fill_width=0, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn indexer_paged_logits(
    q: &Bound<'_, PyAny>,
    kv_cache: &Bound<'_, PyAny>,
    weights: &Bound<'_, PyAny>,
    context_lens: &Bound<'_, PyAny>,
    block_table: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    fill_width: usize,
    stream: Option<usize>,
) -> PyResult<()> {
    let q = import("q", q, stream)?;
    let cache = import("kv_cache", kv_cache, stream)?;
    let weights = import("weights", weights, stream)?;
    let lens = import("context_lens", context_lens, stream)?;
    let table = import("block_table", block_table, stream)?;
    let out = import("out", out, stream)?;

    let heads = check_query(&q, 4, "(batch, next_n, heads, 128)")?;
    let (batch, next_n) = (q.shape[0], q.shape[1]);
    cache.dtype_in(&[DType::U8, DType::F8E4M3])?;
    cache.ndim(4, "(pages, 64, 1, 132)")?;
    cache.shape_is(
        &[cache.shape[0], INDEXER_PAGE_TOKENS, 1, INDEXER_TOKEN_BYTES],
        "pages of 64 keys of 128 + 4 bytes",
    )?;
    cache.contiguous()?;
    check_weights(&weights, batch * next_n, heads)?;
    lens.dtype_in(&[DType::I32])?;
    lens.shape_is(&[batch], "one context length per request")?;
    lens.contiguous()?;
    table.dtype_in(&[DType::I32])?;
    table.ndim(2, "(batch, width)")?;
    table.shape_is(&[batch, table.shape[1]], "one page row per request")?;
    table.contiguous()?;
    let stride = check_out(&out, batch * next_n, fill_width)?;
    let ordinal = same_device(-1, [&q, &cache, &weights, &lens, &table, &out].into_iter())?;
    let _restore = RestoreContext::save()?;
    let rt = runtime(ordinal, launch_stream(stream)?)?;

    let (qb, wb, cb) = (q.buffer::<u8>(&rt)?, weights.buffer::<f32>(&rt)?, cache.buffer::<u8>(&rt)?);
    let (tb, lb, mut ob) = (table.buffer::<i32>(&rt)?, lens.buffer::<i32>(&rt)?, out.buffer::<f32>(&rt)?);
    let query = IndexerQuery { heads, q: qb.view(), weights: wb.view() };
    let keys = PagedIndexerKeys {
        cache: cb.view(),
        block_table: tb.view(),
        table_width: table.shape[1],
        context_lens: lb.view(),
        next_n,
    };
    ops::paged_logits(&rt, &query, &keys, LogitsOut::new(&mut ob.view_mut(), stride).fill_unseen(fill_width)).py()
}

/// RAGGED logits: `q` `(rows, heads, 128)` e4m3 against keys `k` `(num_keys, 128)`
/// e4m3 with scales `k_scales` `(num_keys,)` f32; row t of `out` (`(rows, ≥
/// num_keys)` f32, row stride a multiple of 4) gets entries `[ks[t], ke[t])`, the
/// rest left as they were, or −inf in the columns `[0, fill_width)`.
#[pyfunction]
#[pyo3(signature = (q, k, k_scales, weights, ks, ke, out, *, fill_width=0, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn indexer_ragged_logits(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    k_scales: &Bound<'_, PyAny>,
    weights: &Bound<'_, PyAny>,
    ks: &Bound<'_, PyAny>,
    ke: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    fill_width: usize,
    stream: Option<usize>,
) -> PyResult<()> {
    let q = import("q", q, stream)?;
    let k = import("k", k, stream)?;
    let scales = import("k_scales", k_scales, stream)?;
    let weights = import("weights", weights, stream)?;
    let ks = import("ks", ks, stream)?;
    let ke = import("ke", ke, stream)?;
    let out = import("out", out, stream)?;

    let heads = check_query(&q, 3, "(rows, heads, 128)")?;
    let rows = q.shape[0];
    k.dtype_in(&[DType::U8, DType::F8E4M3])?;
    k.ndim(2, "(num_keys, 128)")?;
    let num_keys = k.shape[0];
    k.shape_is(&[num_keys, INDEXER_HEAD_DIM], "128 e4m3 bytes per key")?;
    k.contiguous()?;
    scales.dtype_in(&[DType::F32])?;
    if scales.shape.len() == 2 {
        scales.shape_is(&[num_keys, 1], "one scale per key")?;
    } else {
        scales.shape_is(&[num_keys], "one scale per key")?;
    }
    scales.contiguous()?;
    check_weights(&weights, rows, heads)?;
    for t in [&ks, &ke] {
        t.dtype_in(&[DType::I32])?;
        t.shape_is(&[rows], "one bound per query row")?;
        t.contiguous()?;
    }
    let stride = check_out(&out, rows, fill_width)?;
    let ordinal = same_device(-1, [&q, &k, &scales, &weights, &ks, &ke, &out].into_iter())?;
    let _restore = RestoreContext::save()?;
    let rt = runtime(ordinal, launch_stream(stream)?)?;

    let (qb, wb, kb, sb) =
        (q.buffer::<u8>(&rt)?, weights.buffer::<f32>(&rt)?, k.buffer::<u8>(&rt)?, scales.buffer::<f32>(&rt)?);
    let (ksb, keb, mut ob) = (ks.buffer::<i32>(&rt)?, ke.buffer::<i32>(&rt)?, out.buffer::<f32>(&rt)?);
    let query = IndexerQuery { heads, q: qb.view(), weights: wb.view() };
    let keys = RaggedIndexerKeys { keys: kb.view(), scales: sb.view(), ks: ksb.view(), ke: keb.view() };
    ops::ragged_logits(&rt, &query, &keys, LogitsOut::new(&mut ob.view_mut(), stride).fill_unseen(fill_width)).py()
}

/// `q`: e4m3 (or its bytes), `dims` dimensions ending in (heads, 128), contiguous;
/// returns the head count.
fn check_query(q: &Tensor, dims: usize, what: &str) -> PyResult<u32> {
    q.dtype_in(&[DType::F8E4M3, DType::U8])?;
    q.ndim(dims, what)?;
    if q.shape[dims - 1] != INDEXER_HEAD_DIM {
        let mut want = q.shape.clone();
        want[dims - 1] = INDEXER_HEAD_DIM;
        q.shape_is(&want, "128 e4m3 values per head")?;
    }
    q.contiguous()?;
    u32::try_from(q.shape[dims - 2]).map_err(|_| PyValueError::new_err("`q`: too many heads"))
}

fn check_weights(w: &Tensor, rows: usize, heads: u32) -> PyResult<()> {
    w.dtype_in(&[DType::F32])?;
    w.shape_is(&[rows, heads as usize], "(query rows, heads)")?;
    w.contiguous()
}

/// `out`: f32 `(rows, width)`, packed along the row, writable, at least `fill_width`
/// wide; returns the row stride.
fn check_out(out: &Tensor, rows: usize, fill_width: usize) -> PyResult<usize> {
    out.dtype_in(&[DType::F32])?;
    out.ndim(2, "(query rows, keys)")?;
    out.shape_is(&[rows, out.shape[1]], "one row per query row")?;
    if fill_width > out.shape[1] {
        return Err(PyValueError::new_err(format!(
            "`fill_width`: {fill_width}, expected at most the width of `out` ({}); pass 0 to leave unseen entries as they are",
            out.shape[1]
        )));
    }
    out.packed_from(1)?;
    out.writable()?;
    out.stride(0)
}
