// The top-k kernels' sample arithmetic (topk.cuh `Sample<kCap>`) evaluated on the
// host, so a test can pin the runtime's mirror of it (ops::topk::sample_expected_kept,
// which picks plans by it) to the kernels' code.
#include <cstdint>

#include "nsa/emu/arch.cuh"
#include "nsa/topk/topk.cuh"

namespace {

template <int kCap, int K>
uint64_t kept(int32_t n) {
  return nsa::topk::Sample<kCap>::template expected_kept<K>(n);
}

template <int kCap>
int expected_kept_for(uint32_t k, int32_t n, uint64_t* out) {
  switch (k) {
    case 512: *out = kept<kCap, 512>(n); return 0;
    case 1024: *out = kept<kCap, 1024>(n); return 0;
    case 2048: *out = kept<kCap, 2048>(n); return 0;
    default: return 1;
  }
}

}  // namespace

// Keys Sample<cap>::expected_kept<k>(n) expects kept; 1 for a (cap, k) not built here.
extern "C" int nsa_emu_sample_expected_kept(uint32_t cap, uint32_t k, int32_t n, uint64_t* out) {
  switch (cap) {
    case 2048: return expected_kept_for<2048>(k, n, out);
    case 8192: return expected_kept_for<8192>(k, n, out);
    case 24576: return expected_kept_for<24576>(k, n, out);
    default: return 1;
  }
}
