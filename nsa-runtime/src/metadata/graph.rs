//! CUDA-graph metadata state (spec §9), host side: fixed-capacity buffers that
//! capture binds once and replay rewrites in place, never reallocating. The device
//! replay kernel mirrors [`GraphState`]'s replay functions write for write.
//!
//! One [`GraphState`] serves one mode (the reference keeps separate backends for
//! decode, verify and draft-extend graphs) and every captured batch size: a graph
//! of `bs` requests is bound to the first `bs` (or `bs × D`) entries of each buffer.
//! The reference allocates the small per-token buffers per captured bs instead;
//! sharing is equivalent because graphs of one backend replay one at a time on one
//! stream, and it keeps the footprint at one set of buffers.
//!
//! Replay writes only the current extent ([`ReplayExtent`]); rows and columns past it
//! keep values of earlier captures/replays (§9.3), so consumers bound every read by
//! the lengths. `cu_seqlens_q` / `nsa_cu_seqlens_q` are `arange` and never written.

use super::build::MetadataParams;
use super::check::{self, invalid};
use super::host::{PageTable, RealPageTable};
use super::seq;
use super::{ReqToToken, Requests};
use crate::Result;

/// Sizes fixed at `init_cuda_graph_state` (§9.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphCapacity {
    /// Largest captured batch size.
    pub max_bs: usize,
    /// Largest number of query rows (`max_bs` for decode, `max_bs × D` for verify and draft-extend).
    pub max_tokens: usize,
    /// Width of the page-size-1 table (`max_context_len`, = `max_seq_len_k` of every graph).
    pub max_context_len: usize,
}

/// The decode-like modes graphs serve (graphs never serve plain extend).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphMode {
    Decode,
    TargetVerify,
    DraftExtend,
    DraftExtendV2,
}

impl GraphMode {
    pub fn name(self) -> &'static str {
        match self {
            GraphMode::Decode => "decode",
            GraphMode::TargetVerify => "target_verify",
            GraphMode::DraftExtend => "draft_extend",
            GraphMode::DraftExtendV2 => "draft_extend_v2",
        }
    }

    /// Query rows a captured graph has per request.
    pub fn rows_per_request(self, d: u32) -> usize {
        match self {
            GraphMode::Decode => 1,
            _ => d as usize,
        }
    }
}

impl GraphCapacity {
    /// Checks `params` and that this capacity holds a full batch of `mode`; returns
    /// the query rows per request. Shared by the host and the device graph state.
    pub fn check(&self, params: &MetadataParams, mode: GraphMode) -> Result<usize> {
        super::MetadataBuilder::new(*params)?;
        let per_req = mode.rows_per_request(params.draft_tokens);
        if per_req == 0 {
            return Err(invalid(
                "draft_tokens",
                "0",
                format!("D ≥ 1 (speculative_num_draft_tokens) for {} graphs", mode.name()),
            ));
        }
        let needed = self.max_bs.saturating_mul(per_req);
        if needed > self.max_tokens {
            return Err(invalid(
                "max_tokens",
                self.max_tokens.to_string(),
                format!("at least max_bs × {per_req} = {needed} query rows for {} graphs", mode.name()),
            ));
        }
        Ok(per_req)
    }
}

/// The extents one captured graph is bound to (its kernels see exactly these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphShape {
    pub mode: GraphMode,
    pub bs: usize,
    /// Query rows: `bs` (decode) or `bs × D`. `page_table_1`, `real_page_table`,
    /// `nsa_*` are bound to this many rows (`+ 1` for the cu arrays); the graph's
    /// `nsa_extend_seq_lens` is `[1] * rows`.
    pub rows: usize,
    /// Always the table width `max_context_len` in graphs.
    pub max_seq_len_k: usize,
    pub max_seq_len_q: usize,
}

/// What one replay wrote; everything else keeps earlier values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayExtent {
    /// `cache_seqlens[..bs]`, `cu_seqlens_k[1..=bs]`.
    pub bs: usize,
    /// `page_table_1[..rows, ..page_cols]`, `real_page_table[..rows, ..real_cols]`.
    pub rows: usize,
    /// `nsa_seqlens_expanded[..size]` (not in decode, where it aliases `cache_seqlens`),
    /// `nsa_cache_seqlens[..size]`, `nsa_cu_seqlens_k[1..=size]`.
    pub size: usize,
    /// Max KV length of the batch (`max_len` / `max_seqlen_k` of §9.5).
    pub page_cols: usize,
    /// `ceil(page_cols / page_size)`; 0 with page size 1 (the alias needs no write).
    pub real_cols: usize,
}

/// Persistent CUDA-graph metadata buffers of one mode (§9.1–9.3).
#[derive(Clone, Debug)]
pub struct GraphState {
    params: MetadataParams,
    mode: GraphMode,
    capacity: GraphCapacity,
    /// `[max_bs]`: KV length per request (`+D` for verify). Initialised to the
    /// padded-request fill value 1.
    cache_seqlens: Vec<i32>,
    /// `[max_bs + 1]`: element 0 is never written.
    cu_seqlens_k: Vec<i32>,
    /// `[max_tokens + 1]` arange: both `cu_seqlens_q` and `nsa_cu_seqlens_q`.
    arange: Vec<i32>,
    /// `[max_tokens, max_context_len]`.
    page_table_1: PageTable,
    /// `[max_tokens, ceil(max_context_len / page_size)]`, or aliased (page size 1).
    real_page_table: RealPageTable,
    /// `[max_tokens]`; unused in decode (aliases `cache_seqlens`).
    nsa_seqlens_expanded: Vec<i32>,
    /// `[max_tokens]`.
    nsa_cache_seqlens: Vec<i32>,
    /// `[max_tokens + 1]`: element 0 is never written.
    nsa_cu_seqlens_k: Vec<i32>,
    /// `[max_bs]` host copy of the draft-extend lengths of the last replay.
    extend_lens: Vec<i32>,
    last: Option<ReplayExtent>,
}

/// Value of `seq_lens` for padded requests of a captured batch (§9.1).
pub const SEQ_LEN_FILL: i32 = 1;

impl GraphState {
    /// Allocates every buffer once at full capacity (`init_cuda_graph_state`).
    pub fn new(params: MetadataParams, mode: GraphMode, capacity: GraphCapacity) -> Result<Self> {
        capacity.check(&params, mode)?;
        let GraphCapacity { max_bs, max_tokens, max_context_len: w } = capacity;
        check::fits_i32("max_tokens", max_tokens as i64 + 1, "query rows + 1")?;
        let real_page_table = match params.page_size {
            1 => RealPageTable::Aliased,
            p => RealPageTable::Table(PageTable::zeros(max_tokens, seq::real_cols(w, p))),
        };
        let mut arange = Vec::new();
        seq::arange_into(max_tokens + 1, &mut arange);
        Ok(GraphState {
            params,
            mode,
            capacity,
            cache_seqlens: vec![SEQ_LEN_FILL; max_bs],
            cu_seqlens_k: vec![0; max_bs + 1],
            arange,
            page_table_1: PageTable::zeros(max_tokens, w),
            real_page_table,
            nsa_seqlens_expanded: vec![0; max_tokens],
            nsa_cache_seqlens: vec![0; max_tokens],
            nsa_cu_seqlens_k: vec![0; max_tokens + 1],
            extend_lens: vec![0; max_bs],
            last: None,
        })
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

    /// The extents a graph of `bs` requests is bound to.
    pub fn shape(&self, bs: usize) -> GraphShape {
        GraphShape {
            mode: self.mode,
            bs,
            rows: bs * self.mode.rows_per_request(self.params.draft_tokens),
            max_seq_len_k: self.capacity.max_context_len,
            max_seq_len_q: 1,
        }
    }

    /// What the last replay wrote.
    pub fn last_replay(&self) -> Option<ReplayExtent> {
        self.last
    }

    /// `[max_bs]`.
    pub fn cache_seqlens(&self) -> &[i32] {
        &self.cache_seqlens
    }

    /// `[max_bs + 1]`.
    pub fn cu_seqlens_k(&self) -> &[i32] {
        &self.cu_seqlens_k
    }

    /// `[max_tokens + 1]` arange (`cu_seqlens_q`, `nsa_cu_seqlens_q`).
    pub fn cu_seqlens_q(&self) -> &[i32] {
        &self.arange
    }

    pub fn page_table_1(&self) -> &PageTable {
        &self.page_table_1
    }

    /// The real page table, resolving the page-size-1 alias.
    pub fn real_table(&self) -> &PageTable {
        match &self.real_page_table {
            RealPageTable::Aliased => &self.page_table_1,
            RealPageTable::Table(t) => t,
        }
    }

    /// `[max_tokens]`, except decode where the expanded lengths ARE `cache_seqlens`.
    pub fn nsa_seqlens_expanded(&self) -> &[i32] {
        match self.mode {
            GraphMode::Decode => &self.cache_seqlens,
            _ => &self.nsa_seqlens_expanded,
        }
    }

    /// `[max_tokens]`.
    pub fn nsa_cache_seqlens(&self) -> &[i32] {
        &self.nsa_cache_seqlens
    }

    /// `[max_tokens + 1]`.
    pub fn nsa_cu_seqlens_k(&self) -> &[i32] {
        &self.nsa_cu_seqlens_k
    }

    /// `[max_bs]`: the draft-extend lengths of the last replay (host copy).
    pub fn extend_lens(&self) -> &[i32] {
        &self.extend_lens
    }

    /// (address, capacity) of every buffer, for tests asserting that capture and
    /// replay never reallocate (the device mirror binds these addresses once).
    pub fn allocation_fingerprint(&self) -> Vec<(usize, usize)> {
        let mut v: Vec<&Vec<i32>> = vec![
            &self.cache_seqlens,
            &self.cu_seqlens_k,
            &self.arange,
            &self.page_table_1.data,
            &self.nsa_seqlens_expanded,
            &self.nsa_cache_seqlens,
            &self.nsa_cu_seqlens_k,
            &self.extend_lens,
        ];
        if let RealPageTable::Table(t) = &self.real_page_table {
            v.push(&t.data);
        }
        v.iter().map(|b| (b.as_ptr() as usize, b.capacity())).collect()
    }

    /// Capture (§9.2) with the capture-time `seq_lens` (padded requests: [`SEQ_LEN_FILL`]).
    /// Writes the length family for `bs = seq_lens.len()`; verify and both draft-extend
    /// modes use `L_i + D`, as the reference does. The page table is left as is.
    pub fn capture(&mut self, seq_lens: &[i32]) -> Result<GraphShape> {
        let bs = seq_lens.len();
        self.check_bs(bs)?;
        check::non_negative("seq_lens", seq_lens)?;
        let shape = self.shape(bs);
        let d = self.params.draft_tokens as i32;
        let (add, q) = match self.mode {
            GraphMode::Decode => (0, 1),
            _ => (d, d),
        };
        let total: i64 = seq_lens.iter().map(|&l| l as i64 + add as i64).sum();
        check::fits_i32("seq_lens", total, "Σ KV lengths")?;
        let mut size = 0;
        for (i, &l) in seq_lens.iter().enumerate() {
            self.cache_seqlens[i] = l + add;
            size = self.write_expanded(size, l + add, q);
        }
        seq::cumsum_into_slice(&self.cache_seqlens[..bs], &mut self.cu_seqlens_k[1..]);
        seq::cumsum_into_slice(&self.nsa_cache_seqlens[..size], &mut self.nsa_cu_seqlens_k[1..]);
        // The real table of the (unchanged) rows, as the reference recomputes it.
        let w = self.capacity.max_context_len;
        if let RealPageTable::Table(real) = &mut self.real_page_table {
            let width = real.width;
            seq::transform_block(
                &self.page_table_1.data,
                w,
                shape.rows,
                w,
                self.params.page_size,
                &mut real.data,
                width,
            );
        }
        Ok(shape)
    }

    /// DECODE replay (§9.3): lengths, `page_table_1[..bs, ..max_len]`, the real table.
    pub fn replay_decode(&mut self, table: &ReqToToken<'_>, reqs: Requests<'_>) -> Result<ReplayExtent> {
        self.replay(GraphMode::Decode, table, reqs, None)
    }

    /// TARGET_VERIFY replay: KV lengths `L_i + D`, rows repeated `D` times.
    pub fn replay_target_verify(&mut self, table: &ReqToToken<'_>, reqs: Requests<'_>) -> Result<ReplayExtent> {
        self.replay(GraphMode::TargetVerify, table, reqs, None)
    }

    /// DRAFT_EXTEND (v1) replay: request i extends by `extend_lens[i]` (the accept
    /// lengths), already counted in `seq_lens`. Σ `extend_lens` must fit the `bs × D`
    /// rows of the captured graph; rows past it keep stale values.
    pub fn replay_draft_extend(
        &mut self,
        table: &ReqToToken<'_>,
        reqs: Requests<'_>,
        extend_lens: &[i32],
    ) -> Result<ReplayExtent> {
        self.replay(GraphMode::DraftExtend, table, reqs, Some(extend_lens))
    }

    /// DRAFT_EXTEND_V2 replay: every request extends by exactly `D`. (The reference
    /// reads the accept lengths here, UNVERIFIED to equal D; v2 fills all D draft
    /// tokens up front and its eager path repeats rows by D, so D it is.)
    pub fn replay_draft_extend_v2(&mut self, table: &ReqToToken<'_>, reqs: Requests<'_>) -> Result<ReplayExtent> {
        self.replay(GraphMode::DraftExtendV2, table, reqs, None)
    }

    fn check_bs(&self, bs: usize) -> Result<()> {
        if bs > self.capacity.max_bs {
            return Err(invalid(
                "bs",
                bs.to_string(),
                format!("at most max_bs = {} (the CUDA-graph capacity)", self.capacity.max_bs),
            ));
        }
        Ok(())
    }

    fn replay(
        &mut self,
        mode: GraphMode,
        table: &ReqToToken<'_>,
        reqs: Requests<'_>,
        extend_lens: Option<&[i32]>,
    ) -> Result<ReplayExtent> {
        if mode != self.mode {
            return Err(invalid(
                "mode",
                mode.name(),
                format!("{} (this graph state was built for {} graphs)", self.mode.name(), self.mode.name()),
            ));
        }
        let Requests { req_pool_indices: rpi, seq_lens } = reqs;
        let bs = seq_lens.len();
        self.check_bs(bs)?;
        check::same_len("req_pool_indices", rpi.len(), "seq_lens", bs)?;
        check::non_negative("seq_lens", seq_lens)?;
        let d = self.params.draft_tokens as i32;
        let add = if mode == GraphMode::TargetVerify { d } else { 0 };
        let fixed_q = match mode {
            GraphMode::Decode => 1,
            _ => d,
        };
        if let Some(e) = extend_lens {
            check::same_len("extend_lens", e.len(), "seq_lens", bs)?;
            check::non_negative("extend_lens", e)?;
            check::q_within_kv("extend_lens", e, "seq_lens", seq_lens)?;
        } else if mode == GraphMode::DraftExtendV2 {
            if let Some(i) = seq_lens.iter().position(|&l| l < d) {
                return Err(invalid(
                    "seq_lens",
                    format!("seq_lens[{i}] = {}", seq_lens[i]),
                    format!("at least D = {d}: draft-extend v2 extends every request by D tokens"),
                ));
            }
        }
        let q = |i: usize| extend_lens.map_or(fixed_q, |e| e[i]);
        let rows: usize = (0..bs).map(|i| q(i) as usize).sum();
        let graph_rows = self.shape(bs).rows;
        if rows > graph_rows {
            return Err(invalid(
                "extend_lens",
                format!("Σ extend_lens = {rows}"),
                format!("at most bs × D = {graph_rows}, the query rows captured for bs = {bs}"),
            ));
        }
        let max_k = seq_lens.iter().max().map_or(0, |&m| m as i64 + add as i64);
        check::fits_i32("seq_lens", max_k, "max KV length")?;
        let max_k = max_k as usize;
        let w = self.capacity.max_context_len;
        if max_k > w {
            return Err(invalid(
                "seq_lens",
                format!("max KV length {max_k}"),
                format!("at most max_context_len = {w}, the width of the graph's page table"),
            ));
        }
        check::rows_and_width(table, rpi, max_k, "max KV length")?;
        let kv_sum: i64 = seq_lens.iter().map(|&l| l as i64 + add as i64).sum();
        check::fits_i32("seq_lens", kv_sum, "Σ KV lengths")?;
        check::slots(table, rpi, |i| (seq_lens[i] + add) as usize, self.params.pool_slots, self.params.page_size)?;

        let mut row = 0;
        let mut size = 0;
        for i in 0..bs {
            let kv = seq_lens[i] + add;
            self.cache_seqlens[i] = kv;
            let src = &table.row(rpi[i] as usize)[..max_k];
            for _ in 0..q(i) {
                self.page_table_1.row_mut(row)[..max_k].copy_from_slice(src);
                row += 1;
            }
            size = self.write_expanded(size, kv, q(i));
        }
        if let Some(e) = extend_lens {
            self.extend_lens[..bs].copy_from_slice(e);
        } else if mode != GraphMode::Decode {
            self.extend_lens[..bs].fill(fixed_q);
        }
        seq::cumsum_into_slice(&self.cache_seqlens[..bs], &mut self.cu_seqlens_k[1..]);
        seq::cumsum_into_slice(&self.nsa_cache_seqlens[..size], &mut self.nsa_cu_seqlens_k[1..]);
        let real_cols = match &mut self.real_page_table {
            RealPageTable::Aliased => 0,
            RealPageTable::Table(real) => {
                let width = real.width;
                let p = self.params.page_size;
                seq::transform_block(&self.page_table_1.data, w, rows, max_k, p, &mut real.data, width);
                seq::real_cols(max_k, p)
            }
        };
        let extent = ReplayExtent { bs, rows, size, page_cols: max_k, real_cols };
        self.last = Some(extent);
        Ok(extent)
    }

    /// Writes the per-token lengths of one request (`q` query rows over `kv` tokens)
    /// at `at`; returns the next free position. Decode keeps `expanded` aliased.
    fn write_expanded(&mut self, at: usize, kv: i32, q: i32) -> usize {
        let topk = self.params.topk;
        for j in 0..q {
            let v = kv - q + 1 + j;
            if self.mode != GraphMode::Decode {
                self.nsa_seqlens_expanded[at + j as usize] = v;
            }
            self.nsa_cache_seqlens[at + j as usize] = seq::clip(v, topk);
        }
        at + q as usize
    }

    /// The fused metadata copy (§9.5 table, §9.6): copies exactly what `src`'s replay
    /// wrote (`extent`) into this state. Both states must have the same mode, page
    /// size and capacity.
    pub fn copy_replay_from(&mut self, src: &GraphState, extent: ReplayExtent) -> Result<()> {
        if src.mode != self.mode {
            return Err(invalid("mode", src.mode.name(), format!("{} (the destination's mode)", self.mode.name())));
        }
        if src.params.page_size != self.params.page_size {
            return Err(invalid(
                "page_size",
                src.params.page_size.to_string(),
                format!("{} (the destination's page size)", self.params.page_size),
            ));
        }
        if src.capacity != self.capacity {
            return Err(invalid(
                "capacity",
                format!("{:?}", src.capacity),
                format!("{:?} (the destination's capacity)", self.capacity),
            ));
        }
        let ReplayExtent { bs, rows, size, page_cols, real_cols } = extent;
        let cap = self.capacity;
        if bs > cap.max_bs || rows > cap.max_tokens || size > cap.max_tokens || page_cols > cap.max_context_len {
            return Err(invalid("extent", format!("{extent:?}"), format!("within the capacity {cap:?}")));
        }
        self.cache_seqlens[..bs].copy_from_slice(&src.cache_seqlens[..bs]);
        self.cu_seqlens_k[1..=bs].copy_from_slice(&src.cu_seqlens_k[1..=bs]);
        let w = cap.max_context_len;
        for r in 0..rows {
            self.page_table_1.data[r * w..r * w + page_cols]
                .copy_from_slice(&src.page_table_1.data[r * w..r * w + page_cols]);
        }
        if self.mode != GraphMode::Decode {
            self.nsa_seqlens_expanded[..size].copy_from_slice(&src.nsa_seqlens_expanded[..size]);
            self.extend_lens[..bs].copy_from_slice(&src.extend_lens[..bs]);
        }
        self.nsa_cache_seqlens[..size].copy_from_slice(&src.nsa_cache_seqlens[..size]);
        self.nsa_cu_seqlens_k[1..=size].copy_from_slice(&src.nsa_cu_seqlens_k[1..=size]);
        if let (RealPageTable::Table(dst), RealPageTable::Table(s)) = (&mut self.real_page_table, &src.real_page_table)
        {
            let rw = dst.width;
            for r in 0..rows {
                dst.data[r * rw..r * rw + real_cols].copy_from_slice(&s.data[r * rw..r * rw + real_cols]);
            }
        }
        self.last = Some(extent);
        Ok(())
    }
}
