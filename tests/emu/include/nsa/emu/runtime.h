// The CPU emulator's scheduler interface, used by the emulated arch layer
// (nsa/emu/arch.cuh). A CTA's threads are fibers on one OS thread; they run until
// they reach a barrier or a warp collective, where the scheduler takes over. Test
// code only: it lets CI run the kernels' logic without a GPU, not time them.
#pragma once
#include <cstddef>
#include <cstdint>

namespace nsa_emu {

// Lanes of a warp: 32 (NVIDIA) or 64 (gfx942 wavefronts), per launch.
constexpr int kMaxLanes = 64;

// The lanes of one warp meeting at one warp collective (same call site).
struct WarpGroup {
  uint32_t lanes;            // the warp's width
  uint64_t present;          // lanes that arrived
  uint64_t in[kMaxLanes];    // each lane's operand
  uint64_t arg[kMaxLanes];   // each lane's second operand (shuffle source, xor mask, counter)
  uint64_t out[kMaxLanes];   // each lane's result, written by the resolver
};
using Resolver = void (*)(WarpGroup&);

uint32_t thread_x();
uint32_t block_x();
uint32_t cluster_rank();
uint32_t cluster_size();

// Blocks until every thread of the CTA has arrived.
void sync_block();
// Cluster barrier, split like barrier.cluster.arrive / wait.
void cluster_arrive();
void cluster_wait();
// The shared-memory base of CTA `rank` of this thread's cluster. `access`: for a
// load or store now, which is an error before the cluster's first barrier (the CTA
// may not have started) or once that CTA has exited; false for an address only
// (mapa), whose accesses come later and are not checked.
unsigned char* cluster_smem(uint32_t rank, bool access);
// This CTA's shared memory (the thread_local `smem` of the kernel's namespace).
unsigned char* local_smem();
// Whether p points into this CTA's shared memory.
bool in_local_smem(const void* p);

// A warp collective: once no lane of the warp can run on, the lanes that called from
// the same source position (file, line, column) form one group, resolved when every
// lane in `required` is among them (a full-warp shuffle), or at once when `required`
// is 0 ("whichever arrived", as __activemask). `what` names it in errors.
uint64_t warp_collective(Resolver resolve, uint64_t in, uint64_t arg, uint64_t required, const char* what,
                         const char* file, int line, int column);

// cp.async at its latest: the word (read now: sources are never written while a
// copy is in flight) lands in `dst` only when the issuing thread waits, so a read
// before the wait sees the old value, as it may on a GPU, and a test fails. A thread
// that ends with copies not waited for is an error.
void async_copy(uint32_t* dst, uint32_t value);
void async_wait();

// Ends the launch with an error (a kernel used an operation wrongly).
[[noreturn]] void fail(const char* what, const char* file, int line);

}  // namespace nsa_emu
