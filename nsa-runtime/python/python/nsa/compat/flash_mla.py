"""FlashMLA's DeepSeek V3.2 sparse calls (``flash_mla.get_mla_metadata``,
``flash_mla_with_kvcache`` with ``indices`` on the 656-byte FP8 cache,
``flash_mla_sparse_fwd``) on nsa's kernels, for Hopper and Blackwell alike.

Beyond FlashMLA: any head count nsa compiles (1-16, or a multiple of 16 up to
128; FlashMLA takes 64 or 128), without padding. Not implemented (each raises
``NotImplementedError`` naming the argument): dense decode (``indices=None``),
``attn_sink``, ``extra_k_cache`` / ``extra_indices_in_kvcache`` /
``extra_topk_length``.
"""

import dataclasses
from typing import Optional, Tuple

from .._arrays import current_stream, empty
from .._nsa import DecodePlan, device_of
from .._nsa import sparse_decode as _sparse_decode
from .._nsa import sparse_prefill as _sparse_prefill

V_DIM = 512


@dataclasses.dataclass
class FlashMLASchedMeta:
    """The decode schedule of one batch shape: made on the first
    ``flash_mla_with_kvcache`` call that uses it, reused (and checked) after."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int] = None
        extra_topk: Optional[int] = None

    have_initialized: bool = False
    config: Optional[Config] = None
    # nsa's plan (split count, kernel) and its workspace, standing where FlashMLA
    # keeps its tile scheduler metadata and split counts.
    tile_scheduler_metadata: Optional[DecodePlan] = None
    num_splits: Optional[object] = None
    workspace: Optional[object] = None
    # The shapes and flags of the last call that passed every check.
    _key: Optional[tuple] = dataclasses.field(default=None, repr=False, compare=False)


def get_mla_metadata(*args, **kwargs) -> Tuple[FlashMLASchedMeta, None]:
    """An empty schedule, filled by the first ``flash_mla_with_kvcache`` call
    (arguments are accepted and ignored, as FlashMLA's current line does)."""
    return FlashMLASchedMeta(), None


def _unsupported(**given):
    for name, value in given.items():
        if value is not None:
            raise NotImplementedError(f"`{name}`: nsa's sparse MLA does not take it (pass None)")


def _check_decode_args(q, k_cache, indices, head_dim_v, meta, num_splits, causal, is_fp8_kvcache, attn_sink,
                       extra_k_cache, extra_indices_in_kvcache, extra_topk_length):
    """Every argument check of ``flash_mla_with_kvcache``; sets the schedule up on
    its first call."""
    if indices is None:
        raise NotImplementedError("`indices`: None asks for dense decode; nsa implements the sparse path (pass indices)")
    _unsupported(
        attn_sink=attn_sink,
        extra_k_cache=extra_k_cache,
        extra_indices_in_kvcache=extra_indices_in_kvcache,
        extra_topk_length=extra_topk_length,
    )
    if not isinstance(meta, FlashMLASchedMeta):
        raise TypeError(
            f"`tile_scheduler_metadata`: {type(meta).__name__}, expected the FlashMLASchedMeta "
            "of nsa.compat.flash_mla.get_mla_metadata()"
        )
    if num_splits is not None:
        raise ValueError("`num_splits`: expected None (the schedule lives in tile_scheduler_metadata)")
    if head_dim_v != V_DIM:
        raise ValueError(f"`head_dim_v`: {head_dim_v}, expected {V_DIM}")
    if causal:
        raise ValueError("`causal`: True, expected False with sparse attention (indices choose the keys)")
    if not is_fp8_kvcache:
        raise ValueError("`is_fp8_kvcache`: False, expected True (sparse decode reads the 656-byte FP8 records)")
    if len(q.shape) != 4 or len(k_cache.shape) != 4 or len(indices.shape) != 3:
        raise ValueError(
            f"`q`, `k_cache`, `indices`: shapes {tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(indices.shape)}, "
            "expected (batch, s_q, heads, 576), (pages, page_size, 1, 656), (batch, s_q, topk)"
        )
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    topk = indices.shape[-1]
    config = FlashMLASchedMeta.Config(b, s_q, h_q, k_cache.shape[1], k_cache.shape[2], causal, is_fp8_kvcache, topk)
    if not meta.have_initialized:
        plan = DecodePlan(b, s_q, h_q, topk, k_cache.shape[1], device_of(q, "q"))
        meta.tile_scheduler_metadata = plan
        meta.num_splits = plan.splits
        meta.workspace = empty(q, (max(plan.workspace_floats, 1),), "float32", "q")
        meta.config = config
        meta.have_initialized = True
    elif meta.config != config:
        raise ValueError(
            f"`tile_scheduler_metadata`: made for {meta.config}, used for {config}; take a new get_mla_metadata() "
            "for each batch shape"
        )


def flash_mla_with_kvcache(
    q,
    k_cache,
    block_table,
    cache_seqlens,
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    num_splits: None = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices=None,
    attn_sink=None,
    extra_k_cache=None,
    extra_indices_in_kvcache=None,
    topk_length=None,
    extra_topk_length=None,
):
    """Sparse decode: ``q`` ``(batch, s_q, heads, 576)`` bf16 over ``k_cache``
    ``(pages, page_size, 1, 656)`` (FP8 records) at the slots ``indices``
    ``(batch, s_q, topk)`` int32 gives (-1 skipped); ``topk_length`` ``(batch,)``
    keeps only the first entries of each row. Returns ``out`` ``(batch, s_q,
    heads, 512)`` bf16 and ``softmax_lse`` ``(batch, heads, s_q)`` f32 (natural
    log; a transposed view of nsa's ``(batch, s_q, heads)``)."""
    meta = tile_scheduler_metadata
    # A schedule that is set up was made for one shape and these flags: a step of
    # that shape skips the argument checks below (its shapes are one tuple compare).
    q_shape = q.shape
    key = (q_shape, k_cache.shape[1:3], indices.shape[-1] if indices is not None else None, head_dim_v, causal, is_fp8_kvcache)
    if not (
        type(meta) is FlashMLASchedMeta
        and meta.have_initialized
        and meta._key == key
        and num_splits is None
        and attn_sink is None
        and extra_k_cache is None
        and extra_indices_in_kvcache is None
        and extra_topk_length is None
    ):
        _check_decode_args(q, k_cache, indices, head_dim_v, meta, num_splits, causal, is_fp8_kvcache, attn_sink,
                           extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
        meta._key = key
    b, s_q, h_q = q_shape[0], q_shape[1], q_shape[2]
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    if topk_length is not None and s_q > 1:
        topk_length = topk_length.repeat_interleave(s_q)
    out = empty(q, (b, s_q, h_q, V_DIM), "bfloat16", "q")
    lse = empty(q, (b, s_q, h_q), "float32", "q")
    _sparse_decode(
        meta.tile_scheduler_metadata,
        q,
        k_cache,
        indices,
        out,
        lse,
        meta.workspace,
        sm_scale=softmax_scale,
        topk_length=topk_length,
        stream=current_stream(q),
    )
    return out, lse.transpose(1, 2)


def flash_mla_sparse_fwd(q, kv, indices, sm_scale: float, d_v: int = 512, attn_sink=None, topk_length=None):
    """Sparse prefill: ``q`` ``(s_q, heads, d_qk)`` bf16 over the rows of ``kv``
    ``(s_kv, 1, d_qk)`` that ``indices`` ``(s_q, 1, topk)`` int32 names (-1 or
    >= s_kv masked; d_qk 576 or 512). Returns ``(out, max_logits, lse)``:
    ``(s_q, heads, 512)`` bf16, ``(s_q, heads)`` f32 twice (natural log)."""
    _unsupported(attn_sink=attn_sink)
    if d_v != V_DIM:
        raise ValueError(f"`d_v`: {d_v}, expected {V_DIM}")
    if len(q.shape) != 3:
        raise ValueError(f"`q`: shape {tuple(q.shape)}, expected (s_q, heads, d_qk)")
    s_q, h_q = q.shape[0], q.shape[1]
    out = empty(q, (s_q, h_q, V_DIM), "bfloat16", "q")
    max_logits = empty(q, (s_q, h_q), "float32", "q")
    lse = empty(q, (s_q, h_q), "float32", "q")
    _sparse_prefill(
        q, kv, indices, out, max_logits, lse, sm_scale=sm_scale, topk_length=topk_length, stream=current_stream(q)
    )
    return out, max_logits, lse


__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd"]
