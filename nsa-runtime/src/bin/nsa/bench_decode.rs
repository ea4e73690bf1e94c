//! `nsa bench --suite decode`: sparse MLA decode on the FP8 cache (top-k 2048, 16K
//! keys per request, page 64), with FLOP/s, the
//! KV bytes gathered per µs and the roofline of this run.

use crate::bench::{copy_gbps, time_us};
use crate::shapes::parse_dims;
use cudarc::driver::CudaSlice;
use half::bf16;
use nsa_kernels::layout::*;
use nsa_runtime::ops::sparse_decode::{sparse_decode, DecodePlan, DecodeShape, Fp8PagedCache, SparseDecodeInputs};
use nsa_runtime::verify::upload;
use nsa_runtime::{testdata, Error, Result, Runtime};
use rand::Rng;
use serde::Serialize;

/// bf16 dense tensor peak of an H200 (datasheet); the compute roof of the table.
const BF16_PEAK_TFLOPS: f64 = 989.0;
const KEYS_PER_REQUEST: usize = 16_384;
const TOPK: u32 = 2048;

#[derive(Serialize, Debug)]
pub struct DecodeRow {
    batch: usize,
    s_q: usize,
    heads: u32,
    splits: u32,
    us: f64,
    tflops: f64,
    /// KV bytes gathered (rows × top-k × 656) plus q and out, per µs.
    gbps: f64,
    /// max(FLOPs at the bf16 peak, bytes at the copy rate of this run).
    roofline_us: f64,
}

/// Valid FP8 records (no NaN codes), a few thousand distinct ones tiled over the pool.
fn fp8_pool(slots: usize, rng: &mut impl Rng) -> Vec<u8> {
    let distinct = 4096.min(slots);
    let mut base = vec![0u8; distinct * FP8_TOKEN_BYTES];
    for rec in base.chunks_mut(FP8_TOKEN_BYTES) {
        rec[..KV_LORA_RANK].iter_mut().for_each(|b| *b = rng.random::<u8>() & 0x77);
        for t in 0..FP8_SCALE_TILES {
            let at = FP8_SCALES_OFFSET + 4 * t;
            rec[at..at + 4].copy_from_slice(&rng.random_range(0.002f32..0.02).to_le_bytes());
        }
        for r in 0..ROPE_DIM {
            let at = FP8_ROPE_OFFSET + 2 * r;
            rec[at..at + 2].copy_from_slice(&bf16::from_f32(rng.random_range(-1.0..1.0)).to_bits().to_le_bytes());
        }
    }
    base.chunks(FP8_TOKEN_BYTES).cycle().take(slots).flatten().copied().collect()
}

/// Default shapes (batch, s_q, heads): b1/b32/b128 at 128 heads, b64 with s_q 2, b128
/// at 64 heads, and b128/b1/b32 at 16 heads.
const DEFAULT_CASES: [(usize, usize, u32); 8] =
    [(1, 1, 128), (32, 1, 128), (128, 1, 128), (64, 2, 128), (128, 1, 64), (128, 1, 16), (1, 1, 16), (32, 1, 16)];

fn parse_shape(s: &str) -> Result<(usize, usize, u32)> {
    let [b, q, h] = parse_dims::<3>("--decode-shapes", s, "batch x s_q x heads", "128x1x16")?;
    let heads = u32::try_from(h).map_err(|_| Error::InvalidArgument {
        field: "--decode-shapes",
        value: format!("`{s}`"),
        expected: format!("a head count below 2^32 (not {h})"),
    })?;
    Ok((b, q, heads))
}

/// The cases of `--decode-shapes` (the default shapes when none are given).
pub fn decode_cases(shapes: &[String]) -> Result<Vec<(usize, usize, u32)>> {
    if shapes.is_empty() {
        return Ok(DEFAULT_CASES.to_vec());
    }
    shapes.iter().map(|s| parse_shape(s)).collect()
}

/// Each case under the launcher's plan, then under each of `splits` (KV split
/// counts chosen by hand, for comparing plans).
pub fn decode_bench(
    rt: &Runtime,
    reps: usize,
    cases: &[(usize, usize, u32)],
    shared_keys: bool,
    splits: &[u32],
) -> Result<Vec<DecodeRow>> {
    let stream = rt.gpu().stream().clone();
    let copy_gbps = copy_gbps(&stream)?;
    let mut rng = testdata::rng(11);
    let max_batch = cases.iter().map(|c| c.0).max().unwrap_or(1);
    let pool = fp8_pool(max_batch * KEYS_PER_REQUEST, &mut rng);
    let d_pool = upload(&stream, &pool)?;
    let mut out_rows = Vec::new();
    for &(batch, s_q, heads) in cases {
        let shape = DecodeShape { batch, s_q, heads, topk: TOPK, page_size: 64 };
        let mut plans = vec![DecodePlan::new(shape, rt.launch_target())?];
        for &s in splits {
            plans.push(DecodePlan::with_splits(shape, rt.target(), s)?);
        }
        let rows = shape.rows();
        let k = TOPK as usize;
        // Request b owns slots [b·16K, (b+1)·16K); each query row picks 2048 distinct ones.
        let mut indices = Vec::with_capacity(rows * k);
        for r in 0..rows {
            let b = if shared_keys { 0 } else { r / s_q };
            let picks = testdata::distinct_slots(k, KEYS_PER_REQUEST, rng.random());
            indices.extend(picks.iter().map(|p| (b * KEYS_PER_REQUEST) as i32 + p));
        }
        let q: Vec<bf16> = (0..rows * heads as usize * BF16_TOKEN_ELEMS)
            .map(|_| bf16::from_f32(rng.random_range(-1.0..1.0)))
            .collect();
        let d_q = upload(&stream, &q)?;
        let d_idx = upload(&stream, &indices)?;
        let mut d_out: CudaSlice<bf16> =
            stream.alloc_zeros(rows * heads as usize * KV_LORA_RANK).map_err(Error::driver("alloc"))?;
        let mut d_lse: CudaSlice<f32> = stream.alloc_zeros(rows * heads as usize).map_err(Error::driver("alloc"))?;
        let ws_floats = plans.iter().map(|p| p.workspace_floats()).max().unwrap_or(0);
        let mut d_ws: CudaSlice<f32> = stream.alloc_zeros(ws_floats.max(4)).map_err(Error::driver("alloc"))?;
        let inputs = SparseDecodeInputs {
            q: d_q.slice(0..),
            cache: Fp8PagedCache::dense(d_pool.slice(0..), 64),
            indices: d_idx.slice(0..),
            topk_length: None,
            sm_scale: DEEPSEEK_V32_SM_SCALE,
        };
        for plan in &plans {
            let us = time_us(&stream, reps, || {
                sparse_decode(
                    rt,
                    plan,
                    &inputs,
                    &mut d_out.slice_mut(0..),
                    &mut d_lse.slice_mut(0..),
                    &mut d_ws.slice_mut(0..),
                )
            })?;
            let flops = 2.0 * rows as f64 * heads as f64 * TOPK as f64 * (BF16_TOKEN_ELEMS + KV_LORA_RANK) as f64;
            let bytes = (rows * k * (FP8_TOKEN_BYTES + 4)
                + rows * heads as usize * 2 * (BF16_TOKEN_ELEMS + KV_LORA_RANK)) as f64;
            let roofline_us = (flops / (BF16_PEAK_TFLOPS * 1e6)).max(bytes / copy_gbps / 1e3);
            let row = DecodeRow {
                batch,
                s_q,
                heads,
                splits: plan.splits,
                us,
                tflops: flops / us / 1e6,
                gbps: bytes / us / 1e3,
                roofline_us,
            };
            println!(
                "sparse decode b{batch:<4} s_q{s_q} h{heads:<4} splits {:>2}: {us:>9.2} µs  {:>6.1} TFLOP/s  {:>6.0} GB/s  (roofline {roofline_us:.1} µs: {BF16_PEAK_TFLOPS} TFLOP/s, {copy_gbps:.0} GB/s)",
                plan.splits, row.tflops, row.gbps
            );
            out_rows.push(row);
        }
    }
    Ok(out_rows)
}
