"""Type stubs of the extension module (every tensor argument: any DLPack producer,
in practice a torch.Tensor on a CUDA device; ``stream``: the raw launch stream)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

__version__: str

class Config:
    def __init__(self, preset: str = "deepseek-v3.2", **overrides: Union[int, bool, str, Sequence[str]]) -> None: ...
    @staticmethod
    def from_text(text: str, **overrides: Union[int, bool, str, Sequence[str]]) -> "Config": ...
    @staticmethod
    def presets() -> List[Tuple[str, str]]: ...
    def replace(self, **overrides: Union[int, bool, str, Sequence[str]]) -> "Config": ...
    def to_json(self) -> str: ...
    @property
    def page_size(self) -> int: ...
    @property
    def topk(self) -> int: ...
    @property
    def num_q_heads(self) -> int: ...
    @property
    def kv_lora_rank(self) -> int: ...
    @property
    def qk_rope_head_dim(self) -> int: ...
    @property
    def index_n_heads(self) -> int: ...
    @property
    def index_head_dim(self) -> int: ...
    @property
    def kv_cache(self) -> str: ...
    @property
    def targets(self) -> List[str]: ...
    @property
    def topk_bf16_scores(self) -> bool: ...
    def summary(self) -> str: ...
    def kernel_ids(self, deterministic_topk: bool = False) -> List[str]: ...
    def compile(
        self, only: Optional[Sequence[str]] = None, deterministic_topk: bool = False
    ) -> List[Dict[str, Union[str, float]]]: ...

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
    q: Any,
    kv_cache: Any,
    weights: Any,
    context_lens: Any,
    block_table: Any,
    out: Any,
    *,
    fill_width: int = 0,
    stream: Optional[int] = None,
) -> None: ...
def indexer_ragged_logits(
    q: Any, k: Any, k_scales: Any, weights: Any, ks: Any, ke: Any, out: Any, *, fill_width: int = 0, stream: Optional[int] = None
) -> None: ...
def device_of(tensor: Any, name: str = "tensor") -> int: ...
def cache_stats() -> Dict[int, Dict[str, int]]: ...

class Plan:
    """One step's plan (``Layer.plan`` or ``Layer.graph_plan``)."""
    @property
    def mode(self) -> str: ...
    @property
    def rows(self) -> int: ...
    @property
    def padded_rows(self) -> int: ...
    @property
    def is_graph(self) -> bool: ...
    @property
    def use_mha(self) -> bool: ...
    @property
    def keys(self) -> Optional[int]: ...
    @property
    def device(self) -> int: ...
    def explain(self) -> str: ...

class Layer:
    """The extension's layer; use ``nsa.Layer``, which finds the device and stream."""
    def __init__(
        self,
        config: Config,
        *,
        pool_slots: int,
        max_bs: int,
        max_context_len: int,
        max_tokens: Optional[int] = None,
        max_keys: Optional[int] = None,
        draft_tokens: int = 0,
        sm_scale: Optional[float] = None,
        deterministic_topk: bool = False,
        batch_invariant: bool = False,
        logits_budget_bytes: int = 1 << 30,
        prefill_backend: str = "auto",
        mha_one_shot: bool = False,
        device: int = 0,
        stream: Optional[int] = None,
    ) -> None: ...
    @property
    def device(self) -> int: ...
    @property
    def heads(self) -> int: ...
    def plan(
        self,
        mode: str,
        req_to_token: Any,
        req_pool_indices: Any,
        seq_lens: Any,
        seq_lens_cpu: Sequence[int],
        extend_lens: Any = None,
        extend_lens_cpu: Optional[Sequence[int]] = None,
        *,
        stream: Optional[int] = None,
    ) -> Plan: ...
    def graph_plan(self, mode: str, bs: int, *, stream: Optional[int] = None) -> Plan: ...
    def replay(
        self, plan: Plan, req_to_token: Any, req_pool_indices: Any, seq_lens: Any, extend_lens: Any = None, *, stream: Optional[int] = None
    ) -> None: ...
    def forward(
        self,
        plan: Plan,
        q: Any,
        k_nope: Any,
        k_rope: Any,
        out_cache_loc: Any,
        index_q: Any,
        index_weights: Any,
        index_k: Any,
        kv_cache: Any,
        index_k_cache: Any,
        out: Any,
        lse: Any,
        *,
        stream: Optional[int] = None,
    ) -> None: ...
    def mha_store(
        self,
        plan: Plan,
        k_nope: Any,
        k_rope: Any,
        out_cache_loc: Any,
        index_k: Any,
        kv_cache: Any,
        index_k_cache: Any,
        latent: Any = None,
        *,
        stream: Optional[int] = None,
    ) -> None: ...
    def mha_attend(
        self, plan: Plan, q: Any, k: Any, v: Any, out: Any, lse: Any, *, stream: Optional[int] = None
    ) -> None: ...
