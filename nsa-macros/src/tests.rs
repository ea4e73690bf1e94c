//! Unit tests of the expansion: insta snapshots (pretty-printed) and the identity
//! of compile-time and run-time validation.

use crate::expand::{derive, Model};
use nsa_kernels::NsaConfig;
use proc_macro2::TokenStream;
use quote::quote;

fn parse(input: TokenStream) -> syn::DeriveInput {
    syn::parse2(input).expect("test input parses")
}

/// The expansion, pretty-printed.
fn expand(input: TokenStream) -> String {
    let file: syn::File = syn::parse2(derive(&parse(input))).expect("the expansion is an item list");
    prettyplease::unparse(&file)
}

/// The messages of every error the derive gives for `input`.
fn errors(input: TokenStream) -> Vec<String> {
    match Model::from_input(&parse(input)) {
        Ok(m) => panic!("expected errors, got {:?}", m.config()),
        Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn expansion_preset_with_override() {
    insta::assert_snapshot!(expand(quote! {
        #[derive(NsaKernels)]
        #[nsa(preset = "deepseek-v3.2", heads = 16)]
        pub struct DeepSeekV32Tp8;
    }));
}

#[test]
fn expansion_spelled_out_bf16() {
    insta::assert_snapshot!(expand(quote! {
        #[derive(NsaKernels)]
        #[nsa(page_size = 128, topk = 1024, heads = 64, kv_cache = "bf16", targets("gfx942", "sm_90a"))]
        #[nsa(indexer(heads = 64, head_dim = 128), kv_lora_rank = 512, rope_dim = 64)]
        pub struct Bf16Model;
    }));
}

#[test]
fn expansion_generic_with_crate_path() {
    insta::assert_snapshot!(expand(quote! {
        #[derive(NsaKernels)]
        #[nsa(preset = "deepseek-v3.2-tp16", targets = ["sm_100a"], crate = "my_engine::nsa")]
        struct Layer<'a, T: Copy>(&'a [T]) where T: Send;
    }));
}

#[test]
fn embed_sources_adds_one_entry_per_spec() {
    let out = expand(quote! {
        #[derive(NsaKernels)]
        #[nsa(preset = "deepseek-v3.2", targets("sm_90a"), embed_sources)]
        struct M;
    });
    let specs = nsa_kernels::kernel_set(&NsaConfig { targets: vec![nsa_kernels::Target::Sm90a], ..preset() });
    assert_eq!(out.matches("::nsa_runtime::model::EmbeddedSource {").count(), specs.len(), "{out}");
    for spec in specs {
        assert!(out.contains(&format!("id: \"{}\"", spec.id())), "{} missing", spec.id());
    }
}

fn preset() -> NsaConfig {
    NsaConfig::preset("deepseek-v3.2").unwrap()
}

/// Without a preset the optional fields take the defaults a config file gets.
#[test]
fn no_preset_means_config_file_defaults() {
    let m = Model::from_input(&parse(quote! {
        #[nsa(page_size = 64, topk = 2048, heads = 128, kv_cache = "bf16", targets("sm_90a"))]
        struct M;
    }))
    .unwrap();
    let file = "page_size = 64\ntopk = 2048\nnum_q_heads = 128\nkv_cache = \"bf16\"\ntargets = [\"sm_90a\"]\n";
    assert_eq!(m.config(), &NsaConfig::from_text(file).unwrap());
}

#[test]
fn topk_bf16_scores_flag_sets_the_field_and_the_const() {
    let input = quote! {
        #[nsa(preset = "deepseek-v3.2", topk_bf16_scores)]
        struct M;
    };
    let m = Model::from_input(&parse(input.clone())).unwrap();
    assert_eq!(m.config(), &NsaConfig { topk_bf16_scores: true, ..preset() });
    assert!(expand(input).contains("const TOPK_BF16_SCORES: bool = true;"));
    let plain = expand(quote! {
        #[nsa(preset = "deepseek-v3.2")]
        struct M;
    });
    assert!(plain.contains("const TOPK_BF16_SCORES: bool = false;"), "{plain}");
}

#[test]
fn preset_then_overrides() {
    let m = Model::from_input(&parse(quote! {
        #[nsa(preset = "deepseek-v3.2-tp2", topk = 1024, kv_cache = "bf16", targets("gfx942"))]
        struct M;
    }))
    .unwrap();
    let want = NsaConfig {
        topk: 1024,
        kv_cache: nsa_kernels::KvCacheFormat::Bf16,
        targets: vec![nsa_kernels::Target::Gfx942],
        ..NsaConfig::preset("deepseek-v3.2-tp2").unwrap()
    };
    assert_eq!(m.config(), &want);
}

/// The compile-time messages are the runtime's, issue for issue, in its order.
#[test]
fn messages_are_the_runtimes() {
    let got = errors(quote! {
        #[nsa(preset = "deepseek-v3.2", page_size = 2000, topk = 96, heads = 48, rope_dim = 32,
              indexer(heads = 1, head_dim = 256), kv_lora_rank = 0, targets("sm_100a", "sm_100a", "gfx942", "gfx942"))]
        struct M;
    });
    let bad = NsaConfig {
        page_size: 2000,
        topk: 96,
        num_q_heads: 48,
        kv_lora_rank: 0,
        qk_rope_head_dim: 32,
        index_n_heads: 1,
        index_head_dim: 256,
        targets: vec![
            nsa_kernels::Target::Sm100a,
            nsa_kernels::Target::Sm100a,
            nsa_kernels::Target::Gfx942,
            nsa_kernels::Target::Gfx942,
        ],
        ..preset()
    };
    let want: Vec<String> = bad.validate().unwrap_err().issues.iter().map(|i| i.to_string()).collect();
    assert_eq!(want.len(), 9);
    assert_eq!(got, want);
}

#[test]
fn parser_messages_are_the_runtimes() {
    let got = errors(quote! {
        #[nsa(preset = "deepseek-v3.3", kv_cache = "int4", targets("sm_89"))]
        struct M;
    });
    let want = vec![
        NsaConfig::preset("deepseek-v3.3").unwrap_err().issues[0].to_string(),
        "int4".parse::<nsa_kernels::KvCacheFormat>().unwrap_err(),
        "sm_89".parse::<nsa_kernels::Target>().unwrap_err().to_string(),
    ];
    assert_eq!(got, want);
}

/// One misspelt key does not hide the other problems, and brings no "missing" noise.
#[test]
fn unknown_key_and_validation_together() {
    let got = errors(quote! {
        #[nsa(page_size = 0, topk = 2048, heds = 16, kv_cache = "fp8", targets("sm_90a"))]
        struct M;
    });
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(got[0].contains("`heds`") && got[0].contains("Did you mean `heads`?"), "{got:#?}");
    assert!(got[1].starts_with("`page_size` = 0 is not allowed"), "{got:#?}");
}

#[test]
fn presets_all_expand() {
    for (name, _) in nsa_kernels::PRESETS {
        let m = Model::from_input(&parse(quote! { #[nsa(preset = #name)] struct M; })).unwrap();
        assert_eq!(m.config(), &NsaConfig::preset(name).unwrap());
    }
}
