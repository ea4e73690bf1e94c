//! Exact top-k over DLPack tensors: plain positions, slots of a page table
//! (fused transform), or positions plus ragged offsets.

use crate::device::{launch_stream, runtime, RestoreContext};
use crate::error::IntoPy;
use crate::tensor::{import, import_opt, same_device, DType, Tensor};
use cudarc::driver::CudaView;
use half::bf16;
use nsa_runtime::ops::topk::{self as ops, PageTable, TopkOutput, TopkScoreElem, TopkScores};
use nsa_runtime::Runtime;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Top-`k` of each score row into `out` (`(rows, k)` int32; `k` is its width).
/// Row b's candidates are `score[b, row_starts[b] ..][.. lengths[b]]`; −1 pads
/// rows with fewer than `k`. With `page_table` (`(table_rows, width)` int32, one
/// table row per score row, or per request with `cu_seqlens_q`) each position
/// becomes the slot the table gives it (pages of `page_size` positions); with
/// `offsets` (`(rows,)` int32) position + `offsets[b]`.
#[pyfunction]
#[pyo3(signature = (score, lengths, out, *, row_starts=None, page_table=None, cu_seqlens_q=None, page_size=1, offsets=None, deterministic=false, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn topk(
    score: &Bound<'_, PyAny>,
    lengths: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    row_starts: Option<&Bound<'_, PyAny>>,
    page_table: Option<&Bound<'_, PyAny>>,
    cu_seqlens_q: Option<&Bound<'_, PyAny>>,
    page_size: usize,
    offsets: Option<&Bound<'_, PyAny>>,
    deterministic: bool,
    stream: Option<usize>,
) -> PyResult<()> {
    let args = Args {
        score: import("score", score, stream)?,
        lengths: import("lengths", lengths, stream)?,
        out: import("out", out, stream)?,
        row_starts: import_opt("row_starts", row_starts, stream)?,
        page_table: import_opt("page_table", page_table, stream)?,
        cu_seqlens_q: import_opt("cu_seqlens_q", cu_seqlens_q, stream)?,
        offsets: import_opt("offsets", offsets, stream)?,
    };
    let ordinal = args.check()?;
    let rows = args.score.shape[0];
    if rows == 0 {
        return Ok(());
    }
    let _restore = RestoreContext::save()?;
    let rt = runtime(ordinal, launch_stream(stream)?)?;
    match args.score.dtype {
        DType::Bf16 => launch::<bf16>(&rt, &args, page_size, deterministic),
        _ => launch::<f32>(&rt, &args, page_size, deterministic),
    }
}

struct Args {
    score: Tensor,
    lengths: Tensor,
    out: Tensor,
    row_starts: Option<Tensor>,
    page_table: Option<Tensor>,
    cu_seqlens_q: Option<Tensor>,
    offsets: Option<Tensor>,
}

impl Args {
    /// Dtypes, shapes and strides argument by argument, then the devices; returns
    /// the device ordinal.
    fn check(&self) -> PyResult<i32> {
        self.score.dtype_in(&[DType::F32, DType::Bf16])?;
        self.score.ndim(2, "(rows, keys)")?;
        self.score.packed_from(1)?;
        let rows = self.score.shape[0];
        let per_row = |t: &Tensor, what: &str| -> PyResult<()> {
            t.dtype_in(&[DType::I32])?;
            t.shape_is(&[rows], what)?;
            t.contiguous()
        };
        per_row(&self.lengths, "one length per score row")?;
        if let Some(t) = &self.row_starts {
            per_row(t, "one start per score row")?;
        }
        if let Some(t) = &self.offsets {
            per_row(t, "one offset per score row")?;
        }
        self.out.dtype_in(&[DType::I32])?;
        self.out.ndim(2, "(rows, k)")?;
        self.out.shape_is(&[rows, self.out.shape[1]], "one row of k per score row")?;
        self.out.contiguous()?;
        self.out.writable()?;
        if let Some(t) = &self.page_table {
            t.dtype_in(&[DType::I32])?;
            t.ndim(2, "(table rows, width)")?;
            t.packed_from(1)?;
        }
        match (&self.cu_seqlens_q, &self.page_table) {
            (Some(cu), Some(table)) => {
                cu.dtype_in(&[DType::I32])?;
                cu.ndim(1, "(requests + 1,)")?;
                cu.contiguous()?;
                if cu.shape[0] == 0 || cu.shape[0] - 1 > table.shape[0] {
                    return Err(PyValueError::new_err(format!(
                        "`cu_seqlens_q`: {} entries, expected 1 to {} (one per request, plus one; `page_table` has {} rows)",
                        cu.shape[0],
                        table.shape[0] + 1,
                        table.shape[0]
                    )));
                }
            }
            (Some(_), None) => {
                return Err(PyValueError::new_err(
                    "`cu_seqlens_q`: given without `page_table`, expected None (it maps score rows to page-table rows)",
                ))
            }
            _ => {}
        }
        if self.page_table.is_some() && self.offsets.is_some() {
            return Err(PyValueError::new_err(
                "`offsets`: given with `page_table`, expected one transform at a time (slots from a page table, or ragged offsets)",
            ));
        }
        same_device(-1, self.all())
    }

    fn all(&self) -> impl Iterator<Item = &Tensor> {
        [&self.score, &self.lengths, &self.out]
            .into_iter()
            .chain([&self.row_starts, &self.page_table, &self.cu_seqlens_q, &self.offsets].into_iter().flatten())
    }
}

fn launch<T: TopkScoreElem>(rt: &Runtime, a: &Args, page_size: usize, deterministic: bool) -> PyResult<()> {
    let score = a.score.buffer::<T>(rt)?;
    let lengths = a.lengths.buffer::<i32>(rt)?;
    let mut out = a.out.buffer::<i32>(rt)?;
    let starts = a.row_starts.as_ref().map(|t| t.buffer::<i32>(rt)).transpose()?;
    let table = a.page_table.as_ref().map(|t| t.buffer::<i32>(rt)).transpose()?;
    let cu = a.cu_seqlens_q.as_ref().map(|t| t.buffer::<i32>(rt)).transpose()?;
    let offsets = a.offsets.as_ref().map(|t| t.buffer::<i32>(rt)).transpose()?;
    let (score_v, lengths_v) = (score.view(), lengths.view());
    let starts_v = starts.as_ref().map(|b| b.view());
    let (table_v, cu_v, offsets_v): (Option<CudaView<'_, i32>>, _, _) =
        (table.as_ref().map(|b| b.view()), cu.as_ref().map(|b| b.view()), offsets.as_ref().map(|b| b.view()));
    let scores = TopkScores {
        scores: &score_v,
        row_stride: a.score.stride(0)?,
        row_capacity: a.score.shape[1],
        lengths: &lengths_v,
        row_starts: starts_v.as_ref(),
    };
    let output = match (&table_v, &offsets_v) {
        (Some(table), _) => {
            let t = a.page_table.as_ref().expect("viewed above");
            TopkOutput::Paged(PageTable {
                table,
                // A server's table may have more rows than this batch uses.
                rows: a.cu_seqlens_q.as_ref().map_or(t.shape[0], |cu| cu.shape[0] - 1),
                stride: t.stride(0)?,
                width: t.shape[1],
                page_size,
                cu_seqlens_q: cu_v.as_ref(),
            })
        }
        (None, Some(offsets)) => TopkOutput::Ragged { offsets },
        (None, None) => TopkOutput::Plain,
    };
    let k = u32::try_from(a.out.shape[1])
        .map_err(|_| PyValueError::new_err(format!("`out`: width {}, expected k ≤ 2^32 − 1", a.out.shape[1])))?;
    let mut out_v = out.view_mut();
    ops::topk(rt, k, deterministic, &scores, &output, &mut out_v, None).py()
}
