"""The peers of `nsa bench --suite dense`: PyTorch's scaled_dot_product_attention, causal,
with each backend torch offers (flash, cuDNN, memory-efficient), and FlashAttention-3
(`flash_attn_interface`) where installed, on the same shapes: requests of 2048 tokens,
q/k of d_qk and v of d_v per head, bf16. Every request has the same length, so one
[batch, heads, 2048, d] call is the varlen work without padding. The tensors are views
of nsa's [tokens, heads, d] layout (transposed, not copied). Time: CUDA events around
20 back-to-back calls after 3 warm-ups, per call, as `nsa bench` times its kernels.

    python3 .ci/bench/torch_dense.py > rows.txt   # writes $OUT/torch_dense.json
"""

import json
import os
import traceback

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

SEQ = 2048
# (total tokens, heads, d_qk, d_v): as nsa's dense bench.
CASES = [
    (2048, 128, 192, 128),
    (8192, 128, 192, 128),
    (32768, 128, 192, 128),
    (2048, 16, 192, 128),
    (8192, 16, 192, 128),
    (32768, 16, 192, 128),
    (32768, 128, 128, 128),
]
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}
ROWS = []


def timed_us(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def fa3():
    try:
        import flash_attn_interface

        return flash_attn_interface.flash_attn_func
    except Exception:  # noqa: BLE001 - absent is the usual case
        return None


def main():
    dev = torch.device("cuda")
    fa3_func = fa3()
    for tokens, heads, d_qk, d_v in CASES:
        batch = tokens // SEQ
        q = torch.randn(batch, SEQ, heads, d_qk, device=dev, dtype=torch.bfloat16)
        k = torch.randn(batch, SEQ, heads, d_qk, device=dev, dtype=torch.bfloat16)
        v = torch.randn(batch, SEQ, heads, d_v, device=dev, dtype=torch.bfloat16)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        pairs = batch * SEQ * (SEQ + 1) // 2
        flops = 2.0 * pairs * heads * (d_qk + d_v)
        peers = [(name, lambda b=b: _sdpa(qt, kt, vt, b)) for name, b in BACKENDS.items()]
        if fa3_func is not None:
            peers.append(("fa3", lambda: fa3_func(q, k, v, causal=True)))
        for name, fn in peers:
            row = dict(tokens=tokens, seq=SEQ, heads=heads, d_qk=d_qk, d_v=d_v, peer=name)
            try:
                us = timed_us(fn)
                row.update(us=us, tflops=flops / us / 1e6)
            except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is a row
                row.update(error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            ROWS.append(row)
            print(json.dumps(row), flush=True)
    out = os.environ.get("OUT", ".")
    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, fa3=fa3_func is not None, rows=ROWS)
    with open(os.path.join(out, "torch_dense.json"), "w") as f:
        json.dump(report, f, indent=1)


def _sdpa(q, k, v, backend):
    with sdpa_kernel([backend]):
        return sdpa(q, k, v, is_causal=True)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        raise
