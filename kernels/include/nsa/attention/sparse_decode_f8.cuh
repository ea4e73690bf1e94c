// Sparse MLA decode over the FP8-656 cache for 16-head tiles (sm_90a): the
// consumers read the raw records. Copy warps move each chosen token's whole
// 656-byte record into a ring of kStages 64-token stages (one bulk copy per
// record; no register loads, no dequant pass, no bf16 K/V tile); the 8 consumer
// warps convert e4m3 to f16 inside their mma fragments. The per-tile scales never
// touch the e4m3 values:
//   Q K^T: per dims quarter, f16 mma of (Q * 2^e) with the raw e4m3 tile, then
//          times scale[token][quarter] * 2^-e, plus the rope dims (bf16 mma);
//   P V:   V's tile j is raw e4m3; its scale goes into P (f16, normalised by a
//          running bound on the tile's scales, see kScaleSlack).
// K and V are e4m3 * bf16(scale) exactly: FlashMLA's decode rounds each such
// value to bf16 (spec §2.3), so logits differ from it by at most one bf16 rounding
// per value (the reference models this kernel's values: DecodeDequant::Exact).
// Fragment layouts: PTX ISA "mma.m16n8k16".
#pragma once
#include "nsa/cuda/bulk.cuh"
#include "nsa/attention/sparse_decode.cuh"

namespace nsa {
namespace decode_f8 {

using namespace attend;
using decode::kTokenBytes;
using decode::Params;
constexpr int kStages = 4;
// Copy warps: each moves 32 tokens of every step, one bulk copy (cp.async.bulk)
// per record. On the H200, b128 h16 took 63.7 us this way, against 69.6 with one bulk
// warp for 48 tokens and four cp.async warps for the rest, and 79.3 with one bulk
// and four cp.async warps for 32 each (December 2026): the cp.async
// address streams cost the consumers more issue slots than they saved.
constexpr int kCopyWarps = kBlockTokens / 32;
constexpr int kThreads = kConsumerThreads + 32 * kCopyWarps;
constexpr u32 kStageBytes = kBlockTokens * kTokenBytes;
constexpr u32 kScalesOffset = 512;
constexpr u32 kRopeOffset = 528;

// The step's tile scales, rounded to bf16 once (by the Q K^T lanes) for P V, in
// the order P V's lanes read them: tile-major, then lane t's 16 tokens together.
constexpr u32 kScaleBytes = kQuarters * kBlockTokens * 4;
NSA_DEVICE u32 scale_slot(u32 tile, u32 token) {
  const u32 r = token % 16;  // token = 16 kt + 2t + (i & 1) + 8 (i >> 1)
  return (tile * kBlockTokens + (r % 8) / 2 * 16 + token / 16 * 4 + (r & 1) + (r / 8) * 2) * 4;
}

// Shared memory: the record ring, the split-K partial S, P (f16, padded rows),
// per-warp row partials, the step's rounded scales (two buffers: a warp may write
// step s + 1's while others still read step s's), token validity per stage, the
// full/empty barriers, and the CTA's slot indices (copied once: the copy warps
// never wait on an index load).
struct Layout {
  static constexpr u32 kRing = 0;
  static constexpr u32 kPart = kRing + kStages * kStageBytes;
  static constexpr u32 kP = kPart + kQuarters * 16 * kPartStride * 4;
  static constexpr u32 kRed = kP + 16 * kPRowBytes;
  static constexpr u32 kScales = kRed + kConsumerWarps * 16 * 4;
  static constexpr u32 kValid = kScales + 2 * kScaleBytes;
  static constexpr u32 kFull = kValid + kStages * kBlockTokens;
  static constexpr u32 kEmpty = kFull + kStages * 8;
  static constexpr u32 kIdx = kEmpty + kStages * 8;
  static_assert(kFull % 8 == 0, "mbarriers are 8-byte aligned");
};

template <int kTopk>
struct Smem : Layout {
  static constexpr u32 kBytes = kIdx + kTopk * 4;
};

// Slack of the running values the P V operands are taken against, so that most
// steps need no rescale of O: the row max moves only when a step's max passes it
// by kMaxSlack (log2 units; P <= 2^8 meanwhile) and sigma only when a tile scale
// passes it kScaleSlack-fold, so P' = P * scale / sigma <= 2^12, well inside f16.
constexpr float kMaxSlack = 8.0f;
constexpr float kScaleSlack = 16.0f;

// |x| as an operand modifier of the max that consumes it (a bit mask is an
// instruction of its own).
NSA_DEVICE float abs_f32(float x) {
  float r;
  asm("abs.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// A record's tile scale as FlashMLA's decode uses it: rounded to bf16 (spec §2.3).
NSA_DEVICE float scale_at(u32 addr) { return bf16_to_f32(f32_to_bf16(u32_as_f32(mma::lds_u32(addr)))); }

// 2^(13 - e) for the largest |q| = m * 2^e (so |q| * factor < 2^14 fits f16 with
// its full precision); 1 when the row is zero. Kept within 2^-126 .. 2^126 so the
// inverse is a normal f32 too.
NSA_DEVICE float q_factor(float max_abs) {
  if (!(max_abs > 0.0f)) return 1.0f;
  i32 e = (i32)((f32_as_u32(max_abs) >> 23) & 0xff) - 127;
  i32 f = 13 - e;
  f = f < -126 ? -126 : (f > 126 ? 126 : f);
  return u32_as_f32((u32)(f + 127) << 23);
}

// Index entry `pos` of the CTA's range as a slot, or -1 when it is past the row's
// valid prefix, is -1, or is rejected (counted in `status`: outside the cache).
NSA_DEVICE i32 checked_slot(const Params& p, i32 s, i64 at, bool live, bool report, u32* status) {
  return live ? decode::checked_entry(p, s, at, report, status) : -1;
}

// The copy warps: warp w moves tokens 32 w .. + 31 of every step, lane l token
// 32 w + l. Each warp first copies its index entries into shared memory (4-byte
// async copies: one round trip). Invalid tokens are not copied: their flag is 0
// and their scales are zeroed, and in a slot's first use its e4m3 bytes too (P V
// multiplies them by P = 0, so they must be finite; later a slot holds a record
// this CTA read, or zeros).
template <int kTopk, int kPage>
NSA_DEVICE void copy_records(const Params& p, u32 base, u8* smem, i64 row, i32 first, i32 last, i32 steps,
                             bool report, u32* status) {
  typedef Smem<kTopk> L;
  const u32 lane = lane_id();
  const u32 token = (thread_x() / 32 - kConsumerWarps) * 32 + lane;
  for (i32 step = 0; step < steps; ++step) {
    const i32 at = step * kBlockTokens + (i32)token;
    mma::cp_async_4(base + L::kIdx + at * 4, p.indices + row * kTopk + first + at);
  }
  mma::cp_async_commit();
  mma::cp_async_wait<0>();
  __syncwarp();
  const i32* idx = reinterpret_cast<const i32*>(smem + L::kIdx);
  for (i32 step = 0; step < steps; ++step) {
    const u32 stage = (u32)step % kStages;
    const u32 full = base + L::kFull + stage * 8;
    if (step >= kStages) bulk::mbar_wait(base + L::kEmpty + stage * 8, ((u32)step / kStages - 1) & 1);
    const u32 ring = base + L::kRing + stage * kStageBytes;
    const i32 at = step * kBlockTokens + (i32)token;
    const i32 slot = checked_slot(p, idx[at], row * kTopk + first + at, first + at < last, report, status);
    const bool valid = slot >= 0;
    smem[L::kValid + stage * kBlockTokens + token] = valid ? 1 : 0;
    if (!valid) {
      const u32 rec = ring + token * kTokenBytes;
      for (u32 i = step < kStages ? 0u : kScalesOffset; i <= kScalesOffset; i += 16)
        mma::sts_v4(rec + i, Vec16{{0u, 0u, 0u, 0u}});
    }
    const u32 hits = __ballot_sync(0xffffffffu, valid);
    // The zeroed bytes are generic-proxy writes into a slot a later copy may fill.
    if (hits != 0xffffffffu) mma::fence_proxy_async();
    __syncwarp();
    if (lane == 0) bulk::mbar_arrive_expect_tx(full, popc_u32(hits) * kTokenBytes);
    __syncwarp();
    if (valid) bulk::copy_g2s(ring + token * kTokenBytes, decode::record<kPage>(p, slot), kTokenBytes, full);
  }
}

// One consumer warp: Q K^T over dims quarter q = warp % 4 (e4m3 tile q and rope
// dims 16q..16q+15) for tokens 32 (warp / 4) .. + 31; softmax over tokens 8 warp
// .. + 7 (after the quarters meet in shared memory); P V for output dims
// 64 warp .. + 63 (scale tile warp / 2). Lanes: g = lane / 4, t = lane % 4.
//
// Q K^T k-permutation: for k-step ks, lane t's logical k pairs (2t, 2t+1) and
// (2t+8, 2t+9) are the tile's dims 32t + 4ks + (0, 1) and (2, 3), so one lane's
// B operands for all 8 k-steps are 32 consecutive bytes of its token's record.
// P V n-permutation: n8 tile j (j < 4) column n is dim 64 warp + 4n + j, tile
// j >= 4 dim 64 warp + 32 + 4n + (j - 4): a lane's B bytes are two words per
// token, and its C values are 8 consecutive dims per row and word.
template <int kHeads>
struct Consumer {
  u32 base, warp, g, t, quarter;
  u32 qh[8][4];      // Q nope quarter, f16, times qscale
  u32 qr[4];         // Q rope dims of the quarter, bf16
  float qinv[2];     // 1 / qscale of rows g, g + 8
  float m_run[2];    // running max (log2 domain) of rows g, g + 8
  float l_run[2];    // this thread's share of the row sums
  float sigma;       // a bound on |scale| of this warp's V tile so far: P' = P scale / sigma <= kScaleSlack
  float inv_sigma;   // 1 / sigma, 0 while sigma is 0
  float o[8][4];
  // Lane-constant byte offsets (from a stage's ring base, or the scale buffer),
  // so a step's shared-memory addresses are its stage base plus immediates.
  u32 k_at;          // Q K^T: the lane's B bytes of n-tile 0 (token tok_base + g)
  u32 rope_at;       // Q K^T: its rope words
  u32 own_scale_at;  // the scale this lane rounds: token tok_base + lane, tile quarter
  u32 own_slot;      // where it keeps it (scale_slot)
  u32 qk_scales_at;  // Q K^T: the rounded scales of the lane's 8 tokens (n-tiles 0, 1; then 2, 3)
  u32 v_at;          // P V: the lane's V bytes of token 2t
  u32 scales_at;     // P V: the lane's 16 rounded scales of tile warp / 2

  NSA_DEVICE Consumer(u32 smem_base, u32 w, u32 lane) : base(smem_base), warp(w) {
    g = lane / 4;
    t = lane % 4;
    quarter = w % kQuarters;
    const u32 tok_base = (w / kQuarters) * 32;
    k_at = (tok_base + g) * kTokenBytes + quarter * 128 + t * 32;
    rope_at = (tok_base + g) * kTokenBytes + kRopeOffset + quarter * 32 + t * 4;
    own_scale_at = (tok_base + lane) * kTokenBytes + kScalesOffset + quarter * 4;
    own_slot = scale_slot(quarter, tok_base + lane);
    qk_scales_at = scale_slot(quarter, tok_base + 2 * t);
    v_at = 2 * t * kTokenBytes + w * 64 + 4 * g;
    scales_at = (w / 2) * kBlockTokens * 4 + t * 64;  // scale_slot(w / 2, 2t), folded by hand
    m_run[0] = m_run[1] = kMaxInit;
    l_run[0] = l_run[1] = 0.0f;
    sigma = 0.0f;
    inv_sigma = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  }

  // Q fragments straight from global memory (heads past kHeads are zero rows).
  NSA_DEVICE void load_q(const u16* q_row, u32 head0, u8* smem) {
    float nope[2][32];
    float mx[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u32 head = head0 + g + 8 * h;
      const bool live = head < (u32)kHeads;
      const u16* src = q_row + (live ? head : 0) * 576;
      mx[h] = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        Vec16 v = mma::ldg_stream_v4(src + quarter * 128 + t * 32 + c * 8);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float x = live ? bf16_to_f32((u16)(v.w[e / 2] >> (16 * (e % 2)))) : 0.0f;
          nope[h][c * 8 + e] = x;
          mx[h] = mma::max_f32(mx[h], abs_f32(x));
        }
      }
      const u32* rope = reinterpret_cast<const u32*>(src + 512 + quarter * 16);
      qr[h] = live ? rope[t] : 0u;          // a0 / a1: dims 2t, 2t + 1
      qr[2 + h] = live ? rope[4 + t] : 0u;  // a2 / a3: dims 2t + 8, 2t + 9
    }
    // Largest |q| of each row over all four quarters (warps 0..3 hold them).
    float* red = reinterpret_cast<float*>(smem + Layout::kRed);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = mma::max_f32(mx[h], shfl_xor(mx[h], 1));
      mx[h] = mma::max_f32(mx[h], shfl_xor(mx[h], 2));
    }
    if (warp < (u32)kQuarters && t == 0) {
      red[warp * 16 + g] = mx[0];
      red[warp * 16 + g + 8] = mx[1];
    }
    mma::bar_sync(kBarConsumers, kConsumerThreads);
    float factor[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = 0.0f;
#pragma unroll
      for (int w = 0; w < kQuarters; ++w) m = mma::max_f32(m, red[w * 16 + g + 8 * h]);
      factor[h] = q_factor(m);
      qinv[h] = 1.0f / factor[h];
    }
    mma::bar_sync(kBarConsumers, kConsumerThreads);  // red is reused by the softmax
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float* x = &nope[h][4 * ks];
        qh[ks][h] = mma::pack_f16x2(x[0] * factor[h], x[1] * factor[h]);
        qh[ks][2 + h] = mma::pack_f16x2(x[2] * factor[h], x[3] * factor[h]);
      }
    }
  }

  // This warp's partial S (its dims quarter and 32 tokens; rows g, g + 8), in
  // registers. Each lane rounds one of the 32 scales of the warp's tokens and
  // quarter into `scales` (the step's buffer), where the warp's lanes and later
  // P V read them.
  NSA_DEVICE void qk_partial(u32 ring, u32 scales, float (&ps)[4][4]) {
    mma::sts_f32(scales + own_slot, scale_at(ring + own_scale_at));
    __syncwarp();
    // Tokens nt * 8 + 2t + {0, 1}: words 2 (nt % 2) + {0, 1} of vector nt / 2.
    const Vec16 sc_pairs[2] = {mma::lds_v4(scales + qk_scales_at), mma::lds_v4(scales + qk_scales_at + 16)};
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const u32 rec = ring + k_at + nt * 8 * kTokenBytes;
      const Vec16 w0 = mma::lds_v4(rec);
      const Vec16 w1 = mma::lds_v4(rec + 16);
      const u32 rope = ring + rope_at + nt * 8 * kTokenBytes;
      const u32 r0 = mma::lds_u32(rope);
      const u32 r1 = mma::lds_u32(rope + 16);
      float an[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ar[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma::mma_bf16(ar, qr, r0, r1);
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const u32 w = ks < 4 ? w0.w[ks] : w1.w[ks - 4];
        mma::mma_f16(an, qh[ks], e4m3x2_to_f16x2(w), e4m3x2_hi_to_f16x2(w));
      }
      // C columns 2t, 2t + 1 of this n-tile are tokens tok_base + nt * 8 + 2t, + 1.
      const float sc0 = u32_as_f32(sc_pairs[nt / 2].w[2 * (nt % 2)]);
      const float sc1 = u32_as_f32(sc_pairs[nt / 2].w[2 * (nt % 2) + 1]);
      ps[nt][0] = an[0] * qinv[0] * sc0 + ar[0];
      ps[nt][1] = an[1] * qinv[0] * sc1 + ar[1];
      ps[nt][2] = an[2] * qinv[1] * sc0 + ar[2];
      ps[nt][3] = an[3] * qinv[1] * sc1 + ar[3];
    }
  }

  // The quarters' partial S meet: the full S of tokens 8 warp + 2t, + 1.
  NSA_DEVICE void meet(const float (&ps)[4][4], float (&s)[4]) const {
    const u32 tok_base = (warp / kQuarters) * 32;
    const u32 part = base + Layout::kPart;
    meet_quarters(part + (quarter * 16 * kPartStride + tok_base + 2 * t) * 4, part + (warp * 8 + 2 * t) * 4, ps, g, s);
  }

  NSA_DEVICE u32 ring_at(i32 step) const { return base + Layout::kRing + ((u32)step % kStages) * kStageBytes; }
  NSA_DEVICE u32 scales_at_step(i32 step) const { return base + Layout::kScales + ((u32)step & 1u) * kScaleBytes; }

  // One step, software-pipelined: `ps` holds this step's partial S on entry and
  // the next step's on return, whose Q K^T runs beside this step's P V (one block
  // of independent work for the scheduler: b128 h16 60.1 -> 59.7 us on the H200).
  // After the last step it reads a stage no copy writes any more (or never
  // wrote) and its result is dropped: a wasted Q K^T that costs b1, one step per
  // CTA, ~2%. Loads that do not depend on the step's barriers are issued before
  // them (a load cannot move across a barrier): the validity flags, the P V
  // scales (written before the first barrier) and the first V words (before the
  // P barrier).
  NSA_DEVICE void consume(u8* smem, i32 step, i32 steps, float c_scale, float (&ps)[4][4]) {
    const u32 stage = (u32)step % kStages;
    const u32 ring = ring_at(step);
    const u32 scales = scales_at_step(step);
    const u32 col = warp * 8 + 2 * t;
    const u16 valid = *reinterpret_cast<const u16*>(smem + Layout::kValid + stage * kBlockTokens + col);
    float s[4];
    meet(ps, s);

    // This warp's V tile scales of the lane's 16 tokens (16 kt + 2t + {0, 1, 8, 9}),
    // rounded by the Q K^T lanes (visible after the barrier in meet).
    float sc[4][4];
    float smax = 0.0f;
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) {
      const Vec16 v = mma::lds_v4(scales + scales_at + kt * 16);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sc[kt][i] = u32_as_f32(v.w[i]);
        smax = mma::max_f32(smax, abs_f32(sc[kt][i]));
      }
    }

    // Scale into the log2 domain, mask invalid tokens, row max across the warps.
    float* red = reinterpret_cast<float*>(smem + Layout::kRed);
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = (valid >> (8 * (e & 1))) & 0xffu ? s[e] * c_scale : neg_inf();
      s[e] = x;
      mx[e >> 1] = mma::max_f32(mx[e >> 1], x);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = mma::max_f32(mx[h], shfl_xor(mx[h], 1));
      mx[h] = mma::max_f32(mx[h], shfl_xor(mx[h], 2));
    }
    if (t == 0) {
      red[warp * 16 + g] = mx[0];
      red[warp * 16 + g + 8] = mx[1];
    }
    smax = mma::max_f32(smax, shfl_xor(smax, 1));  // the tile's 64 tokens: the same in every lane
    smax = mma::max_f32(smax, shfl_xor(smax, 2));
    // sigma moves only when a scale passes it kScaleSlack-fold (any, from 0).
    float grow = 1.0f;
    if (smax > sigma * kScaleSlack) {
      const float inv = 1.0f / smax;
      grow = sigma * inv;  // O was accumulated against sigma (0 while nothing was)
      sigma = smax;
      inv_sigma = inv;
    }
    mma::bar_sync(kBarConsumers, kConsumerThreads);
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m_blk = red[g + 8 * h];
#pragma unroll
      for (int w = 1; w < kConsumerWarps; ++w) m_blk = mma::max_f32(m_blk, red[w * 16 + g + 8 * h]);
      const float m_new = m_blk > m_run[h] + kMaxSlack ? m_blk : m_run[h];
      alpha[h] = mma::exp2_approx(m_run[h] - m_new);  // exactly 1 while the max stays
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }
    {
      const float p0 = mma::exp2_approx(s[0] - m_run[0]);
      const float p1 = mma::exp2_approx(s[1] - m_run[0]);
      const float p2 = mma::exp2_approx(s[2] - m_run[1]);
      const float p3 = mma::exp2_approx(s[3] - m_run[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      *reinterpret_cast<u32*>(smem + Layout::kP + g * kPRowBytes + col * 2) = mma::pack_f16x2(p0, p1);
      *reinterpret_cast<u32*>(smem + Layout::kP + (g + 8) * kPRowBytes + col * 2) = mma::pack_f16x2(p2, p3);
    }
    // O rescales only in the steps where a row's max or sigma moved (the warp
    // agrees on the branch).
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f || grow != 1.0f)) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        o[j][0] *= alpha[0] * grow;
        o[j][1] *= alpha[0] * grow;
        o[j][2] *= alpha[1] * grow;
        o[j][3] *= alpha[1] * grow;
      }
    }
    // V words of tokens 16 kt + 2t, + 1, + 8, + 9: dims 64 warp + 4g .. + 3 and + 32 .. + 35.
    u32 wa[4], wb[4];
    load_v(ring, 0, wa, wb);
    mma::bar_sync(kBarConsumers, kConsumerThreads);

    // The next step's Q K^T (its records must have landed).
    if (step + 1 < steps) wait_full(step + 1);
    qk_partial(ring_at(step + 1), scales_at_step(step + 1), ps);

    // O += P' V: A = P (f16) times the token's scale / sigma; B = raw e4m3 V.
    const u32 lane = lane_id();
    const u32 p_addr = base + Layout::kP + (lane & 15) * kPRowBytes + ((lane >> 4) << 4);
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) {
      u32 a[4];
      mma::ldsm_x4(p_addr + kt * 32, a);
      const u32 r_lo = mma::pack_f16x2(sc[kt][0] * inv_sigma, sc[kt][1] * inv_sigma);
      const u32 r_hi = mma::pack_f16x2(sc[kt][2] * inv_sigma, sc[kt][3] * inv_sigma);
      a[0] = mma::mul_f16x2(a[0], r_lo);
      a[1] = mma::mul_f16x2(a[1], r_lo);
      a[2] = mma::mul_f16x2(a[2], r_hi);
      a[3] = mma::mul_f16x2(a[3], r_hi);
      u32 b[8][2];  // B operands of n-tiles 0..7
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        const u32* w = jp < 2 ? wa : wb;
        const u32 sel = jp % 2 == 0 ? 0x5140u : 0x7362u;  // bytes j, j + 1 of both tokens
        const u32 lo = mma::byte_perm(w[0], w[1], sel);   // k rows 2t, 2t + 1
        const u32 hi = mma::byte_perm(w[2], w[3], sel);   // k rows 2t + 8, 2t + 9
        b[2 * jp][0] = e4m3x2_to_f16x2(lo);
        b[2 * jp][1] = e4m3x2_to_f16x2(hi);
        b[2 * jp + 1][0] = e4m3x2_hi_to_f16x2(lo);
        b[2 * jp + 1][1] = e4m3x2_hi_to_f16x2(hi);
      }
      if (kt + 1 < 4) load_v(ring, kt + 1, wa, wb);
#pragma unroll
      for (int j = 0; j < 8; ++j) mma::mma_f16(o[j], a, b[j][0], b[j][1]);
    }
  }

  NSA_DEVICE void wait_full(i32 step) const {
    bulk::mbar_wait(base + Layout::kFull + ((u32)step % kStages) * 8, ((u32)step / kStages) & 1);
  }

  NSA_DEVICE void load_v(u32 ring, int kt, u32 (&wa)[4], u32 (&wb)[4]) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const u32 rec = ring + v_at + (kt * 16 + (i & 1) + 8 * (i >> 1)) * kTokenBytes;
      wa[i] = mma::lds_u32(rec);
      wb[i] = mma::lds_u32(rec + 32);
    }
  }

  // Full row sums of rows g and g + 8.
  NSA_DEVICE void row_sums(u8* smem, float (&l_tot)[2]) {
    float* red = reinterpret_cast<float*>(smem + Layout::kRed);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_run[h] += shfl_xor(l_run[h], 1);
      l_run[h] += shfl_xor(l_run[h], 2);
    }
    // Not needed for ordering (every read of red precedes the last step's P
    // barrier); kept as in the GPU-tested build. Once per CTA.
    mma::bar_sync(kBarConsumers, kConsumerThreads);
    if (t == 0) {
      red[warp * 16 + g] = l_run[0];
      red[warp * 16 + g + 8] = l_run[1];
    }
    mma::bar_sync(kBarConsumers, kConsumerThreads);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_tot[h] = 0.0f;
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) l_tot[h] += red[w * 16 + g + 8 * h];
    }
  }

  // Row g + 8h's 16 output values of this lane times `f`: dims 64 warp + 8t .. + 7
  // (n-tiles 0..3) and 64 warp + 32 + 8t .. + 7 (n-tiles 4..7).
  NSA_DEVICE void values(int h, float f, float (&v)[2][8]) const {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[half][j] = o[4 * half + j][2 * h] * f;
        v[half][4 + j] = o[4 * half + j][2 * h + 1] * f;
      }
    }
  }

  NSA_DEVICE u32 dim(int half) const { return warp * 64 + half * 32 + 8 * t; }
};

template <int kHeads, int kTopk, int kPage>
NSA_DEVICE void sparse_decode(const Params& p, u32* status) {
  static_assert(kTopk % kBlockTokens == 0, "top-k is a multiple of 64");
  constexpr int kHeadTiles = (kHeads + 15) / 16;
  extern NSA_SHARED Vec16 smem_vec[];
  u8* smem = reinterpret_cast<u8*>(smem_vec);
  const u32 base = mma::smem_addr(smem);
  const u32 warp = thread_x() / 32;

  const auto [ht, row, split] = decode::cta_tile<kHeadTiles>(p);
  if (row >= p.rows) return;
  const decode::SplitRange r = decode::split_range<kTopk>(p, row, split);

  if (thread_x() == 0) {
    for (int s = 0; s < kStages; ++s) {
      bulk::mbar_init(base + Layout::kFull + s * 8, kCopyWarps);  // each copy warp's expect_tx
      bulk::mbar_init(base + Layout::kEmpty + s * 8, kConsumerWarps);
    }
    bulk::mbar_init_fence();
  }
  sync_block();

  if (warp >= (u32)kConsumerWarps) {
    copy_records<kTopk, kPage>(p, base, smem, row, r.first, r.last, r.steps, ht == 0, status);
    return;
  }

  const u32 head0 = ht * 16;
  Consumer<kHeads> c(base, warp, lane_id());
  c.load_q(p.q + row * kHeads * 576, head0, smem);
  const float c_scale = p.sm_scale * kLog2e;
  float ps[4][4];
  if (r.steps > 0) {
    c.wait_full(0);
    c.qk_partial(c.ring_at(0), c.scales_at_step(0), ps);
  }
  for (i32 step = 0; step < r.steps; ++step) {
    c.consume(smem, step, r.steps, c_scale, ps);
    __syncwarp();
    if (lane_id() == 0) bulk::mbar_arrive(base + Layout::kEmpty + ((u32)step % kStages) * 8);
  }
  float l_tot[2];
  c.row_sums(smem, l_tot);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const u32 head = head0 + c.g + 8 * h;
    if (head >= (u32)kHeads) continue;
    const bool empty = !(l_tot[h] > 0.0f);
    const float f = empty ? 0.0f : c.sigma / l_tot[h];
    float v[2][8];
    c.values(h, f, v);
    const bool writes_lse = warp == 0 && c.t == 0;
    if (p.splits == 1) {
      u16* dst = p.out + (row * kHeads + head) * kDv;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        Vec16 b;
#pragma unroll
        for (int i = 0; i < 4; ++i) b.w[i] = mma::pack_bf16x2(v[half][2 * i], v[half][2 * i + 1]);
        *reinterpret_cast<Vec16*>(dst + c.dim(half)) = b;
      }
      if (writes_lse) p.lse[row * kHeads + head] = empty ? pos_inf() : (c.m_run[h] + mma::log2_approx(l_tot[h])) * kLn2;
    } else {
      const i64 slot = (row * p.splits + split) * kHeads + head;
      float* dst = p.o_part + slot * kDv;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          Vec16 b;
#pragma unroll
          for (int e = 0; e < 4; ++e) b.w[e] = f32_as_u32(v[half][4 * i + e]);
          *reinterpret_cast<Vec16*>(dst + c.dim(half) + 4 * i) = b;
        }
      }
      if (writes_lse) p.lse_part[slot] = empty ? neg_inf() : c.m_run[h] + mma::log2_approx(l_tot[h]);
    }
  }
}

}  // namespace decode_f8
}  // namespace nsa
