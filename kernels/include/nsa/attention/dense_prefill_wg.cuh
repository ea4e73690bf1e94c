// Dense causal varlen attention (the MHA one-shot prefill, spec §5.1) with warp-group
// MMA (sm_90a): persistent CTAs of three warp groups, each taking (128 query rows of a
// sequence, head) tiles one after another from a grid-wide counter.
//   WG0, WG1 (consumers): 64 query rows each; per 128-key block S = Q K^T
//     (wgmma m64n128k16, Q and K from shared memory), causal mask, online softmax,
//     O += P V (wgmma m64n128k16, P from registers). A group issues block j's
//     Q K^T together with block j - 1's P V and runs block j's softmax while that
//     P V is in flight. The two groups take turns issuing (the turn barriers), so
//     one's softmax also overlaps the other's products.
//   WG2 (producer; its first warp, the others leave): takes the next tile, announces
//     it to the consumers with its Q tile (TMA through the tensor map) once they
//     are done with the previous Q, then copies K and V blocks into double-buffered
//     tiles, K one block ahead of V: a whole block by one thread through the tensor
//     maps (TMA, 64 dims a copy), the sequence's last partial block by every lane
//     with 16-byte cp.async, zeros past its end (the rows after it may hold
//     anything, and P V must not read them). Either way the block's mbarrier
//     completes when it has landed, so the producer never waits for its own
//     copies, only for a buffer to be given back (the empty barriers: K after the
//     block's Q K^T, V after its P V, Q after the tile's last Q K^T). The next
//     tile's Q and first blocks thus load while the consumers finish a tile.
// Tiles are numbered with `pair_group` (sequence, head) pairs interleaved, heaviest
// row tile first, and taken in that order (CTA i starts with tile i, then an atomic
// counter hands out the rest; the last CTA to finish zeroes it for the next
// launch): the pairs in flight keep their K and V in L2 for every row tile that
// re-reads them, and heavy tiles start first.
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
constexpr int kProducerThreads = 32;  // the producer group's first warp
constexpr u32 kConsumerWarps = kConsumerThreads / 32;
// Named barriers (0 is sync_block): the other group issued its Q K^T, this one may.
constexpr u32 kBarTurn = 1;  // + group
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
  // mbarriers, producer -> consumers, a block landed: K of buffer 0, 1, V of 0, 1, Q
  // (with the tile's number); then consumers -> producer, a buffer was read: the same
  // five.
  static constexpr u32 kFull = kV + 2 * V::kBytes;
  static constexpr u32 kEmpty = kFull + 5 * 8;
  static constexpr u32 kTile = kEmpty + 5 * 8;  // the announced tile (Announced, 48 bytes)
  // The swizzle follows address bits: the layout starts 1024-byte aligned.
  static constexpr u32 kBytes = kTile + 48 + 1024;
};

// The tile the producer announces: its number (the grid's tile count or more: no
// tile is left), head and rows; read by the consumers once full_q completes.
struct Announced {
  u32 id;
  i32 head;
  dense::SeqTile st;
};
static_assert(sizeof(Announced) <= 48, "the announced tile's shared-memory slot");

// Rows [0, valid) of a kR-row block of kDim-wide rows (`stride` elements apart in
// global memory) into a swizzled tile, zeros for the rest; by the producer warp:
// eight lanes per row, each a 16-byte chunk of one 64-dim block.
template <int kR, int kDim>
NSA_DEVICE void copy_rows(u32 tile, const u16* src, i64 stride, i32 valid, u32 ptid, u64 policy) {
  typedef Tile<kR, kDim> T;
  const u32 c8 = ptid % 8;
  // Not unrolled: the producer's 56 registers (a sequence's last partial block is
  // the only caller) hold the loop without spilling.
#pragma unroll 1
  for (u32 r = ptid / 8; r < (u32)kR; r += kProducerThreads / 8) {
    const bool live = (i32)r < valid;
    const u16* row = src + (live ? (i64)r * stride : 0);
#pragma unroll
    for (int b = 0; b < kDim / 64; ++b) {
      const u32 chunk = b * 8 + c8;
      mma::cp_async_16_policy(tile + T::offset(r, chunk), row + chunk * 8, live ? 16u : 0u, policy);
    }
  }
}

// Key rows key0 .. key0 + kKeys of one head (`rows`: the sequence's row 0 of it in
// global memory, `stride` elements apart; row 0 is row k0 of the tensor `map`
// describes; the sequence has lk rows) into the tile `dst`, completing mbarrier
// `full` when they land; by the producer warp. A whole block is kDim / 64
// tensor-map copies by one thread, the other lanes arriving; a partial one is
// copy_rows, zeros past the sequence.
template <int kDim>
NSA_DEVICE void copy_block(const bulk::TensorMap* map, const u16* rows, i64 stride, i32 k0, i32 head, i32 key0, i32 lk,
                           u32 dst, u32 full, u32 ptid, u64 policy) {
  typedef Tile<kKeys, kDim> T;
  if (key0 + kKeys <= lk) {
    if (ptid == 0) {
      bulk::mbar_arrive_expect_tx(full, T::kBytes);
#pragma unroll
      for (int b = 0; b < kDim / 64; ++b)
        bulk::copy_tensor_3d(dst + b * T::kBlockBytes, map, 64 * b, head, k0 + key0, full, policy);
    } else {
      bulk::mbar_arrive(full);
    }
  } else {
    copy_rows<kKeys, kDim>(dst, rows + (i64)key0 * stride, stride, lk - key0, ptid, policy);
    bulk::mbar_arrive_on_cp_async(full);
  }
}

// Q [rows, heads, d_qk], K [keys, heads, d_qk] and V [keys, heads, d_v] as 3-D tensor maps (dims innermost
// first), boxes of 64 dims x 1 head x kKeys rows, 128-byte swizzle: a box is one
// 64-dim block of a Tile. Passed as a __grid_constant__ parameter.
struct TensorMaps {
  bulk::TensorMap q, k, v;
};

template <int kHeads, int kDqk, int kDv>
NSA_DEVICE void dense_prefill(const Params& p, const TensorMaps& maps, u32* status) {
  static_assert(kDqk % 64 == 0 && kDv == 128, "q/k: whole 64-dim blocks; v: one n128 wgmma");
  typedef Smem<kDqk, kDv> L;
  typedef typename L::Q TQ;
  typedef typename L::K TK;
  typedef typename L::V TV;

  const u32 tiles = (u32)p.row_tiles, pairs = (u32)kHeads * (u32)p.batch;
  const u32 total = tiles * pairs;
  // Tile `id`: groups of pair_group (sequence, head) pairs, each group's row tiles
  // heaviest first (a causal tile's work grows with its index). False when it has
  // nothing to do (past the sequence's rows, or the sequence's offsets are bad:
  // reported where `report`).
  auto tile_of = [&](u32 id, bool report, dense::SeqTile& st, i32& head) {
    const u32 per_group = (u32)p.pair_group;
    const u32 first_pair = id / (per_group * tiles) * per_group, in_group = id % (per_group * tiles);
    const u32 group_pairs = pairs - first_pair < per_group ? pairs - first_pair : per_group;
    const i32 tile = (i32)tiles - 1 - (i32)(in_group / group_pairs);
    const u32 pair = first_pair + in_group % group_pairs;
    head = (i32)(pair % (u32)kHeads);
    const i32 seq = (i32)(pair / (u32)kHeads);
    return tile >= 0 && seq < p.batch && dense::seq_tile<kRows>(p, seq, tile, head, report, status, st);
  };
  auto steps_of = [](const dense::SeqTile& st) { return (st.key_end + kKeys - 1) / kKeys; };

  extern NSA_SHARED Vec16 smem_vec[];
  const u32 raw = mma::smem_addr(smem_vec);
  const u32 base = raw + (1024u - raw % 1024u) % 1024u;
  Announced* announced_tile =
      reinterpret_cast<Announced*>(reinterpret_cast<unsigned char*>(smem_vec) + (base - raw) + L::kTile);
  const u32 tid = thread_x();
  const i64 qk_stride = (i64)kHeads * kDqk, v_stride = (i64)kHeads * kDv;

  // K, V: + 8 buffer.
  const u32 full_k = base + L::kFull, full_v = full_k + 16, full_q = full_k + 32;
  const u32 empty_k = base + L::kEmpty, empty_v = empty_k + 16, empty_q = empty_k + 32;
  if (tid == 0) {
    for (u32 b = 0; b < 4; ++b) bulk::mbar_init(full_k + 8 * b, kProducerThreads);
    bulk::mbar_init(full_q, 1);
    for (u32 b = 0; b < 5; ++b) bulk::mbar_init(empty_k + 8 * b, kConsumerWarps);
    bulk::mbar_init_fence();
  }
  sync_block();

  if (tid >= (u32)kConsumerThreads) {
    wg::regs_set<kLaunchRegs, kRegsProducer>();
    if (tid >= (u32)(kConsumerThreads + kProducerThreads)) return;
    const u32 ptid = tid - kConsumerThreads;
    const u64 keep = mma::l2_evict_last_policy();  // every row tile of the head re-reads K and V
    if (ptid == 0 && p.keys > 0) {  // no key rows: the maps are placeholders, and no copy reads them
      bulk::prefetch_tensor_map(&maps.q);
      bulk::prefetch_tensor_map(&maps.k);
      bulk::prefetch_tensor_map(&maps.v);
    }
    u32 blocks = 0, announced = 0;  // K/V blocks copied and tiles announced so far
    // Every K/V buffer's use after its first waits for the consumers to give it back.
    auto wait_empty = [&](u32 empty, u32 blk) {
      if (blk >= 2) bulk::mbar_wait(empty + 8 * (blk & 1), ((blk >> 1) - 1) & 1u);
    };
    for (u32 id = block_x();; id = __shfl_sync(0xffffffffu, ptid == 0 ? atomic_add_ret(p.tile_counter, 1u) : 0u, 0) +
                                   grid_x()) {
      dense::SeqTile st;
      i32 head = 0;
      const bool live = id < total && tile_of(id, ptid == 0, st, head);
      if (id < total && !live) continue;  // nothing to do: not announced
      const i32 steps = live ? steps_of(st) : 0;
      // Announce the tile (past the last: the end) once the previous Q is free, its
      // Q tile with it. Q rows past the sequence hold whatever follows it (zeros past
      // the tensor): they only reach rows of S and O that are never stored.
      if (announced > 0) bulk::mbar_wait(empty_q, (announced - 1) & 1u);
      ++announced;
      if (ptid == 0) {
        announced_tile->id = id;
        if (live) {
          announced_tile->head = head;
          announced_tile->st = st;
        }
        if (steps > 0) {
          bulk::mbar_arrive_expect_tx(full_q, TQ::kBytes);
#pragma unroll
          for (int b = 0; b < kDqk / 64; ++b)
            bulk::copy_tensor_3d(base + L::kQ + b * TQ::kBlockBytes, &maps.q, 64 * b, head, st.q0 + st.row0, full_q,
                                 mma::l2_evict_first_policy());
        } else {
          bulk::mbar_arrive(full_q);
        }
      }
      if (!live) break;
      // K of block 0, then per step K of the next block and V of this one.
      const u16* k_rows = p.k + (i64)st.k0 * qk_stride + (i64)head * kDqk;
      const u16* v_rows = p.v + (i64)st.k0 * v_stride + (i64)head * kDv;
      auto copy_k = [&](i32 step) {
        const u32 blk = blocks + (u32)step;
        wait_empty(empty_k, blk);
        copy_block<kDqk>(&maps.k, k_rows, qk_stride, st.k0, head, step * kKeys, st.lk, base + L::kK + (blk & 1) * TK::kBytes,
                         full_k + 8 * (blk & 1), ptid, keep);
      };
      if (steps > 0) copy_k(0);
      for (i32 step = 0; step < steps; ++step) {
        const u32 blk = blocks + (u32)step;
        if (step + 1 < steps) copy_k(step + 1);
        wait_empty(empty_v, blk);
        copy_block<kDv>(&maps.v, v_rows, v_stride, st.k0, head, step * kKeys, st.lk, base + L::kV + (blk & 1) * TV::kBytes,
                        full_v + 8 * (blk & 1), ptid, keep);
      }
      blocks += (u32)steps;
    }
    // Every CTA took its last number; the last to get here zeroes the counter.
    if (ptid == 0) {
      fence_device();
      if (atomic_add_ret(p.tile_counter + 1, 1u) == grid_x() - 1) {
        atomic_exch_ret(p.tile_counter, 0u);
        atomic_exch_ret(p.tile_counter + 1, 0u);
      }
    }
    return;
  }

  // Consumers.
  wg::regs_set<kLaunchRegs, kRegsConsumer>();
  const u32 group = tid / kGroupThreads, gtid = tid % kGroupThreads;
  const u32 r0 = 16 * (gtid / 32) + (gtid % 32) / 4, t = gtid % 4;
  const u64 q_desc = wg::desc_sw128(base + L::kQ + group * kRowsWg * 128);
  const float c_scale = p.sm_scale * kLog2e;
  float o[64];
  float m_run[2], l_run[2];
  float s[64];
  u32 pa[32];  // P of the block whose P V is issued next, bf16 pairs
  float alpha[2];
  // The current tile's sequence and rows (the lambdas below read them).
  i32 lk = 0, shift = 0, first_row = 0;
  i32 rows[2] = {0, 0};

  // A warp's lanes are done with a buffer (their wgmma that read it retired): one
  // arrival per warp.
  auto give_back = [&](u32 empty) {
    __syncwarp();
    if (gtid % 32 == 0) bulk::mbar_arrive(empty);
  };
  // Waits until K (full_k) or V (full_v) of block `blk` has landed.
  auto wait_block = [&](u32 full, u32 blk) {
    bulk::mbar_wait(full + 8 * (blk & 1), (blk >> 1) & 1u);
    mma::fence_proxy_async();  // the producer's cp.async writes, read by wgmma
  };
  // S = Q K^T of block `blk` into s, issued (not waited for).
  auto issue_qk = [&](u32 blk) {
    const u64 k_desc = wg::desc_sw128(base + L::kK + (blk & 1) * TK::kBytes);
#pragma unroll
    for (int ks = 0; ks < kDqk / 16; ++ks) {
      wg::mma_m64n128k16_ss<0>(s, wg::desc_advance(q_desc, TQ::k_step(ks)), wg::desc_advance(k_desc, TK::k_step(ks)),
                               ks > 0);
    }
    wg::commit();
  };
  // O += P V of block `blk` with P in pa, issued (not waited for).
  auto issue_pv = [&](u32 blk) {
    const u64 v_desc = wg::desc_sw128(base + L::kV + (blk & 1) * TV::kBytes, TV::kBlockBytes);
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      // Keys 16 ks .. 16 ks + 15: n8 tiles 2 ks and 2 ks + 1 of S.
      const u32 a[4] = {pa[4 * ks], pa[4 * ks + 1], pa[4 * ks + 2], pa[4 * ks + 3]};
      wg::mma_m64n128k16_rs<1>(o, a, wg::desc_advance(v_desc, ks * 16 * 128), true);
    }
    wg::commit();
  };
  // The online softmax of block `step`'s scores in s: P in place of them (f32), the
  // running max and sum, and alpha, the factor O takes before this block's P V. Masks where the
  // block crosses the diagonal or the sequence's end (uniform per group: its first
  // row sees the fewest keys); the row max is of the raw scores, the scale (> 0)
  // goes into the exponent's FFMA, exp2(s c - m c).
  auto softmax_block = [&](i32 step) {
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
    float neg_mc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmax2(mx[h], shfl_xor(mx[h], 1));
      mx[h] = fmax2(mx[h], shfl_xor(mx[h], 2));
      const float m_new = fmax2(m_run[h], mx[h]);
      alpha[h] = mma::exp2_approx((m_run[h] - m_new) * c_scale);
      m_run[h] = m_new;
      neg_mc[h] = -m_new * c_scale;
    }
    // The row sums in two chains per row (half the dependent adds).
    float sum[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float p0 = mma::exp2_approx(s[4 * i] * c_scale + neg_mc[0]);
      const float p1 = mma::exp2_approx(s[4 * i + 1] * c_scale + neg_mc[0]);
      const float p2 = mma::exp2_approx(s[4 * i + 2] * c_scale + neg_mc[1]);
      const float p3 = mma::exp2_approx(s[4 * i + 3] * c_scale + neg_mc[1]);
      sum[0][i & 1] += p0 + p1;
      sum[1][i & 1] += p2 + p3;
      s[4 * i] = p0;
      s[4 * i + 1] = p1;
      s[4 * i + 2] = p2;
      s[4 * i + 3] = p3;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + (sum[h][0] + sum[h][1]);
  };

  auto rescale_o = [&]() {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  };
  auto pack_p = [&]() {
#pragma unroll
    for (int i = 0; i < 32; ++i) pa[i] = mma::pack_bf16x2(s[2 * i], s[2 * i + 1]);
  };

  u32 blocks = 0;  // K/V blocks consumed so far (their buffers and phases)
  for (u32 announced = 0;; ++announced) {
    bulk::mbar_wait(full_q, announced & 1u);  // the tile, and its Q tile when it has keys
    if (announced_tile->id >= total) break;
    const i32 head = announced_tile->head;
    const dense::SeqTile st = announced_tile->st;
    const i32 steps = steps_of(st);
    lk = st.lk;
    shift = st.shift;
    first_row = st.row0 + (i32)group * kRowsWg;  // of this group, in the sequence
    rows[0] = first_row + (i32)r0;
    rows[1] = first_row + (i32)r0 + 8;
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_run[h] = kMaxInit;
      l_run[h] = 0.0f;
    }

    // Each group issues block step's Q K^T together with block step - 1's P V, so
    // that block step's softmax overlaps its own P V as well as the other group's
    // products. The groups take turns issuing (group 0 first); each waits for its
    // turn as often as the other hands it one (steps times), so no arrival is left
    // over at the tile's end. Q is given back once the tile's last Q K^T retired.
    if (steps > 0) {
      if (group == 1) mma::bar_arrive(kBarTurn, kPairThreads);
      wait_block(full_k, blocks);
      mma::bar_sync(kBarTurn + group, kPairThreads);
      wg::fence();
      issue_qk(blocks);
      if (group == 0 || 1 < steps) mma::bar_arrive(kBarTurn + (group ^ 1), kPairThreads);
      wg::wait<0>();
      wg::pin(s);
      give_back(empty_k + 8 * (blocks & 1));
      if (steps == 1) give_back(empty_q);
      softmax_block(0);  // O is zero: its rescale by alpha changes nothing
      pack_p();
    } else {
      give_back(empty_q);
    }
    for (i32 step = 1; step < steps; ++step) {
      const u32 blk = blocks + (u32)step;
      wait_block(full_k, blk);
      wait_block(full_v, blk - 1);
      mma::bar_sync(kBarTurn + group, kPairThreads);
      wg::fence();  // P, written by this thread, read by the P V below
      issue_qk(blk);
      // O to block step - 1's max while Q K^T runs: it is idle between two P V.
      rescale_o();
      wg::fence();
      issue_pv(blk - 1);
      if (group == 0 || step + 1 < steps) mma::bar_arrive(kBarTurn + (group ^ 1), kPairThreads);
      wg::wait<1>();
      wg::pin(s);
      give_back(empty_k + 8 * (blk & 1));
      if (step + 1 == steps) give_back(empty_q);
      softmax_block(step);
      wg::wait<0>();
      wg::pin(o);
      give_back(empty_v + 8 * ((blk - 1) & 1));
      pack_p();  // pa is free once the P V that read it retired
    }
    if (steps > 0) {
      const u32 blk = blocks + (u32)steps - 1;
      wait_block(full_v, blk);
      rescale_o();
      wg::fence();
      issue_pv(blk);
      wg::wait<0>();
      wg::pin(o);
      give_back(empty_v + 8 * (blk & 1));
    }
    blocks += (u32)steps;

    // The row sums over the quad, then out = O / l and lse (natural log).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_run[h] += shfl_xor(l_run[h], 1);
      l_run[h] += shfl_xor(l_run[h], 2);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (rows[h] >= st.lq) continue;
      const i64 row = (i64)(st.q0 + rows[h]) * kHeads + head;
      const bool empty = !(l_run[h] > 0.0f);
      const float inv = empty ? 0.0f : 1.0f / l_run[h];
      u16* out = p.out + row * kDv + 2 * t;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        mma::stg_stream_u32(out + 8 * j, mma::pack_bf16x2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv));
      if (t == 0) p.lse[row] = empty ? pos_inf() : (m_run[h] * c_scale + mma::log2_approx(l_run[h])) * kLn2;
    }
  }
}

}  // namespace dense_wg
}  // namespace nsa
