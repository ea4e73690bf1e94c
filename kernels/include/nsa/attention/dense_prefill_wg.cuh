// Dense causal varlen attention (the MHA one-shot prefill, spec §5.1) with warp-group
// MMA (sm_90a): one CTA of three warp groups per (128 query rows of a sequence, head).
//   WG0, WG1 (consumers): 64 query rows each; per 128-key block S = Q K^T
//     (wgmma m64n128k16, Q and K from shared memory), causal mask, online softmax,
//     O += P V (wgmma m64n128k16, P from registers). A block's P V is issued
//     without a wait so that it overlaps the next block's Q K^T. The two groups
//     take turns issuing Q K^T (the turn barriers), so one's softmax runs while
//     the other's products keep the tensor cores busy.
//   WG2 (producer): copies each K and V block into a double-buffered tile with
//     16-byte cp.async (zeros past the sequence) and hands it over with a full
//     barrier per consumer group (so neither waits for the other's softmax) and
//     takes it back with the empty barrier.
// CTAs of one (sequence, head) are adjacent, heaviest row tile first: the few heads
// in flight keep their K and V in L2 for every row tile that re-reads them.
// Q, K and V tiles use the 128-byte swizzle layout (dims 64 b .. 64 b + 63 of every
// row form block b; row r at r * 128 in it, its 16-byte chunk c at (c ^ r % 8) * 16):
// K is the K-major B operand of Q K^T, V the MN-major B operand of P V.
// Semantics, parameters and outputs as dense_prefill.cuh (the mma.sync kernel).
#pragma once
#include "nsa/attention/dense_prefill.cuh"
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
// Named barriers (0 is sync_block).
constexpr u32 kBarFull = 1;   // + 2 group + buffer: producer -> a consumer group, the block landed
constexpr u32 kBarEmpty = 5;  // + buffer: consumers -> producer, the block was read
constexpr u32 kBarTurn = 7;   // + group: the other group issued its Q K^T, this one may
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
  // The swizzle follows address bits: the layout starts 1024-byte aligned.
  static constexpr u32 kBytes = kV + 2 * V::kBytes + 1024;
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

  // A (sequence, head)'s row tiles adjacent, heaviest first: a causal tile's work
  // grows with its index, and the tiles in flight share their K and V in L2.
  const u32 bid = block_x();
  const i32 tile = p.row_tiles - 1 - (i32)(bid % (u32)p.row_tiles);
  const u32 pair = bid / (u32)p.row_tiles;
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
  }
  sync_block();

  if (tid >= (u32)kConsumerThreads) {
    // Producer. Publish the previous block (landed, fenced for the async proxy)
    // before waiting for this block's buffer: the consumers release a buffer only
    // after the next block's Q K^T, so the other order would deadlock.
    wg::regs_set<kLaunchRegs, kRegsProducer>();
    const u32 ptid = tid - kConsumerThreads;
    const u64 keep = mma::l2_evict_last_policy();  // every row tile of the head re-reads K and V
    auto publish = [&](i32 step) {
      mma::cp_async_wait<0>();
      mma::fence_proxy_async();
      mma::bar_arrive(kBarFull + (step & 1), kPairThreads);
      mma::bar_arrive(kBarFull + 2 + (step & 1), kPairThreads);
    };
    for (i32 step = 0; step < steps; ++step) {
      const u32 buf = step & 1;
      if (step >= 1) publish(step - 1);
      if (step >= 2) mma::bar_sync(kBarEmpty + buf, kThreads);
      const i32 key0 = step * kKeys;
      const i64 row = (i64)(k0 + key0);
      copy_rows<kKeys, kDqk>(base + L::kK + buf * TK::kBytes, p.k + row * qk_stride + (i64)head * kDqk, qk_stride,
                             lk - key0, ptid, keep);
      copy_rows<kKeys, kDv>(base + L::kV + buf * TV::kBytes, p.v + row * v_stride + (i64)head * kDv, v_stride,
                            lk - key0, ptid, keep);
      mma::cp_async_commit();
    }
    if (steps > 0) publish(steps - 1);
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
    mma::bar_sync(kBarFull + 2 * group + buf, kPairThreads);
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
      if (step + 1 < steps) mma::bar_arrive(kBarEmpty + (buf ^ 1), kThreads);
    }
    wg::wait<0>();
    wg::pin(s);

    // Mask where the block crosses the diagonal or the sequence's end (uniform per
    // group: its first row sees the fewest keys), scale into log2 units, row max.
    const i32 key0 = step * kKeys;
    const bool full = key0 + kKeys <= lk && key0 + kKeys - 1 <= shift + first_row;
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const i32 key = key0 + 8 * i + 2 * (i32)t + (e & 1);
        const bool live = full || (key < lk && key <= shift + rows[h]);
        const float x = live ? s[4 * i + e] * c_scale : neg_inf();
        s[4 * i + e] = x;
        mx[h] = fmax2(mx[h], x);
      }
    }
    float alpha[2];
    update_max(mx, m_run, l_run, alpha);
    u32 pa[32];
#pragma unroll
    for (int i = 0; i < 16; ++i)
      exp_pack(s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3], m_run, l_run, pa[2 * i], pa[2 * i + 1]);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
    const u64 v_desc = wg::desc_sw128(vbuf, TV::kBlockBytes);
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
    if (t == 0) p.lse[row] = empty ? pos_inf() : (m_run[h] + mma::log2_approx(l_run[h])) * kLn2;
  }
}

}  // namespace dense_wg
}  // namespace nsa
