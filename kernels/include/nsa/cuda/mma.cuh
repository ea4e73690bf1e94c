// Warp-level tensor-core primitives (sm_80+ PTX, also valid on sm_90a/sm_100a):
// ldmatrix from shared memory, mma.sync m16n8k16 bf16 with f32 accumulators,
// read-only 128-bit gathers. Fragment layouts: PTX ISA "mma.m16n8k16" (lane l:
// group g = l/4, t = l%4; C rows g and g+8, columns 2t and 2t+1).
#pragma once
#ifndef NSA_CUDA
#error "nsa/cuda/mma.cuh needs the NVIDIA arch header"
#endif

namespace nsa {
namespace mma {

// Shared-window address of a generic pointer into shared memory.
NSA_DEVICE u32 smem_addr(const void* p) {
  u64 a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return (u32)a;
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
NSA_DEVICE void ldsm_x4(u32 addr, u32 (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// As ldsm_x4, each matrix transposed (a [k][n] tile read as a B fragment).
NSA_DEVICE void ldsm_x4_trans(u32 addr, u32 (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a (16x16 bf16, row) * b (16x8 bf16, col), f32 accumulate.
NSA_DEVICE void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a (16x16 f16, row) * b (16x8 f16, col), f32 accumulate.
NSA_DEVICE void mma_f16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a (16x32 e4m3, row) * b (32x8 e4m3, col), f32 accumulate (sm_89+).
NSA_DEVICE void mma_e4m3(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 4 bytes global -> shared without a register (cp.async.ca; 4-byte alignment only).
NSA_DEVICE void cp_async_4(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

// 16 bytes global -> shared, cached in L2 only, without cp_async_16's 256-byte L2
// prefetch hint (a 656-byte record's last chunks would pull in its neighbour's bytes).
NSA_DEVICE void cp_async_16_cg(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// 16 bytes from global memory through the non-coherent path, prefetching 256 B into
// L2 (gathered KV rows are 656 B: the neighbouring chunks come along), only when
// `pred`; zeros otherwise (no branch: the result is always defined, so gathered rows
// stay in registers).
NSA_DEVICE Vec16 ldg_nc_v4_if(const void* p, bool pred) {
  Vec16 v;
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n"
      "mov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
      "@q ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
      : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
      : "l"(p), "r"((int)pred));
  return v;
}

// *p through the non-coherent path when `pred`, else `fallback` (no branch: a
// value loaded steps before its use stays in flight).
NSA_DEVICE i32 ldg_nc_s32_or(const i32* p, bool pred, i32 fallback) {
  i32 v;
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\nmov.b32 %0, %3;\n@q ld.global.nc.s32 %0, [%1];\n}"
               : "=r"(v)
               : "l"(p), "r"((int)pred), "r"(fallback));
  return v;
}

// 16 bytes global -> shared without a register round trip; `src_bytes` 0 reads
// nothing and fills the 16 bytes with zeros (a masked row). L2::256B prefetches the
// neighbouring chunks of the same gathered row.
NSA_DEVICE void cp_async_16(u32 dst, const void* src, u32 src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// L2 policy that keeps lines over normal and streaming ones: the sparse-prefill KV
// working set (37.7 MB at s_kv 32K) fits L2 only if the Q, index and output streams
// (each touched once) do not push it out.
NSA_DEVICE u64 l2_evict_last_policy() {
  u64 policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// L2 policy for lines read once (a CTA's Q tile): the first to go.
NSA_DEVICE u64 l2_evict_first_policy() {
  u64 policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// cp_async_16 with an L2 cache policy (l2_evict_last_policy) on the source lines and
// no L2 prefetch: a warp copies whole 128-byte lines of a gathered row, so a 256-byte
// prefetch can only add a line of a neighbouring row, and those lines pushed the
// sparse-prefill KV out of L2 (h16 on the H200: 2.01-2.05 ms with it, 1.88-1.96 without).
NSA_DEVICE void cp_async_16_policy(u32 dst, const void* src, u32 src_bytes, u64 policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
}

// Loads and stores of data touched once (ld/st .cs: evict-first in L1 and L2).
NSA_DEVICE Vec16 ldg_stream_v4(const void* p) {
  Vec16 v;
  asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "l"(p));
  return v;
}
NSA_DEVICE i32 ldg_stream_i32(const i32* p) {
  i32 v;
  asm("ld.global.cs.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
NSA_DEVICE void stg_stream_u32(void* p, u32 v) {
  asm volatile("st.global.cs.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

NSA_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most `kPending` of this thread's committed groups are in flight.
template <int kPending>
NSA_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

NSA_DEVICE void sts_v4(u32 addr, const Vec16& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]),
               "r"(v.w[3]));
}

// Two f32 -> packed bf16x2 (lo in bits 0..15), round to nearest even.
NSA_DEVICE u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Two f32 -> packed f16x2 (lo in bits 0..15), round to nearest even.
NSA_DEVICE u32 pack_f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

NSA_DEVICE u32 mul_f16x2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Bytes of {b, a} (a: 0..3, b: 4..7) picked by the selector's nibbles.
NSA_DEVICE u32 byte_perm(u32 a, u32 b, u32 selector) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

NSA_DEVICE u32 lds_u32(u32 addr) {
  u32 v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

NSA_DEVICE void sts_v2_f32(u32 addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(x), "f"(y));
}

NSA_DEVICE void lds_v2_f32(u32 addr, float& x, float& y) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(x), "=f"(y) : "r"(addr));
}

NSA_DEVICE void sts_f32(u32 addr, float v) { asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(v)); }

NSA_DEVICE Vec16 lds_v4(u32 addr) {
  Vec16 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "r"(addr));
  return v;
}

// Named barriers (ids 1..15) between warp groups: `sync` waits until `n` threads
// have arrived at `id`; `arrive` counts this thread without waiting. Both order the
// shared-memory accesses before them (the producer/consumer hand-off).
NSA_DEVICE void bar_sync(u32 id, u32 n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
NSA_DEVICE void bar_arrive(u32 id, u32 n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }

// Ordinary shared-memory stores become visible to the async proxy (wgmma, TMA)
// after this fence plus a barrier (sm_90+).
NSA_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// One FMNMX (fmax2's compare-and-select takes two instructions); a NaN operand
// yields the other operand.
NSA_DEVICE float max_f32(float a, float b) {
  float r;
  asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// The arch layer's MUFU.EX2 and MUFU.LG2, by the names the MMA kernels use.
NSA_DEVICE float exp2_approx(float x) { return exp2_fast(x); }
NSA_DEVICE float log2_approx(float x) { return log2_fast(x); }

}  // namespace mma
}  // namespace nsa
