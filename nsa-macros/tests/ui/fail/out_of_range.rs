// Values NsaConfig::validate rejects: the runtime's messages, on the keys.
use nsa_macros::NsaKernels;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", page_size = 0, topk = 100, heads = 12)]
struct Model;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", indexer(heads = 32, head_dim = 64), kv_lora_rank = 256, rope_dim = 128)]
struct Shape;

fn main() {}
