// Unfused page-table transform of top-k positions (spec §7.7):
// out[t, j] = page_table[row(t), idx[t, j]] for idx >= 0, else -1.
#pragma once
#ifndef NSA_DEVICE
#error "include the arch header (nsa/cuda/arch.cuh or nsa/rocm/arch.cuh) first"
#endif
#include "nsa/common/segments.cuh"
#include "nsa/common/status.cuh"

namespace nsa {
namespace index_transform {

struct Params {
  const i32* idx;           // [rows, K] relative positions, -1 padded
  const i32* page_table;    // [table_rows, table_stride]
  const i32* cu_seqlens_q;  // prefill: [table_rows + 1] (token t uses request i with cu[i] <= t < cu[i+1]); decode: null
  i32* out;                 // [rows, K]
  i64 table_stride;
  i32 rows;
  i32 table_rows;
  i32 table_width;  // a position >= this is rejected (written as -1)
};

// One thread per output element. Rows past the last request (prefill) are all -1.
template <int K, int kBlockThreads>
NSA_DEVICE void page_table(const Params& p, u32* status) {
  const i64 e = (i64)block_x() * kBlockThreads + thread_x();
  if (e >= (i64)p.rows * K) return;
  const i32 t = (i32)(e / K);
  const i32 trow = segment_of(p.cu_seqlens_q, p.table_rows, t);
  const i32 pos = p.idx[e];
  i32 slot = -1;
  if (pos >= 0 && trow >= 0) {
    if (pos < p.table_width) {
      slot = p.page_table[(i64)trow * p.table_stride + pos];
    } else {
      report_bad_entry(status, t);
    }
  }
  p.out[e] = slot;
}

}  // namespace index_transform
}  // namespace nsa
