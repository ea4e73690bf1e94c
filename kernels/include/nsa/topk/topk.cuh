// Exact top-k of f32 or bf16 scores per row by radix select (spec §7), with the output
// transformed in place: relative positions, page-table slots (PAGED, from a
// page_table_1 or from a table of pages) or positions plus a per-row offset (RAGGED).
//
// Keys are the scores (bf16 widened to f32, exactly) mapped to order-preserving u32
// (NaN maps to 0, below -inf, so a NaN is never chosen ahead of any number). Three
// ways to a row's top k:
// - Sample filter (unordered rows, one block per row): a strided sample gives a
//   threshold a little below the k-th largest, one pass lists the positions at or
//   above it (a float compare per key; the few listed keys are gathered after), and
//   a radix cut of that short list places the top k. It declines (writes nothing)
//   when the row is too long for its list, or when the list holds fewer than k keys
//   or overflows.
// - Histogram path: round 0 histograms 13 bits of every key and finds the bin
//   holding the k-th largest; rounds 1 and 2 refine that bin (11 and 8 more bits)
//   over a shared-memory candidate list, or, when the bin holds more keys than the
//   list can take, by re-reading the row: exact either way, never a dropped
//   candidate. Rows of up to kCacheCap keys are kept in shared memory.
// - Split path (few long rows): the sample filter with each row's pass spread over
//   many blocks, their lists joined in a workspace; the row's last block cuts it.
#pragma once
#ifndef NSA_DEVICE
#error "include the arch header (nsa/cuda/arch.cuh or nsa/rocm/arch.cuh) first"
#endif
#include "nsa/common/block.cuh"
#include "nsa/common/segments.cuh"
#include "nsa/common/status.cuh"

namespace nsa {
namespace topk {

// The output transform, fixed per kernel as the entries it writes. kPositions: the
// position, plus offsets[row] when offsets is given (RAGGED; plain otherwise).
// kSlots: PAGED, the KV slot from the page table (page_size positions an entry; 1: a
// page_table_1; a page entry < 0 gives the slot -1, spec §2.2); kTable1 and kPages:
// the same with the table's form fixed (a page_table_1; a table of pages), for the
// plans whose rows are few, where the form chosen at run time measured up to 1.8%
// slower. kRaw, internal: the position as it is, for the passes over the row, whose
// entries are translated after they are placed (or before, for lists whose
// page_table_1 slots were looked up where they were built). Kernels per kind of
// entry keep the run-time choice out of the passes: one kernel for every transform
// measured up to 5.5% slower.
enum Transform { kRaw = 0, kPositions = 1, kSlots = 2, kTable1 = 3, kPages = 4 };

// Any PAGED form: the entries are KV slots.
NSA_DEVICE constexpr bool is_slots(int transform) { return transform >= kSlots; }

// Kernel parameters; the host mirrors this layout field for field.
struct Params {
  const void* scores;       // [rows, row_stride] of the kernel's Score type; row r's candidates start at row_starts[r]
  const i32* lengths;       // [rows] candidates per row (<= 0: none)
  const i32* row_starts;    // [rows] or null (all 0)
  const i32* page_table;    // PAGED: [table_rows, table_stride] slots, or page ids (pages)
  const i32* cu_seqlens_q;  // PAGED prefill: [table_rows + 1], row r uses table row i with cu[i] <= r < cu[i+1]; null: row r
  const i32* offsets;       // RAGGED: [rows], added to the positions; null: none
  i32* out;                 // [rows, K]
  i64 row_stride;           // elements between score rows
  i64 table_stride;         // elements between page-table rows
  i32 rows;
  i32 row_capacity;         // readable elements per score row: row_starts[r] + lengths[r] must fit
  i32 table_rows;
  i32 table_width;          // PAGED: lengths[r] must be <= this * page_size
  i32 page_size;            // PAGED: positions per page-table entry (1: a page_table_1)
  i32 page_shift;           // tables of pages: pos / page_size = (pos * page_magic) >> page_shift
  u64 page_magic;           //   for every pos < 2^31 (the host's page_divisor)
};

// What a kernel's transform and its parameters ask: PAGED from a page_table_1 (a
// slot lookup per listed key); any entry other than the position itself.
template <int kTransform>
NSA_DEVICE bool reads_table_1(const Params& p) {
  return kTransform == kTable1 || (kTransform == kSlots && p.page_size == 1);
}
template <int kTransform>
NSA_DEVICE bool translates(const Params& p) {
  return is_slots(kTransform) || (kTransform == kPositions && p.offsets != nullptr);
}

// Workspace of the split path (few long rows, each over many blocks): zero on
// entry, and left zero again by each row's last block.
struct Split {
  u32* state;     // [rows, kStateWords]
  u32* cand_idx;  // [rows, cand_cap] the row's kept positions
  u32* cand_key;  // [rows, cand_cap] and their keys
  i32 chunk;      // elements of a row per block
  i32 chunks;     // blocks per row (chunk * chunks >= row_capacity)
  i32 cand_cap;   // the kernel's list capacity
};
enum StateWord { kStateCands = 0, kStateDone = 1, kStateWords = 2 };

// Round 0 uses 13 bits (sign, 8 exponent, 4 mantissa: 16 bins per octave) so the
// threshold bin of realistic rows fits the candidate list; rounds 1 and 2 refine
// 11 and 8 more bits.
constexpr int kBins = 8192;
constexpr int kRounds = 3;
// Radix rounds over the 32-bit key: bits [21, 32), [10, 21), [0, 10).
NSA_DEVICE constexpr int round_shift(int round) { return round == 0 ? 19 : round == 1 ? 8 : 0; }
NSA_DEVICE constexpr int round_width(int round) { return round == 0 ? 13 : round == 1 ? 11 : 8; }
NSA_DEVICE constexpr u32 round_mask(int round) { return (1u << round_width(round)) - 1u; }

// Scalars kept in shared memory after the scan scratch (kJoined: the cluster
// kernel's joined list length).
enum Slot { kThrBin = kScanScratch, kAbove, kWinners, kTies, kCands, kBase, kLast, kJoined, kScalarWords };

// Score types: f32, or bf16 as stored (its f32 value is the high half of the f32
// bits, so the keys, the order and the NaN rule are those of f32).
struct Bf16 {
  u16 bits;
};
NSA_DEVICE float score_value(float v) { return v; }
NSA_DEVICE float score_value(Bf16 v) { return bf16_to_f32(v.bits); }
// A NaN of each score type: pads the filter pass's last batch, never listed.
NSA_DEVICE void set_nan(float& v) { v = u32_as_f32(0x7fffffffu); }
NSA_DEVICE void set_nan(Bf16& v) { v.bits = 0x7fffu; }

// 16 bytes of scores, moved as one vector load (4 f32 or 8 bf16).
template <typename S>
constexpr int kScoreLanes = 16 / (int)sizeof(S);
template <typename S>
struct alignas(16) ScoreVec {
  S v[kScoreLanes<S>];
};

// Scores from kBytes alignment on (16: one vector load): the scalar head before it
// (at most one aligned load's worth), and the whole aligned loads after it.
template <u32 kBytes = 16, typename S>
NSA_DEVICE i32 unaligned_head(const S* src, i32 n) {
  static_assert((kBytes & (kBytes - 1u)) == 0, "a power of two");
  const i32 to_align = (i32)(((kBytes - ((u32)(u64)src & (kBytes - 1u))) & (kBytes - 1u)) / (u32)sizeof(S));
  return to_align < n ? to_align : n;
}

NSA_DEVICE u32 order_key(float f) {
  const u32 b = f32_as_u32(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Calls f(i, value of src[i]) for every i in [0, n), the block's threads striding
// over the row: a scalar head up to 16-byte alignment, then 16 keys' worth of 16-byte
// loads issued before any is used (64 B of f32 per thread in flight, 32 B of bf16:
// 64 B of bf16 spilled), then a scalar tail.
template <int kBlockThreads, typename S, typename F>
NSA_DEVICE void scan_scores(const S* src, i32 n, F&& f) {
  using V = ScoreVec<S>;
  constexpr int kLanes = kScoreLanes<S>;
  constexpr int kUnroll = 16 / kLanes;
  const i32 tid = (i32)thread_x();
  const i32 head = unaligned_head(src, n);
  for (i32 i = tid; i < head; i += kBlockThreads) f(i, score_value(src[i]));
  const V* body = reinterpret_cast<const V*>(src + head);
  const i32 vecs = (n - head) / kLanes;
  i32 j = tid;
  for (; j + (kUnroll - 1) * kBlockThreads < vecs; j += kUnroll * kBlockThreads) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = body[j + u * kBlockThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int e = 0; e < kLanes; ++e) f(head + kLanes * (j + u * kBlockThreads) + e, score_value(v[u].v[e]));
    }
  }
  for (; j < vecs; j += kBlockThreads) {
    const V v = body[j];
#pragma unroll
    for (int e = 0; e < kLanes; ++e) f(head + kLanes * j + e, score_value(v.v[e]));
  }
  for (i32 i = head + kLanes * vecs + tid; i < n; i += kBlockThreads) f(i, score_value(src[i]));
}

// scan_scores handing f the order-preserving key of each score.
template <int kBlockThreads, typename S, typename F>
NSA_DEVICE void scan_global(const S* src, i32 n, F&& f) {
  scan_scores<kBlockThreads>(src, n, [&](i32 i, float v) { f(i, order_key(v)); });
}

// Every (position, key) of the row, from the shared-memory copy when there is one.
template <int kBlockThreads, typename S, typename F>
NSA_DEVICE void for_each_key(bool cached, const u32* cache, const S* src, i32 n, F&& f) {
  if (cached) {
    for (i32 i = (i32)thread_x(); i < n; i += kBlockThreads) f(i, cache[i]);
  } else {
    scan_global<kBlockThreads>(src, n, f);
  }
}

// for_each_key in a fraction of the code, for the passes that rarely run (the
// overflow path, and the histogram path kept as the split and cluster kernels'
// fallback): a thread takes a group of 4 consecutive keys a step (one 16-byte f32
// load, 8-byte bf16, where the group is whole and aligned; a cached row reads shared
// memory), so f is expanded 4 times instead of once per key of an unrolled batch
// (a load of the next group ahead spilled in the throughput kernels). Compiling the
// unrolled form into these passes took half of a top-k kernel's NVRTC time.
constexpr int kGroupKeys = 4;
struct KeyGroup {
  u32 key[kGroupKeys];
  i32 first;  // position of key[0]
  i32 count;  // keys of the group in the row (0 past its end)
};
// Group g of the row: group 0 is the scalar head up to the alignment of a whole
// group, group g >= 1 the kGroupKeys keys from head + kGroupKeys * (g - 1).
template <typename S>
NSA_DEVICE KeyGroup load_group(bool cached, const u32* cache, const S* src, i32 n, i32 head, i32 g) {
  struct alignas(kGroupKeys * sizeof(S)) Vec {
    S v[kGroupKeys];
  };
  KeyGroup k;
  k.first = g == 0 ? 0 : head + kGroupKeys * (g - 1);
  const i32 end = g == 0 ? head : (k.first + kGroupKeys < n ? k.first + kGroupKeys : n);
  k.count = end > k.first ? end - k.first : 0;
  if (!cached && g != 0 && k.count == kGroupKeys) {
    const Vec v = *reinterpret_cast<const Vec*>(src + k.first);
#pragma unroll
    for (int e = 0; e < kGroupKeys; ++e) k.key[e] = order_key(score_value(v.v[e]));
  } else {
#pragma unroll
    for (int e = 0; e < kGroupKeys; ++e) {
      const i32 i = k.first + e;
      k.key[e] = e < k.count ? (cached ? cache[i] : order_key(score_value(src[i]))) : 0u;
    }
  }
  return k;
}
template <int kBlockThreads, typename S, typename F>
NSA_DEVICE void for_each_key_compact(bool cached, const u32* cache, const S* src, i32 n, F&& f) {
  const i32 head = cached ? 0 : unaligned_head<kGroupKeys * sizeof(S)>(src, n);
  const i32 groups = 1 + (n - head + kGroupKeys - 1) / kGroupKeys;
  // Groups kAhead steps ahead are prefetched into L2, so a thread has as many bytes
  // in flight as the unrolled passes without holding them in registers (without it,
  // passes over uncached 512K-key rows ran 1.4-1.6x slower on an H100).
  constexpr i32 kAhead = 4;
  auto prefetch = [&](i32 g) {
    if (!cached && g >= 1 && g < groups) prefetch_l2(src + head + kGroupKeys * (g - 1));
  };
  for (i32 a = 1; a < kAhead; ++a) prefetch((i32)thread_x() + a * kBlockThreads);
  for (i32 g = (i32)thread_x(); g < groups; g += kBlockThreads) {
    prefetch(g + kAhead * kBlockThreads);
    const KeyGroup k = load_group(cached, cache, src, n, head, g);
#pragma unroll
    for (int e = 0; e < kGroupKeys; ++e) {
      if (e < k.count) f(k.first + e, k.key[e]);
    }
  }
}

// for_each_key, unrolled (kFast) or compact.
template <int kBlockThreads, bool kFast, typename S, typename F>
NSA_DEVICE void for_each_key_as(bool cached, const u32* cache, const S* src, i32 n, F&& f) {
  if constexpr (kFast) {
    for_each_key<kBlockThreads>(cached, cache, src, n, f);
  } else {
    for_each_key_compact<kBlockThreads>(cached, cache, src, n, f);
  }
}

// Which page-table row serves score row `row` (-1: none).
template <int kTransform>
NSA_DEVICE i32 table_row_of(const Params& p, i32 row) {
  return is_slots(kTransform) ? segment_of(p.cu_seqlens_q, p.table_rows, row) : 0;
}

// Page-table row `trow` as words, for the asynchronous slot lookups.
NSA_DEVICE const u32* table_row_slots(const Params& p, i32 trow) {
  return reinterpret_cast<const u32*>(p.page_table + (i64)trow * p.table_stride);
}

// Slot of position `pos` in a table of pages of P >= 2 positions (spec §2.2):
// table[pos / P] · P + pos % P, or -1 where the page entry is < 0 (no page), as its
// page_table_1 entries would be. The division is a multiply and a shift by the
// host's constants: a few instructions at every inlined call instead of a loop.
NSA_DEVICE i32 page_slot(const Params& p, const i32* table_row, i32 pos) {
  const u32 P = (u32)p.page_size;
  const u32 page = (u32)(((u64)(u32)pos * p.page_magic) >> p.page_shift);
  const i32 entry = table_row[page];
  return entry < 0 ? -1 : (i32)((u32)entry * P + ((u32)pos - page * P));
}

// Entry for position `pos` of score row `row` (page-table row `trow`).
template <int kTransform>
NSA_DEVICE i32 emit(const Params& p, i32 row, i32 trow, i32 pos) {
  if (kTransform == kRaw) return pos;
  if (kTransform == kPositions) return p.offsets != nullptr ? pos + p.offsets[row] : pos;
  const i32* table_row = p.page_table + (i64)trow * p.table_stride;
  return reads_table_1<kTransform>(p) ? table_row[pos] : page_slot(p, table_row, pos);
}

// Finds the bin holding the r-th largest key (counting down from the top bin) in
// hist[0, bins), bins <= kMaxBins; stores it and the count of keys in higher bins in
// sm[kThrBin/kAbove].
template <int kBlockThreads, int kMaxBins = kBins>
NSA_DEVICE void find_threshold(const u32* hist, int bins, u32 r, u32* sm) {
  constexpr int kPer = kMaxBins / kBlockThreads;
  static_assert(kPer * kBlockThreads == kMaxBins && (kPer & (kPer - 1)) == 0 && kPer <= 32,
                "bins split evenly over threads, a power of two each");
  const u32 tid = thread_x();
  auto bin_of = [&](int j) { return bins - 1 - (int)(tid * kPer + j); };
  // Thread t owns kPer consecutive bins (descending). Its sum reads them rotated by
  // t / (32 / kPer), so the lanes of a warp hit distinct banks.
  constexpr u32 kLanesPerRotation = kPer >= 32 ? 1u : 32u / kPer;
  u32 sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int bin = bin_of((j + (int)(tid / kLanesPerRotation)) & (kPer - 1));
    sum += bin >= 0 ? hist[bin] : 0u;
  }
  u32 total;
  const u32 run = block_exclusive_scan<kBlockThreads>(sum, sm, total);
  if (run < r && r <= run + sum) {  // the one thread whose bins hold the r-th key
    // bin_of(j) = top - j: one base address and immediate offsets, so the loads need
    // no register per bin (the throughput kernels sit at their 64-register cap).
    const int top = bin_of(0);
    u32 c[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) c[j] = j <= top ? hist[top - j] : 0u;
    u32 acc = run;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (acc < r && r <= acc + c[j]) {
        sm[kThrBin] = (u32)bin_of(j);
        sm[kAbove] = acc;
      }
      acc += c[j];
    }
  }
  sync_block();
}

// find_threshold compiled apart, for the histogram path that is itself compiled
// apart (histogram_row): inlined there, its bin counts spill in half-size blocks.
template <int kBlockThreads>
NSA_NOINLINE void find_threshold_apart(const u32* hist, int bins, u32 r, u32* sm) {
  find_threshold<kBlockThreads>(hist, bins, r, sm);
}

// Places one key once the threshold is known: keys above `thr` take the next
// winner slot, and the first `r` keys equal to it take the tie slots [K - r, K)
// (unordered: whichever claims first).
template <int K, int kTransform>
struct Placer {
  const Params& p;
  i32 row;
  i32 trow;
  i32* out;
  u32* sm;
  i64 thr;
  u32 r;

  NSA_DEVICE void operator()(i32 i, u32 key) const {
    if ((i64)key > thr) {
      out[atomic_add_ret(&sm[kWinners], 1u)] = emit<kTransform>(p, row, trow, i);
    } else if ((i64)key == thr) {
      const u32 t = atomic_add_ret(&sm[kTies], 1u);
      if (t < r) out[(u32)K - r + t] = emit<kTransform>(p, row, trow, i);
    }
  }
};

// Round-0 bin overflowed the candidate list: one more pass over the row resolves
// round 1 (emitting the winners above the round-0 bin on the way), a second gathers
// the far smaller round-1 bin (emitting its winners above the round-1 bin), and
// round 2 plus the ties come from those candidates, or from a third pass if even
// they do not fit. Exact always.
template <int K, int kTransform, int kBlockThreads, int kCandCap, typename S>
NSA_DEVICE void overflow_select(const Params& p, i32 row, i32 trow, i32* out, bool cached, const u32* cache,
                                const S* src, i32 n, u32 bin0, u32 r, u32* hist, u32* sm, u32* cand_idx,
                                u32* cand_key) {
  const u32 tid = thread_x();
  for (int b = tid; b < kBins; b += kBlockThreads) hist[b] = 0u;
  sync_block();
  for_each_key_compact<kBlockThreads>(cached, cache, src, n, [&](i32 i, u32 key) {
    const u32 bin = key >> round_shift(0);
    if (bin > bin0) {
      out[atomic_add_ret(&sm[kWinners], 1u)] = emit<kTransform>(p, row, trow, i);
    } else if (bin == bin0) {
      atomic_add_ret(&hist[(key >> round_shift(1)) & round_mask(1)], 1u);
    }
  });
  sync_block();
  find_threshold<kBlockThreads>(hist, 1 << round_width(1), r, sm);
  const u32 prefix1 = (bin0 << round_width(1)) | sm[kThrBin];
  r -= sm[kAbove];
  const u32 in_bin1 = hist[sm[kThrBin]];
  const bool all_taken = in_bin1 == r;  // the whole round-1 bin wins
  const bool use_cands = in_bin1 <= (u32)kCandCap;
  sync_block();
  for_each_key_compact<kBlockThreads>(cached, cache, src, n, [&](i32 i, u32 key) {
    if ((key >> round_shift(0)) != bin0) return;
    const u32 top = key >> round_shift(1);
    if (top > prefix1 || (all_taken && top == prefix1)) {
      out[atomic_add_ret(&sm[kWinners], 1u)] = emit<kTransform>(p, row, trow, i);
    } else if (top == prefix1 && use_cands) {
      const u32 c = atomic_add_ret(&sm[kCands], 1u);
      cand_idx[c] = (u32)i;
      cand_key[c] = key;
    }
  });
  sync_block();
  if (all_taken) return;
  // Round 2 over the low 10 bits of the round-1 bin.
  for (int b = tid; b < kBins; b += kBlockThreads) hist[b] = 0u;
  sync_block();
  if (use_cands) {
    for (u32 c = tid; c < in_bin1; c += kBlockThreads) atomic_add_ret(&hist[cand_key[c] & round_mask(2)], 1u);
  } else {
    for_each_key_compact<kBlockThreads>(cached, cache, src, n, [&](i32, u32 key) {
      if ((key >> round_shift(1)) == prefix1) atomic_add_ret(&hist[key & round_mask(2)], 1u);
    });
  }
  sync_block();
  find_threshold<kBlockThreads>(hist, 1 << round_width(2), r, sm);
  const u32 thr = (prefix1 << round_width(2)) | sm[kThrBin];
  r -= sm[kAbove];
  sync_block();
  const Placer<K, kTransform> place{p, row, trow, out, sm, (i64)thr, r};
  if (use_cands) {
    for (u32 c = tid; c < in_bin1; c += kBlockThreads) place((i32)cand_idx[c], cand_key[c]);
  } else {
    for_each_key_compact<kBlockThreads>(cached, cache, src, n, [&](i32 i, u32 key) {
      if ((key >> round_shift(1)) == prefix1) place(i, key);
    });
  }
  sync_block();
}

// After a pass that placed positions (kRaw; a barrier since): all K entries hold
// positions (n > K); each thread translates its own.
template <int K, int kTransform, int kBlockThreads>
NSA_DEVICE void translate_placed(const Params& p, i32 row, i32 trow, i32* out) {
  if constexpr (kTransform == kPositions) {  // RAGGED: one offset for the row
    const i32 add = p.offsets != nullptr ? p.offsets[row] : 0;
    for (int k = thread_x(); k < K; k += kBlockThreads) out[k] += add;
  } else {
    for (int k = thread_x(); k < K; k += kBlockThreads) out[k] = emit<kTransform>(p, row, trow, out[k]);
  }
}

// overflow_select compiled apart, for the histogram path that is itself compiled
// apart (histogram_row): inlined there, its live values spill under the 64-register
// cap of the split and cluster kernels. It writes positions and translates them
// after, keeping the table lookup out of the passes (it spilled them on sm_100a).
template <int K, int kTransform, int kBlockThreads, int kCandCap, typename S>
NSA_NOINLINE void overflow_select_apart(const Params& p, i32 row, i32 trow, i32* out, bool cached, const u32* cache,
                                        const S* src, i32 n, u32 bin0, u32 r, u32* hist, u32* sm, u32* cand_idx,
                                        u32* cand_key) {
  overflow_select<K, kRaw, kBlockThreads, kCandCap>(p, row, trow, out, cached, cache, src, n, bin0, r, hist, sm,
                                                     cand_idx, cand_key);
  if (translates<kTransform>(p)) translate_placed<K, kTransform, kBlockThreads>(p, row, trow, out);
}

// Shared-memory words the kernel needs beyond the candidate list and row cache.
constexpr int kFixedWords = kBins + kScalarWords;

// The top-k kernels' shared memory: the histogram, the scalars, then a list of kCap
// positions and their keys (the histogram path's candidates; its row cache follows).
struct ListSmem {
  u32* hist;
  u32* sm;
  u32* idx;
  u32* key;
};
template <int kCap>
NSA_DEVICE ListSmem list_smem(u32* smem) {
  u32* sm = smem + kBins;
  return ListSmem{smem, sm, sm + kScalarWords, sm + kScalarWords + kCap};
}

// Radix widths of list_cut's rounds (32 bits in all): 2048 bins, which a block
// clears and scans in far fewer steps than the histogram path's 8192 (H200,
// December 2026: 2048 x 32K 163.9 -> 153.4 us in the phase harness).
NSA_DEVICE constexpr int list_width(int round) { return round < 2 ? 11 : 10; }
constexpr int kListBins = 1 << 11;

// Exact cut of the r-th largest key of keys[0, c) (1 <= r <= c): the top r are the
// keys above `thr` plus `ties` of the keys equal to it. Radix rounds of up to 11, 11
// and 10 bits start at the highest bit in which the keys differ, so a list whose keys
// share their top bits (the sample filter's) spreads over the bins instead of piling
// its atomics onto a few. With kMaxRounds < 3 the cut may stop early, as a lower
// bound: the keys above `thr` (ties 0) then include the top r. Each round has its own
// histogram (hist: kMaxRounds * kListBins words), all cleared up front with the
// common-bits reduction, so a round needs no clearing barrier and no closing one.
// `after_round0(shift, bin)`: called by every thread once round 0 has found its bin
// (or, when all c keys are equal, before any round); the top r are then among the
// keys with (key >> shift) >= bin.
struct NoHook {
  NSA_DEVICE void operator()(int, u64) const {}
};
template <int kBlockThreads, int kMaxRounds = kRounds, class Hook = NoHook>
NSA_DEVICE void list_cut(const u32* keys, u32 c, u32 r, u32* hist, u32* sm, i64& thr, u32& ties,
                         Hook after_round0 = Hook()) {
  static_assert(kMaxRounds * kListBins <= kBins, "the rounds' histograms fit the kernel's histogram words");
  constexpr int kWarps = kBlockThreads / kWarpSize;
  const u32 tid = thread_x();
  const u32 first = keys[0];
  u32 diff = 0;
  for (u32 i = tid; i < c; i += kBlockThreads) diff |= keys[i] ^ first;
#pragma unroll
  for (int m = kWarpSize / 2; m > 0; m /= 2) diff |= f32_as_u32(shfl_xor(u32_as_f32(diff), m));
  if (lane_id() == 0) sm[tid / kWarpSize] = diff;
  for (int b = tid; b < kMaxRounds * kListBins; b += kBlockThreads) hist[b] = 0u;
  sync_block();
  diff = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) diff |= sm[w];
  int hi = 32 - clz_u32(diff);  // bits [hi, 32) are common to every key
  // The per-warp words are read above; without a round's barrier before the caller
  // reuses them, wait here (hi is the same in every thread).
  if (hi == 0) {
    sync_block();
    after_round0(0, (u64)first);
  }
  u64 prefix = (u64)first >> hi;
#pragma unroll
  for (int round = 0; round < kMaxRounds; ++round) {
    if (hi == 0) break;
    const int shift = hi > list_width(round) ? hi - list_width(round) : 0;
    const int width = hi - shift;
    const u32 mask = (1u << width) - 1u;
    u32* h = hist + round * kListBins;
    for (u32 i = tid; i < c; i += kBlockThreads) {
      const u32 key = keys[i];
      if (((u64)key >> hi) == prefix) atomic_add_ret(&h[(key >> shift) & mask], 1u);
    }
    sync_block();
    find_threshold<kBlockThreads, kListBins>(h, 1 << width, r, sm);
    const u32 bin = sm[kThrBin];
    r -= sm[kAbove];
    prefix = (prefix << width) | bin;
    if (round == 0) after_round0(shift, prefix);
    if (h[bin] == r) {  // the whole bin is taken
      thr = (i64)(prefix << shift) - 1;
      ties = 0;
      return;
    }
    hi = shift;
  }
  if (hi > 0) {  // stopped early: the lower bound of the bin holding the r-th key
    thr = (i64)(prefix << hi) - 1;
    ties = 0;
    return;
  }
  thr = (i64)prefix;  // every bit resolved
  ties = r;
}

// ceil(sqrt(v)) for v < 2^26.
NSA_DEVICE u32 isqrt_ceil(u32 v) {
  u32 s = 0;
#pragma unroll
  for (u32 bit = 1u << 12; bit != 0; bit >>= 1) {
    if ((s + bit) * (s + bit) <= v) s += bit;
  }
  return s * s < v ? s + 1 : s;
}

// The float whose order_key is `key` (key != 0; 0 is NaN's key).
NSA_DEVICE float key_value(u32 key) { return u32_as_f32((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key); }

NSA_DEVICE constexpr u32 pow2_floor(u32 v) { return v < 2u ? v : 2u * pow2_floor(v / 2u); }

// The sample filter's sample: kSectors runs of kRun adjacent keys (a power of two
// of them: the run starts then cost a shift, not a 64-bit division).
template <int kCap>
struct Sample {
  static constexpr u32 kRun = 8;
  static constexpr u32 kSectors = pow2_floor((kCap < 8192 ? kCap : 8192) / kRun);
  // Runs count as single draws (adjacent scores may move together): e runs are
  // expected at or above the K-th largest of n; rank e + 4·sqrt(e) + 4 runs is four
  // standard deviations and 4 above that.
  template <int K>
  static NSA_DEVICE u32 runs(i32 n) {
    const u32 e = (u32)(((u64)kSectors * (u64)K + (u64)n - 1) / (u64)n);
    const u32 r = e + 4u * isqrt_ceil(e) + 4u;
    return r < kSectors ? r : kSectors;
  }
  // Keys the filter is expected to keep from an n-key row.
  template <int K>
  static NSA_DEVICE u64 expected_kept(i32 n) {
    return (u64)runs<K>(n) * (u64)n / kSectors;
  }
};

// Fills keys[0, kSectors * kRun) with the keys of the row's sample: kSectors runs of
// kRun adjacent scores (a 32-byte sector of f32, half of one of bf16), spread evenly
// over the row.
template <int kBlockThreads, int kCap, typename S>
NSA_DEVICE void load_sample(const S* src, i32 n, u32* keys) {
  constexpr u32 kRun = Sample<kCap>::kRun;
  constexpr u32 kSectors = Sample<kCap>::kSectors;
  static_assert(kSectors * kRun % kBlockThreads == 0, "every thread loads the same count");
  constexpr u32 kPerThread = kSectors * kRun / kBlockThreads;
  constexpr u32 kInFlight = kPerThread < 8 ? kPerThread : 8;  // loads issued together
  static_assert(kPerThread % kInFlight == 0, "whole batches of loads (powers of two)");
#pragma unroll
  for (u32 it0 = 0; it0 < kPerThread; it0 += kInFlight) {
    float v[kInFlight];
#pragma unroll
    for (u32 it = 0; it < kInFlight; ++it) {
      const u32 j = (it0 + it) * kBlockThreads + thread_x();
      v[it] = score_value(src[(i64)(j / kRun) * (n - (i32)kRun) / (i64)kSectors + j % kRun]);
    }
#pragma unroll
    for (u32 it = 0; it < kInFlight; ++it) keys[(it0 + it) * kBlockThreads + thread_x()] = order_key(v[it]);
  }
  sync_block();
}

// Sample filter: the sample (a strided sample of single keys would make DRAM fetch
// nearly the whole row) gives a threshold `lo` (a key) a little below the K-th largest
// of an n-key row (n > kCap). Every key >= lo is kept; when between K and kCap are,
// the top K of the row are exactly the top K of the kept ones. `keys` (kCap words)
// is scratch.
template <int K, int kBlockThreads, int kCap, typename S>
NSA_DEVICE u32 sample_threshold(const S* src, i32 n, u32* hist, u32* sm, u32* keys) {
  constexpr u32 kRun = Sample<kCap>::kRun;
  constexpr u32 kSectors = Sample<kCap>::kSectors;
  load_sample<kBlockThreads, kCap>(src, n, keys);
  const u32 rank = Sample<kCap>::template runs<K>(n) * kRun;
  i64 thr;
  u32 ties;
  // One round (11 bits below the sample's common prefix) puts `lo` at the floor of
  // the bin holding the rank-th key: a bin's worth of extra keys at most, cheaper
  // than a second round (measured: 1 × 128K split 22.0 -> 19.3 µs).
  list_cut<kBlockThreads, 1>(keys, kSectors * kRun, rank, hist, sm, thr, ties);
  return (u32)(ties > 0 ? thr : thr + 1);
}

// The float bound equivalent to `key >= lo` (lo != 0) as a float compare: below
// -inf's key every number passes; above +inf's the bound is NaN and none does. The
// one difference, -0.0 passing a bound of +0.0, only lengthens the list, and a cut
// of any list holding the row's top K is exact. NaN never passes.
NSA_DEVICE float keep_bound(u32 lo) {
  constexpr u32 kNegInfKey = 0x007fffffu;
  return key_value(lo > kNegInfKey ? lo : kNegInfKey);
}

// Lists every position of src[begin, begin + len) at or above the bound `lo` (every
// key when lo is 0), up to kCap (sm[kCands] counts past it; entries past it are
// dropped); fkey is filled in by fill_keys. The body goes in batches of at most 32
// keys per thread (kMaxUnroll f32 vectors, half as many bf16 ones: one u32 hit mask;
// 64 bf16 keys spilled on sm_100a): one float compare per key, one list reservation
// per warp and batch, and a loop over the thread's hits only (about 3% of keys).
template <int kBlockThreads, int kCap, int kMaxUnroll, typename S>
NSA_DEVICE void filter_pass(const S* src, i32 begin, i32 len, u32 lo, u32* sm, u32* fidx) {
  using V = ScoreVec<S>;
  constexpr int kLanes = kScoreLanes<S>;
  constexpr int kUnroll = kMaxUnroll * kLanes <= 32 ? kMaxUnroll : 32 / kLanes;
  const u32 tid = thread_x();
  if (lo == 0u) {  // the whole row fits the list
    for (i32 i = (i32)tid; i < len && i < kCap; i += kBlockThreads) fidx[i] = (u32)(begin + i);
    if (tid == 0) sm[kCands] = (u32)len;
    return;
  }
  const float bound = keep_bound(lo);
  auto append_one = [&](i32 i, S v) {
    const bool hit = score_value(v) >= bound;
    const u32 c = warp_append(&sm[kCands], hit);
    if (hit && c < (u32)kCap) fidx[c] = (u32)(begin + i);
  };
  const S* row = src + begin;
  const i32 head = unaligned_head(row, len);
  for (i32 i = (i32)tid; i < head; i += kBlockThreads) append_one(i, row[i]);
  const V* body = reinterpret_cast<const V*>(row + head);
  const i32 vecs = (len - head) / kLanes;
  S nan_score;
  set_nan(nan_score);
  V nan;
#pragma unroll
  for (int e = 0; e < kLanes; ++e) nan.v[e] = nan_score;
  for (i32 base = 0; base < vecs; base += kUnroll * kBlockThreads) {  // same trip count in every warp
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const i32 j = base + u * kBlockThreads + (i32)tid;
      v[u] = j < vecs ? body[j] : nan;
    }
    u32 hits = 0;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int e = 0; e < kLanes; ++e) hits |= (score_value(v[u].v[e]) >= bound ? 1u : 0u) << (kLanes * u + e);
    }
    u32 slot = warp_reserve(&sm[kCands], popc_u32(hits));
    const i32 first = begin + head + kLanes * (base + (i32)tid);
    for (; hits != 0u; hits &= hits - 1u, ++slot) {
      const u32 b = popc_u32((hits & (0u - hits)) - 1u);  // lowest set bit
      if (slot < (u32)kCap) fidx[slot] = (u32)(first + kLanes * (i32)(b / kLanes) * kBlockThreads + (i32)(b % kLanes));
    }
  }
  for (i32 i = head + kLanes * vecs + (i32)tid; i < len; i += kBlockThreads) append_one(i, row[i]);
}

// fkey[c] = the key at position fidx[c] of src, for the first `kept` entries: a
// gather of the few listed keys (mostly L2 hits), after the pass that listed them,
// which then carries no key per hit. In one block, PAGED slots are looked up only for
// the winners, during the cut: looking them up (or prefetching them) here for the
// whole list measured slower (H200, December 2026). For a page_table_1
// the cluster and split paths look up their whole lists, spread over their blocks
// (translate_listed); over a table of pages they look up winners at placement too.
template <int kBlockThreads, typename S>
NSA_DEVICE void fill_keys(const S* src, u32 kept, const u32* fidx, u32* fkey) {
  constexpr u32 kBatch = 8;  // loads in flight per thread: one round trip for most lists
  for (u32 c0 = thread_x(); c0 < kept; c0 += kBatch * kBlockThreads) {
    float v[kBatch];
#pragma unroll
    for (u32 b = 0; b < kBatch; ++b) {
      const u32 c = c0 + b * kBlockThreads;
      v[b] = c < kept ? score_value(src[fidx[c]]) : 0.0f;
    }
#pragma unroll
    for (u32 b = 0; b < kBatch; ++b) {
      const u32 c = c0 + b * kBlockThreads;
      if (c < kept) fkey[c] = order_key(v[b]);
    }
  }
}

// The filter pass and the gather of the listed keys; the list is complete on return.
template <int kBlockThreads, int kCap, int kUnroll, typename S>
NSA_DEVICE void list_at_or_above(const S* src, i32 begin, i32 len, u32 lo, u32* sm, u32* fidx, u32* fkey) {
  filter_pass<kBlockThreads, kCap, kUnroll>(src, begin, len, lo, sm, fidx);
  sync_block();
  const u32 listed = sm[kCands];
  fill_keys<kBlockThreads>(src, listed < (u32)kCap ? listed : (u32)kCap, fidx, fkey);
  sync_block();
}

// Zeroes the list counter and returns the bound of the n-key row's list: the sample
// threshold, or 0 (every key) when n <= kCap. `keys` (kCap words) is scratch.
template <int K, int kBlockThreads, int kCap, typename S>
NSA_DEVICE u32 list_bound(const S* src, i32 n, u32* hist, u32* sm, u32* keys) {
  if (thread_x() == 0) sm[kCands] = 0u;
  const u32 lo = n > kCap ? sample_threshold<K, kBlockThreads, kCap>(src, n, hist, sm, keys) : 0u;
  sync_block();
  return lo;
}

// Zeroes the list counter, takes the sample threshold of the n-key row (none when
// n <= kCap: every key is kept) and lists the keys of src[begin, begin + len) at or
// above it; the list is complete on return. kUnroll: 16-byte vectors per thread in
// flight in the pass.
template <int K, int kBlockThreads, int kCap, int kUnroll, typename S>
NSA_DEVICE void keep_above_sample(const S* src, i32 n, i32 begin, i32 len, u32* hist, u32* sm, u32* fidx,
                                  u32* fkey) {
  const u32 lo = list_bound<K, kBlockThreads, kCap>(src, n, hist, sm, fkey);
  list_at_or_above<kBlockThreads, kCap, kUnroll>(src, begin, len, lo, sm, fidx, fkey);
}

// keep_above_sample for the split kernel, compiled apart: its registers are tight
// (it spills otherwise), and its short chunks gain nothing from 8 vectors in flight.
template <int K, int kBlockThreads, int kCap, typename S>
NSA_NOINLINE void keep_above_sample_apart(const S* src, i32 n, i32 begin, i32 len, u32* hist, u32* sm, u32* fidx,
                                          u32* fkey) {
  keep_above_sample<K, kBlockThreads, kCap, 4>(src, n, begin, len, hist, sm, fidx, fkey);
}

// Writes the listed keys above `thr` and the first `ties` keys equal to it (K in
// all; kept < 2^16) to out. Every thread counts the winners and ties among its
// entries, one block scan gives each its slots, their positions are staged in `stage`
// (K words of shared memory, free once every thread has passed the scan), and one
// coalesced pass writes them out: the stores are whole lines and a PAGED row's
// page-table reads are all issued together (measured faster on an H200).
// translated: the listed entries that can be placed already hold their PAGED slots
// (cut_and_place), so none is looked up here.
template <int K, int kTransform, int kBlockThreads>
NSA_DEVICE void place_listed(const Params& p, i32 row, i32 trow, i32* out, const u32* fidx, const u32* fkey, u32 kept,
                             i64 thr, u32 ties, u32* stage, u32* sm, bool translated) {
  const u32 tid = thread_x();
  u32 counts = 0;  // winners | ties << 16
  for (u32 c = tid; c < kept; c += kBlockThreads) {
    const i64 key = fkey[c];
    counts += key > thr ? 1u : key == thr ? 1u << 16 : 0u;
  }
  u32 total;
  const u32 before = block_exclusive_scan<kBlockThreads>(counts, sm, total);
  u32 w = before & 0xffffu;
  u32 t = before >> 16;
  if (translated) wait_async_copies();  // this thread's own entries, read below
  for (u32 c = tid; c < kept; c += kBlockThreads) {
    const i64 key = fkey[c];
    if (key > thr) {
      stage[w++] = fidx[c];
    } else if (key == thr) {
      if (t < ties) stage[(u32)K - ties + t] = fidx[c];
      ++t;
    }
  }
  sync_block();
  constexpr u32 kPer = ((u32)K + kBlockThreads - 1) / kBlockThreads;
  i32 v[kPer];
  // Positions plus one offset for the row (plain, RAGGED, or slots looked up
  // already), or table lookups; chosen once, outside the unrolled loads.
  if (!is_slots(kTransform) || translated) {
    const i32 add = kTransform == kPositions && p.offsets != nullptr ? p.offsets[row] : 0;
#pragma unroll
    for (u32 j = 0; j < kPer; ++j) {
      const u32 k = tid + j * kBlockThreads;
      v[j] = k >= (u32)K ? 0 : (i32)stage[k] + add;
    }
  } else {
#pragma unroll
    for (u32 j = 0; j < kPer; ++j) {
      const u32 k = tid + j * kBlockThreads;
      v[j] = k >= (u32)K ? 0 : emit<kTransform>(p, row, trow, (i32)stage[k]);
    }
  }
#pragma unroll
  for (u32 j = 0; j < kPer; ++j) {
    const u32 k = tid + j * kBlockThreads;
    if (k < (u32)K) out[k] = v[j];
  }
}

// PAGED: copies the page-table slot (from `slots`, the row's table row) of every
// listed entry whose key is in or above bin `bin` of (key >> shift) over its
// position, asynchronously.
template <int kBlockThreads>
NSA_DEVICE void look_up_slots(const u32* slots, u32* fidx, const u32* fkey, u32 kept, int shift, u64 bin) {
  for (u32 c = thread_x(); c < kept; c += kBlockThreads)
    if (((u64)fkey[c] >> shift) >= bin) async_copy_u32(&fidx[c], slots + fidx[c]);
}

// PAGED lists spread over many blocks (cluster and split paths): each block replaces
// the positions of its own listed keys by their page-table slots, asynchronously
// (wait_async_copies() before a thread's entries are read), so the lookups run in
// every block at once instead of in the one that cuts; that one then places the
// list's entries as they are (cut_and_place's `listed`).
template <int kBlockThreads>
NSA_DEVICE void translate_listed(const Params& p, i32 trow, u32* fidx, u32 listed) {
  const u32* slots = table_row_slots(p, trow);
  for (u32 c = thread_x(); c < listed; c += kBlockThreads) async_copy_u32(&fidx[c], slots + fidx[c]);
}

// Places the top K of the `kept` listed keys (K <= kept < 2^16); the cut's histogram
// words then stage the chosen positions. PAGED from a page_table_1: once round 0 of
// the cut has found its bin, the page-table slots of the listed keys in or above it
// (about K of them) are copied over their positions asynchronously, so the lookups
// overlap the cut's later rounds instead of following it. A table of pages (a few KB
// a row) is read as the chosen entries are placed: measured faster than prefetching
// it into L2 or copying it to shared memory after round 0 (H200, December 2026).
// `listed`: the list was joined from many blocks, which looked up their own
// page_table_1 slots (translate_listed).
template <int K, int kTransform, int kBlockThreads>
NSA_DEVICE void cut_and_place(const Params& p, i32 row, i32 trow, i32* out, u32* fidx, const u32* fkey, u32 kept,
                              u32* hist, u32* sm, bool listed) {
  static_assert(K <= kBins, "the chosen positions fit the histogram words");
  const bool table_1 = reads_table_1<kTransform>(p);
  i64 thr;
  u32 ties;
  auto after_round0 = [&](int shift, u64 bin) {
    if (table_1 && !listed) look_up_slots<kBlockThreads>(table_row_slots(p, trow), fidx, fkey, kept, shift, bin);
  };
  list_cut<kBlockThreads>(fkey, kept, (u32)K, hist, sm, thr, ties, after_round0);
  place_listed<K, kTransform, kBlockThreads>(p, row, trow, out, fidx, fkey, kept, thr, ties, hist, sm, table_1);
}

// The sample filter over one block's row (non-deterministic rows of n > K). Returns
// false, having written nothing, when the row is too long for the list (more than
// 3/4 of it expected kept: the pass would likely be wasted), when fewer than K keys
// are kept (a sample that sat high) or more than kCap (heavy ties near the
// threshold); the caller then runs the histogram path.
template <int K, int kTransform, int kBlockThreads, int kCap, int kUnroll, typename S>
NSA_DEVICE bool filter_select(const Params& p, i32 row, i32 trow, i32* out, const S* src, i32 n, u32* hist,
                                u32* sm, u32* fidx, u32* fkey) {
  if (Sample<kCap>::template expected_kept<K>(n) > (u64)kCap * 3u / 4u) return false;
  keep_above_sample<K, kBlockThreads, kCap, kUnroll>(src, n, 0, n, hist, sm, fidx, fkey);
  const u32 kept = sm[kCands];
  sync_block();  // every thread has read kCands before anyone resets it
  if (kept < (u32)K || kept > (u32)kCap) return false;  // fewer than K, or some dropped
  cut_and_place<K, kTransform, kBlockThreads>(p, row, trow, out, fidx, fkey, kept, hist, sm, false);
  return true;
}

// Row `row`'s extent, and whether it may be read: a start >= 0, start + length
// within the row capacity, a page-table row (PAGED prefill) and a length within the
// table width (PAGED). Lengths <= 0 are empty rows, always fine.
struct RowExtent {
  i32 s0;
  i32 n;
  i32 trow;
  bool ok;
};
template <int kTransform>
NSA_DEVICE RowExtent row_extent(const Params& p, i32 row) {
  RowExtent e;
  e.s0 = p.row_starts != nullptr ? p.row_starts[row] : 0;
  e.n = p.lengths[row] > 0 ? p.lengths[row] : 0;
  e.trow = table_row_of<kTransform>(p, row);
  e.ok = e.n == 0 || (e.s0 >= 0 && (i64)e.s0 + e.n <= p.row_capacity && e.trow >= 0 &&
                      (!is_slots(kTransform) || (i64)e.n <= (i64)p.table_width * p.page_size));
  return e;
}

// Row `row`'s candidates, from its start s0.
template <typename S>
NSA_DEVICE const S* row_scores(const Params& p, i32 row, i32 s0) {
  return static_cast<const S*>(p.scores) + (i64)row * p.row_stride + s0;
}

// Top-k of row `row` by one block. kFilter: try the sample filter first (unordered
// rows only); otherwise, or when it declines, the histogram path. Without kFilter
// (the split and cluster kernels' fallback) the histogram path alone, its passes
// compact.
template <typename S, int K, int kTransform, bool kDeterministic, int kBlockThreads, int kCandCap, int kCacheCap,
          int kSmemWords, bool kFilter = true>
NSA_DEVICE void select_row(const Params& p, u32* status, i32 row) {
  static_assert(kFixedWords + 2 * kCandCap + kCacheCap <= kSmemWords, "launch provides kSmemWords of shared memory");
  extern NSA_SHARED u32 smem[];
  const ListSmem l = list_smem<kCandCap>(smem);
  u32 *hist = l.hist, *sm = l.sm, *cand_idx = l.idx, *cand_key = l.key;
  u32* cache = cand_key + kCandCap;

  const u32 tid = thread_x();
  i32* out = p.out + (i64)row * K;
  const RowExtent ext = row_extent<kTransform>(p, row);
  const i32 s0 = ext.s0, n = ext.n, trow = ext.trow;
  // The passes over the row write positions (kRaw); translate_after turns the K
  // placed ones into the transform's entries (after a barrier), keeping the table
  // reads and the run-time choice out of the passes.
  auto translate_after = [&] {
    if (translates<kTransform>(p)) {
      sync_block();
      translate_placed<K, kTransform, kBlockThreads>(p, row, trow, out);
    }
  };
  if (!ext.ok) {
    if (tid == 0) report_bad_entry(status, row);
    for (int k = tid; k < K; k += kBlockThreads) out[k] = -1;
    return;
  }
  if (n <= K) {  // short row: every position, in order, then -1
    for (int k = tid; k < K; k += kBlockThreads) out[k] = k < n ? emit<kTransform>(p, row, trow, k) : -1;
    return;
  }

  const S* src = row_scores<S>(p, row, s0);
  const bool cached = kCacheCap > 0 && n <= kCacheCap;
  // The sample filter keeps its list in the candidate lists and the row cache.
  constexpr int kFilterCap = (2 * kCandCap + kCacheCap) / 2;
  if constexpr (kFilter && !kDeterministic && kFilterCap >= 2 * K) {
    // 8 f32 vectors in flight per thread (4 of bf16: see filter_pass), in both
    // layouts (H200, December 2026: 2048 x 32K 153.4 -> 144.0 us against 4
    // in the phase harness).
    constexpr int kUnroll = 8;
    if (filter_select<K, kTransform, kBlockThreads, kFilterCap, kUnroll>(p, row, trow, out, src, n, hist, sm, cand_idx,
                                                                          cand_idx + kFilterCap)) {
      return;
    }
  }

  auto threshold = [&](const u32* h, int bins, u32 rank) {
    if constexpr (kFilter) {
      find_threshold<kBlockThreads>(h, bins, rank, sm);
    } else {
      find_threshold_apart<kBlockThreads>(h, bins, rank, sm);
    }
  };
  // Round 0: histogram of the top 13 bits of every key (caching the keys).
  for (int b = tid; b < kBins; b += kBlockThreads) hist[b] = 0u;
  if (tid == 0) {
    sm[kWinners] = 0u;
    sm[kTies] = 0u;
    sm[kCands] = 0u;
  }
  sync_block();
  for_each_key_as<kBlockThreads, kFilter>(false, cache, src, n, [&](i32 i, u32 key) {
    atomic_add_ret(&hist[key >> round_shift(0)], 1u);
    if (cached) cache[i] = key;
  });
  sync_block();
  threshold(hist, kBins, (u32)K);
  const u32 bin0 = sm[kThrBin];
  u32 prefix = bin0;
  u32 r = (u32)K - sm[kAbove];  // still to take from the threshold bin
  const u32 in_bin = hist[bin0];
  const bool use_cands = in_bin <= (u32)kCandCap;
  sync_block();
  if (!kDeterministic && !use_cands) {
    // The round-0 bin is too big for the candidate list (coarse bins: 4 per octave).
    if constexpr (kFilter) {
      overflow_select<K, kRaw, kBlockThreads, kCandCap>(p, row, trow, out, cached, cache, src, n, bin0, r, hist, sm,
                                                         cand_idx, cand_key);
      if (translates<kTransform>(p)) translate_placed<K, kTransform, kBlockThreads>(p, row, trow, out);
    } else {
      overflow_select_apart<K, kTransform, kBlockThreads, kCandCap>(p, row, trow, out, cached, cache, src, n, bin0, r,
                                                                   hist, sm, cand_idx, cand_key);
    }
    return;
  }

  // The bin's keys become candidates; without ordering, winners above it go out now.
  if (use_cands || !kDeterministic) {
    for_each_key_as<kBlockThreads, kFilter>(cached, cache, src, n, [&](i32 i, u32 key) {
      const u32 bin = key >> round_shift(0);
      if (!kDeterministic && bin > bin0) {
        out[atomic_add_ret(&sm[kWinners], 1u)] = emit<kRaw>(p, row, trow, i);
      } else if (bin == bin0 && use_cands) {
        const u32 c = atomic_add_ret(&sm[kCands], 1u);
        cand_idx[c] = (u32)i;
        cand_key[c] = key;
      }
    });
  }
  sync_block();  // candidates are read by other threads below

  // Rounds 1, 2: refine the threshold bin until the threshold key is exact, or until
  // the whole bin is taken. Afterwards: winners are keys > thr, plus r keys == thr.
  i64 thr = -1;
  bool resolved = false;
  if (in_bin == r) {  // the whole round-0 bin is taken
    thr = ((i64)prefix << round_shift(0)) - 1;
    r = 0;
    resolved = true;
  }
#pragma unroll
  for (int round = 1; round < kRounds; ++round) {
    if (resolved) break;
    const int shift = round_shift(round);
    const u32 mask = (1u << round_width(round)) - 1u;
    const int up = round_shift(round - 1);
    for (int b = tid; b < kBins; b += kBlockThreads) hist[b] = 0u;
    sync_block();
    if (use_cands) {
      for (u32 c = tid; c < in_bin; c += kBlockThreads) {
        const u32 key = cand_key[c];
        if ((key >> up) == prefix) atomic_add_ret(&hist[(key >> shift) & mask], 1u);
      }
    } else {
      for_each_key_as<kBlockThreads, kFilter>(cached, cache, src, n, [&](i32, u32 key) {
        if ((key >> up) == prefix) atomic_add_ret(&hist[(key >> shift) & mask], 1u);
      });
    }
    sync_block();
    threshold(hist, 1 << round_width(round), r);
    const u32 bin = sm[kThrBin];
    r -= sm[kAbove];
    prefix = (prefix << round_width(round)) | bin;
    const u32 count_here = hist[bin];
    sync_block();
    if (round == kRounds - 1) {
      thr = (i64)prefix;
      resolved = true;
    } else if (count_here == r) {
      thr = ((i64)prefix << shift) - 1;
      r = 0;
      resolved = true;
    }
  }

  if (kDeterministic) {
    // Ordered compaction over the row: output sorted by position, ties by lowest position.
    u32 win_run = 0, tie_run = 0;
    for (i32 base = 0; base < n; base += kBlockThreads) {
      const i32 i = base + (i32)tid;
      const u32 key = i < n ? (cached ? cache[i] : order_key(score_value(src[i]))) : 0u;
      const u32 w = (i < n && (i64)key > thr) ? 1u : 0u;
      const u32 t = (i < n && (i64)key == thr) ? 1u : 0u;
      u32 total;
      const u32 before = block_exclusive_scan<kBlockThreads>(w | (t << 16), sm, total);
      const u32 tb = tie_run + (before >> 16);
      const u32 pos = win_run + (before & 0xffffu) + (tb < r ? tb : r);
      if (w || (t && tb < r)) out[pos] = emit<kRaw>(p, row, trow, i);
      win_run += total & 0xffffu;
      tie_run += total >> 16;
    }
    translate_after();
    return;
  }
  // Non-deterministic: the round-0 bin's winners and ties (any r of the ties).
  const Placer<K, kRaw> place{p, row, trow, out, sm, thr, r};
  if (use_cands) {
    for (u32 c = tid; c < in_bin; c += kBlockThreads) place((i32)cand_idx[c], cand_key[c]);
  } else {
    for_each_key_as<kBlockThreads, kFilter>(cached, cache, src, n, [&](i32 i, u32 key) {
      if ((key >> round_shift(0)) == bin0) place(i, key);
    });
  }
  translate_after();
}

// One block per row (the sample filter first, for unordered rows) over scores of type S.
template <typename S, int K, int kTransform, bool kDeterministic, int kBlockThreads, int kCandCap, int kCacheCap,
          int kSmemWords>
NSA_DEVICE void select(const Params& p, u32* status) {
  select_row<S, K, kTransform, kDeterministic, kBlockThreads, kCandCap, kCacheCap, kSmemWords>(p, status,
                                                                                              (i32)block_x());
}

// The histogram path over row `row`, compiled apart (keeps the split kernel's
// registers for its own work).
template <typename S, int K, int kTransform, int kBlockThreads, int kCandCap, int kCacheCap, int kSmemWords>
NSA_NOINLINE void histogram_row(const Params& p, u32* status, i32 row) {
  select_row<S, K, kTransform, false, kBlockThreads, kCandCap, kCacheCap, kSmemWords, false>(p, status, row);
}

// Split path: block (row, chunk) of a row longer than K keeps the keys >= the
// sample threshold of its chunk (every block derives the same threshold from the
// same sample), appends them to the row's list in the workspace, and the row's last
// block to finish cuts and places the top K from that list, or, when the list holds
// fewer than K or overflowed, runs the histogram path over the whole row. It leaves
// the row's workspace words zero. Short and rejected rows are chunk 0's.
template <typename S, int K, int kTransform, int kBlockThreads, int kCap, int kSmemWords>
NSA_DEVICE void split_select(const Params& p, const Split& split, u32* status) {
  static_assert(kFixedWords + 2 * kCap <= kSmemWords, "launch provides kSmemWords of shared memory");
  extern NSA_SHARED u32 smem[];
  const ListSmem l = list_smem<kCap>(smem);
  u32 *hist = l.hist, *sm = l.sm, *fidx = l.idx, *fkey = l.key;
  const u32 tid = thread_x();
  const i32 row = (i32)(block_x() / (u32)split.chunks);
  const i32 chunk = (i32)(block_x() % (u32)split.chunks);
  const RowExtent ext = row_extent<kTransform>(p, row);
  const i32 n = ext.n;
  // The histogram path in the same shared memory: up to 4096 candidates, the rest
  // as row cache.
  constexpr int kFallbackCands = kCap >= 8192 ? 4096 : kCap / 2;
  auto whole_row = [&] {
    histogram_row<S, K, kTransform, kBlockThreads, kFallbackCands, 2 * kCap - 2 * kFallbackCands, kSmemWords>(
        p, status, row);
  };
  if (!ext.ok || n <= K) {
    if (chunk == 0) whole_row();
    return;
  }
  const i32 active = (i32)(((i64)n + split.chunk - 1) / split.chunk);
  if (chunk >= active) return;
  const i32 begin = chunk * split.chunk;
  const i32 len = n - begin < split.chunk ? n - begin : split.chunk;
  const S* src = row_scores<S>(p, row, ext.s0);
  keep_above_sample_apart<K, kBlockThreads, kCap>(src, n, begin, len, hist, sm, fidx, fkey);

  // Reserve room in the row's list (one atomic per block) and copy the chunk's keys.
  u32* state = split.state + (i64)row * kStateWords;
  u32* gidx = split.cand_idx + (i64)row * split.cand_cap;
  u32* gkey = split.cand_key + (i64)row * split.cand_cap;
  const u32 mine = sm[kCands];
  const bool table_1 = reads_table_1<kTransform>(p);
  if (table_1) translate_listed<kBlockThreads>(p, ext.trow, fidx, mine < (u32)kCap ? mine : (u32)kCap);
  if (tid == 0) sm[kBase] = atomic_add_ret(&state[kStateCands], mine);
  sync_block();
  const u32 base = sm[kBase];
  if (table_1) wait_async_copies();  // this thread's entries, copied below
  for (u32 c = tid; c < mine && c < (u32)kCap && base + c < (u32)kCap; c += kBlockThreads) {
    gidx[base + c] = fidx[c];
    gkey[base + c] = fkey[c];
  }
  fence_device();  // the list entries are visible before this block counts as done
  sync_block();
  if (tid == 0) sm[kLast] = atomic_add_ret(&state[kStateDone], 1u) == (u32)(active - 1) ? 1u : 0u;
  sync_block();
  if (sm[kLast] == 0u) return;

  fence_device();
  const u32 kept = *(volatile u32*)&state[kStateCands];
  sync_block();  // every thread has read the count
  if (tid == 0) {  // the row's other blocks are done with its state words: reset them now
    state[kStateCands] = 0u;
    state[kStateDone] = 0u;
  }
  if (kept >= (u32)K && kept <= (u32)kCap) {  // at least K, none dropped
    constexpr u32 kBatch = 4;  // loads in flight per thread
    for (u32 c0 = 0; c0 < kept; c0 += kBatch * kBlockThreads) {
      u32 gi[kBatch], gk[kBatch];
#pragma unroll
      for (u32 b = 0; b < kBatch; ++b) {
        const u32 c = c0 + b * kBlockThreads + tid;
        gi[b] = c < kept ? load_coherent(&gidx[c]) : 0u;
        gk[b] = c < kept ? load_coherent(&gkey[c]) : 0u;
      }
#pragma unroll
      for (u32 b = 0; b < kBatch; ++b) {
        const u32 c = c0 + b * kBlockThreads + tid;
        if (c < kept) {
          fidx[c] = gi[b];
          fkey[c] = gk[b];
        }
      }
    }
    sync_block();
    cut_and_place<K, kTransform, kBlockThreads>(p, row, ext.trow, p.out + (i64)row * K, fidx, fkey, kept,
                                                               hist, sm, true);
  } else {
    whole_row();
  }
}

}  // namespace topk
}  // namespace nsa
