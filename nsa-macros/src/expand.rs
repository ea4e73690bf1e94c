//! From `#[nsa(...)]` to a validated [`NsaConfig`] (or every error at once), then to
//! the `NsaModel` impl.

use crate::attrs::{IndexerOpts, Lenient, LenientOpts, Opts, Quoted, TargetList, U32};
use darling::FromDeriveInput;
use nsa_kernels::{KvCacheFormat, NsaConfig, Target};
use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote, ToTokens};
use std::collections::HashMap;
use syn::DeriveInput;

/// The derive: the impl, or `compile_error!`s for every problem found.
pub fn derive(input: &DeriveInput) -> TokenStream {
    match Model::from_input(input) {
        Ok(model) => model.expand(),
        Err(errors) => errors.into_compile_error(),
    }
}

/// Fields of [`NsaConfig`] that have no serde default: a config without a preset
/// must give each of them.
/// (field, attribute key, example).
const REQUIRED: [(&str, &str, &str); 5] = [
    ("page_size", "page_size", "page_size = 64"),
    ("topk", "topk", "topk = 2048"),
    ("num_q_heads", "heads", "heads = 128"),
    ("kv_cache", "kv_cache", "kv_cache = \"fp8\""),
    ("targets", "targets", "targets(\"sm_90a\", \"sm_100a\")"),
];

/// The preset that stands in for fields that could not be read, so that the
/// remaining ones are still validated.
const PLACEHOLDER_PRESET: &str = "deepseek-v3.2";

/// A validated configuration and what the expansion needs besides it.
#[derive(Debug)]
pub struct Model {
    ident: syn::Ident,
    generics: syn::Generics,
    krate: syn::Path,
    config: NsaConfig,
    embed_sources: bool,
}

/// Collects errors in the order found; a [`syn::Error`] keeps the whole span of
/// a `key = value` item (a darling error keeps one token's).
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, e: impl Into<syn::Error>) {
        let e = e.into();
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    fn at(&mut self, tokens: &dyn ToTokens, msg: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }

    fn finish(self) -> Result<(), syn::Error> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Where each [`NsaConfig`] field came from, for spans.
struct Sources {
    /// Field → the `key = value` tokens that set it.
    explicit: HashMap<&'static str, TokenStream>,
    /// The literal of each target, in order.
    target_lits: Vec<syn::LitStr>,
    /// `preset = "..."`, where fields not given explicitly came from.
    preset: Option<TokenStream>,
    /// The derive input's name: the span of last resort.
    ident: syn::Ident,
}

impl Sources {
    fn span_of(&self, field: &str) -> TokenStream {
        self.explicit.get(field).or(self.preset.as_ref()).cloned().unwrap_or_else(|| self.ident.to_token_stream())
    }
}

impl Model {
    /// Parses the attributes, applies them over the preset (or the serde defaults),
    /// and validates with [`NsaConfig::validate`]: every problem becomes one error,
    /// spanned on the attribute it comes from, all reported together.
    pub fn from_input(input: &DeriveInput) -> Result<Model, syn::Error> {
        let mut errors = Errors::default();
        // Strict parse first: unknown keys (with "did you mean") and shape errors.
        let (opts, keys_ok) = match Opts::from_derive_input(input) {
            Ok(opts) => (opts, true),
            Err(e) => match LenientOpts::from_derive_input(input) {
                Ok(opts) => {
                    errors.push(e);
                    (Opts::from(opts), false)
                }
                // Not a struct, a repeated key, ...: nothing more can be checked.
                Err(_) => return Err(e.into()),
            },
        };

        let mut src =
            Sources { explicit: HashMap::new(), target_lits: Vec::new(), preset: None, ident: opts.ident.clone() };
        // The base every key overrides; `complete` says whether it holds every field.
        let (mut config, complete) = match opts.preset {
            Some(Lenient::Ok(Quoted(lit), tokens)) => match NsaConfig::preset(&lit.value()) {
                Ok(config) => {
                    src.preset = Some(tokens);
                    (config, true)
                }
                Err(e) => {
                    for issue in &e.issues {
                        errors.at(&lit, issue);
                    }
                    (placeholder(), true)
                }
            },
            Some(Lenient::Err(e)) => {
                errors.push(e);
                (placeholder(), true)
            }
            None => (serde_defaults(), false),
        };

        let mut given: Vec<&'static str> = Vec::new();
        let mut scalar = |field: &'static str, value: Option<Lenient<U32>>, slot: &mut u32, errors: &mut Errors| {
            match value {
                Some(Lenient::Ok(U32(v), tokens)) => {
                    *slot = v;
                    src.explicit.insert(field, tokens);
                }
                Some(Lenient::Err(e)) => errors.push(e),
                None => return,
            }
            given.push(field);
        };
        scalar("page_size", opts.page_size, &mut config.page_size, &mut errors);
        scalar("topk", opts.topk, &mut config.topk, &mut errors);
        scalar("num_q_heads", opts.heads, &mut config.num_q_heads, &mut errors);
        scalar("kv_lora_rank", opts.kv_lora_rank, &mut config.kv_lora_rank, &mut errors);
        scalar("qk_rope_head_dim", opts.rope_dim, &mut config.qk_rope_head_dim, &mut errors);
        match opts.indexer {
            Some(Lenient::Ok(IndexerOpts { heads, head_dim }, _)) => {
                scalar("index_n_heads", heads, &mut config.index_n_heads, &mut errors);
                scalar("index_head_dim", head_dim, &mut config.index_head_dim, &mut errors);
            }
            Some(Lenient::Err(e)) => errors.push(e),
            None => {}
        }

        match opts.kv_cache {
            Some(Lenient::Ok(Quoted(lit), tokens)) => {
                match lit.value().parse::<KvCacheFormat>() {
                    Ok(format) => config.kv_cache = format,
                    Err(msg) => errors.at(&lit, msg),
                }
                src.explicit.insert("kv_cache", tokens);
                given.push("kv_cache");
            }
            Some(Lenient::Err(e)) => {
                errors.push(e);
                given.push("kv_cache");
            }
            None => {}
        }

        if opts.topk_bf16_scores.is_present() {
            config.topk_bf16_scores = true;
        }

        match opts.targets {
            Some(Lenient::Ok(TargetList(lits), tokens)) => {
                let mut targets = Vec::new();
                let mut unknown = false;
                for lit in lits {
                    match lit.value().parse::<Target>() {
                        Ok(t) => {
                            targets.push(t);
                            src.target_lits.push(lit);
                        }
                        Err(e) => {
                            errors.at(&lit, e);
                            unknown = true;
                        }
                    }
                }
                // `targets("sm_80")` is one error (the unknown name), not also "empty".
                if !(unknown && targets.is_empty()) {
                    config.targets = targets;
                }
                src.explicit.insert("targets", tokens);
                given.push("targets");
            }
            Some(Lenient::Err(e)) => {
                errors.push(e);
                given.push("targets");
            }
            None => {}
        }

        // Without a preset, the fields that have no default must be given. After an
        // unknown key, a "missing" error would mostly repeat the misspelt key's.
        if !complete && keys_ok {
            let missing: Vec<_> = REQUIRED.iter().filter(|(field, _, _)| !given.contains(field)).collect();
            if !missing.is_empty() {
                let keys: Vec<String> = missing.iter().map(|(_, key, _)| format!("`{key}`")).collect();
                let examples: Vec<&str> = missing.iter().map(|(_, _, example)| *example).collect();
                errors.at(
                    &opts.ident,
                    format!(
                        "missing {}: add `#[nsa({})]`, or start from a preset: `#[nsa(preset = \"{PLACEHOLDER_PRESET}\")]`",
                        keys.join(", "),
                        examples.join(", ")
                    ),
                );
            }
        }

        // The runtime's validation, verbatim; each issue on the attribute it is about.
        if let Err(e) = config.validate() {
            let mut duplicates = duplicate_target_lits(&config.targets, &src.target_lits).into_iter();
            for issue in &e.issues {
                let at = match issue.field {
                    "targets" if !config.targets.is_empty() => {
                        duplicates.next().map(|lit| lit.to_token_stream()).unwrap_or_else(|| src.span_of("targets"))
                    }
                    field => src.span_of(field),
                };
                errors.at(&at, issue);
            }
        }

        let default_crate: syn::Path = syn::parse_quote!(::nsa_runtime);
        let krate = match opts.krate {
            Some(Lenient::Ok(Quoted(lit), _)) => lit.parse::<syn::Path>().unwrap_or_else(|e| {
                errors.at(&lit, format!("expected the path of the runtime crate, e.g. \"::nsa_runtime\": {e}"));
                default_crate
            }),
            Some(Lenient::Err(e)) => {
                errors.push(e);
                default_crate
            }
            None => default_crate,
        };
        let embed_sources = opts.embed_sources.is_present();
        errors.finish()?;
        Ok(Model { ident: opts.ident, generics: opts.generics, krate, config, embed_sources })
    }

    /// The validated configuration.
    #[cfg(test)]
    pub fn config(&self) -> &NsaConfig {
        &self.config
    }

    /// The `NsaModel` impl.
    pub fn expand(&self) -> TokenStream {
        let Model { ident, generics, krate, config, embed_sources } = self;
        let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
        let name = ident.to_string();
        let format = format_ident!("{}", format!("{:?}", config.kv_cache));
        let u = |v: u32| Literal::u32_unsuffixed(v);
        let (page_size, topk, heads) = (u(config.page_size), u(config.topk), u(config.num_q_heads));
        let (rank, rope) = (u(config.kv_lora_rank), u(config.qk_rope_head_dim));
        let (index_heads, index_dim) = (u(config.index_n_heads), u(config.index_head_dim));
        // Debug of a unit variant is its name: no match to keep in step with `Target`.
        let targets = config.targets.iter().map(|t| format_ident!("{}", format!("{t:?}")));
        let topk_bf16_scores = config.topk_bf16_scores;
        let sources = embed_sources.then(|| self.embedded_sources());
        quote! {
            #[automatically_derived]
            impl #impl_generics #krate::model::NsaModel for #ident #ty_generics #where_clause {
                type KvFormat = #krate::model::format::#format;
                const NAME: &'static str = #name;
                const PAGE_SIZE: u32 = #page_size;
                const TOPK: u32 = #topk;
                const NUM_Q_HEADS: u32 = #heads;
                const KV_LORA_RANK: u32 = #rank;
                const QK_ROPE_HEAD_DIM: u32 = #rope;
                const INDEX_N_HEADS: u32 = #index_heads;
                const INDEX_HEAD_DIM: u32 = #index_dim;
                const TARGETS: &'static [#krate::kernels::Target] = &[#(#krate::kernels::Target::#targets),*];
                const TOPK_BF16_SCORES: bool = #topk_bf16_scores;
                #sources
            }
        }
    }

    /// `const EMBEDDED_SOURCES`: every kernel of the set, rendered by the same
    /// `nsa_kernels::render` the runtime calls.
    fn embedded_sources(&self) -> TokenStream {
        let krate = &self.krate;
        let entries = nsa_kernels::kernel_set(&self.config).into_iter().map(|spec| match nsa_kernels::render(&spec) {
            Ok(k) => {
                let (id, symbol, source_name, source) = (k.id, k.symbol, k.source_name, k.source);
                quote! {
                    #krate::model::EmbeddedSource {
                        id: #id, symbol: #symbol, source_name: #source_name, source: #source,
                    }
                }
            }
            // A template bug, never the user's: say so where the sources were asked for.
            Err(e) => syn::Error::new_spanned(&self.ident, e).into_compile_error(),
        });
        quote! {
            const EMBEDDED_SOURCES: &'static [#krate::model::EmbeddedSource] = &[#(#entries),*];
        }
    }
}

/// The literal of each repeated target, in the order `NsaConfig::validate` reports
/// the repeats (it walks the list and flags every target seen before).
fn duplicate_target_lits<'a>(targets: &[Target], lits: &'a [syn::LitStr]) -> Vec<&'a syn::LitStr> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for (t, lit) in targets.iter().zip(lits) {
        if seen.contains(t) {
            out.push(lit);
        }
        seen.push(*t);
    }
    out
}

/// A valid stand-in for fields that could not be read.
fn placeholder() -> NsaConfig {
    NsaConfig::preset(PLACEHOLDER_PRESET).expect("the placeholder preset exists")
}

/// What a config file with only the required fields gives: the optional fields
/// take their serde defaults, exactly as `NsaConfig::from_text` would. The required
/// ones hold the placeholder's values until the attributes set them.
fn serde_defaults() -> NsaConfig {
    let full = serde_json::to_value(placeholder()).expect("NsaConfig serializes");
    let required: serde_json::Map<String, serde_json::Value> =
        REQUIRED.iter().map(|(field, _, _)| (field.to_string(), full[*field].clone())).collect();
    serde_json::from_value(serde_json::Value::Object(required)).expect("required fields suffice")
}
