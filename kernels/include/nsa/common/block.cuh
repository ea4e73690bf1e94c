// Block-wide collectives built on the arch layer's warp scan.
#pragma once
#ifndef NSA_DEVICE
#error "include the arch header (nsa/cuda/arch.cuh or nsa/rocm/arch.cuh) first"
#endif

namespace nsa {

// Words of shared scratch block_exclusive_scan needs.
constexpr int kScanScratch = 64;

// Exclusive prefix sum of `v` in thread order across the block; `total` gets the
// block sum. Every thread must call it; `scratch` is free again on return.
template <int kBlockThreads>
NSA_DEVICE u32 block_exclusive_scan(u32 v, u32* scratch, u32& total) {
  constexpr int kWarps = kBlockThreads / kWarpSize;
  static_assert(kWarps <= kWarpSize && kWarps <= kScanScratch, "one warp scans the warp totals");
  const u32 tid = thread_x();
  const u32 warp = tid / kWarpSize;
  const u32 lane = lane_id();
  const u32 inclusive = warp_inclusive_scan(v);
  if (lane == kWarpSize - 1) scratch[warp] = inclusive;
  sync_block();
  if (warp == 0) {
    const u32 w = warp_inclusive_scan(lane < (u32)kWarps ? scratch[lane] : 0u);
    if (lane < (u32)kWarps) scratch[lane] = w;
  }
  sync_block();
  const u32 before = warp == 0 ? 0u : scratch[warp - 1];
  total = scratch[kWarps - 1];
  sync_block();
  return before + inclusive - v;
}

// Block-wide reduction of `v` by `op` (associative and commutative): a warp
// butterfly, then one shared-memory round (two barriers, not one per halving).
// Every thread must call it; `scratch` (at least one word per warp) is free again
// on return.
template <int kBlockThreads, typename Op>
NSA_DEVICE u32 block_reduce(u32 v, u32* scratch, Op op) {
  constexpr int kWarps = kBlockThreads / kWarpSize;
  static_assert(kWarps <= kScanScratch, "one scratch word per warp");
#pragma unroll
  for (int m = kWarpSize / 2; m > 0; m /= 2) v = op(v, f32_as_u32(shfl_xor(u32_as_f32(v), m)));  // bits only
  if (lane_id() == 0) scratch[thread_x() / kWarpSize] = v;
  sync_block();
  u32 r = scratch[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) r = op(r, scratch[w]);
  sync_block();
  return r;
}

template <int kBlockThreads>
NSA_DEVICE i32 block_max(i32 v, u32* scratch) {
  return (i32)block_reduce<kBlockThreads>((u32)v, scratch, [](u32 a, u32 b) { return (i32)b > (i32)a ? b : a; });
}

}  // namespace nsa
