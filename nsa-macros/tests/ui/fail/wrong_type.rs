// Values of the wrong type, each reported on its own key.
use nsa_macros::NsaKernels;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", page_size = "64", heads = 16.0, kv_cache = fp8, targets = 90, crate = 5)]
struct Model;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", crate = "nsa runtime")]
struct BadPath;

#[derive(NsaKernels)]
#[nsa(preset = deepseek, topk = 99999999999, rope_dim = -64, indexer = 64, targets("sm_90a", sm_100a))]
struct Other;

fn main() {}
