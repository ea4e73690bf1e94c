// Thread-block clusters (sm_90+): rank, cluster-wide barrier and distributed
// shared memory (DSMEM) loads and stores by shared-window address.
#pragma once
#if defined(NSA_EMU)
// The tests' CPU emulator (tests/emu/) supplies these from its arch header.
#elif !defined(NSA_CUDA)
#error "nsa/cuda/cluster.cuh needs the NVIDIA arch header"
#else

namespace nsa {
namespace cluster {

NSA_DEVICE u32 rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// CTAs in the cluster (the launch's cluster size).
NSA_DEVICE u32 size() {
  u32 n;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}

// Every thread of every CTA of the cluster arrives; shared-memory writes before
// it (local or remote) are visible to every CTA after it.
NSA_DEVICE void sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Shared-window address of a local shared-memory object.
NSA_DEVICE u32 local_addr(const void* p) {
  u64 a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return (u32)a;
}

// The same object's address in CTA `cta` of the cluster.
NSA_DEVICE u32 map(u32 addr, u32 cta) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(cta));
  return r;
}

NSA_DEVICE u32 load(u32 cluster_addr) {
  u32 v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(cluster_addr) : "memory");
  return v;
}

NSA_DEVICE void store(u32 cluster_addr, u32 v) {
  asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(cluster_addr), "r"(v) : "memory");
}

}  // namespace cluster
}  // namespace nsa
#endif
