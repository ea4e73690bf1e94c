// Exact top-k with each row spread over a cluster of CTAs (sm_90+; at most 8, the
// size a launch attribute, so one kernel serves every size), one launch: a
// threshold filter with the row's pass split over the CTAs, then a cut by one.
//
// Slices of up to kSliceKeys keys a thread are listed from registers, with no
// sample: each CTA histograms its slice (13-bit bins) and takes the floor of the bin
// holding its ceil(K / cluster size)-th key as its bound, and every CTA lists its
// keys at or above the lowest of the CTAs' bounds. Each CTA has that many keys at or above
// its own bound, so the joined list holds at least K keys whenever every slice has
// that many that are not NaN. Longer slices: every CTA draws the same sample (so
// finds the same threshold) and lists the keys of its slice at or above it. Either
// way the bound is common to all CTAs, so the joined list is every key of the row
// at or above it. The lists are joined in CTA 0's shared memory through
// distributed shared memory (DSMEM), and CTA 0 cuts and places the top k. When the
// joined list holds fewer than k keys or more than the list takes, or the row is
// too long for the list, CTA 0 runs the histogram path over the whole row instead:
// exact either way. Same key order, NaN rule and output as topk.cuh.
#pragma once
#include "nsa/cuda/cluster.cuh"
#include "nsa/topk/topk.cuh"

// Phase marks: a profiling build defines this hook to time the cluster path's
// phases; the product compiles them out.
#ifndef NSA_TOPK_CLUSTER_MARK
#define NSA_TOPK_CLUSTER_MARK(phase)
#endif

namespace nsa {
namespace topk {

// Every CTA's list length, summed (sm[kJoined]) and summed over the lower-ranked
// CTAs (sm[kBase]), read from each CTA's sm[kCands] by one warp.
// One lane per CTA: clusters hold at most 8.
NSA_DEVICE void join_counts(u32* sm, u32 rank, u32 ctas) {
  if (thread_x() >= kWarpSize) return;
  const u32 lane = lane_id();
  const u32 count = lane < ctas ? cluster::load(cluster::map(cluster::local_addr(&sm[kCands]), lane)) : 0u;
  const u32 incl = warp_inclusive_scan(count);
  const u32 total = __shfl_sync(0xffffffffu, incl, kWarpSize - 1);
  const u32 base = __shfl_sync(0xffffffffu, incl - count, rank);
  if (lane == 0) {
    sm[kJoined] = total;
    sm[kBase] = base;
  }
}

// Keys a thread holds in registers on the sample-free path.
constexpr int kSliceKeys = 16;

// The sample-free list of this CTA's slice src[begin, begin + len) (len <= kSliceKeys
// * kBlockThreads; sm[kCands] zero, hist free): the keys at or above the lowest of the
// CTAs' local bounds, with their positions, complete on return. Ends past a cluster
// barrier (the bounds' exchange) and a block barrier.
template <typename S, int K, int kBlockThreads, int kCap>
NSA_DEVICE void list_local(const S* src, i32 begin, i32 len, u32 ctas, u32* hist, u32* sm, u32* fidx, u32* fkey) {
  const u32 tid = thread_x();
  for (u32 b = tid; b < (u32)kBins; b += kBlockThreads) hist[b] = 0u;
  u32 key[kSliceKeys];  // 0 (NaN's key) past the slice: never listed
#pragma unroll
  for (int m = 0; m < kSliceKeys; ++m) {
    const i32 i = m * kBlockThreads + (i32)tid;
    key[m] = i < len ? order_key(score_value(src[begin + i])) : 0u;
  }
  sync_block();  // the histogram is clear
#pragma unroll
  for (int m = 0; m < kSliceKeys; ++m) atomic_add_ret(&hist[key[m] >> round_shift(0)], 1u);
  sync_block();
  // Padding counts in bin 0, so the rank is always found; a bound of bin 0 lists every
  // key but NaN.
  find_threshold<kBlockThreads>(hist, kBins, ((u32)K + ctas - 1u) / ctas, sm);
  const u32 bin_floor = sm[kThrBin] << round_shift(0);
  if (tid == 0) sm[kLast] = bin_floor > 1u ? bin_floor : 1u;
  cluster::sync();  // every CTA's bound is in its sm[kLast]
  if (tid < kWarpSize) {
    const u32 lane = lane_id();
    u32 b = lane < ctas ? cluster::load(cluster::map(cluster::local_addr(&sm[kLast]), lane)) : ~0u;
#pragma unroll
    for (int m = kWarpSize / 2; m > 0; m /= 2) {
      const u32 o = f32_as_u32(shfl_xor(u32_as_f32(b), m));
      b = o < b ? o : b;
    }
    if (lane == 0) sm[kBase] = b;
  }
  sync_block();
  const u32 lo = sm[kBase];
  NSA_TOPK_CLUSTER_MARK(1);
  u32 hits = 0;
#pragma unroll
  for (int m = 0; m < kSliceKeys; ++m) hits |= (key[m] >= lo ? 1u : 0u) << m;
  u32 slot = warp_reserve(&sm[kCands], popc_u32(hits));
  for (; hits != 0u; hits &= hits - 1u, ++slot) {
    const u32 m = popc_u32((hits & (0u - hits)) - 1u);  // lowest set bit
    if (slot < (u32)kCap) {
      fidx[slot] = (u32)(begin + (i32)m * kBlockThreads + (i32)tid);
      fkey[slot] = key[m];
    }
  }
  sync_block();
}

template <typename S, int K, int kTransform, int kBlockThreads, int kCandCap, int kCacheCap, int kSmemWords>
NSA_DEVICE void cluster_select(const Params& p, u32* status) {
  static_assert(kFixedWords + 2 * kCandCap + kCacheCap <= kSmemWords, "launch provides kSmemWords of shared memory");
  extern NSA_SHARED u32 smem[];
  // The layout of select_row (topk.cuh): CTA 0 may run its histogram path.
  constexpr int kCap = (2 * kCandCap + kCacheCap) / 2;
  const ListSmem l = list_smem<kCap>(smem);
  u32 *hist = l.hist, *sm = l.sm, *fidx = l.idx, *fkey = l.key;

  const u32 rank = cluster::rank();
  const u32 ctas = cluster::size();
  const u32 tid = thread_x();
  const i32 row = (i32)(block_x() / ctas);
  const RowExtent ext = row_extent<kTransform>(p, row);
  const i32 n = ext.n;
  auto whole_row = [&] {
    if (rank == 0) histogram_row<S, K, kTransform, kBlockThreads, kCandCap, kCacheCap, kSmemWords>(p, status, row);
  };
  // These exits are uniform over the cluster (one row), before any cluster barrier:
  // rejected and short rows, and rows too long for the list.
  if (!ext.ok || n <= K || Sample<kCap>::template expected_kept<K>(n) > (u64)kCap * 3u / 4u) {
    whole_row();
    return;
  }
  NSA_TOPK_CLUSTER_MARK(0);

  // Slices are multiples of 4 long, so every slice of an aligned row is aligned.
  const i32 slice = ((n + (i32)ctas - 1) / (i32)ctas + 3) & ~3;
  const i32 begin = (i32)rank * slice < n ? (i32)rank * slice : n;
  const i32 len = n - begin < slice ? n - begin : slice;
  const S* src = row_scores<S>(p, row, ext.s0);
  if (slice <= kSliceKeys * kBlockThreads) {
    if (tid == 0) sm[kCands] = 0u;  // read after list_local's barriers
    list_local<S, K, kBlockThreads, kCap>(src, begin, len, ctas, hist, sm, fidx, fkey);
    NSA_TOPK_CLUSTER_MARK(2);
  } else {
    // keep_above_sample, with a mark between its halves.
    const u32 lo = list_bound<K, kBlockThreads, kCap>(src, n, hist, sm, fkey);
    NSA_TOPK_CLUSTER_MARK(1);
    list_at_or_above<kBlockThreads, kCap, 8>(src, begin, len, lo, sm, fidx, fkey);
    NSA_TOPK_CLUSTER_MARK(2);
  }
  const u32 mine = sm[kCands];
  // PAGED over a page_table_1: each CTA looks up the slots of its own listed keys, so
  // the lookups spread over the cluster and overlap the join instead of CTA 0 issuing
  // about K of them during its cut; the joined list then carries slots, and CTA 0
  // places them as is. Over a table of pages CTA 0 looks up winners at placement.
  const bool table_1 = reads_table_1<kTransform>(p);
  if (table_1) translate_listed<kBlockThreads>(p, ext.trow, fidx, mine < (u32)kCap ? mine : (u32)kCap);
  cluster::sync();  // every CTA's list and count are final

  join_counts(sm, rank, ctas);
  sync_block();
  NSA_TOPK_CLUSTER_MARK(3);
  const u32 joined = sm[kJoined];
  const u32 base = sm[kBase];
  // At least K keys and none dropped (no CTA's list can then have overflowed).
  const bool fits = joined >= (u32)K && joined <= (u32)kCap;
  if (table_1) wait_async_copies();  // this thread's entries, pushed or cut below
  if (fits && rank != 0) {  // CTA 0's own entries are already in place
    const u32 idx0 = cluster::map(cluster::local_addr(fidx), 0);
    const u32 key0 = cluster::map(cluster::local_addr(fkey), 0);
    for (u32 c = tid; c < mine; c += kBlockThreads) {
      cluster::store(idx0 + 4u * (base + c), fidx[c]);
      cluster::store(key0 + 4u * (base + c), fkey[c]);
    }
  }
  cluster::sync();  // CTA 0 holds the joined list; no CTA touches another's memory after this
  NSA_TOPK_CLUSTER_MARK(4);
  if (rank != 0) return;
  if (fits) {
    cut_and_place<K, kTransform, kBlockThreads>(p, row, ext.trow, p.out + (i64)row * K, fidx, fkey, joined,
                                                               hist, sm, true);
    NSA_TOPK_CLUSTER_MARK(5);
  } else {
    whole_row();
  }
}

}  // namespace topk
}  // namespace nsa
