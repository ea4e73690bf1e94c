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

/// Eager extend metadata built on the device ([`DeviceExtendState`]) against the
/// host builder over `iterations` random batches (empty ones, pure prefills,
/// prefixes, zero-length extends, a request at the full width), one launch each:
/// every field compared bit for bit, the table rows over the batch's longest
/// request, and the ragged keys against [`ragged_keys`](crate::layer::ragged_keys).
pub fn random_extends(rt: &Runtime, page_size: u32, iterations: usize, seed: u64) -> Result<Check> {
    use crate::metadata::extend_device::{DeviceExtendState, ExtendCapacity};
    use crate::metadata::{ExtendBatch, ExtendPlan, MetadataBuilder, TransformMethod};
    let mut rng = testdata::rng(seed);
    let stream = rt.gpu().stream().clone();
    let (max_bs, width) = (12usize, 700usize);
    let table_rows = max_bs * 2 + 1;
    let table_width = width + 5;
    let (table_data, pool_slots) = table(table_rows, table_width, page_size, &mut rng);
    let params = MetadataParams { page_size, topk: 64, draft_tokens: 0, pool_slots, cp: None };
    let capacity =
        ExtendCapacity { max_bs, max_tokens: max_bs * width / 2, max_keys: max_bs * width, max_context_len: width };
    let mut dev = DeviceExtendState::new(rt, params, capacity)?;
    let builder = MetadataBuilder::new(params)?;
    let view = ReqToToken::new(&table_data, table_width)?;
    let table_dev = upload(&stream, &table_data)?;
    let table_view = table_dev.slice(0..table_data.len());
    let kernel =
        KernelSpec::new(KernelFamily::MetadataReplay { page_size, mode: MetadataMode::Extend }, rt.target()).id();
    let (mut mismatches, mut first) = (0, None);
    for it in 0..iterations {
        let bs = if rng.random_bool(0.05) { 0 } else { rng.random_range(1..=max_bs) };
        let prefix = rng.random_bool(0.6);
        let mut seq_lens: Vec<i32> = (0..bs).map(|_| rng.random_range(0..=width as i32 / 2)).collect();
        if bs > 0 && rng.random_bool(0.2) {
            seq_lens[rng.random_range(0..bs)] = width as i32;
        }
        let extend: Vec<i32> =
            seq_lens.iter().map(|&l| if prefix { rng.random_range(0..=l.min(width as i32 / 2)) } else { l }).collect();
        let prefix_lens: Vec<i32> = seq_lens.iter().zip(&extend).map(|(l, e)| l - e).collect();
        let mut rpi: Vec<i32> = (0..table_rows as i32).collect();
        rpi.shuffle(&mut rng);
        rpi.truncate(bs);
        let batch = ExtendBatch {
            req_pool_indices: &rpi,
            seq_lens: &seq_lens,
            extend_lens: &extend,
            prefix_lens: prefix.then_some(&prefix_lens[..]),
        };
        let md =
            builder.extend(&view, batch, ExtendPlan { transform: TransformMethod::Ragged, mha_fp8_dequant: false })?;
        let keys = crate::layer::ragged_keys(&md)?;
        let x = dev.extent(&seq_lens, &extend)?;
        let (s_dev, r_dev, e_dev) = (upload(&stream, &seq_lens)?, upload(&stream, &rpi)?, upload(&stream, &extend)?);
        let (s_v, r_v, e_v) = (s_dev.slice(0..bs), r_dev.slice(0..bs), e_dev.slice(0..bs));
        let reqs = DeviceRequests {
            req_to_token: &table_view,
            req_to_token_width: table_width,
            req_pool_indices: &r_v,
            seq_lens: &s_v,
        };
        let before = dev.launches();
        dev.build(rt, &reqs, &e_v)?;
        let snap = dev.download(rt, &x)?;
        // Table rows: the host's width is the batch's longest request.
        let rows_of = |data: &[i32], stride: usize, cols: usize| -> Vec<i32> {
            (0..bs).flat_map(|r| data[r * stride..r * stride + cols].iter().copied()).collect()
        };
        let host_real = md.real_table();
        let l = dev.layout();
        let t = md.num_tokens();
        let mut diffs: Vec<(&str, Vec<i32>, Vec<i32>)> = vec![
            ("cache_seqlens", snap.cache_seqlens.clone(), md.cache_seqlens.clone()),
            ("cu_seqlens_k", snap.cu_seqlens_k.clone(), md.cu_seqlens_k.clone()),
            ("cu_seqlens_q", snap.cu_seqlens_q.clone(), md.cu_seqlens_q.clone()),
            ("page_table_1", rows_of(&snap.page_table_1, l.width, md.page_table_1.width), md.page_table_1.data.clone()),
            ("nsa_seqlens_expanded", snap.nsa_seqlens_expanded.clone(), md.nsa_seqlens_expanded.clone()),
            ("nsa_cache_seqlens", snap.nsa_cache_seqlens.clone(), md.nsa_cache_seqlens[..t].to_vec()),
            ("nsa_cu_seqlens_k", snap.nsa_cu_seqlens_k.clone(), md.nsa_cu_seqlens_k[..=t].to_vec()),
            ("slots", snap.slots.clone(), keys.slots.clone()),
            ("ks", snap.ks.clone(), keys.ks.clone()),
            ("ke", snap.ke.clone(), keys.ke.clone()),
        ];
        if let Some(real) = &snap.real_page_table {
            diffs.push(("real_page_table", rows_of(real, l.real_width, host_real.width), host_real.data.to_vec()));
        }
        let mut diff = (dev.launches() != before + 1).then(|| "not exactly one launch".to_string());
        for (name, d, h) in diffs {
            if diff.is_some() {
                break;
            }
            if d.len() != h.len() {
                diff = Some(format!("{name}: {} entries on the device, {} on the host", d.len(), h.len()));
            } else if let Some(i) = d.iter().zip(&h).position(|(a, b)| a != b) {
                diff = Some(format!("{name}[{i}]: device {} host {}", d[i], h[i]));
            }
        }
        if let Some(m) = diff {
            mismatches += 1;
            first.get_or_insert_with(|| format!("batch {it} (bs {bs}, prefix {prefix}): {m}"));
        }
    }
    Ok(Check {
        kernel,
        case: format!("extend p{page_size} x{iterations}"),
        items: iterations,
        mismatches,
        first_mismatch: first,
    })
}
