"""Output allocation and the launch stream, for torch tensors and other arrays.

Both sit on every call's host path, so the torch case is kept to a few C-level
calls: the dtype objects are looked up once, ``Tensor.new_empty`` allocates on the
tensor's own device without parsing a device argument, and the raw stream handle
comes from torch's C binding."""

import sys

from ._nsa import device_of

_TORCH = {}  # "torch": the module; dtype name -> torch.dtype


def _torch():
    torch = _TORCH.get("torch")
    if torch is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        _TORCH["torch"] = torch
        _TORCH["raw_stream"] = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return torch


def _is_torch_cuda(torch, like):
    return torch is not None and isinstance(like, torch.Tensor) and like.is_cuda


def current_stream(like):
    """The raw handle of the current stream of ``like``'s CUDA device (torch), or
    None when ``like`` is not a torch CUDA tensor (nsa then refuses it by device)."""
    torch = _torch()
    if not _is_torch_cuda(torch, like):
        return None
    raw = _TORCH["raw_stream"]
    if raw is not None:
        return raw(like.get_device())
    return torch.cuda.current_stream(like.device).cuda_stream


def _torch_dtype(torch, name):
    dtype = _TORCH.get(name)
    if dtype is None:
        dtype = _TORCH[name] = getattr(torch, name)
    return dtype


def empty(like, shape, dtype, name):
    """An uninitialised array of ``shape`` and ``dtype`` (a name: "int32", ...) on
    the CUDA device of ``like`` (argument ``name``), from ``like``'s own library:
    torch's caching allocator for a torch tensor, so the memory is ordered on its
    current stream. Anything not on a CUDA device is refused, naming ``name``."""
    torch = _torch()
    if _is_torch_cuda(torch, like):
        return like.new_empty(shape, dtype=_torch_dtype(torch, dtype))
    device_of(like, name)  # raises for anything not on a CUDA device
    xp = like.__array_namespace__()
    return xp.empty(shape, dtype=getattr(xp, dtype), device=like.device)
