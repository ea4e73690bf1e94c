"""Each row's median time per build over the rounds of `ab.sh`, and its ratio to
the first build (above 1: slower than it).

    python3 .ci/bench/ab_report.py DIR NAME_A NAME_B [...]

Reads DIR/<name>_<round>.json (`nsa bench --json`). A row is one entry of any of
the report's lists of rows; rows match across builds by the suite and every field
that is not a measurement (strings, integers, booleans), and `us` is the time
compared.
"""

import glob
import json
import os
import statistics
import sys


def row_key(suite, row):
    """The suite and the row's identifying fields (floats are measurements)."""
    fields = tuple(sorted((k, v) for k, v in row.items()
                          if k != "us" and (v is None or isinstance(v, (str, int, bool)))))
    return suite, fields


def times(report):
    """{row key: µs} of one `nsa bench --json` report."""
    out = {}
    for suite, rows in report.items():
        if not isinstance(rows, list):
            continue
        for row in rows:
            if isinstance(row, dict) and isinstance(row.get("us"), (int, float)):
                out[row_key(suite, row)] = float(row["us"])
    return out


def medians(dir_, name):
    """{row key: (median µs, runs)} over DIR/<name>_<round>.json."""
    runs = {}
    paths = sorted(p for p in glob.glob(os.path.join(dir_, f"{glob.escape(name)}_*.json"))
                   if os.path.basename(p)[len(name) + 1:-len(".json")].isdigit())
    for path in paths:
        with open(path) as f:
            for key, us in times(json.load(f)).items():
                runs.setdefault(key, []).append(us)
    return {key: (statistics.median(v), len(v)) for key, v in runs.items()}


def label(key):
    suite, fields = key
    return suite + " " + " ".join(f"{k}={v}" for k, v in fields)


def compare(dir_, names):
    """Rows of (label, [median µs or None per build], [ratio to the first or None])."""
    per_build = [medians(dir_, n) for n in names]
    keys = sorted(set().union(*per_build), key=label)
    out = []
    for key in keys:
        meds = [b[key][0] if key in b else None for b in per_build]
        base = meds[0]
        out.append((label(key), meds, [None if m is None or not base else m / base for m in meds]))
    return out


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    dir_, names = argv[0], argv[1:]
    rows = compare(dir_, names)
    if not rows:
        print(f"ab_report: no `nsa bench --json` rows under {dir_} for {', '.join(names)}", file=sys.stderr)
        return 1
    fmt = lambda x, spec: "—" if x is None else format(x, spec)  # noqa: E731
    print("| row | " + " | ".join(f"{n} µs" for n in names) + " | " +
          " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(names) - 1))
    for name, meds, ratios in rows:
        print(f"| {name} | " + " | ".join(fmt(m, ".2f") for m in meds) + " | " +
              " | ".join(fmt(r, ".3f") for r in ratios[1:]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
