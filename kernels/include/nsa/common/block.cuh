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

// Block-wide max of `v`: a warp butterfly, then one shared-memory round (two
// barriers, not one per halving). Every thread must call it; `scratch` (at least
// one word per warp) is free again on return.
template <int kBlockThreads>
NSA_DEVICE i32 block_max(i32 v, u32* scratch) {
  constexpr int kWarps = kBlockThreads / kWarpSize;
  static_assert(kWarps <= kScanScratch, "one scratch word per warp");
#pragma unroll
  for (int m = kWarpSize / 2; m > 0; m /= 2) {
    const i32 o = (i32)f32_as_u32(shfl_xor(u32_as_f32((u32)v), m));  // the shuffle moves bits only
    v = o > v ? o : v;
  }
  if (lane_id() == 0) scratch[thread_x() / kWarpSize] = (u32)v;
  sync_block();
  i32 best = (i32)scratch[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) best = (i32)scratch[w] > best ? (i32)scratch[w] : best;
  sync_block();
  return best;
}

}  // namespace nsa
