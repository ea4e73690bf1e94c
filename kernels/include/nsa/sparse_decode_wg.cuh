// Sparse MLA decode over the FP8-656 cache with warp-group MMA (sm_90a, playbook
// stage D3), for head counts that are a multiple of 64: one CTA per (query row,
// 64-head tile, KV split), three warp groups with their own register budgets:
//   WG0: S = Q K^T (wgmma m64n64k16, both operands in shared memory), masking,
//        online softmax, P to shared memory, O[:, 0:256] += P V (A = P from
//        registers);
//   WG1: O[:, 256:512] += P V (A = P from shared memory), rescaled by WG0's factors;
//   WG2: the producer: gathers and dequantizes two tokens per thread per step
//        (sparse_decode.cuh) into the double-buffered K/V tile.
// Q, K/V and P tiles use the no-swizzle core-matrix layout (`Interleaved64`): the
// same K/V bytes are the K-major B operand of Q K^T and the MN-major B operand of
// P V. Outputs and split partials are those of the mma.sync kernel.
#pragma once
#include "nsa/cuda/wgmma.cuh"
#include "nsa/sparse_decode.cuh"

namespace nsa {
namespace decode_wg {

using namespace decode;

constexpr int kHT = 64;               // heads per CTA: the wgmma M
constexpr int kGroupThreads = 128;    // one warp group
constexpr int kConsumerThreads = 2 * kGroupThreads;
constexpr int kThreads = 3 * kGroupThreads;
constexpr int kTokensPerPass = kGroupThreads / kPartsPerToken;  // 32: two passes per 64-token step
// setmaxnreg budgets. The CTA is launched with 168 registers per thread (64K / 384,
// rounded down to 8) and setmaxnreg only moves registers between its warp groups:
// an increase that the decreases do not cover waits forever. WG0 holds S and half
// of O, WG1 half of O, the producer two gathered tokens.
constexpr int kLaunchRegs = 168;
constexpr int kRegsWg0 = 200;
constexpr int kRegsWg1 = 160;
constexpr int kRegsProducer = 144;
static_assert(kRegsWg0 + kRegsWg1 + kRegsProducer <= 3 * kLaunchRegs, "setmaxnreg moves registers, never adds");

// 64-row tile as core matrices: 16-byte chunk c of row r at c * 1024 + r * 16.
struct Interleaved64 {
  static constexpr u32 kChunkBytes = kHT * 16;
  static NSA_DEVICE u32 offset(u32 r, u32 c) { return c * kChunkBytes + r * 16; }
};
constexpr u32 kRowTileBytes = kDqk / 8 * Interleaved64::kChunkBytes;  // 64 rows x 576
constexpr u32 kK16Bytes = 2 * Interleaved64::kChunkBytes;           // one k16 slice of a K-major tile
constexpr u32 kTok16Bytes = 16 * 16;                                // 16 tokens of an MN-major V slice
constexpr u32 kVHalfBytes = 32 * Interleaved64::kChunkBytes;        // 256 output dims

// Named barriers beyond attend's full/empty pair (ids 1..4).
constexpr u32 kBarPReady = 5;  // WG0 -> WG1: P and the rescale factors are in shared memory
constexpr u32 kBarPFree = 6;   // WG1 -> WG0: WG1's P V has read them
constexpr u32 kBarFinal = 7;   // WG0 -> WG1: final row max and sums

struct Smem {
  static constexpr u32 kQ = 0;
  static constexpr u32 kK = kQ + kRowTileBytes;
  static constexpr u32 kP = kK + 2 * kRowTileBytes;  // [64 heads][64 tokens] bf16
  static constexpr u32 kAlpha = kP + 8 * Interleaved64::kChunkBytes;
  static constexpr u32 kRowMax = kAlpha + kHT * 4;
  static constexpr u32 kRowSum = kRowMax + kHT * 4;
  static constexpr u32 kValid = kRowSum + kHT * 4;
  static constexpr u32 kBytes = kValid + 2 * kBlockTokens;
};

// Descriptors of the three operand kinds.
// K-major (Q, K, P: 8 rows of a core matrix are 8 heads or tokens; the next 8 dims
// are a chunk further) and MN-major V (8 rows are 8 tokens; the next 8 dims are a
// chunk further).
NSA_DEVICE u64 k_major(u32 addr) { return wg::desc(addr, Interleaved64::kChunkBytes, 128); }
NSA_DEVICE u64 mn_major_v(u32 addr) { return wg::desc(addr, 128, Interleaved64::kChunkBytes); }

// Per-thread accumulator coordinates: rows r0 and r0 + 8 of the 64-head tile,
// columns 8 i + 2 t (+1).
struct Lane {
  u32 r0, t;
  NSA_DEVICE explicit Lane(u32 tid) : r0(16 * (tid / 32) + (tid % 32) / 4), t(tid % 4) {}
};

NSA_DEVICE void scale_rows(float (&o)[128], float a0, float a1) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j] *= a0;
    o[4 * j + 1] *= a0;
    o[4 * j + 2] *= a1;
    o[4 * j + 3] *= a1;
  }
}

// WG0: scores, softmax, the left half of the output.
NSA_DEVICE void run_wg0(u8* smem, u32 base, i32 steps, float c_scale, const Lane& ln, float (&o)[128],
                        float (&m_run)[2], float (&l_run)[2]) {
  const u64 q_desc = k_major(base + Smem::kQ);
  float* alpha_s = reinterpret_cast<float*>(smem + Smem::kAlpha);
  for (i32 step = 0; step < steps; ++step) {
    const u32 buf = step & 1;
    const u32 kbuf = base + Smem::kK + buf * kRowTileBytes;
    mma::bar_sync(kBarFull + buf, kThreads);

    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    const u64 k_desc = k_major(kbuf);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kDqk / 16; ++ks)
      wg::mma_m64n64k16_ss<0>(s, wg::desc_advance(q_desc, ks * kK16Bytes), wg::desc_advance(k_desc, ks * kK16Bytes), true);
    wg::commit();
    wg::wait<0>();
    wg::pin(s);

    // Log2-domain scores, invalid tokens masked, row max over the quad.
    const u8* flags = smem + Smem::kValid + buf * kBlockTokens;
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = flags[8 * i + 2 * ln.t + (e & 1)] ? s[4 * i + e] * c_scale : neg_inf();
        s[4 * i + e] = x;
        mx[e >> 1] = fmax2(mx[e >> 1], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmax2(mx[h], shfl_xor(mx[h], 1));
      mx[h] = fmax2(mx[h], shfl_xor(mx[h], 2));
      const float m_new = fmax2(m_run[h], mx[h]);
      alpha[h] = mma::exp2_approx(m_run[h] - m_new);
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }
    // P = exp2(S - m) as bf16: registers (this group's A operand) and shared memory (WG1's).
    u32 pa[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float p0 = mma::exp2_approx(s[4 * i] - m_run[0]);
      const float p1 = mma::exp2_approx(s[4 * i + 1] - m_run[0]);
      const float p2 = mma::exp2_approx(s[4 * i + 2] - m_run[1]);
      const float p3 = mma::exp2_approx(s[4 * i + 3] - m_run[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      pa[2 * i] = mma::pack_bf16x2(p0, p1);
      pa[2 * i + 1] = mma::pack_bf16x2(p2, p3);
    }
    if (step > 0) mma::bar_sync(kBarPFree, kConsumerThreads);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      u8* chunk = smem + Smem::kP + i * Interleaved64::kChunkBytes + 4 * ln.t;
      *reinterpret_cast<u32*>(chunk + ln.r0 * 16) = pa[2 * i];
      *reinterpret_cast<u32*>(chunk + (ln.r0 + 8) * 16) = pa[2 * i + 1];
    }
    if (ln.t == 0) {
      alpha_s[ln.r0] = alpha[0];
      alpha_s[ln.r0 + 8] = alpha[1];
    }
    wg::fence_proxy_async();
    mma::bar_arrive(kBarPReady, kConsumerThreads);

    scale_rows(o, alpha[0], alpha[1]);
    const u64 v_desc = mn_major_v(kbuf);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      // Tokens 16 ks .. 16 ks + 15: n8 tiles 2 ks and 2 ks + 1 of S, rows r0 and r0 + 8.
      const u32 a[4] = {pa[4 * ks], pa[4 * ks + 1], pa[4 * ks + 2], pa[4 * ks + 3]};
      wg::mma_m64n256k16_rs<1>(o, a, wg::desc_advance(v_desc, ks * kTok16Bytes), true);
    }
    wg::commit();
    wg::wait<0>();
    wg::pin(o);
    if (step + 2 < steps) mma::bar_arrive(kBarEmpty + buf, kThreads);
  }
}

// WG1: the right half of the output, from WG0's P and rescale factors.
NSA_DEVICE void run_wg1(u8* smem, u32 base, i32 steps, const Lane& ln, float (&o)[128]) {
  const float* alpha_s = reinterpret_cast<const float*>(smem + Smem::kAlpha);
  const u64 p_desc = k_major(base + Smem::kP);
  for (i32 step = 0; step < steps; ++step) {
    const u32 buf = step & 1;
    const u32 vbuf = base + Smem::kK + buf * kRowTileBytes + kVHalfBytes;
    mma::bar_sync(kBarFull + buf, kThreads);
    mma::bar_sync(kBarPReady, kConsumerThreads);
    scale_rows(o, alpha_s[ln.r0], alpha_s[ln.r0 + 8]);
    const u64 v_desc = mn_major_v(vbuf);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wg::mma_m64n256k16_ss<1>(o, wg::desc_advance(p_desc, ks * kK16Bytes), wg::desc_advance(v_desc, ks * kTok16Bytes),
                               true);
    wg::commit();
    wg::wait<0>();
    wg::pin(o);
    if (step + 1 < steps) mma::bar_arrive(kBarPFree, kConsumerThreads);
    if (step + 2 < steps) mma::bar_arrive(kBarEmpty + buf, kThreads);
  }
}

// WG2: two tokens per thread per step (token and token + 32), prefetched one step
// ahead in registers.
template <int kTopk, int kPage>
NSA_DEVICE void produce_pairs(const Params& p, u32 k_base, u8* valid_flags, i64 row, i32 first, i32 last, i32 steps,
                        bool report, u32* status) {
  const u32 ptid = thread_x() - kConsumerThreads;
  const u32 token = ptid / kPartsPerToken, part = ptid % kPartsPerToken;
  report = report && part == 0;
  // Two named gathers rather than an array: ptxas keeps them in registers.
  const u32 tok1 = token + kTokensPerPass;
  Gather g0, g1;
  issue_gather<kPage>(p, slot_at<kTopk>(p, row, first + (i32)token, last, report, status), part, g0);
  issue_gather<kPage>(p, slot_at<kTopk>(p, row, first + (i32)tok1, last, report, status), part, g1);
  i32 next0 = -1, next1 = -1;
  if (steps > 1) {
    next0 = slot_at<kTopk>(p, row, first + kBlockTokens + (i32)token, last, report, status);
    next1 = slot_at<kTopk>(p, row, first + kBlockTokens + (i32)tok1, last, report, status);
  }
  for (i32 step = 0; step < steps; ++step) {
    const u32 buf = step & 1;
    if (step >= 2) mma::bar_sync(kBarEmpty + buf, kThreads);
    const u32 kbuf = k_base + buf * kRowTileBytes;
    store_gather<Interleaved64>(g0, kbuf, valid_flags + buf * kBlockTokens, token, part);
    store_gather<Interleaved64>(g1, kbuf, valid_flags + buf * kBlockTokens, tok1, part);
    wg::fence_proxy_async();
    mma::bar_arrive(kBarFull + buf, kThreads);
    if (step + 1 < steps) {
      issue_gather<kPage>(p, next0, part, g0);
      issue_gather<kPage>(p, next1, part, g1);
      const i32 pos = first + (step + 2) * kBlockTokens;
      next0 = step + 2 < steps ? slot_at<kTopk>(p, row, pos + (i32)token, last, report, status) : -1;
      next1 = step + 2 < steps ? slot_at<kTopk>(p, row, pos + (i32)tok1, last, report, status) : -1;
    }
  }
}

// This thread's output columns d0 + 8 j + 2 t of head-row r0 + 8 h: bf16 (splits == 1)
// or f32 partials.
NSA_DEVICE void store_out(const Params& p, i64 row, i32 split, u32 head, u32 d0, const Lane& ln,
                          const float (&o)[128], int h, float inv, int heads) {
  if (p.splits == 1) {
    u16* dst = p.out + (row * heads + head) * kDv + d0 + 2 * ln.t;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<u32*>(dst + j * 8) = mma::pack_bf16x2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
  } else {
    float* dst = p.o_part + ((row * p.splits + split) * heads + head) * kDv + d0 + 2 * ln.t;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      Vec8 v;
      v.w[0] = f32_as_u32(o[4 * j + 2 * h] * inv);
      v.w[1] = f32_as_u32(o[4 * j + 2 * h + 1] * inv);
      *reinterpret_cast<Vec8*>(dst + j * 8) = v;
    }
  }
}

template <int kHeads, int kTopk, int kPage>
NSA_DEVICE void sparse_decode(const Params& p, u32* status) {
  static_assert(kHeads % kHT == 0, "the warp-group kernel takes whole 64-head tiles");
  static_assert(kTopk % kBlockTokens == 0, "top-k is a multiple of 64");
  constexpr int kHeadTiles = kHeads / kHT;

  extern NSA_SHARED Vec16 smem_vec[];
  u8* smem = reinterpret_cast<u8*>(smem_vec);
  const u32 base = mma::smem_addr(smem);
  const u32 tid = thread_x();

  const u32 bid = block_x();
  const u32 ht = bid % kHeadTiles;
  const i64 row = (bid / kHeadTiles) / (u32)p.splits;
  const i32 split = (i32)((bid / kHeadTiles) % (u32)p.splits);
  if (row >= p.rows) return;

  const i32 valid_len = row_topk_len<kTopk>(p.topk_length, row);
  const i32 first = split * p.blocks_per_split * kBlockTokens;
  i32 last = first + p.blocks_per_split * kBlockTokens;
  last = last < valid_len ? last : valid_len;
  const i32 steps = last > first ? (last - first + kBlockTokens - 1) / kBlockTokens : 0;

  // Q tile: global reads along each head's row, one 16-byte chunk per thread.
  const u32 head0 = ht * kHT;
  const u16* q_row = p.q + (row * kHeads + head0) * kDqk;
  for (u32 i = tid; i < (u32)kHT * (kDqk / 8); i += kThreads) {
    const u32 r = i / (kDqk / 8), c = i % (kDqk / 8);
    mma::sts_v4(base + Smem::kQ + Interleaved64::offset(r, c), *reinterpret_cast<const Vec16*>(q_row + r * kDqk + c * 8));
  }
  wg::fence_proxy_async();
  sync_block();

  const u32 group = tid / kGroupThreads;
  if (group == 2) {
    wg::regs_dec<kRegsProducer>();
    if (steps > 0) produce_pairs<kTopk, kPage>(p, base + Smem::kK, smem + Smem::kValid, row, first, last, steps, ht == 0, status);
    return;
  }

  const Lane ln(tid % kGroupThreads);
  float* row_max = reinterpret_cast<float*>(smem + Smem::kRowMax);
  float* row_sum = reinterpret_cast<float*>(smem + Smem::kRowSum);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m_run[2] = {kMaxInit, kMaxInit}, l_tot[2] = {0.0f, 0.0f};
  if (group == 0) {
    wg::regs_inc<kRegsWg0>();
    run_wg0(smem, base, steps, p.sm_scale * kLog2e, ln, o, m_run, l_tot);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_tot[h] += shfl_xor(l_tot[h], 1);
      l_tot[h] += shfl_xor(l_tot[h], 2);
    }
    if (ln.t == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[ln.r0 + 8 * h] = m_run[h];
        row_sum[ln.r0 + 8 * h] = l_tot[h];
      }
    }
    mma::bar_arrive(kBarFinal, kConsumerThreads);
  } else {
    wg::regs_dec<kRegsWg1>();
    run_wg1(smem, base, steps, ln, o);
    mma::bar_sync(kBarFinal, kConsumerThreads);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_run[h] = row_max[ln.r0 + 8 * h];
      l_tot[h] = row_sum[ln.r0 + 8 * h];
    }
  }

  const u32 d0 = group * (kDv / 2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const u32 head = head0 + ln.r0 + 8 * h;
    const bool empty = !(l_tot[h] > 0.0f);
    store_out(p, row, split, head, d0, ln, o, h, empty ? 0.0f : 1.0f / l_tot[h], kHeads);
    if (group != 0 || ln.t != 0) continue;
    if (p.splits == 1)
      p.lse[row * kHeads + head] = empty ? pos_inf() : (m_run[h] + mma::log2_approx(l_tot[h])) * kLn2;
    else
      p.lse_part[(row * p.splits + split) * kHeads + head] = empty ? neg_inf() : m_run[h] + mma::log2_approx(l_tot[h]);
  }
}

}  // namespace decode_wg
}  // namespace nsa
