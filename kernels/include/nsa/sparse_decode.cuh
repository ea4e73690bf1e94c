// Sparse MLA decode over the FP8-656 cache (spec §8.1, §8.3), playbook stages D1-D2:
// one CTA per (query row, head tile, KV split) with two warp groups. Producers
// (8 warps) gather the chosen tokens with 128-bit loads, dequantize in registers and
// fill a double-buffered shared K/V tile (FlashMLA's decode dequant rounding); consumers (8 warps) run mma.sync m16n8k16
// (bf16 in, f32 accumulate) from ldmatrix with an online softmax in the log2 domain.
// Named barriers hand buffers over, so dequant and tensor work overlap. Split-KV
// partials are merged by `combine`.
#pragma once
#include "nsa/common/status.cuh"
#include "nsa/cuda/mma.cuh"

namespace nsa {
namespace decode {

constexpr int kDqk = 576;              // latent 512 + rope 64
constexpr int kDv = 512;               // V = the latent part of the same row
constexpr int kBlockTokens = 64;       // tokens per pipeline step
constexpr int kConsumerWarps = 8;
constexpr int kProducerWarps = 8;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kProducerThreads = kProducerWarps * 32;
constexpr int kThreads = kConsumerThreads + kProducerThreads;
// One bf16 row of Q or K in shared memory, padded by 16 bytes: the 8 rows one
// ldmatrix (or 8 tokens' stores) touch start 4 banks apart, so they never conflict,
// and addresses stay base + immediate (no swizzle arithmetic per access).
constexpr int kRowBytes = kDqk * 2 + 16;
constexpr int kTokenBytes = 656;       // FP8 cache record
constexpr int kScalesOffset = 512;
constexpr int kRopeOffset = 528;
constexpr int kPartsPerToken = kProducerThreads / kBlockTokens;  // 4 producer threads per token
constexpr int kNopePerPart = kDv / kPartsPerToken;               // 128 e4m3 bytes: one scale tile
constexpr int kRopePerPart = 64 / kPartsPerToken;                // 16 rope dims
// Named barriers: buffer b full (producers arrive, consumers wait), buffer b
// empty (consumers arrive, producers wait), and the consumers' own.
constexpr u32 kBarFull = 1;
constexpr u32 kBarEmpty = 3;
constexpr u32 kBarConsumers = 5;
constexpr int kPRowBytes = kBlockTokens * 2 + 16;        // padded: ldmatrix rows hit distinct banks
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
NSA_DEVICE float neg_inf() { return u32_as_f32(0xff800000u); }
NSA_DEVICE float pos_inf() { return u32_as_f32(0x7f800000u); }
NSA_DEVICE float fmax2(float a, float b) { return a > b ? a : b; }
// Running max start: finite, so exp2(m_old - m_new) never sees -inf - -inf.
constexpr float kMaxInit = -1e30f;

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

// Byte offset of 16-byte chunk `c` of row `r` in a [rows][72 chunks] bf16 tile.
NSA_DEVICE u32 tile_offset(u32 r, u32 c) { return r * kRowBytes + c * 16; }

// Shared memory: Q [kHT][576], K/V x2 [64][576], P [kHT][64] (padded rows),
// per-warp row partials (max, then sums), token validity flags.
template <int kHT>
struct Smem {
  // Consumer warps per 16-head m-tile (each: a token group in Q K^T, a column group in P V).
  static constexpr int kNW = kConsumerWarps / (kHT / 16);
  static constexpr u32 kQ = 0;
  static constexpr u32 kK = kQ + kHT * kRowBytes;
  static constexpr u32 kP = kK + 2 * kBlockTokens * kRowBytes;
  static constexpr u32 kRed = kP + kHT * kPRowBytes;
  static constexpr u32 kValid = kRed + kNW * kHT * 4;
  static constexpr u32 kBytes = kValid + 2 * kBlockTokens;
};

// One producer thread's share of a 64-token step: token `ptid / 4`, scale tile
// `ptid % 4` (128 e4m3 bytes, 16 rope dims, the tile's scale).
struct Gather {
  Vec16 nope[8];
  Vec16 rope[2];
  float scale;
  bool valid;
};

template <int kPage>
NSA_DEVICE const u8* record(const Params& p, i32 slot) {
  // Unsigned div/mod by a constant: shifts for powers of two, a multiply otherwise.
  const u32 s = (u32)slot;
  return p.cache + (i64)(s / (u32)kPage) * p.page_stride + (i64)(s % (u32)kPage) * kTokenBytes;
}

template <int kPage>
NSA_DEVICE void issue_gather(const Params& p, i32 slot, u32 part, Gather& g) {
  g.valid = slot >= 0;
  if (!g.valid) return;
  const u8* rec = record<kPage>(p, slot);
#pragma unroll
  for (int i = 0; i < 8; ++i) g.nope[i] = mma::ldg_nc_v4(rec + part * kNopePerPart + i * 16);
#pragma unroll
  for (int i = 0; i < 2; ++i) g.rope[i] = mma::ldg_nc_v4(rec + kRopeOffset + part * 32 + i * 16);
  g.scale = *reinterpret_cast<const float*>(rec + kScalesOffset + part * 4);
}

// e4m3 pair -> bf16 pair holding value * 2^-112, exactly: the f16 conversion is exact
// (e4m3 uses only the top 3 mantissa bits), and f16 bits shifted right by 3 are the
// bf16 bits of the same significand with the exponent 112 lower; the sign moves back.
NSA_DEVICE u32 e4m3x2_to_bf16x2_rebased(u32 pair) {
  u32 h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((u16)pair));
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
  u32 first, second;  // bf16x2 factors; second == 0 means "no second multiply"
};

NSA_DEVICE TileScale tile_scale(float scale) {
  const float kTwo112 = 5.192296858534828e33f;
  if (scale < 32768.0f) {
    const u32 f = (u32)f32_to_bf16(scale * kTwo112);
    return TileScale{f | (f << 16), 0u};
  }
  const u32 a = (u32)f32_to_bf16(kTwo112), b = (u32)f32_to_bf16(scale);
  return TileScale{a | (a << 16), b | (b << 16)};
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

// Writes a gathered token share into K/V buffer `kbuf` (zeros for an invalid token,
// so masked keys can never inject NaN through 0 * garbage).
template <bool kTwoStep>
NSA_DEVICE void store_nope(const Gather& g, const TileScale& ts, u32 kbuf, u32 token, u32 part) {
  const Vec16 zero = {{0u, 0u, 0u, 0u}};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const Vec16 lo = g.valid ? dequant8<kTwoStep>(g.nope[i].w[0], g.nope[i].w[1], ts) : zero;
    const Vec16 hi = g.valid ? dequant8<kTwoStep>(g.nope[i].w[2], g.nope[i].w[3], ts) : zero;
    mma::sts_v4(kbuf + tile_offset(token, part * 16 + 2 * i), lo);
    mma::sts_v4(kbuf + tile_offset(token, part * 16 + 2 * i + 1), hi);
  }
}

NSA_DEVICE void store_gather(const Gather& g, u32 kbuf, u8* valid_flags, u32 token, u32 part) {
  const Vec16 zero = {{0u, 0u, 0u, 0u}};
  const TileScale ts = tile_scale(g.scale);
  // Uniform per thread (one tile): the common case pays one multiply per pair.
  if (ts.second == 0u)
    store_nope<false>(g, ts, kbuf, token, part);
  else
    store_nope<true>(g, ts, kbuf, token, part);
#pragma unroll
  for (int i = 0; i < 2; ++i) mma::sts_v4(kbuf + tile_offset(token, 64 + part * 2 + i), g.valid ? g.rope[i] : zero);
  if (part == 0) valid_flags[token] = g.valid ? 1 : 0;
}

// Out of line: the rare error path must not take registers from the hot loop.
__noinline__ __device__ void report_rejected_slot(u32* status, i64 index) { report_bad_entry(status, index); }

// The slot of index position `pos` of `row`, or -1 when it is past the row's valid
// prefix, is -1, or is rejected (counted in `status`: outside the cache).
template <int kTopk>
NSA_DEVICE i32 slot_at(const Params& p, i64 row, i32 pos, i32 valid_len, bool report, u32* status) {
  if (pos >= valid_len) return -1;
  const i32 s = p.indices[row * kTopk + pos];
  if (s == -1) return -1;
  if (s < -1 || (i64)s >= p.num_slots) {
    if (report) report_rejected_slot(status, row * kTopk + pos);
    return -1;
  }
  return s;
}

// Producer warps: prefetch the next step's slots and rows into registers while the
// consumers work, then dequantize into the buffer the consumers released.
template <int kTopk, int kPage>
NSA_DEVICE void produce(const Params& p, u32 k_base, u8* valid_flags, i64 row, i32 first, i32 last, i32 steps,
                        bool report, u32* status) {
  const u32 ptid = thread_x() - kConsumerThreads;
  const u32 token = ptid / kPartsPerToken, part = ptid % kPartsPerToken;
  report = report && part == 0;
  Gather g;
  issue_gather<kPage>(p, slot_at<kTopk>(p, row, first + (i32)token, last, report, status), part, g);
  i32 next = steps > 1 ? slot_at<kTopk>(p, row, first + kBlockTokens + (i32)token, last, report, status) : -1;
  for (i32 step = 0; step < steps; ++step) {
    const u32 buf = step & 1;
    if (step >= 2) mma::bar_sync(kBarEmpty + buf, kThreads);
    store_gather(g, k_base + buf * (kBlockTokens * kRowBytes), valid_flags + buf * kBlockTokens, token, part);
    mma::bar_arrive(kBarFull + buf, kThreads);
    if (step + 1 < steps) {
      issue_gather<kPage>(p, next, part, g);
      const i32 pos = first + (step + 2) * kBlockTokens + (i32)token;
      next = step + 2 < steps ? slot_at<kTopk>(p, row, pos, last, report, status) : -1;
    }
  }
}

// kHeads query heads; kHT heads per CTA (16 or 32; kHeads < 16 runs one 16-row
// tile with the missing heads zero and unwritten). kQkUnroll: unroll of the Q K^T
// loop; 36 (full) on sm_90a, less where ptxas would spill (sm_100a), which also
// keeps the P V token loop rolled.
template <int kHeads, int kHT, int kTopk, int kPage, int kQkUnroll>
NSA_DEVICE void sparse_decode(const Params& p, u32* status) {
  static_assert(kHT == 16 || kHT == 32, "head tile: 16 or 32 (consumer registers cap the P V columns per warp)");
  static_assert(kTopk % kBlockTokens == 0, "top-k is a multiple of 64");
  typedef Smem<kHT> L;
  constexpr int kMW = kHT / 16;                    // m-tiles (16 heads each)
  constexpr int kNW = L::kNW;                      // consumer warps per m-tile
  constexpr int kTokPerWarp = kBlockTokens / kNW;  // Q K^T columns per warp
  constexpr int kNT = kTokPerWarp / 8;             // n8 tiles per warp in Q K^T
  constexpr int kDimsPerWarp = kDv / kNW;          // P V columns per warp
  constexpr int kNV = kDimsPerWarp / 8;            // n8 tiles per warp in P V
  constexpr int kHeadTiles = (kHeads + kHT - 1) / kHT;
  static_assert(kNT >= 1 && kNV % 2 == 0, "warp tiling");

  extern NSA_SHARED Vec16 smem_vec[];  // 16-byte aligned (ldmatrix, st.shared.v4)
  u8* smem = reinterpret_cast<u8*>(smem_vec);
  const u32 base = mma::smem_addr(smem);
  const u32 tid = thread_x();
  const u32 warp = tid / 32, lane = tid % 32;

  // Block order: head tiles of one (row, split) are adjacent, so they gather the
  // same tokens at about the same time and share them through L2.
  const u32 bid = block_x();
  const u32 ht = bid % kHeadTiles;
  const i64 row = (bid / kHeadTiles) / (u32)p.splits;
  const i32 split = (i32)((bid / kHeadTiles) % (u32)p.splits);
  if (row >= p.rows) return;

  i32 valid_len = kTopk;
  if (p.topk_length != nullptr) {
    const i32 l = p.topk_length[row];
    valid_len = l < 0 ? 0 : (l < kTopk ? l : kTopk);
  }
  const i32 first = split * p.blocks_per_split * kBlockTokens;
  i32 last = first + p.blocks_per_split * kBlockTokens;
  last = last < valid_len ? last : valid_len;
  const i32 steps = last > first ? (last - first + kBlockTokens - 1) / kBlockTokens : 0;

  // Q tile -> shared (heads past kHeads are zero rows), by every thread.
  const u32 head0 = ht * kHT;
  for (u32 i = tid; i < (u32)kHT * (kDqk / 8); i += kThreads) {
    const u32 r = i / (kDqk / 8), c = i % (kDqk / 8);
    Vec16 v = {{0u, 0u, 0u, 0u}};
    if (head0 + r < (u32)kHeads)
      v = *reinterpret_cast<const Vec16*>(p.q + (row * kHeads + head0 + r) * kDqk + c * 8);
    mma::sts_v4(base + L::kQ + tile_offset(r, c), v);
  }
  sync_block();
  u8* valid_flags = smem + L::kValid;
  if (warp >= (u32)kConsumerWarps) {
    if (steps > 0) produce<kTopk, kPage>(p, base + L::kK, valid_flags, row, first, last, steps, ht == 0, status);
    return;
  }

  // Consumer warp (m-tile mw, group nw): Q K^T for tokens of group nw, P V for
  // columns of group nw, both for heads 16 mw .. 16 mw + 15.
  const u32 g = lane / 4, t = lane % 4;
  const u32 mw = warp % kMW, nw = warp / kMW;
  const float c_scale = p.sm_scale * kLog2e;
  float m_run[2] = {kMaxInit, kMaxInit};  // rows g and g + 8 of this warp's m-tile
  float l_run[2] = {0.0f, 0.0f};          // this thread's share of the row sums
  float o[kNV][4];
#pragma unroll
  for (int j = 0; j < kNV; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float* red = reinterpret_cast<float*>(smem + L::kRed);  // [kNW][kHT]
  const u32 q_rows = base + L::kQ;
  const u32 p_tile = base + L::kP;
  const u32 tok0 = nw * kTokPerWarp;
  const u32 d0 = nw * kDimsPerWarp;

  for (i32 step = 0; step < steps; ++step) {
    const u32 buf = step & 1;
    const u32 kbuf = base + L::kK + buf * (kBlockTokens * kRowBytes);
    mma::bar_sync(kBarFull + buf, kThreads);

    // S = Q K^T for 16 heads x kTokPerWarp tokens.
    float s[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    if constexpr (kNT == 1) {
      // One n8 tile per warp: each x4 load of K spans two k16 steps instead.
#pragma unroll(kQkUnroll)
      for (int kc = 0; kc < kDqk / 8; kc += 4) {
        u32 a0[4], a1[4], b[4];
        mma::ldsm_x4(q_rows + tile_offset(mw * 16 + (lane & 15), kc + (lane >> 4)), a0);
        mma::ldsm_x4(q_rows + tile_offset(mw * 16 + (lane & 15), kc + 2 + (lane >> 4)), a1);
        mma::ldsm_x4(kbuf + tile_offset(tok0 + (lane & 7), kc + (lane >> 3)), b);
        mma::mma_bf16(s[0], a0, b[0], b[1]);
        mma::mma_bf16(s[0], a1, b[2], b[3]);
      }
    } else {
#pragma unroll(kQkUnroll)
      for (int kc = 0; kc < kDqk / 8; kc += 2) {
        u32 a[4];
        mma::ldsm_x4(q_rows + tile_offset(mw * 16 + (lane & 15), kc + (lane >> 4)), a);
#pragma unroll
        for (int j = 0; j < kNT; j += 2) {
          u32 b[4];
          mma::ldsm_x4(kbuf + tile_offset(tok0 + j * 8 + (lane & 7) + ((lane >> 4) << 3), kc + ((lane >> 3) & 1)), b);
          mma::mma_bf16(s[j], a, b[0], b[1]);
          mma::mma_bf16(s[j + 1], a, b[2], b[3]);
        }
      }
    }

    // Scale into the log2 domain, mask invalid tokens, row max across the warps.
    const u8* flags = valid_flags + buf * kBlockTokens;
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const u32 col = tok0 + j * 8 + 2 * t + (e & 1);
        const float x = flags[col] ? s[j][e] * c_scale : neg_inf();
        s[j][e] = x;
        mx[e >> 1] = x > mx[e >> 1] ? x : mx[e >> 1];
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmax2(mx[h], shfl_xor(mx[h], 1));
      mx[h] = fmax2(mx[h], shfl_xor(mx[h], 2));
    }
    if (t == 0) {
      red[nw * kHT + mw * 16 + g] = mx[0];
      red[nw * kHT + mw * 16 + g + 8] = mx[1];
    }
    mma::bar_sync(kBarConsumers, kConsumerThreads);
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m_blk = red[mw * 16 + g + 8 * h];
#pragma unroll
      for (int w = 1; w < kNW; ++w) m_blk = fmax2(m_blk, red[w * kHT + mw * 16 + g + 8 * h]);
      const float m_new = fmax2(m_run[h], m_blk);
      alpha[h] = mma::exp2_approx(m_run[h] - m_new);
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }

    // P = exp2(S - m) as bf16 into shared memory (the A operand of P V).
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const float p0 = mma::exp2_approx(s[j][0] - m_run[0]);
      const float p1 = mma::exp2_approx(s[j][1] - m_run[0]);
      const float p2 = mma::exp2_approx(s[j][2] - m_run[1]);
      const float p3 = mma::exp2_approx(s[j][3] - m_run[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      const u32 col = tok0 + j * 8 + 2 * t;
      const u32 r0 = mw * 16 + g;
      *reinterpret_cast<u32*>(smem + L::kP + r0 * kPRowBytes + col * 2) = mma::pack_bf16x2(p0, p1);
      *reinterpret_cast<u32*>(smem + L::kP + (r0 + 8) * kPRowBytes + col * 2) = mma::pack_bf16x2(p2, p3);
    }
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
    mma::bar_sync(kBarConsumers, kConsumerThreads);

    // O += P V for 16 heads x kDimsPerWarp dims.
#pragma unroll(kQkUnroll < 36 ? 1 : 4)
    for (int kt = 0; kt < kBlockTokens; kt += 16) {
      u32 a[4];
      mma::ldsm_x4(p_tile + (mw * 16 + (lane & 15)) * kPRowBytes + (kt + ((lane >> 4) << 3)) * 2, a);
#pragma unroll
      for (int j = 0; j < kNV; j += 2) {
        u32 b[4];
        mma::ldsm_x4_trans(kbuf + tile_offset(kt + (lane & 7) + (((lane >> 3) & 1) << 3), d0 / 8 + j + (lane >> 4)), b);
        mma::mma_bf16(o[j], a, b[0], b[1]);
        mma::mma_bf16(o[j + 1], a, b[2], b[3]);
      }
    }
    // Release the buffer only when a producer will wait for it (step + 2 refills it).
    if (step + 2 < steps) mma::bar_arrive(kBarEmpty + buf, kThreads);
  }

  // Row sums: across the quad, then across the warps sharing the m-tile.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += shfl_xor(l_run[h], 1);
    l_run[h] += shfl_xor(l_run[h], 2);
  }
  if (t == 0) {
    red[nw * kHT + mw * 16 + g] = l_run[0];
    red[nw * kHT + mw * 16 + g + 8] = l_run[1];
  }
  mma::bar_sync(kBarConsumers, kConsumerThreads);
  float l_tot[2], inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_tot[h] = 0.0f;
#pragma unroll
    for (int w = 0; w < kNW; ++w) l_tot[h] += red[w * kHT + mw * 16 + g + 8 * h];
    inv[h] = l_tot[h] > 0.0f ? 1.0f / l_tot[h] : 0.0f;
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const u32 head = head0 + mw * 16 + g + 8 * h;
    if (head >= (u32)kHeads) continue;
    const bool empty = !(l_tot[h] > 0.0f);
    if (p.splits == 1) {
      u16* dst = p.out + (row * kHeads + head) * kDv + d0 + 2 * t;
#pragma unroll
      for (int j = 0; j < kNV; ++j)
        *reinterpret_cast<u32*>(dst + j * 8) = mma::pack_bf16x2(o[j][2 * h] * inv[h], o[j][2 * h + 1] * inv[h]);
      if (nw == 0 && t == 0)
        p.lse[row * kHeads + head] = empty ? pos_inf() : (m_run[h] + mma::log2_approx(l_tot[h])) * kLn2;
    } else {
      const i64 slot = (row * p.splits + split) * kHeads + head;
      float* dst = p.o_part + slot * kDv + d0 + 2 * t;
#pragma unroll
      for (int j = 0; j < kNV; ++j) {
        Vec8 v;
        v.w[0] = f32_as_u32(o[j][2 * h] * inv[h]);
        v.w[1] = f32_as_u32(o[j][2 * h + 1] * inv[h]);
        *reinterpret_cast<Vec8*>(dst + j * 8) = v;
      }
      if (nw == 0 && t == 0) p.lse_part[slot] = empty ? neg_inf() : m_run[h] + mma::log2_approx(l_tot[h]);
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
