// Sparse MLA prefill over bf16 KV with warp-group MMA (sm_90a, playbook stage P2),
// for head counts that are a multiple of 64: one CTA per (query token, 64-head
// tile). The consumers are sparse_attend_wg.cuh's two warp groups; one producer
// warp group copies the chosen KV rows into the core-matrix K/V tile with 16-byte
// cp.async (zero-filled for a masked index). Outputs as the mma.sync kernel's.
#pragma once
#include "nsa/attention/sparse_attend_wg.cuh"
#include "nsa/attention/sparse_prefill.cuh"

namespace nsa {
namespace prefill_wg {

using namespace prefill;
using attend_wg::kGroupThreads;
using attend_wg::kHT;
static_assert(kConsumerThreads == 2 * kGroupThreads && kThreads == 3 * kGroupThreads,
              "two consumer warp groups and one producer group (prefill's thread split)");

// setmaxnreg budgets: launched with 64K / 384 registers per thread, rounded down
// to 8 (168); setmaxnreg only moves registers between the groups. The producer
// copies with cp.async and needs few.
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kRegsWg0 = 208;
constexpr int kRegsWg1 = 176;
constexpr int kRegsProducer = 120;
static_assert(kRegsWg0 + kRegsWg1 + kRegsProducer <= 3 * kLaunchRegs, "setmaxnreg moves registers, never adds");

// Producer warp group: each 64-token step, warp w copies rows 16 w .. 16 w + 15,
// four rows at a time with eight lanes per row (lane: row r4 = lane / 8, chunk
// lane % 8 of each 64-dim block), so one cp.async instruction reads 4 whole
// 128-byte lines and writes them into distinct banks of the swizzled tile. Lanes
// 0..15 hold the step's indices, read one step ahead.
// Order within a step: publish the previous step's buffer (landed, fenced for the
// async proxy), then wait for this step's buffer to be released, then copy. WG0
// releases a buffer only after the next step's Q K^T (its P V overlaps that), so
// waiting for the release before publishing would deadlock.
template <int kTopk, int kDqk>
NSA_DEVICE void produce_tile(const Params& p, u32 k_base, u8* flags, i64 row, i32 valid_len, i32 steps) {
  typedef attend_wg::Tile<kDqk> T;
  constexpr int kRowsPerWarp = kBlockTokens / kProducerWarps;
  constexpr int kBlocks = kDqk / 64;
  static_assert(kRowsPerWarp == 16, "four passes of 4 rows");
  const u32 lane = thread_x() % 32;
  const u32 row0 = (thread_x() / 32 - kConsumerWarps) * kRowsPerWarp;
  const u32 r4 = lane / 8, c8 = lane % 8;
  const i32* idx_row = p.indices + row * kTopk;
  auto index_at = [&](i32 step) -> i32 {
    const i32 pos = step * kBlockTokens + (i32)(row0 + lane);
    return (lane < (u32)kRowsPerWarp && pos < valid_len) ? mma::ldg_stream_i32(idx_row + pos) : -1;
  };
  const u64 keep = mma::l2_evict_last_policy();  // the KV rows: see l2_evict_last_policy
  auto publish = [&](i32 step) {
    mma::cp_async_wait<0>();
    mma::fence_proxy_async();
    mma::bar_arrive(kBarFull + (step & 1), kThreads);
  };
  i32 next = index_at(0);
  for (i32 step = 0; step < steps; ++step) {
    const u32 buf = step & 1;
    const i32 mine = next;
    next = step + 1 < steps ? index_at(step + 1) : -1;
    if (step >= 1) publish(step - 1);
    if (step >= 2) mma::bar_sync(kBarEmpty + buf, kThreads);
    if (lane < (u32)kRowsPerWarp) flags[buf * kBlockTokens + row0 + lane] = (mine >= 0 && (i64)mine < p.s_kv) ? 1 : 0;
    const u32 tile = k_base + buf * T::kTileBytes;
#pragma unroll
    for (int pass = 0; pass < 4; ++pass) {
      const i32 idx = __shfl_sync(0xffffffffu, mine, pass * 4 + r4);
      const bool valid = idx >= 0 && (i64)idx < p.s_kv;
      const u16* src = p.kv + (valid ? (i64)idx * p.kv_stride : 0);
      const u32 r = row0 + pass * 4 + r4;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        const u32 chunk = b * 8 + c8;
        mma::cp_async_16_policy(tile + T::offset(r, chunk), src + chunk * 8, valid ? 16u : 0u, keep);
      }
    }
    mma::cp_async_commit();
  }
  publish(steps - 1);
}

template <int kHeads, int kTopk, int kDqk>
NSA_DEVICE void sparse_prefill(const Params& p) {
  static_assert(kHeads % 16 == 0 && kHeads > 16, "17+ heads in 64-head tiles (the last may be partial)");
  static_assert(kTopk % kBlockTokens == 0, "top-k is a multiple of 64");
  typedef attend_wg::Smem<kDqk> L;
  constexpr int kHeadTiles = (kHeads + kHT - 1) / kHT;

  extern NSA_SHARED Vec16 smem_vec[];
  u8* smem = attend_wg::aligned_smem(smem_vec);
  const u32 base = mma::smem_addr(smem);
  const u32 tid = thread_x();

  const auto [ht, row] = cta_tile<kHeadTiles>();
  if (row >= p.s_q) return;

  const i32 valid_len = row_topk_len<kTopk>(p.topk_length, row);
  const i32 steps = (valid_len + kBlockTokens - 1) / kBlockTokens;

  const u32 head0 = ht * kHT;
  const u32 rows = kHeads - head0 < (u32)kHT ? kHeads - head0 : (u32)kHT;  // heads of this tile
  attend_wg::load_q<kDqk, kThreads>(p.q + (row * kHeads + head0) * kDqk, base + L::kQ, rows);
  sync_block();
  if (tid >= (u32)kConsumerThreads) {
    wg::regs_set<kLaunchRegs, kRegsProducer>();
    if (steps > 0) produce_tile<kTopk, kDqk>(p, base + L::kK, smem + L::kValid, row, valid_len, steps);
    return;
  }

  attend_wg::Consumers<kDqk, kThreads, kLaunchRegs, kRegsWg0, kRegsWg1> c(tid);
  c.run(smem, base, steps, p.sm_scale * kLog2e);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const u32 head = head0 + c.ln.r0 + 8 * h;
    if (head >= (u32)kHeads) continue;  // a zero row of a partial tile
    const bool empty = !(c.l[h] > 0.0f);
    const i64 at = row * kHeads + head;
    c.store_bf16(p.out + at * kDv, h, empty ? 0.0f : 1.0f / c.l[h]);
    if (c.group == 0 && c.ln.t == 0) {
      p.max_logits[at] = empty ? neg_inf() : c.m[h] * kLn2;
      p.lse[at] = empty ? pos_inf() : (c.m[h] + mma::log2_approx(c.l[h])) * kLn2;
    }
  }
}

}  // namespace prefill_wg
}  // namespace nsa
