"""Offline model of topk.cuh's list cut (no GPU): how many radix rounds the exact cut
of the sample filter's list takes on the bench's rows, for three forms of the cut:
  prefix       rounds below the keys' common bit prefix (main's cut);
  prefix+rank  the same, and a threshold bin of at most 64 keys ranked directly;
  range+rank   rounds over offsets from the least key, and the small-bin rank
               (built and measured slower on an H100, December 2026).
The sample and its one-round cut follow topk.cuh (runs of 8 keys, bins on the keys'
bit boundaries). Each cut is checked to select exactly K keys. Pure Python:
    python3 .ci/bench/topk_cut_model.py
"""
import math
import random
import struct

K = 2048
WIDTHS = [11, 11, 10]
SMALL_BIN = 64


def order_key(f):
    u = struct.unpack("<I", struct.pack("<f", f))[0]
    return (~u) & 0xFFFFFFFF if u & 0x80000000 else u | 0x80000000


def threshold_bin(hist, r):
    above = 0
    for b in range(len(hist) - 1, -1, -1):
        if above < r <= above + hist[b]:
            return b, above
        above += hist[b]
    raise AssertionError("r exceeds the keys")


def cut(keys, r, rounds, from_least, rank):
    """(thr, ties, rounds run, ranked): keys > thr and `ties` keys == thr are the top r."""
    least, most = min(keys), max(keys)
    base = least if from_least else 0
    hi = (most - least if from_least else most ^ least).bit_length()
    prefix = (least - base) >> hi
    offs = [k - base for k in keys]
    for rd in range(rounds):
        if hi == 0:
            break
        shift = max(hi - WIDTHS[rd], 0)
        width = hi - shift
        hist = [0] * (1 << width)
        for o in offs:
            if o >> hi == prefix:
                hist[(o >> shift) & ((1 << width) - 1)] += 1
        b, above = threshold_bin(hist, r)
        r -= above
        prefix = (prefix << width) | b
        if hist[b] == r:
            return base + (prefix << shift) - 1, 0, rd + 1, False
        if rank and rd + 1 < rounds and shift > 0 and hist[b] <= SMALL_BIN:
            in_bin = sorted((o for o in offs if o >> shift == prefix), reverse=True)
            v = in_bin[r - 1]
            return base + v, r - sum(1 for o in in_bin if o > v), rd + 1, True
        hi = shift
    if hi > 0:
        return base + (prefix << hi) - 1, 0, rounds, False
    return base + prefix, r, rounds, False


def row_case(n, sectors, dist, seed):
    rng = random.Random(seed)
    vals = [rng.random() if dist == "uniform" else rng.gauss(0, 1) for _ in range(n)]
    keys = [order_key(v) for v in vals]
    e = (sectors * K + n - 1) // n
    s = math.isqrt(e)
    runs = min(e + 4 * (s if s * s == e else s + 1) + 4, sectors)
    sample = [keys[(j // 8) * (n - 8) // sectors + j % 8] for j in range(sectors * 8)]
    thr, ties, _, _ = cut(sample, runs * 8, 1, False, False)
    lo = thr if ties > 0 else thr + 1
    listed = [k for k in keys if k >= lo]
    out = [len(listed)]
    for from_least, rank in ((False, False), (False, True), (True, True)):
        t, ti, rounds, ranked = cut(listed, K, 3, from_least, rank)
        assert sum(1 for k in listed if k > t) + ti == K and ti <= sum(1 for k in listed if k == t)
        out.append(f"{rounds}{'+rank' if ranked else ''}")
    return out


if __name__ == "__main__":
    print("values    keys/row  sample runs | list keys: rounds of prefix / prefix+rank / range+rank")
    for dist in ("uniform", "gaussian"):
        for n, sectors in ((131072, 1024), (32768, 512)):
            for seed in range(6):
                listed, a, b, c = row_case(n, sectors, dist, seed)
                print(f"{dist:<9} {n:>8}  {sectors:>11} | {listed:>5}: {a:<6} {b:<6} {c}")
