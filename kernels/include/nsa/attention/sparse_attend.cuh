// The consumer half shared by sparse MLA decode (FP8 cache) and prefill (bf16 KV),
// spec §8.1: a CTA holds a Q tile of kHT heads and gathered K/V rows in shared
// memory, 64 tokens per step; 8 consumer warps run mma.sync m16n8k16 (bf16 in, f32
// accumulate) from ldmatrix with an online softmax in the log2 domain, while the
// family's own producer warps fill the next rows. Decode double-buffers 64-row
// tiles handed over by named barriers (`run`); prefill keeps a ring of 32-row
// slots with mbarriers (sparse_prefill.cuh), a step's two halves in two slots.
#pragma once
#include "nsa/attention/softmax.cuh"
#include "nsa/cuda/mma.cuh"

namespace nsa {
namespace attend {

using namespace softmax;

constexpr int kDv = 512;               // V = the latent part of the same row
constexpr int kBlockTokens = 64;       // tokens per pipeline step
constexpr int kConsumerWarps = 8;
constexpr int kConsumerThreads = kConsumerWarps * 32;
// Named barriers: buffer b full (producers arrive, consumers wait), buffer b
// empty (consumers arrive, producers wait), and the consumers' own.
constexpr u32 kBarFull = 1;
constexpr u32 kBarEmpty = 3;
constexpr u32 kBarConsumers = 5;
constexpr int kPRowBytes = kBlockTokens * 2 + 16;  // padded: ldmatrix rows hit distinct banks

// One bf16 row of Q or K (kDqk dims) in shared memory, padded by 16 bytes: the 8
// rows one ldmatrix (or 8 tokens' stores) touch start 4 banks apart, so they never
// conflict, and addresses stay base + immediate (no swizzle arithmetic per access).
template <int kDqk>
struct Rows {
  static_assert(kDqk % 64 == 0 && kDqk >= kDv, "Q/K width: the 512 latent dims, optionally rope");
  static constexpr int kChunks = kDqk / 8;  // 16-byte chunks per row
  static constexpr int kBytes = kDqk * 2 + 16;
  static constexpr u32 kTileBytes = kBlockTokens * kBytes;  // one K/V buffer
  // Byte offset of 16-byte chunk `c` of row `r`.
  static NSA_DEVICE u32 offset(u32 r, u32 c) { return r * kBytes + c * 16; }
};

// 16-head tiles split Q K^T over the dims (see Consumer): kQuarters warps each
// hold a quarter of Q in registers and leave partial S [16][64] f32 rows, padded
// so a warp's float2 stores of 8 rows fill two conflict-free wavefronts.
constexpr int kQuarters = 4;
constexpr int kPartStride = kBlockTokens + 8;  // floats per partial-S row

// The split-K meeting point: a warp's partial S of 4 n8 tiles goes to the padded
// partial rows (`mine`: shared address of its dims quarter's row 0 at column
// tok_base + 2t); after a consumer barrier, `s` gets the full S of rows g, g + 8 at
// `sum_at` (quarter 0's row 0 at column tok0 + 2t), summed over the quarters.
// Shared addresses, not pointers: each access is then one register plus an
// immediate (u32 index arithmetic kept the compiler from folding the offsets).
NSA_DEVICE void meet_quarters(u32 mine, u32 sum_at, const float (&ps)[4][4], u32 g, float (&s)[4]) {
  constexpr u32 kRow = kPartStride * 4;  // bytes per partial row
  mine += g * kRow;
  sum_at += g * kRow;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) mma::sts_v2_f32(mine + 8 * h * kRow + j * 32, ps[j][2 * h], ps[j][2 * h + 1]);
  }
  mma::bar_sync(kBarConsumers, kConsumerThreads);
  s[0] = s[1] = s[2] = s[3] = 0.0f;
#pragma unroll
  for (int q = 0; q < kQuarters; ++q) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float x, y;
      mma::lds_v2_f32(sum_at + (q * 16 + 8 * h) * kRow, x, y);
      s[2 * h] += x;
      s[2 * h + 1] += y;
    }
  }
}

// Shared memory: Q [kHT][kDqk], K/V x2 [64][kDqk], P [kHT][64] (padded rows),
// per-warp row partials (max, then sums), token validity flags, and for 16-head
// tiles the partial S of each dims quarter.
template <int kHT, int kDqk>
struct Smem {
  // Consumer warps per 16-head m-tile (each: a token group in Q K^T, a column group in P V).
  static constexpr int kNW = kConsumerWarps / (kHT / 16);
  static constexpr u32 kQ = 0;
  static constexpr u32 kK = kQ + kHT * Rows<kDqk>::kBytes;
  static constexpr u32 kP = kK + 2 * Rows<kDqk>::kTileBytes;
  static constexpr u32 kRed = kP + kHT * kPRowBytes;
  static constexpr u32 kValid = kRed + kNW * kHT * 4;
  static constexpr u32 kPart = kValid + 2 * kBlockTokens;
  static constexpr u32 kBytes = kPart + (kHT == 16 ? kQuarters * 16 * kPartStride * 4 : 0);
};

// Where one 64-token step's K/V rows and validity flags are: tokens 0..31 from
// `lo` / `flags_lo`, tokens 32..63 from `hi` / `flags_hi` (shared addresses of
// their first row). A double-buffered tile is one contiguous block; a ring of
// 32-row slots (prefill) puts the halves wherever their slots are.
constexpr int kHalfTokens = kBlockTokens / 2;
struct StepTile {
  u32 lo, hi;
  const u8* flags_lo;
  const u8* flags_hi;
};

// Index entries of query row `row` that count: `topk_length[row]` clamped to
// 0..kTopk, or all kTopk without a length array.
template <int kTopk>
NSA_DEVICE i32 row_topk_len(const i32* topk_length, i64 row) {
  i32 len = kTopk;
  if (topk_length != nullptr) {
    const i32 l = topk_length[row];
    len = l < 0 ? 0 : (l < kTopk ? l : kTopk);
  }
  return len;
}

// Q rows of heads head0 .. head0 + kHT - 1 of one query row into shared memory, by
// every one of the CTA's kThreads threads (heads past kHeads are zero rows).
template <int kHeads, int kHT, int kDqk, int kThreads>
NSA_DEVICE void load_q_tile(const u16* q_row, u32 head0, u32 q_tile) {
  typedef Rows<kDqk> R;
  for (u32 i = thread_x(); i < (u32)kHT * R::kChunks; i += kThreads) {
    const u32 r = i / R::kChunks, c = i % R::kChunks;
    Vec16 v = {{0u, 0u, 0u, 0u}};
    if (head0 + r < (u32)kHeads) v = mma::ldg_stream_v4(q_row + (head0 + r) * kDqk + c * 8);
    mma::sts_v4(q_tile + R::offset(r, c), v);
  }
}

// One consumer warp's state: heads 16 mw .. 16 mw + 15 of the tile (rows g and
// g + 8 of the m-tile per thread), Q K^T over the tokens of group nw, P V over the
// output columns of group nw. kQkUnroll: unroll of the Q K^T loop (full on sm_90a;
// less where ptxas would spill, which also keeps the P V token loop rolled).
//
// A 16-head tile splits Q K^T over the dims instead (kSplitK): warp w keeps dims
// quarter w % 4 of Q in registers for the whole kernel and computes partial S for
// tokens 32 (w / 4) .. + 31; the quarters meet in shared memory, where warp w
// sums its 8 tokens. Reading Q from shared memory every step (8 warps × the whole
// tile) was most of a 16-head step's shared-memory traffic.
// kThreads: the CTA's threads (consumers first, then the family's producers), the
// count of the full/empty barriers. L: the shared-memory layout (its kQ, kP, kRed,
// kPart and kNW; Smem's K/V buffers and flags are only read by `run`).
// Warp w's Q K^T tokens (and flags) lie in token half w / 4 of the step
// (`half`): it needs only that half's rows before P V.
template <int kHT, int kDqk, int kQkUnroll, int kThreads, class L = Smem<kHT, kDqk>>
struct Consumer {
  static_assert(kHT == 16 || kHT == 32, "head tile: 16 or 32 (consumer registers cap the P V columns per warp)");
  typedef Rows<kDqk> R;
  static constexpr int kMW = kHT / 16;                    // m-tiles (16 heads each)
  static constexpr int kNW = L::kNW;                      // consumer warps per m-tile
  static constexpr int kTokPerWarp = kBlockTokens / kNW;  // Q K^T columns per warp
  static constexpr int kNT = kTokPerWarp / 8;             // n8 tiles per warp in Q K^T
  static constexpr int kDimsPerWarp = kDv / kNW;          // P V columns per warp
  static constexpr int kNV = kDimsPerWarp / 8;            // n8 tiles per warp in P V
  static constexpr bool kFullUnroll = kQkUnroll * 2 >= R::kChunks;
  static_assert(kNT >= 1 && kNV % 2 == 0, "warp tiling");
  static constexpr bool kSplitK = kHT == 16;
  static constexpr int kQSteps = kDqk / 16 / kQuarters;   // k16 steps of a dims quarter
  static constexpr int kSplitTokens = kBlockTokens * kQuarters / kConsumerWarps;  // 32 per warp
  static_assert(!kSplitK || (kDqk % (16 * kQuarters) == 0 && kSplitTokens == 32 && kNT == 1), "split-K tiling");
  static_assert(kTokPerWarp <= kHalfTokens && kSplitTokens == kHalfTokens, "a warp's Q K^T tokens lie in one half");

  u32 base, g, t, mw, nw, tok0, d0, half;
  // Per-thread ldmatrix row addresses, fixed for the whole kernel: every access in
  // the loops is one of these plus an immediate.
  u32 q_addr;  // Q rows (A of Q K^T), shared address
  u32 k_off;   // K rows (B of Q K^T), offset inside the warp's token half
  u32 p_addr;  // P rows (A of P V), shared address
  u32 v_off;   // V rows (B of P V, transposed), offset inside a token half
  u32 ks_off;  // kSplitK: K rows of this warp's 32 tokens at its dims quarter, inside its token half
  u32 part_at;  // kSplitK: this warp's partial S row 0 (meet_quarters' `mine`), shared address
  u32 qf[kSplitK ? kQSteps : 1][4];  // kSplitK: this warp's Q quarter as A fragments
  float m_run[2];  // running max (log2 domain, scaled) of rows g and g + 8
  float l_run[2];  // this thread's share of the row sums
  float o[kNV][4];

  NSA_DEVICE Consumer(u32 smem_base, u32 warp, u32 lane) : base(smem_base) {
    g = lane / 4;
    t = lane % 4;
    mw = warp % kMW;
    nw = warp / kMW;
    tok0 = nw * kTokPerWarp;
    d0 = nw * kDimsPerWarp;
    half = tok0 / kHalfTokens;
    const u32 tok_in_half = tok0 % kHalfTokens;
    q_addr = base + L::kQ + R::offset(mw * 16 + (lane & 15), lane >> 4);
    k_off = kNT == 1 ? R::offset(tok_in_half + (lane & 7), lane >> 3)
                     : R::offset(tok_in_half + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    p_addr = base + L::kP + (mw * 16 + (lane & 15)) * kPRowBytes + ((lane >> 4) << 3) * 2;
    v_off = R::offset((lane & 7) + (((lane >> 3) & 1) << 3), d0 / 8 + (lane >> 4));
    if constexpr (kSplitK) {
      const u32 quarter = warp % kQuarters, chunk0 = quarter * kQSteps * 2;
      const u32 token = (lane & 7) + ((lane >> 4) << 3);  // inside half warp / kQuarters (== `half`)
      ks_off = R::offset(token, chunk0 + ((lane >> 3) & 1));
      part_at = base + L::kPart + (quarter * 16 * kPartStride + (warp / kQuarters) * kSplitTokens + (lane % 4) * 2) * 4;
#pragma unroll
      for (int ks = 0; ks < kQSteps; ++ks) mma::ldsm_x4(q_addr + (chunk0 + 2 * ks) * 16, qf[ks]);
    }
    m_run[0] = m_run[1] = kMaxInit;
    l_run[0] = l_run[1] = 0.0f;
#pragma unroll
    for (int j = 0; j < kNV; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  }

  NSA_DEVICE float* red(u8* smem) const { return reinterpret_cast<float*>(smem + L::kRed); }  // [kNW][kHT]

  // Consumes `steps` 64-token buffers of Smem's double-buffered tile in order;
  // `c_scale` = sm_scale · log2(e).
  NSA_DEVICE void run(u8* smem, i32 steps, float c_scale) {
    for (i32 step = 0; step < steps; ++step) {
      const u32 buf = step & 1;
      mma::bar_sync(kBarFull + buf, kThreads);
      const u32 kbuf = base + L::kK + buf * R::kTileBytes;
      const u8* flags = smem + L::kValid + buf * kBlockTokens;
      const StepTile tile{kbuf, kbuf + kHalfTokens * R::kBytes, flags, flags + kHalfTokens};
      qk_softmax(smem, tile, c_scale);
      pv(tile);
      // Release the buffer only when a producer will wait for it (step + 2 refills it).
      if (step + 2 < steps) mma::bar_arrive(kBarEmpty + buf, kThreads);
    }
  }

  // S = Q K^T of the warp's tokens (token half `half` of `tile` only), the online
  // softmax, P into shared memory and O rescaled; ends at a consumer barrier.
  NSA_DEVICE void qk_softmax(u8* smem, const StepTile& tile, float c_scale) {
    float s[kNT][4];
    qk(half ? tile.hi : tile.lo, s);
    softmax_p(smem, tile, s, c_scale);
  }

  // S = Q K^T for 16 heads x kTokPerWarp tokens from the warp's token half at `kbuf`.
  NSA_DEVICE void qk(u32 kbuf, float (&s)[kNT][4]) {
#pragma unroll
    for (int j = 0; j < kNT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const u32 k_addr = kbuf + k_off;
    if constexpr (kSplitK) {
      float ps[kSplitTiles][4];
      qk_partial(kbuf, ps);
      meet(ps, s[0]);
    } else if constexpr (kNT == 1) {
      // One n8 tile per warp: each x4 load of K spans two k16 steps instead.
#pragma unroll(kQkUnroll)
      for (int kc = 0; kc < R::kChunks; kc += 4) {
        u32 a0[4], a1[4], b[4];
        mma::ldsm_x4(q_addr + kc * 16, a0);
        mma::ldsm_x4(q_addr + (kc + 2) * 16, a1);
        mma::ldsm_x4(k_addr + kc * 16, b);
        mma::mma_bf16(s[0], a0, b[0], b[1]);
        mma::mma_bf16(s[0], a1, b[2], b[3]);
      }
    } else {
#pragma unroll(kQkUnroll)
      for (int kc = 0; kc < R::kChunks; kc += 2) {
        u32 a[4];
        mma::ldsm_x4(q_addr + kc * 16, a);
#pragma unroll
        for (int j = 0; j < kNT; j += 2) {
          u32 b[4];
          mma::ldsm_x4(k_addr + j * 8 * R::kBytes + kc * 16, b);
          mma::mma_bf16(s[j], a, b[0], b[1]);
          mma::mma_bf16(s[j + 1], a, b[2], b[3]);
        }
      }
    }
  }

  // From S: the online softmax, P into shared memory and O rescaled (the flags of
  // the warp's tokens come from `tile`); ends at a consumer barrier.
  NSA_DEVICE void softmax_p(u8* smem, const StepTile& tile, float (&s)[kNT][4], float c_scale) {
    float* rd = red(smem);
    // Scale into the log2 domain, mask invalid tokens, row max across the warps.
    const u8* flags = (half ? tile.flags_hi : tile.flags_lo) + tok0 % kHalfTokens;  // the warp's first token
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = flags[j * 8 + 2 * t + (e & 1)] ? s[j][e] * c_scale : neg_inf();
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
      rd[nw * kHT + mw * 16 + g] = mx[0];
      rd[nw * kHT + mw * 16 + g + 8] = mx[1];
    }
    mma::bar_sync(kBarConsumers, kConsumerThreads);
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m_blk = rd[mw * 16 + g + 8 * h];
#pragma unroll
      for (int w = 1; w < kNW; ++w) m_blk = fmax2(m_blk, rd[w * kHT + mw * 16 + g + 8 * h]);
      const float m_new = fmax2(m_run[h], m_blk);
      alpha[h] = mma::exp2_approx(m_run[h] - m_new);
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }

    // P = exp2(S - m) as bf16 into shared memory (the A operand of P V).
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      u32 lo, hi;
      exp_pack(s[j][0], s[j][1], s[j][2], s[j][3], m_run, l_run, lo, hi);
      const u32 col = tok0 + j * 8 + 2 * t;
      const u32 r0 = mw * 16 + g;
      *reinterpret_cast<u32*>(smem + L::kP + r0 * kPRowBytes + col * 2) = lo;
      *reinterpret_cast<u32*>(smem + L::kP + (r0 + 8) * kPRowBytes + col * 2) = hi;
    }
    rescale(o, alpha);
    mma::bar_sync(kBarConsumers, kConsumerThreads);
  }

  // O += P V for 16 heads x kDimsPerWarp dims, over both token halves of `tile`.
  NSA_DEVICE void pv(const StepTile& tile) {
#pragma unroll(kFullUnroll ? 4 : 1)
    for (int kt = 0; kt < kBlockTokens; kt += 16) {
      u32 a[4];
      mma::ldsm_x4(p_addr + kt * 2, a);
      const u32 v_addr = (kt < kHalfTokens ? tile.lo : tile.hi) + v_off + (kt % kHalfTokens) * R::kBytes;
#pragma unroll
      for (int j = 0; j < kNV; j += 2) {
        u32 b[4];
        mma::ldsm_x4_trans(v_addr + j * 16, b);
        mma::mma_bf16(o[j], a, b[0], b[1]);
        mma::mma_bf16(o[j + 1], a, b[2], b[3]);
      }
    }
  }

  // kSplitK: partial S of this warp's dims quarter and 32 tokens (the token half at
  // `kbuf`), in registers.
  static constexpr int kSplitTiles = kSplitTokens / 8;
  NSA_DEVICE void qk_partial(u32 kbuf, float (&ps)[kSplitTiles][4]) const {
#pragma unroll
    for (int j = 0; j < kSplitTiles; ++j) ps[j][0] = ps[j][1] = ps[j][2] = ps[j][3] = 0.0f;
    const u32 k_addr = kbuf + ks_off;
#pragma unroll
    for (int ks = 0; ks < kQSteps; ++ks) {
#pragma unroll
      for (int j = 0; j < kSplitTiles; j += 2) {
        u32 b[4];
        mma::ldsm_x4(k_addr + j * 8 * R::kBytes + ks * 32, b);
        mma::mma_bf16(ps[j], qf[ks], b[0], b[1]);
        mma::mma_bf16(ps[j + 1], qf[ks], b[2], b[3]);
      }
    }
  }

  // kSplitK: the quarters' partial S meet in shared memory (a consumer barrier);
  // returns the full S of the warp's 8 tokens (tok0, the kNT == 1 layout).
  NSA_DEVICE void meet(const float (&ps)[kSplitTiles][4], float (&s0)[4]) const {
    static_assert(kSplitTiles == 4, "meet_quarters takes 4 n8 tiles");
    meet_quarters(part_at, base + L::kPart + (tok0 + 2 * t) * 4, ps, g, s0);
  }

  // Full row sums of rows g and g + 8 (across the quad, then across the warps
  // sharing the m-tile); every consumer thread must call it.
  NSA_DEVICE void row_sums(u8* smem, float (&l_tot)[2]) {
    float* rd = red(smem);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_run[h] += shfl_xor(l_run[h], 1);
      l_run[h] += shfl_xor(l_run[h], 2);
    }
    if (t == 0) {
      rd[nw * kHT + mw * 16 + g] = l_run[0];
      rd[nw * kHT + mw * 16 + g + 8] = l_run[1];
    }
    mma::bar_sync(kBarConsumers, kConsumerThreads);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_tot[h] = 0.0f;
#pragma unroll
      for (int w = 0; w < kNW; ++w) l_tot[h] += rd[w * kHT + mw * 16 + g + 8 * h];
    }
  }

  // This thread's output columns of head-row g + 8 h, scaled by `inv`, as bf16 to
  // `dst` (the head's [512] output row). kStream: evict-first stores (prefill's
  // large output must not push its KV out of L2; decode keeps plain stores, which
  // ptxas schedules without spilling at the 128-register cap).
  template <bool kStream = false>
  NSA_DEVICE void store_bf16(u16* dst, int h, float inv) const {
    dst += d0 + 2 * t;
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
      const u32 v = mma::pack_bf16x2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
      if (kStream)
        mma::stg_stream_u32(dst + j * 8, v);
      else
        *reinterpret_cast<u32*>(dst + j * 8) = v;
    }
  }

  // As store_bf16, in f32 (split partials).
  NSA_DEVICE void store_f32(float* dst, int h, float inv) const {
    dst += d0 + 2 * t;
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
      Vec8 v;
      v.w[0] = f32_as_u32(o[j][2 * h] * inv);
      v.w[1] = f32_as_u32(o[j][2 * h + 1] * inv);
      *reinterpret_cast<Vec8*>(dst + j * 8) = v;
    }
  }
};

}  // namespace attend
}  // namespace nsa
