// Sparse MLA decode over the FP8-656 cache with warp-group MMA (sm_90a, playbook
// stage D3), for head counts that are a multiple of 64: one CTA per (query row,
// 64-head tile, KV split). The consumers are sparse_attend_wg.cuh's two warp
// groups; the producer is one warp group running sparse_decode.cuh's producer
// with two token shares per thread (a fourth group would cap the kernel at 128
// registers per thread, and ptxas then serializes the wgmma chains). Outputs and
// split partials are those of the mma.sync kernel.
#pragma once
#include "nsa/cuda/bulk.cuh"
#include "nsa/cuda/cluster.cuh"
#include "nsa/sparse_attend_wg.cuh"
#include "nsa/sparse_decode.cuh"

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
// The cluster pair's producer holds two steps of rows (and DSMEM addresses): at
// 136 registers ptxas spilled it, so 8 registers move over from WG0.
constexpr int kPairRegsWg0 = 200;
constexpr int kPairRegsProducer = 144;
static_assert(kPairRegsWg0 + kRegsWg1 + kPairRegsProducer <= 3 * kLaunchRegs, "setmaxnreg moves registers, never adds");

// The cluster pair (playbook §1.5), for head counts that are a multiple of 128:
// the two 64-head tiles of a (query row, split) run as one cluster of two CTAs.
// The producer of rank r gathers and dequantizes tokens 32 r .. 32 r + 31 of every
// step into the K/V buffers of both CTAs (local stores and DSMEM stores), so each
// CTA dequantizes half of the tokens, and one token share per thread leaves room
// for two steps of gathered rows in registers. The handoff is by mbarriers at
// cluster scope: full[buf] counts the producer warps of both CTAs, empty[buf] the
// consumer warps of both CTAs (a producer writes into both CTAs' buffers).
template <int kHeads>
constexpr bool kPaired = kHeads % (2 * kHT) == 0;
constexpr int kPairTokens = kBlockTokens / 2;  // tokens each CTA's producer gathers per step
constexpr u32 kBarFullPair = Smem::kValid + 2 * kBlockTokens;  // 2 mbarriers, then 2 empty ones
constexpr u32 kBarEmptyPair = kBarFullPair + 16;
constexpr u32 kFullArrivals = 2 * (kGroupThreads / 32);
constexpr u32 kEmptyArrivals = 2 * (kConsumerThreads / 32);
static_assert(kBarFullPair % 8 == 0, "mbarriers are 8-byte aligned");

// Dynamic shared memory of the kernel: the pair adds its four mbarriers.
template <int kHeads>
constexpr u32 kSmemBytes = Smem::kBytes + (kPaired<kHeads> ? 32 : 0);

NSA_DEVICE u32 lane_id() { return thread_x() % 32; }

template <bool kFirst, class A, class B>
struct Select {
  typedef A Type;
};
template <class A, class B>
struct Select<false, A, B> {
  typedef B Type;
};

// Dequantized chunks and flags into this CTA's buffer and the peer's.
struct PairSink {
  typedef u32 Addr;  // the offset in both buffers
  u32 kbuf, peer_kbuf;
  u8* flags;
  u32 peer_flags;
  NSA_DEVICE Addr at(u32 offset) const { return offset; }
  NSA_DEVICE void put(Addr offset, const Vec16& v) const {
    mma::sts_v4(kbuf + offset, v);
    cluster::store_v4(peer_kbuf + offset, v);
  }
  NSA_DEVICE void flag(u32 token, bool valid) const {
    flags[token] = valid ? 1 : 0;
    cluster::store_u8(peer_flags + token, valid ? 1u : 0u);
  }
};

// Consumer side of the pair: wait on this CTA's full barrier; a warp's release
// arrives once on the empty barriers of both CTAs.
struct PairHandoff {
  u32 bars;       // this CTA's shared-memory address of full[0]
  u32 peer_bars;  // the peer's full[0] (cluster address)
  NSA_DEVICE void wait_full(u32 buf, i32 step) const {
    cluster::mbar_wait(bars + 8 * buf, ((u32)step >> 1) & 1);
  }
  NSA_DEVICE void release(u32 buf) const {
    __syncwarp();
    if (lane_id() == 0) {
      cluster::mbar_arrive(bars + (kBarEmptyPair - kBarFullPair) + 8 * buf);
      cluster::mbar_arrive_remote(peer_bars + (kBarEmptyPair - kBarFullPair) + 8 * buf);
    }
  }
};

// The pair's producer group: one token share per thread (token 32 rank + ptid / 4,
// scale tile ptid % 4), two steps of rows in registers, the rows of step + 3
// prefetched into L2, index entries loaded a step before their prefetch (see
// `produce`).
template <int kTopk, int kPage>
NSA_DEVICE void produce_pair(const Params& p, u32 base, u8* smem, u32 rank, i64 row, i32 first, i32 last, i32 steps,
                             bool report, u32* status) {
  const u32 ptid = thread_x() - kConsumerThreads;
  const u32 token = kPairTokens * rank + ptid / kPartsPerToken, part = ptid % kPartsPerToken;
  static_assert(kPartsPerToken * kPairTokens == kGroupThreads, "one token share per producer thread");
  const u32 peer = rank ^ 1u;
  const u32 peer_base = cluster::map(base, peer);
  const u32 bars = base + kBarFullPair, peer_bars = peer_base + kBarFullPair;
  report = report && part == 0;
  auto pos_of = [&](i32 step) { return first + step * kBlockTokens + (i32)token; };
  auto raw = [&](i32 step) { return raw_slot<kTopk>(p, row, pos_of(step), last); };
  auto slot = [&](i32 s, i32 step) { return checked_slot<kTopk>(p, s, row, pos_of(step), report, status); };
  Gather g[2];
  issue_gather<kPage>(p, slot(raw(0), 0), part, g[0]);
  issue_gather<kPage>(p, slot(raw(1), 1), part, g[1]);
  i32 next = raw(2), after = raw(3);  // raw entries of steps + 2 and + 3
  prefetch_record<kPage>(p, quiet_slot(p, next), part);
  for (i32 step0 = 0; step0 < steps; step0 += 2) {
#pragma unroll
    for (int buf = 0; buf < 2; ++buf) {
      const i32 step = step0 + buf;
      if (step >= steps) break;
      const i32 later = raw(step + 4);
      prefetch_record<kPage>(p, quiet_slot(p, after), part);
      // Both CTAs' consumers are done with the step that last used this buffer.
      if (step >= 2) cluster::mbar_wait(bars + (kBarEmptyPair - kBarFullPair) + 8 * buf, (((u32)step >> 1) & 1) ^ 1);
      const u32 tile = Smem::kK + buf * Tile::kTileBytes, flags = Smem::kValid + buf * kBlockTokens;
      store_gather<Tile>(g[buf], PairSink{base + tile, peer_base + tile, smem + flags, peer_base + flags}, token, part);
      cluster::fence_proxy_async();
      __syncwarp();
      if (lane_id() == 0) {
        cluster::mbar_arrive(bars + 8 * buf);
        cluster::mbar_arrive_remote(peer_bars + 8 * buf);
      }
      if (step + 2 < steps) issue_gather<kPage>(p, slot(next, step + 2), part, g[buf]);
      next = after;
      after = later;
    }
  }
}

template <int kHeads, int kTopk, int kPage>
NSA_DEVICE void sparse_decode(const Params& p, u32* status) {
  static_assert(kHeads % kHT == 0, "the warp-group kernel takes whole 64-head tiles");
  static_assert(kTopk % kBlockTokens == 0, "top-k is a multiple of 64");
  constexpr int kHeadTiles = kHeads / kHT;
  constexpr bool kPair = kPaired<kHeads>;

  extern NSA_SHARED Vec16 smem_vec[];
  u8* smem = attend_wg::aligned_smem(smem_vec);
  const u32 base = mma::smem_addr(smem);
  const u32 tid = thread_x();

  // Both CTAs of a pair share the row and split: they leave together.
  const auto [ht, row, split] = cta_tile<kHeadTiles>(p);
  if (row >= p.rows) return;

  const SplitRange r = split_range<kTopk>(p, row, split);
  const i32 first = r.first, last = r.last, steps = r.steps;

  const u32 head0 = ht * kHT;
  attend_wg::load_q<kDqk, kThreads>(p.q + (row * kHeads + head0) * kDqk, base + Smem::kQ);
  if (kPair) {
    if (tid == 0) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        bulk::mbar_init(base + kBarFullPair + 8 * b, kFullArrivals);
        bulk::mbar_init(base + kBarEmptyPair + 8 * b, kEmptyArrivals);
      }
      bulk::mbar_init_fence();
    }
    cluster::sync();  // the peer's barriers exist before any remote arrival
  } else {
    sync_block();
  }

  if (tid >= (u32)kConsumerThreads) {
    if constexpr (kPair) {
      wg::regs_set<kLaunchRegs, kPairRegsProducer>();
      // Rejected slots are counted by the first pair of head tiles.
      if (steps > 0) produce_pair<kTopk, kPage>(p, base, smem, cluster::rank(), row, first, last, steps, ht < 2, status);
      cluster::sync();  // see the end of the kernel
    } else {
      wg::regs_set<kLaunchRegs, kRegsProducer>();
      if (steps > 0)
        produce<Tile, true, 2, 1, kThreads, kTopk, kPage>(p, base + Smem::kK, smem + Smem::kValid, row, first, last,
                                                          steps, ht == 0, status);
    }
    return;
  }
  typedef typename Select<kPair, PairHandoff, attend_wg::NamedHandoff<kThreads>>::Type Handoff;
  attend_wg::Consumers<kDqk, kThreads, kLaunchRegs, kPair ? kPairRegsWg0 : kRegsWg0, kRegsWg1, Handoff> c(tid);
  Handoff hand;
  if constexpr (kPair) hand = PairHandoff{base + kBarFullPair, cluster::map(base, cluster::rank() ^ 1u) + kBarFullPair};
  c.run(smem, base, steps, p.sm_scale * kLog2e, hand);
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
  // A CTA's shared memory must outlive the peer's last DSMEM access to it.
  if constexpr (kPair) cluster::sync();
}

}  // namespace decode_wg
}  // namespace nsa
