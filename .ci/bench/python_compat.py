"""nsa's Python package beside the libraries it replaces, in one process on one GPU:
device time of each compat function and of its peer on the same inputs (median of
per-call CUDA-event timings, each call queued behind a ~1 ms device sleep so host
overhead is hidden), and the host time of a call (enqueue cost, GPU kept busy).

    python3 .ci/bench/python_compat.py PEERS_DIR > rows.txt   # writes $OUT/python_compat.json

PEERS_DIR holds the prebuilt peers (flashmla/, sgl_topk/, deepgemm.tar.xz); a peer that
does not load is reported and its rows carry nsa alone.
"""

import json
import os
import statistics
import sys
import tarfile
import time
import traceback

import torch

from nsa.compat import deep_gemm as nsa_dg
from nsa.compat import flash_mla as nsa_fm
from nsa.compat import sgl_kernel as nsa_sk

PEERS = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "peers")
WORK = "/tmp/nsa_bench_peers"
DEV = torch.device("cuda")
ROWS = []


def emit(**row):
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def device_us(fn, reps=30):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def host_us(fn, calls=200):
    """Wall time per call while the GPU is busy (the calls only enqueue)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t) * 1e6 / calls
    torch.cuda.synchronize()
    return us


def load_peers():
    peers = {}
    try:
        torch.ops.load_library(os.path.join(PEERS, "sgl_topk", "sgl_topk.so"))
        peers["sgl"] = torch.ops.sgl_kernel
    except Exception as e:  # noqa: BLE001
        emit(peer="sgl-kernel topk", error=repr(e)[:300])
    try:
        sys.path[:0] = [os.path.join(PEERS, "flashmla")]
        import flash_mla_up

        peers["fm"] = flash_mla_up
    except Exception as e:  # noqa: BLE001
        emit(peer="FlashMLA", error=repr(e)[:300])
    try:
        if not os.path.isdir(os.path.join(WORK, "deepgemm_prebuilt")):
            with tarfile.open(os.path.join(PEERS, "deepgemm.tar.xz")) as t:
                t.extractall(WORK, filter="fully_trusted")
        os.environ.setdefault("DG_JIT_CACHE_DIR", os.path.join(WORK, "dg_jit"))
        os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
        sys.path[:0] = [os.path.join(WORK, "deepgemm_prebuilt")]
        import deep_gemm

        peers["dg"] = deep_gemm
    except Exception as e:  # noqa: BLE001
        emit(peer="DeepGEMM", error=repr(e)[:300])
    return peers


def row(family, case, nsa_fn, peer_name=None, peer_fn=None):
    try:
        nsa = device_us(nsa_fn)
        host = host_us(nsa_fn)
    except Exception:  # noqa: BLE001
        emit(family=family, case=case, error=traceback.format_exc()[-400:])
        return
    out = dict(family=family, case=case, nsa_us=round(nsa, 2), nsa_host_us=round(host, 2))
    if peer_fn is not None:
        try:
            peer = device_us(peer_fn)
            out.update(peer=peer_name, peer_us=round(peer, 2), ratio=round(peer / nsa, 3),
                       peer_host_us=round(host_us(peer_fn), 2))
        except Exception:  # noqa: BLE001
            out.update(peer=peer_name, peer_error=traceback.format_exc()[-300:])
    emit(**out)


def bench_topk(peers):
    sgl = peers.get("sgl")
    for r, n in [(1, 131072), (16, 131072), (64, 8192), (2048, 32768)]:
        g = torch.Generator(device=DEV).manual_seed(r ^ n)
        x = torch.rand(r, n, generator=g, device=DEV)
        lengths = torch.full((r,), n, dtype=torch.int32, device=DEV)
        table = torch.arange(r * n, dtype=torch.int32, device=DEV).view(r, n)
        cu = torch.arange(r + 1, dtype=torch.int32, device=DEV)
        offsets = torch.full((r,), 17, dtype=torch.int32, device=DEV)
        out = torch.empty(r, 2048, dtype=torch.int32, device=DEV)
        case = f"{r}x{n} f32"
        row("topk", f"fast_topk_v2 {case}", lambda: nsa_sk.fast_topk_v2(x, lengths, 2048),
            "sgl-kernel", sgl and (lambda: sgl.fast_topk(x, out, lengths, None)))
        row("topk", f"fast_topk_transform_fused {case}",
            lambda: nsa_sk.fast_topk_transform_fused(x, lengths, table, cu, 2048),
            "sgl-kernel", sgl and (lambda: sgl.fast_topk_transform_fused(x, lengths, out, table, cu, None)))
        row("topk", f"fast_topk_transform_ragged_fused {case}",
            lambda: nsa_sk.fast_topk_transform_ragged_fused(x, lengths, offsets, 2048),
            "sgl-kernel", sgl and (lambda: sgl.fast_topk_transform_ragged_fused(x, lengths, out, offsets, None)))
        del x, table
        torch.cuda.empty_cache()


def fp8_pool(tokens):
    g = torch.Generator(device=DEV).manual_seed(1)
    rec = torch.empty(tokens, 656, dtype=torch.uint8, device=DEV)
    rec[:, :512] = torch.randint(0, 256, (tokens, 512), generator=g, device=DEV, dtype=torch.uint8) & 0x77
    rec[:, 512:528] = (torch.rand(tokens, 4, generator=g, device=DEV) * 0.018 + 0.002).view(torch.uint8)
    rec[:, 528:] = (torch.rand(tokens, 64, generator=g, device=DEV) * 2 - 1).to(torch.bfloat16).view(torch.uint8)
    return rec


def bench_mla(peers):
    fm = peers.get("fm")
    keys = 16384
    pool = fp8_pool(128 * keys)
    for batch, heads in [(1, 128), (32, 64), (128, 64), (128, 128), (32, 16)]:
        g = torch.Generator(device=DEV).manual_seed(batch * 131 + heads)
        q = (torch.rand(batch, 1, heads, 576, generator=g, device=DEV) * 2 - 1).to(torch.bfloat16)
        cache = pool[: batch * keys].view(batch * keys // 64, 64, 1, 656)
        base = torch.arange(batch, device=DEV)[:, None, None] * keys
        idx = (torch.randint(0, keys, (batch, 1, 2048), generator=g, device=DEV) + base).to(torch.int32)
        meta, _ = nsa_fm.get_mla_metadata()
        nsa_fn = lambda: nsa_fm.flash_mla_with_kvcache(q, cache, None, None, 512, meta, softmax_scale=0.0417,
                                                       is_fp8_kvcache=True, indices=idx)
        peer_fn = None
        if fm is not None and heads in (64, 128):
            pmeta, _ = fm.get_mla_metadata()
            peer_fn = lambda: fm.flash_mla_with_kvcache(q, cache, None, None, 512, pmeta, softmax_scale=0.0417,
                                                        is_fp8_kvcache=True, indices=idx)
        row("sparse decode", f"flash_mla_with_kvcache b{batch} h{heads} topk2048 fp8 page64", nsa_fn,
            "FlashMLA@9241ae3", peer_fn)
    del pool
    torch.cuda.empty_cache()
    s_q, s_kv = 4096, 32768
    g = torch.Generator(device=DEV).manual_seed(12)
    kv = (torch.rand(s_kv, 1, 576, generator=g, device=DEV) * 2 - 1).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(s_kv, generator=g, device=DEV)[:2048] for _ in range(64)]).repeat(64, 1)
    idx = idx.to(torch.int32).view(s_q, 1, 2048).contiguous()
    for heads in (64, 128):
        q = (torch.rand(s_q, heads, 576, generator=g, device=DEV) * 2 - 1).to(torch.bfloat16)
        row("sparse prefill", f"flash_mla_sparse_fwd s_q{s_q} s_kv{s_kv} h{heads} d576",
            lambda: nsa_fm.flash_mla_sparse_fwd(q, kv, idx, 0.0417),
            "FlashMLA@9241ae3", fm and (lambda: fm.flash_mla_sparse_fwd(q, kv, idx, 0.0417, 512)))


def bench_indexer(peers):
    dg = peers.get("dg")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, context in [(1, 65536), (32, 16384), (128, 16384)]:
        g = torch.Generator(device=DEV).manual_seed(batch)
        width = context // 64
        pages = batch * width
        cache = torch.randint(0, 256, (pages, 64, 1, 132), generator=g, device=DEV, dtype=torch.uint8) & 0x77
        cache.view(pages, -1)[:, 64 * 128:] = torch.full((pages, 64), 1 / 64, device=DEV).view(torch.uint8)
        table = torch.randperm(pages, generator=g, device=DEV).to(torch.int32).view(batch, width)
        ctx = torch.full((batch, 1), context, dtype=torch.int32, device=DEV)  # DeepGEMM's (batch, next_n)
        q = (torch.randint(0, 256, (batch, 1, 64, 128), generator=g, device=DEV, dtype=torch.uint8) & 0x77).view(torch.float8_e4m3fn)
        w = torch.full((batch, 64), 0.01, device=DEV)
        meta = nsa_dg.get_paged_mqa_logits_metadata(ctx, 64, sms)
        peer_fn = None
        if dg is not None:
            pmeta = dg.get_paged_mqa_logits_metadata(ctx, 64, sms)
            peer_fn = lambda: dg.fp8_paged_mqa_logits(q, cache, w, ctx, table, pmeta, context, False)
        row("indexer", f"fp8_paged_mqa_logits b{batch} ctx{context} h64 next_n1",
            lambda: nsa_dg.fp8_paged_mqa_logits(q, cache, w, ctx, table, meta, context, False), "DeepGEMM@54e2261", peer_fn)
    rows, keys = 4096, 32768
    g = torch.Generator(device=DEV).manual_seed(5)
    q = (torch.randint(0, 256, (rows, 64, 128), generator=g, device=DEV, dtype=torch.uint8) & 0x77).view(torch.float8_e4m3fn)
    k = (torch.randint(0, 256, (keys, 128), generator=g, device=DEV, dtype=torch.uint8) & 0x77).view(torch.float8_e4m3fn)
    s = torch.full((keys,), 1 / 64, device=DEV)
    w = torch.full((rows, 64), 0.01, device=DEV)
    ks = torch.zeros(rows, dtype=torch.int32, device=DEV)
    ke = torch.arange(keys - rows + 1, keys + 1, dtype=torch.int32, device=DEV)
    for clean in (False, True):
        row("indexer", f"fp8_mqa_logits t{rows} keys{keys} h64{' clean_logits' if clean else ''}",
            lambda: nsa_dg.fp8_mqa_logits(q, (k, s), w, ks, ke, clean_logits=clean), "DeepGEMM@54e2261",
            dg and (lambda: dg.fp8_mqa_logits(q, (k, s), w, ks, ke, clean_logits=clean)))


def bench_host(peers):
    """Where a call's host time goes: a torch allocation, and nsa's native functions
    with their outputs given (DLPack imports, checks, launch) at the shapes
    `nsa bench --suite host` times the Rust calls."""
    import nsa

    z = lambda *shape, dtype=torch.float32: torch.zeros(*shape, dtype=dtype, device=DEV)
    i32 = lambda n, v: torch.full((n,), v, dtype=torch.int32, device=DEV)
    stream = torch.cuda.current_stream().cuda_stream
    b, h, k, s_q, s_kv, ctx, rq, keys = 32, 64, 2048, 64, 4096, 16384, 64, 4096
    score, lengths, out = z(1, 131072), i32(1, 131072), z(1, 2048, dtype=torch.int32)
    plan = nsa.DecodePlan(b, 1, h, k, 64)
    dq, cache, idx = z(b, 1, h, 576, dtype=torch.bfloat16), z(64, 64, 1, 656, dtype=torch.uint8), z(b, 1, k, dtype=torch.int32)
    do, dl, ws = z(b, 1, h, 512, dtype=torch.bfloat16), z(b, 1, h), z(max(plan.workspace_floats, 1))
    pq, kv, pidx = z(s_q, h, 576, dtype=torch.bfloat16), z(s_kv, 1, 576, dtype=torch.bfloat16), z(s_q, 1, k, dtype=torch.int32)
    po, pm, pl = z(s_q, h, 512, dtype=torch.bfloat16), z(s_q, h), z(s_q, h)
    iq, w = z(b, 1, 64, 128, dtype=torch.uint8), z(b, 64)
    icache, table, lens, logits = z(b * ctx // 64, 64, 1, 132, dtype=torch.uint8), z(b, ctx // 64, dtype=torch.int32), i32(b, ctx), z(b, ctx)
    rqb, rw, kb, sc = z(rq, 64, 128, dtype=torch.uint8), z(rq, 64), z(keys, 128, dtype=torch.uint8), z(keys)
    ks, ke, rl = i32(rq, 0), i32(rq, keys), z(rq, keys)
    cases = [
        ("torch.empty", "(1, 2048) int32", lambda: torch.empty(1, 2048, dtype=torch.int32, device=DEV)),
        ("nsa.topk", "1 x 131072 f32", lambda: nsa.topk(score, lengths, out, stream=stream)),
        ("nsa.sparse_decode", f"b{b} s_q1 h{h} topk{k} fp8 page64",
         lambda: nsa.sparse_decode(plan, dq, cache, idx, do, dl, ws, sm_scale=0.0417, stream=stream)),
        ("nsa.sparse_prefill", f"s_q{s_q} s_kv{s_kv} h{h} d576",
         lambda: nsa.sparse_prefill(pq, kv, pidx, po, pm, pl, sm_scale=0.0417, stream=stream)),
        ("nsa.indexer_paged_logits", f"b{b} ctx{ctx} next_n1 h64",
         lambda: nsa.indexer_paged_logits(iq, icache, w, lens, table, logits, stream=stream)),
        ("nsa.indexer_ragged_logits", f"rows{rq} keys{keys} h64",
         lambda: nsa.indexer_ragged_logits(rqb, kb, sc, rw, ks, ke, rl, stream=stream)),
    ]
    # 400 calls: sparse_decode launches twice a call, and past about 1000 pending
    # launches the queue is full and the calls wait on the sleep.
    for call, shape, fn in cases:
        emit(family="host", call=call, case=f"{call} {shape}", nsa_host_us=round(host_us(fn, calls=400), 2))


def bench_layer(peers):
    """Host time of nsa.Layer's plan and forward (an eager decode step, FP8 cache,
    h128), at the shapes `nsa bench --suite plan` times the Rust calls."""
    import nsa

    cfg = nsa.Config(num_q_heads=128)
    for bs, ctx in [(1, 16384), (32, 16384), (256, 16384)]:
        g = torch.Generator(device=DEV).manual_seed(bs)
        pages = 1 + bs * ctx // 64
        layer = nsa.Layer(cfg, pool_slots=pages * 64, max_bs=bs, max_context_len=ctx)
        perm = (torch.randperm(pages - 1, generator=g, device=DEV) + 1).to(torch.int32).view(bs, ctx // 64)
        table = (perm[:, :, None] * 64 + torch.arange(64, device=DEV, dtype=torch.int32)).view(bs, ctx).contiguous()
        seq = torch.randint(ctx // 2, ctx + 1, (bs,), generator=g, device=DEV, dtype=torch.int32)
        seq_cpu = seq.tolist()
        rpi = torch.arange(bs, device=DEV, dtype=torch.int32)
        kv = torch.zeros(pages * 64, 656, dtype=torch.uint8, device=DEV)
        index_cache = torch.zeros(pages, 64 * 132, dtype=torch.uint8, device=DEV)
        loc = table[torch.arange(bs, device=DEV), (seq - 1).long()].contiguous()
        q = torch.zeros(bs, 128, 576, dtype=torch.bfloat16, device=DEV)
        latent = torch.zeros(bs, 576, dtype=torch.bfloat16, device=DEV)
        iq = torch.zeros(bs, 64, 128, dtype=torch.uint8, device=DEV)
        w = torch.zeros(bs, 64, device=DEV)
        ik = torch.zeros(bs, 128, dtype=torch.bfloat16, device=DEV)
        out = torch.empty(bs, 128, 512, dtype=torch.bfloat16, device=DEV)
        lse = torch.empty(bs, 128, device=DEV)
        plan = layer.plan("decode", table, rpi, seq, seq_cpu)
        fwd = lambda: layer.forward(plan, q, latent[:, :512], latent[:, 512:], loc, iq, w, ik, kv, index_cache, out, lse)
        emit(family="layer", case=f"Layer.plan decode bs{bs} ctx{ctx} h128 fp8",
             nsa_host_us=round(host_us(lambda: layer.plan("decode", table, rpi, seq, seq_cpu)), 2))
        # 20 calls: a forward enqueues several kernels, and 200 of them would fill the
        # launch queue behind host_us's sleep, timing the sleep instead of the calls.
        emit(family="layer", case=f"Layer.forward decode bs{bs} ctx{ctx} h128 fp8", nsa_us=round(device_us(fwd), 2),
             nsa_host_us=round(host_us(fwd, calls=20), 2))
        del layer, plan


def main():
    emit(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
    peers = load_peers()
    for bench in (bench_host, bench_topk, bench_mla, bench_indexer, bench_layer):
        try:
            bench(peers)
        except Exception:  # noqa: BLE001
            emit(family=bench.__name__, error=traceback.format_exc()[-600:])
    with open(os.path.join(os.environ.get("OUT", "."), "python_compat.json"), "w") as f:
        json.dump(ROWS, f, indent=1)


if __name__ == "__main__":
    main()
