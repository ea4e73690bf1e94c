//! Lightning-indexer logits over FP8 keys: PAGED from the indexer cache, or
//! RAGGED from gathered keys with per-row `[ks, ke)`; the warp-group (wgmma FP8)
//! kernel on sm_90a at 64 heads, the mma.sync kernel elsewhere.

use super::{number_after, FamilyRules};
use crate::spec::{KernelFamily, KernelSpec};
use crate::target::{Target, Vendor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Where the indexer logits kernel reads its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexerLayout {
    Paged,
    Ragged,
}

impl IndexerLayout {
    pub const ALL: [IndexerLayout; 2] = [IndexerLayout::Paged, IndexerLayout::Ragged];

    pub fn tag(self) -> &'static str {
        match self {
            IndexerLayout::Paged => "paged",
            IndexerLayout::Ragged => "ragged",
        }
    }

    pub(crate) fn device_enum(self) -> &'static str {
        match self {
            IndexerLayout::Paged => "kPaged",
            IndexerLayout::Ragged => "kRagged",
        }
    }
}

/// Threads of an indexer logits CTA (4 warps, 16 keys each per 64-key block; the
/// warp-group kernel: one warp group).
const INDEXER_LOGITS_THREADS: u32 = 128;

/// Whether indexer logits of `heads` heads on `target` run the warp-group (wgmma
/// FP8) kernel: one CTA per (unit of query rows, chunk of key blocks), every row of
/// the unit served by each block it loads — PAGED: a request's next_n rows; RAGGED:
/// [`INDEXER_WG_RAGGED_ROWS`] consecutive rows. Everything else runs the mma.sync
/// kernel, one CTA per (query row, chunk).
pub fn indexer_wg_kernel(heads: u32, target: Target) -> bool {
    target == Target::Sm90a && heads == INDEXER_WG_HEADS
}

/// Consecutive RAGGED query rows one warp-group indexer CTA serves (`kMaxNextN`).
pub const INDEXER_WG_RAGGED_ROWS: u32 = 4;

/// Index heads of the warp-group indexer kernel (the wgmma N; DeepSeek V3.2's count).
pub const INDEXER_WG_HEADS: u32 = 64;

/// Dynamic shared memory of the warp-group indexer kernel; mirrors
/// `nsa::indexer_wg::Smem` (indexer_logits_wg.cuh): four Q tiles (next_n ≤ 4), a ring
/// of four 64-key tiles and their scales, 1 KiB of alignment slack.
pub const INDEXER_WG_SMEM_BYTES: u32 = 4 * 8192 + 4 * 8192 + 4 * 256 + 1024;

pub(crate) struct Indexer;

impl FamilyRules for Indexer {
    fn name(&self, _spec: &KernelSpec) -> &'static str {
        "indexer_logits"
    }

    fn knobs(&self, spec: &KernelSpec) -> Vec<String> {
        match spec.family {
            KernelFamily::IndexerLogits { heads, layout } => vec![layout.tag().into(), format!("h{heads}")],
            _ => unreachable!("not an indexer family"),
        }
    }

    fn template(&self, spec: &KernelSpec) -> &'static str {
        match spec.family {
            KernelFamily::IndexerLogits { heads, .. } if indexer_wg_kernel(heads, spec.target) => {
                "indexer_logits_wg.cu.tera"
            }
            _ => "indexer_logits.cu.tera",
        }
    }

    fn block_threads(&self, _spec: &KernelSpec) -> u32 {
        INDEXER_LOGITS_THREADS
    }

    fn dynamic_smem_bytes(&self, spec: &KernelSpec) -> u32 {
        match spec.family {
            KernelFamily::IndexerLogits { heads, .. } if indexer_wg_kernel(heads, spec.target) => INDEXER_WG_SMEM_BYTES,
            _ => 0,
        }
    }

    fn context(&self, spec: &KernelSpec, ctx: &mut Map<String, Value>) {
        if let KernelFamily::IndexerLogits { heads, layout } = spec.family {
            ctx.insert("heads".into(), json!(heads));
            ctx.insert("layout".into(), json!(layout.tag()));
            ctx.insert("layout_enum".into(), json!(layout.device_enum()));
            ctx.insert("smem_bytes".into(), json!(self.dynamic_smem_bytes(spec)));
        }
    }

    /// Both layouts at 64 heads, on NVIDIA (no ROCm variant yet: mma.sync).
    fn representatives(&self, target: Target) -> Vec<KernelFamily> {
        if target.vendor() != Vendor::Nvidia {
            return Vec::new();
        }
        IndexerLayout::ALL.map(|layout| KernelFamily::IndexerLogits { heads: 64, layout }).to_vec()
    }

    fn parse(&self, name: &str, knobs: &[&str]) -> Option<KernelFamily> {
        match (name, knobs) {
            ("indexer_logits", [l, h]) => Some(KernelFamily::IndexerLogits {
                layout: IndexerLayout::ALL.into_iter().find(|x| x.tag() == *l)?,
                heads: number_after(h, 'h')?,
            }),
            _ => None,
        }
    }
}
