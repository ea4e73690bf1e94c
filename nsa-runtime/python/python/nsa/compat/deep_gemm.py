"""DeepGEMM's lightning-indexer calls of the NSA backend (``fp8_mqa_logits``,
``fp8_paged_mqa_logits``, ``get_paged_mqa_logits_metadata``) on nsa's kernels.

nsa's indexer schedule is a function of the shapes only, so the schedule metadata
is not read: ``get_paged_mqa_logits_metadata`` returns a zeroed int32 tensor of
DeepGEMM's shape ``(num_sms + 1, 2)``, so servers that keep or copy it (CUDA-graph
buffers) work unchanged. Logits rows are padded to a multiple of 4 floats and
returned as a view of DeepGEMM's shape, as DeepGEMM does for its alignment.
Not implemented: per-row ``context_lens`` of shape ``(batch, next_n)``.
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
    its first ``context_lens[b] - next_n + j + 1`` keys; with ``clean_logits`` the
    rest are -inf, otherwise left unwritten."""
    if len(getattr(context_lens, "shape", ())) != 1:
        raise NotImplementedError(
            f"`context_lens`: shape {tuple(getattr(context_lens, 'shape', ()))}, nsa takes one length per request (batch,)"
        )
    if len(q.shape) != 4:
        raise ValueError(f"`q`: shape {tuple(q.shape)}, expected (batch, next_n, heads, 128)")
    batch, next_n = q.shape[0], q.shape[1]
    width = max(max_context_len, block_table.shape[-1] * PAGE_TOKENS)
    logits = _padded(q, batch * next_n, width, "q")
    _paged(q, kv_cache, weights, context_lens, block_table, logits, stream=current_stream(q))
    logits = logits[:, :max_context_len]
    if clean_logits:
        import torch

        pos = torch.arange(max_context_len, device=logits.device)
        last = context_lens.repeat_interleave(next_n) - next_n + torch.arange(next_n, device=logits.device).repeat(batch)
        logits.masked_fill_(pos[None, :] > last[:, None], float("-inf"))
    return logits


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
    _ragged(q, k, k_scales, weights, cu_seqlen_ks, cu_seqlen_ke, logits, stream=current_stream(q))
    if clean_logits:
        import torch

        pos = torch.arange(num_keys, device=logits.device)
        outside = (pos[None, :] < cu_seqlen_ks[:, None]) | (pos[None, :] >= cu_seqlen_ke[:, None])
        logits.masked_fill_(outside, float("-inf"))
    return logits


__all__ = ["get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits", "fp8_mqa_logits"]
