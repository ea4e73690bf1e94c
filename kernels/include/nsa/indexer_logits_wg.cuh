// PAGED lightning-indexer logits with warp-group FP8 MMA (sm_90a, playbook §3.3):
// one CTA of one warp group per (request, chunk of pages). Each 64-key page is
// copied once into a kStages-deep shared-memory ring with 16-byte cp.async (the
// copies of the next pages stay in flight while this one is multiplied) and
// serves all next_n query rows of the request:
//   S_j[key, head] = K[key, :] . Q_j[head, :]   (wgmma m64n64k32 e4m3, A = keys, B = Q_j)
//   logit_j[key] = k_scale[key] * sum_head w_j[head] * max(0, S_j[key, head])
// Keys on M put a key's 64 heads in one quad of lanes: the head sum is two shuffles.
// Outputs, masking and error reporting are those of indexer_logits.cuh.
#pragma once
#include "nsa/cuda/wgmma.cuh"
#include "nsa/indexer_logits.cuh"

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

// Byte offset of 16-byte chunk c of row r in a 128-byte-swizzled tile.
NSA_DEVICE u32 sw128(u32 r, u32 c) { return r * 128 + ((c ^ (r & 7)) * 16); }

// 64 rows x 128 bytes from `src` (rows 128 bytes apart) into the swizzled tile at
// `dst`: 8 threads per row, so a warp reads 4 whole rows per instruction.
NSA_DEVICE void copy_tile(u32 dst, const u8* src) {
#pragma unroll
  for (int i = 0; i < (int)kTileBytes / 16 / kThreads; ++i) {
    const u32 chunk = thread_x() + i * kThreads;
    const u32 r = chunk / 8, c = chunk % 8;
    mma::cp_async_16(dst + sw128(r, c), src + r * 128 + c * 16, 16u);
  }
}

NSA_DEVICE void indexer_logits(const Params& p, u32* status) {
  extern NSA_SHARED Vec16 smem_vec[];
  const u32 raw = mma::smem_addr(smem_vec);
  const u32 base = (raw + 1023u) & ~1023u;
  const u8* smem = reinterpret_cast<const u8*>(smem_vec) + (base - raw);

  const i32 next_n = p.next_n;
  const i64 batch = p.rows / next_n;
  const u32 bid = block_x();
  const i64 req = bid / (u32)p.chunks;
  const i32 chunk = (i32)(bid % (u32)p.chunks);
  if (req >= batch) return;

  // Row j of the request sees keys [0, len - next_n + j + 1), capped by the table.
  const i64 cap = (i64)p.table_width * kPageTokens;
  auto visible = [&](i32 j) -> i64 {
    const i64 len = (i64)p.lengths[req] - next_n + j + 1;
    return len < 0 ? 0 : (len < cap ? len : cap);
  };
  const i64 hi_last = visible(next_n - 1);
  const i64 first_block = (i64)chunk * p.blocks_per_cta;
  i64 end_block = (hi_last + kBlockTokens - 1) / kBlockTokens;
  if (first_block + p.blocks_per_cta < end_block) end_block = first_block + p.blocks_per_cta;
  if (first_block >= end_block) return;
  const i32 blocks = (i32)(end_block - first_block);

  const u32 tid = thread_x();
  const u32 warp = tid / 32, lane = tid % 32;
  const u32 r0 = 16 * warp + lane / 4, t = lane % 4;
  const i32* table = p.block_table + req * p.table_width;
  auto page_at = [&](i32 b) -> i32 {
    const i32 page = table[first_block + b];
    return (page < 0 || (i64)page * kPageTokens >= p.num_keys) ? -1 : page;
  };

  // Q tiles (the first cp.async group, with stage 0) and this thread's head weights.
  for (i32 j = 0; j < next_n; ++j) copy_tile(base + Smem::kQ + j * kTileBytes, p.q + (req * next_n + j) * kHeads * kDim);
  float w[kMaxNextN][16];
#pragma unroll
  for (int j = 0; j < kMaxNextN; ++j)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool live = j < next_n;
      const float* wr = p.weights + (req * next_n + (live ? j : 0)) * kHeads + 8 * i + 2 * t;
      w[j][2 * i] = live ? wr[0] : 0.0f;
      w[j][2 * i + 1] = live ? wr[1] : 0.0f;
    }

  // Prologue: pages 0 .. kStages - 2 in flight; one commit group per page (empty for a
  // page past the chunk or rejected) keeps the group count uniform.
  auto issue = [&](i32 b) {
    if (b < blocks) {
      const i32 page = page_at(b);
      if (page >= 0) {
        const u32 slot = b % kStages;
        const u8* pg = p.keys + (i64)page * kPageBytes;
        copy_tile(base + Smem::kKeys + slot * kTileBytes, pg);
        if (tid < kScaleBytes / 16)
          mma::cp_async_16(base + Smem::kScales + slot * kScaleBytes + tid * 16, pg + kPageScales + tid * 16, 16u);
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
    const i32 page = page_at(b);
    if (page < 0) {
      if (status != nullptr && tid == 0) report_rejected(status, req * p.table_width + first_block + b);
    } else {
      const u32 slot = b % kStages;
      const float* scales = reinterpret_cast<const float*>(smem + Smem::kScales + slot * kScaleBytes);
      const i64 key0 = (first_block + b) * kBlockTokens;
      // Lane t = 0 writes key r0, lane t = 1 key r0 + 8 (t = 2, 3 write nothing).
      const u32 my_key = r0 + 8 * (t & 1);
      const float my_scale = scales[my_key];
      const u64 k_desc = wg::desc_sw128(base + Smem::kKeys + slot * kTileBytes);
#pragma unroll
      for (int j = 0; j < kMaxNextN; ++j) {
        if (j >= next_n) break;
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
        if (t < 2) {
          const i64 key = key0 + my_key;
          if (key < visible(j)) p.logits[(req * next_n + j) * p.logits_stride + key] = my_scale * (t == 0 ? sum[0] : sum[1]);
        }
      }
    }
    sync_block();  // every thread is done with this stage before it is refilled
  }
  mma::cp_async_wait<0>();
}

}  // namespace indexer_wg
}  // namespace nsa
