// Thread-block clusters (sm_90+): rank, cluster-wide barrier and distributed
// shared memory (DSMEM) loads and stores by shared-window address.
#pragma once
#ifndef NSA_CUDA
#error "nsa/cuda/cluster.cuh needs the NVIDIA arch header"
#endif

namespace nsa {
namespace cluster {

NSA_DEVICE u32 rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
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

NSA_DEVICE void store_u8(u32 cluster_addr, u32 v) {
  asm volatile("st.shared::cluster.u8 [%0], %1;" ::"r"(cluster_addr), "r"(v) : "memory");
}

NSA_DEVICE void store_v4(u32 cluster_addr, const Vec16& v) {
  asm volatile("st.shared::cluster.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(cluster_addr), "r"(v.w[0]), "r"(v.w[1]),
               "r"(v.w[2]), "r"(v.w[3])
               : "memory");
}

// Generic-proxy shared-memory writes of this thread (local or remote) made visible
// to the async proxy (wgmma operands) before a release hands them over.
NSA_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cluster;" ::: "memory"); }

// mbarrier arrivals and waits at cluster scope: the arrival releases this thread's
// earlier shared-memory writes (to either CTA) to whoever waits on the phase.
NSA_DEVICE void mbar_arrive(u32 bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.release.cluster.shared::cta.b64 st, [%0];\n}" ::"r"(bar) : "memory");
}

// Arrives on the barrier at `cluster_addr` (`map` of a barrier in another CTA).
NSA_DEVICE void mbar_arrive_remote(u32 cluster_addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr) : "memory");
}

NSA_DEVICE void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n.reg .pred done;\nNSA_CLUSTER_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra NSA_CLUSTER_MBAR_WAIT;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}

}  // namespace cluster
}  // namespace nsa
