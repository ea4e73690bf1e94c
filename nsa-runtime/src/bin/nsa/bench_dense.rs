//! `nsa bench --suite dense`: dense causal varlen attention (the MHA one-shot
//! prefill) over batches of equal-length requests, with FLOP/s against the bf16
//! peak, for every dense kernel the GPU runs (mma.sync; warp-group on sm_90a).

use crate::bench::time_us;
use cudarc::driver::CudaSlice;
use half::bf16;
use nsa_kernels::spec::DenseKernel;
use nsa_runtime::ops::dense_prefill::{dense_prefill, DenseInputs, DenseOutputs, DenseShape};
use nsa_runtime::verify::upload;
use nsa_runtime::{testdata, Error, Result, Runtime};
use rand::Rng;
use serde::Serialize;

/// bf16 dense tensor peak of an H100 SXM (datasheet); the compute roof of the table.
const BF16_PEAK_TFLOPS: f64 = 989.0;
/// Tokens per request.
const SEQ: usize = 2048;
/// (total tokens, heads, d_qk, d_v): 1, 4 and 16 requests of 2K tokens at 128 heads
/// (one GPU) and 16 heads (eight-way tensor parallel), and the 128-wide head shape.
const CASES: [(usize, u32, u32, u32); 7] = [
    (2048, 128, 192, 128),
    (8192, 128, 192, 128),
    (32768, 128, 192, 128),
    (2048, 16, 192, 128),
    (8192, 16, 192, 128),
    (32768, 16, 192, 128),
    (32768, 128, 128, 128),
];

#[derive(Serialize, Debug)]
pub struct DenseRow {
    /// The kernel: mma_sync or warp_group.
    kernel: DenseKernel,
    tokens: usize,
    seq: usize,
    heads: u32,
    d_qk: u32,
    d_v: u32,
    us: f64,
    /// Causal FLOPs (each row's visible keys only) per second.
    tflops: f64,
    /// The FLOPs at the bf16 peak.
    roofline_us: f64,
}

pub fn dense_bench(rt: &Runtime, reps: usize) -> Result<Vec<DenseRow>> {
    let stream = rt.gpu().stream().clone();
    let mut rng = testdata::rng(21);
    let max = CASES.iter().map(|c| c.0 * c.1 as usize * c.2 as usize).max().unwrap_or(0);
    // A 1M-value random block repeated: the timing depends on the values' range only.
    let block: Vec<bf16> = (0..1 << 20).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect();
    let values: Vec<bf16> = block.iter().cycle().take(max).copied().collect();
    let (d_q, d_k, d_v) = (upload(&stream, &values)?, upload(&stream, &values)?, upload(&stream, &values)?);
    let mut rows = Vec::new();
    let kernels = [DenseKernel::MmaSync, DenseKernel::WarpGroup].into_iter().filter(|k| k.runs_on(rt.target()));
    for kernel in kernels {
        for (tokens, heads, d_qk, d_v_dim) in CASES {
            rows.push(time_case(rt, kernel, (tokens, heads, d_qk, d_v_dim), reps, (&d_q, &d_k, &d_v))?);
        }
    }
    Ok(rows)
}

/// One case on one kernel.
fn time_case(
    rt: &Runtime,
    kernel: DenseKernel,
    (tokens, heads, d_qk, d_v_dim): (usize, u32, u32, u32),
    reps: usize,
    (d_q, d_k, d_v): (&CudaSlice<bf16>, &CudaSlice<bf16>, &CudaSlice<bf16>),
) -> Result<DenseRow> {
    let stream = rt.gpu().stream().clone();
    let batch = tokens / SEQ;
    let cu: Vec<i32> = (0..=batch).map(|b| (b * SEQ) as i32).collect();
    let d_cu = upload(&stream, &cu)?;
    let (h, dq, dv) = (heads as usize, d_qk as usize, d_v_dim as usize);
    let shape = DenseShape {
        heads,
        d_qk,
        d_v: d_v_dim,
        batch,
        rows: tokens,
        keys: tokens,
        max_seqlen_q: SEQ,
        target: rt.target(),
        kernel,
    };
    let mut d_out: CudaSlice<bf16> = stream.alloc_zeros(tokens * h * dv).map_err(Error::driver("alloc"))?;
    let mut d_lse: CudaSlice<f32> = stream.alloc_zeros(tokens * h).map_err(Error::driver("alloc"))?;
    let inputs = DenseInputs {
        q: d_q.slice(0..tokens * h * dq),
        k: d_k.slice(0..tokens * h * dq),
        v: d_v.slice(0..tokens * h * dv),
        cu_seqlens_q: d_cu.slice(0..),
        cu_seqlens_k: d_cu.slice(0..),
        sm_scale: 1.0 / (d_qk as f32).sqrt(),
    };
    let us = time_us(&stream, reps, || {
        let outputs = DenseOutputs { out: &mut d_out.slice_mut(0..), lse: &mut d_lse.slice_mut(0..) };
        dense_prefill(rt, &shape, &inputs, outputs)
    })?;
    let pairs = batch as f64 * (SEQ * (SEQ + 1) / 2) as f64;
    let flops = 2.0 * pairs * heads as f64 * (d_qk + d_v_dim) as f64;
    let row = DenseRow {
        kernel,
        tokens,
        seq: SEQ,
        heads,
        d_qk,
        d_v: d_v_dim,
        us,
        tflops: flops / us / 1e6,
        roofline_us: flops / (BF16_PEAK_TFLOPS * 1e6),
    };
    println!(
            "dense prefill {kernel:?} {tokens:>6} tokens ({batch} × {SEQ}) h{heads:<4} d{d_qk}/{d_v_dim}: {us:>9.1} µs  {:>6.1} TFLOP/s  ({:.0}% of {BF16_PEAK_TFLOPS})",
            row.tflops,
            100.0 * row.tflops / BF16_PEAK_TFLOPS
        );
    Ok(row)
}
