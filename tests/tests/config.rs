//! Table tests of `NsaConfig` validation, presets, parsing (JSON / TOML) and the
//! `FromStr` impls of `Target` and `KvCacheFormat`.

use nsa_kernels::config::{ALLOWED_HEADS, ALLOWED_INDEX_HEADS, PAGE_SIZE_RANGE, TOPK_MULTIPLE, TOPK_RANGE};
use nsa_kernels::{ConfigError, ConfigIssue, KvCacheFormat, NsaConfig, Target, PRESETS};

/// The validated fields of `NsaConfig` in declaration order (all but the last,
/// `topk_bf16_scores`); validation reports in this order.
const FIELD_ORDER: &[&str] = nsa_kernels::config::FIELDS.split_at(9).0;

fn base() -> NsaConfig {
    NsaConfig::preset("deepseek-v3.2").unwrap()
}

fn with(mutate: Mutation) -> NsaConfig {
    let mut cfg = base();
    mutate(&mut cfg);
    cfg
}

fn issues_of(cfg: &NsaConfig) -> Vec<ConfigIssue> {
    match cfg.validate() {
        Ok(()) => panic!("expected {} to be rejected", cfg.summary()),
        Err(e) => e.issues,
    }
}

fn field_rank(field: &str) -> usize {
    FIELD_ORDER.iter().position(|f| *f == field).unwrap_or_else(|| panic!("`{field}` is not a field of NsaConfig"))
}

// ---------------------------------------------------------------- validate: one error

/// Edits one field (or several) of a valid config.
type Mutation = fn(&mut NsaConfig);

struct Case {
    what: &'static str,
    mutate: Mutation,
    field: &'static str,
    value: &'static str,
    allowed: &'static str,
    nearest: &'static str,
}

/// One row per error class. `nearest` rules: ranges round to the nearest multiple
/// (an exact half rounds UP) and then clamp into the range; sets pick the closest
/// member (an exact tie picks the SMALLER one).
const CASES: &[Case] = &[
    Case {
        what: "page_size 0",
        mutate: |c| c.page_size = 0,
        field: "page_size",
        value: "0",
        allowed: "1..=1024",
        nearest: "1",
    },
    Case {
        what: "page_size 5000",
        mutate: |c| c.page_size = 5000,
        field: "page_size",
        value: "5000",
        allowed: "1..=1024",
        nearest: "1024",
    },
    Case {
        what: "page_size one past the end",
        mutate: |c| c.page_size = 1025,
        field: "page_size",
        value: "1025",
        allowed: "1..=1024",
        nearest: "1024",
    },
    Case {
        what: "page_size u32::MAX",
        mutate: |c| c.page_size = u32::MAX,
        field: "page_size",
        value: "4294967295",
        allowed: "1..=1024",
        nearest: "1024",
    },
    Case {
        what: "topk 0",
        mutate: |c| c.topk = 0,
        field: "topk",
        value: "0",
        allowed: "multiples of 64 in 64..=4096",
        nearest: "64",
    },
    Case {
        what: "topk 2000 (31.25 x 64: rounds down)",
        mutate: |c| c.topk = 2000,
        field: "topk",
        value: "2000",
        allowed: "multiples of 64 in 64..=4096",
        nearest: "1984",
    },
    Case {
        what: "topk 2040 (31.875 x 64: rounds up)",
        mutate: |c| c.topk = 2040,
        field: "topk",
        value: "2040",
        allowed: "multiples of 64 in 64..=4096",
        nearest: "2048",
    },
    Case {
        what: "topk 2016 (exact half: rounds up)",
        mutate: |c| c.topk = 2016,
        field: "topk",
        value: "2016",
        allowed: "multiples of 64 in 64..=4096",
        nearest: "2048",
    },
    Case {
        what: "topk 31 (rounds to 0, clamped up)",
        mutate: |c| c.topk = 31,
        field: "topk",
        value: "31",
        allowed: "multiples of 64 in 64..=4096",
        nearest: "64",
    },
    Case {
        what: "topk 4097 (just past the range)",
        mutate: |c| c.topk = 4097,
        field: "topk",
        value: "4097",
        allowed: "multiples of 64 in 64..=4096",
        nearest: "4096",
    },
    Case {
        what: "topk 8192 (a multiple, out of range: clamped)",
        mutate: |c| c.topk = 8192,
        field: "topk",
        value: "8192",
        allowed: "multiples of 64 in 64..=4096",
        nearest: "4096",
    },
    Case {
        what: "topk u32::MAX (no overflow while rounding)",
        mutate: |c| c.topk = u32::MAX,
        field: "topk",
        value: "4294967295",
        allowed: "multiples of 64 in 64..=4096",
        nearest: "4096",
    },
    Case {
        what: "num_q_heads 12 (tie 8/16: smaller)",
        mutate: |c| c.num_q_heads = 12,
        field: "num_q_heads",
        value: "12",
        allowed: "8, 16, 32, 64, 128",
        nearest: "8",
    },
    Case {
        what: "num_q_heads 24 (tie 16/32: smaller)",
        mutate: |c| c.num_q_heads = 24,
        field: "num_q_heads",
        value: "24",
        allowed: "8, 16, 32, 64, 128",
        nearest: "16",
    },
    Case {
        what: "num_q_heads 96 (tie 64/128: smaller)",
        mutate: |c| c.num_q_heads = 96,
        field: "num_q_heads",
        value: "96",
        allowed: "8, 16, 32, 64, 128",
        nearest: "64",
    },
    Case {
        what: "num_q_heads 100 (closer to 128)",
        mutate: |c| c.num_q_heads = 100,
        field: "num_q_heads",
        value: "100",
        allowed: "8, 16, 32, 64, 128",
        nearest: "128",
    },
    Case {
        what: "num_q_heads 0",
        mutate: |c| c.num_q_heads = 0,
        field: "num_q_heads",
        value: "0",
        allowed: "8, 16, 32, 64, 128",
        nearest: "8",
    },
    Case {
        what: "num_q_heads 256",
        mutate: |c| c.num_q_heads = 256,
        field: "num_q_heads",
        value: "256",
        allowed: "8, 16, 32, 64, 128",
        nearest: "128",
    },
    Case {
        what: "kv_lora_rank 256",
        mutate: |c| c.kv_lora_rank = 256,
        field: "kv_lora_rank",
        value: "256",
        allowed: "512",
        nearest: "512",
    },
    Case {
        what: "qk_rope_head_dim 32",
        mutate: |c| c.qk_rope_head_dim = 32,
        field: "qk_rope_head_dim",
        value: "32",
        allowed: "64",
        nearest: "64",
    },
    Case {
        what: "index_n_heads 32",
        mutate: |c| c.index_n_heads = 32,
        field: "index_n_heads",
        value: "32",
        allowed: "64",
        nearest: "64",
    },
    Case {
        what: "index_head_dim 64",
        mutate: |c| c.index_head_dim = 64,
        field: "index_head_dim",
        value: "64",
        allowed: "128",
        nearest: "128",
    },
    Case {
        what: "empty targets",
        mutate: |c| c.targets.clear(),
        field: "targets",
        value: "[] (empty)",
        allowed: "a non-empty list of sm_90a, sm_100a, gfx942",
        nearest: "[\"sm_90a\"]",
    },
    Case {
        what: "duplicate target",
        mutate: |c| c.targets = vec![Target::Sm90a, Target::Gfx942, Target::Sm90a],
        field: "targets",
        value: "sm_90a listed 2 times",
        allowed: "each of sm_90a, sm_100a, gfx942 at most once",
        nearest: "list sm_90a once",
    },
];

#[test]
fn each_error_class_is_one_issue_with_field_value_allowed_and_nearest() {
    for case in CASES {
        let cfg = with(case.mutate);
        let issues = issues_of(&cfg);
        assert_eq!(
            issues,
            vec![ConfigIssue {
                field: case.field,
                value: case.value.to_string(),
                allowed: case.allowed.to_string(),
                nearest: Some(case.nearest.to_string()),
            }],
            "case `{}`",
            case.what
        );
    }
}

#[test]
fn display_names_field_value_allowed_set_and_nearest() {
    for case in CASES {
        let err = with(case.mutate).validate().unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("invalid NSA config (1 problem):"), "case `{}`: {text}", case.what);
        for part in [
            format!("`{}`", case.field),
            format!("= {} is not allowed", case.value),
            format!("(allowed: {})", case.allowed),
            format!("nearest valid: {}", case.nearest),
        ] {
            assert!(text.contains(&part), "case `{}`: {text:?} lacks {part:?}", case.what);
        }
    }
}

#[test]
fn display_of_one_issue_is_exact() {
    let err = with(|c| c.topk = 2000).validate().unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid NSA config (1 problem):\n  - `topk` = 2000 is not allowed \
         (allowed: multiples of 64 in 64..=4096); nearest valid: 1984"
    );
}

#[test]
fn nearest_of_every_reported_value_is_itself_valid() {
    // The suggestion must be accepted when applied (closes the loop on rounding + clamping).
    for case in CASES {
        let mut cfg = with(case.mutate);
        let issue = &issues_of(&cfg)[0];
        let Ok(n) = issue.nearest.as_deref().unwrap().parse::<u32>() else {
            continue; // targets: the suggestion is prose
        };
        match issue.field {
            "page_size" => cfg.page_size = n,
            "topk" => cfg.topk = n,
            "num_q_heads" => cfg.num_q_heads = n,
            "kv_lora_rank" => cfg.kv_lora_rank = n,
            "qk_rope_head_dim" => cfg.qk_rope_head_dim = n,
            "index_n_heads" => cfg.index_n_heads = n,
            "index_head_dim" => cfg.index_head_dim = n,
            other => panic!("unexpected field {other}"),
        }
        assert_eq!(cfg.validate(), Ok(()), "case `{}`", case.what);
    }
}

#[test]
fn topk_nearest_is_the_closest_multiple_for_every_value() {
    // Brute force against the definition: the closest valid value, exact halves up.
    let valid: Vec<u32> = (TOPK_RANGE.0..=TOPK_RANGE.1).filter(|v| v % TOPK_MULTIPLE == 0).collect();
    for topk in 0..=TOPK_RANGE.1 + 200 {
        let cfg = NsaConfig { topk, ..base() };
        let expected_ok = valid.contains(&topk);
        match cfg.validate() {
            Ok(()) => assert!(expected_ok, "topk {topk} accepted"),
            Err(e) => {
                assert!(!expected_ok, "topk {topk} rejected: {e}");
                let best = valid.iter().copied().min_by_key(|v| (v.abs_diff(topk), std::cmp::Reverse(*v))).unwrap();
                assert_eq!(e.issues[0].nearest.as_deref(), Some(best.to_string().as_str()), "topk {topk}");
            }
        }
    }
}

#[test]
fn heads_nearest_is_the_closest_allowed_with_ties_to_the_smaller() {
    for heads in 0..=300u32 {
        let cfg = NsaConfig { num_q_heads: heads, ..base() };
        if ALLOWED_HEADS.contains(&heads) {
            assert_eq!(cfg.validate(), Ok(()), "heads {heads}");
            continue;
        }
        let best = ALLOWED_HEADS.iter().copied().min_by_key(|a| (a.abs_diff(heads), *a)).unwrap();
        let issues = issues_of(&cfg);
        assert_eq!(issues[0].nearest.as_deref(), Some(best.to_string().as_str()), "heads {heads}");
    }
}

#[test]
fn boundary_values_are_accepted() {
    let ok: &[(&str, Mutation)] = &[
        ("page_size 1", |c| c.page_size = PAGE_SIZE_RANGE.0),
        ("page_size 1024", |c| c.page_size = PAGE_SIZE_RANGE.1),
        ("page_size 63", |c| c.page_size = 63),
        ("topk 64", |c| c.topk = TOPK_RANGE.0),
        ("topk 4096", |c| c.topk = TOPK_RANGE.1),
        ("topk 1024", |c| c.topk = 1024),
        ("heads 8", |c| c.num_q_heads = 8),
        ("heads 16", |c| c.num_q_heads = 16),
        ("heads 32", |c| c.num_q_heads = 32),
        ("heads 64", |c| c.num_q_heads = 64),
        ("heads 128", |c| c.num_q_heads = 128),
        ("index heads 64", |c| c.index_n_heads = ALLOWED_INDEX_HEADS[0]),
        ("bf16 cache", |c| c.kv_cache = KvCacheFormat::Bf16),
        ("one target", |c| c.targets = vec![Target::Gfx942]),
        ("all targets", |c| c.targets = Target::ALL.to_vec()),
        ("targets in any order", |c| c.targets = vec![Target::Gfx942, Target::Sm100a, Target::Sm90a]),
    ];
    for (what, mutate) in ok {
        assert_eq!(with(*mutate).validate(), Ok(()), "{what}");
    }
}

// ---------------------------------------------------------------- validate: many errors

#[test]
fn several_errors_are_all_reported_in_field_order() {
    let cfg = NsaConfig {
        page_size: 0,
        topk: 2000,
        num_q_heads: 12,
        kv_lora_rank: 256,
        qk_rope_head_dim: 32,
        index_n_heads: 32,
        index_head_dim: 64,
        kv_cache: KvCacheFormat::Fp8,
        targets: vec![],
        topk_bf16_scores: true,
    };
    let err = cfg.validate().unwrap_err();
    let fields: Vec<&str> = err.issues.iter().map(|i| i.field).collect();
    assert_eq!(
        fields,
        [
            "page_size",
            "topk",
            "num_q_heads",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "index_n_heads",
            "index_head_dim",
            "targets"
        ]
    );
    let nearest: Vec<&str> = err.issues.iter().map(|i| i.nearest.as_deref().unwrap()).collect();
    assert_eq!(nearest, ["1", "1984", "8", "512", "64", "64", "128", "[\"sm_90a\"]"]);

    let text = err.to_string();
    assert!(text.starts_with("invalid NSA config (8 problems):"), "{text}");
    assert_eq!(text.lines().count(), 9, "{text}");
    // One line per issue, in the same order.
    for (line, issue) in text.lines().skip(1).zip(&err.issues) {
        assert_eq!(line, format!("  - {issue}"));
    }
}

#[test]
fn any_subset_of_errors_keeps_field_order() {
    // Every combination of the single-error mutations (one per field) reports
    // exactly those fields, sorted by declaration order.
    let per_field: [Mutation; 8] = [
        |c| c.page_size = 0,
        |c| c.topk = 1,
        |c| c.num_q_heads = 3,
        |c| c.kv_lora_rank = 1,
        |c| c.qk_rope_head_dim = 1,
        |c| c.index_n_heads = 1,
        |c| c.index_head_dim = 1,
        |c| c.targets.clear(),
    ];
    for mask in 1u32..(1 << per_field.len()) {
        let mut cfg = base();
        for (bit, mutate) in per_field.iter().enumerate() {
            if mask & (1 << bit) != 0 {
                mutate(&mut cfg);
            }
        }
        let issues = issues_of(&cfg);
        assert_eq!(issues.len(), mask.count_ones() as usize, "mask {mask:#b}");
        let ranks: Vec<usize> = issues.iter().map(|i| field_rank(i.field)).collect();
        assert!(ranks.windows(2).all(|w| w[0] < w[1]), "mask {mask:#b}: {ranks:?}");
    }
}

#[test]
fn each_repeated_target_is_one_issue_with_its_count() {
    let cfg = NsaConfig {
        targets: vec![Target::Sm90a, Target::Gfx942, Target::Sm90a, Target::Gfx942, Target::Sm90a],
        ..base()
    };
    let values: Vec<String> = issues_of(&cfg).into_iter().map(|i| i.value).collect();
    assert_eq!(values, ["sm_90a listed 3 times", "gfx942 listed 2 times"]);

    // Half a million repeats are one line, not half a million.
    let cfg = NsaConfig { targets: vec![Target::Sm90a; 500_000], ..base() };
    let msg = cfg.validate().unwrap_err().to_string();
    assert_eq!(msg.lines().count(), 2, "{msg}");
    assert!(msg.contains("sm_90a listed 500000 times"), "{msg}");
}

#[test]
fn parse_errors_quote_a_bounded_excerpt_of_the_input() {
    let huge = "x".repeat(10 << 20);
    let text = format!("page_size = 64\ntopk = \"{huge}\"\n");
    let msg = NsaConfig::from_text(&text).unwrap_err().to_string();
    assert!(msg.len() < 2000, "{} bytes of message", msg.len());
    assert!(msg.contains("more bytes)"), "{msg}");
    let json = format!("{{\"kv_cache\": \"{huge}\"}}");
    let msg = NsaConfig::from_text(&json).unwrap_err().to_string();
    assert!(msg.len() < 2000, "{} bytes of message", msg.len());
    // Control characters are escaped, not printed.
    let issue = nsa_kernels::excerpt("a\u{1b}[31mb", 100);
    assert_eq!(issue, "a\\u{1b}[31mb");
}

#[test]
fn a_byte_order_mark_is_skipped_before_json_and_toml() {
    let cfg = base();
    let json = format!("\u{feff}{}", serde_json::to_string(&cfg).unwrap());
    assert_eq!(NsaConfig::from_text(&json).unwrap(), cfg);
    let toml = format!("\u{feff}{}", toml::to_string(&cfg).unwrap());
    assert_eq!(NsaConfig::from_text(&toml).unwrap(), cfg);
}

#[test]
fn config_error_is_a_std_error() {
    let err: Box<dyn std::error::Error> = Box::new(with(|c| c.topk = 0).validate().unwrap_err());
    assert!(err.to_string().contains("`topk` = 0"));
}

// ---------------------------------------------------------------- presets

#[test]
fn every_preset_validates_with_its_head_count() {
    let expected: &[(&str, u32)] = &[
        ("deepseek-v3.2", 128),
        ("deepseek-v3.2-tp2", 64),
        ("deepseek-v3.2-tp4", 32),
        ("deepseek-v3.2-tp8", 16),
        ("deepseek-v3.2-tp16", 8),
    ];
    let listed: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
    let names: Vec<&str> = expected.iter().map(|e| e.0).collect();
    assert_eq!(listed, names, "PRESETS lists exactly the expected presets");

    for ((name, description), (_, heads)) in PRESETS.iter().zip(expected) {
        let cfg = NsaConfig::preset(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(cfg.validate(), Ok(()), "{name}");
        assert_eq!(cfg.num_q_heads, *heads, "{name}");
        assert_eq!(cfg.topk, 2048, "{name}");
        assert_eq!(cfg.page_size, 64, "{name}");
        assert_eq!(cfg.kv_cache, KvCacheFormat::Fp8, "{name}");
        assert_eq!(cfg.kv_lora_rank, 512, "{name}");
        assert_eq!(cfg.qk_rope_head_dim, 64, "{name}");
        assert_eq!(cfg.index_n_heads, 64, "{name}");
        assert_eq!(cfg.index_head_dim, 128, "{name}");
        assert_eq!(cfg.targets, Target::NVIDIA.to_vec(), "{name}");
        assert!(
            description.starts_with(&format!("{heads} query heads per GPU")),
            "{name}: description {description:?} disagrees with {heads} heads"
        );
        // Head count = 128 / TP.
        let tp = name.strip_prefix("deepseek-v3.2-tp").map_or(1, |t| t.parse::<u32>().unwrap());
        assert_eq!(128 / tp, *heads, "{name}");
    }
}

#[test]
fn tp1_alias_equals_the_base_preset() {
    assert_eq!(NsaConfig::preset("deepseek-v3.2-tp1").unwrap(), NsaConfig::preset("deepseek-v3.2").unwrap());
}

#[test]
fn preset_summary_is_stable() {
    assert_eq!(
        NsaConfig::preset("deepseek-v3.2-tp8").unwrap().summary(),
        "h=16 topk=2048 page=64 cache=fp8_656 targets=[sm_90a,sm_100a]"
    );
}

#[test]
fn unknown_preset_suggests_the_nearest_name() {
    let all = PRESETS.iter().map(|p| p.0).collect::<Vec<_>>().join(", ");
    let cases: &[(&str, Option<&str>)] = &[
        ("deepseek-v3.3", Some("deepseek-v3.2")),
        ("deepsek-v3.2", Some("deepseek-v3.2")),
        ("deepseek-v32", Some("deepseek-v3.2")),
        ("DeepSeek-V3.2", Some("deepseek-v3.2")),
        ("deepseek-v3.2-tp61", Some("deepseek-v3.2-tp16")),
        // Equally close to tp2/tp4/tp8: the smallest name wins, deterministically.
        ("deepseek-v3.2-tp3", Some("deepseek-v3.2-tp2")),
        ("deepseek-v3.2-tp32", Some("deepseek-v3.2-tp2")),
        ("llama-3-70b", None),
        ("", None),
    ];
    for (name, nearest) in cases {
        let err = NsaConfig::preset(name).unwrap_err();
        assert_eq!(err.issues.len(), 1, "{name}");
        let issue = &err.issues[0];
        assert_eq!(issue.field, "preset");
        assert_eq!(issue.value, format!("{name:?}"));
        assert_eq!(issue.allowed, all);
        assert_eq!(issue.nearest.as_deref(), *nearest, "{name:?}");
        let text = err.to_string();
        assert!(text.contains("`preset`"), "{text}");
        assert!(text.contains(&format!("{name:?}")), "{text}");
        assert!(text.contains(&all), "{text}");
        match nearest {
            Some(n) => assert!(text.contains(&format!("nearest valid: {n}")), "{text}"),
            None => assert!(!text.contains("nearest"), "{text}"),
        }
    }
}

// ---------------------------------------------------------------- serde / from_text

fn custom() -> NsaConfig {
    NsaConfig {
        page_size: 1,
        topk: 512,
        num_q_heads: 32,
        kv_cache: KvCacheFormat::Bf16,
        targets: vec![Target::Gfx942, Target::Sm100a],
        topk_bf16_scores: true,
        ..base()
    }
}

#[test]
fn json_shape_is_stable() {
    let v = serde_json::to_value(NsaConfig::preset("deepseek-v3.2-tp8").unwrap()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "page_size": 64,
            "topk": 2048,
            "num_q_heads": 16,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "index_n_heads": 64,
            "index_head_dim": 128,
            "kv_cache": "fp8",
            "targets": ["sm_90a", "sm_100a"],
            "topk_bf16_scores": false,
        })
    );
}

#[test]
fn json_round_trip() {
    let mut all = vec![custom()];
    all.extend(PRESETS.iter().map(|p| NsaConfig::preset(p.0).unwrap()));
    for cfg in all {
        for text in [serde_json::to_string(&cfg).unwrap(), serde_json::to_string_pretty(&cfg).unwrap()] {
            assert_eq!(NsaConfig::from_text(&text), Ok(cfg.clone()), "{text}");
            assert_eq!(serde_json::from_str::<NsaConfig>(&text).unwrap(), cfg);
        }
        // Leading whitespace still selects JSON.
        let text = format!("\n   {}", serde_json::to_string(&cfg).unwrap());
        assert_eq!(NsaConfig::from_text(&text), Ok(cfg));
    }
}

#[test]
fn toml_round_trip() {
    let mut all = vec![custom()];
    all.extend(PRESETS.iter().map(|p| NsaConfig::preset(p.0).unwrap()));
    for cfg in all {
        let text = toml::to_string(&cfg).unwrap();
        assert!(!text.trim_start().starts_with('{'), "{text}");
        assert_eq!(NsaConfig::from_text(&text), Ok(cfg.clone()), "{text}");
        assert_eq!(toml::from_str::<NsaConfig>(&text).unwrap(), cfg);
    }
}

#[test]
fn defaults_fill_the_model_constants() {
    let json = r#"{"page_size": 64, "topk": 2048, "num_q_heads": 128,
                  "kv_cache": "fp8", "targets": ["sm_90a", "sm_100a"]}"#;
    let toml = "# DeepSeek V3.2, TP1\npage_size = 64\ntopk = 2048\nnum_q_heads = 128\n\
                kv_cache = \"fp8\"\ntargets = [\"sm_90a\", \"sm_100a\"]\n";
    for text in [json, toml] {
        assert_eq!(NsaConfig::from_text(text), Ok(base()), "{text}");
    }
    // Explicit values win over the defaults (and are then validated).
    let err = NsaConfig::from_text(
        "page_size = 64\ntopk = 2048\nnum_q_heads = 128\nkv_lora_rank = 256\n\
         kv_cache = \"bf16\"\ntargets = [\"gfx942\"]\n",
    )
    .unwrap_err();
    assert_eq!(err.issues.len(), 1);
    assert_eq!(err.issues[0].field, "kv_lora_rank");
}

#[test]
fn from_text_validates_after_parsing() {
    let text = r#"{"page_size": 0, "topk": 2000, "num_q_heads": 12,
                   "kv_cache": "bf16", "targets": []}"#;
    let err = NsaConfig::from_text(text).unwrap_err();
    let fields: Vec<&str> = err.issues.iter().map(|i| i.field).collect();
    assert_eq!(fields, ["page_size", "topk", "num_q_heads", "targets"]);
}

/// A parse failure is one `config file` issue whose text carries serde's message.
fn parse_error(text: &str) -> String {
    let err: ConfigError = NsaConfig::from_text(text).unwrap_err();
    assert_eq!(err.issues.len(), 1, "{err}");
    assert_eq!(err.issues[0].field, "config file", "{err}");
    assert!(err.issues[0].nearest.is_none(), "{err}");
    let shown = err.to_string();
    assert!(shown.contains("(a config file is JSON or TOML"), "{shown}");
    assert!(shown.contains(&err.issues[0].value), "{shown}");
    err.issues[0].value.clone()
}

#[test]
fn unknown_fields_are_rejected_by_name() {
    let json = r#"{"page_size": 64, "topk": 2048, "num_q_heads": 128, "kv_cache": "fp8",
                   "targets": ["sm_90a"], "index_topk": 2048}"#;
    let msg = parse_error(json);
    assert!(msg.contains("unknown field `index_topk`"), "{msg}");
    // serde lists the real fields, so the typo is easy to fix.
    assert!(msg.contains("topk"), "{msg}");

    let toml = "page_size = 64\ntopk = 2048\nnum_q_heads = 128\nkv_cache = \"fp8\"\n\
                targets = [\"sm_90a\"]\nnum_heads = 128\n";
    let msg = parse_error(toml);
    assert!(msg.contains("unknown field `num_heads`"), "{msg}");
}

#[test]
fn malformed_files_name_the_problem() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "missing required field (JSON)",
            r#"{"page_size": 64, "num_q_heads": 128, "kv_cache": "fp8", "targets": ["sm_90a"]}"#,
            "missing field `topk`",
        ),
        (
            "missing required field (TOML)",
            "page_size = 64\ntopk = 2048\nnum_q_heads = 128\ntargets = [\"sm_90a\"]\n",
            "missing field `kv_cache`",
        ),
        (
            "unknown target",
            r#"{"page_size": 64, "topk": 2048, "num_q_heads": 128, "kv_cache": "fp8", "targets": ["sm_80"]}"#,
            "unknown variant `sm_80`",
        ),
        (
            "unknown cache format",
            "page_size = 64\ntopk = 2048\nnum_q_heads = 128\nkv_cache = \"fp16\"\ntargets = [\"sm_90a\"]\n",
            "unknown variant `fp16`",
        ),
        (
            "negative number",
            r#"{"page_size": -1, "topk": 2048, "num_q_heads": 128, "kv_cache": "fp8", "targets": ["sm_90a"]}"#,
            "-1",
        ),
        ("truncated JSON", r#"{"page_size": 64, "#, "EOF"),
        ("not a config at all", "hello", "hello"),
    ];
    for (what, text, needle) in cases {
        let msg = parse_error(text);
        assert!(msg.contains(needle), "{what}: {msg:?} lacks {needle:?}");
    }
}

// ---------------------------------------------------------------- FromStr

#[test]
fn target_from_str() {
    let ok: &[(&str, Target)] = &[
        ("sm_90a", Target::Sm90a),
        ("sm_100a", Target::Sm100a),
        ("gfx942", Target::Gfx942),
        ("SM_90A", Target::Sm90a),
        ("  sm_100a\n", Target::Sm100a),
        ("sm90a", Target::Sm90a),
        ("sm100a", Target::Sm100a),
        ("sm-90a", Target::Sm90a),
        ("GFX942", Target::Gfx942),
    ];
    for (text, t) in ok {
        assert_eq!(text.parse::<Target>(), Ok(*t), "{text:?}");
    }
    let bad = ["", "sm_90", "sm_100", "sm_80", "sm_89", "sm_120a", "gfx90a", "gfx950", "h100", "cuda"];
    for text in bad {
        let err = text.parse::<Target>().unwrap_err();
        assert_eq!(err.0, text);
        let msg = err.to_string();
        assert!(msg.contains(&format!("`{text}`")), "{msg}");
        assert!(msg.contains("allowed sm_90a, sm_100a, gfx942"), "{msg}");
    }
}

#[test]
fn target_names_round_trip() {
    for t in Target::ALL {
        assert_eq!(t.arch().parse::<Target>(), Ok(t));
        assert_eq!(t.to_string(), t.arch());
        assert_eq!(serde_json::to_value(t).unwrap(), t.arch());
        assert_eq!(serde_json::from_value::<Target>(serde_json::json!(t.arch())).unwrap(), t);
    }
}

#[test]
fn kv_cache_format_from_str() {
    let ok: &[(&str, KvCacheFormat)] = &[
        ("bf16", KvCacheFormat::Bf16),
        ("BF16", KvCacheFormat::Bf16),
        ("bf16_576", KvCacheFormat::Bf16),
        (" bf16 ", KvCacheFormat::Bf16),
        ("fp8", KvCacheFormat::Fp8),
        ("FP8", KvCacheFormat::Fp8),
        ("fp8_656", KvCacheFormat::Fp8),
        ("fp8_e4m3", KvCacheFormat::Fp8),
    ];
    for (text, f) in ok {
        assert_eq!(text.parse::<KvCacheFormat>(), Ok(*f), "{text:?}");
    }
    for text in ["", "fp16", "FP16", "e4m3", "fp8_e5m2", "int8", "bf16_512"] {
        let msg = text.parse::<KvCacheFormat>().unwrap_err();
        assert!(msg.contains(&format!("`{text}`")), "{msg}");
        assert!(msg.contains("bf16") && msg.contains("fp8"), "{msg}");
    }
}

#[test]
fn kv_cache_format_names_and_sizes() {
    for (f, serde_name, tag, bytes) in
        [(KvCacheFormat::Bf16, "bf16", "bf16_576", 1152), (KvCacheFormat::Fp8, "fp8", "fp8_656", 656)]
    {
        assert_eq!(serde_json::to_value(f).unwrap(), serde_name);
        assert_eq!(tag.parse::<KvCacheFormat>(), Ok(f));
        assert_eq!(serde_name.parse::<KvCacheFormat>(), Ok(f));
        assert_eq!(f.tag(), tag);
        assert_eq!(f.token_bytes(), bytes);
    }
}

#[test]
fn the_field_list_matches_the_config_struct() {
    let v = serde_json::to_value(base()).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    let mut fields = nsa_kernels::config::FIELDS.to_vec();
    keys.sort_unstable();
    fields.sort_unstable();
    assert_eq!(keys, fields);
}
