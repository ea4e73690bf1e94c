// What every dense attention kernel shares (dense_prefill.cuh, dense_prefill_wg.cuh,
// dense_prefill_scalar.cuh): the launch parameters and the lookup of a CTA's
// sequence and row tile. Arch-neutral: only the arch layer's thread ids.
#pragma once
#include "nsa/common/status.cuh"

namespace nsa {
namespace dense {

// Mirrors `DensePrefillParams` in nsa-runtime (ops/dense_prefill.rs) field for field.
struct Params {
  const u16* q;              // [rows, heads, d_qk] bf16
  const u16* k;              // [keys, heads, d_qk] bf16
  const u16* v;              // [keys, heads, d_v] bf16
  const i32* cu_seqlens_q;   // [batch + 1]
  const i32* cu_seqlens_k;   // [batch + 1]
  u16* out;                  // [rows, heads, d_v] bf16
  float* lse;                // [rows, heads]
  i32 batch;
  i32 row_tiles;             // ceil(max_seqlen_q / kRows): CTAs per (sequence, head)
  i32 rows;                  // query rows of q and out (cu_seqlens_q must stay inside)
  i32 keys;                  // key rows of k and v (cu_seqlens_k must stay inside)
  float sm_scale;
  i32 pair_group;            // the warp-group kernel's (sequence, head) pairs per CTA group (dense_prefill_wg.cuh)
  u32* tile_counter;         // the warp-group kernel's two words: tiles handed out, CTAs done; zero at launch
};

// The work of one CTA: rows [row0, row0 + tile rows) of sequence `seq`, whose query
// rows are q0 .. q0 + lq of q and key rows k0 .. k0 + lk of k and v; row i sees keys
// [0, shift + i], and the tile's rows see keys [0, key_end).
struct SeqTile {
  i32 q0, lq, k0, lk, row0, shift, key_end;
};

// Row tile `tile` (kTileRows rows) of sequence `seq`, or false when the CTA has
// nothing to do: its tile starts past the sequence's rows, or the sequence's
// offsets lie outside the tensors, decrease, or hold more rows than the grid's
// tiles cover (reported once per sequence by the caller that passes `report`,
// nothing computed for it).
template <int kTileRows>
NSA_DEVICE bool seq_tile(const Params& p, i32 seq, i32 tile, i32 head, bool report, u32* status, SeqTile& st) {
  st.q0 = p.cu_seqlens_q[seq];
  st.lq = p.cu_seqlens_q[seq + 1] - st.q0;
  st.k0 = p.cu_seqlens_k[seq];
  st.lk = p.cu_seqlens_k[seq + 1] - st.k0;
  if (st.q0 < 0 || st.lq < 0 || st.q0 + st.lq > p.rows || st.k0 < 0 || st.lk < 0 || st.k0 + st.lk > p.keys ||
      st.lq > p.row_tiles * kTileRows) {
    if (tile == 0 && head == 0 && report && status != nullptr) report_bad_entry(status, seq);
    return false;
  }
  st.row0 = tile * kTileRows;
  if (st.row0 >= st.lq) return false;
  st.shift = st.lk - st.lq;
  // Keys the tile's last row sees, at most all of the sequence's.
  const i32 end = st.shift + (st.row0 + kTileRows < st.lq ? st.row0 + kTileRows : st.lq);
  st.key_end = end < 0 ? 0 : (end > st.lk ? st.lk : end);
  return true;
}

}  // namespace dense
}  // namespace nsa
