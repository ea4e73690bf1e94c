// NVIDIA arch layer (sm_90a, sm_100a): thread ids, warp shuffles, conversions via PTX.
#pragma once
#define NSA_CUDA 1
#define NSA_DEVICE __device__ __forceinline__
#define NSA_KERNEL extern "C" __global__
// A device function compiled on its own (its registers are allocated apart).
#define NSA_NOINLINE __noinline__ __device__
#define NSA_LAUNCH_BOUNDS(n) __launch_bounds__(n)
// n threads per block, at least m blocks resident per SM.
#define NSA_LAUNCH_BOUNDS_MIN(n, m) __launch_bounds__(n, m)
#define NSA_SHARED __shared__
#include "nsa/common/types.cuh"

namespace nsa {

constexpr int kWarpSize = 32;

NSA_DEVICE u32 thread_x() { return threadIdx.x; }
NSA_DEVICE u32 block_x() { return blockIdx.x; }
NSA_DEVICE u32 grid_x() { return gridDim.x; }
NSA_DEVICE u32 lane_id() { return threadIdx.x % 32u; }

NSA_DEVICE void sync_block() { __syncthreads(); }

// Shared- or global-memory atomic add returning the old value.
NSA_DEVICE u32 atomic_add_ret(u32* p, u32 v) { return atomicAdd(p, v); }
NSA_DEVICE u32 atomic_exch_ret(u32* p, u32 v) { return atomicExch(p, v); }

// Inclusive prefix sum across the 32 lanes of a converged warp.
NSA_DEVICE u32 warp_inclusive_scan(u32 v) {
  const u32 lane = lane_id();
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const u32 o = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= (u32)d) v += o;
  }
  return v;
}

// Butterfly exchange within the warp; callers keep `mask` inside a converged group.
NSA_DEVICE float shfl_xor(float v, int mask) {
  float r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(mask));
  return r;
}

// Programmatic dependent launch (PDL). A kernel the host launched with programmatic
// stream serialization may start while the previous kernel of its stream runs:
// wait_prior_grids() returns once that kernel has completed and its writes are
// visible (at once for a plain launch), so nothing may be read before it.
// start_dependent_grids() lets the stream's next such launch start its blocks, which
// then wait in their own wait_prior_grids().
NSA_DEVICE void wait_prior_grids() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
NSA_DEVICE void start_dependent_grids() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Orders this thread's earlier global writes before its later ones for every
// block of the grid (the last-block-done pattern).
NSA_DEVICE void fence_device() { __threadfence(); }

// Set bits of v.
NSA_DEVICE u32 popc_u32(u32 v) { return (u32)__popc((int)v); }

// For a converged warp: reserves `count` consecutive slots per lane at `*counter`
// with one atomic add for the warp (lanes' slots follow lane order); returns this
// lane's first slot.
NSA_DEVICE u32 warp_reserve(u32* counter, u32 count) {
  const u32 incl = warp_inclusive_scan(count);
  const u32 total = __shfl_sync(0xffffffffu, incl, 31);
  u32 base = 0u;
  if (total != 0u) {
    if (lane_id() == 31u) base = atomicAdd(counter, total);
    base = __shfl_sync(0xffffffffu, base, 31);
  }
  return base + incl - count;
}

// A global load served by L2 (the coherence point), not a possibly stale L1 line:
// for data other blocks wrote before a fence_device() handshake.
NSA_DEVICE u32 load_coherent(const u32* p) { return __ldcg(p); }

// Leading zero bits of v (32 for 0).
NSA_DEVICE int clz_u32(u32 v) { return __clz((int)v); }

// *dst = *src (shared <- global) without waiting for the load: cp.async, completed
// for the issuing thread by wait_async_copies(). For words read once: evict-first in
// L2, so they do not push out data that is read again (PAGED top-k's page-table
// slots; H200: 2048 x 32K 168.0 -> 165.7 us, 64 x 128K 21.7 -> 21.4 us).
NSA_DEVICE void async_copy_u32(u32* dst, const u32* src) {
  asm volatile(
      "{\n.reg .b64 pol;\ncreatepolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
      "cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, pol;\n}" ::"r"((u32)__cvta_generic_to_shared(dst)),
      "l"(src)
      : "memory");
}
NSA_DEVICE void wait_async_copies() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Starts pulling the 128-byte line at `p` into L2 (no register, no completion).
NSA_DEVICE void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Slot for each lane with `hit` among the lanes executing together: one atomic add
// of the hit count to `*counter` per warp (lanes' slots follow lane order).
NSA_DEVICE u32 warp_append(u32* counter, bool hit) {
  const u32 active = __activemask();
  const u32 hits = __ballot_sync(active, hit);
  if (hits == 0u) return 0u;
  const int leader = __ffs((int)hits) - 1;
  u32 base = 0u;
  if ((int)lane_id() == leader) base = atomicAdd(counter, popc_u32(hits));
  base = __shfl_sync(active, base, leader);
  return base + popc_u32(hits & ((1u << lane_id()) - 1u));
}

// *p += v for p in global memory only (red.global: a shared address faults).
NSA_DEVICE void atomic_add_global_u32(u32* p, u32 v) {
  asm volatile("red.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

NSA_DEVICE float u32_as_f32(u32 b) {
  float r;
  asm("mov.b32 %0, %1;" : "=f"(r) : "r"(b));
  return r;
}
NSA_DEVICE u32 f32_as_u32(float f) {
  u32 r;
  asm("mov.b32 %0, %1;" : "=r"(r) : "f"(f));
  return r;
}

// 2^x and log2(x) at the hardware's approximate precision (MUFU.EX2, MUFU.LG2).
NSA_DEVICE float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
NSA_DEVICE float log2_fast(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
NSA_DEVICE float bf16_to_f32(u16 h) { return u32_as_f32((u32)h << 16); }

NSA_DEVICE u16 f32_to_bf16(float f) {
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

// Two f32 -> two e4m3fn bytes (lo from `lo`, hi from `hi`), RNE, saturating; NaN stays NaN.
NSA_DEVICE u16 f32x2_to_e4m3x2(float lo, float hi) {
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// The two e4m3fn bytes of `pair`'s low half (low byte -> low half) -> f16x2, exactly.
NSA_DEVICE u32 e4m3x2_to_f16x2(u32 pair) {
  u32 h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((u16)pair));
  return h;
}

// The high two e4m3fn bytes of `word` -> f16x2: the conversion reads the upper
// half-word itself (no shift instruction).
NSA_DEVICE u32 e4m3x2_hi_to_f16x2(u32 word) {
  u32 h;
  asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, hi;\n\t}" : "=r"(h) : "r"(word));
  return h;
}

// Two e4m3fn bytes -> two f32 (exact, through f16x2).
NSA_DEVICE void e4m3x2_to_f32x2(u16 v, float& lo, float& hi) {
  const u32 h2 = e4m3x2_to_f16x2(v);
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"((u16)(h2 & 0xffffu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"((u16)(h2 >> 16)));
}

}  // namespace nsa
