"""sgl-kernel's top-k calls of the NSA indexer (``sgl_kernel.fast_topk_v2`` and
the fused transforms), exact, on nsa's kernels.

Beyond sgl-kernel: ``topk`` may be any width nsa compiles (not only 2048), and
``score`` may be bfloat16 as well as float32.
"""

from typing import Optional

from .._arrays import current_stream, empty
from .._nsa import topk as _topk


def _rows(score):
    """Rows of ``score``, read before the output is allocated."""
    shape = getattr(score, "shape", None)
    if shape is None:
        raise TypeError(
            f"`score`: expected a tensor (a torch.Tensor on a CUDA device), got {type(score).__module__}.{type(score).__qualname__}"
        )
    if len(shape) != 2:
        raise ValueError(f"`score`: shape {tuple(shape)}, expected 2 dimensions (rows, keys)")
    return shape[0]


def fast_topk_v2(score, lengths, topk: int, row_starts: Optional[object] = None):
    """Top-``topk`` positions of each row of ``score`` (``(B, L)``) among its first
    ``lengths[b]`` scores from ``row_starts[b]`` (0 when None): int32 ``(B, topk)``,
    relative to the row start, -1 padded."""
    out = empty(score, (_rows(score), topk), "int32", "score")
    _topk(score, lengths, out, row_starts=row_starts, stream=current_stream(score))
    return out


def fast_topk_transform_fused(score, lengths, page_table_size_1, cu_seqlens_q, topk: int, row_starts: Optional[object] = None):
    """Top-k of each row, each position replaced by its slot in
    ``page_table_size_1`` (``(batch, width)``, page size 1): score row b reads the
    table row of the request ``cu_seqlens_q`` (``(batch + 1,)``) puts it in.
    int32 ``(B, topk)``, -1 padded."""
    out = empty(score, (_rows(score), topk), "int32", "score")
    _topk(
        score,
        lengths,
        out,
        row_starts=row_starts,
        page_table=page_table_size_1,
        cu_seqlens_q=cu_seqlens_q,
        page_size=1,
        stream=current_stream(score),
    )
    return out


def fast_topk_transform_ragged_fused(score, lengths, topk_indices_offset, topk: int, row_starts: Optional[object] = None):
    """Top-k of each row, each position plus ``topk_indices_offset[b]`` (an index
    into the ragged KV of the extend batch). int32 ``(B, topk)``, -1 padded."""
    out = empty(score, (_rows(score), topk), "int32", "score")
    _topk(score, lengths, out, row_starts=row_starts, offsets=topk_indices_offset, stream=current_stream(score))
    return out


__all__ = ["fast_topk_v2", "fast_topk_transform_fused", "fast_topk_transform_ragged_fused"]
