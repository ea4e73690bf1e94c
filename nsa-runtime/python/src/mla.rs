//! Sparse MLA attention over DLPack tensors: decode over the 656-byte FP8 paged
//! cache (with its plan, made once per batch shape), and prefill over bf16 KV rows.

use crate::device::{launch_stream, launch_target, runtime, RestoreContext};
use crate::error::IntoPy;
use crate::tensor::{import, import_opt, same_device, DType};
use nsa_runtime::kernels::layout::{BF16_TOKEN_ELEMS, FP8_TOKEN_BYTES, KV_LORA_RANK};
use nsa_runtime::ops::sparse_decode::{self as decode_ops, DecodeShape, Fp8PagedCache, SparseDecodeInputs};
use nsa_runtime::ops::sparse_prefill::{
    self as prefill_ops, PrefillQuery, PrefillShape, SparsePrefillInputs, SparsePrefillOutputs,
};
use nsa_runtime::ops::Rows;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// How a sparse decode of one batch shape is spread over device `device`:
/// depends only on the shape and the SM count, so one plan serves every step
/// of that shape (and CUDA-graph replays).
#[derive(Debug)]
#[pyclass(frozen, module = "nsa._nsa")]
pub struct DecodePlan {
    plan: decode_ops::DecodePlan,
    device: i32,
}

#[pymethods]
impl DecodePlan {
    #[new]
    #[pyo3(signature = (batch, s_q, heads, topk, page_size, device=0))]
    fn new(batch: usize, s_q: usize, heads: u32, topk: u32, page_size: u32, device: i32) -> PyResult<Self> {
        let shape = DecodeShape { batch, s_q, heads, topk, page_size };
        let plan = decode_ops::DecodePlan::new(shape, launch_target(device)?).py()?;
        Ok(DecodePlan { plan, device })
    }

    /// KV splits per query row (1: no combine launch).
    #[getter]
    fn splits(&self) -> u32 {
        self.plan.splits
    }

    /// Heads per CTA of the chosen kernel.
    #[getter]
    fn head_tile(&self) -> u32 {
        self.plan.head_tile
    }

    /// f32 elements of the workspace `sparse_decode` needs.
    #[getter]
    fn workspace_floats(&self) -> usize {
        self.plan.workspace_floats()
    }

    #[getter]
    fn device(&self) -> i32 {
        self.device
    }

    /// `(batch, s_q, heads, topk, page_size)`.
    #[getter]
    fn shape(&self) -> (usize, usize, u32, u32, u32) {
        let s = self.plan.shape;
        (s.batch, s.s_q, s.heads, s.topk, s.page_size)
    }

    fn explain(&self) -> String {
        self.plan.explain()
    }

    fn __repr__(&self) -> String {
        let (b, s_q, h, k, p) = self.shape();
        format!("DecodePlan(batch={b}, s_q={s_q}, heads={h}, topk={k}, page_size={p}, splits={})", self.plan.splits)
    }
}

/// Sparse MLA decode on `plan`: `q` `(batch, s_q, heads, 576)` bf16 attends, per
/// query row, to the `topk` slots of `indices` (`(batch, s_q, topk)` int32,
/// page × page_size + offset; −1 skipped) in `k_cache` (`(pages, page_size, 1,
/// 656)` bytes). Writes `out` `(batch, s_q, heads, 512)` bf16 and `lse`
/// `(batch, s_q, heads)` f32 (natural log).
#[pyfunction]
#[pyo3(signature = (plan, q, k_cache, indices, out, lse, workspace, *, sm_scale, topk_length=None, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn sparse_decode(
    plan: &DecodePlan,
    q: &Bound<'_, PyAny>,
    k_cache: &Bound<'_, PyAny>,
    indices: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    workspace: &Bound<'_, PyAny>,
    sm_scale: f32,
    topk_length: Option<&Bound<'_, PyAny>>,
    stream: Option<usize>,
) -> PyResult<()> {
    let q = import("q", q, stream)?;
    let k_cache = import("k_cache", k_cache, stream)?;
    let indices = import("indices", indices, stream)?;
    let out = import("out", out, stream)?;
    let lse = import("lse", lse, stream)?;
    let workspace = import("workspace", workspace, stream)?;
    let topk_length = import_opt("topk_length", topk_length, stream)?;

    let s = plan.plan.shape;
    let (b, s_q, h, k) = (s.batch, s.s_q, s.heads as usize, s.topk as usize);
    q.dtype_in(&[DType::Bf16])?;
    q.shape_is(&[b, s_q, h, BF16_TOKEN_ELEMS], "the plan's (batch, s_q, heads) and 576 = latent 512 + rope 64")?;
    q.contiguous()?;
    k_cache.dtype_in(&[DType::U8, DType::F8E4M3])?;
    k_cache.ndim(4, "(pages, page_size, 1, 656)")?;
    let pages = k_cache.shape[0];
    k_cache.shape_is(
        &[pages, s.page_size as usize, 1, FP8_TOKEN_BYTES],
        "the plan's page size, one KV head, 656-byte records",
    )?;
    k_cache.packed_from(1)?;
    indices.dtype_in(&[DType::I32])?;
    indices.shape_is(&[b, s_q, k], "the plan's (batch, s_q, topk)")?;
    indices.contiguous()?;
    if let Some(t) = &topk_length {
        t.dtype_in(&[DType::I32])?;
        t.shape_is(&[b * s_q], "one length per query row (batch × s_q)")?;
        t.contiguous()?;
    }
    out.dtype_in(&[DType::Bf16])?;
    out.shape_is(&[b, s_q, h, KV_LORA_RANK], "(batch, s_q, heads, 512)")?;
    out.contiguous()?;
    out.writable()?;
    lse.dtype_in(&[DType::F32])?;
    lse.shape_is(&[b, s_q, h], "(batch, s_q, heads)")?;
    lse.contiguous()?;
    lse.writable()?;
    workspace.dtype_in(&[DType::F32])?;
    workspace.ndim(1, "(elements,)")?;
    workspace.contiguous()?;
    workspace.writable()?;
    let all = [&q, &k_cache, &indices, &out, &lse, &workspace];
    let ordinal = same_device(plan.device, all.into_iter().chain(topk_length.as_ref()))?;
    let stream = launch_stream(stream)?;
    let _restore = RestoreContext::save()?;
    let rt = runtime(ordinal, stream)?;

    let (qb, cache, idx) = (q.buffer::<half::bf16>(&rt)?, k_cache.buffer::<u8>(&rt)?, indices.buffer::<i32>(&rt)?);
    let lengths = topk_length.as_ref().map(|t| t.buffer::<i32>(&rt)).transpose()?;
    let (mut ob, mut lb, mut wb) =
        (out.buffer::<half::bf16>(&rt)?, lse.buffer::<f32>(&rt)?, workspace.buffer::<f32>(&rt)?);
    let inputs = SparseDecodeInputs {
        q: qb.view(),
        cache: Fp8PagedCache { data: cache.view(), page_size: s.page_size, page_stride: k_cache.stride(0)? },
        indices: idx.view(),
        topk_length: lengths.as_ref().map(|l| l.view()),
        sm_scale,
    };
    decode_ops::sparse_decode(&rt, &plan.plan, &inputs, &mut ob.view_mut(), &mut lb.view_mut(), &mut wb.view_mut()).py()
}

/// Sparse MLA prefill: `q` `(s_q, heads, d_qk)` bf16 attends, per query token, to
/// the rows of `kv` (`(s_kv, 1, d_qk)` bf16) that `indices` (`(s_q, 1, topk)`
/// int32; −1 or ≥ s_kv masked) names. Writes `out` `(s_q, heads, 512)` bf16,
/// `max_logits` and `lse` `(s_q, heads)` f32 (natural log).
#[pyfunction]
#[pyo3(signature = (q, kv, indices, out, max_logits, lse, *, sm_scale, topk_length=None, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn sparse_prefill(
    q: &Bound<'_, PyAny>,
    kv: &Bound<'_, PyAny>,
    indices: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    max_logits: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    sm_scale: f32,
    topk_length: Option<&Bound<'_, PyAny>>,
    stream: Option<usize>,
) -> PyResult<()> {
    let q = import("q", q, stream)?;
    let kv = import("kv", kv, stream)?;
    let indices = import("indices", indices, stream)?;
    let out = import("out", out, stream)?;
    let max_logits = import("max_logits", max_logits, stream)?;
    let lse = import("lse", lse, stream)?;
    let topk_length = import_opt("topk_length", topk_length, stream)?;

    q.dtype_in(&[DType::Bf16])?;
    q.ndim(3, "(s_q, heads, d_qk)")?;
    q.contiguous()?;
    let (s_q, h, d_qk) = (q.shape[0], q.shape[1], q.shape[2]);
    kv.dtype_in(&[DType::Bf16])?;
    kv.ndim(3, "(s_kv, 1, d_qk)")?;
    let s_kv = kv.shape[0];
    kv.shape_is(&[s_kv, 1, d_qk], "one KV head of q's width d_qk")?;
    kv.packed_from(1)?;
    indices.dtype_in(&[DType::I32])?;
    indices.ndim(3, "(s_q, 1, topk)")?;
    let k = indices.shape[2];
    indices.shape_is(&[s_q, 1, k], "q's s_q, one KV head")?;
    indices.contiguous()?;
    if let Some(t) = &topk_length {
        t.dtype_in(&[DType::I32])?;
        t.shape_is(&[s_q], "one length per query token")?;
        t.contiguous()?;
    }
    out.dtype_in(&[DType::Bf16])?;
    out.shape_is(&[s_q, h, KV_LORA_RANK], "(s_q, heads, 512)")?;
    for t in [&out, &max_logits, &lse] {
        if t.name != "out" {
            t.dtype_in(&[DType::F32])?;
            t.shape_is(&[s_q, h], "(s_q, heads)")?;
        }
        t.contiguous()?;
        t.writable()?;
    }
    let heads = u32::try_from(h).map_err(|_| PyValueError::new_err(format!("`q`: {h} heads, expected ≤ 128")))?;
    let topk = u32::try_from(k).map_err(|_| PyValueError::new_err(format!("`indices`: topk {k}, expected ≤ 4096")))?;
    let all = [&q, &kv, &indices, &out, &max_logits, &lse];
    let ordinal = same_device(-1, all.into_iter().chain(topk_length.as_ref()))?;
    let stream = launch_stream(stream)?;
    let _restore = RestoreContext::save()?;
    let rt = runtime(ordinal, stream)?;
    let shape = PrefillShape { s_q, heads, topk, d_qk: d_qk as u32, target: rt.target() };

    let (qb, kvb, idx) = (q.buffer::<half::bf16>(&rt)?, kv.buffer::<half::bf16>(&rt)?, indices.buffer::<i32>(&rt)?);
    let lengths = topk_length.as_ref().map(|t| t.buffer::<i32>(&rt)).transpose()?;
    let (mut ob, mut mb, mut lb) =
        (out.buffer::<half::bf16>(&rt)?, max_logits.buffer::<f32>(&rt)?, lse.buffer::<f32>(&rt)?);
    let inputs = SparsePrefillInputs {
        query: PrefillQuery {
            q: qb.view(),
            indices: idx.view(),
            topk_length: lengths.as_ref().map(|l| l.view()),
            sm_scale,
        },
        kv: Rows { data: kvb.view(), count: s_kv, width: d_qk, stride: kv.stride(0)? },
    };
    let outputs =
        SparsePrefillOutputs { out: &mut ob.view_mut(), max_logits: &mut mb.view_mut(), lse: &mut lb.view_mut() };
    prefill_ops::sparse_prefill(&rt, &shape, &inputs, outputs).py()
}
