"""Peer for `nsa bench --suite topk`: torch.topk(sorted=False) on the same shapes,
over f32 scores and the same values rounded to bf16 (as `--topk-scores f32,bf16`).

Run on the GPU machine in the same call as the nsa benchmark:
    python3 .ci/bench/torch_topk.py
"""
import torch

K = 2048
REPS = 50
for dtype in [torch.float32, torch.bfloat16]:
    for rows, n in [(64, 131072), (1, 131072), (2048, 32768)]:
        x = torch.rand(rows, n, device="cuda", dtype=torch.float32).to(dtype)
        for _ in range(3):
            torch.topk(x, K, dim=-1, sorted=False)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPS):
            torch.topk(x, K, dim=-1, sorted=False)
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1e3 / REPS
        name = str(dtype).removeprefix("torch.")
        gbps = rows * n * x.element_size() / us / 1e3
        print(f"torch.topk k{K} {name:<8} {rows:>5} rows x {n:>7}: {us:9.2f} us  {gbps:6.0f} GB/s")
