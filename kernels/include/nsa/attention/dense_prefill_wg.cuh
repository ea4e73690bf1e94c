// Dense causal varlen attention (the MHA one-shot prefill, spec §5.1) with warp-group
// MMA (sm_90a): one CTA of three warp groups per (128 query rows of a sequence, head).
//   WG0, WG1 (consumers): 64 query rows each; per 128-key block S = Q K^T
//     (wgmma m64n128k16, Q and K from shared memory), causal mask, online softmax,
//     O += P V (wgmma m64n128k16, P from registers). A block's P V is issued
//     without a wait so that it overlaps the next block's Q K^T. The two groups
//     take turns issuing Q K^T (the turn barriers), so one's softmax runs while
//     the other's products keep the tensor cores busy.
//   WG2 (producer): copies K and V blocks into double-buffered tiles with 16-byte
//     cp.async (zeros past the sequence), K one block ahead of V. Each copy
//     signals an mbarrier when it lands (cp.async.mbarrier.arrive), so the
//     producer never waits for its own copies, only for a buffer to be given back
//     (the empty barriers: K after the block's Q K^T, V after its P V).
// CTAs of `pair_group` (sequence, head) pairs are interleaved, heaviest row tile
// first: the pairs in flight keep their K and V in L2 for every row tile that
// re-reads them, and a small grid is one group (longest tiles first overall).
// Q, K and V tiles use the 128-byte swizzle layout (dims 64 b .. 64 b + 63 of every
// row form block b; row r at r * 128 in it, its 16-byte chunk c at (c ^ r % 8) * 16):
// K is the K-major B operand of Q K^T, V the MN-major B operand of P V.
// Semantics, parameters and outputs as dense_prefill.cuh (the mma.sync kernel).
#pragma once
#include "nsa/attention/dense_prefill.cuh"
#include "nsa/cuda/bulk.cuh"
#include "nsa/cuda/wgmma.cuh"

namespace nsa {
namespace dense_wg {

using namespace softmax;
using dense::Params;

constexpr int kRowsWg = 64;             // query rows per consumer group: the wgmma M
constexpr int kRows = 2 * kRowsWg;      // query rows per CTA
constexpr int kKeys = 128;              // keys per block: the wgmma N of Q K^T
constexpr int kGroupThreads = 128;
constexpr int kConsumerThreads = 2 * kGroupThreads;
constexpr int kThreads = 3 * kGroupThreads;
// Named barriers (0 is sync_block): consumers -> producer, a buffer was read.
constexpr u32 kBarEmptyK = 1;  // + buffer
constexpr u32 kBarEmptyV = 3;  // + buffer
constexpr u32 kBarTurn = 5;    // + group: the other group issued its Q K^T, this one may
constexpr u32 kPairThreads = 2 * kGroupThreads;

// setmaxnreg budgets: launched with 64K / 384 registers per thread (168); the
// producer gives most of its share to the consumers.
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kRegsConsumer = 224;
constexpr int kRegsProducer = 56;
static_assert(2 * kRegsConsumer + kRegsProducer <= 3 * kLaunchRegs, "setmaxnreg moves registers, never adds");

// A swizzled tile of kR rows of kDim bf16.
template <int kR, int kDim>
struct Tile {
  static_assert(kDim % 64 == 0 && kR % 8 == 0, "whole 64-dim blocks and 8-row atoms");
  static constexpr u32 kBlockBytes = kR * 128;
  static constexpr u32 kBytes = kDim / 64 * kBlockBytes;
  static NSA_DEVICE u32 offset(u32 r, u32 c) { return (c / 8) * kBlockBytes + wg::sw128_offset(r, c % 8); }
  // Step ks (16 dims) of a K-major operand: the block, then 32 bytes per step inside it.
  static NSA_DEVICE constexpr u32 k_step(int ks) { return (ks / 4) * kBlockBytes + (ks % 4) * 32; }
};

template <int kDqk, int kDv>
struct Smem {
  typedef Tile<kRows, kDqk> Q;
  typedef Tile<kKeys, kDqk> K;
  typedef Tile<kKeys, kDv> V;
  static constexpr u32 kQ = 0;
  static constexpr u32 kK = kQ + Q::kBytes;
  static constexpr u32 kV = kK + 2 * K::kBytes;
  // mbarriers, producer -> consumers, a block landed: K of buffer 0, 1, V of 0, 1.
  static constexpr u32 kFull = kV + 2 * V::kBytes;
  // The swizzle follows address bits: the layout starts 1024-byte aligned.
  static constexpr u32 kBytes = kFull + 4 * 8 + 1024;
};

// Rows [0, valid) of a kR-row block of kDim-wide rows (`stride` elements apart in
// global memory) into a swizzled tile, zeros for the rest; by the producer group:
// eight lanes per row, each a 16-byte chunk of one 64-dim block.
template <int kR, int kDim>
NSA_DEVICE void copy_rows(u32 tile, const u16* src, i64 stride, i32 valid, u32 ptid, u64 policy) {
  typedef Tile<kR, kDim> T;
  const u32 c8 = ptid % 8;
#pragma unroll 4
  for (u32 r = ptid / 8; r < (u32)kR; r += kGroupThreads / 8) {
    const bool live = (i32)r < valid;
    const u16* row = src + (live ? (i64)r * stride : 0);
#pragma unroll
    for (int b = 0; b < kDim / 64; ++b) {
      const u32 chunk = b * 8 + c8;
      mma::cp_async_16_policy(tile + T::offset(r, chunk), row + chunk * 8, live ? 16u : 0u, policy);
    }
  }
}

template <int kHeads, int kDqk, int kDv>
NSA_DEVICE void dense_prefill(const Params& p, u32* status) {
  static_assert(kDqk % 64 == 0 && kDv == 128, "q/k: whole 64-dim blocks; v: one n128 wgmma");
  typedef Smem<kDqk, kDv> L;
  typedef typename L::Q TQ;
  typedef typename L::K TK;
  typedef typename L::V TV;

  // Groups of pair_group (sequence, head) pairs, each group's row tiles heaviest
  // first (a causal tile's work grows with its index).
  const u32 bid = block_x(), tiles = (u32)p.row_tiles;
  const u32 pairs = (u32)kHeads * (u32)p.batch, per_group = (u32)p.pair_group;
  const u32 first_pair = bid / (per_group * tiles) * per_group, in_group = bid % (per_group * tiles);
  const u32 group_pairs = pairs - first_pair < per_group ? pairs - first_pair : per_group;
  const i32 tile = (i32)tiles - 1 - (i32)(in_group / group_pairs);
  const u32 pair = first_pair + in_group % group_pairs;
  const i32 head = (i32)(pair % (u32)kHeads);
  const i32 seq = (i32)(pair / (u32)kHeads);
  if (tile < 0 || seq >= p.batch) return;
  dense::SeqTile st;
  if (!dense::seq_tile<kRows>(p, seq, tile, head, status, st)) return;
  // Plain copies: lambdas below capture them (structured bindings cannot be captured in C++17).
  const i32 q0 = st.q0, lq = st.lq, k0 = st.k0, lk = st.lk, row0 = st.row0, shift = st.shift, key_end = st.key_end;
  const i32 steps = (key_end + kKeys - 1) / kKeys;

  extern NSA_SHARED Vec16 smem_vec[];
  const u32 raw = mma::smem_addr(smem_vec);
  const u32 base = raw + (1024u - raw % 1024u) % 1024u;
  const u32 tid = thread_x();
  const i64 qk_stride = (i64)kHeads * kDqk, v_stride = (i64)kHeads * kDv;

  // Q: the tile's rows (zeros past the sequence) by every thread.
  {
    const u16* src = p.q + (i64)(q0 + row0) * qk_stride + (i64)head * kDqk;
    for (u32 i = tid; i < (u32)kRows * (kDqk / 8); i += kThreads) {
      const u32 r = i / (kDqk / 8), c = i % (kDqk / 8);
      Vec16 v = {{0u, 0u, 0u, 0u}};
      if ((i32)r < lq - row0) v = mma::ldg_stream_v4(src + r * qk_stride + c * 8);
      mma::sts_v4(base + L::kQ + TQ::offset(r, c), v);
    }
    mma::fence_proxy_async();
    if (tid == 0) {
      for (u32 b = 0; b < 4; ++b) bulk::mbar_init(base + L::kFull + 8 * b, kGroupThreads);
      bulk::mbar_init_fence();
    }
  }
  sync_block();
  const u32 full_k = base + L::kFull, full_v = full_k + 16;  // + 8 buffer

  if (tid >= (u32)kConsumerThreads) {
    // Producer: K of block 0, then per step K of the next block and V of this one,
    // each once its buffer is back (from block step - 2). Every lane arrives on the
    // block's mbarrier when its own copies land.
    wg::regs_set<kLaunchRegs, kRegsProducer>();
    const u32 ptid = tid - kConsumerThreads;
    const u64 keep = mma::l2_evict_last_policy();  // every row tile of the head re-reads K and V
    auto copy_k = [&](i32 step) {
      const u32 buf = step & 1;
      if (step >= 2) mma::bar_sync(kBarEmptyK + buf, kThreads);
      const i32 key0 = step * kKeys;
      copy_rows<kKeys, kDqk>(base + L::kK + buf * TK::kBytes, p.k + (i64)(k0 + key0) * qk_stride + (i64)head * kDqk,
                             qk_stride, lk - key0, ptid, keep);
      bulk::mbar_arrive_on_cp_async(full_k + 8 * buf);
    };
    if (steps > 0) copy_k(0);
    for (i32 step = 0; step < steps; ++step) {
      const u32 buf = step & 1;
      if (step + 1 < steps) copy_k(step + 1);
      if (step >= 2) mma::bar_sync(kBarEmptyV + buf, kThreads);
      const i32 key0 = step * kKeys;
      copy_rows<kKeys, kDv>(base + L::kV + buf * TV::kBytes, p.v + (i64)(k0 + key0) * v_stride + (i64)head * kDv,
                            v_stride, lk - key0, ptid, keep);
      bulk::mbar_arrive_on_cp_async(full_v + 8 * buf);
    }
    return;
  }

  // Consumers.
  wg::regs_set<kLaunchRegs, kRegsConsumer>();
  const u32 group = tid / kGroupThreads, gtid = tid % kGroupThreads;
  const u32 r0 = 16 * (gtid / 32) + (gtid % 32) / 4, t = gtid % 4;
  const i32 first_row = row0 + (i32)group * kRowsWg;  // of this group, in the sequence
  const i32 rows[2] = {first_row + (i32)r0, first_row + (i32)r0 + 8};
  const u64 q_desc = wg::desc_sw128(base + L::kQ + group * kRowsWg * 128);
  const float c_scale = p.sm_scale * kLog2e;
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m_run[2] = {kMaxInit, kMaxInit}, l_run[2] = {0.0f, 0.0f};
  // Group 0 issues first. Each group waits for its turn as often as the other
  // hands it one (steps times), so no arrival is left over at exit.
  if (group == 1 && steps > 0) mma::bar_arrive(kBarTurn, kPairThreads);

  for (i32 step = 0; step < steps; ++step) {
    const u32 buf = step & 1;
    const u32 kbuf = base + L::kK + buf * TK::kBytes, vbuf = base + L::kV + buf * TV::kBytes;
    const u32 parity = (u32)(step >> 1) & 1u;
    bulk::mbar_wait(full_k + 8 * buf, parity);
    mma::fence_proxy_async();  // the producer's cp.async writes, read by wgmma
    mma::bar_sync(kBarTurn + group, kPairThreads);

    float s[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = 0.0f;
    const u64 k_desc = wg::desc_sw128(kbuf);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kDqk / 16; ++ks) {
      wg::mma_m64n128k16_ss<0>(s, wg::desc_advance(q_desc, TQ::k_step(ks)), wg::desc_advance(k_desc, TK::k_step(ks)),
                               true);
    }
    wg::commit();
    if (group == 0 || step + 1 < steps) mma::bar_arrive(kBarTurn + (group ^ 1), kPairThreads);
    // The previous block's P V overlapped these scores; once it retires its buffer
    // goes back to the producer.
    if (step >= 1) {
      wg::wait<1>();
      wg::pin(o);
      if (step + 1 < steps) mma::bar_arrive(kBarEmptyV + (buf ^ 1), kThreads);
    }
    wg::wait<0>();
    wg::pin(s);
    if (step + 2 < steps) mma::bar_arrive(kBarEmptyK + buf, kThreads);

    // Mask where the block crosses the diagonal or the sequence's end (uniform per
    // group: its first row sees the fewest keys) and take the row max of the raw
    // scores: the scale (> 0) goes into the exponent's FFMA, exp2(s c - m c).
    const i32 key0 = step * kKeys;
    const bool full = key0 + kKeys <= lk && key0 + kKeys - 1 <= shift + first_row;
    float mx[2] = {neg_inf(), neg_inf()};
    if (full) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        mx[0] = fmax2(mx[0], fmax2(s[4 * i], s[4 * i + 1]));
        mx[1] = fmax2(mx[1], fmax2(s[4 * i + 2], s[4 * i + 3]));
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1;
          const i32 key = key0 + 8 * i + 2 * (i32)t + (e & 1);
          const float x = key < lk && key <= shift + rows[h] ? s[4 * i + e] : neg_inf();
          s[4 * i + e] = x;
          mx[h] = fmax2(mx[h], x);
        }
      }
    }
    float alpha[2], neg_mc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmax2(mx[h], shfl_xor(mx[h], 1));
      mx[h] = fmax2(mx[h], shfl_xor(mx[h], 2));
      const float m_new = fmax2(m_run[h], mx[h]);
      alpha[h] = mma::exp2_approx((m_run[h] - m_new) * c_scale);
      m_run[h] = m_new;
      neg_mc[h] = -m_new * c_scale;
    }
    // P as bf16 pairs; the row sums in two chains per row (half the dependent adds).
    u32 pa[32];
    float sum[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float p0 = mma::exp2_approx(s[4 * i] * c_scale + neg_mc[0]);
      const float p1 = mma::exp2_approx(s[4 * i + 1] * c_scale + neg_mc[0]);
      const float p2 = mma::exp2_approx(s[4 * i + 2] * c_scale + neg_mc[1]);
      const float p3 = mma::exp2_approx(s[4 * i + 3] * c_scale + neg_mc[1]);
      sum[0][i & 1] += p0 + p1;
      sum[1][i & 1] += p2 + p3;
      pa[2 * i] = mma::pack_bf16x2(p0, p1);
      pa[2 * i + 1] = mma::pack_bf16x2(p2, p3);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + (sum[h][0] + sum[h][1]);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
    const u64 v_desc = wg::desc_sw128(vbuf, TV::kBlockBytes);
    bulk::mbar_wait(full_v + 8 * buf, parity);
    mma::fence_proxy_async();
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      // Keys 16 ks .. 16 ks + 15: n8 tiles 2 ks and 2 ks + 1 of S.
      const u32 a[4] = {pa[4 * ks], pa[4 * ks + 1], pa[4 * ks + 2], pa[4 * ks + 3]};
      wg::mma_m64n128k16_rs<1>(o, a, wg::desc_advance(v_desc, ks * 16 * 128), true);
    }
    wg::commit();
  }
  wg::wait<0>();
  wg::pin(o);

  // The row sums over the quad, then out = O / l and lse (natural log).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += shfl_xor(l_run[h], 1);
    l_run[h] += shfl_xor(l_run[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (rows[h] >= lq) continue;
    const i64 row = (i64)(q0 + rows[h]) * kHeads + head;
    const bool empty = !(l_run[h] > 0.0f);
    const float inv = empty ? 0.0f : 1.0f / l_run[h];
    u16* out = p.out + row * kDv + 2 * t;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      mma::stg_stream_u32(out + 8 * j, mma::pack_bf16x2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv));
    if (t == 0) p.lse[row] = empty ? pos_inf() : (m_run[h] * c_scale + mma::log2_approx(l_run[h])) * kLn2;
  }
}

}  // namespace dense_wg
}  // namespace nsa
