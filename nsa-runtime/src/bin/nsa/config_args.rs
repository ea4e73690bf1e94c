//! The config every subcommand takes: a preset or a file, plus overrides.

use clap::Args;
use nsa_kernels::{KvCacheFormat, NsaConfig};
use nsa_runtime::{Error, Result};
use std::path::{Path, PathBuf};

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

/// Largest config file read; real ones are a few hundred bytes.
pub const CONFIG_FILE_LIMIT: u64 = 1 << 20;

/// The text of config file `path`: a regular file (no FIFO or device) of at most
/// [`CONFIG_FILE_LIMIT`] bytes, in UTF-8.
pub fn read_config_file(path: &Path) -> Result<String> {
    let bytes = nsa_runtime::fsread::read_bounded(path, CONFIG_FILE_LIMIT, true).map_err(Error::io(path))?;
    String::from_utf8(bytes).map_err(|e| Error::InvalidArgument {
        field: "--config",
        value: path.display().to_string(),
        expected: format!("a UTF-8 JSON or TOML file (byte {} is not UTF-8)", e.utf8_error().valid_up_to()),
    })
}

impl ConfigArgs {
    /// The preset or file, with overrides applied, validated (all problems at once).
    pub fn load(&self) -> Result<NsaConfig> {
        self.load_with(|_| Ok(()))
    }

    /// Like [`load`](Self::load), with `more` overrides (e.g. `--arch`) applied
    /// before validation too: the nearest valid values a bad file is told about
    /// can be passed as overrides to fix it.
    pub fn load_with(&self, more: impl FnOnce(&mut NsaConfig) -> Result<()>) -> Result<NsaConfig> {
        let mut cfg = match &self.config {
            Some(path) => NsaConfig::parse_text(&read_config_file(path)?).map_err(|e| e.in_file(path.display()))?,
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
        more(&mut cfg)?;
        cfg.validate().map_err(|e| match &self.config {
            Some(path) => e.in_file(format!("{} (with the command line's overrides)", path.display())),
            None => e,
        })?;
        Ok(cfg)
    }
}
