//! trybuild UI tests: what the derive accepts (`ui/pass`) and the exact errors it
//! gives (`ui/fail/*.stderr`), the format misuses of the typed API included.
//!
//! Compiler diagnostics change between Rust releases, so the `.stderr` files hold
//! for the toolchain they were written with, [`STDERR_TOOLCHAIN`]; on another one
//! the compile-fail cases are skipped with a note (the pass cases always run).
//! Regenerate them with `TRYBUILD=overwrite cargo test -p nsa-macros --test ui`.

use std::process::Command;

/// `rustc --version` prefix the `.stderr` files were made with.
const STDERR_TOOLCHAIN: &str = "rustc 1.95.0 ";

fn rustc_version() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc).arg("--version").output().expect("running rustc --version");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    let version = rustc_version();
    if version.starts_with(STDERR_TOOLCHAIN) {
        t.compile_fail("tests/ui/fail/*.rs");
    } else {
        eprintln!(
            "note: compile-fail UI cases skipped: their .stderr files are for `{}`, this is `{version}`",
            STDERR_TOOLCHAIN.trim_end()
        );
    }
}
