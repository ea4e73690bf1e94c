//! [`KernelSpec`]: one value per kernel variant. Its id, entry symbol, template,
//! template context and launch geometry are all derived here and nowhere else.

use crate::config::KvCacheFormat;
use crate::target::Target;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::fmt;

/// The kernel families and the knobs that change their generated code.
///
/// A knob that does not change the code is not a knob: the store kernels address
/// rows by slot, so the MLA page size is not part of their spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "snake_case")]
pub enum KernelFamily {
    /// Write new tokens' latent + rope into the MLA cache (quantizing for FP8).
    KvStore { format: KvCacheFormat },
    /// Gather FP8-656 rows by slot and dequantize them to bf16 576.
    KvDequant,
    /// Quantize indexer keys into the 132-byte, 64-token-page indexer cache.
    IndexerKStore,
}

/// One kernel variant for one target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KernelSpec {
    #[serde(flatten)]
    pub family: KernelFamily,
    pub target: Target,
}

/// Threads per block of the store/dequant family (8 MLA tokens, or 32 indexer lane groups).
const STORE_BLOCK_THREADS: u32 = 256;
/// Lanes that cooperate on one MLA token (each owns 16 latent dims).
const MLA_LANES_PER_TOKEN: u32 = 32;
/// Lanes that cooperate on one indexer token (each owns 16 dims).
const INDEXER_LANES_PER_TOKEN: u32 = 8;
/// Indexer tokens each lane group stores (loads issued together for memory parallelism).
const INDEXER_TOKENS_PER_LANE_GROUP: u32 = 2;

impl KernelSpec {
    pub fn new(family: KernelFamily, target: Target) -> Self {
        KernelSpec { family, target }
    }

    /// Family name, the first component of the id.
    pub fn family_name(&self) -> &'static str {
        match self.family {
            KernelFamily::KvStore { .. } => "kv_store",
            KernelFamily::KvDequant => "kv_dequant",
            KernelFamily::IndexerKStore => "indexer_k_store",
        }
    }

    /// Human-readable id, e.g. `kv_store.fp8_656.sm_90a`. Unique per variant.
    pub fn id(&self) -> String {
        let knobs: Vec<&str> = match self.family {
            KernelFamily::KvStore { format } => vec![format.tag()],
            KernelFamily::KvDequant => vec![KvCacheFormat::Fp8.tag()],
            KernelFamily::IndexerKStore => vec!["fp8_132", "p64"],
        };
        let mut parts = vec![self.family_name()];
        parts.extend(knobs);
        parts.push(self.target.arch());
        parts.join(".")
    }

    /// The `extern "C"` entry point: the id with `.` spelled `__` (ids never hold `__`).
    pub fn symbol(&self) -> String {
        format!("nsa_{}", self.id().replace('.', "__"))
    }

    /// File name of the rendered source.
    pub fn source_name(&self) -> String {
        format!("{}.cu", self.id())
    }

    /// The thin template this family renders from.
    pub fn template(&self) -> &'static str {
        match self.family {
            KernelFamily::KvStore { .. } => "kv_store.cu.tera",
            KernelFamily::KvDequant => "kv_dequant.cu.tera",
            KernelFamily::IndexerKStore => "indexer_k_store.cu.tera",
        }
    }

    /// Threads per block the kernel is compiled for (`__launch_bounds__`) and launched with.
    pub fn block_threads(&self) -> u32 {
        STORE_BLOCK_THREADS
    }

    /// Tokens one block handles; the launcher's grid is `ceil(tokens / tokens_per_block)`.
    pub fn tokens_per_block(&self) -> u32 {
        match self.family {
            KernelFamily::KvStore { .. } | KernelFamily::KvDequant => self.block_threads() / MLA_LANES_PER_TOKEN,
            KernelFamily::IndexerKStore => {
                self.block_threads() / INDEXER_LANES_PER_TOKEN * INDEXER_TOKENS_PER_LANE_GROUP
            }
        }
    }

    /// Everything the template may read. Templates are strict: a name missing here
    /// fails rendering.
    pub fn context(&self) -> Value {
        let mut ctx = Map::new();
        ctx.insert("id".into(), json!(self.id()));
        ctx.insert("symbol".into(), json!(self.symbol()));
        ctx.insert("arch".into(), json!(self.target.arch()));
        ctx.insert("arch_header".into(), json!(self.target.arch_header()));
        ctx.insert("block_threads".into(), json!(self.block_threads()));
        if self.family == KernelFamily::IndexerKStore {
            ctx.insert("tokens_per_lane_group".into(), json!(INDEXER_TOKENS_PER_LANE_GROUP));
        }
        if let KernelFamily::KvStore { format } = self.family {
            ctx.insert("format".into(), json!(format.tag()));
            let (func, elem) = match format {
                KvCacheFormat::Bf16 => ("store_bf16", "nsa::u16"),
                KvCacheFormat::Fp8 => ("store_fp8", "nsa::u8"),
            };
            ctx.insert("store_fn".into(), json!(func));
            ctx.insert("cache_elem".into(), json!(elem));
        }
        Value::Object(ctx)
    }

    /// Every variant that exists for `target`, for id look-up and compile-all.
    pub fn all_for(target: Target) -> Vec<KernelSpec> {
        [
            KernelFamily::KvStore { format: KvCacheFormat::Bf16 },
            KernelFamily::KvStore { format: KvCacheFormat::Fp8 },
            KernelFamily::KvDequant,
            KernelFamily::IndexerKStore,
        ]
        .into_iter()
        .map(|family| KernelSpec::new(family, target))
        .collect()
    }

    /// The variant whose [`id`](Self::id) is `id`.
    pub fn from_id(id: &str) -> Option<KernelSpec> {
        Target::ALL.into_iter().flat_map(KernelSpec::all_for).find(|s| s.id() == id)
    }
}

impl fmt::Display for KernelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id())
    }
}
