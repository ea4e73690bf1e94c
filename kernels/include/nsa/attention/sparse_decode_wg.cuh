// Sparse MLA decode over the FP8-656 cache with warp-group MMA (sm_90a, playbook
// stage D3), for head counts that are a multiple of 64: one CTA per (query row,
// 64-head tile, KV split). The consumers are sparse_attend_wg.cuh's two warp
// groups; the producer is one warp group running sparse_decode.cuh's producer
// with two token shares per thread (a fourth group would cap the kernel at 128
// registers per thread, and ptxas then serializes the wgmma chains). Outputs and
// split partials are those of the mma.sync kernel.
#pragma once
#include "nsa/attention/sparse_attend_wg.cuh"
#include "nsa/attention/sparse_decode.cuh"

namespace nsa {
namespace decode_wg {

using namespace decode;
using attend_wg::kGroupThreads;
using attend_wg::kHT;
typedef attend_wg::Smem<kDqk> Smem;
typedef attend_wg::Tile<kDqk> Tile;
constexpr int kThreads = 3 * kGroupThreads;  // WG0, WG1, producer
static_assert(kConsumerThreads == 2 * kGroupThreads, "two consumer warp groups");

// setmaxnreg budgets. The CTA is launched with 64K / 384 registers per thread,
// rounded down to a multiple of 8 (168), and setmaxnreg only moves registers
// between its warp groups: an increase that the decreases do not cover waits
// forever. WG0 holds S and half of O, WG1 half of O, the producer two gathered
// token shares.
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kRegsWg0 = 208;
constexpr int kRegsWg1 = 160;
constexpr int kRegsProducer = 136;
static_assert(kRegsWg0 + kRegsWg1 + kRegsProducer <= 3 * kLaunchRegs, "setmaxnreg moves registers, never adds");

template <int kHeads, int kTopk, int kPage>
NSA_DEVICE void sparse_decode(const Params& p, u32* status) {
  static_assert(kHeads % kHT == 0, "the warp-group kernel takes whole 64-head tiles");
  static_assert(kTopk % kBlockTokens == 0, "top-k is a multiple of 64");
  constexpr int kHeadTiles = kHeads / kHT;

  extern NSA_SHARED Vec16 smem_vec[];
  u8* smem = attend_wg::aligned_smem(smem_vec);
  const u32 base = mma::smem_addr(smem);
  const u32 tid = thread_x();

  const auto [ht, row, split] = cta_tile<kHeadTiles>(p);
  if (row >= p.rows) return;

  const SplitRange r = split_range<kTopk>(p, row, split);
  const i32 first = r.first, last = r.last, steps = r.steps;

  const u32 head0 = ht * kHT;
  attend_wg::load_q<kDqk, kThreads>(p.q + (row * kHeads + head0) * kDqk, base + Smem::kQ);
  sync_block();

  if (tid >= (u32)kConsumerThreads) {
    wg::regs_set<kLaunchRegs, kRegsProducer>();
    if (steps > 0)
      produce<Tile, true, 2, 1, kThreads, kTopk, kPage>(p, base + Smem::kK, smem + Smem::kValid, row, first, last,
                                                        steps, ht == 0, status);
    return;
  }

  attend_wg::Consumers<kDqk, kThreads, kLaunchRegs, kRegsWg0, kRegsWg1> c(tid);
  c.run(smem, base, steps, p.sm_scale * kLog2e);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const u32 head = head0 + c.ln.r0 + 8 * h;
    const bool empty = !(c.l[h] > 0.0f);
    const float inv = empty ? 0.0f : 1.0f / c.l[h];
    const bool writes_lse = c.group == 0 && c.ln.t == 0;
    if (p.splits == 1) {
      c.store_bf16(p.out + (row * kHeads + head) * kDv, h, inv);
      if (writes_lse) p.lse[row * kHeads + head] = empty ? pos_inf() : (c.m[h] + mma::log2_approx(c.l[h])) * kLn2;
    } else {
      const i64 slot = (row * p.splits + split) * kHeads + head;
      c.store_f32(p.o_part + slot * kDv, h, inv);
      if (writes_lse) p.lse_part[slot] = empty ? neg_inf() : c.m[h] + mma::log2_approx(c.l[h]);
    }
  }
}

}  // namespace decode_wg
}  // namespace nsa
