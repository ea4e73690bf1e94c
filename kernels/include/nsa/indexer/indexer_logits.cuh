// Lightning-indexer logits (spec §6): for query row t and key s,
//   logit[t, s] = sum_h weights[t, h] * max(0, k_scale[s] * sum_d q[t, h, d] * k[s, d])
// with q and k e4m3 (exact products, f32 accumulate in FP8 mma.sync m16n8k32).
// One CTA of 4 warps per (query row, chunk of 64-token key blocks); each warp owns
// 16 keys of a block and all kHeads heads, with Q and K fragments loaded straight
// from global memory (no shared memory, no barriers).
//
// The 128 dims are permuted identically for Q and K (a dot product does not care):
// lane (g, t) of an mma reads the 32 contiguous bytes [32 t, 32 t + 32) of its row,
// and word i of them is the 4-byte k-group of k-step i / 2, half i % 2.
#pragma once
#include "nsa/common/status.cuh"
#include "nsa/cuda/mma.cuh"

namespace nsa {
namespace indexer {

constexpr int kDim = 128;
constexpr int kPageTokens = 64;
constexpr int kPageScales = kPageTokens * kDim;  // byte offset of a page's scales
constexpr int kPageBytes = kPageTokens * (kDim + 4);
constexpr int kBlockTokens = 64;  // keys per CTA step (one indexer page)
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpTokens = kBlockTokens / kWarps;  // 16 keys: two n8 tiles per warp

enum Layout { kPaged = 0, kRagged = 1 };

// Mirrors `IndexerLogitsParams` in nsa-runtime (ops/indexer.rs) field for field.
struct Params {
  const u8* q;              // [rows, kHeads, 128] e4m3
  const float* weights;     // [rows, kHeads] (q scale and softmax scales folded in)
  const u8* keys;           // paged: indexer cache pages; ragged: [num_keys, 128] e4m3
  const float* key_scales;  // ragged: [num_keys]; paged: unused (scales live in the pages)
  const i32* block_table;   // paged: [batch, table_width] page ids
  const i32* lengths;       // paged: [batch] context lengths
  const i32* ks;            // ragged: [rows] first visible key
  const i32* ke;            // ragged: [rows] one past the last visible key
  float* logits;            // [rows, logits_stride] f32
  i64 logits_stride;
  i64 num_keys;             // paged: cache pages * 64 (a page id past it is rejected); ragged: keys
  i32 rows;
  i32 next_n;               // paged: query rows per request
  i32 table_width;          // paged: page ids per request
  i32 blocks_per_cta;       // 64-key blocks one CTA walks
  i32 chunks;               // CTAs per query row
  i64 fill_width;           // columns [0, fill_width) a row does not see get -inf (0: left unwritten)
};

// The 32 bytes a lane owns of a 128-byte row (8 words).
struct Row32 {
  Vec16 lo, hi;
  NSA_DEVICE u32 word(int i) const { return i < 4 ? lo.w[i] : hi.w[i - 4]; }
};

NSA_DEVICE Row32 load_row32(const u8* row, u32 t) {
  Row32 r;
  r.lo = *reinterpret_cast<const Vec16*>(row + 32 * t);
  r.hi = *reinterpret_cast<const Vec16*>(row + 32 * t + 16);
  return r;
}

NSA_DEVICE float relu(float x) { return x > 0.0f ? x : 0.0f; }

__noinline__ __device__ void report_rejected(u32* status, i64 index) { report_bad_entry(status, index); }

// -inf into the columns [0, fill_width) of `row` outside its visible keys [lo, hi)
// (all of them when hi <= lo), the row's CTA `chunk` of p.chunks taking an equal
// share, so a masked row needs no pass of its own after the kernel.
NSA_DEVICE void fill_unseen(const Params& p, i64 row, i64 lo, i64 hi, i32 chunk) {
  if (p.fill_width <= 0) return;
  if (hi <= lo) lo = hi = 0;
  const i64 share = (p.fill_width + p.chunks - 1) / p.chunks;
  const i64 c0 = (i64)chunk * share;
  const i64 c1 = c0 + share < p.fill_width ? c0 + share : p.fill_width;
  float* out = p.logits + row * p.logits_stride;
  const float ninf = u32_as_f32(0xff800000u);
  const i64 below = lo < c1 ? lo : c1;  // [c0, below) lies before the visible keys
  for (i64 c = c0 + thread_x(); c < below; c += kThreads) out[c] = ninf;
  for (i64 c = (hi > c0 ? hi : c0) + thread_x(); c < c1; c += kThreads) out[c] = ninf;
}

template <int kHeads, int kLayout>
NSA_DEVICE void indexer_logits(const Params& p, u32* status) {
  static_assert(kHeads % 16 == 0 && kHeads <= 64, "heads: a multiple of 16 up to 64");
  constexpr int kMT = kHeads / 16;
  const u32 bid = block_x();
  const i64 row = bid / (u32)p.chunks;
  const i32 chunk = (i32)(bid % (u32)p.chunks);
  if (row >= p.rows) return;
  const u32 warp = thread_x() / 32, lane = thread_x() % 32;
  const u32 g = lane / 4, t = lane % 4;

  // Visible keys [lo, hi) of this row.
  i64 lo = 0, hi = 0, req = 0;
  if constexpr (kLayout == kPaged) {
    req = row / p.next_n;
    const i32 j = (i32)(row % p.next_n);
    const i64 len = (i64)p.lengths[req] - p.next_n + j + 1;
    const i64 cap = (i64)p.table_width * kPageTokens;
    hi = len < 0 ? 0 : (len < cap ? len : cap);
  } else {
    lo = p.ks[row] < 0 ? 0 : p.ks[row];
    hi = p.ke[row] < p.num_keys ? p.ke[row] : p.num_keys;
  }
  fill_unseen(p, row, lo, hi, chunk);
  const i64 first_block = lo / kBlockTokens + (i64)chunk * p.blocks_per_cta;
  i64 end_block = (hi + kBlockTokens - 1) / kBlockTokens;
  if (first_block + p.blocks_per_cta < end_block) end_block = first_block + p.blocks_per_cta;
  if (hi <= lo || first_block >= end_block) return;

  // Q fragments (rows g, g + 8 of each 16-head tile) and the head weights, kept for
  // the whole CTA.
  const u8* q_row = p.q + row * kHeads * kDim;
  Row32 q[kMT][2];
  float w[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      q[mt][h] = load_row32(q_row + (mt * 16 + g + 8 * h) * kDim, t);
      w[mt][h] = p.weights[row * kHeads + mt * 16 + g + 8 * h];
    }
  }

  for (i64 blk = first_block; blk < end_block; ++blk) {
    // This warp's 16 keys: key rows and scales of its two n8 tiles.
    const u8* key_base;
    const float* scale_base;
    if constexpr (kLayout == kPaged) {
      const i32 page = p.block_table[req * p.table_width + blk];
      if (page < 0 || (i64)page * kPageTokens >= p.num_keys) {
        if (status != nullptr && thread_x() == 0) report_rejected(status, req * p.table_width + blk);
        continue;  // the block's logits stay unwritten (unspecified)
      }
      const u8* pg = p.keys + (i64)page * kPageBytes;
      key_base = pg + warp * kWarpTokens * kDim;
      scale_base = reinterpret_cast<const float*>(pg + kPageScales) + warp * kWarpTokens;
    } else {
      // Keys past num_keys are clamped to the last one (their logits are not written).
      key_base = p.keys + (blk * kBlockTokens + warp * kWarpTokens) * kDim;
      scale_base = p.key_scales + blk * kBlockTokens + warp * kWarpTokens;
    }
    const i64 tok0 = blk * kBlockTokens + warp * kWarpTokens;
    float acc[kMT][2][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const i64 key = tok0 + nt * 8 + g;
      i64 off = nt * 8 + g;
      if (kLayout == kRagged && key >= p.num_keys) off -= key - (p.num_keys - 1);  // stay inside the tensor
      const Row32 k = load_row32(key_base + off * kDim, t);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const u32 a[4] = {q[mt][0].word(2 * kk), q[mt][1].word(2 * kk), q[mt][0].word(2 * kk + 1),
                            q[mt][1].word(2 * kk + 1)};
          mma::mma_e4m3(acc[mt][nt], a, k.word(2 * kk), k.word(2 * kk + 1));
        }
      }
    }
    // Columns 2t, 2t + 1 of each n8 tile: weighted ReLU over this thread's heads,
    // then over the 8 lanes sharing t; lanes 0..3 write.
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      float s[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float sum = 0.0f;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          sum += w[mt][0] * relu(acc[mt][nt][c]);
          sum += w[mt][1] * relu(acc[mt][nt][2 + c]);
        }
        sum += shfl_xor(sum, 4);
        sum += shfl_xor(sum, 8);
        sum += shfl_xor(sum, 16);
        s[c] = sum;
      }
      const i64 key = tok0 + nt * 8 + 2 * t;
      if (g == 0) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (key + c >= lo && key + c < hi) {
            p.logits[row * p.logits_stride + key + c] = scale_base[nt * 8 + 2 * t + c] * s[c];
          }
        }
      }
    }
  }
}

}  // namespace indexer
}  // namespace nsa
