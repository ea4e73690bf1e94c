// Lightning-indexer logits with warp-group FP8 MMA (sm_90a, playbook §3.2-3.3): one
// CTA of one warp group per (unit of query rows, chunk of 64-key blocks). A unit is
// a request's next_n rows (PAGED) or 4 consecutive rows (RAGGED, extend: their
// causal windows nearly coincide). Each 64-key block is copied once into a
// kStages-deep shared-memory ring with 16-byte cp.async (the next blocks' copies
// stay in flight while this one is multiplied) and serves every row of the unit:
//   S_j[key, head] = K[key, :] . Q_j[head, :]   (wgmma m64n64k32 e4m3, A = keys, B = Q_j)
//   logit_j[key] = k_scale[key] * sum_head w_j[head] * max(0, S_j[key, head])
// Keys on M put a key's 64 heads in one quad of lanes: the head sum is two shuffles.
// Outputs, masking and error reporting are those of indexer_logits.cuh.
#pragma once
#include "nsa/cuda/wgmma.cuh"
#include "nsa/indexer/indexer_logits.cuh"

namespace nsa {
namespace indexer_wg {

using namespace indexer;
constexpr int kHeads = 64;      // wgmma N
constexpr int kMaxNextN = 4;    // query rows per request (MTP)
constexpr int kStages = 4;      // pages in flight per CTA
constexpr u32 kTileBytes = kBlockTokens * kDim;  // 64 rows of 128 e4m3 bytes
constexpr u32 kScaleBytes = kBlockTokens * 4;
static_assert(kThreads == 128 && kHeads * kDim == (int)kTileBytes, "one warp group; Q and K tiles alike");

// Shared memory (from a 1024-byte aligned base): Q tiles of the request's rows, the
// ring of key tiles, the ring of key scales. kBytes includes the alignment slack.
struct Smem {
  static constexpr u32 kQ = 0;
  static constexpr u32 kKeys = kQ + kMaxNextN * kTileBytes;
  static constexpr u32 kScales = kKeys + kStages * kTileBytes;
  static constexpr u32 kBytes = kScales + kStages * kScaleBytes + 1024;
};
static_assert(kTileBytes % 1024 == 0, "swizzled tiles stay 1024-byte aligned");

// Rows [0, valid) of a 64-row x 128-byte block at `src` (rows 128 bytes apart) into
// the swizzled tile at `dst`, zeros for the rest: 8 threads per row, so a warp
// reads 4 whole rows per instruction.
NSA_DEVICE void copy_tile(u32 dst, const u8* src, i64 valid = kBlockTokens) {
#pragma unroll
  for (int i = 0; i < (int)kTileBytes / 16 / kThreads; ++i) {
    const u32 chunk = thread_x() + i * kThreads;
    const u32 r = chunk / 8, c = chunk % 8;
    const bool live = (i64)r < valid;
    mma::cp_async_16(dst + wg::sw128_offset(r, c), src + (live ? r * 128 + c * 16 : 0), live ? 16u : 0u);
  }
}

// The query rows of CTA `unit` and the keys each sees ([lo[j], hi[j]), empty when
// hi <= lo), as in indexer_logits.cuh: PAGED row j of a request sees
// [0, len - next_n + j + 1) capped by the table; RAGGED row t sees [ks[t], ke[t]).
template <int kLayout>
struct Unit {
  i64 row0 = 0;
  i32 rows = 0;
  i64 lo[kMaxNextN], hi[kMaxNextN];
  i64 lo_all = 0, hi_all = 0;  // the union's hull

  NSA_DEVICE Unit(const Params& p, i64 unit) {
    if constexpr (kLayout == kPaged) {
      if (unit >= p.rows / p.next_n) return;
      row0 = unit * p.next_n;
      rows = p.next_n;
    } else {
      row0 = unit * kMaxNextN;
      if (row0 >= p.rows) return;
      rows = p.rows - row0 < kMaxNextN ? (i32)(p.rows - row0) : kMaxNextN;
    }
    const i64 cap = (i64)p.table_width * kPageTokens;
    lo_all = (i64)0x7fffffffffffffffLL;
#pragma unroll
    for (int j = 0; j < kMaxNextN; ++j) {
      lo[j] = hi[j] = 0;
      if (j >= rows) continue;
      if constexpr (kLayout == kPaged) {
        const i64 len = (i64)p.lengths[unit] - p.next_n + j + 1;
        hi[j] = len < 0 ? 0 : (len < cap ? len : cap);
      } else {
        lo[j] = p.ks[row0 + j] < 0 ? 0 : p.ks[row0 + j];
        hi[j] = p.ke[row0 + j] < p.num_keys ? p.ke[row0 + j] : p.num_keys;
      }
      if (hi[j] > lo[j]) {
        lo_all = lo[j] < lo_all ? lo[j] : lo_all;
        hi_all = hi[j] > hi_all ? hi[j] : hi_all;
      }
    }
    if (hi_all == 0) lo_all = 0;
  }
};

template <int kLayout>
NSA_DEVICE void indexer_logits(const Params& p, u32* status) {
  extern NSA_SHARED Vec16 smem_vec[];
  const u32 raw = mma::smem_addr(smem_vec);
  const u32 base = (raw + 1023u) & ~1023u;
  const u8* smem = reinterpret_cast<const u8*>(smem_vec) + (base - raw);

  const u32 bid = block_x();
  const i64 unit_id = bid / (u32)p.chunks;
  const i32 chunk = (i32)(bid % (u32)p.chunks);
  const Unit<kLayout> u(p, unit_id);
  for (i32 j = 0; j < u.rows; ++j) fill_unseen(p, u.row0 + j, u.lo[j], u.hi[j], chunk);
  if (u.hi_all <= u.lo_all) return;
  const i64 first_block = u.lo_all / kBlockTokens + (i64)chunk * p.blocks_per_cta;
  i64 end_block = (u.hi_all + kBlockTokens - 1) / kBlockTokens;
  if (first_block + p.blocks_per_cta < end_block) end_block = first_block + p.blocks_per_cta;
  if (first_block >= end_block) return;
  const i32 blocks = (i32)(end_block - first_block);

  const u32 tid = thread_x();
  const u32 warp = tid / 32, lane = tid % 32;
  const u32 r0 = 16 * warp + lane / 4, t = lane % 4;
  // PAGED: the page of block b, or -1 for a rejected page id.
  auto page_at = [&](i32 b) -> i32 {
    const i32 page = p.block_table[unit_id * p.table_width + first_block + b];
    return (page < 0 || (i64)page * kPageTokens >= p.num_keys) ? -1 : page;
  };

  // Q tiles (the first cp.async group, with block 0) and this thread's head weights.
  for (i32 j = 0; j < u.rows; ++j) copy_tile(base + Smem::kQ + j * kTileBytes, p.q + (u.row0 + j) * kHeads * kDim);
  float w[kMaxNextN][16];
#pragma unroll
  for (int j = 0; j < kMaxNextN; ++j)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool live = j < u.rows;
      const float* wr = p.weights + (u.row0 + (live ? j : 0)) * kHeads + 8 * i + 2 * t;
      w[j][2 * i] = live ? wr[0] : 0.0f;
      w[j][2 * i + 1] = live ? wr[1] : 0.0f;
    }

  // One commit group per block (empty past the chunk or for a rejected page) keeps
  // the group count uniform.
  auto issue = [&](i32 b) {
    if (b < blocks) {
      const u32 slot = b % kStages;
      const u32 keys = base + Smem::kKeys + slot * kTileBytes, scales = base + Smem::kScales + slot * kScaleBytes;
      if constexpr (kLayout == kPaged) {
        const i32 page = page_at(b);
        if (page >= 0) {
          const u8* pg = p.keys + (i64)page * kPageBytes;
          copy_tile(keys, pg);
          if (tid < kScaleBytes / 16) mma::cp_async_16(scales + tid * 16, pg + kPageScales + tid * 16, 16u);
        }
      } else {
        // The last block may run past the tensor: those rows and scales are zeros.
        const i64 key0 = (first_block + b) * kBlockTokens;
        copy_tile(keys, p.keys + key0 * kDim, p.num_keys - key0);
        if (tid < kScaleBytes / 16) {
          const i64 first = key0 + 4 * tid;
          const i64 left = p.num_keys - first;
          if (left >= 4) {
            mma::cp_async_16(scales + tid * 16, p.key_scales + first, 16u);
          } else {
            // The tensor's last, partial group: plain loads (a partial cp.async is
            // still a 16-byte access for the sanitizer), zeros past the end.
            Vec16 v;
#pragma unroll
            for (int e = 0; e < 4; ++e) v.w[e] = e < left ? f32_as_u32(p.key_scales[first + e]) : 0u;
            mma::sts_v4(scales + tid * 16, v);
          }
        }
      }
    }
    mma::cp_async_commit();
  };
#pragma unroll
  for (int b = 0; b < kStages - 1; ++b) issue(b);

  for (i32 b = 0; b < blocks; ++b) {
    issue(b + kStages - 1);
    mma::cp_async_wait<kStages - 1>();
    mma::fence_proxy_async();
    sync_block();
    bool skip = false;
    if constexpr (kLayout == kPaged) {
      skip = page_at(b) < 0;
      if (skip && status != nullptr && tid == 0) report_rejected(status, unit_id * p.table_width + first_block + b);
    }
    if (!skip) {
      const u32 slot = b % kStages;
      const float* scales = reinterpret_cast<const float*>(smem + Smem::kScales + slot * kScaleBytes);
      // Lane t = 0 writes key r0, lane t = 1 key r0 + 8 (t = 2, 3 write nothing).
      const u32 my_key = r0 + 8 * (t & 1);
      const i64 key = (first_block + b) * kBlockTokens + my_key;
      const float my_scale = scales[my_key];
      const u64 k_desc = wg::desc_sw128(base + Smem::kKeys + slot * kTileBytes);
#pragma unroll
      for (int j = 0; j < kMaxNextN; ++j) {
        if (j >= u.rows) break;
        float acc[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
        const u64 q_desc = wg::desc_sw128(base + Smem::kQ + j * kTileBytes);
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < kDim / 32; ++ks)
          wg::mma_m64n64k32_e4m3_ss(acc, wg::desc_advance(k_desc, ks * 32), wg::desc_advance(q_desc, ks * 32), true);
        wg::commit();
        wg::wait<0>();
        wg::pin(acc);
        // acc[4 i + e]: key r0 (e < 2) or r0 + 8, head 8 i + 2 t + e % 2.
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) sum[e >> 1] += w[j][2 * i + (e & 1)] * relu(acc[4 * i + e]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sum[h] += shfl_xor(sum[h], 1);
          sum[h] += shfl_xor(sum[h], 2);
        }
        if (t < 2 && key >= u.lo[j] && key < u.hi[j])
          p.logits[(u.row0 + j) * p.logits_stride + key] = my_scale * (t == 0 ? sum[0] : sum[1]);
      }
    }
    sync_block();  // every thread is done with this stage before it is refilled
  }
  mma::cp_async_wait<0>();
}

}  // namespace indexer_wg
}  // namespace nsa
