"""Output allocation and the launch stream, for torch tensors and other arrays."""

import sys

from ._nsa import device_of


def _torch():
    return sys.modules.get("torch")


def current_stream(like):
    """The raw handle of the current stream of ``like``'s CUDA device (torch), or
    None when ``like`` is not a torch CUDA tensor (nsa then refuses it by device)."""
    torch = _torch()
    if torch is None or not isinstance(like, torch.Tensor) or not like.is_cuda:
        return None
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(like.device.index)
    return torch.cuda.current_stream(like.device).cuda_stream


def empty(like, shape, dtype, name):
    """An uninitialised array of ``shape`` and ``dtype`` (a name: "int32", ...) on
    the CUDA device of ``like`` (argument ``name``), from ``like``'s own library:
    torch's caching allocator for a torch tensor, so the memory is ordered on its
    current stream. Anything not on a CUDA device is refused, naming ``name``."""
    torch = _torch()
    if torch is not None and isinstance(like, torch.Tensor) and like.is_cuda:
        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    device_of(like, name)  # raises for anything not on a CUDA device
    xp = like.__array_namespace__()
    return xp.empty(shape, dtype=getattr(xp, dtype), device=like.device)
