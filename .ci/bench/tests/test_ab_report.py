"""ab_report.py on rounds shaped like `nsa bench --json`: rows matched across builds
by their identifying fields, medians over rounds, ratios to the first build, and a
row that one build lacks."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import ab_report  # noqa: E402


def dense(us_a, us_b, extra=False):
    rows = [{"kernel": "warp_group", "tokens": 2048, "heads": 128, "d_qk": 192, "d_v": 128, "us": us_a,
             "tflops": 500.0},
            {"kernel": "warp_group", "tokens": 2048, "heads": 16, "d_qk": 192, "d_v": 128, "us": us_b,
             "tflops": 400.0}]
    if extra:
        rows.append({"kernel": "mma_sync", "tokens": 2048, "heads": 16, "d_qk": 192, "d_v": 128, "us": 200.0,
                     "tflops": 100.0})
    return {"device": "NVIDIA H100", "date_utc": "2026-12-07T00:00:00Z", "pdl": True, "topk": [], "dense": rows}


def write(tmp_path, name, rounds):
    for i, report in enumerate(rounds, start=1):
        (tmp_path / f"{name}_{i}.json").write_text(json.dumps(report))
    (tmp_path / f"{name}_warmup.txt").write_text("not a round")


def test_medians_and_ratios(tmp_path):
    write(tmp_path, "nsa-a", [dense(300, 50), dense(320, 52, extra=True), dense(310, 70)])
    write(tmp_path, "nsa-b", [dense(290, 55), dense(280, 51), dense(300, 53)])
    rows = {label: (meds, ratios) for label, meds, ratios in ab_report.compare(str(tmp_path), ["nsa-a", "nsa-b"])}
    h128 = next(v for k, v in rows.items() if "heads=128" in k)
    assert h128[0] == [310.0, 290.0]
    assert abs(h128[1][1] - 290 / 310) < 1e-12
    h16 = next(v for k, v in rows.items() if "heads=16" in k and "warp_group" in k)
    assert h16[0] == [52.0, 53.0]
    # Only build a ran the mma.sync row (once): no ratio.
    mma = next(v for k, v in rows.items() if "mma_sync" in k)
    assert mma[0] == [200.0, None] and mma[1][1] is None
    # Floats (tflops) are measurements, not identity: the rows still matched across rounds.
    assert len(rows) == 3


def test_main_prints_a_table_and_fails_without_rows(tmp_path, capsys):
    write(tmp_path, "x", [dense(10, 20)])
    write(tmp_path, "y", [dense(20, 20)])
    assert ab_report.main([str(tmp_path), "x", "y"]) == 0
    out = capsys.readouterr().out
    assert "| x µs | y µs | y / x |" in out and "2.000" in out and "1.000" in out
    assert ab_report.main([str(tmp_path), "nobody", "y2"]) == 1
    assert ab_report.main([str(tmp_path)]) == 2
