//! Batch-dependent dispatch (spec §5.1–5.2): MHA one-shot or absorbed MLA, the
//! prefill implementation, and PAGED vs RAGGED — a pure function of the policy and
//! the batch, with a reason the server can log.

use super::extend_cost::ExtendCosts;
use super::{ExtendPlan, ForwardMode, TransformMethod};
use nsa_kernels::KvCacheFormat;
use std::fmt::Write;

/// Sparse-attention implementations (`nsa_prefill_backend` / `nsa_decode_backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnImpl {
    FlashMlaSparse,
    FlashMlaKv,
    Fa3,
    Tilelang,
    Trtllm,
}

impl AttnImpl {
    pub fn name(self) -> &'static str {
        match self {
            AttnImpl::FlashMlaSparse => "flashmla_sparse",
            AttnImpl::FlashMlaKv => "flashmla_kv",
            AttnImpl::Fa3 => "fa3",
            AttnImpl::Tilelang => "tilelang",
            AttnImpl::Trtllm => "trtllm",
        }
    }
}

/// The configured prefill backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrefillBackend {
    /// `flashmla_auto`: chosen per batch (§5.1).
    Auto,
    /// Chosen per batch from nsa's own kernel costs ([`ExtendCosts`]) for a layer of
    /// `heads` query heads: an FP8-cache extend batch takes dequantize + prefill
    /// (RAGGED) when estimated faster than the decode kernel (PAGED).
    Cost {
        heads: u32,
    },
    Fixed(AttnImpl),
}

/// Server- and device-level inputs of the decision (fixed for a server's lifetime).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchPolicy {
    /// Device compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// KV pool format (both allowed formats qualify for MHA).
    pub kv_cache: KvCacheFormat,
    pub prefill_backend: PrefillBackend,
    /// `index_topk`: the MHA KV-length limit unless the prefill impl is trtllm.
    pub topk: u32,
    /// `get_max_chunk_capacity()` of the forward batch.
    pub max_chunk_capacity: usize,
    /// Prefill context parallelism enabled (forbids MHA one-shot).
    pub cp_enabled: bool,
    /// `SGLANG_NSA_FORCE_MLA`.
    pub force_mla: bool,
}

/// What the decision reads from a batch.
#[derive(Clone, Copy, Debug)]
pub struct BatchSummary<'a> {
    pub mode: ForwardMode,
    /// `L_i` of every request.
    pub seq_lens: &'a [i32],
    /// Σ `E_i` (query tokens).
    pub extend_num_tokens: usize,
}

/// The outcome for one batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatch {
    /// Dense MHA one-shot instead of sparse absorbed MLA.
    pub use_mha: bool,
    /// The prefill implementation after auto selection.
    pub prefill_impl: AttnImpl,
    pub transform: TransformMethod,
    /// MHA on an FP8 pool: the prefix KV must be dequantized.
    pub mha_fp8_dequant: bool,
    /// One line for the log: the deciding conditions and values.
    pub reason: String,
}

impl Dispatch {
    pub fn extend_plan(&self) -> ExtendPlan {
        ExtendPlan { transform: self.transform, mha_fp8_dequant: self.mha_fp8_dequant }
    }
}

/// `set_nsa_prefill_impl` + `get_topk_transform_method`. `batch` is `None` for
/// CUDA-graph capture/replay, which never uses MHA.
///
/// Decisions where the reference is history-dependent or open:
/// * With `flashmla_auto`, the reference writes the chosen impl back and keeps it when
///   a batch picks MHA (the auto rule is skipped), so an MHA batch inherits the
///   previous batch's impl. Here an MHA batch applies the auto rule too: the result
///   only feeds the transform, which MHA does not use.
/// * Decode-like modes are always PAGED: they have no ragged offsets. The reference
///   would say RAGGED if fp8 + `flashmla_sparse` prefill were forced (§5.2, UNVERIFIED
///   whether the server rejects that); the reason string says so when it happens.
/// * An empty extend batch does not take MHA (the reference's `max()` of an empty
///   list is unguarded).
pub fn decide(policy: &DispatchPolicy, batch: Option<&BatchSummary<'_>>) -> Dispatch {
    let mut reason = String::new();
    let use_mha = mha_one_shot(policy, batch, &mut reason);
    let prefill_impl = prefill_impl(policy, batch, &mut reason);
    let fp8 = policy.kv_cache == KvCacheFormat::Fp8;
    let ragged = fp8 && prefill_impl == AttnImpl::FlashMlaSparse;
    let extend = batch.is_some_and(|b| b.mode == ForwardMode::Extend);
    let transform = if ragged && extend { TransformMethod::Ragged } else { TransformMethod::Paged };
    let _ = match (ragged, extend) {
        (true, true) => write!(reason, "; RAGGED: fp8 cache with flashmla_sparse"),
        (true, false) => write!(
            reason,
            "; PAGED: decode-like batches have no ragged offsets (the reference would pick RAGGED for fp8 + flashmla_sparse)"
        ),
        (false, _) => write!(
            reason,
            "; PAGED: {}",
            if fp8 { "prefill impl is not flashmla_sparse" } else { "bf16 cache" }
        ),
    };
    Dispatch { use_mha, prefill_impl, transform, mha_fp8_dequant: use_mha && fp8, reason }
}

fn mha_one_shot(policy: &DispatchPolicy, batch: Option<&BatchSummary<'_>>, reason: &mut String) -> bool {
    let mut no = |why: String| {
        reason.push_str("MLA: ");
        reason.push_str(&why);
        false
    };
    let Some(b) = batch else { return no("no batch (CUDA-graph capture/replay)".into()) };
    if b.mode != ForwardMode::Extend {
        return no(format!("{} batches always use MLA", b.mode.name()));
    }
    if policy.force_mla {
        return no("SGLANG_NSA_FORCE_MLA is set".into());
    }
    let (major, minor) = policy.compute_capability;
    let sm = major * 10 + minor;
    if !(sm == 90 || (100..110).contains(&sm)) {
        return no(format!("sm_{sm} is neither sm_90 nor sm_100..sm_109"));
    }
    if policy.cp_enabled {
        return no("context parallelism is enabled".into());
    }
    let Some(&max_len) = b.seq_lens.iter().max() else { return no("empty batch".into()) };
    let (limit, limit_name) = match policy.prefill_backend {
        PrefillBackend::Fixed(AttnImpl::Trtllm) => (policy.max_chunk_capacity, "max chunk capacity (trtllm)"),
        _ => (policy.topk as usize, "index_topk"),
    };
    if max_len as usize > limit {
        return no(format!("max seq len {max_len} > {limit} ({limit_name})"));
    }
    let sum: usize = b.seq_lens.iter().map(|&l| l.max(0) as usize).sum();
    if sum > policy.max_chunk_capacity {
        return no(format!("Σ seq lens {sum} > max chunk capacity {}", policy.max_chunk_capacity));
    }
    let _ = write!(
        reason,
        "MHA one-shot: max seq len {max_len} ≤ {limit} ({limit_name}), Σ seq lens {sum} ≤ chunk capacity {}, sm_{sm}, {} cache, no CP",
        policy.max_chunk_capacity,
        policy.kv_cache.tag()
    );
    true
}

fn prefill_impl(policy: &DispatchPolicy, batch: Option<&BatchSummary<'_>>, reason: &mut String) -> AttnImpl {
    let fixed = match policy.prefill_backend {
        PrefillBackend::Fixed(i) => i,
        PrefillBackend::Auto => {
            let (choice, why) = auto_impl(policy, batch);
            let _ = write!(reason, "; prefill {} (auto: {why})", choice.name());
            return choice;
        }
        PrefillBackend::Cost { heads } => {
            let (choice, why) = cost_impl(policy, batch, heads);
            let _ = write!(reason, "; prefill {} (cost: {why})", choice.name());
            return choice;
        }
    };
    let _ = write!(reason, "; prefill {} (configured)", fixed.name());
    fixed
}

fn auto_impl(policy: &DispatchPolicy, batch: Option<&BatchSummary<'_>>) -> (AttnImpl, String) {
    if policy.kv_cache == KvCacheFormat::Bf16 {
        return (AttnImpl::FlashMlaSparse, "bf16 cache".into());
    }
    let blackwell = policy.compute_capability.0 == 10;
    match batch {
        Some(b) if blackwell && b.mode == ForwardMode::Extend => {
            let kv: usize = b.seq_lens.iter().map(|&l| l.max(0) as usize).sum();
            let q512 = b.extend_num_tokens * 512;
            if kv < q512 {
                (
                    AttnImpl::FlashMlaSparse,
                    format!("fp8 on Blackwell, Σ seq lens {kv} < 512 × {} query tokens", b.extend_num_tokens),
                )
            } else {
                (
                    AttnImpl::FlashMlaKv,
                    format!("fp8 on Blackwell, Σ seq lens {kv} ≥ 512 × {} query tokens", b.extend_num_tokens),
                )
            }
        }
        Some(b) if blackwell => (AttnImpl::FlashMlaKv, format!("fp8, {} batch", b.mode.name())),
        Some(_) => (AttnImpl::FlashMlaKv, "fp8 on Hopper".into()),
        None => (AttnImpl::FlashMlaKv, "fp8, no batch (CUDA graph)".into()),
    }
}

/// The prefill implementation by nsa's kernel costs: only an FP8-cache extend batch
/// has two paths to weigh.
fn cost_impl(policy: &DispatchPolicy, batch: Option<&BatchSummary<'_>>, heads: u32) -> (AttnImpl, String) {
    if policy.kv_cache == KvCacheFormat::Bf16 {
        return (AttnImpl::FlashMlaSparse, "bf16 cache".into());
    }
    let b = match batch {
        Some(b) if b.mode == ForwardMode::Extend => b,
        Some(b) => return (AttnImpl::FlashMlaKv, format!("fp8, {} batch", b.mode.name())),
        None => return (AttnImpl::FlashMlaKv, "fp8, no batch (CUDA graph)".into()),
    };
    let kv: usize = b.seq_lens.iter().map(|&l| l.max(0) as usize).sum();
    let c = ExtendCosts::estimate(heads, b.extend_num_tokens, kv);
    let why = format!(
        "dequantize {kv} tokens + prefill kernel over {} rows ≈ {:.0} + {:.0} = {:.0} µs {} decode kernel over them ≈ {:.0} µs, h{heads}",
        b.extend_num_tokens,
        c.dequant_us,
        c.prefill_us,
        c.ragged_us(),
        if c.prefers_ragged() { "<" } else { "≥" },
        c.decode_us
    );
    (if c.prefers_ragged() { AttnImpl::FlashMlaSparse } else { AttnImpl::FlashMlaKv }, why)
}
