//! [`StepPlan`]: what one forward step runs in every layer, decided once from the
//! step's metadata and dispatch and shared by all layers of the model.
//!
//! Every decision is a pure function of the configuration, the metadata and the SM
//! count ([`StepDecisions::new`]), so it can be logged, table-tested and captured
//! in a CUDA graph; [`StepPlan::new`] adds the device copies of the metadata.

use super::keys::{ragged_keys, table_rows_per_token, RaggedKeys};
use super::LayerConfig;
use crate::metadata::device::{DeviceNsaMetadata, Field};
use crate::metadata::extend_device::DeviceExtendBuffers;
use crate::metadata::graph_device::{DeviceGraphBuffers, DeviceGraphState};
use crate::metadata::GraphMode;
use crate::metadata::{Dispatch, ForwardMode, NsaMetadata, TransformMethod};
use crate::ops::indexer::ragged_chunk_rows;
use crate::ops::sparse_decode::{batch_invariant_splits, DecodePlan, DecodeShape};
use crate::ops::sparse_prefill::{ragged_kv_elems, PrefillShape};
use crate::ops::topk::{choose_plan, split_list_suffices, TopkPlan, TopkWorkspace};
use crate::ops::{invalid, LaunchTarget};
use crate::runtime::Runtime;
use crate::{Error, Result};
use cudarc::driver::{CudaSlice, CudaView};
use nsa_kernels::layout::{BF16_TOKEN_ELEMS, INDEXER_PAGE_TOKENS};
use nsa_kernels::{KvCacheFormat, Target};
use std::ops::Range;

/// How the indexer scores keys in this step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexerStage {
    /// Every query token sees at most top-k keys: top-k's short-row path selects all
    /// of them without reading scores, so no logits are computed (spec §6.1
    /// shortcut, exact in every mode).
    Skip,
    /// PAGED logits over the indexer K cache through the real page table
    /// (`table_width` pages of 64 tokens), one query row per token.
    Paged { table_width: usize },
    /// Keys gathered by slot into a ragged buffer, then RAGGED logits over each
    /// token's `[ks, ke)`, in `chunks` of query rows sized to the logits budget.
    Gathered { num_keys: usize, chunk_rows: usize, why: &'static str },
}

/// Which sparse MLA kernel attends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttentionStage {
    /// FP8 cache, PAGED slots: the sparse decode kernel, one row per query token.
    Decode(DecodePlan),
    /// bf16 cache, PAGED slots: the prefill kernel over the whole pool.
    PrefillPaged(PrefillShape),
    /// FP8 cache, RAGGED rows: dequantize every request's keys, then prefill.
    PrefillRagged(PrefillShape),
}

/// Device scratch one layer call needs (shared by the layers, which run in turn).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceNeeds {
    /// f32 logits (one chunk of rows × row stride; 1 when no logits are computed).
    pub logits: usize,
    /// i32 top-k output, `[T, topk]`.
    pub indices: usize,
    /// Rows of the split top-k workspace ([`TopkWorkspace`]).
    pub topk_split_rows: usize,
    /// f32 split-KV partials of the decode kernel.
    pub decode_partials: usize,
    /// f32 max_logits of the prefill kernel, `[T, heads]`.
    pub max_logits: usize,
    /// Gathered indexer keys: `S` (×128 bytes and ×1 f32 scale).
    pub gathered_keys: usize,
    /// bf16 elements of the dequantized ragged KV (RAGGED prefill).
    pub ragged_kv: usize,
}

impl WorkspaceNeeds {
    /// The element-wise maximum: a workspace for both.
    pub fn max(self, o: WorkspaceNeeds) -> WorkspaceNeeds {
        WorkspaceNeeds {
            logits: self.logits.max(o.logits),
            indices: self.indices.max(o.indices),
            topk_split_rows: self.topk_split_rows.max(o.topk_split_rows),
            decode_partials: self.decode_partials.max(o.decode_partials),
            max_logits: self.max_logits.max(o.max_logits),
            gathered_keys: self.gathered_keys.max(o.gathered_keys),
            ragged_kv: self.ragged_kv.max(o.ragged_kv),
        }
    }

    /// Device bytes of a workspace with these needs on `target` (what a server
    /// counts against its memory budget).
    pub fn bytes(&self, target: Target) -> usize {
        4 * (self.logits + self.indices + self.decode_partials + self.max_logits)
            + self.gathered_keys * (128 + 4)
            + 2 * self.ragged_kv
            + TopkWorkspace::bytes_for(self.topk_split_rows, target)
    }
}

/// The host-side decisions of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepDecisions {
    pub mode: ForwardMode,
    /// Query tokens `T`.
    pub rows: usize,
    pub transform: TransformMethod,
    pub indexer: IndexerStage,
    /// Query-row ranges processed together (logits chunk → top-k).
    pub chunks: Vec<Range<usize>>,
    /// f32 elements between logits rows (0 when no logits are computed).
    pub logits_stride: usize,
    pub attention: AttentionStage,
    pub needs: WorkspaceNeeds,
    /// The dispatch's reason (the first line of [`StepDecisions::explain`]).
    pub reason: String,
    /// Keys of the ragged layout (0 when the step has none).
    pub num_keys: usize,
    pub target: nsa_kernels::Target,
}

/// What the decisions read from a batch, all host values: from an [`NsaMetadata`],
/// or from the lengths a server keeps on the host when the metadata is built on
/// the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StepFacts {
    pub mode: ForwardMode,
    /// Query tokens `T`.
    pub rows: usize,
    /// The most KV tokens any query token sees (unclipped).
    pub max_visible: i64,
    /// Pages per row of the real page table (PAGED logits).
    pub table_pages: usize,
}

impl StepFacts {
    fn of(md: &NsaMetadata) -> StepFacts {
        StepFacts {
            mode: md.mode,
            rows: md.num_tokens(),
            max_visible: md.nsa_seqlens_expanded.iter().map(|&l| l as i64).max().unwrap_or(0),
            table_pages: md.real_table().width,
        }
    }
}

impl StepDecisions {
    /// Decides every stage of a step; `keys` is the ragged key layout when the
    /// indexer gathers or the transform is RAGGED (see [`StepDecisions::needs_keys`]).
    pub fn new(
        cfg: &LayerConfig,
        md: &NsaMetadata,
        dispatch: &Dispatch,
        num_keys: usize,
        gpu: LaunchTarget,
    ) -> Result<StepDecisions> {
        check_metadata(cfg, md, dispatch)?;
        Self::from_facts(cfg, &StepFacts::of(md), dispatch, num_keys, gpu)
    }

    pub(super) fn from_facts(
        cfg: &LayerConfig,
        facts: &StepFacts,
        dispatch: &Dispatch,
        num_keys: usize,
        gpu: LaunchTarget,
    ) -> Result<StepDecisions> {
        let rows = facts.rows;
        let indexer = indexer_stage(cfg, facts, num_keys)?;
        let attention = attention_stage(cfg, facts.mode, dispatch.transform, rows, gpu)?;
        Ok(assemble(cfg, facts.mode, rows, dispatch.transform, indexer, attention, num_keys, &dispatch.reason, gpu))
    }

    /// The decisions of a CUDA graph of `rows` query rows in `mode` that reads
    /// [`DeviceGraphState`] buffers of `width` columns: nothing depends on the
    /// lengths a replay writes, so logits are always computed (PAGED; page size 64)
    /// and top-k and attention cover every row.
    pub fn for_graph(
        cfg: &LayerConfig,
        mode: ForwardMode,
        rows: usize,
        width: usize,
        gpu: LaunchTarget,
    ) -> Result<StepDecisions> {
        check_graph_page_size(cfg, "graph-bound steps")?;
        let indexer = IndexerStage::Paged { table_width: width.div_ceil(INDEXER_PAGE_TOKENS) };
        let attention = attention_stage(cfg, mode, TransformMethod::Paged, rows, gpu)?;
        let reason = format!("CUDA graph of {} rows ({}): PAGED, MLA", rows, mode.name());
        Ok(assemble(cfg, mode, rows, TransformMethod::Paged, indexer, attention, 0, &reason, gpu))
    }

    /// Whether the step needs [`RaggedKeys`]: gathered indexer keys or a RAGGED
    /// transform. Decided before the (host) layout is built.
    pub fn needs_keys(cfg: &LayerConfig, md: &NsaMetadata, dispatch: &Dispatch) -> bool {
        let facts = StepFacts::of(md);
        dispatch.transform == TransformMethod::Ragged
            || (needs_logits(cfg, &facts) && !paged_logits_apply(cfg, facts.mode).0)
    }
}

/// Steps whose table rows are bound to device buffers read the indexer cache
/// through the real page table, whose pages must be the indexer's 64 tokens.
pub(super) fn check_graph_page_size(cfg: &LayerConfig, what: &str) -> Result<()> {
    if cfg.model.page_size as usize != INDEXER_PAGE_TOKENS {
        return Err(invalid(
            "page_size",
            cfg.model.page_size.to_string(),
            format!(
                "64 for {what} (PAGED logits read index-K pages through the real page table); other page sizes run eager steps from host metadata"
            ),
        ));
    }
    Ok(())
}

/// The chunks, explanation and workspace of chosen stages.
#[allow(clippy::too_many_arguments)]
fn assemble(
    cfg: &LayerConfig,
    mode: ForwardMode,
    rows: usize,
    transform: TransformMethod,
    indexer: IndexerStage,
    attention: AttentionStage,
    num_keys: usize,
    reason: &str,
    gpu: LaunchTarget,
) -> StepDecisions {
    let target = gpu.target;
    let model = &cfg.model;
    let topk = model.topk as usize;
    let (chunks, logits_stride) = match &indexer {
        IndexerStage::Skip => (std::iter::once(0..rows).collect(), 0),
        IndexerStage::Paged { table_width } => (std::iter::once(0..rows).collect(), table_width * INDEXER_PAGE_TOKENS),
        IndexerStage::Gathered { num_keys, chunk_rows, .. } => {
            let chunks: Vec<Range<usize>> =
                (0..rows).step_by((*chunk_rows).max(1)).map(|r| r..(r + chunk_rows).min(rows)).collect();
            (chunks, num_keys.next_multiple_of(4))
        }
    };
    let chunk_max = chunks.iter().map(|c| c.len()).max().unwrap_or(0);
    // The split top-k workspace: rows of the largest chunk whose top-k call takes the
    // split plan (the same choice `ops::topk::topk` makes for it with a workspace).
    let topk_capacity = match &indexer {
        IndexerStage::Skip => topk,
        IndexerStage::Paged { .. } => logits_stride,
        IndexerStage::Gathered { num_keys, .. } => *num_keys,
    };
    let split_fits = split_list_suffices(target, model.topk, topk_capacity);
    let splits = |n: usize| {
        let plan =
            choose_plan(n, topk_capacity, gpu.sm_count, cfg.deterministic_ties(), split_fits, target.has_clusters());
        matches!(plan.0, TopkPlan::Split { .. })
    };
    let topk_split_rows = chunks.iter().map(|c| c.len()).filter(|&n| splits(n)).max().unwrap_or(0);
    let needs = WorkspaceNeeds {
        logits: (chunk_max * logits_stride).max(topk),
        indices: rows * topk,
        topk_split_rows,
        decode_partials: match &attention {
            AttentionStage::Decode(p) => p.workspace_floats(),
            _ => 0,
        },
        max_logits: match &attention {
            AttentionStage::Decode(_) => 0,
            _ => rows * model.num_q_heads as usize,
        },
        gathered_keys: if matches!(indexer, IndexerStage::Gathered { .. }) { num_keys } else { 0 },
        ragged_kv: match &attention {
            AttentionStage::PrefillRagged(_) => ragged_kv_elems(num_keys),
            _ => 0,
        },
    };
    StepDecisions {
        mode,
        rows,
        transform,
        indexer,
        chunks,
        logits_stride,
        attention,
        needs,
        reason: reason.to_string(),
        num_keys,
        target,
    }
}

impl StepDecisions {
    /// Why: one line per stage (built on demand, off the step path).
    pub fn explain(&self, cfg: &LayerConfig) -> Vec<String> {
        let (model, target, topk, num_keys) = (&cfg.model, self.target, cfg.model.topk, self.num_keys);
        let (indexer, chunks, transform, attention) = (&self.indexer, &self.chunks, self.transform, &self.attention);
        let mut explain = vec![format!("dispatch: {}", self.reason)];
        let indexer_kernel = if nsa_kernels::spec::indexer_wg_kernel(model.index_n_heads, target) {
            "wgmma FP8: each key block read once per request (PAGED) or per 4 rows (RAGGED)"
        } else {
            "mma.sync FP8: one CTA per query row"
        };
        explain.push(match &indexer {
        IndexerStage::Skip => {
            format!("indexer: skipped, every token sees ≤ {topk} keys (top-k selects them all without scores)")
        }
        IndexerStage::Paged { table_width } => format!(
            "indexer: indexer_logits.paged.h{} over the real page table ({table_width} pages of 64; {indexer_kernel})",
            model.index_n_heads,
        ),
        IndexerStage::Gathered { num_keys, chunk_rows, why } => format!(
            "indexer: indexer_k_gather of {num_keys} keys, then indexer_logits.ragged.h{} in {} chunk(s) of ≤ {chunk_rows} rows ({why}; logits budget {} bytes; {indexer_kernel})",
            model.index_n_heads,
            chunks.len(),
            cfg.logits_budget_bytes
        ),
    });
        explain.push(format!(
            "top-k: k={topk} {} transform{}{}",
            transform.name(),
            match (transform, model.page_size) {
                (TransformMethod::Paged, p) if p > 1 => format!(" (slots from the real page table, pages of {p})"),
                _ => String::new(),
            },
            if cfg.deterministic_ties() { ", deterministic ties" } else { "" }
        ));
        explain.push(match &attention {
            AttentionStage::Decode(p) => format!("attention: {} (FP8 cache, PAGED slots)", p.explain()),
            AttentionStage::PrefillPaged(s) => format!("attention: {} over the bf16 pool (PAGED slots)", s.explain()),
            AttentionStage::PrefillRagged(s) => {
                format!("attention: kv_dequant of {num_keys} keys, then {} (FP8 cache, RAGGED rows)", s.explain())
            }
        });
        explain
    }
}

/// A dispatch the layer runs: sparse MLA (MHA one-shot batches run in the model).
pub(super) fn check_dispatch(dispatch: &Dispatch) -> Result<()> {
    if dispatch.use_mha {
        return Err(invalid(
            "dispatch.use_mha",
            format!("true ({})", dispatch.reason),
            "a sparse (absorbed MLA) batch: plan MHA one-shot batches with NsaLayer::plan_mha, or set DispatchPolicy::force_mla",
        ));
    }
    Ok(())
}

fn check_metadata(cfg: &LayerConfig, md: &NsaMetadata, dispatch: &Dispatch) -> Result<()> {
    let model = &cfg.model;
    check_dispatch(dispatch)?;
    if md.page_size != model.page_size || md.topk != model.topk {
        return Err(invalid(
            "metadata.page_size/topk",
            format!("{}/{}", md.page_size, md.topk),
            format!("the layer's {}/{} (build metadata with MetadataParams::from_config)", model.page_size, model.topk),
        ));
    }
    if md.bs_idx.is_some() && md.mode != ForwardMode::Extend {
        return Err(invalid(
            "metadata.bs_idx",
            format!("a context-parallel split in a {} batch", md.mode.name()),
            "a CP split of an extend batch only (spec §4.7)",
        ));
    }
    if md.transform != dispatch.transform {
        return Err(invalid(
            "dispatch.transform",
            dispatch.transform.name(),
            format!("the transform the metadata was built for ({})", md.transform.name()),
        ));
    }
    Ok(())
}

pub(super) fn needs_logits(cfg: &LayerConfig, facts: &StepFacts) -> bool {
    facts.max_visible > cfg.model.topk as i64
}

/// PAGED logits read the indexer cache through 64-token pages of the real page
/// table, one table row per query token: decode-like modes with page size 64.
pub(super) fn paged_logits_apply(cfg: &LayerConfig, mode: ForwardMode) -> (bool, &'static str) {
    if mode == ForwardMode::Extend {
        (false, "extend batches score ragged keys")
    } else if cfg.model.page_size as usize != INDEXER_PAGE_TOKENS {
        (false, "the page size is not 64, so pages of the index-K cache are not table pages")
    } else {
        (true, "")
    }
}

fn indexer_stage(cfg: &LayerConfig, facts: &StepFacts, num_keys: usize) -> Result<IndexerStage> {
    if !needs_logits(cfg, facts) {
        return Ok(IndexerStage::Skip);
    }
    match paged_logits_apply(cfg, facts.mode) {
        (true, _) => Ok(IndexerStage::Paged { table_width: facts.table_pages }),
        (false, why) => {
            let stride = num_keys.next_multiple_of(4);
            let chunk_rows = ragged_chunk_rows(facts.rows, stride, cfg.logits_budget_bytes)?;
            Ok(IndexerStage::Gathered { num_keys, chunk_rows, why })
        }
    }
}

fn attention_stage(
    cfg: &LayerConfig,
    mode: ForwardMode,
    transform: TransformMethod,
    rows: usize,
    gpu: LaunchTarget,
) -> Result<AttentionStage> {
    let model = &cfg.model;
    let prefill = PrefillShape {
        s_q: rows,
        heads: model.num_q_heads,
        topk: model.topk,
        d_qk: BF16_TOKEN_ELEMS as u32,
        target: gpu.target,
    };
    match (model.kv_cache, transform) {
        (KvCacheFormat::Bf16, TransformMethod::Paged) => Ok(AttentionStage::PrefillPaged(prefill)),
        (KvCacheFormat::Fp8, TransformMethod::Ragged) => Ok(AttentionStage::PrefillRagged(prefill)),
        (KvCacheFormat::Fp8, TransformMethod::Paged) => {
            let shape = DecodeShape {
                batch: rows,
                s_q: 1,
                heads: model.num_q_heads,
                topk: model.topk,
                page_size: model.page_size,
            };
            let plan = if cfg.batch_invariant {
                DecodePlan::with_splits(shape, gpu.target, batch_invariant_splits(shape, gpu)?)?
            } else {
                DecodePlan::new(shape, gpu)?
            };
            Ok(AttentionStage::Decode(plan))
        }
        (KvCacheFormat::Bf16, TransformMethod::Ragged) => Err(invalid(
            "dispatch.transform",
            format!("RAGGED in a {} batch with a bf16 cache", mode.name()),
            "PAGED: a bf16 pool is read in place (metadata::decide never picks RAGGED for bf16)",
        )),
    }
}

/// A step's decisions plus its device data: the metadata (uploaded for this step,
/// or the fixed buffers of a CUDA-graph state that replays rewrite) and the ragged keys.
#[derive(Debug)]
pub struct StepPlan<'m> {
    pub(super) config: LayerConfig,
    pub(super) decisions: StepDecisions,
    pub(super) metadata: PlanMetadata<'m>,
    pub(super) keys: Option<DeviceKeys<'m>>,
    /// `page_table_1` has one row per query token.
    pub(super) table_per_token: bool,
    /// Query rows the caller passes, `T_pad ≥ T`: DP padding rows (spec §3.2) get
    /// zeros in `out` and +inf in `lse`, as a token without keys.
    pub(super) padded_rows: usize,
    /// One rank's share of a context-parallel round-robin split (spec §4.7): the KV
    /// store takes every token of the step (all-gathered), not only this rank's.
    pub(super) cp_split: bool,
    pub(super) table_rows: usize,
    pub(super) table_width: usize,
}

/// The ragged keys on the device, plus per-chunk `cu_seqlens_q` shifted to the
/// chunk's first row (extend PAGED top-k maps chunk-relative rows to requests).
#[derive(Debug)]
pub(super) enum DeviceKeys<'m> {
    /// Uploaded for one step from the host layout, in one buffer.
    Owned { buf: CudaSlice<i32>, slots: Range<usize>, ks: Range<usize>, ke: Range<usize>, chunk_cu: Vec<Range<usize>> },
    /// Built on the device ([`DeviceExtendState`]); the per-chunk `cu_seqlens_q`
    /// (several chunks only) uploaded from the host query lengths.
    Device {
        slots: CudaView<'m, i32>,
        ks: CudaView<'m, i32>,
        ke: CudaView<'m, i32>,
        chunk_cu: Option<(CudaSlice<i32>, Vec<Range<usize>>)>,
    },
}

impl DeviceKeys<'_> {
    pub(super) fn slots(&self) -> CudaView<'_, i32> {
        match self {
            DeviceKeys::Owned { buf, slots, .. } => buf.slice(slots.clone()),
            DeviceKeys::Device { slots, .. } => slots.slice(..),
        }
    }

    pub(super) fn num_keys(&self) -> usize {
        match self {
            DeviceKeys::Owned { slots, .. } => slots.len(),
            DeviceKeys::Device { slots, .. } => slots.len(),
        }
    }

    pub(super) fn ks(&self) -> CudaView<'_, i32> {
        match self {
            DeviceKeys::Owned { buf, ks, .. } => buf.slice(ks.clone()),
            DeviceKeys::Device { ks, .. } => ks.slice(..),
        }
    }

    pub(super) fn ke(&self) -> CudaView<'_, i32> {
        match self {
            DeviceKeys::Owned { buf, ke, .. } => buf.slice(ke.clone()),
            DeviceKeys::Device { ke, .. } => ke.slice(..),
        }
    }

    /// `cu_seqlens_q − start` of chunk `ci`, when the step has several chunks.
    pub(super) fn chunk_cu(&self, ci: usize) -> Option<CudaView<'_, i32>> {
        match self {
            DeviceKeys::Owned { buf, chunk_cu, .. } => chunk_cu.get(ci).map(|r| buf.slice(r.clone())),
            DeviceKeys::Device { chunk_cu, .. } => {
                chunk_cu.as_ref().and_then(|(buf, r)| r.get(ci).map(|r| buf.slice(r.clone())))
            }
        }
    }
}

/// Where a plan's metadata lives.
#[derive(Debug)]
pub(super) enum PlanMetadata<'m> {
    /// Uploaded for one step.
    Owned(DeviceNsaMetadata),
    /// A CUDA-graph state's buffers (fixed addresses, rewritten by each replay),
    /// also read by eager decode-like steps built on the device.
    Graph(DeviceGraphBuffers<'m>),
    /// An extend batch built on the device.
    Extend(DeviceExtendBuffers<'m>),
}

impl PlanMetadata<'_> {
    pub(super) fn field(&self, f: Field) -> Option<CudaView<'_, i32>> {
        let b = match self {
            PlanMetadata::Owned(m) => return m.field(f),
            PlanMetadata::Graph(b) => b,
            PlanMetadata::Extend(e) => return extend_field(e, f),
        };
        Some(match f {
            Field::CacheSeqlens => b.cache_seqlens.slice(..),
            Field::CuSeqlensQ | Field::NsaCuSeqlensQ => b.cu_seqlens_q.slice(..),
            Field::CuSeqlensK => b.cu_seqlens_k.slice(..),
            Field::PageTable1 => b.page_table_1.slice(..),
            Field::RealPageTable => b.real_page_table.as_ref().unwrap_or(&b.page_table_1).slice(..),
            Field::SeqlensExpanded => b.nsa_seqlens_expanded.slice(..),
            Field::NsaCacheSeqlens => b.nsa_cache_seqlens.slice(..),
            Field::NsaCuSeqlensK => b.nsa_cu_seqlens_k.slice(..),
            _ => return None,
        })
    }
}

fn extend_field<'a>(e: &'a DeviceExtendBuffers<'_>, f: Field) -> Option<CudaView<'a, i32>> {
    Some(match f {
        Field::CacheSeqlens => e.cache_seqlens.slice(..),
        Field::CuSeqlensQ => e.cu_seqlens_q.slice(..),
        Field::CuSeqlensK => e.cu_seqlens_k.slice(..),
        Field::PageTable1 => e.page_table_1.slice(..),
        Field::RealPageTable => e.real_page_table.as_ref().unwrap_or(&e.page_table_1).slice(..),
        Field::SeqlensExpanded => e.nsa_seqlens_expanded.slice(..),
        Field::NsaCacheSeqlens => e.nsa_cache_seqlens.slice(..),
        Field::NsaCuSeqlensK => e.nsa_cu_seqlens_k.slice(..),
        Field::PageTable1Flattened => e.slots.slice(..),
        Field::TopkIndicesOffset | Field::IndexerKs => e.ks.slice(..),
        Field::IndexerKe => e.ke.slice(..),
        _ => return None,
    })
}

impl<'m> StepPlan<'m> {
    /// A plan bound to the buffers of `state` for graphs of `bs` requests (step
    /// `step` of a multi-step state): capture the layer's forward once per batch
    /// size, then each step replays the metadata (one launch) and the layer graph.
    pub fn for_graph(
        rt: &Runtime,
        cfg: &LayerConfig,
        state: &'m DeviceGraphState,
        bs: usize,
        step: usize,
    ) -> Result<StepPlan<'m>> {
        let p = state.params();
        if p.page_size != cfg.model.page_size || p.topk != cfg.model.topk {
            return Err(invalid(
                "state.params.page_size/topk",
                format!("{}/{}", p.page_size, p.topk),
                format!("the layer's {}/{}", cfg.model.page_size, cfg.model.topk),
            ));
        }
        if bs == 0 || bs > state.capacity().max_bs || step >= state.steps() {
            return Err(invalid(
                "bs/step",
                format!("{bs}/{step}"),
                format!("1..={} requests and a step below {}", state.capacity().max_bs, state.steps()),
            ));
        }
        let mode = match state.mode() {
            GraphMode::Decode => ForwardMode::Decode,
            GraphMode::TargetVerify => ForwardMode::TargetVerify,
            GraphMode::DraftExtend => ForwardMode::DraftExtend,
            GraphMode::DraftExtendV2 => ForwardMode::DraftExtendV2,
        };
        let shape = state.shape(bs);
        let width = state.layout().width;
        let decisions = StepDecisions::for_graph(cfg, mode, shape.rows, width, rt.launch_target())?;
        Ok(StepPlan {
            config: cfg.clone(),
            decisions,
            metadata: PlanMetadata::Graph(state.buffers(step)),
            keys: None,
            table_per_token: true,
            padded_rows: shape.rows,
            cp_split: false,
            table_rows: shape.rows,
            table_width: width,
        })
    }
}

impl StepPlan<'static> {
    /// Decides the step and uploads what its kernels read (two host→device copies).
    pub fn new(rt: &Runtime, cfg: &LayerConfig, md: &NsaMetadata, dispatch: &Dispatch) -> Result<StepPlan<'static>> {
        let keys = if StepDecisions::needs_keys(cfg, md, dispatch) { Some(ragged_keys(md)?) } else { None };
        let num_keys = keys.as_ref().map_or(0, RaggedKeys::num_keys);
        let decisions = StepDecisions::new(cfg, md, dispatch, num_keys, rt.launch_target())?;
        if tracing::enabled!(target: "nsa::layer", tracing::Level::DEBUG) {
            for line in decisions.explain(cfg) {
                tracing::debug!(target: "nsa::layer", mode = md.mode.name(), "{line}");
            }
        }
        let stream = rt.gpu().stream();
        let metadata = DeviceNsaMetadata::upload(md, stream)?;
        let extend_paged = md.mode == ForwardMode::Extend && dispatch.transform == TransformMethod::Paged;
        let chunk_cu: Vec<Vec<i32>> = if extend_paged {
            let cu = &md.cu_seqlens_q;
            decisions.chunks.iter().map(|c| cu.iter().map(|&v| v - c.start as i32).collect()).collect()
        } else {
            Vec::new()
        };
        let keys = keys.map(|k| upload_keys(rt, &k, &chunk_cu)).transpose()?;
        Ok(StepPlan {
            config: cfg.clone(),
            decisions,
            metadata: PlanMetadata::Owned(metadata),
            keys,
            table_per_token: table_rows_per_token(md.mode),
            padded_rows: md.nsa_cache_seqlens.len().max(md.num_tokens()),
            cp_split: md.bs_idx.is_some(),
            table_rows: md.page_table_1.rows,
            table_width: md.page_table_1.width,
        })
    }
}

impl StepPlan<'_> {
    pub fn decisions(&self) -> &StepDecisions {
        &self.decisions
    }

    /// One line per stage: which kernel variant runs and why.
    pub fn explain(&self) -> String {
        self.decisions.explain(&self.config).join("\n")
    }

    /// Query tokens `T` the step computes.
    pub fn rows(&self) -> usize {
        self.decisions.rows
    }

    /// Query rows the caller passes (`T` plus DP padding rows).
    pub fn padded_rows(&self) -> usize {
        self.padded_rows
    }

    /// Whether this is one rank's share of a context-parallel split.
    pub fn cp_split(&self) -> bool {
        self.cp_split
    }

    pub fn needs(&self) -> WorkspaceNeeds {
        self.decisions.needs
    }
}

fn upload_keys(rt: &Runtime, k: &RaggedKeys, chunk_cu: &[Vec<i32>]) -> Result<DeviceKeys<'static>> {
    let mut staging = Vec::new();
    let mut push = |data: &[i32]| {
        let start = staging.len();
        staging.extend_from_slice(data);
        let range = start..staging.len();
        staging.resize(staging.len().next_multiple_of(crate::metadata::device::FIELD_ALIGN), 0);
        range
    };
    let slots = push(&k.slots);
    let ks = push(&k.ks);
    let ke = push(&k.ke);
    let chunk_cu = chunk_cu.iter().map(|cu| push(cu)).collect();
    staging.resize(staging.len().max(1), 0);
    let buf = rt.gpu().stream().clone_htod(&staging).map_err(Error::driver("uploading the ragged key layout"))?;
    Ok(DeviceKeys::Owned { buf, slots, ks, ke, chunk_cu })
}
