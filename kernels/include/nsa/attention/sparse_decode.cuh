// Sparse MLA decode over the FP8-656 cache (spec §8.1, §8.3), playbook stages D1-D2:
// one CTA per (query row, head tile, KV split). Producers (8 warps) gather the
// chosen tokens with 128-bit loads, dequantize in registers (FlashMLA's decode
// rounding) and fill the double-buffered K/V tile that the shared consumer warps
// (sparse_attend.cuh) read. Split-KV partials are merged by `combine`.
#pragma once
#include "nsa/common/status.cuh"
#include "nsa/attention/sparse_attend.cuh"

namespace nsa {
namespace decode {

using namespace attend;
constexpr int kProducerWarps = 8;      // gather + dequant is ALU work: as many as the consumers
constexpr int kProducerThreads = kProducerWarps * 32;
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kDqk = 576;              // latent 512 + rope 64
typedef Rows<kDqk> KRows;
constexpr int kTokenBytes = 656;       // FP8 cache record
constexpr int kScalesOffset = 512;
constexpr int kRopeOffset = 528;
constexpr int kPartsPerToken = kProducerThreads / kBlockTokens;  // 4 producer threads per token
constexpr int kNopePerPart = kDv / kPartsPerToken;               // 128 e4m3 bytes a thread loads
constexpr int kRopePerPart = 64 / kPartsPerToken;                // 16 rope dims a thread loads

static_assert(kNopePerPart == 128 && kRopePerPart == 16, "gather thread share: 8 + 2 16-byte loads");

// Mirrors `SparseDecodeParams` in nsa-runtime (ops/sparse_decode.rs) field for field.
struct Params {
  const u16* q;            // [rows, heads, 576] bf16
  const u8* cache;         // pages of kPage records, page_stride bytes apart
  const i32* indices;      // [rows, kTopk] physical slots (page * kPage + offset); -1 = none
  const i32* topk_length;  // [rows] valid prefix of each index row, or null (all kTopk)
  u16* out;                // [rows, heads, 512] bf16 (splits == 1)
  float* lse;              // [rows, heads] natural log, +inf for a row with no key (splits == 1)
  float* o_part;           // [rows, splits, heads, 512] f32 (splits > 1)
  float* lse_part;         // [rows, splits, heads] log2 units, -inf when empty (splits > 1)
  i64 page_stride;         // bytes from one page to the next (>= kPage * 656, multiple of 16)
  i64 num_slots;           // pages * kPage: an index at or past it is rejected
  i32 rows;
  i32 splits;
  i32 blocks_per_split;    // 64-token steps each split covers
  float sm_scale;
};

template <int kHT>
using Smem = attend::Smem<kHT, kDqk>;

// One producer thread's share of a 64-token step: token `ptid / 4`, `part` =
// ptid % 4 of the token's four threads. Load i of the four reads 64 contiguous
// bytes (16-byte chunk 4 i + part of the e4m3 bytes, and of the rope bytes for
// i < 2), so each 32-byte sector a warp touches is read whole by one instruction
// (a thread reading 128 contiguous bytes left half of every sector to the next
// load: twice the L2 sector traffic, measured on the H200). Chunk 4 i + part lies in
// scale tile i / 2, so every thread loads the record's four scales.
struct Gather {
  Vec16 nope[8];
  Vec16 rope[2];
  Vec16 scales;  // the four f32 tile scales
  bool valid;
};

template <int kPage>
NSA_DEVICE const u8* record(const Params& p, i32 slot) {
  // Unsigned div/mod by a constant: shifts for powers of two, a multiply otherwise.
  const u32 s = (u32)slot;
  return p.cache + (i64)(s / (u32)kPage) * p.page_stride + (i64)(s % (u32)kPage) * kTokenBytes;
}

// An invalid slot (-1) loads nothing and leaves zeros (predicated loads, no branch).
template <int kPage>
NSA_DEVICE void issue_gather(const Params& p, i32 slot, u32 part, Gather& g) {
  g.valid = slot >= 0;
  const u8* rec = record<kPage>(p, g.valid ? slot : 0);
#pragma unroll
  for (int i = 0; i < 8; ++i) g.nope[i] = mma::ldg_nc_v4_if(rec + (4 * i + part) * 16, g.valid);
#pragma unroll
  for (int i = 0; i < 2; ++i) g.rope[i] = mma::ldg_nc_v4_if(rec + kRopeOffset + (4 * i + part) * 16, g.valid);
  g.scales = mma::ldg_nc_v4_if(rec + kScalesOffset, g.valid);
}

// e4m3 pair -> bf16 pair holding value * 2^-112, exactly: the f16 conversion is exact
// (e4m3 uses only the top 3 mantissa bits), and f16 bits shifted right by 3 are the
// bf16 bits of the same significand with the exponent 112 lower; the sign moves back.
NSA_DEVICE u32 e4m3x2_to_bf16x2_rebased(u32 pair) {
  const u32 h = e4m3x2_to_f16x2(pair);
  return ((h & 0x7fff7fffu) >> 3) | (h & 0x80008000u);
}

NSA_DEVICE u32 mul_bf16x2(u32 a, u32 b) {
  u32 r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
  return r;
}

// Scale factors of one tile for `dequant8`: FlashMLA's decode rounding (spec §2.3),
// bf16(e4m3) * bf16(scale) with one bf16 rounding. Normally one multiply by
// bf16(scale) * 2^112; a scale of 2^15 or more (that factor would overflow) first
// multiplies by 2^112 (exact), then by bf16(scale).
struct TileScale {
  u32 first, second;  // bf16x2 factors; `second` only for the two-step multiply
};

NSA_DEVICE u32 bf16_pair(float x) {
  const u32 f = (u32)f32_to_bf16(x);
  return f | (f << 16);
}

constexpr float kTwo112 = 5.192296858534828e33f;

// One multiply (every scale of the record below 2^15) or two (any scale at or
// above: the same single bf16 rounding, for every tile of the record).
NSA_DEVICE TileScale tile_scale(float scale, bool two_step) {
  return two_step ? TileScale{bf16_pair(kTwo112), bf16_pair(scale)} : TileScale{bf16_pair(scale * kTwo112), 0u};
}

// 8 e4m3 bytes -> 8 bf16 (memory order kept).
template <bool kTwoStep>
NSA_DEVICE Vec16 dequant8(u32 w0, u32 w1, const TileScale& ts) {
  Vec16 o;
  const u32 w[2] = {w0, w1};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      u32 v = mul_bf16x2(e4m3x2_to_bf16x2_rebased(w[i] >> (16 * half)), ts.first);
      if (kTwoStep) v = mul_bf16x2(v, ts.second);
      o.w[2 * i + half] = v;
    }
  }
  return o;
}

// Writes a gathered token share into K/V buffer `kbuf`. An invalid token was
// gathered as zeros (scales included), so it dequantizes to exact zeros and masked
// keys can never inject NaN through 0 * garbage. `Tile::offset(token, chunk)`: the
// byte offset of a 16-byte chunk in the consumer's tile layout.
template <class Tile, bool kTwoStep>
NSA_DEVICE void store_nope(const Gather& g, u32 kbuf, u32 token, u32 part) {
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const TileScale ts = tile_scale(u32_as_f32(g.scales.w[t]), kTwoStep);
#pragma unroll
    for (int i = 2 * t; i < 2 * t + 2; ++i) {
      const u32 c = 2 * (4 * i + part);  // bf16 chunks (8 dims) of e4m3 chunk 4 i + part
      mma::sts_v4(kbuf + Tile::offset(token, c), dequant8<kTwoStep>(g.nope[i].w[0], g.nope[i].w[1], ts));
      mma::sts_v4(kbuf + Tile::offset(token, c + 1), dequant8<kTwoStep>(g.nope[i].w[2], g.nope[i].w[3], ts));
    }
  }
}

template <class Tile>
NSA_DEVICE void store_gather(const Gather& g, u32 kbuf, u8* valid_flags, u32 token, u32 part) {
  const float most = fmax2(fmax2(u32_as_f32(g.scales.w[0]), u32_as_f32(g.scales.w[1])),
                           fmax2(u32_as_f32(g.scales.w[2]), u32_as_f32(g.scales.w[3])));
  // Uniform per thread (one record): the common case pays one multiply per pair.
  if (most < 32768.0f)
    store_nope<Tile, false>(g, kbuf, token, part);
  else
    store_nope<Tile, true>(g, kbuf, token, part);
#pragma unroll
  for (int i = 0; i < 2; ++i) mma::sts_v4(kbuf + Tile::offset(token, 64 + 4 * i + part), g.rope[i]);
  if (part == 0) valid_flags[token] = g.valid ? 1 : 0;
}

// Out of line: the rare error path must not take registers from the hot loop.
__noinline__ __device__ void report_rejected_slot(u32* status, i64 index) { report_bad_entry(status, index); }

// The index entry at position `pos` of `row`, or -1 past the row's valid prefix:
// loaded steps before its use and checked then (`checked_slot`), so that no load
// latency sits between a load and a branch on its value.
template <int kTopk>
NSA_DEVICE i32 raw_slot(const Params& p, i64 row, i32 pos, i32 valid_len) {
  return mma::ldg_nc_s32_or(p.indices + row * kTopk + pos, pos < valid_len, -1);
}

// A raw entry (index `at` of the indices tensor) as a slot: -1 stays -1; an entry
// outside the cache is rejected (-1, counted in `status` when `report`).
NSA_DEVICE i32 checked_entry(const Params& p, i32 s, i64 at, bool report, u32* status) {
  if (s == -1) return -1;
  if (s < -1 || (i64)s >= p.num_slots) {
    if (report) report_rejected_slot(status, at);
    return -1;
  }
  return s;
}

// checked_entry for entry `pos` of `row`.
template <int kTopk>
NSA_DEVICE i32 checked_slot(const Params& p, i32 s, i64 row, i32 pos, bool report, u32* status) {
  return checked_entry(p, s, row * kTopk + pos, report, status);
}

// A raw entry for an L2 prefetch: any entry outside the cache is skipped.
NSA_DEVICE i32 quiet_slot(const Params& p, i32 s) { return s >= 0 && (i64)s < p.num_slots ? s : -1; }

// Pulls the lines of `slot`'s record that producer thread `part` will load into
// L2, a step before its register loads: HBM stays busy while the producers
// dequantize, and the loads then wait for L2 instead of HBM.
template <int kPage>
NSA_DEVICE void prefetch_record(const Params& p, i32 slot, u32 part) {
  if (slot < 0) return;
  const u8* rec = record<kPage>(p, slot);
  prefetch_l2(rec + part * kNopePerPart);
  if (part < 2) prefetch_l2(rec + kScalesOffset + part * 128);  // scales and rope: bytes 512..655
}

// Producer warps (the threads after kConsumerThreads): kShares (1 or 2) token
// shares per thread per step, tokens `token` and `token + 64 / kShares`, with the
// rows of kDepth (1 or 2) steps in flight in registers. Each step they prefetch
// the rows of step + kDepth + 1 into L2, dequantize the oldest gathered step into
// the buffer the consumers released, publish it, and load step + kDepth's rows
// into the freed registers. Index entries are loaded a step before their L2
// prefetch and two before their gather, and checked only at the gather, so no
// index load latency sits in the loop. `Tile`: the consumers' tile layout
// (offsets and kTileBytes); kAsyncProxy: the consumers read with wgmma, so the
// stores are fenced for the async proxy before the buffer is published;
// kBarThreads: the CTA's threads.
template <class Tile, bool kAsyncProxy, int kShares, int kDepth, int kBarThreads, int kTopk, int kPage>
NSA_DEVICE void produce(const Params& p, u32 k_base, u8* valid_flags, i64 row, i32 first, i32 last, i32 steps,
                        bool report, u32* status) {
  static_assert(kShares == 1 || kShares == 2, "one or two token shares per thread");
  static_assert(kDepth == 1 || kDepth == 2, "one or two steps in flight (two K/V buffers)");
  constexpr u32 kStride = kBlockTokens / kShares;  // tokens between a thread's shares
  const u32 ptid = thread_x() - kConsumerThreads;
  const u32 token = ptid / kPartsPerToken, part = ptid % kPartsPerToken;
  static_assert(kPartsPerToken * kStride == kBarThreads - kConsumerThreads, "every token share has a thread");
  report = report && part == 0;
  auto pos_of = [&](i32 step, int share) { return first + step * kBlockTokens + (i32)(token + share * kStride); };
  auto raw = [&](i32 step, int share) { return raw_slot<kTopk>(p, row, pos_of(step, share), last); };
  auto slot = [&](i32 s, i32 step, int share) {
    return checked_slot<kTopk>(p, s, row, pos_of(step, share), report, status);
  };
  // Fully unrolled constant indices: ptxas keeps the gathers in registers.
  Gather g[kDepth][kShares];
  i32 next[kShares], after[kShares];  // raw entries of steps + kDepth and + kDepth + 1
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
#pragma unroll
    for (int sh = 0; sh < kShares; ++sh) issue_gather<kPage>(p, slot(raw(d, sh), d, sh), part, g[d][sh]);
  }
#pragma unroll
  for (int sh = 0; sh < kShares; ++sh) {
    next[sh] = raw(kDepth, sh);
    after[sh] = raw(kDepth + 1, sh);
    prefetch_record<kPage>(p, quiet_slot(p, next[sh]), part);
  }
  for (i32 base = 0; base < steps; base += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const i32 step = base + d;
      if (step >= steps) break;
      const u32 buf = step & 1;
      i32 later[kShares];
#pragma unroll
      for (int sh = 0; sh < kShares; ++sh) {
        later[sh] = raw(step + kDepth + 2, sh);
        prefetch_record<kPage>(p, quiet_slot(p, after[sh]), part);
      }
      if (step >= 2) mma::bar_sync(kBarEmpty + buf, kBarThreads);
      const u32 kbuf = k_base + buf * Tile::kTileBytes;
#pragma unroll
      for (int sh = 0; sh < kShares; ++sh)
        store_gather<Tile>(g[d][sh], kbuf, valid_flags + buf * kBlockTokens, token + sh * kStride, part);
      if (kAsyncProxy) mma::fence_proxy_async();
      mma::bar_arrive(kBarFull + buf, kBarThreads);
#pragma unroll
      for (int sh = 0; sh < kShares; ++sh) {
        if (step + kDepth < steps) issue_gather<kPage>(p, slot(next[sh], step + kDepth, sh), part, g[d][sh]);
        next[sh] = after[sh];
        after[sh] = later[sh];
      }
    }
  }
}

// Index positions first .. last - 1 of query row `row` that KV split `split`
// covers (clipped to the row's valid length), in `steps` 64-token steps.
struct SplitRange {
  i32 first, last, steps;
};

template <int kTopk>
NSA_DEVICE SplitRange split_range(const Params& p, i64 row, i32 split) {
  const i32 valid_len = row_topk_len<kTopk>(p.topk_length, row);
  SplitRange r;
  r.first = split * p.blocks_per_split * kBlockTokens;
  r.last = r.first + p.blocks_per_split * kBlockTokens;
  r.last = r.last < valid_len ? r.last : valid_len;
  r.steps = r.last > r.first ? (r.last - r.first + kBlockTokens - 1) / kBlockTokens : 0;
  return r;
}

// This CTA's head tile, query row and KV split. Head tiles of one (row, split) are
// adjacent block ids, so they gather the same tokens at about the same time and
// share them through L2.
struct CtaTile {
  u32 ht;
  i64 row;
  i32 split;
};

template <int kHeadTiles>
NSA_DEVICE CtaTile cta_tile(const Params& p) {
  const u32 bid = block_x();
  return CtaTile{bid % kHeadTiles, (i64)((bid / kHeadTiles) / (u32)p.splits), (i32)((bid / kHeadTiles) % (u32)p.splits)};
}

// kHeads query heads; kHT heads per CTA (16 or 32; kHeads < 16 runs one 16-row
// tile with the missing heads zero and unwritten). kQkUnroll: see attend::Consumer.
template <int kHeads, int kHT, int kTopk, int kPage, int kQkUnroll>
NSA_DEVICE void sparse_decode(const Params& p, u32* status) {
  static_assert(kTopk % kBlockTokens == 0, "top-k is a multiple of 64");
  typedef Smem<kHT> L;
  constexpr int kHeadTiles = (kHeads + kHT - 1) / kHT;

  extern NSA_SHARED Vec16 smem_vec[];  // 16-byte aligned (ldmatrix, st.shared.v4)
  u8* smem = reinterpret_cast<u8*>(smem_vec);
  const u32 base = mma::smem_addr(smem);
  const u32 warp = thread_x() / 32, lane = thread_x() % 32;

  const auto [ht, row, split] = cta_tile<kHeadTiles>(p);
  if (row >= p.rows) return;

  const SplitRange r = split_range<kTopk>(p, row, split);
  const i32 first = r.first, last = r.last, steps = r.steps;

  const u32 head0 = ht * kHT;
  load_q_tile<kHeads, kHT, kDqk, kThreads>(p.q + row * kHeads * kDqk, head0, base + L::kQ);
  sync_block();
  if (warp >= (u32)kConsumerWarps) {
    if (steps > 0)
      produce<KRows, false, 1, 2, kThreads, kTopk, kPage>(p, base + L::kK, smem + L::kValid, row, first, last,
                                                          steps, ht == 0, status);
    return;
  }

  Consumer<kHT, kDqk, kQkUnroll, kThreads> c(base, warp, lane);
  c.run(smem, steps, p.sm_scale * kLog2e);
  float l_tot[2];
  c.row_sums(smem, l_tot);
  const float inv[2] = {l_tot[0] > 0.0f ? 1.0f / l_tot[0] : 0.0f, l_tot[1] > 0.0f ? 1.0f / l_tot[1] : 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const u32 head = head0 + c.mw * 16 + c.g + 8 * h;
    if (head >= (u32)kHeads) continue;
    const bool empty = !(l_tot[h] > 0.0f);
    const bool writes_lse = c.nw == 0 && c.t == 0;
    if (p.splits == 1) {
      c.store_bf16(p.out + (row * kHeads + head) * kDv, h, inv[h]);
      if (writes_lse) p.lse[row * kHeads + head] = empty ? pos_inf() : (c.m_run[h] + mma::log2_approx(l_tot[h])) * kLn2;
    } else {
      const i64 slot = (row * p.splits + split) * kHeads + head;
      c.store_f32(p.o_part + slot * kDv, h, inv[h]);
      if (writes_lse) p.lse_part[slot] = empty ? neg_inf() : c.m_run[h] + mma::log2_approx(l_tot[h]);
    }
  }
}

// Mirrors `CombineParams` in nsa-runtime.
struct CombineParams {
  const float* o_part;    // [rows, splits, heads, 512]
  const float* lse_part;  // [rows, splits, heads] log2
  u16* out;               // [rows, heads, 512]
  float* lse;             // [rows, heads] natural log
  i32 rows;
  i32 splits;
};

// One block of 128 threads per (row, head): weights 2^(lse_i - LSE) over the
// splits, 4 output dims per thread.
template <int kHeads>
NSA_DEVICE void combine(const CombineParams& p) {
  const u32 bid = block_x();
  const i64 row = bid / kHeads;
  const u32 head = bid % kHeads;
  if (row >= p.rows) return;
  const u32 tid = thread_x();
  const float* lse_i = p.lse_part + row * p.splits * kHeads + head;
  float m = neg_inf();
  for (i32 s = 0; s < p.splits; ++s) m = fmax2(m, lse_i[s * kHeads]);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float total = 0.0f;
  if (m != neg_inf()) {
    for (i32 s = 0; s < p.splits; ++s) {
      const float w = mma::exp2_approx(lse_i[s * kHeads] - m);
      total += w;
      const Vec16 v =
          *reinterpret_cast<const Vec16*>(p.o_part + ((row * p.splits + s) * kHeads + head) * kDv + tid * 4);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] += w * u32_as_f32(v.w[e]);
    }
  }
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  u16* dst = p.out + (row * kHeads + head) * kDv + tid * 4;
  *reinterpret_cast<u32*>(dst) = mma::pack_bf16x2(acc[0] * inv, acc[1] * inv);
  *reinterpret_cast<u32*>(dst + 2) = mma::pack_bf16x2(acc[2] * inv, acc[3] * inv);
  if (tid == 0)
    p.lse[row * kHeads + head] = total > 0.0f ? (m + mma::log2_approx(total)) * kLn2 : pos_inf();
}

}  // namespace decode
}  // namespace nsa
