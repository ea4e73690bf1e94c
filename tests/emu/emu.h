// Launching a kernel on the CPU emulator (see runtime.cpp).
#pragma once
#include <cstdint>
#include <string>

namespace nsa_emu {

// Bytes of each OS thread's emulated shared memory: sm_90a's per-block maximum
// (gfx942 kernels take at most 64 KiB).
constexpr uint32_t kSmemBytes = 232448;

struct LaunchSpec {
  uint32_t grid;           // blocks, a whole number of clusters
  uint32_t block_threads;  // whole warps, up to 1024
  uint32_t cluster;        // CTAs per cluster (1: none)
  uint32_t smem_bytes;     // dynamic shared memory the kernel is launched with
  uint32_t smem_capacity;  // bytes of the thread_local array behind `smem`
  uint32_t groups;         // clusters run at once (OS threads: groups × cluster)
  uint32_t warp_size;      // 32 or 64 lanes
  uint64_t seed;           // fiber order
  void (*entry)(void* args);
  void* args;
  unsigned char* (*smem)();  // the calling OS thread's shared memory
};

// Runs the grid to completion; returns "" or what went wrong.
std::string launch(const LaunchSpec& spec);

}  // namespace nsa_emu
