"""``nsa.Layer`` on a CUDA GPU with PyTorch, in every forward mode, against a
whole-layer reference written here in torch (stores checked against the
activations; indexer logits, top-k and sparse attention recomputed from what the
stores wrote), plus CUDA-graph capture + replay against eager. Run on a GPU
machine: ``pytest nsa-runtime/python/tests/test_layer_gpu.py``."""

import math

import pytest
import torch

import nsa

assert torch.cuda.is_available(), "test_layer_gpu.py needs a CUDA GPU (run it on the GPU machine)"
DEV = torch.device("cuda")
PAGE, TOPK, IH = 64, 2048, 64
SM_SCALE = 0.1


class Server:
    """A miniature server: a page pool, ``req_to_token`` on the device, the caches."""

    def __init__(self, heads, kv_cache, max_reqs=4, width=4096, draft_tokens=0, seed=0, **layer_kw):
        self.cfg = nsa.Config(num_q_heads=heads, kv_cache=kv_cache)
        self.heads, self.fp8, self.width = heads, kv_cache == "fp8", width
        pages = 1 + max_reqs * width // PAGE
        self.pool_slots = pages * PAGE
        self.layer = nsa.Layer(self.cfg, pool_slots=self.pool_slots, max_bs=max_reqs, max_context_len=width,
                               draft_tokens=draft_tokens, sm_scale=SM_SCALE, **layer_kw)
        self.kv = (torch.zeros(self.pool_slots, 656, dtype=torch.uint8, device=DEV) if self.fp8
                   else torch.zeros(self.pool_slots, 576, dtype=torch.bfloat16, device=DEV))
        self.index_cache = torch.zeros(pages, PAGE * 132, dtype=torch.uint8, device=DEV)
        g = torch.Generator(device=DEV).manual_seed(seed)
        # Each request row owns shuffled pages (page 0 is the pool's dummy page).
        perm = torch.randperm(pages - 1, generator=g, device=DEV)[: max_reqs * (width // PAGE)] + 1
        page_rows = perm.view(max_reqs, width // PAGE).to(torch.int32)
        self.table = (page_rows[:, :, None] * PAGE + torch.arange(PAGE, device=DEV, dtype=torch.int32)).view(max_reqs, width).contiguous()
        self.gen = g

    def activations(self, rows, slots):
        g, h = self.gen, self.heads
        u = lambda *shape, amp=1.0: ((torch.rand(*shape, generator=g, device=DEV) * 2 - 1) * amp)
        latent = u(rows, 576, amp=2.0).to(torch.bfloat16)
        return dict(
            q=u(rows, h, 576).to(torch.bfloat16),
            k_nope=latent[:, :512],  # views of one latent tensor: row stride 576
            k_rope=latent[:, 512:],
            out_cache_loc=slots.to(torch.int32).contiguous(),
            index_q=(torch.randint(0, 256, (rows, IH, 128), generator=g, device=DEV, dtype=torch.uint8) & 0x77).view(torch.float8_e4m3fn),
            index_weights=(torch.rand(rows, IH, generator=g, device=DEV) * 0.07 - 0.02),
            index_k=u(rows, 128).to(torch.bfloat16),
        )

    def forward(self, plan, acts, **kw):
        return self.layer.forward(plan, acts["q"], acts["k_nope"], acts["k_rope"], acts["out_cache_loc"], acts["index_q"],
                                  acts["index_weights"], acts["index_k"], self.kv, self.index_cache, **kw)

    # -------------------------------------------------------------- the reference

    def stored_kv(self):
        if not self.fp8:
            return self.kv.float()
        nope = self.kv[:, :512].contiguous().view(torch.float8_e4m3fn).float()
        scales = self.kv[:, 512:528].contiguous().view(torch.float32)
        rope = self.kv[:, 528:].contiguous().view(torch.bfloat16).float()
        return torch.cat([(nope.view(-1, 4, 128) * scales[:, :, None]).view(-1, 512), rope], dim=1)

    def stored_index_k(self):
        c = self.index_cache
        keys = c[:, : PAGE * 128].contiguous().view(torch.float8_e4m3fn).float().view(-1, 128)
        scales = c[:, PAGE * 128 :].contiguous().view(torch.float32).view(-1)
        return keys * scales[:, None]

    def check_stores(self, acts):
        loc = acts["out_cache_loc"].long()
        latent = torch.cat([acts["k_nope"], acts["k_rope"]], dim=1).float()
        kv = self.stored_kv()[loc]
        if self.fp8:
            # e4m3 keeps 3 mantissa bits: within 1/16 of each value (+ the tile's underflow).
            amax = latent[:, :512].abs().view(-1, 4, 128).amax(-1).repeat_interleave(128, 1)
            assert ((kv[:, :512] - latent[:, :512]).abs() <= latent[:, :512].abs() / 16 + amax / 256).all()
            assert torch.equal(kv[:, 512:], latent[:, 512:])
        else:
            assert torch.equal(kv, latent)
        ik = self.stored_index_k()[loc]
        x = acts["index_k"].float()
        assert ((ik - x).abs() <= x.abs() / 16 + x.abs().amax(1, keepdim=True) / 256).all()

    def check_rows(self, acts, rows, out, lse, sample=None):
        """``rows``: per query row, (request row of req_to_token, visible keys)."""
        kv, ik = self.stored_kv(), self.stored_index_k()
        picks = range(len(rows)) if sample is None else sample
        for t in picks:
            r, vis = rows[t]
            slots = self.table[r, :vis].long()
            lse_lo = lse_hi = None
            if vis > TOPK:
                qi, w = acts["index_q"][t].float(), acts["index_weights"][t]
                logits = (torch.relu(qi @ ik[slots].T) * w[:, None]).sum(0)
                lse_lo, lse_hi = self.boundary_lse_bounds(acts["q"][t].float(), kv[slots], logits)
                slots = slots[torch.topk(logits, TOPK).indices]
            k = kv[slots]
            q = acts["q"][t].float()
            s = q @ k.T * SM_SCALE
            want_lse = torch.logsumexp(s, dim=1)
            want = torch.softmax(s, dim=1) @ k[:, :512]
            err = (out[t].float() - want).abs().max().item()
            assert err < 3e-2, f"row {t} (request row {r}, {vis} keys): out differs by {err}"
            # lse moves by at most the largest score error. An FP8 cache's kernels may
            # round each dequantized value (and its scale) to bf16: 2^-8 of each product.
            tol = 1e-2
            if self.fp8:
                tol = tol + 2.0**-8 * SM_SCALE * (q[:, :512].abs() @ k[:, :512].abs().T).amax(dim=1)
            if lse_lo is None:
                assert ((lse[t] - want_lse).abs() <= tol).all(), f"row {t}: lse {lse[t] - want_lse} over {tol}"
            else:
                assert ((lse[t] >= lse_lo - tol) & (lse[t] <= lse_hi + tol)).all(), (
                    f"row {t}: lse {lse[t].tolist()} outside [{lse_lo.tolist()}, {lse_hi.tolist()}] ± {tol}")

    @staticmethod
    def boundary_lse_bounds(q, k, logits):
        """Per head, the lowest and highest lse any correct top-k can give. The
        indexer's FP8 tensor cores truncate their accumulators (logits come out about
        0.1% low), so keys whose logits lie within 0.3% of the scale from the k-th
        largest may be chosen either way: the sure keys are always in, and the rest of
        the k come from those boundary keys, the ones with the lowest or the highest
        attention scores at the extremes."""
        thr = torch.topk(logits, TOPK).values[-1]
        margin = 3e-3 * logits.abs().max()
        sure = logits > thr + margin
        boundary = (logits - thr).abs() <= margin
        left = TOPK - int(sure.sum())
        s = q @ k.T * SM_SCALE
        s_sure, s_edge = s[:, sure], torch.sort(s[:, boundary], dim=1).values
        lo = torch.logsumexp(torch.cat([s_sure, s_edge[:, :left]], dim=1), dim=1)
        hi = torch.logsumexp(torch.cat([s_sure, s_edge[:, s_edge.shape[1] - left:]], dim=1), dim=1)
        return lo, hi


def i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEV)


def tables(srv, reqs, seq):
    """The device tables of a step: ``req_to_token``, ``req_pool_indices``, ``seq_lens``."""
    return srv.table, i32(reqs), i32(seq)


def plan(srv, mode, reqs, seq, ext=None):
    """An eager plan; the host lengths are the same lists the device tables hold."""
    return srv.layer.plan(mode, *tables(srv, reqs, seq), seq, None if ext is None else i32(ext), ext)


def sample_rows(n):
    picks = {0, n - 1, n // 2} | set(range(0, n, max(1, n // 24)))
    return sorted(p for p in picks if 0 <= p < n)


@pytest.mark.parametrize("kv_cache", ["fp8", "bf16"])
@pytest.mark.parametrize("heads", [16, 128])
def test_extend_then_decode(kv_cache, heads):
    srv = Server(heads, kv_cache)
    # Prefill: three prompts (longer than top-k, shorter, a page edge), then a chunk
    # over a cached prefix.
    reqs, prompts = [0, 1, 2], [2600, 700, 64]
    for done, chunk in [([0, 0, 0], prompts), ([2600, 700, 64], [150, 1, 40])]:
        seq = [d + c for d, c in zip(done, chunk)]
        t_req, t_vis, slots = [], [], []
        for r, d, c in zip(reqs, done, chunk):
            t_req += [(r, d + j + 1) for j in range(c)]
            slots.append(srv.table[r, d : d + c])
        acts = srv.activations(sum(chunk), torch.cat(slots))
        step = plan(srv, "extend", reqs, seq, chunk)
        assert step.mode == "extend" and step.rows == sum(chunk) and "top-k" in step.explain()
        out, lse = srv.forward(step, acts)
        torch.cuda.synchronize()
        srv.check_stores(acts)
        srv.check_rows(acts, t_req, out, lse, sample_rows(len(t_req)))
    # Decode: one token per request, eager.
    seq = [2751, 702, 105]
    acts = srv.activations(3, torch.stack([srv.table[r, s - 1] for r, s in zip(reqs, seq)]))
    step = plan(srv, "decode", reqs, seq)
    out, lse = srv.forward(step, acts)
    torch.cuda.synchronize()
    srv.check_stores(acts)
    srv.check_rows(acts, [(r, s) for r, s in zip(reqs, seq)], out, lse)


@pytest.mark.parametrize("mode", ["target_verify", "draft_extend", "draft_extend_v2"])
def test_speculative_modes(mode):
    d = 3
    srv = Server(16, "fp8", draft_tokens=d, seed=1)
    reqs, prefix = [1, 3], [2500, 900]
    # The prefix is in the cache: an extend writes it first.
    acts = srv.activations(sum(prefix), torch.cat([srv.table[r, :p] for r, p in zip(reqs, prefix)]))
    srv.forward(plan(srv, "extend", reqs, prefix, prefix), acts)
    if mode == "target_verify":
        seq, q_lens = prefix, [d, d]  # drafts at L .. L + D - 1
        starts = prefix
    elif mode == "draft_extend":
        q_lens = [2, 1]  # accepted lengths: the last q tokens of L
        seq = [p + q for p, q in zip(prefix, q_lens)]
        starts = [s - q for s, q in zip(seq, q_lens)]
    else:
        seq, q_lens = [p + d for p in prefix], [d, d]
        starts = prefix
    rows = [(r, st + j + 1) for r, st, q in zip(reqs, starts, q_lens) for j in range(q)]
    acts = srv.activations(len(rows), torch.cat([srv.table[r, st : st + q] for r, st, q in zip(reqs, starts, q_lens)]))
    step = plan(srv, mode, reqs, seq, q_lens if mode == "draft_extend" else None)
    assert step.mode == mode and step.rows == len(rows)
    out, lse = srv.forward(step, acts)
    torch.cuda.synchronize()
    srv.check_stores(acts)
    srv.check_rows(acts, rows, out, lse)


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_graph_capture_matches_eager(batch_invariant):
    srv = Server(128, "fp8", seed=2, batch_invariant=batch_invariant)
    reqs, prompts = [0, 1, 2], [3000, 500, 2100]
    acts = srv.activations(sum(prompts), torch.cat([srv.table[r, :p] for r, p in zip(reqs, prompts)]))
    srv.forward(plan(srv, "extend", reqs, prompts, prompts), acts)
    bs = 3
    static = srv.activations(bs, torch.zeros(bs, dtype=torch.int32, device=DEV))
    static = {k: v.clone() if k not in ("k_nope", "k_rope") else v for k, v in static.items()}
    latent = torch.empty(bs, 576, dtype=torch.bfloat16, device=DEV)
    static["k_nope"], static["k_rope"] = latent[:, :512], latent[:, 512:]
    table, rpi, seq_dev = tables(srv, reqs, [1] * bs)
    out = torch.empty(bs, 128, 512, dtype=torch.bfloat16, device=DEV)
    lse = torch.empty(bs, 128, dtype=torch.float32, device=DEV)
    gplan = srv.layer.graph_plan("decode", bs)
    assert gplan.is_graph and gplan.rows == bs
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the capture stream
        srv.layer.replay(gplan, table, rpi, seq_dev)
        srv.forward(gplan, static, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        srv.layer.replay(gplan, table, rpi, seq_dev)
        srv.forward(gplan, static, out=out, lse=lse)
    seq = list(prompts)
    for step in range(3):
        seq = [s + 1 for s in seq]
        step_acts = srv.activations(bs, torch.stack([srv.table[r, s - 1] for r, s in zip(reqs, seq)]))
        for k in static:
            static[k].copy_(step_acts[k])
        seq_dev.copy_(torch.tensor(seq, dtype=torch.int32))
        graph.replay()
        eager = srv.layer.plan("decode", table, rpi, seq_dev, seq)
        out_e, lse_e = srv.forward(eager, static)
        torch.cuda.synchronize()
        srv.check_rows(static, [(r, s) for r, s in zip(reqs, seq)], out, lse)
        if batch_invariant:
            assert torch.equal(out, out_e) and torch.equal(lse, lse_e), f"step {step}: graph and eager differ in bits"
        else:
            assert (out.float() - out_e.float()).abs().max().item() < 1e-2


def test_layer_errors_name_the_argument():
    srv = Server(16, "bf16")
    seq = [100]
    with pytest.raises(ValueError, match=r"`mode`: \"prefill\""):
        srv.layer.plan("prefill", *tables(srv, [0], seq), seq)
    with pytest.raises(ValueError, match=r"`mode`: \"extend\", expected a decode-like mode"):
        srv.layer.graph_plan("extend", 1)
    step = plan(srv, "decode", [0], seq)
    acts = srv.activations(1, srv.table[0, 99:100])
    with pytest.raises(TypeError, match=r"`out_cache_loc`: dtype int64, expected int32"):
        srv.forward(step, dict(acts, out_cache_loc=acts["out_cache_loc"].long()))
    with pytest.raises(ValueError, match=r"`q`: shape \(2, 16, 576\), expected \(1, 16, 576\)"):
        srv.forward(step, dict(acts, q=torch.zeros(2, 16, 576, dtype=torch.bfloat16, device=DEV)))
    with pytest.raises(ValueError, match=r"`kv_cache`"):
        srv.layer.forward(step, *[acts[k] for k in ("q", "k_nope", "k_rope", "out_cache_loc", "index_q", "index_weights", "index_k")],
                          srv.kv[:10], srv.index_cache)
    other = Server(16, "bf16").layer
    with pytest.raises(ValueError, match=r"`plan`: made by another Layer"):
        other.forward(step, *[acts[k] for k in ("q", "k_nope", "k_rope", "out_cache_loc", "index_q", "index_weights", "index_k")],
                      srv.kv, srv.index_cache)
    with pytest.raises(ValueError, match=r"`seq_lens`: shape \(2,\), expected \(1,\)"):
        srv.layer.plan("decode", srv.table, torch.zeros(1, dtype=torch.int32, device=DEV),
                       torch.zeros(2, dtype=torch.int32, device=DEV), seq)


def test_extend_lengths_go_with_the_modes_that_take_them():
    srv = Server(16, "bf16")
    seq = [100]
    with pytest.raises(ValueError, match=r"`extend_lens`/`extend_lens_cpu`: neither given for mode \"extend\""):
        srv.layer.plan("extend", *tables(srv, [0], seq), seq)
    with pytest.raises(ValueError, match=r"`extend_lens`/`extend_lens_cpu`: both given for mode \"decode\""):
        plan(srv, "decode", [0], seq, [1])


def expand(latent, w_uk, w_uv):
    """The model's ``kv_b_proj``: per head, k = (latent[:512] · W_UK) ‖ rope and
    v = latent[:512] · W_UV, bf16."""
    nope = latent[:, :512].float()
    k_nope = torch.einsum("kc,hcd->khd", nope, w_uk)
    rope = latent[:, None, 512:].float().expand(-1, w_uk.shape[0], -1)
    k = torch.cat([k_nope, rope], dim=2).to(torch.bfloat16).contiguous()
    v = torch.einsum("kc,hcd->khd", nope, w_uv).to(torch.bfloat16).contiguous()
    return k, v


@pytest.mark.parametrize("kv_cache", ["fp8", "bf16"])
@pytest.mark.parametrize("heads", [16, 128])
def test_mha_one_shot(kv_cache, heads):
    """Short prompts, then chunks over their prefixes, as MHA one-shot steps: the
    stores, the latent read back from the cache (prefixes included) and dense causal
    attention over the q/k/v expanded from it, against torch."""
    srv = Server(heads, kv_cache, mha_one_shot=True)
    g = srv.gen
    w_uk = (torch.rand(heads, 512, 128, generator=g, device=DEV) * 2 - 1) / 512**0.5
    w_uv = (torch.rand(heads, 512, 128, generator=g, device=DEV) * 2 - 1) / 512**0.5
    reqs, prompts = [0, 1, 2], [700, 64, 1]
    for done, chunk in [([0, 0, 0], prompts), (prompts, [150, 40, 1])]:
        seq = [d + c for d, c in zip(done, chunk)]
        slots = torch.cat([srv.table[r, d : d + c] for r, d, c in zip(reqs, done, chunk)])
        acts = srv.activations(sum(chunk), slots)
        step = plan(srv, "extend", reqs, seq, chunk)
        assert step.use_mha and step.rows == sum(chunk) and step.keys == sum(seq), step.explain()
        assert "dense_prefill" in step.explain() and "MHA one-shot" in step.explain(), step.explain()
        latent = srv.layer.mha_store(step, acts["k_nope"], acts["k_rope"], acts["out_cache_loc"], acts["index_k"],
                                     srv.kv, srv.index_cache)
        torch.cuda.synchronize()
        srv.check_stores(acts)
        # The read-back: every request's rows [0, L) out of the cache, bf16.
        key_slots = torch.cat([srv.table[r, :s] for r, s in zip(reqs, seq)]).long()
        want = srv.stored_kv()[key_slots]
        assert latent.shape == (sum(seq), 576)
        assert torch.equal(latent.float(), want.to(torch.bfloat16).float()), "latent read-back differs"
        q = ((torch.rand(sum(chunk), heads, 192, generator=g, device=DEV) * 2 - 1) * 2).to(torch.bfloat16)
        k, v = expand(latent, w_uk, w_uv)
        out, lse = srv.layer.mha_attend(step, q, k, v)
        torch.cuda.synchronize()
        row, key0 = 0, 0
        for d, c, s in zip(done, chunk, seq):
            for j in sample_rows(c):
                vis = d + j + 1
                sc = torch.einsum("hd,khd->hk", q[row + j].float(), k[key0 : key0 + vis].float()) * SM_SCALE
                want_out = torch.einsum("hk,khd->hd", torch.softmax(sc, dim=1), v[key0 : key0 + vis].float())
                err = (out[row + j].float() - want_out).abs().max().item()
                assert err < 2e-2, f"query {row + j} ({vis} keys): out differs by {err}"
                lse_err = (lse[row + j] - torch.logsumexp(sc, dim=1)).abs().max().item()
                assert lse_err < 1e-2, f"query {row + j}: lse differs by {lse_err}"
            row, key0 = row + c, key0 + s
    # A request past the top-k takes sparse MLA, and each path refuses the other's plan.
    seq = [851 + 2048]
    sparse = plan(srv, "extend", [0], seq, [2048])
    assert not sparse.use_mha and sparse.keys is None
    acts = srv.activations(2048, srv.table[0, 851:seq[0]])
    with pytest.raises(ValueError, match=r"`plan`: a sparse extend plan, expected an MHA one-shot plan"):
        srv.layer.mha_store(sparse, acts["k_nope"], acts["k_rope"], acts["out_cache_loc"], acts["index_k"], srv.kv,
                            srv.index_cache)
    short = plan(srv, "extend", [1], [105], [1])
    with pytest.raises(ValueError, match=r"`plan`: an MHA one-shot plan \(plan.use_mha\)"):
        srv.forward(short, srv.activations(1, srv.table[1, 104:105]))
    with pytest.raises(ValueError, match=r"`latent`: None, expected a \(105, 576\) bfloat16 tensor"):
        one = srv.activations(1, srv.table[1, 104:105])
        srv.layer.mha_store(short, one["k_nope"], one["k_rope"], one["out_cache_loc"], one["index_k"], srv.kv,
                            srv.index_cache, read_back=False)
