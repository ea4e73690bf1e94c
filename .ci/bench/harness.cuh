// Shared by the nvcc bench harnesses in this folder (not part of the product).
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                \
  do {                                                                       \
    cudaError_t e = (x);                                                     \
    if (e != cudaSuccess) {                                                  \
      printf("CUDA error %s at line %d\n", cudaGetErrorString(e), __LINE__); \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

// Uniform [0, 1) scores from a hash of the index, like `nsa bench --suite topk`'s.
__global__ void fill_uniform(float* s, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    s[i] = (x >> 8) * (1.0f / 16777216.0f);
  }
}

// µs per launch of `launch()` over `reps` back-to-back launches after 3 warm-ups,
// between events on `stream` (the default stream unless given).
template <typename F>
float events_us(F launch, int reps, cudaStream_t stream = nullptr) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch();
  CK(cudaEventRecord(a, stream));
  for (int i = 0; i < reps; ++i) launch();
  CK(cudaEventRecord(b, stream));
  CK(cudaEventSynchronize(b));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms * 1000.f / reps;
}

// `rows` full-length rows of n uniform scores (fill_uniform) and the top-k
// kernels' other buffers: lengths, a rows x k output and a zeroed status word.
struct TopkRows {
  float* scores;
  int* lengths;
  int* out;
  unsigned* status;
  int rows, n;
  // nsa::topk::Params over these rows (plain; no row starts).
  template <class Params>
  Params params() const {
    Params p{};
    p.scores = scores;
    p.lengths = lengths;
    p.out = out;
    p.row_stride = n;
    p.rows = rows;
    p.row_capacity = n;
    return p;
  }
};
inline TopkRows alloc_topk_rows(int rows, int n, int k, unsigned seed = 4242u) {
  TopkRows t;
  t.rows = rows;
  t.n = n;
  CK(cudaMalloc(&t.scores, (size_t)rows * n * 4));
  fill_uniform<<<256, 256>>>(t.scores, (long long)rows * n, seed);
  CK(cudaMalloc(&t.lengths, rows * 4));
  std::vector<int> len(rows, n);
  CK(cudaMemcpy(t.lengths, len.data(), rows * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&t.out, (size_t)rows * k * 4));
  CK(cudaMalloc(&t.status, 64));
  CK(cudaMemset(t.status, 0, 64));
  return t;
}

// Rows among the first `check_rows` whose k outputs (less row * n when `paged`: an
// identity page table) are not distinct positions with scores at least the row's
// k-th largest, every score above it chosen.
inline int topk_wrong_rows(const std::vector<float>& scores, const std::vector<int>& out, int rows, int n, int k,
                           bool paged, int check_rows) {
  int wrong = 0;
  for (int r = 0; r < rows && r < check_rows; ++r) {
    const float* row = scores.data() + (size_t)r * n;
    std::vector<float> sorted(row, row + n);
    std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
    const float kth = sorted[k - 1];
    long above = 0, got_above = 0;
    for (int i = 0; i < n; ++i) above += row[i] > kth;
    std::vector<char> seen(n, 0);
    bool ok = true;
    for (int j = 0; j < k && ok; ++j) {
      const int i = out[(size_t)r * k + j] - (paged ? r * n : 0);
      ok = i >= 0 && i < n && !seen[i] && row[i] >= kth;
      if (ok) seen[i] = 1, got_above += row[i] > kth;
    }
    wrong += !ok || got_above != above;
  }
  return wrong;
}
