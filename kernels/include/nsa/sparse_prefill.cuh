// Sparse MLA prefill over bf16 KV (spec §8.1, §8.2), playbook stage P1: one CTA
// per (query token, head tile). Producers (4 warps) gather the chosen KV rows
// straight into the double-buffered K/V tile with 16-byte cp.async (zero-filled
// for a masked index, so no register staging and no dequant); the consumer warps
// are the decode kernel's (sparse_attend.cuh). Outputs out, max_logits and lse in
// natural-log units.
#pragma once
#include "nsa/sparse_attend.cuh"

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

// Producer warps: each 64-token step, warp w copies rows 16 w .. 16 w + 15 of the
// buffer, one row at a time with the whole warp (lane l moves 16-byte chunks l,
// l + 32, ...), so every cp.async instruction reads 512 contiguous bytes. Lanes
// 0..15 hold the step's 16 indices, read one step ahead. A buffer is published
// (full) once its cp.async group has landed, one step behind the issue, so two
// steps of loads are in flight.
template <int kTopk, int kDqk>
NSA_DEVICE void produce(const Params& p, u32 k_base, u8* flags, i64 row, i32 valid_len, i32 steps) {
  typedef Rows<kDqk> R;
  constexpr int kRowsPerWarp = kBlockTokens / kProducerWarps;
  constexpr int kRounds = (R::kChunks + 31) / 32;
  static_assert(kRowsPerWarp <= 32, "one index per lane");
  const u32 lane = thread_x() % 32;
  const u32 row0 = (thread_x() / 32 - kConsumerWarps) * kRowsPerWarp;
  const i32* idx_row = p.indices + row * kTopk;
  auto index_at = [&](i32 step) -> i32 {
    const i32 pos = step * kBlockTokens + (i32)(row0 + lane);
    return (lane < (u32)kRowsPerWarp && pos < valid_len) ? mma::ldg_stream_i32(idx_row + pos) : -1;
  };
  const u64 keep = mma::l2_evict_last_policy();  // the KV rows: see l2_evict_last_policy
  i32 next = index_at(0);
  for (i32 step = 0; step < steps; ++step) {
    const u32 buf = step & 1;
    const i32 mine = next;
    next = step + 1 < steps ? index_at(step + 1) : -1;
    if (step >= 2) mma::bar_sync(kBarEmpty + buf, kThreads);
    if (lane < (u32)kRowsPerWarp) flags[buf * kBlockTokens + row0 + lane] = (mine >= 0 && (i64)mine < p.s_kv) ? 1 : 0;
    const u32 tile = k_base + buf * R::kTileBytes;
#pragma unroll 4
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const i32 idx = __shfl_sync(0xffffffffu, mine, r);
      const bool valid = idx >= 0 && (i64)idx < p.s_kv;
      const u16* src = p.kv + (valid ? (i64)idx * p.kv_stride : 0);
      const u32 dst = tile + R::offset(row0 + r, 0);
#pragma unroll
      for (int c = 0; c < kRounds; ++c) {
        const u32 chunk = c * 32 + lane;
        if (chunk < (u32)R::kChunks)
          mma::cp_async_16_policy(dst + chunk * 16, src + chunk * 8, valid ? 16u : 0u, keep);
      }
    }
    mma::cp_async_commit();
    if (step >= 1) {
      mma::cp_async_wait<1>();
      mma::bar_arrive(kBarFull + (buf ^ 1), kThreads);
    }
  }
  mma::cp_async_wait<0>();
  mma::bar_arrive(kBarFull + ((steps - 1) & 1), kThreads);
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
  typedef Smem<kHT, kDqk> L;
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
  load_q_tile<kHeads, kHT, kDqk, kThreads>(p.q + row * kHeads * kDqk, head0, base + L::kQ);
  sync_block();
  if (warp >= (u32)kConsumerWarps) {
    if (steps > 0) produce<kTopk, kDqk>(p, base + L::kK, smem + L::kValid, row, valid_len, steps);
    return;
  }

  Consumer<kHT, kDqk, kQkUnroll, kThreads> c(base, warp, lane);
  c.run(smem, steps, p.sm_scale * kLog2e);
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
