// Exact top-k of f32 scores per row by radix select (spec §7), with the output
// transformed in place: relative positions, page-table slots (PAGED) or positions
// plus a per-row offset (RAGGED).
//
// One block per row. Keys are the scores mapped to order-preserving u32 (NaN maps
// to 0, below -inf, so a NaN is never chosen ahead of any number). Round 0 builds
// an 11-bit histogram of every key and finds the bin holding the k-th largest;
// keys above it are winners. Rounds 1 and 2 refine the threshold bin (11 and 10
// more bits) over a shared-memory candidate list, or, when that bin holds more
// keys than the list can take, by re-reading the row: exact either way, never a
// dropped candidate. Rows of up to kCacheCap keys are kept in shared memory so
// the row is read from HBM once.
#pragma once
#ifndef NSA_DEVICE
#error "include the arch header (nsa/cuda/arch.cuh or nsa/rocm/arch.cuh) first"
#endif
#include "nsa/common/block.cuh"
#include "nsa/common/segments.cuh"
#include "nsa/common/status.cuh"

namespace nsa {
namespace topk {

enum Transform { kPlain = 0, kPaged = 1, kRagged = 2 };

// Kernel parameters; the host mirrors this layout field for field.
struct Params {
  const float* scores;      // [rows, row_stride] f32; row r's candidates start at row_starts[r]
  const i32* lengths;       // [rows] candidates per row (<= 0: none)
  const i32* row_starts;    // [rows] or null (all 0)
  const i32* page_table;    // PAGED: [table_rows, table_stride] slots
  const i32* cu_seqlens_q;  // PAGED prefill: [table_rows + 1], row r uses table row i with cu[i] <= r < cu[i+1]; null: row r
  const i32* offsets;       // RAGGED: [rows]
  i32* out;                 // [rows, K]
  i64 row_stride;           // elements between score rows
  i64 table_stride;         // elements between page-table rows
  i32 rows;
  i32 row_capacity;         // readable elements per score row: row_starts[r] + lengths[r] must fit
  i32 table_rows;
  i32 table_width;          // PAGED: lengths[r] must be <= this
};

// Workspace of the split path (rows too long for one block): zero on entry, and
// left zero again by the finish stage.
struct Split {
  u32* hist;      // [rows, kBins] round-0 histogram, summed over the row's chunks
  u32* state;     // [rows, kStateWords]
  u32* cand_idx;  // [rows, cand_cap] threshold-bin candidates
  u32* cand_key;  // [rows, cand_cap]
  i32 chunk;      // elements of a row per block in the histogram and collect stages
  i32 chunks;     // blocks per row (ceil(row_capacity / chunk))
  i32 cand_cap;
};
enum StateWord { kStateWinners = 0, kStateCands = 1, kStateWords = 4 };

// Round 0 uses 13 bits (sign, 8 exponent, 4 mantissa: 16 bins per octave) so the
// threshold bin of realistic rows fits the candidate list; rounds 1 and 2 refine
// 11 and 8 more bits.
constexpr int kBins = 8192;
constexpr int kRounds = 3;
// Radix rounds over the 32-bit key: bits [21, 32), [10, 21), [0, 10).
NSA_DEVICE constexpr int round_shift(int round) { return round == 0 ? 19 : round == 1 ? 8 : 0; }
NSA_DEVICE constexpr int round_width(int round) { return round == 0 ? 13 : round == 1 ? 11 : 8; }
NSA_DEVICE constexpr u32 round_mask(int round) { return (1u << round_width(round)) - 1u; }

// Scalars kept in shared memory after the scan scratch.
enum Slot { kThrBin = kScanScratch, kAbove, kWinners, kTies, kCands, kScalarWords };

struct alignas(16) F4 {
  float v[4];
};

NSA_DEVICE u32 order_key(float f) {
  const u32 b = f32_as_u32(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Calls f(i, key) for every i in [0, n) of `src`, the block's threads striding over
// the row: a scalar head up to 16-byte alignment, then kUnroll float4 loads issued
// before any is used (keeps ~64 B per thread in flight), then a scalar tail.
template <int kBlockThreads, typename F>
NSA_DEVICE void scan_global(const float* src, i32 n, F&& f) {
  constexpr int kUnroll = 4;
  const i32 tid = (i32)thread_x();
  const i32 to_align = (i32)(((16u - ((u32)(u64)src & 15u)) & 15u) / 4u);
  const i32 head = to_align < n ? to_align : n;
  for (i32 i = tid; i < head; i += kBlockThreads) f(i, order_key(src[i]));
  const F4* body = reinterpret_cast<const F4*>(src + head);
  const i32 vecs = (n - head) / 4;
  i32 j = tid;
  for (; j + (kUnroll - 1) * kBlockThreads < vecs; j += kUnroll * kBlockThreads) {
    F4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = body[j + u * kBlockThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int e = 0; e < 4; ++e) f(head + 4 * (j + u * kBlockThreads) + e, order_key(v[u].v[e]));
    }
  }
  for (; j < vecs; j += kBlockThreads) {
    const F4 v = body[j];
#pragma unroll
    for (int e = 0; e < 4; ++e) f(head + 4 * j + e, order_key(v.v[e]));
  }
  for (i32 i = head + 4 * vecs + tid; i < n; i += kBlockThreads) f(i, order_key(src[i]));
}

// Every (position, key) of the row, from the shared-memory copy when there is one.
template <int kBlockThreads, typename F>
NSA_DEVICE void for_each_key(bool cached, const u32* cache, const float* src, i32 n, F&& f) {
  if (cached) {
    for (i32 i = (i32)thread_x(); i < n; i += kBlockThreads) f(i, cache[i]);
  } else {
    scan_global<kBlockThreads>(src, n, f);
  }
}

// Which page-table row serves score row `row` (-1: none).
template <int kTransform>
NSA_DEVICE i32 table_row_of(const Params& p, i32 row) {
  return kTransform == kPaged ? segment_of(p.cu_seqlens_q, p.table_rows, row) : 0;
}

template <int kTransform>
NSA_DEVICE i32 emit(const Params& p, i32 row, i32 trow, i32 pos) {
  if (kTransform == kRagged) return pos + p.offsets[row];
  if (kTransform == kPaged) return p.page_table[(i64)trow * p.table_stride + pos];
  return pos;
}

// Finds the bin holding the r-th largest key (counting down from the top bin) in
// hist[0, bins), bins <= kMaxBins; stores it and the count of keys in higher bins in
// sm[kThrBin/kAbove].
template <int kBlockThreads, int kMaxBins = kBins>
NSA_DEVICE void find_threshold(const u32* hist, int bins, u32 r, u32* sm) {
  constexpr int kPer = kMaxBins / kBlockThreads;
  static_assert(kPer * kBlockThreads == kMaxBins, "bins split evenly over threads");
  const u32 tid = thread_x();
  u32 c[kPer];
  u32 sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int bin = bins - 1 - (int)(tid * kPer + j);
    c[j] = bin >= 0 ? hist[bin] : 0u;
    sum += c[j];
  }
  u32 total;
  u32 run = block_exclusive_scan<kBlockThreads>(sum, sm, total);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (run < r && r <= run + c[j]) {
      sm[kThrBin] = (u32)(bins - 1 - (int)(tid * kPer + j));
      sm[kAbove] = run;
    }
    run += c[j];
  }
  sync_block();
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

// Leaves one row of the split workspace zero for the next call.
template <int kBlockThreads>
NSA_DEVICE void clear_split_row_impl(u32* hist, u32* state, int bins, int words) {
  for (int b = thread_x(); b < bins; b += kBlockThreads) hist[b] = 0u;
  if ((int)thread_x() < words) state[thread_x()] = 0u;
}

// Round-0 bin overflowed the candidate list: one more pass over the row resolves
// round 1 (emitting the winners above the round-0 bin on the way, unless the split
// path's collect stage already did), a second gathers the far smaller round-1 bin
// (emitting its winners above the round-1 bin), and round 2 plus the ties come from
// those candidates, or from a third pass if even they do not fit. Exact always.
template <int K, int kTransform, int kBlockThreads, int kCandCap, bool kSplit>
NSA_DEVICE void overflow_select(const Params& p, i32 row, i32 trow, i32* out, bool cached, const u32* cache,
                                const float* src, i32 n, u32 bin0, u32 r, u32* hist, u32* sm, u32* cand_idx,
                                u32* cand_key) {
  const u32 tid = thread_x();
  for (int b = tid; b < kBins; b += kBlockThreads) hist[b] = 0u;
  sync_block();
  for_each_key<kBlockThreads>(cached, cache, src, n, [&](i32 i, u32 key) {
    const u32 bin = key >> round_shift(0);
    if (bin > bin0) {
      if (!kSplit) out[atomic_add_ret(&sm[kWinners], 1u)] = emit<kTransform>(p, row, trow, i);
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
  for_each_key<kBlockThreads>(cached, cache, src, n, [&](i32 i, u32 key) {
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
    for_each_key<kBlockThreads>(cached, cache, src, n, [&](i32, u32 key) {
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
    for_each_key<kBlockThreads>(cached, cache, src, n, [&](i32 i, u32 key) {
      if ((key >> round_shift(1)) == prefix1) place(i, key);
    });
  }
  sync_block();
}

// Shared-memory words the kernel needs beyond the candidate list and row cache.
constexpr int kFixedWords = kBins + kScalarWords;

template <int K, int kTransform, bool kDeterministic, int kBlockThreads, int kCandCap, int kCacheCap, int kSmemWords,
          bool kSplit = false>
NSA_DEVICE void select(const Params& p, u32* status, const Split& split = Split{}) {
  static_assert(!(kSplit && kDeterministic), "the split path is unordered");
  static_assert(kFixedWords + 2 * kCandCap + kCacheCap <= kSmemWords, "launch provides kSmemWords of shared memory");
  extern NSA_SHARED u32 smem[];
  u32* hist = smem;
  u32* sm = hist + kBins;
  u32* cand_idx = sm + kScalarWords;
  u32* cand_key = cand_idx + kCandCap;
  u32* cache = cand_key + kCandCap;

  const i32 row = (i32)block_x();
  const u32 tid = thread_x();
  i32* out = p.out + (i64)row * K;
  const i32 s0 = p.row_starts != nullptr ? p.row_starts[row] : 0;
  const i32 n = p.lengths[row] > 0 ? p.lengths[row] : 0;
  const i32 trow = table_row_of<kTransform>(p, row);
  const bool row_ok = n == 0 || (s0 >= 0 && (i64)s0 + n <= p.row_capacity && trow >= 0 &&
                                 (kTransform != kPaged || n <= p.table_width));
  if (!row_ok) {
    if (tid == 0) report_bad_entry(status, row);
    for (int k = tid; k < K; k += kBlockThreads) out[k] = -1;
    return;
  }
  if (n <= K) {  // short row: every position, in order, then -1
    for (int k = tid; k < K; k += kBlockThreads) out[k] = k < n ? emit<kTransform>(p, row, trow, k) : -1;
    return;
  }

  const float* src = p.scores + (i64)row * p.row_stride + s0;
  const bool cached = kCacheCap > 0 && n <= kCacheCap;


  // Round 0: histogram of the top 11 bits of every key (caching the keys); the
  // split path's earlier stages have summed it, and emitted the winners above the
  // threshold bin, already.
  u32* split_hist = kSplit ? split.hist + (i64)row * kBins : nullptr;
  u32* split_state = kSplit ? split.state + (i64)row * kStateWords : nullptr;
  for (int b = tid; b < kBins; b += kBlockThreads) hist[b] = kSplit ? split_hist[b] : 0u;
  if (tid == 0) {
    sm[kWinners] = kSplit ? split_state[kStateWinners] : 0u;
    sm[kTies] = 0u;
    sm[kCands] = 0u;
  }
  sync_block();
  if (!kSplit) {
    scan_global<kBlockThreads>(src, n, [&](i32 i, u32 key) {
      atomic_add_ret(&hist[key >> round_shift(0)], 1u);
      if (cached) cache[i] = key;
    });
  }
  sync_block();
  find_threshold<kBlockThreads>(hist, kBins, (u32)K, sm);
  const u32 bin0 = sm[kThrBin];
  u32 prefix = bin0;
  u32 r = (u32)K - sm[kAbove];  // still to take from the threshold bin
  const u32 in_bin = hist[bin0];
  const bool use_cands = in_bin <= (u32)kCandCap;
  sync_block();
  if (!kDeterministic && !use_cands) {
    // The round-0 bin is too big for the candidate list (coarse bins: 4 per octave).
    overflow_select<K, kTransform, kBlockThreads, kCandCap, kSplit>(p, row, trow, out, cached, cache, src, n, bin0, r,
                                                                   hist, sm, cand_idx, cand_key);
    if (kSplit) clear_split_row_impl<kBlockThreads>(split_hist, split_state, kBins, kStateWords);
    return;
  }

  if (kSplit && use_cands) {
    const u32* gi = split.cand_idx + (i64)row * split.cand_cap;
    const u32* gk = split.cand_key + (i64)row * split.cand_cap;
    for (u32 c = tid; c < in_bin; c += kBlockThreads) {
      cand_idx[c] = gi[c];
      cand_key[c] = gk[c];
    }
  }
  // The bin's keys become candidates; without ordering, winners above it go out now.
  if (!kSplit && (use_cands || !kDeterministic)) {
    for_each_key<kBlockThreads>(cached, cache, src, n, [&](i32 i, u32 key) {
      const u32 bin = key >> round_shift(0);
      if (!kDeterministic && bin > bin0) {
        out[atomic_add_ret(&sm[kWinners], 1u)] = emit<kTransform>(p, row, trow, i);
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
      for_each_key<kBlockThreads>(cached, cache, src, n, [&](i32, u32 key) {
        if ((key >> up) == prefix) atomic_add_ret(&hist[(key >> shift) & mask], 1u);
      });
    }
    sync_block();
    find_threshold<kBlockThreads>(hist, 1 << round_width(round), r, sm);
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
      const u32 key = i < n ? (cached ? cache[i] : order_key(src[i])) : 0u;
      const u32 w = (i < n && (i64)key > thr) ? 1u : 0u;
      const u32 t = (i < n && (i64)key == thr) ? 1u : 0u;
      u32 total;
      const u32 before = block_exclusive_scan<kBlockThreads>(w | (t << 16), sm, total);
      const u32 tb = tie_run + (before >> 16);
      const u32 pos = win_run + (before & 0xffffu) + (tb < r ? tb : r);
      if (w || (t && tb < r)) out[pos] = emit<kTransform>(p, row, trow, i);
      win_run += total & 0xffffu;
      tie_run += total >> 16;
    }
    return;
  }
  // Non-deterministic: the round-0 bin's winners and ties (any r of the ties).
  const Placer<K, kTransform> place{p, row, trow, out, sm, thr, r};
  if (use_cands) {
    for (u32 c = tid; c < in_bin; c += kBlockThreads) place((i32)cand_idx[c], cand_key[c]);
  } else {
    for_each_key<kBlockThreads>(cached, cache, src, n, [&](i32 i, u32 key) {
      if ((key >> round_shift(0)) == bin0) place(i, key);
    });
  }
  if (kSplit) clear_split_row_impl<kBlockThreads>(split_hist, split_state, kBins, kStateWords);
}

// Split path, stage 1: block (row, chunk) adds its chunk's round-0 histogram to
// split.hist[row]. Rows that are short or rejected are left to the finish stage.
template <int K, int kTransform, int kBlockThreads>
NSA_DEVICE bool split_chunk(const Params& p, const Split& split, i32& row, i32& begin, i32& count, i32& trow) {
  row = (i32)(block_x() / (u32)split.chunks);
  const i32 chunk = (i32)(block_x() % (u32)split.chunks);
  const i32 s0 = p.row_starts != nullptr ? p.row_starts[row] : 0;
  const i32 n = p.lengths[row] > 0 ? p.lengths[row] : 0;
  trow = table_row_of<kTransform>(p, row);
  const bool row_ok = s0 >= 0 && (i64)s0 + n <= p.row_capacity && trow >= 0 &&
                      (kTransform != kPaged || n <= p.table_width);
  begin = chunk * split.chunk;
  if (!row_ok || n <= K || begin >= n) return false;
  count = n - begin < split.chunk ? n - begin : split.chunk;
  return true;
}

template <int K, int kTransform, int kBlockThreads>
NSA_DEVICE void split_histogram(const Params& p, const Split& split) {
  extern NSA_SHARED u32 smem[];
  u32* hist = smem;
  i32 row, begin, count, trow;
  const bool active = split_chunk<K, kTransform, kBlockThreads>(p, split, row, begin, count, trow);
  if (!active) return;  // uniform across the block
  const u32 tid = thread_x();
  for (int b = tid; b < kBins; b += kBlockThreads) hist[b] = 0u;
  sync_block();
  const i32 s0 = p.row_starts != nullptr ? p.row_starts[row] : 0;
  const float* src = p.scores + (i64)row * p.row_stride + s0 + begin;
  scan_global<kBlockThreads>(src, count, [&](i32, u32 key) { atomic_add_ret(&hist[key >> round_shift(0)], 1u); });
  sync_block();
  u32* g = split.hist + (i64)row * kBins;
  for (int b = tid; b < kBins; b += kBlockThreads) {
    if (hist[b] != 0u) atomic_add_ret(&g[b], hist[b]);
  }
}

// Split path, stage 2: block (row, chunk) finds the threshold bin from the summed
// histogram, emits its chunk's winners above it and appends the bin's keys to the
// row's candidate list (counting past cand_cap sends the finish stage to the row).
template <int K, int kTransform, int kBlockThreads>
NSA_DEVICE void split_collect(const Params& p, const Split& split) {
  extern NSA_SHARED u32 smem[];
  u32* hist = smem;
  u32* sm = hist + kBins;
  i32 row, begin, count, trow;
  const bool active = split_chunk<K, kTransform, kBlockThreads>(p, split, row, begin, count, trow);
  if (!active) return;
  const u32 tid = thread_x();
  const u32* g = split.hist + (i64)row * kBins;
  for (int b = tid; b < kBins; b += kBlockThreads) hist[b] = g[b];
  sync_block();
  find_threshold<kBlockThreads>(hist, kBins, (u32)K, sm);
  const u32 bin0 = sm[kThrBin];
  const bool keep = hist[bin0] <= (u32)split.cand_cap;
  const i32 s0 = p.row_starts != nullptr ? p.row_starts[row] : 0;
  const float* src = p.scores + (i64)row * p.row_stride + s0 + begin;
  i32* out = p.out + (i64)row * K;
  u32* state = split.state + (i64)row * kStateWords;
  u32* ci = split.cand_idx + (i64)row * split.cand_cap;
  u32* ck = split.cand_key + (i64)row * split.cand_cap;
  scan_global<kBlockThreads>(src, count, [&](i32 i, u32 key) {
    const u32 bin = key >> round_shift(0);
    if (bin > bin0) {
      out[atomic_add_ret(&state[kStateWinners], 1u)] = emit<kTransform>(p, row, trow, begin + i);
    } else if (bin == bin0 && keep) {
      const u32 c = atomic_add_ret(&state[kStateCands], 1u);
      ci[c] = (u32)(begin + i);
      ck[c] = key;
    }
  });
}

enum SplitStage { kSplitHist = 0, kSplitCollect = 1, kSplitFinish = 2 };

// One stage of the split path; the launch provides kSmemWords of shared memory.
template <int kStage, int K, int kTransform, int kBlockThreads, int kCandCap, int kSmemWords>
NSA_DEVICE void split_stage(const Params& p, const Split& split, u32* status) {
  if constexpr (kStage == kSplitHist) {
    static_assert(kFixedWords <= kSmemWords, "histogram and scan scratch fit");
    split_histogram<K, kTransform, kBlockThreads>(p, split);
  } else if constexpr (kStage == kSplitCollect) {
    static_assert(kFixedWords <= kSmemWords, "histogram and scan scratch fit");
    split_collect<K, kTransform, kBlockThreads>(p, split);
  } else {
    select<K, kTransform, false, kBlockThreads, kCandCap, 0, kSmemWords, true>(p, status, split);
  }
}

}  // namespace topk
}  // namespace nsa
