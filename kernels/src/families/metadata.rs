//! CUDA-graph metadata replay and the device-built extend metadata: one launch
//! rewrites a graph state's lengths, cumulative sums and page-table rows in place.

use super::{number_after, FamilyRules};
use crate::spec::{KernelFamily, KernelSpec};
use crate::target::Target;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The forward mode a metadata kernel serves: the decode-like modes of CUDA graphs
/// (draft-extend v2 is draft-extend with every request extending by `D`, no
/// per-request lengths) and extend, whose eager steps build their metadata on the
/// device (one table row per request, plus the ragged key layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetadataMode {
    Decode,
    TargetVerify,
    DraftExtend,
    Extend,
}

impl MetadataMode {
    pub const ALL: [MetadataMode; 4] =
        [MetadataMode::Decode, MetadataMode::TargetVerify, MetadataMode::DraftExtend, MetadataMode::Extend];

    pub fn tag(self) -> &'static str {
        match self {
            MetadataMode::Decode => "decode",
            MetadataMode::TargetVerify => "target_verify",
            MetadataMode::DraftExtend => "draft_extend",
            MetadataMode::Extend => "extend",
        }
    }

    pub(crate) fn device_enum(self) -> &'static str {
        match self {
            MetadataMode::Decode => "kDecode",
            MetadataMode::TargetVerify => "kTargetVerify",
            MetadataMode::DraftExtend => "kDraftExtend",
            MetadataMode::Extend => "kExtend",
        }
    }
}

/// Threads per block of the metadata replay kernel (every block scans the batch;
/// blocks share the page-table rows).
const METADATA_BLOCK_THREADS: u32 = 512;
/// Requests one metadata replay handles at most (each block keeps the first query
/// row of every request in shared memory): the largest CUDA-graph batch size.
pub const METADATA_MAX_BATCH: u32 = 4096;

pub(crate) struct Metadata;

impl FamilyRules for Metadata {
    fn name(&self, _spec: &KernelSpec) -> &'static str {
        "metadata_replay"
    }

    fn knobs(&self, spec: &KernelSpec) -> Vec<String> {
        match spec.family {
            KernelFamily::MetadataReplay { page_size, mode } => vec![mode.tag().into(), format!("p{page_size}")],
            _ => unreachable!("not a metadata family"),
        }
    }

    fn template(&self, _spec: &KernelSpec) -> &'static str {
        "metadata_replay.cu.tera"
    }

    fn block_threads(&self, _spec: &KernelSpec) -> u32 {
        METADATA_BLOCK_THREADS
    }

    fn context(&self, spec: &KernelSpec, ctx: &mut Map<String, Value>) {
        if let KernelFamily::MetadataReplay { page_size, mode } = spec.family {
            ctx.insert("page_size".into(), json!(page_size));
            ctx.insert("mode".into(), json!(mode.tag()));
            ctx.insert("mode_enum".into(), json!(mode.device_enum()));
            ctx.insert("max_batch".into(), json!(METADATA_MAX_BATCH));
        }
    }

    /// Every mode at page sizes 64 and 1.
    fn representatives(&self, _target: Target) -> Vec<KernelFamily> {
        [64, 1]
            .into_iter()
            .flat_map(|page_size| MetadataMode::ALL.map(|mode| KernelFamily::MetadataReplay { page_size, mode }))
            .collect()
    }

    fn parse(&self, name: &str, knobs: &[&str]) -> Option<KernelFamily> {
        match (name, knobs) {
            ("metadata_replay", [mode, p]) => Some(KernelFamily::MetadataReplay {
                page_size: number_after(p, 'p')?,
                mode: MetadataMode::ALL.into_iter().find(|m| m.tag() == *mode)?,
            }),
            _ => None,
        }
    }
}
