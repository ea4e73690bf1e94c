//! Sparse MLA prefill on the GPU against the CPU reference (spec §8.1, §8.2), over
//! bf16 KV rows (PAGED: the pool) or over an FP8 pool dequantized into a ragged
//! buffer (RAGGED). Tolerances: [`super::attention`].

use super::attention::{compare, index_row, reference_rows, sample_rows, GpuAttention, IndexPattern};
use super::{download, upload, Check};
use crate::ops::sparse_prefill::{
    self, Fp8RaggedKv, PrefillKernel, PrefillQuery, PrefillShape, SparsePrefillInputs, SparsePrefillOutputs,
};
use crate::ops::Rows;
use crate::reference::kv_cache::{dequantize_fp8_token, quantize_fp8_token};
use crate::reference::sparse_mla::attend;
use crate::runtime::Runtime;
use crate::testdata;
use crate::Result;
use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::{KernelFamily, KernelSpec};
use rand::Rng;

/// Where the KV rows come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSource {
    /// bf16 rows given directly (the bf16 pool, PAGED).
    Bf16,
    /// An FP8-656 pool, `s_kv` of its slots dequantized into the ragged buffer
    /// (RAGGED; d_qk 576 only).
    Fp8Ragged,
}

/// One prefill test case.
#[derive(Clone, Debug)]
pub struct PrefillCase {
    pub shape: PrefillShape,
    /// KV rows the indices address.
    pub s_kv: usize,
    pub pattern: IndexPattern,
    pub source: KvSource,
    /// Random per-query `topk_length` in 0..=topk (0 for every 5th query).
    pub lengths: bool,
    /// Replace about 1 in 16 entries by a masked value ≥ s_kv or < −1.
    pub out_of_range: bool,
    /// Extra bf16 elements between KV rows (multiple of 8): a strided pool.
    pub row_pad: usize,
    /// Queries compared against the reference (evenly spread, first and last included).
    pub check_rows: usize,
    /// The kernel launched for bf16 KV rows (the FP8 RAGGED path runs the standard one).
    pub kernel: PrefillKernel,
    pub seed: u64,
}

impl PrefillCase {
    pub fn new(shape: PrefillShape, s_kv: usize, pattern: IndexPattern, seed: u64) -> Self {
        PrefillCase {
            shape,
            s_kv,
            pattern,
            source: KvSource::Bf16,
            lengths: false,
            out_of_range: false,
            row_pad: 0,
            check_rows: 24,
            kernel: PrefillKernel::Standard,
            seed,
        }
    }
}

/// KV rows as the kernel reads them (`stride` apart) and as f32 for the reference.
struct KvData {
    device_rows: Vec<bf16>,
    stride: usize,
    reference: Vec<f32>, // [s_kv, d_qk]
    /// Fp8Ragged: the pool bytes and the slots dequantized into the ragged buffer.
    fp8: Option<(Vec<u8>, Vec<i32>)>,
}

fn kv_data(case: &PrefillCase, rng: &mut rand::rngs::StdRng) -> KvData {
    let d = case.shape.d_qk as usize;
    let s_kv = case.s_kv;
    match case.source {
        KvSource::Bf16 => {
            let stride = d + case.row_pad;
            let mut device_rows = vec![bf16::from_bits(0x7fc1); s_kv * stride];
            let mut reference = Vec::with_capacity(s_kv * d);
            for r in 0..s_kv {
                for c in 0..d {
                    let v = bf16::from_f32(rng.random_range(-2.0..2.0));
                    device_rows[r * stride + c] = v;
                    reference.push(v.to_f32());
                }
            }
            KvData { device_rows, stride, reference, fp8: None }
        }
        KvSource::Fp8Ragged => {
            // A pool twice the ragged length; the ragged rows are a random subset.
            let pool = 2 * s_kv.max(1);
            let mut bytes = Vec::with_capacity(pool * FP8_TOKEN_BYTES);
            for _ in 0..pool {
                let tok: Vec<bf16> =
                    (0..BF16_TOKEN_ELEMS).map(|_| bf16::from_f32(rng.random_range(-2.0..2.0))).collect();
                bytes.extend(quantize_fp8_token(&tok[..KV_LORA_RANK], &tok[KV_LORA_RANK..]));
            }
            let slots = testdata::distinct_slots(s_kv, pool, rng.random());
            let mut reference = Vec::with_capacity(s_kv * BF16_TOKEN_ELEMS);
            for &slot in &slots {
                let at = slot as usize * FP8_TOKEN_BYTES;
                reference.extend(dequantize_fp8_token(&bytes[at..at + FP8_TOKEN_BYTES]).iter().map(|v| v.to_f32()));
            }
            KvData { device_rows: Vec::new(), stride: BF16_TOKEN_ELEMS, reference, fp8: Some((bytes, slots)) }
        }
    }
}

/// Builds KV rows, random queries and index rows, runs the kernel and compares the
/// sampled queries with the reference.
pub fn run(rt: &Runtime, case: &PrefillCase) -> Result<Check> {
    if case.kernel == PrefillKernel::Pairs && !matches!(case.source, KvSource::Bf16) {
        let want = "PrefillKernel::Standard with an FP8 source (its RAGGED prefill launches the standard kernel)";
        return Err(crate::error::invalid("kernel", "Pairs", want));
    }
    let stream = rt.gpu().stream();
    let s = case.shape;
    let mut rng = testdata::rng(case.seed);
    let kv = kv_data(case, &mut rng);
    let (s_q, heads, k, d) = (s.s_q, s.heads as usize, s.topk as usize, s.d_qk as usize);
    let q: Vec<bf16> = (0..s_q * heads * d).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect();
    let mut indices = Vec::with_capacity(s_q * k);
    for _ in 0..s_q {
        let mut row = index_row(case.pattern, k, case.s_kv, &mut rng);
        if case.out_of_range {
            for v in row.iter_mut() {
                if rng.random_range(0..16) == 0 {
                    *v = if rng.random() {
                        case.s_kv as i32 + rng.random_range(0..1000)
                    } else {
                        -rng.random_range(2..9)
                    };
                }
            }
        }
        indices.extend(row);
    }
    let lengths: Option<Vec<i32>> =
        case.lengths.then(|| (0..s_q).map(|r| if r % 5 == 0 { 0 } else { rng.random_range(0..=k as i32) }).collect());

    let d_q = upload(stream, &q)?;
    let d_idx = upload(stream, &indices)?;
    let d_len = lengths.as_ref().map(|l| upload(stream, l)).transpose()?;
    let mut d_out = upload(stream, &vec![bf16::from_bits(0x7fc1); s_q * heads * KV_LORA_RANK])?;
    let mut d_max = upload(stream, &vec![f32::NAN; s_q * heads])?;
    let mut d_lse = upload(stream, &vec![f32::NAN; s_q * heads])?;
    let query = PrefillQuery {
        q: d_q.slice(0..q.len()),
        indices: d_idx.slice(0..indices.len()),
        topk_length: d_len.as_ref().map(|l| l.slice(0..s_q)),
        sm_scale: DEEPSEEK_V32_SM_SCALE,
    };
    let mut out_view = d_out.slice_mut(0..s_q * heads * KV_LORA_RANK);
    let mut max_view = d_max.slice_mut(0..s_q * heads);
    let mut lse_view = d_lse.slice_mut(0..s_q * heads);
    let outputs = SparsePrefillOutputs { out: &mut out_view, max_logits: &mut max_view, lse: &mut lse_view };
    match &kv.fp8 {
        None => {
            let d_kv = upload(stream, &kv.device_rows)?;
            let rows = Rows { data: d_kv.slice(0..), count: case.s_kv, width: d, stride: kv.stride };
            sparse_prefill::sparse_prefill_with(
                rt,
                &s,
                case.kernel,
                &SparsePrefillInputs { query, kv: rows },
                outputs,
            )?;
        }
        Some((pool, slots)) => {
            let d_pool = upload(stream, pool)?;
            let d_slots = upload(stream, slots)?;
            let mut d_buf =
                upload(stream, &vec![bf16::from_bits(0x7fc1); sparse_prefill::ragged_kv_elems(slots.len())])?;
            let mut buffer = d_buf.slice_mut(0..sparse_prefill::ragged_kv_elems(slots.len()));
            let ragged = Fp8RaggedKv {
                cache: d_pool.slice(0..pool.len()),
                kv_slots: d_slots.slice(0..slots.len()),
                buffer: &mut buffer,
            };
            sparse_prefill::sparse_prefill_fp8_ragged(rt, &s, ragged, query, outputs)?;
        }
    }
    let out = download(stream, &d_out, s_q * heads * KV_LORA_RANK)?;
    let max_logits = download(stream, &d_max, s_q * heads)?;
    let lse = download(stream, &d_lse, s_q * heads)?;

    let picked = sample_rows(s_q, case.check_rows);
    let kv_width = kv.reference.len() / case.s_kv.max(1);
    let want = reference_rows(&picked, |r| {
        let len = lengths.as_ref().map_or(k, |l| l[r].clamp(0, k as i32) as usize);
        let keys: Vec<&[f32]> = indices[r * k..r * k + len]
            .iter()
            .filter(|&&i| i >= 0 && (i as usize) < case.s_kv)
            .map(|&i| &kv.reference[i as usize * kv_width..(i as usize + 1) * kv_width])
            .collect();
        let qr: Vec<f32> = q[r * heads * d..(r + 1) * heads * d].iter().map(|v| v.to_f32()).collect();
        attend(&qr, heads, d, &keys, DEEPSEEK_V32_SM_SCALE)
    });
    let gpu = GpuAttention { heads, out: &out, lse: &lse, max_logits: Some(&max_logits) };
    let (mismatches, first_mismatch) = compare(&gpu, &picked, &want);
    let id = KernelSpec::new(
        KernelFamily::SparsePrefill {
            heads: s.heads,
            topk: s.topk,
            d_qk: s.d_qk,
            paired: case.kernel == PrefillKernel::Pairs,
        },
        rt.target(),
    )
    .id();
    Ok(Check {
        kernel: id,
        case: format!(
            "s_q{} s_kv{} {:?} {:?}{}{}{}",
            s_q,
            case.s_kv,
            case.pattern,
            case.source,
            if case.lengths { " +len" } else { "" },
            if case.out_of_range { " +out-of-range" } else { "" },
            if case.row_pad > 0 { " strided" } else { "" },
        ),
        items: picked.len(),
        mismatches,
        first_mismatch,
    })
}
