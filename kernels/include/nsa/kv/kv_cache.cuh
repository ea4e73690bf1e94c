// KV cache store / quantize / dequantize (spec §2.3–§2.5). One group of lanes per
// token, 16-byte vector accesses, scales reduced with butterflies inside the group.
#pragma once
#ifndef NSA_DEVICE
#error "include the arch header (nsa/cuda/arch.cuh or nsa/rocm/arch.cuh) first"
#endif
#include "nsa/common/status.cuh"

namespace nsa {
namespace kv {

constexpr int kLatent = 512;
constexpr int kRope = 64;
constexpr int kTile = 128;
constexpr int kFp8TokenBytes = 656;
constexpr int kFp8ScalesOffset = 512;
constexpr int kFp8RopeOffset = 528;
constexpr int kBf16TokenElems = 576;

// Lanes per MLA token: lane l owns latent chunks l and l + 32 (8 dims each), so each
// warp-wide access is one contiguous span. Tile t (128 dims) = 16 consecutive chunks.
constexpr int kMlaLanes = 32;
constexpr int kChunk = 8;
constexpr int kLanesPerTile = kTile / kChunk;

NSA_DEVICE void unpack_bf16x8(const Vec16& v, float* x) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = bf16_to_f32((u16)(v.w[i] & 0xffffu));
    x[2 * i + 1] = bf16_to_f32((u16)(v.w[i] >> 16));
  }
}

// Largest finite magnitude; NaN and +-inf are left out so one bad value cannot
// poison the scale of the whole tile.
NSA_DEVICE float finite_amax(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = x[i] < 0.0f ? -x[i] : x[i];
    if (a <= kF32MaxFinite) m = a > m ? a : m;
  }
  return m;
}

NSA_DEVICE float group_max(float v, int lanes) {
  for (int m = 1; m < lanes; m <<= 1) {
    const float o = shfl_xor(v, m);
    v = o > v ? o : v;
  }
  return v;
}

// q = e4m3_satfinite(x * inv): saturation is the clamp to +-448; NaN stays NaN.
template <int N>
NSA_DEVICE void quantize(const float* x, float inv, u32* out_words) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const u32 lo = f32x2_to_e4m3x2(x[4 * i] * inv, x[4 * i + 1] * inv);
    const u32 hi = f32x2_to_e4m3x2(x[4 * i + 2] * inv, x[4 * i + 3] * inv);
    out_words[i] = lo | (hi << 16);
  }
}

NSA_DEVICE bool slot_ok(i64 slot, i64 pool_slots) { return slot >= 0 && slot < pool_slots; }
// No other store of the launch reports rejected slots.
constexpr i64 kNoOtherPool = -1;

// scale = amax/448 and its reciprocal; when 1/scale is not finite (amax 0, or amax
// below ~1.3e-36) both are 0, so the tile stores scale 0 and q 0.
NSA_DEVICE void fp8_tile_scale(float amax, float& scale, float& inv) {
  scale = amax / kE4m3Max;
  inv = 1.0f / scale;
  if (!(inv <= kF32MaxFinite)) {
    scale = 0.0f;
    inv = 0.0f;
  }
}

// k_nope [n, 512] and k_rope [n, 64] bf16 rows (strides in elements, multiples of 8)
// -> cache rows loc[t] in the 656-byte format. `block`: this block's index in the
// store's part of the grid (kBlockThreads / 32 tokens each).
template <int kBlockThreads>
NSA_DEVICE void store_fp8(i64 block, const u16* __restrict__ k_nope, i64 nope_stride, const u16* __restrict__ k_rope,
                          i64 rope_stride, const i32* __restrict__ loc, i32 num_tokens, u8* __restrict__ cache,
                          i64 pool_slots, u32* status) {
  const u32 tid = thread_x();
  const i64 token = block * (kBlockThreads / kMlaLanes) + tid / kMlaLanes;
  const u32 lane = tid % kMlaLanes;
  // Every lane takes part in the shuffles below (a 64-lane wavefront holds two
  // tokens, and the second may lie past the end); only a token in range reads and
  // writes memory.
  const bool live = token < num_tokens;
  // Issue the input loads before the slot load so their latencies overlap.
  Vec16 a = {{0u, 0u, 0u, 0u}}, b = a, rope = a;
  if (live) {
    const Vec16* src = reinterpret_cast<const Vec16*>(k_nope + token * nope_stride);
    a = src[lane];
    b = src[lane + kMlaLanes];
    if (lane < kRope / kChunk) rope = reinterpret_cast<const Vec16*>(k_rope + token * rope_stride)[lane];
  }
  const i64 slot = live ? (i64)loc[token] : -1;
  float x[16];
  unpack_bf16x8(a, x);
  unpack_bf16x8(b, x + 8);
  float scale_a, inv_a, scale_b, inv_b;  // tiles lane/16 and 2 + lane/16
  fp8_tile_scale(group_max(finite_amax(x, 8), kLanesPerTile), scale_a, inv_a);
  fp8_tile_scale(group_max(finite_amax(x + 8, 8), kLanesPerTile), scale_b, inv_b);
  const float scale_1 = shfl_xor(scale_a, 16);  // lane 0 gathers all four scales
  const float scale_3 = shfl_xor(scale_b, 16);
  if (!live) return;
  if (!slot_ok(slot, pool_slots)) {
    if (lane == 0) report_bad_entry(status, token);
    return;
  }
  Vec8 qa, qb;
  quantize<8>(x, inv_a, qa.w);
  quantize<8>(x + 8, inv_b, qb.w);
  u8* row = cache + slot * kFp8TokenBytes;
  reinterpret_cast<Vec8*>(row)[lane] = qa;
  reinterpret_cast<Vec8*>(row)[lane + kMlaLanes] = qb;
  if (lane == 0) {
    const Vec16 scales = {{f32_as_u32(scale_a), f32_as_u32(scale_1), f32_as_u32(scale_b), f32_as_u32(scale_3)}};
    *reinterpret_cast<Vec16*>(row + kFp8ScalesOffset) = scales;
  }
  if (lane < kRope / kChunk) reinterpret_cast<Vec16*>(row + kFp8RopeOffset)[lane] = rope;
}

// Bit-exact bf16 copy: cache row = [nope 512 | rope 64]. `block` as for store_fp8.
template <int kBlockThreads>
NSA_DEVICE void store_bf16(i64 block, const u16* __restrict__ k_nope, i64 nope_stride, const u16* __restrict__ k_rope,
                           i64 rope_stride, const i32* __restrict__ loc, i32 num_tokens, u16* __restrict__ cache,
                           i64 pool_slots, u32* status) {
  const u32 tid = thread_x();
  const i64 token = block * (kBlockThreads / kMlaLanes) + tid / kMlaLanes;
  const u32 lane = tid % kMlaLanes;
  if (token >= num_tokens) return;
  const Vec16* src = reinterpret_cast<const Vec16*>(k_nope + token * nope_stride);
  const Vec16 a = src[lane];
  const Vec16 b = src[lane + kMlaLanes];
  Vec16 rope = {{0u, 0u, 0u, 0u}};
  if (lane < kRope / kChunk) rope = reinterpret_cast<const Vec16*>(k_rope + token * rope_stride)[lane];
  const i64 slot = loc[token];
  if (!slot_ok(slot, pool_slots)) {
    if (lane == 0) report_bad_entry(status, token);
    return;
  }
  Vec16* dst = reinterpret_cast<Vec16*>(cache + slot * kBf16TokenElems);
  dst[lane] = a;
  dst[lane + kMlaLanes] = b;
  if (lane < kRope / kChunk) dst[kLatent / kChunk + lane] = rope;
}

// 8 e4m3 -> 8 bf16: bf16(f32(q) * scale).
NSA_DEVICE Vec16 dequant8(const Vec8& q, float scale) {
  Vec16 o;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float a, b, c, d;
    e4m3x2_to_f32x2((u16)(q.w[i] & 0xffffu), a, b);
    e4m3x2_to_f32x2((u16)(q.w[i] >> 16), c, d);
    o.w[2 * i] = (u32)f32_to_bf16(a * scale) | ((u32)f32_to_bf16(b * scale) << 16);
    o.w[2 * i + 1] = (u32)f32_to_bf16(c * scale) | ((u32)f32_to_bf16(d * scale) << 16);
  }
  return o;
}

// Token t of a read-back (a group of kMlaLanes lanes per token): its slot idx[t]
// checked against the pool, then `row(dst, slot, lane)` writes its bf16 576 output
// row; a rejected index is reported (by lane 0 of the group) and its row zeroed.
template <int kBlockThreads, class Row>
NSA_DEVICE void read_rows(i64 pool_slots, const i32* __restrict__ idx, i32 num_tokens, u16* __restrict__ out,
                          u32* status, Row row) {
  const u32 tid = thread_x();
  const i64 token = (i64)block_x() * (kBlockThreads / kMlaLanes) + tid / kMlaLanes;
  const u32 lane = tid % kMlaLanes;
  if (token >= num_tokens) return;
  const i64 slot = idx[token];
  Vec16* dst = reinterpret_cast<Vec16*>(out + token * kBf16TokenElems);
  if (slot_ok(slot, pool_slots)) {
    row(dst, slot, lane);
    return;
  }
  if (lane == 0) report_bad_entry(status, token);
  const Vec16 zero = {{0u, 0u, 0u, 0u}};
  dst[lane] = zero;
  dst[lane + kMlaLanes] = zero;
  if (lane < kRope / kChunk) dst[kLatent / kChunk + lane] = zero;
}

// Gathers cache rows idx[t] (656-byte format) into bf16 [n, 576]:
// out = bf16(f32(e4m3) * scale), rope copied. A rejected index writes a zero row.
template <int kBlockThreads>
NSA_DEVICE void dequant_fp8(const u8* __restrict__ cache, i64 pool_slots, const i32* __restrict__ idx,
                            i32 num_tokens, u16* __restrict__ out, u32* status) {
  read_rows<kBlockThreads>(pool_slots, idx, num_tokens, out, status, [&](Vec16* dst, i64 slot, u32 lane) {
    const u8* row = cache + slot * kFp8TokenBytes;
    const Vec8 qa = reinterpret_cast<const Vec8*>(row)[lane];
    const Vec8 qb = reinterpret_cast<const Vec8*>(row)[lane + kMlaLanes];
    const float* scales = reinterpret_cast<const float*>(row + kFp8ScalesOffset);
    const float scale_a = scales[lane / kLanesPerTile];
    const float scale_b = scales[2 + lane / kLanesPerTile];
    Vec16 rope = {{0u, 0u, 0u, 0u}};
    if (lane < kRope / kChunk) rope = reinterpret_cast<const Vec16*>(row + kFp8RopeOffset)[lane];
    dst[lane] = dequant8(qa, scale_a);
    dst[lane + kMlaLanes] = dequant8(qb, scale_b);
    if (lane < kRope / kChunk) dst[kLatent / kChunk + lane] = rope;
  });
}

// Gathers bf16 cache rows idx[t] (576 elements) into bf16 [n, 576]. A rejected
// index writes a zero row.
template <int kBlockThreads>
NSA_DEVICE void gather_bf16(const u16* __restrict__ cache, i64 pool_slots, const i32* __restrict__ idx,
                            i32 num_tokens, u16* __restrict__ out, u32* status) {
  read_rows<kBlockThreads>(pool_slots, idx, num_tokens, out, status, [&](Vec16* dst, i64 slot, u32 lane) {
    // 72 vectors of 16 bytes per row: lanes take l, l + 32 and (l < 8) l + 64.
    const Vec16* src = reinterpret_cast<const Vec16*>(cache + slot * kBf16TokenElems);
    dst[lane] = src[lane];
    dst[lane + kMlaLanes] = src[lane + kMlaLanes];
    if (lane < kRope / kChunk) dst[kLatent / kChunk + lane] = src[kLatent / kChunk + lane];
  });
}

// ---- Lightning-indexer K (spec §2.5): 128 e4m3 + f32 power-of-two scale, 64-token pages.
constexpr int kIdxDim = 128;
constexpr int kIdxPageTokens = 64;
constexpr int kIdxPageBytes = kIdxPageTokens * (kIdxDim + 4);
constexpr int kIdxLanes = kIdxDim / 16;  // each lane owns 16 dims (32 B in, 16 B out)
constexpr float kIdxAmaxFloor = 1e-4f;

// Smallest power of two >= v, for positive normal v (exact, no log2 rounding).
NSA_DEVICE float ceil_pow2(float v) {
  u32 b = f32_as_u32(v);
  if (b & 0x7fffffu) b = (b & 0x7f800000u) + 0x800000u;
  return u32_as_f32(b);
}

// Each 8-lane group stores kRounds tokens, kBlockThreads / 8 apart, with all
// their loads issued up front (a 256-byte key alone cannot keep HBM busy). `block`:
// this block's index in the store's part of the grid (kBlockThreads / 8 · kRounds
// tokens each). A rejected slot is reported unless another store of the same
// launch, over a pool of `other_pool` slots (kNoOtherPool: none), rejects and
// reports it too, so each rejected token is counted once.
template <int kBlockThreads, int kRounds>
NSA_DEVICE void store_indexer_k(i64 block, const u16* __restrict__ k, i64 k_stride, const i32* __restrict__ loc,
                                i32 num_tokens, u8* __restrict__ cache, i64 pool_slots, u32* status,
                                i64 other_pool = kNoOtherPool) {
  const int kGroups = kBlockThreads / kIdxLanes;
  const u32 tid = thread_x();
  const i64 first = block * kGroups * kRounds + tid / kIdxLanes;
  const u32 lane = tid % kIdxLanes;
  Vec16 raw[kRounds][2];
  i64 slot[kRounds];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const i64 token = first + r * kGroups;
    raw[r][0] = raw[r][1] = Vec16{{0u, 0u, 0u, 0u}};
    if (token < num_tokens) {
      const Vec16* src = reinterpret_cast<const Vec16*>(k + token * k_stride + lane * 16);
      raw[r][0] = src[0];
      raw[r][1] = src[1];
    }
  }
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const i64 token = first + r * kGroups;
    slot[r] = token < num_tokens ? (i64)loc[token] : -1;
  }
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    // Four tokens share a 32-lane warp: every lane takes part in the full-warp
    // shuffles, and only an accepted token writes memory.
    const i64 token = first + r * kGroups;
    const bool in_range = token < num_tokens;
    const bool ok = in_range && slot_ok(slot[r], pool_slots);
    const bool reported_elsewhere = other_pool != kNoOtherPool && !slot_ok(slot[r], other_pool);
    if (in_range && !ok && lane == 0 && !reported_elsewhere) report_bad_entry(status, token);
    float x[16];
    unpack_bf16x8(raw[r][0], x);
    unpack_bf16x8(raw[r][1], x + 8);
    float amax = group_max(finite_amax(x, 16), kIdxLanes);
    amax = amax > kIdxAmaxFloor ? amax : kIdxAmaxFloor;
    const float scale = ceil_pow2(amax / kE4m3Max);
    const float inv = 1.0f / scale;  // exact: scale is a power of two
    if (!ok) continue;
    Vec16 q;
    quantize<16>(x, inv, q.w);
    u8* page = cache + (slot[r] / kIdxPageTokens) * kIdxPageBytes;
    const i64 off = slot[r] % kIdxPageTokens;
    *reinterpret_cast<Vec16*>(page + off * kIdxDim + lane * 16) = q;
    if (lane == 0) reinterpret_cast<float*>(page + kIdxPageTokens * kIdxDim)[off] = scale;
  }
}

// Ragged gather for the extend logits (spec §6.3): keys[t] (128 e4m3) and scales[t]
// = cache entry of slots[t]; a rejected slot yields a zero key and scale 0. Lane l of
// a group moves bytes [16l, 16l + 16), lane 0 also the scale. All slot loads, then
// all key loads, are issued before the first store (memory parallelism).
template <int kBlockThreads, int kRounds>
NSA_DEVICE void gather_indexer_k(const u8* __restrict__ cache, i64 pool_slots, const i32* __restrict__ slots,
                                 i32 num_tokens, u8* __restrict__ keys, float* __restrict__ scales, u32* status) {
  const int kGroups = kBlockThreads / kIdxLanes;
  const u32 tid = thread_x();
  const i64 first = (i64)block_x() * kGroups * kRounds + tid / kIdxLanes;
  const u32 lane = tid % kIdxLanes;
  i64 slot[kRounds];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const i64 token = first + r * kGroups;
    slot[r] = token < num_tokens ? (i64)slots[token] : -1;
  }
  Vec16 q[kRounds];
  float scale[kRounds];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    q[r] = Vec16{{0u, 0u, 0u, 0u}};
    scale[r] = 0.0f;
    if (slot_ok(slot[r], pool_slots)) {
      const u8* page = cache + (slot[r] / kIdxPageTokens) * kIdxPageBytes;
      const i64 off = slot[r] % kIdxPageTokens;
      q[r] = *reinterpret_cast<const Vec16*>(page + off * kIdxDim + lane * 16);
      if (lane == 0) scale[r] = reinterpret_cast<const float*>(page + kIdxPageTokens * kIdxDim)[off];
    }
  }
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const i64 token = first + r * kGroups;
    if (token >= num_tokens) break;  // later rounds are further out
    if (lane == 0 && !slot_ok(slot[r], pool_slots)) report_bad_entry(status, token);
    reinterpret_cast<Vec16*>(keys + token * kIdxDim)[lane] = q[r];
    if (lane == 0) scales[token] = scale[r];
  }
}

}  // namespace kv
}  // namespace nsa
