//! Whole-layer steps (`nsa bench --suite layer`): the device time of one
//! `NsaLayer` call, eager and as a CUDA graph, and each stage's, on the
//! DeepSeek-V3.2 preset (FP8 cache, page 64, top-k 2048): decode at small and large
//! batches with 128 and 16 heads, an MTP verify step, and FP8 extend under the
//! reference's rule and under nsa's kernel costs; short prompts both as sparse MLA
//! and as MHA one-shot (the layer's two calls, the model's `kv_b_proj` between them
//! not timed). Every step is also checked against the CPU reference on a few rows.

use nsa_kernels::NsaConfig;
use nsa_runtime::layer::Stage;
use nsa_runtime::metadata::PrefillBackend;
use nsa_runtime::verify::layer::{run as run_layer, LayerCase, LayerMode};
use nsa_runtime::verify::mha::{run as run_mha, MhaCase};
use nsa_runtime::{Error, Result, Runtime};
use serde::Serialize;

#[derive(Serialize, Debug)]
pub struct StageUs {
    stage: &'static str,
    us: f64,
}

#[derive(Serialize, Debug)]
pub struct LayerRow {
    mode: String,
    batch: usize,
    context: usize,
    heads: u32,
    /// How an FP8 extend attends: "auto" (the reference's rule) or "cost".
    prefill: &'static str,
    /// Query tokens of the step.
    rows: usize,
    eager_us: f64,
    /// None for MHA one-shot rows (eager: the model's projection runs between the calls).
    graph_us: Option<f64>,
    /// Each stage's time, from events between the stages of more eager calls.
    stages: Vec<StageUs>,
    /// The step's outputs matched the whole-layer CPU reference on the checked rows.
    checks_passed: bool,
}

struct Shape {
    mode: LayerMode,
    batch: usize,
    context: usize,
    heads: u32,
    uniform: bool,
    seed: u64,
}

fn shapes() -> Vec<Shape> {
    let s = |mode, batch, context, heads, uniform, seed| Shape { mode, batch, context, heads, uniform, seed };
    let (decode, verify) = (LayerMode::Decode, LayerMode::TargetVerify { draft: 2 });
    let (extend, prefix) = (LayerMode::Extend { prefix: false }, LayerMode::Extend { prefix: true });
    vec![
        s(decode, 1, 16_384, 128, true, 1),
        s(decode, 32, 16_384, 128, true, 1),
        s(decode, 128, 16_384, 128, true, 1),
        s(decode, 1, 131_072, 128, true, 1),
        s(decode, 1, 16_384, 16, true, 1),
        s(decode, 32, 16_384, 16, true, 1),
        s(decode, 128, 16_384, 16, true, 1),
        s(verify, 8, 16_384, 128, true, 1),
        s(extend, 1, 16_384, 128, true, 1),
        s(extend, 4, 8_192, 128, true, 1),
        s(prefix, 1, 65_536, 128, true, 7),
        s(extend, 1, 16_384, 16, true, 1),
        s(extend, 16, 1_024, 128, true, 1),
        s(extend, 16, 1_024, 16, true, 1),
    ]
}

/// Short prompts as MHA one-shot: (requests, tokens each, heads).
const MHA_SHAPES: [(usize, usize, u32); 2] = [(16, 1_024, 128), (16, 1_024, 16)];

/// Each shape once; extend shapes under both prefill choices. `short_only`: the
/// shapes of the MHA one-shot rows alone; `decode_only`: the decode and verify steps.
pub fn layer_bench(rt: &Runtime, iters: usize, short_only: bool, decode_only: bool) -> Result<Vec<LayerRow>> {
    let base = NsaConfig::preset("deepseek-v3.2").map_err(|e| Error::Other(e.to_string()))?;
    let mut rows = Vec::new();
    let short = |s: &Shape| MHA_SHAPES.iter().any(|&(b, c, h)| (s.batch, s.context, s.heads) == (b, c, h));
    let extend = |s: &Shape| matches!(s.mode, LayerMode::Extend { .. });
    for shape in shapes().into_iter().filter(|s| (!short_only || short(s)) && (!decode_only || !extend(s))) {
        let auto = ("auto", PrefillBackend::Auto);
        let cost = ("cost", PrefillBackend::Cost { heads: shape.heads });
        let choices = if matches!(shape.mode, LayerMode::Extend { .. }) { vec![auto, cost] } else { vec![auto] };
        for (prefill, backend) in choices {
            let mut model = base.clone();
            model.num_q_heads = shape.heads;
            let mut case = LayerCase::new(model, shape.mode, shape.batch, shape.context, shape.seed);
            case.uniform = shape.uniform;
            case.check_rows = 2;
            case.timing_iters = iters;
            case.prefill_backend = backend;
            let report = run_layer(rt, &case)?;
            let Some(t) = report.timing else {
                return Err(Error::Other(format!("{}: the layer run returned no timing", case.describe())));
            };
            let passed = report.checks.iter().all(|c| c.passed());
            println!(
                "layer {:<40} {prefill:<4} {:>6} rows: {:>9.1} µs eager, {:>9.1} µs graph{}",
                case.describe(),
                report.rows,
                t.total_us,
                t.graph_us,
                if passed { "" } else { "  (a check FAILED)" }
            );
            rows.push(LayerRow {
                mode: case.mode.name(),
                batch: shape.batch,
                context: shape.context,
                heads: shape.heads,
                prefill,
                rows: report.rows,
                eager_us: t.total_us,
                graph_us: Some(t.graph_us),
                stages: Stage::ALL
                    .iter()
                    .filter_map(|s| {
                        t.stages.iter().find(|(x, _)| x == s).map(|&(_, us)| StageUs { stage: s.name(), us })
                    })
                    .collect(),
                checks_passed: passed,
            });
        }
    }
    for (batch, context, heads) in MHA_SHAPES.into_iter().filter(|_| !decode_only) {
        let mut model = base.clone();
        model.num_q_heads = heads;
        let case =
            MhaCase { model, requests: vec![(0, context); batch], seed: 1, check_rows: Some(2), timing_iters: iters };
        let report = run_mha(rt, &case)?;
        let Some(t) = report.timing else {
            return Err(Error::Other(format!("MHA b{batch} ctx{context}: the run returned no timing")));
        };
        let passed = report.checks.iter().all(|c| c.passed());
        let eager = t.store_us + t.attend_us;
        println!(
            "layer extend b{batch} ctx{context} h{heads} MHA one-shot {:>6} rows: {eager:>9.1} µs ({:.1} stores and read-back, {:.1} attention){}",
            batch * context,
            t.store_us,
            t.attend_us,
            if passed { "" } else { "  (a check FAILED)" }
        );
        rows.push(LayerRow {
            mode: "extend".into(),
            batch,
            context,
            heads,
            prefill: "mha",
            rows: batch * context,
            eager_us: eager,
            graph_us: None,
            stages: vec![
                StageUs { stage: "stores and read-back", us: t.store_us },
                StageUs { stage: "dense MHA", us: t.attend_us },
            ],
            checks_passed: passed,
        });
    }
    Ok(rows)
}
