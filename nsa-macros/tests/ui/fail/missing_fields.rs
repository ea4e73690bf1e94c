// Without a preset, the fields a config file must have are required.
use nsa_macros::NsaKernels;

#[derive(NsaKernels)]
#[nsa(page_size = 64, kv_cache = "bf16")]
struct Model;

fn main() {}
