// Bulk asynchronous copies (TMA, with or without a tensor map, sm_90+) and the
// shared-memory mbarriers that count their bytes. A copy signals completion by
// decrementing the barrier's transaction count; a phase completes when its arrivals
// and its expected bytes are both in.
#pragma once
#ifndef NSA_CUDA
#error "nsa/cuda/bulk.cuh needs the NVIDIA arch header"
#endif

namespace nsa {
namespace bulk {

NSA_DEVICE void mbar_init(u32 bar, u32 arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes initialised barriers visible to the other threads and to the async proxy
// (the copy engine); a block barrier must follow.
NSA_DEVICE void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

NSA_DEVICE void mbar_arrive(u32 bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar) : "memory");
}

// One arrival that also expects `bytes` more bytes of copies in this phase.
NSA_DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Waits until the phase with parity `parity` has completed.
NSA_DEVICE void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n.reg .pred done;\nNSA_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra NSA_MBAR_WAIT;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared
// memory, counted on `bar`.
NSA_DEVICE void copy_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// A tensor map as the host encodes it (cuTensorMapEncodeTiled): 128 opaque bytes,
// read by the copy engine from a __grid_constant__ kernel parameter.
struct alignas(64) TensorMap {
  u64 opaque[16];
};

// The box of the 3-D tensor map `map` at coordinates (c0, c1, c2), innermost first,
// into shared memory at `dst` in the map's layout (its swizzle; 1024-byte aligned
// for 128-byte swizzle), counted on `bar`, under the L2 cache policy `policy`.
NSA_DEVICE void copy_tensor_3d(u32 dst, const TensorMap* map, i32 c0, i32 c1, i32 c2, u32 bar, u64 policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
      : "memory");
}

// Fetches `map` into the copy engine's cache ahead of its first copy.
NSA_DEVICE void prefetch_tensor_map(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// Arrives on `bar` once all of this thread's earlier cp.async copies have landed
// (the barrier's arrival count includes this arrival).
NSA_DEVICE void mbar_arrive_on_cp_async(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

}  // namespace bulk
}  // namespace nsa
