//! `#[derive(NsaKernels)]`: a model crate's sparse-attention configuration, checked at
//! compile time and turned into a typed kernel set.
//!
//! ```ignore
//! use nsa_macros::NsaKernels;
//! use nsa_runtime::NsaModel;
//!
//! /// DeepSeek V3.2 at TP8: 16 query heads per GPU, FP8-656 cache, sm_90a + sm_100a.
//! #[derive(NsaKernels)]
//! #[nsa(preset = "deepseek-v3.2", heads = 16)]
//! pub struct DeepSeekV32Tp8;
//!
//! /// Everything spelled out, bf16 cache, Hopper only.
//! #[derive(NsaKernels)]
//! #[nsa(page_size = 64, topk = 2048, heads = 128, kv_cache = "bf16", targets("sm_90a"),
//!       indexer(heads = 64, head_dim = 128), kv_lora_rank = 512, rope_dim = 64)]
//! pub struct Bf16Model;
//! ```
//!
//! # Keys
//!
//! | key | `NsaConfig` field | value |
//! |---|---|---|
//! | `preset` | all of them | a name of `nsa_kernels::PRESETS`; the other keys override it |
//! | `page_size` | `page_size` | integer |
//! | `topk` | `topk` | integer |
//! | `heads` | `num_q_heads` | integer |
//! | `kv_cache` | `kv_cache` | `"bf16"` or `"fp8"` (what `KvCacheFormat::from_str` takes) |
//! | `targets` | `targets` | `targets("sm_90a", "sm_100a")`, `targets = ["sm_90a"]` or `targets = "sm_90a"` |
//! | `indexer(heads, head_dim)` | `index_n_heads`, `index_head_dim` | integers |
//! | `kv_lora_rank` | `kv_lora_rank` | integer |
//! | `rope_dim` | `qk_rope_head_dim` | integer |
//! | `topk_bf16_scores` | `topk_bf16_scores` | flag: also the top-k kernels for bf16 scores |
//! | `crate` | — | path of the runtime crate in generated code, default `"::nsa_runtime"` |
//! | `embed_sources` | — | flag: render every kernel now into `NsaModel::EMBEDDED_SOURCES` |
//!
//! Without `preset`, `page_size`, `topk`, `heads`, `kv_cache` and `targets` are
//! required and the others take the defaults a config file gets.
//!
//! # Errors
//!
//! The configuration is validated by `nsa_kernels::NsaConfig::validate`, the very
//! code the runtime runs, so each message is the runtime's text. Every problem is
//! reported in the same compile, spanned on its `key = value` (the `preset` for a
//! field that came from it): unknown keys (with "did you mean"), wrong value types,
//! unknown target or cache names, out-of-range values, repeated targets.
//!
//! # Expansion
//!
//! An impl of `nsa_runtime::model::NsaModel` (see there for the typed API): the
//! config as associated consts, the cache format as the type `KvFormat`, and with
//! `embed_sources` the rendered kernels.

mod attrs;
mod expand;
#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Implements `nsa_runtime::model::NsaModel` from `#[nsa(...)]`; see the crate docs.
#[proc_macro_derive(NsaKernels, attributes(nsa))]
pub fn derive_nsa_kernels(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::derive(&input).into()
}
