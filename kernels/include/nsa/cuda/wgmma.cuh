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

// Descriptor of a no-swizzle operand starting at shared address `addr`, K-major or
// MN-major alike: `k_stride` bytes between core matrices along K (the "leading"
// field), `mn_stride` along M/N (the "stride" field). Checked on the H200 by a
// single wgmma per operand kind against a CPU matmul.
NSA_DEVICE u64 desc(u32 addr, u32 k_stride, u32 mn_stride) {
  return (u64)((addr & 0x3ffffu) >> 4) | ((u64)((k_stride >> 4) & 0x3fffu) << 16) |
         ((u64)((mn_stride >> 4) & 0x3fffu) << 32);
}

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
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"((int)accumulate), "n"(kTransB));
}

// d (64 x 128, f32) {+}= A (64 x 16 bf16, smem descriptor) * B (128 x 16 bf16, smem descriptor);
// kTransB: B is MN-major (the 128 columns contiguous in each core-matrix row).
template <int kTransB>
NSA_DEVICE void mma_m64n128k16_ss(float (&d)[64], u64 desc_a, u64 desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, %67;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"((int)accumulate), "n"(kTransB));
}

// d (64 x 128, f32) {+}= A (64 x 16 bf16, registers: the mma.sync A fragment of
// this warp's 16 rows) * B (128 x 16 bf16, smem descriptor); kTransB as above.
template <int kTransB>
NSA_DEVICE void mma_m64n128k16_rs(float (&d)[64], const u32 (&a)[4], u64 desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"((int)accumulate), "n"(kTransB));
}

}  // namespace wg
}  // namespace nsa
