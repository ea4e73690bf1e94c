//! The `#[nsa(...)]` attribute grammar, parsed by darling.
//!
//! Every value is wrapped in [`Lenient`], which never fails the darling parse: a
//! wrong type is kept as an error and reported together with everything else,
//! instead of hiding the range checks of the other keys. Unknown keys do fail the
//! strict parse (that is where darling's "did you mean" comes from); the derive then
//! re-parses with [`LenientOpts`] (`allow_unknown_fields`) so the known keys are
//! still checked in the same compile.

use darling::ast::NestedMeta;
use darling::util::Flag;
use darling::{FromDeriveInput, FromMeta};
use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::{Expr, ExprArray, Lit, LitStr, Meta};

/// A value that parsed (with the tokens of its `key = value` / `key(...)` item, for
/// spans), or the error darling gave for it.
#[derive(Debug)]
pub enum Lenient<T> {
    Ok(T, TokenStream),
    Err(darling::Error),
}

impl<T: FromMeta> FromMeta for Lenient<T> {
    fn from_meta(item: &Meta) -> darling::Result<Self> {
        Ok(match T::from_meta(item) {
            Ok(value) => Lenient::Ok(value, item.to_token_stream()),
            Err(e) => Lenient::Err(e.with_span(item)),
        })
    }
}

/// An integer key's value: an unsuffixed or `u32` integer literal, nothing else
/// (darling's own `u32` would also take `"64"`).
#[derive(Debug)]
pub struct U32(pub u32);

impl FromMeta for U32 {
    fn from_value(value: &Lit) -> darling::Result<Self> {
        match value {
            Lit::Int(i) => i
                .base10_parse::<u32>()
                .map(U32)
                .map_err(|_| darling::Error::custom(format!("`{i}` does not fit in a u32")).with_span(i)),
            other => {
                Err(darling::Error::custom(format!("expected an integer, found {}", lit_kind(other))).with_span(other))
            }
        }
    }

    fn from_expr(expr: &Expr) -> darling::Result<Self> {
        match expr {
            Expr::Lit(l) => Self::from_value(&l.lit),
            Expr::Group(g) => Self::from_expr(&g.expr),
            Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => {
                Err(darling::Error::custom("expected a non-negative integer").with_span(expr))
            }
            other => Err(darling::Error::custom("expected an integer literal").with_span(other)),
        }
    }
}

/// A string key's value: a string literal (a bare name gets a hint to quote it).
#[derive(Debug)]
pub struct Quoted(pub LitStr);

impl FromMeta for Quoted {
    fn from_value(value: &Lit) -> darling::Result<Self> {
        match value {
            Lit::Str(s) => Ok(Quoted(s.clone())),
            other => Err(darling::Error::custom(format!("expected a string literal, found {}", lit_kind(other)))
                .with_span(other)),
        }
    }

    fn from_expr(expr: &Expr) -> darling::Result<Self> {
        match expr {
            Expr::Lit(l) => Self::from_value(&l.lit),
            Expr::Group(g) => Self::from_expr(&g.expr),
            other => {
                let text = other.to_token_stream().to_string().replace(' ', "");
                Err(darling::Error::custom(format!("expected a string literal: write \"{text}\"")).with_span(other))
            }
        }
    }
}

fn lit_kind(lit: &Lit) -> &'static str {
    match lit {
        Lit::Str(_) => "a string",
        Lit::ByteStr(_) | Lit::CStr(_) => "a byte string",
        Lit::Byte(_) | Lit::Char(_) => "a character",
        Lit::Int(_) => "an integer",
        Lit::Float(_) => "a float",
        Lit::Bool(_) => "a bool",
        _ => "another literal",
    }
}

/// `targets("sm_90a", "sm_100a")`, `targets = ["sm_90a", "sm_100a"]` or
/// `targets = "sm_90a"`: the arch strings, each kept as a literal for its span.
#[derive(Debug)]
pub struct TargetList(pub Vec<LitStr>);

impl FromMeta for TargetList {
    fn from_list(items: &[NestedMeta]) -> darling::Result<Self> {
        let mut errors = darling::Error::accumulator();
        let mut lits = Vec::new();
        for item in items {
            match item {
                NestedMeta::Lit(Lit::Str(s)) => lits.push(s.clone()),
                NestedMeta::Lit(lit) => errors.push(
                    darling::Error::custom(format!("expected a target name in quotes, found {}", lit_kind(lit)))
                        .with_span(lit),
                ),
                NestedMeta::Meta(m) => {
                    let text = m.to_token_stream().to_string().replace(' ', "");
                    errors.push(
                        darling::Error::custom(format!("expected a target name in quotes: write \"{text}\""))
                            .with_span(m),
                    )
                }
            }
        }
        errors.finish_with(TargetList(lits))
    }

    fn from_value(value: &Lit) -> darling::Result<Self> {
        match value {
            Lit::Str(s) => Ok(TargetList(vec![s.clone()])),
            other => Err(darling::Error::custom(format!(
                "expected target names, e.g. `targets(\"sm_90a\", \"sm_100a\")`, found {}",
                lit_kind(other)
            ))
            .with_span(other)),
        }
    }

    fn from_expr(expr: &Expr) -> darling::Result<Self> {
        match expr {
            Expr::Array(ExprArray { elems, .. }) => {
                let items: Vec<NestedMeta> = elems
                    .iter()
                    .map(|e| match e {
                        Expr::Lit(l) => Ok(NestedMeta::Lit(l.lit.clone())),
                        other => Err(darling::Error::custom("expected a target name in quotes").with_span(other)),
                    })
                    .collect::<darling::Result<_>>()?;
                Self::from_list(&items)
            }
            Expr::Lit(l) => Self::from_value(&l.lit),
            Expr::Group(g) => Self::from_expr(&g.expr),
            other => Err(darling::Error::custom("expected target names, e.g. `targets(\"sm_90a\", \"sm_100a\")`")
                .with_span(other)),
        }
    }
}

/// `indexer(heads = 64, head_dim = 128)`: the lightning indexer's shape.
#[derive(Debug, FromMeta)]
pub struct IndexerOpts {
    /// → `index_n_heads`.
    pub heads: Option<Lenient<U32>>,
    /// → `index_head_dim`.
    pub head_dim: Option<Lenient<U32>>,
}

/// Declares the options struct twice: strict (unknown keys are errors with
/// suggestions) and lenient (unknown keys ignored), with a conversion between them.
macro_rules! options {
    ($( $(#[$fattr:meta])* $field:ident : $ty:ty, )*) => {
        /// The derive's input and its `#[nsa(...)]` keys.
        #[derive(Debug, FromDeriveInput)]
        #[darling(attributes(nsa), supports(struct_any))]
        pub struct Opts {
            pub ident: syn::Ident,
            pub generics: syn::Generics,
            $( $(#[$fattr])* pub $field: $ty, )*
        }

        /// [`Opts`] without the unknown-key check, for a second pass after it failed.
        #[derive(Debug, FromDeriveInput)]
        #[darling(attributes(nsa), supports(struct_any), allow_unknown_fields)]
        pub struct LenientOpts {
            pub ident: syn::Ident,
            pub generics: syn::Generics,
            $( $(#[$fattr])* pub $field: $ty, )*
        }

        impl From<LenientOpts> for Opts {
            fn from(o: LenientOpts) -> Opts {
                Opts { ident: o.ident, generics: o.generics, $( $field: o.$field, )* }
            }
        }
    };
}

options! {
    /// A named configuration (`nsa_kernels::PRESETS`) the other keys override.
    preset: Option<Lenient<Quoted>>,
    /// → `page_size`.
    page_size: Option<Lenient<U32>>,
    /// → `topk`.
    topk: Option<Lenient<U32>>,
    /// → `num_q_heads`.
    heads: Option<Lenient<U32>>,
    /// → `kv_cache`: "bf16" or "fp8" (what `KvCacheFormat::from_str` takes).
    kv_cache: Option<Lenient<Quoted>>,
    /// → `targets`.
    targets: Option<Lenient<TargetList>>,
    /// → `index_n_heads`, `index_head_dim`.
    indexer: Option<Lenient<IndexerOpts>>,
    /// → `kv_lora_rank`.
    kv_lora_rank: Option<Lenient<U32>>,
    /// → `qk_rope_head_dim`.
    rope_dim: Option<Lenient<U32>>,
    /// Path of the runtime crate in generated code (default `::nsa_runtime`).
    #[darling(rename = "crate")]
    krate: Option<Lenient<Quoted>>,
    /// Render every kernel at compile time into `NsaModel::EMBEDDED_SOURCES`.
    embed_sources: Flag,
    /// → `topk_bf16_scores` (flag).
    topk_bf16_scores: Flag,
}
