// CPU-emulation of nsa/cuda/cluster.cuh: a shared-window address is the byte
// offset in the CTA's shared memory, with the CTA's rank in the top byte once mapped.
#pragma once
#ifndef NSA_EMU
#error "nsa/emu/cluster.cuh needs the emulated arch header"
#endif

namespace nsa {
namespace cluster {

constexpr u32 kRankShift = 24;  // shared memory stays below 16 MiB

NSA_DEVICE u32 rank() { return nsa_emu::cluster_rank(); }

NSA_DEVICE u32 size() { return nsa_emu::cluster_size(); }

NSA_DEVICE void sync() {
  nsa_emu::cluster_arrive();
  nsa_emu::cluster_wait();
}

NSA_DEVICE u32 local_addr(const void* p) {
  return (u32)(static_cast<const unsigned char*>(p) - nsa_emu::local_smem());
}

NSA_DEVICE u32 map(u32 addr, u32 cta) { return (addr & ((1u << kRankShift) - 1u)) | cta << kRankShift; }

NSA_DEVICE u32* at(u32 cluster_addr) {
  return reinterpret_cast<u32*>(nsa_emu::cluster_smem(cluster_addr >> kRankShift, true) +
                                (cluster_addr & ((1u << kRankShift) - 1u)));
}

NSA_DEVICE u32 load(u32 cluster_addr) { return __atomic_load_n(at(cluster_addr), __ATOMIC_RELAXED); }

NSA_DEVICE void store(u32 cluster_addr, u32 v) { __atomic_store_n(at(cluster_addr), v, __ATOMIC_RELAXED); }

}  // namespace cluster
}  // namespace nsa
