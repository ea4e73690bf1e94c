"""BENCHMARKS.md tables from what was measured: `nsa bench --json` reports, the
peers' `peers.json` (../shared/peers, run in the same device call) and the Python
package's `python_compat.json` and the dense peers' `torch_dense.json`, one table per family, each row nsa beside every
peer measured on the same shape with the ratio (peer time / nsa time: above 1,
nsa is faster) and nsa's roofline share.

    python3 .ci/bench/report.py --nsa nsa.json --peers peers.json [--python python_compat.json] \
        [--command "nsa bench --suite all --json nsa.json; bash peers/run.sh"] [--command "topk=..."] \
        [--write BENCHMARKS.md | --check BENCHMARKS.md]
    python3 .ci/bench/report.py --results .ci/bench/results --check BENCHMARKS.md

Without --write/--check the tables are printed. With --write, each table replaces
the text between `<!-- report:FAMILY -->` and `<!-- /report:FAMILY -->` in the file
(the prose around them stays); --check exits 1 when the file's tables differ from
the ones the JSON gives, so a table cannot drift from its measurement.
"""

import argparse
import functools
import glob
import json
import os
import re
import sys

FAMILIES = ["kv", "topk", "decode", "prefill", "dense", "indexer", "layer", "plan", "metadata", "python", "host"]


def load(path):
    with open(path) as f:
        return json.load(f)


def fmt_us(us):
    return "—" if us is None else (f"{us:.2f}" if us < 100 else f"{us:.1f}")


def ratio(peer_us, nsa_us):
    if peer_us is None or not nsa_us:
        return "—"
    return f"{peer_us / nsa_us:.2f}×"


class PeerTime(float):
    """A peer's µs, with the share of the exact top-k set it found when it missed some."""
    found = None


def peer_index(peers):
    """{(peer, case): us} of the rows that ran, and the peers in first-seen order."""
    times, names = {}, []
    for row in peers.get("rows", peers) if isinstance(peers, dict) else peers:
        if not isinstance(row, dict) or "peer" not in row or "case" not in row:
            continue
        if row.get("us") is not None:
            t = PeerTime(row["us"])
            m = re.match(r"(\d+)/(\d+) of the exact", str(row.get("check", "")))
            if m and int(m[1]) < int(m[2]):
                t.found = f"{m[1]}/{m[2]}"
            times[(row["peer"], row["case"])] = t
            if row["peer"] not in names:
                names.append(row["peer"])
    return times, names


def fmt_peer(t):
    """A peer's time; an inexact top-k names how much of the exact set it found."""
    found = getattr(t, "found", None)
    return fmt_us(t) + (f" (finds {found} of the exact set)" if found else "")


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def with_peers(key_rows, times, names, peer_cases):
    """Rows of (label, nsa_us, roofline_share, key) extended by every peer that has
    a time for one of `peer_cases(key)` (the first that ran counts); peers without
    any time are left out."""
    def peer_us(p, key):
        return next((times[(p, c)] for c in peer_cases(key) if (p, c) in times), None)

    used = [p for p in names if any(peer_us(p, k) is not None for *_, k in key_rows)]
    header = ["shape", "nsa µs", "roofline share"]
    for p in used:
        header += [f"{p} µs", "ratio"]
    out = []
    for label, nsa_us, share, key in key_rows:
        row = [label, fmt_us(nsa_us), share]
        for p in used:
            t = peer_us(p, key)
            row += [fmt_peer(t), ratio(t, nsa_us)]
        out.append(row)
    return table(header, out)


def share(row):
    r, us = row.get("roofline_us"), row.get("us")
    return f"{100 * r / us:.0f}%" if r and us else "—"


def decode_table(nsa, times, names):
    rows = [(f"b{r['batch']} × s_q{r['s_q']} × h{r['heads']}", r["us"], share(r), (r["batch"], r["s_q"], r["heads"]))
            for r in nsa.get("decode", [])]
    return with_peers(rows, times, names, lambda k: [f"decode b{k[0]} s_q{k[1]} h{k[2]}"])


def prefill_table(nsa, times, names):
    rows = [(f"s_q{r['s_q']} × s_kv{r['s_kv']} × h{r['heads']} d{r['d_qk']}", r["us"], share(r),
             (r["s_q"], r["s_kv"], r["heads"], r["d_qk"])) for r in nsa.get("prefill", [])]
    return with_peers(rows, times, names, lambda k: [f"prefill s_q{k[0]} s_kv{k[1]} h{k[2]} d{k[3]}"])


# Dense FP8 tensor-core peak (TFLOP/s, datasheet, SXM) by GPU name.
FP8_PEAK_TFLOPS = {"H100": 1979, "H200": 1979}


def indexer_table(nsa, times, names, device=""):
    def peer_case(case):
        m = re.fullmatch(r"decode b(\d+) ctx(\d+)", case)
        if m:
            return [f"fp8_paged_mqa_logits decode b{m[1]} ctx{m[2]} (next_n 1, h64, page 64)"]
        m = re.fullmatch(r"extend t(\d+) keys(\d+)", case)
        return [f"fp8_mqa_logits extend t{m[1]} keys{m[2]} (ragged, h64)" if m else case]

    rows = []
    peak = next((v for k, v in FP8_PEAK_TFLOPS.items() if k in device), None)
    for r in nsa.get("indexer", []):
        if r.get("fraction_of_copy"):
            s = f"{100 * r['fraction_of_copy']:.0f}% of copy"
        elif r.get("tflops"):
            # Extend is compute-bound: FP8 TFLOP/s over the visible pairs, against the dense peak.
            s = f"{r['tflops']:.0f} FP8 TFLOP/s" + (f", {100 * r['tflops'] / peak:.0f}% of {peak}" if peak else "")
        else:
            s = "—"
        rows.append((r["case"], r["us"], s, r["case"]))
    return with_peers(rows, times, names, peer_case)


# The peers' top-k cases for nsa's (transform, values) rows, by their case prefix.
TOPK_PEER_CASES = {
    ("plain", "uniform"): ["fast_topk_v2 f32", "topk k2048 float32", "top_k (sorted=False) f32"],
    ("plain", "gaussian"): ["fast_topk_v2 [gaussian values] f32", "top_k (sorted=False) [gaussian values] f32"],
    ("paged", "uniform"): ["fast_topk_transform_fused (page_table_1) f32", "top_k_page_table_transform f32"],
    ("ragged", "uniform"): ["fast_topk_transform_ragged_fused (+17) f32", "top_k_ragged_transform (+17) f32"],
    ("plain", "indexer"): ["indexer values"],
}


def value_rows_as_peers(report):
    """peers_topk_values.json's rows (peers timed on the very score rows nsa dumped)
    as peers.json rows: case `<values> values <rows>x<n>`, the exact share as a check."""
    out = []
    for row in report.get("rows", []):
        case = f"{row['values']} values {row['rows']}x{row['n']}"
        entry = {"peer": row["peer"], "case": case, "us": row.get("us")}
        if row.get("checked"):
            entry["check"] = f"{row['exact']}/{row['checked']} of the exact top-k set"
        out.append(entry)
    return out


def topk_table(nsa, times, names):
    rows = []
    for r in nsa.get("topk", []):
        if not r.get("chosen") or r.get("score") != "f32" or r.get("paged_requests"):
            continue
        transform = r["transform"] if r.get("page_size") in (None, 1) else f"pages{r['page_size']}"
        key = (transform, r.get("values", "uniform"), r["rows"], r["n"])
        label = f"{transform} {key[1]} {r['rows']}×{r['n']} k{r['k']}"
        rows.append((label, r["us"], share(r), key))

    def peer_cases(key):
        return [f"{c} {key[2]}x{key[3]}" for c in TOPK_PEER_CASES.get(key[:2], [])]

    return with_peers(rows, times, names, peer_cases)


def dense_table(nsa, torch_rows):
    """Dense causal MHA beside each torch SDPA backend (and FA3 where installed)
    on the same shapes, measured in the same call (`.ci/bench/torch_dense.py`); the
    ratio is against the fastest peer."""
    peers = {}
    for r in torch_rows:
        if r.get("us") is not None:
            peers.setdefault((r["tokens"], r["heads"], r["d_qk"], r["d_v"]), []).append((r["us"], r["peer"]))
    out = []
    for r in nsa.get("dense", []):
        key = (r["tokens"], r["heads"], r["d_qk"], r["d_v"])
        best = min(peers.get(key, []), default=(None, "—"))
        out.append([r.get("kernel", "mma_sync"),
                    f"{r['tokens'] // r['seq']} × {r['seq']} h{r['heads']} d{r['d_qk']}/{r['d_v']}", fmt_us(r["us"]),
                    f"{r['tflops']:.0f}", best[1], fmt_us(best[0]), ratio(best[0], r["us"]),
                    f"{100 * r['roofline_us'] / r['us']:.0f}%"])
    return table(["kernel", "requests × tokens, heads, d_qk/d_v", "nsa µs", "nsa TFLOP/s", "fastest peer", "peer µs",
                  "ratio", "nsa, share of bf16 peak"], out)


def kv_table(nsa):
    """The KV-cache kernels beside the device-to-device copy of the same bytes
    (the practical roof), measured in the same run."""
    rows = [[r["kernel"], str(r["tokens"]), f"{r['bytes'] / 1e6:.1f} MB", fmt_us(r["us"]), f"{r['gbps']:.0f}",
             fmt_us(r["copy_us"]), f"{r['copy_gbps']:.0f}", f"{100 * r['fraction_of_copy']:.0f}%"]
            for r in nsa.get("bandwidth", [])]
    return table(["kernel", "tokens", "bytes moved", "nsa µs", "nsa GB/s", "copy µs", "copy GB/s", "nsa, share of copy"],
                 rows)


def plan_table(nsa):
    """Eager decode plans and whole steps with metadata built on the host or on
    the device, side by side per shape (the host path is the baseline)."""
    plans = {(r["metadata"], r["bs"], r["context"]): r for r in nsa.get("plans", [])}
    steps = {(r["metadata"], r["bs"], r["context"]): r["step_us"] for r in nsa.get("steps", [])}
    shapes = sorted({k[1:] for k in list(plans) + list(steps)}, key=lambda k: (k[1], k[0]))
    out = []
    for bs, ctx in shapes:
        h, d = plans.get(("host", bs, ctx), {}), plans.get(("device", bs, ctx), {})
        hs, ds = steps.get(("host", bs, ctx)), steps.get(("device", bs, ctx))
        out.append([str(bs), f"{ctx // 1024}K", fmt_us(h.get("host_us")), fmt_us(d.get("host_us")),
                    fmt_us(d.get("gpu_us")), ratio(h.get("host_us"), d.get("host_us")), fmt_us(hs), fmt_us(ds),
                    ratio(hs, ds)])
    return table(["bs", "context", "host metadata: plan host µs", "device metadata: plan host µs",
                  "device metadata: plan device µs", "plan host-time ratio", "step µs, host metadata",
                  "step µs, device metadata", "step ratio"], out)


# The layer's stages in call order (nsa_runtime::layer::Stage::ALL), and what an
# MHA one-shot row (two layer calls) reports in the same columns.
LAYER_STAGES = ["stores", "indexer logits", "top-k", "sparse MLA"]
MHA_STAGES = {"stores": "stores and read-back", "sparse MLA": "dense MHA"}


def stage_us(stages, name):
    return stages.get(name, stages.get(MHA_STAGES.get(name)))


def layer_table(nsa):
    """Whole-layer steps: eager and CUDA-graph µs and each stage's; FP8 extend rows
    under the reference's rule (auto) and nsa's kernel costs (cost) side by side,
    and short prompts as MHA one-shot (mha: the stores with the latent read-back,
    then dense attention)."""
    out = []
    for r in nsa.get("layer", []):
        stages = {s["stage"]: s["us"] for s in r.get("stages", [])}
        cols = [stage_us(stages, s) for s in LAYER_STAGES]
        out.append([f"{r['mode']} b{r['batch']} ctx{r['context']} h{r['heads']}", r["prefill"], str(r["rows"]),
                    fmt_us(r["eager_us"]), fmt_us(r.get("graph_us"))] + [fmt_us(c) for c in cols]
                   + ["yes" if r.get("checks_passed") else "NO"])
    return table(["step", "prefill", "query rows", "eager µs", "graph µs", "stores µs",
                  "indexer logits µs", "top-k µs", "attention µs", "matches the reference"], out)


def metadata_table(nsa):
    return table(["what", "µs"], [[r["what"], fmt_us(r["us"])] for r in nsa.get("metadata", [])])


def python_table(rows):
    out = []
    for r in rows:
        if "case" not in r or ("nsa_us" not in r and "nsa_host_us" not in r):
            continue
        out.append([r["case"], fmt_us(r.get("nsa_us")), fmt_us(r.get("nsa_host_us")), r.get("peer", "—"),
                    fmt_us(r.get("peer_us")), ratio(r.get("peer_us"), r.get("nsa_us")), fmt_us(r.get("peer_host_us"))])
    return table(["call", "nsa µs", "nsa host µs", "peer", "peer µs", "ratio", "peer host µs"], out)


def host_table(nsa, python_rows):
    """nsa's Python functions (outputs given) beside the Rust call at the same shape:
    what the binding adds per call."""
    rust = {f"{r['call']} {r['shape']}": r["host_us"] for r in nsa.get("host", [])}
    out = []
    for r in python_rows:
        if r.get("family") != "host" or "nsa_host_us" not in r:
            continue
        py, rs = r["nsa_host_us"], rust.get(r["case"])
        added = "—" if rs is None else f"{py - rs:+.2f}"
        out.append([r["case"], fmt_us(py), fmt_us(rs), added])
    return table(["call (outputs given)", "Python host µs", "Rust host µs", "Python adds µs"], out)


def python_device(rows):
    return next((r for r in rows if "gpu" in r), {})


def tables(nsa_reports, peers, python_rows, command, torch_dense=None):
    """The marked tables by family. `command`: the command that measured, or a dict
    of them by family (key "" for the rest)."""
    commands = command if isinstance(command, dict) else {"": command}
    times, names = peer_index(peers) if peers is not None else ({}, [])
    merged = {}
    # Rows of every report together; the host table reads the last host rows per call.
    for rep in nsa_reports:
        for fam in ("topk", "decode", "prefill", "dense", "indexer", "host", "layer", "bandwidth", "plans", "steps",
                    "metadata"):
            merged.setdefault(fam, []).extend(rep.get(fam, []))

    def measured(source):
        # The report that measured this family (its GPU and date).
        return next((r for r in nsa_reports if r.get(source)), {})

    def where(fam, source):
        rep = measured(source)
        cmd = commands.get(fam, commands.get("", "nsa bench --json"))
        return f"{rep.get('device', '?')}, {rep.get('date_utc', '?')[:10]}, `{cmd}`"

    out = {}
    indexer = functools.partial(indexer_table, device=measured("indexer").get("device", ""))
    for fam, make in (("topk", topk_table), ("decode", decode_table), ("prefill", prefill_table),
                      ("indexer", indexer)):
        if merged.get(fam):
            out[fam] = f"{where(fam, fam)}\n\n{make(merged, times, names)}"
    # Families without a peer library: the copy rate or nsa's own baseline path.
    for fam, source, make in (("kv", "bandwidth", kv_table), ("layer", "layer", layer_table),
                              ("plan", "plans", plan_table), ("metadata", "metadata", metadata_table)):
        if merged.get(source):
            out[fam] = f"{where(fam, source)}\n\n{make(merged)}"
    if merged.get("dense"):
        out["dense"] = f"{where('dense', 'dense')}\n\n{dense_table(merged, (torch_dense or {}).get('rows', []))}"
    if python_rows:
        dev = python_device(python_rows)
        where_py = f"{dev.get('gpu', '?')}, {dev.get('date', '?')}, torch {dev.get('torch', '?')}"
        rows = [r for r in python_rows if r.get("family") != "host"]
        out["python"] = f"{where_py}, `.ci/bench/python_compat.py`\n\n{python_table(rows)}"
        if any(r.get("family") == "host" for r in python_rows):
            # The Rust column comes from `nsa bench --suite host`: named only when given.
            rust = " and `nsa bench --suite host`" if merged.get("host") else ""
            out["host"] = (f"{where_py}, `.ci/bench/python_compat.py`{rust}\n\n"
                           f"{host_table(merged, python_rows)}")
    return out


def splice(text, family, body):
    begin, end = f"<!-- report:{family} -->", f"<!-- /report:{family} -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        return text, False
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text), True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nsa", action="append", default=[], help="an `nsa bench --json` report (repeatable)")
    ap.add_argument("--peers", help="peers.json of the same device call")
    ap.add_argument("--topk-values", help="peers_topk_values.json: top-k peers on the rows nsa dumped")
    ap.add_argument("--python", help="python_compat.json of the same device call")
    ap.add_argument("--torch-dense", help="torch_dense.json of the same device call (the dense peers)")
    ap.add_argument("--results", metavar="DIR",
                    help="a folder of measurements: nsa_*.json, peers.json, peers_topk_values.json, "
                         "python_compat.json, torch_dense.json and commands.json ({family: command})")
    ap.add_argument("--command", action="append", default=[],
                    help="the command that measured; FAMILY=COMMAND for one family's table (repeatable)")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="FILE", help="replace the marked tables in FILE")
    group.add_argument("--check", metavar="FILE", help="exit 1 if FILE's marked tables differ")
    args = ap.parse_args(argv)
    commands = {"": "nsa bench --json; bash peers/run.sh"}
    if args.results:
        found = lambda name: os.path.join(args.results, name) if os.path.exists(os.path.join(args.results, name)) else None
        args.nsa += sorted(glob.glob(os.path.join(args.results, "nsa_*.json")))
        args.peers = args.peers or found("peers.json")
        args.topk_values = args.topk_values or found("peers_topk_values.json")
        args.python = args.python or found("python_compat.json")
        args.torch_dense = args.torch_dense or found("torch_dense.json")
        if found("commands.json"):
            commands.update(load(found("commands.json")))
    reports = [load(p) for p in args.nsa]
    for c in args.command:
        fam, eq, rest = c.partition("=")
        if eq and fam in FAMILIES:
            commands[fam] = rest
        else:
            commands[""] = c
    peers = load(args.peers) if args.peers else None
    if args.topk_values:
        base = peers.get("rows", []) if isinstance(peers, dict) else (peers or [])
        peers = {"rows": base + value_rows_as_peers(load(args.topk_values))}
    out = tables(reports, peers, load(args.python) if args.python else [],
                 commands, load(args.torch_dense) if args.torch_dense else None)
    target = args.write or args.check
    if not target:
        for fam in FAMILIES:
            if fam in out:
                print(f"## {fam}\n\n{out[fam]}\n")
        return 0
    with open(target) as f:
        text = f.read()
    new = text
    for fam, body in out.items():
        new, found = splice(new, fam, body)
        if not found:
            print(f"{target}: no <!-- report:{fam} --> block for the {fam} table", file=sys.stderr)
            return 2
    if args.check:
        if new != text:
            print(f"{target}: its tables differ from the measurements; run report.py --write", file=sys.stderr)
            return 1
        return 0
    with open(target, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
