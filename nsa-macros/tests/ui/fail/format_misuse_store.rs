// A bf16 cache handed to an FP8-cache model's store does not type-check.
use nsa_macros::NsaKernels;
use nsa_runtime::model::{Bf16Cache, ModelKernels};
use nsa_runtime::ops::Rows;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2")]
struct Fp8Model;

fn store(
    kernels: &ModelKernels<'_, Fp8Model>,
    k_nope: &Rows<'_, half::bf16>,
    k_rope: &Rows<'_, half::bf16>,
    loc: &cudarc::driver::CudaView<'_, i32>,
    cache: &mut Bf16Cache<'_>,
) -> nsa_runtime::Result<()> {
    kernels.store_mla(k_nope, k_rope, loc, cache)
}

fn main() {}
