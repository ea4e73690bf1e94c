//! `nsa bench`: KV store/dequant bandwidth beside a device copy of the same bytes,
//! and JIT latency (cold compile, disk-cache load, memory hit). Writes JSON.

use crate::shapes::parse_dims;
use clap::Args;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::{kernel_set, KvCacheFormat, NsaConfig, TopkScore};
use nsa_runtime::cache::{CacheConfig, JitPolicy, KernelCache};
use nsa_runtime::jit::nvrtc::NvrtcCompiler;
use nsa_runtime::ops::kv_cache::{self, MlaCacheMut};
use nsa_runtime::ops::topk::TopkScoreElem;
use nsa_runtime::ops::Rows;
use nsa_runtime::verify::{download, upload};
use nsa_runtime::{testdata, Error, Result, Runtime};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Token counts.
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384,65536,262144,1048576")]
    pub tokens: Vec<usize>,
    /// Timed repetitions per point (after 3 warm-up launches).
    #[arg(long, default_value_t = 50)]
    pub reps: usize,
    /// Write all results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Sparse-decode shapes as batch x s_q x heads (default: 1x1x128, 32x1x128,
    /// 128x1x128, 64x2x128, 128x1x64, 128x1x16, 1x1x16, 32x1x16).
    #[arg(long, value_delimiter = ',')]
    pub decode_shapes: Vec<String>,
    /// Sparse decode: also time every shape at each of these KV split counts
    /// (1..=32 at top-k 2048), beside the launcher's own choice.
    #[arg(long, value_delimiter = ',')]
    pub decode_splits: Vec<u32>,
    /// Top-k shapes as rows x keys per row (default: 64x131072, 1x131072, 2048x32768).
    #[arg(long, value_delimiter = ',')]
    pub topk_shapes: Vec<String>,
    /// Top-k: time only the plan `choose_plan` picks for each shape (default: every plan).
    #[arg(long)]
    pub topk_chosen_only: bool,
    /// Top-k PAGED in the prefill form: a shape's rows split evenly over this many
    /// requests, each request's rows translated through its one page-table row (as
    /// in extend/prefill). Default: the decode form, a table row per score row.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub topk_paged_requests: Option<u32>,
    /// Top-k PAGED: the page sizes to time, each a row of its own: 1 reads a
    /// page_table_1 (an entry per position), P > 1 a table of page ids (an entry per
    /// P positions, as the KV cache's page table), e.g. `1,64`; up to 65536, as
    /// the launcher.
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub topk_page_sizes: Vec<u32>,
    /// Top-k score types to time, each over the same values (bf16: rounded): f32,
    /// bf16, or both (`f32,bf16`).
    #[arg(long, value_delimiter = ',', default_value = "f32", value_parser = parse_topk_score)]
    pub topk_scores: Vec<TopkScore>,
    /// Top-k score values: uniform in [0, 1) (as torch_topk.py's rows; the top keys
    /// share one octave), N(0, 1) (the top keys cross powers of two, as spread
    /// logits do), or indexer: the logits the indexer kernel computes from queries
    /// and keys drawn around shared topics (`testdata::indexer_topics`), clustered
    /// as a model's (keys per row a multiple of 64).
    #[arg(long, value_enum, default_value_t = TopkValues::Uniform)]
    pub topk_values: TopkValues,
    /// Top-k: also write each shape's scores here, as `topk_<values>_<rows>x<keys>.f32`
    /// (little-endian f32, row-major), so peers can be timed on the same rows
    /// (`.ci/bench/peers_topk_values.py`).
    #[arg(long)]
    pub topk_dump: Option<std::path::PathBuf>,
    /// Launch every kernel without programmatic dependent launch (on by default on
    /// NVIDIA: each launch starts while the previous kernel runs and waits on the
    /// device until it is done), to compare.
    #[arg(long)]
    pub no_pdl: bool,
    /// Sparse decode: every request draws from the same 16K slots (an L2-resident
    /// working set; separates gather latency from compute).
    #[arg(long)]
    pub decode_shared_keys: bool,
    /// Sparse prefill: KV rows the indices draw from (32768 by default; fewer make
    /// the gathered rows L2-resident, which separates L2 misses from the gather rate).
    /// At least the top-k (each query draws that many distinct rows); at most 2^31 - 1.
    #[arg(long, default_value_t = crate::bench_prefill::DEFAULT_S_KV,
          value_parser = clap::value_parser!(u64).range(crate::bench_prefill::TOPK as u64..=i32::MAX as u64))]
    pub prefill_s_kv: u64,
    /// Sparse prefill: the kernel of the shapes with a warp-group kernel (sm_90a, 17+
    /// heads): standard, or pairs (its two consumer groups on alternate blocks), to
    /// compare the two
    #[arg(long, default_value = "standard")]
    pub prefill_kernel: nsa_runtime::ops::sparse_prefill::PrefillKernel,
    /// Which benchmarks: kv (store/dequant + JIT), topk, metadata, plan (eager plans
    /// and steps with host- or device-built metadata), decode, prefill (sparse),
    /// dense (causal varlen MHA, 2K-token requests), indexer, host
    /// (the host cost of one call of each op), layer (whole-layer steps: decode,
    /// verify, FP8 extend under the reference's rule and nsa's costs), or all.
    #[arg(long, value_enum, default_value_t = Suite::All)]
    pub suite: Suite,
    /// Layer suite: only the short prompts (16 × 1K tokens at 128 and 16 heads), as
    /// sparse MLA and as MHA one-shot.
    #[arg(long, conflicts_with = "layer_decode_only")]
    pub layer_short_prompts_only: bool,
    /// Layer suite: only the decode and MTP-verify steps (no extend, no MHA one-shot).
    #[arg(long)]
    pub layer_decode_only: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Suite {
    Kv,
    Topk,
    Metadata,
    Plan,
    Decode,
    Prefill,
    Dense,
    Indexer,
    Host,
    Layer,
    All,
}

/// The distribution the top-k bench draws its scores from (`--topk-values`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TopkValues {
    Uniform,
    Gaussian,
    Indexer,
}

impl TopkValues {
    fn tag(self) -> &'static str {
        match self {
            TopkValues::Uniform => "uniform",
            TopkValues::Gaussian => "gaussian",
            TopkValues::Indexer => "indexer",
        }
    }
}

/// What the timed top-k rows hold: the score types (bf16: the same values rounded)
/// and the values' distribution.
struct TopkData<'a> {
    scores: &'a [TopkScore],
    distribution: TopkValues,
    /// Where to write each shape's scores (`--topk-dump`).
    dump: Option<&'a std::path::Path>,
}

#[derive(Serialize, Debug)]
struct MetadataRow {
    what: String,
    /// Host builds: mean wall time per build; device replay: event time per launch.
    us: f64,
}

#[derive(Serialize, Debug)]
struct TopkRow {
    rows: usize,
    n: usize,
    k: u32,
    /// The scores' type: f32 or bf16.
    score: &'static str,
    /// The scores' distribution: uniform or gaussian.
    values: &'static str,
    transform: String,
    layout: String,
    /// Whether `choose_plan` picks this row's plan for the shape.
    chosen: bool,
    us: f64,
    /// Host time to enqueue one launch (see `LaunchTiming`).
    host_us: f64,
    /// PAGED in the prefill form: the requests sharing the rows (None: decode form).
    paged_requests: Option<usize>,
    /// PAGED: positions per page-table entry (1: page_table_1); None otherwise.
    page_size: Option<usize>,
    /// Score bytes read once, per µs.
    gbps: f64,
    /// PAGED: bytes of the distinct 32-byte page-table sectors the output's slots
    /// were read from (0 otherwise): reads any exact PAGED top-k must make.
    table_bytes: usize,
    /// Time to read the scores, and PAGED's table sectors, once at the copy rate
    /// measured in this run.
    roofline_us: f64,
}

#[derive(Serialize, Debug)]
struct BandwidthRow {
    kernel: &'static str,
    tokens: usize,
    bytes: usize,
    us: f64,
    gbps: f64,
    copy_us: f64,
    copy_gbps: f64,
    fraction_of_copy: f64,
}

#[derive(Serialize, Debug)]
struct JitRow {
    id: String,
    cold_compile_ms: f64,
}

#[derive(Serialize, Debug)]
struct Report {
    device: String,
    date_utc: String,
    /// Programmatic dependent launch on (the default on NVIDIA; `--no-pdl` or `NSA_PDL=0`: off).
    pdl: bool,
    topk: Vec<TopkRow>,
    decode: Vec<crate::bench_decode::DecodeRow>,
    prefill: Vec<crate::bench_prefill::PrefillRow>,
    dense: Vec<crate::bench_dense::DenseRow>,
    indexer: Vec<crate::bench_indexer::IndexerRow>,
    metadata: Vec<MetadataRow>,
    plans: Vec<crate::bench_plan::PlanRow>,
    steps: Vec<crate::bench_plan::StepRow>,
    host: Vec<crate::bench_host::HostRow>,
    layer: Vec<crate::bench_layer::LayerRow>,
    bandwidth: Vec<BandwidthRow>,
    jit_cold: Vec<JitRow>,
    jit_disk_load_total_ms: f64,
    jit_disk_load_kernels: usize,
    jit_memory_hit_ns: f64,
}

/// Average µs per launch of `f` over `reps`, timed with events on `stream`.
pub(crate) fn time_us(stream: &Arc<CudaStream>, reps: usize, f: impl FnMut() -> Result<()>) -> Result<f64> {
    Ok(time_launches(stream, reps, f)?.gpu_us)
}

/// Per-launch times of a benchmark loop.
pub(crate) struct LaunchTiming {
    /// Between events around the loop on the stream.
    pub gpu_us: f64,
    /// Host wall time to enqueue the loop: when it reaches `gpu_us`, the launches
    /// cannot come faster than the host issues them, and `gpu_us` measures the host.
    pub host_us: f64,
}

/// `time_us` plus the host's enqueue time per launch.
pub(crate) fn time_launches(
    stream: &Arc<CudaStream>,
    reps: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<LaunchTiming> {
    for _ in 0..3 {
        f()?;
    }
    let ev = |s: &Arc<CudaStream>| {
        s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(Error::driver("recording an event"))
    };
    let start = ev(stream)?;
    let host = std::time::Instant::now();
    for _ in 0..reps {
        f()?;
    }
    let host_us = host.elapsed().as_secs_f64() * 1e6 / reps as f64;
    let end = ev(stream)?;
    end.synchronize().map_err(Error::driver("waiting for the benchmark"))?;
    let ms = start.elapsed_ms(&end).map_err(Error::driver("reading event time"))?;
    Ok(LaunchTiming { gpu_us: ms as f64 * 1e3 / reps as f64, host_us })
}

/// A device-to-device copy moving `bytes` in total (read + write), in µs.
/// The device-to-device copy rate (GB/s, read + write) over 512 MiB: the HBM roof
/// the sparse-attention tables compare against.
pub(crate) fn copy_gbps(stream: &Arc<CudaStream>) -> Result<f64> {
    let bytes = 512 << 20;
    Ok(bytes as f64 / copy_us(stream, bytes, 20)? / 1e3)
}

pub(crate) fn copy_us(stream: &Arc<CudaStream>, bytes: usize, reps: usize) -> Result<f64> {
    let half = bytes / 2;
    let src: CudaSlice<u8> = stream.alloc_zeros(half).map_err(Error::driver("allocating copy source"))?;
    let mut dst: CudaSlice<u8> = stream.alloc_zeros(half).map_err(Error::driver("allocating copy target"))?;
    time_us(stream, reps, || stream.memcpy_dtod(&src, &mut dst).map_err(Error::driver("copying")))
}

/// Realistic slots: page order shuffled, tokens in order within a page.
fn paged_slots(n: usize) -> Vec<i32> {
    let pages = n.div_ceil(64);
    let order = testdata::distinct_slots(pages, pages, 7);
    (0..n).map(|t| order[t / 64] * 64 + (t % 64) as i32).collect()
}

/// `n` rows of a 4096-row pattern (generating 1M adversarial rows would take longer than the run).
fn tiled<T: Copy>(base: &[T], row: usize, n: usize) -> Vec<T> {
    base.chunks(row).cycle().take(n).flatten().copied().collect()
}

fn bandwidth(rt: &Runtime, tokens: &[usize], reps: usize) -> Result<Vec<BandwidthRow>> {
    let stream = rt.gpu().stream().clone();
    let mla = testdata::mla_rows(4096, 1);
    let idx_keys = testdata::indexer_rows(4096, 2);
    let mut rows = Vec::new();
    for &n in tokens {
        let d_rows = upload(&stream, &tiled(&mla, BF16_TOKEN_ELEMS, n))?;
        let d_keys = upload(&stream, &tiled(&idx_keys, INDEXER_HEAD_DIM, n))?;
        let d_loc = upload(&stream, &paged_slots(n))?;
        let pages = n.div_ceil(64);
        let mut fp8: CudaSlice<u8> =
            stream.alloc_zeros(pages * 64 * FP8_TOKEN_BYTES).map_err(Error::driver("alloc"))?;
        let mut b16: CudaSlice<bf16> =
            stream.alloc_zeros(pages * 64 * BF16_TOKEN_ELEMS).map_err(Error::driver("alloc"))?;
        let mut idx_cache: CudaSlice<u8> =
            stream.alloc_zeros(pages * INDEXER_PAGE_BYTES).map_err(Error::driver("alloc"))?;
        let mut deq: CudaSlice<bf16> = stream.alloc_zeros(n * BF16_TOKEN_ELEMS).map_err(Error::driver("alloc"))?;
        let nope = Rows { data: d_rows.slice(0..), count: n, width: KV_LORA_RANK, stride: BF16_TOKEN_ELEMS };
        let rope = Rows { data: d_rows.slice(KV_LORA_RANK..), count: n, width: ROPE_DIM, stride: BF16_TOKEN_ELEMS };
        let keys = Rows { data: d_keys.slice(0..), count: n, width: INDEXER_HEAD_DIM, stride: INDEXER_HEAD_DIM };
        let loc = d_loc.slice(0..n);
        let input = 2 * BF16_TOKEN_ELEMS + 4;
        let cases: [(&'static str, usize); 4] = [
            ("kv_store.fp8_656", n * (input + FP8_TOKEN_BYTES)),
            ("kv_store.bf16_576", n * (input + 2 * BF16_TOKEN_ELEMS)),
            ("kv_dequant.fp8_656", n * (4 + FP8_TOKEN_BYTES + 2 * BF16_TOKEN_ELEMS)),
            ("indexer_k_store.fp8_132", n * (2 * INDEXER_HEAD_DIM + 4 + INDEXER_TOKEN_BYTES)),
        ];
        for (kernel, bytes) in cases {
            let us = match kernel {
                "kv_store.fp8_656" => time_us(&stream, reps, || {
                    kv_cache::store_mla(rt, &nope, &rope, &loc, &mut MlaCacheMut::Fp8(fp8.slice_mut(0..)))
                })?,
                "kv_store.bf16_576" => time_us(&stream, reps, || {
                    kv_cache::store_mla(rt, &nope, &rope, &loc, &mut MlaCacheMut::Bf16(b16.slice_mut(0..)))
                })?,
                "kv_dequant.fp8_656" => time_us(&stream, reps, || {
                    kv_cache::dequant_fp8(rt, &fp8.slice(0..), &loc, &mut deq.slice_mut(0..))
                })?,
                _ => time_us(&stream, reps, || {
                    kv_cache::store_indexer_k(rt, &keys, &loc, &mut idx_cache.slice_mut(0..))
                })?,
            };
            let copy = copy_us(&stream, bytes, reps)?;
            let gbps = bytes as f64 / us / 1e3;
            let copy_gbps = bytes as f64 / copy / 1e3;
            let row = BandwidthRow {
                kernel,
                tokens: n,
                bytes,
                us,
                gbps,
                copy_us: copy,
                copy_gbps,
                fraction_of_copy: gbps / copy_gbps,
            };
            println!(
                "{:<26} {:>8} tokens {:>10.2} µs {:>7.0} GB/s | copy {:>9.2} µs {:>7.0} GB/s | {:>5.1}% of copy",
                row.kernel,
                n,
                us,
                gbps,
                copy,
                copy_gbps,
                100.0 * row.fraction_of_copy
            );
            rows.push(row);
        }
    }
    Ok(rows)
}

fn jit(rt: &Runtime) -> Result<(Vec<JitRow>, f64, usize, f64)> {
    let cfg = NsaConfig::preset("deepseek-v3.2")?;
    let mut cfg_all = cfg.clone();
    cfg_all.kv_cache = KvCacheFormat::Bf16;
    let mut specs = kernel_set(&cfg);
    specs.extend(kernel_set(&cfg_all));
    specs.sort();
    specs.dedup();
    let dir = tempfile::tempdir().map_err(Error::io(std::env::temp_dir()))?;
    let compiler = Arc::new(NvrtcCompiler::new()?);
    let cold = KernelCache::new(compiler.clone(), CacheConfig::at(dir.path()));
    let mut rows = Vec::new();
    for spec in &specs {
        let t = Instant::now();
        cold.get(spec)?;
        rows.push(JitRow { id: spec.id(), cold_compile_ms: t.elapsed().as_secs_f64() * 1e3 });
    }
    // A new process's view: fresh memory layer, same disk, compiling forbidden.
    let warm = KernelCache::new(compiler, CacheConfig::at(dir.path()).with_jit(JitPolicy::Off));
    let t = Instant::now();
    for spec in &specs {
        warm.get(spec)?;
    }
    let disk_ms = t.elapsed().as_secs_f64() * 1e3;
    let spec = specs[0];
    let iters = 1_000_000;
    let t = Instant::now();
    for _ in 0..iters {
        std::hint::black_box(warm.get(std::hint::black_box(&spec))?);
    }
    let hit_ns = t.elapsed().as_secs_f64() * 1e9 / iters as f64;
    let _ = rt;
    Ok((rows, disk_ms, specs.len(), hit_ns))
}

/// Default top-k shapes (rows, keys per row): decode rows over long contexts, one
/// row, and a prefill chunk.
const TOPK_DEFAULT_SHAPES: [(usize, usize); 3] = [(64, 131_072), (1, 131_072), (2048, 32_768)];

/// The cases of `--topk-shapes` (the default shapes when none are given): at most
/// 2^31 - 1 scores in all, since the bench's page table numbers them in i32.
fn topk_cases(shapes: &[String]) -> Result<Vec<(usize, usize)>> {
    if shapes.is_empty() {
        return Ok(TOPK_DEFAULT_SHAPES.to_vec());
    }
    let case = |s: &String| {
        let [rows, n] = parse_dims::<2>("--topk-shapes", s, "rows x keys", "64x131072")?;
        if rows.checked_mul(n).is_none_or(|e| e > i32::MAX as usize) {
            return Err(Error::InvalidArgument {
                field: "--topk-shapes",
                value: format!("`{s}`"),
                expected: "at most 2^31 - 1 scores in all (the bench numbers them in i32)".into(),
            });
        }
        Ok((rows, n))
    };
    shapes.iter().map(case).collect()
}

/// `cu_seqlens_q` splitting `rows` score rows over `requests` requests as evenly as
/// possible (the first `rows % requests` take one row more).
fn even_cu_seqlens(rows: usize, requests: usize) -> Vec<i32> {
    let (per, extra) = (rows / requests, rows % requests);
    let mut cu = vec![0i32];
    for i in 0..requests {
        cu.push(cu[i] + (per + usize::from(i < extra)) as i32);
    }
    cu
}

/// `--topk-paged-requests` against every shape, before any data is made: at most one
/// request per score row.
fn check_paged_requests(cases: &[(usize, usize)], paged_requests: Option<usize>) -> Result<()> {
    let Some(r) = paged_requests else { return Ok(()) };
    match cases.iter().find(|&&(rows, _)| r > rows) {
        Some(&(rows, n)) => Err(Error::InvalidArgument {
            field: "--topk-paged-requests",
            value: r.to_string(),
            expected: format!(
                "at most one request per row: at most {rows} for the {rows}x{n} shape (or leave that shape out of \
                 --topk-shapes)"
            ),
        }),
        None => Ok(()),
    }
}

/// Top-k (k = 2048) of random scores (`data`) over every transform and shape, on
/// every plan `choose_plan` can return (or only the one it picks), for each score
/// type. PAGED takes the decode form (a table row per score row) or, with
/// `paged_requests`, the prefill form.
fn topk_bench(
    rt: &Runtime,
    reps: usize,
    cases: &[(usize, usize)],
    chosen_only: bool,
    paged_requests: Option<usize>,
    page_sizes: &[usize],
    data: TopkData<'_>,
) -> Result<Vec<TopkRow>> {
    check_paged_requests(cases, paged_requests)?;
    let stream = rt.gpu().stream().clone();
    let copy_gbps = {
        let bytes = 512 << 20;
        bytes as f64 / copy_us(&stream, bytes, 20)? / 1e3
    };
    let mut out_rows = Vec::new();
    for &(rows, n) in cases {
        let mut rng = testdata::rng(rows as u64 ^ n as u64);
        let values: Vec<f32> = match data.distribution {
            TopkValues::Uniform => (0..rows * n).map(|_| rand::Rng::random::<f32>(&mut rng)).collect(),
            TopkValues::Gaussian => testdata::score_row(testdata::ScorePattern::Gaussian, rows * n, &mut rng),
            TopkValues::Indexer => crate::bench_indexer::structured_logits(rt, rows, n, rows as u64 ^ n as u64)?,
        };
        if let Some(dir) = data.dump {
            dump_scores(dir, data.distribution, rows, n, &values)?;
        }
        let distribution = data.distribution;
        let shape = TopkShape { rows, n, reps, chosen_only, paged_requests, page_sizes, distribution, copy_gbps };
        for &score in data.scores {
            match score {
                TopkScore::F32 => out_rows.extend(topk_bench_shape(rt, &shape, &values)?),
                TopkScore::Bf16 => {
                    let values: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
                    out_rows.extend(topk_bench_shape(rt, &shape, &values)?)
                }
            }
        }
    }
    Ok(out_rows)
}

/// Writes one shape's scores for the peers' script: `dir/topk_<values>_<rows>x<n>.f32`.
fn dump_scores(dir: &std::path::Path, values: TopkValues, rows: usize, n: usize, scores: &[f32]) -> Result<()> {
    let path = dir.join(format!("topk_{}_{rows}x{n}.f32", values.tag()));
    let io = |source| Error::Io { path: path.clone(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    let bytes: Vec<u8> = scores.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&path, bytes).map_err(io)
}

/// Bytes of the distinct 32-byte page-table sectors that PAGED `slots` were read
/// from. The bench's page table maps entry i to page (or slot) i, so a slot over the
/// page size is the index of the table entry it came from; −1 (padding) reads
/// nothing.
fn table_sector_bytes(slots: &[i32], page_size: usize) -> usize {
    const SECTOR_BYTES: usize = 32;
    const ENTRIES_PER_SECTOR: i32 = (SECTOR_BYTES / std::mem::size_of::<i32>()) as i32;
    let page = page_size as i32;
    let mut sectors: Vec<i32> = slots.iter().filter(|&&s| s >= 0).map(|&s| s / page / ENTRIES_PER_SECTOR).collect();
    sectors.sort_unstable();
    sectors.dedup();
    sectors.len() * SECTOR_BYTES
}

/// `--topk-scores` values: what `TopkScore::from_str` takes (its error names them).
fn parse_topk_score(s: &str) -> std::result::Result<TopkScore, String> {
    s.parse()
}

/// One top-k bench shape and how to run it.
struct TopkShape<'a> {
    rows: usize,
    n: usize,
    reps: usize,
    chosen_only: bool,
    paged_requests: Option<usize>,
    page_sizes: &'a [usize],
    distribution: TopkValues,
    /// The copy rate measured in this run (the roofline).
    copy_gbps: f64,
}

/// [`topk_bench`] of one shape over `values` (`rows × n` scores of type `T`).
fn topk_bench_shape<T: TopkScoreElem>(rt: &Runtime, shape: &TopkShape<'_>, values: &[T]) -> Result<Vec<TopkRow>> {
    use nsa_kernels::{TopkLayout, TopkTransform};
    use nsa_runtime::ops::topk::{
        choose_plan, cluster_size, split_list_suffices, split_plan, topk_with_plan, PageTable, TopkOutput, TopkPlan,
        TopkScores, TopkWorkspace,
    };
    let &TopkShape { rows, n, reps, chosen_only, paged_requests, page_sizes, distribution, copy_gbps } = shape;
    let stream = rt.gpu().stream().clone();
    let k = 2048u32;
    let d_scores = upload(&stream, values)?;
    let d_lengths = upload(&stream, &vec![n as i32; rows])?;
    let table_rows = paged_requests.unwrap_or(rows);
    // Entry i holds page (or slot) i; a table of pages has one entry per page_size
    // positions, so the page_table_1's entries cover every table.
    let d_table = upload(&stream, &(0..(table_rows * n) as i32).collect::<Vec<_>>())?;
    // The prefill form's cu_seqlens_q (none in the decode form).
    let d_cu = paged_requests.map(|r| upload(&stream, &even_cu_seqlens(rows, r))).transpose()?;
    let cu_view = d_cu.as_ref().map(|cu| cu.slice(0..));
    let d_offsets = upload(&stream, &vec![17i32; rows])?;
    let mut d_out: CudaSlice<i32> = stream.alloc_zeros(rows * k as usize).map_err(Error::driver("alloc"))?;
    let (sv, lv, tv, ov) = (d_scores.slice(0..), d_lengths.slice(0..), d_table.slice(0..), d_offsets.slice(0..));
    let input = TopkScores { scores: &sv, row_stride: n, row_capacity: n, lengths: &lv, row_starts: None };
    let sms = rt.gpu().caps().sm_count;
    let clusters = rt.target().has_clusters();
    let chosen = choose_plan(rows, n, sms, false, split_list_suffices(rt.target(), k, n), clusters).0;
    // Every plan: both single-block layouts, the split path (with the chunks the
    // plan would give it), the cluster path where the target has clusters.
    let mut plans =
        vec![TopkPlan::Single(TopkLayout::Latency), TopkPlan::Single(TopkLayout::Throughput), split_plan(rows, n, sms)];
    if clusters {
        plans.push(TopkPlan::Cluster { size: cluster_size(rows, sms) });
    }
    if chosen_only {
        plans = vec![chosen];
    }
    let mut ws = TopkWorkspace::new(rt, rows)?;
    let mut out_rows = Vec::new();
    // Each transform, PAGED once per page size (with its page size).
    let transforms = TopkTransform::ALL.into_iter().flat_map(|t| match t {
        TopkTransform::Paged => page_sizes.iter().map(|&p| TopkTransform::paged(p as u32)).collect(),
        _ => vec![t],
    });
    let variants: Vec<_> = transforms.flat_map(|t| plans.iter().map(move |&p| (t, p))).collect();
    for (transform, plan) in variants {
        let page_size = transform.page_size().map(|p| p as usize);
        let output = match (transform, page_size) {
            (TopkTransform::Ragged, _) => TopkOutput::Ragged { offsets: &ov },
            (_, None) => TopkOutput::Plain,
            (_, Some(page_size)) => {
                let width = n.div_ceil(page_size);
                let (cu_seqlens_q, rows) = (cu_view.as_ref(), table_rows);
                TopkOutput::Paged(PageTable { table: &tv, rows, stride: width, width, page_size, cu_seqlens_q })
            }
        };
        let timing = time_launches(&stream, reps, || {
            topk_with_plan(rt, k, false, plan, &input, &output, &mut d_out.slice_mut(0..), Some(&mut ws))
        })?;
        let (us, host_us) = (timing.gpu_us, timing.host_us);
        let bytes = (rows * n * T::SCORE.bytes()) as f64;
        let table_bytes = match page_size {
            Some(p) => table_sector_bytes(&download(&stream, &d_out, rows * k as usize)?, p),
            None => 0,
        };
        let row = TopkRow {
            rows,
            n,
            k,
            score: T::SCORE.tag(),
            values: distribution.tag(),
            // PAGED over pages of P: `pagesP` (the kernel's transform).
            transform: transform.tag(),
            layout: match plan {
                TopkPlan::Single(TopkLayout::Latency) => "latency".into(),
                TopkPlan::Single(TopkLayout::Throughput) => "throughput".into(),
                TopkPlan::Split { chunks, .. } => format!("split{chunks}"),
                TopkPlan::Cluster { size } => format!("cluster{size}"),
            },
            chosen: plan == chosen,
            us,
            host_us,
            paged_requests: paged_requests.filter(|_| transform.is_paged()),
            page_size,
            gbps: bytes / us / 1e3,
            table_bytes,
            roofline_us: (bytes + table_bytes as f64) / copy_gbps / 1e3,
        };
        println!(
            "topk k{k} {:<4} {:<7} {:<10} {rows:>5} rows × {n:>7}: {us:>9.2} µs  {:>6.0} GB/s  (read-once roofline {:.2} µs at {copy_gbps:.0} GB/s{}; host {host_us:.2} µs a launch{}){}{}{}",
            row.score,
            row.transform,
            row.layout,
            row.gbps,
            row.roofline_us,
            if table_bytes > 0 { format!(", {:.1} MB of it table sectors", table_bytes as f64 / 1e6) } else { String::new() },
            // Within 10% of the stream time: the host may be what is timed.
            if host_us >= 0.9 * us { ", host-bound" } else { "" },
            row.paged_requests.map(|r| format!("  [prefill form: {r} requests]")).unwrap_or_default(),
            if distribution == TopkValues::Uniform { String::new() } else { format!("  [{} values]", row.values) },
            if row.chosen { "  <- plan" } else { "" }
        );
        out_rows.push(row);
    }
    Ok(out_rows)
}

/// Host metadata builds (decode at several batch sizes, a 64 × 2K-token prefill)
/// and the device decode replay at bs 256, all with a 16K-token context table.
fn metadata_bench(rt: &Runtime, reps: usize) -> Result<Vec<MetadataRow>> {
    use nsa_runtime::metadata::graph_device::{DeviceGraphState, DeviceRequests};
    use nsa_runtime::metadata::{
        ExtendBatch, ExtendPlan, GraphCapacity, GraphMode, MetadataBuilder, MetadataParams, ReqToToken, Requests,
    };
    let width = 16_384usize;
    let mut rows = Vec::new();
    let mut rng = testdata::rng(3);
    let params =
        |bs: usize| MetadataParams { page_size: 64, topk: 2048, draft_tokens: 1, pool_slots: bs * width, cp: None };
    let host_iters = 2000;
    for bs in [1usize, 32, 256, 1024] {
        let table_data: Vec<i32> = (0..(bs * width) as i32).collect();
        let table = ReqToToken::new(&table_data, width)?;
        let pool: Vec<i32> = (0..bs as i32).collect();
        let seq: Vec<i32> = (0..bs).map(|_| rand::Rng::random_range(&mut rng, 1..width as i32)).collect();
        let reqs = Requests { req_pool_indices: &pool, seq_lens: &seq };
        let builder = MetadataBuilder::new(params(bs))?;
        let mut md = builder.decode(&table, reqs)?;
        let t = Instant::now();
        for _ in 0..host_iters {
            builder.decode_into(&mut md, &table, reqs)?;
            std::hint::black_box(&md);
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / host_iters as f64;
        println!("metadata host decode build, bs {bs:>5}: {us:>9.2} µs");
        rows.push(MetadataRow { what: format!("host decode bs={bs}"), us });
    }
    {
        let (bs, len) = (64usize, 2048i32);
        let table_data: Vec<i32> = (0..(bs * width) as i32).collect();
        let table = ReqToToken::new(&table_data, width)?;
        let pool: Vec<i32> = (0..bs as i32).collect();
        let seq = vec![len; bs];
        let builder = MetadataBuilder::new(params(bs))?;
        let iters = 200;
        let t = Instant::now();
        for _ in 0..iters {
            std::hint::black_box(builder.extend(
                &table,
                ExtendBatch::without_prefix(&pool, &seq),
                ExtendPlan::default(),
            )?);
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        println!("metadata host extend build, 64 requests x 2048 tokens: {us:>9.2} µs");
        rows.push(MetadataRow { what: "host extend 64x2048".into(), us });
    }
    {
        let bs = 256usize;
        let stream = rt.gpu().stream().clone();
        let table_data: Vec<i32> = (0..(bs * width) as i32).collect();
        let seq: Vec<i32> = (0..bs).map(|_| rand::Rng::random_range(&mut rng, 1..width as i32)).collect();
        let pool: Vec<i32> = (0..bs as i32).collect();
        let (d_table, d_seq, d_pool) = (upload(&stream, &table_data)?, upload(&stream, &seq)?, upload(&stream, &pool)?);
        let cap = GraphCapacity { max_bs: bs, max_tokens: bs, max_context_len: width };
        let mut state = DeviceGraphState::new(rt, params(bs), GraphMode::Decode, cap)?;
        let (tv, sv, pv) = (d_table.slice(0..), d_seq.slice(0..), d_pool.slice(0..));
        state.capture(rt, &sv)?;
        let reqs =
            DeviceRequests { req_to_token: &tv, req_to_token_width: width, req_pool_indices: &pv, seq_lens: &sv };
        let before = state.launches();
        let us = time_us(&stream, reps, || state.replay_decode(rt, &reqs))?;
        let per_step = (state.launches() - before) as f64 / (reps + 3) as f64;
        println!("metadata device decode replay, bs 256: {us:>9.2} µs per step, {per_step} launch(es) per step");
        rows.push(MetadataRow { what: format!("device decode replay bs=256 ({per_step} launches/step)"), us });
        // The host side of a device-built decode step: checks + one launch (the
        // eager path through NsaLayer::plan_for_graph needs nothing else). Fewer
        // launches than the driver's queue holds, so enqueueing never blocks.
        stream.synchronize().map_err(Error::driver("waiting for the replays"))?;
        let launches = 100;
        let t = Instant::now();
        for _ in 0..launches {
            state.replay_decode(rt, &reqs)?;
        }
        let host_us = t.elapsed().as_secs_f64() * 1e6 / launches as f64;
        stream.synchronize().map_err(Error::driver("waiting for the replays"))?;
        println!("metadata device decode build, bs 256: {host_us:>9.2} µs of host time per step (enqueue)");
        rows.push(MetadataRow { what: "device decode build bs=256, host time".into(), us: host_us });
    }
    Ok(rows)
}

pub fn run(args: BenchArgs) -> Result<()> {
    // Bad shapes fail before the device is touched.
    let topk_cases = topk_cases(&args.topk_shapes)?;
    let decode_cases = crate::bench_decode::decode_cases(&args.decode_shapes)?;
    let mut rt = Runtime::new(0)?;
    if args.no_pdl {
        rt.set_pdl(false)?;
    }
    let device = format!("{} ({} SMs)", rt.gpu().caps().name, rt.gpu().caps().sm_count);
    println!("bench on {device}{}", if rt.pdl() { ", PDL launches" } else { ", no PDL" });
    let want = |s: Suite| args.suite == s || args.suite == Suite::All;
    let topk = if want(Suite::Topk) {
        let requests = args.topk_paged_requests.map(|r| r as usize);
        let page_sizes: Vec<usize> = args.topk_page_sizes.iter().map(|&p| p as usize).collect();
        let data =
            TopkData { scores: &args.topk_scores, distribution: args.topk_values, dump: args.topk_dump.as_deref() };
        topk_bench(&rt, args.reps, &topk_cases, args.topk_chosen_only, requests, &page_sizes, data)?
    } else {
        vec![]
    };
    let decode = if want(Suite::Decode) {
        crate::bench_decode::decode_bench(&rt, args.reps, &decode_cases, args.decode_shared_keys, &args.decode_splits)?
    } else {
        vec![]
    };
    let prefill = if want(Suite::Prefill) {
        crate::bench_prefill::prefill_bench(&rt, args.reps.min(20), args.prefill_s_kv as usize, args.prefill_kernel)?
    } else {
        vec![]
    };
    let dense = if want(Suite::Dense) { crate::bench_dense::dense_bench(&rt, args.reps.min(20))? } else { vec![] };
    let indexer = if want(Suite::Indexer) { crate::bench_indexer::indexer_bench(&rt, args.reps)? } else { vec![] };
    let metadata = if want(Suite::Metadata) { metadata_bench(&rt, args.reps)? } else { vec![] };
    let (plans, steps) = if want(Suite::Plan) { crate::bench_plan::plan_bench(&rt)? } else { (vec![], vec![]) };
    let host = if want(Suite::Host) { crate::bench_host::host_bench(&rt)? } else { vec![] };
    let layer = if want(Suite::Layer) {
        crate::bench_layer::layer_bench(&rt, args.reps.min(20), args.layer_short_prompts_only, args.layer_decode_only)?
    } else {
        vec![]
    };
    let bandwidth = if want(Suite::Kv) { bandwidth(&rt, &args.tokens, args.reps)? } else { vec![] };
    let (jit_cold, disk_ms, kernels, hit_ns) = if want(Suite::Kv) { jit(&rt)? } else { (vec![], 0.0, 0, 0.0) };
    for r in &jit_cold {
        println!("cold compile {:<40} {:>8.1} ms", r.id, r.cold_compile_ms);
    }
    if want(Suite::Kv) {
        println!("disk-cache load of {kernels} kernels: {disk_ms:.2} ms total; memory hit: {hit_ns:.1} ns");
    }
    let date_utc = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let report = Report {
        device,
        date_utc,
        pdl: rt.pdl(),
        topk,
        decode,
        prefill,
        dense,
        indexer,
        metadata,
        plans,
        steps,
        host,
        layer,
        bandwidth,
        jit_cold,
        jit_disk_load_total_ms: disk_ms,
        jit_disk_load_kernels: kernels,
        jit_memory_hit_ns: hit_ns,
    };
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| Error::Other(e.to_string()))?;
        std::fs::write(&path, text).map_err(Error::io(&path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{table_sector_bytes, BenchArgs, TopkScore};
    use clap::{Args, Command, FromArgMatches};

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        let cmd = BenchArgs::augment_args(Command::new("bench"));
        BenchArgs::from_arg_matches(&cmd.try_get_matches_from(args)?)
    }

    #[test]
    fn table_sectors_count_each_32_byte_sector_once_and_skip_padding() {
        // Entries 0..8 share sector 0; 8 and 15 share sector 1; 16 is sector 2.
        assert_eq!(table_sector_bytes(&[0, 7, 3, 8, 15, 16, -1, -1], 1), 3 * 32);
        assert_eq!(table_sector_bytes(&[-1, -1], 1), 0);
        assert_eq!(table_sector_bytes(&[], 1), 0);
        // Pages of 64: slots 0..512 come from entries 0..8, sector 0; 512 from sector 1.
        assert_eq!(table_sector_bytes(&[0, 63, 64, 511, 512, -1], 64), 2 * 32);
    }

    #[test]
    fn topk_page_sizes_default_to_the_page_table_1_and_take_a_list() {
        assert_eq!(parse(&["bench"]).unwrap().topk_page_sizes, vec![1]);
        assert_eq!(parse(&["bench", "--topk-page-sizes", "1,64"]).unwrap().topk_page_sizes, vec![1, 64]);
        let err = parse(&["bench", "--topk-page-sizes", "0"]).unwrap_err().to_string();
        assert!(err.contains("--topk-page-sizes") && err.contains('0') && err.contains("1..=65536"), "{err}");
        assert!(parse(&["bench", "--topk-page-sizes", "65537"]).is_err());
    }

    #[test]
    fn topk_scores_default_to_f32_and_take_a_list() {
        assert_eq!(parse(&["bench"]).unwrap().topk_scores, vec![TopkScore::F32]);
        let both = parse(&["bench", "--topk-scores", "f32,bf16"]).unwrap().topk_scores;
        assert_eq!(both, vec![TopkScore::F32, TopkScore::Bf16]);
        let err = parse(&["bench", "--topk-scores", "fp16"]).unwrap_err().to_string();
        assert!(err.contains("fp16") && err.contains("allowed f32 or bf16"), "{err}");
    }

    #[test]
    fn topk_values_default_to_uniform_and_take_gaussian() {
        assert_eq!(parse(&["bench"]).unwrap().topk_values, super::TopkValues::Uniform);
        assert_eq!(parse(&["bench", "--topk-values", "gaussian"]).unwrap().topk_values, super::TopkValues::Gaussian);
        let err = parse(&["bench", "--topk-values", "normal"]).unwrap_err().to_string();
        assert!(err.contains("normal") && err.contains("uniform") && err.contains("gaussian"), "{err}");
    }

    #[test]
    fn paged_requests_is_optional_and_at_least_one() {
        assert_eq!(parse(&["bench"]).unwrap().topk_paged_requests, None);
        assert_eq!(parse(&["bench", "--topk-paged-requests", "4"]).unwrap().topk_paged_requests, Some(4));
        let err = parse(&["bench", "--topk-paged-requests", "0"]).unwrap_err().to_string();
        assert!(err.contains("--topk-paged-requests") && err.contains('0') && err.contains("1.."), "{err}");
    }

    #[test]
    fn paged_requests_above_a_shapes_rows_are_refused_up_front() {
        let cases = [(64, 131_072), (1, 131_072)];
        assert!(super::check_paged_requests(&cases, None).is_ok());
        assert!(super::check_paged_requests(&cases, Some(1)).is_ok());
        let err = super::check_paged_requests(&cases, Some(4)).unwrap_err().to_string();
        assert!(
            err.contains("--topk-paged-requests") && err.contains("1x131072") && err.contains("at most 1"),
            "{err}"
        );
    }

    #[test]
    fn even_cu_seqlens_covers_every_row_once() {
        assert_eq!(super::even_cu_seqlens(2048, 1), vec![0, 2048]);
        assert_eq!(super::even_cu_seqlens(10, 4), vec![0, 3, 6, 8, 10]);
        assert_eq!(super::even_cu_seqlens(3, 3), vec![0, 1, 2, 3]);
        for (rows, requests) in [(64, 7), (2048, 3), (5, 5), (1, 1)] {
            let cu = super::even_cu_seqlens(rows, requests);
            assert_eq!((cu.len(), cu[0], cu[requests]), (requests + 1, 0, rows as i32));
            let sizes: Vec<i32> = cu.windows(2).map(|w| w[1] - w[0]).collect();
            assert!(sizes.iter().all(|&s| s >= 1) && sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn prefill_s_kv_defaults_to_32k_and_rejects_fewer_rows_than_the_topk() {
        assert_eq!(parse(&["bench"]).unwrap().prefill_s_kv, 32_768);
        assert_eq!(parse(&["bench", "--prefill-s-kv", "2048"]).unwrap().prefill_s_kv, 2048);
        let err = parse(&["bench", "--prefill-s-kv", "2047"]).unwrap_err().to_string();
        assert!(err.contains("--prefill-s-kv") && err.contains("2047") && err.contains("2048.."), "{err}");
        assert!(parse(&["bench", "--prefill-s-kv", "2147483648"]).is_err());
    }

    #[test]
    fn prefill_kernel_defaults_to_standard_and_names_what_it_allows() {
        use nsa_runtime::ops::sparse_prefill::PrefillKernel;
        assert_eq!(parse(&["bench"]).unwrap().prefill_kernel, PrefillKernel::Standard);
        assert_eq!(parse(&["bench", "--prefill-kernel", "pairs"]).unwrap().prefill_kernel, PrefillKernel::Pairs);
        let err = parse(&["bench", "--prefill-kernel", "paired"]).unwrap_err().to_string();
        assert!(err.contains("--prefill-kernel") && err.contains("standard or pairs"), "{err}");
    }
}
