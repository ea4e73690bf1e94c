"""nsa: DeepSeek V3.2 sparse attention (NSA / DSA) kernels for PyTorch servers.

Kernels are specialised for the call's shapes, JIT-compiled with NVRTC on first use
and cached in memory and on disk (``NSA_CACHE_DIR``; ``NSA_JIT=off`` forbids
compiling). Tensors come in over DLPack without a copy; every launch goes to
``torch.cuda.current_stream()`` of the tensors' device, so results are ready for
the next torch op on that stream without a synchronisation.

``nsa.compat.flash_mla``, ``nsa.compat.sgl_kernel`` and ``nsa.compat.deep_gemm``
are drop-in replacements of the kernel calls SGLang's NSA backend makes (switch by
changing the import); the functions below are nsa's own, taking the outputs too.
``nsa.Layer`` runs a whole attention layer (stores, indexer, top-k, sparse MLA)
from the server's device tables, eagerly or captured in a CUDA graph.
``nsa.Config`` describes one attention configuration (a preset or JSON/TOML, with
keyword overrides) and bakes its kernel set into the cache ahead of the first
launch (``Config(...).compile()``, no GPU needed).
"""

import os as _os


def _nvrtc_from_wheel():
    """The lib folder of the pinned ``nvidia-cuda-nvrtc`` wheel, if installed."""
    try:
        import nvidia  # namespace package of NVIDIA's CUDA wheels
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        lib = _os.path.join(root, "cu13", "lib")
        if _os.path.isfile(_os.path.join(lib, "libnvrtc.so.13")):
            return lib
    return None


if not _os.environ.get("NSA_NVRTC_PATH"):
    _lib = _nvrtc_from_wheel()
    if _lib is not None:
        _os.environ["NSA_NVRTC_PATH"] = _lib

from ._nsa import (  # noqa: E402
    Config,
    DecodePlan,
    __version__,
    cache_stats,
    device_of,
    indexer_paged_logits,
    indexer_ragged_logits,
    sparse_decode,
    sparse_prefill,
    topk,
)
from ._layer import MODES, Layer, Plan  # noqa: E402
from . import compat  # noqa: E402

__all__ = [
    "__version__",
    "Config",
    "DecodePlan",
    "Layer",
    "MODES",
    "Plan",
    "cache_stats",
    "compat",
    "device_of",
    "indexer_paged_logits",
    "indexer_ragged_logits",
    "sparse_decode",
    "sparse_prefill",
    "topk",
]
