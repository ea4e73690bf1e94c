// Phase timing of the cluster top-k kernel (one row over a cluster of 8 CTAs), for
// finding what limits it. Not part of the product; build and run on the GPU machine:
//   nvcc -std=c++17 -O3 -arch=sm_90a -I kernels/include -o topk_cluster_phases .ci/bench/topk_cluster_phases.cu
//   ./topk_cluster_phases [n]
// -DCLUSTER=16 builds a non-portable cluster of 16; -DNSA_PHASES_UNMARKED builds the
// kernel without marks (then only the back-to-back time means anything).
// It compiles the product's cluster_select with its phase-mark hook defined (a block
// barrier, then thread 0 records clock64 and %globaltimer), runs it on uniform
// [0, 1) rows like `nsa bench --suite topk`, checks the chosen set on the CPU and
// prints each CTA's cycles per phase and its first and last mark against the
// cluster's first mark. The marks' barriers add a little to every phase.
#include "nsa/cuda/arch.cuh"

#include <cstdint>

__device__ long long* g_marks;  // [launch CTA][phase][clock64, globaltimer]
constexpr int kMarks = 6;

#ifndef NSA_PHASES_UNMARKED
#define NSA_TOPK_CLUSTER_MARK(phase)                                               \
  do {                                                                             \
    nsa::sync_block();                                                             \
    if (nsa::thread_x() == 0) {                                                    \
      unsigned long long ns;                                                       \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));                       \
      long long* m = g_marks + ((long long)nsa::block_x() * kMarks + (phase)) * 2; \
      m[0] = clock64();                                                            \
      m[1] = (long long)ns;                                                        \
    }                                                                              \
  } while (0)
#endif

#include "nsa/topk_cluster.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "harness.cuh"

using namespace nsa;
using namespace nsa::topk;

constexpr int K = 2048;
constexpr int kThreads = 1024;
#ifndef CLUSTER
#define CLUSTER 8
#endif
constexpr int kCluster = CLUSTER;
// The product's cluster layout (kernels/src/spec.rs): 4096 candidates, 40960-key row cache.
constexpr int kCandCap = 4096;
constexpr int kCacheCap = 40960;
constexpr int kSmemWords = kFixedWords + 2 * kCandCap + kCacheCap;
// Every CTA passes marks 0-4; only CTA 0 cuts and places (mark 5). On the sample-free
// path (slices of up to 16 keys a thread) "sample" is the local histogram and the
// bounds' exchange, and "list" the listing from registers.
const char* const kPhaseNames[kMarks - 1] = {"sample", "list", "counts", "push", "cut+place"};

__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 1) marked(Params p, u32* status) {
  cluster_select<float, K, kPlain, kThreads, kCluster, kCandCap, kCacheCap, kSmemWords>(p, status);
}

int main(int argc, char** argv) {
  const int rows = 1, n = argc > 1 ? atoi(argv[1]) : 131072, reps = 50;
  const TopkRows t = alloc_topk_rows(rows, n, K);
  long long* marks;
  const int ctas = rows * kCluster;
  CK(cudaMalloc(&marks, (size_t)ctas * kMarks * 2 * 8));
  CK(cudaMemset(marks, 0, (size_t)ctas * kMarks * 2 * 8));
  CK(cudaMemcpyToSymbol(g_marks, &marks, sizeof(marks)));
  auto p = t.params<Params>();
  const int smem = kSmemWords * 4;
  CK(cudaFuncSetAttribute(marked, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  if (kCluster > 8) CK(cudaFuncSetAttribute(marked, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  const float b2b_us = events_us([&] { marked<<<ctas, kThreads, smem>>>(p, t.status); }, 200);
  CK(cudaGetLastError());
  printf("cluster %d, %d x %d: %.2f us per launch back to back (events, 200 launches)\n", kCluster, rows, n, b2b_us);

  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> cycles(kCluster * (kMarks - 1), 0.0), start_ns(kCluster, 0.0), end_ns(kCluster, 0.0);
  std::vector<long long> m((size_t)ctas * kMarks * 2);
  for (int i = 0; i < 3; ++i) marked<<<ctas, kThreads, smem>>>(p, t.status);
  CK(cudaEventRecord(a));
  for (int r = 0; r < reps; ++r) {
    CK(cudaMemset(marks, 0, (size_t)ctas * kMarks * 2 * 8));
    marked<<<ctas, kThreads, smem>>>(p, t.status);
    CK(cudaMemcpy(m.data(), marks, m.size() * 8, cudaMemcpyDeviceToHost));
    long long first = m[1];
    for (int c = 0; c < kCluster; ++c) first = std::min(first, m[((size_t)c * kMarks) * 2 + 1]);
    for (int c = 0; c < kCluster; ++c) {
      const long long* mc = m.data() + (size_t)c * kMarks * 2;
      int last = 0;
      for (int ph = 0; ph + 1 < kMarks; ++ph) {
        if (mc[(ph + 1) * 2] == 0) continue;  // a mark this CTA does not pass
        cycles[c * (kMarks - 1) + ph] += (double)(mc[(ph + 1) * 2] - mc[ph * 2]);
        last = ph + 1;
      }
      start_ns[c] += (double)(mc[1] - first);
      end_ns[c] += (double)(mc[last * 2 + 1] - first);
    }
  }
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  CK(cudaGetLastError());
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  printf("marked cluster kernel, %d x %d, cluster %d: %.2f us per launch with a copy between (events)\n", rows, n,
         kCluster, ms * 1000.f / reps);

  // Check the last launch's set against the CPU.
  std::vector<float> host((size_t)n);
  std::vector<int> got(K);
  CK(cudaMemcpy(host.data(), t.scores, (size_t)n * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(got.data(), t.out, K * 4, cudaMemcpyDeviceToHost));
  printf("set %s\n", topk_wrong_rows(host, got, rows, n, K, false, rows) == 0 ? "correct" : "WRONG");

  int clock_khz;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  printf("cycles per phase (mean of %d launches; SM clock %d MHz), start and end in ns after the first CTA's start:\n",
         reps, clock_khz / 1000);
  printf("cta");
  for (const char* name : kPhaseNames) printf(" %8s", name);
  printf(" %8s %8s\n", "start", "end");
  for (int c = 0; c < kCluster; ++c) {
    printf("%3d", c);
    for (int ph = 0; ph + 1 < kMarks; ++ph) printf(" %8.0f", cycles[c * (kMarks - 1) + ph] / reps);
    printf(" %8.0f %8.0f\n", start_ns[c] / reps, end_ns[c] / reps);
  }
  return 0;
}
