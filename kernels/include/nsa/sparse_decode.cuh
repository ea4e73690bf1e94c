// Sparse MLA decode over the FP8-656 cache (spec §8.1, §8.3), stage D1 of the
// kernel playbook: one CTA per (query row, head tile, KV split), 16 warps,
// mma.sync m16n8k16 (bf16 in, f32 accumulate) from ldmatrix, 128-bit gathers of the
// chosen tokens dequantized in registers into a double-buffered shared tile,
// online softmax in the log2 domain, split-KV partials merged by `combine`.
#pragma once
#include "nsa/common/status.cuh"
#include "nsa/cuda/mma.cuh"

namespace nsa {
namespace decode {

constexpr int kDqk = 576;              // latent 512 + rope 64
constexpr int kDv = 512;               // V = the latent part of the same row
constexpr int kBlockTokens = 64;       // tokens per pipeline step
constexpr int kWarps = 16;  // 4 per scheduler: the gather/dequant chains need the latency hiding
constexpr int kThreads = kWarps * 32;
constexpr int kRowBytes = kDqk * 2;    // one bf16 row of Q or K in shared memory
constexpr int kTokenBytes = 656;       // FP8 cache record
constexpr int kScalesOffset = 512;
constexpr int kRopeOffset = 528;
constexpr int kPartsPerToken = kThreads / kBlockTokens;  // 8 gather threads per token
constexpr int kNopePerPart = kDv / kPartsPerToken;       // 64 e4m3 bytes (half a scale tile)
constexpr int kRopePerPart = 64 / kPartsPerToken;        // 8 rope dims
constexpr int kPRowBytes = kBlockTokens * 2 + 16;        // padded: ldmatrix rows hit distinct banks
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
NSA_DEVICE float kNegInf() { return u32_as_f32(0xff800000u); }
NSA_DEVICE float kPosInf() { return u32_as_f32(0x7f800000u); }
NSA_DEVICE float fmax2(float a, float b) { return a > b ? a : b; }
// Running max start: finite, so exp2(m_old - m_new) never sees -inf - -inf.
constexpr float kMaxInit = -1e30f;

static_assert(kNopePerPart == 64 && kRopePerPart == 8, "gather thread share: 4 + 1 16-byte loads");

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

// Byte offset of 16-byte chunk `c` of row `r` in a [rows][72 chunks] bf16 tile:
// chunks are XOR-swizzled within groups of 8 so that the 8 rows one ldmatrix
// reads (same chunk, consecutive rows) fall in 8 distinct bank groups.
NSA_DEVICE u32 tile_offset(u32 r, u32 c) { return r * kRowBytes + ((c ^ (r & 7u)) << 4); }

// Shared memory: Q [kHT][576], K/V x2 [64][576], P [kHT][64] (padded rows),
// per-warp row partials (max, then sums), token validity flags.
template <int kHT>
struct Smem {
  // QK^T warps per 16-head m-tile: at least 8 tokens (one n8 tile) each.
  static constexpr int kNW = kWarps / (kHT / 16) < 8 ? kWarps / (kHT / 16) : 8;
  static constexpr u32 kQ = 0;
  static constexpr u32 kK = kQ + kHT * kRowBytes;
  static constexpr u32 kP = kK + 2 * kBlockTokens * kRowBytes;
  static constexpr u32 kRed = kP + kHT * kPRowBytes;
  static constexpr u32 kValid = kRed + kNW * kHT * 4;
  static constexpr u32 kBytes = kValid + 2 * kBlockTokens;
};

// One thread's share of a 64-token step: token `tid / 8`, part `tid % 8`
// (64 e4m3 bytes of scale tile part / 2, 8 rope dims, that tile's scale).
struct Gather {
  Vec16 nope[4];
  Vec16 rope;
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
  for (int i = 0; i < 4; ++i) g.nope[i] = mma::ldg_nc_v4(rec + part * kNopePerPart + i * 16);
  g.rope = mma::ldg_nc_v4(rec + kRopeOffset + part * 16);
  g.scale = *reinterpret_cast<const float*>(rec + kScalesOffset + (part / 2) * 4);
}

// 8 e4m3 bytes -> 8 bf16 = bf16(f32(e4m3) * scale), the rounding of nsa's dequant kernel.
NSA_DEVICE Vec16 dequant8(u32 w0, u32 w1, float scale) {
  Vec16 o;
  const u32 w[2] = {w0, w1};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float a, b, c, d;
    e4m3x2_to_f32x2((u16)(w[i] & 0xffffu), a, b);
    e4m3x2_to_f32x2((u16)(w[i] >> 16), c, d);
    o.w[2 * i] = mma::pack_bf16x2(a * scale, b * scale);
    o.w[2 * i + 1] = mma::pack_bf16x2(c * scale, d * scale);
  }
  return o;
}

// Writes a gathered token share into K/V buffer `kbuf` (zeros for an invalid token,
// so masked keys can never inject NaN through 0 * garbage).
NSA_DEVICE void store_gather(const Gather& g, u32 kbuf, u8* valid_flags, u32 token, u32 part) {
  const Vec16 zero = {{0u, 0u, 0u, 0u}};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const Vec16 lo = g.valid ? dequant8(g.nope[i].w[0], g.nope[i].w[1], g.scale) : zero;
    const Vec16 hi = g.valid ? dequant8(g.nope[i].w[2], g.nope[i].w[3], g.scale) : zero;
    mma::sts_v4(kbuf + tile_offset(token, part * 8 + 2 * i), lo);
    mma::sts_v4(kbuf + tile_offset(token, part * 8 + 2 * i + 1), hi);
  }
  mma::sts_v4(kbuf + tile_offset(token, 64 + part), g.valid ? g.rope : zero);
  if (part == 0) valid_flags[token] = g.valid ? 1 : 0;
}

// The slot of index position `pos` of `row`, or -1 when it is past the row's valid
// prefix, is -1, or is rejected (counted in `status`: outside the cache).
template <int kTopk>
NSA_DEVICE i32 slot_at(const Params& p, i64 row, i32 pos, i32 valid_len, bool report, u32* status) {
  if (pos >= valid_len) return -1;
  const i32 s = p.indices[row * kTopk + pos];
  if (s == -1) return -1;
  if (s < -1 || (i64)s >= p.num_slots) {
    if (report) report_bad_entry(status, row * kTopk + pos);
    return -1;
  }
  return s;
}

// kHeads query heads; kHT heads per CTA (16, 32 or 64; kHeads < 16 runs one
// 16-row tile with the missing heads zero and unwritten).
template <int kHeads, int kHT, int kTopk, int kPage>
NSA_DEVICE void sparse_decode(const Params& p, u32* status) {
  static_assert(kHT == 16 || kHT == 32 || kHT == 64, "head tile");
  static_assert(kTopk % kBlockTokens == 0, "top-k is a multiple of 64");
  typedef Smem<kHT> L;
  constexpr int kMW = kHT / 16;                    // m-tiles (16 heads each)
  constexpr int kNW = L::kNW;                      // QK^T warps per m-tile
  constexpr int kTokPerWarp = kBlockTokens / kNW;  // QK^T columns per warp
  constexpr int kNT = kTokPerWarp / 8;             // n8 tiles per warp in QK^T
  constexpr int kPW = kWarps / kMW;                // PV warps per m-tile (all warps)
  constexpr int kDimsPerWarp = kDv / kPW;          // PV columns per warp
  constexpr int kNV = kDimsPerWarp / 8;            // n8 tiles per warp in PV
  constexpr int kHeadTiles = (kHeads + kHT - 1) / kHT;
  static_assert(kNT >= 1 && kNV % 2 == 0, "warp tiling");

  extern NSA_SHARED Vec16 smem_vec[];  // 16-byte aligned (ldmatrix, st.shared.v4)
  u8* smem = reinterpret_cast<u8*>(smem_vec);
  const u32 base = mma::smem_addr(smem);
  const u32 tid = thread_x();
  const u32 warp = tid / 32, lane = tid % 32;
  const u32 g = lane / 4, t = lane % 4;
  // Every warp takes part in P V (m-tile mw, column group nw); the first kMW * kNW
  // also compute Q K^T for (mw, token group nw) and own the row sums.
  const u32 mw = warp % kMW, nw = warp / kMW;
  const bool qk_warp = nw < (u32)kNW;

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

  // Q tile -> shared (heads past kHeads are zero rows).
  const u32 head0 = ht * kHT;
  for (u32 i = tid; i < (u32)kHT * (kDqk / 8); i += kThreads) {
    const u32 r = i / (kDqk / 8), c = i % (kDqk / 8);
    Vec16 v = {{0u, 0u, 0u, 0u}};
    if (head0 + r < (u32)kHeads)
      v = *reinterpret_cast<const Vec16*>(p.q + (row * kHeads + head0 + r) * kDqk + c * 8);
    mma::sts_v4(base + L::kQ + tile_offset(r, c), v);
  }

  const u32 g_token = tid / kPartsPerToken, g_part = tid % kPartsPerToken;
  const bool reporter = g_part == 0 && ht == 0;
  u8* valid_flags = smem + L::kValid;
  Gather ga;
  i32 next_slot = -1;
  if (steps > 0) {
    const i32 s0 = slot_at<kTopk>(p, row, first + (i32)g_token, last, reporter, status);
    issue_gather<kPage>(p, s0, g_part, ga);
    if (steps > 1) next_slot = slot_at<kTopk>(p, row, first + kBlockTokens + (i32)g_token, last, reporter, status);
    store_gather(ga, base + L::kK, valid_flags, g_token, g_part);
  }
  sync_block();

  const float c_scale = p.sm_scale * kLog2e;
  float m_run[2] = {kMaxInit, kMaxInit};  // rows g and g + 8 of this warp's m-tile
  float l_run[2] = {0.0f, 0.0f};          // this thread's share of the row sums
  float o[kNV][4];
#pragma unroll
  for (int j = 0; j < kNV; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float* red = reinterpret_cast<float*>(smem + L::kRed);  // [kNW][kHT]
  const u32 q_rows = base + L::kQ;
  const u32 p_tile = base + L::kP;

  for (i32 step = 0; step < steps; ++step) {
    const u32 buf = step & 1;
    const u32 kbuf = base + L::kK + buf * (kBlockTokens * kRowBytes);
    const bool more = step + 1 < steps;
    if (more) {
      issue_gather<kPage>(p, next_slot, g_part, ga);
      next_slot = step + 2 < steps ? slot_at<kTopk>(p, row, first + (step + 2) * kBlockTokens + (i32)g_token, last,
                                                    reporter, status)
                                   : -1;
    }

    // S = Q K^T for 16 heads x kTokPerWarp tokens (QK^T warps only).
    float s[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const u32 tok0 = nw * kTokPerWarp;
    if (qk_warp) {
      if constexpr (kNT == 1) {
        // One n8 tile per warp: each x4 load of K spans two k16 steps instead.
#pragma unroll 2
        for (int kc = 0; kc < kDqk / 8; kc += 4) {
          u32 a0[4], a1[4], b[4];
          mma::ldsm_x4(q_rows + tile_offset(mw * 16 + (lane & 15), kc + (lane >> 4)), a0);
          mma::ldsm_x4(q_rows + tile_offset(mw * 16 + (lane & 15), kc + 2 + (lane >> 4)), a1);
          mma::ldsm_x4(kbuf + tile_offset(tok0 + (lane & 7), kc + (lane >> 3)), b);
          mma::mma_bf16(s[0], a0, b[0], b[1]);
          mma::mma_bf16(s[0], a1, b[2], b[3]);
        }
      } else {
#pragma unroll 2
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
      float mx[2] = {kNegInf(), kNegInf()};
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const u32 col = tok0 + j * 8 + 2 * t + (e & 1);
          const float x = flags[col] ? s[j][e] * c_scale : kNegInf();
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
    }
    sync_block();
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
    if (qk_warp) {
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
    }
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
    sync_block();

    // O += P V for 16 heads x kDimsPerWarp dims.
    const u32 d0 = nw * kDimsPerWarp;
#pragma unroll
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

    if (more) store_gather(ga, base + L::kK + (buf ^ 1) * (kBlockTokens * kRowBytes), valid_flags + (buf ^ 1) * kBlockTokens,
                           g_token, g_part);
    sync_block();
  }

  // Row sums: across the quad, then across the warps sharing the m-tile.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += shfl_xor(l_run[h], 1);
    l_run[h] += shfl_xor(l_run[h], 2);
  }
  if (qk_warp && t == 0) {
    red[nw * kHT + mw * 16 + g] = l_run[0];
    red[nw * kHT + mw * 16 + g + 8] = l_run[1];
  }
  sync_block();
  float l_tot[2], inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_tot[h] = 0.0f;
#pragma unroll
    for (int w = 0; w < kNW; ++w) l_tot[h] += red[w * kHT + mw * 16 + g + 8 * h];
    inv[h] = l_tot[h] > 0.0f ? 1.0f / l_tot[h] : 0.0f;
  }

  const u32 d0 = nw * kDimsPerWarp;
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
        p.lse[row * kHeads + head] =
            empty ? kPosInf() : (m_run[h] + mma::log2_approx(l_tot[h])) * kLn2;
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
      if (nw == 0 && t == 0)
        p.lse_part[slot] = empty ? kNegInf() : m_run[h] + mma::log2_approx(l_tot[h]);
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
  float m = kNegInf();
  for (i32 s = 0; s < p.splits; ++s) m = fmax2(m, lse_i[s * kHeads]);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float total = 0.0f;
  if (m != kNegInf()) {
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
    p.lse[row * kHeads + head] = total > 0.0f ? (m + mma::log2_approx(total)) * kLn2 : kPosInf();
}

}  // namespace decode
}  // namespace nsa
