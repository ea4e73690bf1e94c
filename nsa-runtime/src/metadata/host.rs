//! [`NsaMetadata`]: the host copy of the per-forward record of spec §3.
//!
//! Every index field is a `Vec<i32>` laid out exactly as the device tensor, so the
//! device mirror ([`super::device`]) is one copy per field (or one packed copy).

use super::{ForwardMode, TransformMethod};
use crate::error::invalid;
use crate::Result;

/// A dense row-major `[rows, width]` int32 table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageTable {
    pub rows: usize,
    pub width: usize,
    /// `rows * width` entries, row r at `[r * width, (r + 1) * width)`.
    pub data: Vec<i32>,
}

impl PageTable {
    /// A zero-filled table.
    pub fn zeros(rows: usize, width: usize) -> Self {
        PageTable { rows, width, data: vec![0; rows * width] }
    }

    pub fn row(&self, r: usize) -> &[i32] {
        &self.data[r * self.width..(r + 1) * self.width]
    }

    pub fn row_mut(&mut self, r: usize) -> &mut [i32] {
        &mut self.data[r * self.width..(r + 1) * self.width]
    }

    /// Empties the table for refilling row by row, keeping its allocation.
    pub(crate) fn clear(&mut self, width: usize) {
        self.rows = 0;
        self.width = width;
        self.data.clear();
    }

    /// Appends one row (exactly `width` entries).
    pub(crate) fn push_row(&mut self, row: &[i32]) {
        debug_assert_eq!(row.len(), self.width);
        self.data.extend_from_slice(row);
        self.rows += 1;
    }
}

/// `real_page_table` (spec §2.2): page ids, or the page-size-1 table itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RealPageTable {
    /// page_size == 1: the real table IS `page_table_1` (same tensor; CUDA graphs
    /// rely on the aliasing, so replay writes it once).
    #[default]
    Aliased,
    /// page_size > 1: `[rows, ceil(width / page_size)]`, entry (r, c) =
    /// `page_table_1[r, c * page_size] / page_size` (floor division).
    Table(PageTable),
}

/// Ranges of the ragged indexer (spec §4.6); extend batches only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexerRanges {
    /// `[T]` int32: start of the token's request in the concatenated index K.
    pub ks: Vec<i32>,
    /// `[T]` int32: exclusive end; `ke - ks == nsa_seqlens_expanded`.
    pub ke: Vec<i32>,
    /// `[T]` int32: the token's request as an index into the selected requests.
    pub token_to_batch_idx: Vec<i32>,
}

/// The metadata of one forward (spec §3). `bs'` = selected requests (all of them
/// unless CP split), `T` = query tokens on this rank, `T_pad` ≥ `T` after DP padding
/// ([`NsaMetadata::pad_nsa_rows`]; without it `T_pad == T`).
///
/// Not here: the FlashMLA tile schedule and the DeepGEMM paged-logits schedule of §3.
/// They belong to the kernels that consume them (a Rust kernel may schedule its own
/// way); [`NsaMetadata::paged_schedule_lens`] gives the lengths they are computed from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NsaMetadata {
    pub mode: ForwardMode,
    /// Tokens per KV page (host).
    pub page_size: u32,
    /// `index_topk` the lengths are clipped to (host).
    pub topk: u32,
    /// How top-k positions become KV indices (host). Always PAGED outside extend.
    pub transform: TransformMethod,
    /// MHA one-shot on an FP8 pool: the model dequantizes the prefix KV (host).
    pub mha_fp8_dequant: bool,
    /// `[bs']` int32: KV length per request (`L_i`, `+D` in target-verify).
    pub cache_seqlens: Vec<i32>,
    /// Host: 1 outside extend; extend: max `E_i`, or max `L_i` for a pure prefill.
    pub max_seq_len_q: usize,
    /// Host: max of `cache_seqlens` (0 for an empty batch); also the width of `page_table_1`.
    pub max_seq_len_k: usize,
    /// `[rows + 1]` int32: decode-like `arange`; extend `cu(E)` (= `cu_seqlens_k` for a
    /// pure prefill, where the reference shares the tensor; here it is a copy).
    pub cu_seqlens_q: Vec<i32>,
    /// `[bs' + 1]` int32: `cu(cache_seqlens)`.
    pub cu_seqlens_k: Vec<i32>,
    /// `[R, max_seq_len_k]` int32 slots, rows of `req_to_token`. R = bs' (decode,
    /// extend) or T (verify/draft-extend: each request's row repeated per query token).
    pub page_table_1: PageTable,
    /// `[R, ceil(max_seq_len_k / page_size)]` int32 page ids, or aliased (page size 1).
    pub real_page_table: RealPageTable,
    /// `[T]` int32: KV tokens each query token may see (causal), unclipped. In decode
    /// the reference aliases `cache_seqlens`; here it is a copy.
    pub nsa_seqlens_expanded: Vec<i32>,
    /// `[T_pad]` int32: `min(expanded, topk)`, zero-padded (§3.2).
    pub nsa_cache_seqlens: Vec<i32>,
    /// `[T_pad + 1]` int32: `cu(nsa_cache_seqlens)`.
    pub nsa_cu_seqlens_k: Vec<i32>,
    /// `[T_pad + 1]` int32: `arange` (every query token is its own sequence).
    pub nsa_cu_seqlens_q: Vec<i32>,
    /// Host: query tokens per selected request (decode `[1]*bs`, verify `[D]*bs`,
    /// draft-extend and extend `E`, CP: this rank's counts).
    pub nsa_extend_seq_lens: Vec<i32>,
    /// Host: Σ `L_i` over the whole batch (before any CP selection).
    pub seq_lens_sum: usize,
    /// `[Σ L_i]` int32: `page_table_1[i, :L_i]` concatenated over selected requests.
    /// Extend with a prefix and (RAGGED or `mha_fp8_dequant`) only.
    pub page_table_1_flattened: Option<Vec<i32>>,
    /// `[T]` int32: start of each token's request in the ragged KV. Extend RAGGED only.
    pub topk_indices_offset: Option<Vec<i32>>,
    /// `ks`, `ke`, `token_to_batch_idx` (§4.6). Extend only (empty for an empty batch).
    pub indexer: Option<IndexerRanges>,
    /// Host `[bs']`: `L_i` of the selected requests (no `+D`).
    pub indexer_seq_lens: Vec<i32>,
    /// Host: the requests this CP rank kept, in order; `None` = all of them.
    pub bs_idx: Option<Vec<i32>>,
}

impl NsaMetadata {
    /// Selected requests (`bs'`).
    pub fn bs(&self) -> usize {
        self.cache_seqlens.len()
    }

    /// Query tokens `T` (before DP padding).
    pub fn num_tokens(&self) -> usize {
        self.nsa_seqlens_expanded.len()
    }

    /// Always 1: every query token is its own sequence for the sparse kernels.
    pub fn nsa_max_seqlen_q(&self) -> usize {
        1
    }

    /// `page_table_64`: the real page table, resolving the page-size-1 alias.
    pub fn real_table(&self) -> &PageTable {
        match &self.real_page_table {
            RealPageTable::Aliased => &self.page_table_1,
            RealPageTable::Table(t) => t,
        }
    }

    /// The context lengths of the DeepGEMM paged-logits schedule (§4.8): expanded
    /// lengths for verify / draft-extend v1, `cache_seqlens` for decode. `None` where the
    /// reference computes no schedule (extend; draft-extend v2 schedules on the fly).
    pub fn paged_schedule_lens(&self) -> Option<&[i32]> {
        match self.mode {
            ForwardMode::Idle | ForwardMode::Decode => Some(&self.cache_seqlens),
            ForwardMode::TargetVerify | ForwardMode::DraftExtend => Some(&self.nsa_seqlens_expanded),
            ForwardMode::DraftExtendV2 | ForwardMode::Extend => None,
        }
    }

    /// Pads the per-token NSA rows to `tokens` with zero-length rows (§3.2); fewer
    /// tokens than present is a no-op. Padded rows attend to nothing.
    pub fn pad_nsa_rows(&mut self, tokens: usize) {
        let have = self.nsa_cache_seqlens.len();
        if tokens <= have {
            return;
        }
        let last = *self.nsa_cu_seqlens_k.last().unwrap_or(&0);
        self.nsa_cache_seqlens.resize(tokens, 0);
        self.nsa_cu_seqlens_k.resize(tokens + 1, last);
        self.nsa_cu_seqlens_q.extend(have as i32 + 1..=tokens as i32);
    }
}

/// How DP attention pads every rank's token count (§3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DpPadding {
    /// Every rank pads to the largest rank's count.
    MaxLen,
    /// Each rank keeps its own (rounded) count.
    SumLen,
}

/// The padded token count of §3.2 for DP rank `dp_rank`: each rank's count rounded
/// up to a multiple of `attn_cp_size`, then the max (MAX_LEN) or this rank's, then
/// divided (rounding up) by `attn_cp_size` when the CP round-robin split applies.
/// No DP info (`global_num_tokens` empty) gives 0, which makes the padding a no-op.
pub fn dp_padded_tokens(
    global_num_tokens: &[usize],
    dp_rank: usize,
    attn_cp_size: usize,
    mode: DpPadding,
    cp_split: bool,
) -> Result<usize> {
    if global_num_tokens.is_empty() {
        return Ok(0);
    }
    if global_num_tokens.len() > 1 && dp_rank >= global_num_tokens.len() {
        let expected = format!("a rank below {} (one count per DP rank in global_num_tokens)", global_num_tokens.len());
        return Err(invalid("dp_rank", dp_rank.to_string(), expected));
    }
    let cp = attn_cp_size.max(1);
    let rounded = |n: usize| n.div_ceil(cp) * cp;
    let mut tokens = match mode {
        DpPadding::MaxLen => global_num_tokens.iter().map(|&n| rounded(n)).max().unwrap_or(0),
        DpPadding::SumLen if global_num_tokens.len() > 1 => rounded(global_num_tokens[dp_rank]),
        DpPadding::SumLen => rounded(global_num_tokens[0]),
    };
    if cp_split {
        tokens = tokens.div_ceil(cp);
    }
    Ok(tokens)
}
