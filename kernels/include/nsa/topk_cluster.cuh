// Exact top-k with each row spread over a cluster of kCluster CTAs (sm_90+), one
// launch: the sample filter of topk.cuh with the row's pass, cut and placement
// spread over the CTAs.
//
// Every CTA draws the same sample (so finds the same threshold) and lists the keys
// of its slice of the row at or above it; a slice of up to kRegKeys keys is read
// into registers while the sample is cut. Each CTA then copies its list into every
// CTA's shared memory (DSMEM), at an offset reserved in CTA 0, so after one cluster
// barrier every CTA holds the same joined list, cuts it alike and writes its share
// of the K outputs. When the joined list holds fewer than K keys or more than it
// takes, or the row is too long for it, CTA 0 runs the histogram path over the
// whole row instead: exact either way. Same key order, NaN rule and output as
// topk.cuh.
#pragma once
#include "nsa/cuda/cluster.cuh"
#include "nsa/topk.cuh"

// Phase marks for .ci/bench/topk_cluster_phases.cu, which defines this hook; the
// product compiles them out.
#ifndef NSA_TOPK_CLUSTER_MARK
#define NSA_TOPK_CLUSTER_MARK(phase)
#endif

namespace nsa {
namespace topk {

// The cluster kernel's sample: 2048 single keys, read by every CTA (one load per
// key, all L2 hits after the first CTA's). Single keys are independent draws: as
// good as 1024 runs of 8 with an eighth of the keys to cut (BENCHMARKS.md, session
// 14: the cut of 8192 sample keys took ~5 µs), and they keep ~1.9 k of a 128K row
// with k 2048.
constexpr int kClusterSampleKeys = 2048;
using ClusterSample = Sample<kClusterSampleKeys, 1>;

// A load issued where it stands (volatile, ordered with other memory accesses), so
// the slice's loads are in flight while the sample is cut instead of being sunk to
// their first use.
NSA_DEVICE float load_now(const float* p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

// Lists the keys of slice[0, len) in registers (v[e] at slice position
// e * kBlockThreads + tid) at or above `lo` (all when lo is 0) into fidx/fkey,
// up to kCap (sm[kCands] counts past it).
template <int kBlockThreads, int kCap, int kPer>
NSA_DEVICE void list_registers(const float (&v)[kPer], i32 begin, i32 len, u32 lo, u32* sm, u32* fidx, u32* fkey) {
  const u32 tid = thread_x();
  const float bound = keep_bound(lo == 0u ? 1u : lo);
  u32 hits = 0;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const bool in = (i32)(e * kBlockThreads + tid) < len;
    hits |= (in && (lo == 0u || v[e] >= bound) ? 1u : 0u) << e;
  }
  u32 slot = warp_reserve(&sm[kCands], popc_u32(hits));
#pragma unroll
  for (int e = 0; e < kPer; ++e) {  // static indices keep v in registers
    if ((hits >> e) & 1u) {
      if (slot < (u32)kCap) {
        fidx[slot] = (u32)(begin + e * kBlockThreads + (i32)tid);
        fkey[slot] = order_key(v[e]);
      }
      ++slot;
    }
  }
}

template <int K, int kTransform, int kBlockThreads, int kCluster, int kCandCap, int kCacheCap, int kSmemWords>
NSA_DEVICE void cluster_select(const Params& p, u32* status) {
  constexpr int kStageCap = 4096;  // a CTA's own list (the sample's keys before it)
  constexpr int kCap = (kSmemWords - kFixedWords) / 2 - kStageCap;  // the joined list
  constexpr int kPer = 16;                            // slice keys per thread held in registers
  constexpr int kRegKeys = kPer * kBlockThreads;
  static_assert(kFixedWords + 2 * kStageCap + 2 * kCap <= kSmemWords && kClusterSampleKeys <= kStageCap,
                "launch provides kSmemWords");
  static_assert(kFixedWords + 2 * kCandCap + kCacheCap <= kSmemWords, "CTA 0's histogram path fits too");
  extern NSA_SHARED u32 smem[];
  u32* hist = smem;
  u32* sm = hist + kBins;
  u32* own_idx = sm + kScalarWords;
  u32* own_key = own_idx + kStageCap;
  u32* sample = own_idx;  // free again once the threshold is known
  u32* join_idx = own_key + kStageCap;
  u32* join_key = join_idx + kCap;

  const u32 rank = cluster::rank();
  const u32 tid = thread_x();
  const i32 row = (i32)(block_x() / (u32)kCluster);
  const RowExtent ext = row_extent<kTransform>(p, row);
  const i32 n = ext.n;
  auto whole_row = [&] {
    if (rank == 0) histogram_row<K, kTransform, kBlockThreads, kCandCap, kCacheCap, kSmemWords>(p, status, row);
  };
  // These exits are uniform over the cluster (one row), before any cluster barrier:
  // rejected and short rows, and rows too long for the list.
  if (!ext.ok || n <= K || ClusterSample::template expected_kept<K>(n) > (u64)kCap * 3u / 4u) {
    whole_row();
    return;
  }
  NSA_TOPK_CLUSTER_MARK(0);
  if (tid == 0) {
    sm[kCands] = 0u;
    sm[kBase] = 0u;    // CTA 0: the joined list's next free entry
    sm[kJoined] = 0u;  // every CTA: the joined list's length
  }
  sync_block();
  cluster::arrive();  // phase 1: the counters are zero and every CTA runs

  // Slices are multiples of 4 long, so every slice of an aligned row is aligned.
  const i32 slice = ((n + kCluster - 1) / kCluster + 3) & ~3;
  const i32 begin = (i32)rank * slice < n ? (i32)rank * slice : n;
  const i32 len = n - begin < slice ? n - begin : slice;
  const float* src = p.scores + (i64)row * p.row_stride + ext.s0;
  const bool in_registers = len <= kRegKeys;
  float v[kPer];
  if (in_registers && len > 0) {  // in flight while the sample is cut
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const i32 i = e * kBlockThreads + (i32)tid;
      v[e] = load_now(src + begin + (i < len ? i : len - 1));  // list_registers skips i >= len
    }
  }
  const bool keep_all = slice <= kStageCap && n <= kCap;
  const u32 lo = keep_all ? 0u : sample_threshold<K, kBlockThreads, kClusterSampleKeys, 1>(src, n, hist, sm, sample);
  NSA_TOPK_CLUSTER_MARK(1);
  if (in_registers) {
    list_registers<kBlockThreads, kStageCap>(v, begin, len, lo, sm, own_idx, own_key);
    sync_block();
  } else {
    list_at_or_above<kBlockThreads, kStageCap, 8>(src, begin, len, lo, sm, own_idx, own_key);
  }
  const u32 mine = sm[kCands];
  NSA_TOPK_CLUSTER_MARK(2);

  cluster::wait();
  if (tid == 0) {
    // A CTA that dropped entries counts as overflowing the joined list.
    const u32 count = mine <= (u32)kStageCap ? mine : (u32)kCap + 1u;
    sm[kLast] = cluster::atomic_add(cluster::map(cluster::local_addr(&sm[kBase]), 0), count);
    const u32 joined_at = cluster::local_addr(&sm[kJoined]);
    for (u32 c = 0; c < (u32)kCluster; ++c) cluster::reduce_add(cluster::map(joined_at, c), count);
  }
  sync_block();
  const u32 base = sm[kLast];
  const u32 idx_at = cluster::local_addr(join_idx);
  const u32 key_at = cluster::local_addr(join_key);
  for (u32 c = tid; c < mine && c < (u32)kStageCap && base + c < (u32)kCap; c += kBlockThreads) {
    const u32 idx = own_idx[c];
    const u32 key = own_key[c];
#pragma unroll
    for (u32 cta = 0; cta < (u32)kCluster; ++cta) {
      cluster::store(cluster::map(idx_at, cta) + 4u * (base + c), idx);
      cluster::store(cluster::map(key_at, cta) + 4u * (base + c), key);
    }
  }
  cluster::sync();  // phase 2: every CTA holds the joined list; no CTA touches another's memory after this

  NSA_TOPK_CLUSTER_MARK(3);
  const u32 joined = sm[kJoined];
  if (joined < (u32)K || joined > (u32)kCap) {  // fewer than K, or some dropped
    whole_row();
    return;
  }
  i64 thr;
  u32 ties;
  list_cut<kBlockThreads>(join_key, joined, (u32)K, hist, sm, thr, ties);
  NSA_TOPK_CLUSTER_MARK(4);
  stage_listed<K, kBlockThreads>(join_idx, join_key, joined, thr, ties, hist, sm);
  NSA_TOPK_CLUSTER_MARK(5);
  constexpr u32 kShare = ((u32)K + kCluster - 1) / kCluster;
  const u32 k0 = rank * kShare;
  const u32 k1 = k0 + kShare < (u32)K ? k0 + kShare : (u32)K;
  write_staged<K, kTransform, kBlockThreads>(p, row, ext.trow, p.out + (i64)row * K, hist, k0, k1);
  NSA_TOPK_CLUSTER_MARK(6);
}

}  // namespace topk
}  // namespace nsa
