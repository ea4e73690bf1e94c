//! CUDA-graph metadata on the GPU against the host [`GraphState`] (spec §9): random
//! captures and replays, every buffer compared bit for bit after each one, and one
//! kernel launch per capture/replay.

use super::{upload, Check};
use crate::metadata::graph::SEQ_LEN_FILL;
use crate::metadata::graph_device::{DeviceGraphState, DeviceRequests, GraphSnapshot};
use crate::metadata::{GraphCapacity, GraphMode, GraphState, MetadataParams, MultiStepGraphs, ReqToToken, Requests};
use crate::runtime::Runtime;
use crate::testdata;
use crate::Result;
use nsa_kernels::spec::MetadataMode;
use nsa_kernels::{KernelFamily, KernelSpec};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// One random sequence of captures and replays.
#[derive(Clone, Copy, Debug)]
pub struct ReplayCase {
    pub mode: GraphMode,
    pub page_size: u32,
    /// 1: one backend; > 1: the multi-step draft backend (decode) with this many steps.
    pub steps: usize,
    pub topk: u32,
    /// D (ignored by decode).
    pub draft_tokens: u32,
    pub max_bs: usize,
    /// Graph page-table width (max_context_len).
    pub width: usize,
    /// Captures + replays.
    pub iterations: usize,
    pub seed: u64,
}

impl ReplayCase {
    pub fn new(mode: GraphMode, page_size: u32, seed: u64) -> Self {
        ReplayCase {
            mode,
            page_size,
            steps: 1,
            topk: 100,
            draft_tokens: 3,
            max_bs: 24,
            width: 320,
            iterations: 200,
            seed,
        }
    }
}

/// A page-aligned `req_to_token` of `rows` rows, `width` wide, pages shuffled (page 0 free).
fn table(rows: usize, width: usize, page: u32, rng: &mut StdRng) -> (Vec<i32>, usize) {
    let p = page as usize;
    let pages_per_row = width.div_ceil(p);
    let mut order: Vec<usize> = (1..=rows * pages_per_row).collect();
    order.shuffle(rng);
    let mut data = Vec::with_capacity(rows * width);
    for r in 0..rows {
        for pos in 0..width {
            data.push((order[r * pages_per_row + pos / p] * p + pos % p) as i32);
        }
    }
    (data, (rows * pages_per_row + 2) * p)
}

/// The host side: one state, or the multi-step backend's states.
enum Host {
    One(Box<GraphState>),
    Multi(MultiStepGraphs),
}

impl Host {
    fn states(&self) -> Vec<&GraphState> {
        match self {
            Host::One(g) => vec![&**g],
            Host::Multi(m) => m.states().iter().collect(),
        }
    }
}

/// Differences between the device snapshot and the host state, first one described.
fn compare(dev: &GraphSnapshot, host: &GraphState) -> Option<String> {
    let mut diffs: Vec<(&str, &[i32], &[i32])> = vec![
        ("cache_seqlens", &dev.cache_seqlens, host.cache_seqlens()),
        ("cu_seqlens_k", &dev.cu_seqlens_k, host.cu_seqlens_k()),
        ("cu_seqlens_q", &dev.cu_seqlens_q, host.cu_seqlens_q()),
        ("page_table_1", &dev.page_table_1.data, &host.page_table_1().data),
        ("nsa_cache_seqlens", &dev.nsa_cache_seqlens, host.nsa_cache_seqlens()),
        ("nsa_cu_seqlens_k", &dev.nsa_cu_seqlens_k, host.nsa_cu_seqlens_k()),
        ("extend_lens", &dev.extend_lens, host.extend_lens()),
    ];
    if host.mode() != GraphMode::Decode {
        diffs.push(("nsa_seqlens_expanded", &dev.nsa_seqlens_expanded, host.nsa_seqlens_expanded()));
    } else if dev.nsa_seqlens_expanded.iter().any(|&v| v != 0) {
        return Some("decode wrote nsa_seqlens_expanded (it aliases cache_seqlens)".into());
    }
    match &dev.real_page_table {
        Some(real) => diffs.push(("real_page_table", &real.data, &host.real_table().data)),
        None if host.params().page_size > 1 => return Some("real_page_table missing".into()),
        None => {}
    }
    for (name, d, h) in diffs {
        if d.len() != h.len() {
            return Some(format!("{name}: {} entries on the device, {} on the host", d.len(), h.len()));
        }
        if let Some(i) = d.iter().zip(h).position(|(a, b)| a != b) {
            return Some(format!("{name}[{i}]: device {} host {}", d[i], h[i]));
        }
    }
    None
}

/// Runs `case`: the first operation is a capture, then random replays (and the
/// occasional re-capture) of random batches; after each, every step's buffers are
/// downloaded and compared with the host state's.
pub fn random_replays(rt: &Runtime, case: &ReplayCase) -> Result<Check> {
    let mut rng = testdata::rng(case.seed);
    let stream = rt.gpu().stream().clone();
    let d = case.draft_tokens as i32;
    let per_req = if case.mode == GraphMode::Decode { 1 } else { case.draft_tokens as usize };
    let table_rows = case.max_bs * 2 + 3;
    // req_to_token wider than the graph table: its own stride.
    let table_width = case.width + 8;
    let (table_data, pool_slots) = table(table_rows, table_width, case.page_size, &mut rng);
    let params = MetadataParams {
        page_size: case.page_size,
        topk: case.topk,
        draft_tokens: if case.mode == GraphMode::Decode { 0 } else { case.draft_tokens },
        pool_slots,
        cp: None,
    };
    let capacity =
        GraphCapacity { max_bs: case.max_bs, max_tokens: case.max_bs * per_req, max_context_len: case.width };
    let (mut host, mut dev) = if case.steps > 1 {
        (
            Host::Multi(MultiStepGraphs::new(params, capacity, case.steps + 1)?),
            DeviceGraphState::multi_step(rt, params, capacity, case.steps + 1)?,
        )
    } else {
        (
            Host::One(Box::new(GraphState::new(params, case.mode, capacity)?)),
            DeviceGraphState::new(rt, params, case.mode, capacity)?,
        )
    };
    let mode = match case.mode {
        GraphMode::Decode => MetadataMode::Decode,
        GraphMode::TargetVerify => MetadataMode::TargetVerify,
        _ => MetadataMode::DraftExtend,
    };
    let kernel = KernelSpec::new(KernelFamily::MetadataReplay { page_size: case.page_size, mode }, rt.target()).id();
    let view = ReqToToken::new(&table_data, table_width)?;
    let table_dev = upload(&stream, &table_data)?;
    let table_view = table_dev.slice(0..table_data.len());

    let mut mismatches = 0;
    let mut first = None;
    for it in 0..case.iterations {
        let bs = if rng.random_bool(0.05) { 0 } else { rng.random_range(1..=case.max_bs) };
        let before = dev.launches();
        let what;
        if it == 0 || rng.random_bool(0.1) {
            let seq_lens: Vec<i32> = (0..bs)
                .map(|_| if rng.random_bool(0.3) { SEQ_LEN_FILL } else { rng.random_range(0..=case.width as i32 / 2) })
                .collect();
            match &mut host {
                Host::One(g) => {
                    g.capture(&seq_lens)?;
                }
                Host::Multi(m) => {
                    m.capture(&seq_lens)?;
                }
            }
            let s = upload(&stream, &seq_lens)?;
            dev.capture(rt, &s.slice(0..bs))?;
            what = format!("capture bs {bs}");
        } else {
            let w = case.width as i32;
            let lo = if case.mode == GraphMode::DraftExtendV2 { d } else { 0 };
            let hi = if case.mode == GraphMode::TargetVerify { w - d } else { w };
            // Sometimes every request short, sometimes one at the full width.
            let cap = if rng.random_bool(0.3) { (lo + 5).min(hi) } else { hi };
            let mut seq_lens: Vec<i32> = (0..bs).map(|_| rng.random_range(lo..=cap)).collect();
            if bs > 0 && rng.random_bool(0.2) {
                seq_lens[rng.random_range(0..bs)] = hi;
            }
            let rpi: Vec<i32> = (0..bs).map(|_| rng.random_range(0..table_rows as i32)).collect();
            let extend: Vec<i32> = seq_lens.iter().map(|&l| rng.random_range(0..=l.min(d))).collect();
            let reqs = Requests { req_pool_indices: &rpi, seq_lens: &seq_lens };
            let (s_dev, r_dev, e_dev) =
                (upload(&stream, &seq_lens)?, upload(&stream, &rpi)?, upload(&stream, &extend)?);
            let (s_v, r_v, e_v) = (s_dev.slice(0..bs), r_dev.slice(0..bs), e_dev.slice(0..bs));
            let dreqs = DeviceRequests {
                req_to_token: &table_view,
                req_to_token_width: table_width,
                req_pool_indices: &r_v,
                seq_lens: &s_v,
            };
            match (&mut host, case.mode) {
                (Host::Multi(m), _) => {
                    m.replay(&view, reqs)?;
                    dev.replay_decode(rt, &dreqs)?;
                }
                (Host::One(g), GraphMode::Decode) => {
                    g.replay_decode(&view, reqs)?;
                    dev.replay_decode(rt, &dreqs)?;
                }
                (Host::One(g), GraphMode::TargetVerify) => {
                    g.replay_target_verify(&view, reqs)?;
                    dev.replay_target_verify(rt, &dreqs)?;
                }
                (Host::One(g), GraphMode::DraftExtend) => {
                    g.replay_draft_extend(&view, reqs, &extend)?;
                    dev.replay_draft_extend(rt, &dreqs, &e_v)?;
                }
                (Host::One(g), GraphMode::DraftExtendV2) => {
                    g.replay_draft_extend_v2(&view, reqs)?;
                    dev.replay_draft_extend_v2(rt, &dreqs)?;
                }
            }
            what = format!("replay bs {bs}");
        }
        let mut diff = None;
        if dev.launches() != before + 1 {
            diff = Some(format!("{} launches (one expected)", dev.launches() - before));
        }
        for (step, h) in host.states().into_iter().enumerate() {
            if diff.is_some() {
                break;
            }
            let snap = dev.download(rt, step)?;
            diff = compare(&snap, h).map(|m| format!("step {step}: {m}"));
        }
        if let Some(m) = diff {
            mismatches += 1;
            first.get_or_insert_with(|| format!("op {it} ({what}): {m}"));
        }
    }
    Ok(Check {
        kernel,
        case: format!("{} steps {} x{}", case.mode.name(), case.steps, case.iterations),
        items: case.iterations,
        mismatches,
        first_mismatch: first,
    })
}
