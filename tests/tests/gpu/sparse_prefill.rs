//! Sparse MLA prefill on the GPU against the CPU reference (included by gpu.rs).
//! Tolerances: nsa_runtime::verify::attention (module docs).

use super::{assert_all, rt};
use nsa_kernels::spec::PREFILL_HEADS;
use nsa_kernels::Target;
use nsa_runtime::ops::sparse_prefill::{PrefillKernel, PrefillShape};
use nsa_runtime::verify::attention::IndexPattern;
use nsa_runtime::verify::sparse_prefill::{run, KvSource, PrefillCase};

// The GPU tests run on the H200 (sm_90a): 64-head multiples take the wgmma kernel.
fn shape(s_q: usize, heads: u32, topk: u32, d_qk: u32) -> PrefillShape {
    PrefillShape { s_q, heads, topk, d_qk, target: Target::Sm90a }
}

#[test]
fn every_head_count_topk_and_width() {
    let rt = rt();
    let mut checks = Vec::new();
    let mut seed = 1500;
    for heads in PREFILL_HEADS {
        for topk in [64, 576, 2048] {
            for d_qk in [576, 512] {
                seed += 1;
                let c = PrefillCase::new(shape(62, heads, topk, d_qk), 577, IndexPattern::Holes, seed);
                checks.push(run(&rt, &c).unwrap());
            }
        }
    }
    assert_all(&checks);
}

#[test]
fn query_and_kv_lengths() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, (s_q, s_kv, heads)) in
        [(1, 64, 128), (1, 32768, 16), (62, 64, 64), (62, 32768, 128), (4096, 577, 16), (4096, 32768, 32)]
            .into_iter()
            .enumerate()
    {
        let mut c = PrefillCase::new(shape(s_q, heads, 2048, 576), s_kv, IndexPattern::Holes, 1600 + i as u64);
        c.check_rows = 16;
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

/// Rows without any valid index (out 0, max_logits −inf, lse +inf), indices ≥ s_kv
/// or below −1 (masked, spec §8.2), per-query lengths, duplicates, strided rows.
#[test]
fn invalid_rows_masked_indices_lengths_and_duplicates() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, heads) in [16u32, 128].into_iter().enumerate() {
        let base = shape(40, heads, 2048, 576);
        let seed = 1700 + 10 * i as u64;
        checks.push(run(&rt, &PrefillCase::new(base, 3000, IndexPattern::AllInvalid, seed)).unwrap());
        checks.push(run(&rt, &PrefillCase::new(base, 3000, IndexPattern::Duplicates, seed + 1)).unwrap());
        let mut c = PrefillCase::new(base, 3000, IndexPattern::Full, seed + 2);
        c.lengths = true; // every 5th query 0, others anywhere in 0..=topk
        c.out_of_range = true;
        checks.push(run(&rt, &c).unwrap());
        let mut c = PrefillCase::new(base, 3000, IndexPattern::Holes, seed + 3);
        c.row_pad = 64;
        c.out_of_range = true;
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

/// The paired-block kernel (its consumer groups on alternate 64-token blocks): every
/// head count with a warp-group kernel, both widths, even and odd block counts (top-k
/// 64 is one block, 576 nine), per-query lengths (a last pair of one block, queries
/// without keys), masked and duplicate indices, strided rows, long KV.
#[test]
fn paired_block_kernel_every_shape_and_edge() {
    let rt = rt();
    let mut checks = Vec::new();
    let mut seed = 1900;
    let mut push = |mut c: PrefillCase| {
        c.kernel = PrefillKernel::Pairs;
        checks.push(run(&rt, &c).unwrap());
    };
    for heads in PREFILL_HEADS.into_iter().filter(|&h| h > 16) {
        for topk in [64, 576, 2048] {
            for d_qk in [576, 512] {
                seed += 1;
                push(PrefillCase::new(shape(62, heads, topk, d_qk), 577, IndexPattern::Holes, seed));
            }
        }
    }
    let base = shape(40, 128, 2048, 576);
    push(PrefillCase::new(base, 3000, IndexPattern::AllInvalid, 1950));
    push(PrefillCase::new(base, 3000, IndexPattern::Duplicates, 1951));
    let mut c = PrefillCase::new(base, 3000, IndexPattern::Full, 1952);
    c.lengths = true;
    c.out_of_range = true;
    push(c);
    let mut c = PrefillCase::new(shape(40, 64, 2048, 512), 3000, IndexPattern::Holes, 1953);
    c.row_pad = 64;
    c.lengths = true;
    push(c);
    let mut c = PrefillCase::new(shape(4096, 128, 2048, 576), 32768, IndexPattern::Holes, 1954);
    c.check_rows = 16;
    push(c);
    assert_all(&checks);
}

/// The FP8-cache path: the prefix dequantized into the ragged buffer, then prefill.
#[test]
fn fp8_ragged_path() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, (s_q, s_kv, heads)) in [(62, 577, 16), (300, 5000, 128), (1, 64, 64)].into_iter().enumerate() {
        let mut c = PrefillCase::new(shape(s_q, heads, 2048, 576), s_kv, IndexPattern::Holes, 1800 + i as u64);
        c.source = KvSource::Fp8Ragged;
        c.lengths = i == 1;
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

/// s_q = 0 launches nothing and succeeds.
#[test]
fn empty_batch() {
    let rt = rt();
    let c = PrefillCase::new(shape(0, 64, 2048, 576), 100, IndexPattern::Holes, 1900);
    assert_all(&[run(&rt, &c).unwrap()]);
}

/// 64-bit addressing and grid limits: KV rows past 2^31 bytes are read, and
/// s_q > 65,535 query tokens run in one launch.
#[test]
fn kv_over_2_gib_and_s_q_over_65535() {
    use half::bf16;
    use nsa_kernels::layout::{BF16_TOKEN_ELEMS, DEEPSEEK_V32_SM_SCALE, KV_LORA_RANK};
    use nsa_runtime::ops::sparse_prefill::{sparse_prefill, PrefillQuery, SparsePrefillInputs, SparsePrefillOutputs};
    use nsa_runtime::ops::Rows;
    use nsa_runtime::reference::sparse_mla::attend;
    use nsa_runtime::testdata;
    use nsa_runtime::verify::attention::{compare, sample_rows, GpuAttention};
    use nsa_runtime::verify::{download, upload};
    use rand::Rng;

    let rt = rt();
    let stream = rt.gpu().stream();
    let mut rng = testdata::rng(1950);
    // 1.9M rows of 1152 bytes: 2.19 GB, the last rows start past 2^31 bytes.
    let s_kv = 1_900_000usize;
    assert!((s_kv - 64) * 2 * BF16_TOKEN_ELEMS > 1 << 31);
    let mut d_kv = stream.alloc_zeros::<bf16>(s_kv * BF16_TOKEN_ELEMS).unwrap();
    // 64 random rows at each end of the tensor; everything else stays zero.
    let ends: Vec<usize> = (0..64).chain(s_kv - 64..s_kv).collect();
    let mut rows = std::collections::HashMap::new();
    for (i, &r) in ends.iter().enumerate() {
        let v: Vec<bf16> = (0..BF16_TOKEN_ELEMS).map(|_| bf16::from_f32(rng.random_range(-2.0..2.0))).collect();
        let at = r * BF16_TOKEN_ELEMS;
        stream.memcpy_htod(&v, &mut d_kv.slice_mut(at..at + BF16_TOKEN_ELEMS)).unwrap();
        rows.insert(r, (i, v));
    }
    let (s_q, heads, topk) = (70_000usize, 16u32, 64u32);
    let h = heads as usize;
    // Queries: a random block repeated (the grid, not the values, is under test).
    let block: Vec<bf16> = (0..(1 << 20)).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect();
    let q: Vec<bf16> = block.iter().cycle().take(s_q * h * BF16_TOKEN_ELEMS).copied().collect();
    let indices: Vec<i32> = (0..s_q * topk as usize)
        .map(|_| if rng.random_range(0..8) == 0 { -1 } else { ends[rng.random_range(0..ends.len())] as i32 })
        .collect();
    let d_q = upload(stream, &q).unwrap();
    let d_idx = upload(stream, &indices).unwrap();
    let mut d_out = stream.alloc_zeros::<bf16>(s_q * h * KV_LORA_RANK).unwrap();
    let mut d_max = stream.alloc_zeros::<f32>(s_q * h).unwrap();
    let mut d_lse = stream.alloc_zeros::<f32>(s_q * h).unwrap();
    let shape = PrefillShape { s_q, heads, topk, d_qk: 576, target: Target::Sm90a };
    let inputs = SparsePrefillInputs {
        query: PrefillQuery {
            q: d_q.slice(0..q.len()),
            indices: d_idx.slice(0..indices.len()),
            topk_length: None,
            sm_scale: DEEPSEEK_V32_SM_SCALE,
        },
        kv: Rows { data: d_kv.slice(0..), count: s_kv, width: BF16_TOKEN_ELEMS, stride: BF16_TOKEN_ELEMS },
    };
    let outputs = SparsePrefillOutputs {
        out: &mut d_out.slice_mut(0..),
        max_logits: &mut d_max.slice_mut(0..),
        lse: &mut d_lse.slice_mut(0..),
    };
    sparse_prefill(&rt, &shape, &inputs, outputs).unwrap();
    let out = download(stream, &d_out, s_q * h * KV_LORA_RANK).unwrap();
    let max_logits = download(stream, &d_max, s_q * h).unwrap();
    let lse = download(stream, &d_lse, s_q * h).unwrap();
    let picked = sample_rows(s_q, 16);
    let keys: Vec<Vec<f32>> = ends.iter().map(|r| rows[r].1.iter().map(|v| v.to_f32()).collect()).collect();
    let want: Vec<_> = picked
        .iter()
        .map(|&t| {
            let k = topk as usize;
            let ks: Vec<&[f32]> = indices[t * k..(t + 1) * k]
                .iter()
                .filter(|&&i| i >= 0)
                .map(|&i| keys[rows[&(i as usize)].0].as_slice())
                .collect();
            let qt: Vec<f32> =
                q[t * h * BF16_TOKEN_ELEMS..(t + 1) * h * BF16_TOKEN_ELEMS].iter().map(|v| v.to_f32()).collect();
            attend(&qt, h, BF16_TOKEN_ELEMS, &ks, DEEPSEEK_V32_SM_SCALE)
        })
        .collect();
    let gpu = GpuAttention { heads: h, out: &out, lse: &lse, max_logits: Some(&max_logits) };
    let (mismatches, first) = compare(&gpu, &picked, &want);
    assert_eq!(mismatches, 0, "{first:?}");
}
