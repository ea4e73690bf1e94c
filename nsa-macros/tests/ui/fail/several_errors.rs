// Every error of one derive in one compile: an unknown key, a wrong type, two
// out-of-range values, an unknown target and a repeated one.
use nsa_macros::NsaKernels;

#[derive(NsaKernels)]
#[nsa(
    preset = "deepseek-v3.2",
    page_sise = 64,
    kv_cache = 8,
    topk = 4097,
    heads = 0,
    targets("sm_90a", "gfx90a", "sm_90a")
)]
struct Model;

fn main() {}
