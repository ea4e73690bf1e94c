// Exact top-k with each row spread over a cluster of kCluster CTAs (sm_90+), one
// launch, the row read from HBM once.
//
// CTA c of the cluster owns slice c of the row and keeps its keys in shared
// memory (a slice longer than the cache is re-read instead: exact, slower). Each
// radix round every CTA histograms its slice, the cluster sums the histograms
// through distributed shared memory (CTA c sums bins c, c + C, ... and writes the
// sums into every CTA), and every CTA finds the same threshold bin in its copy.
// Rounds of 12, 12 and 8 bits end with an exact threshold key; the winners (keys
// above it, and the first r keys equal to it) are then placed after the winners
// of lower-ranked CTAs. The same key order, NaN rule and output as topk.cuh.
#pragma once
#include "nsa/cuda/cluster.cuh"
#include "nsa/topk.cuh"

namespace nsa {
namespace topk {

// Radix rounds over the 32-bit key: bits [20, 32), [8, 20), [0, 8).
constexpr int kClusterBins = 4096;
constexpr int kClusterRounds = 3;
NSA_DEVICE constexpr int cluster_shift(int round) { return round == 0 ? 20 : round == 1 ? 8 : 0; }
NSA_DEVICE constexpr int cluster_width(int round) { return round == 2 ? 8 : 12; }

// Shared words beyond the key cache: local and cluster-summed histograms, scalars.
constexpr int kClusterFixedWords = 2 * kClusterBins + kScalarWords + 4;
// Scalars after the Slot words: this CTA's first winner slot and first tie (from the
// counts of lower-ranked CTAs, kept in their kWinners / kTies), and its cursors.
enum ClusterSlot { kWinBase = kScalarWords, kTieBase, kWinCursor, kTieCursor };

// Sums bins [0, bins) of every CTA's `hist` into every CTA's `merged`: CTA c adds
// up bins c, c + C, ... (strided, so each CTA gets a share even of small rounds).
template <int kBlockThreads, int kCluster>
NSA_DEVICE void cluster_sum_bins(const u32* hist, u32* merged, int bins, u32 rank) {
  const u32 hist_addr = cluster::local_addr(hist);
  const u32 merged_addr = cluster::local_addr(merged);
  for (int b = (int)rank + (int)thread_x() * kCluster; b < bins; b += kBlockThreads * kCluster) {
    u32 sum = 0;
#pragma unroll
    for (int c = 0; c < kCluster; ++c) sum += cluster::load(cluster::map(hist_addr + 4u * (u32)b, (u32)c));
#pragma unroll
    for (int c = 0; c < kCluster; ++c) cluster::store(cluster::map(merged_addr + 4u * (u32)b, (u32)c), sum);
  }
}

template <int K, int kTransform, int kBlockThreads, int kCluster, int kCacheCap, int kSmemWords>
NSA_DEVICE void cluster_select(const Params& p, u32* status) {
  static_assert(kClusterFixedWords + kCacheCap <= kSmemWords, "launch provides kSmemWords of shared memory");
  static_assert(kClusterBins % kBlockThreads == 0, "bins split evenly over threads");
  extern NSA_SHARED u32 smem[];
  u32* hist = smem;
  u32* merged = hist + kClusterBins;
  u32* sm = merged + kClusterBins;
  u32* cache = sm + (kClusterFixedWords - 2 * kClusterBins);

  const u32 rank = cluster::rank();
  const i32 row = (i32)(block_x() / (u32)kCluster);
  const u32 tid = thread_x();
  i32* out = p.out + (i64)row * K;
  const RowExtent ext = row_extent<kTransform>(p, row);
  const i32 s0 = ext.s0, n = ext.n, trow = ext.trow;
  // These exits are uniform over the cluster (one row), before any cluster barrier.
  if (!ext.ok) {
    if (rank == 0) {
      if (tid == 0) report_bad_entry(status, row);
      for (int k = tid; k < K; k += kBlockThreads) out[k] = -1;
    }
    return;
  }
  if (n <= K) {
    if (rank == 0) {
      for (int k = tid; k < K; k += kBlockThreads) out[k] = k < n ? emit<kTransform>(p, row, trow, k) : -1;
    }
    return;
  }

  // Slices are multiples of 4 long, so every slice of an aligned row is aligned.
  const i32 slice = ((n + kCluster - 1) / kCluster + 3) & ~3;
  const i32 begin = (i32)rank * slice < n ? (i32)rank * slice : n;
  const i32 count = n - begin < slice ? n - begin : slice;
  const float* src = p.scores + (i64)row * p.row_stride + s0 + begin;
  const bool cached = count <= kCacheCap;

  // Round 0 over every key (filling the cache); later rounds over the keys whose
  // higher bits match the threshold prefix so far.
  u32 prefix = 0;
  u32 r = (u32)K;  // still to take at or below the prefix
  i64 thr = -1;
#pragma unroll 1
  for (int round = 0; round < kClusterRounds; ++round) {
    const int shift = cluster_shift(round);
    const u32 mask = (1u << cluster_width(round)) - 1u;
    const int bins = 1 << cluster_width(round);
    for (int b = tid; b < bins; b += kBlockThreads) hist[b] = 0u;
    sync_block();
    if (round == 0) {
      scan_global<kBlockThreads>(src, count, [&](i32 i, u32 key) {
        atomic_add_ret(&hist[key >> shift], 1u);
        if (cached) cache[i] = key;
      });
    } else {
      const int up = cluster_shift(round - 1);
      for_each_key<kBlockThreads>(cached, cache, src, count, [&](i32, u32 key) {
        if ((key >> up) == prefix) atomic_add_ret(&hist[(key >> shift) & mask], 1u);
      });
    }
    cluster::sync();  // every CTA's histogram is complete
    cluster_sum_bins<kBlockThreads, kCluster>(hist, merged, bins, rank);
    cluster::sync();  // every CTA holds the cluster's sums
    find_threshold<kBlockThreads, kClusterBins>(merged, bins, r, sm);
    const u32 bin = sm[kThrBin];
    r -= sm[kAbove];
    prefix = (prefix << cluster_width(round)) | bin;
    if (merged[bin] == r) {  // the whole bin is taken
      thr = ((i64)prefix << shift) - 1;
      r = 0;
      break;
    }
    if (round == kClusterRounds - 1) thr = (i64)prefix;
  }

  // Count this slice's winners and ties, then place them after those of the
  // lower-ranked CTAs: winners from slot 0 up, the first r ties from K - r.
  if (tid == 0) {
    sm[kWinners] = 0u;
    sm[kTies] = 0u;
    sm[kWinCursor] = 0u;
    sm[kTieCursor] = 0u;
  }
  sync_block();
  u32 wins = 0, ties = 0;
  for_each_key<kBlockThreads>(cached, cache, src, count, [&](i32, u32 key) {
    wins += (i64)key > thr;
    ties += (i64)key == thr;
  });
  wins = __reduce_add_sync(0xffffffffu, wins);
  ties = __reduce_add_sync(0xffffffffu, ties);
  if (lane_id() == 0) {
    if (wins) atomic_add_ret(&sm[kWinners], wins);
    if (ties) atomic_add_ret(&sm[kTies], ties);
  }
  cluster::sync();  // every CTA's counts are final
  if (tid == 0) {
    u32 win_base = 0, tie_base = 0;
    for (u32 c = 0; c < rank; ++c) {
      win_base += cluster::load(cluster::map(cluster::local_addr(&sm[kWinners]), c));
      tie_base += cluster::load(cluster::map(cluster::local_addr(&sm[kTies]), c));
    }
    sm[kWinBase] = win_base;
    sm[kTieBase] = tie_base;
  }
  sync_block();
  const u32 win_base = sm[kWinBase];
  const u32 tie_base = sm[kTieBase];
  for_each_key<kBlockThreads>(cached, cache, src, count, [&](i32 i, u32 key) {
    if ((i64)key > thr) {
      out[win_base + atomic_add_ret(&sm[kWinCursor], 1u)] = emit<kTransform>(p, row, trow, begin + i);
    } else if ((i64)key == thr) {
      const u32 t = tie_base + atomic_add_ret(&sm[kTieCursor], 1u);
      if (t < r) out[(u32)K - r + t] = emit<kTransform>(p, row, trow, begin + i);
    }
  });
  cluster::sync();  // no CTA leaves while another may still read its counts
}

}  // namespace topk
}  // namespace nsa
