"""``nsa.Layer``: a whole NSA attention layer (the KV and indexer-K stores in one
launch, indexer logits, top-k, sparse MLA) over a server's tensors, as the
server's attention backend runs it.

Per step, one plan (``Layer.plan`` for an eager step, ``Layer.graph_plan`` +
``Layer.replay`` under a CUDA graph) built from the server's device tables
(``req_to_token``, ``req_pool_indices``, ``seq_lens``, int32), shared by every
layer of the model; per layer, ``Layer.forward``. Launches go to the current
torch stream of the layer's device. A dropped plan hands its metadata buffers to
the next plan of its mode (ordered by the stream).
"""

from ._arrays import current_stream, empty
from ._nsa import Layer as _Layer
from ._nsa import Plan

MODES = ("decode", "target_verify", "draft_extend", "draft_extend_v2", "extend")


def _ints(values, name):
    """Host lengths as a list of ints (a list, a tuple or a CPU tensor/array)."""
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        return [int(v) for v in values]
    except TypeError:
        raise TypeError(f"`{name}`: {type(values).__name__}, expected a sequence of ints (the host copy of the lengths)") from None


def _device_stream(device):
    """(ordinal, raw current stream) of ``device`` (None: torch's current device);
    without torch, (the ordinal or 0, None), which nsa refuses once the arguments
    are checked."""
    try:
        import torch
    except ImportError:
        return (0 if device is None else int(device)), None
    if device is None:
        index = torch.cuda.current_device()
    else:
        dev = torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"`device`: {dev}, expected a CUDA device")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
    return index, torch._C._cuda_getCurrentRawStream(index)


def _raw_stream_getter():
    """torch's current-raw-stream function (None without torch)."""
    try:
        import torch
    except ImportError:
        return None
    return torch._C._cuda_getCurrentRawStream


class Layer:
    """One attention layer configuration on one CUDA device.

    ``pool_slots``: slots of the KV pool (``pool_size + page_size``: the dummy page
    included); ``max_bs``, ``max_context_len`` (the width of ``req_to_token``),
    ``max_tokens`` (query tokens of an extend step) and ``max_keys`` (KV tokens of
    an extend step) size the metadata buffers; ``draft_tokens``: speculative ``D``
    (target-verify, draft-extend). ``sm_scale`` defaults to DeepSeek V3.2's.
    ``prefill_backend``: ``"auto"`` as the reference chooses, ``"cost"`` (each FP8
    extend batch takes whichever of the two paths nsa's kernel costs estimate
    faster; ``explain()`` gives both estimates), ``"flashmla_sparse"`` (FP8 extend
    dequantizes and runs the prefill kernel) or ``"flashmla_kv"``.
    ``mha_one_shot``: extend steps whose every request fits in the top-k (and whose
    keys fit in ``max_keys``) run dense MHA one-shot, as the reference does:
    ``plan.use_mha`` says so, and the step takes ``mha_store``, the model's
    ``kv_b_proj`` expansion and ``mha_attend`` instead of ``forward``. Off, every
    batch runs absorbed sparse MLA. Constructing compiles (or loads from the cache) every kernel the layer runs.
    """

    def __init__(self, config, *, pool_slots, max_bs, max_context_len, max_tokens=None, max_keys=None,
                 draft_tokens=0, sm_scale=None, deterministic_topk=False, batch_invariant=False,
                 logits_budget_bytes=1 << 30, prefill_backend="auto", mha_one_shot=False, device=None):
        index, stream = _device_stream(device)
        self._layer = _Layer(
            config, pool_slots=pool_slots, max_bs=max_bs, max_context_len=max_context_len, max_tokens=max_tokens,
            max_keys=max_keys, draft_tokens=draft_tokens, sm_scale=sm_scale, deterministic_topk=deterministic_topk,
            batch_invariant=batch_invariant, logits_budget_bytes=logits_budget_bytes,
            prefill_backend=prefill_backend, mha_one_shot=mha_one_shot, device=index, stream=stream,
        )
        self.config = config
        # The per-step calls read the current stream of a known device: no torch.device parsing there.
        self._raw_stream = _raw_stream_getter()

    @property
    def device(self):
        return self._layer.device

    @property
    def heads(self):
        return self._layer.heads

    def _stream(self):
        return None if self._raw_stream is None else self._raw_stream(self._layer.device)

    def plan(self, mode, req_to_token, req_pool_indices, seq_lens, seq_lens_cpu, extend_lens=None, extend_lens_cpu=None):
        """The plan of an eager step in ``mode`` (one of ``MODES``). ``seq_lens``:
        ``L_i`` per request (target-verify: without the drafts); ``extend_lens``:
        query tokens per request (extend; draft_extend: accepted lengths). The
        ``*_cpu`` copies must equal the device values: they size the step."""
        return self._layer.plan(
            mode, req_to_token, req_pool_indices, seq_lens, _ints(seq_lens_cpu, "seq_lens_cpu"), extend_lens,
            _ints(extend_lens_cpu, "extend_lens_cpu"), stream=self._stream(),
        )

    def graph_plan(self, mode, bs):
        """The plan of a CUDA graph of ``bs`` requests in a decode-like ``mode``. Make
        it before capturing; inside the capture, call ``replay`` then ``forward``."""
        return self._layer.graph_plan(mode, bs, stream=self._stream())

    def replay(self, plan, req_to_token, req_pool_indices, seq_lens, extend_lens=None):
        """Rewrites a graph plan's metadata from the device tables (one launch)."""
        self._layer.replay(plan, req_to_token, req_pool_indices, seq_lens, extend_lens, stream=self._stream())

    def forward(self, plan, q, k_nope, k_rope, out_cache_loc, index_q, index_weights, index_k, kv_cache,
                index_k_cache, out=None, lse=None):
        """One layer call for ``plan``'s step; ``T`` = ``plan.padded_rows``.

        ``q`` ``(T, heads, 576)`` bf16 (absorbed q_nope 512 ‖ q_rope 64); ``k_nope``
        ``(T, 512)``, ``k_rope`` ``(T, 64)`` and ``index_k`` ``(T, 128)`` bf16 (any
        row stride: views of one latent tensor work); ``out_cache_loc`` ``(T,)``
        int32 slots; ``index_q`` ``(T, index_heads, 128)`` e4m3; ``index_weights``
        ``(T, index_heads)`` f32. ``kv_cache``: the MLA pool (bf16 ``(..., 576)`` or
        FP8 uint8 ``(..., 656)``), written at ``out_cache_loc``; ``index_k_cache``:
        the indexer pool, uint8 pages of 64 × (128 e4m3 + f32 scale). Returns
        ``(out, lse)``: ``(T, heads, 512)`` bf16 in latent space and ``(T, heads)``
        f32 (natural log), allocated on the current stream unless given."""
        out, lse = self._out_lse(q, plan.padded_rows, 512, out, lse)
        self._layer.forward(
            plan, q, k_nope, k_rope, out_cache_loc, index_q, index_weights, index_k, kv_cache, index_k_cache, out,
            lse, stream=current_stream(q) or self._stream(),
        )
        return out, lse

    def mha_store(self, plan, k_nope, k_rope, out_cache_loc, index_k, kv_cache, index_k_cache, latent=None,
                  read_back=True):
        """An MHA one-shot step's stores (``plan.use_mha``; ``T`` = ``plan.rows``):
        the new tokens' ``k_nope`` ``(T, 512)``, ``k_rope`` ``(T, 64)`` and
        ``index_k`` ``(T, 128)`` into the caches at ``out_cache_loc``, as
        ``forward`` stores them; then every request's latent rows (prefix and new
        tokens, requests in order) read back out of ``kv_cache`` into ``latent``
        ``(plan.keys, 576)`` bf16 (FP8 records dequantized) for the model to expand
        with ``kv_b_proj``. Without cached prefixes (``plan.keys == plan.rows``)
        the model may expand its own rows: ``read_back=False`` skips the read-back
        and returns None. Returns ``latent`` (allocated on the current stream
        unless given)."""
        if not read_back:
            if latent is not None:
                raise ValueError("`latent`: given with read_back=False, expected None (nothing is read back)")
        elif latent is None and plan.use_mha:  # a sparse plan is refused below, naming it
            latent = empty(k_nope, (plan.keys, 576), "bfloat16", "k_nope")
        self._layer.mha_store(
            plan, k_nope, k_rope, out_cache_loc, index_k, kv_cache, index_k_cache, latent,
            stream=current_stream(k_nope) or self._stream(),
        )
        return latent

    def mha_attend(self, plan, q, k, v, out=None, lse=None):
        """An MHA one-shot step's attention: each request's query rows attend
        causally to its keys (its prefix, then its new tokens). ``q`` ``(plan.rows,
        heads, 192)``, ``k`` ``(plan.keys, heads, 192)`` (nope 128 ‖ rope 64) and
        ``v`` ``(plan.keys, heads, 128)`` bf16, keys in ``latent``'s order. Returns
        ``(out, lse)``: ``(plan.rows, heads, 128)`` bf16 and ``(plan.rows, heads)``
        f32 (natural log), allocated on the current stream unless given."""
        out, lse = self._out_lse(q, plan.rows, 128, out, lse)
        self._layer.mha_attend(plan, q, k, v, out, lse, stream=current_stream(q) or self._stream())
        return out, lse

    def _out_lse(self, q, rows, width, out, lse):
        """``out`` ``(rows, heads, width)`` bf16 and ``lse`` ``(rows, heads)`` f32: as
        given, or allocated beside ``q`` on its current stream."""
        heads = self._layer.heads
        if out is None:
            out = empty(q, (rows, heads, width), "bfloat16", "q")
        if lse is None:
            lse = empty(q, (rows, heads), "float32", "q")
        return out, lse

    def __repr__(self):
        return f"nsa.Layer(heads={self.heads}, device=cuda:{self.device})"


__all__ = ["Layer", "Plan", "MODES"]
