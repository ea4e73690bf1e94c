"""The package on a CUDA GPU with PyTorch: every compat function against a torch
reference written here, on the edge cases of the Rust GPU suite (-1 holes, short
rows, every head count, page sizes 1 and 64, s_q 1-2), launches on torch's current
stream, and CUDA-graph capture + replay equal to eager. Run on a GPU machine:
`pytest nsa-runtime/python/tests/test_gpu.py` (it fails, never skips, without one)."""

import math

import pytest
import torch

from nsa.compat import deep_gemm, flash_mla, sgl_kernel

assert torch.cuda.is_available(), "test_gpu.py needs a CUDA GPU (run it on the GPU machine)"
DEV = torch.device("cuda")
K = 2048


def gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


# ------------------------------------------------------------------ top-k


def topk_sets_equal(score, lengths, starts, got, k, transform=lambda b, pos: pos):
    """Each row's chosen set is the exact top-k set of its window (ties: any
    equal-valued choice), mapped through ``transform``."""
    for b in range(score.shape[0]):
        n, s = int(lengths[b]), int(starts[b]) if starts is not None else 0
        row = score[b, s : s + n].float()
        valid = got[b][got[b] >= 0]
        assert valid.numel() == min(n, k), f"row {b}: {valid.numel()} entries for length {n}"
        assert (got[b][valid.numel() :] == -1).all(), f"row {b}: -1 padding after the valid entries"
        if n <= k:
            want = transform(b, torch.arange(n, device=DEV, dtype=torch.int64))
            assert sorted(valid.tolist()) == sorted(want.tolist()), f"row {b}"
            continue
        kth = torch.topk(row, k).values[-1]
        want_strict = transform(b, torch.nonzero(row > kth).flatten())
        assert set(want_strict.tolist()) <= set(valid.tolist()), f"row {b}: a score above the k-th is missing"
        allowed = set(transform(b, torch.nonzero(row >= kth).flatten()).tolist())
        assert set(valid.tolist()) <= allowed, f"row {b}: a chosen score is below the k-th"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, keys", [(1, 131072), (4, 16384), (64, 8192), (300, 4096)])
def test_fast_topk_v2(rows, keys, dtype):
    score = torch.randn(rows, keys, generator=gen(rows + keys), device=DEV).to(dtype)
    lengths = torch.randint(1, keys + 1, (rows,), generator=gen(7), device=DEV, dtype=torch.int32)
    lengths[0] = keys
    if rows > 1:
        lengths[1] = 100  # shorter than k
    got = sgl_kernel.fast_topk_v2(score, lengths, K)
    assert got.shape == (rows, K) and got.dtype == torch.int32
    topk_sets_equal(score, lengths, None, got, K)


def test_fast_topk_v2_row_starts_and_row_stride():
    wide = torch.rand(8, 20000, generator=gen(3), device=DEV)
    score = wide[:, :16384]  # row stride 20000
    starts = torch.tensor([0, 5, 100, 3000, 0, 7, 16000, 64], dtype=torch.int32, device=DEV)
    lengths = torch.minimum(torch.full((8,), 9000, dtype=torch.int32, device=DEV), 16384 - starts)
    got = sgl_kernel.fast_topk_v2(score, lengths, K, row_starts=starts)
    topk_sets_equal(score, lengths, starts, got, K)


def test_fast_topk_transform_fused_page_table_1():
    batch, keys = 3, 8192
    cu = torch.tensor([0, 2, 3, 6], dtype=torch.int32, device=DEV)  # request r owns rows cu[r]..cu[r+1]
    rows = int(cu[-1])
    score = torch.rand(rows, keys, generator=gen(5), device=DEV)
    lengths = torch.tensor([8192, 3000, 8192, 100, 5000, 8192], dtype=torch.int32, device=DEV)
    # Two rows more than requests: a server's table sized for its largest batch.
    table = torch.randperm((batch + 2) * keys, generator=gen(6), device=DEV).to(torch.int32).view(batch + 2, keys)
    got = sgl_kernel.fast_topk_transform_fused(score, lengths, table, cu, K)
    request = torch.repeat_interleave(torch.arange(batch, device=DEV), (cu[1:] - cu[:-1]).long())
    topk_sets_equal(score, lengths, None, got, K, lambda b, pos: table[request[b]][pos].long())


def test_fast_topk_transform_ragged_fused():
    score = torch.rand(5, 12000, generator=gen(8), device=DEV)
    lengths = torch.tensor([12000, 50, 4096, 2049, 2048], dtype=torch.int32, device=DEV)
    offsets = torch.tensor([0, 17, 100000, 3, 5], dtype=torch.int32, device=DEV)
    got = sgl_kernel.fast_topk_transform_ragged_fused(score, lengths, offsets, K)
    topk_sets_equal(score, lengths, None, got, K, lambda b, pos: pos + int(offsets[b]))


def test_launches_follow_the_current_stream():
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        score = torch.rand(16, 32768, device=DEV)  # produced on the side stream
        lengths = torch.full((16,), 32768, dtype=torch.int32, device=DEV)
        got = sgl_kernel.fast_topk_v2(score, lengths, K)
        ref = torch.topk(score, K).indices.sort(dim=1).values
        same = (got.long().sort(dim=1).values == ref).all()
    side.synchronize()
    assert bool(same)


def test_cuda_graph_capture_and_replay_equal_eager():
    score = torch.rand(32, 16384, generator=gen(9), device=DEV)
    lengths = torch.full((32,), 16384, dtype=torch.int32, device=DEV)
    sgl_kernel.fast_topk_v2(score, lengths, K)  # compile and load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sgl_kernel.fast_topk_v2(score, lengths, K)
    for seed in (10, 11):
        score.copy_(torch.rand(32, 16384, generator=gen(seed), device=DEV))
        lengths.fill_(9000 + seed)
        graph.replay()
        eager = sgl_kernel.fast_topk_v2(score, lengths, K)
        torch.cuda.synchronize()
        assert torch.equal(captured.sort(dim=1).values, eager.sort(dim=1).values)


def test_cuda_errors_name_the_argument():
    score = torch.rand(4, 4096, device=DEV)
    with pytest.raises(TypeError, match=r"`lengths`: dtype int64, expected int32"):
        sgl_kernel.fast_topk_v2(score, torch.full((4,), 4096, device=DEV), K)
    with pytest.raises(ValueError, match=r"`lengths`: on cpu, expected a CUDA tensor on cuda:0"):
        sgl_kernel.fast_topk_v2(score, torch.full((4,), 4096, dtype=torch.int32), K)
    with pytest.raises(ValueError, match=r"`score`: on cpu"):
        sgl_kernel.fast_topk_v2(score.cpu(), torch.full((4,), 4096, dtype=torch.int32), K)
    with pytest.raises(ValueError, match=r"`score`: strides"):
        sgl_kernel.fast_topk_v2(score.t(), torch.full((4096,), 4, dtype=torch.int32, device=DEV), K)


# ------------------------------------------------------------------ sparse MLA


def fp8_records(tokens, seed):
    """656-byte FP8 records: 512 e4m3 (bytes & 0x77: finite), 4 f32 scales, 64 bf16 rope."""
    g = gen(seed)
    rec = torch.empty(tokens, 656, dtype=torch.uint8, device=DEV)
    rec[:, :512] = torch.randint(0, 256, (tokens, 512), generator=g, device=DEV, dtype=torch.uint8) & 0x77
    scales = torch.rand(tokens, 4, generator=g, device=DEV) * 0.018 + 0.002
    rec[:, 512:528] = scales.view(torch.uint8)
    rope = (torch.rand(tokens, 64, generator=g, device=DEV) * 2 - 1).to(torch.bfloat16)
    rec[:, 528:] = rope.view(torch.uint8)
    return rec


def dequant(rec):
    nope = rec[:, :512].view(torch.float8_e4m3fn).float().view(-1, 4, 128)
    scales = rec[:, 512:528].contiguous().view(torch.float32).view(-1, 4, 1)
    rope = rec[:, 528:].contiguous().view(torch.bfloat16).float()
    return torch.cat([(nope * scales).view(-1, 512), rope], dim=1)


def ref_attend(q, kv, valid, scale):
    """q [rows, h, d], kv [rows, topk, d] (v = first 512), valid [rows, topk]."""
    s = torch.einsum("rhd,rkd->rhk", q.float(), kv.float()) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("rhk,rkd->rhd", p, kv[..., :512].float()), lse


@pytest.mark.parametrize("heads", [1, 16, 32, 64, 128])
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("page", [1, 64])
def test_flash_mla_with_kvcache_sparse_fp8(heads, s_q, page):
    batch, topk, pages = 3, 2048, 8192 // page * 3
    tokens = pages * page
    rec = fp8_records(tokens, heads * 10 + s_q + page)
    cache = rec.view(pages, page, 1, 656)
    q = (torch.rand(batch, s_q, heads, 576, generator=gen(1), device=DEV) * 2 - 1).to(torch.bfloat16)
    idx = torch.randint(0, tokens, (batch, s_q, topk), generator=gen(2), device=DEV, dtype=torch.int32)
    idx[0, :, 100:300] = -1  # holes
    idx[1, :, 1000:] = -1  # a short row
    topk_length = torch.tensor([topk, topk, 1500], dtype=torch.int32, device=DEV)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, cache, None, None, 512, meta, softmax_scale=0.07, is_fp8_kvcache=True, indices=idx, topk_length=topk_length
    )
    assert out.shape == (batch, s_q, heads, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (batch, heads, s_q) and lse.dtype == torch.float32
    rows = batch * s_q
    flat = idx.view(rows, topk).long()
    lim = topk_length.repeat_interleave(s_q)[:, None]
    valid = (flat >= 0) & (torch.arange(topk, device=DEV)[None, :] < lim)
    kv = dequant(rec)[flat.clamp(min=0)]
    want, want_lse = ref_attend(q.view(rows, heads, 576), kv, valid, 0.07)
    got = out.view(rows, heads, 512).float()
    assert (got - want).abs().max().item() < 2e-2
    assert (lse.transpose(1, 2).reshape(rows, heads) - want_lse).abs().max().item() < 1e-3
    # The schedule is reused for the same shape and refused for another.
    again, _ = flash_mla.flash_mla_with_kvcache(
        q, cache, None, None, 512, meta, softmax_scale=0.07, is_fp8_kvcache=True, indices=idx, topk_length=topk_length
    )
    assert torch.equal(again, out)
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        flash_mla.flash_mla_with_kvcache(q[:2], cache, None, None, 512, meta, is_fp8_kvcache=True, indices=idx[:2])


@pytest.mark.parametrize("heads", [16, 64, 128])
@pytest.mark.parametrize("d_qk", [576, 512])
def test_flash_mla_sparse_fwd(heads, d_qk):
    s_q, s_kv, topk = 96, 5000, 2048
    q = (torch.rand(s_q, heads, d_qk, generator=gen(3), device=DEV) * 2 - 1).to(torch.bfloat16)
    kv = (torch.rand(s_kv, 1, d_qk, generator=gen(4), device=DEV) * 2 - 1).to(torch.bfloat16)
    idx = torch.randint(0, s_kv, (s_q, 1, topk), generator=gen(5), device=DEV, dtype=torch.int32)
    idx[:, :, 2000:] = -1
    idx[3, 0, :10] = s_kv + 7  # beyond s_kv: masked
    idx[5] = -1  # a query with no valid index
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.05)
    flat = idx.view(s_q, topk).long()
    valid = (flat >= 0) & (flat < s_kv)
    want, want_lse = ref_attend(q, kv[:, 0][flat.clamp(0, s_kv - 1)], valid, 0.05)
    assert (out.float() - want).abs().max().item() < 2e-2
    ok = valid.any(dim=1)
    assert (lse[ok] - want_lse[ok]).abs().max().item() < 1e-3
    assert (out[5] == 0).all() and torch.isinf(lse[5]).all() and (max_logits[5] == float("-inf")).all()


# ------------------------------------------------------------------ indexer logits


def indexer_pages(pages, seed):
    g = gen(seed)
    cache = torch.empty(pages, 64 * 132, dtype=torch.uint8, device=DEV)
    cache[:, : 64 * 128] = torch.randint(0, 256, (pages, 64 * 128), generator=g, device=DEV, dtype=torch.uint8) & 0x77
    cache[:, 64 * 128 :] = (torch.rand(pages, 64, generator=g, device=DEV) * 0.02 + 0.001).view(torch.uint8)
    return cache


def page_keys(cache):
    keys = cache[:, : 64 * 128].contiguous().view(torch.float8_e4m3fn).float().view(-1, 128)
    scales = cache[:, 64 * 128 :].contiguous().view(torch.float32).view(-1)
    return keys * scales[:, None]


def q_fp8(shape, seed):
    return (torch.randint(0, 256, shape, generator=gen(seed), device=DEV, dtype=torch.uint8) & 0x77).view(torch.float8_e4m3fn)


@pytest.mark.parametrize("lens_2d", [False, True])
@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("heads", [32, 64])
def test_fp8_paged_mqa_logits(next_n, heads, lens_2d):
    batch, width, pages = 4, 40, 200
    cache = indexer_pages(pages, 1)
    table = torch.randint(0, pages, (batch, width), generator=gen(2), device=DEV, dtype=torch.int32)
    ctx = torch.tensor([2560, 1, 700, 64], dtype=torch.int32, device=DEV)
    q = q_fp8((batch, next_n, heads, 128), 3)
    w = torch.rand(batch * next_n, heads, generator=gen(4), device=DEV)
    # One length per row, as DeepGEMM's current line takes them: the same causal limits.
    lens = ctx[:, None] - next_n + 1 + torch.arange(next_n, device=DEV)[None, :] if lens_2d else ctx
    lens = lens.clamp(min=0).to(torch.int32).contiguous()
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 64, torch.cuda.get_device_properties(0).multi_processor_count)
    got = deep_gemm.fp8_paged_mqa_logits(q, cache.view(pages, 64, 1, 132), w, lens, table, meta, 2560, True)
    assert got.shape == (batch * next_n, 2560) and got.dtype == torch.float32
    keys = page_keys(cache)
    for b in range(batch):
        slots = (table[b].long()[:, None] * 64 + torch.arange(64, device=DEV)[None, :]).view(-1)
        for j in range(next_n):
            r = b * next_n + j
            n = max(int(ctx[b]) - next_n + j + 1, 0)
            if n:
                want = (torch.relu(q[b, j].float() @ keys[slots[:n]].T) * w[r][:, None]).sum(0)
                # Hopper's FP8 tensor cores truncate their accumulators: all-positive
                # products (e4m3 & 0x77) lose up to ~0.1% low, systematically.
                assert (got[r, :n] - want).abs().max().item() <= 3e-3 * max(1.0, want.abs().max().item()), f"row {r}"
            assert (got[r, n:] == float("-inf")).all(), f"row {r}: entries past the context are -inf"


def test_fp8_mqa_logits_ragged():
    rows, num_keys, heads = 70, 3001, 64
    k = q_fp8((num_keys, 128), 5)
    scales = torch.rand(num_keys, generator=gen(6), device=DEV) * 0.02 + 0.001
    q = q_fp8((rows, heads, 128), 7)
    w = torch.rand(rows, heads, generator=gen(8), device=DEV)
    ks = torch.randint(0, 1000, (rows,), generator=gen(9), device=DEV, dtype=torch.int32)
    ke = torch.minimum(ks + torch.randint(0, 2500, (rows,), generator=gen(10), device=DEV, dtype=torch.int32), torch.tensor(num_keys, device=DEV))
    got = deep_gemm.fp8_mqa_logits(q, (k, scales), w, ks, ke.to(torch.int32))
    assert got.shape == (rows, num_keys)
    full = (torch.relu(torch.einsum("rhd,kd->rhk", q.float(), k.float() * scales[:, None])) * w[:, :, None]).sum(1)
    pos = torch.arange(num_keys, device=DEV)[None, :]
    inside = (pos >= ks[:, None]) & (pos < ke[:, None])
    assert ((got - full).abs()[inside]).max().item() <= 3e-3 * full.abs().max().item()  # FP8 accumulation, as above
    assert (got[~inside] == float("-inf")).all()
