//! Finding NVRTC (libnvrtc and the libnvrtc-builtins it loads at compile time)
//! without loading it, and loading it only when something must be compiled.
//!
//! [`locate`] looks in the usual install places (no subprocess: pip-installed
//! wheels are found by looking in the known site-packages locations), checks each
//! candidate's ELF structure and exports (a few KB read) and names the exact build
//! (release and GNU build-ids) for the cache key. [`NvrtcFiles::load`] then, once
//! per process, checks the files against the sha256 their wheel recorded (when
//! they came from a wheel), loads them and checks `nvrtcVersion`. A damaged or
//! wrong library is an error naming the file and what is wrong, not a signal or
//! a panic.

use super::elf_check::{self, LibraryFacts};
use super::nvrtc_api::{self, NvrtcApi};
use crate::fsread::dir_names;
use base64::Engine;
use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Pinned wheel that provisions NVRTC when no toolkit is installed.
pub const NVRTC_WHEEL: &str = "nvidia-cuda-nvrtc==13.0.88";
/// The variable that names the NVRTC library (a file) or its directory.
pub const ENV_NVRTC_PATH: &str = "NSA_NVRTC_PATH";
/// File names looked for in each directory: the CUDA 13 soname, then the unversioned link.
const NVRTC_NAMES: [&str; 2] = ["libnvrtc.so.13", "libnvrtc.so"];
/// The oldest NVRTC that compiles every target nsa has (sm_100a needs 12.8).
pub const MIN_VERSION: (u32, u32) = (12, 8);

/// A located NVRTC install, checked but not loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvrtcFiles {
    pub library: PathBuf,
    pub builtins: PathBuf,
    /// Which rule found it (for logs and error messages).
    pub found_by: String,
    /// Major and minor version, from the builtins library's name.
    pub version: (u32, u32),
    /// The full release (e.g. `13.0.88`), from the wheel's metadata or the
    /// library's versioned file name, when either says.
    pub release: Option<String>,
    /// The exact build: release plus both libraries' GNU build-ids.
    pub build: String,
    /// The wheel's RECORD and the sha256 (urlsafe base64) it lists for each file.
    record: Option<WheelRecord>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct WheelRecord {
    path: PathBuf,
    library_sha256: String,
    builtins_sha256: String,
}

/// Why no NVRTC could be located.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocateError {
    /// `NSA_NVRTC_PATH` is set and does not name a usable NVRTC: never replaced by another.
    Explicit(String),
    /// Nothing usable in any place looked at; the text lists them and how to install.
    NotFound(String),
}

impl LocateError {
    pub fn message(&self) -> &str {
        match self {
            LocateError::Explicit(m) | LocateError::NotFound(m) => m,
        }
    }
}

/// [`locate_with`] over the process environment, once per process.
pub fn locate() -> Result<&'static NvrtcFiles, LocateError> {
    static LOCATED: OnceLock<Result<NvrtcFiles, LocateError>> = OnceLock::new();
    LOCATED.get_or_init(|| locate_with(|name| std::env::var_os(name))).as_ref().map_err(Clone::clone)
}

/// Finds NVRTC, reading variables through `var`. `NSA_NVRTC_PATH` (a file or a
/// directory; empty means unset), when set, is the only place looked at.
pub fn locate_with(var: impl Fn(&str) -> Option<OsString>) -> Result<NvrtcFiles, LocateError> {
    if let Some(p) = var(ENV_NVRTC_PATH).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        let fix = format!("fix or unset {ENV_NVRTC_PATH} (it takes the library file or its directory)");
        let candidates: Vec<PathBuf> = if p.is_dir() {
            NVRTC_NAMES.iter().map(|n| p.join(n)).filter(|c| c.exists()).collect()
        } else if p.exists() {
            vec![p.clone()]
        } else {
            return Err(LocateError::Explicit(format!(
                "{ENV_NVRTC_PATH}={}: no such file or directory; {fix}",
                p.display()
            )));
        };
        let Some(library) = candidates.first() else {
            return Err(LocateError::Explicit(format!(
                "{ENV_NVRTC_PATH}={}: the directory holds none of {}; {fix}",
                p.display(),
                NVRTC_NAMES.join(", ")
            )));
        };
        return check(library, ENV_NVRTC_PATH)
            .map_err(|e| LocateError::Explicit(format!("{ENV_NVRTC_PATH}={}: {e}; {fix}", library.display())));
    }
    let mut tried = Vec::new();
    for (rule, dir) in search_dirs(&var) {
        for name in NVRTC_NAMES {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            match check(&path, &rule) {
                Ok(found) => return Ok(found),
                Err(e) => {
                    tracing::warn!(path = %path.display(), rule, error = %e, "skipping an unusable NVRTC library");
                    tried.push(format!("{} ({rule}): {e}", path.display()));
                }
            }
        }
        tried.push(format!("{} ({rule}): no libnvrtc", dir.display()));
    }
    Err(LocateError::NotFound(format!(
        "libnvrtc (CUDA 13) was not found. Looked in:\n  - {}\nInstall it with one of:\n  \
         - `bash .ci/env.sh <command>` from the nsa checkout (installs the pinned wheel into .nsa-tools/),\n  \
         - `python3 -m pip install {NVRTC_WHEEL}` (found in the usual site-packages places),\n  \
         - a CUDA 13 toolkit (set CUDA_HOME if it is not /usr/local/cuda),\n  \
         or set {ENV_NVRTC_PATH} to the library or its directory.",
        tried.join("\n  - ")
    )))
}

/// The directories looked in when `NSA_NVRTC_PATH` is unset, in order, with the
/// rule that put each on the list. No subprocess is run.
pub fn search_dirs(var: &impl Fn(&str) -> Option<OsString>) -> Vec<(String, PathBuf)> {
    let mut dirs: Vec<(String, PathBuf)> = Vec::new();
    let mut push = |rule: &str, dir: PathBuf| {
        if !dirs.iter().any(|(_, d)| *d == dir) {
            dirs.push((rule.to_string(), dir));
        }
    };
    for name in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = var(name).filter(|v| !v.is_empty()) {
            for sub in ["lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"] {
                push(name, PathBuf::from(&root).join(sub));
            }
        }
    }
    for dir in nsa_tools_dirs() {
        push(".nsa-tools beside the executable", dir);
    }
    for root in ["/usr/local/cuda", "/usr/local/cuda-13", "/usr/local/cuda-13.0", "/opt/cuda"] {
        push("toolkit default", Path::new(root).join("lib64"));
    }
    for site in python_site_dirs(var) {
        for sub in ["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"] {
            push("pip wheel", site.join(sub));
        }
    }
    let ld_path = var("LD_LIBRARY_PATH").unwrap_or_default();
    for dir in std::env::split_paths(&ld_path).filter(|d| !d.as_os_str().is_empty()) {
        push("LD_LIBRARY_PATH", dir);
    }
    for dir in ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"] {
        push("system library directory", PathBuf::from(dir));
    }
    dirs
}

/// `.nsa-tools/nvrtc-*/nvidia/cu13/lib` in the nearest ancestor of the running
/// executable that has `.nsa-tools` (where `bash .ci/env.sh` installs the wheel).
fn nsa_tools_dirs() -> Vec<PathBuf> {
    let Ok(exe) = std::env::current_exe() else { return Vec::new() };
    let Some(tools) = exe.ancestors().skip(1).take(8).map(|a| a.join(".nsa-tools")).find(|t| t.is_dir()) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = dir_names(&tools)
        .into_iter()
        .filter(|n| n.starts_with("nvrtc-") && !n.ends_with(".partial"))
        .map(|n| tools.join(n).join("nvidia/cu13/lib"))
        .collect();
    found.sort();
    found.reverse(); // the newest pinned version first
    found
}

/// site-packages directories of the Python installs this machine plausibly has,
/// found by looking (never by running Python): `PYTHONPATH`, the active virtual or
/// conda environment, the prefix of each `python3` on `PATH`, the user's site and
/// the system's.
fn python_site_dirs(var: &impl Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let mut sites: Vec<PathBuf> = Vec::new();
    let python_path = var("PYTHONPATH").unwrap_or_default();
    sites.extend(std::env::split_paths(&python_path).filter(|d| !d.as_os_str().is_empty()));
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for name in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        prefixes.extend(var(name).filter(|v| !v.is_empty()).map(PathBuf::from));
    }
    let path = var("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let python = dir.join("python3");
        if !python.is_file() {
            continue;
        }
        prefixes.extend(dir.parent().map(Path::to_path_buf));
        if let Ok(real) = fs::canonicalize(&python) {
            prefixes.extend(real.parent().and_then(Path::parent).map(Path::to_path_buf));
        }
    }
    if let Some(home) = var("HOME").filter(|v| !v.is_empty()) {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    prefixes.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
    for prefix in prefixes {
        for lib in ["lib", "lib64"] {
            let lib = prefix.join(lib);
            for name in dir_names(&lib).into_iter().filter(|n| n.starts_with("python3")) {
                sites.push(lib.join(&name).join("site-packages"));
                sites.push(lib.join(&name).join("dist-packages"));
            }
            sites.push(lib.join("python3/dist-packages"));
        }
    }
    sites.retain(|s| s.is_dir());
    sites.dedup();
    sites
}

/// Checks one candidate library and the builtins beside it; reads headers only.
fn check(library: &Path, rule: &str) -> Result<NvrtcFiles, String> {
    let facts = elf_check::inspect(library)?;
    if let Some(symbol) = facts.missing(&nvrtc_api::SYMBOLS) {
        return Err(format!("it does not export {symbol}, so it is not an NVRTC library nsa can use"));
    }
    let dir = library.parent().unwrap_or(Path::new("."));
    let (builtins, version) = find_builtins(dir, &facts)?;
    if version < MIN_VERSION {
        return Err(format!(
            "it is NVRTC {}.{} ({}); nsa needs {}.{} or newer (13.x preferred)",
            version.0,
            version.1,
            builtins.display(),
            MIN_VERSION.0,
            MIN_VERSION.1
        ));
    }
    let builtins_facts = elf_check::inspect(&builtins).map_err(|e| format!("{}: {e}", builtins.display()))?;
    let record = wheel_record(library, &builtins);
    let release =
        record.as_ref().and_then(|(_, release)| release.clone()).or_else(|| versioned_file_release(library, version));
    let id = |f: &LibraryFacts| f.build_id.clone().unwrap_or_else(|| format!("no build-id, {} bytes", f.size));
    let build = format!(
        "{}; libnvrtc {}; builtins {}",
        release.clone().unwrap_or_else(|| format!("{}.{}", version.0, version.1)),
        id(&facts),
        id(&builtins_facts)
    );
    Ok(NvrtcFiles {
        library: library.to_path_buf(),
        builtins,
        found_by: rule.to_string(),
        version,
        release,
        build,
        record: record.map(|(r, _)| r),
    })
}

/// `libnvrtc-builtins.so.<major>.<minor>` beside the library, for the major
/// version its soname names (any, without a soname); newest first.
fn find_builtins(dir: &Path, facts: &LibraryFacts) -> Result<(PathBuf, (u32, u32)), String> {
    let major =
        facts.soname.as_deref().and_then(|s| s.strip_prefix("libnvrtc.so.")).and_then(|m| m.parse::<u32>().ok());
    let mut found: Vec<((u32, u32), String)> = dir_names(dir)
        .into_iter()
        .filter_map(|name| {
            let v = name.strip_prefix("libnvrtc-builtins.so.")?;
            let (ma, mi) = v.split_once('.')?;
            let version = (ma.parse().ok()?, mi.parse().ok()?);
            (major.is_none_or(|m| m == version.0)).then_some((version, name))
        })
        .collect();
    found.sort();
    let Some((version, name)) = found.pop() else {
        return Err(format!(
            "no libnvrtc-builtins.so.{}.* beside it in {}; NVRTC loads that library to compile",
            major.map_or("<major>".to_string(), |m| m.to_string()),
            dir.display()
        ));
    };
    Ok((dir.join(name), version))
}

/// The full release from a toolkit's versioned file name (`libnvrtc.so.13.0.88`,
/// the target of the `libnvrtc.so.13` link).
fn versioned_file_release(library: &Path, (major, minor): (u32, u32)) -> Option<String> {
    let real = fs::canonicalize(library).ok()?;
    let name = real.file_name()?.to_str()?;
    let release = name.strip_prefix("libnvrtc.so.")?;
    (release.starts_with(&format!("{major}.{minor}.")) && release.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .then(|| release.to_string())
}

/// The RECORD of the wheel that installed `library` (a `*.dist-info` in an
/// ancestor directory listing both files), with the release in its name.
fn wheel_record(library: &Path, builtins: &Path) -> Option<(WheelRecord, Option<String>)> {
    for site in library.ancestors().skip(1).take(4) {
        for name in
            dir_names(site).into_iter().filter(|n| n.starts_with("nvidia_cuda_nvrtc") && n.ends_with(".dist-info"))
        {
            let path = site.join(&name).join("RECORD");
            let Ok(text) = crate::fsread::read_bounded(&path, 1 << 20, false) else { continue };
            let text = String::from_utf8_lossy(&text);
            let listed = |file: &Path| -> Option<String> {
                let rel = file.strip_prefix(site).ok()?.to_str()?;
                text.lines().find_map(|line| {
                    let mut cols = line.split(',');
                    (cols.next()? == rel).then_some(())?;
                    cols.next()?.strip_prefix("sha256=").map(str::to_string)
                })
            };
            let (Some(library_sha256), Some(builtins_sha256)) = (listed(library), listed(builtins)) else { continue };
            let release = name.trim_end_matches(".dist-info").rsplit('-').next().map(str::to_string);
            return Some((WheelRecord { path, library_sha256, builtins_sha256 }, release));
        }
    }
    None
}

impl NvrtcFiles {
    /// Verifies (against the wheel's RECORD, when there is one) and loads the
    /// libraries, once per process for the located install.
    pub fn load(&self) -> Result<&'static NvrtcApi, String> {
        static LOADED: OnceLock<(NvrtcFiles, Result<NvrtcApi, String>)> = OnceLock::new();
        let (files, api) = LOADED.get_or_init(|| (self.clone(), self.verify_and_load()));
        if files != self {
            return Err(format!(
                "NVRTC was already loaded from {} in this process; {} cannot be loaded beside it",
                files.library.display(),
                self.library.display()
            ));
        }
        api.as_ref().map_err(Clone::clone)
    }

    fn verify_and_load(&self) -> Result<NvrtcApi, String> {
        if let Some(record) = &self.record {
            for (file, expected) in [(&self.library, &record.library_sha256), (&self.builtins, &record.builtins_sha256)]
            {
                let actual = sha256_urlsafe(file)?;
                if &actual != expected {
                    return Err(format!(
                        "{} does not match the sha256 its wheel recorded in {} (expected {expected}, found {actual}): \
                         the file is damaged; reinstall {NVRTC_WHEEL}",
                        file.display(),
                        record.path.display()
                    ));
                }
            }
        }
        // Checked again: the files may have changed since they were located.
        for file in [&self.library, &self.builtins] {
            elf_check::inspect(file).map_err(|e| format!("{}: {e}", file.display()))?;
        }
        // SAFETY: both files were just checked to be whole ELF libraries for this
        // machine, the first exporting every symbol resolved.
        let api = unsafe { NvrtcApi::load(&self.library, &self.builtins) }?;
        let (major, minor) = api.runtime_version().map_err(|e| format!("{}: {e}", self.library.display()))?;
        if (major as u32, minor as u32) != self.version {
            return Err(format!(
                "{} reports NVRTC {major}.{minor}, but the builtins beside it ({}) are for {}.{}",
                self.library.display(),
                self.builtins.display(),
                self.version.0,
                self.version.1
            ));
        }
        tracing::debug!(path = %self.library.display(), build = %self.build, rule = %self.found_by, "loaded NVRTC");
        Ok(api)
    }
}

/// sha256 of a file in the urlsafe, unpadded base64 that wheel RECORDs use.
fn sha256_urlsafe(path: &Path) -> Result<String, String> {
    let mut file = crate::fsread::open_regular(path, true).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: Vec<(&'static str, OsString)>) -> impl Fn(&str) -> Option<OsString> {
        move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn python_sites_are_found_by_looking_not_by_running_python() {
        let tmp = tempfile::tempdir().unwrap();
        let venv = tmp.path().join("venv");
        let venv_site = venv.join("lib/python3.12/site-packages");
        fs::create_dir_all(&venv_site).unwrap();
        // A python3 on PATH whose prefix has a site, and a PYTHONPATH entry.
        let other = tmp.path().join("pyenv");
        fs::create_dir_all(other.join("bin")).unwrap();
        fs::write(other.join("bin/python3"), "#!/bin/sh\nexit 3\n").unwrap();
        let other_site = other.join("lib/python3.11/site-packages");
        fs::create_dir_all(&other_site).unwrap();
        let extra = tmp.path().join("extra");
        fs::create_dir_all(&extra).unwrap();
        let var = vars(vec![
            ("VIRTUAL_ENV", venv.into_os_string()),
            ("PATH", other.join("bin").into_os_string()),
            ("PYTHONPATH", extra.clone().into_os_string()),
        ]);
        let dirs: Vec<PathBuf> =
            search_dirs(&var).into_iter().filter(|(rule, _)| rule == "pip wheel").map(|(_, d)| d).collect();
        for site in [&venv_site, &other_site, &extra] {
            assert!(dirs.contains(&site.join("nvidia/cu13/lib")), "{} missing from {dirs:?}", site.display());
        }
    }

    #[test]
    fn an_empty_nvrtc_path_means_unset_and_a_wrong_one_is_never_replaced() {
        let empty = locate_with(vars(vec![(ENV_NVRTC_PATH, OsString::new())]));
        assert!(!matches!(empty, Err(LocateError::Explicit(_))), "{empty:?}");
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nope");
        match locate_with(vars(vec![(ENV_NVRTC_PATH, missing.clone().into_os_string())])) {
            Err(LocateError::Explicit(m)) => assert!(m.contains(&missing.display().to_string()), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn builtins_and_release_come_from_file_names() {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["libnvrtc-builtins.so.13.0", "libnvrtc-builtins.so.13.1", "libnvrtc-builtins.so.12.9"] {
            fs::write(tmp.path().join(name), b"").unwrap();
        }
        let facts = |soname: Option<&str>| LibraryFacts {
            size: 0,
            soname: soname.map(str::to_string),
            build_id: None,
            exports: Vec::new(),
        };
        let (path, version) = find_builtins(tmp.path(), &facts(Some("libnvrtc.so.13"))).unwrap();
        assert_eq!((path.file_name().unwrap().to_str().unwrap(), version), ("libnvrtc-builtins.so.13.1", (13, 1)));
        let (_, version) = find_builtins(tmp.path(), &facts(Some("libnvrtc.so.12"))).unwrap();
        assert_eq!(version, (12, 9));
        let err = find_builtins(tmp.path(), &facts(Some("libnvrtc.so.14"))).unwrap_err();
        assert!(err.contains("libnvrtc-builtins.so.14.*"), "{err}");

        fs::write(tmp.path().join("libnvrtc.so.13.0.88"), b"").unwrap();
        std::os::unix::fs::symlink("libnvrtc.so.13.0.88", tmp.path().join("libnvrtc.so.13")).unwrap();
        let lib = tmp.path().join("libnvrtc.so.13");
        assert_eq!(versioned_file_release(&lib, (13, 0)).as_deref(), Some("13.0.88"));
        assert_eq!(versioned_file_release(&lib, (13, 1)), None);
    }
}
