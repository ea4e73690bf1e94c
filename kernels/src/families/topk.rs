//! Exact top-k (one block per row in two layouts, split over many blocks, or over
//! a thread-block cluster) with the output transform fused in, and the unfused
//! page-table transform.

use super::{number_after, FamilyRules};
use crate::spec::{KernelFamily, KernelSpec};
use crate::target::{Target, Vendor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// How a top-k kernel spends one SM: one big block per row with the row cached in
/// shared memory (few rows: latency), or half-size blocks without a row cache so
/// two rows share an SM (many rows: throughput).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopkLayout {
    Latency,
    Throughput,
}

/// The element type of the scores a top-k kernel reads. Either way the choice is
/// exact: a bf16 score's f32 value is exact, so the keys, their order and the NaN
/// rule are those of f32 (spec §7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopkScore {
    /// f32 logits (what the indexer kernels write).
    #[default]
    F32,
    /// bf16 logits: half the bytes to read.
    Bf16,
}

impl TopkScore {
    pub const ALL: [TopkScore; 2] = [TopkScore::F32, TopkScore::Bf16];

    pub fn tag(self) -> &'static str {
        match self {
            TopkScore::F32 => "f32",
            TopkScore::Bf16 => "bf16",
        }
    }

    /// Bytes per score.
    pub fn bytes(self) -> usize {
        match self {
            TopkScore::F32 => 4,
            TopkScore::Bf16 => 2,
        }
    }

    pub(crate) fn device_type(self) -> &'static str {
        match self {
            TopkScore::F32 => "float",
            TopkScore::Bf16 => "nsa::topk::Bf16",
        }
    }

    /// Id knobs: none for f32 (the ids that came before bf16), `bf16` otherwise.
    pub(crate) fn id_knobs(self, knobs: &mut Vec<String>) {
        if self != TopkScore::F32 {
            knobs.push(self.tag().into());
        }
    }
}

impl std::str::FromStr for TopkScore {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => Ok(TopkScore::F32),
            "bf16" | "bfloat16" => Ok(TopkScore::Bf16),
            _ => Err(format!("unknown top-k score type `{s}`: allowed f32 or bf16")),
        }
    }
}

/// What a top-k call writes for each chosen position p of row b.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopkTransform {
    /// p itself (relative to the row start).
    Plain,
    /// page_table[row of b, p]: a physical KV slot (spec §7.3).
    Paged,
    /// p + offsets[b] (spec §7.4).
    Ragged,
    /// PAGED from a table of pages of this many positions (at least 2; spec §2.2):
    /// `table[row of b, p / P] · P + p % P`, the same slot as [`TopkTransform::Paged`]
    /// reads from the page_table_1 that table expands to, from a table P times
    /// smaller; an entry < 0 (no page) gives −1, as its page_table_1 entries would.
    /// The page size is a launch parameter.
    Pages(u32),
}

/// What a top-k kernel writes, fixed when it is compiled (kernels per plan and kind
/// of entry; the launch parameters name the rest of the transform): positions serve
/// plain and RAGGED (offsets given); slots serve PAGED. One kernel for every
/// transform measured up to 5.5% slower (H100, December 2026): the run-time choice
/// stayed in the passes over the row. The plans of few rows (one block per row in
/// the latency layout, clusters) give each PAGED form its own kernel (`table1`,
/// `pages`): one kernel for both measured up to 1.8% slower there; the plans of many
/// rows (throughput layout, split) serve both forms from one `slots` kernel, which
/// measured within 0.1% of a kernel per form.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopkEntries {
    /// Positions in the row, plus a per-row offset when one is given.
    #[default]
    Positions,
    /// KV slots read from a page table of either form (chosen at run time).
    Slots,
    /// KV slots read from a page_table_1.
    Table1,
    /// KV slots read from a table of pages (any page size, a launch parameter).
    Pages,
}

impl TopkEntries {
    pub const ALL: [TopkEntries; 4] =
        [TopkEntries::Positions, TopkEntries::Slots, TopkEntries::Table1, TopkEntries::Pages];
    /// What a call writes ([`TopkTransform::entries`]): the kinds of the plans that
    /// give each PAGED form its own kernel.
    pub const CALLS: [TopkEntries; 3] = [TopkEntries::Positions, TopkEntries::Table1, TopkEntries::Pages];
    /// The kinds of the plans whose one slots kernel serves both PAGED forms.
    pub const MERGED: [TopkEntries; 2] = [TopkEntries::Positions, TopkEntries::Slots];

    pub fn tag(self) -> &'static str {
        match self {
            TopkEntries::Positions => "positions",
            TopkEntries::Slots => "slots",
            TopkEntries::Table1 => "table1",
            TopkEntries::Pages => "pages",
        }
    }

    fn device_enum(self) -> &'static str {
        match self {
            TopkEntries::Positions => "kPositions",
            TopkEntries::Slots => "kSlots",
            TopkEntries::Table1 => "kTable1",
            TopkEntries::Pages => "kPages",
        }
    }

    fn description(self) -> &'static str {
        match self {
            TopkEntries::Positions => "positions (plain, or RAGGED when offsets are given)",
            TopkEntries::Slots => "KV slots (PAGED, from a page_table_1 or a table of pages)",
            TopkEntries::Table1 => "KV slots (PAGED, from a page_table_1)",
            TopkEntries::Pages => "KV slots (PAGED, from a table of pages)",
        }
    }

    /// Either PAGED form as the one `slots` kind (the plans of many rows).
    pub fn merged(self) -> TopkEntries {
        match self {
            TopkEntries::Table1 | TopkEntries::Pages => TopkEntries::Slots,
            e => e,
        }
    }

    /// Id knobs: none for positions (the ids that came before slots), the tag otherwise.
    fn id_knobs(self, knobs: &mut Vec<String>) {
        if self != TopkEntries::Positions {
            knobs.push(self.tag().into());
        }
    }

    fn parse(flags: &[&str]) -> TopkEntries {
        TopkEntries::ALL
            .into_iter()
            .find(|e| *e != TopkEntries::Positions && flags.contains(&e.tag()))
            .unwrap_or_default()
    }
}

impl TopkLayout {
    /// The kinds of entry this layout's kernels are compiled for.
    pub fn kernel_entries(self) -> &'static [TopkEntries] {
        match self {
            TopkLayout::Latency => &TopkEntries::CALLS,
            TopkLayout::Throughput => &TopkEntries::MERGED,
        }
    }

    /// The kind of this layout's kernel for a call writing `entries`.
    pub fn entries(self, entries: TopkEntries) -> TopkEntries {
        match self {
            TopkLayout::Latency => entries,
            TopkLayout::Throughput => entries.merged(),
        }
    }
}

/// Page sizes [`TopkTransform::Pages`] takes.
pub const TOPK_PAGE_SIZES: std::ops::RangeInclusive<u32> = 2..=65536;

impl TopkTransform {
    /// The transforms a top-k call may ask for; [`TopkTransform::Pages`] joins them at
    /// the config's page size.
    pub const ALL: [TopkTransform; 3] = [TopkTransform::Plain, TopkTransform::Paged, TopkTransform::Ragged];

    /// PAGED from a table with `page_size` positions per entry: 1 is a page_table_1.
    pub fn paged(page_size: u32) -> TopkTransform {
        if page_size == 1 {
            TopkTransform::Paged
        } else {
            TopkTransform::Pages(page_size)
        }
    }

    /// Either PAGED form: the output is KV slots.
    pub fn is_paged(self) -> bool {
        self.page_size().is_some()
    }

    /// PAGED: positions per page-table entry (1: a page_table_1); `None` otherwise.
    /// The inverse of [`TopkTransform::paged`].
    pub fn page_size(self) -> Option<u32> {
        match self {
            TopkTransform::Paged => Some(1),
            TopkTransform::Pages(p) => Some(p),
            TopkTransform::Plain | TopkTransform::Ragged => None,
        }
    }

    /// What this transform writes, as the plans of few rows compile it (one of
    /// [`TopkEntries::CALLS`]; [`TopkEntries::merged`] for the plans of many rows).
    pub fn entries(self) -> TopkEntries {
        match self {
            TopkTransform::Plain | TopkTransform::Ragged => TopkEntries::Positions,
            TopkTransform::Paged => TopkEntries::Table1,
            TopkTransform::Pages(_) => TopkEntries::Pages,
        }
    }

    pub fn tag(self) -> String {
        match self {
            TopkTransform::Plain => "plain".into(),
            TopkTransform::Paged => "paged".into(),
            TopkTransform::Ragged => "ragged".into(),
            TopkTransform::Pages(p) => format!("pages{p}"),
        }
    }
}

/// Threads per top-k block (one block per row).
const TOPK_BLOCK_THREADS: u32 = 1024;
/// Shared words of the top-k kernel besides candidates and row cache: the 8192-bin
/// round-0 histogram (which the list cuts' three 2048-bin round histograms and the
/// staged top-k positions reuse) and 72 scalars (`kFixedWords` in topk.cuh;
/// static_asserts there).
const TOPK_FIXED_WORDS: u32 = 8192 + 72;
/// Cluster sizes the cluster top-k kernel is launched with (8: the portable maximum; a
/// non-portable 16 measured slower at 1 × 128K on an H200, December 2026). Its CTAs
/// are latency-layout blocks (1024 threads, one per SM, the same shared memory), so
/// CTA 0 can fall back to that layout's histogram path.
pub const TOPK_CLUSTER_SIZES: [u32; 3] = [2, 4, 8];
/// Threshold-bin candidates (index + key) kept in shared memory before falling back
/// to re-reading the row (latency layout: the rest of its shared memory is row cache).
const TOPK_CANDIDATES: u32 = 4096;
/// The throughput layout's candidates, which are also its sample filter's list: its
/// 512-run sample keeps ~3.8K of a 32K-key row with k 2048 (the list must hold 4/3
/// of that), and two blocks of 8264 + 2 × 6144 words still share an SM.
const TOPK_CANDIDATES_THROUGHPUT: u32 = 6144;
/// gfx942 has 64 KiB of LDS per block: histogram plus half the candidates.
const TOPK_CANDIDATES_GFX942: u32 = 2048;
/// Keys per row of the split path's list: the sample threshold keeps about
/// 1.5 k (32K-key rows) to 2.3 k (128K) with k 2048; 2 × 8192 words in shared
/// memory, so two 512-thread blocks share an SM.
const TOPK_SPLIT_LIST: u32 = 8192;
/// gfx942 (64 KiB of LDS): the histogram plus a 2048-key list, so with k 2048
/// long rows overflow it and take the histogram path.
const TOPK_SPLIT_LIST_GFX942: u32 = 2048;
/// The cluster kernel's CTAs cache rows up to this many keys in shared memory for
/// CTA 0's histogram path; the joined list (of the sample filter or of the CTAs'
/// local bounds) takes the candidate lists plus this cache: up to (2 × 4096 + 40960) / 2 = 24576 keys (rows to ~1M keys).
const TOPK_ROW_CACHE_CLUSTER: u32 = 40960;
/// The latency layout's row cache: its filter list holds (2 × 4096 + 8192) / 2 = 8192
/// keys (rows up to 256K keys with k 2048), and its 96 KiB of shared memory leave the
/// SM ~128 KiB of L1, which the gather of the listed keys hits (H200, December
/// 2026: 64 × 128K 23.5 -> 21.3 µs against the 224 KiB layout with a
/// 24576-key list).
const TOPK_ROW_CACHE_LATENCY: u32 = 8192;
/// Threads per block of the elementwise index transform.
const TRANSFORM_BLOCK_THREADS: u32 = 256;

pub(crate) struct Topk;

/// Row-cache words of a top-k kernel's shared memory.
fn row_cache(spec: &KernelSpec) -> u32 {
    match (spec.family, spec.target) {
        (KernelFamily::TopK { layout: TopkLayout::Throughput, .. } | KernelFamily::TopkSplit { .. }, _) => 0,
        (KernelFamily::TopK { layout: TopkLayout::Latency, .. }, Target::Sm90a | Target::Sm100a) => {
            TOPK_ROW_CACHE_LATENCY
        }
        (_, Target::Sm90a | Target::Sm100a) => TOPK_ROW_CACHE_CLUSTER,
        // 64 KiB of LDS: histogram and candidates only.
        (_, Target::Gfx942) => 0,
    }
}

fn smem_words(spec: &KernelSpec) -> u32 {
    match spec.family {
        KernelFamily::TopkSplit { .. } => TOPK_FIXED_WORDS + 2 * split_list(spec.target),
        _ => TOPK_FIXED_WORDS + 2 * candidates(spec) + row_cache(spec),
    }
}

/// Half-size top-k blocks promise two per SM (`__launch_bounds__(n, 2)`): without it
/// ptxas caps them at 40 registers and spills.
fn min_blocks_per_sm(spec: &KernelSpec) -> u32 {
    if Topk.block_threads(spec) < TOPK_BLOCK_THREADS {
        2
    } else {
        1
    }
}

/// Keys the split path's list holds per row (in the workspace and in each block's
/// shared memory).
pub fn split_list(target: Target) -> u32 {
    match target {
        Target::Gfx942 => TOPK_SPLIT_LIST_GFX942,
        Target::Sm90a | Target::Sm100a => TOPK_SPLIT_LIST,
    }
}

/// Candidate capacity of the top-k kernels' histogram path.
pub fn candidates(spec: &KernelSpec) -> u32 {
    match (spec.family, spec.target) {
        (_, Target::Gfx942) => TOPK_CANDIDATES_GFX942,
        (KernelFamily::TopK { layout: TopkLayout::Throughput, .. }, _) => TOPK_CANDIDATES_THROUGHPUT,
        _ => TOPK_CANDIDATES,
    }
}

/// Context shared by the top-k families (one block per row, split, cluster).
fn shared_context(spec: &KernelSpec, ctx: &mut Map<String, Value>, k: u32, score: TopkScore, entries: TopkEntries) {
    ctx.insert("k".into(), json!(k));
    ctx.insert("score".into(), json!(score.tag()));
    ctx.insert("score_type".into(), json!(score.device_type()));
    ctx.insert("entries_enum".into(), json!(entries.device_enum()));
    ctx.insert("entries_desc".into(), json!(entries.description()));
    ctx.insert("smem_words".into(), json!(smem_words(spec)));
    ctx.insert("min_blocks_per_sm".into(), json!(min_blocks_per_sm(spec)));
}

impl FamilyRules for Topk {
    fn name(&self, spec: &KernelSpec) -> &'static str {
        match spec.family {
            KernelFamily::TopK { .. } => "topk",
            KernelFamily::TopkSplit { .. } => "topk_split",
            KernelFamily::TopkCluster { .. } => "topk_cluster",
            _ => "index_transform",
        }
    }

    fn knobs(&self, spec: &KernelSpec) -> Vec<String> {
        match spec.family {
            KernelFamily::TopK { k, deterministic, layout, score, entries } => {
                let mut v = vec![format!("k{k}")];
                score.id_knobs(&mut v);
                entries.id_knobs(&mut v);
                if deterministic {
                    v.push("det".into());
                }
                if layout == TopkLayout::Throughput {
                    v.push("tput".into());
                }
                v
            }
            KernelFamily::TopkSplit { k, score, entries } | KernelFamily::TopkCluster { k, score, entries } => {
                let mut v = vec![format!("k{k}")];
                score.id_knobs(&mut v);
                entries.id_knobs(&mut v);
                v
            }
            KernelFamily::IndexTransform { k } => vec![format!("k{k}")],
            _ => unreachable!("not a top-k family"),
        }
    }

    fn template(&self, spec: &KernelSpec) -> &'static str {
        match spec.family {
            KernelFamily::TopK { .. } => "topk.cu.tera",
            KernelFamily::TopkSplit { .. } => "topk_split.cu.tera",
            KernelFamily::TopkCluster { .. } => "topk_cluster.cu.tera",
            _ => "index_transform.cu.tera",
        }
    }

    fn block_threads(&self, spec: &KernelSpec) -> u32 {
        match spec.family {
            KernelFamily::TopK { layout: TopkLayout::Latency, .. } | KernelFamily::TopkCluster { .. } => {
                TOPK_BLOCK_THREADS
            }
            KernelFamily::TopK { layout: TopkLayout::Throughput, .. } | KernelFamily::TopkSplit { .. } => {
                TOPK_BLOCK_THREADS / 2
            }
            _ => TRANSFORM_BLOCK_THREADS,
        }
    }

    fn dynamic_smem_bytes(&self, spec: &KernelSpec) -> u32 {
        match spec.family {
            KernelFamily::IndexTransform { .. } => 0,
            _ => 4 * smem_words(spec),
        }
    }

    /// One row per block (the cluster kernel: a cluster of CTAs per row, the
    /// launcher passes rows × cluster size); the transform: one element per thread.
    fn tokens_per_block(&self, spec: &KernelSpec) -> u32 {
        match spec.family {
            KernelFamily::IndexTransform { .. } => self.block_threads(spec),
            _ => 1,
        }
    }

    fn context(&self, spec: &KernelSpec, ctx: &mut Map<String, Value>) {
        match spec.family {
            KernelFamily::TopK { k, deterministic, score, entries, .. } => {
                shared_context(spec, ctx, k, score, entries);
                ctx.insert("deterministic".into(), json!(deterministic));
                ctx.insert("candidate_capacity".into(), json!(candidates(spec)));
                ctx.insert("row_cache_capacity".into(), json!(row_cache(spec)));
            }
            KernelFamily::TopkSplit { k, score, entries } => {
                shared_context(spec, ctx, k, score, entries);
                ctx.insert("list_capacity".into(), json!(split_list(spec.target)));
            }
            KernelFamily::TopkCluster { k, score, entries } => {
                shared_context(spec, ctx, k, score, entries);
                ctx.insert("candidate_capacity".into(), json!(candidates(spec)));
                ctx.insert("row_cache_capacity".into(), json!(row_cache(spec)));
            }
            KernelFamily::IndexTransform { k } => {
                ctx.insert("k".into(), json!(k));
            }
            _ => {}
        }
    }

    /// k 512/1024/2048, plus the deterministic and throughput k 2048 ones (f32 and
    /// bf16 scores); the index transform at 2048; the split path for both scores;
    /// on NVIDIA, the cluster kernel for every k (bf16 at k 2048). Each writes
    /// positions; the f32 k 2048 kernel of every plan also writes slots, in the kinds
    /// its plan compiles (`table1` and `pages`, or `slots`).
    fn representatives(&self, target: Target) -> Vec<KernelFamily> {
        let mut families = Vec::new();
        let positions = TopkEntries::Positions;
        for k in [512, 1024, 2048] {
            let topk =
                |deterministic, layout, score, entries| KernelFamily::TopK { k, deterministic, layout, score, entries };
            families.push(topk(false, TopkLayout::Latency, TopkScore::F32, positions));
            if k == 2048 {
                // bf16 scores: every load path (both layouts, deterministic, split and cluster below).
                for score in TopkScore::ALL {
                    families.push(topk(true, TopkLayout::Latency, score, positions));
                    families.push(topk(false, TopkLayout::Throughput, score, positions));
                }
                families.push(topk(false, TopkLayout::Latency, TopkScore::Bf16, positions));
                for layout in [TopkLayout::Latency, TopkLayout::Throughput] {
                    for &entries in layout.kernel_entries().iter().filter(|&&e| e != positions) {
                        families.push(topk(false, layout, TopkScore::F32, entries));
                    }
                }
            }
        }
        families.push(KernelFamily::IndexTransform { k: 2048 });
        for score in TopkScore::ALL {
            families.push(KernelFamily::TopkSplit { k: 2048, score, entries: positions });
        }
        families.push(KernelFamily::TopkSplit { k: 2048, score: TopkScore::F32, entries: TopkEntries::Slots });
        if target.vendor() == Vendor::Nvidia {
            for k in [512, 1024, 2048] {
                families.push(KernelFamily::TopkCluster { k, score: TopkScore::F32, entries: positions });
            }
            families.push(KernelFamily::TopkCluster { k: 2048, score: TopkScore::Bf16, entries: positions });
            for entries in [TopkEntries::Table1, TopkEntries::Pages] {
                families.push(KernelFamily::TopkCluster { k: 2048, score: TopkScore::F32, entries });
            }
        }
        families
    }

    fn parse(&self, name: &str, knobs: &[&str]) -> Option<KernelFamily> {
        // Unknown flags parse to a family whose id differs, rejected by the caller.
        let score_of = |flags: &[&str]| if flags.contains(&"bf16") { TopkScore::Bf16 } else { TopkScore::F32 };
        Some(match (name, knobs) {
            ("topk", [k, flags @ ..]) => KernelFamily::TopK {
                k: number_after(k, 'k')?,
                deterministic: flags.contains(&"det"),
                layout: if flags.contains(&"tput") { TopkLayout::Throughput } else { TopkLayout::Latency },
                score: score_of(flags),
                entries: TopkEntries::parse(flags),
            },
            ("index_transform", [k]) => KernelFamily::IndexTransform { k: number_after(k, 'k')? },
            ("topk_cluster", [k, flags @ ..]) => KernelFamily::TopkCluster {
                k: number_after(k, 'k')?,
                score: score_of(flags),
                entries: TopkEntries::parse(flags),
            },
            ("topk_split", [k, flags @ ..]) => KernelFamily::TopkSplit {
                k: number_after(k, 'k')?,
                score: score_of(flags),
                entries: TopkEntries::parse(flags),
            },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_inverts_paged_and_only_paged_transforms_have_one() {
        for p in [1, 2, 61, 64, 65536] {
            assert_eq!(TopkTransform::paged(p).page_size(), Some(p));
            assert!(TopkTransform::paged(p).is_paged());
        }
        assert_eq!(TopkTransform::paged(1), TopkTransform::Paged);
        for t in [TopkTransform::Plain, TopkTransform::Ragged] {
            assert_eq!(t.page_size(), None);
            assert!(!t.is_paged());
        }
    }
}
