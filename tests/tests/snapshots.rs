//! Snapshots of what the generator emits for a fixed matrix of configurations
//! (kernel sets, rendered sources, spec / template-context JSON), plus checks that
//! no template or header is dead, that templates are strict, and that ids and
//! entry symbols follow their rules.
//!
//! Update with `INSTA_UPDATE=always cargo test -p nsa-tests --test snapshots`
//! and review the diff of `tests/snapshots/`.

use nsa_kernels::layout;
use nsa_kernels::render::{render_with_context, TEMPLATES};
use nsa_kernels::spec::DenseKernel;
use nsa_kernels::{kernel_set, render, KernelFamily, KernelSpec, KvCacheFormat, NsaConfig, Target, HEADERS};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MATRIX_PRESETS: [&str; 2] = ["deepseek-v3.2", "deepseek-v3.2-tp8"];
const MATRIX_FORMATS: [KvCacheFormat; 2] = [KvCacheFormat::Bf16, KvCacheFormat::Fp8];

/// (name, config) for every preset x cache format, generating for every target.
fn matrix() -> Vec<(String, NsaConfig)> {
    let mut out = Vec::new();
    for preset in MATRIX_PRESETS {
        for format in MATRIX_FORMATS {
            let mut cfg = NsaConfig::preset(preset).unwrap();
            cfg.kv_cache = format;
            cfg.targets = Target::ALL.to_vec();
            cfg.validate().unwrap();
            out.push((format!("{preset}__{}", format.tag()), cfg));
        }
    }
    out
}

/// Every distinct spec the matrix needs, plus every representative variant, sorted.
fn matrix_specs() -> BTreeSet<KernelSpec> {
    matrix().iter().flat_map(|(_, c)| kernel_set(c)).chain(all_specs()).collect()
}

/// Every variant that exists.
fn all_specs() -> Vec<KernelSpec> {
    Target::ALL.into_iter().flat_map(KernelSpec::all_for).collect()
}

fn sorted_maps(f: impl FnOnce()) {
    let mut settings = insta::Settings::clone_current();
    settings.set_sort_maps(true);
    settings.set_omit_expression(true);
    settings.bind(f);
}

// ---------------------------------------------------------------- snapshots

#[test]
fn kernel_set_ids() {
    sorted_maps(|| {
        for (name, cfg) in matrix() {
            let mut text = format!("# {}\n", cfg.summary());
            for spec in kernel_set(&cfg) {
                text.push_str(&spec.id());
                text.push('\n');
            }
            insta::assert_snapshot!(format!("kernel_set__{name}"), text);
        }
    });
}

#[test]
fn kernel_set_is_sorted_unique_and_covers_each_target() {
    for (name, cfg) in matrix() {
        let set = kernel_set(&cfg);
        assert!(set.windows(2).all(|w| w[0] < w[1]), "{name}: not sorted/unique");
        for t in &cfg.targets {
            let families: BTreeSet<&str> = set.iter().filter(|s| s.target == *t).map(|s| s.family_name()).collect();
            let mut expected = BTreeSet::from([
                "kv_store",
                "indexer_k_store",
                "indexer_k_gather",
                // Both stores of a layer step in one launch.
                "step_store",
                "topk",
                "index_transform",
                "metadata_replay",
                "topk_split",
                // The cache read back as bf16 rows (RAGGED prefix, MHA one-shot).
                "kv_dequant",
            ]);
            let nvidia = t.vendor() == nsa_kernels::Vendor::Nvidia;
            // Sparse MLA is NVIDIA only (mma.sync) so far: prefill for every format.
            // Dense MHA one-shot on every target (the scalar kernel on gfx942).
            expected.insert("dense_prefill");
            if nvidia {
                expected.extend(["sparse_prefill", "indexer_logits"]);
            }
            // Few long top-k rows go over clusters where the target has them.
            if t.has_clusters() {
                expected.insert("topk_cluster");
            }
            // Sparse decode reads the FP8 cache.
            if cfg.kv_cache == KvCacheFormat::Fp8 && nvidia {
                expected.extend(["sparse_decode", "sparse_decode_combine"]);
            }
            assert_eq!(families, expected, "{name} on {t}");
        }
        assert!(set.iter().all(|s| cfg.targets.contains(&s.target)), "{name}");
        // A repeated target does not repeat kernels.
        let mut twice = cfg.clone();
        twice.targets.extend(cfg.targets.iter().copied());
        assert_eq!(kernel_set(&twice), set, "{name}");
    }
}

#[test]
fn config_kernel_sets_stay_within_the_representative_variants() {
    // The snapshots below render matrix_specs(); the presets' sets are part of it,
    // and for the default top-k (2048) they need nothing all_for() lacks.
    let all: BTreeSet<KernelSpec> = all_specs().into_iter().collect();
    for (name, cfg) in matrix() {
        for spec in kernel_set(&cfg) {
            assert!(all.contains(&spec), "{name}: {spec} is not in KernelSpec::all_for");
        }
    }
}

#[test]
fn rendered_sources() {
    sorted_maps(|| {
        for spec in matrix_specs() {
            let r = render(&spec).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(r.spec, spec);
            assert_eq!(r.id, spec.id());
            assert_eq!(r.symbol, spec.symbol());
            assert_eq!(r.source_name, spec.source_name());
            insta::assert_snapshot!(format!("source__{}", spec.id()), r.source);
        }
    });
}

#[test]
fn spec_and_context_json() {
    sorted_maps(|| {
        for spec in matrix_specs() {
            let doc = json!({
                "spec": spec,
                "id": spec.id(),
                "symbol": spec.symbol(),
                "source_name": spec.source_name(),
                "template": spec.template(),
                "block_threads": spec.block_threads(),
                "tokens_per_block": spec.tokens_per_block(),
                "toolchain": spec.target.toolchain(),
                "output_kind": spec.target.output_kind(),
                "context": spec.context(),
            });
            insta::assert_json_snapshot!(format!("spec__{}", spec.id()), doc);
        }
    });
}

#[test]
fn rendering_is_deterministic() {
    for spec in all_specs() {
        let a = render(&spec).unwrap();
        let b = render(&spec).unwrap();
        assert_eq!(a, b, "{spec}");
        assert_eq!(spec.context(), spec.context(), "{spec}");
    }
}

// ---------------------------------------------------------------- dead files

/// `#include "x"` names in `text`; panics on `<...>` includes (sources must be self-contained).
fn includes(text: &str, what: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix("#include") else {
            continue;
        };
        let rest = rest.trim();
        let name = rest
            .strip_prefix('"')
            .and_then(|r| r.split('"').next())
            .unwrap_or_else(|| panic!("{what}: `{line}` is not a quoted include of an embedded header"));
        out.push(name.to_string());
    }
    out
}

fn header(name: &str) -> Option<&'static str> {
    HEADERS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// Every header `source` includes, transitively; panics on one that is not embedded.
fn included_closure(source: &str, what: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = includes(source, what);
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let text = header(&name).unwrap_or_else(|| panic!("{what} includes `{name}`, which is not in render::HEADERS"));
        todo.extend(includes(text, &name));
    }
    seen
}

#[test]
fn every_template_is_used_by_some_spec() {
    let used: BTreeSet<&str> = all_specs().iter().map(KernelSpec::template).collect();
    let embedded: BTreeSet<&str> = TEMPLATES.iter().map(|(n, _)| *n).collect();
    assert_eq!(used, embedded, "templates used by specs vs embedded templates");
}

#[test]
fn every_header_is_included_by_some_source() {
    let mut reached = BTreeSet::new();
    for spec in all_specs() {
        let r = render(&spec).unwrap();
        reached.extend(included_closure(&r.source, &r.id));
    }
    let embedded: BTreeSet<String> = HEADERS.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(reached, embedded, "headers reached from sources vs embedded headers");
}

#[test]
fn every_header_is_guarded() {
    for (name, text) in HEADERS {
        assert!(text.contains("#pragma once"), "{name} lacks #pragma once");
    }
}

fn files_under(dir: &Path, suffix: &str) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, suffix: &str, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, suffix, out);
            } else if path.to_string_lossy().ends_with(suffix) {
                let rel = path.strip_prefix(root).unwrap();
                let rel: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
                out.insert(rel.join("/"));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, suffix, &mut out);
    out
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[test]
fn every_file_on_disk_is_embedded_and_identical() {
    let root = workspace_root();
    let template_dir = root.join("templates");
    let on_disk = files_under(&template_dir, ".tera");
    let embedded: BTreeSet<String> = TEMPLATES.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(on_disk, embedded, "templates/ vs render::TEMPLATES");
    for (name, text) in TEMPLATES {
        assert_eq!(std::fs::read_to_string(template_dir.join(name)).unwrap(), *text, "{name}");
    }

    let include_dir = root.join("kernels/include");
    let on_disk = files_under(&include_dir, ".cuh");
    let embedded: BTreeSet<String> = HEADERS.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(on_disk, embedded, "kernels/include/ vs render::HEADERS");
    for (name, text) in HEADERS {
        assert_eq!(std::fs::read_to_string(include_dir.join(name)).unwrap(), *text, "{name}");
    }
}

// ---------------------------------------------------------------- template strictness

/// The variables `{{ name }}` a template reads (leading identifier of each expression).
fn template_vars(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("{{") {
        let after = &rest[i + 2..];
        let end = after.find("}}").expect("unterminated {{");
        let name: String = after[..end]
            .trim_start_matches('-')
            .trim()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(!name.is_empty(), "unparsed expression {:?}", &after[..end]);
        out.insert(name);
        rest = &after[end + 2..];
    }
    out
}

#[test]
fn an_empty_context_fails_every_template() {
    for (name, _) in TEMPLATES {
        let err = render_with_context(name, json!({})).unwrap_err();
        assert!(err.contains("not found in context"), "{name}: unexpected error {err}");
    }
}

#[test]
fn a_context_missing_any_variable_fails() {
    for spec in all_specs() {
        let text = TEMPLATES.iter().find(|(n, _)| *n == spec.template()).unwrap().1;
        let full = spec.context();
        // The engine renders the same text as `render`.
        assert_eq!(
            render_with_context(spec.template(), full.clone()).unwrap(),
            render(&spec).unwrap().source,
            "{spec}"
        );
        let vars = template_vars(text);
        assert!(!vars.is_empty(), "{spec}");
        for var in &vars {
            let mut ctx = full.clone();
            let removed = ctx.as_object_mut().unwrap().remove(var);
            assert!(removed.is_some(), "{spec}: context lacks `{var}` the template reads");
            let err = render_with_context(spec.template(), ctx).unwrap_err();
            assert!(
                err.contains(&format!("`{var}`")) && err.contains("not found in context"),
                "{spec} without `{var}`: {err}"
            );
        }
    }
}

#[test]
fn unknown_template_fails() {
    assert!(render_with_context("no_such.cu.tera", json!({})).is_err());
}

// ---------------------------------------------------------------- ids and symbols

fn is_c_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[test]
fn ids_and_symbols_are_unique_and_round_trip() {
    let specs = all_specs();
    // 3 store kernels + 2 step stores (both keys in one launch) + 2 cache reads (FP8 dequant, bf16 gather) + 1 indexer gather + 3
    // top-k (k 512, 1024, 2048) + 1 deterministic + 1 throughput top-k + 1 index
    // transform + 4 metadata modes × 2 page sizes + 1 split top-k per target, and bf16
    // scores for top-k, deterministic, throughput and split (4); the f32 k 2048
    // top-k kernel also writes slots from a page_table_1 and from a table of pages
    // (2), its throughput and split kernels slots of either form (2; the rest,
    // positions). On NVIDIA also 9 sparse decode variants, 5 combines, 7 sparse
    // prefill variants, 2 indexer logits layouts, 3 cluster top-k (the cluster size
    // is a launch attribute), 1 bf16 and 2 slots cluster top-k (page_table_1, table
    // of pages) and 7 dense prefill variants; on
    // sm_90a the same 7 with the warp-group kernel and 4 paired-block sparse prefill
    // variants; on every target the same 7 with the scalar kernel.
    let nvidia = Target::ALL.iter().filter(|t| t.vendor() == nsa_kernels::Vendor::Nvidia).count();
    assert_eq!(specs.len(), 38 * Target::ALL.len() + 36 * nvidia + 7 + 4);
    let mut ids = BTreeMap::new();
    let mut symbols = BTreeMap::new();
    let mut sources = BTreeSet::new();
    for spec in &specs {
        let id = spec.id();
        assert!(ids.insert(id.clone(), *spec).is_none(), "id {id} repeats");
        assert_eq!(KernelSpec::from_id(&id), Some(*spec), "from_id({id})");
        assert_eq!(spec.to_string(), id);
        assert!(id.starts_with(&format!("{}.", spec.family_name())), "{id} does not start with its family");
        assert!(id.ends_with(&format!(".{}", spec.target.arch())), "{id} does not end with its target");
        assert!(!id.contains("__"), "{id} holds `__`");
        assert!(
            id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.'),
            "{id} holds characters unsafe in file names"
        );

        let symbol = spec.symbol();
        assert!(is_c_identifier(&symbol), "{symbol} is not a C identifier");
        assert!(!symbol.contains("___"), "{symbol}: ambiguous separator");
        assert_eq!(
            symbol.strip_prefix("nsa_").map(|s| s.replace("__", ".")),
            Some(id.clone()),
            "{symbol} does not map back to {id}"
        );
        assert!(symbols.insert(symbol.clone(), *spec).is_none(), "symbol {symbol} repeats");
        assert!(sources.insert(spec.source_name()), "source name repeats");
        assert_eq!(spec.source_name(), format!("{id}.cu"));

        // Serde form round-trips too (it is what cache keys and the CLI print).
        let v = serde_json::to_value(spec).unwrap();
        assert_eq!(serde_json::from_value::<KernelSpec>(v).unwrap(), *spec);
    }
    for bad in [
        "",
        "kv_store",
        "kv_store.fp8_656",
        "kv_store.fp8_656.sm_80",
        "kv_dequant.f16_576.sm_90a",
        "dense_prefill.h16.d192.v128.wg.sm_100a",
        "dense_prefill.h16.d192.v128.tc.sm_90a",
    ] {
        assert_eq!(KernelSpec::from_id(bad), None, "{bad:?}");
    }
}

#[test]
fn each_source_defines_its_symbol_once() {
    for spec in all_specs() {
        let r = render(&spec).unwrap();
        let def = format!(" {}(", r.symbol);
        assert_eq!(r.source.matches(&def).count(), 1, "{}", r.id);
        assert_eq!(r.source.matches("NSA_KERNEL").count(), 1, "{}", r.id);
        assert!(r.source.contains(&format!("#include \"{}\"", spec.target.arch_header())));
        // The header of another vendor is never pulled in.
        let other = match spec.target.arch_header() {
            "nsa/cuda/arch.cuh" => "nsa/rocm/arch.cuh",
            _ => "nsa/cuda/arch.cuh",
        };
        assert!(!included_closure(&r.source, &r.id).contains(other), "{} includes {other}", r.id);
    }
}

// ---------------------------------------------------------------- launch geometry

/// `constexpr int NAME = EXPR;` of `text`, where EXPR is built from integer
/// literals, earlier constants, `+ - * /` and parentheses.
fn int_constants(text: &str) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for line in text.lines() {
        // Namespace-scope constants only (unindented); function-local ones depend on template arguments.
        let Some(rest) = line.strip_prefix("constexpr int ") else {
            continue;
        };
        let (name, expr) = rest.split_once('=').unwrap();
        let expr = expr.split(';').next().unwrap();
        let mut tokens = Vec::new();
        let mut word = String::new();
        for c in expr.chars().chain([' ']) {
            if c.is_ascii_alphanumeric() || c == '_' {
                word.push(c);
                continue;
            }
            if !word.is_empty() {
                tokens.push(std::mem::take(&mut word));
            }
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
        }
        let mut pos = 0;
        let value = eval_sum(&tokens, &mut pos, &out, line);
        assert_eq!(pos, tokens.len(), "cannot evaluate `{line}`");
        out.insert(name.trim().to_string(), value);
    }
    out
}

fn eval_sum(t: &[String], pos: &mut usize, env: &BTreeMap<String, i64>, line: &str) -> i64 {
    let mut v = eval_product(t, pos, env, line);
    while let Some(op) = t.get(*pos).filter(|o| *o == "+" || *o == "-").cloned() {
        *pos += 1;
        let r = eval_product(t, pos, env, line);
        v = if op == "+" { v + r } else { v - r };
    }
    v
}

fn eval_product(t: &[String], pos: &mut usize, env: &BTreeMap<String, i64>, line: &str) -> i64 {
    let mut v = eval_atom(t, pos, env, line);
    while let Some(op) = t.get(*pos).filter(|o| *o == "*" || *o == "/").cloned() {
        *pos += 1;
        let r = eval_atom(t, pos, env, line);
        v = if op == "*" { v * r } else { v / r };
    }
    v
}

fn eval_atom(t: &[String], pos: &mut usize, env: &BTreeMap<String, i64>, line: &str) -> i64 {
    let tok = t.get(*pos).unwrap_or_else(|| panic!("cannot evaluate `{line}`"));
    *pos += 1;
    if tok == "(" {
        let v = eval_sum(t, pos, env, line);
        assert_eq!(t.get(*pos).map(String::as_str), Some(")"), "cannot evaluate `{line}`");
        *pos += 1;
        return v;
    }
    tok.parse().ok().or_else(|| env.get(tok).copied()).unwrap_or_else(|| panic!("cannot evaluate `{tok}` in `{line}`"))
}

#[test]
fn device_constants_agree_with_the_host_layout() {
    let k = int_constants(header("nsa/kv/kv_cache.cuh").unwrap());
    let expect = [
        ("kLatent", layout::KV_LORA_RANK),
        ("kRope", layout::ROPE_DIM),
        ("kTile", layout::FP8_TILE),
        ("kFp8TokenBytes", layout::FP8_TOKEN_BYTES),
        ("kFp8ScalesOffset", layout::FP8_SCALES_OFFSET),
        ("kFp8RopeOffset", layout::FP8_ROPE_OFFSET),
        ("kBf16TokenElems", layout::BF16_TOKEN_ELEMS),
        ("kIdxDim", layout::INDEXER_HEAD_DIM),
        ("kIdxPageTokens", layout::INDEXER_PAGE_TOKENS),
        ("kIdxPageBytes", layout::INDEXER_PAGE_BYTES),
    ];
    for (name, value) in expect {
        assert_eq!(k.get(name).copied(), Some(value as i64), "{name}");
    }
    assert_eq!(KvCacheFormat::Fp8.token_bytes() as i64, k["kFp8TokenBytes"]);
    assert_eq!(KvCacheFormat::Bf16.token_bytes() as i64, 2 * k["kBf16TokenElems"]);
}

fn r_has_bounds(spec: &KernelSpec, threads: u32) -> bool {
    let src = render(spec).unwrap().source;
    src.contains(&format!("NSA_LAUNCH_BOUNDS({threads})"))
        || src.contains(&format!("NSA_LAUNCH_BOUNDS_MIN({threads}, "))
}

#[test]
fn launch_geometry_matches_the_device_code() {
    let k = int_constants(header("nsa/kv/kv_cache.cuh").unwrap());
    for spec in all_specs() {
        let threads = spec.block_threads();
        assert!(threads > 0 && threads <= 1024, "{spec}");
        assert_eq!(threads % spec.target.warp_size(), 0, "{spec}: partial warp");
        // The device code maps `kBlockThreads / lanes` tokens to a block; the
        // launcher's grid divides by tokens_per_block: they must agree.
        let lanes = match spec.family {
            KernelFamily::KvStore { .. } | KernelFamily::KvDequant { .. } => k["kMlaLanes"],
            KernelFamily::IndexerKStore | KernelFamily::IndexerKGather => k["kIdxLanes"],
            // The two stores' grids end to end (latents first): the launcher counts
            // blocks, and the kernel splits them at the latent store's block count.
            KernelFamily::StepStore { .. } => {
                assert_eq!(spec.tokens_per_block(), 1, "{spec}");
                let mla = threads as i64 / k["kMlaLanes"];
                let src = render(&spec).unwrap().source;
                assert!(src.contains(&format!("+ {mla} - 1) / {mla};")), "{spec}: {mla} latents per block");
                let index = threads as i64 / k["kIdxLanes"] * 2;
                assert!(src.contains("store_indexer_k<256, 2>"), "{spec}: two indexer tokens per lane group");
                for n in [0usize, 1, 7, 64, 65, 1000] {
                    let want = n.div_ceil(mla as usize) + n.div_ceil(index as usize);
                    assert_eq!(nsa_kernels::spec::step_store_blocks(n), want, "{spec}: {n} tokens");
                }
                assert!(r_has_bounds(&spec, threads), "{spec}");
                continue;
            }
            // One row (or one chunk of a row) per block: the whole block cooperates.
            KernelFamily::TopK { .. } | KernelFamily::TopkSplit { .. } => {
                assert_eq!(spec.tokens_per_block(), 1, "{spec}");
                assert!(r_has_bounds(&spec, threads), "{spec}");
                continue;
            }
            // One CTA per (row, slice): the launcher passes rows × cluster items and the
            // cluster size as a launch attribute (no compile-time cluster shape, which
            // would refuse the other sizes); one CTA per SM (a latency-layout block).
            KernelFamily::TopkCluster { .. } => {
                assert_eq!(spec.tokens_per_block(), 1, "{spec}");
                assert!(r_has_bounds(&spec, threads), "{spec}");
                assert!(!render(&spec).unwrap().source.contains("__cluster_dims__"), "{spec}");
                assert!(spec.dynamic_smem_bytes() + 1024 <= 228 * 1024, "{spec}");
                continue;
            }
            // One page-table row per block; every block scans the whole batch.
            KernelFamily::MetadataReplay { .. } => {
                assert_eq!(spec.tokens_per_block(), 1, "{spec}");
                assert!(r_has_bounds(&spec, threads), "{spec}");
                continue;
            }
            // One (head tile, row, split) per CTA; combine: one (row, head) per block.
            // Prefill: one (head tile, query token) per CTA.
            KernelFamily::SparseDecode { heads, .. } | KernelFamily::SparsePrefill { heads, .. } => {
                let tile = spec.sparse_mla_head_tile(heads).unwrap();
                let decode = matches!(spec.family, KernelFamily::SparseDecode { .. });
                let f8 = spec.decode_f8_kernel(heads);
                let family_header = match (decode, spec.wg_kernel(heads)) {
                    (true, false) if f8 => "nsa/attention/sparse_decode_f8.cuh",
                    (true, false) => "nsa/attention/sparse_decode.cuh",
                    (true, true) => "nsa/attention/sparse_decode_wg.cuh",
                    (false, false) => "nsa/attention/sparse_prefill.cuh",
                    (false, true) => "nsa/attention/sparse_prefill_wg.cuh",
                };
                // The family header builds on the shared consumer header's constants (a
                // warp-group kernel also on its mma.sync sibling's thread split).
                let mut text = header("nsa/attention/sparse_attend.cuh").unwrap().to_string();
                if f8 {
                    text = format!("{text}\n{}", header("nsa/attention/sparse_decode.cuh").unwrap());
                }
                if spec.wg_kernel(heads) {
                    let sibling =
                        if decode { "nsa/attention/sparse_decode.cuh" } else { "nsa/attention/sparse_prefill.cuh" };
                    text = format!(
                        "{text}\n{}\n{}",
                        header("nsa/attention/sparse_attend_wg.cuh").unwrap(),
                        header(sibling).unwrap()
                    );
                }
                let d = int_constants(&format!("{text}\n{}", header(family_header).unwrap()));
                assert_eq!(spec.tokens_per_block(), 1, "{spec}");
                assert_eq!(threads as i64, d["kThreads"], "{spec}");
                assert_eq!(nsa_kernels::spec::DECODE_BLOCK_TOKENS as i64, d["kBlockTokens"], "{spec}");
                assert!(spec.dynamic_smem_bytes() <= 227 * 1024, "{spec}: {} bytes", spec.dynamic_smem_bytes());
                let args =
                    if spec.wg_kernel(heads) || f8 { format!("<{heads}, ") } else { format!("<{heads}, {tile}, ") };
                assert!(render(&spec).unwrap().source.contains(&args), "{spec}");
                assert!(r_has_bounds(&spec, threads), "{spec}");
                continue;
            }
            // One (query row, chunk of 64-key blocks) per CTA; 16 keys per warp. The
            // warp-group kernel: one (unit of rows, chunk) per CTA.
            KernelFamily::IndexerLogits { heads, .. } => {
                let d = int_constants(header("nsa/indexer/indexer_logits.cuh").unwrap());
                assert_eq!(spec.tokens_per_block(), 1, "{spec}");
                assert_eq!(threads as i64, d["kThreads"], "{spec}");
                assert_eq!(d["kBlockTokens"], d["kPageTokens"], "{spec}: one indexer page per step");
                assert_eq!(d["kPageBytes"], layout::INDEXER_PAGE_BYTES as i64, "{spec}");
                if nsa_kernels::spec::indexer_wg_kernel(heads, spec.target) {
                    let wg = int_constants(header("nsa/indexer/indexer_logits_wg.cuh").unwrap());
                    assert_eq!(wg["kHeads"], heads as i64, "{spec}");
                    // The runtime accepts next_n 1..=4 (ops/indexer.rs) and groups RAGGED
                    // rows by this count when it sizes the grid.
                    assert_eq!(wg["kMaxNextN"], 4, "{spec}");
                    assert_eq!(wg["kMaxNextN"], nsa_kernels::spec::INDEXER_WG_RAGGED_ROWS as i64, "{spec}");
                    assert!(spec.dynamic_smem_bytes() <= 227 * 1024 / 3, "{spec}: three CTAs per SM");
                } else {
                    assert_eq!(spec.dynamic_smem_bytes(), 0, "{spec}");
                }
                assert!(r_has_bounds(&spec, threads), "{spec}");
                continue;
            }
            // One CTA per (query rows, head, sequence): warp-group, 128 rows over two
            // consumer groups and a producer; mma.sync, 64 rows over 4 warps.
            KernelFamily::DensePrefill { kernel: DenseKernel::WarpGroup, .. } => {
                let d = int_constants(header("nsa/attention/dense_prefill_wg.cuh").unwrap());
                assert_eq!(spec.tokens_per_block(), 1, "{spec}");
                assert_eq!(threads as i64, d["kThreads"], "{spec}");
                assert_eq!(d["kRowsWg"] * 2, nsa_kernels::spec::DENSE_WG_ROWS as i64, "{spec}");
                assert_eq!(DenseKernel::WarpGroup.rows(), nsa_kernels::spec::DENSE_WG_ROWS, "{spec}");
                assert_eq!(spec.target, Target::Sm90a, "{spec}: wgmma");
                assert!(spec.dynamic_smem_bytes() <= 227 * 1024, "{spec}: {} bytes", spec.dynamic_smem_bytes());
                assert!(r_has_bounds(&spec, threads), "{spec}");
                continue;
            }
            // Scalar: one thread per query row.
            KernelFamily::DensePrefill { kernel: DenseKernel::Scalar, .. } => {
                let d = int_constants(header("nsa/attention/dense_prefill_scalar.cuh").unwrap());
                assert_eq!(spec.tokens_per_block(), 1, "{spec}");
                assert_eq!(threads as i64, d["kThreads"], "{spec}");
                assert_eq!(d["kRows"], d["kThreads"], "{spec}: one row per thread");
                assert_eq!(d["kRows"], nsa_kernels::spec::DENSE_SCALAR_ROWS as i64, "{spec}");
                assert_eq!(DenseKernel::Scalar.rows(), nsa_kernels::spec::DENSE_SCALAR_ROWS, "{spec}");
                assert!(spec.dynamic_smem_bytes() <= spec.target.max_smem_per_block(), "{spec}");
                assert!(r_has_bounds(&spec, threads), "{spec}");
                continue;
            }
            KernelFamily::DensePrefill { .. } => {
                let d = int_constants(header("nsa/attention/dense_prefill.cuh").unwrap());
                assert_eq!(spec.tokens_per_block(), 1, "{spec}");
                assert_eq!(threads as i64, d["kThreads"], "{spec}");
                assert_eq!(d["kRows"], nsa_kernels::spec::DENSE_ROWS as i64, "{spec}");
                assert_eq!(DenseKernel::MmaSync.rows(), nsa_kernels::spec::DENSE_ROWS, "{spec}");
                assert_eq!(d["kRows"], 16 * d["kWarps"], "{spec}: 16 rows per warp");
                assert!(spec.dynamic_smem_bytes() <= 227 * 1024, "{spec}: {} bytes", spec.dynamic_smem_bytes());
                assert!(r_has_bounds(&spec, threads), "{spec}");
                continue;
            }
            KernelFamily::SparseDecodeCombine { .. } => {
                // 4 output dims per thread cover the 512-wide latent.
                assert_eq!(threads * 4, 512, "{spec}");
                assert_eq!(spec.tokens_per_block(), 1, "{spec}");
                assert!(r_has_bounds(&spec, threads), "{spec}");
                continue;
            }
            // One output element per thread.
            KernelFamily::IndexTransform { .. } => {
                assert_eq!(spec.tokens_per_block(), threads, "{spec}");
                assert!(r_has_bounds(&spec, threads), "{spec}");
                continue;
            }
        };
        assert_eq!(threads as i64 % lanes, 0, "{spec}");
        // Indexer lane groups store or gather several tokens each; the template passes the count.
        let rounds = spec.context()["tokens_per_lane_group"].as_i64().unwrap_or(1);
        assert_eq!(spec.tokens_per_block() as i64, threads as i64 / lanes * rounds, "{spec}");
        // A token's lane group never straddles a warp (its shuffles stay inside one).
        assert_eq!(32 % lanes, 0, "{spec}");

        let r = render(&spec).unwrap();
        assert!(r.source.contains(&format!("NSA_LAUNCH_BOUNDS({threads})")), "{spec}");
        let instantiation = match rounds {
            1 => format!("<{threads}>("),
            n => format!("<{threads}, {n}>("),
        };
        assert!(r.source.contains(&instantiation), "{spec}");
    }
}

#[test]
fn store_context_matches_the_format() {
    for spec in all_specs() {
        let ctx = spec.context();
        let obj = ctx.as_object().unwrap();
        match spec.family {
            KernelFamily::KvStore { format } | KernelFamily::StepStore { format } => {
                assert_eq!(obj["format"], Value::from(format.tag()));
                let (f, e) = match format {
                    KvCacheFormat::Bf16 => ("store_bf16", "nsa::u16"),
                    KvCacheFormat::Fp8 => ("store_fp8", "nsa::u8"),
                };
                assert_eq!(obj["store_fn"], Value::from(f), "{spec}");
                assert_eq!(obj["cache_elem"], Value::from(e), "{spec}");
            }
            KernelFamily::KvDequant { format } => {
                assert_eq!(obj["format"], Value::from(format.tag()));
                let (f, e) = match format {
                    KvCacheFormat::Bf16 => ("gather_bf16", "nsa::u16"),
                    KvCacheFormat::Fp8 => ("dequant_fp8", "nsa::u8"),
                };
                assert_eq!(obj["read_fn"], Value::from(f), "{spec}");
                assert_eq!(obj["cache_elem"], Value::from(e), "{spec}");
            }
            _ => {
                for key in ["format", "store_fn", "read_fn", "cache_elem"] {
                    assert!(!obj.contains_key(key), "{spec} has `{key}`");
                }
            }
        }
    }
}
