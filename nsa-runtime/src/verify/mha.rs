//! The layer's MHA one-shot path on the GPU ([`NsaLayer::plan_mha`],
//! [`NsaLayer::mha_store`], [`NsaLayer::mha_attend`]) against the CPU references:
//! the two stores, the latent rows read back (bit for bit: FP8 dequantized, bf16
//! copied), and dense attention over q/k/v expanded from those rows as a model does
//! (a random `kv_b_proj`), within `verify::dense`'s tolerance.

use super::dense::compare;
use super::{download, split_rows, upload, Check};
use crate::layer::{
    DeviceBatch, HostLens, LayerCaches, LayerConfig, MhaInputs, MhaNewTokens, MhaOutputs, MhaPlan, NsaLayer,
    MHA_QK_HEAD_DIM, MHA_V_HEAD_DIM,
};
use crate::metadata::extend_device::{DeviceExtendState, ExtendCapacity};
use crate::metadata::graph_device::DeviceRequests;
use crate::metadata::{
    decide, BatchSummary, Dispatch, DispatchPolicy, ExtendBatch, ForwardMode, MetadataBuilder, MetadataParams,
    PrefillBackend, ReqToToken,
};
use crate::ops::kv_cache::MlaCacheMut;
use crate::ops::Rows;
use crate::reference::dense_mha::{dense_causal_rows, DenseBatch};
use crate::reference::kv_cache as reference;
use crate::runtime::Runtime;
use crate::{testdata, Result};
use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::{KvCacheFormat, NsaConfig};
use rand::Rng;

/// One MHA one-shot batch: `(prefix, new tokens)` per request, every total within
/// the model's top-k (else the dispatch takes sparse MLA and the case is refused).
#[derive(Clone, Debug)]
pub struct MhaCase {
    pub model: NsaConfig,
    pub requests: Vec<(usize, usize)>,
    pub seed: u64,
    /// `None`: k and v expanded from the latent rows read back, every query row
    /// checked. `Some(n)`: random k and v (for timing large batches: the expansion
    /// and the reference of every row would take minutes on the CPU), the first and
    /// last `n` query rows of each request checked.
    pub check_rows: Option<usize>,
    /// Timed repetitions of the two calls (0: none).
    pub timing_iters: usize,
}

/// Device time of the step's layer calls, per call (the model's `kv_b_proj`
/// between them not included).
#[derive(Clone, Copy, Debug)]
pub struct MhaTiming {
    /// [`NsaLayer::mha_store`]: both stores and the latent read-back.
    pub store_us: f64,
    /// [`NsaLayer::mha_attend`].
    pub attend_us: f64,
}

#[derive(Debug)]
pub struct MhaReport {
    pub checks: Vec<Check>,
    pub timing: Option<MhaTiming>,
    /// What the step ran ([`crate::layer::MhaPlan::explain`]).
    pub explain: String,
}

/// The pages of each request (shuffled over the pool) and the `req_to_token` table.
struct Pages {
    table: Vec<i32>,
    width: usize,
    pool_slots: usize,
}

impl Pages {
    fn new(totals: &[usize], page: usize, seed: u64) -> Pages {
        let width = totals.iter().copied().max().unwrap_or(0).max(1).next_multiple_of(page);
        let pages: usize = totals.iter().map(|t| t.div_ceil(page)).sum();
        // Page 0 stays unused, as a server's dummy page.
        let order = testdata::distinct_slots(pages, pages, seed);
        let mut table = vec![0i32; totals.len().max(1) * width];
        let mut next = 0;
        for (r, &t) in totals.iter().enumerate() {
            for p in 0..t {
                if p % page == 0 {
                    next += 1;
                }
                let id = order[next - 1] as usize + 1;
                table[r * width + p] = (id * page + p % page) as i32;
            }
        }
        Pages { table, width, pool_slots: (pages + 1) * page }
    }

    fn slot(&self, r: usize, p: usize) -> i32 {
        self.table[r * self.width + p]
    }
}

/// `[keys, heads, 192]` k and `[keys, heads, 128]` v from latent rows `[keys, 576]`:
/// k = (nope · W_UKᵀ) ‖ rope and v = nope · W_UVᵀ per head, rounded to bf16, the
/// keys dealt over the machine's cores.
fn expand(latent: &[bf16], w_uk: &[f32], w_uv: &[f32], heads: usize) -> (Vec<bf16>, Vec<bf16>) {
    let (dq, dv, nope_w) = (MHA_QK_HEAD_DIM as usize, MHA_V_HEAD_DIM as usize, dq_nope());
    let keys = latent.len() / BF16_TOKEN_ELEMS;
    let mut k = vec![bf16::ZERO; keys * heads * dq];
    let mut v = vec![bf16::ZERO; keys * heads * dv];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(keys.max(1));
    let per = keys.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for ((kc, vc), rows) in k
            .chunks_mut(per * heads * dq)
            .zip(v.chunks_mut(per * heads * dv))
            .zip(latent.chunks(per * BF16_TOKEN_ELEMS))
        {
            s.spawn(move || {
                for (j, row) in rows.chunks(BF16_TOKEN_ELEMS).enumerate() {
                    let x: Vec<f32> = row.iter().map(|b| b.to_f32()).collect();
                    for h in 0..heads {
                        let kh = &mut kc[(j * heads + h) * dq..][..dq];
                        for (d, o) in kh[..nope_w].iter_mut().enumerate() {
                            let w = &w_uk[(h * nope_w + d) * KV_LORA_RANK..][..KV_LORA_RANK];
                            *o = bf16::from_f32(x[..KV_LORA_RANK].iter().zip(w).map(|(a, b)| a * b).sum());
                        }
                        kh[nope_w..].copy_from_slice(&row[KV_LORA_RANK..]);
                        let vh = &mut vc[(j * heads + h) * dv..][..dv];
                        for (d, o) in vh.iter_mut().enumerate() {
                            let w = &w_uv[(h * dv + d) * KV_LORA_RANK..][..KV_LORA_RANK];
                            *o = bf16::from_f32(x[..KV_LORA_RANK].iter().zip(w).map(|(a, b)| a * b).sum());
                        }
                    }
                }
            });
        }
    });
    (k, v)
}

/// The nope part of an expanded q/k head (192 − the rope 64).
fn dq_nope() -> usize {
    MHA_QK_HEAD_DIM as usize - ROPE_DIM
}

pub fn run(rt: &Runtime, case: &MhaCase) -> Result<MhaReport> {
    let stream = rt.gpu().stream();
    let model = &case.model;
    let (heads, page) = (model.num_q_heads as usize, model.page_size as usize);
    let fp8 = model.kv_cache == KvCacheFormat::Fp8;
    let totals: Vec<usize> = case.requests.iter().map(|&(p, n)| p + n).collect();
    let pages = Pages::new(&totals, page, case.seed);
    let mut rng = testdata::rng(case.seed);
    let all: usize = totals.iter().sum();
    // Moderate latent values (the stores' edge values are tested with the cache
    // family): softmax over expanded heads stays within f32 and bf16.
    let rows_all: Vec<bf16> =
        (0..all * BF16_TOKEN_ELEMS).map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0))).collect();
    let index_all = testdata::indexer_rows(all.max(1), case.seed ^ 2);
    // Every position's slot and row, request by request; the new tokens are the last of each.
    let (mut slots_all, mut old, mut new) = (Vec::new(), Vec::new(), Vec::new());
    for (r, &(prefix, _)) in case.requests.iter().enumerate() {
        for p in 0..totals[r] {
            let g = slots_all.len();
            slots_all.push(pages.slot(r, p));
            if p < prefix {
                old.push(g)
            } else {
                new.push(g)
            }
        }
    }
    let pick = |src: &[bf16], w: usize, which: &[usize]| -> Vec<bf16> {
        which.iter().flat_map(|&g| src[g * w..][..w].iter().copied()).collect()
    };
    let slots_of = |which: &[usize]| -> Vec<i32> { which.iter().map(|&g| slots_all[g]).collect() };

    // Reference caches before the step: the prefixes stored, the new slots a sentinel.
    let (old_nope, old_rope) = split_rows(&pick(&rows_all, BF16_TOKEN_ELEMS, &old));
    let (new_nope, new_rope) = split_rows(&pick(&rows_all, BF16_TOKEN_ELEMS, &new));
    let (old_slots, new_slots) = (slots_of(&old), slots_of(&new));
    let new_index = pick(&index_all, INDEXER_HEAD_DIM, &new);
    let mut ref_fp8 = vec![0xa5u8; if fp8 { pages.pool_slots * FP8_TOKEN_BYTES } else { 0 }];
    let mut ref_bf16 = vec![bf16::from_bits(0xa5a5); if fp8 { 0 } else { pages.pool_slots * BF16_TOKEN_ELEMS }];
    let mut ref_index = vec![0xa5u8; pages.pool_slots / INDEXER_PAGE_TOKENS * INDEXER_PAGE_BYTES];
    if fp8 {
        reference::store_fp8(&old_nope, &old_rope, &old_slots, &mut ref_fp8);
    } else {
        reference::store_bf16(&old_nope, &old_rope, &old_slots, &mut ref_bf16);
    }
    reference::store_indexer_k(&pick(&index_all, INDEXER_HEAD_DIM, &old), &old_slots, &mut ref_index);

    // Metadata and dispatch as a server builds them.
    let seq_lens: Vec<i32> = totals.iter().map(|&t| t as i32).collect();
    let extend_lens: Vec<i32> = case.requests.iter().map(|&(_, n)| n as i32).collect();
    let prefix_lens: Vec<i32> = case.requests.iter().map(|&(p, _)| p as i32).collect();
    let policy = DispatchPolicy {
        compute_capability: rt.gpu().caps().compute_capability,
        kv_cache: model.kv_cache,
        prefill_backend: PrefillBackend::Auto,
        topk: model.topk,
        max_chunk_capacity: usize::MAX,
        cp_enabled: false,
        force_mla: false,
    };
    let summary = BatchSummary { mode: ForwardMode::Extend, seq_lens: &seq_lens, extend_num_tokens: new.len() };
    let dispatch = decide(&policy, Some(&summary));
    let builder = MetadataBuilder::new(MetadataParams::from_config(model, pages.pool_slots))?;
    let rpi: Vec<i32> = (0..case.requests.len() as i32).collect();
    let batch = ExtendBatch {
        req_pool_indices: &rpi,
        seq_lens: &seq_lens,
        extend_lens: &extend_lens,
        prefix_lens: prefix_lens.iter().any(|&p| p > 0).then_some(&prefix_lens[..]),
    };
    let md = builder.extend(&ReqToToken::new(&pages.table, pages.width)?, batch, dispatch.extend_plan())?;
    let layer = NsaLayer::new(rt, LayerConfig::new(model.clone())?)?;
    let plan = layer.plan_mha(&md, &dispatch)?;
    let (t, keys) = (plan.rows(), plan.keys());
    let device_plan = same_plan_from_device_tables(rt, &layer, &plan, &pages, &seq_lens, &extend_lens, &dispatch)?;

    // GPU: the stores and the latent read-back.
    let (d_nope, d_rope) = (upload(stream, &new_nope)?, upload(stream, &new_rope)?);
    let (d_loc, d_index_k) = (upload(stream, &new_slots)?, upload(stream, &new_index)?);
    let mut d_index = upload(stream, &ref_index)?;
    let mut d_fp8 = upload(stream, &ref_fp8)?;
    let mut d_bf16 = upload(stream, &ref_bf16)?;
    let mut d_latent = upload(stream, &vec![bf16::from_bits(0x7fc0); keys.max(1) * BF16_TOKEN_ELEMS])?;
    let mut store = || -> Result<()> {
        let new_tokens = MhaNewTokens {
            k_nope: Rows { data: d_nope.slice(..), count: t, width: KV_LORA_RANK, stride: KV_LORA_RANK },
            k_rope: Rows { data: d_rope.slice(..), count: t, width: ROPE_DIM, stride: ROPE_DIM },
            out_cache_loc: d_loc.slice(..t),
            index_k: Rows { data: d_index_k.slice(..), count: t, width: INDEXER_HEAD_DIM, stride: INDEXER_HEAD_DIM },
        };
        let kv = if fp8 { MlaCacheMut::Fp8(d_fp8.slice_mut(..)) } else { MlaCacheMut::Bf16(d_bf16.slice_mut(..)) };
        let mut caches = LayerCaches { kv, index_k: d_index.slice_mut(..) };
        let mut latent = d_latent.slice_mut(..keys * BF16_TOKEN_ELEMS);
        layer.mha_store(&plan, &new_tokens, &mut caches, Some(&mut latent))
    };
    store()?;
    let store_us = (case.timing_iters > 0).then(|| super::device_us(rt, case.timing_iters, &mut store)).transpose()?;
    let latent = download(stream, &d_latent, keys * BF16_TOKEN_ELEMS)?;

    // The model's expansion, then dense attention.
    let scale = 1.0 / (KV_LORA_RANK as f32).sqrt();
    let mut weights = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-scale..scale)).collect() };
    let w_uk = weights(heads * dq_nope() * KV_LORA_RANK);
    let w_uv = weights(heads * MHA_V_HEAD_DIM as usize * KV_LORA_RANK);
    let (dq, dv) = (MHA_QK_HEAD_DIM as usize, MHA_V_HEAD_DIM as usize);
    let (k, v) = match case.check_rows {
        None => expand(&latent, &w_uk, &w_uv, heads),
        Some(_) => {
            let mut random =
                |n: usize| -> Vec<bf16> { (0..n).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect() };
            (random(keys * heads * dq), random(keys * heads * dv))
        }
    };
    let q: Vec<bf16> = (0..t * heads * dq).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect();
    let (d_q, d_k, d_v) = (upload(stream, &q)?, upload(stream, &k)?, upload(stream, &v)?);
    let mut d_out = upload(stream, &vec![bf16::from_f32(7.0); t.max(1) * heads * dv])?;
    let mut d_lse = upload(stream, &vec![7.0f32; t.max(1) * heads])?;
    let inputs = MhaInputs {
        q: d_q.slice(..t * heads * dq),
        k: d_k.slice(..keys * heads * dq),
        v: d_v.slice(..keys * heads * dv),
    };
    let mut attend = || {
        let (mut out_view, mut lse_view) = (d_out.slice_mut(..t * heads * dv), d_lse.slice_mut(..t * heads));
        layer.mha_attend(&plan, &inputs, MhaOutputs { out: &mut out_view, lse: &mut lse_view })
    };
    attend()?;
    let attend_us =
        (case.timing_iters > 0).then(|| super::device_us(rt, case.timing_iters, &mut attend)).transpose()?;
    let got_out = download(stream, &d_out, t * heads * dv)?;
    let got_lse = download(stream, &d_lse, t * heads)?;
    let got_fp8 = download(stream, &d_fp8, ref_fp8.len())?;
    let got_bf16 = download(stream, &d_bf16, ref_bf16.len())?;
    let got_index = download(stream, &d_index, ref_index.len())?;

    // References.
    reference::store_indexer_k(&new_index, &new_slots, &mut ref_index);
    let want_latent = if fp8 {
        reference::store_fp8(&new_nope, &new_rope, &new_slots, &mut ref_fp8);
        reference::dequant_fp8(&ref_fp8, &slots_all).0
    } else {
        reference::store_bf16(&new_nope, &new_rope, &new_slots, &mut ref_bf16);
        reference::gather_bf16(&ref_bf16, &slots_all).0
    };
    let f = |x: &[bf16]| x.iter().map(|b| b.to_f32()).collect::<Vec<f32>>();
    let (qf, kf, vf) = (f(&q), f(&k), f(&v));
    // Query rows checked: all, or each request's first and last `n`.
    let mut checked = vec![case.check_rows.is_none(); t];
    if let Some(n) = case.check_rows {
        for w in md.cu_seqlens_q.windows(2) {
            let (a, b) = (w[0] as usize, w[1] as usize);
            checked[a..b].iter_mut().enumerate().for_each(|(i, c)| *c = i < n || i + n >= b - a);
        }
    }
    let want = dense_causal_rows(
        &DenseBatch {
            q: &qf,
            k: &kf,
            v: &vf,
            cu_seqlens_q: &md.cu_seqlens_q,
            cu_seqlens_k: &md.cu_seqlens_k,
            heads,
            d_qk: dq,
            d_v: dv,
            sm_scale: layer.config().sm_scale,
        },
        |r| checked[r],
    )?;
    let name = format!("{} cache, h{heads}, (prefix, new) {:?}", model.kv_cache.tag(), case.requests);
    let rows_check = |kernel: &str, differ: Vec<bool>| Check {
        kernel: kernel.into(),
        case: name.clone(),
        items: differ.len(),
        mismatches: differ.iter().filter(|&&d| d).count(),
        first_mismatch: differ.iter().position(|&d| d).map(|r| format!("row {r} differs")),
    };
    let bits = |x: &[bf16]| x.iter().map(|b| b.to_bits()).collect::<Vec<u16>>();
    let differ_rows = |g: &[u16], w: &[u16], row: usize| -> Vec<bool> {
        g.chunks(row).zip(w.chunks(row)).map(|(a, b)| a != b).collect()
    };
    let kv_rows = if fp8 {
        got_fp8.chunks(FP8_TOKEN_BYTES).zip(ref_fp8.chunks(FP8_TOKEN_BYTES)).map(|(a, b)| a != b).collect()
    } else {
        differ_rows(&bits(&got_bf16), &bits(&ref_bf16), BF16_TOKEN_ELEMS)
    };
    let index_pages =
        got_index.chunks(INDEXER_PAGE_BYTES).zip(ref_index.chunks(INDEXER_PAGE_BYTES)).map(|(a, b)| a != b).collect();
    let (bad, first) = compare(&got_out, &got_lse, &want, heads, dv, |r| checked[r]);
    let explain = plan.explain(&dispatch);
    let checks = vec![
        rows_check("layer MHA: plan from device tables (offsets, slots, extents)", device_plan),
        rows_check("layer MHA: KV store", kv_rows),
        rows_check("layer MHA: index-K store", index_pages),
        rows_check(
            "layer MHA: latent rows read back",
            differ_rows(&bits(&latent), &bits(&want_latent), BF16_TOKEN_ELEMS),
        ),
        Check {
            kernel: "layer MHA: dense attention".into(),
            case: name,
            items: checked.iter().filter(|&&c| c).count() * heads,
            mismatches: bad,
            first_mismatch: first,
        },
    ];
    let timing = store_us.zip(attend_us).map(|(store_us, attend_us)| MhaTiming { store_us, attend_us });
    Ok(MhaReport { checks, timing, explain })
}

/// [`NsaLayer::plan_mha_on_device`] over the same batch as device tables (rows wider
/// than the host's, requests in reverse rows) against the host plan: per part
/// (query offsets, key offsets, slots, extents), whether it differs.
fn same_plan_from_device_tables(
    rt: &Runtime,
    layer: &NsaLayer<'_>,
    host_plan: &MhaPlan,
    pages: &Pages,
    seq_lens: &[i32],
    extend_lens: &[i32],
    dispatch: &Dispatch,
) -> Result<Vec<bool>> {
    let stream = rt.gpu().stream();
    let bs = seq_lens.len();
    let width = pages.width + 7;
    let mut table = vec![-1i32; bs.max(1) * width];
    for r in 0..bs {
        table[r * width..][..pages.width].copy_from_slice(&pages.table[r * pages.width..][..pages.width]);
    }
    // Request i lives in table row bs - 1 - i.
    let rpi: Vec<i32> = (0..bs as i32).rev().collect();
    let mut rows = vec![0i32; table.len()];
    for (i, &row) in rpi.iter().enumerate() {
        rows[row as usize * width..][..width].copy_from_slice(&table[i * width..][..width]);
    }
    let (d_table, d_rpi) = (upload(stream, &rows)?, upload(stream, &rpi)?);
    let (d_seq, d_ext) = (upload(stream, seq_lens)?, upload(stream, extend_lens)?);
    let (v_table, v_rpi, v_seq, v_ext) = (d_table.slice(..), d_rpi.slice(..bs), d_seq.slice(..bs), d_ext.slice(..bs));
    let batch = DeviceBatch {
        reqs: DeviceRequests {
            req_to_token: &v_table,
            req_to_token_width: width,
            req_pool_indices: &v_rpi,
            seq_lens: &v_seq,
        },
        extend_lens: Some(&v_ext),
    };
    let capacity = ExtendCapacity {
        max_bs: bs.max(1),
        max_tokens: host_plan.rows().max(1),
        max_keys: host_plan.keys().max(1),
        max_context_len: width,
    };
    let mut state =
        DeviceExtendState::new(rt, MetadataParams::from_config(&layer.config().model, pages.pool_slots), capacity)?;
    let host = HostLens { seq_lens, extend_lens: Some(extend_lens) };
    let dev_plan = layer.plan_mha_on_device(&mut state, &batch, host, dispatch)?;
    let get = |p: &MhaPlan| -> Result<[Vec<i32>; 3]> {
        let dl = |v: &cudarc::driver::CudaView<'_, i32>| {
            stream.clone_dtoh(v).map_err(crate::Error::driver("downloading an MHA plan"))
        };
        Ok([dl(&p.cu_seqlens_q())?, dl(&p.cu_seqlens_k())?, dl(&p.slots())?])
    };
    let (want, got) = (get(host_plan)?, get(&dev_plan)?);
    let mut differ: Vec<bool> = want.iter().zip(&got).map(|(w, g)| w != g).collect();
    let extents = |p: &MhaPlan| (p.rows(), p.keys(), p.has_prefix());
    differ.push(extents(&dev_plan) != extents(host_plan));
    Ok(differ)
}
