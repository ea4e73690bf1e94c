//! The store, dequant and gather kernels of the MLA and indexer caches: one
//! token per lane group, addressed by slot (the MLA page size is not a knob).

use super::FamilyRules;
use crate::config::KvCacheFormat;
use crate::spec::{KernelFamily, KernelSpec};
use crate::target::Target;
use serde_json::{json, Map, Value};

/// Threads per block of the store/dequant/gather family (8 MLA tokens, or 32 indexer lane groups).
const STORE_BLOCK_THREADS: u32 = 256;
/// Lanes that cooperate on one MLA token (each owns 16 latent dims).
const MLA_LANES_PER_TOKEN: u32 = 32;
/// Lanes that cooperate on one indexer token (each owns 16 dims).
const INDEXER_LANES_PER_TOKEN: u32 = 8;
/// Indexer tokens each lane group stores or gathers (loads issued together for memory parallelism).
const INDEXER_TOKENS_PER_LANE_GROUP: u32 = 2;

pub(crate) struct Kv;

impl FamilyRules for Kv {
    fn name(&self, spec: &KernelSpec) -> &'static str {
        match spec.family {
            KernelFamily::KvStore { .. } => "kv_store",
            KernelFamily::KvDequant { .. } => "kv_dequant",
            KernelFamily::IndexerKStore => "indexer_k_store",
            KernelFamily::StepStore { .. } => "step_store",
            _ => "indexer_k_gather",
        }
    }

    fn knobs(&self, spec: &KernelSpec) -> Vec<String> {
        match spec.family {
            KernelFamily::KvStore { format }
            | KernelFamily::KvDequant { format }
            | KernelFamily::StepStore { format } => vec![format.tag().into()],
            _ => vec!["fp8_132".into(), "p64".into()],
        }
    }

    fn template(&self, spec: &KernelSpec) -> &'static str {
        match spec.family {
            KernelFamily::KvStore { .. } => "kv_store.cu.tera",
            KernelFamily::KvDequant { .. } => "kv_dequant.cu.tera",
            KernelFamily::IndexerKStore => "indexer_k_store.cu.tera",
            KernelFamily::StepStore { .. } => "step_store.cu.tera",
            _ => "indexer_k_gather.cu.tera",
        }
    }

    fn block_threads(&self, _spec: &KernelSpec) -> u32 {
        STORE_BLOCK_THREADS
    }

    /// The step store's grid is the two stores' grids end to end: its launch counts
    /// blocks ([`step_store_blocks`]).
    fn tokens_per_block(&self, spec: &KernelSpec) -> u32 {
        match spec.family {
            KernelFamily::KvStore { .. } | KernelFamily::KvDequant { .. } => mla_tokens_per_block(),
            KernelFamily::StepStore { .. } => 1,
            _ => indexer_tokens_per_block(),
        }
    }

    fn context(&self, spec: &KernelSpec, ctx: &mut Map<String, Value>) {
        match spec.family {
            KernelFamily::KvStore { format } => mla_store_context(format, ctx),
            KernelFamily::StepStore { format } => {
                mla_store_context(format, ctx);
                ctx.insert("mla_tokens_per_block".into(), json!(mla_tokens_per_block()));
                ctx.insert("tokens_per_lane_group".into(), json!(INDEXER_TOKENS_PER_LANE_GROUP));
            }
            KernelFamily::KvDequant { format } => {
                let (func, elem) = match format {
                    KvCacheFormat::Bf16 => ("gather_bf16", "nsa::u16"),
                    KvCacheFormat::Fp8 => ("dequant_fp8", "nsa::u8"),
                };
                ctx.insert("format".into(), json!(format.tag()));
                ctx.insert("read_fn".into(), json!(func));
                ctx.insert("cache_elem".into(), json!(elem));
            }
            KernelFamily::IndexerKStore | KernelFamily::IndexerKGather => {
                ctx.insert("tokens_per_lane_group".into(), json!(INDEXER_TOKENS_PER_LANE_GROUP));
            }
            _ => {}
        }
    }

    /// Each store, dequant and gather kernel.
    fn representatives(&self, _target: Target) -> Vec<KernelFamily> {
        vec![
            KernelFamily::KvStore { format: KvCacheFormat::Bf16 },
            KernelFamily::KvStore { format: KvCacheFormat::Fp8 },
            KernelFamily::KvDequant { format: KvCacheFormat::Bf16 },
            KernelFamily::KvDequant { format: KvCacheFormat::Fp8 },
            KernelFamily::IndexerKStore,
            KernelFamily::IndexerKGather,
            KernelFamily::StepStore { format: KvCacheFormat::Bf16 },
            KernelFamily::StepStore { format: KvCacheFormat::Fp8 },
        ]
    }

    fn parse(&self, name: &str, knobs: &[&str]) -> Option<KernelFamily> {
        Some(match (name, knobs) {
            ("kv_store", [fmt]) => KernelFamily::KvStore { format: fmt.parse().ok()? },
            ("kv_dequant", [fmt]) => KernelFamily::KvDequant { format: fmt.parse().ok()? },
            ("indexer_k_store", _) => KernelFamily::IndexerKStore,
            ("indexer_k_gather", _) => KernelFamily::IndexerKGather,
            ("step_store", [fmt]) => KernelFamily::StepStore { format: fmt.parse().ok()? },
            _ => return None,
        })
    }
}

fn mla_store_context(format: KvCacheFormat, ctx: &mut Map<String, Value>) {
    ctx.insert("format".into(), json!(format.tag()));
    let (func, elem) = match format {
        KvCacheFormat::Bf16 => ("store_bf16", "nsa::u16"),
        KvCacheFormat::Fp8 => ("store_fp8", "nsa::u8"),
    };
    ctx.insert("store_fn".into(), json!(func));
    ctx.insert("cache_elem".into(), json!(elem));
}

/// MLA tokens per store, dequant or gather block (one 32-lane group each).
fn mla_tokens_per_block() -> u32 {
    STORE_BLOCK_THREADS / MLA_LANES_PER_TOKEN
}

/// Indexer tokens per store or gather block.
fn indexer_tokens_per_block() -> u32 {
    STORE_BLOCK_THREADS / INDEXER_LANES_PER_TOKEN * INDEXER_TOKENS_PER_LANE_GROUP
}

/// Blocks of a step store of `tokens` tokens: the latent stores' blocks, then the
/// indexer keys'.
pub fn step_store_blocks(tokens: usize) -> usize {
    tokens.div_ceil(mla_tokens_per_block() as usize) + tokens.div_ceil(indexer_tokens_per_block() as usize)
}
