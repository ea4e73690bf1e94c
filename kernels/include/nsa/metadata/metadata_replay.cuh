// CUDA-graph metadata capture and replay (spec §9.2, §9.3, §9.6) in one launch:
// the lengths, their cumulative sums, the clipped NSA lengths, the gathered
// page_table_1 rows and the real page table of a graph state, written in place
// into its fixed-capacity buffers (and into every step backend of a multi-step
// draft state: step s's buffers sit `step_stride` elements after step 0's).
// Mirrors the host GraphState write for write; nothing else is touched.
//
// Extend (eager prefill steps built on the device) writes one page_table_1 row per
// request instead of per token, the cumulative query lengths, and the ragged key
// layout: every request's slots concatenated, and per token the window [ks, ke) of
// its request's keys. Its rows are split into column segments over the grid, so a
// single long prompt still spreads over many blocks.
//
// Every block scans the whole batch (seq_lens, extend lens: bs <= kMaxBatch
// entries) into shared memory: validity, the largest KV length and the first query
// row of every request. Block 0 then writes the per-request and per-token arrays;
// all blocks share the page-table rows (row r -> request via the row starts). A
// batch with any bad entry is reported and writes nothing (every block reaches the
// same verdict from the same inputs).
#pragma once
#ifndef NSA_DEVICE
#error "include the arch header (nsa/cuda/arch.cuh or nsa/rocm/arch.cuh) first"
#endif
#include "nsa/common/block.cuh"
#include "nsa/common/segments.cuh"
#include "nsa/common/status.cuh"

namespace nsa {
namespace metadata_replay {

enum Mode { kDecode = 0, kTargetVerify = 1, kDraftExtend = 2, kExtend = 3 };

// Kernel parameters; the host mirrors this layout field for field.
struct Params {
  const i32* seq_lens;          // [bs] L_i
  const i32* req_pool_indices;  // [bs] row of req_to_token (replay only)
  const i32* extend_lens;       // draft-extend: [bs] accepted lengths E_i, null: every request D (v2); extend: [bs] E_i
  const i32* req_to_token;      // [table_rows, table_stride] slots (replay only)
  // Step 0's buffers (step s: + s * step_stride).
  i32* cache_seqlens;     // [max_bs]
  i32* cu_seqlens_k;      // [max_bs + 1], element 0 never written
  i32* page_table_1;      // [max_tokens, width]
  i32* real_page_table;   // [max_tokens, real_width]; null with page size 1 (aliased)
  i32* seqlens_expanded;  // [max_tokens] (not decode: there it aliases cache_seqlens)
  i32* nsa_cache_seqlens; // [max_tokens]
  i32* nsa_cu_seqlens_k;  // [max_tokens + 1], element 0 never written
  i32* extend_lens_out;   // [max_bs] (not decode)
  i32* cu_seqlens_q;      // extend: [max_bs + 1] cumulative query lengths
  i32* slots;             // extend: [max_keys] req_to_token[row_i, :L_i], request after request
  i32* ks;                // extend: [max_tokens] first key of each token's request in `slots`
  i32* ke;                // extend: [max_tokens] ks + keys the token sees
  i64 step_stride;
  i64 table_stride;
  i32 bs;
  i32 steps;
  i32 table_rows;
  i32 table_width;  // readable columns of a req_to_token row
  i32 width;        // page_table_1 row stride (max_context_len)
  i32 real_width;   // real_page_table row stride
  i32 max_rows;     // query rows the graph is bound to (bs, or bs * D)
  i32 topk;         // NSA clip of the per-token lengths
  i32 draft_tokens; // D
  i32 capture;      // 1: capture (lengths only, real table from the resident rows)
  i32 grid;         // blocks launched (rows are strided over them)
  i32 max_keys;     // extend: capacity of `slots`
};

// Scalars kept in shared memory after the scan scratch.
enum Slot { kBad = kScanScratch, kMaxKv, kRows, kScalarWords };


// torch's `//` by a positive constant: floor division (negative slots are garbage
// but must match the host bit for bit).
template <int kDiv>
NSA_DEVICE i32 floor_div(i32 v) {
  const i32 q = v / kDiv;
  return (v % kDiv != 0 && v < 0) ? q - 1 : q;
}

template <int kMode>
NSA_DEVICE i32 query_rows(const Params& p, i32 i) {
  if (kMode == kDecode) return 1;
  if (kMode == kExtend) return p.extend_lens[i];
  if (kMode == kDraftExtend && !p.capture && p.extend_lens != nullptr) return p.extend_lens[i];
  return p.draft_tokens;
}

// KV length of request i: verify (and every non-decode capture) adds the D drafts.
template <int kMode>
NSA_DEVICE i32 kv_len(const Params& p, i32 i) {
  const bool add = kMode == kTargetVerify || (kMode != kDecode && p.capture);
  return p.seq_lens[i] + (add ? p.draft_tokens : 0);
}

// One page_table_1 row (and its real-table entries) into every step. 16-byte
// vectors, kInFlight per thread loaded before any is stored (enough bytes in
// flight to cover HBM latency with one or two blocks per SM), when every address
// allows it; else (and for the tail) one slot per thread. A page start is lane 0
// of a vector when the page size is a multiple of 4.
#ifdef NSA_CUDA
constexpr bool kVectorRows = true;
#else
constexpr bool kVectorRows = false;  // clang for gfx942 puts the vector group in scratch
#endif
constexpr int kInFlight = 4;

template <int kPageSize, int kBlockThreads>
NSA_DEVICE void copy_row(const i32* __restrict__ src, i32* __restrict__ dst, i32* __restrict__ real, i32 max_kv,
                         i32 steps, i64 ss) {
  const i32 tid = (i32)thread_x();
  const bool vec = kVectorRows && (kPageSize == 1 || kPageSize % 4 == 0) && (ss & 3) == 0 &&
                   ((reinterpret_cast<u64>(src) | reinterpret_cast<u64>(dst)) & 15) == 0;
  const i32 n4 = vec ? max_kv / 4 : 0;
  const Vec16* s4 = reinterpret_cast<const Vec16*>(src);
  Vec16* d4 = reinterpret_cast<Vec16*>(dst);
  for (i32 c0 = tid; c0 < n4; c0 += kInFlight * kBlockThreads) {
    Vec16 v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const i32 c = c0 + k * kBlockThreads;
      v[k] = s4[c < n4 ? c : c0];
    }
    for (i32 s = 0; s < steps; ++s) {
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const i32 c = c0 + k * kBlockThreads;
        if (c >= n4) break;
        d4[s * (ss / 4) + c] = v[k];
        if (kPageSize > 1 && (4 * c) % kPageSize == 0)
          real[s * ss + 4 * c / kPageSize] = floor_div<kPageSize>((i32)v[k].w[0]);
      }
    }
  }
  for (i32 col = 4 * n4 + tid; col < max_kv; col += kBlockThreads) {
    const i32 slot = src[col];
    const bool page_start = kPageSize > 1 && col % kPageSize == 0;
    for (i32 s = 0; s < steps; ++s) {
      dst[s * ss + col] = slot;
      if (page_start) real[s * ss + col / kPageSize] = floor_div<kPageSize>(slot);
    }
  }
}

template <int kMode, int kPageSize, int kBlockThreads, int kMaxBatch>
NSA_DEVICE void run(const Params& p, u32* status) {
  static_assert(kMaxBatch % kBlockThreads == 0, "the batch is scanned in whole chunks");
  NSA_SHARED u32 sm[kScalarWords];
  NSA_SHARED i32 row_start[kMaxBatch + 1];
  NSA_SHARED i32 kv_start[kMode == kExtend ? kMaxBatch + 1 : 1];  // extend: first key of each request
  const i32 tid = (i32)thread_x();
  const i32 bs = p.bs;
  const bool replay = p.capture == 0;

  // Pass 1 (every block): validity, max KV length, first query row of each request.
  const bool bs_ok = bs >= 0 && bs <= kMaxBatch;
  if (tid == 0) sm[kBad] = bs_ok ? 0u : 1u;
  sync_block();
  const i32 chunks = bs_ok ? (bs + kBlockThreads - 1) / kBlockThreads : 0;
  i32 max_kv = 0;
  u32 rows = 0, keys = 0;
  for (i32 c = 0; c < chunks; ++c) {
    const i32 i = c * kBlockThreads + tid;
    i32 q = 0;
    if (i < bs) {
      const i32 l = p.seq_lens[i];
      q = query_rows<kMode>(p, i);
      const i32 kv = kv_len<kMode>(p, i);
      bool bad = l < 0 || q < 0 || kv < 0;
      if (replay) {
        const i32 r = p.req_pool_indices[i];
        bad = bad || r < 0 || r >= p.table_rows || kv > p.width || kv > p.table_width;
        if (kMode == kDraftExtend || kMode == kExtend) bad = bad || q > l;  // v1: E_i <= L_i; v2: L_i >= D
      }
      if (bad) sm[kBad] = 1u;
      if (kv > max_kv) max_kv = kv;
    }
    u32 total, before;
    if (kMode == kDecode) {  // one row per request: no scan (and its barriers) needed
      const i32 left = bs - c * kBlockThreads;
      before = (u32)tid;
      total = (u32)(left < kBlockThreads ? left : kBlockThreads);
    } else {
      before = block_exclusive_scan<kBlockThreads>((u32)q, sm, total);
    }
    if (i < bs) row_start[i] = (i32)(rows + before);
    rows += total;
    if (kMode == kExtend) {
      // Clamped to the checked width, so the sum of a batch within the state's
      // capacity (max_bs x width < 2^31) cannot wrap; a bad entry writes nothing anyway.
      const i32 kv = i < bs ? kv_len<kMode>(p, i) : 0;
      const u32 kv_c = kv < 0 ? 0u : (kv > p.width ? (u32)p.width : (u32)kv);
      u32 kv_total;
      const u32 kv_before = block_exclusive_scan<kBlockThreads>(kv_c, sm, kv_total);
      if (i < bs) kv_start[i] = (i32)(keys + kv_before);
      keys += kv_total;
    }
  }
  max_kv = block_max<kBlockThreads>(max_kv, sm);
  if (tid == 0) {
    row_start[bs_ok ? bs : 0] = (i32)rows;
    if ((i64)rows > (i64)p.max_rows) sm[kBad] = 1u;  // Σ E_i beyond the graph's bs × D rows
    if (kMode == kExtend) {
      kv_start[bs_ok ? bs : 0] = (i32)keys;
      if ((i64)keys > (i64)p.max_keys) sm[kBad] = 1u;  // Σ L_i beyond the ragged key capacity
    }
  }
  sync_block();
  if (sm[kBad]) {
    if (tid == 0 && block_x() == 0) report_bad_entry(status, 0);
    return;
  }
  const i32 n_rows = (i32)rows;
  const i64 ss = p.step_stride;

  // Pass 2 (block 0): per-request and per-token arrays, with their cumulative sums.
  if (block_x() == 0) {
    u32 carry = 0;
    for (i32 c = 0; c < chunks; ++c) {
      const i32 i = c * kBlockThreads + tid;
      const i32 kv = i < bs ? kv_len<kMode>(p, i) : 0;
      u32 total;
      const u32 before = block_exclusive_scan<kBlockThreads>((u32)kv, sm, total);
      if (i < bs) {
        const i32 cu = (i32)(carry + before + (u32)kv);
        const i32 q = query_rows<kMode>(p, i);
        for (i32 s = 0; s < p.steps; ++s) {
          p.cache_seqlens[s * ss + i] = kv;
          p.cu_seqlens_k[s * ss + 1 + i] = cu;
          if (kMode != kDecode && replay) p.extend_lens_out[s * ss + i] = q;
        }
        if (kMode == kExtend) p.cu_seqlens_q[i] = row_start[i];
      }
      carry += total;
    }
    if (kMode == kExtend && tid == 0) p.cu_seqlens_q[bs] = row_start[bs];
    carry = 0;
    const i32 token_chunks = (n_rows + kBlockThreads - 1) / kBlockThreads;
    for (i32 c = 0; c < token_chunks; ++c) {
      const i32 t = c * kBlockThreads + tid;
      i32 v = 0, clipped = 0;
      if (t < n_rows) {
        const i32 i = segment_of(row_start, bs, t);
        const i32 q = query_rows<kMode>(p, i);
        v = kv_len<kMode>(p, i) - q + 1 + (t - row_start[i]);
        clipped = v < p.topk ? v : p.topk;
      }
      u32 total;
      const u32 before = block_exclusive_scan<kBlockThreads>((u32)clipped, sm, total);
      if (t < n_rows) {
        const i32 cu = (i32)(carry + before + (u32)clipped);
        for (i32 s = 0; s < p.steps; ++s) {
          if (kMode != kDecode) p.seqlens_expanded[s * ss + t] = v;
          p.nsa_cache_seqlens[s * ss + t] = clipped;
          p.nsa_cu_seqlens_k[s * ss + 1 + t] = cu;
        }
        if (kMode == kExtend) {
          const i32 i = segment_of(row_start, bs, t);
          p.ks[t] = kv_start[i];
          p.ke[t] = kv_start[i] + v;
        }
      }
      carry += total;
    }
  }

  if (kMode == kExtend) {
    // Pass 3, extend (all blocks): (request, column segment) items strided over the
    // grid; each copies its segment into the request's table row and its keys.
    // Columns of one item: a whole number of 16-byte vectors and of pages (so page
    // starts stay at a segment's multiples), about 8192.
    constexpr i32 kQuantum = 4 * kPageSize;
    constexpr i32 kSeg = (8192 + kQuantum - 1) / kQuantum * kQuantum;
    const i32 segs = (max_kv + kSeg - 1) / kSeg;
    for (i32 w = (i32)block_x(); w < bs * segs; w += p.grid) {
      const i32 i = w / segs;
      const i32 c0 = (w % segs) * kSeg;
      const i32 n = max_kv - c0 < kSeg ? max_kv - c0 : kSeg;
      const i32* src = p.req_to_token + (i64)p.req_pool_indices[i] * p.table_stride + c0;
      i32* real = kPageSize > 1 ? p.real_page_table + (i64)i * p.real_width + c0 / kPageSize : nullptr;
      copy_row<kPageSize, kBlockThreads>(src, p.page_table_1 + (i64)i * p.width + c0, real, n, 1, 0);
      const i32 own = kv_len<kMode>(p, i) - c0;
      if (own > 0) copy_row<1, kBlockThreads>(src, p.slots + kv_start[i] + c0, nullptr, own < n ? own : n, 1, 0);
    }
    return;
  }

  // Pass 3 (all blocks, rows strided over the grid): page_table_1 and the real table.
  for (i32 r = (i32)block_x(); r < n_rows; r += p.grid) {
    i32* dst = p.page_table_1 + (i64)r * p.width;
    i32* real = kPageSize > 1 ? p.real_page_table + (i64)r * p.real_width : nullptr;
    if (replay) {
      const i32 i = segment_of(row_start, bs, r);
      const i32* src = p.req_to_token + (i64)p.req_pool_indices[i] * p.table_stride;
      copy_row<kPageSize, kBlockThreads>(src, dst, real, max_kv, p.steps, ss);
    } else if (kPageSize > 1) {
      // Capture: the real table of the resident rows, over the full width.
      const i32 cols = (p.width + kPageSize - 1) / kPageSize;
      for (i32 col = tid; col < cols; col += kBlockThreads) {
        for (i32 s = 0; s < p.steps; ++s) real[s * ss + col] = floor_div<kPageSize>(dst[s * ss + (i64)col * kPageSize]);
      }
    }
  }
}

}  // namespace metadata_replay
}  // namespace nsa
