// The C entry points the Rust tests call (tests/src/emu.rs): find a kernel by id,
// run its grid on the emulator, report errors as text.
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>

#include "emu.h"
#include "kernels.h"

struct EmuShape {
  uint32_t grid, block_threads, cluster, smem_bytes, groups, pad;
  uint64_t seed;
};
static_assert(sizeof(EmuShape) == 32);

namespace {

const EmuKernel* find(const char* id, EmuKind kind, std::string& error) {
  for (unsigned long i = 0; i < kEmuKernelCount; ++i) {
    if (std::strcmp(kEmuKernels[i].id, id) != 0) continue;
    if (kEmuKernels[i].kind != kind) {
      error = std::string(id) + " is launched with other parameters";
      return nullptr;
    }
    return &kEmuKernels[i];
  }
  error = std::string("no emulated kernel ") + id +
          " (tests/build.rs emulates the sm_90a and gfx942 top-k kernels, the scalar dense kernels and the KV cache's step "
          "store and reads)";
  return nullptr;
}

// The kernel `id` launched with any of `kinds`' parameters (one entry point serves
// several kernel types).
const EmuKernel* find_any(const char* id, std::initializer_list<EmuKind> kinds, std::string& error) {
  for (EmuKind kind : kinds) {
    const EmuKernel* k = find(id, kind, error);
    if (k != nullptr) return k;
  }
  return nullptr;
}

int run(const EmuKernel& k, const EmuShape& shape, void (*entry)(void*), void* args, char* err, size_t err_len) {
  nsa_emu::LaunchSpec spec{shape.grid,   shape.block_threads, shape.cluster, shape.smem_bytes, nsa_emu::kSmemBytes,
                           shape.groups, k.warp_size,         shape.seed,    entry,            args,
                           k.smem};
  const std::string e = nsa_emu::launch(spec);
  if (e.empty()) return 0;
  std::snprintf(err, err_len, "%s", e.c_str());
  return 1;
}

int not_found(const std::string& e, char* err, size_t err_len) {
  std::snprintf(err, err_len, "%s", e.c_str());
  return 2;
}

template <typename Call>
void call(void* a) {
  (*static_cast<Call*>(a))();
}

}  // namespace

// 0: ran; 1: the emulator stopped the kernel (err says why); 2: no such kernel.
extern "C" int nsa_emu_topk(const char* id, const EmuShape* shape, const nsa::topk::Params* p, nsa::u32* status,
                            char* err, size_t err_len) {
  std::string e;
  const EmuKernel* k = find(id, kTopk, e);
  if (k == nullptr) return not_found(e, err, err_len);
  auto go = [&] { k->entry.topk(*p, status); };
  return run(*k, *shape, call<decltype(go)>, &go, err, err_len);
}

extern "C" int nsa_emu_topk_split(const char* id, const EmuShape* shape, const nsa::topk::Params* p,
                                  const nsa::topk::Split* split, nsa::u32* status, char* err, size_t err_len) {
  std::string e;
  const EmuKernel* k = find(id, kSplit, e);
  if (k == nullptr) return not_found(e, err, err_len);
  auto go = [&] { k->entry.split(*p, *split, status); };
  return run(*k, *shape, call<decltype(go)>, &go, err, err_len);
}

extern "C" int nsa_emu_index_transform(const char* id, const EmuShape* shape, const nsa::index_transform::Params* p,
                                       nsa::u32* status, char* err, size_t err_len) {
  std::string e;
  const EmuKernel* k = find(id, kTransform, e);
  if (k == nullptr) return not_found(e, err, err_len);
  auto go = [&] { k->entry.transform(*p, status); };
  return run(*k, *shape, call<decltype(go)>, &go, err, err_len);
}

extern "C" int nsa_emu_dense(const char* id, const EmuShape* shape, const nsa::dense::Params* p, nsa::u32* status,
                             char* err, size_t err_len) {
  std::string e;
  const EmuKernel* k = find(id, kDense, e);
  if (k == nullptr) return not_found(e, err, err_len);
  auto go = [&] { k->entry.dense(*p, status); };
  return run(*k, *shape, call<decltype(go)>, &go, err, err_len);
}

// The step store (both formats: the kernel's kind says which cache type it takes).
extern "C" int nsa_emu_step_store(const char* id, const EmuShape* shape, const EmuStepStoreArgs* a,
                                  nsa::u32* status, char* err, size_t err_len) {
  std::string e;
  const EmuKernel* k = find_any(id, {kStepStoreFp8, kStepStoreBf16}, e);
  if (k == nullptr) return not_found(e, err, err_len);
  auto go = [&] {
    if (k->kind == kStepStoreFp8) {
      k->entry.step_store_fp8(a->k_nope, a->nope_stride, a->k_rope, a->rope_stride, a->index_k, a->index_stride, a->loc,
                              a->num_tokens, static_cast<nsa::u8*>(a->cache), a->pool_slots, a->index_cache,
                              a->index_pool_slots, status);
    } else {
      k->entry.step_store_bf16(a->k_nope, a->nope_stride, a->k_rope, a->rope_stride, a->index_k, a->index_stride,
                               a->loc, a->num_tokens, static_cast<nsa::u16*>(a->cache), a->pool_slots, a->index_cache,
                               a->index_pool_slots, status);
    }
  };
  return run(*k, *shape, call<decltype(go)>, &go, err, err_len);
}

// The cache reads: the FP8 dequant and bf16 gather (kv_dequant) and the indexer-K gather.
extern "C" int nsa_emu_read(const char* id, const EmuShape* shape, const EmuReadArgs* a, nsa::u32* status, char* err,
                            size_t err_len) {
  std::string e;
  const EmuKernel* k = find_any(id, {kReadFp8, kReadBf16, kIndexerGather}, e);
  if (k == nullptr) return not_found(e, err, err_len);
  auto go = [&] {
    switch (k->kind) {
      case kReadFp8:
        k->entry.read_fp8(static_cast<const nsa::u8*>(a->cache), a->pool_slots, a->idx, a->num_tokens,
                          static_cast<nsa::u16*>(a->out), status);
        break;
      case kReadBf16:
        k->entry.read_bf16(static_cast<const nsa::u16*>(a->cache), a->pool_slots, a->idx, a->num_tokens,
                           static_cast<nsa::u16*>(a->out), status);
        break;
      default:
        k->entry.indexer_gather(static_cast<const nsa::u8*>(a->cache), a->pool_slots, a->idx, a->num_tokens,
                                static_cast<nsa::u8*>(a->out), a->scales, status);
    }
  };
  return run(*k, *shape, call<decltype(go)>, &go, err, err_len);
}
