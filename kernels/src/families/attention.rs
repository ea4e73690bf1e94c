//! Sparse MLA attention: decode over the FP8-656 paged cache (warp-group, raw-record
//! and mma.sync kernels), the combine of its split-KV partials, and prefill over
//! bf16 KV rows (warp-group and mma.sync kernels).

use super::{number_after, FamilyRules};
use crate::spec::{KernelFamily, KernelSpec};
use crate::target::{Target, Vendor};
use serde_json::{json, Map, Value};

/// Heads one sparse-attention (decode or prefill) CTA computes: 32 when `heads` is a multiple of 32, else
/// 16; 1..=15 heads run one 16-row tile whose extra rows are zero and never
/// written (no head padding in memory). Larger tiles would need more than the
/// 128 registers a 512-thread CTA allows for the P V accumulators. `None` for
/// counts that fit no tile.
pub fn sparse_head_tile(heads: u32) -> Option<u32> {
    match heads {
        1..=16 => Some(16),
        h if h > 128 => None,
        h if h % 32 == 0 => Some(32),
        h if h % 16 == 0 => Some(16),
        _ => None,
    }
}

/// Heads one sparse MLA (decode or prefill) CTA computes on `target`: on sm_90a a
/// multiple of 64 heads runs the warp-group (wgmma) kernels with 64-head tiles;
/// everything else the mma.sync kernels' [`sparse_head_tile`].
pub fn sparse_mla_head_tile(heads: u32, target: Target) -> Option<u32> {
    if target == Target::Sm90a && heads % WG_HEAD_TILE == 0 && (1..=128).contains(&heads) {
        return Some(WG_HEAD_TILE);
    }
    sparse_head_tile(heads)
}

/// Heads one sparse-prefill CTA computes on `target`: on sm_90a every head count
/// above 16 runs the warp-group kernel in 64-head tiles, the last one partial when
/// the count is not a multiple of 64 (zero Q rows, outputs not stored): measured on
/// the H200, 32 heads in one such tile took 2.36 ms where the mma.sync kernel took
/// 3.46 ms (BENCHMARKS.md). Decode keeps [`sparse_mla_head_tile`]: its 32-head
/// mma.sync tile is faster than half a warp-group tile there.
pub fn sparse_prefill_head_tile(heads: u32, target: Target) -> Option<u32> {
    if target == Target::Sm90a && heads > 16 && sparse_head_tile(heads).is_some() {
        return Some(WG_HEAD_TILE);
    }
    sparse_mla_head_tile(heads, target)
}

/// Head tile of the warp-group sparse MLA kernels (the wgmma M).
pub const WG_HEAD_TILE: u32 = 64;

/// Dynamic shared memory of the warp-group sparse MLA kernels with `d_qk`-wide rows;
/// mirrors `nsa::attend_wg::Smem` (sparse_attend_wg.cuh): Q and two K/V tiles of 64
/// rows, the 64 × 64 bf16 P tile, per-row rescale factors, max and sum, validity
/// flags, and 1 KiB of slack to start the swizzled tiles 1024-byte aligned.
pub fn wg_smem_bytes(d_qk: u32) -> u32 {
    let tile = WG_HEAD_TILE * d_qk * 2;
    3 * tile + WG_HEAD_TILE * DECODE_BLOCK_TOKENS * 2 + 3 * WG_HEAD_TILE * 4 + 2 * DECODE_BLOCK_TOKENS + 1024
}

/// Dynamic shared memory of the paired-block warp-group prefill kernel (its two
/// consumer groups on alternate blocks); mirrors `nsa::prefill_pairs::Smem`
/// (sparse_prefill_pairs.cuh): Q and two K/V tiles, the P tiles the groups exchange
/// (one in K's rope block when the rows have one), each group's row maxima and
/// sums, validity flags, a ready mbarrier per block, and 1 KiB of slack for the
/// 1024-byte alignment.
pub fn pairs_smem_bytes(d_qk: u32) -> u32 {
    let tile = WG_HEAD_TILE * d_qk * 2;
    let p_tile = WG_HEAD_TILE * DECODE_BLOCK_TOKENS * 2;
    let p_tiles = if d_qk > 512 { 1 } else { 2 };
    3 * tile + p_tiles * p_tile + 4 * WG_HEAD_TILE * 4 + 2 * DECODE_BLOCK_TOKENS + 2 * 8 + 1024
}

/// Tokens one sparse-decode pipeline step covers (top-k must be a multiple).
pub const DECODE_BLOCK_TOKENS: u32 = 64;
/// Threads of a sparse-decode CTA (8 producer + 8 consumer warps).
const DECODE_BLOCK_THREADS: u32 = 512;
/// Threads of a raw-record decode CTA (8 consumer warps + 2 bulk-copy warps).
const DECODE_F8_BLOCK_THREADS: u32 = 320;
/// Stages of the raw-record decode kernel's ring (64 records of 656 bytes each).
const DECODE_F8_STAGES: u32 = 4;

/// Dynamic shared memory of the raw-record decode kernel; mirrors
/// `nsa::decode_f8::Smem` (sparse_decode_f8.cuh): the record ring, the split-K
/// partial S, the padded f16 P tile, per-warp row partials, two buffers of a
/// step's rounded tile scales, validity flags per stage, a full and an empty
/// mbarrier per stage, and the CTA's `topk` slot indices.
pub fn decode_f8_smem_bytes(topk: u32) -> u32 {
    DECODE_F8_STAGES * DECODE_BLOCK_TOKENS * 656
        + 4 * 16 * (DECODE_BLOCK_TOKENS + 8) * 4
        + 16 * (DECODE_BLOCK_TOKENS * 2 + 16)
        + 8 * 16 * 4
        + 2 * 4 * DECODE_BLOCK_TOKENS * 4
        + DECODE_F8_STAGES * DECODE_BLOCK_TOKENS
        + 2 * DECODE_F8_STAGES * 8
        + topk * 4
}

/// Threads of a warp-group decode CTA (two consumer groups, one producer group).
const DECODE_WG_BLOCK_THREADS: u32 = 384;
/// Threads of a sparse-prefill CTA (4 cp.async producer + 8 consumer warps).
const PREFILL_BLOCK_THREADS: u32 = 384;
/// Threads of a combine block (4 output dims each).
const DECODE_COMBINE_THREADS: u32 = 128;

/// Bytes of one padded bf16 row of `d_qk` dims in the mma.sync kernels (`Rows::kBytes`).
fn padded_row_bytes(d_qk: u32) -> u32 {
    d_qk * 2 + 16
}

/// The shared consumer's part of an mma.sync sparse-attention CTA's shared memory
/// (sparse_attend.cuh): the Q tile, the padded P tile, per-warp row partials and,
/// for 16-head tiles, the partial S of the four dims quarters (padded f32 rows).
fn consumer_smem_bytes(head_tile: u32, d_qk: u32) -> u32 {
    let warps_per_mtile = 8 / (head_tile / 16); // consumer warps per 16-head m-tile (`kNW`)
    let split_k_partials = if head_tile == 16 { 4 * 16 * (DECODE_BLOCK_TOKENS + 8) * 4 } else { 0 };
    head_tile * padded_row_bytes(d_qk)
        + head_tile * (DECODE_BLOCK_TOKENS * 2 + 16)
        + warps_per_mtile * head_tile * 4
        + split_k_partials
}

/// Dynamic shared memory of a (dequantizing, mma.sync) sparse-decode CTA with
/// `head_tile` heads of `d_qk`-wide rows; mirrors `nsa::attend::Smem`
/// (sparse_attend.cuh): the consumer's part, two 64-row K/V tiles and their
/// validity flags.
pub fn attend_smem_bytes(head_tile: u32, d_qk: u32) -> u32 {
    consumer_smem_bytes(head_tile, d_qk) + 2 * DECODE_BLOCK_TOKENS * (padded_row_bytes(d_qk) + 1)
}

/// Slots of 32 KV rows in the mma.sync prefill kernel's ring (`nsa::prefill::kSlots`).
const PREFILL_SLOTS: u32 = 5;

/// Dynamic shared memory of the mma.sync sparse-prefill CTA; mirrors
/// `nsa::prefill::RingSmem` (sparse_prefill.cuh): the consumer's part, the ring of
/// 32-row slots with their validity flags, and a full and an empty mbarrier per slot.
pub fn prefill_ring_smem_bytes(head_tile: u32, d_qk: u32) -> u32 {
    let slot_rows = DECODE_BLOCK_TOKENS / 2;
    consumer_smem_bytes(head_tile, d_qk)
        + PREFILL_SLOTS * slot_rows * (padded_row_bytes(d_qk) + 1)
        + 2 * PREFILL_SLOTS * 8
}

/// Head counts of the representative sparse-decode variants (TP16 … TP1).
pub const DECODE_HEADS: [u32; 5] = [8, 16, 32, 64, 128];
/// Head counts of the representative sparse-prefill variants (TP8 … TP1).
pub const PREFILL_HEADS: [u32; 4] = [16, 32, 64, 128];
/// Q/K widths the sparse prefill supports: latent + rope, or latent only.
pub const PREFILL_DQK: [u32; 2] = [576, 512];

pub(crate) struct Attention;

/// Heads per CTA of this sparse MLA spec: [`sparse_prefill_head_tile`] for
/// prefill, [`sparse_mla_head_tile`] otherwise.
pub(crate) fn head_tile(spec: &KernelSpec, heads: u32) -> Option<u32> {
    match spec.family {
        KernelFamily::SparsePrefill { .. } => sparse_prefill_head_tile(heads, spec.target),
        _ => sparse_mla_head_tile(heads, spec.target),
    }
}

/// Whether a sparse MLA spec of `heads` heads is the warp-group (wgmma) kernel.
pub(crate) fn wg_kernel(spec: &KernelSpec, heads: u32) -> bool {
    head_tile(spec, heads) == Some(WG_HEAD_TILE)
}

/// Decode with 16-head tiles on sm_90a reads the raw FP8 records (bulk copies,
/// e4m3 converted inside the mma fragments) instead of dequantizing into a bf16
/// tile: the dequant pass's loads and shared-memory stores were the limit there
/// (BENCHMARKS.md).
pub(crate) fn decode_f8_kernel(spec: &KernelSpec, heads: u32) -> bool {
    matches!(spec.family, KernelFamily::SparseDecode { .. })
        && spec.target == Target::Sm90a
        && head_tile(spec, heads) == Some(16)
}

/// The warp-group kernels' layout, else the mma.sync prefill ring or decode's
/// double-buffered tiles.
fn mla_smem_bytes(spec: &KernelSpec, heads: u32, d_qk: u32) -> u32 {
    let prefill = matches!(spec.family, KernelFamily::SparsePrefill { .. });
    let paired = matches!(spec.family, KernelFamily::SparsePrefill { paired: true, .. });
    match head_tile(spec, heads) {
        Some(WG_HEAD_TILE) if paired => pairs_smem_bytes(d_qk),
        Some(WG_HEAD_TILE) => wg_smem_bytes(d_qk),
        Some(t) if prefill => prefill_ring_smem_bytes(t, d_qk),
        tile => tile.map_or(0, |t| attend_smem_bytes(t, d_qk)),
    }
}

/// Context shared by the sparse MLA families (same consumer warps, same tiles).
fn mla_context(spec: &KernelSpec, ctx: &mut Map<String, Value>, heads: u32, topk: u32, d_qk: u32) {
    ctx.insert("heads".into(), json!(heads));
    ctx.insert("head_tile".into(), json!(head_tile(spec, heads)));
    ctx.insert("topk".into(), json!(topk));
    // Fully unrolled Q K^T on sm_90a (addresses become immediates); at 128
    // registers ptxas spills that on sm_100a, which gets a partial unroll and a
    // rolled P V token loop (no spills: tests/compile_all.rs).
    let qk_unroll = if spec.target == Target::Sm100a { 4 } else { d_qk / 16 };
    ctx.insert("qk_unroll".into(), json!(qk_unroll));
    ctx.insert("smem_bytes".into(), json!(Attention.dynamic_smem_bytes(spec)));
}

impl FamilyRules for Attention {
    fn name(&self, spec: &KernelSpec) -> &'static str {
        match spec.family {
            KernelFamily::SparseDecode { .. } => "sparse_decode",
            KernelFamily::SparseDecodeCombine { .. } => "sparse_decode_combine",
            _ => "sparse_prefill",
        }
    }

    fn knobs(&self, spec: &KernelSpec) -> Vec<String> {
        match spec.family {
            KernelFamily::SparseDecode { heads, topk, page_size } => {
                vec![format!("h{heads}"), format!("k{topk}"), format!("p{page_size}")]
            }
            KernelFamily::SparseDecodeCombine { heads } => vec![format!("h{heads}")],
            KernelFamily::SparsePrefill { heads, topk, d_qk, paired } => {
                let mut v = vec![format!("h{heads}"), format!("k{topk}"), format!("d{d_qk}")];
                if paired {
                    v.push("pairs".into());
                }
                v
            }
            _ => unreachable!("not a sparse MLA family"),
        }
    }

    fn template(&self, spec: &KernelSpec) -> &'static str {
        match spec.family {
            KernelFamily::SparseDecode { heads, .. } => {
                if wg_kernel(spec, heads) {
                    "sparse_decode_wg.cu.tera"
                } else if decode_f8_kernel(spec, heads) {
                    "sparse_decode_f8.cu.tera"
                } else {
                    "sparse_decode.cu.tera"
                }
            }
            KernelFamily::SparseDecodeCombine { .. } => "sparse_decode_combine.cu.tera",
            KernelFamily::SparsePrefill { paired: true, .. } => "sparse_prefill_pairs.cu.tera",
            KernelFamily::SparsePrefill { heads, .. } if wg_kernel(spec, heads) => "sparse_prefill_wg.cu.tera",
            _ => "sparse_prefill.cu.tera",
        }
    }

    fn block_threads(&self, spec: &KernelSpec) -> u32 {
        match spec.family {
            KernelFamily::SparseDecode { heads, .. } => {
                if wg_kernel(spec, heads) {
                    DECODE_WG_BLOCK_THREADS
                } else if decode_f8_kernel(spec, heads) {
                    DECODE_F8_BLOCK_THREADS
                } else {
                    DECODE_BLOCK_THREADS
                }
            }
            KernelFamily::SparseDecodeCombine { .. } => DECODE_COMBINE_THREADS,
            _ => PREFILL_BLOCK_THREADS,
        }
    }

    fn dynamic_smem_bytes(&self, spec: &KernelSpec) -> u32 {
        match spec.family {
            KernelFamily::SparseDecode { heads, topk, .. } if decode_f8_kernel(spec, heads) => {
                decode_f8_smem_bytes(topk)
            }
            KernelFamily::SparseDecode { heads, .. } => mla_smem_bytes(spec, heads, 576),
            KernelFamily::SparsePrefill { heads, d_qk, .. } => mla_smem_bytes(spec, heads, d_qk),
            _ => 0,
        }
    }

    /// One (head tile, row, split) per CTA; combine: one (row, head) per block.
    fn tokens_per_block(&self, _spec: &KernelSpec) -> u32 {
        1
    }

    fn context(&self, spec: &KernelSpec, ctx: &mut Map<String, Value>) {
        match spec.family {
            KernelFamily::SparseDecode { heads, topk, page_size } => {
                mla_context(spec, ctx, heads, topk, 576);
                ctx.insert("page_size".into(), json!(page_size));
            }
            KernelFamily::SparseDecodeCombine { heads } => {
                ctx.insert("heads".into(), json!(heads));
            }
            KernelFamily::SparsePrefill { heads, topk, d_qk, .. } => {
                mla_context(spec, ctx, heads, topk, d_qk);
                ctx.insert("d_qk".into(), json!(d_qk));
            }
            _ => {}
        }
    }

    /// On NVIDIA (no ROCm variant yet: mma.sync): decode (+ combine) for every head
    /// count of [`DECODE_HEADS`] at top-k 2048 / page 64, top-k 512 and 1024 at 128
    /// heads, and page sizes 1 and 61; prefill for every head count of
    /// [`PREFILL_HEADS`] at top-k 2048 / d_qk 576, top-k 512 and 1024 and d_qk 512
    /// at 128 heads; on sm_90a the paired-block prefill kernel at 32, 64 and 128 heads
    /// (d_qk 576) and at 128 heads with d_qk 512.
    fn representatives(&self, target: Target) -> Vec<KernelFamily> {
        let mut families = Vec::new();
        if target.vendor() != Vendor::Nvidia {
            return families;
        }
        for heads in DECODE_HEADS {
            families.push(KernelFamily::SparseDecode { heads, topk: 2048, page_size: 64 });
            families.push(KernelFamily::SparseDecodeCombine { heads });
        }
        for topk in [512, 1024] {
            families.push(KernelFamily::SparseDecode { heads: 128, topk, page_size: 64 });
        }
        for page_size in [1, 61] {
            families.push(KernelFamily::SparseDecode { heads: 16, topk: 2048, page_size });
        }
        let prefill = |heads, topk, d_qk, paired| KernelFamily::SparsePrefill { heads, topk, d_qk, paired };
        for heads in PREFILL_HEADS {
            families.push(prefill(heads, 2048, 576, false));
        }
        for topk in [512, 1024] {
            families.push(prefill(128, topk, 576, false));
        }
        families.push(prefill(128, 2048, 512, false));
        if target == Target::Sm90a {
            for heads in [32, 64, 128] {
                families.push(prefill(heads, 2048, 576, true));
            }
            families.push(prefill(128, 2048, 512, true));
        }
        families
    }

    /// The paired-block prefill kernel exists only where the warp-group one does
    /// (sm_90a, 17+ heads).
    fn exists(&self, spec: &KernelSpec) -> bool {
        match spec.family {
            KernelFamily::SparsePrefill { heads, paired: true, .. } => wg_kernel(spec, heads),
            _ => true,
        }
    }

    fn parse(&self, name: &str, knobs: &[&str]) -> Option<KernelFamily> {
        Some(match (name, knobs) {
            ("sparse_decode", [h, k, p]) => KernelFamily::SparseDecode {
                heads: number_after(h, 'h')?,
                topk: number_after(k, 'k')?,
                page_size: number_after(p, 'p')?,
            },
            ("sparse_prefill", [h, k, d, flags @ ..]) => KernelFamily::SparsePrefill {
                heads: number_after(h, 'h')?,
                topk: number_after(k, 'k')?,
                d_qk: number_after(d, 'd')?,
                paired: flags.contains(&"pairs"),
            },
            ("sparse_decode_combine", [h]) => KernelFamily::SparseDecodeCombine { heads: number_after(h, 'h')? },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paired-block prefill kernel exists where the warp-group one does (sm_90a,
    /// 17+ heads), under its own id and template.
    #[test]
    fn paired_prefill_only_beside_the_warp_group_kernel() {
        let id = "sparse_prefill.h128.k2048.d576.pairs.sm_90a";
        let spec = KernelSpec::from_id(id).expect("the paired kernel at 128 heads on sm_90a");
        assert!(matches!(spec.family, KernelFamily::SparsePrefill { paired: true, .. }));
        assert!(crate::render(&spec).unwrap().source.contains("prefill_pairs::sparse_prefill"));
        assert_eq!(spec.dynamic_smem_bytes(), pairs_smem_bytes(576));
        for missing in ["sparse_prefill.h16.k2048.d576.pairs.sm_90a", "sparse_prefill.h128.k2048.d576.pairs.sm_100a"] {
            assert_eq!(KernelSpec::from_id(missing), None, "{missing}");
        }
    }

    /// Decode and prefill agree on which head counts exist; they differ only in
    /// the tile sm_90a runs for 17+ heads that are not a multiple of 64.
    #[test]
    fn head_tiles_per_family_and_target() {
        type Row = (u32, Option<u32>, Option<u32>, Option<u32>);
        let table: [Row; 10] = [
            // heads, decode sm_90a, prefill sm_90a, both on sm_100a
            (8, Some(16), Some(16), Some(16)),
            (16, Some(16), Some(16), Some(16)),
            (24, None, None, None),
            (32, Some(32), Some(64), Some(32)),
            (48, Some(16), Some(64), Some(16)),
            (64, Some(64), Some(64), Some(32)),
            (96, Some(32), Some(64), Some(32)),
            (112, Some(16), Some(64), Some(16)),
            (128, Some(64), Some(64), Some(32)),
            (144, None, None, None),
        ];
        for (heads, decode90, prefill90, any100) in table {
            assert_eq!(sparse_mla_head_tile(heads, Target::Sm90a), decode90, "decode h{heads} sm_90a");
            assert_eq!(sparse_prefill_head_tile(heads, Target::Sm90a), prefill90, "prefill h{heads} sm_90a");
            assert_eq!(sparse_mla_head_tile(heads, Target::Sm100a), any100, "decode h{heads} sm_100a");
            assert_eq!(sparse_prefill_head_tile(heads, Target::Sm100a), any100, "prefill h{heads} sm_100a");
            // The raw-record decode kernel: exactly the 16-head tiles on sm_90a.
            let decode =
                |target| KernelSpec::new(KernelFamily::SparseDecode { heads, topk: 2048, page_size: 64 }, target);
            assert_eq!(decode(Target::Sm90a).decode_f8_kernel(heads), decode90 == Some(16), "h{heads}");
            assert!(!decode(Target::Sm100a).decode_f8_kernel(heads), "h{heads} sm_100a");
            let prefill = KernelSpec::new(
                KernelFamily::SparsePrefill { heads, topk: 2048, d_qk: 576, paired: false },
                Target::Sm90a,
            );
            assert!(!prefill.decode_f8_kernel(heads), "prefill h{heads}");
        }
    }
}
