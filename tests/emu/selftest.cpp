// Small kernels that check the emulator itself (tests/tests/emu_selftest.rs): that
// warp collectives group lanes the way a GPU converges them, that what would hang
// or be undefined on a GPU stops the launch with an error, and that DSMEM and the
// cluster barrier order what they should.
#include <cstdio>
#include <cstring>
#include <string>

#include "emu.h"
#include "nsa/emu/arch.cuh"
#include "nsa/topk/topk.cuh"  // nsa::topk::smem, the shared memory launch.cpp defines

namespace nsa {
namespace topk {
extern thread_local u32 smem[];
}  // namespace topk
}  // namespace nsa

namespace {

using nsa::u32;
using nsa::topk::smem;

// `p` (this CTA's shared memory) in CTA `cta`: the runtime's DSMEM, under either
// version of the cluster API.
u32* remote(u32* p, u32 cta) {
  return reinterpret_cast<u32*>(nsa_emu::cluster_smem(cta, true) + (reinterpret_cast<unsigned char*>(p) - nsa_emu::local_smem()));
}

// Lanes 0-1 first take a detour through warp_append (as filter_pass's head does);
// then the whole warp scans: the scan waits for them. out[t] = inclusive sum.
void scan_after_detour(u32* out) {
  const u32 t = nsa::thread_x();
  if (t == 0) smem[0] = 0;
  nsa::sync_block();
  if (nsa::lane_id() < 2) nsa::warp_append(&smem[0], true);
  out[nsa::block_x() * 64 + t] = nsa::warp_inclusive_scan(t % 32 + 1);
  nsa::sync_block();
  if (t == 0) out[nsa::block_x() * 64 + 63] += smem[0] << 16;  // 2 appends per warp
}

// Half a warp calls a full-warp scan while the other half has exited: on a GPU
// this hangs or is undefined.
void partial_warp_scan(u32* out) {
  if (nsa::lane_id() < 16) out[nsa::thread_x()] = nsa::warp_inclusive_scan(1);
}

// Warp 0 waits at a block barrier while the others wait at a cluster barrier.
void barrier_mismatch(u32*) {
  if (nsa::thread_x() < 32) {
    nsa::sync_block();
  } else {
    nsa::cluster::sync();
  }
}

// Rank 1 exits; rank 0 waits at a cluster barrier nobody else reaches.
void cluster_barrier_missed(u32*) {
  if (nsa::cluster::rank() == 0) nsa::cluster::sync();
}

// Two arrivals without a wait between (the barrier's halves out of order).
void arrive_twice(u32*) {
  nsa_emu::cluster_arrive();
  nsa_emu::cluster_arrive();
}

// Every CTA of a cluster of 4 stores rank + 1 into CTA 0's smem[rank] through DSMEM
// (once every CTA has started: after a cluster barrier); after the next barrier
// CTA 0 sums them: out[0] = 10.
void dsmem_sum(u32* out) {
  const u32 rank = nsa::cluster::rank();
  nsa::cluster::sync();
  if (nsa::thread_x() == 0) {
    *remote(&smem[rank], 0) = rank + 1;
  }
  nsa::cluster::sync();
  if (rank == 0 && nsa::thread_x() == 0) out[0] = smem[0] + smem[1] + smem[2] + smem[3];
}

// A DSMEM store before any cluster barrier: CTA 0 may not have started.
void dsmem_too_early(u32*) {
  if (nsa::cluster::rank() == 1) *remote(&smem[0], 0) = 1;
  nsa::cluster::sync();
}

// Thread 0 writes a word that thread 1 reads with no barrier between: what thread 1
// sees depends on the fiber order (out[0] = 7 or the poison), which the seed varies.
void missing_barrier(u32* out) {
  if (nsa::thread_x() == 0) smem[0] = 7;
  if (nsa::thread_x() == 1) out[0] = smem[0];
}

// The last thread, alone once the others have exited, fills a local array larger
// than its emulated stack (reaching only the dead stack below): the canary at the
// bottom of its stack reports the overrun.
__attribute__((noinline)) void fill_big_array(u32* out) {  // its frame exists only here
  volatile unsigned char big[136 * 1024];
  for (size_t i = 0; i < sizeof big; ++i) big[i] = (unsigned char)i;
  out[0] = big[7];
}
void stack_overrun(u32* out) {
  nsa::sync_block();
  if (nsa::thread_x() != 31) return;
  nsa::sync_block();
  fill_big_array(out);
}

// An async copy lands when its thread waits: out[t] is the word before the wait
// (the old one), out[32 + t] after it.
void async_copy_lands_at_the_wait(u32* out) {
  const u32 t = nsa::thread_x();
  static const u32 src[32] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
                              26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41};
  smem[t] = 1;
  nsa::async_copy_u32(&smem[t], &src[t]);
  out[t] = smem[t];
  nsa::wait_async_copies();
  out[32 + t] = smem[t];
}
// A thread that never waits for its copy.
void async_copy_unwaited(u32*) {
  static const u32 src = 5;
  if (nsa::thread_x() == 3) nsa::async_copy_u32(&smem[0], &src);
}

// atomic_add_global_u32 (red.global) counts into global memory: out[0] = 32...
void global_add_to_global(u32* out) { nsa::atomic_add_global_u32(&out[0], 1u); }
// ...and faults on a GPU when given a shared-memory address.
void global_add_to_shared(u32*) {
  if (nsa::thread_x() == 0) nsa::atomic_add_global_u32(&smem[0], 1u);
}

struct Case {
  const char* name;
  void (*fn)(u32* out);
  uint32_t grid, threads, cluster;
};
const Case kCases[] = {
    {"scan_after_detour", scan_after_detour, 2, 64, 1},
    {"partial_warp_scan", partial_warp_scan, 1, 64, 1},
    {"barrier_mismatch", barrier_mismatch, 1, 64, 1},
    {"cluster_barrier_missed", cluster_barrier_missed, 2, 64, 2},
    {"arrive_twice", arrive_twice, 2, 32, 2},
    {"dsmem_sum", dsmem_sum, 4, 32, 4},
    {"dsmem_too_early", dsmem_too_early, 2, 32, 2},
    {"missing_barrier", missing_barrier, 1, 32, 1},
    {"stack_overrun", stack_overrun, 1, 32, 1},
    {"async_copy_lands_at_the_wait", async_copy_lands_at_the_wait, 1, 32, 1},
    {"async_copy_unwaited", async_copy_unwaited, 1, 32, 1},
    {"global_add_to_global", global_add_to_global, 1, 32, 1},
    {"global_add_to_shared", global_add_to_shared, 1, 32, 1},
};

struct Run {
  const Case* c;
  u32* out;
};
void call(void* run) {
  const Run& r = *static_cast<const Run*>(run);
  r.c->fn(r.out);
}
unsigned char* smem_of_thread() { return reinterpret_cast<unsigned char*>(nsa::topk::smem); }

}  // namespace

// 0: ran; 1: the emulator stopped it (err says why); 2: no such case.
extern "C" int nsa_emu_selftest(const char* name, uint64_t seed, uint32_t* out, char* err, size_t err_len) {
  for (const Case& c : kCases) {
    if (std::strcmp(c.name, name) != 0) continue;
    Run run{&c, out};
    nsa_emu::LaunchSpec spec{c.grid, c.threads, c.cluster, 1024, 1024, 1, 32, seed, call, &run, smem_of_thread};
    const std::string e = nsa_emu::launch(spec);
    std::snprintf(err, err_len, "%s", e.c_str());
    return e.empty() ? 0 : 1;
  }
  std::snprintf(err, err_len, "no self-test %s", name);
  return 2;
}
