// Device-side input errors. Kernels never touch memory for a rejected entry; they
// count it here so the host can report the field and the offending index.
#pragma once
#ifndef NSA_DEVICE
#error "include the arch header (nsa/cuda/arch.cuh or nsa/rocm/arch.cuh) first"
#endif

namespace nsa {
// status[0]: number of rejected entries; status[1]: index of one of them.
NSA_DEVICE void report_bad_entry(u32* status, i64 index) {
  if (status == nullptr) return;
  atomic_add_global_u32(status, 1u);
  *(volatile u32*)(status + 1) = (u32)index;
}
}  // namespace nsa
