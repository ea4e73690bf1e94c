"""DeepGEMM's lightning-indexer calls of the NSA backend (``fp8_mqa_logits``,
``fp8_paged_mqa_logits``, ``get_paged_mqa_logits_metadata``) on nsa's kernels.

nsa's indexer schedule is a function of the shapes only, so the schedule metadata
is not read: ``get_paged_mqa_logits_metadata`` returns a zeroed int32 tensor of
DeepGEMM's shape ``(num_sms + 1, 2)``, so servers that keep or copy it (CUDA-graph
buffers) work unchanged. Logits rows are padded to a multiple of 4 floats and
returned as a view of DeepGEMM's shape, as DeepGEMM does for its alignment.
``context_lens`` is one length per request ``(batch,)`` (row ``b * next_n + j`` sees
``context_lens[b] - next_n + j + 1`` keys) or one per row ``(batch, next_n)`` as
DeepGEMM's current line takes it (row ``b * next_n + j`` sees ``context_lens[b, j]``).
"""

from .._arrays import current_stream, empty
from .._nsa import indexer_paged_logits as _paged
from .._nsa import indexer_ragged_logits as _ragged

PAGE_TOKENS = 64


def _padded(like, rows, width, name):
    """``(rows, width)`` f32 logits inside rows padded to a multiple of 4."""
    padded = empty(like, (rows, max(4, (width + 3) // 4 * 4)), "float32", name)
    return padded[:, :width]


def get_paged_mqa_logits_metadata(context_lens, block_kv: int, num_sms: int):
    """DeepGEMM's schedule tensor, zeroed: nsa schedules from the shapes alone."""
    if block_kv != PAGE_TOKENS:
        raise ValueError(f"`block_kv`: {block_kv}, expected {PAGE_TOKENS} (the indexer cache's page size)")
    out = empty(context_lens, (num_sms + 1, 2), "int32", "context_lens")
    out.zero_()
    return out


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len: int, clean_logits: bool):
    """Logits of ``q`` ``(batch, next_n, heads, 128)`` e4m3 against each request's
    keys in ``kv_cache`` ``(pages, 64, 1, 132)`` through ``block_table``:
    ``(batch * next_n, max_context_len)`` f32. Row ``b * next_n + j`` is valid for
    its first ``context_lens[b] - next_n + j + 1`` keys (``context_lens``
    ``(batch,)``) or ``context_lens[b, j]`` keys (``(batch, next_n)``); with
    ``clean_logits`` the rest are -inf, otherwise left unwritten."""
    if len(q.shape) != 4:
        raise ValueError(f"`q`: shape {tuple(q.shape)}, expected (batch, next_n, heads, 128)")
    batch, next_n = q.shape[0], q.shape[1]
    lens_shape = tuple(getattr(context_lens, "shape", ()))
    if lens_shape not in ((batch,), (batch, next_n)):
        raise ValueError(f"`context_lens`: shape {lens_shape}, expected ({batch},) or ({batch}, {next_n}) for q of shape {tuple(q.shape)}")
    width = max(max_context_len, block_table.shape[-1] * PAGE_TOKENS)
    logits = _padded(q, batch * next_n, width, "q")
    # clean_logits: the kernel itself writes -inf where a row sees no key.
    fill = max_context_len if clean_logits else 0
    if len(lens_shape) == 2:
        # One length per row: each row is a request of its own (its table row repeated).
        rows_q = q.reshape(batch * next_n, 1, *q.shape[2:])
        rows_table = block_table if next_n == 1 else block_table.repeat_interleave(next_n, 0)
        row_lens = context_lens.reshape(batch * next_n)
        _paged(rows_q, kv_cache, weights, row_lens, rows_table, logits, fill_width=fill, stream=current_stream(q))
    else:
        _paged(q, kv_cache, weights, context_lens, block_table, logits, fill_width=fill, stream=current_stream(q))
    return logits[:, :max_context_len]


def fp8_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits: bool = True):
    """Logits of ``q`` ``(rows, heads, 128)`` e4m3 against ``kv = (k, k_scales)``
    (``(num_keys, 128)`` e4m3, ``(num_keys,)`` f32): ``(rows, num_keys)`` f32,
    row t valid on ``[cu_seqlen_ks[t], cu_seqlen_ke[t])``; with ``clean_logits``
    the rest are -inf, otherwise left unwritten."""
    if not isinstance(kv, (tuple, list)) or len(kv) != 2:
        raise TypeError(f"`kv`: {type(kv).__name__}, expected a tuple (k, k_scales)")
    k, k_scales = kv
    if len(q.shape) != 3 or len(k.shape) != 2:
        raise ValueError(f"`q`, `kv[0]`: shapes {tuple(q.shape)}, {tuple(k.shape)}, expected (rows, heads, 128), (num_keys, 128)")
    rows, num_keys = q.shape[0], k.shape[0]
    logits = _padded(q, rows, num_keys, "q")
    fill = num_keys if clean_logits else 0
    _ragged(q, k, k_scales, weights, cu_seqlen_ks, cu_seqlen_ke, logits, fill_width=fill, stream=current_stream(q))
    return logits


__all__ = ["get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits", "fp8_mqa_logits"]
