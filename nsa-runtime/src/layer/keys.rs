//! The ragged key layout of one step (spec §6.3 "Gather K", §5.2 RAGGED): every
//! selected request's KV slots for positions `[0, L_i)`, request after request, and
//! for each query token the window `[ks, ke)` of its own request's keys.
//!
//! The same list feeds the indexer-K gather (extend, or page sizes other than 64)
//! and the FP8 dequantize of the RAGGED prefill, where `ks` is the
//! `topk_indices_offset` of the RAGGED top-k transform.

use crate::error::invalid;
use crate::metadata::{ForwardMode, NsaMetadata};
use crate::{Error, Result};

/// Host copy of the ragged keys: `slots` `[S]`, `ks`/`ke` `[T]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaggedKeys {
    pub slots: Vec<i32>,
    pub ks: Vec<i32>,
    pub ke: Vec<i32>,
}

impl RaggedKeys {
    /// `S`: keys of all selected requests.
    pub fn num_keys(&self) -> usize {
        self.slots.len()
    }
}

/// Whether `page_table_1` has one row per query token (verify / draft-extend) rather
/// than one per request (decode, extend).
pub fn table_rows_per_token(mode: ForwardMode) -> bool {
    matches!(mode, ForwardMode::TargetVerify | ForwardMode::DraftExtend | ForwardMode::DraftExtendV2)
}

fn inconsistent(what: String) -> Error {
    invalid("metadata", what, "metadata from MetadataBuilder (per-request query counts summing to the token count)")
}

/// Builds the layout from a step's metadata. Token `j` of request `i` sees keys
/// `[off_i, off_i + nsa_seqlens_expanded[t])`, `off_i = Σ_{r<i} L_r`.
pub fn ragged_keys(md: &NsaMetadata) -> Result<RaggedKeys> {
    let tokens = md.num_tokens();
    let per_token = table_rows_per_token(md.mode);
    let q_counts = &md.nsa_extend_seq_lens;
    if q_counts.len() != md.bs() {
        return Err(inconsistent(format!("{} query counts for {} requests", q_counts.len(), md.bs())));
    }
    let total_keys: usize = md.cache_seqlens.iter().map(|&l| l.max(0) as usize).sum();
    let mut keys = RaggedKeys {
        slots: Vec::with_capacity(total_keys),
        ks: Vec::with_capacity(tokens),
        ke: Vec::with_capacity(tokens),
    };
    let mut token = 0usize;
    for (i, (&len, &count)) in md.cache_seqlens.iter().zip(q_counts).enumerate() {
        let (len, count) = (len.max(0) as usize, count.max(0) as usize);
        let row = if per_token { token } else { i };
        if row >= md.page_table_1.rows || len > md.page_table_1.width || token + count > tokens {
            return Err(inconsistent(format!(
                "request {i}: table row {row} of {}, length {len} of width {}, tokens {}..{} of {tokens}",
                md.page_table_1.rows,
                md.page_table_1.width,
                token,
                token + count
            )));
        }
        let offset = i32::try_from(keys.slots.len()).map_err(|_| inconsistent(format!("{total_keys} keys")))?;
        keys.slots.extend_from_slice(&md.page_table_1.row(row)[..len]);
        for t in token..token + count {
            keys.ks.push(offset);
            keys.ke.push(offset + md.nsa_seqlens_expanded[t].clamp(0, len as i32));
        }
        token += count;
    }
    if token != tokens {
        return Err(inconsistent(format!("query counts sum to {token}, but there are {tokens} tokens")));
    }
    Ok(keys)
}
