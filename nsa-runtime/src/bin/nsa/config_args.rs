//! The config every subcommand takes: a preset or a file, plus overrides.

use clap::Args;
use nsa_kernels::{KvCacheFormat, NsaConfig};
use nsa_runtime::{Error, Result};
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct ConfigArgs {
    /// Named config (deepseek-v3.2, deepseek-v3.2-tp2/-tp4/-tp8/-tp16).
    #[arg(long, default_value = "deepseek-v3.2", conflicts_with = "config")]
    pub preset: String,
    /// Config file (JSON or TOML with the fields of NsaConfig) instead of a preset.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override: query heads per GPU.
    #[arg(long)]
    pub heads: Option<u32>,
    /// Override: keys per query.
    #[arg(long)]
    pub topk: Option<u32>,
    /// Override: tokens per KV page.
    #[arg(long)]
    pub page_size: Option<u32>,
    /// Override: KV cache format (bf16 or fp8).
    #[arg(long)]
    pub cache: Option<KvCacheFormat>,
    /// Override: also generate the top-k kernels for bf16 scores.
    #[arg(long)]
    pub topk_bf16_scores: bool,
}

impl ConfigArgs {
    /// The preset or file, with overrides applied, validated (all problems at once).
    pub fn load(&self) -> Result<NsaConfig> {
        let mut cfg = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
                NsaConfig::from_text(&text)?
            }
            None => NsaConfig::preset(&self.preset)?,
        };
        if let Some(h) = self.heads {
            cfg.num_q_heads = h;
        }
        if let Some(k) = self.topk {
            cfg.topk = k;
        }
        if let Some(p) = self.page_size {
            cfg.page_size = p;
        }
        if let Some(c) = self.cache {
            cfg.kv_cache = c;
        }
        cfg.topk_bf16_scores |= self.topk_bf16_scores;
        cfg.validate()?;
        Ok(cfg)
    }
}
