//! [`NsaConfig`]: the model-level description one attention configuration is built from.

use crate::layout;
use crate::target::Target;
use serde::{Deserialize, Serialize};
use std::fmt;

/// How the MLA latent KV cache stores one token (spec §2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheFormat {
    /// 576 bf16 per token: 512 latent then 64 rope (1152 bytes).
    Bf16,
    /// 656 bytes per token: 512 e4m3, 4 f32 scales (one per 128 dims), 64 bf16 rope.
    Fp8,
}

impl KvCacheFormat {
    /// Short tag used in kernel ids.
    pub fn tag(self) -> &'static str {
        match self {
            KvCacheFormat::Bf16 => "bf16_576",
            KvCacheFormat::Fp8 => "fp8_656",
        }
    }

    /// Bytes one token occupies in the cache.
    pub fn token_bytes(self) -> usize {
        match self {
            KvCacheFormat::Bf16 => 2 * layout::BF16_TOKEN_ELEMS,
            KvCacheFormat::Fp8 => layout::FP8_TOKEN_BYTES,
        }
    }
}

impl std::str::FromStr for KvCacheFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bf16" | "bf16_576" => Ok(KvCacheFormat::Bf16),
            "fp8" | "fp8_656" | "fp8_e4m3" => Ok(KvCacheFormat::Fp8),
            _ => Err(format!("unknown KV cache format `{s}`: allowed bf16 (576 bf16/token) or fp8 (656 bytes/token)")),
        }
    }
}

/// One attention configuration of a DeepSeek V3.2-style model on one GPU.
///
/// Build it from a preset ([`NsaConfig::preset`]) or deserialize it (JSON/TOML),
/// then call [`NsaConfig::validate`]; every kernel is specialised on these values.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NsaConfig {
    /// Tokens per KV page (64 on CUDA servers; any value in range works).
    pub page_size: u32,
    /// Keys each query attends to (`index_topk`).
    pub topk: u32,
    /// Query heads on this GPU (128 / attention TP size).
    pub num_q_heads: u32,
    /// Latent width of the MLA cache.
    #[serde(default = "default_kv_lora_rank")]
    pub kv_lora_rank: u32,
    /// RoPE width of the MLA cache.
    #[serde(default = "default_rope_dim")]
    pub qk_rope_head_dim: u32,
    /// Lightning-indexer heads.
    #[serde(default = "default_index_heads")]
    pub index_n_heads: u32,
    /// Lightning-indexer head dim.
    #[serde(default = "default_index_head_dim")]
    pub index_head_dim: u32,
    /// MLA KV cache format.
    pub kv_cache: KvCacheFormat,
    /// Architectures to generate for (at least one, no repeats).
    pub targets: Vec<Target>,
    /// Also generate the top-k kernels for bf16 scores (every transform and plan),
    /// for logits written in bf16 outside nsa; the layer's indexer writes f32, whose
    /// top-k kernels are always generated.
    #[serde(default)]
    pub topk_bf16_scores: bool,
}

fn default_kv_lora_rank() -> u32 {
    layout::KV_LORA_RANK as u32
}
fn default_rope_dim() -> u32 {
    layout::ROPE_DIM as u32
}
fn default_index_heads() -> u32 {
    64
}
fn default_index_head_dim() -> u32 {
    layout::INDEXER_HEAD_DIM as u32
}

/// Named configurations: DeepSeek V3.2 and its per-GPU tensor-parallel shapes.
pub const PRESETS: &[(&str, &str)] = &[
    ("deepseek-v3.2", "128 query heads per GPU (TP1), top-k 2048, page 64, FP8-656 cache"),
    ("deepseek-v3.2-tp2", "64 query heads per GPU"),
    ("deepseek-v3.2-tp4", "32 query heads per GPU"),
    ("deepseek-v3.2-tp8", "16 query heads per GPU"),
    ("deepseek-v3.2-tp16", "8 query heads per GPU"),
];

pub const ALLOWED_HEADS: [u32; 5] = [8, 16, 32, 64, 128];
pub const PAGE_SIZE_RANGE: (u32, u32) = (1, 1024);
pub const TOPK_RANGE: (u32, u32) = (64, 4096);
pub const TOPK_MULTIPLE: u32 = 64;
pub const ALLOWED_INDEX_HEADS: [u32; 1] = [64];

impl NsaConfig {
    /// The preset called `name` (see [`PRESETS`]), generating for sm_90a and sm_100a.
    pub fn preset(name: &str) -> Result<NsaConfig, ConfigError> {
        let heads = match name {
            "deepseek-v3.2" | "deepseek-v3.2-tp1" => 128,
            "deepseek-v3.2-tp2" => 64,
            "deepseek-v3.2-tp4" => 32,
            "deepseek-v3.2-tp8" => 16,
            "deepseek-v3.2-tp16" => 8,
            _ => {
                let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
                return Err(ConfigError::single(ConfigIssue {
                    field: "preset",
                    value: format!("{name:?}"),
                    allowed: names.join(", "),
                    nearest: nearest_name(name, &names).map(str::to_string),
                }));
            }
        };
        Ok(NsaConfig {
            page_size: 64,
            topk: 2048,
            num_q_heads: heads,
            kv_lora_rank: default_kv_lora_rank(),
            qk_rope_head_dim: default_rope_dim(),
            index_n_heads: default_index_heads(),
            index_head_dim: default_index_head_dim(),
            kv_cache: KvCacheFormat::Fp8,
            targets: Target::NVIDIA.to_vec(),
            topk_bf16_scores: false,
        })
    }

    /// Checks every field and returns ALL problems at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut issues = Vec::new();
        check_range(&mut issues, "page_size", self.page_size, PAGE_SIZE_RANGE, 1);
        check_range(&mut issues, "topk", self.topk, TOPK_RANGE, TOPK_MULTIPLE);
        check_set(&mut issues, "num_q_heads", self.num_q_heads, &ALLOWED_HEADS);
        check_set(&mut issues, "kv_lora_rank", self.kv_lora_rank, &[layout::KV_LORA_RANK as u32]);
        check_set(&mut issues, "qk_rope_head_dim", self.qk_rope_head_dim, &[layout::ROPE_DIM as u32]);
        check_set(&mut issues, "index_n_heads", self.index_n_heads, &ALLOWED_INDEX_HEADS);
        check_set(&mut issues, "index_head_dim", self.index_head_dim, &[layout::INDEXER_HEAD_DIM as u32]);
        self.check_targets(&mut issues);
        ConfigError::from_issues(issues)
    }

    /// Parses a config from JSON (text starting with `{`) or TOML, then validates
    /// it. See [`parse_text`](Self::parse_text).
    pub fn from_text(text: &str) -> Result<NsaConfig, ConfigError> {
        let cfg = Self::parse_text(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses a config from JSON (text starting with `{`) or TOML without
    /// validating it, so that overrides can be applied first. A leading UTF-8
    /// byte-order mark is skipped; an empty text says so; every unknown field is
    /// named with the field it is probably a misspelling of; a parse error names
    /// the field and the line and column, quoting at most [`EXCERPT_CHARS`]
    /// characters of the parser's message.
    pub fn parse_text(text: &str) -> Result<NsaConfig, ConfigError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let json = text.trim_start().starts_with('{');
        let issue = |value: String| ConfigIssue {
            field: "config file",
            value,
            allowed: format!("JSON or TOML with the fields {}", FIELDS.join(", ")),
            nearest: None,
        };
        if text.trim().is_empty() {
            return Err(ConfigError::single(issue("empty: the file has no fields".into())));
        }
        let keys: Result<Vec<String>, String> = if json {
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text)
                .map(|m| m.keys().cloned().collect())
                .map_err(|e| e.to_string())
        } else {
            toml::from_str::<toml::Table>(text).map(|t| t.keys().cloned().collect()).map_err(|e| e.to_string())
        };
        let keys = keys.map_err(|msg| ConfigError::single(issue(excerpt(&msg, EXCERPT_CHARS))))?;
        let unknown: Vec<ConfigIssue> = keys
            .iter()
            .filter(|k| !FIELDS.contains(&k.as_str()))
            .map(|k| {
                let guess = nearest_name(k, &FIELDS).map(|n| format!(" (did you mean `{n}`?)")).unwrap_or_default();
                issue(format!("unknown field `{}`{guess}", excerpt(k, 80)))
            })
            .collect();
        ConfigError::from_issues(unknown)?;
        fn at_path<E: fmt::Display>(e: serde_path_to_error::Error<E>) -> String {
            format!("`{}`: {}", e.path(), e.inner())
        }
        let parsed: Result<NsaConfig, String> = if json {
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(text)).map_err(at_path)
        } else {
            serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(at_path)
        };
        parsed.map_err(|msg| ConfigError::single(issue(excerpt(&msg, EXCERPT_CHARS))))
    }

    fn check_targets(&self, issues: &mut Vec<ConfigIssue>) {
        let allowed = Target::ALL.map(|t| t.arch()).join(", ");
        if self.targets.is_empty() {
            issues.push(ConfigIssue {
                field: "targets",
                value: "[] (empty)".into(),
                allowed: format!("a non-empty list of {allowed}"),
                nearest: Some("[\"sm_90a\"]".into()),
            });
        }
        // One issue per repeated target, however often it repeats.
        for t in Target::ALL {
            let n = self.targets.iter().filter(|x| **x == t).count();
            if n > 1 {
                issues.push(ConfigIssue {
                    field: "targets",
                    value: format!("{t} listed {n} times"),
                    allowed: format!("each of {allowed} at most once"),
                    nearest: Some(format!("list {t} once")),
                });
            }
        }
    }

    /// Readable one-line summary for logs and the CLI.
    pub fn summary(&self) -> String {
        let targets: Vec<&str> = self.targets.iter().map(|t| t.arch()).collect();
        format!(
            "h={} topk={} page={} cache={} targets=[{}]{}",
            self.num_q_heads,
            self.topk,
            self.page_size,
            self.kv_cache.tag(),
            targets.join(","),
            if self.topk_bf16_scores { " topk_scores=f32,bf16" } else { "" }
        )
    }
}

fn check_range(issues: &mut Vec<ConfigIssue>, field: &'static str, v: u32, (lo, hi): (u32, u32), multiple: u32) {
    let in_range = (lo..=hi).contains(&v) && v % multiple == 0;
    if in_range {
        return;
    }
    // Nearest multiple (an exact half rounds up), then clamped into the range.
    // In u64: `v + multiple / 2` overflows u32 for values near u32::MAX.
    let m = u64::from(multiple);
    let rounded = (u64::from(v) + m / 2) / m * m;
    let nearest = rounded.clamp(u64::from(lo), u64::from(hi));
    let allowed =
        if multiple == 1 { format!("{lo}..={hi}") } else { format!("multiples of {multiple} in {lo}..={hi}") };
    issues.push(ConfigIssue { field, value: v.to_string(), allowed, nearest: Some(nearest.to_string()) });
}

fn check_set(issues: &mut Vec<ConfigIssue>, field: &'static str, v: u32, allowed: &[u32]) {
    if allowed.contains(&v) {
        return;
    }
    // Closest member; an exact tie goes to the smaller one.
    let nearest = allowed.iter().copied().min_by_key(|a| (a.abs_diff(v), *a));
    issues.push(ConfigIssue {
        field,
        value: v.to_string(),
        allowed: allowed.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
        nearest: nearest.map(|n| n.to_string()),
    });
}

/// The fields of a config file, as spelled there.
pub const FIELDS: [&str; 10] = [
    "page_size",
    "topk",
    "num_q_heads",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "index_n_heads",
    "index_head_dim",
    "kv_cache",
    "targets",
    "topk_bf16_scores",
];

/// Issues a [`ConfigError`] lists; the rest are counted.
pub const MAX_LISTED_ISSUES: usize = 20;

/// Characters of user input quoted in an error message; longer input is cut.
pub const EXCERPT_CHARS: usize = 400;

/// `text` for an error message: at most `max_chars` characters, control
/// characters escaped, and the size of what was cut said.
pub fn excerpt(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    for (taken, (i, c)) in text.char_indices().enumerate() {
        if taken == max_chars {
            out.push_str(&format!("… ({} more bytes)", text.len() - i));
            break;
        }
        if c.is_control() && c != '\n' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The closest name by edit distance, when it is plausibly a typo.
pub fn nearest_name<'a>(given: &str, names: &[&'a str]) -> Option<&'a str> {
    names
        .iter()
        .map(|n| (edit_distance(given, n), *n))
        .min()
        .filter(|(d, n)| *d <= (n.len() / 2).max(2))
        .map(|(_, n)| n)
}

/// The `n` names closest to `given`, closest first: by the edit distance to the
/// name's nearest prefix (a partial or misspelt id such as `dense_prefil.h128`
/// ranks the ids that start that way first), then to the whole name.
pub fn closest_names<'a>(given: &str, names: &[&'a str], n: usize) -> Vec<&'a str> {
    let mut ranked: Vec<((usize, usize), &str)> = names
        .iter()
        .map(|name| {
            let row = edit_distances_to_prefixes(given, name);
            ((row.iter().copied().min().unwrap_or(0), row[row.len() - 1]), *name)
        })
        .collect();
    ranked.sort();
    ranked.into_iter().take(n).map(|(_, name)| name).collect()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let row = edit_distances_to_prefixes(a, b);
    row[row.len() - 1]
}

/// The edit distance from `a` to every prefix of `b` (entry j: the first j chars),
/// the last row of the Levenshtein table.
fn edit_distances_to_prefixes(a: &str, b: &str) -> Vec<usize> {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev
}

/// One problem with one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigIssue {
    /// The field, as spelled in the config file / attribute.
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// What is allowed.
    pub allowed: String,
    /// The nearest valid value, when there is one. Ranges round to the nearest
    /// allowed multiple (an exact half rounds up) and clamp into the range; sets
    /// pick the closest member (an exact tie picks the smaller).
    pub nearest: Option<String>,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = excerpt(&self.value, EXCERPT_CHARS);
        if self.field == "config file" {
            // The file as a whole: what is wrong with it, then what it should be.
            return write!(f, "{value}\n    (a config file is {})", self.allowed);
        }
        write!(f, "`{}` = {value} is not allowed (allowed: {})", self.field, self.allowed)?;
        if let Some(n) = &self.nearest {
            write!(f, "; nearest valid: {n}")?;
        }
        Ok(())
    }
}

/// Every problem found in one config.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub issues: Vec<ConfigIssue>,
    /// The file the config came from, when it came from one.
    pub origin: Option<String>,
}

impl ConfigError {
    fn single(issue: ConfigIssue) -> Self {
        ConfigError { issues: vec![issue], origin: None }
    }

    fn from_issues(issues: Vec<ConfigIssue>) -> Result<(), ConfigError> {
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { issues, origin: None })
        }
    }

    /// The same error, naming the file the config came from.
    pub fn in_file(mut self, path: impl fmt::Display) -> Self {
        self.origin = Some(path.to_string());
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.issues.len();
        let origin = self.origin.as_ref().map(|o| format!(" in {o}")).unwrap_or_default();
        write!(f, "invalid NSA config{origin} ({n} problem{}):", if n == 1 { "" } else { "s" })?;
        for issue in self.issues.iter().take(MAX_LISTED_ISSUES) {
            write!(f, "\n  - {issue}")?;
        }
        if n > MAX_LISTED_ISSUES {
            write!(f, "\n  - … and {} more", n - MAX_LISTED_ISSUES)?;
        }
        Ok(())
    }
}
