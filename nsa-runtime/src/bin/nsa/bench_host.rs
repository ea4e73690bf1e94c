//! `nsa bench --suite host`: the host cost of one Rust call of each op (checks,
//! kernel lookup, launches), at the shapes `.ci/bench/python_compat.py` times
//! nsa's Python functions with their outputs given, so the two compare call for
//! call. Zeroed inputs: the device work is small and its values do not matter.

use crate::bench::time_launches;
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use half::bf16;
use nsa_kernels::layout::{BF16_TOKEN_ELEMS, FP8_TOKEN_BYTES, INDEXER_HEAD_DIM, INDEXER_TOKEN_BYTES, KV_LORA_RANK};
use nsa_runtime::ops::indexer::{self, IndexerQuery, LogitsOut, PagedIndexerKeys, RaggedIndexerKeys};
use nsa_runtime::ops::sparse_decode::{self, DecodePlan, DecodeShape, Fp8PagedCache, SparseDecodeInputs};
use nsa_runtime::ops::sparse_prefill::{self, PrefillQuery, PrefillShape, SparsePrefillInputs, SparsePrefillOutputs};
use nsa_runtime::ops::topk::{self, TopkOutput, TopkScores};
use nsa_runtime::ops::Rows;
use nsa_runtime::{Error, Result, Runtime};
use serde::Serialize;
use std::sync::Arc;

#[derive(Serialize, Debug)]
pub struct HostRow {
    /// The Python function timed at the same shape.
    call: &'static str,
    shape: String,
    /// Host wall time per call (enqueue only).
    host_us: f64,
}

const REPS: usize = 200;

fn zeros<T: DeviceRepr + ValidAsZeroBits>(s: &Arc<CudaStream>, n: usize) -> Result<CudaSlice<T>> {
    s.alloc_zeros(n.max(1)).map_err(Error::driver("allocating a host-bench buffer"))
}

fn full(s: &Arc<CudaStream>, n: usize, v: i32) -> Result<CudaSlice<i32>> {
    s.clone_htod(&vec![v; n]).map_err(Error::driver("uploading a host-bench buffer"))
}

pub fn host_bench(rt: &Runtime) -> Result<Vec<HostRow>> {
    let s = rt.gpu().stream().clone();
    let mut rows = Vec::new();
    let mut push = |call, shape: String, us: f64| {
        println!("host {call:<24} {shape:<36} {us:>7.2} µs/call");
        rows.push(HostRow { call, shape, host_us: us });
    };

    // Top-k, 1 × 131072 f32, plain output.
    let n = 131072;
    let (score, lengths) = (zeros::<f32>(&s, n)?, full(&s, 1, n as i32)?);
    let mut out = zeros::<i32>(&s, 2048)?;
    let (sv, lv) = (score.slice(..), lengths.slice(..));
    let scores = TopkScores { scores: &sv, row_stride: n, row_capacity: n, lengths: &lv, row_starts: None };
    let t = time_launches(&s, REPS, || {
        topk::topk(rt, 2048, false, &scores, &TopkOutput::Plain, &mut out.slice_mut(..), None)
    })?;
    push("nsa.topk", "1 x 131072 f32".into(), t.host_us);

    // Sparse decode, b32 s_q1 h64, FP8 cache, page 64.
    let (b, h, k, page) = (32usize, 64u32, 2048u32, 64u32);
    let shape = DecodeShape { batch: b, s_q: 1, heads: h, topk: k, page_size: page };
    let plan = DecodePlan::new(shape, rt.launch_target())?;
    let q = zeros::<bf16>(&s, b * h as usize * BF16_TOKEN_ELEMS)?;
    let cache = zeros::<u8>(&s, 4096 * FP8_TOKEN_BYTES)?;
    let idx = zeros::<i32>(&s, b * k as usize)?;
    let (mut o, mut lse) = (zeros::<bf16>(&s, b * h as usize * KV_LORA_RANK)?, zeros::<f32>(&s, b * h as usize)?);
    let mut ws = zeros::<f32>(&s, plan.workspace_floats())?;
    let t = time_launches(&s, REPS, || {
        let inputs = SparseDecodeInputs {
            q: q.slice(..),
            cache: Fp8PagedCache {
                data: cache.slice(..),
                page_size: page,
                page_stride: page as usize * FP8_TOKEN_BYTES,
            },
            indices: idx.slice(..),
            topk_length: None,
            sm_scale: 0.0417,
        };
        sparse_decode::sparse_decode(
            rt,
            &plan,
            &inputs,
            &mut o.slice_mut(..),
            &mut lse.slice_mut(..),
            &mut ws.slice_mut(..),
        )
    })?;
    push("nsa.sparse_decode", format!("b{b} s_q1 h{h} topk{k} fp8 page{page}"), t.host_us);

    // Sparse prefill, s_q 64 over 4096 bf16 rows, h64, d576.
    let (s_q, s_kv) = (64usize, 4096usize);
    let pshape = PrefillShape { s_q, heads: h, topk: k, d_qk: BF16_TOKEN_ELEMS as u32, target: rt.target() };
    let pq = zeros::<bf16>(&s, s_q * h as usize * BF16_TOKEN_ELEMS)?;
    let kv = zeros::<bf16>(&s, s_kv * BF16_TOKEN_ELEMS)?;
    let pidx = zeros::<i32>(&s, s_q * k as usize)?;
    let mut po = zeros::<bf16>(&s, s_q * h as usize * KV_LORA_RANK)?;
    let (mut pm, mut pl) = (zeros::<f32>(&s, s_q * h as usize)?, zeros::<f32>(&s, s_q * h as usize)?);
    let t = time_launches(&s, REPS, || {
        let inputs = SparsePrefillInputs {
            query: PrefillQuery { q: pq.slice(..), indices: pidx.slice(..), topk_length: None, sm_scale: 0.0417 },
            kv: Rows { data: kv.slice(..), count: s_kv, width: BF16_TOKEN_ELEMS, stride: BF16_TOKEN_ELEMS },
        };
        let outputs = SparsePrefillOutputs {
            out: &mut po.slice_mut(..),
            max_logits: &mut pm.slice_mut(..),
            lse: &mut pl.slice_mut(..),
        };
        sparse_prefill::sparse_prefill(rt, &pshape, &inputs, outputs)
    })?;
    push("nsa.sparse_prefill", format!("s_q{s_q} s_kv{s_kv} h{h} d576"), t.host_us);

    // Indexer logits, PAGED: b32 over 16K tokens, next_n 1, 64 heads.
    let (ih, ctx) = (64u32, 16384usize);
    let width = ctx / 64;
    let iq = zeros::<u8>(&s, b * ih as usize * INDEXER_HEAD_DIM)?;
    let w = zeros::<f32>(&s, b * ih as usize)?;
    let icache = zeros::<u8>(&s, b * width * 64 * INDEXER_TOKEN_BYTES)?;
    let table = zeros::<i32>(&s, b * width)?;
    let ctx_lens = full(&s, b, ctx as i32)?;
    let mut logits = zeros::<f32>(&s, b * ctx)?;
    let t = time_launches(&s, REPS, || {
        let query = IndexerQuery { heads: ih, q: iq.slice(..), weights: w.slice(..) };
        let keys = PagedIndexerKeys {
            cache: icache.slice(..),
            block_table: table.slice(..),
            table_width: width,
            context_lens: ctx_lens.slice(..),
            next_n: 1,
        };
        indexer::paged_logits(rt, &query, &keys, LogitsOut::new(&mut logits.slice_mut(..), ctx))
    })?;
    push("nsa.indexer_paged_logits", format!("b{b} ctx{ctx} next_n1 h{ih}"), t.host_us);

    // Indexer logits, RAGGED: 64 rows over 4096 keys.
    let (rq, keys_n) = (64usize, 4096usize);
    let rqb = zeros::<u8>(&s, rq * ih as usize * INDEXER_HEAD_DIM)?;
    let rw = zeros::<f32>(&s, rq * ih as usize)?;
    let kb = zeros::<u8>(&s, keys_n * INDEXER_HEAD_DIM)?;
    let sc = zeros::<f32>(&s, keys_n)?;
    let (ks, ke) = (full(&s, rq, 0)?, full(&s, rq, keys_n as i32)?);
    let mut rl = zeros::<f32>(&s, rq * keys_n)?;
    let t = time_launches(&s, REPS, || {
        let query = IndexerQuery { heads: ih, q: rqb.slice(..), weights: rw.slice(..) };
        let keys = RaggedIndexerKeys { keys: kb.slice(..), scales: sc.slice(..), ks: ks.slice(..), ke: ke.slice(..) };
        indexer::ragged_logits(rt, &query, &keys, LogitsOut::new(&mut rl.slice_mut(..), keys_n))
    })?;
    push("nsa.indexer_ragged_logits", format!("rows{rq} keys{keys_n} h{ih}"), t.host_us);
    Ok(rows)
}
