//! CUDA-graph metadata state on the device (spec §9): the fixed-capacity buffers of
//! [`GraphState`](super::GraphState), allocated once, and capture/replay as ONE
//! launch each of the generated metadata kernel (`metadata_replay.<mode>.p<page>`),
//! which writes exactly what the host replay writes. Nothing allocates, nothing
//! synchronises with the host: the batch (seq_lens, req_pool_indices, accepted
//! lengths, req_to_token) stays on the device and the kernel computes the max KV
//! length, the cumulative sums and the row mapping itself.
//!
//! A multi-step draft state ([`DeviceGraphState::multi_step`], §9.4) holds the buffers
//! of every step backend in one allocation and fills them all in the same launch.
//!
//! Differences from the host replay: the host checks slots (inside the pool,
//! page-aligned) and i32 overflow of Σ lengths before writing; the kernel copies
//! slots as they are (it never dereferences them) and rejects only what it can see
//! per entry (a rejected batch writes nothing, reported with device checks on). The
//! extent of a replay ([`ReplayExtent`](super::ReplayExtent)) depends on device values,
//! so replay returns nothing.

use super::build::MetadataParams;
use super::check::invalid;
use super::graph::{GraphCapacity, GraphMode, GraphShape, SEQ_LEN_FILL};
use super::host::PageTable;
use crate::ops::metadata::{self, GraphLayout, MetadataOp, ReplayInputs, ReplayScalars};
use crate::runtime::Runtime;
use crate::{Error, Result};
use cudarc::driver::{CudaSlice, CudaView};
use nsa_kernels::spec::MetadataMode;

/// The batch of one replay, on the device.
#[derive(Clone, Copy, Debug)]
pub struct DeviceRequests<'a> {
    /// `[rows, width]` request→slot table (row-major, `width` = its max_context_len).
    pub req_to_token: &'a CudaView<'a, i32>,
    pub req_to_token_width: usize,
    /// `[bs]` row of each request.
    pub req_pool_indices: &'a CudaView<'a, i32>,
    /// `[bs]` `L_i` (verify: without the D drafts).
    pub seq_lens: &'a CudaView<'a, i32>,
}

/// Persistent graph metadata buffers of one mode on the device.
#[derive(Debug)]
pub struct DeviceGraphState {
    params: MetadataParams,
    mode: GraphMode,
    capacity: GraphCapacity,
    layout: GraphLayout,
    buf: CudaSlice<i32>,
    launches: u64,
}

/// The device views a graph captured for one step reads, each the field's whole
/// capacity (a graph of `bs` requests reads the first `shape.rows` rows).
#[derive(Debug)]
pub struct DeviceGraphBuffers<'a> {
    pub cache_seqlens: CudaView<'a, i32>,
    pub cu_seqlens_k: CudaView<'a, i32>,
    /// Also `nsa_cu_seqlens_q` (both are `arange`).
    pub cu_seqlens_q: CudaView<'a, i32>,
    pub page_table_1: CudaView<'a, i32>,
    /// `None` with page size 1: the real table is `page_table_1`.
    pub real_page_table: Option<CudaView<'a, i32>>,
    /// Decode: `cache_seqlens` (the alias).
    pub nsa_seqlens_expanded: CudaView<'a, i32>,
    pub nsa_cache_seqlens: CudaView<'a, i32>,
    pub nsa_cu_seqlens_k: CudaView<'a, i32>,
    pub extend_lens: CudaView<'a, i32>,
}

/// A host copy of one step's buffers (tests, debugging), with the host state's shapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphSnapshot {
    pub cache_seqlens: Vec<i32>,
    pub cu_seqlens_k: Vec<i32>,
    pub cu_seqlens_q: Vec<i32>,
    pub page_table_1: PageTable,
    /// `None` with page size 1 (aliased).
    pub real_page_table: Option<PageTable>,
    /// The expanded-lengths buffer itself (decode never writes it; it aliases `cache_seqlens`).
    pub nsa_seqlens_expanded: Vec<i32>,
    pub nsa_cache_seqlens: Vec<i32>,
    pub nsa_cu_seqlens_k: Vec<i32>,
    pub extend_lens: Vec<i32>,
}

fn kernel_mode(mode: GraphMode) -> MetadataMode {
    match mode {
        GraphMode::Decode => MetadataMode::Decode,
        GraphMode::TargetVerify => MetadataMode::TargetVerify,
        GraphMode::DraftExtend | GraphMode::DraftExtendV2 => MetadataMode::DraftExtend,
    }
}

impl DeviceGraphState {
    /// Allocates and initialises every buffer once (`init_cuda_graph_state`, the
    /// values of [`GraphState::new`](super::GraphState::new)).
    pub fn new(rt: &Runtime, params: MetadataParams, mode: GraphMode, capacity: GraphCapacity) -> Result<Self> {
        Self::with_steps(rt, params, mode, capacity, 1)
    }

    /// The multi-step draft backend (§9.4): `speculative_num_steps − 1` decode step
    /// states (at least one) filled by one launch.
    pub fn multi_step(
        rt: &Runtime,
        params: MetadataParams,
        capacity: GraphCapacity,
        speculative_num_steps: usize,
    ) -> Result<Self> {
        if speculative_num_steps < 2 {
            return Err(invalid(
                "speculative_num_steps",
                speculative_num_steps.to_string(),
                "at least 2 (steps − 1 draft backends; with none there is nothing to replay)",
            ));
        }
        Self::with_steps(rt, params, GraphMode::Decode, capacity, speculative_num_steps - 1)
    }

    fn with_steps(
        rt: &Runtime,
        params: MetadataParams,
        mode: GraphMode,
        capacity: GraphCapacity,
        steps: usize,
    ) -> Result<Self> {
        // The host state's validation (params, D, capacity) without its host buffers.
        capacity.check(&params, mode)?;
        let GraphCapacity { max_bs, max_tokens, max_context_len: w } = capacity;
        let max_batch = nsa_kernels::spec::METADATA_MAX_BATCH as usize;
        if max_bs > max_batch {
            return Err(invalid(
                "max_bs",
                max_bs.to_string(),
                format!("at most {max_batch} (requests the metadata kernel holds per replay)"),
            ));
        }
        let layout = GraphLayout::new(max_bs, max_tokens, w, params.page_size, steps);
        let total = layout.total_len();
        if total > i32::MAX as usize {
            return Err(invalid("capacity", format!("{capacity:?}"), "at most 2^31-1 int32 entries of graph metadata"));
        }
        // The initial image: SEQ_LEN_FILL lengths, the arange, zeros elsewhere.
        let mut image = vec![0i32; total.max(1)];
        for s in 0..steps {
            let base = s * layout.step_len;
            image[base + layout.cache_seqlens..][..max_bs].fill(SEQ_LEN_FILL);
            for (k, v) in image[base + layout.cu_seqlens_q..][..=max_tokens].iter_mut().enumerate() {
                *v = k as i32;
            }
        }
        let buf = rt.gpu().stream().clone_htod(&image).map_err(Error::driver("allocating graph metadata"))?;
        Ok(DeviceGraphState { params, mode, capacity, layout, buf, launches: 0 })
    }

    pub fn mode(&self) -> GraphMode {
        self.mode
    }

    pub fn capacity(&self) -> GraphCapacity {
        self.capacity
    }

    pub fn params(&self) -> &MetadataParams {
        &self.params
    }

    /// Step backends this state fills (1 unless multi-step).
    pub fn steps(&self) -> usize {
        self.layout.steps
    }

    pub fn layout(&self) -> &GraphLayout {
        &self.layout
    }

    /// Kernel launches so far (capture and replay: one each).
    pub fn launches(&self) -> u64 {
        self.launches
    }

    /// The extents a graph of `bs` requests is bound to.
    pub fn shape(&self, bs: usize) -> GraphShape {
        GraphShape {
            mode: self.mode,
            bs,
            rows: metadata::graph_rows(kernel_mode(self.mode), bs, self.params.draft_tokens),
            max_seq_len_k: self.capacity.max_context_len,
            max_seq_len_q: 1,
        }
    }

    /// The buffers step `step`'s graphs bind (fixed addresses for the state's lifetime).
    pub fn buffers(&self, step: usize) -> DeviceGraphBuffers<'_> {
        assert!(step < self.layout.steps, "step {step} of {}", self.layout.steps);
        let l = &self.layout;
        let base = step * l.step_len;
        let view = |offset: usize, len: usize| self.buf.slice(base + offset..base + offset + len);
        let expanded = match self.mode {
            GraphMode::Decode => view(l.cache_seqlens, l.max_bs),
            _ => view(l.seqlens_expanded, l.max_tokens),
        };
        DeviceGraphBuffers {
            cache_seqlens: view(l.cache_seqlens, l.max_bs),
            cu_seqlens_k: view(l.cu_seqlens_k, l.max_bs + 1),
            cu_seqlens_q: view(l.cu_seqlens_q, l.max_tokens + 1),
            page_table_1: view(l.page_table_1, l.max_tokens * l.width),
            real_page_table: (l.page_size > 1).then(|| view(l.real_page_table, l.max_tokens * l.real_width)),
            nsa_seqlens_expanded: expanded,
            nsa_cache_seqlens: view(l.nsa_cache_seqlens, l.max_tokens),
            nsa_cu_seqlens_k: view(l.nsa_cu_seqlens_k, l.max_tokens + 1),
            extend_lens: view(l.extend_lens, l.max_bs),
        }
    }

    /// Capture (§9.2) with the capture-time `seq_lens` on the device (padded requests:
    /// [`SEQ_LEN_FILL`]); one launch writing what [`GraphState::capture`](super::GraphState::capture) writes.
    pub fn capture(&mut self, rt: &Runtime, seq_lens: &CudaView<'_, i32>) -> Result<GraphShape> {
        let bs = seq_lens.len();
        self.launch(rt, &MetadataOp::Capture { seq_lens }, bs)?;
        Ok(self.shape(bs))
    }

    /// DECODE replay (§9.3); for a multi-step state, every step backend.
    pub fn replay_decode(&mut self, rt: &Runtime, reqs: &DeviceRequests<'_>) -> Result<()> {
        self.replay(rt, GraphMode::Decode, reqs, None)
    }

    /// TARGET_VERIFY replay: KV lengths `L_i + D`, rows repeated `D` times.
    pub fn replay_target_verify(&mut self, rt: &Runtime, reqs: &DeviceRequests<'_>) -> Result<()> {
        self.replay(rt, GraphMode::TargetVerify, reqs, None)
    }

    /// DRAFT_EXTEND (v1) replay with the accepted lengths on the device.
    pub fn replay_draft_extend(
        &mut self,
        rt: &Runtime,
        reqs: &DeviceRequests<'_>,
        extend_lens: &CudaView<'_, i32>,
    ) -> Result<()> {
        self.replay(rt, GraphMode::DraftExtend, reqs, Some(extend_lens))
    }

    /// DRAFT_EXTEND_V2 replay: every request extends by exactly `D`.
    pub fn replay_draft_extend_v2(&mut self, rt: &Runtime, reqs: &DeviceRequests<'_>) -> Result<()> {
        self.replay(rt, GraphMode::DraftExtendV2, reqs, None)
    }

    fn replay(
        &mut self,
        rt: &Runtime,
        mode: GraphMode,
        reqs: &DeviceRequests<'_>,
        extend_lens: Option<&CudaView<'_, i32>>,
    ) -> Result<()> {
        if mode != self.mode {
            return Err(invalid(
                "mode",
                mode.name(),
                format!("{} (this graph state was built for {} graphs)", self.mode.name(), self.mode.name()),
            ));
        }
        let op = MetadataOp::Replay(ReplayInputs {
            seq_lens: reqs.seq_lens,
            req_pool_indices: reqs.req_pool_indices,
            extend_lens,
            req_to_token: reqs.req_to_token,
            req_to_token_width: reqs.req_to_token_width,
        });
        self.launch(rt, &op, reqs.seq_lens.len())
    }

    fn launch(&mut self, rt: &Runtime, op: &MetadataOp<'_>, bs: usize) -> Result<()> {
        let scalars = ReplayScalars { bs, topk: self.params.topk, draft_tokens: self.params.draft_tokens };
        let mode = kernel_mode(self.mode);
        // A launch whose batch the kernel rejected still ran.
        let result = metadata::metadata_replay(rt, mode, op, scalars, &self.layout, &mut self.buf);
        if matches!(result, Ok(()) | Err(Error::DeviceRejected { .. })) {
            self.launches += 1;
        }
        result
    }

    /// Downloads step `step`'s buffers (synchronises: tests and debugging only).
    pub fn download(&self, rt: &Runtime, step: usize) -> Result<GraphSnapshot> {
        assert!(step < self.layout.steps, "step {step} of {}", self.layout.steps);
        let l = &self.layout;
        let all = rt.gpu().stream().clone_dtoh(&self.buf).map_err(Error::driver("downloading graph metadata"))?;
        let base = step * l.step_len;
        let get = |offset: usize, len: usize| all[base + offset..base + offset + len].to_vec();
        let table = |offset: usize, width: usize| PageTable {
            rows: l.max_tokens,
            width,
            data: get(offset, l.max_tokens * width),
        };
        Ok(GraphSnapshot {
            cache_seqlens: get(l.cache_seqlens, l.max_bs),
            cu_seqlens_k: get(l.cu_seqlens_k, l.max_bs + 1),
            cu_seqlens_q: get(l.cu_seqlens_q, l.max_tokens + 1),
            page_table_1: table(l.page_table_1, l.width),
            real_page_table: (l.page_size > 1).then(|| table(l.real_page_table, l.real_width)),
            nsa_seqlens_expanded: get(l.seqlens_expanded, l.max_tokens),
            nsa_cache_seqlens: get(l.nsa_cache_seqlens, l.max_tokens),
            nsa_cu_seqlens_k: get(l.nsa_cu_seqlens_k, l.max_tokens + 1),
            extend_lens: get(l.extend_lens, l.max_bs),
        })
    }
}
