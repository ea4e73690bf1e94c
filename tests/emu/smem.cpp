// Shared memory of one emulated build: compiled once per warp width, with the
// kernels' namespace renamed for 64-lane builds (`-Dnsa=nsa_w64`, see build.rs) so
// that the two widths' inline functions never meet at link time.
#include "nsa/emu/arch.cuh"
#include "nsa/topk/index_transform.cuh"
#include "nsa/topk/topk.cuh"
#include "nsa/attention/dense_common.cuh"

#include <cstddef>

#include "emu.h"

namespace nsa {
namespace topk {
alignas(16) thread_local u32 smem[nsa_emu::kSmemBytes / 4];
}  // namespace topk
// The scalar dense kernel's `extern NSA_SHARED u32 smem[]` (its own namespace's name).
namespace dense_scalar {
alignas(16) thread_local u32 smem[nsa_emu::kSmemBytes / 4];
}  // namespace dense_scalar
}  // namespace nsa

// The Rust side and launch.cpp (which declares every kernel with the 32-lane
// build's types) rely on these layouts in both widths.
static_assert(sizeof(nsa::topk::Params) == 104 && offsetof(nsa::topk::Params, row_stride) == 56 &&
              offsetof(nsa::topk::Params, page_size) == 88);
static_assert(sizeof(nsa::topk::Split) == 40 && offsetof(nsa::topk::Split, chunk) == 24);
static_assert(sizeof(nsa::index_transform::Params) == 56 && offsetof(nsa::index_transform::Params, rows) == 40);
static_assert(sizeof(nsa::dense::Params) == 88 && offsetof(nsa::dense::Params, batch) == 56);

// The calling OS thread's shared memory (nsa_emu::kSmemBytes).
extern "C" unsigned char* NSA_EMU_SMEM_FN() { return reinterpret_cast<unsigned char*>(nsa::topk::smem); }
extern "C" unsigned char* NSA_EMU_DENSE_SMEM_FN() { return reinterpret_cast<unsigned char*>(nsa::dense_scalar::smem); }
