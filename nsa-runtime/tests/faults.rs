//! Fault injection against the `nsa` binary (CPU only; processes on this machine,
//! each bounded in time): processes sharing one cache, a killed compiler, damaged
//! or wrong NVRTC libraries, hostile config files, offline runs without NVRTC and
//! a hanging `python3` on PATH. Needs NVRTC (`bash .ci/env.sh` provides it).

use nsa_runtime::jit::nvrtc_lib;
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const NSA: &str = env!("CARGO_BIN_EXE_nsa");

/// Held by every test here: they run one at a time, so the time limits measure
/// nsa, not 8 compilers of another test sharing the cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}
/// Four small kernels (the KV and indexer-K stores and gathers) that compile fast.
const SMALL_SET: &str = "kv_*,indexer_k_*";
const SMALL_SET_LEN: usize = 4;

/// The NVRTC this test run uses (the one `bash .ci/env.sh` installs).
fn nvrtc() -> &'static nvrtc_lib::NvrtcFiles {
    nvrtc_lib::locate().unwrap_or_else(|e| panic!("these tests need NVRTC: {}", e.message()))
}

/// `nsa <args>` with a given cache root; the environment is inherited unless changed.
fn nsa(cache: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(NSA);
    cmd.args(args).env("NSA_CACHE_DIR", cache).env_remove("NSA_JIT").stdin(Stdio::null());
    cmd
}

fn compile_small(cache: &Path) -> Command {
    nsa(cache, &["compile", "--arch", "sm_90a", "--only", SMALL_SET, "--verify", "no"])
}

/// Runs `cmd` with a time limit; kills it and fails past that.
fn run(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// "<n> kernels: <compiled> compiled, <loaded> from the disk cache" of `nsa compile`.
fn compiled_and_loaded(out: &Output) -> (usize, usize) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.contains(" compiled, ")).unwrap_or_else(|| panic!("{}", text(out)));
    let numbers: Vec<usize> =
        line.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    (numbers[1], numbers[2])
}

fn assert_clean_failure(out: &Output, what: &str, must_name: &str) {
    let all = text(out);
    assert_eq!(out.status.signal(), None, "{what}: killed by a signal\n{all}");
    assert_eq!(out.status.code(), Some(1), "{what}: exit code\n{all}");
    assert!(all.contains(must_name), "{what}: the error should name {must_name}\n{all}");
    assert!(!all.contains("panicked"), "{what}: panicked\n{all}");
}

fn staging_dirs(cache: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(cache.join(format!("v{}", nsa_runtime::cache::CACHE_SCHEMA))) else {
        return Vec::new();
    };
    entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(".tmp-")).collect()
}

#[test]
fn processes_sharing_an_empty_cache_compile_each_kernel_once() {
    let _serial = serial();
    let cache = tempfile::tempdir().unwrap();
    let processes = 8;
    let children: Vec<_> = (0..processes)
        .map(|_| compile_small(cache.path()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap())
        .collect();
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    let mut compiles = 0;
    for out in &outputs {
        assert!(out.status.success(), "{}", text(out));
        let (compiled, loaded) = compiled_and_loaded(out);
        assert_eq!(compiled + loaded, SMALL_SET_LEN, "{}", text(out));
        compiles += compiled;
    }
    assert_eq!(compiles, SMALL_SET_LEN, "{processes} processes compiled {compiles} times for {SMALL_SET_LEN} kernels");
    assert!(staging_dirs(cache.path()).is_empty());
    // And the next run loads everything.
    let out = run(compile_small(cache.path()), Duration::from_secs(60));
    assert_eq!(compiled_and_loaded(&out), (0, SMALL_SET_LEN), "{}", text(&out));
}

#[test]
fn a_killed_lock_holder_is_taken_over_and_leaves_nothing_behind() {
    let _serial = serial();
    let cache = tempfile::tempdir().unwrap();
    let slow = "topk.k2048.sm_90a";
    let one = |cache: &Path| nsa(cache, &["compile", "--arch", "sm_90a", "--only", slow, "--verify", "no"]);
    let mut holder = one(cache.path()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // Kill it mid-compile: once it holds the key's lock.
    let schema = cache.path().join(format!("v{}", nsa_runtime::cache::CACHE_SCHEMA));
    let started = Instant::now();
    while !fs::read_dir(&schema)
        .is_ok_and(|mut d| d.any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".lock")))
    {
        assert!(started.elapsed() < Duration::from_secs(30), "the compiler never took its lock");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    holder.kill().unwrap();
    holder.wait().unwrap();
    // What a kill during the write leaves behind, beside what this one left.
    let entry = fs::read_dir(&schema)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find_map(|n| n.strip_suffix(".lock").map(str::to_string))
        .unwrap();
    fs::create_dir_all(schema.join(format!(".tmp-{entry}-k1lled"))).unwrap();

    let out = run(one(cache.path()), Duration::from_secs(120));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(compiled_and_loaded(&out), (1, 0), "the next process compiles it without waiting on the dead one");
    let out = run(one(cache.path()), Duration::from_secs(60));
    assert_eq!(compiled_and_loaded(&out), (0, 1), "{}", text(&out));
    assert!(staging_dirs(cache.path()).is_empty(), "{:?}", staging_dirs(cache.path()));
}

/// A directory holding `library` bytes as libnvrtc.so.13 beside a copy of the builtins.
fn nvrtc_dir(root: &Path, name: &str, library: &[u8]) -> PathBuf {
    let dir = root.join(name);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("libnvrtc.so.13"), library).unwrap();
    let builtins = &nvrtc().builtins;
    fs::copy(builtins, dir.join(builtins.file_name().unwrap())).unwrap();
    dir
}

#[test]
fn damaged_or_wrong_nvrtc_libraries_are_errors_naming_the_file() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let real = fs::read(&nvrtc().library).unwrap();
    let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("libc");
    let mut garbage = b"\x7fELF\x02\x01\x01".to_vec();
    garbage.extend((0..100_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
    let cases: Vec<(&str, PathBuf, &str)> = vec![
        ("truncated", nvrtc_dir(tmp.path(), "truncated", &real[..real.len() / 2]), "truncated"),
        ("garbage", nvrtc_dir(tmp.path(), "garbage", &garbage), "not a usable ELF"),
        ("another library", nvrtc_dir(tmp.path(), "libc", &fs::read(libc).unwrap()), "does not export nvrtc"),
        ("empty", nvrtc_dir(tmp.path(), "empty", b""), "plausible size"),
    ];
    for (what, dir, reason) in cases {
        for jit in ["on", "off"] {
            let cache = tempfile::tempdir().unwrap();
            let mut cmd = compile_small(cache.path());
            cmd.env("NSA_NVRTC_PATH", &dir).env("NSA_JIT", jit);
            let out = run(cmd, Duration::from_secs(30));
            assert_clean_failure(&out, what, &dir.join("libnvrtc.so.13").display().to_string());
            assert!(text(&out).contains(reason), "{what}: {}", text(&out));
        }
    }
}

#[test]
fn a_wheel_install_with_flipped_bytes_fails_its_recorded_hash() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let site = tmp.path().join("site");
    let lib = site.join("nvidia/cu13/lib");
    let mut library = fs::read(&nvrtc().library).unwrap();
    let dir = nvrtc_dir(&site, "nvidia/cu13/lib", &library);
    assert_eq!(dir, lib);
    let builtins_name = nvrtc().builtins.file_name().unwrap().to_string_lossy().into_owned();
    let record_line = |rel: &str, bytes: &[u8]| {
        use base64::Engine;
        let sha = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(bytes));
        format!("{rel},sha256={sha},{}\n", bytes.len())
    };
    let dist_info = site.join("nvidia_cuda_nvrtc-13.0.88.dist-info");
    fs::create_dir_all(&dist_info).unwrap();
    let mut record = fs::File::create(dist_info.join("RECORD")).unwrap();
    record.write_all(record_line("nvidia/cu13/lib/libnvrtc.so.13", &library).as_bytes()).unwrap();
    let builtins = fs::read(lib.join(&builtins_name)).unwrap();
    record.write_all(record_line(&format!("nvidia/cu13/lib/{builtins_name}"), &builtins).as_bytes()).unwrap();
    drop(record);

    // Intact, it compiles; with a few bytes flipped in the middle (code), it is refused.
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = compile_small(cache.path());
    cmd.env("NSA_NVRTC_PATH", &lib);
    let out = run(cmd, Duration::from_secs(120));
    assert!(out.status.success(), "{}", text(&out));
    let middle = library.len() / 2;
    for i in 0..4 {
        library[middle + 4099 * i] ^= 0x5a;
    }
    fs::write(lib.join("libnvrtc.so.13"), &library).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = compile_small(cache.path());
    cmd.env("NSA_NVRTC_PATH", &lib);
    let out = run(cmd, Duration::from_secs(30));
    assert_clean_failure(&out, "flipped bytes", "does not match the sha256 its wheel recorded");
}

#[test]
fn nvrtc_path_takes_a_file_or_a_directory_and_is_never_replaced() {
    let _serial = serial();
    let cache = tempfile::tempdir().unwrap();
    assert!(run(compile_small(cache.path()), Duration::from_secs(120)).status.success());
    let files = nvrtc();
    let tmp = tempfile::tempdir().unwrap();
    // A real NVRTC under another file name, named as a file.
    let renamed = nvrtc_dir(tmp.path(), "renamed", &[]);
    fs::remove_file(renamed.join("libnvrtc.so.13")).unwrap();
    fs::copy(&files.library, renamed.join("my-nvrtc.so")).unwrap();
    for (value, ok) in [
        (files.library.display().to_string(), true),
        (files.library.parent().unwrap().display().to_string(), true),
        (renamed.join("my-nvrtc.so").display().to_string(), true),
        (String::new(), true), // empty: unset, found as usual
        (tmp.path().join("missing").display().to_string(), false),
        (tmp.path().display().to_string(), false), // a directory without it
    ] {
        let mut cmd = compile_small(cache.path());
        cmd.env("NSA_NVRTC_PATH", &value);
        let out = run(cmd, Duration::from_secs(60));
        if ok {
            assert!(out.status.success(), "NSA_NVRTC_PATH={value:?}: {}", text(&out));
        } else {
            assert_clean_failure(&out, &format!("NSA_NVRTC_PATH={value}"), &format!("NSA_NVRTC_PATH={value}"));
        }
    }
}

#[test]
fn a_warm_offline_run_needs_no_nvrtc_and_never_loads_it() {
    let _serial = serial();
    let cache = tempfile::tempdir().unwrap();
    assert!(run(compile_small(cache.path()), Duration::from_secs(120)).status.success());
    // Found but not needed: never loaded.
    let mut cmd = compile_small(cache.path());
    cmd.env("NSA_JIT", "off").env("NSA_LOG", "nsa_runtime=debug");
    let out = run(cmd, Duration::from_secs(30));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(compiled_and_loaded(&out), (0, SMALL_SET_LEN));
    assert!(!text(&out).contains("loaded NVRTC"), "{}", text(&out));

    // Not on the machine at all: a copy of the binary away from .nsa-tools, a bare
    // environment. The entries are served by any build of NVRTC that made them.
    let bare = tempfile::tempdir().unwrap();
    let exe = bare.path().join("nsa");
    fs::copy(NSA, &exe).unwrap();
    for jit in ["off", "on"] {
        let mut cmd = Command::new(&exe);
        cmd.args(["compile", "--arch", "sm_90a", "--only", SMALL_SET, "--verify", "no"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", bare.path())
            .env("NSA_CACHE_DIR", cache.path())
            .env("NSA_JIT", jit);
        let out = run(cmd, Duration::from_secs(30));
        assert!(out.status.success(), "NSA_JIT={jit}: {}", text(&out));
        assert_eq!(compiled_and_loaded(&out), (0, SMALL_SET_LEN), "{}", text(&out));
    }
}

#[test]
fn a_hanging_python3_on_path_has_no_effect() {
    let _serial = serial();
    let cache = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let python = bin.path().join("python3");
    fs::write(&python, "#!/bin/sh\nsleep 600\n").unwrap();
    fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.path().display(), std::env::var("PATH").unwrap_or_default());
    for _ in 0..2 {
        // Cold, then warm.
        let mut cmd = compile_small(cache.path());
        cmd.env("PATH", &path);
        let out = run(cmd, Duration::from_secs(120));
        assert!(out.status.success(), "{}", text(&out));
    }
}

#[test]
fn hostile_config_files_are_errors_within_a_second() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("fifo.toml");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let link = tmp.path().join("zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let sparse = tmp.path().join("sparse.toml");
    fs::File::create(&sparse).unwrap().set_len(2 << 30).unwrap();
    let long_value = tmp.path().join("long.toml");
    fs::write(&long_value, format!("page_size = 64\ntopk = 2048\nkv_cache = \"{}\"\n", "x".repeat(900_000))).unwrap();
    let bom = tmp.path().join("bom.json");
    let json = r#"{"page_size":64,"topk":2048,"num_q_heads":128,"kv_cache":"fp8","targets":["sm_90a"]}"#;
    fs::write(&bom, format!("\u{feff}{json}")).unwrap();
    let cases: [(&Path, Option<&str>); 6] = [
        (&fifo, Some("FIFO")),
        (Path::new("/dev/zero"), Some("device")),
        (Path::new("/dev/urandom"), Some("device")),
        (&link, Some("device")),
        (&sparse, Some("more than the")),
        (&long_value, Some("more bytes")),
    ];
    for (path, reason) in cases {
        let out = run(nsa(tmp.path(), &["list", "--config", path.to_str().unwrap()]), Duration::from_secs(1));
        assert_clean_failure(&out, &path.display().to_string(), reason.unwrap());
        assert!(text(&out).len() < 4000, "{}: {} bytes of output", path.display(), text(&out).len());
    }
    let out = run(nsa(tmp.path(), &["list", "--config", bom.to_str().unwrap()]), Duration::from_secs(5));
    assert!(out.status.success(), "{}", text(&out));
}
