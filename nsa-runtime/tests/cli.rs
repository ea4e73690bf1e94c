//! What a new user of the `nsa` binary meets: config files with mistakes,
//! overrides that fix them, misspelt environment variables, unknown kernel ids,
//! an unwritable cache, and output that stays readable in logs. CPU only; the
//! compile cases need NVRTC (`bash .ci/env.sh` provides it).

use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const NSA: &str = env!("CARGO_BIN_EXE_nsa");

fn nsa(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(NSA);
    cmd.args(args).stdin(Stdio::null());
    for key in ["NSA_JIT", "NSA_PDL", "NSA_LOG", "NSA_CHECK_DEVICE_INPUTS"] {
        cmd.env_remove(key);
    }
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails_with(out: &Output, needles: &[&str]) {
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(out), stderr(out));
    for n in needles {
        assert!(stderr(out).contains(n), "missing {n:?} in:\n{}", stderr(out));
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    path.display().to_string()
}

const VALID_BUT_TOPK: &str =
    "page_size = 64\ntopk = 2000\nnum_q_heads = 128\nkv_cache = \"fp8\"\ntargets = [\"sm_90a\", \"sm_90a\"]\n";

#[test]
fn overrides_apply_before_validation_so_the_suggested_values_fix_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "cfg.toml", VALID_BUT_TOPK);
    let out = nsa(&["list", "--config", &file], &[]);
    fails_with(&out, &[&file, "`topk` = 2000", "nearest valid: 1984", "sm_90a listed 2 times"]);
    let out = nsa(&["list", "--config", &file, "--topk", "1984", "--arch", "sm_90a"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).lines().all(|l| l.ends_with(".sm_90a")), "{}", stdout(&out));
    assert!(stdout(&out).contains("topk.k1984.sm_90a"), "{}", stdout(&out));
}

#[test]
fn config_parse_errors_name_the_file_the_field_and_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let typo = write(dir.path(), "typo.toml", "pagesize = 64\ntopk = 2048\n");
    fails_with(
        &nsa(&["list", "--config", &typo], &[]),
        &[&typo, "unknown field `pagesize`", "did you mean `page_size`?"],
    );
    let empty = write(dir.path(), "empty.toml", " \n");
    fails_with(&nsa(&["list", "--config", &empty], &[]), &[&empty, "empty"]);
    let toml_type = write(dir.path(), "type.toml", "page_size = \"x\"\n");
    fails_with(&nsa(&["list", "--config", &toml_type], &[]), &["`page_size`", "line 1, column 13"]);
    let json_type = write(dir.path(), "type.json", "{\"page_size\": 64,\n \"topk\": \"x\"}");
    fails_with(&nsa(&["list", "--config", &json_type], &[]), &["`topk`", "line 2 column 12"]);
    let control = write(dir.path(), "ctl.toml", "kv_cache = \"\u{1b}[31mred\"\n");
    let out = nsa(&["list", "--config", &control], &[]);
    assert!(!stderr(&out).contains('\u{1b}'), "control bytes are escaped: {:?}", stderr(&out));
}

#[test]
fn environment_flags_are_checked_on_every_subcommand() {
    for sub in [&["list"][..], &["inspect", "kv_store.fp8_656.sm_90a", "--source"], &["compile", "--only", "x"]] {
        fails_with(&nsa(sub, &[("NSA_PDL", "maybe")]), &["NSA_PDL", "\"maybe\""]);
        fails_with(&nsa(sub, &[("NSA_CHECK_DEVICE_INPUTS", "yes")]), &["NSA_CHECK_DEVICE_INPUTS"]);
        fails_with(&nsa(sub, &[("NSA_JIT", "of")]), &["NSA_JIT"]);
        fails_with(&nsa(sub, &[("NSA_JTI", "off")]), &["NSA_JTI", "did you mean NSA_JIT"]);
        fails_with(&nsa(sub, &[("NSA_LOG", "x=nope[")]), &["NSA_LOG", "not a tracing filter"]);
    }
}

#[test]
fn inspect_suggests_close_ids_and_refuses_impossible_requests_before_printing() {
    let out = nsa(&["inspect", "topk.k2048.sm90a"], &[]);
    fails_with(&out, &["the closest are topk.k2048.sm_90a"]);
    assert!(stderr(&out).len() < 1000, "{} bytes: not every id", stderr(&out).len());
    // A misspelt start of an id: the ids that start that way come first.
    let out = nsa(&["inspect", "dense_prefil.h128"], &[]);
    fails_with(&out, &["the closest are dense_prefill.h128."]);
    let out = nsa(&["inspect", "kv_store.fp8_656.gfx942", "--ptx"], &[]);
    fails_with(&out, &["--ptx", "gfx942"]);
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
}

#[test]
fn compiling_into_an_unwritable_cache_says_nothing_was_saved_and_logs_stay_plain() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let root = file.path().join("cache");
    let out = nsa(
        &["compile", "--arch", "sm_90a", "--only", "kv_*", "--verify", "no"],
        &[("NSA_CACHE_DIR", root.to_str().unwrap()), ("NSA_LOG", "info")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("warning: 2 of 2 kernels were compiled but not saved to the disk cache"),
        "{}",
        stdout(&out)
    );
    assert!(stderr(&out).contains("nsa compile: 2/2 kernels ready"), "{}", stderr(&out));
    assert!(!stderr(&out).contains('\u{1b}'), "no colour codes into a pipe: {:?}", stderr(&out));
}
