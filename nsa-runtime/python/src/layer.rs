//! `nsa.Layer`: one NSA attention layer configuration on one device, run over
//! DLPack tensors as a server runs it: a plan per step (eager, or a CUDA graph's
//! with its metadata replay), then `forward` per layer, every launch on the
//! caller's stream.

use crate::config::Config;
use crate::device::{launch_stream, runtime, RestoreContext};
use crate::error::IntoPy;
use crate::mha::{check_caches, check_new_tokens, int_vector, rows, CacheBuffers, MhaAttend, MhaStore};
use crate::plan::{ExtendHeldTryBuilder, GraphBuffers, GraphHeldTryBuilder, Held, Plan, Pools};
use crate::tensor::{import, import_opt, same_device, DType, Tensor};
use half::bf16;
use nsa_runtime::kernels::layout::{BF16_TOKEN_ELEMS, INDEXER_HEAD_DIM, KV_LORA_RANK, ROPE_DIM};
use nsa_runtime::kernels::KvCacheFormat;
use nsa_runtime::layer::{
    DeviceBatch, HostLens, LayerConfig, LayerInputs, LayerOutputs, LayerWorkspace, MhaPlan, NsaLayer, StepPlan,
};
use nsa_runtime::metadata::extend_device::{DeviceExtendState, ExtendCapacity};
use nsa_runtime::metadata::graph_device::{DeviceGraphState, DeviceRequests};
use nsa_runtime::metadata::{
    decide, AttnImpl, BatchSummary, DispatchPolicy, ForwardMode, GraphCapacity, GraphMode, MetadataParams,
    PrefillBackend,
};
use nsa_runtime::Runtime;
use ouroboros::self_referencing;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The layer checked (kernels compiled or loaded) on the runtime it was made on;
/// calls rebind it to the runtime of their stream.
#[self_referencing]
struct Checked {
    rt: Arc<Runtime>,
    #[borrows(rt)]
    #[covariant]
    layer: NsaLayer<'this>,
}

impl std::fmt::Debug for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.with_layer(|l| l.fmt(f))
    }
}

/// What the layer's metadata states are sized for.
#[derive(Clone, Copy, Debug)]
struct Limits {
    max_bs: usize,
    max_tokens: usize,
    max_keys: usize,
    max_context_len: usize,
}

#[pyclass(frozen, module = "nsa._nsa")]
#[derive(Debug)]
pub struct Layer {
    checked: Checked,
    device: i32,
    params: MetadataParams,
    policy: DispatchPolicy,
    limits: Limits,
    pools: Arc<Pools>,
    /// Shared by eager plans (grown to the largest step; graphs own theirs).
    workspace: Mutex<Option<LayerWorkspace>>,
    id: usize,
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

fn positive(name: &str, v: usize, what: &str) -> PyResult<usize> {
    if v == 0 {
        return Err(PyValueError::new_err(format!("`{name}`: 0, expected ≥ 1 ({what})")));
    }
    Ok(v)
}

fn prefill_backend(name: &str, heads: u32) -> PyResult<PrefillBackend> {
    Ok(match name {
        "auto" | "flashmla_auto" => PrefillBackend::Auto,
        "flashmla_sparse" => PrefillBackend::Fixed(AttnImpl::FlashMlaSparse),
        "flashmla_kv" => PrefillBackend::Fixed(AttnImpl::FlashMlaKv),
        "cost" => PrefillBackend::Cost { heads },
        other => {
            return Err(PyValueError::new_err(format!(
                "`prefill_backend`: {other:?}, expected \"auto\", \"cost\" (nsa's kernel costs decide per FP8 \
                 extend batch), \"flashmla_sparse\" (FP8 extend dequantizes and runs the prefill kernel) or \
                 \"flashmla_kv\" (FP8 extend reads the cache with the decode kernel)"
            )))
        }
    })
}

fn graph_mode(mode: &str) -> PyResult<Option<GraphMode>> {
    Ok(Some(match mode {
        "decode" => GraphMode::Decode,
        "target_verify" => GraphMode::TargetVerify,
        "draft_extend" => GraphMode::DraftExtend,
        "draft_extend_v2" => GraphMode::DraftExtendV2,
        "extend" => return Ok(None),
        other => {
            return Err(PyValueError::new_err(format!(
                "`mode`: {other:?}, expected \"decode\", \"target_verify\", \"draft_extend\", \"draft_extend_v2\" \
                 or \"extend\""
            )))
        }
    }))
}

fn forward_mode(mode: GraphMode) -> ForwardMode {
    match mode {
        GraphMode::Decode => ForwardMode::Decode,
        GraphMode::TargetVerify => ForwardMode::TargetVerify,
        GraphMode::DraftExtend => ForwardMode::DraftExtend,
        GraphMode::DraftExtendV2 => ForwardMode::DraftExtendV2,
    }
}

/// The server's device tables of a step.
struct Tables {
    table: Tensor,
    rows: Tensor,
    lens: Tensor,
    extend: Option<Tensor>,
}

impl Tables {
    fn import(
        req_to_token: &Bound<'_, PyAny>,
        req_pool_indices: &Bound<'_, PyAny>,
        seq_lens: &Bound<'_, PyAny>,
        extend_lens: Option<&Bound<'_, PyAny>>,
        bs: Option<usize>,
        stream: Option<usize>,
    ) -> PyResult<Self> {
        let table = import("req_to_token", req_to_token, stream)?;
        table.dtype_in(&[DType::I32])?;
        table.ndim(2, "(requests, max_context_len)")?;
        table.contiguous()?;
        let lens = import("seq_lens", seq_lens, stream)?;
        let bs = bs.unwrap_or(lens.shape.first().copied().unwrap_or(0));
        int_vector(&lens, bs, "one length per request")?;
        let rows = import("req_pool_indices", req_pool_indices, stream)?;
        int_vector(&rows, bs, "one req_to_token row per request")?;
        let extend = import_opt("extend_lens", extend_lens, stream)?;
        if let Some(e) = &extend {
            int_vector(e, bs, "one query length per request")?;
        }
        Ok(Tables { table, rows, lens, extend })
    }

    fn device(&self, expected: i32) -> PyResult<i32> {
        same_device(expected, [&self.table, &self.rows, &self.lens].into_iter().chain(self.extend.as_ref()))
    }
}

impl Layer {
    /// The runtime of `stream` on this layer's device, with the thread's context
    /// restored when the guard drops.
    fn enter(&self, stream: Option<usize>) -> PyResult<(RestoreContext, Arc<Runtime>)> {
        let restore = RestoreContext::save()?;
        let rt = runtime(self.device, launch_stream(stream)?)?;
        Ok((restore, rt))
    }

    fn on<'a>(&self, rt: &'a Runtime) -> PyResult<NsaLayer<'a>> {
        self.checked.with_layer(|l| l.on_runtime(rt)).py()
    }

    fn new_graph_state(&self, rt: &Runtime, mode: GraphMode) -> PyResult<DeviceGraphState> {
        let l = self.limits;
        let cap = GraphCapacity {
            max_bs: l.max_bs,
            max_tokens: l.max_bs * mode.rows_per_request(self.params.draft_tokens),
            max_context_len: l.max_context_len,
        };
        DeviceGraphState::new(rt, self.params, mode, cap).py()
    }

    fn new_extend_state(&self, rt: &Runtime) -> PyResult<DeviceExtendState> {
        let l = self.limits;
        let cap = ExtendCapacity {
            max_bs: l.max_bs,
            max_tokens: l.max_tokens,
            max_keys: l.max_keys,
            max_context_len: l.max_context_len,
        };
        DeviceExtendState::new(rt, self.params, cap).py()
    }

    /// `plan`'s MHA one-shot plan under one lock (an error for any other plan):
    /// `check` (the call's tensors against it), then `run` on the runtime of `stream`.
    fn run_mha(
        &self,
        plan: &Plan,
        stream: Option<usize>,
        check: impl FnOnce(&MhaPlan) -> PyResult<()>,
        run: impl FnOnce(&Runtime, &NsaLayer<'_>, &MhaPlan) -> PyResult<()>,
    ) -> PyResult<()> {
        let held = plan.lock();
        let mha = match held.as_ref() {
            Some(Held::Mha(mha)) => mha,
            Some(_) => {
                return Err(PyValueError::new_err(format!(
                    "`plan`: a sparse {} plan, expected an MHA one-shot plan (plan.use_mha: an extend step of a \
                     layer made with mha_one_shot=True whose requests all fit in the top-k)",
                    plan.mode
                )))
            }
            None => return Err(PyValueError::new_err("`plan`: released, expected a live plan")),
        };
        check(mha)?;
        let (_restore, rt) = self.enter(stream)?;
        let layer = self.on(&rt)?;
        run(&rt, &layer, mha)
    }

    fn check_plan(&self, plan: &Plan) -> PyResult<()> {
        if plan.layer_id != self.id {
            return Err(PyValueError::new_err(
                "`plan`: made by another Layer, expected a plan of this layer (Layer.plan / Layer.graph_plan)",
            ));
        }
        Ok(())
    }
}

#[pymethods]
impl Layer {
    #[new]
    #[pyo3(signature = (
        config, *, pool_slots, max_bs, max_context_len, max_tokens=None, max_keys=None, draft_tokens=0,
        sm_scale=None, deterministic_topk=false, batch_invariant=false, logits_budget_bytes=1usize << 30,
        prefill_backend="auto", mha_one_shot=false, device=0, stream=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        config: &Config,
        pool_slots: usize,
        max_bs: usize,
        max_context_len: usize,
        max_tokens: Option<usize>,
        max_keys: Option<usize>,
        draft_tokens: u32,
        sm_scale: Option<f32>,
        deterministic_topk: bool,
        batch_invariant: bool,
        logits_budget_bytes: usize,
        prefill_backend: &str,
        mha_one_shot: bool,
        device: i32,
        stream: Option<usize>,
    ) -> PyResult<Self> {
        let model = config.model().clone();
        positive("pool_slots", pool_slots, "slots in the KV pool, dummy page included")?;
        positive("max_bs", max_bs, "requests per step")?;
        positive("max_context_len", max_context_len, "the width of req_to_token")?;
        let max_tokens =
            positive("max_tokens", max_tokens.unwrap_or(max_bs.max(8192)), "query tokens per extend step")?;
        let max_keys = positive("max_keys", max_keys.unwrap_or(max_bs * max_context_len), "KV tokens per extend step")?;
        let backend = self::prefill_backend(prefill_backend, model.num_q_heads)?;
        let mut cfg = LayerConfig::new(model.clone()).py()?;
        if let Some(s) = sm_scale {
            cfg.sm_scale = s;
        }
        cfg.deterministic_topk = deterministic_topk;
        cfg.batch_invariant = batch_invariant;
        cfg.logits_budget_bytes = logits_budget_bytes;
        let mut params = MetadataParams::from_config(&model, pool_slots);
        params.draft_tokens = draft_tokens;
        let stream = launch_stream(stream)?;
        let _restore = RestoreContext::save()?;
        let rt = runtime(device, stream)?;
        let policy = DispatchPolicy {
            compute_capability: rt.gpu().caps().compute_capability,
            kv_cache: model.kv_cache,
            prefill_backend: backend,
            topk: model.topk,
            // An MHA step holds every request's keys at once: at most max_keys.
            max_chunk_capacity: max_keys,
            cp_enabled: false,
            force_mla: !mha_one_shot,
        };
        // Compiling a cold kernel set takes seconds: other Python threads run meanwhile.
        let checked =
            py.detach(|| CheckedTryBuilder { rt, layer_builder: |rt| NsaLayer::new(rt, cfg) }.try_build()).py()?;
        Ok(Layer {
            checked,
            device,
            params,
            policy,
            limits: Limits { max_bs, max_tokens, max_keys, max_context_len },
            pools: Arc::default(),
            workspace: Mutex::new(None),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    #[getter]
    fn device(&self) -> i32 {
        self.device
    }

    /// Query heads of the layer.
    #[getter]
    fn heads(&self) -> u32 {
        self.checked.borrow_layer().config().model.num_q_heads
    }

    /// An eager step's plan: one metadata launch reads the server's device tables
    /// (`req_to_token` `(rows, width)`, `req_pool_indices`, `seq_lens` and, for
    /// extend and draft-extend, `extend_lens`, all int32), and the decisions come
    /// from the host copies of the lengths, which must equal the device ones.
    #[pyo3(signature = (mode, req_to_token, req_pool_indices, seq_lens, seq_lens_cpu, extend_lens=None, extend_lens_cpu=None, *, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        mode: &str,
        req_to_token: &Bound<'_, PyAny>,
        req_pool_indices: &Bound<'_, PyAny>,
        seq_lens: &Bound<'_, PyAny>,
        seq_lens_cpu: Vec<i32>,
        extend_lens: Option<&Bound<'_, PyAny>>,
        extend_lens_cpu: Option<Vec<i32>>,
        stream: Option<usize>,
    ) -> PyResult<Plan> {
        let gm = graph_mode(mode)?;
        let takes_extend = matches!(gm, None | Some(GraphMode::DraftExtend));
        let given = (extend_lens.is_some_and(|e| !e.is_none()), extend_lens_cpu.is_some());
        if given != (takes_extend, takes_extend) {
            let what = if takes_extend {
                "both (the query tokens of each request, on the device and on the host)"
            } else {
                "neither (the mode fixes the query tokens of each request)"
            };
            return Err(PyValueError::new_err(format!(
                "`extend_lens`/`extend_lens_cpu`: {} given for mode {mode:?}, expected {what}",
                match given {
                    (true, true) => "both",
                    (true, false) => "only extend_lens",
                    (false, true) => "only extend_lens_cpu",
                    (false, false) => "neither",
                }
            )));
        }
        let bs = seq_lens_cpu.len();
        let t = Tables::import(req_to_token, req_pool_indices, seq_lens, extend_lens, Some(bs), stream)?;
        t.device(self.device)?;
        if let Some(e) = &extend_lens_cpu {
            if e.len() != bs {
                return Err(PyValueError::new_err(format!(
                    "`extend_lens_cpu`: {} entries, expected {bs} (one per request, as seq_lens_cpu)",
                    e.len()
                )));
            }
        }
        let (_restore, rt) = self.enter(stream)?;
        let layer = self.on(&rt)?;
        let (tb, rb, lb) = (t.table.buffer::<i32>(&rt)?, t.rows.buffer::<i32>(&rt)?, t.lens.buffer::<i32>(&rt)?);
        let eb = t.extend.as_ref().map(|e| e.buffer::<i32>(&rt)).transpose()?;
        let (tv, rv, lv) = (tb.view(), rb.view(), lb.view());
        let ev = eb.as_ref().map(|e| e.view());
        let reqs = DeviceRequests {
            req_to_token: &tv,
            req_to_token_width: t.table.shape[1],
            req_pool_indices: &rv,
            seq_lens: &lv,
        };
        let batch = DeviceBatch { reqs, extend_lens: ev.as_ref() };
        let host = HostLens { seq_lens: &seq_lens_cpu, extend_lens: extend_lens_cpu.as_deref() };
        let fmode = gm.map_or(ForwardMode::Extend, forward_mode);
        let tokens = match (fmode, &extend_lens_cpu) {
            (_, Some(e)) => e.iter().map(|&v| v.max(0) as usize).sum(),
            (ForwardMode::Decode, None) => bs,
            (_, None) => bs * self.params.draft_tokens as usize,
        };
        let summary = BatchSummary { mode: fmode, seq_lens: &seq_lens_cpu, extend_num_tokens: tokens };
        let dispatch = decide(&self.policy, Some(&summary));
        if dispatch.use_mha {
            let mut state = match self.pools.take_extend() {
                Some(s) => s,
                None => self.new_extend_state(&rt)?,
            };
            let made = layer.plan_mha_on_device(&mut state, &batch, host, &dispatch);
            // The plan copied what it needs: the state serves the next step.
            self.pools.put_extend(state);
            let mha = made.py()?;
            let explain = mha.explain(&dispatch);
            return Ok(Plan::new(Held::Mha(mha), self.pools.clone(), self.device, self.id, explain));
        }
        let held = match gm {
            Some(gm) => {
                let state = match self.pools.take_graph(gm) {
                    Some(s) => s,
                    None => self.new_graph_state(&rt, gm)?,
                };
                let built = GraphHeldTryBuilder {
                    state,
                    plan_builder: |s: &mut DeviceGraphState| layer.plan_on_device(s, &batch, host, &dispatch),
                }
                .try_build_or_recover();
                match built {
                    Ok(h) => Held::Decode(h),
                    Err((e, heads)) => {
                        self.pools.put_graph(heads.state);
                        return Err(e).py();
                    }
                }
            }
            None => {
                let state = match self.pools.take_extend() {
                    Some(s) => s,
                    None => self.new_extend_state(&rt)?,
                };
                let built = ExtendHeldTryBuilder {
                    state,
                    plan_builder: |s: &mut DeviceExtendState| layer.plan_extend_on_device(s, &batch, host, &dispatch),
                }
                .try_build_or_recover();
                match built {
                    Ok(h) => Held::Extend(h),
                    Err((e, heads)) => {
                        self.pools.put_extend(heads.state);
                        return Err(e).py();
                    }
                }
            }
        };
        let explain = match &held {
            Held::Decode(h) => h.with_plan(|p| p.explain()),
            Held::Extend(h) => h.with_plan(|p| p.explain()),
            Held::Graph(_) | Held::Mha(_) => unreachable!("eager sparse plans only"),
        };
        Ok(Plan::new(held, self.pools.clone(), self.device, self.id, explain))
    }

    /// The plan of a CUDA graph of `bs` requests in a decode-like `mode`: fixed
    /// metadata buffers and workspace, rewritten by `replay` (capture it with the
    /// forwards). Make it before capturing: it allocates.
    #[pyo3(signature = (mode, bs, *, stream=None))]
    fn graph_plan(&self, mode: &str, bs: usize, stream: Option<usize>) -> PyResult<Plan> {
        let gm = graph_mode(mode)?.ok_or_else(|| {
            PyValueError::new_err(
                "`mode`: \"extend\", expected a decode-like mode (graphs serve decode, verify and draft-extend)",
            )
        })?;
        let (_restore, rt) = self.enter(stream)?;
        let layer = self.on(&rt)?;
        let state = self.new_graph_state(&rt, gm)?;
        let (needs, explain) = {
            let plan = layer.plan_for_graph(&state, bs, 0).py()?;
            (plan.needs(), plan.explain())
        };
        let ws = LayerWorkspace::new(&rt, needs).py()?;
        let held = Held::Graph(GraphBuffers { state, ws, bs });
        Ok(Plan::new(held, self.pools.clone(), self.device, self.id, explain))
    }

    /// Rewrites a graph plan's metadata from the device tables (one launch; capture
    /// it in the graph before the forwards).
    #[pyo3(signature = (plan, req_to_token, req_pool_indices, seq_lens, extend_lens=None, *, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn replay(
        &self,
        plan: &Plan,
        req_to_token: &Bound<'_, PyAny>,
        req_pool_indices: &Bound<'_, PyAny>,
        seq_lens: &Bound<'_, PyAny>,
        extend_lens: Option<&Bound<'_, PyAny>>,
        stream: Option<usize>,
    ) -> PyResult<()> {
        self.check_plan(plan)?;
        let mut held = plan.lock();
        let Some(Held::Graph(g)) = held.as_mut() else {
            return Err(PyValueError::new_err(
                "`plan`: an eager plan, expected a graph plan (Layer.graph_plan); eager plans build their metadata in Layer.plan",
            ));
        };
        let t = Tables::import(req_to_token, req_pool_indices, seq_lens, extend_lens, Some(g.bs), stream)?;
        t.device(self.device)?;
        let (_restore, rt) = self.enter(stream)?;
        let (tb, rb, lb) = (t.table.buffer::<i32>(&rt)?, t.rows.buffer::<i32>(&rt)?, t.lens.buffer::<i32>(&rt)?);
        let (tv, rv, lv) = (tb.view(), rb.view(), lb.view());
        let reqs = DeviceRequests {
            req_to_token: &tv,
            req_to_token_width: t.table.shape[1],
            req_pool_indices: &rv,
            seq_lens: &lv,
        };
        match g.state.mode() {
            GraphMode::Decode => g.state.replay_decode(&rt, &reqs),
            GraphMode::TargetVerify => g.state.replay_target_verify(&rt, &reqs),
            GraphMode::DraftExtendV2 => g.state.replay_draft_extend_v2(&rt, &reqs),
            GraphMode::DraftExtend => {
                let e = t.extend.as_ref().ok_or_else(|| {
                    PyValueError::new_err(
                        "`extend_lens`: None, expected the accepted lengths on the device (draft_extend)",
                    )
                })?;
                let eb = e.buffer::<i32>(&rt)?;
                g.state.replay_draft_extend(&rt, &reqs, &eb.view())
            }
        }
        .py()
    }

    /// Runs the layer for `plan`'s step; see `nsa.Layer.forward` for the tensors.
    #[pyo3(signature = (
        plan, q, k_nope, k_rope, out_cache_loc, index_q, index_weights, index_k, kv_cache, index_k_cache, out, lse,
        *, stream=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        plan: &Plan,
        q: &Bound<'_, PyAny>,
        k_nope: &Bound<'_, PyAny>,
        k_rope: &Bound<'_, PyAny>,
        out_cache_loc: &Bound<'_, PyAny>,
        index_q: &Bound<'_, PyAny>,
        index_weights: &Bound<'_, PyAny>,
        index_k: &Bound<'_, PyAny>,
        kv_cache: &Bound<'_, PyAny>,
        index_k_cache: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        lse: &Bound<'_, PyAny>,
        stream: Option<usize>,
    ) -> PyResult<()> {
        self.check_plan(plan)?;
        if plan.mha_keys.is_some() {
            return Err(PyValueError::new_err(
                "`plan`: an MHA one-shot plan (plan.use_mha), expected a sparse plan: run MHA steps with \
                 Layer.mha_store and Layer.mha_attend",
            ));
        }
        let model = &self.checked.borrow_layer().config().model;
        let (heads, ih) = (model.num_q_heads as usize, model.index_n_heads as usize);
        let t = plan.padded_rows;
        let a = Activations::import(
            [q, k_nope, k_rope, out_cache_loc, index_q, index_weights, index_k, kv_cache, index_k_cache, out, lse],
            stream,
        )?;
        a.check(t, heads, ih, model.kv_cache, self.params.pool_slots)?;
        same_device(self.device, a.all())?;
        let (_restore, rt) = self.enter(stream)?;
        let layer = self.on(&rt)?;
        let mut held = plan.lock();
        let run = |sp: &StepPlan<'_>, ws: &mut LayerWorkspace| a.run(&rt, &layer, sp, ws);
        match held.as_mut() {
            Some(Held::Graph(g)) => {
                let GraphBuffers { state, ws, bs } = g;
                let sp = layer.plan_for_graph(state, *bs, 0).py()?;
                run(&sp, ws)
            }
            Some(Held::Decode(h)) => h.with_plan(|sp| self.with_workspace(&rt, sp, |ws| run(sp, ws))),
            Some(Held::Extend(h)) => h.with_plan(|sp| self.with_workspace(&rt, sp, |ws| run(sp, ws))),
            Some(Held::Mha(_)) => unreachable!("refused above"),
            None => Err(PyValueError::new_err("`plan`: released, expected a live plan")),
        }
    }

    /// An MHA one-shot step's stores: the new tokens' latent KV and indexer keys into
    /// the caches, then every request's latent rows (prefix and new tokens, in
    /// `cu_seqlens_k` order) read back into `latent` `(plan.keys, 576)` bf16 for the
    /// model's `kv_b_proj` (required when the step has prefixes).
    #[pyo3(signature = (plan, k_nope, k_rope, out_cache_loc, index_k, kv_cache, index_k_cache, latent=None, *, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn mha_store(
        &self,
        plan: &Plan,
        k_nope: &Bound<'_, PyAny>,
        k_rope: &Bound<'_, PyAny>,
        out_cache_loc: &Bound<'_, PyAny>,
        index_k: &Bound<'_, PyAny>,
        kv_cache: &Bound<'_, PyAny>,
        index_k_cache: &Bound<'_, PyAny>,
        latent: Option<&Bound<'_, PyAny>>,
        stream: Option<usize>,
    ) -> PyResult<()> {
        self.check_plan(plan)?;
        let a = MhaStore::import([k_nope, k_rope, out_cache_loc, index_k, kv_cache, index_k_cache], latent, stream)?;
        let format = self.checked.borrow_layer().config().model.kv_cache;
        let check = |mha: &MhaPlan| {
            a.check(mha, format, self.params.pool_slots)?;
            same_device(self.device, a.all()).map(drop)
        };
        self.run_mha(plan, stream, check, |rt, layer, mha| a.run(rt, layer, mha))
    }

    /// An MHA one-shot step's attention: dense causal attention of each request's
    /// query rows over its keys, `q` `(plan.rows, heads, 192)`, `k` `(plan.keys,
    /// heads, 192)`, `v` `(plan.keys, heads, 128)` bf16 into `out` `(plan.rows, heads,
    /// 128)` bf16 and `lse` `(plan.rows, heads)` f32 (natural log).
    #[pyo3(signature = (plan, q, k, v, out, lse, *, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn mha_attend(
        &self,
        plan: &Plan,
        q: &Bound<'_, PyAny>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        lse: &Bound<'_, PyAny>,
        stream: Option<usize>,
    ) -> PyResult<()> {
        self.check_plan(plan)?;
        let a = MhaAttend::import([q, k, v, out, lse], stream)?;
        let heads = self.heads() as usize;
        let check = |mha: &MhaPlan| {
            a.check(mha, heads)?;
            same_device(self.device, a.all()).map(drop)
        };
        self.run_mha(plan, stream, check, |rt, layer, mha| a.run(rt, layer, mha))
    }
}

impl Layer {
    /// Runs `f` on the eager workspace, grown first when `plan` needs more.
    fn with_workspace(
        &self,
        rt: &Runtime,
        plan: &StepPlan<'_>,
        f: impl FnOnce(&mut LayerWorkspace) -> PyResult<()>,
    ) -> PyResult<()> {
        let mut guard = self.workspace.lock().unwrap_or_else(|p| p.into_inner());
        let need = plan.needs();
        let grow = match guard.as_ref() {
            Some(ws) => ws.needs().max(need) != ws.needs(),
            None => true,
        };
        if grow {
            let want = guard.as_ref().map_or(need, |ws| ws.needs().max(need));
            // The old buffers are freed in stream order, after the launches using them.
            *guard = None;
            *guard = Some(LayerWorkspace::new(rt, want).py()?);
        }
        f(guard.as_mut().expect("allocated above"))
    }
}

/// The tensors of one `forward`, imported and checked.
struct Activations {
    t: [Tensor; 11],
}

const ACTIVATION_NAMES: [&str; 11] = [
    "q",
    "k_nope",
    "k_rope",
    "out_cache_loc",
    "index_q",
    "index_weights",
    "index_k",
    "kv_cache",
    "index_k_cache",
    "out",
    "lse",
];

impl Activations {
    fn import(objs: [&Bound<'_, PyAny>; 11], stream: Option<usize>) -> PyResult<Self> {
        let mut v = Vec::with_capacity(11);
        for (name, obj) in ACTIVATION_NAMES.into_iter().zip(objs) {
            v.push(import(name, obj, stream)?);
        }
        let t = v.try_into().map_err(|_| PyTypeError::new_err("eleven tensors"))?;
        Ok(Activations { t })
    }

    fn all(&self) -> impl Iterator<Item = &Tensor> {
        self.t.iter()
    }

    fn check(&self, t: usize, heads: usize, ih: usize, format: KvCacheFormat, pool_slots: usize) -> PyResult<()> {
        let [q, k_nope, k_rope, loc, index_q, weights, index_k, kv, index_cache, out, lse] = &self.t;
        q.dtype_in(&[DType::Bf16])?;
        q.shape_is(&[t, heads, BF16_TOKEN_ELEMS], "the plan's padded_rows × heads × 576 (q_nope 512 ‖ q_rope 64)")?;
        q.contiguous()?;
        check_new_tokens(k_nope, k_rope, loc, index_k, t)?;
        index_q.dtype_in(&[DType::U8, DType::F8E4M3])?;
        index_q.shape_is(&[t, ih, INDEXER_HEAD_DIM], "query rows × index heads × 128 (e4m3)")?;
        index_q.contiguous()?;
        weights.dtype_in(&[DType::F32])?;
        weights.shape_is(&[t, ih], "query rows × index heads")?;
        weights.contiguous()?;
        check_caches(kv, index_cache, format, pool_slots)?;
        out.dtype_in(&[DType::Bf16])?;
        out.shape_is(&[t, heads, KV_LORA_RANK], "the plan's padded_rows × heads × 512")?;
        out.contiguous()?;
        out.writable()?;
        lse.dtype_in(&[DType::F32])?;
        lse.shape_is(&[t, heads], "the plan's padded_rows × heads")?;
        lse.contiguous()?;
        lse.writable()
    }

    fn run(&self, rt: &Runtime, layer: &NsaLayer<'_>, plan: &StepPlan<'_>, ws: &mut LayerWorkspace) -> PyResult<()> {
        let [q, k_nope, k_rope, loc, index_q, weights, index_k, kv, index_cache, out, lse] = &self.t;
        let t = plan.padded_rows();
        let (qb, nb, rb) = (q.buffer::<bf16>(rt)?, k_nope.buffer::<bf16>(rt)?, k_rope.buffer::<bf16>(rt)?);
        let (lb, iqb, wb) = (loc.buffer::<i32>(rt)?, index_q.buffer::<u8>(rt)?, weights.buffer::<f32>(rt)?);
        let ikb = index_k.buffer::<bf16>(rt)?;
        let (mut ob, mut lsb) = (out.buffer::<bf16>(rt)?, lse.buffer::<f32>(rt)?);
        let inputs = LayerInputs {
            q: qb.view(),
            k_nope: rows(&nb, k_nope, t, KV_LORA_RANK)?,
            k_rope: rows(&rb, k_rope, t, ROPE_DIM)?,
            out_cache_loc: lb.view(),
            index_q: iqb.view(),
            index_weights: wb.view(),
            index_k: rows(&ikb, index_k, t, INDEXER_HEAD_DIM)?,
        };
        let mut cb = CacheBuffers::new(rt, kv, index_cache)?;
        let mut caches = cb.caches();
        let outputs = LayerOutputs { out: &mut ob.view_mut(), lse: &mut lsb.view_mut() };
        layer.forward(plan, &inputs, &mut caches, ws, outputs).py()
    }
}
