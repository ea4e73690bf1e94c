//! `nsa run`: one NSA layer on random data on the GPU, every stage checked against
//! the whole-layer CPU reference, optionally timed.

use crate::config_args::ConfigArgs;
use clap::{Args, ValueEnum};
use nsa_runtime::metadata::{AttnImpl, PrefillBackend};
use nsa_runtime::verify::layer::{run as run_layer, LayerCase, LayerMode};
use nsa_runtime::{Error, Result, Runtime};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Decode,
    Verify,
    DraftExtend,
    DraftExtendV2,
    Extend,
    ExtendPrefix,
}

/// The `--prefill` choices.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefill {
    Cost,
    Auto,
    Sparse,
    Kv,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Forward mode of the step.
    #[arg(long, value_enum, default_value_t = Mode::Decode)]
    pub mode: Mode,
    /// Requests in the batch.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// KV length of the longest request after the step (request 0 is kept short).
    #[arg(long, default_value_t = 16_384)]
    pub context: usize,
    /// Every request exactly --context long (otherwise lengths vary and request 0 is short).
    #[arg(long)]
    pub uniform: bool,
    /// Draft tokens D (verify, draft-extend-v2: all of them; draft-extend: accept lengths in 1..=D).
    #[arg(long, default_value_t = 2)]
    pub draft: u32,
    /// Plant a strongly matching key per request and check it is selected and dominates.
    #[arg(long)]
    pub needle: bool,
    /// How an FP8-cache extend attends: `cost` (nsa's kernel costs decide per
    /// batch), `auto` (the reference's rule: the decode kernel on Hopper), `sparse`
    /// (dequantize + prefill kernel, RAGGED) or `kv` (the decode kernel, PAGED).
    #[arg(long, value_enum, default_value_t = Prefill::Cost)]
    pub prefill: Prefill,
    /// Cap on one chunk of extend logits, in MiB.
    #[arg(long)]
    pub logits_budget_mib: Option<usize>,
    /// Query tokens compared against the reference (spread evenly).
    #[arg(long, default_value_t = 24)]
    pub check_rows: usize,
    /// Batch-invariant layer: a request's outputs do not depend on the rest of the
    /// batch (deterministic top-k, decode splits fixed per GPU); time it against the default.
    #[arg(long)]
    pub batch_invariant: bool,
    /// Also time this many eager forwards and report each stage's share.
    #[arg(long, default_value_t = 0)]
    pub iters: usize,
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
}

pub fn run(args: RunArgs) -> Result<()> {
    let model = args.config.load()?;
    let rt = Runtime::new(0)?;
    let mode = match args.mode {
        Mode::Decode => LayerMode::Decode,
        Mode::Verify => LayerMode::TargetVerify { draft: args.draft },
        Mode::DraftExtend => LayerMode::DraftExtend { draft: args.draft },
        Mode::DraftExtendV2 => LayerMode::DraftExtendV2 { draft: args.draft },
        Mode::Extend => LayerMode::Extend { prefix: false },
        Mode::ExtendPrefix => LayerMode::Extend { prefix: true },
    };
    let mut case = LayerCase::new(model, mode, args.batch, args.context, args.seed);
    case.needle = args.needle;
    case.uniform = args.uniform;
    case.check_rows = args.check_rows;
    case.timing_iters = args.iters;
    case.batch_invariant = args.batch_invariant;
    case.logits_budget = args.logits_budget_mib.map(|m| m << 20);
    case.prefill_backend = match args.prefill {
        Prefill::Cost => PrefillBackend::Cost { heads: case.model.num_q_heads },
        Prefill::Auto => PrefillBackend::Auto,
        Prefill::Sparse => PrefillBackend::Fixed(AttnImpl::FlashMlaSparse),
        Prefill::Kv => PrefillBackend::Fixed(AttnImpl::FlashMlaKv),
    };
    println!("{} on {}", case.describe(), rt.gpu().caps().name);
    let report = run_layer(&rt, &case)?;
    println!("{}", report.explain);
    for c in &report.checks {
        println!("{c}");
    }
    if let Some(t) = &report.timing {
        println!(
            "layer call: {:.1} µs eager, {:.1} µs as a CUDA graph ({} iterations each)",
            t.total_us, t.graph_us, args.iters
        );
        let marked: f64 = t.stages.iter().map(|s| s.1).sum();
        for (stage, us) in &t.stages {
            println!("  {:16} {:9.1} µs  {:5.1}%", stage.name(), us, 100.0 * us / marked.max(1e-9));
        }
    }
    let failed = report.checks.iter().filter(|c| !c.passed()).count();
    if failed > 0 {
        return Err(Error::Other(format!(
            "{failed} of {} layer stage check(s) differ from the CPU reference",
            report.checks.len()
        )));
    }
    Ok(())
}
