//! Sparse MLA prefill over bf16 KV rows (spec §8.1, §8.2, §8.4): the launcher, and
//! the two ways a server feeds it (spec §5.2): PAGED over the bf16 pool with slot
//! indices, and RAGGED over a dequantized FP8 prefix (+ new tokens) with ragged
//! row indices.

use super::kv_cache::dequant_fp8;
use super::{check_aligned, check_count_fits_i32, check_len, check_sparse_mla_heads_topk, check_target, invalid, Rows};
use crate::runtime::Runtime;
use crate::Result;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr};
use half::bf16;
use nsa_kernels::layout::{BF16_TOKEN_ELEMS, KV_LORA_RANK};
use nsa_kernels::spec::PREFILL_DQK;
use nsa_kernels::{KernelFamily, Target};

/// The shape of one prefill call: `s_q` query tokens (every request of the batch
/// folded together: indices carry the batch), each with its own `topk` indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillShape {
    pub s_q: usize,
    pub heads: u32,
    pub topk: u32,
    /// Q/K width: 576 (latent 512 ‖ rope 64) or 512 (no rope). V is always the first 512.
    pub d_qk: u32,
    /// The GPU generation the kernel variant is for (sm_90a runs 64-head wgmma tiles).
    pub target: Target,
}

impl PrefillShape {
    /// Heads per CTA, or an error naming the unsupported field.
    pub fn head_tile(&self) -> Result<u32> {
        let tile = check_sparse_mla_heads_topk(
            self.heads,
            self.topk,
            self.target,
            nsa_kernels::spec::sparse_prefill_head_tile,
        )?;
        if !PREFILL_DQK.contains(&self.d_qk) {
            return Err(invalid("d_qk", self.d_qk.to_string(), "576 (latent + rope) or 512 (latent only)"));
        }
        Ok(tile)
    }

    /// CTAs of the launch: one per (query token, head tile).
    pub fn ctas(&self) -> Result<usize> {
        Ok(self.s_q * self.heads.div_ceil(self.head_tile()?) as usize)
    }

    /// One line for logs: the variant and the grid.
    pub fn explain(&self) -> String {
        match self.head_tile() {
            Ok(t) => format!(
                "sparse_prefill h{} k{} d{} ({}): {} query tokens × {} head tile(s) of {} = {} CTAs",
                self.heads,
                self.topk,
                self.d_qk,
                if t == nsa_kernels::spec::WG_HEAD_TILE { "wgmma" } else { "mma.sync" },
                self.s_q,
                self.heads.div_ceil(t),
                t,
                self.s_q * self.heads.div_ceil(t) as usize
            ),
            Err(e) => format!("sparse_prefill: unsupported shape ({e})"),
        }
    }
}

/// The query side of one prefill call (spec §8.2).
#[derive(Debug)]
pub struct PrefillQuery<'a> {
    /// `[s_q, heads, d_qk]` bf16: absorbed q_nope (512) ‖ q_rope (64 when d_qk = 576).
    pub q: CudaView<'a, bf16>,
    /// `[s_q, topk]` row numbers of the KV rows; −1, any negative value or ≥ s_kv is masked.
    pub indices: CudaView<'a, i32>,
    /// `[s_q]`: only the first `topk_length[t]` indices of query t count.
    pub topk_length: Option<CudaView<'a, i32>>,
    pub sm_scale: f32,
}

/// Inputs of one prefill call: the query side and the KV rows it indexes.
#[derive(Debug)]
pub struct SparsePrefillInputs<'a> {
    pub query: PrefillQuery<'a>,
    /// `s_kv` rows of `d_qk` bf16 (`count` = s_kv, `width` = d_qk, any 16-byte
    /// multiple stride): the whole bf16 pool (PAGED) or a ragged KV buffer (RAGGED).
    pub kv: Rows<'a, bf16>,
}

/// The FP8 cache rows a RAGGED prefill reads (spec §5.2, §8.2): `kv_slots` is
/// `page_table_1_flattened` (every request's prefix and new tokens, request after
/// request), dequantized into `buffer` (`[kv_slots.len(), 576]` bf16,
/// [`ragged_kv_elems`]).
#[derive(Debug)]
pub struct Fp8RaggedKv<'a, 'b> {
    /// `[pool_slots, 656]` bytes.
    pub cache: CudaView<'a, u8>,
    pub kv_slots: CudaView<'a, i32>,
    pub buffer: &'a mut CudaViewMut<'b, bf16>,
}

/// Outputs of one prefill call. `max_logits` and `lse` are natural-log values:
/// `max_j(sm_scale·q·k_j)` and `ln Σ_j exp(sm_scale·q·k_j)`; a query without any
/// valid index gets out 0, max_logits −inf and lse +inf.
#[derive(Debug)]
pub struct SparsePrefillOutputs<'a, 'b> {
    /// `[s_q, heads, 512]` bf16.
    pub out: &'a mut CudaViewMut<'b, bf16>,
    /// `[s_q, heads]` f32.
    pub max_logits: &'a mut CudaViewMut<'b, f32>,
    /// `[s_q, heads]` f32.
    pub lse: &'a mut CudaViewMut<'b, f32>,
}

/// Mirrors `nsa::prefill::Params` (sparse_prefill.cuh) field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SparsePrefillParams {
    q: u64,
    kv: u64,
    indices: u64,
    topk_length: u64,
    out: u64,
    max_logits: u64,
    lse: u64,
    kv_stride: i64,
    s_kv: i64,
    s_q: i64,
    sm_scale: f32,
}
// SAFETY: plain old data with the C layout the kernel declares.
unsafe impl DeviceRepr for SparsePrefillParams {}

/// Checks everything but the KV rows (their view may not exist yet: the FP8 path
/// fills them after this check) and returns the CTA count.
fn check_inputs(
    shape: &PrefillShape,
    query: &PrefillQuery<'_>,
    kv_width: usize,
    outputs: &SparsePrefillOutputs,
) -> Result<usize> {
    let ctas = shape.ctas()?;
    let (s_q, heads) = (shape.s_q, shape.heads as usize);
    check_len("q", query.q.len(), s_q * heads * shape.d_qk as usize, "s_q × heads × d_qk")?;
    check_len("kv.width", kv_width, shape.d_qk as usize, "d_qk (the kernel reads whole rows)")?;
    check_len("indices", query.indices.len(), s_q * shape.topk as usize, "s_q × topk")?;
    if let Some(l) = &query.topk_length {
        check_len("topk_length", l.len(), s_q, "one entry per query token")?;
    }
    check_len("out", outputs.out.len(), s_q * heads * KV_LORA_RANK, "s_q × heads × 512")?;
    check_len("max_logits", outputs.max_logits.len(), s_q * heads, "s_q × heads")?;
    check_len("lse", outputs.lse.len(), s_q * heads, "s_q × heads")?;
    // One CTA per (query token, head tile) on grid.x.
    check_count_fits_i32("s_q × head tiles", ctas)?;
    if !query.sm_scale.is_finite() || query.sm_scale <= 0.0 {
        return Err(invalid("sm_scale", query.sm_scale.to_string(), "a finite positive softmax scale"));
    }
    Ok(ctas)
}

/// Which kernel a sparse prefill call launches where the warp-group kernel runs
/// (sm_90a, 17+ heads; elsewhere only `Standard` exists).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillKernel {
    /// One consumer group computes every block's scores and softmax, both groups
    /// half of P·V (sparse_prefill_wg.cuh).
    #[default]
    Standard,
    /// The two consumer groups take alternate 64-token blocks and exchange the row
    /// max and P (sparse_prefill_pairs.cuh). Opt-in: not yet timed against
    /// `Standard` on a GPU.
    Pairs,
}

impl std::str::FromStr for PrefillKernel {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "standard" => Ok(PrefillKernel::Standard),
            "pairs" => Ok(PrefillKernel::Pairs),
            _ => Err(format!("unknown sparse prefill kernel `{s}`: allowed standard or pairs")),
        }
    }
}

/// Sparse MLA prefill: `out[t, h] = softmax_j(sm_scale · q·k_j) · k_j[..512]` over
/// the valid indices of query t, with `max_logits` and `lse` (natural log).
pub fn sparse_prefill(
    rt: &Runtime,
    shape: &PrefillShape,
    inputs: &SparsePrefillInputs<'_>,
    outputs: SparsePrefillOutputs<'_, '_>,
) -> Result<()> {
    sparse_prefill_with(rt, shape, PrefillKernel::Standard, inputs, outputs)
}

/// [`sparse_prefill`] on the kernel the caller names (benchmarks, tests).
pub fn sparse_prefill_with(
    rt: &Runtime,
    shape: &PrefillShape,
    kernel: PrefillKernel,
    inputs: &SparsePrefillInputs<'_>,
    outputs: SparsePrefillOutputs<'_, '_>,
) -> Result<()> {
    check_target("shape.target", shape.target, rt)?;
    let ctas = check_inputs(shape, &inputs.query, inputs.kv.width, &outputs)?;
    let paired = check_kernel(shape, kernel)?;
    launch(rt, shape, paired, ctas, inputs, outputs)
}

/// Whether `kernel` is the paired-block one, or an error where `shape` has no
/// warp-group kernel (sm_90a, 17+ heads) for it to replace.
fn check_kernel(shape: &PrefillShape, kernel: PrefillKernel) -> Result<bool> {
    let paired = kernel == PrefillKernel::Pairs;
    if paired && shape.head_tile()? != nsa_kernels::spec::WG_HEAD_TILE {
        return Err(invalid(
            "kernel",
            "Pairs",
            format!(
                "PrefillKernel::Standard for {} heads on {}: Pairs needs sm_90a and 17+ heads",
                shape.heads, shape.target
            ),
        ));
    }
    Ok(paired)
}

/// The launch after [`check_inputs`]: the KV view, alignment, the kernel.
fn launch(
    rt: &Runtime,
    shape: &PrefillShape,
    paired: bool,
    ctas: usize,
    inputs: &SparsePrefillInputs<'_>,
    outputs: SparsePrefillOutputs<'_, '_>,
) -> Result<()> {
    if ctas == 0 {
        return Ok(());
    }
    let stream = rt.gpu().stream();
    inputs.kv.check("kv", stream)?;
    let query = &inputs.query;
    check_aligned("q", &query.q, 16, stream)?;
    check_aligned("out", outputs.out, 16, stream)?;
    let kernel =
        rt.kernel(KernelFamily::SparsePrefill { heads: shape.heads, topk: shape.topk, d_qk: shape.d_qk, paired })?;
    let (q, _g1) = query.q.device_ptr(stream);
    let (kv, _g2) = inputs.kv.data.device_ptr(stream);
    let (indices, _g3) = query.indices.device_ptr(stream);
    let topk_length = query.topk_length.as_ref().map(|l| l.device_ptr(stream));
    let (out, _g4) = outputs.out.device_ptr_mut(stream);
    let (max_logits, _g5) = outputs.max_logits.device_ptr_mut(stream);
    let (lse, _g6) = outputs.lse.device_ptr_mut(stream);
    let params = SparsePrefillParams {
        q,
        kv,
        indices,
        topk_length: topk_length.as_ref().map_or(0, |(p, _)| *p),
        out,
        max_logits,
        lse,
        kv_stride: inputs.kv.stride as i64,
        s_kv: inputs.kv.count as i64,
        s_q: shape.s_q as i64,
        sm_scale: query.sm_scale,
    };
    let mut args = rt.args();
    args.arg(&params);
    rt.launch(&kernel, args, ctas, "indices", "")
}

/// bf16 elements of the ragged KV buffer [`sparse_prefill_fp8_ragged`] needs for
/// `kv_tokens` rows (Σ of the batch's sequence lengths, spec §8.2).
pub fn ragged_kv_elems(kv_tokens: usize) -> usize {
    kv_tokens * BF16_TOKEN_ELEMS
}

/// The FP8-cache prefill (spec §5.2 RAGGED, §8.2): dequantizes `kv.kv_slots` into
/// `kv.buffer`, then attends with `query.indices` that are row numbers of that
/// buffer (the RAGGED top-k output, `pos + topk_indices_offset`).
pub fn sparse_prefill_fp8_ragged(
    rt: &Runtime,
    shape: &PrefillShape,
    kv: Fp8RaggedKv<'_, '_>,
    query: PrefillQuery<'_>,
    outputs: SparsePrefillOutputs<'_, '_>,
) -> Result<()> {
    if shape.d_qk as usize != BF16_TOKEN_ELEMS {
        return Err(invalid("d_qk", shape.d_qk.to_string(), "576: the FP8 cache holds latent + rope"));
    }
    // Every prefill argument is checked before the dequant is launched.
    check_target("shape.target", shape.target, rt)?;
    let ctas = check_inputs(shape, &query, BF16_TOKEN_ELEMS, &outputs)?;
    let rows = kv.kv_slots.len();
    check_len("kv.buffer", kv.buffer.len(), ragged_kv_elems(rows), "kv_slots.len() × 576 (ragged_kv_elems)")?;
    dequant_fp8(rt, &kv.cache, &kv.kv_slots, kv.buffer)?;
    let rows = Rows { data: kv.buffer.slice(0..), count: rows, width: BF16_TOKEN_ELEMS, stride: BF16_TOKEN_ELEMS };
    launch(rt, shape, false, ctas, &SparsePrefillInputs { query, kv: rows }, outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paired_kernel_only_where_the_warp_group_kernel_runs() {
        let hopper = PrefillShape { s_q: 8, heads: 128, topk: 2048, d_qk: 576, target: Target::Sm90a };
        assert!(check_kernel(&hopper, PrefillKernel::Pairs).unwrap());
        assert!(!check_kernel(&hopper, PrefillKernel::Standard).unwrap());
        for shape in [PrefillShape { heads: 16, ..hopper }, PrefillShape { target: Target::Sm100a, ..hopper }] {
            assert!(!check_kernel(&shape, PrefillKernel::Standard).unwrap());
            let err = check_kernel(&shape, PrefillKernel::Pairs).unwrap_err().to_string();
            assert!(err.contains("`kernel`") && err.contains("Pairs") && err.contains("sm_90a"), "{err}");
        }
    }

    #[test]
    fn shapes_are_checked_naming_the_field() {
        let ok = PrefillShape { s_q: 4096, heads: 128, topk: 2048, d_qk: 576, target: Target::Sm100a };
        assert_eq!(ok.head_tile().unwrap(), 32);
        assert_eq!(ok.ctas().unwrap(), 4096 * 4);
        assert_eq!(PrefillShape { heads: 16, ..ok }.ctas().unwrap(), 4096);
        assert_eq!(PrefillShape { d_qk: 512, ..ok }.head_tile().unwrap(), 32);
        // sm_90a: more than 16 heads go to the warp-group kernel in 64-head tiles (the
        // last one partial), up to 16 stay on the split-K mma.sync kernel.
        let hopper = PrefillShape { target: Target::Sm90a, ..ok };
        assert_eq!(hopper.head_tile().unwrap(), 64);
        assert_eq!(hopper.ctas().unwrap(), 4096 * 2);
        assert!(hopper.explain().contains("wgmma"), "{}", hopper.explain());
        assert_eq!(PrefillShape { heads: 96, ..hopper }.head_tile().unwrap(), 64);
        assert_eq!(PrefillShape { heads: 96, ..hopper }.ctas().unwrap(), 4096 * 2);
        assert_eq!(PrefillShape { heads: 32, ..hopper }.head_tile().unwrap(), 64);
        assert_eq!(PrefillShape { heads: 32, ..hopper }.ctas().unwrap(), 4096);
        assert_eq!(PrefillShape { heads: 16, ..hopper }.head_tile().unwrap(), 16);
        assert!(PrefillShape { heads: 16, ..hopper }.explain().contains("mma.sync"));
        for (shape, field) in [
            (PrefillShape { heads: 24, ..ok }, "heads"),
            (PrefillShape { heads: 256, ..ok }, "heads"),
            (PrefillShape { topk: 100, ..ok }, "topk"),
            (PrefillShape { topk: 0, ..ok }, "topk"),
            (PrefillShape { d_qk: 192, ..ok }, "d_qk"),
        ] {
            let err = shape.head_tile().unwrap_err().to_string();
            assert!(err.contains(&format!("`{field}`")), "{err}");
            assert!(shape.explain().contains("unsupported"), "{}", shape.explain());
        }
        assert!(ok.explain().contains("16384 CTAs"), "{}", ok.explain());
    }
}
