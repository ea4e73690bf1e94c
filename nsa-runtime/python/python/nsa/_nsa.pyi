"""Type stubs of the extension module (every tensor argument: any DLPack producer,
in practice a torch.Tensor on a CUDA device; ``stream``: the raw launch stream)."""

from typing import Any, Dict, Optional, Tuple

__version__: str

class DecodePlan:
    def __init__(self, batch: int, s_q: int, heads: int, topk: int, page_size: int, device: int = 0) -> None: ...
    @property
    def splits(self) -> int: ...
    @property
    def head_tile(self) -> int: ...
    @property
    def workspace_floats(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def shape(self) -> Tuple[int, int, int, int, int]: ...
    def explain(self) -> str: ...

def topk(
    score: Any,
    lengths: Any,
    out: Any,
    *,
    row_starts: Optional[Any] = None,
    page_table: Optional[Any] = None,
    cu_seqlens_q: Optional[Any] = None,
    page_size: int = 1,
    offsets: Optional[Any] = None,
    deterministic: bool = False,
    stream: Optional[int] = None,
) -> None: ...
def sparse_decode(
    plan: DecodePlan,
    q: Any,
    k_cache: Any,
    indices: Any,
    out: Any,
    lse: Any,
    workspace: Any,
    *,
    sm_scale: float,
    topk_length: Optional[Any] = None,
    stream: Optional[int] = None,
) -> None: ...
def sparse_prefill(
    q: Any,
    kv: Any,
    indices: Any,
    out: Any,
    max_logits: Any,
    lse: Any,
    *,
    sm_scale: float,
    topk_length: Optional[Any] = None,
    stream: Optional[int] = None,
) -> None: ...
def indexer_paged_logits(
    q: Any, kv_cache: Any, weights: Any, context_lens: Any, block_table: Any, out: Any, *, stream: Optional[int] = None
) -> None: ...
def indexer_ragged_logits(
    q: Any, k: Any, k_scales: Any, weights: Any, ks: Any, ke: Any, out: Any, *, stream: Optional[int] = None
) -> None: ...
def device_of(tensor: Any, name: str = "tensor") -> int: ...
def cache_stats() -> Dict[int, Dict[str, int]]: ...
