// The consumer half of the warp-group (wgmma, sm_90a) sparse MLA kernels, playbook
// stage D3 (the decode kernel's; kept apart from its FP8 producer so a bf16
// prefill producer can reuse it, stage P2; the paired-block prefill kernel,
// sparse_prefill_pairs.cuh, shares its tiles and P V helpers but not this
// schedule). A CTA computes a 64-head tile:
//   WG0: S = Q K^T (wgmma m64n64k16, both operands in shared memory), masking,
//        online softmax, P to shared memory, O[:, 0:256] += P V (A = P from
//        registers);
//   WG1: O[:, 256:512] += P V (A = P from shared memory), rescaled by WG0's factors.
// The family's producer warp groups fill the double-buffered K/V tile and hand it
// over with attend's full/empty named barriers. Q and K/V tiles use the 128-byte
// swizzle layout (`Tile`): the same K/V bytes are the K-major B operand of Q K^T
// and the MN-major B operand of P V, a producer's 8 lanes copy one row's 128
// contiguous bytes without bank conflicts, and wgmma reads them conflict-free. P
// uses the no-swizzle core-matrix layout.
#pragma once
#include "nsa/cuda/wgmma.cuh"
#include "nsa/attention/sparse_attend.cuh"

namespace nsa {
namespace attend_wg {

using namespace attend;

constexpr int kHT = 64;             // heads per CTA: the wgmma M
constexpr int kGroupThreads = 128;  // one warp group
constexpr u32 kChunkBytes = kHT * 16;  // P: one 8-token chunk of 64 rows (no swizzle)
constexpr u32 kBlockBytes = kHT * 128;  // Q, K/V: 64 dims (128 bytes) of 64 rows

// 64-row tile of kDqk-wide bf16 rows in the 128-byte swizzle layout: dims
// 64 b .. 64 b + 63 of all rows form block b (kBlockBytes, 1024-byte aligned), row r
// at r * 128 in it, its 16-byte chunk c at (c ^ r % 8) * 16.
template <int kDqk>
struct Tile {
  static_assert(kDqk % 64 == 0, "whole 64-dim blocks");
  static constexpr u32 kTileBytes = kDqk / 64 * kBlockBytes;
  static NSA_DEVICE u32 offset(u32 r, u32 c) { return (c / 8) * kBlockBytes + wg::sw128_offset(r, c % 8); }
};
// Q K^T step ks (16 dims): the block, then 32 bytes further per step inside it.
NSA_DEVICE constexpr u32 qk_step_bytes(int ks) { return (ks / 4) * kBlockBytes + (ks % 4) * 32; }
constexpr u32 kP16Bytes = 2 * kChunkBytes;     // one k16 slice of the P tile
constexpr u32 kTok16Bytes = 2 * 1024;          // 16 tokens of the MN-major V view: two 8-row atoms
constexpr u32 kVHalfBytes = 4 * kBlockBytes;   // 256 output dims
constexpr u32 kVQuarterBytes = 2 * kBlockBytes;  // 128 output dims

// Named barriers beyond attend's full/empty pair (ids 1..4).
constexpr u32 kBarPReady = 5;  // WG0 -> WG1: P and the rescale factors are in shared memory
constexpr u32 kBarPFree = 6;   // WG1 -> WG0: WG1's P V has read them
constexpr u32 kBarFinal = 7;   // WG0 -> WG1: final row max and sums

// Shared memory: Q, two K/V tiles, P [64 heads][64 tokens] bf16, per-row rescale
// factors, max and sums, token validity flags.
template <int kDqk>
struct Smem {
  static constexpr u32 kQ = 0;
  static constexpr u32 kK = kQ + Tile<kDqk>::kTileBytes;
  static constexpr u32 kP = kK + 2 * Tile<kDqk>::kTileBytes;
  static constexpr u32 kAlpha = kP + 8 * kChunkBytes;
  static constexpr u32 kRowMax = kAlpha + kHT * 4;
  static constexpr u32 kRowSum = kRowMax + kHT * 4;
  static constexpr u32 kValid = kRowSum + kHT * 4;
  // The swizzle pattern follows address bits: the layout starts 1024-byte aligned.
  static constexpr u32 kBytes = kValid + 2 * kBlockTokens + 1024;
};

// The kernel's dynamic shared memory from its first 1024-byte aligned byte.
NSA_DEVICE u8* aligned_smem(Vec16* dynamic_smem) {
  u8* raw = reinterpret_cast<u8*>(dynamic_smem);
  return raw + ((1024u - mma::smem_addr(raw) % 1024u) % 1024u);
}

// Descriptors: Q and K are K-major swizzled tiles (8-row atoms 1024 bytes apart);
// V, the same bytes read MN-major, steps 1024 bytes per 8 tokens and a block per 64
// dims (golden-checked on the H200); P is K-major without swizzle (the 8 rows of
// a core matrix are 8 heads, the next 8 tokens a chunk further).
NSA_DEVICE u64 k_major(u32 addr) { return wg::desc_sw128(addr); }
NSA_DEVICE u64 mn_major_v(u32 addr) { return wg::desc_sw128(addr, kBlockBytes); }
NSA_DEVICE u64 p_major(u32 addr) { return wg::desc(addr, kChunkBytes, 128); }

// Per-thread accumulator coordinates: rows r0 and r0 + 8 of the 64-head tile,
// columns 8 i + 2 t (+1).
struct Lane {
  u32 r0, t;
  NSA_DEVICE explicit Lane(u32 tid) : r0(16 * (tid / 32) + (tid % 32) / 4), t(tid % 4) {}
};

// 64 consecutive head rows of Q (`q_heads`: the tile's first head) into the Q tile,
// by all kThreads threads: global reads along each head's row. Rows from `rows` on
// (a last tile past the head count) are zeros: their outputs are never stored.
template <int kDqk, int kThreads>
NSA_DEVICE void load_q(const u16* q_heads, u32 q_tile, u32 rows = kHT) {
  for (u32 i = thread_x(); i < (u32)kHT * (kDqk / 8); i += kThreads) {
    const u32 r = i / (kDqk / 8), c = i % (kDqk / 8);
    Vec16 v = {{0u, 0u, 0u, 0u}};
    if (r < rows) v = mma::ldg_stream_v4(q_heads + r * kDqk + c * 8);
    mma::sts_v4(q_tile + Tile<kDqk>::offset(r, c), v);
  }
  mma::fence_proxy_async();
}

// O[:, 0:256] of this group += P[:, 16 ks .. 16 ks + 15] V[16 ks .., 0:256], as two
// n128 halves: ptxas fits one wgmma's operands into the launch register budget,
// whatever setmaxnreg grants later (n256 fails to compile at 128 registers), and
// the 384-thread decode kernel was measured with the halves.
NSA_DEVICE float (&half_cols(float (&o)[128], int half))[64] { return *reinterpret_cast<float(*)[64]>(o + 64 * half); }

NSA_DEVICE void pv_rs(float (&o)[128], const u32 (&a)[4], u64 v_desc, int ks) {
#pragma unroll
  for (int half = 0; half < 2; ++half)
    wg::mma_m64n128k16_rs<1>(half_cols(o, half), a, wg::desc_advance(v_desc, ks * kTok16Bytes + half * kVQuarterBytes), true);
}

NSA_DEVICE void pv_ss(float (&o)[128], u64 p_desc, u64 v_desc, int ks) {
#pragma unroll
  for (int half = 0; half < 2; ++half)
    wg::mma_m64n128k16_ss<1>(half_cols(o, half), p_desc, wg::desc_advance(v_desc, ks * kTok16Bytes + half * kVQuarterBytes),
                             true);
}

NSA_DEVICE void scale_rows(float (&o)[128], float a0, float a1) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j] *= a0;
    o[4 * j + 1] *= a0;
    o[4 * j + 2] *= a1;
    o[4 * j + 3] *= a1;
  }
}

// A group's 256 output columns of head row r0 + 8 h (`o` as the group holds them),
// scaled by `inv`, into `dst` (the head's [512] output row) as bf16 (evict-first:
// a prefill's large output must not push its KV out of L2).
NSA_DEVICE void store_half_bf16(const float (&o)[128], u32 group, const Lane& ln, u16* dst, int h, float inv) {
  dst += group * (kDv / 2) + 2 * ln.t;
#pragma unroll
  for (int j = 0; j < 32; ++j)
    mma::stg_stream_u32(dst + j * 8, mma::pack_bf16x2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv));
}

// O (this group's 256 columns) += P V over one block: P from registers or from a
// P tile in shared memory, V's half at `vbuf` (its first column block).
NSA_DEVICE void pv_from_regs(float (&o)[128], const u32 (&pa)[16], u32 vbuf) {
  const u64 v_desc = mn_major_v(vbuf);
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const u32 a[4] = {pa[4 * ks], pa[4 * ks + 1], pa[4 * ks + 2], pa[4 * ks + 3]};
    pv_rs(o, a, v_desc, ks);
  }
  wg::commit();
}
NSA_DEVICE void pv_from_smem(float (&o)[128], u32 p_tile, u32 vbuf) {
  const u64 v_desc = mn_major_v(vbuf);
  const u64 p_desc = p_major(p_tile);
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) pv_ss(o, wg::desc_advance(p_desc, ks * kP16Bytes), v_desc, ks);
  wg::commit();
}

// Zeroed S, then S += Q K^T over the K tile at `kbuf` (committed, not waited for).
template <int kDqk>
NSA_DEVICE void issue_scores(float (&s)[32], u64 q_desc, u32 kbuf) {
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.0f;
  const u64 k_desc = k_major(kbuf);
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < kDqk / 16; ++ks)
    wg::mma_m64n64k16_ss<0>(s, wg::desc_advance(q_desc, qk_step_bytes(ks)), wg::desc_advance(k_desc, qk_step_bytes(ks)),
                            true);
  wg::commit();
}

// WG0: scores, softmax, the left half of the output.
template <int kDqk, int kThreads>
NSA_DEVICE void run_wg0(u8* smem, u32 base, i32 steps, float c_scale, const Lane& ln, float (&o)[128],
                        float (&m_run)[2], float (&l_run)[2]) {
  typedef Smem<kDqk> L;
  const u64 q_desc = k_major(base + L::kQ);
  float* alpha_s = reinterpret_cast<float*>(smem + L::kAlpha);
  for (i32 step = 0; step < steps; ++step) {
    const u32 buf = step & 1;
    const u32 kbuf = base + L::kK + buf * Tile<kDqk>::kTileBytes;
    mma::bar_sync(kBarFull + buf, kThreads);

    float s[32];
    issue_scores<kDqk>(s, q_desc, kbuf);
    // The previous step's P V was issued without a wait so that it overlaps this
    // Q K^T; groups retire in order, so once at most this one is pending that
    // buffer can go back to the producers while the scores finish.
    if (step >= 1) {
      wg::wait<1>();
      wg::pin(o);
      if (step + 1 < steps) mma::bar_arrive(kBarEmpty + (buf ^ 1), kThreads);
    }
    wg::wait<0>();
    wg::pin(s);

    // Log2-domain scores, invalid tokens masked, row max over the quad.
    const u8* flags = smem + L::kValid + buf * kBlockTokens;
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
    update_max(mx, m_run, l_run, alpha);
    // P = exp2(S - m) as bf16: registers (this group's A operand) and shared memory (WG1's).
    u32 pa[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) exp_pack(s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3], m_run, l_run, pa[2 * i], pa[2 * i + 1]);
    if (step > 0) mma::bar_sync(kBarPFree, kConsumerThreads);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      u8* chunk = smem + L::kP + i * kChunkBytes + 4 * ln.t;
      *reinterpret_cast<u32*>(chunk + ln.r0 * 16) = pa[2 * i];
      *reinterpret_cast<u32*>(chunk + (ln.r0 + 8) * 16) = pa[2 * i + 1];
    }
    if (ln.t == 0) {
      alpha_s[ln.r0] = alpha[0];
      alpha_s[ln.r0 + 8] = alpha[1];
    }
    mma::fence_proxy_async();
    mma::bar_arrive(kBarPReady, kConsumerThreads);

    scale_rows(o, alpha[0], alpha[1]);
    pv_from_regs(o, pa, kbuf);
  }
  wg::wait<0>();
  wg::pin(o);
}

// WG1: the right half of the output, from WG0's P and rescale factors.
template <int kDqk, int kThreads>
NSA_DEVICE void run_wg1(u8* smem, u32 base, i32 steps, const Lane& ln, float (&o)[128]) {
  typedef Smem<kDqk> L;
  const float* alpha_s = reinterpret_cast<const float*>(smem + L::kAlpha);
  const u64 p_desc = p_major(base + L::kP);
  for (i32 step = 0; step < steps; ++step) {
    const u32 buf = step & 1;
    const u32 vbuf = base + L::kK + buf * Tile<kDqk>::kTileBytes + kVHalfBytes;
    mma::bar_sync(kBarFull + buf, kThreads);
    mma::bar_sync(kBarPReady, kConsumerThreads);
    scale_rows(o, alpha_s[ln.r0], alpha_s[ln.r0 + 8]);
    const u64 v_desc = mn_major_v(vbuf);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) pv_ss(o, wg::desc_advance(p_desc, ks * kP16Bytes), v_desc, ks);
    wg::commit();
    wg::wait<0>();
    wg::pin(o);
    if (step + 1 < steps) mma::bar_arrive(kBarPFree, kConsumerThreads);
    if (step + 2 < steps) mma::bar_arrive(kBarEmpty + buf, kThreads);
  }
}

// The two consumer warp groups of a CTA of kThreads threads (consumers first).
// `run` sets the group's register budget, consumes `steps` buffers and leaves this
// thread's output columns in `o` and its rows' final max (log2 domain) and sum in
// `m` and `l`, the same in both groups.
template <int kDqk, int kThreads, int kLaunchRegs, int kRegsWg0, int kRegsWg1>
struct Consumers {
  u32 group;  // 0 or 1: output columns 256 group ..
  Lane ln;
  float o[128];
  float m[2], l[2];

  NSA_DEVICE explicit Consumers(u32 tid) : group(tid / kGroupThreads), ln(tid % kGroupThreads) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    m[0] = m[1] = kMaxInit;
    l[0] = l[1] = 0.0f;
  }

  NSA_DEVICE void run(u8* smem, u32 base, i32 steps, float c_scale) {
    typedef Smem<kDqk> L;
    float* row_max = reinterpret_cast<float*>(smem + L::kRowMax);
    float* row_sum = reinterpret_cast<float*>(smem + L::kRowSum);
    if (group == 0) {
      wg::regs_set<kLaunchRegs, kRegsWg0>();
      run_wg0<kDqk, kThreads>(smem, base, steps, c_scale, ln, o, m, l);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l[h] += shfl_xor(l[h], 1);
        l[h] += shfl_xor(l[h], 2);
        if (ln.t == 0) {
          row_max[ln.r0 + 8 * h] = m[h];
          row_sum[ln.r0 + 8 * h] = l[h];
        }
      }
      mma::bar_arrive(kBarFinal, kConsumerThreads);
    } else {
      wg::regs_set<kLaunchRegs, kRegsWg1>();
      run_wg1<kDqk, kThreads>(smem, base, steps, ln, o);
      mma::bar_sync(kBarFinal, kConsumerThreads);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m[h] = row_max[ln.r0 + 8 * h];
        l[h] = row_sum[ln.r0 + 8 * h];
      }
    }
  }

  // This thread's columns of head row r0 + 8 h, scaled by `inv`, into `dst` (the
  // head's [512] output row): bf16 (store_half_bf16) or f32 (decode split partials,
  // re-read by the combine).
  NSA_DEVICE void store_bf16(u16* dst, int h, float inv) const { store_half_bf16(o, group, ln, dst, h, inv); }

  NSA_DEVICE void store_f32(float* dst, int h, float inv) const {
    dst += group * (kDv / 2) + 2 * ln.t;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      Vec8 v;
      v.w[0] = f32_as_u32(o[4 * j + 2 * h] * inv);
      v.w[1] = f32_as_u32(o[4 * j + 2 * h + 1] * inv);
      *reinterpret_cast<Vec8*>(dst + j * 8) = v;
    }
  }
};

}  // namespace attend_wg
}  // namespace nsa
