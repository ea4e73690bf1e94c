#!/usr/bin/env python3
"""Top-k peers on the score rows `nsa bench --suite topk --topk-dump DIR` wrote.

Times sgl-kernel's `fast_topk` (both builds the peers folder carries), FlashInfer's
`top_k` and `torch.topk` on exactly the rows nsa was timed on (e.g. the indexer
logits of `--topk-values indexer`), and checks each peer's answer against the exact
top-k, ties counted as the set allows. Run on the GPU machine after
`bash peers/run.sh` (which unpacks the peers and puts FlashInfer on PYTHONPATH):

    PYTHONPATH=/tmp/peers_site:/tmp/peers_work/fi_site python3 .ci/bench/peers_topk_values.py \\
        --scores /tmp/topk_scores --peers peers --json $OUT/peers_topk_values.json

Device time per call: the median of CUDA-event timings, each call queued behind a
~1 ms device sleep so the host's enqueue cost is hidden.
"""
import argparse
import datetime
import glob
import json
import os
import re

K = 2048
TIMED = 30
WARMUP = 3


def device_us(torch, fn):
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(TIMED):
        torch.cuda._sleep(1_000_000)  # ~1 ms of device cycles ahead of the call
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def exact_share(torch, x, positions, rows_checked=4):
    """Returned positions that belong to a valid top-k answer, over a few rows: distinct,
    every key above the k-th largest value included, the rest equal to it."""
    good, total = 0, 0
    for i in range(min(rows_checked, x.shape[0])):
        row = x[i]
        kth = torch.topk(row, K).values.min()
        got = torch.unique(positions[i].long())
        got = got[(got >= 0) & (got < row.numel())]
        above = int((row > kth).sum())
        got_above = int((row[got] > kth).sum())
        got_tied = int((row[got] == kth).sum())
        good += got_above + min(got_tied, K - above)
        total += K
    return good, total


def sgl_ops(torch, peers):
    """(label, op namespace) of each sgl-kernel top-k build that loads."""
    builds = []
    for d in (os.path.join(os.environ.get("PEERS_WORK", "/tmp/peers_work"), "sgl_topk_build"),
              os.path.join(peers, "prebuilt", "sgl_topk")):
        for so, ns, label in (("sgl_topk.so", "sgl_kernel", "sgl-kernel topk (32KB smem)"),
                              ("sgl_topk_128k.so", "sgl_kernel_128k", "sgl-kernel topk (128KB smem)")):
            path = os.path.join(d, so)
            if os.path.exists(path) and label not in [b[0] for b in builds]:
                torch.ops.load_library(path)
                builds.append((label, getattr(torch.ops, ns)))
    return builds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scores", required=True, help="the folder `nsa bench --topk-dump` wrote")
    ap.add_argument("--peers", required=True, help="the carried peers folder (its prebuilt sgl-kernel top-k)")
    ap.add_argument("--json", required=True, help="where to write the rows")
    args = ap.parse_args()
    import numpy as np
    import torch

    peers = [(label, lambda x, out, lens, ops=ops: (ops.fast_topk(x, out, lens, None), out)[1])
             for label, ops in sgl_ops(torch, args.peers)]
    try:
        import flashinfer.topk as fit
        version = getattr(__import__("flashinfer"), "__version__", "?")
        peers.append((f"FlashInfer {version}", lambda x, out, lens: fit.top_k(x, K)[1]))
    except ImportError as e:
        print(f"FlashInfer not importable: {e}")
    peers.append(("torch.topk", lambda x, out, lens: torch.topk(x, K, dim=-1, sorted=False).indices))

    rows_out = []
    for path in sorted(glob.glob(os.path.join(args.scores, "topk_*_*x*.f32"))):
        m = re.match(r"topk_(\w+?)_(\d+)x(\d+)\.f32$", os.path.basename(path))
        if not m:
            continue
        values, r, n = m.group(1), int(m.group(2)), int(m.group(3))
        x = torch.from_numpy(np.fromfile(path, dtype="<f4").reshape(r, n)).cuda()
        out = torch.empty(r, K, dtype=torch.int32, device="cuda")
        lens = torch.full((r,), n, dtype=torch.int32, device="cuda")
        for label, fn in peers:
            row = {"peer": label, "values": values, "rows": r, "n": n}
            try:
                good, total = exact_share(torch, x, fn(x, out, lens))
                row.update(us=device_us(torch, lambda: fn(x, out, lens)), exact=good, checked=total)
            except Exception as e:  # noqa: BLE001 (a peer's failure is a row, not the end)
                row.update(us=None, error=f"{type(e).__name__}: {e}"[:300])
            print(json.dumps(row))
            rows_out.append(row)
        del x
        torch.cuda.empty_cache()
    report = {"device": torch.cuda.get_device_name(),
              "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "k": K, "rows": rows_out}
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
