"""Peer for `nsa bench --suite prefill`: PyTorch gather + einsum sparse MLA prefill
on the same shapes (s_q 4096, s_kv 32768, top-k 2048, bf16 KV), chunked over
queries so the gathered keys fit in memory.

Run on the GPU machine in the same call as the nsa benchmark:
    python3 .ci/bench/torch_sparse_prefill.py
"""
import torch

S_Q, S_KV, TOPK, REPS, SCALE, CHUNK = 4096, 32768, 2048, 3, 0.1352, 512
CASES = [(128, 576), (64, 576), (32, 576), (16, 576), (128, 512)]


def attend(q, kv, idx, d_qk):
    out = torch.empty(q.shape[0], q.shape[1], 512, device="cuda", dtype=torch.bfloat16)
    for c in range(0, q.shape[0], CHUNK):
        k = kv[idx[c : c + CHUNK]]  # [chunk, topk, 576]
        s = torch.einsum("rhd,rkd->rhk", q[c : c + CHUNK], k[..., :d_qk]).float() * SCALE
        p = torch.softmax(s, dim=-1).to(torch.bfloat16)
        out[c : c + CHUNK] = torch.einsum("rhk,rkd->rhd", p, k[..., :512])
    return out


kv = torch.randn(S_KV, 576, device="cuda", dtype=torch.bfloat16)
idx = torch.rand(S_Q, S_KV, device="cuda").argsort(dim=1)[:, :TOPK]
for heads, d_qk in CASES:
    q = torch.randn(S_Q, heads, d_qk, device="cuda", dtype=torch.bfloat16)
    attend(q, kv, idx, d_qk)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPS):
        attend(q, kv, idx, d_qk)
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1e3 / REPS
    flops = 2 * S_Q * heads * TOPK * (d_qk + 512)
    print(f"torch gather+einsum prefill h{heads:<4} d{d_qk}: {us:10.1f} us  {flops / us / 1e6:6.1f} TFLOP/s")
    del q
