//! `nsa bench --suite prefill`: sparse MLA prefill over bf16 KV (s_q 4096, s_kv
//! 32768 by default, top-k 2048), with FLOP/s and the
//! roofline of this run.

use crate::bench::{copy_gbps, time_us};
use cudarc::driver::CudaSlice;
use half::bf16;
use nsa_kernels::layout::*;
use nsa_runtime::ops::sparse_prefill::{
    sparse_prefill_with, PrefillKernel, PrefillQuery, PrefillShape, SparsePrefillInputs, SparsePrefillOutputs,
};
use nsa_runtime::ops::Rows;
use nsa_runtime::verify::upload;
use nsa_runtime::{testdata, Error, Result, Runtime};
use rand::Rng;
use serde::Serialize;

/// bf16 dense tensor peak of an H200 (datasheet); the compute roof of the table.
const BF16_PEAK_TFLOPS: f64 = 989.0;
const S_Q: usize = 4096;
/// KV rows the prefill indices draw from by default (`--prefill-s-kv`).
pub const DEFAULT_S_KV: u64 = 32_768;
pub const TOPK: u32 = 2048;
/// (heads, d_qk) of the table.
const CASES: [(u32, u32); 5] = [(128, 576), (64, 576), (32, 576), (16, 576), (128, 512)];

#[derive(Serialize, Debug)]
pub struct PrefillRow {
    s_q: usize,
    s_kv: usize,
    heads: u32,
    d_qk: u32,
    us: f64,
    tflops: f64,
    /// max(FLOPs at the bf16 peak, HBM bytes (q, out, unique KV, indices) at the copy rate).
    roofline_us: f64,
}

/// `n` random bf16 values: a 1M-value random block repeated (the timing does not
/// depend on the values, only their range).
fn bf16_values(n: usize, rng: &mut impl Rng) -> Vec<bf16> {
    let block: Vec<bf16> = (0..n.min(1 << 20)).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect();
    block.iter().cycle().take(n).copied().collect()
}

/// `s_kv` >= TOPK (`--prefill-s-kv` is range-checked when parsed).
/// `kernel`: the kernel of the shapes that have a warp-group kernel (the others run
/// the standard one, and their rows say so).
pub fn prefill_bench(rt: &Runtime, reps: usize, s_kv: usize, kernel: PrefillKernel) -> Result<Vec<PrefillRow>> {
    let stream = rt.gpu().stream().clone();
    let copy_gbps = copy_gbps(&stream)?;
    let mut rng = testdata::rng(12);
    let k = TOPK as usize;
    let mut indices = Vec::with_capacity(S_Q * k);
    for _ in 0..S_Q {
        indices.extend(testdata::distinct_slots(k, s_kv, rng.random()));
    }
    let d_idx = upload(&stream, &indices)?;
    let d_kv = upload(&stream, &bf16_values(s_kv * BF16_TOKEN_ELEMS, &mut rng))?;
    let max_heads = CASES.iter().map(|c| c.0 as usize).max().unwrap_or(1);
    let d_q = upload(&stream, &bf16_values(S_Q * max_heads * BF16_TOKEN_ELEMS, &mut rng))?;
    let mut rows = Vec::new();
    for (heads, d_qk) in CASES {
        let shape = PrefillShape { s_q: S_Q, heads, topk: TOPK, d_qk, target: rt.target() };
        let wg = shape.head_tile()? == nsa_kernels::spec::WG_HEAD_TILE;
        let kernel = if wg { kernel } else { PrefillKernel::Standard };
        let h = heads as usize;
        let mut d_out: CudaSlice<bf16> = stream.alloc_zeros(S_Q * h * KV_LORA_RANK).map_err(Error::driver("alloc"))?;
        let mut d_max: CudaSlice<f32> = stream.alloc_zeros(S_Q * h).map_err(Error::driver("alloc"))?;
        let mut d_lse: CudaSlice<f32> = stream.alloc_zeros(S_Q * h).map_err(Error::driver("alloc"))?;
        let inputs = SparsePrefillInputs {
            query: PrefillQuery {
                q: d_q.slice(0..S_Q * h * d_qk as usize),
                indices: d_idx.slice(0..),
                topk_length: None,
                sm_scale: DEEPSEEK_V32_SM_SCALE,
            },
            // d_qk 512 reads the first 512 of each 576-wide row (a strided view).
            kv: Rows { data: d_kv.slice(0..), count: s_kv, width: d_qk as usize, stride: BF16_TOKEN_ELEMS },
        };
        let us = time_us(&stream, reps, || {
            let outputs = SparsePrefillOutputs {
                out: &mut d_out.slice_mut(0..),
                max_logits: &mut d_max.slice_mut(0..),
                lse: &mut d_lse.slice_mut(0..),
            };
            sparse_prefill_with(rt, &shape, kernel, &inputs, outputs)
        })?;
        let flops = 2.0 * S_Q as f64 * heads as f64 * TOPK as f64 * (d_qk as usize + KV_LORA_RANK) as f64;
        let bytes = (S_Q * h * 2 * (d_qk as usize + KV_LORA_RANK) + s_kv * 2 * d_qk as usize + S_Q * k * 4) as f64;
        let roofline_us = (flops / (BF16_PEAK_TFLOPS * 1e6)).max(bytes / copy_gbps / 1e3);
        // The kernel is printed, not in the JSON row: a row keeps its key across the two
        // kernels (`ab_report.py` pairs rows by their identifying fields).
        let kernel = if kernel == PrefillKernel::Pairs { "pairs" } else { "standard" };
        let row = PrefillRow { s_q: S_Q, s_kv, heads, d_qk, us, tflops: flops / us / 1e6, roofline_us };
        println!(
            "sparse prefill s_q{S_Q} s_kv{s_kv} h{heads:<4} d{d_qk} {kernel:<8}: {us:>10.1} µs  {:>6.1} TFLOP/s  (roofline {roofline_us:.1} µs: {BF16_PEAK_TFLOPS} TFLOP/s, {copy_gbps:.0} GB/s)",
            row.tflops
        );
        rows.push(row);
    }
    Ok(rows)
}
