//! Finding libnvrtc (and libnvrtc-builtins) before cudarc looks for it.
//!
//! cudarc panics when it cannot dlopen NVRTC, and it only searches the loader's
//! default path. We search the usual install places ourselves, dlopen the library
//! by full path with RTLD_GLOBAL (so cudarc's later dlopen by soname returns the
//! same object), and preload the matching builtins library, which libnvrtc itself
//! dlopens by name at compile time.

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
use std::env;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Pinned wheel that provisions NVRTC when no toolkit is installed.
pub const NVRTC_WHEEL: &str = "nvidia-cuda-nvrtc==13.0.88";
/// Sonames we accept: the CUDA 13 library, or an unversioned symlink to it.
const NVRTC_NAMES: [&str; 2] = ["libnvrtc.so.13", "libnvrtc.so"];

/// The NVRTC library in use.
#[derive(Clone, Debug)]
pub struct NvrtcLibrary {
    /// Full path, or the bare soname when the loader's default search found it.
    pub path: PathBuf,
    /// `nvrtcVersion()` of that library.
    pub version: (i32, i32),
    /// The builtins library preloaded beside it.
    pub builtins: PathBuf,
    /// Which rule found it (for logs and `nsa doctor`-style output).
    pub found_by: String,
}

/// Locates and loads NVRTC once per process; later calls return the same answer.
pub fn load() -> Result<&'static NvrtcLibrary, String> {
    static LOADED: OnceLock<Result<NvrtcLibrary, String>> = OnceLock::new();
    LOADED.get_or_init(locate_and_load).as_ref().map_err(Clone::clone)
}

/// Where we look, in order, with the rule that put each place on the list.
pub fn search_dirs() -> Vec<(String, PathBuf)> {
    let mut dirs = Vec::new();
    if let Some(p) = env::var_os("NSA_NVRTC_PATH") {
        let p = PathBuf::from(p);
        let dir = if p.is_file() { p.parent().map(Path::to_path_buf).unwrap_or_default() } else { p };
        dirs.push(("NSA_NVRTC_PATH".to_string(), dir));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = env::var_os(var) {
            for sub in ["lib64", "lib", "targets/x86_64-linux/lib"] {
                dirs.push((var.to_string(), PathBuf::from(&root).join(sub)));
            }
        }
    }
    for root in ["/usr/local/cuda", "/usr/local/cuda-13", "/usr/local/cuda-13.0", "/opt/cuda"] {
        dirs.push(("toolkit default".to_string(), PathBuf::from(root).join("lib64")));
    }
    for site in python_site_dirs() {
        for sub in ["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"] {
            dirs.push(("pip wheel".to_string(), site.join(sub)));
        }
    }
    dirs
}

fn locate_and_load() -> Result<NvrtcLibrary, String> {
    let mut tried = Vec::new();
    for (rule, dir) in search_dirs() {
        for name in NVRTC_NAMES {
            let path = dir.join(name);
            if !path.exists() {
                tried.push(format!("{} ({rule}): not present", path.display()));
                continue;
            }
            match open_global(&path).and_then(|lib| finish(lib, path.clone(), Some(&dir), &rule)) {
                Ok(found) => return Ok(found),
                Err(e) => tried.push(format!("{} ({rule}): {e}", path.display())),
            }
        }
    }
    for name in NVRTC_NAMES {
        match open_global(Path::new(name)) {
            Ok(lib) => match finish(lib, PathBuf::from(name), None, "loader default path") {
                Ok(found) => return Ok(found),
                Err(e) => tried.push(format!("{name} (loader default path): {e}")),
            },
            Err(e) => tried.push(format!("{name} (loader default path): {e}")),
        }
    }
    Err(format!(
        "libnvrtc (CUDA 13) was not found. Tried:\n  - {}\nInstall it with one of:\n  \
         - `bash .ci/env.sh <command>` from the nsa checkout (installs the pinned wheel into .nsa-tools/),\n  \
         - `python3 -m pip install {NVRTC_WHEEL}` (found automatically in site-packages),\n  \
         - a CUDA 13 toolkit (set CUDA_HOME if it is not /usr/local/cuda),\n  \
         or point NSA_NVRTC_PATH at the directory holding libnvrtc.so.13.",
        tried.join("\n  - ")
    ))
}

fn open_global(path: &Path) -> Result<Library, String> {
    // SAFETY: loading NVRTC runs its initialisers, which have no preconditions.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| e.to_string())
}

fn finish(lib: Library, path: PathBuf, dir: Option<&Path>, rule: &str) -> Result<NvrtcLibrary, String> {
    type VersionFn = unsafe extern "C" fn(*mut i32, *mut i32) -> i32;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion has this signature in every NVRTC release and only writes two ints.
    let rc = unsafe {
        let f = lib.get::<VersionFn>(b"nvrtcVersion\0").map_err(|e| format!("not an NVRTC library: {e}"))?;
        f(&mut major, &mut minor)
    };
    if rc != 0 || major < 12 {
        return Err(format!(
            "nvrtcVersion returned {major}.{minor} (rc {rc}); nsa needs NVRTC 12.8 or newer (13.x preferred)"
        ));
    }
    let builtins_name = format!("libnvrtc-builtins.so.{major}.{minor}");
    let builtins = match dir.map(|d| d.join(&builtins_name)).filter(|p| p.exists()) {
        Some(p) => p,
        None => PathBuf::from(&builtins_name),
    };
    let builtins_lib = open_global(&builtins)
        .map_err(|e| format!("found NVRTC {major}.{minor} but not {builtins_name}, which it loads to compile: {e}"))?;
    // Both stay loaded for the life of the process: cudarc resolves symbols from them.
    std::mem::forget(builtins_lib);
    std::mem::forget(lib);
    tracing::debug!(path = %path.display(), version = %format!("{major}.{minor}"), rule, "loaded NVRTC");
    Ok(NvrtcLibrary { path, version: (major, minor), builtins, found_by: rule.to_string() })
}

/// site-packages directories of the `python3` on PATH (user and system), if any.
fn python_site_dirs() -> Vec<PathBuf> {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let script = "import site,sys\nfor p in site.getsitepackages()+[site.getusersitepackages()]: print(p)";
        std::process::Command::new("python3")
            .args(["-c", script])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(PathBuf::from).collect())
            .unwrap_or_default()
    })
    .clone()
}
