//! `nsa bench --suite indexer`: lightning-indexer logits. Decode (PAGED, 64 heads,
//! next_n 1) in GB/s of indexer K read against the copy rate of this run; extend
//! (RAGGED, causal windows) in FP8 TFLOP/s.

use crate::bench::{copy_gbps, time_us};
use cudarc::driver::CudaSlice;
use nsa_kernels::layout::{INDEXER_HEAD_DIM, INDEXER_PAGE_BYTES, INDEXER_PAGE_TOKENS, INDEXER_TOKEN_BYTES};
use nsa_runtime::ops::indexer::{
    paged_logits, ragged_logits, IndexerQuery, LogitsOut, PagedIndexerKeys, RaggedIndexerKeys,
};
use nsa_runtime::verify::upload;
use nsa_runtime::{testdata, Error, Result, Runtime};
use rand::Rng;
use serde::Serialize;

const HEADS: u32 = 64;
/// FP8 dense tensor peak of an H200 (datasheet); the extend roof.
const FP8_PEAK_TFLOPS: f64 = 1979.0;

#[derive(Serialize, Debug)]
pub struct IndexerRow {
    case: String,
    us: f64,
    /// Decode: indexer K bytes read per µs (GB/s); extend: 0.
    gbps: f64,
    /// Decode: share of the copy rate of this run.
    fraction_of_copy: f64,
    /// Extend: FP8 TFLOP/s over the visible (query, key) pairs.
    tflops: f64,
}

fn random_bytes(n: usize, rng: &mut impl Rng) -> Vec<u8> {
    (0..n).map(|_| rng.random::<u8>() & 0x77).collect()
}

pub fn indexer_bench(rt: &Runtime, reps: usize) -> Result<Vec<IndexerRow>> {
    let stream = rt.gpu().stream().clone();
    let copy_gbps = copy_gbps(&stream)?;
    let mut rng = testdata::rng(13);
    let mut rows_out = Vec::new();
    let h = HEADS as usize;
    for (batch, context) in
        [(1usize, 16_384usize), (32, 16_384), (128, 16_384), (1, 65_536), (32, 65_536), (128, 65_536)]
    {
        let width = context / INDEXER_PAGE_TOKENS;
        let pages = batch * width;
        let mut cache = random_bytes(pages * INDEXER_PAGE_BYTES, &mut rng);
        for p in 0..pages {
            for o in 0..INDEXER_PAGE_TOKENS {
                let at = p * INDEXER_PAGE_BYTES + INDEXER_PAGE_TOKENS * INDEXER_HEAD_DIM + 4 * o;
                cache[at..at + 4].copy_from_slice(&(1.0f32 / 64.0).to_le_bytes());
            }
        }
        // Each request owns its pages, in shuffled order.
        let table: Vec<i32> = testdata::distinct_slots(pages, pages, rng.random());
        let d_cache = upload(&stream, &cache)?;
        let d_table = upload(&stream, &table)?;
        let d_lens = upload(&stream, &vec![context as i32; batch])?;
        let d_q = upload(&stream, &random_bytes(batch * h * INDEXER_HEAD_DIM, &mut rng))?;
        let d_w = upload(&stream, &vec![0.01f32; batch * h])?;
        let mut d_out: CudaSlice<f32> = stream.alloc_zeros(batch * context).map_err(Error::driver("alloc"))?;
        let query = IndexerQuery { heads: HEADS, q: d_q.slice(0..), weights: d_w.slice(0..batch * h) };
        let keys = PagedIndexerKeys {
            cache: d_cache.slice(0..),
            block_table: d_table.slice(0..),
            table_width: width,
            context_lens: d_lens.slice(0..batch),
            next_n: 1,
        };
        let us = time_us(&stream, reps, || {
            paged_logits(rt, &query, &keys, LogitsOut::new(&mut d_out.slice_mut(0..), context))
        })?;
        let bytes = (batch * context * INDEXER_TOKEN_BYTES) as f64;
        let gbps = bytes / us / 1e3;
        let case = format!("decode b{batch} ctx{context}");
        println!(
            "indexer {case:<24}: {us:>9.2} µs  {gbps:>6.0} GB/s of K  ({:.0}% of the {copy_gbps:.0} GB/s copy)",
            100.0 * gbps / copy_gbps
        );
        rows_out.push(IndexerRow { case, us, gbps, fraction_of_copy: gbps / copy_gbps, tflops: 0.0 });
    }
    // Extend: 4096 new tokens after a 28K prefix, causal windows over 32K keys.
    let (t_rows, keys_n) = (4096usize, 32_768usize);
    let d_k = upload(&stream, &random_bytes(keys_n * INDEXER_HEAD_DIM, &mut rng))?;
    let d_s = upload(&stream, &vec![1.0f32 / 64.0; keys_n])?;
    let ke: Vec<i32> = (0..t_rows).map(|t| (keys_n - t_rows + t + 1) as i32).collect();
    let d_ks = upload(&stream, &vec![0i32; t_rows])?;
    let d_ke = upload(&stream, &ke)?;
    let d_q = upload(&stream, &random_bytes(t_rows * h * INDEXER_HEAD_DIM, &mut rng))?;
    let d_w = upload(&stream, &vec![0.01f32; t_rows * h])?;
    let mut d_out: CudaSlice<f32> = stream.alloc_zeros(t_rows * keys_n).map_err(Error::driver("alloc"))?;
    let query = IndexerQuery { heads: HEADS, q: d_q.slice(0..), weights: d_w.slice(0..) };
    let rk =
        RaggedIndexerKeys { keys: d_k.slice(0..), scales: d_s.slice(0..), ks: d_ks.slice(0..), ke: d_ke.slice(0..) };
    let us = time_us(&stream, reps.min(10), || {
        ragged_logits(rt, &query, &rk, LogitsOut::new(&mut d_out.slice_mut(0..), keys_n))
    })?;
    let pairs: f64 = ke.iter().map(|&e| e as f64).sum();
    let tflops = 2.0 * pairs * (h * INDEXER_HEAD_DIM) as f64 / us / 1e6;
    let case = format!("extend t{t_rows} keys{keys_n}");
    println!("indexer {case:<24}: {us:>9.2} µs  {tflops:>6.1} FP8 TFLOP/s (peak {FP8_PEAK_TFLOPS})");
    rows_out.push(IndexerRow { case, us, gbps: 0.0, fraction_of_copy: 0.0, tflops });
    Ok(rows_out)
}

/// The logits the paged indexer kernel computes for `rows` requests of `n` keys
/// (a multiple of 64) from `testdata::indexer_topics`' structured inputs, `[rows, n]`.
pub fn structured_logits(rt: &Runtime, rows: usize, n: usize, seed: u64) -> Result<Vec<f32>> {
    if n % INDEXER_PAGE_TOKENS != 0 || n == 0 {
        return Err(Error::InvalidArgument {
            field: "--topk-shapes",
            value: format!("{rows}x{n}"),
            expected: format!("keys per row a positive multiple of {INDEXER_PAGE_TOKENS} with --topk-values indexer"),
        });
    }
    let stream = rt.gpu().stream().clone();
    let s = testdata::indexer_topics::structured_indexer(rows, n, seed);
    let d_cache = upload(&stream, &s.cache)?;
    let d_table = upload(&stream, &s.block_table)?;
    let d_lens = upload(&stream, &s.context_lens)?;
    let d_q = upload(&stream, &s.q)?;
    let d_w = upload(&stream, &s.weights)?;
    let mut d_out: CudaSlice<f32> = stream.alloc_zeros(rows * n).map_err(Error::driver("alloc"))?;
    let query = IndexerQuery { heads: HEADS, q: d_q.slice(0..), weights: d_w.slice(0..) };
    let keys = PagedIndexerKeys {
        cache: d_cache.slice(0..),
        block_table: d_table.slice(0..),
        table_width: s.width,
        context_lens: d_lens.slice(0..),
        next_n: 1,
    };
    paged_logits(rt, &query, &keys, LogitsOut::new(&mut d_out.slice_mut(0..), n))?;
    stream.clone_dtoh(&d_out).map_err(Error::driver("logits download"))
}
