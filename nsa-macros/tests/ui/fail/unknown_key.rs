// Misspelt keys: darling names the key it expected.
use nsa_macros::NsaKernels;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", pag_size = 64, top_k = 2048)]
struct Model;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", indexer(heads = 64, head_dims = 128))]
struct IndexerTypo;

fn main() {}
