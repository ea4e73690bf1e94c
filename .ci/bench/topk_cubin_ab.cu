// Times two CUBINs of one top-k kernel through the same launch path, interleaved, on
// the same uniform rows: e.g. NVRTC's image (from the nsa cache) against nvcc's build
// of the same rendered source. It separates code generation from everything else
// that differs between `nsa bench` and the nvcc harnesses. Not part of the product;
// on the GPU machine:
//   nvcc -std=c++17 -O3 -arch=sm_90a -I kernels/include -o topk_cubin_ab .ci/bench/topk_cubin_ab.cu -lcuda
//   ./topk_cubin_ab ROWS N CTAS_PER_ROW THREADS SMEM_BYTES SYMBOL A.cubin B.cubin [REPS] [pdl]
// A symbol with "paged" in it gets an identity page table (slot = row * N + position).
// `pdl`: B is launched with programmatic stream serialization (cuLaunchKernelEx), so
// each launch may start while the previous one runs; B's kernel must then execute
// `griddepcontrol.wait` before it reads anything (topk_cubin_ab.sh, pdl mode, builds such a B).
#include "nsa/cuda/arch.cuh"
#include "nsa/topk.cuh"

#include <cuda.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "harness.cuh"

#define CU(x)                                                          \
  do {                                                                 \
    CUresult e = (x);                                                  \
    if (e != CUDA_SUCCESS) {                                           \
      const char* s = nullptr;                                         \
      cuGetErrorString(e, &s);                                         \
      printf("driver error %s at line %d\n", s ? s : "?", __LINE__);   \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

constexpr int K = 2048;

static CUfunction load(const char* path, const char* symbol, int smem) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    printf("cannot read %s\n", path);
    exit(1);
  }
  std::vector<char> image((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CUmodule m;
  CUfunction fn;
  CU(cuModuleLoadData(&m, image.data()));
  CU(cuModuleGetFunction(&fn, m, symbol));
  CU(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem));
  return fn;
}

int main(int argc, char** argv) {
  if (argc < 9) {
    printf("usage: %s ROWS N CTAS_PER_ROW THREADS SMEM_BYTES SYMBOL A.cubin B.cubin [REPS] [pdl]\n", argv[0]);
    return 2;
  }
  const int rows = atoi(argv[1]), n = atoi(argv[2]), per_row = atoi(argv[3]), threads = atoi(argv[4]);
  const int smem = atoi(argv[5]);
  const char* symbol = argv[6];
  const int reps = argc > 9 ? atoi(argv[9]) : 200;
  const bool pdl_b = argc > 10 && strcmp(argv[10], "pdl") == 0;
  const bool paged = strstr(symbol, "paged") != nullptr;
  CK(cudaFree(nullptr));  // creates the primary context the driver calls below use
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUfunction fns[2] = {load(argv[7], symbol, smem), load(argv[8], symbol, smem)};

  const TopkRows t = alloc_topk_rows(rows, n, K);
  int* table = nullptr;
  auto p = t.params<nsa::topk::Params>();
  if (paged) {
    std::vector<int> slots((size_t)rows * n);
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = (int)i;
    CK(cudaMalloc(&table, slots.size() * 4));
    CK(cudaMemcpy(table, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
    p.page_table = table;
    p.table_stride = n;
    p.table_rows = rows;
    p.table_width = n;
  }
  nsa::u32* status = t.status;
  void* args[] = {&p, &status};
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  auto launch = [&](int v) {
    CUlaunchConfig cfg{};
    cfg.gridDimX = rows * per_row;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = threads;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.sharedMemBytes = smem;
    cfg.hStream = (CUstream)stream;
    cfg.attrs = v == 1 && pdl_b ? &attr : nullptr;
    cfg.numAttrs = v == 1 && pdl_b ? 1 : 0;
    CU(cuLaunchKernelEx(&cfg, fns[v], args, nullptr));
  };

  std::vector<float> host((size_t)rows * n);
  std::vector<int> got((size_t)rows * K);
  CK(cudaMemcpy(host.data(), t.scores, host.size() * 4, cudaMemcpyDeviceToHost));
  printf("%s, %d x %d, %d CTAs a row, %d threads, %d B smem, %d back-to-back launches per timing%s\n", symbol, rows,
         n, per_row, threads, smem, reps, pdl_b ? ", B with PDL" : "");
  double sum[2] = {0, 0};
  const int rounds = 5;
  for (int round = 0; round < rounds; ++round) {
    for (int v = 0; v < 2; ++v) {
      CK(cudaMemset(t.out, 0xff, (size_t)rows * K * 4));
      CK(cudaDeviceSynchronize());  // the memset (default stream) is done before `stream` launches
      const float us = events_us([&] { launch(v); }, reps, stream);
      CK(cudaMemcpy(got.data(), t.out, got.size() * 4, cudaMemcpyDeviceToHost));
      const bool ok = topk_wrong_rows(host, got, rows, n, K, paged, rows) == 0;
      printf("  round %d  %s  %8.2f us  set %s\n", round, v == 0 ? "A" : "B", us, ok ? "correct" : "WRONG");
      sum[v] += us;
    }
  }
  printf("mean: A %.2f us (%s), B %.2f us (%s)\n", sum[0] / rounds, argv[7], sum[1] / rounds, argv[8]);
  return 0;
}
