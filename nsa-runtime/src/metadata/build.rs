//! [`MetadataBuilder`]: `init_forward_metadata` of spec §4, one entry point per mode.
//!
//! Each `*_into` form rewrites an existing [`NsaMetadata`] in place, reusing its
//! buffers: once they have grown to the largest batch, building allocates nothing
//! (decode is the hot path). On error the output is left untouched: every check runs
//! before the first write.

use super::check::{self, invalid};
use super::cp::{self, CpRank};
use super::host::{NsaMetadata, PageTable, RealPageTable};
use super::seq;
use super::{ExtendBatch, ForwardMode, ReqToToken, Requests, TransformMethod};
use crate::Result;

/// What the builders need to know besides the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetadataParams {
    /// Tokens per KV page (64 on CUDA servers, 1 on ROCm).
    pub page_size: u32,
    /// `index_topk` (2048 for DeepSeek V3.2).
    pub topk: u32,
    /// `D` = `speculative_num_draft_tokens`; 0 without speculation. Target-verify and
    /// draft-extend v2 need D ≥ 1.
    pub draft_tokens: u32,
    /// Slots in the KV pool (`pool_size + page_size`): every slot a request reads
    /// must be below it.
    pub pool_slots: usize,
    /// Context-parallel round-robin split of extend batches (§4.7); `None` = off.
    pub cp: Option<CpRank>,
}

impl MetadataParams {
    /// Page size and top-k of `cfg`, no speculation, no CP.
    pub fn from_config(cfg: &nsa_kernels::NsaConfig, pool_slots: usize) -> Self {
        MetadataParams { page_size: cfg.page_size, topk: cfg.topk, draft_tokens: 0, pool_slots, cp: None }
    }
}

/// The batch-dependent choices extend metadata depends on (from [`super::decide`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtendPlan {
    pub transform: TransformMethod,
    /// MHA one-shot on an FP8 pool (§4.5 step 4).
    pub mha_fp8_dequant: bool,
}

/// Query rows per request in a decode-like mode.
#[derive(Clone, Copy)]
enum QRows<'a> {
    Fixed(i32),
    PerRequest(&'a [i32]),
}

impl QRows<'_> {
    fn get(&self, i: usize) -> i32 {
        match self {
            QRows::Fixed(n) => *n,
            QRows::PerRequest(e) => e[i],
        }
    }
}

/// Builds [`NsaMetadata`] for every forward mode from the server's batch description.
///
/// Checked before anything is written (each failure names the field and values):
/// per-request slices of equal length, lengths ≥ 0, query tokens ≤ KV length,
/// `prefix + extend == seq` (extend), rows inside `req_to_token` and KV lengths within
/// its width, every slot a request reads inside the pool and page-aligned for the
/// page size, and every cu array within int32.
#[derive(Clone, Debug)]
pub struct MetadataBuilder {
    params: MetadataParams,
}

impl MetadataBuilder {
    pub fn new(params: MetadataParams) -> Result<Self> {
        if params.page_size == 0 || params.page_size > i32::MAX as u32 {
            return Err(invalid("page_size", params.page_size.to_string(), "a page size ≥ 1 (64 on CUDA, 1 on ROCm)"));
        }
        if params.topk == 0 {
            return Err(invalid("topk", "0", "index_topk ≥ 1 (2048 for DeepSeek V3.2)"));
        }
        if params.draft_tokens > i32::MAX as u32 {
            return Err(invalid("draft_tokens", params.draft_tokens.to_string(), "at most 2^31-1"));
        }
        if let Some(cp) = params.cp {
            CpRank::new(cp.rank, cp.size)?;
        }
        Ok(MetadataBuilder { params })
    }

    pub fn params(&self) -> &MetadataParams {
        &self.params
    }

    /// IDLE: an empty decode (no requests on this rank).
    pub fn idle(&self) -> NsaMetadata {
        let mut out = NsaMetadata::default();
        let empty = Requests { req_pool_indices: &[], seq_lens: &[] };
        let table = ReqToToken::new(&[0], 1).expect("a 1×1 table is valid");
        self.decode_like_into(&mut out, ForwardMode::Idle, &table, empty, QRows::Fixed(1))
            .expect("an empty batch is always consistent");
        out
    }

    /// DECODE (§4.2): one query token per request.
    pub fn decode(&self, table: &ReqToToken<'_>, reqs: Requests<'_>) -> Result<NsaMetadata> {
        let mut out = NsaMetadata::default();
        self.decode_into(&mut out, table, reqs)?;
        Ok(out)
    }

    /// [`Self::decode`] into `out`, reusing its buffers.
    pub fn decode_into(&self, out: &mut NsaMetadata, table: &ReqToToken<'_>, reqs: Requests<'_>) -> Result<()> {
        self.decode_like_into(out, ForwardMode::Decode, table, reqs, QRows::Fixed(1))
    }

    /// TARGET_VERIFY (§4.3): `D` draft tokens after each request's `seq_lens[i]`
    /// tokens; KV lengths become `L_i + D`, rows repeat `D` times.
    pub fn target_verify(&self, table: &ReqToToken<'_>, reqs: Requests<'_>) -> Result<NsaMetadata> {
        let mut out = NsaMetadata::default();
        self.target_verify_into(&mut out, table, reqs)?;
        Ok(out)
    }

    pub fn target_verify_into(&self, out: &mut NsaMetadata, table: &ReqToToken<'_>, reqs: Requests<'_>) -> Result<()> {
        let d = self.draft_tokens("target-verify")?;
        self.decode_like_into(out, ForwardMode::TargetVerify, table, reqs, QRows::Fixed(d))
    }

    /// DRAFT_EXTEND v1 (§4.4): request i extends by `extend_lens[i]` (accepted + 1),
    /// already counted in `seq_lens[i]`; rows repeat `extend_lens[i]` times.
    pub fn draft_extend(&self, table: &ReqToToken<'_>, reqs: Requests<'_>, extend_lens: &[i32]) -> Result<NsaMetadata> {
        let mut out = NsaMetadata::default();
        self.draft_extend_into(&mut out, table, reqs, extend_lens)?;
        Ok(out)
    }

    pub fn draft_extend_into(
        &self,
        out: &mut NsaMetadata,
        table: &ReqToToken<'_>,
        reqs: Requests<'_>,
        extend_lens: &[i32],
    ) -> Result<()> {
        check::same_len("extend_lens", extend_lens.len(), "seq_lens", reqs.seq_lens.len())?;
        check::non_negative("extend_lens", extend_lens)?;
        self.decode_like_into(out, ForwardMode::DraftExtend, table, reqs, QRows::PerRequest(extend_lens))
    }

    /// DRAFT_EXTEND_V2 (§4.4): every request extends by exactly `D` tokens, already
    /// counted in `seq_lens[i]`.
    pub fn draft_extend_v2(&self, table: &ReqToToken<'_>, reqs: Requests<'_>) -> Result<NsaMetadata> {
        let mut out = NsaMetadata::default();
        self.draft_extend_v2_into(&mut out, table, reqs)?;
        Ok(out)
    }

    pub fn draft_extend_v2_into(
        &self,
        out: &mut NsaMetadata,
        table: &ReqToToken<'_>,
        reqs: Requests<'_>,
    ) -> Result<()> {
        let d = self.draft_tokens("draft-extend v2")?;
        self.decode_like_into(out, ForwardMode::DraftExtendV2, table, reqs, QRows::Fixed(d))
    }

    /// EXTEND (§4.5–4.7): prefill or chunked prefill, with or without a cached prefix,
    /// split round-robin over CP ranks when [`MetadataParams::cp`] is set (size > 1 and
    /// at least one token). Requests with `extend_lens[i] == 0` are allowed and add no
    /// tokens. An empty pure prefill has `max_seq_len_q == max_seq_len_k == 0`.
    pub fn extend(&self, table: &ReqToToken<'_>, batch: ExtendBatch<'_>, plan: ExtendPlan) -> Result<NsaMetadata> {
        let mut out = NsaMetadata::default();
        self.extend_into(&mut out, table, batch, plan)?;
        Ok(out)
    }

    fn draft_tokens(&self, mode: &str) -> Result<i32> {
        match self.params.draft_tokens {
            0 => Err(invalid("draft_tokens", "0", format!("D ≥ 1 (speculative_num_draft_tokens) for {mode}"))),
            d => Ok(d as i32),
        }
    }

    /// Decode, verify and both draft-extends: one query row per token, rows of the
    /// page table repeated per token, `cu_seqlens_q = arange`.
    fn decode_like_into(
        &self,
        out: &mut NsaMetadata,
        mode: ForwardMode,
        table: &ReqToToken<'_>,
        reqs: Requests<'_>,
        q: QRows<'_>,
    ) -> Result<()> {
        let p = &self.params;
        let Requests { req_pool_indices: rpi, seq_lens } = reqs;
        let bs = seq_lens.len();
        check::same_len("req_pool_indices", rpi.len(), "seq_lens", bs)?;
        check::non_negative("seq_lens", seq_lens)?;
        let d_eff = if mode == ForwardMode::TargetVerify { p.draft_tokens as i32 } else { 0 };
        match (mode, q) {
            (ForwardMode::DraftExtend, QRows::PerRequest(e)) => {
                check::q_within_kv("extend_lens", e, "seq_lens", seq_lens)?
            }
            (ForwardMode::DraftExtendV2, QRows::Fixed(d)) => {
                if let Some(i) = seq_lens.iter().position(|&l| l < d) {
                    return Err(invalid(
                        "seq_lens",
                        format!("seq_lens[{i}] = {}", seq_lens[i]),
                        format!(
                            "at least D = {d}: draft-extend v2 extends every request by D tokens, counted in seq_lens"
                        ),
                    ));
                }
            }
            _ => {}
        }
        // The reference takes max() of an empty list here (UNVERIFIED); 0 is the sane answer.
        let max_k = seq_lens.iter().max().map_or(0, |&m| m as i64 + d_eff as i64);
        check::fits_i32("seq_lens", max_k, "max KV length")?;
        let max_k = max_k as usize;
        check::rows_and_width(table, rpi, max_k, "max KV length")?;
        let kv_sum: i64 = seq_lens.iter().map(|&l| l as i64 + d_eff as i64).sum();
        check::fits_i32("seq_lens", kv_sum, "Σ KV lengths")?;
        let rows: i64 = (0..bs).map(|i| q.get(i) as i64).sum();
        check::fits_i32("seq_lens", rows, "query tokens")?;
        let clipped: i64 = (0..bs)
            .map(|i| {
                let kv = seq_lens[i] as i64 + d_eff as i64;
                seq::clipped_sum(kv - q.get(i) as i64 + 1, kv, p.topk as i64)
            })
            .sum();
        check::fits_i32("seq_lens", clipped, "Σ top-k-clipped lengths")?;
        check::slots(table, rpi, |i| (seq_lens[i] + d_eff) as usize, p.pool_slots, p.page_size)?;

        out.mode = mode;
        self.common_header(out, TransformMethod::Paged, false);
        out.cache_seqlens.clear();
        out.cache_seqlens.extend(seq_lens.iter().map(|&l| l + d_eff));
        seq::cu_into(&out.cache_seqlens, &mut out.cu_seqlens_k);
        out.max_seq_len_q = 1;
        out.max_seq_len_k = max_k;
        out.page_table_1.clear(max_k);
        out.nsa_seqlens_expanded.clear();
        out.nsa_extend_seq_lens.clear();
        for (i, &r) in rpi.iter().enumerate() {
            let n = q.get(i);
            let row = &table.row(r as usize)[..max_k];
            for _ in 0..n {
                out.page_table_1.push_row(row);
            }
            seq::push_expanded(out.cache_seqlens[i], n, &mut out.nsa_seqlens_expanded);
            out.nsa_extend_seq_lens.push(n);
        }
        seq::arange_into(rows as usize + 1, &mut out.cu_seqlens_q);
        out.indexer_seq_lens.clear();
        out.indexer_seq_lens.extend_from_slice(seq_lens);
        out.seq_lens_sum = seq_lens.iter().map(|&l| l as usize).sum();
        out.page_table_1_flattened = None;
        out.topk_indices_offset = None;
        out.indexer = None;
        out.bs_idx = None;
        self.common_suffix(out);
        Ok(())
    }

    /// [`Self::extend`] into `out`, reusing its buffers.
    pub fn extend_into(
        &self,
        out: &mut NsaMetadata,
        table: &ReqToToken<'_>,
        batch: ExtendBatch<'_>,
        plan: ExtendPlan,
    ) -> Result<()> {
        let p = &self.params;
        let ExtendBatch { req_pool_indices: rpi, seq_lens, extend_lens, prefix_lens } = batch;
        let bs = seq_lens.len();
        check::same_len("req_pool_indices", rpi.len(), "seq_lens", bs)?;
        check::same_len("extend_lens", extend_lens.len(), "seq_lens", bs)?;
        check::non_negative("seq_lens", seq_lens)?;
        check::non_negative("extend_lens", extend_lens)?;
        check::q_within_kv("extend_lens", extend_lens, "seq_lens", seq_lens)?;
        match prefix_lens {
            Some(prefix) => {
                check::same_len("prefix_lens", prefix.len(), "seq_lens", bs)?;
                check::non_negative("prefix_lens", prefix)?;
                for i in 0..bs {
                    if prefix[i] as i64 + extend_lens[i] as i64 != seq_lens[i] as i64 {
                        return Err(invalid(
                            "prefix_lens",
                            format!("prefix_lens[{i}] = {} with extend_lens[{i}] = {}", prefix[i], extend_lens[i]),
                            format!("prefix + extend = seq_lens[{i}] = {}", seq_lens[i]),
                        ));
                    }
                }
            }
            None => {
                if let Some(i) = (0..bs).find(|&i| extend_lens[i] != seq_lens[i]) {
                    return Err(invalid(
                        "extend_lens",
                        format!("extend_lens[{i}] = {}", extend_lens[i]),
                        format!("seq_lens[{i}] = {}: without prefix_lens every request is a pure prefill", seq_lens[i]),
                    ));
                }
            }
        }
        let max_all = seq_lens.iter().max().map_or(0, |&m| m as usize);
        check::rows_and_width(table, rpi, max_all, "max seq len")?;
        check::fits_i32("seq_lens", seq_lens.iter().map(|&l| l as i64).sum(), "Σ seq lens")?;
        let total: i64 = extend_lens.iter().map(|&e| e as i64).sum();
        check::fits_i32("extend_lens", total, "query tokens")?;
        let clipped: i64 = (0..bs)
            .map(|i| {
                let (l, e) = (seq_lens[i] as i64, extend_lens[i] as i64);
                seq::clipped_sum(l - e + 1, l, p.topk as i64)
            })
            .sum();
        check::fits_i32("extend_lens", clipped, "Σ top-k-clipped lengths")?;
        check::slots(table, rpi, |i| seq_lens[i] as usize, p.pool_slots, p.page_size)?;

        let total = total as usize;
        let has_prefix = prefix_lens.is_some_and(|pl| pl.iter().any(|&x| x > 0));
        let split = p.cp.filter(|cp| cp.splits(total));
        // Selected requests and this rank's query count for each.
        let (counts, bs_idx) = match split {
            Some(cp) => {
                let q = cp::split_q_seqs(extend_lens, cp);
                (q.counts, Some(q.bs_idx))
            }
            None => (extend_lens.to_vec(), None),
        };
        let selected = |k: usize| bs_idx.as_ref().map_or(k, |b| b[k] as usize);
        let nsel = counts.len();

        out.mode = ForwardMode::Extend;
        self.common_header(out, plan.transform, plan.mha_fp8_dequant);
        out.cache_seqlens.clear();
        out.cache_seqlens.extend((0..nsel).map(|k| seq_lens[selected(k)]));
        seq::cu_into(&out.cache_seqlens, &mut out.cu_seqlens_k);
        let max_k = out.cache_seqlens.iter().max().map_or(0, |&m| m as usize);
        out.max_seq_len_k = max_k;
        out.page_table_1.clear(max_k);
        for k in 0..nsel {
            out.page_table_1.push_row(&table.row(rpi[selected(k)] as usize)[..max_k]);
        }
        out.indexer_seq_lens.clear();
        out.indexer_seq_lens.extend_from_slice(&out.cache_seqlens);
        out.seq_lens_sum = seq_lens.iter().map(|&l| l as usize).sum();
        out.nsa_extend_seq_lens.clear();
        out.nsa_extend_seq_lens.extend_from_slice(&counts);

        if has_prefix || split.is_some() {
            out.max_seq_len_q = counts.iter().max().map_or(1, |&m| m as usize);
            seq::cu_into(&counts, &mut out.cu_seqlens_q);
        } else {
            // Pure prefill: E == L, so the query layout is the KV layout.
            out.max_seq_len_q = max_k;
            out.cu_seqlens_q.clone_from(&out.cu_seqlens_k);
        }

        // Per-token values, in global token order, keeping this rank's tokens (§4.6).
        let mut ranges = out.indexer.take().unwrap_or_default();
        ranges.ks.clear();
        ranges.ke.clear();
        ranges.token_to_batch_idx.clear();
        out.nsa_seqlens_expanded.clear();
        let (mut g, mut k_offset, mut next_sel) = (0usize, 0i32, 0usize);
        for i in 0..bs {
            let is_selected = next_sel < nsel && selected(next_sel) == i;
            let (l, e) = (seq_lens[i], extend_lens[i]);
            for j in 0..e {
                let owned = split.is_none_or(|cp| g % cp.size as usize == cp.rank as usize);
                g += 1;
                if !owned {
                    continue;
                }
                let visible = l - e + j + 1;
                out.nsa_seqlens_expanded.push(visible);
                ranges.ks.push(k_offset);
                ranges.ke.push(k_offset + visible);
                ranges.token_to_batch_idx.push(next_sel as i32);
            }
            if is_selected {
                k_offset += l;
                next_sel += 1;
            }
        }
        out.indexer = Some(ranges);

        let mut flat = out.page_table_1_flattened.take().unwrap_or_default();
        out.page_table_1_flattened =
            if has_prefix && (plan.transform == TransformMethod::Ragged || plan.mha_fp8_dequant) {
                flat.clear();
                for k in 0..nsel {
                    flat.extend_from_slice(&out.page_table_1.row(k)[..out.cache_seqlens[k] as usize]);
                }
                Some(flat)
            } else {
                None
            };
        let mut offsets = out.topk_indices_offset.take().unwrap_or_default();
        out.topk_indices_offset = if plan.transform == TransformMethod::Ragged {
            offsets.clear();
            for (k, &n) in counts.iter().enumerate() {
                offsets.extend(std::iter::repeat_n(out.cu_seqlens_k[k], n as usize));
            }
            Some(offsets)
        } else {
            None
        };
        out.bs_idx = bs_idx;
        self.common_suffix(out);
        Ok(())
    }

    fn common_header(&self, out: &mut NsaMetadata, transform: TransformMethod, mha_fp8_dequant: bool) {
        out.page_size = self.params.page_size;
        out.topk = self.params.topk;
        out.transform = transform;
        out.mha_fp8_dequant = mha_fp8_dequant;
    }

    /// §4.8: clipped lengths, their cu, the arange, and the real page table.
    fn common_suffix(&self, out: &mut NsaMetadata) {
        seq::clip_into(&out.nsa_seqlens_expanded, self.params.topk, &mut out.nsa_cache_seqlens);
        seq::cu_into(&out.nsa_cache_seqlens, &mut out.nsa_cu_seqlens_k);
        seq::arange_into(out.nsa_cu_seqlens_k.len(), &mut out.nsa_cu_seqlens_q);
        if self.params.page_size == 1 {
            out.real_page_table = RealPageTable::Aliased;
            return;
        }
        let mut real = match std::mem::replace(&mut out.real_page_table, RealPageTable::Aliased) {
            RealPageTable::Table(t) => t,
            RealPageTable::Aliased => PageTable::default(),
        };
        seq::transform_into(&out.page_table_1, self.params.page_size, &mut real);
        out.real_page_table = RealPageTable::Table(real);
    }
}

impl NsaMetadata {
    /// Rebuilds this metadata for a decode batch, reusing every buffer (see
    /// [`MetadataBuilder::decode_into`]).
    pub fn build_decode_into(
        &mut self,
        builder: &MetadataBuilder,
        table: &ReqToToken<'_>,
        reqs: Requests<'_>,
    ) -> Result<()> {
        builder.decode_into(self, table, reqs)
    }
}
