//! Baking a kernel set ahead of its first launch (`nsa compile`, the Python
//! package's `Config.compile`): one cache per toolchain the set needs, and every
//! kernel compiled (or loaded from disk) on one worker per core.

use super::{CacheConfig, CachedKernel, KernelCache};
use crate::jit::{clang_hip::ClangHipCompiler, nvrtc::NvrtcCompiler, Compiler};
use crate::{Error, Result};
use nsa_kernels::{KernelSpec, Toolchain};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One kernel cache per toolchain the specs need, sharing the disk root from the
/// environment. `Sync`: workers compile through it concurrently.
#[derive(Debug)]
pub struct Caches {
    nvrtc: Option<KernelCache>,
    hip: Option<KernelCache>,
}

impl Caches {
    pub fn for_specs(specs: &[KernelSpec]) -> Result<Self> {
        let needs = |t: Toolchain| specs.iter().any(|s| s.target.toolchain() == t);
        let cache = |compiler: Arc<dyn Compiler>| -> Result<KernelCache> {
            Ok(KernelCache::new(compiler, CacheConfig::from_env()?))
        };
        Ok(Caches {
            nvrtc: if needs(Toolchain::Nvrtc) { Some(cache(Arc::new(NvrtcCompiler::new()?))?) } else { None },
            hip: if needs(Toolchain::Hip) { Some(cache(Arc::new(ClangHipCompiler::new()?))?) } else { None },
        })
    }

    pub fn get(&self, spec: &KernelSpec) -> Result<Arc<CachedKernel>> {
        let cache = match spec.target.toolchain() {
            Toolchain::Nvrtc => self.nvrtc.as_ref(),
            Toolchain::Hip => self.hip.as_ref(),
        };
        cache.ok_or_else(|| Error::Other(format!("no compiler was set up for {spec}")))?.get(spec)
    }

    pub fn root(&self) -> Option<&std::path::Path> {
        self.nvrtc.as_ref().or(self.hip.as_ref()).and_then(|c| c.root())
    }

    /// Compiled kernels that could not be saved to the disk cache.
    pub fn unpersisted(&self) -> Vec<super::Unpersisted> {
        self.nvrtc.iter().chain(self.hip.iter()).flat_map(KernelCache::unpersisted).collect()
    }
}

/// Compiles (or loads) every spec on one worker per core; `ready(spec, done)` runs
/// after each (`done`: how many are ready so far). Results in spec order.
pub fn compile_all(
    caches: &Caches,
    specs: &[KernelSpec],
    ready: impl Fn(&KernelSpec, usize) + Sync,
) -> Result<Vec<Arc<CachedKernel>>> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, specs.len().max(1));
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<Arc<CachedKernel>>>>> = specs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(spec) = specs.get(i) else { break };
                let result = caches.get(spec);
                *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
                ready(spec, finished.fetch_add(1, Ordering::Relaxed) + 1);
            });
        }
    });
    slots
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()).expect("every spec was taken by a worker"))
        .collect()
}

/// The specs whose id matches one of `patterns` (all of them when there are none).
///
/// `field` names the patterns in errors, `listing` says where the ids are listed.
pub fn select(
    specs: Vec<KernelSpec>,
    patterns: &[String],
    field: &'static str,
    listing: &str,
) -> Result<Vec<KernelSpec>> {
    if patterns.is_empty() {
        return Ok(specs);
    }
    let globs = patterns
        .iter()
        .map(|p| {
            glob::Pattern::new(p).map_err(|e| Error::InvalidArgument {
                field,
                value: p.clone(),
                expected: format!("a glob over kernel ids such as `kv_*` ({e})"),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let total = specs.len();
    let chosen: Vec<KernelSpec> = specs.into_iter().filter(|s| globs.iter().any(|g| g.matches(&s.id()))).collect();
    if chosen.is_empty() {
        return Err(Error::InvalidArgument {
            field,
            value: patterns.join(","),
            expected: format!("globs that match some of the config's {total} kernel ids ({listing})"),
        });
    }
    Ok(chosen)
}
