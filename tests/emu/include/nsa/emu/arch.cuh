// CPU-emulation arch layer: the API of nsa/cuda/arch.cuh (32-lane warps) or, with
// NSA_EMU_WARP 64, of nsa/rocm/arch.cuh (64-lane wavefronts), in host C++ over the
// fiber scheduler of nsa/emu/runtime.h. Lets the test suite run the kernels' logic
// on a machine without a GPU; nothing here is fast or used in production. Warp
// collectives go through the scheduler as whole operations.
#pragma once
#include <cstring>
#include <source_location>
#include "nsa/emu/runtime.h"

#define NSA_EMU 1
#define NSA_DEVICE inline
#define NSA_KERNEL extern "C"
#define NSA_NOINLINE __attribute__((noinline))
#define NSA_LAUNCH_BOUNDS(n)
#define NSA_LAUNCH_BOUNDS_MIN(n, m)
// Each CTA runs on its own OS thread, so a thread_local array is per-CTA shared memory.
#define NSA_SHARED thread_local
#define __restrict__ __restrict
#include "nsa/common/types.cuh"
#include "nsa/common/numeric_soft.cuh"

// The source position of a warp collective's call: lanes at the same one form a
// group (a machine address would not do: the compiler may duplicate a call).
#define NSA_EMU_SITE std::source_location at = std::source_location::current()
#define NSA_EMU_AT at.file_name(), (int)at.line(), (int)at.column()

#ifndef NSA_EMU_WARP
#define NSA_EMU_WARP 32
#endif

namespace nsa {

constexpr int kWarpSize = NSA_EMU_WARP;
static_assert(kWarpSize == 32 || kWarpSize == 64, "NVIDIA warps or gfx942 wavefronts");

NSA_DEVICE u32 thread_x() { return nsa_emu::thread_x(); }
NSA_DEVICE u32 block_x() { return nsa_emu::block_x(); }
NSA_DEVICE u32 lane_id() { return thread_x() % (u32)kWarpSize; }

NSA_DEVICE void sync_block() { nsa_emu::sync_block(); }

NSA_DEVICE u32 atomic_add_ret(u32* p, u32 v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
// red.global faults on a shared address on a GPU; here it would just work, so it is
// checked.
NSA_DEVICE void atomic_add_global_u32(u32* p, u32 v) {
  if (nsa_emu::in_local_smem(p))
    nsa_emu::fail("atomic_add_global_u32 (red.global) on a shared-memory address", __FILE__, __LINE__);
  __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

namespace emu_ops {
// Every lane of the warp.
constexpr u64 kFull = kWarpSize == 64 ? ~0ull : 0xffffffffull;
inline void inclusive_scan(nsa_emu::WarpGroup& g) {
  u32 sum = 0;
  for (u32 l = 0; l < g.lanes; ++l) {
    sum += (u32)g.in[l];
    g.out[l] = sum;
  }
}
inline void shuffle(nsa_emu::WarpGroup& g) {  // arg: source lane
  for (u32 l = 0; l < g.lanes; ++l)
    if (g.present >> l & 1u) g.out[l] = g.in[g.arg[l] % g.lanes];
}
// Slots of `in` each, reserved with one atomic add on the counter (arg): lane order.
inline void reserve(nsa_emu::WarpGroup& g) {
  u32 total = 0;
  for (u32 l = 0; l < g.lanes; ++l) total += (u32)g.in[l];
  u32 base = total != 0u ? atomic_add_ret(reinterpret_cast<u32*>(g.arg[0]), total) : 0u;
  for (u32 l = 0; l < g.lanes; ++l) {
    g.out[l] = base;
    base += (u32)g.in[l];
  }
}
// One slot per present lane with a hit, in lane order (warp_append).
inline void append(nsa_emu::WarpGroup& g) {
  u64 hits = 0;
  for (u32 l = 0; l < g.lanes; ++l)
    if ((g.present >> l & 1u) && g.in[l] != 0u) hits |= 1ull << l;
  const u32 count = (u32)__builtin_popcountll(hits);
  u32 base = hits != 0u ? atomic_add_ret(reinterpret_cast<u32*>(g.arg[__builtin_ctzll(hits)]), count) : 0u;
  for (u32 l = 0; l < g.lanes; ++l) g.out[l] = base + (u32)__builtin_popcountll(hits & ((1ull << l) - 1u));
}
}  // namespace emu_ops

// Inclusive prefix sum across the 32 lanes of a converged warp.
NSA_DEVICE u32 warp_inclusive_scan(u32 v, NSA_EMU_SITE) {
  return (u32)nsa_emu::warp_collective(emu_ops::inclusive_scan, v, 0, emu_ops::kFull, "warp_inclusive_scan", NSA_EMU_AT);
}

NSA_DEVICE float u32_as_f32(u32 b) {
  float r;
  std::memcpy(&r, &b, 4);
  return r;
}
NSA_DEVICE u32 f32_as_u32(float f) {
  u32 r;
  std::memcpy(&r, &f, 4);
  return r;
}

NSA_DEVICE float shfl_xor(float v, int mask, NSA_EMU_SITE) {
  const u64 src = lane_id() ^ (u32)mask;
  return u32_as_f32((u32)nsa_emu::warp_collective(emu_ops::shuffle, f32_as_u32(v), src, emu_ops::kFull, "shfl_xor", NSA_EMU_AT));
}

// __shfl_sync as CUDA spells it (the cluster kernel's count exchange uses it).
NSA_DEVICE u32 __shfl_sync(u64 mask, u32 v, int src, NSA_EMU_SITE) {
  return (u32)nsa_emu::warp_collective(emu_ops::shuffle, v, (u32)src, mask, "__shfl_sync", NSA_EMU_AT);
}

NSA_DEVICE void fence_device() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

NSA_DEVICE u32 popc_u32(u32 v) { return (u32)__builtin_popcount(v); }

NSA_DEVICE u32 warp_reserve(u32* counter, u32 count, NSA_EMU_SITE) {
  return (u32)nsa_emu::warp_collective(emu_ops::reserve, count, reinterpret_cast<u64>(counter), emu_ops::kFull,
                                       "warp_reserve", NSA_EMU_AT);
}

NSA_DEVICE u32 load_coherent(const u32* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

NSA_DEVICE int clz_u32(u32 v) { return v == 0u ? 32 : __builtin_clz(v); }

NSA_DEVICE void async_copy_u32(u32* dst, const u32* src) { nsa_emu::async_copy(dst, *src); }
NSA_DEVICE void wait_async_copies() { nsa_emu::async_wait(); }
// A cache hint only: nothing to emulate.
NSA_DEVICE void prefetch_l2(const void*) {}

NSA_DEVICE u32 warp_append(u32* counter, bool hit, NSA_EMU_SITE) {
  return (u32)nsa_emu::warp_collective(emu_ops::append, hit ? 1u : 0u, reinterpret_cast<u64>(counter), 0u,
                                       "warp_append", NSA_EMU_AT);
}

// Programmatic dependent launch: emulated launches run one after another.
NSA_DEVICE void wait_prior_grids() {}
NSA_DEVICE void start_dependent_grids() {}

NSA_DEVICE float bf16_to_f32(u16 h) { return u32_as_f32((u32)h << 16); }
NSA_DEVICE float exp2_fast(float x) { return __builtin_exp2f(x); }
NSA_DEVICE float log2_fast(float x) { return __builtin_log2f(x); }
NSA_DEVICE u16 f32_to_bf16(float f) { return soft::f32_to_bf16(f); }
NSA_DEVICE u16 f32x2_to_e4m3x2(float lo, float hi) {
  return (u16)(soft::f32_to_e4m3_satfinite(lo) | ((u32)soft::f32_to_e4m3_satfinite(hi) << 8));
}
NSA_DEVICE void e4m3x2_to_f32x2(u16 v, float& lo, float& hi) {
  lo = soft::e4m3_to_f32((u8)(v & 0xffu));
  hi = soft::e4m3_to_f32((u8)(v >> 8));
}

}  // namespace nsa

// nsa/cuda/cluster.cuh is empty under NSA_EMU: its emulation follows.
#include "nsa/emu/cluster.cuh"
