// Dense causal varlen attention (the MHA one-shot prefill, spec §5.1) without matrix
// instructions, for targets nsa has no MMA kernel for (gfx942): one CTA of 64
// threads per (64 query rows of a sequence, head), one query row per thread. Q rows
// and blocks of 32 K and V rows are staged in shared memory as bf16; each thread
// takes its row's 32 scores of a block (kept in shared memory: loops over keys stay
// rolled, which keeps the compile short), one online-softmax update per block, and
// accumulates P V in f32 registers (P is not rounded to bf16). Semantics,
// parameters and outputs as dense_prefill.cuh.
#pragma once
#include "nsa/attention/dense_common.cuh"

namespace nsa {
namespace dense_scalar {

using dense::Params;

constexpr int kRows = 64;  // query rows per CTA, one per thread
constexpr int kKeys = 32;  // keys per block
constexpr int kThreads = kRows;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Running max start: finite, so exp2(m_old - m_new) never sees -inf - -inf.
constexpr float kMaxInit = -1e30f;

// Q rows padded by one bf16 pair, so threads reading their own rows at the same
// column hit distinct banks; K and V rows unpadded (every thread reads the same one);
// the scores of a block, key-major (thread t's score of key j at j * kRows + t).
template <int kDqk, int kDv>
struct Smem {
  static constexpr u32 kQStride = kDqk + 2;  // bf16 elements
  static constexpr u32 kQ = 0;
  static constexpr u32 kK = kQ + kRows * kQStride * 2;
  static constexpr u32 kV = kK + kKeys * kDqk * 2;
  static constexpr u32 kS = kV + kKeys * kDv * 2;
  static constexpr u32 kBytes = kS + kKeys * kRows * 4;
};

NSA_DEVICE float lo_f32(u32 pair) { return u32_as_f32(pair << 16); }
NSA_DEVICE float hi_f32(u32 pair) { return u32_as_f32(pair & 0xffff0000u); }

// Rows [0, valid) of `count` rows of kDim bf16 (`stride` elements apart) into
// shared memory `dst_stride` elements apart, zeros for the rest; two bf16 per copy.
template <int kDim>
NSA_DEVICE void stage_rows(u16* dst, u32 dst_stride, const u16* src, i64 stride, i32 valid, u32 count) {
  constexpr u32 kPairs = kDim / 2;
  for (u32 i = thread_x(); i < count * kPairs; i += kThreads) {
    const u32 r = i / kPairs, c = i % kPairs;
    u32 v = 0u;
    if ((i32)r < valid) v = reinterpret_cast<const u32*>(src + (i64)r * stride)[c];
    reinterpret_cast<u32*>(dst + r * dst_stride)[c] = v;
  }
}

template <int kHeads, int kDqk, int kDv>
NSA_DEVICE void dense_prefill(const Params& p, u32* status) {
  static_assert(kDqk % 2 == 0 && kDv % 2 == 0, "head dims: bf16 pairs");
  typedef Smem<kDqk, kDv> L;
  const u32 bid = block_x();
  const i32 tile = (i32)(bid % (u32)p.row_tiles);
  const i32 head = (i32)((bid / (u32)p.row_tiles) % (u32)kHeads);
  const i32 seq = (i32)(bid / ((u32)p.row_tiles * (u32)kHeads));
  if (seq >= p.batch) return;
  dense::SeqTile st;
  if (!dense::seq_tile<kRows>(p, seq, tile, head, thread_x() == 0, status, st)) return;

  extern NSA_SHARED u32 smem[];
  u16* const sq = reinterpret_cast<u16*>(reinterpret_cast<u8*>(smem) + L::kQ);
  u16* const sk = reinterpret_cast<u16*>(reinterpret_cast<u8*>(smem) + L::kK);
  u16* const sv = reinterpret_cast<u16*>(reinterpret_cast<u8*>(smem) + L::kV);
  float* const ss = reinterpret_cast<float*>(reinterpret_cast<u8*>(smem) + L::kS) + thread_x();
  const i64 qk_stride = (i64)kHeads * kDqk, v_stride = (i64)kHeads * kDv;
  stage_rows<kDqk>(sq, L::kQStride, p.q + (i64)(st.q0 + st.row0) * qk_stride + (i64)head * kDqk, qk_stride,
                   st.lq - st.row0, kRows);

  const u32 tid = thread_x();
  const i32 row = st.row0 + (i32)tid;  // this thread's query row in the sequence
  const i32 last = st.shift + row;     // the last key it sees
  const u32* q_row = reinterpret_cast<const u32*>(sq + tid * L::kQStride);
  const float c_scale = p.sm_scale * kLog2e;
  const float neg_inf = u32_as_f32(0xff800000u);
  float o[kDv];
#pragma unroll
  for (int d = 0; d < kDv; ++d) o[d] = 0.0f;
  float m_run = kMaxInit, l_run = 0.0f;

  for (i32 key0 = 0; key0 < st.key_end; key0 += kKeys) {
    sync_block();  // Q staged; the previous block's K and V read by every thread
    const i64 first = (i64)(st.k0 + key0);
    stage_rows<kDqk>(sk, kDqk, p.k + first * qk_stride + (i64)head * kDqk, qk_stride, st.lk - key0, kKeys);
    stage_rows<kDv>(sv, kDv, p.v + first * v_stride + (i64)head * kDv, v_stride, st.lk - key0, kKeys);
    sync_block();
    float mx = neg_inf;
#pragma unroll 1
    for (int j = 0; j < kKeys; ++j) {
      const u32* k_row = reinterpret_cast<const u32*>(sk + j * kDqk);
      float acc = 0.0f;
#pragma unroll 8
      for (int c = 0; c < kDqk / 2; ++c) {
        const u32 qp = q_row[c], kp = k_row[c];
        acc += lo_f32(qp) * lo_f32(kp) + hi_f32(qp) * hi_f32(kp);
      }
      const i32 key = key0 + j;
      const float x = key <= last && key < st.lk ? acc * c_scale : neg_inf;
      ss[j * kRows] = x;
      mx = mx > x ? mx : x;
    }
    const float m_new = m_run > mx ? m_run : mx;
    const float alpha = exp2_fast(m_run - m_new);
    m_run = m_new;
    l_run *= alpha;
#pragma unroll
    for (int d = 0; d < kDv; ++d) o[d] *= alpha;
#pragma unroll 1
    for (int j = 0; j < kKeys; ++j) {
      const float pj = exp2_fast(ss[j * kRows] - m_new);
      l_run += pj;
      const u32* v_row = reinterpret_cast<const u32*>(sv + j * kDv);
#pragma unroll
      for (int c = 0; c < kDv / 2; ++c) {
        const u32 vp = v_row[c];
        o[2 * c] += pj * lo_f32(vp);
        o[2 * c + 1] += pj * hi_f32(vp);
      }
    }
  }

  if (row >= st.lq) return;
  const i64 out_row = (i64)(st.q0 + row) * kHeads + head;
  const bool empty = !(l_run > 0.0f);
  const float inv = empty ? 0.0f : 1.0f / l_run;
  u32* out = reinterpret_cast<u32*>(p.out + out_row * kDv);
#pragma unroll
  for (int c = 0; c < kDv / 2; ++c)
    out[c] = (u32)f32_to_bf16(o[2 * c] * inv) | ((u32)f32_to_bf16(o[2 * c + 1] * inv) << 16);
  p.lse[out_row] = empty ? u32_as_f32(0x7f800000u) : (m_run + log2_fast(l_run)) * kLn2;
}

}  // namespace dense_scalar
}  // namespace nsa
