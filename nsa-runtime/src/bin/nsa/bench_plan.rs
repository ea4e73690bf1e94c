//! `nsa bench --suite plan`: the cost of an eager decode step's plan, with the
//! metadata built on the host (`MetadataBuilder::decode` over a host mirror of
//! `req_to_token`, then `NsaLayer::plan`, which uploads it) against built on the
//! device (`NsaLayer::plan_on_device`: one metadata launch from the device tables),
//! at bs 1/32/256/1024 with 16K and 128K-token contexts; and the whole eager
//! decode step of the layer (plan + forward) at bs 128 both ways.

use crate::bench::time_launches;
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::NsaConfig;
use nsa_runtime::layer::{
    DeviceBatch, HostLens, LayerCaches, LayerConfig, LayerInputs, LayerOutputs, LayerWorkspace, NsaLayer, StepPlan,
};
use nsa_runtime::metadata::graph_device::{DeviceGraphState, DeviceRequests};
use nsa_runtime::metadata::{
    decide, BatchSummary, Dispatch, DispatchPolicy, ForwardMode, GraphCapacity, GraphMode, MetadataBuilder,
    MetadataParams, PrefillBackend, ReqToToken, Requests,
};
use nsa_runtime::ops::kv_cache::MlaCacheMut;
use nsa_runtime::ops::Rows;
use nsa_runtime::verify::upload;
use nsa_runtime::{testdata, Error, Result, Runtime};
use rand::Rng;
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

#[derive(Serialize, Debug)]
pub struct PlanRow {
    /// `host` (host metadata + upload) or `device` (built on the device).
    metadata: &'static str,
    bs: usize,
    context: usize,
    /// Host wall time per plan (the caller's thread).
    host_us: f64,
    /// Device time per plan (events around the loop).
    gpu_us: f64,
}

#[derive(Serialize, Debug)]
pub struct StepRow {
    metadata: &'static str,
    bs: usize,
    context: usize,
    /// Wall time per whole eager step (plan + forward), steady state.
    step_us: f64,
}

/// One decode batch: host and device `req_to_token`, lengths in `[ctx/2, ctx]`.
struct Batch {
    bs: usize,
    context: usize,
    table: Vec<i32>,
    seq: Vec<i32>,
    pool: Vec<i32>,
    d_table: CudaSlice<i32>,
    d_seq: CudaSlice<i32>,
    d_pool: CudaSlice<i32>,
}

impl Batch {
    fn new(stream: &Arc<CudaStream>, bs: usize, context: usize, rng: &mut impl Rng) -> Result<Batch> {
        let table: Vec<i32> = (0..(bs * context) as i32).collect();
        let seq: Vec<i32> = (0..bs).map(|_| rng.random_range(context as i32 / 2..=context as i32)).collect();
        let pool: Vec<i32> = (0..bs as i32).collect();
        let (d_table, d_seq, d_pool) = (upload(stream, &table)?, upload(stream, &seq)?, upload(stream, &pool)?);
        Ok(Batch { bs, context, table, seq, pool, d_table, d_seq, d_pool })
    }

    /// `f` with a decode metadata state sized for this batch and its device tables.
    fn on_device<R>(
        &self,
        rt: &Runtime,
        f: impl FnOnce(&mut DeviceGraphState, &DeviceBatch<'_>, HostLens<'_>) -> Result<R>,
    ) -> Result<R> {
        let cap = GraphCapacity { max_bs: self.bs, max_tokens: self.bs, max_context_len: self.context };
        let mut state = DeviceGraphState::new(rt, self.params(), GraphMode::Decode, cap)?;
        let (tv, sv, pv) = (self.d_table.slice(..), self.d_seq.slice(..), self.d_pool.slice(..));
        let reqs = DeviceRequests {
            req_to_token: &tv,
            req_to_token_width: self.context,
            req_pool_indices: &pv,
            seq_lens: &sv,
        };
        f(&mut state, &DeviceBatch { reqs, extend_lens: None }, HostLens { seq_lens: &self.seq, extend_lens: None })
    }

    fn params(&self) -> MetadataParams {
        MetadataParams { page_size: 64, topk: 2048, draft_tokens: 0, pool_slots: self.bs * self.context, cp: None }
    }
}

fn dispatch(rt: &Runtime, model: &NsaConfig, seq: &[i32]) -> Dispatch {
    let policy = DispatchPolicy {
        compute_capability: rt.gpu().caps().compute_capability,
        kv_cache: model.kv_cache,
        prefill_backend: PrefillBackend::Auto,
        topk: model.topk,
        max_chunk_capacity: usize::MAX,
        cp_enabled: false,
        force_mla: true,
    };
    decide(&policy, Some(&BatchSummary { mode: ForwardMode::Decode, seq_lens: seq, extend_num_tokens: seq.len() }))
}

/// Iterations that take about `budget_s` of host time, at least 3.
fn iterations(once_s: f64, budget_s: f64) -> usize {
    ((budget_s / once_s.max(1e-7)) as usize).clamp(3, 2000)
}

/// Both ways of planning one batch, timed: host wall per call, device time per call.
fn time_plans(rt: &Runtime, layer: &NsaLayer<'_>, b: &Batch, rows: &mut Vec<PlanRow>) -> Result<()> {
    let stream = rt.gpu().stream().clone();
    let model = layer.config().model.clone();
    let d = dispatch(rt, &model, &b.seq);
    let builder = MetadataBuilder::new(b.params())?;
    let table = ReqToToken::new(&b.table, b.context)?;
    let reqs = Requests { req_pool_indices: &b.pool, seq_lens: &b.seq };
    let mut md = builder.decode(&table, reqs)?;
    let t = Instant::now();
    drop(layer.plan(&md, &d)?);
    let iters = iterations(t.elapsed().as_secs_f64(), 0.5);
    let host = time_launches(&stream, iters, || {
        builder.decode_into(&mut md, &table, reqs)?;
        drop(layer.plan(&md, &d)?);
        Ok(())
    })?;
    let (device, replay) = b.on_device(rt, |state, batch, lens| {
        let device = time_launches(&stream, 200, || {
            drop(layer.plan_on_device(state, batch, lens, &d)?);
            Ok(())
        })?;
        // The metadata launch alone: what the plan adds to it is the decisions.
        Ok((device, time_launches(&stream, 200, || state.replay_decode(rt, &batch.reqs))?))
    })?;
    println!(
        "plan, metadata launch alone, bs {:>5}, context {:>6}: {:>10.2} µs host, {:>10.2} µs device",
        b.bs, b.context, replay.host_us, replay.gpu_us
    );
    for (metadata, t) in [("host", host), ("device", device)] {
        println!(
            "plan, {metadata:>6} metadata, bs {:>5}, context {:>6}: {:>10.2} µs host, {:>10.2} µs device",
            b.bs, b.context, t.host_us, t.gpu_us
        );
        rows.push(PlanRow { metadata, bs: b.bs, context: b.context, host_us: t.host_us, gpu_us: t.gpu_us });
    }
    Ok(())
}

/// `n` bytes: a random block of `block` bytes (from `fill`) tiled on the device.
fn tiled(stream: &Arc<CudaStream>, n: usize, block: Vec<u8>) -> Result<CudaSlice<u8>> {
    let src = upload(stream, &block)?;
    let mut dst = stream.alloc_zeros::<u8>(n).map_err(Error::driver("allocating a cache"))?;
    let mut at = 0;
    while at < n {
        let len = block.len().min(n - at);
        stream
            .memcpy_dtod(&src.slice(..len), &mut dst.slice_mut(at..at + len))
            .map_err(Error::driver("filling a cache"))?;
        at += len;
    }
    Ok(dst)
}

/// Whole eager decode steps (plan + forward) at `b`'s batch, both ways.
fn time_steps(rt: &Runtime, layer: &NsaLayer<'_>, b: &Batch, rows: &mut Vec<StepRow>) -> Result<()> {
    let stream = rt.gpu().stream().clone();
    let model = layer.config().model.clone();
    let mut rng = testdata::rng(11);
    let slots = b.bs * b.context;
    // 64K distinct FP8 records and index-K pages, tiled over the pool.
    let records = 65_536usize;
    let mut rec = vec![0u8; records * FP8_TOKEN_BYTES];
    for r in rec.chunks_mut(FP8_TOKEN_BYTES) {
        r[..KV_LORA_RANK].iter_mut().for_each(|x| *x = rng.random::<u8>() & 0x77);
        for t in 0..FP8_SCALE_TILES {
            r[FP8_SCALES_OFFSET + 4 * t..][..4].copy_from_slice(&rng.random_range(0.002f32..0.02).to_le_bytes());
        }
        for e in 0..ROPE_DIM {
            let v = bf16::from_f32(rng.random_range(-1.0..1.0)).to_bits().to_le_bytes();
            r[FP8_ROPE_OFFSET + 2 * e..][..2].copy_from_slice(&v);
        }
    }
    let mut kv = tiled(&stream, slots * FP8_TOKEN_BYTES, rec)?;
    let mut page = vec![0u8; records / INDEXER_PAGE_TOKENS * INDEXER_PAGE_BYTES];
    for p in page.chunks_mut(INDEXER_PAGE_BYTES) {
        let (keys, scales) = p.split_at_mut(INDEXER_PAGE_TOKENS * INDEXER_HEAD_DIM);
        keys.iter_mut().for_each(|x| *x = rng.random::<u8>() & 0x77);
        for s in scales.chunks_mut(4) {
            s.copy_from_slice(&rng.random_range(0.01f32..0.1).to_le_bytes());
        }
    }
    let mut index = tiled(&stream, slots.div_ceil(INDEXER_PAGE_TOKENS) * INDEXER_PAGE_BYTES, page)?;
    let (t, heads, ih) = (b.bs, model.num_q_heads as usize, model.index_n_heads as usize);
    let q: Vec<bf16> = (0..t * heads * BF16_TOKEN_ELEMS).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect();
    let q = upload(&stream, &q)?;
    let latent = upload(&stream, &testdata::mla_rows(t, rng.random()))?;
    let loc: Vec<i32> = (0..t).map(|i| b.table[i * b.context + b.seq[i] as usize - 1]).collect();
    let loc = upload(&stream, &loc)?;
    let index_q: Vec<u8> = (0..t * ih * INDEXER_HEAD_DIM).map(|_| rng.random::<u8>() & 0x77).collect();
    let index_q = upload(&stream, &index_q)?;
    let weights: Vec<f32> = (0..t * ih).map(|_| rng.random_range(-0.02f32..0.05)).collect();
    let weights = upload(&stream, &weights)?;
    let index_k = upload(&stream, &testdata::indexer_rows(t, rng.random()))?;
    let mut out = stream.alloc_zeros::<bf16>(t * heads * KV_LORA_RANK).map_err(Error::driver("allocating out"))?;
    let mut lse = stream.alloc_zeros::<f32>(t * heads).map_err(Error::driver("allocating lse"))?;
    let mut forward = |plan: &StepPlan<'_>, ws: &mut LayerWorkspace| -> Result<()> {
        let rows =
            |w: usize, off: usize| Rows { data: latent.slice(off..), count: t, width: w, stride: BF16_TOKEN_ELEMS };
        let inputs = LayerInputs {
            q: q.slice(..),
            k_nope: rows(KV_LORA_RANK, 0),
            k_rope: rows(ROPE_DIM, KV_LORA_RANK),
            out_cache_loc: loc.slice(..),
            index_q: index_q.slice(..),
            index_weights: weights.slice(..),
            index_k: Rows { data: index_k.slice(..), count: t, width: INDEXER_HEAD_DIM, stride: INDEXER_HEAD_DIM },
        };
        let mut caches = LayerCaches { kv: MlaCacheMut::Fp8(kv.slice_mut(..)), index_k: index.slice_mut(..) };
        let outputs = LayerOutputs { out: &mut out.slice_mut(..), lse: &mut lse.slice_mut(..) };
        layer.forward(plan, &inputs, &mut caches, ws, outputs)
    };
    let d = dispatch(rt, &model, &b.seq);
    let builder = MetadataBuilder::new(b.params())?;
    let table = ReqToToken::new(&b.table, b.context)?;
    let reqs = Requests { req_pool_indices: &b.pool, seq_lens: &b.seq };
    let mut md = builder.decode(&table, reqs)?;
    let steps = 30;
    let wall = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        for _ in 0..3 {
            f()?;
        }
        stream.synchronize().map_err(Error::driver("waiting for the steps"))?;
        let start = Instant::now();
        for _ in 0..steps {
            f()?;
        }
        stream.synchronize().map_err(Error::driver("waiting for the steps"))?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / steps as f64)
    };
    let mut ws = LayerWorkspace::new(rt, layer.plan(&md, &d)?.needs())?;
    let host = wall(&mut || {
        builder.decode_into(&mut md, &table, reqs)?;
        let plan = layer.plan(&md, &d)?;
        forward(&plan, &mut ws)
    })?;
    let device = b.on_device(rt, |state, batch, lens| {
        let needs = layer.plan_on_device(state, batch, lens, &d)?.needs();
        let mut ws = LayerWorkspace::new(rt, needs)?;
        wall(&mut || {
            let plan = layer.plan_on_device(state, batch, lens, &d)?;
            forward(&plan, &mut ws)
        })
    })?;
    for (metadata, step_us) in [("host", host), ("device", device)] {
        println!("eager decode step, {metadata:>6} metadata, bs {}, context {}: {step_us:>10.2} µs", b.bs, b.context);
        rows.push(StepRow { metadata, bs: b.bs, context: b.context, step_us });
    }
    Ok(())
}

/// The plan table (every batch size and context), then whole steps at bs 128.
pub fn plan_bench(rt: &Runtime) -> Result<(Vec<PlanRow>, Vec<StepRow>)> {
    let model = NsaConfig::preset("deepseek-v3.2")?;
    let layer = NsaLayer::new(rt, LayerConfig::new(model)?)?;
    let stream = rt.gpu().stream().clone();
    let mut rng = testdata::rng(5);
    let (mut plans, mut steps) = (Vec::new(), Vec::new());
    for context in [16_384usize, 131_072] {
        for bs in [1usize, 32, 256, 1024] {
            let b = Batch::new(&stream, bs, context, &mut rng)?;
            time_plans(rt, &layer, &b, &mut plans)?;
        }
        let b = Batch::new(&stream, 128, context, &mut rng)?;
        time_steps(rt, &layer, &b, &mut steps)?;
    }
    Ok((plans, steps))
}
