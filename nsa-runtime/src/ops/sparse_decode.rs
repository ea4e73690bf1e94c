//! Sparse MLA decode over the FP8-656 cache (spec §8.1, §8.3): the split-KV plan
//! (a pure function of the batch shape, so a CUDA graph can capture it), the
//! workspace it needs, and the launcher (decode kernel, then combine when split).

use super::{
    check_aligned, check_count_fits_i32, check_len, check_sparse_mla_heads_topk, check_target, invalid, LaunchTarget,
};
use crate::runtime::Runtime;
use crate::Result;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr};
use half::bf16;
use nsa_kernels::layout::{BF16_TOKEN_ELEMS, FP8_TOKEN_BYTES, KV_LORA_RANK};
use nsa_kernels::spec::{DECODE_BLOCK_TOKENS, WG_HEAD_TILE};
use nsa_kernels::{KernelFamily, Target};

/// The shape of one decode call: `batch` requests of `s_q` query tokens each
/// (s_q > 1: target-verify / MTP draft tokens), every query token with its own
/// `topk` indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    pub batch: usize,
    pub s_q: usize,
    pub heads: u32,
    pub topk: u32,
    pub page_size: u32,
}

impl DecodeShape {
    /// Query rows (`batch × s_q`): the kernel's unit of work.
    pub fn rows(&self) -> usize {
        self.batch * self.s_q
    }
}

/// How one decode call is spread over the GPU. Depends only on the shape and the
/// SM count, never on the data: plan once per batch shape, capture, replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodePlan {
    pub shape: DecodeShape,
    /// The GPU generation the plan's kernel variant is for.
    pub target: Target,
    /// Heads per CTA: 64 on sm_90a for a multiple of 64 heads (the warp-group
    /// kernel), else 16 (on sm_90a the raw-record kernel) or 32 (the mma.sync kernel).
    pub head_tile: u32,
    /// KV splits per query row; 1 writes the output directly (no combine).
    pub splits: u32,
    /// 64-token steps each split covers.
    pub blocks_per_split: u32,
}

/// The split model's costs in µs for one kernel kind: least-squares fits on an
/// H100 (132 SMs) to `nsa bench --suite decode --decode-splits 1,2,4,8,16,32` over
/// batches 1–32 (2026-12-07). Only their ratios matter to the choice.
struct SplitCosts {
    /// One 64-token step of a CTA.
    step: f64,
    /// A CTA's fixed work (the Q load, the epilogue), once a wave.
    cta: f64,
    /// The combine launch that splitting adds.
    combine: f64,
    /// Writing and re-reading 1024 f32 partials of 512 dims (one per row, head and
    /// split; 2 MB): the cost that grows with the split count.
    partials_per_1024: f64,
}
/// 64-head CTAs (the warp-group kernel).
const WIDE_CTA_COSTS: SplitCosts = SplitCosts { step: 3.4, cta: 3.2, combine: 2.3, partials_per_1024: 1.7 };
/// 16- and 32-head CTAs (fitted on sm_90a's 16-head raw-record kernel).
const NARROW_CTA_COSTS: SplitCosts = SplitCosts { step: 1.6, cta: 4.0, combine: 4.0, partials_per_1024: 3.1 };

/// The split count minimising the modelled time of `rows` query rows of `heads`
/// heads in CTAs of `head_tile` heads, each row walking `steps` 64-token steps, at
/// one CTA per SM (the kernels use ≥ 168 KB of shared memory): waves × (steps per
/// split + a CTA's fixed work), plus, when split, the combine and the partials it
/// moves. Ties go to fewer splits.
pub fn choose_splits(rows: usize, heads: u32, head_tile: u32, steps: u32, sm_count: u32) -> u32 {
    let sms = sm_count.max(1) as usize;
    let base_ctas = rows * heads.div_ceil(head_tile.max(1)) as usize;
    let c = if head_tile >= 64 { WIDE_CTA_COSTS } else { NARROW_CTA_COSTS };
    let mut best = (f64::INFINITY, 1);
    for s in 1..=steps.max(1) as usize {
        let per_split = (steps as usize).div_ceil(s);
        if (steps as usize).div_ceil(per_split) != s {
            continue; // the same split as a smaller s, with empty tails
        }
        let waves = (base_ctas * s).div_ceil(sms);
        let partials = (rows * heads as usize * s) as f64 / 1024.0;
        let combine = if s > 1 { c.combine + partials * c.partials_per_1024 } else { 0.0 };
        let cost = waves as f64 * (per_split as f64 * c.step + c.cta) + combine;
        if cost < best.0 {
            best = (cost, s as u32);
        }
    }
    best.1
}

/// The head tile of a shape the kernels support on `target`, or an error naming the field.
fn check_shape(shape: &DecodeShape, target: Target) -> Result<u32> {
    let head_tile =
        check_sparse_mla_heads_topk(shape.heads, shape.topk, target, nsa_kernels::spec::sparse_mla_head_tile)?;
    if shape.page_size == 0 || shape.page_size > 1024 {
        return Err(invalid("page_size", shape.page_size.to_string(), "1..=1024 tokens per page"));
    }
    if !(1..=16).contains(&shape.s_q) {
        return Err(invalid("s_q", shape.s_q.to_string(), "1..=16 query tokens per request"));
    }
    check_count_fits_i32("batch × s_q", shape.rows())?;
    Ok(head_tile)
}

/// Query rows the batch-invariant split count is chosen for: the count
/// [`choose_splits`] picks for this many rows serves every batch, so a row's
/// summation order (its splits and their combine) never depends on its neighbours.
pub const BATCH_INVARIANT_ROWS: usize = 32;

/// The decode split count of batch-invariant layers: fixed per shape (heads,
/// top-k) and GPU (SM count), whatever the batch.
pub fn batch_invariant_splits(shape: DecodeShape, gpu: LaunchTarget) -> Result<u32> {
    let head_tile = check_shape(&shape, gpu.target)?;
    Ok(choose_splits(BATCH_INVARIANT_ROWS, shape.heads, head_tile, shape.topk / DECODE_BLOCK_TOKENS, gpu.sm_count))
}

impl DecodePlan {
    /// Checks the shape against what the kernels of `gpu.target` support and picks
    /// the splits for its SM count.
    pub fn new(shape: DecodeShape, gpu: LaunchTarget) -> Result<DecodePlan> {
        let head_tile = check_shape(&shape, gpu.target)?;
        let steps = shape.topk / DECODE_BLOCK_TOKENS;
        let splits = choose_splits(shape.rows(), shape.heads, head_tile, steps, gpu.sm_count);
        Ok(DecodePlan::split(shape, gpu.target, head_tile, splits))
    }

    /// The decode kernel this plan launches.
    pub fn family(&self) -> KernelFamily {
        let s = self.shape;
        KernelFamily::SparseDecode { heads: s.heads, topk: s.topk, page_size: s.page_size }
    }

    /// The plan with `splits` chosen by the caller (tests, benchmarks); 1 ≤ splits ≤
    /// the number of 64-token steps.
    pub fn with_splits(shape: DecodeShape, target: Target, splits: u32) -> Result<DecodePlan> {
        let head_tile = check_shape(&shape, target)?;
        let steps = shape.topk / DECODE_BLOCK_TOKENS;
        if splits == 0 || splits > steps {
            return Err(invalid("splits", splits.to_string(), format!("1..={steps} (top-k / 64)")));
        }
        Ok(DecodePlan::split(shape, target, head_tile, splits))
    }

    /// Even split of the steps; a count that would leave empty tails is reduced.
    fn split(shape: DecodeShape, target: Target, head_tile: u32, splits: u32) -> DecodePlan {
        let steps = shape.topk / DECODE_BLOCK_TOKENS;
        let blocks_per_split = steps.div_ceil(splits);
        DecodePlan { shape, target, head_tile, splits: steps.div_ceil(blocks_per_split), blocks_per_split }
    }

    /// Rejects a hand-edited plan that would drop tokens or mis-tile heads.
    fn check(&self) -> Result<()> {
        let steps = self.shape.topk / DECODE_BLOCK_TOKENS;
        let consistent = Some(self.head_tile) == nsa_kernels::spec::sparse_mla_head_tile(self.shape.heads, self.target)
            && self.splits >= 1
            && self.blocks_per_split >= 1
            && self.splits * self.blocks_per_split >= steps
            && (self.splits - 1) * self.blocks_per_split < steps;
        if !consistent {
            return Err(invalid(
                "plan",
                format!("{self:?}"),
                "a plan from DecodePlan::new or DecodePlan::with_splits (splits × blocks_per_split covers top-k / 64)",
            ));
        }
        Ok(())
    }

    pub fn head_tiles(&self) -> u32 {
        self.shape.heads.div_ceil(self.head_tile)
    }

    /// CTAs of the decode launch.
    pub fn ctas(&self) -> usize {
        self.shape.rows() * self.head_tiles() as usize * self.splits as usize
    }

    /// f32 elements of split-KV partials (O then LSE); 0 when not split.
    pub fn workspace_floats(&self) -> usize {
        if self.splits == 1 {
            return 0;
        }
        let per_split = self.shape.rows() * self.splits as usize * self.shape.heads as usize;
        per_split * (KV_LORA_RANK + 1)
    }

    /// Bytes of workspace [`sparse_decode`] needs for this plan.
    pub fn workspace_bytes(&self) -> usize {
        4 * self.workspace_floats()
    }

    /// One line for logs: the variant, the grid and why.
    pub fn explain(&self) -> String {
        let s = &self.shape;
        format!(
            "sparse_decode h{} k{} p{} ({}): {} rows × {} head tile(s) of {} × {} split(s) of {} steps = {} CTAs{}",
            s.heads,
            s.topk,
            s.page_size,
            if self.head_tile == WG_HEAD_TILE { "wgmma" } else { "mma.sync" },
            s.rows(),
            self.head_tiles(),
            self.head_tile,
            self.splits,
            self.blocks_per_split,
            self.ctas(),
            if self.splits > 1 { " + combine (too few rows to fill the GPU)" } else { "" }
        )
    }
}

/// The FP8-656 MLA cache of one layer as the decode kernel reads it: `num_pages`
/// pages of `page_size` records, `page_stride` bytes apart (a dense pool has
/// `page_stride = page_size × 656`). An index is `page × page_size + offset`.
#[derive(Debug)]
pub struct Fp8PagedCache<'a> {
    pub data: CudaView<'a, u8>,
    pub page_size: u32,
    pub page_stride: usize,
}

impl<'a> Fp8PagedCache<'a> {
    /// A dense pool (`[slots, 656]` bytes) viewed as pages of `page_size`.
    pub fn dense(data: CudaView<'a, u8>, page_size: u32) -> Self {
        Fp8PagedCache { data, page_size, page_stride: page_size as usize * FP8_TOKEN_BYTES }
    }

    /// Whole pages the view holds.
    pub fn num_pages(&self) -> usize {
        let page_bytes = self.page_size as usize * FP8_TOKEN_BYTES;
        if self.data.len() < page_bytes || self.page_stride == 0 {
            return 0;
        }
        (self.data.len() - page_bytes) / self.page_stride + 1
    }
}

/// Inputs of one decode call (shapes as in spec §8.3).
#[derive(Debug)]
pub struct SparseDecodeInputs<'a> {
    /// `[batch, s_q, heads, 576]` bf16: absorbed q_nope (512) ‖ q_rope (64).
    pub q: CudaView<'a, bf16>,
    pub cache: Fp8PagedCache<'a>,
    /// `[batch, s_q, topk]` physical slots; −1 marks an unused entry.
    pub indices: CudaView<'a, i32>,
    /// `[batch × s_q]`: only the first `topk_length[r]` indices of row r count.
    pub topk_length: Option<CudaView<'a, i32>>,
    pub sm_scale: f32,
}

/// Mirrors `nsa::decode::Params` (sparse_decode.cuh) field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SparseDecodeParams {
    q: u64,
    cache: u64,
    indices: u64,
    topk_length: u64,
    out: u64,
    lse: u64,
    o_part: u64,
    lse_part: u64,
    page_stride: i64,
    num_slots: i64,
    rows: i32,
    splits: i32,
    blocks_per_split: i32,
    sm_scale: f32,
}
// SAFETY: plain old data with the C layout the kernel declares.
unsafe impl DeviceRepr for SparseDecodeParams {}

/// Mirrors `nsa::decode::CombineParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CombineParams {
    o_part: u64,
    lse_part: u64,
    out: u64,
    lse: u64,
    rows: i32,
    splits: i32,
}
// SAFETY: as above.
unsafe impl DeviceRepr for CombineParams {}

const SLOT_EXPECTED: &str =
    "−1 or a slot below num_pages × page_size of the cache (page × page_size + offset); the entry was skipped";

fn check_inputs(plan: &DecodePlan, inputs: &SparseDecodeInputs<'_>, out: usize, lse: usize, ws: usize) -> Result<()> {
    plan.check()?;
    let s = &plan.shape;
    let rows = s.rows();
    let heads = s.heads as usize;
    check_len("q", inputs.q.len(), rows * heads * BF16_TOKEN_ELEMS, "batch × s_q × heads × 576")?;
    check_len("indices", inputs.indices.len(), rows * s.topk as usize, "batch × s_q × topk")?;
    if let Some(l) = &inputs.topk_length {
        check_len("topk_length", l.len(), rows, "one entry per query row (batch × s_q)")?;
    }
    check_len("out", out, rows * heads * KV_LORA_RANK, "batch × s_q × heads × 512")?;
    check_len("lse", lse, rows * heads, "batch × s_q × heads")?;
    // One CTA per (row, head tile, split) and one combine block per (row, head): grid.x limits.
    check_count_fits_i32("batch × s_q × head tiles × splits", plan.ctas())?;
    check_count_fits_i32("batch × s_q × heads", rows * heads)?;
    if ws < plan.workspace_floats() {
        return Err(invalid(
            "workspace",
            format!("{ws} f32"),
            format!(
                "at least {} f32 (DecodePlan::workspace_floats) for {} splits",
                plan.workspace_floats(),
                plan.splits
            ),
        ));
    }
    let c = &inputs.cache;
    if c.page_size != s.page_size {
        return Err(invalid(
            "cache.page_size",
            c.page_size.to_string(),
            format!("the plan's page size {} (kernels are specialised on it)", s.page_size),
        ));
    }
    let page_bytes = c.page_size as usize * FP8_TOKEN_BYTES;
    if c.page_stride < page_bytes || c.page_stride % 16 != 0 {
        return Err(invalid(
            "cache.page_stride",
            c.page_stride.to_string(),
            format!("a multiple of 16 bytes, at least page_size × 656 = {page_bytes}"),
        ));
    }
    if !inputs.sm_scale.is_finite() || inputs.sm_scale <= 0.0 {
        return Err(invalid("sm_scale", inputs.sm_scale.to_string(), "a finite positive softmax scale"));
    }
    Ok(())
}

/// Sparse MLA decode: `out[r, h] = softmax_j(sm_scale · q·c_j) · c_j[..512]` over the
/// valid indices of row r, `lse[r, h]` in natural log (+inf and out 0 for a row
/// without any valid index). `workspace` holds the split partials
/// ([`DecodePlan::workspace_floats`]; may be empty when `plan.splits == 1`).
pub fn sparse_decode(
    rt: &Runtime,
    plan: &DecodePlan,
    inputs: &SparseDecodeInputs<'_>,
    out: &mut CudaViewMut<'_, bf16>,
    lse: &mut CudaViewMut<'_, f32>,
    workspace: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    check_inputs(plan, inputs, out.len(), lse.len(), workspace.len())?;
    check_target("plan.target", plan.target, rt)?;
    let s = plan.shape;
    if s.rows() == 0 {
        return Ok(());
    }
    let stream = rt.gpu().stream();
    check_aligned("q", &inputs.q, 16, stream)?;
    check_aligned("cache", &inputs.cache.data, 16, stream)?;
    check_aligned("out", out, 16, stream)?;
    check_aligned("workspace", workspace, 16, stream)?;
    let decode = rt.kernel(plan.family())?;
    let num_slots = (inputs.cache.num_pages() * s.page_size as usize) as i64;
    let partials = s.rows() * plan.splits as usize * s.heads as usize;
    let (q, _g1) = inputs.q.device_ptr(stream);
    let (cache, _g2) = inputs.cache.data.device_ptr(stream);
    let (indices, _g3) = inputs.indices.device_ptr(stream);
    let topk_length = inputs.topk_length.as_ref().map(|l| l.device_ptr(stream));
    let (out_ptr, _g4) = out.device_ptr_mut(stream);
    let (lse_ptr, _g5) = lse.device_ptr_mut(stream);
    let (ws, _g6) = workspace.device_ptr_mut(stream);
    let params = SparseDecodeParams {
        q,
        cache,
        indices,
        topk_length: topk_length.as_ref().map_or(0, |(p, _)| *p),
        out: out_ptr,
        lse: lse_ptr,
        o_part: ws,
        lse_part: ws + 4 * (partials * KV_LORA_RANK) as u64,
        page_stride: inputs.cache.page_stride as i64,
        num_slots,
        rows: s.rows() as i32,
        splits: plan.splits as i32,
        blocks_per_split: plan.blocks_per_split as i32,
        sm_scale: inputs.sm_scale,
    };
    let mut args = rt.args();
    args.arg(&params);
    rt.launch(&decode, args, plan.ctas(), "indices", SLOT_EXPECTED)?;
    if plan.splits == 1 {
        return Ok(());
    }
    let combine = rt.kernel(KernelFamily::SparseDecodeCombine { heads: s.heads })?;
    let cp = CombineParams {
        o_part: params.o_part,
        lse_part: params.lse_part,
        out: out_ptr,
        lse: lse_ptr,
        rows: params.rows,
        splits: params.splits,
    };
    let mut args = rt.args();
    args.arg(&cp);
    rt.launch(&combine, args, s.rows() * s.heads as usize, "partials", "")
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: LaunchTarget = LaunchTarget { target: Target::Sm90a, sm_count: 132 };

    #[test]
    fn splits_fill_the_gpu_only_when_rows_are_few() {
        // (query rows, heads, head tile, 64-token steps, SMs) → splits.
        let table = [
            (1, 128, 64, 32, 132, 16),  // b1 h128: 32 splits are as fast with twice the partials
            (2, 128, 64, 32, 132, 16),  // b2 h128
            (4, 128, 64, 32, 132, 11),  // b4 h128: 3 steps a split
            (8, 128, 64, 32, 132, 8),   // b8 h128
            (16, 128, 64, 32, 132, 4),  // b8 s_q2 h128
            (32, 128, 64, 32, 132, 2),  // b32 h128
            (1, 16, 16, 32, 132, 32),   // b1 h16: one step per CTA
            (4, 16, 16, 32, 132, 16),   // b4 h16
            (16, 16, 16, 32, 132, 8),   // b16 h16
            (32, 16, 16, 32, 132, 4),   // b32 h16
            (128, 16, 16, 32, 132, 1),  // b128 h16: one wave already
            (128, 128, 64, 32, 132, 1), // b128 h128, b64 h128 s_q2
            (75, 128, 64, 32, 132, 2),  // just over a wave: halves beat a second full wave
            (1, 128, 64, 1, 132, 1),    // top-k 64: nothing to split
            (2, 128, 64, 9, 132, 9),    // top-k 576
        ];
        for (rows, heads, tile, steps, sms, want) in table {
            let got = choose_splits(rows, heads, tile, steps, sms);
            assert_eq!(got, want, "rows {rows} heads {heads} tile {tile} steps {steps} sms {sms}");
        }
    }

    #[test]
    fn plan_rejects_unsupported_shapes_naming_the_field() {
        let ok = DecodeShape { batch: 4, s_q: 2, heads: 128, topk: 2048, page_size: 64 };
        assert!(DecodePlan::new(ok, H200).is_ok());
        let cases = [
            (DecodeShape { heads: 24, ..ok }, "heads"),
            (DecodeShape { heads: 256, ..ok }, "heads"),
            (DecodeShape { topk: 100, ..ok }, "topk"),
            (DecodeShape { topk: 8192, ..ok }, "topk"),
            (DecodeShape { page_size: 0, ..ok }, "page_size"),
            (DecodeShape { s_q: 0, ..ok }, "s_q"),
        ];
        for (shape, field) in cases {
            let err = DecodePlan::new(shape, H200).unwrap_err().to_string();
            assert!(err.contains(&format!("`{field}`")), "{err}");
        }
    }

    #[test]
    fn sm90a_takes_the_warp_group_kernel_for_whole_64_head_tiles_only() {
        let shape = DecodeShape { batch: 8, s_q: 1, heads: 128, topk: 2048, page_size: 64 };
        let hopper = DecodePlan::new(shape, H200).unwrap();
        assert_eq!((hopper.head_tile, hopper.head_tiles()), (64, 2));
        assert!(hopper.explain().contains("wgmma"), "{}", hopper.explain());
        let blackwell = DecodePlan::new(shape, LaunchTarget { target: Target::Sm100a, ..H200 }).unwrap();
        assert_eq!(blackwell.head_tile, 32);
        assert!(blackwell.explain().contains("mma.sync"), "{}", blackwell.explain());
        for (heads, tile) in [(64, 64), (96, 32), (48, 16), (16, 16), (8, 16)] {
            let p = DecodePlan::new(DecodeShape { heads, ..shape }, H200).unwrap();
            assert_eq!(p.head_tile, tile, "h{heads}");
        }
        // A plan moved to another target no longer matches its kernel's tiling.
        assert!(DecodePlan { target: Target::Sm100a, ..hopper }.check().is_err());
    }

    #[test]
    fn caller_splits_are_even_and_hand_edited_plans_are_rejected() {
        let shape = DecodeShape { batch: 2, s_q: 1, heads: 32, topk: 576, page_size: 64 };
        let p = DecodePlan::with_splits(shape, Target::Sm90a, 5).unwrap();
        assert_eq!((p.splits, p.blocks_per_split), (5, 2));
        // 8 splits of 9 steps would leave an empty tail: 5 splits of 2 steps instead.
        let p = DecodePlan::with_splits(shape, Target::Sm90a, 8).unwrap();
        assert_eq!((p.splits, p.blocks_per_split), (5, 2));
        assert!(p.check().is_ok());
        assert!(DecodePlan::with_splits(shape, Target::Sm90a, 10).unwrap_err().to_string().contains("`splits`"));
        for bad in [
            DecodePlan { blocks_per_split: 1, ..p }, // 5 × 1 steps drop 4 of 9
            DecodePlan { splits: 9, ..p },           // empty splits
            DecodePlan { head_tile: 16, ..p },       // not the kernel's tile
        ] {
            assert!(bad.check().unwrap_err().to_string().contains("`plan`"), "{bad:?}");
        }
    }

    #[test]
    fn workspace_covers_partials_only_when_split() {
        let shape = DecodeShape { batch: 1, s_q: 1, heads: 128, topk: 2048, page_size: 64 };
        let plan = DecodePlan::new(shape, H200).unwrap();
        assert_eq!(plan.splits, 16);
        assert_eq!(plan.workspace_floats(), 16 * 128 * 513);
        let big = DecodePlan::new(DecodeShape { batch: 128, ..shape }, H200).unwrap();
        assert_eq!((big.splits, big.workspace_floats()), (1, 0));
        assert!(plan.explain().contains("combine"), "{}", plan.explain());
    }
}
