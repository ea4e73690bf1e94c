//! The CPU reference of every step the loop runs: the oracle keeps host copies of
//! both caches (updated with each step's stores by the reference store), and for
//! sampled rows checks the layer's top-k against reference indexer logits and its
//! attention output against reference attention over the keys it selected.

use crate::StepActivations;
use cudarc::driver::CudaSlice;
use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::{KernelSpec, NsaConfig};
use nsa_runtime::layer::{AttentionStage, LayerWorkspace};
use nsa_runtime::reference::indexer::{index_k_at, QueryRow};
use nsa_runtime::reference::kv_cache::{dequantize_fp8_token, store_fp8, store_indexer_k};
use nsa_runtime::reference::sparse_mla::{attend, Attention, DecodeDequant, PagedFp8};
use nsa_runtime::reference::topk::check_row;
use nsa_runtime::verify::attention::{compare, sample_rows, GpuAttention};
use nsa_runtime::verify::layer::topk_within;
use nsa_runtime::verify::{download, split_rows, Check};
use nsa_runtime::{Error, Result, Runtime};
use std::collections::HashMap;

/// One query row: the slots of the positions it sees, in position order.
#[derive(Debug)]
pub struct Row {
    pub slots: Vec<i32>,
}

/// What the layer wrote for a step, and how its attention read the cache.
#[derive(Debug)]
pub struct GpuStep<'a> {
    pub out: &'a CudaSlice<bf16>,
    pub lse: &'a CudaSlice<f32>,
    pub ws: &'a LayerWorkspace,
    pub stage: &'a AttentionStage,
}

#[derive(Debug)]
pub struct Oracle {
    fp8: Vec<u8>,
    index: Vec<u8>,
    heads: usize,
    index_heads: usize,
    topk: usize,
    sm_scale: f32,
    wgmma: bool,
}

impl Oracle {
    /// Empty caches of `slots` slots (zero bytes, as the server allocates them).
    pub fn new(rt: &Runtime, model: &NsaConfig, slots: usize) -> Oracle {
        Oracle {
            fp8: vec![0; slots * FP8_TOKEN_BYTES],
            index: vec![0; slots / INDEXER_PAGE_TOKENS * INDEXER_PAGE_BYTES],
            heads: model.num_q_heads as usize,
            index_heads: model.index_n_heads as usize,
            topk: model.topk as usize,
            sm_scale: DEEPSEEK_V32_SM_SCALE,
            wgmma: nsa_kernels::spec::indexer_wg_kernel(model.index_n_heads, rt.target()),
        }
    }

    /// Applies the step's stores, then checks `check_rows` sampled rows of it.
    pub fn step(
        &mut self,
        rt: &Runtime,
        what: &str,
        rows: &[Row],
        acts: &StepActivations,
        gpu: &GpuStep<'_>,
        check_rows: usize,
    ) -> Result<Vec<Check>> {
        let (nope, rope) = split_rows(&acts.latent);
        store_fp8(&nope, &rope, &acts.loc, &mut self.fp8);
        store_indexer_k(&acts.index_k, &acts.loc, &mut self.index);
        let stream = rt.gpu().stream();
        let (t, h, k, ih) = (rows.len(), self.heads, self.topk, self.index_heads);
        let out = download(stream, gpu.out, t * h * KV_LORA_RANK)?;
        let lse = download(stream, gpu.lse, t * h)?;
        let indices = download(stream, gpu.ws.indices(), t * k)?;
        let paged = PagedFp8 {
            bytes: &self.fp8,
            page_size: INDEXER_PAGE_TOKENS,
            page_stride: INDEXER_PAGE_TOKENS * FP8_TOKEN_BYTES,
            dequant: match gpu.stage {
                AttentionStage::Decode(p) => DecodeDequant::of(&KernelSpec::new(p.family(), p.target)),
                _ => DecodeDequant::Bf16Rounded,
            },
        };
        let key = |slot: i32| -> Result<Vec<f32>> {
            match gpu.stage {
                AttentionStage::Decode(_) => Ok(paged.token(slot as usize)),
                AttentionStage::PrefillRagged(_) => {
                    let record = &self.fp8[slot as usize * FP8_TOKEN_BYTES..][..FP8_TOKEN_BYTES];
                    Ok(dequantize_fp8_token(record).iter().map(|v| v.to_f32()).collect())
                }
                AttentionStage::PrefillPaged(_) => Err(Error::Other("a bf16-cache stage in an FP8 server".into())),
            }
        };
        let picked = sample_rows(t, check_rows);
        let (mut topk_bad, mut topk_first) = (0, None);
        let mut want_attn: Vec<Attention> = Vec::new();
        for &r in &picked {
            let row = &rows[r];
            let n = row.slots.len();
            let q8 = &acts.index_q[r * ih * INDEXER_HEAD_DIM..][..ih * INDEXER_HEAD_DIM];
            let query = QueryRow::new(q8, &acts.weights[r * ih..][..ih]);
            let logits: Vec<(f32, f32)> = row
                .slots
                .iter()
                .map(|&s| {
                    let (kb, scale) = index_k_at(&self.index, s as usize);
                    query.logit_and_spread(kb, scale)
                })
                .collect();
            let position: HashMap<i32, i32> = row.slots.iter().enumerate().map(|(p, &s)| (s, p as i32)).collect();
            let chosen = &indices[r * k..(r + 1) * k];
            // PAGED indices are slots; RAGGED ones are rows of the step's ragged KV,
            // which the oracle does not rebuild: their attention is still checked.
            let positions: Vec<Option<i32>> =
                chosen.iter().map(|&v| if v < 0 { Some(-1) } else { position.get(&v).copied() }).collect();
            let err = if n <= k {
                check_row(&vec![0.0; n], k, &positions).err()
            } else {
                topk_within(&logits, &positions, self.wgmma)
            };
            if let Some(e) = err {
                topk_bad += 1;
                topk_first.get_or_insert(format!("row {r}: {e}"));
            }
            let keys: Vec<Vec<f32>> = chosen.iter().filter(|&&v| v >= 0).map(|&v| key(v)).collect::<Result<_>>()?;
            let refs: Vec<&[f32]> = keys.iter().map(|v| v.as_slice()).collect();
            let q: Vec<f32> =
                acts.q[r * h * BF16_TOKEN_ELEMS..][..h * BF16_TOKEN_ELEMS].iter().map(|v| v.to_f32()).collect();
            want_attn.push(attend(&q, h, BF16_TOKEN_ELEMS, &refs, self.sm_scale));
        }
        let (attn_bad, attn_first) =
            compare(&GpuAttention { heads: h, out: &out, lse: &lse, max_logits: None }, &picked, &want_attn);
        let check = |kernel: &str, mismatches, first_mismatch| Check {
            kernel: kernel.into(),
            case: what.into(),
            items: picked.len(),
            mismatches,
            first_mismatch,
        };
        Ok(vec![
            check("server loop: top-k", topk_bad, topk_first),
            check("server loop: sparse MLA", attn_bad, attn_first),
        ])
    }
}
