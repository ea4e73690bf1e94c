//! A Rust server's step loop around one NSA layer, through nsa's public API only.
//!
//! The server owns everything a real one owns, allocated with cudarc on its own
//! stream: the FP8 KV pool and the indexer K pool, the `req_to_token` page table
//! (on the device only: nsa never sees a host copy), the per-step activations
//! (here random; in a model, the projections' outputs), the lengths. nsa gets a
//! [`Runtime`] on that stream and views of those buffers.
//!
//! The loop admits requests of different lengths, prefills them in chunks (eager
//! extend steps whose metadata one kernel builds from the device tables), decodes
//! with one CUDA graph per batch size (the metadata launch and the layer captured
//! together), and between steps retires finished requests and admits new ones.
//! After every step the [`oracle`] checks sampled rows against the CPU reference.
//!
//! Candle: a `candle_core::CudaStorage` holds a cudarc 0.19 `CudaSlice<T>` on the
//! device's `Arc<CudaStream>`. Build the runtime with `Gpu::on_stream(stream)` from
//! that stream, and pass `slice.slice(..)` / `slice.slice_mut(..)` of each tensor
//! (contiguous, row-major, in the shapes of [`LayerInputs`]) where this loop passes
//! its own buffers; a raw `CUdeviceptr` enters through
//! `nsa_runtime::foreign::ForeignBuffer`.

pub mod oracle;

use cudarc::driver::{CudaContext, CudaGraph, CudaSlice, CudaStream, CudaView};
use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::{KvCacheFormat, NsaConfig};
use nsa_runtime::device::Gpu;
use nsa_runtime::layer::{
    AttentionStage, DeviceBatch, HostLens, LayerCaches, LayerConfig, LayerInputs, LayerOutputs, LayerWorkspace,
    NsaLayer, StepPlan,
};
use nsa_runtime::metadata::extend_device::{DeviceExtendState, ExtendCapacity};
use nsa_runtime::metadata::graph_device::{DeviceGraphState, DeviceRequests};
use nsa_runtime::metadata::{
    decide, BatchSummary, DispatchPolicy, ForwardMode, GraphCapacity, GraphMode, MetadataParams, PrefillBackend,
};
use nsa_runtime::ops::kv_cache::MlaCacheMut;
use nsa_runtime::ops::Rows;
use nsa_runtime::verify::Check;
use nsa_runtime::{Error, Result, Runtime};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

const PAGE: usize = 64;

/// What the loop serves and how long it runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Query heads per GPU (DeepSeek V3.2 at TP8: 16).
    pub heads: u32,
    /// Requests in flight at most (rows of `req_to_token`).
    pub max_requests: usize,
    /// Longest request, in tokens (the width of `req_to_token`).
    pub max_context: usize,
    /// Query tokens per prefill step (the chunked-prefill budget).
    pub chunk_tokens: usize,
    /// Prompt length of each request, in admission order.
    pub prompts: Vec<usize>,
    /// Requests running from the start; the rest wait for a free row.
    pub initial: usize,
    /// Tokens each request decodes before it retires.
    pub decode_tokens: Vec<usize>,
    /// Decode steps to run.
    pub decode_steps: usize,
    /// Rows per step checked against the CPU reference.
    pub check_rows: usize,
    pub seed: u64,
}

impl Default for Options {
    /// Four requests: three at the start (one longer than top-k, one shorter, one
    /// crossing top-k while it decodes), a fourth admitted when the second retires
    /// and retiring before the end, so decode runs at two batch sizes.
    fn default() -> Self {
        Options {
            heads: 16,
            max_requests: 3,
            max_context: 4096,
            chunk_tokens: 1024,
            prompts: vec![2600, 700, 2030, 1800],
            initial: 3,
            decode_tokens: vec![32, 9, 32, 12],
            decode_steps: 32,
            check_rows: 3,
            seed: 2026,
        }
    }
}

/// What a run did and what the oracle found.
#[derive(Debug, Default)]
pub struct Report {
    pub prefill_steps: usize,
    pub decode_steps: usize,
    /// CUDA graphs captured (one per decode batch size met).
    pub graphs: usize,
    pub admitted: usize,
    pub retired: usize,
    pub checks: Vec<Check>,
}

/// One request: its row of `req_to_token`, its pages, its length so far.
#[derive(Debug)]
struct Request {
    row: usize,
    prompt: usize,
    /// Tokens in the KV cache.
    len: usize,
    /// Retire at this length.
    end: usize,
    pages: Vec<i32>,
}

impl Request {
    fn slot(&self, pos: usize) -> i32 {
        self.pages[pos / PAGE] * PAGE as i32 + (pos % PAGE) as i32
    }
}

/// The server's device buffers (a model's tensors), allocated once.
#[derive(Debug)]
struct Buffers {
    q: CudaSlice<bf16>,
    latent: CudaSlice<bf16>,
    loc: CudaSlice<i32>,
    index_q: CudaSlice<u8>,
    weights: CudaSlice<f32>,
    index_k: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
    lse: CudaSlice<f32>,
    kv: CudaSlice<u8>,
    index_cache: CudaSlice<u8>,
    req_to_token: CudaSlice<i32>,
    seq_lens: CudaSlice<i32>,
    extend_lens: CudaSlice<i32>,
    req_pool_indices: CudaSlice<i32>,
}

/// One step's activations on the host (the model's outputs for the step's tokens).
#[derive(Debug, Default)]
pub struct StepActivations {
    pub q: Vec<bf16>,
    pub latent: Vec<bf16>,
    pub index_q: Vec<u8>,
    pub weights: Vec<f32>,
    pub index_k: Vec<bf16>,
    /// Slots of the step's new tokens.
    pub loc: Vec<i32>,
}

fn driver(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    Error::driver(what)
}

fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>> {
    stream.alloc_zeros::<T>(n.max(1)).map_err(driver("allocating a server buffer"))
}

/// Runs the loop on GPU 0 and returns what the oracle found.
pub fn run(opts: &Options) -> Result<Report> {
    let ctx = CudaContext::new(0).map_err(driver("opening GPU 0"))?;
    // Every buffer is used on one stream, so cudarc's cross-stream events are not
    // needed; with them, each launch would record an event, which CUDA-graph
    // capture rejects.
    // SAFETY: no buffer of this context exists yet; all work goes to `stream`.
    unsafe { ctx.disable_event_tracking() };
    // The server's own stream: every nsa launch goes there, nothing else syncs it.
    let stream = ctx.new_stream().map_err(driver("creating the server's stream"))?;
    let rt = Runtime::on_gpu(Gpu::on_stream(stream.clone())?)?;
    Server::new(&rt, opts)?.serve()
}

struct Server<'rt> {
    rt: &'rt Runtime,
    opts: Options,
    layer: NsaLayer<'rt>,
    model: NsaConfig,
    bufs: Buffers,
    oracle: oracle::Oracle,
    free_pages: Vec<i32>,
    free_rows: Vec<usize>,
    waiting: VecDeque<usize>,
    running: Vec<Request>,
    rng: StdRng,
    report: Report,
}

impl<'rt> Server<'rt> {
    fn new(rt: &'rt Runtime, opts: &Options) -> Result<Self> {
        let mut model = NsaConfig::preset("deepseek-v3.2")?;
        model.num_q_heads = opts.heads;
        model.kv_cache = KvCacheFormat::Fp8;
        // Compiles (or loads) every kernel the layer runs, before the first step.
        let layer = NsaLayer::new(rt, LayerConfig::new(model.clone())?)?;
        let stream = rt.gpu().stream();
        let (heads, ih) = (opts.heads as usize, model.index_n_heads as usize);
        let rows = opts.chunk_tokens.max(opts.max_requests);
        // Page 0 is the pool's dummy page; each request row can fill its width.
        let pages = 1 + opts.max_requests * opts.max_context.div_ceil(PAGE);
        let slots = pages * PAGE;
        let bufs = Buffers {
            q: alloc(stream, rows * heads * BF16_TOKEN_ELEMS)?,
            latent: alloc(stream, rows * BF16_TOKEN_ELEMS)?,
            loc: alloc(stream, rows)?,
            index_q: alloc(stream, rows * ih * INDEXER_HEAD_DIM)?,
            weights: alloc(stream, rows * ih)?,
            index_k: alloc(stream, rows * INDEXER_HEAD_DIM)?,
            out: alloc(stream, rows * heads * KV_LORA_RANK)?,
            lse: alloc(stream, rows * heads)?,
            kv: alloc(stream, slots * FP8_TOKEN_BYTES)?,
            index_cache: alloc(stream, pages * INDEXER_PAGE_BYTES)?,
            req_to_token: alloc(stream, opts.max_requests * opts.max_context)?,
            seq_lens: alloc(stream, opts.max_requests)?,
            extend_lens: alloc(stream, opts.max_requests)?,
            req_pool_indices: alloc(stream, opts.max_requests)?,
        };
        let oracle = oracle::Oracle::new(rt, &model, slots);
        Ok(Server {
            rt,
            opts: opts.clone(),
            layer,
            model,
            bufs,
            oracle,
            free_pages: (1..pages as i32).rev().collect(),
            free_rows: (0..opts.max_requests).rev().collect(),
            waiting: (0..opts.prompts.len()).collect(),
            running: Vec::new(),
            rng: StdRng::seed_from_u64(opts.seed),
            report: Report::default(),
        })
    }

    fn params(&self) -> MetadataParams {
        MetadataParams::from_config(&self.model, self.bufs.kv.len() / FP8_TOKEN_BYTES)
    }

    fn policy(&self) -> DispatchPolicy {
        DispatchPolicy {
            compute_capability: self.rt.gpu().caps().compute_capability,
            kv_cache: self.model.kv_cache,
            prefill_backend: PrefillBackend::Auto,
            topk: self.model.topk,
            max_chunk_capacity: usize::MAX,
            cp_enabled: false,
            // Short prompts would take the dense MHA path, which the model runs.
            force_mla: true,
        }
    }

    /// Admits waiting requests while rows are free: pages from the pool, their
    /// slots written into the request's row of the device page table.
    fn admit(&mut self) -> Result<()> {
        while !self.free_rows.is_empty() && (self.report.admitted < self.opts.initial || !self.running.is_empty()) {
            let Some(id) = self.waiting.pop_front() else { break };
            let end = self.opts.prompts[id] + self.opts.decode_tokens[id];
            if end > self.opts.max_context {
                return Err(Error::Other(format!("request {id}: {end} tokens, past max_context")));
            }
            let row = self.free_rows.pop().expect("a free row");
            let npages = end.div_ceil(PAGE);
            if self.free_pages.len() < npages {
                return Err(Error::Other(format!("request {id}: the pool has no {npages} free pages")));
            }
            let pages: Vec<i32> = (0..npages).map(|_| self.free_pages.pop().expect("checked")).collect();
            let req = Request { row, prompt: self.opts.prompts[id], len: 0, end, pages };
            let row_slots: Vec<i32> = (0..end).map(|p| req.slot(p)).collect();
            let w = self.opts.max_context;
            let stream = self.rt.gpu().stream();
            stream
                .memcpy_htod(&row_slots, &mut self.bufs.req_to_token.slice_mut(row * w..row * w + end))
                .map_err(driver("writing a page-table row"))?;
            self.running.push(req);
            self.report.admitted += 1;
        }
        Ok(())
    }

    /// Retires finished requests: their pages and rows go back to the pool.
    fn retire(&mut self) {
        let (done, keep): (Vec<Request>, Vec<Request>) = self.running.drain(..).partition(|r| r.len >= r.end);
        self.running = keep;
        for r in done {
            self.free_pages.extend(r.pages);
            self.free_rows.push(r.row);
            self.report.retired += 1;
        }
    }

    fn serve(mut self) -> Result<Report> {
        let mut graphs: HashMap<usize, (CudaGraph, LayerWorkspace, AttentionStage)> = HashMap::new();
        let mut decode_state = DeviceGraphState::new(
            self.rt,
            self.params(),
            GraphMode::Decode,
            GraphCapacity {
                max_bs: self.opts.max_requests,
                max_tokens: self.opts.max_requests,
                max_context_len: self.opts.max_context,
            },
        )?;
        let mut extend_state = DeviceExtendState::new(
            self.rt,
            self.params(),
            ExtendCapacity {
                max_bs: self.opts.max_requests,
                max_tokens: self.opts.chunk_tokens,
                max_keys: self.opts.max_requests * self.opts.max_context,
                max_context_len: self.opts.max_context,
            },
        )?;
        self.admit()?;
        while self.report.decode_steps < self.opts.decode_steps && !self.running.is_empty() {
            if self.running.iter().any(|r| r.len < r.prompt) {
                self.prefill_step(&mut extend_state)?;
            } else {
                self.decode_step(&mut decode_state, &mut graphs)?;
                self.retire();
                self.admit()?;
            }
        }
        self.report.graphs = graphs.len();
        Ok(self.report)
    }

    /// Random activations for `tokens` (request index, position) (the model's part).
    fn activations(&mut self, tokens: &[(usize, usize)]) -> StepActivations {
        let (heads, ih) = (self.opts.heads as usize, self.model.index_n_heads as usize);
        let rng = &mut self.rng;
        let n = tokens.len();
        let mut bf = |count: usize, amp: f32| -> Vec<bf16> {
            (0..count).map(|_| bf16::from_f32(rng.random_range(-amp..amp))).collect()
        };
        let q = bf(n * heads * BF16_TOKEN_ELEMS, 1.0);
        let latent = bf(n * BF16_TOKEN_ELEMS, 2.0);
        let index_k = bf(n * INDEXER_HEAD_DIM, 1.0);
        let index_q = (0..n * ih * INDEXER_HEAD_DIM).map(|_| self.rng.random::<u8>() & 0x77).collect();
        let weights = (0..n * ih).map(|_| self.rng.random_range(-0.02f32..0.05)).collect();
        let loc = tokens.iter().map(|&(i, p)| self.running[i].slot(p)).collect();
        StepActivations { q, latent, index_q, weights, index_k, loc }
    }

    /// Writes the step's activations and lengths into the server's buffers.
    fn upload(&mut self, a: &StepActivations, seq: &[i32], ext: &[i32], rpi: &[i32]) -> Result<()> {
        let stream = self.rt.gpu().stream();
        let b = &mut self.bufs;
        let e = || driver("writing step inputs");
        stream.memcpy_htod(&a.q, &mut b.q.slice_mut(..a.q.len())).map_err(e())?;
        stream.memcpy_htod(&a.latent, &mut b.latent.slice_mut(..a.latent.len())).map_err(e())?;
        stream.memcpy_htod(&a.loc, &mut b.loc.slice_mut(..a.loc.len())).map_err(e())?;
        stream.memcpy_htod(&a.index_q, &mut b.index_q.slice_mut(..a.index_q.len())).map_err(e())?;
        stream.memcpy_htod(&a.weights, &mut b.weights.slice_mut(..a.weights.len())).map_err(e())?;
        stream.memcpy_htod(&a.index_k, &mut b.index_k.slice_mut(..a.index_k.len())).map_err(e())?;
        stream.memcpy_htod(seq, &mut b.seq_lens.slice_mut(..seq.len())).map_err(e())?;
        stream.memcpy_htod(ext, &mut b.extend_lens.slice_mut(..ext.len())).map_err(e())?;
        stream.memcpy_htod(rpi, &mut b.req_pool_indices.slice_mut(..rpi.len())).map_err(e())?;
        Ok(())
    }

    /// One chunked-prefill step: up to `chunk_tokens` prompt tokens of the requests
    /// still prefilling, eagerly, metadata built on the device.
    fn prefill_step(&mut self, state: &mut DeviceExtendState) -> Result<()> {
        let mut budget = self.opts.chunk_tokens;
        let (mut members, mut tokens) = (Vec::new(), Vec::new());
        for (i, r) in self.running.iter().enumerate() {
            if r.len < r.prompt && budget > 0 {
                let n = (r.prompt - r.len).min(budget);
                budget -= n;
                members.push((i, n));
                tokens.extend((r.len..r.len + n).map(|p| (i, p)));
            }
        }
        let seq: Vec<i32> = members.iter().map(|&(i, n)| (self.running[i].len + n) as i32).collect();
        let ext: Vec<i32> = members.iter().map(|&(_, n)| n as i32).collect();
        let rpi: Vec<i32> = members.iter().map(|&(i, _)| self.running[i].row as i32).collect();
        let acts = self.activations(&tokens);
        self.upload(&acts, &seq, &ext, &rpi)?;
        let summary = BatchSummary { mode: ForwardMode::Extend, seq_lens: &seq, extend_num_tokens: tokens.len() };
        let dispatch = decide(&self.policy(), Some(&summary));
        let bs = members.len();
        let (t, rows) = (tokens.len(), self.views(bs));
        let batch = DeviceBatch {
            reqs: DeviceRequests {
                req_to_token: &rows.0,
                req_to_token_width: self.opts.max_context,
                req_pool_indices: &rows.1,
                seq_lens: &rows.2,
            },
            extend_lens: Some(&rows.3),
        };
        let host = HostLens { seq_lens: &seq, extend_lens: Some(&ext) };
        let plan = self.layer.plan_extend_on_device(state, &batch, host, &dispatch)?;
        let mut ws = LayerWorkspace::new(self.rt, plan.needs())?;
        forward(&self.layer, &mut self.bufs, &plan, &mut ws, t, self.opts.heads as usize)?;
        let stage = plan.decisions().attention.clone();
        drop(plan);
        for &(i, n) in &members {
            self.running[i].len += n;
        }
        self.report.prefill_steps += 1;
        let what = format!("prefill step {} ({bs} requests, {t} tokens)", self.report.prefill_steps);
        self.check(&what, &tokens, &acts, &ws, &stage)
    }

    /// One decode step: a token per running request, through the CUDA graph of this
    /// batch size (captured on first use: the metadata launch and the layer).
    fn decode_step(
        &mut self,
        state: &mut DeviceGraphState,
        graphs: &mut HashMap<usize, (CudaGraph, LayerWorkspace, AttentionStage)>,
    ) -> Result<()> {
        let bs = self.running.len();
        let tokens: Vec<(usize, usize)> = (0..bs).map(|i| (i, self.running[i].len)).collect();
        let seq: Vec<i32> = self.running.iter().map(|r| (r.len + 1) as i32).collect();
        let rpi: Vec<i32> = self.running.iter().map(|r| r.row as i32).collect();
        let acts = self.activations(&tokens);
        self.upload(&acts, &seq, &[], &rpi)?;
        if let std::collections::hash_map::Entry::Vacant(slot) = graphs.entry(bs) {
            slot.insert(self.capture_decode(state, bs)?);
        }
        let (graph, ws, stage) = &graphs[&bs];
        graph.launch().map_err(driver("launching a decode graph"))?;
        for r in &mut self.running {
            r.len += 1;
        }
        self.report.decode_steps += 1;
        let what = format!("decode step {} (bs {bs}, graph)", self.report.decode_steps);
        self.check(&what, &tokens, &acts, ws, stage)
    }

    /// Captures one decode step of `bs` requests on the server's stream: the
    /// metadata launch (reading the device lengths and page table at their fixed
    /// addresses) and the layer's forward.
    fn capture_decode(
        &mut self,
        state: &mut DeviceGraphState,
        bs: usize,
    ) -> Result<(CudaGraph, LayerWorkspace, AttentionStage)> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        let (needs, stage) = {
            let plan = self.layer.plan_for_graph(state, bs, 0)?;
            (plan.needs(), plan.decisions().attention.clone())
        };
        let mut ws = LayerWorkspace::new(self.rt, needs)?;
        let stream = self.rt.gpu().stream().clone();
        stream.synchronize().map_err(driver("waiting before a capture"))?;
        let (table, rpi, seq, _) = self.views(bs);
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver("beginning a capture"))?;
        let reqs = DeviceRequests {
            req_to_token: &table,
            req_to_token_width: self.opts.max_context,
            req_pool_indices: &rpi,
            seq_lens: &seq,
        };
        let captured = state.replay_decode(self.rt, &reqs).and_then(|()| {
            let plan = self.layer.plan_for_graph(state, bs, 0)?;
            forward(&self.layer, &mut self.bufs, &plan, &mut ws, bs, self.opts.heads as usize)
        });
        let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(driver("ending a capture"))?;
        captured?;
        let graph = graph.ok_or_else(|| Error::Other("the captured decode step is empty".into()))?;
        Ok((graph, ws, stage))
    }

    /// Device views of the page table and of the first `bs` row indices, lengths
    /// and query lengths.
    fn views(&self, bs: usize) -> (CudaView<'_, i32>, CudaView<'_, i32>, CudaView<'_, i32>, CudaView<'_, i32>) {
        let b = &self.bufs;
        (b.req_to_token.slice(..), b.req_pool_indices.slice(..bs), b.seq_lens.slice(..bs), b.extend_lens.slice(..bs))
    }

    fn check(
        &mut self,
        what: &str,
        tokens: &[(usize, usize)],
        acts: &StepActivations,
        ws: &LayerWorkspace,
        stage: &AttentionStage,
    ) -> Result<()> {
        // Causal: the token at position p sees its request's positions 0..=p.
        let rows: Vec<oracle::Row> = tokens
            .iter()
            .map(|&(i, p)| oracle::Row { slots: (0..=p).map(|q| self.running[i].slot(q)).collect() })
            .collect();
        let gpu = oracle::GpuStep { out: &self.bufs.out, lse: &self.bufs.lse, ws, stage };
        let checks = self.oracle.step(self.rt, what, &rows, acts, &gpu, self.opts.check_rows)?;
        self.report.checks.extend(checks);
        Ok(())
    }
}

/// The layer's forward over the first `t` rows of the server's buffers.
fn forward(
    layer: &NsaLayer<'_>,
    b: &mut Buffers,
    plan: &StepPlan<'_>,
    ws: &mut LayerWorkspace,
    t: usize,
    heads: usize,
) -> Result<()> {
    let ih = layer.config().model.index_n_heads as usize;
    let inputs = LayerInputs {
        q: b.q.slice(..t * heads * BF16_TOKEN_ELEMS),
        k_nope: Rows { data: b.latent.slice(..), count: t, width: KV_LORA_RANK, stride: BF16_TOKEN_ELEMS },
        k_rope: Rows { data: b.latent.slice(KV_LORA_RANK..), count: t, width: ROPE_DIM, stride: BF16_TOKEN_ELEMS },
        out_cache_loc: b.loc.slice(..t),
        index_q: b.index_q.slice(..t * ih * INDEXER_HEAD_DIM),
        index_weights: b.weights.slice(..t * ih),
        index_k: Rows { data: b.index_k.slice(..), count: t, width: INDEXER_HEAD_DIM, stride: INDEXER_HEAD_DIM },
    };
    let mut caches = LayerCaches { kv: MlaCacheMut::Fp8(b.kv.slice_mut(..)), index_k: b.index_cache.slice_mut(..) };
    let outputs =
        LayerOutputs { out: &mut b.out.slice_mut(..t * heads * KV_LORA_RANK), lse: &mut b.lse.slice_mut(..t * heads) };
    layer.forward(plan, &inputs, &mut caches, ws, outputs)
}
