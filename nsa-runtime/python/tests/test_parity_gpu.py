"""The Python functions against the Rust path, bit for bit: the GPU test
`python_parity_ops_repeat_bit_for_bit_and_dump` (tests/tests/gpu/python_parity.rs)
runs each op on seeded inputs and writes inputs and outputs to NSA_PARITY_DIR;
here the same inputs go through nsa's Python functions on torch tensors and every
output bit must match. Run the Rust test first, with the same NSA_PARITY_DIR:

    NSA_PARITY_DIR=/tmp/parity cargo test --release -p nsa-tests --features gpu --test gpu python_parity
    NSA_PARITY_DIR=/tmp/parity python -m pytest nsa-runtime/python/tests/test_parity_gpu.py
"""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import nsa  # noqa: E402

DIR = os.environ.get("NSA_PARITY_DIR")
if not DIR or not os.path.exists(os.path.join(DIR, "manifest.json")):
    pytest.skip("NSA_PARITY_DIR does not hold the Rust side's dump (see the module docstring)", allow_module_level=True)

with open(os.path.join(DIR, "manifest.json")) as f:
    MANIFEST = json.load(f)

NUMPY = {"uint8": np.uint8, "int32": np.int32, "float32": np.float32, "bfloat16": np.int16}
TORCH = {"uint8": torch.uint8, "int32": torch.int32, "float32": torch.float32, "bfloat16": torch.bfloat16}


def load(case, name):
    """An array of the dump on the GPU, with its dtype and shape."""
    meta = MANIFEST[case][name]
    raw = np.fromfile(os.path.join(DIR, meta["file"]), dtype=NUMPY[meta["dtype"]]).reshape(meta["shape"])
    t = torch.from_numpy(raw.copy())
    if meta["dtype"] == "bfloat16":
        t = t.view(torch.bfloat16)
    return t.cuda()


def same_bits(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype} {tuple(got.shape)}"
    g, w = got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)
    differ = (g != w).sum().item()
    assert differ == 0, f"{what}: {differ} bytes differ from the Rust path"


@pytest.mark.parametrize("case", ["topk_plain", "topk_paged", "topk_ragged"])
def test_topk(case):
    score, lengths, starts = load(case, "score"), load(case, "lengths"), load(case, "row_starts")
    want = load(case, "out")
    out = torch.full_like(want, 12345)
    kw = {}
    if case == "topk_paged":
        kw["page_table"] = load(case, "page_table")
    if case == "topk_ragged":
        kw["offsets"] = load(case, "offsets")
    nsa.topk(score, lengths, out, row_starts=starts, stream=torch.cuda.current_stream().cuda_stream, **kw)
    torch.cuda.synchronize()
    same_bits(out, want, case)


def test_sparse_decode():
    c = "sparse_decode"
    q, cache, idx, tl = load(c, "q"), load(c, "k_cache"), load(c, "indices"), load(c, "topk_length")
    scale = float(load(c, "sm_scale")[0])
    b, s_q, h = q.shape[0], q.shape[1], q.shape[2]
    plan = nsa.DecodePlan(b, s_q, h, idx.shape[-1], cache.shape[1], q.device.index)
    out = torch.empty(b, s_q, h, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(b, s_q, h, dtype=torch.float32, device="cuda")
    ws = torch.empty(max(plan.workspace_floats, 1), dtype=torch.float32, device="cuda")
    nsa.sparse_decode(plan, q, cache, idx, out, lse, ws, sm_scale=scale, topk_length=tl,
                      stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    same_bits(out, load(c, "out"), "sparse_decode out")
    same_bits(lse, load(c, "lse"), "sparse_decode lse")


def test_sparse_prefill():
    c = "sparse_prefill"
    q, kv, idx, tl = load(c, "q"), load(c, "kv"), load(c, "indices"), load(c, "topk_length")
    scale = float(load(c, "sm_scale")[0])
    s_q, h = q.shape[0], q.shape[1]
    out = torch.empty(s_q, h, 512, dtype=torch.bfloat16, device="cuda")
    max_logits = torch.empty(s_q, h, dtype=torch.float32, device="cuda")
    lse = torch.empty(s_q, h, dtype=torch.float32, device="cuda")
    nsa.sparse_prefill(q, kv, idx, out, max_logits, lse, sm_scale=scale, topk_length=tl,
                       stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    same_bits(out, load(c, "out"), "sparse_prefill out")
    same_bits(max_logits, load(c, "max_logits"), "sparse_prefill max_logits")
    same_bits(lse, load(c, "lse"), "sparse_prefill lse")


def test_indexer_paged_logits():
    c = "indexer_paged"
    q = load(c, "q").view(torch.float8_e4m3fn)
    cache = load(c, "kv_cache")
    want = load(c, "out")
    out = torch.zeros_like(want)
    nsa.indexer_paged_logits(q, cache, load(c, "weights"), load(c, "context_lens"), load(c, "block_table"), out,
                             stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    same_bits(out, want, "indexer_paged_logits")


def test_indexer_ragged_logits():
    c = "indexer_ragged"
    q = load(c, "q").view(torch.float8_e4m3fn)
    k = load(c, "k").view(torch.float8_e4m3fn)
    ks, ke = load(c, "ks"), load(c, "ke")
    out = torch.zeros(q.shape[0], k.shape[0], dtype=torch.float32, device="cuda")
    nsa.indexer_ragged_logits(q, k, load(c, "k_scales"), load(c, "weights"), ks, ke, out,
                              stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    windows = torch.cat([out[r, ks[r]:ke[r]] for r in range(out.shape[0])])
    same_bits(windows, load(c, "out_in_windows"), "indexer_ragged_logits")
