"""report.py on small reports shaped like `nsa bench --json`, peers.json and
python_compat.json: rows matched to the peers' cases, ratios and roofline shares,
and the marked blocks of a document written and checked."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import report  # noqa: E402

NSA = {
    "device": "NVIDIA H100 80GB HBM3",
    "date_utc": "2026-12-06T14:00:00Z",
    "topk": [
        {"rows": 1, "n": 131072, "k": 2048, "score": "f32", "values": "uniform", "transform": "plain", "layout": "c8",
         "chosen": True, "us": 14.2, "host_us": 2.0, "paged_requests": None, "page_size": None, "gbps": 37,
         "table_bytes": 0, "roofline_us": 0.2},
        {"rows": 1, "n": 131072, "k": 2048, "score": "f32", "values": "uniform", "transform": "plain", "layout": "latency",
         "chosen": False, "us": 40.0, "host_us": 2.0, "paged_requests": None, "page_size": None, "gbps": 13,
         "table_bytes": 0, "roofline_us": 0.2},
    ],
    "decode": [{"batch": 128, "s_q": 1, "heads": 64, "splits": 1, "us": 200.0, "tflops": 300, "gbps": 2000,
                "roofline_us": 150.0}],
    "prefill": [],
    "indexer": [{"case": "decode b32 ctx16384", "us": 20.0, "gbps": 2500, "fraction_of_copy": 0.8, "tflops": 0},
                {"case": "extend t4096 keys32768", "us": 2500.0, "gbps": 0, "fraction_of_copy": 0, "tflops": 830.4}],
    "host": [{"call": "nsa.topk", "shape": "1 x 131072 f32", "host_us": 3.5}],
    "bandwidth": [{"kernel": "kv_store.fp8_656", "tokens": 65536, "bytes": 118_800_000, "us": 40.0, "gbps": 2970.0,
                   "copy_us": 36.0, "copy_gbps": 3300.0, "fraction_of_copy": 0.9}],
    "plans": [{"metadata": "host", "bs": 32, "context": 16384, "host_us": 900.0, "gpu_us": 900.0},
              {"metadata": "device", "bs": 32, "context": 16384, "host_us": 4.5, "gpu_us": 6.0}],
    "steps": [{"metadata": "host", "bs": 32, "context": 16384, "step_us": 1200.0},
              {"metadata": "device", "bs": 32, "context": 16384, "step_us": 300.0}],
    "metadata": [{"what": "host decode bs=32", "us": 359.0}],
    "layer": [{"mode": "extend", "batch": 1, "context": 16384, "heads": 128, "prefill": "cost", "rows": 16384,
               "eager_us": 21000.0, "graph_us": 20900.0, "checks_passed": True,
               "stages": [{"stage": "stores", "us": 9.0}, {"stage": "sparse MLA", "us": 18000.0}]},
              {"mode": "extend", "batch": 16, "context": 1024, "heads": 128, "prefill": "mha", "rows": 16384,
               "eager_us": 1500.0, "graph_us": None, "checks_passed": True,
               "stages": [{"stage": "stores and read-back", "us": 30.0}, {"stage": "dense MHA", "us": 1470.0}]}],
    "dense": [{"kernel": "warp_group", "tokens": 8192, "seq": 2048, "heads": 128, "d_qk": 192, "d_v": 128, "us": 1000.0, "tflops": 690.0,
               "roofline_us": 700.0}],
}
TORCH_DENSE = {"device": "NVIDIA H100 80GB HBM3", "rows": [
    {"tokens": 8192, "heads": 128, "d_qk": 192, "d_v": 128, "peer": "flash", "error": "RuntimeError: no kernel"},
    {"tokens": 8192, "heads": 128, "d_qk": 192, "d_v": 128, "peer": "cudnn", "us": 1250.0},
    {"tokens": 8192, "heads": 128, "d_qk": 192, "d_v": 128, "peer": "efficient", "us": 5100.0},
]}
PEERS = {"rows": [
    {"peer": "FlashMLA@9241ae3", "case": "decode b128 s_q1 h64", "us": 160.0},
    {"peer": "FlashMLA@9241ae3", "case": "decode b1 s_q1 h128", "us": None, "error": "skipped"},
    {"peer": "sgl-kernel topk (32KB smem)", "case": "fast_topk_v2 f32 1x131072", "us": 21.3,
     "check": "2048/2048 of the exact top-k set"},
    {"peer": "FlashInfer", "case": "top_k (sorted=False) f32 1x131072", "us": 28.4,
     "check": "505/2048 of the exact top-k set"},
    {"peer": "DeepGEMM", "case": "fp8_paged_mqa_logits decode b32 ctx16384 (next_n 1, h64, page 64)", "us": 25.0},
    {"peer": "Never ran", "case": "decode b7 s_q1 h64", "us": None},
]}
PYTHON = [
    {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "date": "2026-12-06"},
    {"family": "topk", "case": "fast_topk_v2 1x131072 f32", "nsa_us": 14.5, "nsa_host_us": 6.1,
     "peer": "sgl-kernel", "peer_us": 21.0, "ratio": 1.45, "peer_host_us": 4.0},
    {"family": "host", "call": "nsa.topk", "case": "nsa.topk 1 x 131072 f32", "nsa_host_us": 9.25},
    {"family": "host", "call": "torch.empty", "case": "torch.empty (1, 2048) int32", "nsa_host_us": 2.0},
]


def test_rows_meet_their_peers():
    out = report.tables([NSA], PEERS, PYTHON, "nsa bench --json x")
    decode = out["decode"]
    assert "NVIDIA H100 80GB HBM3, 2026-12-06, `nsa bench --json x`" in decode
    assert "| b128 × s_q1 × h64 | 200.0 | 75% | 160.0 | 0.80× |" in decode
    assert "Never ran" not in decode
    topk = out["topk"]
    assert "| plain uniform 1×131072 k2048 | 14.20 | 1% | 21.30 | 1.50× | 28.40 (finds 505/2048 of the exact set) | 2.00× |" in topk
    assert "40.0" not in topk  # only the plan nsa picks
    assert "| decode b32 ctx16384 | 20.00 | 80% of copy | 25.00 | 1.25× |" in out["indexer"]
    assert "| extend t4096 keys32768 | 2500.0 | 830 FP8 TFLOP/s, 42% of 1979 | — | — |" in out["indexer"]
    assert "prefill" not in out
    assert "| fast_topk_v2 1x131072 f32 | 14.50 | 6.10 | sgl-kernel | 21.00 | 1.45× | 4.00 |" in out["python"]
    assert "| nsa.topk 1 x 131072 f32 | 9.25 | 3.50 | +5.75 |" in out["host"]
    assert "| torch.empty (1, 2048) int32 | 2.00 | — | — |" in out["host"]
    assert "torch.empty" not in out["python"]
    assert "| kv_store.fp8_656 | 65536 | 118.8 MB | 40.00 | 2970 | 36.00 | 3300 | 90% |" in out["kv"]
    assert "| 32 | 16K | 900.0 | 4.50 | 6.00 | 200.00× | 1200.0 | 300.0 | 4.00× |" in out["plan"]
    assert "| host decode bs=32 | 359.0 |" in out["metadata"]
    assert "| extend b1 ctx16384 h128 | cost | 16384 | 21000.0 | 20900.0 | 9.00 | — | — | 18000.0 | yes |" in out["layer"]
    assert "| extend b16 ctx1024 h128 | mha | 16384 | 1500.0 | — | 30.00 | — | — | 1470.0 | yes |" in out["layer"]


def test_dense_rows_meet_the_fastest_torch_backend():
    out = report.tables([NSA], PEERS, [], "nsa bench --suite dense", TORCH_DENSE)
    assert "| warp_group | 4 × 2048 h128 d192/128 | 1000.0 | 690 | cudnn | 1250.0 | 1.25× | 70% |" in out["dense"]


def test_write_then_check(tmp_path):
    files = {}
    for name, data in (("nsa.json", NSA), ("peers.json", PEERS), ("py.json", PYTHON)):
        files[name] = tmp_path / name
        files[name].write_text(json.dumps(data))
    doc = tmp_path / "BENCH.md"
    blocks = "".join(f"## {f}\n\nprose\n\n<!-- report:{f} -->\nstale\n<!-- /report:{f} -->\n\n"
                     for f in ("kv", "topk", "decode", "dense", "indexer", "layer", "plan", "metadata", "python",
                             "host"))
    doc.write_text(blocks)
    args = ["--nsa", str(files["nsa.json"]), "--peers", str(files["peers.json"]), "--python", str(files["py.json"])]
    assert report.main(args + ["--check", str(doc)]) == 1
    assert report.main(args + ["--write", str(doc)]) == 0
    text = doc.read_text()
    assert "stale" not in text and text.count("prose") == 10 and "| b128 × s_q1 × h64 |" in text
    assert report.main(args + ["--check", str(doc)]) == 0
    doc.write_text(text.replace("0.80×", "0.90×"))
    assert report.main(args + ["--check", str(doc)]) == 1


def test_a_missing_block_is_named(tmp_path, capsys):
    (tmp_path / "nsa.json").write_text(json.dumps(NSA))
    doc = tmp_path / "BENCH.md"
    doc.write_text("no blocks here\n")
    assert report.main(["--nsa", str(tmp_path / "nsa.json"), "--write", str(doc)]) == 2
    assert "no <!-- report:topk --> block" in capsys.readouterr().err


def test_each_family_names_its_own_command_and_gpu(tmp_path, capsys):
    kv_only = {"device": "NVIDIA H200", "date_utc": "2026-12-07T01:00:00Z", "bandwidth": NSA["bandwidth"]}
    no_kv = {k: v for k, v in NSA.items() if k != "bandwidth"}
    out = report.tables([no_kv, kv_only], PEERS, [], {"": "bench all", "topk": "bench --suite topk"})
    assert out["topk"].startswith("NVIDIA H100 80GB HBM3, 2026-12-06, `bench --suite topk`")
    assert out["decode"].startswith("NVIDIA H100 80GB HBM3, 2026-12-06, `bench all`")
    assert out["kv"].startswith("NVIDIA H200, 2026-12-07, `bench all`")
    (tmp_path / "nsa.json").write_text(json.dumps(NSA))
    assert report.main(["--nsa", str(tmp_path / "nsa.json"), "--command", "x y", "--command", "decode=a=b"]) == 0
    printed = capsys.readouterr().out
    assert "2026-12-06, `a=b`" in printed and "2026-12-06, `x y`" in printed


def test_a_results_folder(tmp_path):
    (tmp_path / "nsa_decode.json").write_text(json.dumps({k: v for k, v in NSA.items() if k != "topk"}))
    (tmp_path / "nsa_topk.json").write_text(json.dumps({"device": "GPU T", "date_utc": "2026-12-07", "topk": NSA["topk"]}))
    (tmp_path / "peers.json").write_text(json.dumps(PEERS))
    (tmp_path / "commands.json").write_text(json.dumps({"topk": "bench topk"}))
    doc = tmp_path / "BENCH.md"
    doc.write_text("<!-- report:topk -->\n<!-- /report:topk -->\n<!-- report:decode -->\n<!-- /report:decode -->\n"
                   "<!-- report:indexer -->\n<!-- /report:indexer -->\n<!-- report:kv -->\n<!-- /report:kv -->\n"
                   "<!-- report:plan -->\n<!-- /report:plan -->\n<!-- report:metadata -->\n<!-- /report:metadata -->\n"
                   "<!-- report:layer -->\n<!-- /report:layer -->\n<!-- report:dense -->\n<!-- /report:dense -->\n")
    assert report.main(["--results", str(tmp_path), "--write", str(doc)]) == 0
    text = doc.read_text()
    assert "GPU T, 2026-12-07, `bench topk`" in text and "| b128 × s_q1 × h64 | 200.0 | 75% | 160.0 | 0.80× |" in text
    assert report.main(["--results", str(tmp_path), "--check", str(doc)]) == 0


def test_peers_on_the_dumped_indexer_rows(tmp_path):
    rows = dict(NSA["topk"][0], values="indexer", n=65536, rows=64, us=20.0)
    (tmp_path / "nsa_topk.json").write_text(json.dumps({"device": "GPU T", "date_utc": "2026-12-07", "topk": [rows]}))
    (tmp_path / "peers_topk_values.json").write_text(json.dumps({"rows": [
        {"peer": "FlashInfer 0.7.2", "values": "indexer", "rows": 64, "n": 65536, "us": 50.0, "exact": 8192,
         "checked": 8192},
        {"peer": "sgl-kernel topk (32KB smem)", "values": "indexer", "rows": 64, "n": 65536, "us": 40.0,
         "exact": 3000, "checked": 8192},
        {"peer": "torch.topk", "values": "indexer", "rows": 64, "n": 65536, "us": None, "error": "OOM"},
    ]}))
    doc = tmp_path / "BENCH.md"
    doc.write_text("<!-- report:topk -->\n<!-- /report:topk -->\n")
    assert report.main(["--results", str(tmp_path), "--write", str(doc)]) == 0
    text = doc.read_text()
    assert ("| plain indexer 64×65536 k2048 | 20.00 | 1% | 50.00 | 2.50× | "
            "40.00 (finds 3000/8192 of the exact set) | 2.00× |") in text
    assert "torch.topk" not in text
