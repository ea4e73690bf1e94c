// The floor under one-row top-k (1 × N over a cluster of 8 CTAs of 1024 threads,
// the product's launch shape and shared memory): what a launch costs back to back
// before any selection work, and what each step of the minimum chain adds. Not part
// of the product; build and run on the GPU machine:
//   nvcc -std=c++17 -O3 -arch=sm_90a -I kernels/include -o topk_floor .ci/bench/topk_floor.cu
//   ./topk_floor [n]
// Every kernel is timed back to back (200 launches, events), once as plain launches
// and once with programmatic dependent launch (PDL, as `nsa bench` launches top-k).
// The steps, each kernel doing all of the previous one's work too:
//   empty      griddepcontrol only
//   load       every CTA reads its 1/8 of the row (4 float4 a thread, all in flight)
//   write      + CTA 0 writes K output positions (2 a thread)
//   csync      + one cluster barrier between the load and the write
//   hist       + each CTA histograms its keys (2048 bins of the top 11 key bits,
//                shared-memory atomics) and finds the bin of its 256th key
//                (find_threshold): one radix round, no exchange between CTAs
//   local      a sample-free chain: each CTA histograms its own slice (13-bit bins,
//                from registers), takes the floor of the bin of its local rank
//                K/8 + 4·sqrt(K/8) + 4 as its bound, lists its keys at or above it
//                (position and key, no gather), and the lists are joined in CTA 0
//                as the product joins them; CTA 0 then writes K listed positions
//   local+cut  + CTA 0 cuts and places the joined list (the product's cut_and_place).
//                Exact when every CTA's bound is at or below the row's K-th key
//                (CTA 0 would check that the joined keys at or above the highest
//                bound number at least K); the harness checks the set on the CPU
//   pull       local+cut, but CTA 0 reads the other CTAs' lists through DSMEM after
//                the first cluster barrier instead of their pushing them before a
//                second; the others only wait, at a second barrier, until CTA 0 has
//                read them (CTA 0 arrives there and does not wait)
//   min+pull   pull, but every CTA lists its keys at or above the lowest of the
//                CTAs' bounds (exchanged through DSMEM after one more cluster
//                barrier): then at least K keys are listed whatever the row, so the
//                set is exact with no check (a skewed row only lengthens the list)
//   product    the product's cluster_select (plain transform), for the same card
#include "nsa/cuda/arch.cuh"
#include "nsa/topk_cluster.cuh"

#include <cuda_runtime.h>

#include "harness.cuh"

using namespace nsa;
using namespace nsa::topk;

constexpr int K = 2048;
constexpr int kThreads = 1024;
constexpr int kCluster = 8;
// The product's cluster layout (kernels/src/spec.rs): 4096 candidates, 40960-key row cache.
constexpr int kCandCap = 4096;
constexpr int kCacheCap = 40960;
constexpr int kSmemWords = kFixedWords + 2 * kCandCap + kCacheCap;
constexpr int kVecs = 4;  // float4 a thread: 16 keys, a 16K-key slice per CTA

enum Step { kEmpty, kLoad, kWrite, kClusterSync, kHist };
const char* const kStepNames[] = {"empty", "load", "write", "csync", "hist"};

template <int kStep>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 1) step_kernel(Params p, u32* status) {
  wait_prior_grids();
  start_dependent_grids();
  if (kStep == kEmpty) return;
  extern __shared__ u32 smem[];
  u32* hist = smem;
  u32* sm = smem + kBins;
  const u32 tid = thread_x();
  const u32 rank = cluster::rank();
  if (kStep >= kHist)
    for (u32 b = tid; b < (u32)kListBins; b += kThreads) hist[b] = 0u;
  const int n = p.lengths[0];
  const int slice = n / kCluster;
  const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.scores) + (long long)rank * slice);
  float4 v[kVecs];
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
    const int j = u * kThreads + (int)tid;
    v[u] = 4 * j < slice ? src[j] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float m = v[0].x;
#pragma unroll
  for (int u = 0; u < kVecs; ++u) m = fmaxf(fmaxf(m, v[u].x), fmaxf(fmaxf(v[u].y, v[u].z), v[u].w));
  if (m == -12345.f) status[1] = 1u;  // never true for [0, 1) rows: keeps the loads
  if (kStep >= kClusterSync) cluster::sync();
  u32 bin = 0;
  if (kStep >= kHist) {
    sync_block();
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      atomic_add_ret(&hist[order_key(v[u].x) >> 21], 1u);
      atomic_add_ret(&hist[order_key(v[u].y) >> 21], 1u);
      atomic_add_ret(&hist[order_key(v[u].z) >> 21], 1u);
      atomic_add_ret(&hist[order_key(v[u].w) >> 21], 1u);
    }
    sync_block();
    find_threshold<kThreads, kListBins>(hist, kListBins, (u32)(K / kCluster), sm);
    bin = sm[kThrBin];
  }
  if (kStep >= kWrite && rank == 0) {
    for (u32 k = tid; k < (u32)K; k += kThreads) p.out[k] = (i32)(k + bin);
  }
}

// The sample-free chains: local (no kCut), local+cut, pull (kPull, which always
// cuts) and min+pull (kMin).
template <bool kCut, bool kPull, bool kMin = false>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 1) local_kernel(Params p, u32* status) {
  static_assert(kCut || !kPull, "the pull join is timed with its cut");
  wait_prior_grids();
  start_dependent_grids();
  constexpr int kCap = (2 * kCandCap + kCacheCap) / 2;
  extern __shared__ u32 smem[];
  const ListSmem l = list_smem<kCap>(smem);
  u32 *hist = l.hist, *sm = l.sm, *fidx = l.idx, *fkey = l.key;
  const u32 tid = thread_x();
  const u32 rank = cluster::rank();
  for (u32 b = tid; b < (u32)kBins; b += kThreads) hist[b] = 0u;
  if (tid == 0) sm[kCands] = 0u;
  const int n = p.lengths[0];
  const int slice = n / kCluster;
  const int begin = (int)rank * slice;
  const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.scores) + begin);
  u32 key[4 * kVecs];
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
    const int j = u * kThreads + (int)tid;
    const float4 v = 4 * j < slice ? src[j] : make_float4(nanf(""), nanf(""), nanf(""), nanf(""));
    key[4 * u] = order_key(v.x);
    key[4 * u + 1] = order_key(v.y);
    key[4 * u + 2] = order_key(v.z);
    key[4 * u + 3] = order_key(v.w);
  }
  sync_block();  // the histogram is clear
#pragma unroll
  for (int e = 0; e < 4 * kVecs; ++e) atomic_add_ret(&hist[key[e] >> 19], 1u);
  sync_block();
  constexpr u32 kLocal = K / kCluster;
  find_threshold<kThreads, kBins>(hist, kBins, kLocal + 4u * 16u + 4u, sm);  // sqrt(256) = 16
  u32 lo = sm[kThrBin] << 19;
  if (kMin) {
    if (tid == 0) sm[kBase] = lo;
    cluster::sync();
    if (tid < 32) {
      const u32 lane = lane_id();
      u32 b = lane < (u32)kCluster ? cluster::load(cluster::map(cluster::local_addr(&sm[kBase]), lane)) : ~0u;
#pragma unroll
      for (int m = 16; m > 0; m /= 2) b = min(b, __shfl_xor_sync(0xffffffffu, b, m));
      if (lane == 0) sm[kLast] = b;
    }
    sync_block();
    lo = sm[kLast];
  }
  u32 hits = 0;
#pragma unroll
  for (int e = 0; e < 4 * kVecs; ++e) hits |= (key[e] >= lo ? 1u : 0u) << e;
  u32 slot = warp_reserve(&sm[kCands], popc_u32(hits));
  for (; hits != 0u; hits &= hits - 1u, ++slot) {
    const u32 e = popc_u32((hits & (0u - hits)) - 1u);
    if (slot < (u32)kCap) {
      fidx[slot] = (u32)(begin + 4 * ((int)(e / 4) * kThreads + (int)tid) + (int)(e % 4));
      fkey[slot] = key[e];
    }
  }
  sync_block();
  const u32 mine = sm[kCands];
  cluster::sync();
  if (kPull) {
    __shared__ u32 counts[kCluster + 1];  // the CTAs' list starts in the joined list, then its length
    if (rank != 0) {  // wait until CTA 0 has read this CTA's list (it arrives below)
      cluster::sync();
      return;
    }
    if (tid < 32) {
      const u32 lane = lane_id();
      const u32 c = lane < (u32)kCluster ? cluster::load(cluster::map(cluster::local_addr(&sm[kCands]), lane)) : 0u;
      const u32 incl = warp_inclusive_scan(c);
      if (lane < (u32)kCluster) counts[lane] = incl - c;
      if (lane == kCluster - 1) counts[kCluster] = incl;
    }
    sync_block();
    const u32 joined = counts[kCluster];
    const bool fits = joined >= (u32)K && joined <= (u32)kCap;
    if (fits) {
      for (u32 c = mine + tid; c < joined; c += kThreads) {
        u32 cta = 1;
#pragma unroll
        for (int q = 2; q < kCluster; ++q) cta += c >= counts[q] ? 1u : 0u;
        const u32 at = 4u * (c - counts[cta]);
        fidx[c] = cluster::load(cluster::map(cluster::local_addr(fidx), cta) + at);
        fkey[c] = cluster::load(cluster::map(cluster::local_addr(fkey), cta) + at);
      }
    }
    sync_block();
    // Arrive without waiting: CTA 0 is done with the other CTAs' shared memory.
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    if (!fits) {
      if (tid == 0) status[2] = joined;
      return;
    }
    cut_and_place<K, kPlain, kThreads>(p, 0, -1, p.out, fidx, fkey, joined, hist, sm);
    return;
  }
  join_counts<kCluster>(sm, rank);
  sync_block();
  const u32 joined = sm[kJoined];
  const u32 base = sm[kBase];
  const bool fits = joined >= (u32)K && joined <= (u32)kCap;
  if (fits && rank != 0) {
    const u32 idx0 = cluster::map(cluster::local_addr(fidx), 0);
    const u32 key0 = cluster::map(cluster::local_addr(fkey), 0);
    for (u32 c = tid; c < mine; c += kThreads) {
      cluster::store(idx0 + 4u * (base + c), fidx[c]);
      cluster::store(key0 + 4u * (base + c), fkey[c]);
    }
  }
  cluster::sync();
  if (rank != 0) return;
  if (!fits) {
    if (tid == 0) status[2] = joined;
    return;
  }
  if (kCut) {
    cut_and_place<K, kPlain, kThreads>(p, 0, -1, p.out, fidx, fkey, joined, hist, sm);
  } else {
    for (u32 k = tid; k < (u32)K; k += kThreads) p.out[k] = (i32)fidx[k];
  }
}

__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 1) product(Params p, u32* status) {
  wait_prior_grids();
  start_dependent_grids();
  cluster_select<float, K, kPlain, kThreads, kCluster, kCandCap, kCacheCap, kSmemWords>(p, status);
}

template <typename Kernel>
float time_kernel(Kernel kernel, const Params& p, u32* status, bool pdl) {
  const int smem = kSmemWords * 4;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kCluster);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const float us = events_us([&] { CK(cudaLaunchKernelEx(&cfg, kernel, p, status)); }, 200);
  CK(cudaDeviceSynchronize());
  return us;
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 131072;
  if (n % (4 * kCluster) != 0 || n / kCluster > 4 * kVecs * kThreads) {
    printf("n must be a multiple of %d and at most %d\n", 4 * kCluster, 4 * kVecs * kThreads * kCluster);
    return 2;
  }
  const TopkRows t = alloc_topk_rows(1, n, K);
  const Params p = t.params<Params>();
  int clock_khz;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  printf("1 x %d, cluster %d x %d threads, %d B shared memory, SM clock %d MHz\n", n, kCluster, kThreads,
         kSmemWords * 4, clock_khz / 1000);
  printf("%-8s %10s %10s\n", "step", "plain us", "pdl us");
  // Two rounds, so a drifting clock shows.
  for (int round = 0; round < 2; ++round) {
    auto row = [&](const char* name, auto kernel) {
      const float a = time_kernel(kernel, p, t.status, false);
      const float b = time_kernel(kernel, p, t.status, true);
      printf("%-8s %10.2f %10.2f\n", name, a, b);
    };
    row(kStepNames[kEmpty], step_kernel<kEmpty>);
    row(kStepNames[kLoad], step_kernel<kLoad>);
    row(kStepNames[kWrite], step_kernel<kWrite>);
    row(kStepNames[kClusterSync], step_kernel<kClusterSync>);
    row(kStepNames[kHist], step_kernel<kHist>);
    row("local", local_kernel<false, false>);
    auto check = [&](const char* name) {
      std::vector<float> host((size_t)n);
      std::vector<int> got(K);
      unsigned st[4];
      CK(cudaMemcpy(host.data(), t.scores, (size_t)n * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(got.data(), t.out, K * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(st, t.status, 16, cudaMemcpyDeviceToHost));
      printf("%s's set: %s (a list that did not fit: %u keys)\n", name,
             topk_wrong_rows(host, got, 1, n, K, false, 1) == 0 ? "correct" : "WRONG", st[2]);
      CK(cudaMemset(t.out, 0xff, K * 4));
    };
    row("local+cut", local_kernel<true, false>);
    check("local+cut");
    row("pull", local_kernel<true, true>);
    check("pull");
    row("min+pull", local_kernel<true, true, true>);
    check("min+pull");
    row("product", product);
  }
  std::vector<float> host((size_t)n);
  std::vector<int> got(K);
  CK(cudaMemcpy(host.data(), t.scores, (size_t)n * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(got.data(), t.out, K * 4, cudaMemcpyDeviceToHost));
  printf("product's set after its last launch: %s\n",
         topk_wrong_rows(host, got, 1, n, K, false, 1) == 0 ? "correct" : "WRONG");
  return 0;
}
