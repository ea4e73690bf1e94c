//! `nsa compile` and `nsa verify`.

use crate::config_args::ConfigArgs;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use nsa_kernels::spec::{MetadataMode, TOPK_CLUSTER_SIZES};
use nsa_kernels::{
    deterministic_topk_set, kernel_set, KernelFamily, KernelSpec, NsaConfig, Target, TopkEntries, TopkScore,
    TopkTransform,
};
use nsa_runtime::cache::prebuild::{self, Caches};
use nsa_runtime::cache::{CachedKernel, Origin};
use nsa_runtime::metadata::GraphMode;
use nsa_runtime::ops::sparse_decode::DecodeShape;
use nsa_runtime::ops::sparse_prefill::{PrefillKernel, PrefillShape};
use nsa_runtime::testdata::ScorePattern;
use nsa_runtime::verify::dense as vdense;
use nsa_runtime::verify::indexer::{self as vindexer, IndexerCase};
use nsa_runtime::verify::layer::{self as vlayer, LayerCase, LayerMode};
use nsa_runtime::verify::metadata::{self as vmeta, ReplayCase};
use nsa_runtime::verify::sparse_decode::{self as vdecode, DecodeCase, IndexPattern};
use nsa_runtime::verify::sparse_prefill::{self as vprefill, KvSource, PrefillCase};
use nsa_runtime::verify::topk::{self as vtopk, TopkCase, TopkPath};
use nsa_runtime::verify::{self, Check};
use nsa_runtime::{device, Error, Result, Runtime};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct CompileArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Architectures: sm_90a, sm_100a, gfx942, `all`, or `config` (the config's targets).
    #[arg(long, default_value = "config")]
    pub arch: String,
    /// After compiling, verify on the GPU: `auto` does so when an NVIDIA driver is present.
    #[arg(long, value_enum, default_value_t = VerifyMode::Auto)]
    pub verify: VerifyMode,
    /// Also the deterministic top-k kernels (what a layer with deterministic top-k
    /// runs; not in the config's kernel set).
    #[arg(long)]
    pub deterministic_topk: bool,
    /// Only the kernels whose id matches one of these comma-separated globs
    /// (e.g. `kv_*,indexer_k_*`); `nsa list` prints the ids.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// The specs whose id matches one of `patterns` (all of them when there are none).
pub fn select(specs: Vec<KernelSpec>, patterns: &[String]) -> Result<Vec<KernelSpec>> {
    prebuild::select(specs, patterns, "--only", "`nsa list` prints them")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VerifyMode {
    Auto,
    Yes,
    No,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Token counts to check each kernel at.
    #[arg(long, value_delimiter = ',', default_value = "0,1,7,1000,65537")]
    pub sizes: Vec<usize>,
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
}

/// The targets `--arch` names.
pub fn parse_arch(arch: &str, cfg: &NsaConfig) -> Result<Vec<Target>> {
    match arch {
        "config" => Ok(cfg.targets.clone()),
        "all" => Ok(Target::ALL.to_vec()),
        list => list
            .split(',')
            .map(|a| {
                a.parse::<Target>().map_err(|e| Error::InvalidArgument {
                    field: "--arch",
                    value: a.into(),
                    expected: format!("{e}; or `all`, or `config`"),
                })
            })
            .collect(),
    }
}

/// Compiles (or loads) every spec on one worker per core, drawing the bar on a
/// terminal and a log line per tenth otherwise; results in spec order.
fn compile_all(caches: &Caches, specs: &[KernelSpec], bar: &ProgressBar) -> Result<Vec<Arc<CachedKernel>>> {
    let to_terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let step = specs.len().div_ceil(10).max(1);
    prebuild::compile_all(caches, specs, |spec, done| {
        bar.set_message(spec.id());
        bar.inc(1);
        if !to_terminal && (done % step == 0 || done == specs.len()) {
            eprintln!("nsa compile: {done}/{} kernels ready", specs.len());
        }
    })
}

pub fn run(args: CompileArgs) -> Result<()> {
    let cfg = args.config.load_with(|cfg| {
        cfg.targets = parse_arch(&args.arch, cfg)?;
        Ok(())
    })?;
    let mut specs = kernel_set(&cfg);
    if args.deterministic_topk {
        specs.extend(deterministic_topk_set(&cfg));
    }
    let specs = select(specs, &args.only)?;
    println!("config: {}{}", cfg.summary(), if args.deterministic_topk { " +deterministic top-k" } else { "" });
    let bar = ProgressBar::new(specs.len() as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").expect("valid template"));
    let caches = Caches::for_specs(&specs)?;
    let started = std::time::Instant::now();
    let cpu_before = process_cpu_seconds();
    let rows = compile_all(&caches, &specs, &bar)?;
    bar.finish_and_clear();
    print_summary(&rows);
    let cpu = process_cpu_seconds().zip(cpu_before).map(|(after, before)| after - before);
    println!(
        "wall time: {:.1} ms; CPU time: {} (all compiler threads)",
        started.elapsed().as_secs_f64() * 1e3,
        cpu.map_or("unknown".into(), |s| format!("{:.1} s", s))
    );
    if let Some(root) = caches.root() {
        println!("cache: {}", root.display());
    }
    let unsaved = caches.unpersisted();
    if let Some(first) = unsaved.first() {
        println!(
            "warning: {} of {} kernels were compiled but not saved to the disk cache, so the next run compiles them \
             again; first reason: {}",
            unsaved.len(),
            rows.len(),
            first.reason
        );
        for u in &unsaved {
            println!("  not saved: {}", u.entry);
        }
    }
    let nvidia_present = device::probe_driver().is_ok();
    match (args.verify, nvidia_present) {
        (VerifyMode::No, _) => Ok(()),
        (VerifyMode::Auto, false) => {
            println!("verify: skipped (no NVIDIA driver on this machine; kernels were compiled, not run)");
            Ok(())
        }
        (VerifyMode::Auto, true) if !args.only.is_empty() => {
            println!("verify: skipped (--only compiled part of the set; `nsa verify` checks the whole set)");
            Ok(())
        }
        _ => verify(VerifyArgs { config: args.config, sizes: vec![0, 1, 7, 1000, 65537], seed: 2026 }),
    }
}

fn print_summary(rows: &[Arc<CachedKernel>]) {
    let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    println!("{:<40} {:>8} {:>10} {:>5} {:>6} {:>7}", "kernel", "from", "ms", "regs", "smem", "spills");
    let (mut compiled, mut loaded, mut total_ms) = (0, 0, 0.0);
    for k in rows {
        let (from, elapsed) = match k.origin {
            Origin::Compiled { elapsed } => {
                compiled += 1;
                ("compiled", elapsed)
            }
            Origin::Disk { elapsed } => {
                loaded += 1;
                ("disk", elapsed)
            }
        };
        let ms = elapsed.as_secs_f64() * 1e3;
        total_ms += ms;
        let r = k.image.resources;
        let spills = match (r.spill_store_bytes, r.spill_load_bytes) {
            (Some(s), Some(l)) => (s + l).to_string(),
            _ => "-".into(),
        };
        println!(
            "{:<40} {:>8} {:>10.2} {:>5} {:>6} {:>7}",
            k.id,
            from,
            ms,
            opt(r.registers),
            opt(r.smem_bytes),
            spills
        );
    }
    println!(
        "{} kernels: {compiled} compiled, {loaded} from the disk cache, {total_ms:.1} ms of compile/load time",
        rows.len()
    );
}

/// User + system CPU time of the whole process so far (every thread), if the OS tells.
fn process_cpu_seconds() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes one rusage on success; read only then.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Some(secs(usage.ru_utime) + secs(usage.ru_stime))
}

pub fn verify(args: VerifyArgs) -> Result<()> {
    let cfg = args.config.load()?;
    let rt = Runtime::new(0)?;
    println!("verify on {} ({}), config: {}", rt.gpu().caps().name, rt.target(), cfg.summary());
    let mut checks: Vec<Check> = Vec::new();
    let mut on_device = cfg.clone();
    on_device.targets = vec![rt.target()];
    let topk_transforms: Vec<TopkTransform> = TopkTransform::ALL
        .into_iter()
        // The `pages` kernels serve any page size: at page size 1, a table of pages of 2.
        .chain([TopkTransform::Pages(cfg.page_size.max(2))])
        .collect();
    // A `slots` kernel serves both PAGED forms; the others their own kind.
    let served = |entries: TopkEntries| {
        topk_transforms.iter().copied().filter(move |t| t.entries() == entries || t.entries().merged() == entries)
    };
    for spec in kernel_set(&on_device) {
        for (i, &n) in args.sizes.iter().enumerate() {
            let seed = args.seed.wrapping_add(i as u64);
            let check = match spec.family {
                KernelFamily::KvStore { format } => verify::store_mla(&rt, format, n, seed)?,
                KernelFamily::KvDequant { format } => verify::dequant(&rt, format, n, seed, n > 1)?,
                KernelFamily::IndexerKStore => verify::store_indexer(&rt, n, seed)?,
                KernelFamily::StepStore { format } => verify::store_step(&rt, format, n, seed)?,
                KernelFamily::IndexerKGather => verify::gather_indexer(&rt, n, seed, n > 1)?,
                // Each top-k kernel is checked on every transform it serves (positions:
                // plain and RAGGED; slots: PAGED from a page_table_1 and from the
                // config's table of pages; table1 and pages: one of them) and, a
                // cluster kernel, every size the launcher may pick.
                KernelFamily::TopK { k, deterministic, layout, score, entries } => {
                    for call in served(entries) {
                        let path = TopkPath::Single(Some(layout));
                        let case = TopkCase { deterministic, path, ..topk_case(k, call, score, i, n, seed) };
                        checks.push(vtopk::run(&rt, &case)?);
                    }
                    continue;
                }
                KernelFamily::TopkSplit { k, score, entries } => {
                    for call in served(entries) {
                        let case = TopkCase { path: TopkPath::Split, ..topk_case(k, call, score, i, n, seed) };
                        checks.push(vtopk::run(&rt, &case)?);
                    }
                    continue;
                }
                KernelFamily::TopkCluster { k, score, entries } => {
                    for call in served(entries) {
                        for cluster in TOPK_CLUSTER_SIZES {
                            let path = TopkPath::Cluster(cluster);
                            let case = TopkCase { path, ..topk_case(k, call, score, i, n, seed) };
                            checks.push(vtopk::run(&rt, &case)?);
                        }
                    }
                    continue;
                }
                // Random captures and replays against the host graph state, once per kernel.
                KernelFamily::MetadataReplay { page_size, mode: MetadataMode::Extend } if i == 0 => {
                    vmeta::random_extends(&rt, page_size, 50, seed)?
                }
                KernelFamily::MetadataReplay { page_size, mode } if i == 0 => {
                    let mode = match mode {
                        MetadataMode::Decode => GraphMode::Decode,
                        MetadataMode::TargetVerify => GraphMode::TargetVerify,
                        MetadataMode::DraftExtend | MetadataMode::Extend => GraphMode::DraftExtend,
                    };
                    let mut case = ReplayCase::new(mode, page_size, seed);
                    case.iterations = 50;
                    vmeta::random_replays(&rt, &case)?
                }
                KernelFamily::MetadataReplay { .. } => continue,
                KernelFamily::IndexTransform { k } => vtopk::index_transform(&rt, k, i % 2 == 1, seed)?,
                KernelFamily::SparseDecode { heads, topk, page_size } => {
                    let batch = 1 + n % 97;
                    let shape = DecodeShape { batch, s_q: 1 + i % 3, heads, topk, page_size };
                    let mut case = DecodeCase::new(shape, IndexPattern::Holes, seed);
                    case.lengths = i % 2 == 1;
                    case.check_rows = 16;
                    vdecode::run(&rt, &case)?
                }
                // Checked with its decode kernel (split plans).
                KernelFamily::SparseDecodeCombine { .. } => continue,
                KernelFamily::DensePrefill { heads, d_qk, d_v, kernel } => {
                    // A short sequence, one with a prefix, one with fewer keys than rows.
                    let seqs = vec![(1 + n % 97, 1 + n % 97), (65, 65 + 130 + n % 61), (70, 30)];
                    vdense::run(&rt, &vdense::DenseCase { heads, d_qk, d_v, seqs, seed, kernel })?
                }
                KernelFamily::IndexerLogits { heads, layout } => {
                    let case = match layout {
                        nsa_kernels::spec::IndexerLayout::Paged => IndexerCase::Paged {
                            context_lens: vec![1, 63, 64, n as i32 % 3000 + 1, 2049],
                            next_n: 1 + i % 4,
                            table_width: 40,
                            pages: 97,
                            seed,
                        },
                        nsa_kernels::spec::IndexerLayout::Ragged => {
                            let keys = 100 + n % 3000;
                            IndexerCase::Ragged {
                                ks: vec![0, 5, 64, 0],
                                ke: vec![1, 70, keys as i32, 0],
                                num_keys: keys,
                                seed,
                            }
                        }
                    };
                    // Every other kernel also fills the entries its rows do not see.
                    if i % 2 == 0 {
                        vindexer::run(&rt, &case, heads)?
                    } else {
                        vindexer::run_filled(&rt, &case, heads)?
                    }
                }
                KernelFamily::SparsePrefill { heads, topk, d_qk, paired } => {
                    let shape = PrefillShape { s_q: 1 + n % 97, heads, topk, d_qk, target: rt.target() };
                    let mut case = PrefillCase::new(shape, 2 * topk as usize + n, IndexPattern::Holes, seed);
                    case.lengths = i % 2 == 1;
                    case.check_rows = 16;
                    if paired {
                        case.kernel = PrefillKernel::Pairs;
                    }
                    // The FP8 configuration's prefill reads the dequantized prefix.
                    if cfg.kv_cache == nsa_kernels::KvCacheFormat::Fp8 && d_qk == 576 && !paired {
                        case.source = KvSource::Fp8Ragged;
                    }
                    vprefill::run(&rt, &case)?
                }
            };
            checks.push(check);
        }
    }
    // The whole layer (stores → indexer → top-k → sparse MLA) in a decode-like and
    // an extend step, against the whole-layer CPU reference.
    for (n, mode) in [LayerMode::TargetVerify { draft: 2 }, LayerMode::Extend { prefix: true }].into_iter().enumerate()
    {
        let case = LayerCase::new(cfg.clone(), mode, 3, 5000, args.seed.wrapping_add(100 + n as u64));
        checks.extend(vlayer::run(&rt, &case)?.checks);
    }
    for c in &checks {
        println!("{c}");
    }
    let failed = checks.iter().filter(|c| !c.passed()).count();
    println!("verify: {} passed, {failed} failed", checks.len() - failed);
    if failed > 0 {
        return Err(Error::Other(format!("{failed} GPU check(s) differ from the CPU reference")));
    }
    Ok(())
}

/// The verify run's top-k case for size `n` (the `i`-th size): lengths around k,
/// past the size and one long row; Gaussian and one-bucket scores alternate, and
/// PAGED alternates between decode and prefill (grouped) tables. Unordered, the
/// launcher's own layout.
fn topk_case(k: u32, transform: TopkTransform, score: TopkScore, i: usize, n: usize, seed: u64) -> TopkCase {
    TopkCase {
        k,
        transform,
        score,
        deterministic: false,
        pattern: [ScorePattern::Gaussian, ScorePattern::OneBucket][i % 2],
        lengths: vec![0, 1, k as i32, k as i32 + 1, n as i32 + k as i32 + 1, 50_000],
        row_starts: true,
        grouped: transform.is_paged() && i % 2 == 1,
        table_width: None,
        path: TopkPath::Single(None),
        seed,
    }
}
