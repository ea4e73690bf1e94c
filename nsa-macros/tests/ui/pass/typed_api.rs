// The typed API compiles for every spelling of the attributes and every shape of
// struct, and the consts hold the validated configuration.
use cudarc::driver::{CudaView, CudaViewMut};
use half::bf16;
use nsa_macros::NsaKernels;
use nsa_runtime::kernels::{KvCacheFormat, NsaConfig, Target};
use nsa_runtime::model::{format, Bf16Cache, Fp8Cache, KvFormat, MlaCache, ModelKernels, NsaModel};
use nsa_runtime::ops::Rows;

/// A preset with an override.
#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", heads = 16)]
pub struct Tp8;

/// Every key, a bf16 cache, several `#[nsa]` attributes, the array form of targets.
#[derive(NsaKernels)]
#[nsa(page_size = 1, topk = 4096, heads = 8, kv_cache = "bf16_576")]
#[nsa(targets = ["gfx942", "sm_90a"], indexer(heads = 64, head_dim = 128), kv_lora_rank = 512, rope_dim = 64)]
pub struct Spelled;

/// Generic and tuple structs; the runtime reached through a re-export.
mod reexport {
    pub use nsa_runtime as rt;
}
#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2-tp4", targets = "sm_100a", crate = "reexport::rt", embed_sources)]
pub struct Generic<T: Send>(std::marker::PhantomData<T>);

/// Works for any model: the cache type follows the model's format.
pub fn store_any<M: NsaModel>(
    kernels: &ModelKernels<'_, M>,
    k_nope: &Rows<'_, bf16>,
    k_rope: &Rows<'_, bf16>,
    loc: &CudaView<'_, i32>,
    cache: &mut MlaCache<'_, M::KvFormat>,
) -> nsa_runtime::Result<()> {
    kernels.store_mla(k_nope, k_rope, loc, cache)
}

/// An FP8 model: store into its FP8 cache, read it back as bf16.
pub fn fp8_round_trip(
    rt: &nsa_runtime::Runtime,
    k_nope: &Rows<'_, bf16>,
    k_rope: &Rows<'_, bf16>,
    loc: &CudaView<'_, i32>,
    cache: CudaViewMut<'_, u8>,
    out: &mut CudaViewMut<'_, bf16>,
) -> nsa_runtime::Result<()> {
    let kernels = Tp8::kernels(rt)?;
    let mut cache = Fp8Cache::new(cache)?;
    kernels.store_mla(k_nope, k_rope, loc, &mut cache)?;
    kernels.dequant_fp8(&cache, loc, out)
}

/// A bf16 model: its store takes a bf16 cache; the indexer store is format-free.
pub fn bf16_store(
    kernels: &ModelKernels<'_, Spelled>,
    k_nope: &Rows<'_, bf16>,
    k_rope: &Rows<'_, bf16>,
    loc: &CudaView<'_, i32>,
    cache: &mut Bf16Cache<'_>,
    k: &Rows<'_, bf16>,
    indexer_cache: &mut CudaViewMut<'_, u8>,
) -> nsa_runtime::Result<()> {
    store_any(kernels, k_nope, k_rope, loc, cache)?;
    kernels.store_indexer_k(k, loc, indexer_cache)
}

const _: () = assert!(Tp8::NUM_Q_HEADS == 16 && Tp8::TOPK == 2048 && Tp8::PAGE_SIZE == 64);
const _: () = assert!(Spelled::PAGE_SIZE == 1 && Spelled::TOPK == 4096 && Spelled::TARGETS.len() == 2);
const _: () = assert!(matches!(<<Spelled as NsaModel>::KvFormat as KvFormat>::FORMAT, KvCacheFormat::Bf16));

fn main() {
    assert_eq!(Tp8::config(), NsaConfig::preset("deepseek-v3.2-tp8").unwrap());
    assert_eq!(Spelled::config().targets, [Target::Gfx942, Target::Sm90a]);
    Spelled::config().validate().unwrap();
    let generic = <Generic<u8> as NsaModel>::config();
    assert_eq!((generic.num_q_heads, generic.targets.clone()), (32, vec![Target::Sm100a]));
    let specs = <Generic<u8> as NsaModel>::kernel_specs();
    assert_eq!(<Generic<u8> as NsaModel>::EMBEDDED_SOURCES.len(), specs.len());
    assert!(Tp8::EMBEDDED_SOURCES.is_empty());
    let _: Option<format::Fp8> = None::<<Tp8 as NsaModel>::KvFormat>;
}
