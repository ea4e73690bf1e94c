//! An example model crate: attention configurations declared with
//! `#[derive(NsaKernels)]`, checked when this crate compiles.
//!
//! The binary `nsa-example-model` runs the KV store family of both models end to
//! end on a GPU through the typed entry points and compares every byte with the CPU
//! reference (`cargo run --release -p nsa-example-model`).

use nsa_macros::NsaKernels;

/// DeepSeek V3.2 at attention TP8: 16 query heads per GPU, FP8-656 cache,
/// sm_90a + sm_100a; the rest from the preset.
#[derive(Debug, NsaKernels)]
#[nsa(preset = "deepseek-v3.2", heads = 16)]
pub struct DeepSeekV32Tp8;

/// Every field spelled out, with a bf16 cache, for Hopper only.
#[derive(Debug, NsaKernels)]
#[nsa(
    page_size = 64,
    topk = 2048,
    heads = 128,
    kv_cache = "bf16",
    targets("sm_90a"),
    indexer(heads = 64, head_dim = 128),
    kv_lora_rank = 512,
    rope_dim = 64
)]
pub struct DeepSeekV32Bf16;

#[cfg(test)]
mod tests {
    use super::*;
    use nsa_runtime::kernels::{KvCacheFormat, NsaConfig, Target};
    use nsa_runtime::NsaModel;

    #[test]
    fn tp8_is_the_preset_with_16_heads() {
        let mut want = NsaConfig::preset("deepseek-v3.2").unwrap();
        want.num_q_heads = 16;
        assert_eq!(DeepSeekV32Tp8::config(), want);
        assert_eq!(DeepSeekV32Tp8::config(), NsaConfig::preset("deepseek-v3.2-tp8").unwrap());
        assert_eq!(DeepSeekV32Tp8::NAME, "DeepSeekV32Tp8");
    }

    #[test]
    fn bf16_model_config_and_kernel_set() {
        let cfg = DeepSeekV32Bf16::config();
        cfg.validate().unwrap();
        assert_eq!(cfg.kv_cache, KvCacheFormat::Bf16);
        assert_eq!(cfg.targets, [Target::Sm90a]);
        let ids: Vec<String> = DeepSeekV32Bf16::kernel_specs().iter().map(|s| s.id()).collect();
        assert_eq!(ids, nsa_runtime::kernels::kernel_set(&cfg).iter().map(|s| s.id()).collect::<Vec<_>>());
        // The bf16 cache is read back by copy (MHA prefixes), never dequantized.
        assert!(ids.iter().all(|id| !id.starts_with("kv_dequant.fp8")), "{ids:?}");
        assert!(ids.iter().any(|id| id.starts_with("kv_dequant.bf16_576")), "{ids:?}");
    }
}
