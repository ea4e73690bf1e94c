// Sparse MLA prefill over bf16 KV with warp-group MMA (sm_90a), 64-head tiles, the
// `pairs` variant of the warp-group prefill kernel (opt-in: ops::sparse_prefill
// launches sparse_prefill_wg.cuh unless asked for this one), in a ping-pong
// schedule: the two consumer warp groups take alternate 64-token blocks (WG0 the
// even block of each pair, WG1 the odd one). Each computes its own block's
// scores Q K^T and softmax, so one group's softmax runs while the other's products
// keep the tensor cores busy, and the Q K^T work (more than half of the MMAs) is
// shared evenly. The output columns stay split (WG0 0..255, WG1 256..511): a group
// multiplies its own P (registers) by its half of its block's V, and the other
// group's P, rescaled to the pair's common row max and written to shared memory, by
// its half of the other block's V. Per pair, in order:
//   WG0: S0 = Q K0^T; m0 = max(m, rowmax S0) -> WG1; P0 = exp2(S0 - m0);
//        O_L = O_L * 2^(m - m0) + P0 V0_L; then, with WG1's m1: P0 * 2^(m0 - m1) -> WG1,
//        O_L = O_L * 2^(m0 - m1) + P1 V1_L (P1 from WG1).
//   WG1: S1 = Q K1^T; m1 = max(m0, rowmax S1) -> WG0; P1 = exp2(S1 - m1) -> WG0;
//        O_R = O_R * 2^(m - m1) + P1 V1_R + P0' V0_R.
// The producer group copies the chosen rows with 16-byte cp.async in halves that free
// up at different times (K0's dims 0..255 once WG0's P0 V0_L retired, K1's 256..575
// once WG1's P1 V1_R did, ...), so the next pair's rows land while this pair's last
// products run. WG0's P for WG1 lives in K0's rope block (dims 512..575), which
// nothing reads after Q K0^T: 576-wide rows leave no room for a second P tile.
#pragma once
#include "nsa/attention/sparse_attend_wg.cuh"
#include "nsa/attention/sparse_prefill.cuh"

namespace nsa {
namespace prefill_pairs {

using prefill::kProducerThreads;
using prefill::kThreads;
using prefill::Params;
using namespace attend_wg;
static_assert(kConsumerThreads == 2 * kGroupThreads && kThreads == 3 * kGroupThreads,
              "two consumer warp groups and one producer group");

// setmaxnreg budgets (launched with 64K / 384 = 168 per thread): each consumer group
// holds half of O (128), its block's S (32) and its P (16); the producer only
// addresses cp.async copies.
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kRegsConsumer = 208;
constexpr int kRegsProducer = 88;
static_assert(2 * kRegsConsumer + kRegsProducer <= 3 * kLaunchRegs, "setmaxnreg moves registers, never adds");

// A block's rows landed: an mbarrier per block of the pair (every producer thread
// arrives once a pair, after its copies), which each group waits on when it needs
// the block: a named barrier would hold the first group until the second arrives,
// and the groups reach each block at different points of their pair.
// Named barriers (0 is the CTA barrier). Free: a half of a block's buffer may be
// overwritten (its one reader group -> producer). Max, P: the exchange between the
// groups.
constexpr u32 kBarFree0L = 3, kBarFree1L = 4, kBarFree0R = 8, kBarFree1R = 9;
constexpr u32 kBarMax0 = 5, kBarMax1 = 6, kBarSums = 7;
constexpr u32 kBarP0Ready = 10, kBarP1Ready = 11, kBarP1Free = 12;
constexpr u32 kFreeThreads = kGroupThreads + kProducerThreads;

constexpr u32 kPBytes = 8 * kChunkBytes;  // a 64 x 64 bf16 P tile
constexpr int kLeftBlocks = kDv / 2 / 64;  // 64-dim blocks of the output's left half (WG0's V)

// Shared memory: Q, the pair's two K/V tiles, the P tiles the groups exchange, the
// row maxima and final sums of each group, token validity per block.
template <int kDqk>
struct Smem {
  typedef Tile<kDqk> T;
  static constexpr bool kP0InRope = kDqk > kDv;
  static constexpr u32 kQ = 0;
  static constexpr u32 kK = kQ + T::kTileBytes;
  static constexpr u32 kP1 = kK + 2 * T::kTileBytes;
  static constexpr u32 kP0 = kP0InRope ? kK + (kDv / 64) * kBlockBytes : kP1 + kPBytes;
  static constexpr u32 kMax0 = kP1 + (kP0InRope ? 1 : 2) * kPBytes;
  static constexpr u32 kMax1 = kMax0 + kHT * 4;
  static constexpr u32 kSum0 = kMax1 + kHT * 4;
  static constexpr u32 kSum1 = kSum0 + kHT * 4;
  static constexpr u32 kValid = kSum1 + kHT * 4;
  static constexpr u32 kReady = kValid + 2 * kBlockTokens;  // two mbarriers
  // The swizzle pattern follows address bits: the layout starts 1024-byte aligned.
  static constexpr u32 kBytes = kReady + 2 * 8 + 1024;
  static_assert(kReady % 8 == 0, "mbarrier alignment");
};

// Producer warp group: warp w copies rows 16 w .. 16 w + 15 of each block, four rows a
// pass with eight lanes a row (one cp.async instruction reads 4 whole 128-byte lines
// into distinct banks of the swizzled tile). Lanes 0..15 hold the pair's even block's
// indices, lanes 16..31 the odd block's, loaded a pair ahead.
template <int kTopk, int kDqk>
NSA_DEVICE void produce(const Params& p, u32 k_base, u8* flags, u32 ready, i64 row, i32 valid_len, i32 steps) {
  typedef Tile<kDqk> T;
  constexpr int kBlocks = kDqk / 64;
  constexpr u32 kRows = 16;
  const u32 lane = thread_x() % 32;
  const u32 row0 = (thread_x() / 32 - kConsumerWarps) * kRows;
  const u32 r4 = lane / 8, c8 = lane % 8;
  const i32* idx_row = p.indices + row * kTopk;
  const i32 pairs = (steps + 1) / 2;
  auto indices_of = [&](i32 pair) -> i32 {
    const i32 pos = (2 * pair + (i32)(lane / kRows)) * kBlockTokens + (i32)(row0 + lane % kRows);
    return pair < pairs && pos < valid_len ? mma::ldg_stream_i32(idx_row + pos) : -1;
  };
  const u64 keep = mma::l2_evict_last_policy();  // the KV rows: see l2_evict_last_policy
  // Dims blocks [b0, b1) of block `which` (0 even, 1 odd) of the pair; the first part
  // of a block to be copied also writes its validity flags.
  auto copy = [&](i32 idx_lane, int which, int b0, int b1, bool with_flags) {
    const u32 tile = k_base + which * T::kTileBytes;
    if (with_flags && lane / kRows == (u32)which)
      flags[which * kBlockTokens + row0 + lane % kRows] = (idx_lane >= 0 && (i64)idx_lane < p.s_kv) ? 1 : 0;
#pragma unroll
    for (int pass = 0; pass < 4; ++pass) {
      const i32 idx = __shfl_sync(0xffffffffu, idx_lane, which * kRows + pass * 4 + r4);
      const bool valid = idx >= 0 && (i64)idx < p.s_kv;
      const u16* src = p.kv + (valid ? (i64)idx * p.kv_stride : 0);
      const u32 r = row0 + pass * 4 + r4;
#pragma unroll
      for (int b = b0; b < b1; ++b) {
        const u32 chunk = b * 8 + c8;
        mma::cp_async_16_policy(tile + T::offset(r, chunk), src + chunk * 8, valid ? 16u : 0u, keep);
      }
    }
    mma::cp_async_commit();
  };
  auto publish = [&](u32 bar) {
    mma::cp_async_wait<0>();
    mma::fence_proxy_async();
    bulk::mbar_arrive(bar);
  };
  i32 next = indices_of(0);
  for (i32 j = 0; j < pairs; ++j) {
    const i32 mine = next;
    next = indices_of(j + 1);
    const bool odd = 2 * j + 1 < steps;
    // In the order the consumers release the halves.
    if (j > 0) mma::bar_sync(kBarFree0L, kFreeThreads);
    copy(mine, 0, 0, kLeftBlocks, true);
    if (j > 0) mma::bar_sync(kBarFree1R, kFreeThreads);
    if (odd) copy(mine, 1, kLeftBlocks, kBlocks, true);
    if (j > 0) mma::bar_sync(kBarFree0R, kFreeThreads);
    copy(mine, 0, kLeftBlocks, kBlocks, false);
    publish(ready);
    if (j > 0) mma::bar_sync(kBarFree1L, kFreeThreads);
    if (odd) {
      copy(mine, 1, 0, kLeftBlocks, false);
      publish(ready + 8);
    }
  }
}

// Log2-domain scores, invalid tokens masked, and the lane's two rows' maxima over
// their quad.
NSA_DEVICE void mask_scores(float (&s)[32], const u8* flags, const Lane& ln, float c_scale, float (&mx)[2]) {
  mx[0] = mx[1] = neg_inf();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = flags[8 * i + 2 * ln.t + (e & 1)] ? s[4 * i + e] * c_scale : neg_inf();
      s[4 * i + e] = x;
      mx[e >> 1] = fmax2(mx[e >> 1], x);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmax2(mx[h], shfl_xor(mx[h], 1));
    mx[h] = fmax2(mx[h], shfl_xor(mx[h], 2));
  }
}

// P = exp2(S - m) in place, added to the row sums, and as bf16 pairs (rows r0, r0 + 8).
NSA_DEVICE void exponentiate(float (&s)[32], const float (&m)[2], float (&l)[2], u32 (&pa)[16]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[4 * i + e] = mma::exp2_approx(s[4 * i + e] - m[e >> 1]);
      l[e >> 1] += s[4 * i + e];
    }
    pa[2 * i] = mma::pack_bf16x2(s[4 * i], s[4 * i + 1]);
    pa[2 * i + 1] = mma::pack_bf16x2(s[4 * i + 2], s[4 * i + 3]);
  }
}

// P (bf16 pairs of rows r0, r0 + 8) into a P tile in the no-swizzle core-matrix
// layout the other group's descriptor reads, fenced for the async proxy.
NSA_DEVICE void store_p(u8* tile, const Lane& ln, const u32 (&pa)[16]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    u8* chunk = tile + i * kChunkBytes + 4 * ln.t;
    *reinterpret_cast<u32*>(chunk + ln.r0 * 16) = pa[2 * i];
    *reinterpret_cast<u32*>(chunk + (ln.r0 + 8) * 16) = pa[2 * i + 1];
  }
  mma::fence_proxy_async();
}

// The lane's row values of a per-row array in shared memory.
NSA_DEVICE void load_rows(const u8* smem, u32 at, const Lane& ln, float (&v)[2]) {
  const float* a = reinterpret_cast<const float*>(smem + at);
  v[0] = a[ln.r0];
  v[1] = a[ln.r0 + 8];
}
NSA_DEVICE void store_rows(u8* smem, u32 at, const Lane& ln, const float (&v)[2]) {
  if (ln.t != 0) return;
  float* a = reinterpret_cast<float*>(smem + at);
  a[ln.r0] = v[0];
  a[ln.r0 + 8] = v[1];
}

// WG0: the even block of each pair, output columns 0..255.
template <int kDqk>
NSA_DEVICE void run_even(u8* smem, u32 base, i32 steps, float c_scale, const Lane& ln, float (&o)[128],
                         float (&m)[2], float (&l)[2]) {
  typedef Smem<kDqk> L;
  const u64 q_desc = k_major(base + L::kQ);
  const u32 k0 = base + L::kK, k1 = k0 + Tile<kDqk>::kTileBytes;
  const i32 pairs = (steps + 1) / 2;
  for (i32 j = 0; j < pairs; ++j) {
    const bool odd = 2 * j + 1 < steps, more = j + 1 < pairs;
    bulk::mbar_wait(base + L::kReady, (u32)j & 1u);
    float s[32];
    issue_scores<kDqk>(s, q_desc, k0);
    // The wait<1> only where an older group (the previous pair's P1 V1_L) is pending:
    // on the first pair ptxas serialized every wgmma for it (C7514).
    if (j > 0) {  // the previous pair's P1 V1_L retired: K1's left half and WG1's P tile are free
      wg::wait<1>();
      wg::pin(o);
      mma::bar_arrive(kBarFree1L, kFreeThreads);
      mma::bar_arrive(kBarP1Free, kConsumerThreads);
    }
    wg::wait<0>();
    wg::pin(s);
    float mx[2], m0[2], alpha[2];
    mask_scores(s, smem + L::kValid, ln, c_scale, mx);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m0[h] = fmax2(m[h], mx[h]);
      alpha[h] = mma::exp2_approx(m[h] - m0[h]);
      l[h] *= alpha[h];
    }
    store_rows(smem, L::kMax0, ln, m0);
    mma::bar_arrive(kBarMax0, kConsumerThreads);
    u32 pa[16];
    exponentiate(s, m0, l, pa);
    scale_rows(o, alpha[0], alpha[1]);
    wg::pin(o);  // rescaled before wgmma.fence: sunk past it, it cost an injected WG.AR (C7520)
    pv_from_regs(o, pa, k0);
    wg::wait<0>();
    wg::pin(o);
    if (more) mma::bar_arrive(kBarFree0L, kFreeThreads);
    // P0 at the pair's max for WG1 (in K0's rope block or beside P1).
    mma::bar_sync(kBarMax1, kConsumerThreads);
    float m1[2], sc[2];
    load_rows(smem, L::kMax1, ln, m1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[h] = mma::exp2_approx(m0[h] - m1[h]);
      l[h] *= sc[h];
      m[h] = m1[h];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      pa[2 * i] = mma::pack_bf16x2(s[4 * i] * sc[0], s[4 * i + 1] * sc[0]);
      pa[2 * i + 1] = mma::pack_bf16x2(s[4 * i + 2] * sc[1], s[4 * i + 3] * sc[1]);
    }
    store_p(smem + L::kP0, ln, pa);
    mma::bar_arrive(kBarP0Ready, kConsumerThreads);
    scale_rows(o, sc[0], sc[1]);
    wg::pin(o);
    // Only the last pair lacks an odd block: a break, since an if around P1 V1_L left
    // O in flight on one path to the loop's back edge only (C7515, all wgmma serialized).
    if (!odd) break;
    bulk::mbar_wait(base + L::kReady + 8, (u32)j & 1u);
    mma::bar_sync(kBarP1Ready, kConsumerThreads);
    pv_from_smem(o, base + L::kP1, k1);
  }
  wg::wait<0>();
  wg::pin(o);
}

// WG1: the odd block of each pair, output columns 256..511.
template <int kDqk>
NSA_DEVICE void run_odd(u8* smem, u32 base, i32 steps, float c_scale, const Lane& ln, float (&o)[128], float (&m)[2],
                        float (&l)[2]) {
  typedef Smem<kDqk> L;
  const u64 q_desc = k_major(base + L::kQ);
  const u32 k0 = base + L::kK, k1 = k0 + Tile<kDqk>::kTileBytes;
  const i32 pairs = (steps + 1) / 2;
  for (i32 j = 0; j < pairs; ++j) {
    const bool odd = 2 * j + 1 < steps, more = j + 1 < pairs;
    float s[32], mx[2] = {neg_inf(), neg_inf()};
    if (odd) {
      bulk::mbar_wait(base + L::kReady + 8, (u32)j & 1u);
      issue_scores<kDqk>(s, q_desc, k1);
      wg::wait<0>();
      wg::pin(s);
      mask_scores(s, smem + L::kValid + kBlockTokens, ln, c_scale, mx);
    }
    mma::bar_sync(kBarMax0, kConsumerThreads);
    float m0[2], m1[2], alpha[2];
    load_rows(smem, L::kMax0, ln, m0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m1[h] = fmax2(m0[h], mx[h]);  // m0 already holds this group's running max
      alpha[h] = mma::exp2_approx(m[h] - m1[h]);
      l[h] *= alpha[h];
      m[h] = m1[h];
    }
    store_rows(smem, L::kMax1, ln, m1);
    mma::bar_arrive(kBarMax1, kConsumerThreads);
    scale_rows(o, alpha[0], alpha[1]);
    wg::pin(o);  // rescaled before the next wgmma.fence (see run_even)
    if (j > 0) mma::bar_sync(kBarP1Free, kConsumerThreads);
    if (odd) {
      u32 pa[16];
      exponentiate(s, m1, l, pa);
      pv_from_regs(o, pa, k1 + kVHalfBytes);
      store_p(smem + L::kP1, ln, pa);
      mma::bar_arrive(kBarP1Ready, kConsumerThreads);
    }
    bulk::mbar_wait(base + L::kReady, (u32)j & 1u);
    mma::bar_sync(kBarP0Ready, kConsumerThreads);
    pv_from_smem(o, base + L::kP0, k0 + kVHalfBytes);
    wg::wait<1>();
    wg::pin(o);
    if (more) mma::bar_arrive(kBarFree1R, kFreeThreads);  // every pair but the last has its odd block
    wg::wait<0>();
    wg::pin(o);
    if (more) mma::bar_arrive(kBarFree0R, kFreeThreads);
  }
  wg::wait<0>();
  wg::pin(o);
}

template <int kHeads, int kTopk, int kDqk>
NSA_DEVICE void sparse_prefill(const Params& p) {
  static_assert(kHeads % 16 == 0 && kHeads > 16, "17+ heads in 64-head tiles (the last may be partial)");
  static_assert(kTopk % kBlockTokens == 0, "top-k is a multiple of 64 (a last pair may have one block)");
  typedef Smem<kDqk> L;
  constexpr int kHeadTiles = (kHeads + kHT - 1) / kHT;

  extern NSA_SHARED Vec16 smem_vec[];
  u8* smem = aligned_smem(smem_vec);
  const u32 base = mma::smem_addr(smem);
  const u32 tid = thread_x();

  const auto [ht, row] = prefill::cta_tile<kHeadTiles>();
  if (row >= p.s_q) return;

  const i32 valid_len = row_topk_len<kTopk>(p.topk_length, row);
  const i32 steps = (valid_len + kBlockTokens - 1) / kBlockTokens;

  const u32 head0 = ht * kHT;
  const u32 rows = kHeads - head0 < (u32)kHT ? kHeads - head0 : (u32)kHT;  // heads of this tile
  load_q<kDqk, kThreads>(p.q + (row * kHeads + head0) * kDqk, base + L::kQ, rows);
  if (tid == 0) {
    bulk::mbar_init(base + L::kReady, kProducerThreads);
    bulk::mbar_init(base + L::kReady + 8, kProducerThreads);
    bulk::mbar_init_fence();
  }
  sync_block();
  if (tid >= (u32)kConsumerThreads) {
    wg::regs_set<kLaunchRegs, kRegsProducer>();
    if (steps > 0) produce<kTopk, kDqk>(p, base + L::kK, smem + L::kValid, base + L::kReady, row, valid_len, steps);
    return;
  }

  const u32 group = tid / kGroupThreads;
  const Lane ln(tid % kGroupThreads);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m[2] = {kMaxInit, kMaxInit}, l[2] = {0.0f, 0.0f};
  const float c_scale = p.sm_scale * kLog2e;
  wg::regs_set<kLaunchRegs, kRegsConsumer>();
  if (group == 0)
    run_even<kDqk>(smem, base, steps, c_scale, ln, o, m, l);
  else
    run_odd<kDqk>(smem, base, steps, c_scale, ln, o, m, l);
  // Both groups end at the same row max; each has summed its own blocks' P.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += shfl_xor(l[h], 1);
    l[h] += shfl_xor(l[h], 2);
  }
  store_rows(smem, group == 0 ? L::kSum0 : L::kSum1, ln, l);
  mma::bar_sync(kBarSums, kConsumerThreads);
  float other[2];
  load_rows(smem, group == 0 ? L::kSum1 : L::kSum0, ln, other);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += other[h];
    const u32 head = head0 + ln.r0 + 8 * h;
    if (head >= (u32)kHeads) continue;  // a zero row of a partial tile
    const bool empty = !(l[h] > 0.0f);
    const i64 at = row * kHeads + head;
    store_half_bf16(o, group, ln, p.out + at * kDv, h, empty ? 0.0f : 1.0f / l[h]);
    if (group == 0 && ln.t == 0) {
      p.max_logits[at] = empty ? neg_inf() : m[h] * kLn2;
      p.lse[at] = empty ? pos_inf() : (m[h] + mma::log2_approx(l[h])) * kLn2;
    }
  }
}

}  // namespace prefill_pairs
}  // namespace nsa
