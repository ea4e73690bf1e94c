//! Eager extend metadata built on the device (spec §4.5, §4.6): from the server's
//! device `req_to_token`, `req_pool_indices`, `seq_lens` and `extend_seq_lens`, one
//! launch of `metadata_replay.extend.p<page>` writes what
//! [`MetadataBuilder::extend`](super::MetadataBuilder::extend) computes on the host:
//! the lengths and their cumulative sums, one `page_table_1` row per request (and
//! the real table), per token the visible KV length and the window `[ks, ke)` of its
//! request's keys, and the ragged key layout (every request's slots, concatenated).
//! No host mirror of the page table, no device→host copy, no table upload.
//!
//! The buffers have fixed capacities ([`ExtendCapacity`]) allocated once; a batch
//! past them is refused on the host (from the lengths the server keeps on the host)
//! and, should the device lengths disagree, by the kernel, which then writes nothing.

use super::build::MetadataParams;
use super::check::invalid;
use super::graph_device::DeviceRequests;
use crate::ops::metadata::{self, GraphLayout, MetadataOp, ReplayInputs, ReplayScalars};
use crate::runtime::Runtime;
use crate::{Error, Result};
use cudarc::driver::{CudaSlice, CudaView};
use nsa_kernels::spec::{MetadataMode, METADATA_MAX_BATCH};

/// What one extend state holds at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtendCapacity {
    /// Requests per step.
    pub max_bs: usize,
    /// Query tokens per step (Σ `extend_seq_lens`; a chunked-prefill budget).
    pub max_tokens: usize,
    /// KV tokens per step (Σ `seq_lens`: prefixes plus new tokens).
    pub max_keys: usize,
    /// Width of a table row: the longest request (`max_context_len`).
    pub max_context_len: usize,
}

/// Device extend metadata: fixed buffers rewritten by [`DeviceExtendState::build`].
#[derive(Debug)]
pub struct DeviceExtendState {
    params: MetadataParams,
    capacity: ExtendCapacity,
    layout: GraphLayout,
    buf: CudaSlice<i32>,
    launches: u64,
}

/// Views of one built batch, each exactly as long as the batch (`bs` requests, `rows`
/// query tokens), so every consumer sees the batch and nothing stale past it.
#[derive(Debug)]
pub struct DeviceExtendBuffers<'a> {
    pub bs: usize,
    pub rows: usize,
    pub num_keys: usize,
    /// `[bs]` `L_i`.
    pub cache_seqlens: CudaView<'a, i32>,
    /// `[bs + 1]`.
    pub cu_seqlens_k: CudaView<'a, i32>,
    /// `[bs + 1]` `cu(E)`.
    pub cu_seqlens_q: CudaView<'a, i32>,
    /// `[bs, width]`, row stride the state's `max_context_len`.
    pub page_table_1: CudaView<'a, i32>,
    /// `[bs, ceil(width / page)]`; `None` with page size 1.
    pub real_page_table: Option<CudaView<'a, i32>>,
    /// `[rows]` KV tokens each query token sees.
    pub nsa_seqlens_expanded: CudaView<'a, i32>,
    /// `[rows]` clipped to top-k.
    pub nsa_cache_seqlens: CudaView<'a, i32>,
    /// `[rows + 1]`.
    pub nsa_cu_seqlens_k: CudaView<'a, i32>,
    /// `[num_keys]` every request's slots for positions `[0, L_i)`.
    pub slots: CudaView<'a, i32>,
    /// `[rows]` first key of each token's request in `slots`.
    pub ks: CudaView<'a, i32>,
    /// `[rows]` `ks + nsa_seqlens_expanded`.
    pub ke: CudaView<'a, i32>,
}

/// A host copy of one built batch (tests, debugging).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtendSnapshot {
    pub cache_seqlens: Vec<i32>,
    pub cu_seqlens_k: Vec<i32>,
    pub cu_seqlens_q: Vec<i32>,
    /// `[bs, width]` with the state's width (columns past the batch's longest request
    /// are stale).
    pub page_table_1: Vec<i32>,
    pub real_page_table: Option<Vec<i32>>,
    pub nsa_seqlens_expanded: Vec<i32>,
    pub nsa_cache_seqlens: Vec<i32>,
    pub nsa_cu_seqlens_k: Vec<i32>,
    pub slots: Vec<i32>,
    pub ks: Vec<i32>,
    pub ke: Vec<i32>,
}

/// The host lengths of a batch, checked against a state's capacity (made only by
/// [`DeviceExtendState::extent`], so its views always fit the buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExtendExtent {
    pub bs: usize,
    pub rows: usize,
    pub num_keys: usize,
    pub max_seq_len: usize,
}

impl DeviceExtendState {
    /// Allocates the buffers once (zeroed).
    pub fn new(rt: &Runtime, params: MetadataParams, capacity: ExtendCapacity) -> Result<Self> {
        let ExtendCapacity { max_bs, max_tokens, max_keys, max_context_len: w } = capacity;
        let max_batch = METADATA_MAX_BATCH as usize;
        if max_bs == 0 || max_bs > max_batch {
            return Err(invalid(
                "capacity.max_bs",
                max_bs.to_string(),
                format!("1..={max_batch} (requests the metadata kernel holds per launch)"),
            ));
        }
        for (name, v) in [("capacity.max_tokens", max_tokens), ("capacity.max_keys", max_keys)] {
            if v == 0 {
                return Err(invalid(name, "0", "at least 1"));
            }
        }
        if w == 0 {
            return Err(invalid("capacity.max_context_len", "0", "at least 1 (the longest request's KV length)"));
        }
        if params.page_size == 0 {
            return Err(invalid("params.page_size", "0", "at least 1"));
        }
        let layout = GraphLayout::extend(max_bs, max_tokens, max_keys, w, params.page_size);
        if layout.total_len() > i32::MAX as usize {
            return Err(invalid(
                "capacity",
                format!("{capacity:?}"),
                "at most 2^31-1 int32 entries of extend metadata (fewer requests, tokens or keys per step)",
            ));
        }
        let buf = rt
            .gpu()
            .stream()
            .alloc_zeros::<i32>(layout.total_len())
            .map_err(Error::driver("allocating extend metadata"))?;
        Ok(DeviceExtendState { params, capacity, layout, buf, launches: 0 })
    }

    pub fn capacity(&self) -> ExtendCapacity {
        self.capacity
    }

    pub fn params(&self) -> &MetadataParams {
        &self.params
    }

    pub fn layout(&self) -> &GraphLayout {
        &self.layout
    }

    /// Kernel launches so far (one per build).
    pub fn launches(&self) -> u64 {
        self.launches
    }

    /// Checks the host lengths (`seq_lens_cpu`, `extend_seq_lens_cpu`) of a batch
    /// against the capacity; what the device lengths must equal.
    pub fn extent(&self, seq_lens: &[i32], extend_lens: &[i32]) -> Result<ExtendExtent> {
        let bs = seq_lens.len();
        if extend_lens.len() != bs {
            return Err(invalid(
                "extend_lens",
                format!("length {}", extend_lens.len()),
                format!("one entry per request (seq_lens has {bs})"),
            ));
        }
        if bs > self.capacity.max_bs {
            return Err(invalid(
                "seq_lens",
                format!("{bs} requests"),
                format!("at most max_bs = {}", self.capacity.max_bs),
            ));
        }
        let (mut rows, mut keys, mut max_len) = (0usize, 0usize, 0usize);
        for (i, (&l, &e)) in seq_lens.iter().zip(extend_lens).enumerate() {
            if l < 0 || e < 0 || e > l {
                return Err(invalid(
                    "extend_lens",
                    format!("extend_lens[{i}] = {e} with seq_lens[{i}] = {l}"),
                    "0 ≤ extend_lens[i] ≤ seq_lens[i] (the new tokens are counted in seq_lens)",
                ));
            }
            rows += e as usize;
            keys += l as usize;
            max_len = max_len.max(l as usize);
        }
        let cap = self.capacity;
        if max_len > cap.max_context_len {
            return Err(invalid(
                "seq_lens",
                format!("a request of {max_len} tokens"),
                format!("at most max_context_len = {}", cap.max_context_len),
            ));
        }
        if rows > cap.max_tokens {
            return Err(invalid(
                "extend_lens",
                format!("Σ = {rows}"),
                format!("at most max_tokens = {}", cap.max_tokens),
            ));
        }
        if keys > cap.max_keys {
            return Err(invalid("seq_lens", format!("Σ = {keys}"), format!("at most max_keys = {}", cap.max_keys)));
        }
        Ok(ExtendExtent { bs, rows, num_keys: keys, max_seq_len: max_len })
    }

    /// One launch: the metadata of the batch in `reqs` with query lengths
    /// `extend_lens` (all on the device). Never allocates or synchronises (unless
    /// device checks are reported).
    pub fn build(&mut self, rt: &Runtime, reqs: &DeviceRequests<'_>, extend_lens: &CudaView<'_, i32>) -> Result<()> {
        let op = MetadataOp::Replay(ReplayInputs {
            seq_lens: reqs.seq_lens,
            req_pool_indices: reqs.req_pool_indices,
            extend_lens: Some(extend_lens),
            req_to_token: reqs.req_to_token,
            req_to_token_width: reqs.req_to_token_width,
        });
        let scalars = ReplayScalars { bs: reqs.seq_lens.len(), topk: self.params.topk, draft_tokens: 0 };
        let result = metadata::metadata_replay(rt, MetadataMode::Extend, &op, scalars, &self.layout, &mut self.buf);
        // A launch whose batch the kernel rejected still ran.
        if matches!(result, Ok(()) | Err(Error::DeviceRejected { .. })) {
            self.launches += 1;
        }
        result
    }

    /// The buffers of a built batch of extent `x` (from [`DeviceExtendState::extent`]).
    pub fn buffers(&self, x: &ExtendExtent) -> DeviceExtendBuffers<'_> {
        let l = &self.layout;
        let view = |offset: usize, len: usize| self.buf.slice(offset..offset + len);
        DeviceExtendBuffers {
            bs: x.bs,
            rows: x.rows,
            num_keys: x.num_keys,
            cache_seqlens: view(l.cache_seqlens, x.bs),
            cu_seqlens_k: view(l.cu_seqlens_k, x.bs + 1),
            cu_seqlens_q: view(l.cu_seqlens_q, x.bs + 1),
            page_table_1: view(l.page_table_1, x.bs * l.width),
            real_page_table: (l.page_size > 1).then(|| view(l.real_page_table, x.bs * l.real_width)),
            nsa_seqlens_expanded: view(l.seqlens_expanded, x.rows),
            nsa_cache_seqlens: view(l.nsa_cache_seqlens, x.rows),
            nsa_cu_seqlens_k: view(l.nsa_cu_seqlens_k, x.rows + 1),
            slots: view(l.slots, x.num_keys),
            ks: view(l.ks, x.rows),
            ke: view(l.ke, x.rows),
        }
    }

    /// Downloads a built batch (synchronises: tests and debugging only).
    pub fn download(&self, rt: &Runtime, x: &ExtendExtent) -> Result<ExtendSnapshot> {
        let b = self.buffers(x);
        let stream = rt.gpu().stream();
        let get = |v: &CudaView<'_, i32>| stream.clone_dtoh(v).map_err(Error::driver("downloading extend metadata"));
        Ok(ExtendSnapshot {
            cache_seqlens: get(&b.cache_seqlens)?,
            cu_seqlens_k: get(&b.cu_seqlens_k)?,
            cu_seqlens_q: get(&b.cu_seqlens_q)?,
            page_table_1: get(&b.page_table_1)?,
            real_page_table: b.real_page_table.as_ref().map(get).transpose()?,
            nsa_seqlens_expanded: get(&b.nsa_seqlens_expanded)?,
            nsa_cache_seqlens: get(&b.nsa_cache_seqlens)?,
            nsa_cu_seqlens_k: get(&b.nsa_cu_seqlens_k)?,
            slots: get(&b.slots)?,
            ks: get(&b.ks)?,
            ke: get(&b.ke)?,
        })
    }
}
