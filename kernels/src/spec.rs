//! [`KernelSpec`]: one value per kernel variant. Its id, entry symbol, template,
//! template context and launch geometry are all derived here and nowhere else.

use crate::config::KvCacheFormat;
use crate::target::{Target, Vendor};
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
    /// Gather indexer keys and scales by slot into ragged rows (spec §6.3 "Gather K").
    IndexerKGather,
    /// Exact top-k of f32 or bf16 scores per row, with the output transform fused in.
    TopK {
        k: u32,
        transform: TopkTransform,
        deterministic: bool,
        layout: TopkLayout,
        #[serde(default)]
        score: TopkScore,
    },
    /// Unfused page-table transform of top-k positions (spec §7.7).
    IndexTransform { k: u32 },
    /// CUDA-graph metadata replay (spec §9.3, §9.6): one launch rewrites every
    /// length, cumulative sum, `page_table_1` row and real-page-table row of a
    /// graph state in place (and of every step backend of a multi-step state: the
    /// step count is a launch argument, as are top-k and D, which only enter as
    /// values). The page size is a constant (divisions, the real-table stride).
    MetadataReplay { page_size: u32, mode: MetadataMode },
    /// Split top-k: few long rows, each spread over many blocks in one launch; each
    /// row's last block cuts the top k from the keys its blocks kept.
    TopkSplit {
        k: u32,
        transform: TopkTransform,
        #[serde(default)]
        score: TopkScore,
    },
    /// Exact top-k with each row spread over a thread-block cluster of `cluster`
    /// CTAs (sm_90+ only): one launch, the row read once, histograms summed
    /// through distributed shared memory.
    TopkCluster {
        k: u32,
        transform: TopkTransform,
        cluster: u32,
        #[serde(default)]
        score: TopkScore,
    },
    /// Sparse MLA decode over the FP8-656 cache (spec §8.3): heads, top-k and page
    /// size are constants (the page size turns the slot split into shifts or a
    /// multiply). The query tokens per request (s_q) are not: every query row
    /// carries its own index list, so s_q only changes the row count and the plan.
    SparseDecode { heads: u32, topk: u32, page_size: u32 },
    /// Merges the split-KV partials of [`KernelFamily::SparseDecode`].
    SparseDecodeCombine { heads: u32 },
    /// Sparse MLA prefill over bf16 KV rows (spec §8.2): heads, top-k and the Q/K
    /// width `d_qk` (576 = latent + rope, or 512 without rope) are constants. One
    /// CTA per (query token, head tile); no batch dimension (indices carry it).
    SparsePrefill { heads: u32, topk: u32, d_qk: u32 },
    /// Lightning-indexer logits (spec §6.2, §6.3) over FP8 keys: PAGED from the
    /// indexer cache (decode / verify / draft-extend, page size 64 fixed by the
    /// cache layout) or RAGGED from gathered keys with per-row [ks, ke) (extend).
    /// The index head count is a constant (dim 128 is fixed by the cache).
    IndexerLogits { heads: u32, layout: IndexerLayout },
}

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

    fn device_enum(self) -> &'static str {
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

/// Heads one sparse-attention (decode or prefill) CTA computes: 32 when `heads` is a multiple of 32, else
/// 16; 1..=15 heads run one 16-row tile whose extra rows are zero and never
/// written (no head padding in memory). Larger tiles would need more than the
/// 128 registers a 512-thread CTA allows for the P V accumulators. `None` for
/// counts that fit no tile.
pub fn sparse_head_tile(heads: u32) -> Option<u32> {
    match heads {
        1..=16 => Some(16),
        h if h > 128 => None,
        h if h % 32 == 0 => Some(32),
        h if h % 16 == 0 => Some(16),
        _ => None,
    }
}

/// Heads one sparse MLA (decode or prefill) CTA computes on `target`: on sm_90a a
/// multiple of 64 heads runs the warp-group (wgmma) kernels with 64-head tiles;
/// everything else the mma.sync kernels' [`sparse_head_tile`].
pub fn sparse_mla_head_tile(heads: u32, target: Target) -> Option<u32> {
    if target == Target::Sm90a && heads % WG_HEAD_TILE == 0 && (1..=128).contains(&heads) {
        return Some(WG_HEAD_TILE);
    }
    sparse_head_tile(heads)
}

/// Heads one sparse-prefill CTA computes on `target`: on sm_90a every head count
/// above 16 runs the warp-group kernel in 64-head tiles, the last one partial when
/// the count is not a multiple of 64 (zero Q rows, outputs not stored): measured on
/// the H200, 32 heads in one such tile took 2.36 ms where the mma.sync kernel took
/// 3.46 ms (BENCHMARKS.md). Decode keeps [`sparse_mla_head_tile`]: its 32-head
/// mma.sync tile is faster than half a warp-group tile there.
pub fn sparse_prefill_head_tile(heads: u32, target: Target) -> Option<u32> {
    if target == Target::Sm90a && heads > 16 && sparse_head_tile(heads).is_some() {
        return Some(WG_HEAD_TILE);
    }
    sparse_mla_head_tile(heads, target)
}

/// Head tile of the warp-group sparse MLA kernels (the wgmma M).
pub const WG_HEAD_TILE: u32 = 64;

/// Dynamic shared memory of the warp-group sparse MLA kernels with `d_qk`-wide rows;
/// mirrors `nsa::attend_wg::Smem` (sparse_attend_wg.cuh): Q and two K/V tiles of 64
/// rows, the 64 × 64 bf16 P tile, per-row rescale factors, max and sum, validity
/// flags, and 1 KiB of slack to start the swizzled tiles 1024-byte aligned.
pub fn wg_smem_bytes(d_qk: u32) -> u32 {
    let tile = WG_HEAD_TILE * d_qk * 2;
    3 * tile + WG_HEAD_TILE * DECODE_BLOCK_TOKENS * 2 + 3 * WG_HEAD_TILE * 4 + 2 * DECODE_BLOCK_TOKENS + 1024
}

/// Tokens one sparse-decode pipeline step covers (top-k must be a multiple).
pub const DECODE_BLOCK_TOKENS: u32 = 64;
/// Threads of a sparse-decode CTA (8 producer + 8 consumer warps).
const DECODE_BLOCK_THREADS: u32 = 512;
/// Threads of a raw-record decode CTA (8 consumer warps + 2 bulk-copy warps).
const DECODE_F8_BLOCK_THREADS: u32 = 320;
/// Stages of the raw-record decode kernel's ring (64 records of 656 bytes each).
const DECODE_F8_STAGES: u32 = 4;

/// Dynamic shared memory of the raw-record decode kernel; mirrors
/// `nsa::decode_f8::Smem` (sparse_decode_f8.cuh): the record ring, the split-K
/// partial S, the padded f16 P tile, per-warp row partials, two buffers of a
/// step's rounded tile scales, validity flags per stage, a full and an empty
/// mbarrier per stage, and the CTA's `topk` slot indices.
pub fn decode_f8_smem_bytes(topk: u32) -> u32 {
    DECODE_F8_STAGES * DECODE_BLOCK_TOKENS * 656
        + 4 * 16 * (DECODE_BLOCK_TOKENS + 8) * 4
        + 16 * (DECODE_BLOCK_TOKENS * 2 + 16)
        + 8 * 16 * 4
        + 2 * 4 * DECODE_BLOCK_TOKENS * 4
        + DECODE_F8_STAGES * DECODE_BLOCK_TOKENS
        + 2 * DECODE_F8_STAGES * 8
        + topk * 4
}

/// Threads of a warp-group decode CTA (two consumer groups, one producer group).
const DECODE_WG_BLOCK_THREADS: u32 = 384;
/// Threads of a sparse-prefill CTA (4 cp.async producer + 8 consumer warps).
const PREFILL_BLOCK_THREADS: u32 = 384;
/// Threads of a combine block (4 output dims each).
const DECODE_COMBINE_THREADS: u32 = 128;

/// Bytes of one padded bf16 row of `d_qk` dims in the mma.sync kernels (`Rows::kBytes`).
fn padded_row_bytes(d_qk: u32) -> u32 {
    d_qk * 2 + 16
}

/// The shared consumer's part of an mma.sync sparse-attention CTA's shared memory
/// (sparse_attend.cuh): the Q tile, the padded P tile, per-warp row partials and,
/// for 16-head tiles, the partial S of the four dims quarters (padded f32 rows).
fn consumer_smem_bytes(head_tile: u32, d_qk: u32) -> u32 {
    let warps_per_mtile = 8 / (head_tile / 16); // consumer warps per 16-head m-tile (`kNW`)
    let split_k_partials = if head_tile == 16 { 4 * 16 * (DECODE_BLOCK_TOKENS + 8) * 4 } else { 0 };
    head_tile * padded_row_bytes(d_qk)
        + head_tile * (DECODE_BLOCK_TOKENS * 2 + 16)
        + warps_per_mtile * head_tile * 4
        + split_k_partials
}

/// Dynamic shared memory of a (dequantizing, mma.sync) sparse-decode CTA with
/// `head_tile` heads of `d_qk`-wide rows; mirrors `nsa::attend::Smem`
/// (sparse_attend.cuh): the consumer's part, two 64-row K/V tiles and their
/// validity flags.
pub fn attend_smem_bytes(head_tile: u32, d_qk: u32) -> u32 {
    consumer_smem_bytes(head_tile, d_qk) + 2 * DECODE_BLOCK_TOKENS * (padded_row_bytes(d_qk) + 1)
}

/// Slots of 32 KV rows in the mma.sync prefill kernel's ring (`nsa::prefill::kSlots`).
const PREFILL_SLOTS: u32 = 5;

/// Dynamic shared memory of the mma.sync sparse-prefill CTA; mirrors
/// `nsa::prefill::RingSmem` (sparse_prefill.cuh): the consumer's part, the ring of
/// 32-row slots with their validity flags, and a full and an empty mbarrier per slot.
pub fn prefill_ring_smem_bytes(head_tile: u32, d_qk: u32) -> u32 {
    let slot_rows = DECODE_BLOCK_TOKENS / 2;
    consumer_smem_bytes(head_tile, d_qk)
        + PREFILL_SLOTS * slot_rows * (padded_row_bytes(d_qk) + 1)
        + 2 * PREFILL_SLOTS * 8
}

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

    fn device_enum(self) -> &'static str {
        match self {
            MetadataMode::Decode => "kDecode",
            MetadataMode::TargetVerify => "kTargetVerify",
            MetadataMode::DraftExtend => "kDraftExtend",
            MetadataMode::Extend => "kExtend",
        }
    }
}

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

    fn device_type(self) -> &'static str {
        match self {
            TopkScore::F32 => "float",
            TopkScore::Bf16 => "nsa::topk::Bf16",
        }
    }

    /// Id knobs: none for f32 (the ids that came before bf16), `bf16` otherwise.
    fn id_knobs(self, knobs: &mut Vec<String>) {
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

/// What a top-k kernel writes for each chosen position p of row b.
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
    /// The page size is a kernel constant.
    Pages(u32),
}

/// Page sizes [`TopkTransform::Pages`] takes.
pub const TOPK_PAGE_SIZES: std::ops::RangeInclusive<u32> = 2..=65536;

impl TopkTransform {
    /// The transforms of every kernel set; [`TopkTransform::Pages`] joins them at the
    /// config's page size.
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

    pub fn tag(self) -> String {
        match self {
            TopkTransform::Plain => "plain".into(),
            TopkTransform::Paged => "paged".into(),
            TopkTransform::Ragged => "ragged".into(),
            TopkTransform::Pages(p) => format!("pages{p}"),
        }
    }

    /// The transform a [`TopkTransform::tag`] names.
    pub fn from_tag(tag: &str) -> Option<TopkTransform> {
        match tag {
            "plain" => Some(TopkTransform::Plain),
            "paged" => Some(TopkTransform::Paged),
            "ragged" => Some(TopkTransform::Ragged),
            _ => {
                let p = tag.strip_prefix("pages")?.parse::<u32>().ok()?;
                TOPK_PAGE_SIZES.contains(&p).then_some(TopkTransform::Pages(p))
            }
        }
    }

    fn device_enum(self) -> String {
        match self {
            TopkTransform::Plain => "kPlain".into(),
            TopkTransform::Paged => "kPaged".into(),
            TopkTransform::Ragged => "kRagged".into(),
            TopkTransform::Pages(p) => format!("kPagesOf<{p}>"),
        }
    }
}

/// Head counts of the representative sparse-decode variants (TP16 … TP1).
pub const DECODE_HEADS: [u32; 5] = [8, 16, 32, 64, 128];
/// Head counts of the representative sparse-prefill variants (TP8 … TP1).
pub const PREFILL_HEADS: [u32; 4] = [16, 32, 64, 128];
/// Q/K widths the sparse prefill supports: latent + rope, or latent only.
pub const PREFILL_DQK: [u32; 2] = [576, 512];

/// One kernel variant for one target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KernelSpec {
    #[serde(flatten)]
    pub family: KernelFamily,
    pub target: Target,
}

/// Threads per block of the store/dequant/gather family (8 MLA tokens, or 32 indexer lane groups).
const STORE_BLOCK_THREADS: u32 = 256;
/// Lanes that cooperate on one MLA token (each owns 16 latent dims).
const MLA_LANES_PER_TOKEN: u32 = 32;
/// Lanes that cooperate on one indexer token (each owns 16 dims).
const INDEXER_LANES_PER_TOKEN: u32 = 8;
/// Indexer tokens each lane group stores or gathers (loads issued together for memory parallelism).
const INDEXER_TOKENS_PER_LANE_GROUP: u32 = 2;
/// Threads per top-k block (one block per row).
const TOPK_BLOCK_THREADS: u32 = 1024;
/// Shared words of the top-k kernel besides candidates and row cache: the 8192-bin
/// round-0 histogram (which the list cuts' three 2048-bin round histograms and the
/// staged top-k positions reuse) and 72 scalars (`kFixedWords` in topk.cuh;
/// static_asserts there).
const TOPK_FIXED_WORDS: u32 = 8192 + 72;
/// Cluster sizes the cluster top-k kernel is built for (8: the portable maximum; a
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
/// Threads per block of the metadata replay kernel (every block scans the batch;
/// blocks share the page-table rows).
const METADATA_BLOCK_THREADS: u32 = 512;
/// Requests one metadata replay handles at most (each block keeps the first query
/// row of every request in shared memory): the largest CUDA-graph batch size.
pub const METADATA_MAX_BATCH: u32 = 4096;

impl KernelSpec {
    pub fn new(family: KernelFamily, target: Target) -> Self {
        KernelSpec { family, target }
    }

    /// Whether the kernel waits for the previous kernel of its stream before it reads
    /// anything (`wait_prior_grids` at its top), so it may be launched with
    /// programmatic dependent launch (PDL): NVIDIA targets, the top-k families and
    /// the unfused page-table transform.
    pub fn waits_for_prior_grids(&self) -> bool {
        self.target.has_pdl()
            && matches!(
                self.family,
                KernelFamily::TopK { .. }
                    | KernelFamily::TopkCluster { .. }
                    | KernelFamily::TopkSplit { .. }
                    | KernelFamily::IndexTransform { .. }
            )
    }

    /// Family name, the first component of the id.
    pub fn family_name(&self) -> &'static str {
        match self.family {
            KernelFamily::KvStore { .. } => "kv_store",
            KernelFamily::KvDequant => "kv_dequant",
            KernelFamily::IndexerKStore => "indexer_k_store",
            KernelFamily::IndexerKGather => "indexer_k_gather",
            KernelFamily::TopK { .. } => "topk",
            KernelFamily::IndexTransform { .. } => "index_transform",
            KernelFamily::MetadataReplay { .. } => "metadata_replay",
            KernelFamily::TopkSplit { .. } => "topk_split",
            KernelFamily::TopkCluster { .. } => "topk_cluster",
            KernelFamily::SparseDecode { .. } => "sparse_decode",
            KernelFamily::SparseDecodeCombine { .. } => "sparse_decode_combine",
            KernelFamily::SparsePrefill { .. } => "sparse_prefill",
            KernelFamily::IndexerLogits { .. } => "indexer_logits",
        }
    }

    /// Human-readable id, e.g. `kv_store.fp8_656.sm_90a`. Unique per variant.
    pub fn id(&self) -> String {
        let knobs: Vec<String> = match self.family {
            KernelFamily::KvStore { format } => vec![format.tag().into()],
            KernelFamily::KvDequant => vec![KvCacheFormat::Fp8.tag().into()],
            KernelFamily::IndexerKStore | KernelFamily::IndexerKGather => vec!["fp8_132".into(), "p64".into()],
            KernelFamily::TopK { k, transform, deterministic, layout, score } => {
                let mut v = vec![format!("k{k}"), transform.tag()];
                score.id_knobs(&mut v);
                if deterministic {
                    v.push("det".into());
                }
                if layout == TopkLayout::Throughput {
                    v.push("tput".into());
                }
                v
            }
            KernelFamily::IndexTransform { k } => vec![format!("k{k}")],
            KernelFamily::MetadataReplay { page_size, mode } => vec![mode.tag().into(), format!("p{page_size}")],
            KernelFamily::TopkSplit { k, transform, score } => {
                let mut v = vec![format!("k{k}"), transform.tag()];
                score.id_knobs(&mut v);
                v
            }
            KernelFamily::TopkCluster { k, transform, cluster, score } => {
                let mut v = vec![format!("k{k}"), transform.tag()];
                score.id_knobs(&mut v);
                v.push(format!("c{cluster}"));
                v
            }
            KernelFamily::SparseDecode { heads, topk, page_size } => {
                vec![format!("h{heads}"), format!("k{topk}"), format!("p{page_size}")]
            }
            KernelFamily::SparseDecodeCombine { heads } => vec![format!("h{heads}")],
            KernelFamily::SparsePrefill { heads, topk, d_qk } => {
                vec![format!("h{heads}"), format!("k{topk}"), format!("d{d_qk}")]
            }
            KernelFamily::IndexerLogits { heads, layout } => vec![layout.tag().into(), format!("h{heads}")],
        };
        let mut parts = vec![self.family_name().to_string()];
        parts.extend(knobs);
        parts.push(self.target.arch().into());
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
            KernelFamily::IndexerKGather => "indexer_k_gather.cu.tera",
            KernelFamily::TopK { .. } => "topk.cu.tera",
            KernelFamily::IndexTransform { .. } => "index_transform.cu.tera",
            KernelFamily::MetadataReplay { .. } => "metadata_replay.cu.tera",
            KernelFamily::TopkSplit { .. } => "topk_split.cu.tera",
            KernelFamily::TopkCluster { .. } => "topk_cluster.cu.tera",
            KernelFamily::SparseDecode { heads, .. } => {
                if self.wg_kernel(heads) {
                    "sparse_decode_wg.cu.tera"
                } else if self.decode_f8_kernel(heads) {
                    "sparse_decode_f8.cu.tera"
                } else {
                    "sparse_decode.cu.tera"
                }
            }
            KernelFamily::SparseDecodeCombine { .. } => "sparse_decode_combine.cu.tera",
            KernelFamily::SparsePrefill { heads, .. } => {
                if self.wg_kernel(heads) {
                    "sparse_prefill_wg.cu.tera"
                } else {
                    "sparse_prefill.cu.tera"
                }
            }
            KernelFamily::IndexerLogits { heads, .. } => {
                if indexer_wg_kernel(heads, self.target) {
                    "indexer_logits_wg.cu.tera"
                } else {
                    "indexer_logits.cu.tera"
                }
            }
        }
    }

    /// Threads per block the kernel is compiled for (`__launch_bounds__`) and launched with.
    pub fn block_threads(&self) -> u32 {
        match self.family {
            KernelFamily::TopK { layout: TopkLayout::Latency, .. } | KernelFamily::TopkCluster { .. } => {
                TOPK_BLOCK_THREADS
            }
            KernelFamily::TopK { layout: TopkLayout::Throughput, .. } => TOPK_BLOCK_THREADS / 2,
            KernelFamily::IndexTransform { .. } => TRANSFORM_BLOCK_THREADS,
            KernelFamily::MetadataReplay { .. } => METADATA_BLOCK_THREADS,
            KernelFamily::TopkSplit { .. } => TOPK_BLOCK_THREADS / 2,
            KernelFamily::SparseDecode { heads, .. } => {
                if self.wg_kernel(heads) {
                    DECODE_WG_BLOCK_THREADS
                } else if self.decode_f8_kernel(heads) {
                    DECODE_F8_BLOCK_THREADS
                } else {
                    DECODE_BLOCK_THREADS
                }
            }
            KernelFamily::SparsePrefill { .. } => PREFILL_BLOCK_THREADS,
            KernelFamily::IndexerLogits { .. } => INDEXER_LOGITS_THREADS,
            KernelFamily::SparseDecodeCombine { .. } => DECODE_COMBINE_THREADS,
            _ => STORE_BLOCK_THREADS,
        }
    }

    /// Dynamic shared memory per block, in bytes (0 for most families).
    pub fn dynamic_smem_bytes(&self) -> u32 {
        match self.family {
            KernelFamily::TopK { .. } | KernelFamily::TopkSplit { .. } | KernelFamily::TopkCluster { .. } => {
                4 * self.topk_smem_words()
            }
            KernelFamily::SparseDecode { heads, topk, .. } if self.decode_f8_kernel(heads) => {
                decode_f8_smem_bytes(topk)
            }
            KernelFamily::SparseDecode { heads, .. } => self.sparse_mla_smem_bytes(heads, 576),
            KernelFamily::SparsePrefill { heads, d_qk, .. } => self.sparse_mla_smem_bytes(heads, d_qk),
            KernelFamily::IndexerLogits { heads, .. } if indexer_wg_kernel(heads, self.target) => INDEXER_WG_SMEM_BYTES,
            _ => 0,
        }
    }

    fn topk_row_cache(&self) -> u32 {
        match (self.family, self.target) {
            (KernelFamily::TopK { layout: TopkLayout::Throughput, .. } | KernelFamily::TopkSplit { .. }, _) => 0,
            (KernelFamily::TopK { layout: TopkLayout::Latency, .. }, Target::Sm90a | Target::Sm100a) => {
                TOPK_ROW_CACHE_LATENCY
            }
            (_, Target::Sm90a | Target::Sm100a) => TOPK_ROW_CACHE_CLUSTER,
            // 64 KiB of LDS: histogram and candidates only.
            (_, Target::Gfx942) => 0,
        }
    }

    fn topk_smem_words(&self) -> u32 {
        match self.family {
            KernelFamily::TopkSplit { .. } => TOPK_FIXED_WORDS + 2 * self.topk_split_list(),
            _ => TOPK_FIXED_WORDS + 2 * self.topk_candidates() + self.topk_row_cache(),
        }
    }

    /// Half-size top-k blocks promise two per SM (`__launch_bounds__(n, 2)`): without it
    /// ptxas caps them at 40 registers and spills.
    fn topk_min_blocks_per_sm(&self) -> u32 {
        if self.block_threads() < TOPK_BLOCK_THREADS {
            2
        } else {
            1
        }
    }

    /// Keys the split path's list holds per row (in the workspace and in each
    /// block's shared memory).
    pub fn topk_split_list(&self) -> u32 {
        match self.target {
            Target::Gfx942 => TOPK_SPLIT_LIST_GFX942,
            Target::Sm90a | Target::Sm100a => TOPK_SPLIT_LIST,
        }
    }

    /// Candidate capacity of the top-k kernels' histogram path.
    pub fn topk_candidates(&self) -> u32 {
        match (self.family, self.target) {
            (_, Target::Gfx942) => TOPK_CANDIDATES_GFX942,
            (KernelFamily::TopK { layout: TopkLayout::Throughput, .. }, _) => TOPK_CANDIDATES_THROUGHPUT,
            _ => TOPK_CANDIDATES,
        }
    }

    /// Work items one block handles (tokens; top-k rows; transform elements); the
    /// launcher's grid is `ceil(items / tokens_per_block)`.
    pub fn tokens_per_block(&self) -> u32 {
        match self.family {
            // The cluster kernel: `cluster` CTAs per row; the launcher passes rows × cluster.
            KernelFamily::TopK { .. } | KernelFamily::TopkSplit { .. } | KernelFamily::TopkCluster { .. } => 1,
            // One (head tile, row, split) per CTA; combine: one (row, head) per block.
            KernelFamily::SparseDecode { .. }
            | KernelFamily::SparseDecodeCombine { .. }
            | KernelFamily::SparsePrefill { .. } => 1,
            // One (query row, chunk of key blocks) per CTA.
            KernelFamily::IndexerLogits { .. } => 1,
            // One page-table row per block (the kernel strides over rows past the grid).
            KernelFamily::MetadataReplay { .. } => 1,
            KernelFamily::IndexTransform { .. } => self.block_threads(),
            KernelFamily::KvStore { .. } | KernelFamily::KvDequant => self.block_threads() / MLA_LANES_PER_TOKEN,
            KernelFamily::IndexerKStore | KernelFamily::IndexerKGather => {
                self.block_threads() / INDEXER_LANES_PER_TOKEN * INDEXER_TOKENS_PER_LANE_GROUP
            }
        }
    }

    /// Heads per CTA of this sparse MLA family on this spec's target:
    /// [`sparse_prefill_head_tile`] for prefill, [`sparse_mla_head_tile`] otherwise.
    pub fn sparse_mla_head_tile(&self, heads: u32) -> Option<u32> {
        match self.family {
            KernelFamily::SparsePrefill { .. } => sparse_prefill_head_tile(heads, self.target),
            _ => sparse_mla_head_tile(heads, self.target),
        }
    }

    /// Whether a sparse MLA family of `heads` heads is the warp-group (wgmma) kernel.
    pub fn wg_kernel(&self, heads: u32) -> bool {
        self.sparse_mla_head_tile(heads) == Some(WG_HEAD_TILE)
    }

    /// Decode with 16-head tiles on sm_90a reads the raw FP8 records (bulk copies,
    /// e4m3 converted inside the mma fragments) instead of dequantizing into a bf16
    /// tile: the dequant pass's loads and shared-memory stores were the limit there
    /// (BENCHMARKS.md).
    pub fn decode_f8_kernel(&self, heads: u32) -> bool {
        matches!(self.family, KernelFamily::SparseDecode { .. })
            && self.target == Target::Sm90a
            && self.sparse_mla_head_tile(heads) == Some(16)
    }

    /// The warp-group kernels' layout, else the mma.sync prefill ring or decode's
    /// double-buffered tiles.
    fn sparse_mla_smem_bytes(&self, heads: u32, d_qk: u32) -> u32 {
        let prefill = matches!(self.family, KernelFamily::SparsePrefill { .. });
        match self.sparse_mla_head_tile(heads) {
            Some(WG_HEAD_TILE) => wg_smem_bytes(d_qk),
            Some(t) if prefill => prefill_ring_smem_bytes(t, d_qk),
            tile => tile.map_or(0, |t| attend_smem_bytes(t, d_qk)),
        }
    }

    /// Context shared by the top-k families (one block per row, split, cluster).
    fn topk_context(&self, ctx: &mut Map<String, Value>, k: u32, transform: TopkTransform, score: TopkScore) {
        ctx.insert("k".into(), json!(k));
        ctx.insert("score".into(), json!(score.tag()));
        ctx.insert("score_type".into(), json!(score.device_type()));
        ctx.insert("transform".into(), json!(transform.tag()));
        ctx.insert("transform_enum".into(), json!(transform.device_enum()));
        ctx.insert("smem_words".into(), json!(self.topk_smem_words()));
        ctx.insert("min_blocks_per_sm".into(), json!(self.topk_min_blocks_per_sm()));
    }

    /// Context shared by the sparse MLA families (same consumer warps, same tiles).
    fn sparse_mla_context(&self, ctx: &mut Map<String, Value>, heads: u32, topk: u32, d_qk: u32) {
        ctx.insert("heads".into(), json!(heads));
        ctx.insert("head_tile".into(), json!(self.sparse_mla_head_tile(heads)));
        ctx.insert("topk".into(), json!(topk));
        // Fully unrolled Q K^T on sm_90a (addresses become immediates); at 128
        // registers ptxas spills that on sm_100a, which gets a partial unroll and a
        // rolled P V token loop (no spills: tests/compile_all.rs).
        let qk_unroll = if self.target == Target::Sm100a { 4 } else { d_qk / 16 };
        ctx.insert("qk_unroll".into(), json!(qk_unroll));
        ctx.insert("smem_bytes".into(), json!(self.dynamic_smem_bytes()));
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
        if matches!(self.family, KernelFamily::IndexerKStore | KernelFamily::IndexerKGather) {
            ctx.insert("tokens_per_lane_group".into(), json!(INDEXER_TOKENS_PER_LANE_GROUP));
        }
        match self.family {
            KernelFamily::TopK { k, transform, deterministic, score, .. } => {
                self.topk_context(&mut ctx, k, transform, score);
                ctx.insert("deterministic".into(), json!(deterministic));
                ctx.insert("candidate_capacity".into(), json!(self.topk_candidates()));
                ctx.insert("row_cache_capacity".into(), json!(self.topk_row_cache()));
            }
            KernelFamily::TopkSplit { k, transform, score } => {
                self.topk_context(&mut ctx, k, transform, score);
                ctx.insert("list_capacity".into(), json!(self.topk_split_list()));
            }
            KernelFamily::TopkCluster { k, transform, cluster, score } => {
                self.topk_context(&mut ctx, k, transform, score);
                ctx.insert("cluster".into(), json!(cluster));
                ctx.insert("candidate_capacity".into(), json!(self.topk_candidates()));
                ctx.insert("row_cache_capacity".into(), json!(self.topk_row_cache()));
            }
            KernelFamily::IndexTransform { k } => {
                ctx.insert("k".into(), json!(k));
            }
            _ => {}
        }
        if let KernelFamily::MetadataReplay { page_size, mode } = self.family {
            ctx.insert("page_size".into(), json!(page_size));
            ctx.insert("mode".into(), json!(mode.tag()));
            ctx.insert("mode_enum".into(), json!(mode.device_enum()));
            ctx.insert("max_batch".into(), json!(METADATA_MAX_BATCH));
        }
        if let KernelFamily::SparseDecode { heads, topk, page_size } = self.family {
            self.sparse_mla_context(&mut ctx, heads, topk, 576);
            ctx.insert("page_size".into(), json!(page_size));
        }
        if let KernelFamily::SparseDecodeCombine { heads } = self.family {
            ctx.insert("heads".into(), json!(heads));
        }
        if let KernelFamily::IndexerLogits { heads, layout } = self.family {
            ctx.insert("heads".into(), json!(heads));
            ctx.insert("layout".into(), json!(layout.tag()));
            ctx.insert("layout_enum".into(), json!(layout.device_enum()));
            ctx.insert("smem_bytes".into(), json!(self.dynamic_smem_bytes()));
        }
        if let KernelFamily::SparsePrefill { heads, topk, d_qk } = self.family {
            self.sparse_mla_context(&mut ctx, heads, topk, d_qk);
            ctx.insert("d_qk".into(), json!(d_qk));
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

    /// The representative variants of every family for `target` (compile-all and
    /// snapshot matrix): each store, dequant and gather kernel; top-k for k
    /// 512/1024/2048 with every transform, plus the deterministic and throughput
    /// k 2048 ones, and PAGED over tables of pages of 64 and 61; the index
    /// transform at 2048; metadata replay of every mode at page sizes 64 and 1;
    /// on NVIDIA, sparse decode (+ combine) for every head
    /// count of [`DECODE_HEADS`] at top-k 2048 / page 64, top-k 512 and 1024 at
    /// 128 heads, and page sizes 1 and 61; sparse prefill for every head count of
    /// [`PREFILL_HEADS`] at top-k 2048 / d_qk 576, top-k 512 and 1024 and d_qk 512
    /// at 128 heads; indexer logits (paged, ragged) at 64 heads. Sparse MLA and the
    /// indexer logits have no ROCm variant yet (mma.sync).
    pub fn all_for(target: Target) -> Vec<KernelSpec> {
        let mut families = vec![
            KernelFamily::KvStore { format: KvCacheFormat::Bf16 },
            KernelFamily::KvStore { format: KvCacheFormat::Fp8 },
            KernelFamily::KvDequant,
            KernelFamily::IndexerKStore,
            KernelFamily::IndexerKGather,
        ];
        for k in [512, 1024, 2048] {
            for transform in TopkTransform::ALL {
                let topk =
                    |deterministic, layout, score| KernelFamily::TopK { k, transform, deterministic, layout, score };
                families.push(topk(false, TopkLayout::Latency, TopkScore::F32));
                if k == 2048 {
                    // bf16 scores: every load path (both layouts, deterministic, split and cluster below).
                    for score in TopkScore::ALL {
                        families.push(topk(true, TopkLayout::Latency, score));
                        families.push(topk(false, TopkLayout::Throughput, score));
                    }
                    families.push(topk(false, TopkLayout::Latency, TopkScore::Bf16));
                }
            }
        }
        families.push(KernelFamily::IndexTransform { k: 2048 });
        for transform in TopkTransform::ALL {
            for score in TopkScore::ALL {
                families.push(KernelFamily::TopkSplit { k: 2048, transform, score });
            }
        }
        // PAGED over tables of pages: DeepSeek's 64 (a shift) and 61 (a division), on
        // every one-block path and the split path; clusters below.
        for transform in [TopkTransform::Pages(64), TopkTransform::Pages(61)] {
            for (deterministic, layout) in
                [(false, TopkLayout::Latency), (true, TopkLayout::Latency), (false, TopkLayout::Throughput)]
            {
                families.push(KernelFamily::TopK { k: 2048, transform, deterministic, layout, score: TopkScore::F32 });
            }
            families.push(KernelFamily::TopkSplit { k: 2048, transform, score: TopkScore::F32 });
        }
        for page_size in [64, 1] {
            for mode in MetadataMode::ALL {
                families.push(KernelFamily::MetadataReplay { page_size, mode });
            }
        }
        if target.vendor() == Vendor::Nvidia {
            for k in [512, 1024, 2048] {
                for transform in TopkTransform::ALL {
                    for cluster in TOPK_CLUSTER_SIZES {
                        families.push(KernelFamily::TopkCluster { k, transform, cluster, score: TopkScore::F32 });
                    }
                    if k == 2048 {
                        families.push(KernelFamily::TopkCluster { k, transform, cluster: 8, score: TopkScore::Bf16 });
                    }
                }
            }
            for cluster in TOPK_CLUSTER_SIZES {
                let transform = TopkTransform::Pages(64);
                families.push(KernelFamily::TopkCluster { k: 2048, transform, cluster, score: TopkScore::F32 });
            }
            let transform = TopkTransform::Pages(61);
            families.push(KernelFamily::TopkCluster { k: 2048, transform, cluster: 8, score: TopkScore::F32 });
            for heads in DECODE_HEADS {
                families.push(KernelFamily::SparseDecode { heads, topk: 2048, page_size: 64 });
                families.push(KernelFamily::SparseDecodeCombine { heads });
            }
            for topk in [512, 1024] {
                families.push(KernelFamily::SparseDecode { heads: 128, topk, page_size: 64 });
            }
            for page_size in [1, 61] {
                families.push(KernelFamily::SparseDecode { heads: 16, topk: 2048, page_size });
            }
            for heads in PREFILL_HEADS {
                families.push(KernelFamily::SparsePrefill { heads, topk: 2048, d_qk: 576 });
            }
            for topk in [512, 1024] {
                families.push(KernelFamily::SparsePrefill { heads: 128, topk, d_qk: 576 });
            }
            families.push(KernelFamily::SparsePrefill { heads: 128, topk: 2048, d_qk: 512 });
            for layout in IndexerLayout::ALL {
                families.push(KernelFamily::IndexerLogits { heads: 64, layout });
            }
        }
        families.into_iter().map(|family| KernelSpec::new(family, target)).collect()
    }

    /// The variant whose [`id`](Self::id) is `id` (any knob values, not only
    /// those of [`all_for`](Self::all_for)).
    pub fn from_id(id: &str) -> Option<KernelSpec> {
        let parts: Vec<&str> = id.split('.').collect();
        let (&arch, rest) = parts.split_last()?;
        let (&family, knobs) = rest.split_first()?;
        let target: Target = arch.parse().ok()?;
        let k_of = |s: &str| s.strip_prefix('k').and_then(|n| n.parse::<u32>().ok());
        // Unknown flags parse to a family whose id differs, rejected below.
        let score_of = |flags: &[&str]| if flags.contains(&"bf16") { TopkScore::Bf16 } else { TopkScore::F32 };
        let family = match (family, knobs) {
            ("kv_store", [fmt]) => KernelFamily::KvStore { format: fmt.parse().ok()? },
            ("kv_dequant", _) => KernelFamily::KvDequant,
            ("indexer_k_store", _) => KernelFamily::IndexerKStore,
            ("indexer_k_gather", _) => KernelFamily::IndexerKGather,
            ("topk", [k, t, flags @ ..]) => KernelFamily::TopK {
                k: k_of(k)?,
                transform: TopkTransform::from_tag(t)?,
                deterministic: flags.contains(&"det"),
                layout: if flags.contains(&"tput") { TopkLayout::Throughput } else { TopkLayout::Latency },
                score: score_of(flags),
            },
            ("index_transform", [k]) => KernelFamily::IndexTransform { k: k_of(k)? },
            ("topk_cluster", [k, t, flags @ .., c]) => KernelFamily::TopkCluster {
                k: k_of(k)?,
                transform: TopkTransform::from_tag(t)?,
                cluster: c.strip_prefix('c').and_then(|n| n.parse::<u32>().ok())?,
                score: score_of(flags),
            },
            ("topk_split", [k, t, flags @ ..]) => {
                KernelFamily::TopkSplit { k: k_of(k)?, transform: TopkTransform::from_tag(t)?, score: score_of(flags) }
            }
            ("sparse_decode", [h, k, p]) => KernelFamily::SparseDecode {
                heads: h.strip_prefix('h').and_then(|n| n.parse::<u32>().ok())?,
                topk: k_of(k)?,
                page_size: p.strip_prefix('p').and_then(|n| n.parse::<u32>().ok())?,
            },
            ("sparse_prefill", [h, k, d]) => KernelFamily::SparsePrefill {
                heads: h.strip_prefix('h').and_then(|n| n.parse::<u32>().ok())?,
                topk: k_of(k)?,
                d_qk: d.strip_prefix('d').and_then(|n| n.parse::<u32>().ok())?,
            },
            ("indexer_logits", [l, h]) => KernelFamily::IndexerLogits {
                layout: IndexerLayout::ALL.into_iter().find(|x| x.tag() == *l)?,
                heads: h.strip_prefix('h').and_then(|n| n.parse::<u32>().ok())?,
            },
            ("sparse_decode_combine", [h]) => {
                KernelFamily::SparseDecodeCombine { heads: h.strip_prefix('h').and_then(|n| n.parse::<u32>().ok())? }
            }
            ("metadata_replay", [mode, p]) => KernelFamily::MetadataReplay {
                page_size: p.strip_prefix('p').and_then(|n| n.parse::<u32>().ok())?,
                mode: MetadataMode::ALL.into_iter().find(|m| m.tag() == *mode)?,
            },
            _ => return None,
        };
        let spec = KernelSpec::new(family, target);
        (spec.id() == id).then_some(spec)
    }
}

impl fmt::Display for KernelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id())
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

    /// Only kernels whose templates wait at their top may be launched with PDL, and
    /// only where the target has it.
    #[test]
    fn pdl_only_for_kernels_that_wait_and_only_on_nvidia() {
        let topk = KernelFamily::TopK {
            k: 2048,
            transform: TopkTransform::Paged,
            deterministic: false,
            layout: TopkLayout::Latency,
            score: TopkScore::F32,
        };
        let cluster =
            KernelFamily::TopkCluster { k: 2048, transform: TopkTransform::Plain, cluster: 8, score: TopkScore::Bf16 };
        let split = KernelFamily::TopkSplit { k: 512, transform: TopkTransform::Ragged, score: TopkScore::F32 };
        let transform = KernelFamily::IndexTransform { k: 2048 };
        for family in [topk, cluster, split, transform] {
            for target in Target::NVIDIA {
                assert!(KernelSpec::new(family, target).waits_for_prior_grids(), "{family:?} {target}");
            }
            assert!(!KernelSpec::new(family, Target::Gfx942).waits_for_prior_grids(), "{family:?} gfx942");
        }
        for spec in KernelSpec::all_for(Target::Sm90a) {
            let rendered = crate::render(&spec).unwrap().source;
            assert_eq!(
                spec.waits_for_prior_grids(),
                rendered.contains("nsa::wait_prior_grids();"),
                "{}: PDL support and the rendered wait disagree",
                spec.id()
            );
        }
    }

    /// Decode and prefill agree on which head counts exist; they differ only in
    /// the tile sm_90a runs for 17+ heads that are not a multiple of 64.
    #[test]
    fn head_tiles_per_family_and_target() {
        type Row = (u32, Option<u32>, Option<u32>, Option<u32>);
        let table: [Row; 10] = [
            // heads, decode sm_90a, prefill sm_90a, both on sm_100a
            (8, Some(16), Some(16), Some(16)),
            (16, Some(16), Some(16), Some(16)),
            (24, None, None, None),
            (32, Some(32), Some(64), Some(32)),
            (48, Some(16), Some(64), Some(16)),
            (64, Some(64), Some(64), Some(32)),
            (96, Some(32), Some(64), Some(32)),
            (112, Some(16), Some(64), Some(16)),
            (128, Some(64), Some(64), Some(32)),
            (144, None, None, None),
        ];
        for (heads, decode90, prefill90, any100) in table {
            assert_eq!(sparse_mla_head_tile(heads, Target::Sm90a), decode90, "decode h{heads} sm_90a");
            assert_eq!(sparse_prefill_head_tile(heads, Target::Sm90a), prefill90, "prefill h{heads} sm_90a");
            assert_eq!(sparse_mla_head_tile(heads, Target::Sm100a), any100, "decode h{heads} sm_100a");
            assert_eq!(sparse_prefill_head_tile(heads, Target::Sm100a), any100, "prefill h{heads} sm_100a");
            // The raw-record decode kernel: exactly the 16-head tiles on sm_90a.
            let decode =
                |target| KernelSpec::new(KernelFamily::SparseDecode { heads, topk: 2048, page_size: 64 }, target);
            assert_eq!(decode(Target::Sm90a).decode_f8_kernel(heads), decode90 == Some(16), "h{heads}");
            assert!(!decode(Target::Sm100a).decode_f8_kernel(heads), "h{heads} sm_100a");
            let prefill = KernelSpec::new(KernelFamily::SparsePrefill { heads, topk: 2048, d_qk: 576 }, Target::Sm90a);
            assert!(!prefill.decode_f8_kernel(heads), "prefill h{heads}");
        }
    }
}
