//! [`NsaModel`]: one model's attention configuration, fixed at compile time, and the
//! typed entry points of its kernel set.
//!
//! Model crates do not implement the trait by hand: `#[derive(NsaKernels)]` (crate
//! `nsa-macros`) reads `#[nsa(...)]` attributes, validates them with the same
//! [`NsaConfig::validate`] the runtime uses (a bad value fails the build, spanned on
//! the attribute) and emits the impl:
//!
//! ```ignore
//! use nsa_macros::NsaKernels;
//! use nsa_runtime::model::{Fp8Cache, NsaModel};
//!
//! #[derive(NsaKernels)]
//! #[nsa(preset = "deepseek-v3.2", heads = 16)] // TP8, FP8-656 cache, sm_90a + sm_100a
//! pub struct DeepSeekV32Tp8;
//!
//! let kernels = DeepSeekV32Tp8::kernels(&rt)?; // validates, compiles / loads the set
//! let mut cache = Fp8Cache::new(slice.slice_mut(..))?;
//! kernels.store_mla(&k_nope, &k_rope, &loc, &mut cache)?;
//! kernels.dequant_fp8(&cache, &idx, &mut out)?; // exists only for FP8-cache models
//! ```
//!
//! # Design
//!
//! * **The configuration** is a set of associated consts (every scalar field, the
//!   targets as a `&'static [Target]`) plus the cache format as the associated
//!   *type* [`NsaModel::KvFormat`]. [`NsaConfig`] holds a `Vec`, so it cannot be a
//!   const: [`NsaModel::config`] builds it from the consts on each call (a handful of
//!   integers and one short `Vec`; no static, no lock). A static inside a provided
//!   trait method would be shared by every implementor, which is why there is none.
//! * **The cache format is a type**: [`format::Bf16`] or [`format::Fp8`]. The MLA
//!   cache handle [`MlaCache<'_, F>`](MlaCache) carries it, so passing a bf16 cache to
//!   an FP8 model's store is a type mismatch, and [`ModelKernels::dequant_fp8`] only
//!   exists for models whose `KvFormat` is [`format::Fp8`]: both are compile errors.
//! * **Entry points** live on [`ModelKernels`], made by [`NsaModel::kernels`]: it
//!   re-validates the config (a hand-written impl gets the runtime's checks too),
//!   checks that the runtime's device is one of the model's targets, and compiles or
//!   loads every kernel of the set up front, so serving never JIT-compiles. The
//!   launchers are the untyped ones of [`crate::ops::kv_cache`], which check every
//!   buffer on the host as before.

use crate::error::invalid;
use crate::ops::kv_cache::{self, MlaCacheMut};
use crate::ops::Rows;
use crate::runtime::Runtime;
use crate::Result;
use cudarc::driver::{CudaView, CudaViewMut, DeviceRepr, ValidAsZeroBits};
use half::bf16;
use nsa_kernels::layout::{BF16_TOKEN_ELEMS, FP8_TOKEN_BYTES};
use nsa_kernels::{KernelSpec, KvCacheFormat, NsaConfig, Target};
use std::fmt;
use std::marker::PhantomData;

/// A model's attention configuration and kernel set, known at compile time.
///
/// Implemented by `#[derive(NsaKernels)]`; see the [module docs](self).
pub trait NsaModel: Sized {
    /// The MLA cache format, as a type: [`format::Bf16`] or [`format::Fp8`].
    type KvFormat: KvFormat;

    /// The model type's name, for messages.
    const NAME: &'static str;
    /// [`NsaConfig::page_size`].
    const PAGE_SIZE: u32;
    /// [`NsaConfig::topk`].
    const TOPK: u32;
    /// [`NsaConfig::num_q_heads`].
    const NUM_Q_HEADS: u32;
    /// [`NsaConfig::kv_lora_rank`].
    const KV_LORA_RANK: u32;
    /// [`NsaConfig::qk_rope_head_dim`].
    const QK_ROPE_HEAD_DIM: u32;
    /// [`NsaConfig::index_n_heads`].
    const INDEX_N_HEADS: u32;
    /// [`NsaConfig::index_head_dim`].
    const INDEX_HEAD_DIM: u32;
    /// [`NsaConfig::targets`], in the order given.
    const TARGETS: &'static [Target];
    /// [`NsaConfig::topk_bf16_scores`].
    const TOPK_BF16_SCORES: bool = false;
    /// Kernel sources rendered at compile time (`#[nsa(embed_sources)]`), one per spec
    /// of [`kernel_specs`](Self::kernel_specs); empty unless asked for. Byte-identical
    /// to what [`nsa_kernels::render`] gives at run time.
    const EMBEDDED_SOURCES: &'static [EmbeddedSource] = &[];

    /// The configuration (built from the consts above on each call; see the module docs).
    fn config() -> NsaConfig {
        NsaConfig {
            page_size: Self::PAGE_SIZE,
            topk: Self::TOPK,
            num_q_heads: Self::NUM_Q_HEADS,
            kv_lora_rank: Self::KV_LORA_RANK,
            qk_rope_head_dim: Self::QK_ROPE_HEAD_DIM,
            index_n_heads: Self::INDEX_N_HEADS,
            index_head_dim: Self::INDEX_HEAD_DIM,
            kv_cache: <Self::KvFormat as KvFormat>::FORMAT,
            targets: Self::TARGETS.to_vec(),
            topk_bf16_scores: Self::TOPK_BF16_SCORES,
        }
    }

    /// Every kernel the model needs, for every target ([`nsa_kernels::kernel_set`]).
    fn kernel_specs() -> Vec<KernelSpec> {
        nsa_kernels::kernel_set(&Self::config())
    }

    /// The embedded source of `spec`, when sources were embedded.
    fn embedded_source(spec: &KernelSpec) -> Option<&'static EmbeddedSource> {
        let id = spec.id();
        Self::EMBEDDED_SOURCES.iter().find(|s| s.id == id)
    }

    /// The typed entry points on `rt`, with the model's kernels for `rt`'s device
    /// compiled or loaded (see [`ModelKernels::new`]).
    fn kernels(rt: &Runtime) -> Result<ModelKernels<'_, Self>> {
        ModelKernels::new(rt)
    }
}

/// One kernel source rendered at compile time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbeddedSource {
    /// [`KernelSpec::id`].
    pub id: &'static str,
    /// [`KernelSpec::symbol`].
    pub symbol: &'static str,
    /// [`KernelSpec::source_name`].
    pub source_name: &'static str,
    /// The rendered source ([`nsa_kernels::RenderedKernel::source`]).
    pub source: &'static str,
}

/// Type-level MLA cache formats.
pub mod format {
    /// `[pool_slots, 576]` bf16 ([`KvCacheFormat::Bf16`](nsa_kernels::KvCacheFormat::Bf16)).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Bf16 {}

    /// `[pool_slots, 656]` bytes ([`KvCacheFormat::Fp8`](nsa_kernels::KvCacheFormat::Fp8)).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Fp8 {}
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::format::Bf16 {}
    impl Sealed for super::format::Fp8 {}
}

/// An MLA cache format as a type (sealed: [`format::Bf16`] and [`format::Fp8`]).
pub trait KvFormat: sealed::Sealed + Copy + fmt::Debug + 'static {
    /// The runtime value of this format.
    const FORMAT: KvCacheFormat;
    /// Element type of the cache buffer.
    type Elem: DeviceRepr + ValidAsZeroBits + Copy + Default + fmt::Debug + 'static;
    /// Elements of [`Self::Elem`] per cache slot (token).
    const ELEMS_PER_TOKEN: usize;
    /// The untyped launcher's view of a cache buffer.
    #[doc(hidden)]
    fn erase(view: CudaViewMut<'_, Self::Elem>) -> MlaCacheMut<'_>;
}

impl KvFormat for format::Bf16 {
    const FORMAT: KvCacheFormat = KvCacheFormat::Bf16;
    type Elem = bf16;
    const ELEMS_PER_TOKEN: usize = BF16_TOKEN_ELEMS;
    fn erase(view: CudaViewMut<'_, bf16>) -> MlaCacheMut<'_> {
        MlaCacheMut::Bf16(view)
    }
}

impl KvFormat for format::Fp8 {
    const FORMAT: KvCacheFormat = KvCacheFormat::Fp8;
    type Elem = u8;
    const ELEMS_PER_TOKEN: usize = FP8_TOKEN_BYTES;
    fn erase(view: CudaViewMut<'_, u8>) -> MlaCacheMut<'_> {
        MlaCacheMut::Fp8(view)
    }
}

/// The MLA latent cache of one layer in format `F`: `[pool_slots, F::ELEMS_PER_TOKEN]`.
pub struct MlaCache<'a, F: KvFormat> {
    view: CudaViewMut<'a, F::Elem>,
    _format: PhantomData<F>,
}

/// A bf16 (576 per token) MLA cache.
pub type Bf16Cache<'a> = MlaCache<'a, format::Bf16>;
/// An FP8-656 MLA cache.
pub type Fp8Cache<'a> = MlaCache<'a, format::Fp8>;

impl<'a, F: KvFormat> MlaCache<'a, F> {
    /// Wraps a device buffer holding a whole number of `F` tokens.
    pub fn new(view: CudaViewMut<'a, F::Elem>) -> Result<Self> {
        if view.len() % F::ELEMS_PER_TOKEN != 0 {
            let expected = format!("a whole number of {}-element {} rows", F::ELEMS_PER_TOKEN, F::FORMAT.tag());
            return Err(invalid("cache", format!("{} elements", view.len()), expected));
        }
        Ok(MlaCache { view, _format: PhantomData })
    }

    /// The format, as a value.
    pub fn format(&self) -> KvCacheFormat {
        F::FORMAT
    }

    /// Slots (tokens) the cache holds.
    pub fn slots(&self) -> usize {
        self.view.len() / F::ELEMS_PER_TOKEN
    }

    /// A read-only view of the buffer.
    pub fn view(&self) -> CudaView<'_, F::Elem> {
        self.view.as_view()
    }

    /// The buffer itself.
    pub fn into_inner(self) -> CudaViewMut<'a, F::Elem> {
        self.view
    }

    fn erased(&mut self) -> MlaCacheMut<'_> {
        F::erase(self.view.slice_mut(..))
    }
}

impl<F: KvFormat> fmt::Debug for MlaCache<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MlaCache").field("format", &F::FORMAT).field("slots", &self.slots()).finish()
    }
}

/// Model `M`'s kernels on one [`Runtime`]: its typed entry points.
pub struct ModelKernels<'rt, M: NsaModel> {
    rt: &'rt Runtime,
    specs: Vec<KernelSpec>,
    _model: PhantomData<fn() -> M>,
}

impl<M: NsaModel> fmt::Debug for ModelKernels<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelKernels").field("model", &M::NAME).field("specs", &self.specs).finish()
    }
}

impl<'rt, M: NsaModel> ModelKernels<'rt, M> {
    /// Validates `M`'s config ([`NsaConfig::validate`]), checks that `rt`'s device is
    /// one of `M::TARGETS`, and compiles or loads every kernel of the set for it.
    pub fn new(rt: &'rt Runtime) -> Result<Self> {
        let config = M::config();
        config.validate()?;
        let target = rt.target();
        if !M::TARGETS.contains(&target) {
            let targets: Vec<&str> = M::TARGETS.iter().map(|t| t.arch()).collect();
            let expected = format!("one of the targets `{}` is derived for: {}", M::NAME, targets.join(", "));
            return Err(invalid("runtime target", target.arch(), expected));
        }
        let specs: Vec<KernelSpec> =
            nsa_kernels::kernel_set(&config).into_iter().filter(|s| s.target == target).collect();
        for spec in &specs {
            rt.kernel(spec.family)?;
        }
        Ok(ModelKernels { rt, specs, _model: PhantomData })
    }

    /// The runtime the kernels are loaded on.
    pub fn runtime(&self) -> &'rt Runtime {
        self.rt
    }

    /// The model's kernels for this runtime's target.
    pub fn specs(&self) -> &[KernelSpec] {
        &self.specs
    }

    /// Writes token `t` (`k_nope` row t, 512 wide; `k_rope` row t, 64 wide) into cache
    /// row `loc[t]`, in the model's format ([`kv_cache::store_mla`]).
    pub fn store_mla(
        &self,
        k_nope: &Rows<'_, bf16>,
        k_rope: &Rows<'_, bf16>,
        loc: &CudaView<'_, i32>,
        cache: &mut MlaCache<'_, M::KvFormat>,
    ) -> Result<()> {
        kv_cache::store_mla(self.rt, k_nope, k_rope, loc, &mut cache.erased())
    }

    /// Quantizes indexer keys (rows of 128 bf16) into the paged indexer cache
    /// (`[pages, 8448]` bytes) at slots `loc` ([`kv_cache::store_indexer_k`]).
    pub fn store_indexer_k(
        &self,
        k: &Rows<'_, bf16>,
        loc: &CudaView<'_, i32>,
        cache: &mut CudaViewMut<'_, u8>,
    ) -> Result<()> {
        kv_cache::store_indexer_k(self.rt, k, loc, cache)
    }
}

impl<M: NsaModel<KvFormat = format::Fp8>> ModelKernels<'_, M> {
    /// Gathers cache rows `idx` and dequantizes them into `out` (`[idx.len(), 576]`
    /// bf16) ([`kv_cache::dequant_fp8`]). Only FP8-cache models have it.
    pub fn dequant_fp8(
        &self,
        cache: &Fp8Cache<'_>,
        idx: &CudaView<'_, i32>,
        out: &mut CudaViewMut<'_, bf16>,
    ) -> Result<()> {
        kv_cache::dequant_fp8(self.rt, &cache.view(), idx, out)
    }
}
