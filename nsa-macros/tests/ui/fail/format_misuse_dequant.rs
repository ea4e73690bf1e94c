// The FP8 dequantize does not exist for a bf16-cache model.
use nsa_macros::NsaKernels;
use nsa_runtime::model::{Fp8Cache, ModelKernels};

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", kv_cache = "bf16")]
struct Bf16Model;

fn dequant(
    kernels: &ModelKernels<'_, Bf16Model>,
    cache: &Fp8Cache<'_>,
    idx: &cudarc::driver::CudaView<'_, i32>,
    out: &mut cudarc::driver::CudaViewMut<'_, half::bf16>,
) -> nsa_runtime::Result<()> {
    kernels.dequant_fp8(cache, idx, out)
}

fn main() {}
