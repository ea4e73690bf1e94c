//! MHA one-shot steps from Python (`Layer.mha_store`, `Layer.mha_attend`): the
//! tensors of each call imported and checked, and the caches both they and
//! `Layer.forward` write.

use crate::error::IntoPy;
use crate::tensor::{import, import_opt, DType, Tensor};
use half::bf16;
use nsa_runtime::foreign::ForeignBuffer;
use nsa_runtime::kernels::layout::{
    BF16_TOKEN_ELEMS, FP8_TOKEN_BYTES, INDEXER_HEAD_DIM, INDEXER_PAGE_BYTES, INDEXER_PAGE_TOKENS, KV_LORA_RANK,
    ROPE_DIM,
};
use nsa_runtime::kernels::KvCacheFormat;
use nsa_runtime::layer::{
    LayerCaches, MhaInputs, MhaNewTokens, MhaOutputs, MhaPlan, NsaLayer, MHA_QK_HEAD_DIM, MHA_V_HEAD_DIM,
};
use nsa_runtime::ops::kv_cache::MlaCacheMut;
use nsa_runtime::ops::Rows;
use nsa_runtime::Runtime;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// `[len]` int32, contiguous.
pub fn int_vector(t: &Tensor, len: usize, what: &str) -> PyResult<()> {
    t.dtype_in(&[DType::I32])?;
    t.shape_is(&[len], what)?;
    t.contiguous()
}

/// `t` rows of `width` bf16 with any row stride.
fn bf16_rows(x: &Tensor, t: usize, width: usize) -> PyResult<()> {
    x.dtype_in(&[DType::Bf16])?;
    x.shape_is(&[t, width], "one row per query row (any row stride)")?;
    x.packed_from(1)
}

/// A contiguous bf16 or f32 tensor of exactly `shape`, written by nsa.
fn output(x: &Tensor, dtype: DType, shape: &[usize], what: &str) -> PyResult<()> {
    x.dtype_in(&[dtype])?;
    x.shape_is(shape, what)?;
    x.contiguous()?;
    x.writable()
}

/// The new tokens' inputs of a store: k_nope, k_rope, out_cache_loc and index_k of
/// `t` query rows.
pub fn check_new_tokens(k_nope: &Tensor, k_rope: &Tensor, loc: &Tensor, index_k: &Tensor, t: usize) -> PyResult<()> {
    for (x, width) in [(k_nope, KV_LORA_RANK), (k_rope, ROPE_DIM), (index_k, INDEXER_HEAD_DIM)] {
        bf16_rows(x, t, width)?;
    }
    int_vector(loc, t, "one cache slot per query row")
}

/// The layer's two caches: the MLA cache in `format` and the indexer's paged keys,
/// each holding at least `pool_slots` slots.
pub fn check_caches(kv: &Tensor, index_cache: &Tensor, format: KvCacheFormat, pool_slots: usize) -> PyResult<()> {
    let (dtypes, width): (&[DType], usize) = match format {
        KvCacheFormat::Fp8 => (&[DType::U8, DType::F8E4M3], FP8_TOKEN_BYTES),
        KvCacheFormat::Bf16 => (&[DType::Bf16], BF16_TOKEN_ELEMS),
    };
    kv.dtype_in(dtypes)?;
    kv.contiguous()?;
    let slots = kv.shape.iter().product::<usize>() / width;
    if kv.shape.last() != Some(&width) || slots < pool_slots {
        return Err(PyValueError::new_err(format!(
            "`kv_cache`: shape {:?}, expected ≥ {pool_slots} slots (pool_slots) of {width} {} in its last dimension",
            kv.shape,
            if format == KvCacheFormat::Fp8 { "bytes (the FP8 record)" } else { "bf16 (latent 512 ‖ rope 64)" }
        )));
    }
    index_cache.dtype_in(&[DType::U8])?;
    index_cache.contiguous()?;
    let bytes = index_cache.shape.iter().product::<usize>();
    let pages = pool_slots.div_ceil(INDEXER_PAGE_TOKENS);
    if bytes % INDEXER_PAGE_BYTES != 0 || bytes / INDEXER_PAGE_BYTES < pages {
        return Err(PyValueError::new_err(format!(
            "`index_k_cache`: {bytes} bytes, expected ≥ {pages} whole pages of {INDEXER_PAGE_BYTES} bytes \
             (64 keys × 128 e4m3, then 64 f32 scales), e.g. shape ({pages}, {INDEXER_PAGE_BYTES})"
        )));
    }
    Ok(())
}

/// The caches' memory for one call's launches.
pub struct CacheBuffers {
    kv: KvBuffer,
    index: ForeignBuffer<u8>,
}

enum KvBuffer {
    Fp8(ForeignBuffer<u8>),
    Bf16(ForeignBuffer<bf16>),
}

impl CacheBuffers {
    /// `kv` and `index_cache`, checked by [`check_caches`].
    pub fn new(rt: &Runtime, kv: &Tensor, index_cache: &Tensor) -> PyResult<Self> {
        let kv = match kv.dtype {
            DType::Bf16 => KvBuffer::Bf16(kv.buffer::<bf16>(rt)?),
            _ => KvBuffer::Fp8(kv.buffer::<u8>(rt)?),
        };
        Ok(CacheBuffers { kv, index: index_cache.buffer::<u8>(rt)? })
    }

    pub fn caches(&mut self) -> LayerCaches<'_> {
        let kv = match &mut self.kv {
            KvBuffer::Fp8(b) => MlaCacheMut::Fp8(b.view_mut()),
            KvBuffer::Bf16(b) => MlaCacheMut::Bf16(b.view_mut()),
        };
        LayerCaches { kv, index_k: self.index.view_mut() }
    }
}

/// `t` rows of `x` (checked by [`check_new_tokens`]) as the layer reads them.
pub fn rows<'b>(b: &'b ForeignBuffer<bf16>, x: &Tensor, t: usize, width: usize) -> PyResult<Rows<'b, bf16>> {
    Ok(Rows { data: b.view(), count: t, width, stride: x.stride(0)? })
}

const STORE_NAMES: [&str; 6] = ["k_nope", "k_rope", "out_cache_loc", "index_k", "kv_cache", "index_k_cache"];

/// The tensors of one `Layer.mha_store`.
pub struct MhaStore {
    t: [Tensor; 6],
    latent: Option<Tensor>,
}

impl MhaStore {
    pub fn import(
        objs: [&Bound<'_, PyAny>; 6],
        latent: Option<&Bound<'_, PyAny>>,
        stream: Option<usize>,
    ) -> PyResult<Self> {
        let mut v = Vec::with_capacity(6);
        for (name, obj) in STORE_NAMES.into_iter().zip(objs) {
            v.push(import(name, obj, stream)?);
        }
        let t = v.try_into().unwrap_or_else(|_| unreachable!("six names, six tensors"));
        Ok(MhaStore { t, latent: import_opt("latent", latent, stream)? })
    }

    pub fn all(&self) -> impl Iterator<Item = &Tensor> {
        self.t.iter().chain(self.latent.as_ref())
    }

    pub fn check(&self, plan: &MhaPlan, format: KvCacheFormat, pool_slots: usize) -> PyResult<()> {
        let [k_nope, k_rope, loc, index_k, kv, index_cache] = &self.t;
        check_new_tokens(k_nope, k_rope, loc, index_k, plan.rows())?;
        check_caches(kv, index_cache, format, pool_slots)?;
        match &self.latent {
            Some(l) => output(l, DType::Bf16, &[plan.keys(), BF16_TOKEN_ELEMS], "the plan's keys × 576"),
            None if plan.has_prefix() => Err(PyValueError::new_err(format!(
                "`latent`: None, expected a ({}, {BF16_TOKEN_ELEMS}) bfloat16 tensor: the step has cached prefixes \
                 (plan.keys {} > plan.rows {}) whose latent rows the model must expand",
                plan.keys(),
                plan.keys(),
                plan.rows()
            ))),
            None => Ok(()),
        }
    }

    pub fn run(&self, rt: &Runtime, layer: &NsaLayer<'_>, plan: &MhaPlan) -> PyResult<()> {
        let [k_nope, k_rope, loc, index_k, kv, index_cache] = &self.t;
        let t = plan.rows();
        let (nb, rb, ib) = (k_nope.buffer::<bf16>(rt)?, k_rope.buffer::<bf16>(rt)?, index_k.buffer::<bf16>(rt)?);
        let lb = loc.buffer::<i32>(rt)?;
        let new = MhaNewTokens {
            k_nope: rows(&nb, k_nope, t, KV_LORA_RANK)?,
            k_rope: rows(&rb, k_rope, t, ROPE_DIM)?,
            out_cache_loc: lb.view(),
            index_k: rows(&ib, index_k, t, INDEXER_HEAD_DIM)?,
        };
        let mut cb = CacheBuffers::new(rt, kv, index_cache)?;
        let mut latent = self.latent.as_ref().map(|l| l.buffer::<bf16>(rt)).transpose()?;
        let mut latent_view = latent.as_mut().map(|b| b.view_mut());
        layer.mha_store(plan, &new, &mut cb.caches(), latent_view.as_mut()).py()
    }
}

const ATTEND_NAMES: [&str; 5] = ["q", "k", "v", "out", "lse"];

/// The tensors of one `Layer.mha_attend`.
pub struct MhaAttend {
    t: [Tensor; 5],
}

impl MhaAttend {
    pub fn import(objs: [&Bound<'_, PyAny>; 5], stream: Option<usize>) -> PyResult<Self> {
        let mut v = Vec::with_capacity(5);
        for (name, obj) in ATTEND_NAMES.into_iter().zip(objs) {
            v.push(import(name, obj, stream)?);
        }
        Ok(MhaAttend { t: v.try_into().unwrap_or_else(|_| unreachable!("five names, five tensors")) })
    }

    pub fn all(&self) -> impl Iterator<Item = &Tensor> {
        self.t.iter()
    }

    pub fn check(&self, plan: &MhaPlan, heads: usize) -> PyResult<()> {
        let [q, k, v, out, lse] = &self.t;
        let (t, keys) = (plan.rows(), plan.keys());
        let (dq, dv) = (MHA_QK_HEAD_DIM as usize, MHA_V_HEAD_DIM as usize);
        for (x, rows, width, what) in [
            (q, t, dq, "the plan's rows × heads × 192 (q_nope 128 ‖ q_rope 64)"),
            (k, keys, dq, "the plan's keys × heads × 192 (k_nope 128 ‖ k_rope 64), cu_seqlens_k order"),
            (v, keys, dv, "the plan's keys × heads × 128, cu_seqlens_k order"),
        ] {
            x.dtype_in(&[DType::Bf16])?;
            x.shape_is(&[rows, heads, width], what)?;
            x.contiguous()?;
        }
        output(out, DType::Bf16, &[t, heads, dv], "the plan's rows × heads × 128")?;
        output(lse, DType::F32, &[t, heads], "the plan's rows × heads")
    }

    pub fn run(&self, rt: &Runtime, layer: &NsaLayer<'_>, plan: &MhaPlan) -> PyResult<()> {
        let [q, k, v, out, lse] = &self.t;
        let (qb, kb, vb) = (q.buffer::<bf16>(rt)?, k.buffer::<bf16>(rt)?, v.buffer::<bf16>(rt)?);
        let (mut ob, mut lb) = (out.buffer::<bf16>(rt)?, lse.buffer::<f32>(rt)?);
        let inputs = MhaInputs { q: qb.view(), k: kb.view(), v: vb.view() };
        let outputs = MhaOutputs { out: &mut ob.view_mut(), lse: &mut lb.view_mut() };
        layer.mha_attend(plan, &inputs, outputs).py()
    }
}
