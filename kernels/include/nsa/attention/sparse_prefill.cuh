// Sparse MLA prefill over bf16 KV (spec §8.1, §8.2), playbook stage P1: one CTA
// per (query token, head tile). Producers (4 warps) gather the chosen KV rows with
// 16-byte cp.async (zero-filled for a masked index, so no register staging and no
// dequant) into a ring of kSlots slots of 32 rows; the consumer warps are the
// decode kernel's (sparse_attend.cuh) and take two slots per 64-token step.
// Outputs out, max_logits and lse in natural-log units.
#pragma once
#include "nsa/cuda/bulk.cuh"
#include "nsa/attention/sparse_attend.cuh"

namespace nsa {
namespace prefill {

using namespace attend;
// cp.async moves rows without touching registers: 4 producer warps suffice, and
// the smaller CTA (384 threads) lets the consumers use up to 168 registers.
constexpr int kProducerWarps = 4;
constexpr int kProducerThreads = kProducerWarps * 32;
constexpr int kThreads = kConsumerThreads + kProducerThreads;

// Mirrors `SparsePrefillParams` in nsa-runtime (ops/sparse_prefill.rs) field for field.
struct Params {
  const u16* q;            // [s_q, heads, d_qk] bf16
  const u16* kv;           // s_kv rows of d_qk bf16 (512 latent first), kv_stride elements apart
  const i32* indices;      // [s_q, kTopk] kv rows; -1, negative or >= s_kv = masked
  const i32* topk_length;  // [s_q] valid prefix of each index row, or null (all kTopk)
  u16* out;                // [s_q, heads, 512] bf16
  float* max_logits;       // [s_q, heads] max of sm_scale * q.k, -inf for a row with no key
  float* lse;              // [s_q, heads] natural log, +inf for a row with no key
  i64 kv_stride;           // elements from one kv row to the next (multiple of 8)
  i64 s_kv;
  i64 s_q;
  float sm_scale;
};

// The ring: kSlots slots of 32 KV rows. Two 64-row buffers kept a single step of
// rows in flight while the consumers held the other; five slots (what fits beside
// a 16-head Q tile and the split-K partials) keep three in flight and let a warp
// start on its half of a step early (h16 on the H200: about 2% faster).
constexpr int kSlotRows = kHalfTokens;
constexpr int kSlots = 5;

// Shared memory: Q [kHT][kDqk], the slot ring, P [kHT][64] (padded rows), per-warp
// row partials, validity flags per slot, for 16-head tiles the partial S of each
// dims quarter, then a full and an empty mbarrier per slot.
template <int kHT, int kDqk>
struct RingSmem {
  typedef Rows<kDqk> R;
  static constexpr int kNW = kConsumerWarps / (kHT / 16);
  static constexpr u32 kSlotBytes = kSlotRows * R::kBytes;
  static constexpr u32 kQ = 0;
  static constexpr u32 kRing = kQ + kHT * R::kBytes;
  static constexpr u32 kP = kRing + kSlots * kSlotBytes;
  static constexpr u32 kRed = kP + kHT * kPRowBytes;
  static constexpr u32 kValid = kRed + kNW * kHT * 4;
  static constexpr u32 kPart = kValid + kSlots * kSlotRows;
  static constexpr u32 kFull = kPart + (kHT == 16 ? kQuarters * 16 * kPartStride * 4 : 0);
  static constexpr u32 kEmpty = kFull + kSlots * 8;
  static constexpr u32 kBytes = kEmpty + kSlots * 8;
  static_assert(kPart % 16 == 0 && kFull % 8 == 0, "vector and mbarrier alignment");
};

// A slot of the ring and the parity of its current use (flips at each wrap).
struct RingPos {
  u32 slot = 0, phase = 0;
  NSA_DEVICE void advance() {
    if (++slot == (u32)kSlots) {
      slot = 0;
      phase ^= 1u;
    }
  }
};

// A slot is full once every producer thread's plain arrival (ordering its flag
// store) and its cp.async arrival (its copies landed) are in; empty once every
// consumer thread is done with it.
constexpr u32 kFullArrivals = 2 * kProducerThreads;
constexpr u32 kEmptyArrivals = kConsumerThreads;

// Producer warps: warp w copies rows 8 w .. 8 w + 7 of every slot, one row at a
// time with the whole warp (lane l moves 16-byte chunks l, l + 32, ...), so every
// cp.async instruction reads 512 contiguous bytes. Lanes 0..15 hold the step's 16
// indices of the warp (lane / 8 = the token half), read kIndexAhead steps ahead. The
// producers never wait for their own copies: the slot's mbarrier counts them.
constexpr int kIndexAhead = 4;
template <int kTopk, int kDqk, class L>
NSA_DEVICE void produce(const Params& p, u32 base, u8* smem, i64 row, i32 valid_len, i32 steps) {
  typedef Rows<kDqk> R;
  constexpr int kRowsPerWarp = kSlotRows / kProducerWarps;
  constexpr int kRounds = (R::kChunks + 31) / 32;
  const u32 lane = thread_x() % 32;
  const u32 row0 = (thread_x() / 32 - kConsumerWarps) * kRowsPerWarp;
  const i32* idx_row = p.indices + row * kTopk;
  auto index_at = [&](i32 step) -> i32 {
    const i32 pos = step * kBlockTokens + (i32)((lane / kRowsPerWarp) * kSlotRows + row0 + lane % kRowsPerWarp);
    return (lane < 2u * kRowsPerWarp && pos < valid_len) ? mma::ldg_stream_i32(idx_row + pos) : -1;
  };
  auto usable = [&](i32 idx) { return idx >= 0 && (i64)idx < p.s_kv; };
  const u64 keep = mma::l2_evict_last_policy();  // the KV rows: see l2_evict_last_policy
  RingPos at;
  // Index loads kIndexAhead steps ahead, rotated through registers: one step ahead
  // left the producers waiting on them (ncu: the shuffle of the loaded index).
  i32 ahead[kIndexAhead];
#pragma unroll
  for (int i = 0; i < kIndexAhead; ++i) ahead[i] = i < steps ? index_at(i) : -1;
  for (i32 step = 0; step < steps; ++step) {
    const i32 mine = ahead[0];
#pragma unroll
    for (int i = 0; i + 1 < kIndexAhead; ++i) ahead[i] = ahead[i + 1];
    ahead[kIndexAhead - 1] = step + kIndexAhead < steps ? index_at(step + kIndexAhead) : -1;
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
      const u32 full = base + L::kFull + at.slot * 8;
      if (step * 2 + h >= kSlots) bulk::mbar_wait(base + L::kEmpty + at.slot * 8, at.phase ^ 1u);
      const i32 flag_idx = __shfl_sync(0xffffffffu, mine, h * kRowsPerWarp + lane % kRowsPerWarp);
      if (lane < (u32)kRowsPerWarp) smem[L::kValid + at.slot * kSlotRows + row0 + lane] = usable(flag_idx) ? 1 : 0;
      const u32 tile = base + L::kRing + at.slot * L::kSlotBytes;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const i32 idx = __shfl_sync(0xffffffffu, mine, h * kRowsPerWarp + r);
        const bool valid = usable(idx);
        const u16* src = p.kv + (valid ? (i64)idx * p.kv_stride : 0);
        const u32 dst = tile + R::offset(row0 + r, 0);
#pragma unroll
        for (int c = 0; c < kRounds; ++c) {
          const u32 chunk = c * 32 + lane;
          if (chunk < (u32)R::kChunks)
            mma::cp_async_16_policy(dst + chunk * 16, src + chunk * 8, valid ? 16u : 0u, keep);
        }
      }
      bulk::mbar_arrive(full);
      bulk::mbar_arrive_on_cp_async(full);
      at.advance();
    }
  }
}

// Consumer warps: step s takes slots 2 s and 2 s + 1 (token halves 0 and 1); a
// warp waits for its own half before Q K^T and for the other before P V.
// 16-head tiles are software-pipelined: the next step's Q K^T partials (registers
// only) sit in one basic block with this step's P V, so the scheduler interleaves
// the two chains of mma; after the last step that Q K^T reads a stale slot and is
// dropped.
template <class C, class L>
NSA_DEVICE void consume(C& c, u8* smem, u32 base, i32 steps, float c_scale) {
  auto slot_at = [&](RingPos at) { return base + L::kRing + at.slot * L::kSlotBytes; };
  auto slot_tile = [&](RingPos a, RingPos b) {
    return StepTile{slot_at(a), slot_at(b), smem + L::kValid + a.slot * kSlotRows, smem + L::kValid + b.slot * kSlotRows};
  };
  auto wait_full = [&](RingPos at) { bulk::mbar_wait(base + L::kFull + at.slot * 8, at.phase); };
  auto release = [&](RingPos at) { bulk::mbar_arrive(base + L::kEmpty + at.slot * 8); };
  RingPos a, b = a;
  b.advance();
  if constexpr (C::kSplitK) {
    float ps[C::kSplitTiles][4];
    if (steps > 0) {
      wait_full(c.half ? b : a);
      c.qk_partial(c.half ? slot_at(b) : slot_at(a), ps);
    }
    for (i32 step = 0; step < steps; ++step) {
      const StepTile tile = slot_tile(a, b);
      RingPos na = b, nb;
      na.advance();
      nb = na;
      nb.advance();
      float s[C::kNT][4];
      c.meet(ps, s[0]);
      c.softmax_p(smem, tile, s, c_scale);
      wait_full(c.half ? a : b);
      if (step + 1 < steps) wait_full(c.half ? nb : na);
      c.qk_partial(c.half ? slot_at(nb) : slot_at(na), ps);
      c.pv(tile);
      release(a);
      release(b);
      a = na;
      b = nb;
    }
  } else {
    for (i32 step = 0; step < steps; ++step) {
      const StepTile tile = slot_tile(a, b);
      wait_full(c.half ? b : a);
      c.qk_softmax(smem, tile, c_scale);
      wait_full(c.half ? a : b);
      c.pv(tile);
      release(a);
      release(b);
      b.advance();
      a = b;
      b.advance();
    }
  }
}

// This CTA's head tile and query token. Head tiles of one token are adjacent block
// ids, so they gather the same rows at about the same time and share them through L2.
struct CtaTile {
  u32 ht;
  i64 row;
};

template <int kHeadTiles>
NSA_DEVICE CtaTile cta_tile() {
  const u32 bid = block_x();
  return CtaTile{bid % kHeadTiles, (i64)(bid / kHeadTiles)};
}

template <int kHeads, int kHT, int kTopk, int kDqk, int kQkUnroll>
NSA_DEVICE void sparse_prefill(const Params& p) {
  static_assert(kTopk % kBlockTokens == 0, "top-k is a multiple of 64");
  typedef RingSmem<kHT, kDqk> L;
  constexpr int kHeadTiles = (kHeads + kHT - 1) / kHT;

  extern NSA_SHARED Vec16 smem_vec[];  // 16-byte aligned (ldmatrix, cp.async)
  u8* smem = reinterpret_cast<u8*>(smem_vec);
  const u32 base = mma::smem_addr(smem);
  const u32 warp = thread_x() / 32, lane = thread_x() % 32;

  const auto [ht, row] = cta_tile<kHeadTiles>();
  if (row >= p.s_q) return;

  const i32 valid_len = row_topk_len<kTopk>(p.topk_length, row);
  const i32 steps = (valid_len + kBlockTokens - 1) / kBlockTokens;

  const u32 head0 = ht * kHT;
  if (thread_x() == 0) {
    for (int s = 0; s < kSlots; ++s) {
      bulk::mbar_init(base + L::kFull + s * 8, kFullArrivals);
      bulk::mbar_init(base + L::kEmpty + s * 8, kEmptyArrivals);
    }
    bulk::mbar_init_fence();
  }
  sync_block();  // the barriers are initialised
  // The producers start gathering at once; only the consumers wait for Q.
  if (warp >= (u32)kConsumerWarps) {
    produce<kTopk, kDqk, L>(p, base, smem, row, valid_len, steps);
    return;
  }
  load_q_tile<kHeads, kHT, kDqk, kConsumerThreads>(p.q + row * kHeads * kDqk, head0, base + L::kQ);
  mma::bar_sync(kBarConsumers, kConsumerThreads);

  Consumer<kHT, kDqk, kQkUnroll, kThreads, L> c(base, warp, lane);
  consume<decltype(c), L>(c, smem, base, steps, p.sm_scale * kLog2e);
  float l_tot[2];
  c.row_sums(smem, l_tot);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const u32 head = head0 + c.mw * 16 + c.g + 8 * h;
    if (head >= (u32)kHeads) continue;
    const bool empty = !(l_tot[h] > 0.0f);
    const i64 at = row * kHeads + head;
    c.template store_bf16<true>(p.out + at * kDv, h, empty ? 0.0f : 1.0f / l_tot[h]);
    if (c.nw == 0 && c.t == 0) {
      p.max_logits[at] = empty ? neg_inf() : c.m_run[h] * kLn2;
      p.lse[at] = empty ? pos_inf() : (c.m_run[h] + mma::log2_approx(l_tot[h])) * kLn2;
    }
  }
}

}  // namespace prefill
}  // namespace nsa
