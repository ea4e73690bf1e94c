// Dense causal attention over variable-length sequences (the MHA one-shot prefill,
// spec §5.1), mma.sync m16n8k16 bf16 with f32 accumulators: one CTA of 4 warps per
// (64 query rows of a sequence, head). Each warp owns 16 of the rows and every key
// of a 64-key block, so its online softmax needs no other warp. K and V blocks are
// double-buffered in shared memory with 16-byte cp.async (zero-filled past the
// sequence). Sequence b's query row i sees its keys 0 ..= lk - lq + i (causal,
// aligned at the end: the first lk - lq keys are the prefix).
// Outputs: out bf16 [rows, heads, d_v]; lse [rows, heads] in natural log, +inf
// (and out zero) for a row that sees no key.
#pragma once
#include "nsa/attention/dense_common.cuh"
#include "nsa/attention/softmax.cuh"
#include "nsa/cuda/mma.cuh"

namespace nsa {
namespace dense {

using namespace softmax;

constexpr int kRows = 64;  // query rows per CTA
constexpr int kKeys = 64;  // keys per block
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;


// Shared rows of `kDim` bf16 padded by 16 bytes (ldmatrix rows on distinct banks).
template <int kDim>
struct Tile {
  static constexpr u32 kRowBytes = kDim * 2 + 16;
  static constexpr u32 kChunks = kDim / 8;  // 16-byte chunks per row
  static constexpr u32 kBytes = kKeys * kRowBytes;
  static NSA_DEVICE u32 offset(u32 row, u32 chunk) { return row * kRowBytes + chunk * 16; }
};

// Q, two K and two V buffers, and each warp's P rows (16 x 64 bf16, padded).
template <int kDqk, int kDv>
struct Smem {
  static constexpr u32 kPRowBytes = kKeys * 2 + 16;
  static constexpr u32 kQ = 0;
  static constexpr u32 kK = kQ + Tile<kDqk>::kBytes;
  static constexpr u32 kV = kK + 2 * Tile<kDqk>::kBytes;
  static constexpr u32 kP = kV + 2 * Tile<kDv>::kBytes;
  static constexpr u32 kBytes = kP + kWarps * 16 * kPRowBytes;
};

// Rows [0, valid) of a 64-row block of `kDim`-wide rows (`stride` elements apart
// in global memory) into the padded tile at `dst`, zeros for the rest.
template <int kDim>
NSA_DEVICE void load_rows(u32 dst, const u16* src, i64 stride, i32 valid) {
  typedef Tile<kDim> T;
  for (u32 c = thread_x(); c < kKeys * T::kChunks; c += kThreads) {
    const u32 r = c / T::kChunks, ch = c % T::kChunks;
    const bool live = (i32)r < valid;
    mma::cp_async_16(dst + T::offset(r, ch), src + (live ? (i64)r * stride + ch * 8 : 0), live ? 16u : 0u);
  }
}

template <int kHeads, int kDqk, int kDv>
NSA_DEVICE void dense_prefill(const Params& p, u32* status) {
  static_assert(kDqk % 16 == 0 && kDv % 16 == 0, "head dims: multiples of 16");
  typedef Smem<kDqk, kDv> L;
  typedef Tile<kDqk> TK;
  typedef Tile<kDv> TV;
  constexpr int kNT = kKeys / 8;  // n8 tiles of S per warp
  constexpr int kNV = kDv / 8;    // n8 tiles of O per warp

  const u32 bid = block_x();
  const i32 tile = (i32)(bid % (u32)p.row_tiles);
  const i32 head = (i32)((bid / (u32)p.row_tiles) % (u32)kHeads);
  const i32 seq = (i32)(bid / ((u32)p.row_tiles * (u32)kHeads));
  if (seq >= p.batch) return;
  SeqTile st;
  if (!seq_tile<kRows>(p, seq, tile, head, thread_x() == 0, status, st)) return;
  // Plain copies: lambdas below capture them (structured bindings cannot be captured in C++17).
  const i32 q0 = st.q0, lq = st.lq, k0 = st.k0, lk = st.lk, row0 = st.row0, shift = st.shift, key_end = st.key_end;
  const i32 blocks = (key_end + kKeys - 1) / kKeys;

  extern NSA_SHARED Vec16 smem_vec[];
  const u32 base = mma::smem_addr(smem_vec);
  const u32 warp = thread_x() / 32, lane = thread_x() % 32;
  const u32 g = lane / 4, t = lane % 4;
  const i64 q_stride = (i64)kHeads * kDqk, v_stride = (i64)kHeads * kDv;

  auto issue = [&](i32 b) {
    if (b < blocks) {
      const i32 key0 = b * kKeys;
      const i64 row = (i64)(k0 + key0);
      load_rows<kDqk>(base + L::kK + (b & 1) * TK::kBytes, p.k + row * q_stride + (i64)head * kDqk, q_stride,
                      lk - key0);
      load_rows<kDv>(base + L::kV + (b & 1) * TV::kBytes, p.v + row * v_stride + (i64)head * kDv, v_stride, lk - key0);
    }
    mma::cp_async_commit();
  };
  load_rows<kDqk>(base + L::kQ, p.q + (i64)(q0 + row0) * q_stride + (i64)head * kDqk, q_stride, lq - row0);
  issue(0);  // Q and block 0 in the first group

  // Per-lane ldmatrix addresses (the conventions of sparse_attend.cuh): Q rows of
  // this warp as A, K rows as B (two n8 tiles per x4), P as A, V transposed as B.
  const u32 q_addr = base + L::kQ + TK::offset(warp * 16 + (lane & 15), lane >> 4);
  const u32 k_off = TK::offset((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const u32 p_addr = base + L::kP + (warp * 16 + (lane & 15)) * L::kPRowBytes + ((lane >> 4) << 3) * 2;
  u8* p_rows = reinterpret_cast<u8*>(smem_vec) + L::kP + warp * 16 * L::kPRowBytes;
  const u32 v_off = TV::offset((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);

  float o[kNV][4];
#pragma unroll
  for (int j = 0; j < kNV; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_run[2] = {kMaxInit, kMaxInit}, l_run[2] = {0.0f, 0.0f};
  const float c_scale = p.sm_scale * kLog2e;
  // This lane's rows (inside the sequence's query rows) and the last key each sees.
  const i32 r_lo = row0 + (i32)(warp * 16 + g), r_hi = r_lo + 8;
  const i32 last[2] = {shift + r_lo, shift + r_hi};

  for (i32 b = 0; b < blocks; ++b) {
    issue(b + 1);
    mma::cp_async_wait<1>();
    sync_block();
    const u32 kbuf = base + L::kK + (b & 1) * TK::kBytes, vbuf = base + L::kV + (b & 1) * TV::kBytes;

    // S = Q K^T: 16 rows x 64 keys.
    float s[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll 2
    for (u32 kc = 0; kc < TK::kChunks; kc += 2) {
      u32 a[4];
      mma::ldsm_x4(q_addr + kc * 16, a);
#pragma unroll
      for (int j = 0; j < kNT; j += 2) {
        u32 bb[4];
        mma::ldsm_x4(kbuf + k_off + j * 8 * TK::kRowBytes + kc * 16, bb);
        mma::mma_bf16(s[j], a, bb[0], bb[1]);
        mma::mma_bf16(s[j + 1], a, bb[2], bb[3]);
      }
    }

    // Mask (causal, past the sequence, rows past lq), scale into log2 units, row max.
    const i32 key0 = b * kKeys;
    float mx[2] = {kMaxInit, kMaxInit};
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const i32 key = key0 + j * 8 + 2 * (i32)t + (e & 1);
        const int h = e >> 1;
        const bool live = key < lk && key <= last[h] && (h ? r_hi : r_lo) < lq;
        const float x = live ? s[j][e] * c_scale : neg_inf();
        s[j][e] = x;
        mx[h] = fmax2(mx[h], x);
      }
    }
    float alpha[2];
    update_max(mx, m_run, l_run, alpha);

    // P = exp2(S - m) as bf16 into the warp's rows (the A operand of P V).
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      u32 lo, hi;
      exp_pack(s[j][0], s[j][1], s[j][2], s[j][3], m_run, l_run, lo, hi);
      const u32 col = (u32)j * 8 + 2 * t;
      *reinterpret_cast<u32*>(p_rows + g * L::kPRowBytes + col * 2) = lo;
      *reinterpret_cast<u32*>(p_rows + (g + 8) * L::kPRowBytes + col * 2) = hi;
    }
    rescale(o, alpha);
    __syncwarp();

    // O += P V: 16 rows x d_v.
#pragma unroll
    for (int kt = 0; kt < kKeys; kt += 16) {
      u32 a[4];
      mma::ldsm_x4(p_addr + kt * 2, a);
#pragma unroll
      for (int j = 0; j < kNV; j += 2) {
        u32 bb[4];
        mma::ldsm_x4_trans(vbuf + v_off + kt * TV::kRowBytes + j * 16, bb);
        mma::mma_bf16(o[j], a, bb[0], bb[1]);
        mma::mma_bf16(o[j + 1], a, bb[2], bb[3]);
      }
    }
    sync_block();  // every warp is done with this buffer before it is refilled
  }
  mma::cp_async_wait<0>();

  // The row sums over the quad, then out = O / l and lse (natural log).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += shfl_xor(l_run[h], 1);
    l_run[h] += shfl_xor(l_run[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const i32 r = h ? r_hi : r_lo;
    if (r >= lq) continue;
    const i64 row = (i64)(q0 + r) * kHeads + head;
    const bool empty = l_run[h] == 0.0f;
    const float inv = empty ? 0.0f : 1.0f / l_run[h];
    u16* out = p.out + row * kDv;
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
      *reinterpret_cast<u32*>(out + j * 8 + 2 * t) = mma::pack_bf16x2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
    }
    if (t == 0) p.lse[row] = empty ? pos_inf() : (m_run[h] + mma::log2_approx(l_run[h])) * kLn2;
  }
}

}  // namespace dense
}  // namespace nsa
