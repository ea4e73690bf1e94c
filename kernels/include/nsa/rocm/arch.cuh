// AMD arch layer (gfx942, wave64) for clang/hipRTC without HIP headers.
// e4m3fn is converted in software: gfx942's fp8 instructions use the FNUZ format.
#pragma once
#define NSA_ROCM 1
#define NSA_DEVICE __attribute__((device)) __attribute__((always_inline)) inline
#define NSA_KERNEL extern "C" __attribute__((global))
// Inlined here: a call would put a stack in scratch memory, and the 512-VGPR file
// has room (NVIDIA compiles these apart to keep register pressure down).
#define NSA_NOINLINE NSA_DEVICE
#define NSA_LAUNCH_BOUNDS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#define NSA_LAUNCH_BOUNDS_MIN(n, m) NSA_LAUNCH_BOUNDS(n)
#define NSA_SHARED __attribute__((shared))
#define __restrict__ __restrict
#include "nsa/common/types.cuh"
#include "nsa/common/numeric_soft.cuh"

namespace nsa {

constexpr int kWarpSize = 64;

NSA_DEVICE u32 thread_x() { return __builtin_amdgcn_workitem_id_x(); }
NSA_DEVICE u32 block_x() { return __builtin_amdgcn_workgroup_id_x(); }

NSA_DEVICE u32 lane_id() { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }

NSA_DEVICE void sync_block() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

NSA_DEVICE u32 atomic_add_ret(u32* p, u32 v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

// Inclusive prefix sum across the 64 lanes of a converged wavefront.
NSA_DEVICE u32 warp_inclusive_scan(u32 v) {
  const u32 lane = lane_id();
  for (int d = 1; d < 64; d <<= 1) {
    const u32 src = lane >= (u32)d ? lane - (u32)d : lane;
    const u32 o = (u32)__builtin_amdgcn_ds_bpermute((int)(src << 2), (int)v);
    if (lane >= (u32)d) v += o;
  }
  return v;
}

NSA_DEVICE float shfl_xor(float v, int mask) {
  const u32 lane = lane_id();
  const int r = __builtin_amdgcn_ds_bpermute((int)((lane ^ (u32)mask) << 2), __builtin_bit_cast(int, v));
  return __builtin_bit_cast(float, r);
}

// No programmatic dependent launch on ROCm: kernels of a stream run in order.
NSA_DEVICE void wait_prior_grids() {}
NSA_DEVICE void start_dependent_grids() {}

// Orders this thread's earlier global writes before its later ones for every
// block of the grid (the last-block-done pattern).
NSA_DEVICE void fence_device() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }

// Set bits of v.
NSA_DEVICE u32 popc_u32(u32 v) { return (u32)__builtin_popcount(v); }

// For a converged wavefront: reserves `count` consecutive slots per lane at
// `*counter` with one atomic add for the wavefront (lanes' slots follow lane order);
// returns this lane's first slot.
NSA_DEVICE u32 warp_reserve(u32* counter, u32 count) {
  const u32 incl = warp_inclusive_scan(count);
  const u32 total = (u32)__builtin_amdgcn_ds_bpermute(63 << 2, (int)incl);
  u32 base = 0u;
  if (total != 0u) {
    if (lane_id() == 63u) base = atomic_add_ret(counter, total);
    base = (u32)__builtin_amdgcn_ds_bpermute(63 << 2, (int)base);
  }
  return base + incl - count;
}

// A global load that bypasses the non-coherent vector L1: for data other blocks
// wrote before a fence_device() handshake.
NSA_DEVICE u32 load_coherent(const u32* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

// Leading zero bits of v (32 for 0).
NSA_DEVICE int clz_u32(u32 v) { return v == 0u ? 32 : __builtin_clz(v); }

// The CUDA header's asynchronous copy, done synchronously here.
NSA_DEVICE void async_copy_u32(u32* dst, const u32* src) { *dst = *src; }
NSA_DEVICE void wait_async_copies() {}
// No L2 prefetch: a hint the CUDA header gives, nothing to emulate.
NSA_DEVICE void prefetch_l2(const void*) {}

// Slot for each lane with `hit` among the lanes executing together: one atomic add
// of the hit count to `*counter` per wavefront (lanes' slots follow lane order).
NSA_DEVICE u32 warp_append(u32* counter, bool hit) {
  const u64 hits = __builtin_amdgcn_ballot_w64(hit);
  if (hits == 0u) return 0u;
  const u32 leader = (u32)__builtin_ctzll(hits);
  u32 base = 0u;
  if (lane_id() == leader) base = atomic_add_ret(counter, (u32)__builtin_popcountll(hits));
  base = (u32)__builtin_amdgcn_ds_bpermute((int)(leader << 2), (int)base);
  const u32 lo = __builtin_amdgcn_mbcnt_lo((u32)hits, 0u);
  return base + __builtin_amdgcn_mbcnt_hi((u32)(hits >> 32), lo);
}

// *p += v for p in global memory. Named as in the CUDA layer, whose red.global faults
// on a shared address; this generic form would not, so callers keep to global memory.
NSA_DEVICE void atomic_add_global_u32(u32* p, u32 v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

NSA_DEVICE float u32_as_f32(u32 b) { return __builtin_bit_cast(float, b); }
NSA_DEVICE u32 f32_as_u32(float f) { return __builtin_bit_cast(u32, f); }
NSA_DEVICE float bf16_to_f32(u16 h) { return u32_as_f32((u32)h << 16); }
// 2^x and log2(x) at the hardware's approximate precision (v_exp_f32, v_log_f32).
NSA_DEVICE float exp2_fast(float x) { return __builtin_amdgcn_exp2f(x); }
NSA_DEVICE float log2_fast(float x) { return __builtin_amdgcn_logf(x); }
NSA_DEVICE u16 f32_to_bf16(float f) { return soft::f32_to_bf16(f); }

NSA_DEVICE u16 f32x2_to_e4m3x2(float lo, float hi) {
  return (u16)(soft::f32_to_e4m3_satfinite(lo) | ((u32)soft::f32_to_e4m3_satfinite(hi) << 8));
}

NSA_DEVICE void e4m3x2_to_f32x2(u16 v, float& lo, float& hi) {
  lo = soft::e4m3_to_f32((u8)(v & 0xffu));
  hi = soft::e4m3_to_f32((u8)(v >> 8));
}

}  // namespace nsa
