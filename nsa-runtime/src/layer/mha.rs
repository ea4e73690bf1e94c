//! MHA one-shot batches (spec §5.1): an extend batch whose every request's keys fit
//! in the top-k (and the chunk capacity) runs plain causal attention over the
//! expanded heads instead of sparse absorbed MLA: ~3.4× fewer FLOPs per key and no
//! indexer or top-k. The model owns `kv_b_proj`, so a step takes three calls:
//!
//! 1. [`NsaLayer::mha_store`]: the new tokens' latent KV and indexer keys go into
//!    the caches as in any step, and each request's latent rows (prefix, then new
//!    tokens) are read back out as bf16 `[keys, 576]` (FP8 caches dequantized) for
//!    the model to expand;
//! 2. the model: `k = (latent[..512] · W_UK) ‖ rope`, `v = latent[..512] · W_UV`, per head;
//! 3. [`NsaLayer::mha_attend`]: dense causal attention of the expanded q/k/v.

use super::device_plan::{DeviceBatch, HostLens};
use super::{check_store, NsaLayer};
use crate::metadata::extend_device::DeviceExtendState;
use crate::metadata::{Dispatch, ForwardMode, NsaMetadata};
use crate::ops::dense_prefill::{dense_prefill, DenseInputs, DenseOutputs, DenseShape};
use crate::ops::kv_cache::{self, MlaCacheMut};
use crate::ops::{check_len, invalid, Rows};
use crate::{Error, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::bf16;
use nsa_kernels::layout::BF16_TOKEN_ELEMS;
use std::ops::Range;

/// Width of an expanded q/k head: DeepSeek V3.2's `qk_nope_head_dim` 128 + the rope 64.
pub const MHA_QK_HEAD_DIM: u32 = nsa_kernels::spec::MHA_HEAD_DIMS.0;
/// Width of an expanded v head (`v_head_dim`).
pub const MHA_V_HEAD_DIM: u32 = nsa_kernels::spec::MHA_HEAD_DIMS.1;

/// An MHA one-shot step's layout on the device: the query and key offsets of each
/// request and the cache slots of its keys, built once per step and shared by every
/// layer.
#[derive(Debug)]
pub struct MhaPlan {
    heads: u32,
    target: nsa_kernels::Target,
    batch: usize,
    rows: usize,
    keys: usize,
    max_seqlen_q: usize,
    has_prefix: bool,
    buf: CudaSlice<i32>,
    cu_q: Range<usize>,
    cu_k: Range<usize>,
    slots: Range<usize>,
}

impl MhaPlan {
    /// Query tokens `T` of the step.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Keys of all requests, prefixes included (`Σ seq_lens`).
    pub fn keys(&self) -> usize {
        self.keys
    }

    /// Whether some request has cached keys before its new tokens (then the model
    /// needs the latent rows [`NsaLayer::mha_store`] reads back).
    pub fn has_prefix(&self) -> bool {
        self.has_prefix
    }

    /// `[batch + 1]` query offsets (`cu_seqlens_q`).
    pub fn cu_seqlens_q(&self) -> CudaView<'_, i32> {
        self.buf.slice(self.cu_q.clone())
    }

    /// `[batch + 1]` key offsets (`cu_seqlens_k`), the rows of `latent`, `k` and `v`.
    pub fn cu_seqlens_k(&self) -> CudaView<'_, i32> {
        self.buf.slice(self.cu_k.clone())
    }

    /// `[keys]` cache slots of the keys, `cu_seqlens_k` order.
    pub fn slots(&self) -> CudaView<'_, i32> {
        self.buf.slice(self.slots.clone())
    }

    /// The dense kernel the step runs.
    pub fn kernel(&self) -> nsa_kernels::KernelSpec {
        let family = nsa_kernels::KernelFamily::DensePrefill {
            heads: self.heads,
            d_qk: MHA_QK_HEAD_DIM,
            d_v: MHA_V_HEAD_DIM,
            kernel: nsa_kernels::spec::mha_kernel(self.target),
        };
        nsa_kernels::KernelSpec::new(family, self.target)
    }

    /// One line: what the step runs and why.
    pub fn explain(&self, dispatch: &Dispatch) -> String {
        format!(
            "attention: {} over {} requests, {} query rows, {} keys{} ({})",
            self.kernel().id(),
            self.batch,
            self.rows,
            self.keys,
            if self.has_prefix { ", prefix read back from the cache" } else { "" },
            dispatch.reason
        )
    }
}

/// The new tokens of an MHA one-shot step, as [`super::LayerInputs`] holds them.
#[derive(Debug)]
pub struct MhaNewTokens<'a> {
    /// `T` rows of 512: the new tokens' latent.
    pub k_nope: Rows<'a, bf16>,
    /// `T` rows of 64: their rope part.
    pub k_rope: Rows<'a, bf16>,
    /// `[T]` cache slots.
    pub out_cache_loc: CudaView<'a, i32>,
    /// `T` rows of 128 bf16: their indexer keys.
    pub index_k: Rows<'a, bf16>,
}

/// The expanded heads the model computes: `q` `[T, heads, 192]` (nope ‖ rope),
/// `k` `[keys, heads, 192]` and `v` `[keys, heads, 128]` in `cu_seqlens_k` order.
#[derive(Debug)]
pub struct MhaInputs<'a> {
    pub q: CudaView<'a, bf16>,
    pub k: CudaView<'a, bf16>,
    pub v: CudaView<'a, bf16>,
}

/// `out` `[T, heads, 128]` bf16 (value space: the model applies `o_proj`) and `lse`
/// `[T, heads]` f32 (natural log).
#[derive(Debug)]
pub struct MhaOutputs<'a, 'b> {
    pub out: &'a mut CudaViewMut<'b, bf16>,
    pub lse: &'a mut CudaViewMut<'b, f32>,
}

impl NsaLayer<'_> {
    /// The plan of an MHA one-shot extend step (`dispatch.use_mha`): uploads the
    /// offsets and the keys' slots (`page_table_1` rows) in one copy.
    pub fn plan_mha(&self, md: &NsaMetadata, dispatch: &Dispatch) -> Result<MhaPlan> {
        check_mha_dispatch(dispatch)?;
        if md.mode != ForwardMode::Extend || md.bs_idx.is_some() {
            return Err(invalid(
                "metadata.mode",
                format!("{}{}", md.mode.name(), if md.bs_idx.is_some() { " with a CP split" } else { "" }),
                "an extend batch without context parallelism (spec §5.1)",
            ));
        }
        let batch = md.cache_seqlens.len();
        let (cu_q, cu_k) = (&md.cu_seqlens_q, &md.cu_seqlens_k);
        if cu_q.len() != batch + 1 || cu_k.len() != batch + 1 {
            return Err(invalid(
                "metadata.cu_seqlens_q/k",
                format!("{}/{} offsets for {batch} requests", cu_q.len(), cu_k.len()),
                "batch + 1 each (metadata from MetadataBuilder::extend)",
            ));
        }
        let (rows, keys) = (cu_q[batch] as usize, cu_k[batch] as usize);
        let mut staging = Vec::with_capacity(2 * batch + 2 + keys);
        staging.extend_from_slice(cu_q);
        staging.extend_from_slice(cu_k);
        for (r, &len) in md.cache_seqlens.iter().enumerate() {
            staging.extend_from_slice(&md.page_table_1.row(r)[..len as usize]);
        }
        staging.resize(staging.len().max(1), 0); // an empty batch still gets a buffer
        let buf = self
            .rt
            .gpu()
            .stream()
            .clone_htod(&staging)
            .map_err(Error::driver("uploading the MHA offsets and slots"))?;
        let max_seqlen_q = cu_q.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0);
        Ok(self.mha_plan_over(buf, batch, rows, keys, max_seqlen_q))
    }

    /// [`NsaLayer::plan_mha`] from the server's device tables, as
    /// [`NsaLayer::plan_extend_on_device`] builds a sparse step: one metadata launch
    /// into `state`, whose offsets and ragged slots are then copied into the plan
    /// (device to device), so `state` is free for the next step as soon as this
    /// returns. `host` gives the lengths (`extend_lens` required), which must equal
    /// the device ones.
    pub fn plan_mha_on_device(
        &self,
        state: &mut DeviceExtendState,
        batch: &DeviceBatch<'_>,
        host: HostLens<'_>,
        dispatch: &Dispatch,
    ) -> Result<MhaPlan> {
        check_mha_dispatch(dispatch)?;
        let e = host
            .extend_lens
            .ok_or_else(|| invalid("host.extend_lens", "none", "the query length of every request (extend)"))?;
        let d_ext = batch
            .extend_lens
            .ok_or_else(|| invalid("batch.extend_lens", "none", "the query lengths on the device (extend)"))?;
        let x = state.extent(host.seq_lens, e)?;
        check_len("batch.reqs.seq_lens", batch.reqs.seq_lens.len(), x.bs, "one entry per request of host.seq_lens")?;
        state.build(self.rt, &batch.reqs, d_ext)?;
        let b = state.buffers(&x);
        let stream = self.rt.gpu().stream();
        let n = 2 * x.bs + 2 + x.num_keys;
        // SAFETY: the three copies below write all n entries (bs + 1 offsets twice,
        // then num_keys slots) before any launch reads them, in stream order.
        let mut buf =
            unsafe { stream.alloc::<i32>(n) }.map_err(Error::driver("allocating the MHA offsets and slots"))?;
        let parts = [(&b.cu_seqlens_q, 0), (&b.cu_seqlens_k, x.bs + 1), (&b.slots, 2 * x.bs + 2)];
        for (src, at) in parts {
            if !src.is_empty() {
                stream
                    .memcpy_dtod(src, &mut buf.slice_mut(at..at + src.len()))
                    .map_err(Error::driver("copying the MHA offsets and slots"))?;
            }
        }
        let max_seqlen_q = e.iter().map(|&v| v as usize).max().unwrap_or(0);
        Ok(self.mha_plan_over(buf, x.bs, x.rows, x.num_keys, max_seqlen_q))
    }

    /// A plan over `buf`: `[batch + 1]` query offsets, `[batch + 1]` key offsets,
    /// then `keys` slots.
    fn mha_plan_over(
        &self,
        buf: CudaSlice<i32>,
        batch: usize,
        rows: usize,
        keys: usize,
        max_seqlen_q: usize,
    ) -> MhaPlan {
        MhaPlan {
            heads: self.cfg.model.num_q_heads,
            target: self.rt.target(),
            batch,
            rows,
            keys,
            max_seqlen_q,
            has_prefix: keys > rows,
            buf,
            cu_q: 0..batch + 1,
            cu_k: batch + 1..2 * batch + 2,
            slots: 2 * batch + 2..2 * batch + 2 + keys,
        }
    }

    /// Stores the new tokens' latent KV and indexer keys, then reads every request's
    /// latent rows (prefix and new tokens, `cu_seqlens_k` order) out of the cache
    /// into `latent` (`[keys, 576]` bf16). `latent` is required when the step has a
    /// prefix; without one the model may expand its own rows and pass `None`.
    pub fn mha_store(
        &self,
        plan: &MhaPlan,
        new: &MhaNewTokens<'_>,
        caches: &mut super::LayerCaches<'_>,
        latent: Option<&mut CudaViewMut<'_, bf16>>,
    ) -> Result<()> {
        self.check_plan(plan)?;
        check_store(&self.cfg, caches)?;
        check_len("out_cache_loc", new.out_cache_loc.len(), plan.rows, "one slot per query row")?;
        if plan.has_prefix && latent.is_none() {
            return Err(invalid(
                "latent",
                "None",
                format!("[{} keys, 576] bf16: the step has a prefix the model must expand", plan.keys),
            ));
        }
        if let Some(l) = &latent {
            check_len("latent", l.len(), plan.keys * BF16_TOKEN_ELEMS, "keys × 576")?;
        }
        let rt = self.rt;
        kv_cache::store_step(
            rt,
            &new.k_nope,
            &new.k_rope,
            &new.index_k,
            &new.out_cache_loc,
            &mut caches.kv,
            &mut caches.index_k,
        )?;
        let (Some(latent), true) = (latent, plan.keys > 0) else { return Ok(()) };
        let slots = plan.buf.slice(plan.slots.clone());
        match &caches.kv {
            MlaCacheMut::Fp8(c) => kv_cache::dequant_fp8(rt, &c.as_view(), &slots, latent),
            MlaCacheMut::Bf16(c) => kv_cache::gather_bf16(rt, &c.as_view(), &slots, latent),
        }
    }

    /// Dense causal attention of each request's query rows over its keys.
    pub fn mha_attend(&self, plan: &MhaPlan, inputs: &MhaInputs<'_>, outputs: MhaOutputs<'_, '_>) -> Result<()> {
        self.check_plan(plan)?;
        let shape = DenseShape {
            heads: plan.heads,
            d_qk: MHA_QK_HEAD_DIM,
            d_v: MHA_V_HEAD_DIM,
            batch: plan.batch,
            rows: plan.rows,
            keys: plan.keys,
            max_seqlen_q: plan.max_seqlen_q,
            target: self.rt.target(),
            kernel: nsa_kernels::spec::mha_kernel(self.rt.target()),
        };
        let dense = DenseInputs {
            q: inputs.q.slice(..),
            k: inputs.k.slice(..),
            v: inputs.v.slice(..),
            cu_seqlens_q: plan.cu_seqlens_q(),
            cu_seqlens_k: plan.cu_seqlens_k(),
            sm_scale: self.cfg.sm_scale,
        };
        dense_prefill(self.rt, &shape, &dense, DenseOutputs { out: outputs.out, lse: outputs.lse })
    }

    fn check_plan(&self, plan: &MhaPlan) -> Result<()> {
        if plan.heads != self.cfg.model.num_q_heads {
            return Err(invalid(
                "plan",
                format!("an MHA plan of {} heads", plan.heads),
                format!("a plan made by a layer of {} heads (NsaLayer::plan_mha)", self.cfg.model.num_q_heads),
            ));
        }
        Ok(())
    }
}

fn check_mha_dispatch(dispatch: &Dispatch) -> Result<()> {
    if !dispatch.use_mha {
        return Err(invalid(
            "dispatch.use_mha",
            format!("false ({})", dispatch.reason),
            "an MHA one-shot dispatch; plan sparse batches with NsaLayer::plan",
        ));
    }
    Ok(())
}
