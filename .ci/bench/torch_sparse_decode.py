"""Peer for `nsa bench --suite decode`: PyTorch gather + einsum sparse MLA decode
on the same shapes (top-k 2048 of 16K keys per request, bf16 KV gathered by slot).

Run on the GPU machine in the same call as the nsa benchmark:
    python3 .ci/bench/torch_sparse_decode.py
"""
import torch

TOPK, KEYS, REPS, SCALE = 2048, 16384, 20, 0.1352
CASES = [(1, 1, 128), (32, 1, 128), (128, 1, 128), (64, 2, 128), (128, 1, 64), (128, 1, 16), (1, 1, 16), (32, 1, 16)]


def attend(q, kv, idx):
    k = kv[idx]  # [rows, topk, 576]
    s = torch.einsum("rhd,rkd->rhk", q, k).float() * SCALE
    p = torch.softmax(s, dim=-1).to(torch.bfloat16)
    return torch.einsum("rhk,rkd->rhd", p, k[..., :512])


for batch, s_q, heads in CASES:
    rows = batch * s_q
    kv = torch.randn(batch * KEYS, 576, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(rows, heads, 576, device="cuda", dtype=torch.bfloat16)
    base = (torch.arange(rows, device="cuda") // s_q * KEYS).unsqueeze(1)
    idx = torch.rand(rows, KEYS, device="cuda").argsort(dim=1)[:, :TOPK] + base
    for _ in range(3):
        attend(q, kv, idx)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPS):
        attend(q, kv, idx)
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1e3 / REPS
    flops = 2 * rows * heads * TOPK * (576 + 512)
    print(f"torch gather+einsum b{batch:<4} s_q{s_q} h{heads:<4}: {us:9.2f} us  {flops / us / 1e6:6.1f} TFLOP/s")
    del kv, q, idx
