// The online softmax step the attention kernels share, in the log2 domain over an
// mma m16n8 accumulator layout (lane: rows g and g + 8 of its quad, columns 2t and
// 2t + 1): the running max and its rescale factor, P = exp2(S - m) packed to bf16
// with the row sums, and the rescale of the output accumulators.
#pragma once
#include "nsa/cuda/mma.cuh"

namespace nsa {
namespace softmax {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Running max start: finite, so exp2(m_old - m_new) never sees -inf - -inf.
constexpr float kMaxInit = -1e30f;
NSA_DEVICE float neg_inf() { return u32_as_f32(0xff800000u); }
NSA_DEVICE float pos_inf() { return u32_as_f32(0x7f800000u); }
NSA_DEVICE float fmax2(float a, float b) { return a > b ? a : b; }

// This lane's block maxima `mx` of its two rows, over the quad that shares them,
// joined to the running max; `alpha` rescales what was accumulated before (the row
// sums here, the outputs with `rescale`).
NSA_DEVICE void update_max(float (&mx)[2], float (&m_run)[2], float (&l_run)[2], float (&alpha)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmax2(mx[h], shfl_xor(mx[h], 1));
    mx[h] = fmax2(mx[h], shfl_xor(mx[h], 2));
    const float m_new = fmax2(m_run[h], mx[h]);
    alpha[h] = mma::exp2_approx(m_run[h] - m_new);
    m_run[h] = m_new;
    l_run[h] *= alpha[h];
  }
}

// P of one accumulator tile `s` (rows g: s0, s1; g + 8: s2, s3) against the running
// max: added to the row sums, returned as bf16 pairs for rows g (`lo`) and g + 8 (`hi`).
NSA_DEVICE void exp_pack(float s0, float s1, float s2, float s3, const float (&m_run)[2], float (&l_run)[2], u32& lo,
                         u32& hi) {
  const float p0 = mma::exp2_approx(s0 - m_run[0]);
  const float p1 = mma::exp2_approx(s1 - m_run[0]);
  const float p2 = mma::exp2_approx(s2 - m_run[1]);
  const float p3 = mma::exp2_approx(s3 - m_run[1]);
  l_run[0] += p0 + p1;
  l_run[1] += p2 + p3;
  lo = mma::pack_bf16x2(p0, p1);
  hi = mma::pack_bf16x2(p2, p3);
}

// The output accumulators of the lane's two rows times their rescale factors.
template <int kN>
NSA_DEVICE void rescale(float (&o)[kN][4], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    o[j][0] *= alpha[0];
    o[j][1] *= alpha[0];
    o[j][2] *= alpha[1];
    o[j][3] *= alpha[1];
  }
}

}  // namespace softmax
}  // namespace nsa
