// Row → segment look-ups over cumulative offsets (cu_seqlens-style arrays).
#pragma once
#ifndef NSA_DEVICE
#error "include the arch header (nsa/cuda/arch.cuh or nsa/rocm/arch.cuh) first"
#endif

namespace nsa {

// The segment i with cu[i] <= row < cu[i + 1] (cu has segments + 1 entries), or -1.
// With cu == null, row r is segment r (when r < segments).
NSA_DEVICE i32 segment_of(const i32* cu, i32 segments, i32 row) {
  if (cu == nullptr) return row < segments ? row : -1;
  if (segments <= 0) return -1;
  i32 lo = 0, hi = segments;  // last i in [0, segments) with cu[i] <= row
  while (hi - lo > 1) {
    const i32 mid = (lo + hi) / 2;
    if (cu[mid] <= row) lo = mid; else hi = mid;
  }
  return (cu[lo] <= row && row < cu[lo + 1]) ? lo : -1;
}

}  // namespace nsa
