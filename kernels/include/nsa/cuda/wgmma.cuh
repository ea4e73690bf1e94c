// Warp-group tensor-core primitives (sm_90a only: wgmma, setmaxnreg, the async-proxy
// fence). Shared-memory operands use the no-swizzle ("interleave") layout: a core
// matrix is 8 rows x 16 bytes stored as 128 contiguous bytes. Accumulators follow
// the PTX ISA "wgmma 64xNxk16 D fragment": warp w of the group, lane l (g = l/4,
// t = l%4) holds rows 16w + g and 16w + g + 8, columns 8i + 2t and 8i + 2t + 1 in
// d[4i .. 4i + 3], the same per-warp layout as mma.sync m16n8k16's C.
#pragma once
#ifndef NSA_CUDA
#error "nsa/cuda/wgmma.cuh needs the NVIDIA arch header"
#endif

namespace nsa {
namespace wg {

// Eight accumulator operands d[o] .. d[o + 7] of a wgmma asm statement.
#define NSA_WG_ACC8(d, o)                                                                                 \
  "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]), \
      "+f"(d[o + 7])
// The asm operand names of 32 and 64 accumulators (operands %0 ..).
#define NSA_WG_D32                                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define NSA_WG_D64                                                                                              \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "  \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "    \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// Descriptor of a no-swizzle operand starting at shared address `addr`, K-major or
// MN-major alike: `k_stride` bytes between core matrices along K (the "leading"
// field), `mn_stride` along M/N (the "stride" field). Checked on the H200 by a
// single wgmma per operand kind against a CPU matmul.
NSA_DEVICE u64 desc(u32 addr, u32 k_stride, u32 mn_stride) {
  return (u64)((addr & 0x3ffffu) >> 4) | ((u64)((k_stride >> 4) & 0x3fffu) << 16) |
         ((u64)((mn_stride >> 4) & 0x3fffu) << 32);
}

// Descriptor of a tile in the 128-byte swizzle layout: rows of 128 bytes, 8-row
// atoms 1024 bytes apart (the stride offset), 16-byte chunk c of row r stored at
// chunk c ^ (r % 8) (`addr` 1024-byte aligned). K-major: the k offset inside the
// 128-byte row is added to the start address (`desc_advance`) and the leading
// offset is unused. MN-major: `leading` = bytes between 64-element column blocks.
NSA_DEVICE u64 desc_sw128(u32 addr, u32 leading = 16) {
  return (u64)((addr & 0x3ffffu) >> 4) | ((u64)((leading >> 4) & 0x3fffu) << 16) | ((u64)(1024 >> 4) << 32) |
         ((u64)1 << 62);
}

// Byte offset of 16-byte chunk c (0..7) of row r in that layout, from the tile's
// 1024-byte aligned start.
NSA_DEVICE u32 sw128_offset(u32 r, u32 c) { return r * 128 + ((c ^ (r & 7)) * 16); }

// The same descriptor `bytes` further on (inside the 256 KiB window), opaque to the
// compiler so an unrolled k loop recomputes its descriptors instead of holding
// dozens of 64-bit constants in registers across the main loop.
NSA_DEVICE u64 desc_advance(u64 d, u32 bytes) {
  asm volatile("" : "+l"(d));
  return d + (bytes >> 4);
}

// Orders this thread's register writes before the next wgmma that reads them.
NSA_DEVICE void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
NSA_DEVICE void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most kPending committed groups are in flight.
template <int kPending>
NSA_DEVICE void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Keeps the compiler from reading accumulators before the wait that completes them.
template <int kN>
NSA_DEVICE void pin(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Per-warp-group register budgets (all warps of the group execute the same value).
template <int kRegs>
NSA_DEVICE void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
NSA_DEVICE void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
// From the launch budget kFrom to kTo: `inc` or `dec` as the direction needs (the
// wrong direction is an illegal instruction), nothing when equal.
template <int kFrom, int kTo>
NSA_DEVICE void regs_set() {
  static_assert(kTo % 8 == 0 && kTo >= 24 && kTo <= 256, "setmaxnreg: a multiple of 8 in 24..256");
  if constexpr (kTo > kFrom)
    regs_inc<kTo>();
  else if constexpr (kTo < kFrom)
    regs_dec<kTo>();
}

// d (64 x 64, f32) {+}= A (64 x 16 bf16, smem descriptor) * B (64 x 16 bf16, smem descriptor);
// kTransB: B is MN-major (the 64 columns contiguous in each core-matrix row).
template <int kTransB>
NSA_DEVICE void mma_m64n64k16_ss(float (&d)[32], u64 desc_a, u64 desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " NSA_WG_D32 ", %32, %33, p, 1, 1, 0, %35;\n}\n"
      : NSA_WG_ACC8(d, 0), NSA_WG_ACC8(d, 8), NSA_WG_ACC8(d, 16), NSA_WG_ACC8(d, 24)
      : "l"(desc_a), "l"(desc_b), "r"((int)accumulate), "n"(kTransB));
}

// d (64 x 128, f32) {+}= A (64 x 16 bf16, smem descriptor) * B (128 x 16 bf16, smem descriptor);
// kTransB: B is MN-major (the 128 columns contiguous in each core-matrix row).
template <int kTransB>
NSA_DEVICE void mma_m64n128k16_ss(float (&d)[64], u64 desc_a, u64 desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " NSA_WG_D64 ", %64, %65, p, 1, 1, 0, %67;\n}\n"
      : NSA_WG_ACC8(d, 0), NSA_WG_ACC8(d, 8), NSA_WG_ACC8(d, 16), NSA_WG_ACC8(d, 24), NSA_WG_ACC8(d, 32), NSA_WG_ACC8(d, 40), NSA_WG_ACC8(d, 48), NSA_WG_ACC8(d, 56)
      : "l"(desc_a), "l"(desc_b), "r"((int)accumulate), "n"(kTransB));
}

// d (64 x 128, f32) {+}= A (64 x 16 bf16, registers: the mma.sync A fragment of
// this warp's 16 rows) * B (128 x 16 bf16, smem descriptor); kTransB as above.
template <int kTransB>
NSA_DEVICE void mma_m64n128k16_rs(float (&d)[64], const u32 (&a)[4], u64 desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " NSA_WG_D64 ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : NSA_WG_ACC8(d, 0), NSA_WG_ACC8(d, 8), NSA_WG_ACC8(d, 16), NSA_WG_ACC8(d, 24), NSA_WG_ACC8(d, 32), NSA_WG_ACC8(d, 40), NSA_WG_ACC8(d, 48), NSA_WG_ACC8(d, 56)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"((int)accumulate), "n"(kTransB));
}

// d (64 x 64, f32) {+}= A (64 x 32 e4m3, smem descriptor) * B (64 x 32 e4m3, smem
// descriptor), both K-major (FP8 wgmma has no transpose).
NSA_DEVICE void mma_m64n64k32_e4m3_ss(float (&d)[32], u64 desc_a, u64 desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " NSA_WG_D32 ", %32, %33, p, 1, 1;\n}\n"
      : NSA_WG_ACC8(d, 0), NSA_WG_ACC8(d, 8), NSA_WG_ACC8(d, 16), NSA_WG_ACC8(d, 24)
      : "l"(desc_a), "l"(desc_b), "r"((int)accumulate));
}

#undef NSA_WG_ACC8
#undef NSA_WG_D32
#undef NSA_WG_D64

}  // namespace wg
}  // namespace nsa
