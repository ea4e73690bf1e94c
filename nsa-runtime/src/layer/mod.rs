//! [`NsaLayer`]: one attention layer of a DeepSeek V3.2-style model, run as the
//! server calls it once per layer and step (spec §5.3, §6.1, §8.4):
//!
//! 1. the stores, one launch: KV (bf16, or quantized to the FP8-656 record) at
//!    `out_cache_loc`, and indexer K (FP8 + scale) at the same slots, before
//!    scoring (§6.1 step 7);
//! 2. indexer logits: skipped when no token sees more than top-k keys, PAGED over
//!    the index-K pages (decode-like, page size 64), or gathered + RAGGED (extend),
//!    chunked under the caller's logits budget;
//! 3. fused top-k with the PAGED (slots) or RAGGED (ragged rows) transform;
//! 4. sparse MLA: decode kernel on the FP8 cache, prefill kernel on the bf16 pool, or
//!    dequantize + prefill for RAGGED.
//!
//! The step's decisions live in a [`StepPlan`] built once per step from its
//! [`NsaMetadata`](crate::metadata::NsaMetadata) and [`Dispatch`](crate::metadata::Dispatch)
//! and shared by every layer; [`StepPlan::explain`] (and a `tracing` debug event
//! per stage) says which variant each stage runs and why. A forward allocates
//! nothing and never synchronises (with the default [`crate::DeviceChecks::Skip`]),
//! so decode, verify and draft-extend steps can be captured in a CUDA graph.
//!
//! Plans come three ways: [`NsaLayer::plan`] from host metadata (uploaded per step);
//! [`NsaLayer::plan_on_device`] and [`NsaLayer::plan_extend_on_device`] for eager
//! steps whose metadata one kernel builds from the server's device tables (no host
//! page table, no table upload); [`NsaLayer::plan_for_graph`] for CUDA graphs.

mod device_plan;
mod keys;
mod mha;
mod plan;
mod workspace;

pub use device_plan::{DeviceBatch, HostLens};
pub use keys::{ragged_keys, RaggedKeys};
pub use mha::{MhaInputs, MhaNewTokens, MhaOutputs, MhaPlan, MHA_QK_HEAD_DIM, MHA_V_HEAD_DIM};
pub use plan::{AttentionStage, IndexerStage, StepDecisions, StepPlan, WorkspaceNeeds};
pub use workspace::LayerWorkspace;

use crate::metadata::device::Field;
use crate::metadata::{ForwardMode, TransformMethod};
use crate::ops::indexer::{self, IndexerQuery, LogitsOut, PagedIndexerKeys, RaggedIndexerKeys};
use crate::ops::kv_cache::{self, MlaCacheMut};
use crate::ops::sparse_decode::{self, Fp8PagedCache, SparseDecodeInputs};
use crate::ops::sparse_prefill::{self, Fp8RaggedKv, PrefillQuery, SparsePrefillInputs, SparsePrefillOutputs};
use crate::ops::topk::{self, PageTable, TopkOutput, TopkScores};
use crate::ops::{check_len, invalid, Rows};
use crate::runtime::Runtime;
use crate::Result;
use cudarc::driver::{CudaView, CudaViewMut};
use half::bf16;
use nsa_kernels::layout::{BF16_TOKEN_ELEMS, DEEPSEEK_V32_SM_SCALE, INDEXER_HEAD_DIM, KV_LORA_RANK};
use nsa_kernels::NsaConfig;

/// Default cap on one chunk of extend logits (spec §6.3 memory guard).
pub const DEFAULT_LOGITS_BUDGET_BYTES: usize = 1 << 30;

/// The per-layer configuration: the model's attention config plus run options.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerConfig {
    pub model: NsaConfig,
    /// Softmax scale of the sparse MLA (DeepSeek V3.2: `192^-0.5` × YaRN mscale²).
    pub sm_scale: f32,
    /// Top-k ties go to the lowest positions (reproducible runs).
    pub deterministic_topk: bool,
    /// A request's outputs are bitwise identical whatever else is in the batch:
    /// deterministic top-k, and a decode split count fixed per GPU rather than per
    /// batch ([`batch_invariant_splits`](crate::ops::sparse_decode::batch_invariant_splits)).
    pub batch_invariant: bool,
    /// Bytes one chunk of extend logits may take.
    pub logits_budget_bytes: usize,
}

impl LayerConfig {
    /// `model` (validated) with DeepSeek V3.2's softmax scale, fast top-k and a
    /// 1 GiB logits budget.
    pub fn new(model: NsaConfig) -> Result<Self> {
        model.validate()?;
        Ok(LayerConfig {
            model,
            sm_scale: DEEPSEEK_V32_SM_SCALE,
            deterministic_topk: false,
            batch_invariant: false,
            logits_budget_bytes: DEFAULT_LOGITS_BUDGET_BYTES,
        })
    }

    /// Whether top-k ties go to the lowest positions (deterministic or batch-invariant).
    pub fn deterministic_ties(&self) -> bool {
        self.deterministic_topk || self.batch_invariant
    }
}

/// The tensors of one layer call; `T` = query tokens of the step.
#[derive(Debug)]
pub struct LayerInputs<'a> {
    /// `[T, heads, 576]` bf16: absorbed q_nope (512) ‖ q_rope (64).
    pub q: CudaView<'a, bf16>,
    /// `T` rows of 512: the new tokens' latent.
    pub k_nope: Rows<'a, bf16>,
    /// `T` rows of 64: the new tokens' rope part.
    pub k_rope: Rows<'a, bf16>,
    /// `[T]` cache slots of the new tokens.
    pub out_cache_loc: CudaView<'a, i32>,
    /// `[T, index_heads, 128]` e4m3 bytes.
    pub index_q: CudaView<'a, u8>,
    /// `[T, index_heads]` f32 folded head weights (spec §6.1 step 6).
    pub index_weights: CudaView<'a, f32>,
    /// `T` rows of 128 bf16: the new tokens' indexer keys (quantized by the store).
    pub index_k: Rows<'a, bf16>,
}

/// The layer's caches, written by the stores and read by the indexer and attention.
#[derive(Debug)]
pub struct LayerCaches<'a> {
    /// The MLA cache in the model's format.
    pub kv: MlaCacheMut<'a>,
    /// The indexer K cache: pages of 64 tokens × (128 e4m3 + f32 scale).
    pub index_k: CudaViewMut<'a, u8>,
}

/// Where the layer writes: `out` `[T, heads, 512]` bf16 (latent space; the model
/// applies W_UV) and `lse` `[T, heads]` f32 (natural log; +inf for a token without keys).
#[derive(Debug)]
pub struct LayerOutputs<'a, 'b> {
    pub out: &'a mut CudaViewMut<'b, bf16>,
    pub lse: &'a mut CudaViewMut<'b, f32>,
}

/// Sparse steps ([`NsaLayer::forward`]) of at most this many query rows launch
/// their kernels with PDL (where the runtime has it on); larger ones wait for each
/// whole kernel. (MHA one-shot calls keep the runtime's setting: measured no
/// slower with PDL.) On an H100
/// (2026-12-07, `nsa bench --suite layer --layer-decode-only`, CUDA graph, with and
/// without PDL in one call) PDL took 3–6% off decode at batch 1 and 2.5% off an MTP
/// verify step of 8 × 2 rows, and added 3.8% at batch 32 and 1.9% at batch 128
/// with 128 heads.
pub const PDL_MAX_ROWS: usize = 16;

/// The stages of a layer call, in order (for [`NsaLayer::forward_marked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The KV and index-K stores, one launch.
    Stores,
    /// Index-K gather (if any) and logits.
    Indexer,
    Topk,
    Attention,
}

impl Stage {
    pub const ALL: [Stage; 4] = [Stage::Stores, Stage::Indexer, Stage::Topk, Stage::Attention];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Stores => "stores",
            Stage::Indexer => "indexer logits",
            Stage::Topk => "top-k",
            Stage::Attention => "sparse MLA",
        }
    }
}

/// One attention layer configuration on one runtime; see the [module docs](self).
#[derive(Debug)]
pub struct NsaLayer<'rt> {
    rt: &'rt Runtime,
    cfg: LayerConfig,
}

impl<'rt> NsaLayer<'rt> {
    /// Checks `cfg` against the runtime's target and compiles (or loads) every
    /// kernel the layer can run, so no step JIT-compiles or loads a module.
    pub fn new(rt: &'rt Runtime, cfg: LayerConfig) -> Result<Self> {
        cfg.model.validate()?;
        let target = rt.target();
        if !cfg.model.targets.contains(&target) {
            return Err(invalid(
                "targets",
                format!("{:?}", cfg.model.targets.iter().map(|t| t.arch()).collect::<Vec<_>>()),
                format!("a list including this GPU's {}", target.arch()),
            ));
        }
        if !cfg.sm_scale.is_finite() || cfg.sm_scale <= 0.0 {
            return Err(invalid("sm_scale", cfg.sm_scale.to_string(), "a finite positive softmax scale"));
        }
        let mut specs = nsa_kernels::kernel_set(&cfg.model);
        if cfg.deterministic_ties() {
            specs.extend(nsa_kernels::deterministic_topk_set(&cfg.model));
        }
        for spec in specs.into_iter().filter(|s| s.target == target) {
            rt.kernel(spec.family)?;
        }
        Ok(NsaLayer { rt, cfg })
    }

    pub fn config(&self) -> &LayerConfig {
        &self.cfg
    }

    /// This layer launching on `rt`, a runtime of the same device sharing this
    /// one's kernel cache (made by [`Runtime::with_stream`] or
    /// [`Runtime::with_borrowed_stream`]): a server that moves between streams
    /// gets the layer on each without checking its kernels again.
    pub fn on_runtime<'a>(&self, rt: &'a Runtime) -> Result<NsaLayer<'a>> {
        if !std::sync::Arc::ptr_eq(rt.shared_cache(), self.rt.shared_cache())
            || rt.gpu().caps().ordinal != self.rt.gpu().caps().ordinal
        {
            return Err(invalid(
                "rt",
                format!("a runtime of device {} with its own kernel cache", rt.gpu().caps().ordinal),
                format!(
                    "a runtime of device {} made from the layer's (Runtime::with_stream / with_borrowed_stream)",
                    self.rt.gpu().caps().ordinal
                ),
            ));
        }
        Ok(NsaLayer { rt, cfg: self.cfg.clone() })
    }

    /// The step plan for `md` and `dispatch` (one per step, shared by all layers).
    pub fn plan(
        &self,
        md: &crate::metadata::NsaMetadata,
        dispatch: &crate::metadata::Dispatch,
    ) -> Result<StepPlan<'static>> {
        StepPlan::new(self.rt, &self.cfg, md, dispatch)
    }

    /// An eager decode-like step (the mode of `state`) whose metadata is built on the
    /// device in one launch (see [`StepPlan::on_device`]).
    pub fn plan_on_device<'m>(
        &self,
        state: &'m mut crate::metadata::graph_device::DeviceGraphState,
        batch: &DeviceBatch<'_>,
        host: HostLens<'_>,
        dispatch: &crate::metadata::Dispatch,
    ) -> Result<StepPlan<'m>> {
        StepPlan::on_device(self.rt, &self.cfg, state, batch, host, dispatch)
    }

    /// An eager extend step whose metadata is built on the device in one launch
    /// (see [`StepPlan::extend_on_device`]).
    pub fn plan_extend_on_device<'m>(
        &self,
        state: &'m mut crate::metadata::extend_device::DeviceExtendState,
        batch: &DeviceBatch<'_>,
        host: HostLens<'_>,
        dispatch: &crate::metadata::Dispatch,
    ) -> Result<StepPlan<'m>> {
        StepPlan::extend_on_device(self.rt, &self.cfg, state, batch, host, dispatch)
    }

    /// The plan of a CUDA graph of `bs` requests reading `state`'s buffers (see
    /// [`StepPlan::for_graph`]).
    pub fn plan_for_graph<'m>(
        &self,
        state: &'m crate::metadata::graph_device::DeviceGraphState,
        bs: usize,
        step: usize,
    ) -> Result<StepPlan<'m>> {
        StepPlan::for_graph(self.rt, &self.cfg, state, bs, step)
    }

    /// Runs the layer for one step. Every size is checked before the first launch.
    pub fn forward(
        &self,
        plan: &StepPlan<'_>,
        inputs: &LayerInputs<'_>,
        caches: &mut LayerCaches<'_>,
        ws: &mut LayerWorkspace,
        outputs: LayerOutputs<'_, '_>,
    ) -> Result<()> {
        self.forward_marked(plan, inputs, caches, ws, outputs, &mut |_| Ok(()))
    }

    /// [`NsaLayer::forward`], calling `mark(stage)` after each stage's launches are
    /// enqueued (profilers record an event there; chunked steps mark the indexer
    /// and top-k once per chunk).
    pub fn forward_marked(
        &self,
        plan: &StepPlan<'_>,
        inputs: &LayerInputs<'_>,
        caches: &mut LayerCaches<'_>,
        ws: &mut LayerWorkspace,
        outputs: LayerOutputs<'_, '_>,
        mark: &mut dyn FnMut(Stage) -> Result<()>,
    ) -> Result<()> {
        self.check(plan, inputs, caches, ws, &outputs)?;
        let _pdl = self.rt.hold_pdl(plan.padded_rows() > PDL_MAX_ROWS);
        let rt = self.rt;
        kv_cache::store_step(
            rt,
            &inputs.k_nope,
            &inputs.k_rope,
            &inputs.index_k,
            &inputs.out_cache_loc,
            &mut caches.kv,
            &mut caches.index_k,
        )?;
        mark(Stage::Stores)?;
        let heads = self.cfg.model.num_q_heads as usize;
        let (t, t_pad) = (plan.rows(), plan.padded_rows());
        if t_pad > t {
            pad_rows(
                self.rt,
                &mut outputs.out.slice_mut(t * heads * KV_LORA_RANK..),
                &mut outputs.lse.slice_mut(t * heads..),
            )?;
        }
        if t == 0 {
            return Ok(());
        }
        self.select(plan, inputs, caches, ws, mark)?;
        self.attend(plan, inputs, caches, ws, outputs)?;
        mark(Stage::Attention)
    }

    fn check(
        &self,
        plan: &StepPlan<'_>,
        inputs: &LayerInputs<'_>,
        caches: &LayerCaches<'_>,
        ws: &LayerWorkspace,
        outputs: &LayerOutputs<'_, '_>,
    ) -> Result<()> {
        if plan.config != self.cfg {
            return Err(invalid(
                "plan",
                "a plan of another layer configuration",
                "a StepPlan made by a layer with this configuration",
            ));
        }
        let m = &self.cfg.model;
        // Query rows, DP padding included (T_pad = T without padding).
        let t = plan.padded_rows();
        let (heads, index_heads) = (m.num_q_heads as usize, m.index_n_heads as usize);
        check_len("q", inputs.q.len(), t * heads * BF16_TOKEN_ELEMS, "T_pad × heads × 576")?;
        if !plan.cp_split() {
            // A CP rank stores every token of the step (all-gathered KV), any count.
            check_len(
                "out_cache_loc",
                inputs.out_cache_loc.len(),
                t,
                "one slot per query row (padding: a dummy slot)",
            )?;
        }
        check_len("index_q", inputs.index_q.len(), t * index_heads * INDEXER_HEAD_DIM, "T_pad × index heads × 128")?;
        check_len("index_weights", inputs.index_weights.len(), t * index_heads, "T_pad × index heads")?;
        check_len("out", outputs.out.len(), t * heads * KV_LORA_RANK, "T_pad × heads × 512")?;
        check_len("lse", outputs.lse.len(), t * heads, "T_pad × heads")?;
        check_store(&self.cfg, caches)?;
        ws.check(&plan.needs())
    }

    /// Indexer logits and top-k, chunk by chunk, into `ws.indices`.
    fn select(
        &self,
        plan: &StepPlan<'_>,
        inputs: &LayerInputs<'_>,
        caches: &LayerCaches<'_>,
        ws: &mut LayerWorkspace,
        mark: &mut dyn FnMut(Stage) -> Result<()>,
    ) -> Result<()> {
        let rt = self.rt;
        let d = plan.decisions();
        let m = &self.cfg.model;
        let (k, index_heads) = (m.topk as usize, m.index_n_heads as usize);
        let field = |f: Field| {
            plan.metadata.field(f).ok_or_else(|| invalid("metadata", format!("{f:?} absent"), "a field the step reads"))
        };
        let expanded = field(Field::SeqlensExpanded)?;
        // PAGED top-k reads the table of pages where pages hold more than one token:
        // the same slots as page_table_1 (spec §2.1 allocates whole pages) from a table
        // page_size times smaller (+2.7% to +5.1% over plain top-k at pages of 64, against up to
        // +19% from a page_table_1; H100 and H200, December 2026).
        let page_size = m.page_size as usize;
        let table = field(if page_size > 1 { Field::RealPageTable } else { Field::PageTable1 })?;
        let table_width = plan.table_width.div_ceil(page_size);
        let keys = plan.keys.as_ref();
        let index_cache = caches.index_k.as_view();
        if let IndexerStage::Gathered { num_keys, .. } = d.indexer {
            let kd = keys.expect("gathered steps have keys");
            let slots = kd.slots();
            kv_cache::gather_indexer_k(
                rt,
                &index_cache,
                &slots,
                &mut ws.keys.slice_mut(..num_keys * INDEXER_HEAD_DIM),
                &mut ws.key_scales.slice_mut(..num_keys),
            )?;
        }
        for (ci, rows) in d.chunks.iter().enumerate() {
            let n = rows.len();
            let query = IndexerQuery {
                heads: m.index_n_heads,
                q: inputs
                    .index_q
                    .slice(rows.start * index_heads * INDEXER_HEAD_DIM..rows.end * index_heads * INDEXER_HEAD_DIM),
                weights: inputs.index_weights.slice(rows.start * index_heads..rows.end * index_heads),
            };
            let ks = || keys.map(|k| k.ks().slice(rows.clone()));
            let (row_stride, row_capacity) = match &d.indexer {
                IndexerStage::Skip => (0, k),
                IndexerStage::Paged { table_width } => {
                    let lens = expanded.slice(rows.clone());
                    let keys = PagedIndexerKeys {
                        cache: index_cache.slice(..),
                        block_table: field(Field::RealPageTable)?
                            .slice(rows.start * table_width..rows.end * table_width),
                        table_width: *table_width,
                        context_lens: lens,
                        next_n: 1,
                    };
                    let mut data = ws.logits.slice_mut(..);
                    indexer::paged_logits(rt, &query, &keys, LogitsOut::new(&mut data, d.logits_stride))?;
                    (d.logits_stride, d.logits_stride)
                }
                IndexerStage::Gathered { num_keys, .. } => {
                    let keys_dev = keys.expect("gathered steps have keys");
                    let ragged = RaggedIndexerKeys {
                        keys: ws.keys.slice(..num_keys * INDEXER_HEAD_DIM),
                        scales: ws.key_scales.slice(..*num_keys),
                        ks: ks().expect("keys"),
                        ke: keys_dev.ke().slice(rows.clone()),
                    };
                    let mut data = ws.logits.slice_mut(..);
                    indexer::ragged_logits(rt, &query, &ragged, LogitsOut::new(&mut data, d.logits_stride))?;
                    (d.logits_stride, *num_keys)
                }
            };
            mark(Stage::Indexer)?;
            let scores_view = ws.logits.slice(..);
            let lengths = expanded.slice(rows.clone());
            let gathered = matches!(d.indexer, IndexerStage::Gathered { .. });
            let starts = if gathered { ks() } else { None };
            let scores = TopkScores {
                scores: &scores_view,
                row_stride,
                row_capacity,
                lengths: &lengths,
                row_starts: starts.as_ref(),
            };
            let table_rows;
            let cu;
            let offsets;
            let output = match d.transform {
                // Decode-like: one table row per query token.
                TransformMethod::Paged if plan.table_per_token || d.mode != ForwardMode::Extend => {
                    let w = table_width;
                    table_rows = table.slice(rows.start * w..rows.end * w);
                    TopkOutput::Paged(PageTable {
                        table: &table_rows,
                        rows: n,
                        stride: w,
                        width: w,
                        page_size,
                        cu_seqlens_q: None,
                    })
                }
                // Extend: rows map to requests through cu_seqlens_q (shifted per chunk).
                TransformMethod::Paged => {
                    cu = match keys.and_then(|kd| kd.chunk_cu(ci)) {
                        Some(chunk) => chunk,
                        None => field(Field::CuSeqlensQ)?,
                    };
                    let w = table_width;
                    table_rows = table.slice(..);
                    TopkOutput::Paged(PageTable {
                        table: &table_rows,
                        rows: plan.table_rows,
                        stride: w,
                        width: w,
                        page_size,
                        cu_seqlens_q: Some(&cu),
                    })
                }
                TransformMethod::Ragged => {
                    offsets = ks().expect("RAGGED steps have keys");
                    TopkOutput::Ragged { offsets: &offsets }
                }
            };
            let mut out = ws.indices.slice_mut(rows.start * k..rows.end * k);
            topk::topk(rt, m.topk, self.cfg.deterministic_ties(), &scores, &output, &mut out, ws.topk.as_mut())?;
            mark(Stage::Topk)?;
        }
        Ok(())
    }

    /// Sparse MLA over the selected indices.
    fn attend(
        &self,
        plan: &StepPlan<'_>,
        inputs: &LayerInputs<'_>,
        caches: &LayerCaches<'_>,
        ws: &mut LayerWorkspace,
        outputs: LayerOutputs<'_, '_>,
    ) -> Result<()> {
        let rt = self.rt;
        let m = &self.cfg.model;
        let t = plan.rows();
        let k = m.topk as usize;
        let heads = m.num_q_heads as usize;
        // Fresh views of the T computed rows (padding rows are filled apart), so
        // outputs and workspace slices share one lifetime.
        let (mut out, mut lse) =
            (outputs.out.slice_mut(..t * heads * KV_LORA_RANK), outputs.lse.slice_mut(..t * heads));
        let lens = plan
            .metadata
            .field(Field::NsaCacheSeqlens)
            .ok_or_else(|| invalid("metadata", "NsaCacheSeqlens absent", "a field the step reads"))?
            .slice(..t);
        let query = PrefillQuery {
            q: inputs.q.slice(..t * heads * BF16_TOKEN_ELEMS),
            indices: ws.indices.slice(..t * k),
            topk_length: Some(lens),
            sm_scale: self.cfg.sm_scale,
        };
        match (&plan.decisions().attention, &caches.kv) {
            (AttentionStage::Decode(p), MlaCacheMut::Fp8(cache)) => {
                let inputs = SparseDecodeInputs {
                    q: query.q,
                    cache: Fp8PagedCache::dense(cache.as_view(), m.page_size),
                    indices: query.indices,
                    topk_length: query.topk_length,
                    sm_scale: query.sm_scale,
                };
                let floats = plan.needs().decode_partials;
                sparse_decode::sparse_decode(rt, p, &inputs, &mut out, &mut lse, &mut ws.partials.slice_mut(..floats))
            }
            (AttentionStage::PrefillPaged(s), MlaCacheMut::Bf16(cache)) => {
                let kv = Rows::dense(cache.as_view(), BF16_TOKEN_ELEMS);
                let out = SparsePrefillOutputs {
                    out: &mut out,
                    max_logits: &mut ws.max_logits.slice_mut(..t * heads),
                    lse: &mut lse,
                };
                sparse_prefill::sparse_prefill(rt, s, &SparsePrefillInputs { query, kv }, out)
            }
            (AttentionStage::PrefillRagged(s), MlaCacheMut::Fp8(cache)) => {
                let kd = plan.keys.as_ref().expect("RAGGED steps have keys");
                let rows = kd.num_keys();
                let kv = Fp8RaggedKv {
                    cache: cache.as_view(),
                    kv_slots: kd.slots(),
                    buffer: &mut ws.ragged_kv.slice_mut(..sparse_prefill::ragged_kv_elems(rows)),
                };
                let out = SparsePrefillOutputs {
                    out: &mut out,
                    max_logits: &mut ws.max_logits.slice_mut(..t * heads),
                    lse: &mut lse,
                };
                sparse_prefill::sparse_prefill_fp8_ragged(rt, s, kv, query, out)
            }
            (stage, cache) => Err(invalid(
                "caches.kv",
                format!("a {} cache", cache.format().tag()),
                format!("the cache format the plan's attention stage reads ({stage:?})"),
            )),
        }
    }
}

/// DP padding rows (spec §3.2): `out` zeros and `lse` +inf, what a token without
/// keys gets; two stream-ordered memsets (capturable in a CUDA graph).
/// The caches are in the layer's format.
fn check_store(cfg: &LayerConfig, caches: &LayerCaches<'_>) -> Result<()> {
    if caches.kv.format() != cfg.model.kv_cache {
        return Err(invalid(
            "caches.kv",
            format!("a {} cache", caches.kv.format().tag()),
            format!("the layer's {} cache", cfg.model.kv_cache.tag()),
        ));
    }
    Ok(())
}

fn pad_rows(rt: &Runtime, out: &mut CudaViewMut<'_, bf16>, lse: &mut CudaViewMut<'_, f32>) -> Result<()> {
    use cudarc::driver::DevicePtrMut;
    let stream = rt.gpu().stream();
    stream.memset_zeros(out).map_err(crate::Error::driver("zeroing the padding rows of out"))?;
    let n = lse.len();
    let (ptr, _sync) = lse.device_ptr_mut(stream);
    // SAFETY: `ptr` addresses `n` f32 of a live view on this stream.
    unsafe { cudarc::driver::sys::cuMemsetD32Async(ptr, f32::INFINITY.to_bits(), n, stream.cu_stream()) }
        .result()
        .map_err(crate::Error::driver("writing +inf into the padding rows of lse"))
}
