//! Eager step plans whose metadata is built on the device from the server's device
//! tables (`req_to_token`, `req_pool_indices`, `seq_lens`, query lengths): one
//! metadata launch per step, no host mirror of the page table, no device→host
//! copy. The decisions come from the lengths the server keeps on the host
//! ([`HostLens`]), which must equal the device ones.

use super::plan::{
    check_dispatch, check_graph_page_size, needs_logits, DeviceKeys, PlanMetadata, StepDecisions, StepFacts, StepPlan,
};
use super::LayerConfig;
use crate::error::invalid;
use crate::metadata::extend_device::DeviceExtendState;
use crate::metadata::graph_device::{DeviceGraphState, DeviceRequests};
use crate::metadata::{Dispatch, ForwardMode, GraphMode, MetadataParams, TransformMethod};
use crate::runtime::Runtime;
use crate::{Error, Result};
use cudarc::driver::CudaView;
use nsa_kernels::layout::INDEXER_PAGE_TOKENS;

/// The host copies of a batch's lengths (SGLang's `seq_lens_cpu` and
/// `extend_seq_lens_cpu` / accepted lengths): they size the step, and must equal
/// the device values the metadata kernel reads.
#[derive(Clone, Copy, Debug)]
pub struct HostLens<'a> {
    /// `L_i` per request (verify: without the `D` drafts).
    pub seq_lens: &'a [i32],
    /// Query tokens per request: extend and draft-extend v1 (accepted lengths);
    /// `None` in decode, target-verify and draft-extend v2.
    pub extend_lens: Option<&'a [i32]>,
}

/// The device batch of an eager step.
#[derive(Clone, Copy, Debug)]
pub struct DeviceBatch<'a> {
    pub reqs: DeviceRequests<'a>,
    /// Query tokens per request on the device (extend, draft-extend v1).
    pub extend_lens: Option<&'a CudaView<'a, i32>>,
}

fn check_transform(dispatch: &Dispatch, want: TransformMethod, mode: ForwardMode) -> Result<()> {
    if dispatch.transform != want {
        return Err(invalid(
            "dispatch.transform",
            dispatch.transform.name(),
            format!("{} ({} steps read table rows)", want.name(), mode.name()),
        ));
    }
    Ok(())
}

fn same_len(name: &'static str, got: usize, bs: usize) -> Result<()> {
    if got != bs {
        return Err(invalid(name, format!("length {got}"), format!("one entry per request (host seq_lens has {bs})")));
    }
    Ok(())
}

impl<'m> StepPlan<'m> {
    /// A decode-like eager step (decode, target-verify, draft-extend v1/v2, per
    /// `state`'s mode) built on the device: one launch of the metadata kernel into
    /// `state`, then the decisions from `host`. Page size 64 when any token sees
    /// more than top-k keys (the indexer reads pages through the real table).
    pub fn on_device(
        rt: &Runtime,
        cfg: &LayerConfig,
        state: &'m mut DeviceGraphState,
        batch: &DeviceBatch<'_>,
        host: HostLens<'_>,
        dispatch: &Dispatch,
    ) -> Result<StepPlan<'m>> {
        check_state(cfg, dispatch, state.params())?;
        if state.steps() != 1 {
            return Err(invalid("state", format!("{} step backends", state.steps()), "a single-step state"));
        }
        let bs = host.seq_lens.len();
        same_len("batch.reqs.seq_lens", batch.reqs.seq_lens.len(), bs)?;
        let d = state.params().draft_tokens as i64;
        let mode = match state.mode() {
            GraphMode::Decode => ForwardMode::Decode,
            GraphMode::TargetVerify => ForwardMode::TargetVerify,
            GraphMode::DraftExtend => ForwardMode::DraftExtend,
            GraphMode::DraftExtendV2 => ForwardMode::DraftExtendV2,
        };
        let accepted = match (mode, host.extend_lens) {
            (ForwardMode::DraftExtend, Some(e)) => {
                same_len("host.extend_lens", e.len(), bs)?;
                e
            }
            (ForwardMode::DraftExtend, None) => {
                return Err(invalid("host.extend_lens", "none", "the accepted length of every request (draft-extend)"))
            }
            (_, Some(_)) => {
                return Err(invalid("host.extend_lens", "given", format!("none for {} steps", mode.name())))
            }
            (_, None) => &[][..],
        };
        // Query and KV tokens of request i.
        let lens = |i: usize| -> (i64, i64) {
            let l = host.seq_lens[i] as i64;
            match mode {
                ForwardMode::Decode => (1, l),
                ForwardMode::TargetVerify => (d, l + d),
                ForwardMode::DraftExtend => (accepted[i] as i64, l),
                _ => (d, l),
            }
        };
        check_transform(dispatch, TransformMethod::Paged, mode)?;
        let cap = state.capacity();
        if bs > cap.max_bs {
            return Err(invalid("host.seq_lens", format!("{bs} requests"), format!("at most max_bs = {}", cap.max_bs)));
        }
        let (mut rows, mut max_visible) = (0i64, 0i64);
        for i in 0..bs {
            let (q, kv) = lens(i);
            if host.seq_lens[i] < 0 || q < 0 || q > kv || kv > cap.max_context_len as i64 {
                return Err(invalid(
                    "host.seq_lens",
                    format!("request {i}: {kv} KV tokens, {q} query tokens"),
                    format!("0 ≤ query tokens ≤ KV tokens ≤ max_context_len = {}", cap.max_context_len),
                ));
            }
            rows += q;
            max_visible = max_visible.max(kv);
        }
        let rows = rows as usize;
        if rows > cap.max_tokens {
            return Err(invalid(
                "host lengths",
                format!("{rows} query tokens"),
                format!("at most max_tokens = {}", cap.max_tokens),
            ));
        }
        let width = state.layout().width;
        let facts = StepFacts { mode, rows, max_visible, table_pages: width.div_ceil(INDEXER_PAGE_TOKENS) };
        if needs_logits(cfg, &facts) {
            check_graph_page_size(cfg, "decode-like steps built on the device")?;
        }
        let decisions = StepDecisions::from_facts(cfg, &facts, dispatch, 0, rt.launch_target())?;
        let reqs = &batch.reqs;
        match mode {
            ForwardMode::Decode => state.replay_decode(rt, reqs)?,
            ForwardMode::TargetVerify => state.replay_target_verify(rt, reqs)?,
            ForwardMode::DraftExtendV2 => state.replay_draft_extend_v2(rt, reqs)?,
            _ => {
                let e = batch.extend_lens.ok_or_else(|| {
                    invalid("batch.extend_lens", "none", "the accepted lengths on the device (draft-extend)")
                })?;
                state.replay_draft_extend(rt, reqs, e)?
            }
        }
        let state: &'m DeviceGraphState = state;
        Ok(StepPlan {
            config: cfg.clone(),
            decisions,
            metadata: PlanMetadata::Graph(state.buffers(0)),
            keys: None,
            table_per_token: true,
            padded_rows: rows,
            cp_split: false,
            table_rows: rows,
            table_width: width,
        })
    }

    /// An extend step (prefill, with or without cached prefixes) built on the
    /// device: one launch of the metadata kernel into `state`, then the decisions
    /// from `host` (`extend_lens` required).
    pub fn extend_on_device(
        rt: &Runtime,
        cfg: &LayerConfig,
        state: &'m mut DeviceExtendState,
        batch: &DeviceBatch<'_>,
        host: HostLens<'_>,
        dispatch: &Dispatch,
    ) -> Result<StepPlan<'m>> {
        check_state(cfg, dispatch, state.params())?;
        let e = host
            .extend_lens
            .ok_or_else(|| invalid("host.extend_lens", "none", "the query length of every request (extend)"))?;
        let x = state.extent(host.seq_lens, e)?;
        same_len("batch.reqs.seq_lens", batch.reqs.seq_lens.len(), x.bs)?;
        let d_ext = batch
            .extend_lens
            .ok_or_else(|| invalid("batch.extend_lens", "none", "the query lengths on the device (extend)"))?;
        let mode = ForwardMode::Extend;
        let visible = host.seq_lens.iter().map(|&l| l as i64).max().unwrap_or(0);
        let facts = StepFacts { mode, rows: x.rows, max_visible: visible, table_pages: state.layout().real_width };
        let decisions = StepDecisions::from_facts(cfg, &facts, dispatch, x.num_keys, rt.launch_target())?;
        // PAGED top-k of several chunks maps chunk-relative rows through cu_seqlens_q
        // shifted to each chunk's start: computed from the host lengths, one copy.
        let chunk_cu = if dispatch.transform == TransformMethod::Paged && decisions.chunks.len() > 1 {
            let mut cu = Vec::with_capacity(e.len() + 1);
            cu.push(0i32);
            for &v in e {
                cu.push(cu.last().copied().unwrap_or(0) + v);
            }
            let mut staging = Vec::new();
            let mut ranges = Vec::new();
            for c in &decisions.chunks {
                let start = staging.len();
                staging.extend(cu.iter().map(|&v| v - c.start as i32));
                ranges.push(start..staging.len());
                staging.resize(staging.len().next_multiple_of(crate::metadata::device::FIELD_ALIGN), 0);
            }
            let buf = rt.gpu().stream().clone_htod(&staging).map_err(Error::driver("uploading chunk offsets"))?;
            Some((buf, ranges))
        } else {
            None
        };
        state.build(rt, &batch.reqs, d_ext)?;
        let state: &'m DeviceExtendState = state;
        let k = state.buffers(&x);
        let keys = DeviceKeys::Device { slots: k.slots, ks: k.ks, ke: k.ke, chunk_cu };
        let width = state.layout().width;
        Ok(StepPlan {
            config: cfg.clone(),
            decisions,
            keys: Some(keys),
            metadata: PlanMetadata::Extend(state.buffers(&x)),
            table_per_token: false,
            padded_rows: x.rows,
            cp_split: false,
            table_rows: x.bs,
            table_width: width,
        })
    }
}

/// A sparse-MLA dispatch, and a state built for the layer's page size and top-k.
fn check_state(cfg: &LayerConfig, dispatch: &Dispatch, params: &MetadataParams) -> Result<()> {
    check_dispatch(dispatch)?;
    if params.page_size != cfg.model.page_size || params.topk != cfg.model.topk {
        return Err(invalid(
            "state.params.page_size/topk",
            format!("{}/{}", params.page_size, params.topk),
            format!("the layer's {}/{}", cfg.model.page_size, cfg.model.topk),
        ));
    }
    Ok(())
}
