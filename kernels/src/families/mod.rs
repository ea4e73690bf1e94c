//! One module per kernel family: each owns its knobs' spelling in the id, its
//! template, launch geometry, shared-memory formulas, template context, the
//! representative variants the snapshots and compile-all build, and the parsing
//! of its ids, behind [`FamilyRules`]. [`KernelSpec`] dispatches to them through
//! [`rules`], the one place that maps a [`KernelFamily`] to its module.

pub mod attention;
pub mod dense;
pub mod indexer;
pub mod kv;
pub mod metadata;
pub mod topk;

use crate::spec::{KernelFamily, KernelSpec};
use crate::target::Target;
use serde_json::{Map, Value};

/// What a family module decides for its kernels. `spec.family` is always one of
/// the module's variants.
pub(crate) trait FamilyRules: Sync {
    /// The first component of the id.
    fn name(&self, spec: &KernelSpec) -> &'static str;
    /// The id's components between the name and the target.
    fn knobs(&self, spec: &KernelSpec) -> Vec<String>;
    /// The thin template the kernel renders from.
    fn template(&self, spec: &KernelSpec) -> &'static str;
    /// Threads per block (`__launch_bounds__` and the launch).
    fn block_threads(&self, spec: &KernelSpec) -> u32;
    /// Dynamic shared memory per block, in bytes.
    fn dynamic_smem_bytes(&self, _spec: &KernelSpec) -> u32 {
        0
    }
    /// Work items one block handles; the grid is `ceil(items / tokens_per_block)`.
    fn tokens_per_block(&self, _spec: &KernelSpec) -> u32 {
        1
    }
    /// The family's part of the template context.
    fn context(&self, spec: &KernelSpec, ctx: &mut Map<String, Value>);
    /// The representative variants for `target` (see [`KernelSpec::all_for`]).
    fn representatives(&self, target: Target) -> Vec<KernelFamily>;
    /// The variant an id names from its family name and knobs, if this module's.
    fn parse(&self, name: &str, knobs: &[&str]) -> Option<KernelFamily>;
    /// Whether `spec`'s variant exists for its target (ids of others do not parse).
    fn exists(&self, _spec: &KernelSpec) -> bool {
        true
    }
}

/// Every family module, in the order [`KernelSpec::all_for`] lists their kernels.
pub(crate) const ALL: [&dyn FamilyRules; 6] =
    [&kv::Kv, &topk::Topk, &metadata::Metadata, &attention::Attention, &indexer::Indexer, &dense::Dense];

/// The module of `family`.
pub(crate) fn rules(family: &KernelFamily) -> &'static dyn FamilyRules {
    match family {
        KernelFamily::KvStore { .. }
        | KernelFamily::KvDequant { .. }
        | KernelFamily::IndexerKStore
        | KernelFamily::IndexerKGather
        | KernelFamily::StepStore { .. } => &kv::Kv,
        KernelFamily::TopK { .. }
        | KernelFamily::TopkSplit { .. }
        | KernelFamily::TopkCluster { .. }
        | KernelFamily::IndexTransform { .. } => &topk::Topk,
        KernelFamily::MetadataReplay { .. } => &metadata::Metadata,
        KernelFamily::SparseDecode { .. }
        | KernelFamily::SparseDecodeCombine { .. }
        | KernelFamily::SparsePrefill { .. } => &attention::Attention,
        KernelFamily::IndexerLogits { .. } => &indexer::Indexer,
        KernelFamily::DensePrefill { .. } => &dense::Dense,
    }
}

/// `prefix` followed by a number (`h64` → 64).
pub(crate) fn number_after(s: &str, prefix: char) -> Option<u32> {
    s.strip_prefix(prefix).and_then(|n| n.parse::<u32>().ok())
}
