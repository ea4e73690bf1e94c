//! `nsa`: list, compile, inspect, verify and benchmark the kernels of one NSA config.

mod bench;
mod bench_decode;
mod bench_dense;
mod bench_host;
mod bench_indexer;
mod bench_layer;
mod bench_plan;
mod bench_prefill;
mod compile;
mod config_args;
mod inspect;
mod run;
mod shapes;

use clap::{Parser, Subcommand};
use config_args::ConfigArgs;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "nsa", version, about = "DeepSeek V3.2 sparse-attention kernel compiler")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the kernel variants a config needs, one id per line.
    List {
        #[command(flatten)]
        config: ConfigArgs,
        /// Architectures: sm_90a, sm_100a, gfx942, `all`, or `config` (the config's targets).
        #[arg(long, default_value = "config")]
        arch: String,
    },
    /// Generate and compile a config's kernel set into the cache; print a summary.
    /// On a machine with an NVIDIA GPU, also verify the kernels against the CPU reference.
    Compile(compile::CompileArgs),
    /// Show where a kernel's source is, and its PTX or SASS on request.
    Inspect(inspect::InspectArgs),
    /// (GPU) Run every compiled kernel of the config against its CPU reference.
    Verify(compile::VerifyArgs),
    /// (GPU) Run one NSA layer (store → indexer → top-k → sparse MLA) on random data
    /// and check every stage against the whole-layer CPU reference.
    Run(run::RunArgs),
    /// (GPU) Measure kernel bandwidth against a device copy, and JIT/cache latency.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let filter = match std::env::var("NSA_LOG") {
        Err(std::env::VarError::NotPresent) => Ok(tracing_subscriber::EnvFilter::new("warn")),
        Err(e) => Err(format!("NSA_LOG: {e}")),
        Ok(v) => tracing_subscriber::EnvFilter::try_new(&v)
            .map_err(|e| format!("NSA_LOG={v:?} is not a tracing filter ({e}); e.g. `info` or `nsa_runtime=debug`")),
    };
    let filter = match filter {
        Ok(f) => f,
        Err(msg) => {
            eprintln!("error: {msg}");
            return ExitCode::FAILURE;
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, never into logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = nsa_runtime::runtime::check_environment().and_then(|()| match cli.command {
        Command::List { config, arch } => config
            .load_with(|cfg| {
                cfg.targets = compile::parse_arch(&arch, cfg)?;
                Ok(())
            })
            .map(|cfg| {
                for spec in nsa_kernels::kernel_set(&cfg) {
                    println!("{}", spec.id());
                }
            }),
        Command::Compile(args) => compile::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Verify(args) => compile::verify(args),
        Command::Bench(args) => bench::run(args),
        Command::Run(args) => run::run(args),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
