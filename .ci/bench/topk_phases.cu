// Phase timing of the top-k sample filter (one block per row), for finding what
// limits it. Not part of the product; build and run on the GPU machine:
//   nvcc -std=c++17 -O3 -arch=sm_90a -I kernels/include -o topk_phases .ci/bench/topk_phases.cu
//   ./topk_phases
// It runs the product's kernel (nsa::topk::select) and the same filter path with a
// clock64 mark after each phase (thread 0, after a barrier), on uniform [0, 1) scores
// like `nsa bench --suite topk`, and checks the chosen sets on the CPU.
#include "nsa/cuda/arch.cuh"
#include "nsa/topk.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "harness.cuh"

using namespace nsa;
using namespace nsa::topk;

template <int K, int T, int kCandCap, int kCacheCap, int kMinBlocks>
__global__ void __launch_bounds__(T, kMinBlocks) product(Params p, u32* status) {
  select<float, K, kPlain, false, T, kCandCap, kCacheCap, kFixedWords + 2 * kCandCap + kCacheCap>(p, status);
}

constexpr int kPhases = 6;
const char* const kPhaseNames[kPhases] = {"sample load", "sample cut", "pass", "gather", "cut", "place"};

// filter_select's steps with a mark after each (plain transform, rows longer than kCap).
template <int K, int T, int kCap, int kMinBlocks>
__global__ void __launch_bounds__(T, kMinBlocks) phases(Params p, long long* marks, u32* declined) {
  extern __shared__ u32 smem[];
  const ListSmem l = list_smem<kCap>(smem);
  u32 *hist = l.hist, *sm = l.sm, *fidx = l.idx, *fkey = l.key;
  const u32 tid = thread_x();
  const i32 row = (i32)block_x();
  const i32 n = p.lengths[row];
  const float* src = static_cast<const float*>(p.scores) + (i64)row * p.row_stride;
  int m = 0;
  auto mark = [&] {
    sync_block();
    if (tid == 0) marks[(i64)row * (kPhases + 1) + m] = clock64();
    ++m;
  };
  mark();
  if (tid == 0) sm[kCands] = 0u;
  load_sample<T, kCap>(src, n, fkey);
  mark();
  i64 thr;
  u32 ties;
  const u32 rank = Sample<kCap>::template runs<K>(n) * Sample<kCap>::kRun;
  list_cut<T, 1>(fkey, Sample<kCap>::kSectors * Sample<kCap>::kRun, rank, hist, sm, thr, ties);
  const u32 lo = (u32)(ties > 0 ? thr : thr + 1);
  mark();
  filter_pass<T, kCap, 8>(src, 0, n, lo, sm, fidx);
  mark();
  const u32 kept = sm[kCands];
  fill_keys<T>(src, kept < (u32)kCap ? kept : (u32)kCap, fidx, fkey);
  mark();
  if (kept < (u32)K || kept > (u32)kCap) {
    if (tid == 0) declined[row] = 1;
    return;
  }
  list_cut<T>(fkey, kept, (u32)K, hist, sm, thr, ties);
  mark();
  place_listed<K, kPlain, T, false>(p, row, 0, p.out + (i64)row * K, fidx, fkey, kept, thr, ties, hist, sm);
  mark();
}

struct Shape {
  int rows, n;
};

struct Buffers {
  TopkRows t;
  long long* marks;
  u32* declined;
  std::vector<float> host;
};

static Buffers make(Shape sh, int K) {
  Buffers b;
  b.t = alloc_topk_rows(sh.rows, sh.n, K, 12345u + sh.rows);
  CK(cudaMalloc(&b.marks, (size_t)sh.rows * (kPhases + 1) * 8));
  CK(cudaMalloc(&b.declined, sh.rows * 4));
  b.host.resize((size_t)sh.rows * sh.n);
  CK(cudaMemcpy(b.host.data(), b.t.scores, b.host.size() * 4, cudaMemcpyDeviceToHost));
  return b;
}

// Rows (of the first 16) whose output is not a top-k set of distinct positions.
static int wrong_rows(const Buffers& b, Shape sh, int K) {
  std::vector<int> out((size_t)sh.rows * K);
  CK(cudaMemcpy(out.data(), b.t.out, out.size() * 4, cudaMemcpyDeviceToHost));
  return topk_wrong_rows(b.host, out, sh.rows, sh.n, K, false, 16);
}

template <typename Kern>
static void kernel_info(Kern kern, int threads, int smem, int& occupancy, cudaFuncAttributes& fa) {
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy, kern, threads, smem));
  CK(cudaFuncGetAttributes(&fa, kern));
}

template <int K, int T, int kCandCap, int kCacheCap, int kMinBlocks>
static void run(const char* layout, Shape sh, int reps, int clock_khz) {
  Buffers b = make(sh, K);
  const Params p = b.t.params<Params>();
  int occupancy;
  cudaFuncAttributes fa;

  auto prod = product<K, T, kCandCap, kCacheCap, kMinBlocks>;
  const int prod_smem = (kFixedWords + 2 * kCandCap + kCacheCap) * 4;
  kernel_info(prod, T, prod_smem, occupancy, fa);
  CK(cudaMemset(b.t.out, 0xff, (size_t)sh.rows * K * 4));
  const float prod_us = events_us([&] { prod<<<sh.rows, T, prod_smem>>>(p, b.t.status); }, reps);
  CK(cudaGetLastError());
  printf("%-10s %5d x %-7d product kernel %8.2f us  (%d per SM, %d registers, %d B spilled)  wrong rows %d\n", layout,
         sh.rows, sh.n, prod_us, occupancy, fa.numRegs, (int)fa.localSizeBytes, wrong_rows(b, sh, K));

  constexpr int kCap = (2 * kCandCap + kCacheCap) / 2;
  auto ph = phases<K, T, kCap, kMinBlocks>;
  const int ph_smem = (kBins + kScalarWords + 2 * kCap) * 4;
  kernel_info(ph, T, ph_smem, occupancy, fa);
  CK(cudaMemset(b.t.out, 0xff, (size_t)sh.rows * K * 4));
  CK(cudaMemset(b.declined, 0, sh.rows * 4));
  const float ph_us = events_us([&] { ph<<<sh.rows, T, ph_smem>>>(p, b.marks, b.declined); }, reps);
  CK(cudaGetLastError());
  std::vector<long long> marks((size_t)sh.rows * (kPhases + 1));
  CK(cudaMemcpy(marks.data(), b.marks, marks.size() * 8, cudaMemcpyDeviceToHost));
  std::vector<u32> declined(sh.rows);
  CK(cudaMemcpy(declined.data(), b.declined, sh.rows * 4, cudaMemcpyDeviceToHost));
  int n_declined = 0;
  for (u32 d : declined) n_declined += d != 0;
  printf("%-10s %5d x %-7d marked kernel  %8.2f us  declined rows %d  wrong rows %d\n", layout, sh.rows, sh.n, ph_us,
         n_declined, n_declined ? -1 : wrong_rows(b, sh, K));
  double sum = 0;
  printf("    cycles per row:");
  for (int i = 0; i < kPhases; ++i) {
    double c = 0;
    for (int r = 0; r < sh.rows; ++r) c += (double)(marks[(size_t)r * (kPhases + 1) + i + 1] - marks[(size_t)r * (kPhases + 1) + i]);
    c /= sh.rows;
    sum += c;
    printf("  %s %.0f", kPhaseNames[i], c);
  }
  printf("  | total %.0f (%.1f us at %d MHz)\n", sum, sum / (clock_khz / 1000.0), clock_khz / 1000);
}

int main() {
  int clock_khz;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  constexpr int K = 2048;
  // The product's two single-block layouts (kernels/src/spec.rs): latency 1024 threads,
  // 4096 candidates + 8192 row cache; throughput 512 threads, two per SM, 6144 candidates.
  run<K, 1024, 4096, 8192, 1>("latency", Shape{64, 131072}, 50, clock_khz);
  run<K, 512, 6144, 0, 2>("throughput", Shape{2048, 32768}, 50, clock_khz);
  return 0;
}
