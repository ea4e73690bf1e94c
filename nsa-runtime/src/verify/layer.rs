//! The whole layer ([`NsaLayer`]) on the GPU against a CPU reference of every stage
//! (spec §2.4, §2.5, §6, §7, §8): a random batch in one forward mode, prefix tokens
//! already cached, the step's new tokens stored by the layer.
//!
//! Stage by stage, each fed what the GPU produced upstream once that was checked:
//! * both caches, every byte, against the reference stores;
//! * indexer logits of sampled rows against the f64 reference (tolerance
//!   [`super::indexer::logit_tolerance`]: `2·10⁻⁵·max|row| + 10⁻⁶`, plus the FP8
//!   MMA accumulation bound for the sm_90a warp-group kernel);
//! * top-k of sampled rows: exactly `min(n, k)` distinct visible positions (slots
//!   mapped back through the request's table, or ragged rows minus the row offset),
//!   −1 after them, positions `0..n` for short rows, and for long rows no unselected
//!   key whose reference logit beats a selected one by more than their two tolerances;
//! * attention of sampled rows over the selected keys (tolerances of
//!   [`super::attention`]), keys read as the chosen kernel reads them;
//! * with a planted needle: every token that sees its request's needle selects it,
//!   and the output follows the needle's latent.

use super::attention::{compare, parallel_rows, reference_rows, sample_rows, within, GpuAttention};
use super::indexer::e4m3;
use super::indexer::logit_tolerance;
use super::{download, upload, Check};
use crate::layer::{
    AttentionStage, IndexerStage, LayerCaches, LayerConfig, LayerInputs, LayerOutputs, LayerWorkspace, NsaLayer, Stage,
};
use crate::metadata::{
    decide, BatchSummary, DispatchPolicy, ExtendBatch, ForwardMode, MetadataBuilder, MetadataParams, NsaMetadata,
    PrefillBackend, ReqToToken, Requests,
};
use crate::ops::kv_cache::MlaCacheMut;
use crate::ops::Rows;
use crate::reference::fp8::f32_to_e4m3_satfinite;
use crate::reference::indexer::{index_k_at, QueryRow};
use crate::reference::kv_cache::{dequantize_fp8_token, quantize_fp8_token, store_bf16, store_fp8, store_indexer_k};
use crate::reference::sparse_mla::{attend, DecodeDequant, PagedFp8};
use crate::reference::topk::check_row;
use crate::runtime::Runtime;
use crate::testdata;
use crate::Result;
use cudarc::driver::CudaSlice;
use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::spec::indexer_wg_kernel;
use nsa_kernels::KernelSpec;
use nsa_kernels::{KvCacheFormat, NsaConfig};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// The forward mode of a layer case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerMode {
    Decode,
    /// `draft` tokens per request verified at once.
    TargetVerify {
        draft: u32,
    },
    /// Per-request accept lengths in `1..=draft`.
    DraftExtend {
        draft: u32,
    },
    /// Every request extends by exactly `draft` tokens.
    DraftExtendV2 {
        draft: u32,
    },
    /// Prefill; with `prefix`, each request has a cached prefix.
    Extend {
        prefix: bool,
    },
}

impl LayerMode {
    /// `D`, the draft tokens of speculative modes (0 otherwise).
    pub fn draft(self) -> u32 {
        match self {
            LayerMode::TargetVerify { draft }
            | LayerMode::DraftExtend { draft }
            | LayerMode::DraftExtendV2 { draft } => draft,
            LayerMode::Decode | LayerMode::Extend { .. } => 0,
        }
    }

    pub fn name(self) -> String {
        match self {
            LayerMode::Decode => "decode".into(),
            LayerMode::TargetVerify { draft } => format!("verify D={draft}"),
            LayerMode::DraftExtend { draft } => format!("draft-extend D={draft}"),
            LayerMode::DraftExtendV2 { draft } => format!("draft-extend v2 D={draft}"),
            LayerMode::Extend { prefix: false } => "extend".into(),
            LayerMode::Extend { prefix: true } => "extend+prefix".into(),
        }
    }
}

/// One whole-layer case.
#[derive(Clone, Debug)]
pub struct LayerCase {
    pub model: NsaConfig,
    pub mode: LayerMode,
    pub batch: usize,
    /// KV length of the longest request after the step (request 0 is kept short).
    pub context: usize,
    /// Every request exactly `context` long (benchmarks).
    pub uniform: bool,
    /// Plant one strongly matching key per request.
    pub needle: bool,
    /// Prefill backend of the dispatch policy (`Fixed(FlashMlaSparse)` makes FP8
    /// extend RAGGED on Hopper).
    pub prefill_backend: PrefillBackend,
    /// Logits budget per chunk (small values force chunked extend logits).
    pub logits_budget: Option<usize>,
    pub check_rows: usize,
    /// Also time this many eager forwards (and the stage shares over as many more).
    pub timing_iters: usize,
    /// Also capture the forward in a CUDA graph and check replays (with new inputs
    /// written in place between them) against eager forwards, bit for bit. Needs
    /// [`LayerConfig::deterministic_topk`] semantics, which the case then uses.
    pub graph_replays: bool,
    /// Also run the step with its metadata built on the device from device tables
    /// ([`NsaLayer::plan_on_device`], [`NsaLayer::plan_extend_on_device`]; table rows
    /// wider than the host's) and compare it with the host-metadata step bit for
    /// bit. Uses deterministic top-k, like `graph_replays`.
    pub device_metadata: bool,
    /// Run the layer with [`LayerConfig::batch_invariant`] (timings: its cost).
    pub batch_invariant: bool,
    /// DP padding rows after the step's tokens (spec §3.2): their KV goes to an
    /// unused dummy slot, and `out` must hold zeros and `lse` +inf there.
    pub dp_pad: usize,
    pub seed: u64,
}

impl LayerCase {
    pub fn new(model: NsaConfig, mode: LayerMode, batch: usize, context: usize, seed: u64) -> Self {
        LayerCase {
            model,
            mode,
            batch,
            context,
            uniform: false,
            needle: false,
            prefill_backend: PrefillBackend::Auto,
            logits_budget: None,
            check_rows: 24,
            timing_iters: 0,
            graph_replays: false,
            device_metadata: false,
            batch_invariant: false,
            dp_pad: 0,
            seed,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} b{} ctx{} h{} {} p{}{}",
            self.mode.name(),
            self.batch,
            self.context,
            self.model.num_q_heads,
            self.model.kv_cache.tag(),
            self.model.page_size,
            if self.needle { " needle" } else { "" }
        )
    }
}

/// What a run checked, and the plan's explanation.
#[derive(Debug)]
pub struct LayerReport {
    pub checks: Vec<Check>,
    pub explain: String,
    /// Query tokens of the step.
    pub rows: usize,
    /// With [`LayerCase::timing_iters`]: the eager step time and each stage's µs.
    pub timing: Option<LayerTiming>,
}

/// Device time of one layer call (events on the stream, launch gaps included).
#[derive(Clone, Debug)]
pub struct LayerTiming {
    pub total_us: f64,
    /// The same step captured once in a CUDA graph and launched (no launch gaps).
    pub graph_us: f64,
    pub stages: Vec<(Stage, f64)>,
}

/// The batch: per request its KV length after the step and its new tokens.
struct Batch {
    totals: Vec<usize>,
    news: Vec<usize>,
    /// `[rows, width]` req_to_token and each request's row in it.
    table: Vec<i32>,
    width: usize,
    rows_of: Vec<i32>,
    pool_slots: usize,
}

impl Batch {
    fn slot(&self, i: usize, pos: usize) -> i32 {
        self.table[self.rows_of[i] as usize * self.width + pos]
    }

    /// Metadata parameters of `case` over this batch's pool, for CP rank `cp`.
    fn params(&self, case: &LayerCase, cp: Option<crate::metadata::CpRank>) -> MetadataParams {
        MetadataParams {
            page_size: case.model.page_size,
            topk: case.model.topk,
            draft_tokens: case.mode.draft(),
            pool_slots: self.pool_slots,
            cp,
        }
    }

    /// The first slot of a page no table row holds (the pool has spare pages).
    fn unused_slot(&self, page: usize) -> i32 {
        let used: std::collections::HashSet<i32> = self.table.iter().map(|&s| s / page as i32).collect();
        let free = (0..(self.pool_slots / page) as i32).find(|p| !used.contains(p)).expect("spare pages");
        free * page as i32
    }
}

fn make_batch(case: &LayerCase, rng: &mut StdRng) -> Batch {
    let topk = case.model.topk as usize;
    let ctx = case.context.max(1);
    let mut totals: Vec<usize> = (0..case.batch)
        .map(|i| match (case.uniform, i) {
            (true, _) => ctx,
            (false, 0) => ctx.min(topk / 2 + 3),
            _ => rng.random_range(ctx / 2 + 1..=ctx),
        })
        .collect();
    let news: Vec<usize> = totals
        .iter_mut()
        .map(|total| match case.mode {
            LayerMode::Decode => 1,
            LayerMode::TargetVerify { draft }
            | LayerMode::DraftExtend { draft }
            | LayerMode::DraftExtendV2 { draft } => {
                let d = if matches!(case.mode, LayerMode::DraftExtend { .. }) {
                    rng.random_range(1..=draft as usize)
                } else {
                    draft as usize
                };
                *total = (*total).max(d + 1);
                d
            }
            LayerMode::Extend { prefix: false } => *total,
            LayerMode::Extend { prefix: true } => rng.random_range(1..=*total),
        })
        .collect();
    let page = case.model.page_size as usize;
    let width = totals.iter().copied().max().unwrap_or(1).max(1).next_multiple_of(page);
    let rows = case.batch + 1;
    let pages_per_row = width / page;
    let mut pages: Vec<usize> = (0..rows * pages_per_row + 3).collect();
    pages.shuffle(rng);
    let mut table = vec![0i32; rows * width];
    for r in 0..rows {
        for pos in 0..width {
            table[r * width + pos] = (pages[r * pages_per_row + pos / page] * page + pos % page) as i32;
        }
    }
    let mut rows_of: Vec<i32> = (0..rows as i32).collect();
    rows_of.shuffle(rng);
    rows_of.truncate(case.batch);
    let pool_slots = (rows * pages_per_row + 3) * page;
    Batch { totals, news, table, width, rows_of, pool_slots }
}

fn policy(rt: &Runtime, case: &LayerCase) -> DispatchPolicy {
    DispatchPolicy {
        compute_capability: rt.gpu().caps().compute_capability,
        kv_cache: case.model.kv_cache,
        prefill_backend: case.prefill_backend,
        topk: case.model.topk,
        max_chunk_capacity: usize::MAX,
        cp_enabled: false,
        // The layer computes sparse MLA; MHA-eligible batches stay sparse here.
        force_mla: true,
    }
}

/// Host metadata and dispatch of the batch `b` in `case`'s mode; with `cp`, one
/// context-parallel rank's share of an extend batch.
fn metadata(
    rt: &Runtime,
    case: &LayerCase,
    b: &Batch,
    cp: Option<crate::metadata::CpRank>,
) -> Result<(NsaMetadata, crate::metadata::Dispatch)> {
    let params = b.params(case, cp);
    let builder = MetadataBuilder::new(params)?;
    let table = ReqToToken::new(&b.table, b.width)?;
    let totals: Vec<i32> = b.totals.iter().map(|&v| v as i32).collect();
    let news: Vec<i32> = b.news.iter().map(|&v| v as i32).collect();
    let tokens: usize = b.news.iter().sum();
    let mode = match case.mode {
        LayerMode::Decode => ForwardMode::Decode,
        LayerMode::TargetVerify { .. } => ForwardMode::TargetVerify,
        LayerMode::DraftExtend { .. } => ForwardMode::DraftExtend,
        LayerMode::DraftExtendV2 { .. } => ForwardMode::DraftExtendV2,
        LayerMode::Extend { .. } => ForwardMode::Extend,
    };
    let summary = BatchSummary { mode, seq_lens: &totals, extend_num_tokens: tokens };
    let dispatch = decide(&policy(rt, case), Some(&summary));
    let verify_lens: Vec<i32> = totals.iter().zip(&news).map(|(t, n)| t - n).collect();
    let md = match case.mode {
        LayerMode::Decode => builder.decode(&table, Requests { req_pool_indices: &b.rows_of, seq_lens: &totals })?,
        LayerMode::TargetVerify { .. } => {
            builder.target_verify(&table, Requests { req_pool_indices: &b.rows_of, seq_lens: &verify_lens })?
        }
        LayerMode::DraftExtend { .. } => {
            builder.draft_extend(&table, Requests { req_pool_indices: &b.rows_of, seq_lens: &totals }, &news)?
        }
        LayerMode::DraftExtendV2 { .. } => {
            builder.draft_extend_v2(&table, Requests { req_pool_indices: &b.rows_of, seq_lens: &totals })?
        }
        LayerMode::Extend { prefix } => {
            let prefixes = verify_lens;
            let batch = ExtendBatch {
                req_pool_indices: &b.rows_of,
                seq_lens: &totals,
                extend_lens: &news,
                prefix_lens: prefix.then_some(&prefixes[..]),
            };
            builder.extend(&table, batch, dispatch.extend_plan())?
        }
    };
    Ok((md, dispatch))
}

/// Host copies of everything the layer reads and the reference writes.
struct Data {
    /// `[pool_slots, 576]` bf16 latent of every position (new and cached).
    kv_rows: Vec<bf16>,
    index_rows: Vec<bf16>,
    /// Per request, the needle position.
    needles: Vec<Option<usize>>,
    q: Vec<bf16>,
    index_q: Vec<u8>,
    index_weights: Vec<f32>,
    /// Token t → (request, position).
    tokens: Vec<(usize, usize)>,
}

fn make_data(case: &LayerCase, b: &Batch, rng: &mut StdRng) -> Data {
    let heads = case.model.num_q_heads as usize;
    let ih = case.model.index_n_heads as usize;
    let mut kv_rows = random_bf16(b.pool_slots * BF16_TOKEN_ELEMS, 2.0, rng.random());
    let mut index_rows = random_bf16(b.pool_slots * INDEXER_HEAD_DIM, 1.0, rng.random());
    let tokens: Vec<(usize, usize)> =
        (0..case.batch).flat_map(|i| (b.totals[i] - b.news[i]..b.totals[i]).map(move |p| (i, p))).collect();
    // The needle direction: every query head points along `u`, the needle's latent is `u`.
    let u: Vec<f32> = (0..BF16_TOKEN_ELEMS).map(|_| if rng.random::<bool>() { 1.0 } else { -1.0 }).collect();
    let needles: Vec<Option<usize>> = (0..case.batch).map(|i| case.needle.then(|| b.totals[i] / 3)).collect();
    for (i, needle) in needles.iter().enumerate() {
        if let Some(p) = *needle {
            let slot = b.slot(i, p) as usize;
            for (d, &v) in u.iter().enumerate() {
                kv_rows[slot * BF16_TOKEN_ELEMS + d] = bf16::from_f32(v);
            }
            index_rows[slot * INDEXER_HEAD_DIM..][..INDEXER_HEAD_DIM].fill(bf16::from_f32(4.0));
        }
    }
    let t = tokens.len();
    let q: Vec<bf16> = (0..t * heads * BF16_TOKEN_ELEMS)
        .map(|e| {
            let noise = rng.random_range(-1.0f32..1.0);
            bf16::from_f32(if case.needle { u[e % BF16_TOKEN_ELEMS] + 0.25 * noise } else { noise })
        })
        .collect();
    let one = f32_to_e4m3_satfinite(1.0);
    let index_q: Vec<u8> = (0..t * ih * INDEXER_HEAD_DIM).map(|_| if case.needle { one } else { e4m3(rng) }).collect();
    let index_weights: Vec<f32> = (0..t * ih)
        .map(|_| if case.needle { rng.random_range(0.01f32..0.05) } else { rng.random_range(-0.02f32..0.05) })
        .collect();
    Data { kv_rows, index_rows, needles, q, index_q, index_weights, tokens }
}

/// `n` uniform bf16 values in `[-amp, amp)`, generated on all cores.
fn random_bf16(n: usize, amp: f32, seed: u64) -> Vec<bf16> {
    use rand::SeedableRng;
    let mut out = vec![bf16::ZERO; n];
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let chunk = n.div_ceil(threads).max(1 << 16);
    std::thread::scope(|scope| {
        for (c, part) in out.chunks_mut(chunk).enumerate() {
            scope.spawn(move || {
                let mut rng =
                    rand::rngs::SmallRng::seed_from_u64(seed ^ (c as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                part.iter_mut().for_each(|v| *v = bf16::from_f32(rng.random_range(-amp..amp)));
            });
        }
    });
    out
}

/// The reference caches with every slot's row stored (quantized on all cores):
/// FP8 records or bf16 rows for the MLA cache, and the indexer pages.
fn filled_caches(fp8: bool, data: &Data, pool_slots: usize) -> (Vec<u8>, Vec<bf16>, Vec<u8>) {
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let per = pool_slots.div_ceil(threads).next_multiple_of(INDEXER_PAGE_TOKENS).max(INDEXER_PAGE_TOKENS);
    let mut index = vec![0u8; pool_slots.div_ceil(INDEXER_PAGE_TOKENS) * INDEXER_PAGE_BYTES];
    let mut records = vec![0u8; if fp8 { pool_slots * FP8_TOKEN_BYTES } else { 0 }];
    std::thread::scope(|scope| {
        for (c, pages) in index.chunks_mut(per / INDEXER_PAGE_TOKENS * INDEXER_PAGE_BYTES).enumerate() {
            scope.spawn(move || {
                let first = c * per;
                let slots: Vec<i32> = (first..(first + per).min(pool_slots)).map(|s| (s - first) as i32).collect();
                let rows = &data.index_rows[first * INDEXER_HEAD_DIM..(first + slots.len()) * INDEXER_HEAD_DIM];
                store_indexer_k(rows, &slots, pages);
            });
        }
        if fp8 {
            for (c, part) in records.chunks_mut(per * FP8_TOKEN_BYTES).enumerate() {
                scope.spawn(move || {
                    for (j, rec) in part.chunks_mut(FP8_TOKEN_BYTES).enumerate() {
                        let row = row_of(&data.kv_rows, c * per + j, BF16_TOKEN_ELEMS);
                        rec.copy_from_slice(&quantize_fp8_token(&row[..KV_LORA_RANK], &row[KV_LORA_RANK..]));
                    }
                });
            }
        }
    });
    let bf16_rows = if fp8 { Vec::new() } else { data.kv_rows[..pool_slots * BF16_TOKEN_ELEMS].to_vec() };
    (records, bf16_rows, index)
}

fn row_of(rows: &[bf16], slot: usize, width: usize) -> &[bf16] {
    &rows[slot * width..(slot + 1) * width]
}

/// Runs `case` on the GPU and checks every stage against the CPU reference.
pub fn run(rt: &Runtime, case: &LayerCase) -> Result<LayerReport> {
    let stream = rt.gpu().stream();
    let mut rng = testdata::rng(case.seed);
    let b = make_batch(case, &mut rng);
    let (mut md, dispatch) = metadata(rt, case, &b, None)?;
    let mut data = make_data(case, &b, &mut rng);
    let pad = case.dp_pad;
    if pad > 0 {
        assert!(!case.graph_replays && !case.device_metadata, "DP padding runs with host metadata, eagerly");
        md.pad_nsa_rows(md.num_tokens() + pad);
        let (heads, ih) = (case.model.num_q_heads as usize, case.model.index_n_heads as usize);
        data.q.extend((0..pad * heads * BF16_TOKEN_ELEMS).map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0))));
        data.index_q.extend((0..pad * ih * INDEXER_HEAD_DIM).map(|_| e4m3(&mut rng)));
        data.index_weights.extend((0..pad * ih).map(|_| rng.random_range(-0.02f32..0.05)));
    }
    let mut cfg = LayerConfig::new(case.model.clone())?;
    if let Some(budget) = case.logits_budget {
        cfg.logits_budget_bytes = budget;
    }
    // Replays are compared bit for bit: ties and summation order must not vary.
    cfg.deterministic_topk = case.graph_replays || case.device_metadata;
    cfg.batch_invariant = case.batch_invariant;
    let layer = NsaLayer::new(rt, cfg.clone())?;
    let plan = layer.plan(&md, &dispatch)?;
    let heads = case.model.num_q_heads as usize;
    let ih = case.model.index_n_heads as usize;
    let k = case.model.topk as usize;
    let t = data.tokens.len();
    assert_eq!(t, md.num_tokens(), "tokens of the batch and of the metadata");
    let name = case.describe();

    // Reference caches before the step: every slot holds its row, except the new
    // tokens' slots, which hold a sentinel until the layer stores them.
    let fp8 = case.model.kv_cache == KvCacheFormat::Fp8;
    let mut new_slots: Vec<i32> = data.tokens.iter().map(|&(i, p)| b.slot(i, p)).collect();
    // Padding rows all store to one slot no request reads (the pool's dummy area).
    new_slots.extend(std::iter::repeat_n(b.unused_slot(case.model.page_size as usize), pad));
    let gather = |slots: &[i32], rows: &[bf16], w: usize| -> Vec<bf16> {
        slots.iter().flat_map(|&s| row_of(rows, s as usize, w).iter().copied()).collect()
    };
    let (new_nope, new_rope) = super::split_rows(&gather(&new_slots, &data.kv_rows, BF16_TOKEN_ELEMS));
    let new_index = gather(&new_slots, &data.index_rows, INDEXER_HEAD_DIM);
    let (mut ref_fp8, mut ref_bf16, mut ref_index) = filled_caches(fp8, &data, b.pool_slots);
    for &slot in &new_slots {
        let s = slot as usize;
        if fp8 {
            ref_fp8[s * FP8_TOKEN_BYTES..][..FP8_TOKEN_BYTES].fill(0xa5);
        } else {
            ref_bf16[s * BF16_TOKEN_ELEMS..][..BF16_TOKEN_ELEMS].fill(bf16::from_bits(0xa5a5));
        }
        let page = &mut ref_index[s / INDEXER_PAGE_TOKENS * INDEXER_PAGE_BYTES..][..INDEXER_PAGE_BYTES];
        page[s % INDEXER_PAGE_TOKENS * INDEXER_HEAD_DIM..][..INDEXER_HEAD_DIM].fill(0xa5);
    }

    // GPU: upload and run.
    let mut bufs = Buffers::upload(
        rt,
        &HostInputs {
            q: &data.q,
            nope: &new_nope,
            rope: &new_rope,
            loc: &new_slots,
            index_q: &data.index_q,
            index_weights: &data.index_weights,
            index_k: &new_index,
        },
        &ref_index,
        if fp8 { CacheInit::Fp8(&ref_fp8) } else { CacheInit::Bf16(&ref_bf16) },
        heads,
    )?;
    let mut ws = LayerWorkspace::new(rt, plan.needs())?;
    bufs.forward(&layer, &plan, &mut ws, &mut |_| Ok(()))?;
    let timing = (case.timing_iters > 0)
        .then(|| time_layer(rt, case.timing_iters, &mut |mark| bufs.forward(&layer, &plan, &mut ws, mark)))
        .transpose()?;
    let (d_index, d_fp8, d_bf16, d_out, d_lse) = (&bufs.index, &bufs.fp8, &bufs.bf16, &bufs.out, &bufs.lse);
    let got_index = download(stream, d_index, ref_index.len())?;
    let got_fp8 = download(stream, d_fp8, ref_fp8.len())?;
    let got_bf16 = download(stream, d_bf16, ref_bf16.len())?;
    let indices = download(stream, ws.indices(), t * k)?;
    let out = download(stream, d_out, t * heads * KV_LORA_RANK)?;
    let lse = download(stream, d_lse, t * heads)?;
    let padded = (pad > 0).then(|| padding_check(stream, d_out, d_lse, t, pad, heads, &name)).transpose()?;
    let d = plan.decisions();
    let single_chunk = d.chunks.len() == 1;
    let logits = if single_chunk && d.indexer != IndexerStage::Skip {
        download(stream, ws.logits(), t * d.logits_stride)?
    } else {
        Vec::new()
    };
    let on_device = case
        .device_metadata
        .then(|| {
            let host = bufs.results(rt, &ws, k)?;
            device_metadata_step(rt, case, &layer, &b, &dispatch, &mut bufs, &host, &name)
        })
        .transpose()?;
    // Last on the device: replays rewrite the inputs.
    let graph =
        case.graph_replays.then(|| graph_replays(rt, &layer, &plan, &mut bufs, &mut ws, &data, &name)).transpose()?;

    // Reference stores of the new tokens.
    store_indexer_k(&new_index, &new_slots, &mut ref_index);
    if fp8 {
        store_fp8(&new_nope, &new_rope, &new_slots, &mut ref_fp8);
    } else {
        store_bf16(&new_nope, &new_rope, &new_slots, &mut ref_bf16);
    }
    let mut checks: Vec<Check> = graph.into_iter().chain(on_device).chain(padded).collect();
    let bytes_check = |kernel: &str, got: &[u8], want: &[u8], row: usize| {
        let bad = got.chunks(row).zip(want.chunks(row)).filter(|(g, w)| g != w).count();
        let first = got.chunks(row).zip(want.chunks(row)).position(|(g, w)| g != w).map(|r| format!("row {r} differs"));
        Check {
            kernel: kernel.into(),
            case: name.clone(),
            items: want.len() / row,
            mismatches: bad,
            first_mismatch: first,
        }
    };
    checks.push(bytes_check("layer: index-K store", &got_index, &ref_index, INDEXER_PAGE_BYTES));
    if fp8 {
        checks.push(bytes_check("layer: KV store", &got_fp8, &ref_fp8, FP8_TOKEN_BYTES));
    } else {
        let g: Vec<u8> = got_bf16.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        let w: Vec<u8> = ref_bf16.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        checks.push(bytes_check("layer: KV store", &g, &w, 2 * BF16_TOKEN_ELEMS));
    }

    // Per sampled row: reference logits over its visible keys.
    let picked = sample_rows(t, case.check_rows);
    let keys = crate::layer::ragged_keys(&md)?;
    let visible = |r: usize| md.nsa_seqlens_expanded[r].max(0) as usize;
    // (logit, spread) of every visible key: the spread bounds the warp-group kernel's
    // FP8 accumulation error (`verify::indexer::logit_tolerance`).
    let wgmma = indexer_wg_kernel(ih as u32, rt.target());
    let ref_logits = |r: usize| -> Vec<(f32, f32)> {
        let (i, _) = data.tokens[r];
        let q = &data.index_q[r * ih * INDEXER_HEAD_DIM..][..ih * INDEXER_HEAD_DIM];
        let query = QueryRow::new(q, &data.index_weights[r * ih..][..ih]);
        (0..visible(r))
            .map(|p| {
                let (kb, scale) = index_k_at(&ref_index, b.slot(i, p) as usize);
                query.logit_and_spread(kb, scale)
            })
            .collect()
    };
    let computed = d.indexer != IndexerStage::Skip;
    let want_logits: Vec<Vec<(f32, f32)>> =
        parallel_rows(&picked, |r| if computed { ref_logits(r) } else { Vec::new() });
    if computed && single_chunk {
        let (mut bad, mut first) = (0, None);
        for (&r, want) in picked.iter().zip(&want_logits) {
            let base = r * d.logits_stride
                + if matches!(d.indexer, IndexerStage::Gathered { .. }) { keys.ks[r] as usize } else { 0 };
            let max = want.iter().fold(0.0f32, |m, v| m.max(v.0.abs()));
            if let Some(p) = (0..want.len())
                .find(|&p| !within(logits[base + p], want[p].0, 0.0, logit_tolerance(max, want[p].1, wgmma)))
            {
                bad += 1;
                first.get_or_insert(format!("row {r} key {p}: gpu {} vs reference {}", logits[base + p], want[p].0));
            }
        }
        checks.push(Check {
            kernel: "layer: indexer logits".into(),
            case: name.clone(),
            items: picked.len(),
            mismatches: bad,
            first_mismatch: first,
        });
    }

    // Top-k: positions back from slots (PAGED) or ragged rows (RAGGED).
    let mut pos_of_slot = vec![(-1i64, -1i64); b.pool_slots];
    for i in 0..case.batch {
        for p in 0..b.totals[i] {
            pos_of_slot[b.slot(i, p) as usize] = (i as i64, p as i64);
        }
    }
    let ragged = d.transform == crate::metadata::TransformMethod::Ragged;
    let positions = |r: usize| -> Vec<Option<i32>> {
        let (i, _) = data.tokens[r];
        indices[r * k..(r + 1) * k]
            .iter()
            .map(|&v| {
                if v < 0 {
                    Some(-1)
                } else if ragged {
                    let p = v - keys.ks[r];
                    (p >= 0 && (p as usize) < b.totals[i]).then_some(p)
                } else {
                    match pos_of_slot.get(v as usize) {
                        Some(&(owner, p)) if owner == i as i64 => Some(p as i32),
                        _ => None,
                    }
                }
            })
            .collect()
    };
    let (mut bad, mut first) = (0, None);
    for (&r, want) in picked.iter().zip(&want_logits) {
        let got = positions(r);
        let n = visible(r);
        let err = if n <= k { check_row(&vec![0.0; n], k, &got).err() } else { topk_within(want, &got, wgmma) };
        if let Some(e) = err {
            bad += 1;
            first.get_or_insert(format!("row {r}: {e}"));
        }
    }
    checks.push(Check {
        kernel: "layer: top-k".into(),
        case: name.clone(),
        items: picked.len(),
        mismatches: bad,
        first_mismatch: first,
    });

    // Attention over the selected keys, read as the chosen kernel reads them.
    let paged = PagedFp8 {
        bytes: &ref_fp8,
        page_size: case.model.page_size as usize,
        page_stride: case.model.page_size as usize * FP8_TOKEN_BYTES,
        dequant: match &d.attention {
            AttentionStage::Decode(p) => DecodeDequant::of(&KernelSpec::new(p.family(), p.target)),
            _ => DecodeDequant::Bf16Rounded,
        },
    };
    let key_row = |slot: usize| -> Vec<f32> {
        match &d.attention {
            AttentionStage::Decode(_) => paged.token(slot),
            AttentionStage::PrefillRagged(_) => {
                dequantize_fp8_token(&ref_fp8[slot * FP8_TOKEN_BYTES..][..FP8_TOKEN_BYTES])
                    .iter()
                    .map(|v| v.to_f32())
                    .collect()
            }
            AttentionStage::PrefillPaged(_) => {
                row_of(&ref_bf16, slot, BF16_TOKEN_ELEMS).iter().map(|v| v.to_f32()).collect()
            }
        }
    };
    let want_attn = reference_rows(&picked, |r| {
        let (i, _) = data.tokens[r];
        let chosen: Vec<Vec<f32>> = positions(r)
            .iter()
            .filter_map(|p| p.filter(|&p| p >= 0))
            .map(|p| key_row(b.slot(i, p as usize) as usize))
            .collect();
        let refs: Vec<&[f32]> = chosen.iter().map(|v| v.as_slice()).collect();
        let q: Vec<f32> =
            data.q[r * heads * BF16_TOKEN_ELEMS..][..heads * BF16_TOKEN_ELEMS].iter().map(|v| v.to_f32()).collect();
        attend(&q, heads, BF16_TOKEN_ELEMS, &refs, cfg.sm_scale)
    });
    let gpu = GpuAttention { heads, out: &out, lse: &lse, max_logits: None };
    let (bad, first) = compare(&gpu, &picked, &want_attn);
    checks.push(Check {
        kernel: "layer: sparse MLA".into(),
        case: name.clone(),
        items: picked.len(),
        mismatches: bad,
        first_mismatch: first,
    });

    if case.needle {
        checks.push(needle_check(&name, &data, &b, &md, &positions, &out, heads, k));
    }
    Ok(LayerReport { checks, explain: plan.explain(), rows: plan.rows(), timing })
}

/// DP padding rows `t..t + pad`: `out` all zeros, `lse` all +inf.
fn padding_check(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    out: &CudaSlice<bf16>,
    lse: &CudaSlice<f32>,
    t: usize,
    pad: usize,
    heads: usize,
    name: &str,
) -> Result<Check> {
    let out = download(stream, out, (t + pad) * heads * KV_LORA_RANK)?;
    let lse = download(stream, lse, (t + pad) * heads)?;
    let bad_row = (t..t + pad).find(|&r| {
        out[r * heads * KV_LORA_RANK..(r + 1) * heads * KV_LORA_RANK].iter().any(|v| v.to_bits() != 0)
            || lse[r * heads..(r + 1) * heads].iter().any(|&v| v != f32::INFINITY)
    });
    Ok(Check {
        kernel: "layer: padding rows".into(),
        case: name.into(),
        items: pad,
        mismatches: usize::from(bad_row.is_some()),
        first_mismatch: bad_row.map(|r| format!("row {r}: out not all zeros or lse not all +inf")),
    })
}

type Forward<'f> = dyn FnMut(&mut dyn FnMut(Stage) -> Result<()>) -> Result<()> + 'f;

/// Mean eager step time over `iters` forwards, then per-stage time from events
/// recorded at each stage mark over `iters` more.
fn time_layer(rt: &Runtime, iters: usize, forward: &mut Forward<'_>) -> Result<LayerTiming> {
    let stream = rt.gpu().stream();
    let event = || {
        stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(crate::Error::driver("recording an event"))
    };
    let elapsed = |a: &cudarc::driver::CudaEvent, b: &cudarc::driver::CudaEvent| -> Result<f64> {
        b.synchronize().map_err(crate::Error::driver("waiting for the layer"))?;
        Ok(a.elapsed_ms(b).map_err(crate::Error::driver("reading event time"))? as f64 * 1e3)
    };
    let total_us = super::device_us(rt, iters, &mut || forward(&mut |_| Ok(())))?;
    let graph = capture(rt, &mut |mark| forward(mark))?;
    let mut launch = || graph.launch().map_err(crate::Error::driver("launching the layer graph"));
    launch()?;
    let graph_us = super::device_us(rt, iters, &mut launch)?;
    let mut sums = vec![0.0f64; Stage::ALL.len()];
    for _ in 0..iters {
        let mut marks = vec![(None, event()?)];
        forward(&mut |stage| {
            marks.push((Some(stage), event()?));
            Ok(())
        })?;
        for pair in marks.windows(2) {
            if let (Some(stage), a, b) = (pair[1].0, &pair[0].1, &pair[1].1) {
                sums[stage as usize] += elapsed(a, b)?;
            }
        }
    }
    let stages = Stage::ALL.iter().map(|&s| (s, sums[s as usize] / iters as f64)).collect();
    Ok(LayerTiming { total_us, graph_us, stages })
}

/// Long rows: the chosen set holds `k` distinct visible positions, −1-free, and no
/// unchosen key beats a chosen one by more than the two keys' logits tolerances
/// (`want`: reference logit and spread per position).
pub fn topk_within(want: &[(f32, f32)], got: &[Option<i32>], wgmma: bool) -> Option<String> {
    let n = want.len();
    let mut chosen = vec![false; n];
    for (j, p) in got.iter().enumerate() {
        match p {
            Some(p) if *p >= 0 && (*p as usize) < n && !chosen[*p as usize] => chosen[*p as usize] = true,
            other => return Some(format!("entry {j} is {other:?}: not a new position in 0..{n}")),
        }
    }
    let max = want.iter().fold(0.0f32, |m, v| m.max(v.0.abs()));
    let tol = |p: usize| logit_tolerance(max, want[p].1, wgmma);
    // The GPU ranked its own logits, each up to its tolerance off the reference: a
    // wrong choice is an unselected key whose lowest possible logit exceeds the
    // highest possible logit of a selected one.
    // Long rows (n > k): both sets are non-empty.
    let by_bound = |a: &(f32, usize), b: &(f32, usize)| a.0.total_cmp(&b.0);
    let lowest_in = (0..n).filter(|&p| chosen[p]).map(|p| (want[p].0 + tol(p), p)).min_by(by_bound)?;
    let highest_out = (0..n).filter(|&p| !chosen[p]).map(|p| (want[p].0 - tol(p), p)).max_by(by_bound)?;
    (highest_out.0 > lowest_in.0).then(|| {
        let (o, i) = (highest_out.1, lowest_in.1);
        format!("unselected logit {} beats selected {} (tolerances {} and {})", want[o].0, want[i].0, tol(o), tol(i))
    })
}

#[allow(clippy::too_many_arguments)]
fn needle_check(
    name: &str,
    data: &Data,
    b: &Batch,
    md: &NsaMetadata,
    positions: &dyn Fn(usize) -> Vec<Option<i32>>,
    out: &[bf16],
    heads: usize,
    k: usize,
) -> Check {
    let (mut items, mut bad, mut first) = (0, 0, None);
    for (r, &(i, _)) in data.tokens.iter().enumerate() {
        let Some(needle) = data.needles[i] else { continue };
        if needle >= md.nsa_seqlens_expanded[r].max(0) as usize {
            continue;
        }
        items += 1;
        let found = positions(r).iter().take(k).any(|&p| p == Some(needle as i32));
        let slot = b.slot(i, needle) as usize;
        let latent = row_of(&data.kv_rows, slot, BF16_TOKEN_ELEMS);
        let follows = (0..heads).all(|h| {
            (0..KV_LORA_RANK).all(|dim| {
                within(out[(r * heads + h) * KV_LORA_RANK + dim].to_f32(), latent[dim].to_f32(), 1.0 / 64.0, 1e-2)
            })
        });
        if !(found && follows) {
            bad += 1;
            first.get_or_insert(format!(
                "token {r} (request {i}, needle at {needle}): {}",
                if found { "output does not follow the needle" } else { "needle not in the top-k" }
            ));
        }
    }
    Check { kernel: "layer: needle".into(), case: name.into(), items, mismatches: bad, first_mismatch: first }
}

/// Host inputs of one forward, token-major.
struct HostInputs<'a> {
    q: &'a [bf16],
    nope: &'a [bf16],
    rope: &'a [bf16],
    loc: &'a [i32],
    index_q: &'a [u8],
    index_weights: &'a [f32],
    index_k: &'a [bf16],
}

enum CacheInit<'a> {
    Fp8(&'a [u8]),
    Bf16(&'a [bf16]),
}

/// The device buffers of a case; forwards build their views from them, so inputs
/// can be rewritten in place between forwards (graph replays).
struct Buffers {
    q: CudaSlice<bf16>,
    nope: CudaSlice<bf16>,
    rope: CudaSlice<bf16>,
    loc: CudaSlice<i32>,
    index_q: CudaSlice<u8>,
    index_weights: CudaSlice<f32>,
    index_k: CudaSlice<bf16>,
    index: CudaSlice<u8>,
    fp8: CudaSlice<u8>,
    bf16: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
    lse: CudaSlice<f32>,
    /// Rows the KV store writes.
    tokens: usize,
    /// Query rows (DP padding included; a CP rank's share of the tokens).
    q_rows: usize,
    heads: usize,
    fp8_cache: bool,
}

impl Buffers {
    fn upload(rt: &Runtime, h: &HostInputs<'_>, index: &[u8], cache: CacheInit<'_>, heads: usize) -> Result<Self> {
        let stream = rt.gpu().stream();
        let t = h.loc.len();
        let q_rows = h.q.len() / (heads * BF16_TOKEN_ELEMS);
        let (fp8, bf16_cache, fp8_cache) = match cache {
            CacheInit::Fp8(c) => (upload(stream, c)?, upload::<bf16>(stream, &[])?, true),
            CacheInit::Bf16(c) => (upload::<u8>(stream, &[])?, upload(stream, c)?, false),
        };
        Ok(Buffers {
            q: upload(stream, h.q)?,
            nope: upload(stream, h.nope)?,
            rope: upload(stream, h.rope)?,
            loc: upload(stream, h.loc)?,
            index_q: upload(stream, h.index_q)?,
            index_weights: upload(stream, h.index_weights)?,
            index_k: upload(stream, h.index_k)?,
            index: upload(stream, index)?,
            fp8,
            bf16: bf16_cache,
            out: upload(stream, &vec![bf16::from_bits(0x7fc1); q_rows * heads * KV_LORA_RANK])?,
            lse: upload(stream, &vec![f32::NAN; q_rows * heads])?,
            tokens: t,
            q_rows,
            heads,
            fp8_cache,
        })
    }

    /// Rewrites the per-token inputs in place (same sizes).
    fn rewrite(&mut self, rt: &Runtime, h: &HostInputs<'_>) -> Result<()> {
        let stream = rt.gpu().stream();
        let e = || crate::Error::driver("rewriting layer inputs");
        stream.memcpy_htod(h.q, &mut self.q.slice_mut(..h.q.len())).map_err(e())?;
        stream.memcpy_htod(h.loc, &mut self.loc.slice_mut(..h.loc.len())).map_err(e())?;
        stream.memcpy_htod(h.nope, &mut self.nope.slice_mut(..h.nope.len())).map_err(e())?;
        stream.memcpy_htod(h.rope, &mut self.rope.slice_mut(..h.rope.len())).map_err(e())?;
        stream.memcpy_htod(h.index_q, &mut self.index_q.slice_mut(..h.index_q.len())).map_err(e())?;
        stream.memcpy_htod(h.index_weights, &mut self.index_weights.slice_mut(..h.index_weights.len())).map_err(e())?;
        stream.memcpy_htod(h.index_k, &mut self.index_k.slice_mut(..h.index_k.len())).map_err(e())?;
        Ok(())
    }

    fn forward(
        &mut self,
        layer: &NsaLayer<'_>,
        plan: &crate::layer::StepPlan,
        ws: &mut LayerWorkspace,
        mark: &mut dyn FnMut(Stage) -> Result<()>,
    ) -> Result<()> {
        let (t, q_rows, heads) = (self.tokens, self.q_rows, self.heads);
        let ih = layer.config().model.index_n_heads as usize;
        let inputs = LayerInputs {
            q: self.q.slice(0..q_rows * heads * BF16_TOKEN_ELEMS),
            k_nope: Rows {
                data: self.nope.slice(0..t * KV_LORA_RANK),
                count: t,
                width: KV_LORA_RANK,
                stride: KV_LORA_RANK,
            },
            k_rope: Rows { data: self.rope.slice(0..t * ROPE_DIM), count: t, width: ROPE_DIM, stride: ROPE_DIM },
            out_cache_loc: self.loc.slice(0..t),
            index_q: self.index_q.slice(0..q_rows * ih * INDEXER_HEAD_DIM),
            index_weights: self.index_weights.slice(0..q_rows * ih),
            index_k: Rows {
                data: self.index_k.slice(0..t * INDEXER_HEAD_DIM),
                count: t,
                width: INDEXER_HEAD_DIM,
                stride: INDEXER_HEAD_DIM,
            },
        };
        let kv = if self.fp8_cache {
            MlaCacheMut::Fp8(self.fp8.slice_mut(..))
        } else {
            MlaCacheMut::Bf16(self.bf16.slice_mut(..))
        };
        let mut caches = LayerCaches { kv, index_k: self.index.slice_mut(..) };
        let outputs = LayerOutputs {
            out: &mut self.out.slice_mut(0..q_rows * heads * KV_LORA_RANK),
            lse: &mut self.lse.slice_mut(0..q_rows * heads),
        };
        layer.forward_marked(plan, &inputs, &mut caches, ws, outputs, mark)
    }

    fn results(&self, rt: &Runtime, ws: &LayerWorkspace, k: usize) -> Result<StepResults> {
        let stream = rt.gpu().stream();
        let (t, heads) = (self.q_rows, self.heads);
        let out = download(stream, &self.out, t * heads * KV_LORA_RANK)?.iter().map(|v| v.to_bits()).collect();
        let lse = download(stream, &self.lse, t * heads)?.iter().map(|v| v.to_bits()).collect();
        Ok((out, lse, download(stream, ws.indices(), t * k)?))
    }
}

/// Bits of out, lse and the top-k indices of one forward.
type StepResults = (Vec<u16>, Vec<u32>, Vec<i32>);

/// The first output in which two forwards differ, bit for bit.
fn difference(a: &StepResults, b: &StepResults) -> Option<&'static str> {
    if a.2 != b.2 {
        Some("top-k indices")
    } else if a.0 != b.0 {
        Some("out")
    } else if a.1 != b.1 {
        Some("lse")
    } else {
        None
    }
}

/// One forward captured into a CUDA graph (nothing runs until it is launched).
fn capture(rt: &Runtime, forward: &mut Forward<'_>) -> Result<cudarc::driver::CudaGraph> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let stream = rt.gpu().stream();
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    stream.begin_capture(mode).map_err(crate::Error::driver("beginning a graph capture"))?;
    // A panic inside the forward still ends the capture, so the shared stream
    // runs the next test's work instead of recording it.
    struct EndOnUnwind<'a>(&'a std::sync::Arc<cudarc::driver::CudaStream>);
    impl Drop for EndOnUnwind<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = self.0.end_capture(CUgraphInstantiate_flags(0));
            }
        }
    }
    let _unwind = EndOnUnwind(stream);
    let captured = forward(&mut |_| Ok(()));
    let graph =
        stream.end_capture(CUgraphInstantiate_flags(0)).map_err(crate::Error::driver("ending the graph capture"))?;
    captured?;
    graph.ok_or_else(|| crate::Error::Other("the captured layer graph is empty".into()))
}

/// Captures one forward in a CUDA graph, then for three input sets (the case's,
/// and two rewritten in place) compares a graph launch with an eager forward bit
/// for bit: out, lse and the top-k indices.
fn graph_replays(
    rt: &Runtime,
    layer: &NsaLayer<'_>,
    plan: &crate::layer::StepPlan,
    bufs: &mut Buffers,
    ws: &mut LayerWorkspace,
    data: &Data,
    name: &str,
) -> Result<Check> {
    let stream = rt.gpu().stream();
    let k = layer.config().model.topk as usize;
    let driver = |what: &'static str| crate::Error::driver(what);
    let graph = capture(rt, &mut |mark| bufs.forward(layer, plan, ws, mark))?;
    let mut rng = testdata::rng(data.q.len() as u64);
    let (mut items, mut bad, mut first) = (0, 0, None);
    for round in 0..3 {
        if round > 0 {
            let q: Vec<bf16> =
                data.q.iter().map(|v| bf16::from_f32(v.to_f32() * rng.random_range(0.5f32..1.5))).collect();
            let mut index_q = data.index_q.clone();
            index_q.shuffle(&mut rng);
            let mut weights = data.index_weights.clone();
            weights.shuffle(&mut rng);
            let t = bufs.tokens;
            let rows: Vec<bf16> =
                (0..t * BF16_TOKEN_ELEMS).map(|_| bf16::from_f32(rng.random_range(-2.0f32..2.0))).collect();
            let (nope, rope) = super::split_rows(&rows);
            let index_k: Vec<bf16> =
                (0..t * INDEXER_HEAD_DIM).map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0))).collect();
            let loc = download(stream, &bufs.loc, t)?;
            let h = HostInputs {
                q: &q,
                nope: &nope,
                rope: &rope,
                loc: &loc,
                index_q: &index_q,
                index_weights: &weights,
                index_k: &index_k,
            };
            bufs.rewrite(rt, &h)?;
        }
        graph.launch().map_err(driver("launching the layer graph"))?;
        let replayed = bufs.results(rt, ws, k)?;
        bufs.forward(layer, plan, ws, &mut |_| Ok(()))?;
        let eager = bufs.results(rt, ws, k)?;
        items += 1;
        if let Some(what) = difference(&replayed, &eager) {
            bad += 1;
            first.get_or_insert(format!("input set {round}: graph and eager {what} differ"));
        }
    }
    Ok(Check { kernel: "layer: graph replay".into(), case: name.into(), items, mismatches: bad, first_mismatch: first })
}

/// The case's step again with its metadata built on the device (one metadata
/// launch from device `req_to_token`, `req_pool_indices`, lengths), against the
/// host-metadata step just run on the same inputs: out, lse and indices bit for bit.
#[allow(clippy::too_many_arguments)]
fn device_metadata_step(
    rt: &Runtime,
    case: &LayerCase,
    layer: &NsaLayer<'_>,
    b: &Batch,
    dispatch: &crate::metadata::Dispatch,
    bufs: &mut Buffers,
    host: &StepResults,
    name: &str,
) -> Result<Check> {
    use crate::layer::{DeviceBatch, HostLens};
    use crate::metadata::extend_device::{DeviceExtendState, ExtendCapacity};
    use crate::metadata::graph_device::{DeviceGraphState, DeviceRequests};
    use crate::metadata::{GraphCapacity, GraphMode};
    let stream = rt.gpu().stream();
    let k = case.model.topk as usize;
    let bs = case.batch;
    let totals: Vec<i32> = b.totals.iter().map(|&v| v as i32).collect();
    let news: Vec<i32> = b.news.iter().map(|&v| v as i32).collect();
    let tokens: usize = b.news.iter().sum();
    let (graph_mode, draft) = match case.mode {
        LayerMode::Decode => (Some(GraphMode::Decode), 0),
        LayerMode::TargetVerify { draft } => (Some(GraphMode::TargetVerify), draft),
        LayerMode::DraftExtend { draft } => (Some(GraphMode::DraftExtend), draft),
        LayerMode::DraftExtendV2 { draft } => (Some(GraphMode::DraftExtendV2), draft),
        LayerMode::Extend { .. } => (None, 0),
    };
    // Verify counts the drafts on top of seq_lens.
    let seq: Vec<i32> = match case.mode {
        LayerMode::TargetVerify { .. } => totals.iter().zip(&news).map(|(t, n)| t - n).collect(),
        _ => totals.clone(),
    };
    let with_lens = matches!(case.mode, LayerMode::DraftExtend { .. } | LayerMode::Extend { .. });
    let d_table = upload(stream, &b.table)?;
    let d_rpi = upload(stream, &b.rows_of)?;
    let d_seq = upload(stream, &seq)?;
    let d_ext = upload(stream, &news)?;
    let (v_table, v_rpi, v_seq, v_ext) = (d_table.slice(..), d_rpi.slice(..bs), d_seq.slice(..bs), d_ext.slice(..bs));
    let batch = DeviceBatch {
        reqs: DeviceRequests {
            req_to_token: &v_table,
            req_to_token_width: b.width,
            req_pool_indices: &v_rpi,
            seq_lens: &v_seq,
        },
        extend_lens: with_lens.then_some(&v_ext),
    };
    let host_lens = HostLens { seq_lens: &seq, extend_lens: with_lens.then_some(&news[..]) };
    let params = b.params(case, None);
    // Table rows wider than the host's, so strides differ from the host plan's.
    let width = b.width + 3 * case.model.page_size as usize;
    let run = |plan: &crate::layer::StepPlan<'_>, bufs: &mut Buffers| -> Result<StepResults> {
        let mut ws = LayerWorkspace::new(rt, plan.needs())?;
        bufs.forward(layer, plan, &mut ws, &mut |_| Ok(()))?;
        bufs.results(rt, &ws, k)
    };
    // The whole step (metadata launch + layer) captured into one CUDA graph: any
    // hidden synchronisation or host copy fails the capture. `out` is cleared
    // before the launch, so only the graph's own writes are compared.
    type Step<'s> = dyn FnMut(&mut LayerWorkspace, &mut Buffers) -> Result<()> + 's;
    let captured =
        |needs: crate::layer::WorkspaceNeeds, step: &mut Step<'_>, bufs: &mut Buffers| -> Result<StepResults> {
            let mut ws = LayerWorkspace::new(rt, needs)?;
            stream.synchronize().map_err(crate::Error::driver("waiting before the capture"))?;
            let graph = capture(rt, &mut |_| step(&mut ws, bufs))?;
            stream.memset_zeros(&mut bufs.out).map_err(crate::Error::driver("clearing out"))?;
            graph.launch().map_err(crate::Error::driver("launching the captured step"))?;
            bufs.results(rt, &ws, k)
        };
    let (got, graph) = match graph_mode {
        Some(mode) => {
            let per_req = mode.rows_per_request(draft).max(1);
            let capacity = GraphCapacity { max_bs: bs.max(1), max_tokens: bs.max(1) * per_req, max_context_len: width };
            let mut state = DeviceGraphState::new(rt, params, mode, capacity)?;
            let plan = layer.plan_on_device(&mut state, &batch, host_lens, dispatch)?;
            let needs = plan.needs();
            let got = run(&plan, bufs)?;
            drop(plan);
            let mut step = |ws: &mut LayerWorkspace, bufs: &mut Buffers| {
                let plan = layer.plan_on_device(&mut state, &batch, host_lens, dispatch)?;
                bufs.forward(layer, &plan, ws, &mut |_| Ok(()))
            };
            (got, Some(captured(needs, &mut step, bufs)?))
        }
        None => {
            let capacity = ExtendCapacity {
                max_bs: bs.max(1),
                max_tokens: tokens.max(1),
                max_keys: (totals.iter().sum::<i32>() as usize).max(1),
                max_context_len: width,
            };
            let mut state = DeviceExtendState::new(rt, params, capacity)?;
            let plan = layer.plan_extend_on_device(&mut state, &batch, host_lens, dispatch)?;
            // Several PAGED chunks upload their row offsets: not capturable.
            let d = plan.decisions();
            let uploads = d.chunks.len() > 1 && d.transform == crate::metadata::TransformMethod::Paged;
            let needs = plan.needs();
            let got = run(&plan, bufs)?;
            drop(plan);
            let mut step = |ws: &mut LayerWorkspace, bufs: &mut Buffers| {
                let plan = layer.plan_extend_on_device(&mut state, &batch, host_lens, dispatch)?;
                bufs.forward(layer, &plan, ws, &mut |_| Ok(()))
            };
            let graph = if uploads { None } else { Some(captured(needs, &mut step, bufs)?) };
            (got, graph)
        }
    };
    let diff = difference(host, &got).map(|what| format!("host-metadata and device-metadata steps: {what} differ"));
    let graph_diff = graph
        .as_ref()
        .and_then(|g| difference(host, g))
        .map(|what| format!("the host-metadata step and the captured device-metadata step: {what} differ"));
    Ok(Check {
        kernel: "layer: device metadata".into(),
        case: format!("{name}{}", if graph.is_some() { " (eager and captured)" } else { " (eager)" }),
        items: 1 + usize::from(graph.is_some()),
        mismatches: usize::from(diff.is_some()) + usize::from(graph_diff.is_some()),
        first_mismatch: diff.or(graph_diff),
    })
}

/// CUDA-graph serving over several steps: the layer is captured ONCE with a plan
/// bound to a [`DeviceGraphState`](crate::metadata::graph_device::DeviceGraphState);
/// each step replays the metadata (one launch, lengths grown by the step's tokens)
/// and the layer graph, with new inputs written in place. Every step must equal an
/// eager step built from host metadata, bit for bit (out, lse, top-k indices).
/// Decode and target-verify cases.
pub fn graph_steps(rt: &Runtime, case: &LayerCase, steps: usize) -> Result<Check> {
    use crate::metadata::graph_device::{DeviceGraphState, DeviceRequests};
    use crate::metadata::{GraphCapacity, GraphMode};
    let stream = rt.gpu().stream();
    let (mode, per_req) = match case.mode {
        LayerMode::Decode => (GraphMode::Decode, 1),
        LayerMode::TargetVerify { draft } => (GraphMode::TargetVerify, draft as usize),
        other => return Err(crate::Error::Other(format!("graph steps cover decode and verify, not {}", other.name()))),
    };
    let mut rng = testdata::rng(case.seed);
    let b = make_batch(case, &mut rng);
    let data = make_data(case, &b, &mut rng);
    let mut cfg = LayerConfig::new(case.model.clone())?;
    cfg.deterministic_topk = true;
    let layer = NsaLayer::new(rt, cfg)?;
    let (bs, heads, ih) = (case.batch, case.model.num_q_heads as usize, case.model.index_n_heads as usize);
    let t = bs * per_req;
    // KV length of request i after step s; the last step ends at the batch's totals.
    let kv_len = |i: usize, s: usize| b.totals[i] - (steps - 1 - s) * per_req;
    assert!((0..bs).all(|i| b.totals[i] > steps * per_req), "requests long enough for {steps} steps");
    let step_inputs = |s: usize, rng: &mut StdRng| {
        let slots: Vec<i32> = (0..bs)
            .flat_map(|i| (kv_len(i, s) - per_req..kv_len(i, s)).map(move |p| (i, p)))
            .map(|(i, p)| b.slot(i, p))
            .collect();
        let rows: Vec<bf16> =
            slots.iter().flat_map(|&sl| row_of(&data.kv_rows, sl as usize, BF16_TOKEN_ELEMS).iter().copied()).collect();
        let (nope, rope) = super::split_rows(&rows);
        let index_k: Vec<bf16> = slots
            .iter()
            .flat_map(|&sl| row_of(&data.index_rows, sl as usize, INDEXER_HEAD_DIM).iter().copied())
            .collect();
        let q = random_bf16(t * heads * BF16_TOKEN_ELEMS, 1.0, rng.random());
        let index_q: Vec<u8> = (0..t * ih * INDEXER_HEAD_DIM).map(|_| e4m3(rng)).collect();
        let weights: Vec<f32> = (0..t * ih).map(|_| rng.random_range(-0.02f32..0.05)).collect();
        StepInputs { q, nope, rope, loc: slots, index_q, weights, index_k }
    };
    let fp8 = case.model.kv_cache == KvCacheFormat::Fp8;
    let (ref_fp8, ref_bf16, ref_index) = filled_caches(fp8, &data, b.pool_slots);
    let first = step_inputs(0, &mut rng);
    let mut bufs = Buffers::upload(
        rt,
        &first.host(),
        &ref_index,
        if fp8 { CacheInit::Fp8(&ref_fp8) } else { CacheInit::Bf16(&ref_bf16) },
        heads,
    )?;

    // The graph state, its request tables on the device, and the layer graph.
    let params = b.params(case, None);
    let capacity = GraphCapacity { max_bs: bs, max_tokens: t, max_context_len: b.width };
    let mut state = DeviceGraphState::new(rt, params, mode, capacity)?;
    let d_table = upload(stream, &b.table)?;
    let d_rpi = upload(stream, &b.rows_of)?;
    let seq_of = |s: usize| -> Vec<i32> {
        (0..bs).map(|i| (kv_len(i, s) - if per_req > 1 { per_req } else { 0 }) as i32).collect()
    };
    let mut d_seq = upload(stream, &seq_of(0))?;
    state.capture(rt, &d_seq.slice(0..bs))?;
    // The graph keeps the state's buffer addresses; the plan's borrow ends here so
    // replays can rewrite them.
    let (graph, graph_ws) = {
        let plan = layer.plan_for_graph(&state, bs, 0)?;
        let mut ws = LayerWorkspace::new(rt, plan.needs())?;
        let g = capture(rt, &mut |mark| bufs.forward(&layer, &plan, &mut ws, mark))?;
        (g, ws)
    };
    let builder = MetadataBuilder::new(params)?;
    let table = ReqToToken::new(&b.table, b.width)?;
    let (mut bad, mut first_bad) = (0, None);
    let k = case.model.topk as usize;
    for s in 0..steps {
        if s > 0 {
            let x = step_inputs(s, &mut rng);
            bufs.rewrite(rt, &x.host())?;
        }
        let seq = seq_of(s);
        stream.memcpy_htod(&seq, &mut d_seq.slice_mut(..bs)).map_err(crate::Error::driver("writing seq_lens"))?;
        let reqs = DeviceRequests {
            req_to_token: &d_table.slice(..),
            req_to_token_width: b.width,
            req_pool_indices: &d_rpi.slice(..bs),
            seq_lens: &d_seq.slice(..bs),
        };
        match mode {
            GraphMode::Decode => state.replay_decode(rt, &reqs)?,
            _ => state.replay_target_verify(rt, &reqs)?,
        }
        graph.launch().map_err(crate::Error::driver("launching the layer graph"))?;
        let replayed = bufs.results(rt, &graph_ws, k)?;
        // Eager: host metadata for the same batch.
        let reqs = Requests { req_pool_indices: &b.rows_of, seq_lens: &seq };
        let md = match mode {
            GraphMode::Decode => builder.decode(&table, reqs)?,
            _ => builder.target_verify(&table, reqs)?,
        };
        let summary = BatchSummary { mode: md.mode, seq_lens: &md.cache_seqlens, extend_num_tokens: t };
        let dispatch = decide(&policy(rt, case), Some(&summary));
        let plan = layer.plan(&md, &dispatch)?;
        let mut ws = LayerWorkspace::new(rt, plan.needs())?;
        bufs.forward(&layer, &plan, &mut ws, &mut |_| Ok(()))?;
        let eager = bufs.results(rt, &ws, k)?;
        if let Some(what) = difference(&replayed, &eager) {
            bad += 1;
            first_bad.get_or_insert(format!("step {s}: graph and eager {what} differ"));
        }
    }
    Ok(Check {
        kernel: "layer: graph-bound steps".into(),
        case: format!("{} ×{steps} steps", case.describe()),
        items: steps,
        mismatches: bad,
        first_mismatch: first_bad,
    })
}

/// Owned host inputs of one step (graph steps).
struct StepInputs {
    q: Vec<bf16>,
    nope: Vec<bf16>,
    rope: Vec<bf16>,
    loc: Vec<i32>,
    index_q: Vec<u8>,
    weights: Vec<f32>,
    index_k: Vec<bf16>,
}

impl StepInputs {
    fn host(&self) -> HostInputs<'_> {
        HostInputs {
            q: &self.q,
            nope: &self.nope,
            rope: &self.rope,
            loc: &self.loc,
            index_q: &self.index_q,
            index_weights: &self.weights,
            index_k: &self.index_k,
        }
    }
}

/// The caches of a whole batch before its step, every slot filled.
struct Filled {
    fp8: Vec<u8>,
    bf16: Vec<bf16>,
    index: Vec<u8>,
}

/// The batch of `case`, its data, and its caches before the step.
fn whole_batch(case: &LayerCase) -> (Batch, Data, Filled) {
    let mut rng = testdata::rng(case.seed);
    let b = make_batch(case, &mut rng);
    let data = make_data(case, &b, &mut rng);
    let (fp8, bf16, index) = filled_caches(case.model.kv_cache == KvCacheFormat::Fp8, &data, b.pool_slots);
    (b, data, Filled { fp8, bf16, index })
}

/// One forward of `plan` over the batch's data on fresh copies of `filled`: the
/// query rows of the global tokens `q_tokens`, the KV of `store_tokens` stored.
#[allow(clippy::too_many_arguments)]
fn forward_rows(
    rt: &Runtime,
    layer: &NsaLayer<'_>,
    plan: &crate::layer::StepPlan<'_>,
    b: &Batch,
    data: &Data,
    filled: &Filled,
    q_tokens: &[usize],
    store_tokens: &[usize],
) -> Result<StepResults> {
    let m = &layer.config().model;
    let (heads, ih, k) = (m.num_q_heads as usize, m.index_n_heads as usize, m.topk as usize);
    let rows_of = |src: &[bf16], w: usize| -> Vec<bf16> {
        q_tokens.iter().flat_map(|&t| src[t * w..(t + 1) * w].iter().copied()).collect()
    };
    let q = rows_of(&data.q, heads * BF16_TOKEN_ELEMS);
    let index_q: Vec<u8> = q_tokens
        .iter()
        .flat_map(|&t| data.index_q[t * ih * INDEXER_HEAD_DIM..][..ih * INDEXER_HEAD_DIM].iter().copied())
        .collect();
    let weights: Vec<f32> = q_tokens.iter().flat_map(|&t| data.index_weights[t * ih..][..ih].iter().copied()).collect();
    let slots: Vec<i32> = store_tokens.iter().map(|&t| b.slot(data.tokens[t].0, data.tokens[t].1)).collect();
    let of_slots = |src: &[bf16], w: usize| -> Vec<bf16> {
        slots.iter().flat_map(|&s| row_of(src, s as usize, w).iter().copied()).collect()
    };
    let (nope, rope) = super::split_rows(&of_slots(&data.kv_rows, BF16_TOKEN_ELEMS));
    let index_k = of_slots(&data.index_rows, INDEXER_HEAD_DIM);
    let host = HostInputs {
        q: &q,
        nope: &nope,
        rope: &rope,
        loc: &slots,
        index_q: &index_q,
        index_weights: &weights,
        index_k: &index_k,
    };
    let cache =
        if m.kv_cache == KvCacheFormat::Fp8 { CacheInit::Fp8(&filled.fp8) } else { CacheInit::Bf16(&filled.bf16) };
    let mut bufs = Buffers::upload(rt, &host, &filled.index, cache, heads)?;
    let mut ws = LayerWorkspace::new(rt, plan.needs())?;
    bufs.forward(layer, plan, &mut ws, &mut |_| Ok(()))?;
    bufs.results(rt, &ws, k)
}

/// Batch invariance ([`LayerConfig::batch_invariant`]): request 1 of `case`'s batch
/// run alone, then inside sub-batches of each of `sizes` requests (the first `n` of
/// the batch, request 1 moved to the middle); its out, lse and top-k indices
/// (RAGGED: as positions) must equal those of the lone run bit for bit. With
/// `invariant` false the layer runs without the option (a control: a decode split
/// count that follows the batch changes the bits).
pub fn batch_invariance(rt: &Runtime, case: &LayerCase, sizes: &[usize], invariant: bool) -> Result<Check> {
    let (b, data, filled) = whole_batch(case);
    let mut cfg = LayerConfig::new(case.model.clone())?;
    cfg.batch_invariant = invariant;
    cfg.deterministic_topk = true;
    if let Some(budget) = case.logits_budget {
        cfg.logits_budget_bytes = budget;
    }
    let layer = NsaLayer::new(rt, cfg)?;
    let (heads, k) = (case.model.num_q_heads as usize, case.model.topk as usize);
    // First token of each request in the whole batch.
    let first: Vec<usize> = b.news.iter().scan(0, |at, &n| Some(std::mem::replace(at, *at + n))).collect();
    let target = 1usize;
    let rows_of_r = b.news[target];
    // R's rows (out, lse, indices as positions) in a run over `members`.
    let run_with = |members: &[usize]| -> Result<(Vec<u16>, Vec<u32>, Vec<i32>)> {
        let sub = Batch {
            totals: members.iter().map(|&i| b.totals[i]).collect(),
            news: members.iter().map(|&i| b.news[i]).collect(),
            table: b.table.clone(),
            width: b.width,
            rows_of: members.iter().map(|&i| b.rows_of[i]).collect(),
            pool_slots: b.pool_slots,
        };
        let sub_case = LayerCase { batch: members.len(), ..case.clone() };
        let (md, dispatch) = metadata(rt, &sub_case, &sub, None)?;
        let plan = layer.plan(&md, &dispatch)?;
        let tokens: Vec<usize> = members.iter().flat_map(|&i| first[i]..first[i] + b.news[i]).collect();
        let (out, lse, indices) = forward_rows(rt, &layer, &plan, &b, &data, &filled, &tokens, &tokens)?;
        let pos = members.iter().position(|&i| i == target).expect("the request is a member");
        let r0: usize = members[..pos].iter().map(|&i| b.news[i]).sum();
        // RAGGED indices are rows of the ragged KV: positions plus the request's offset.
        let offset = if plan.decisions().transform == crate::metadata::TransformMethod::Ragged {
            members[..pos].iter().map(|&i| b.totals[i] as i32).sum()
        } else {
            0
        };
        Ok((
            out[r0 * heads * KV_LORA_RANK..(r0 + rows_of_r) * heads * KV_LORA_RANK].to_vec(),
            lse[r0 * heads..(r0 + rows_of_r) * heads].to_vec(),
            indices[r0 * k..(r0 + rows_of_r) * k].iter().map(|&v| if v < 0 { v } else { v - offset }).collect(),
        ))
    };
    let alone = run_with(&[target])?;
    let (mut bad, mut first_bad) = (0, None);
    for &n in sizes {
        let mut members: Vec<usize> = (0..n.min(case.batch)).filter(|&i| i != target).collect();
        members.insert(members.len() / 2, target);
        let got = run_with(&members)?;
        if let Some(what) = difference(&alone, &got) {
            bad += 1;
            first_bad.get_or_insert(format!("alone and in a batch of {n}: {what} differ"));
        }
    }
    Ok(Check {
        kernel: "layer: batch invariance".into(),
        case: format!("{} sizes {sizes:?}{}", case.describe(), if invariant { "" } else { " (option off)" }),
        items: sizes.len(),
        mismatches: bad,
        first_mismatch: first_bad,
    })
}

/// Context-parallel prefill (spec §4.7) simulated on one GPU: the extend batch of
/// `case` run whole, then as `cp_size` ranks, each with its round-robin share of
/// the query tokens (metadata with [`CpRank`](crate::metadata::CpRank)) and every
/// token's KV stored (all-gathered, as a CP rank receives it). The union of the
/// ranks' rows must equal the whole layer's bit for bit: out, lse, and the top-k
/// as positions. Batch-invariant layers, so row counts do not change the bits.
pub fn cp_union(rt: &Runtime, case: &LayerCase, cp_size: u32) -> Result<Check> {
    use crate::metadata::CpRank;
    let LayerMode::Extend { .. } = case.mode else {
        return Err(crate::Error::Other(format!("CP splits extend batches, not {}", case.mode.name())));
    };
    let (b, data, filled) = whole_batch(case);
    let mut cfg = LayerConfig::new(case.model.clone())?;
    cfg.batch_invariant = true;
    if let Some(budget) = case.logits_budget {
        cfg.logits_budget_bytes = budget;
    }
    let layer = NsaLayer::new(rt, cfg)?;
    let (heads, k) = (case.model.num_q_heads as usize, case.model.topk as usize);
    let t = data.tokens.len();
    let all: Vec<usize> = (0..t).collect();
    // Out, lse and positions of the top-k of the query tokens `owned` (global order).
    let run_rank = |cp: Option<CpRank>, owned: &[usize]| -> Result<StepResults> {
        let (md, dispatch) = metadata(rt, case, &b, cp)?;
        let plan = layer.plan(&md, &dispatch)?;
        let (out, lse, indices) = forward_rows(rt, &layer, &plan, &b, &data, &filled, owned, &all)?;
        // RAGGED indices are rows of this rank's ragged KV: back to positions.
        let ragged = plan.decisions().transform == crate::metadata::TransformMethod::Ragged;
        let ks = crate::layer::ragged_keys(&md)?.ks;
        let positions = indices
            .chunks(k)
            .zip(&ks)
            .flat_map(|(row, &start)| row.iter().map(move |&v| if ragged && v >= 0 { v - start } else { v }))
            .collect();
        Ok((out, lse, positions))
    };
    let whole = run_rank(None, &all)?;
    let (mut union_out, mut union_lse, mut union_idx) =
        (vec![0u16; whole.0.len()], vec![0u32; whole.1.len()], vec![0i32; whole.2.len()]);
    for rank in 0..cp_size {
        let owned: Vec<usize> = (rank as usize..t).step_by(cp_size as usize).collect();
        let (out, lse, idx) = run_rank(Some(CpRank::new(rank, cp_size)?), &owned)?;
        for (j, &g) in owned.iter().enumerate() {
            let (o, l) = (heads * KV_LORA_RANK, heads);
            union_out[g * o..(g + 1) * o].copy_from_slice(&out[j * o..(j + 1) * o]);
            union_lse[g * l..(g + 1) * l].copy_from_slice(&lse[j * l..(j + 1) * l]);
            union_idx[g * k..(g + 1) * k].copy_from_slice(&idx[j * k..(j + 1) * k]);
        }
    }
    let diff = difference(&whole, &(union_out, union_lse, union_idx));
    Ok(Check {
        kernel: "layer: CP union".into(),
        case: format!("{} cp {cp_size}", case.describe()),
        items: t,
        mismatches: usize::from(diff.is_some()),
        first_mismatch: diff.map(|what| format!("the ranks' union and the whole layer: {what} differ")),
    })
}

#[cfg(test)]
mod tests {
    use super::topk_within;

    #[test]
    fn topk_within_accepts_near_ties_and_rejects_a_clear_swap() {
        // Row max 100: f32 tolerance 2e-5 · 100 + 1e-6 ≈ 0.002 per key.
        let want = [(100.0, 0.0), (50.0, 0.0), (50.001, 0.0), (10.0, 0.0)];
        let pick = |p: [i32; 2]| p.map(Some);
        assert_eq!(topk_within(&want, &pick([0, 2]), false), None);
        assert_eq!(topk_within(&want, &pick([0, 1]), false), None, "0.001 apart: within both tolerances");
        let err = topk_within(&want, &pick([0, 3]), false).expect("10 chosen over 50");
        assert!(err.contains("unselected logit 50.001 beats selected 10"), "{err}");
        // A spread of 40_000 widens the warp-group allowance to ~19.5 per key.
        let wide = [(100.0, 0.0), (50.0, 40_000.0), (45.0, 40_000.0)];
        assert_eq!(topk_within(&wide, &pick([0, 2]), true), None);
        assert!(topk_within(&wide, &pick([0, 2]), false).is_some());
        assert!(topk_within(&want, &[Some(0), Some(0)], false).unwrap().contains("not a new position"));
    }
}
