//! Sparse MLA decode on the GPU against the CPU reference (spec §8.1, §8.3).
//!
//! Tolerances: [`super::attention`].

pub use super::attention::IndexPattern;
use super::attention::{compare, index_row, reference_rows, sample_rows, GpuAttention};
use super::{download, upload, Check};
use crate::ops::sparse_decode::{self, DecodePlan, DecodeShape, Fp8PagedCache, SparseDecodeInputs};
use crate::reference::kv_cache::quantize_fp8_token;
use crate::reference::sparse_mla::{attend, valid_slots, DecodeDequant, PagedFp8};
use crate::runtime::Runtime;
use crate::testdata;
use crate::Result;
use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::KernelSpec;
use rand::Rng;

/// One decode test case.
#[derive(Clone, Debug)]
pub struct DecodeCase {
    pub shape: DecodeShape,
    pub pattern: IndexPattern,
    /// Random per-row `topk_length` in 0..=topk (0 for some rows).
    pub lengths: bool,
    /// Extra bytes between pages (multiple of 16): a non-dense page stride.
    pub page_pad: usize,
    /// Slots of the cache (rounded up to whole pages).
    pub slots: usize,
    /// `None`: the plan's own split choice.
    pub splits: Option<u32>,
    /// Rows compared against the reference (evenly spread, first and last included).
    pub check_rows: usize,
    /// Put one out-of-cache index in row 0 (the kernel must skip it).
    pub bad_index: bool,
    /// Every 11th slot has one 128-dim tile scaled by 2^24: its FP8 scale is ≥ 2^15,
    /// the kernel's two-multiply dequant path.
    pub huge_scales: bool,
    /// Slot s's values are scaled by 2^(6 s / slots) (tile scales grow 64-fold over
    /// the cache) and every index row is sorted ascending: the running row max and
    /// the tile scales rise step after step, so the kernels rescale a non-zero O by
    /// factors strictly between 0 and 1 (the raw-record kernel's lazy rescale moves
    /// the max only past a slack of 8 (log2) and sigma only 16-fold).
    pub rising: bool,
    pub seed: u64,
}

impl DecodeCase {
    pub fn new(shape: DecodeShape, pattern: IndexPattern, seed: u64) -> Self {
        DecodeCase {
            shape,
            pattern,
            lengths: false,
            page_pad: 0,
            slots: 8192,
            splits: None,
            check_rows: 64,
            bad_index: false,
            huge_scales: false,
            rising: false,
            seed,
        }
    }
}

/// Builds a paged FP8 cache, random queries and index rows, runs the kernel and
/// compares the sampled rows with the reference.
pub fn run(rt: &Runtime, case: &DecodeCase) -> Result<Check> {
    let stream = rt.gpu().stream();
    let s = case.shape;
    let plan = match case.splits {
        Some(n) => DecodePlan::with_splits(s, rt.target(), n)?,
        None => DecodePlan::new(s, rt.launch_target())?,
    };
    let mut rng = testdata::rng(case.seed);
    let page = s.page_size as usize;
    let pages = case.slots.div_ceil(page).max(1);
    let stride = page * FP8_TOKEN_BYTES + case.page_pad;
    let mut bytes = vec![0x5au8; pages * stride];
    let num_slots = pages * page;
    for slot in 0..num_slots {
        let huge = case.huge_scales && slot % 11 == 0;
        let rise = if case.rising { (6.0 * slot as f32 / num_slots as f32).exp2() } else { 1.0 };
        let tok: Vec<bf16> = (0..BF16_TOKEN_ELEMS)
            .map(|d| {
                let v: f32 = rng.random_range(-2.0..2.0) * rise;
                bf16::from_f32(if huge && (128..256).contains(&d) { v * 16_777_216.0 } else { v })
            })
            .collect();
        let rec = quantize_fp8_token(&tok[..KV_LORA_RANK], &tok[KV_LORA_RANK..]);
        let at = slot / page * stride + slot % page * FP8_TOKEN_BYTES;
        bytes[at..at + FP8_TOKEN_BYTES].copy_from_slice(&rec);
    }
    let rows = s.rows();
    let heads = s.heads as usize;
    let k = s.topk as usize;
    let q: Vec<bf16> =
        (0..rows * heads * BF16_TOKEN_ELEMS).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect();
    let mut indices = Vec::with_capacity(rows * k);
    for _ in 0..rows {
        let mut row = index_row(case.pattern, k, num_slots, &mut rng);
        if case.rising {
            row.sort_unstable();
        }
        indices.extend(row);
    }
    if case.bad_index && rows > 0 {
        indices[0] = num_slots as i32 + 5;
    }
    let lengths: Option<Vec<i32>> =
        case.lengths.then(|| (0..rows).map(|r| if r % 5 == 0 { 0 } else { rng.random_range(0..=k as i32) }).collect());

    let d_q = upload(stream, &q)?;
    let d_cache = upload(stream, &bytes)?;
    let d_idx = upload(stream, &indices)?;
    let d_len = lengths.as_ref().map(|l| upload(stream, l)).transpose()?;
    let mut d_out = upload(stream, &vec![bf16::from_bits(0x7fc1); rows * heads * KV_LORA_RANK])?;
    let mut d_lse = upload(stream, &vec![f32::NAN; rows * heads])?;
    let mut d_ws = upload(stream, &vec![f32::NAN; plan.workspace_floats().max(4)])?;
    let inputs = SparseDecodeInputs {
        q: d_q.slice(0..q.len()),
        cache: Fp8PagedCache { data: d_cache.slice(0..), page_size: s.page_size, page_stride: stride },
        indices: d_idx.slice(0..indices.len()),
        topk_length: d_len.as_ref().map(|l| l.slice(0..rows)),
        sm_scale: DEEPSEEK_V32_SM_SCALE,
    };
    sparse_decode::sparse_decode(
        rt,
        &plan,
        &inputs,
        &mut d_out.slice_mut(0..rows * heads * KV_LORA_RANK),
        &mut d_lse.slice_mut(0..rows * heads),
        &mut d_ws.slice_mut(0..),
    )?;
    let out = download(stream, &d_out, rows * heads * KV_LORA_RANK)?;
    let lse = download(stream, &d_lse, rows * heads)?;

    let spec = KernelSpec::new(plan.family(), rt.target());
    let cache = PagedFp8 { bytes: &bytes, page_size: page, page_stride: stride, dequant: DecodeDequant::of(&spec) };
    let picked: Vec<usize> = sample_rows(rows, case.check_rows);
    let want = reference_rows(&picked, |r| {
        let len = lengths.as_ref().map_or(k, |l| l[r].clamp(0, k as i32) as usize);
        let slots = valid_slots(&indices[r * k..(r + 1) * k], len, cache.num_slots());
        let keys: Vec<Vec<f32>> = slots.iter().map(|&slot| cache.token(slot)).collect();
        let key_refs: Vec<&[f32]> = keys.iter().map(|v| v.as_slice()).collect();
        let qr: Vec<f32> =
            q[r * heads * BF16_TOKEN_ELEMS..(r + 1) * heads * BF16_TOKEN_ELEMS].iter().map(|v| v.to_f32()).collect();
        attend(&qr, heads, BF16_TOKEN_ELEMS, &key_refs, DEEPSEEK_V32_SM_SCALE)
    });
    let gpu = GpuAttention { heads, out: &out, lse: &lse, max_logits: None };
    let (mismatches, first) = compare(&gpu, &picked, &want);
    let id = spec.id();
    Ok(Check {
        kernel: id,
        case: format!(
            "b{} s_q{} {:?}{}{}{}{} splits {}",
            s.batch,
            s.s_q,
            case.pattern,
            if case.lengths { " +len" } else { "" },
            if case.page_pad > 0 { " padded pages" } else { "" },
            if case.huge_scales { " huge scales" } else { "" },
            if case.rising { " rising" } else { "" },
            plan.splits
        ),
        items: picked.len(),
        mismatches,
        first_mismatch: first,
    })
}
