//! Per-forward NSA metadata (spec §3–§5, §9), built on the host from the batch
//! description the server already has.
//!
//! * [`MetadataBuilder`]: one builder per forward mode (decode, idle, target-verify,
//!   draft-extend v1/v2, extend with or without prefix, CP round-robin split) → [`NsaMetadata`].
//! * [`dispatch`]: the batch-dependent choices of spec §5 (MHA one-shot, prefill impl,
//!   PAGED/RAGGED), a pure function with a loggable reason.
//! * [`graph`]: fixed-capacity CUDA-graph buffers and what capture/replay write (§9);
//!   [`multistep`]: the multi-step draft backend over them (§9.4).
//! * [`cp`]: the context-parallel round-robin split (§4.7).
//! * [`device`]: the device mirror of an [`NsaMetadata`], uploaded in one packed copy.
//! * [`graph_device`] and [`extend_device`]: metadata built on the device from the
//!   server's device tables, for CUDA graphs and for eager steps of every mode.
//!
//! Every input is checked before anything is written: a bad batch is an
//! [`Error::InvalidArgument`] naming the field, the value and what is allowed.

mod build;
mod check;
pub mod cp;
pub mod device;
pub mod dispatch;
pub mod extend_cost;
pub mod extend_device;
pub mod graph;
pub mod graph_device;
mod host;
pub mod multistep;
pub mod seq;

pub use build::{ExtendPlan, MetadataBuilder, MetadataParams};
pub use cp::CpRank;
pub use dispatch::{decide, AttnImpl, BatchSummary, Dispatch, DispatchPolicy, PrefillBackend};
pub use extend_cost::ExtendCosts;
pub use graph::{GraphCapacity, GraphMode, GraphShape, GraphState, ReplayExtent};
pub use host::{dp_padded_tokens, DpPadding, IndexerRanges, NsaMetadata, PageTable, RealPageTable};
pub use multistep::MultiStepGraphs;

use crate::Result;

/// The forward modes metadata is built for (spec §4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ForwardMode {
    /// No requests on this rank (DP attention); an empty decode.
    #[default]
    Idle,
    /// One new token per request.
    Decode,
    /// `D` draft tokens per request, verified against the target model.
    TargetVerify,
    /// Draft model extends by each request's accepted length (+1 bonus), which varies.
    DraftExtend,
    /// Draft model extends every request by exactly `D` tokens.
    DraftExtendV2,
    /// Prefill / chunked prefill, with or without a cached prefix; never speculative.
    Extend,
}

impl ForwardMode {
    pub fn name(self) -> &'static str {
        match self {
            ForwardMode::Idle => "idle",
            ForwardMode::Decode => "decode",
            ForwardMode::TargetVerify => "target_verify",
            ForwardMode::DraftExtend => "draft_extend",
            ForwardMode::DraftExtendV2 => "draft_extend_v2",
            ForwardMode::Extend => "extend",
        }
    }
}

/// How top-k positions become KV indices (spec §5.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TransformMethod {
    /// Physical slots through `page_table_1` (§7.3).
    #[default]
    Paged,
    /// Rows of a ragged bf16 KV tensor: position + `topk_indices_offset` (§7.4).
    Ragged,
}

impl TransformMethod {
    pub fn name(self) -> &'static str {
        match self {
            TransformMethod::Paged => "PAGED",
            TransformMethod::Ragged => "RAGGED",
        }
    }
}

impl From<TransformMethod> for nsa_kernels::TopkTransform {
    fn from(m: TransformMethod) -> Self {
        match m {
            TransformMethod::Paged => nsa_kernels::TopkTransform::Paged,
            TransformMethod::Ragged => nsa_kernels::TopkTransform::Ragged,
        }
    }
}

/// The request→slot table (`req_to_token`, spec §2.1): `[rows, width]` int32,
/// row = request pool index, column p = slot of logical position p.
#[derive(Clone, Copy, Debug)]
pub struct ReqToToken<'a> {
    data: &'a [i32],
    width: usize,
}

impl<'a> ReqToToken<'a> {
    /// `data` holds whole rows of `width` (= max_context_len) slots.
    pub fn new(data: &'a [i32], width: usize) -> Result<Self> {
        if width == 0 || data.len() % width != 0 {
            return Err(crate::error::invalid(
                "req_to_token",
                format!("{} entries with width {width}", data.len()),
                "a whole number of rows of a non-zero width (max_context_len)",
            ));
        }
        Ok(ReqToToken { data, width })
    }

    pub fn rows(&self) -> usize {
        self.data.len() / self.width
    }

    /// Columns per row (max_context_len).
    pub fn width(&self) -> usize {
        self.width
    }

    pub fn row(&self, r: usize) -> &'a [i32] {
        &self.data[r * self.width..(r + 1) * self.width]
    }
}

/// The requests of a decode-like batch, one entry each.
#[derive(Clone, Copy, Debug)]
pub struct Requests<'a> {
    /// Row of each request in `req_to_token`.
    pub req_pool_indices: &'a [i32],
    /// `L_i`: KV tokens of each request, including the ones written by this forward
    /// (verify: NOT including the `D` draft tokens, which the builder adds).
    pub seq_lens: &'a [i32],
}

/// The requests of an extend batch.
#[derive(Clone, Copy, Debug)]
pub struct ExtendBatch<'a> {
    /// Row of each request in `req_to_token`.
    pub req_pool_indices: &'a [i32],
    /// `L_i` = prefix + new tokens.
    pub seq_lens: &'a [i32],
    /// `E_i`: query tokens of each request in this forward.
    pub extend_lens: &'a [i32],
    /// Cached prefix of each request (`prefix_lens[i] + extend_lens[i] == seq_lens[i]`);
    /// `None` = no request has a prefix.
    pub prefix_lens: Option<&'a [i32]>,
}

impl<'a> ExtendBatch<'a> {
    /// A pure prefill: no prefix, `E_i == L_i`.
    pub fn without_prefix(req_pool_indices: &'a [i32], seq_lens: &'a [i32]) -> Self {
        ExtendBatch { req_pool_indices, seq_lens, extend_lens: seq_lens, prefix_lens: None }
    }
}
