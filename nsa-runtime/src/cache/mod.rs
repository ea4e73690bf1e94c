//! The kernel cache: a memory layer (one compile per key per process) over a
//! content-addressed disk layer (one verified directory per key).
//!
//! * **Key** ([`CacheKey`]): kernel id, blake3 of the rendered source, the headers
//!   digest, compiler name + version, the full option list, output kind, target,
//!   crate version and [`CACHE_SCHEMA`]. Its digest is blake3 over its canonical
//!   JSON; never `std::hash::Hash`.
//! * **Memory**: [`KernelCache::get`] renders and hashes a spec once; later calls for
//!   the same spec are a hash-map look-up returning the same `Arc`. Concurrent
//!   callers of one key wait for the first; a failed compile is not remembered,
//!   the next caller tries again.
//! * **Disk** (optional): `NSA_CACHE_DIR`, else `<user cache dir>/nsa`. Entries are
//!   written into a temporary directory inside the root, synced, and renamed into
//!   place; verified (key JSON, image size, blake3 and
//!   entry point) on load, and moved to `<root>/quarantine/` when anything is
//!   off. Files are opened only if regular (no FIFOs, devices or links) and
//!   their size is checked before reading. A root that cannot be written still
//!   serves reads; compiles then live in memory only, and
//!   [`KernelCache::unpersisted`] lists them.
//! * **Processes sharing a root** compile each key once: the compiling process
//!   holds an advisory lock on `<entry>.lock` (released by the OS if it dies);
//!   the others wait, then load what it published. Where locks do not work
//!   (read-only roots, filesystems without them) every process compiles and
//!   the first rename wins. Staging directories of killed compiles are removed
//!   by the next process; `quarantine/` and `failed/` keep their newest few.
//! * **`NSA_JIT=off`**: a kernel found in neither layer is
//!   [`Error::JitDisabledMiss`] instead of a compile. A compiler that was not
//!   found (no NVRTC on the machine) cannot name its exact build; its cache then
//!   serves the entries any build of it made for the same source and options.
//!
//! Trust: the disk cache is trusted like the program's own files. The checks
//! catch accidents (truncation, bit flips, swapped or foreign files), not an
//! adversary who can write the directory: such a writer can forge a matching
//! meta and image. Keep the root writable only by the user that runs nsa.

mod disk;
mod key;
pub mod prebuild;

pub use disk::{dump_source, EntryMeta, FAILED_DIR, IMAGE_FILE, META_FILE, QUARANTINE_DIR, SOURCE_FILE};
pub use key::{CacheKey, CACHE_SCHEMA, ENTRY_DIGEST_HEX};

use crate::jit::{CompiledImage, Compiler};
use crate::{Error, Result};
use disk::{DiskStore, Load, Quarantined};
pub use disk::{Unpersisted, FAILED_KEEP, LOCK_SUFFIX, QUARANTINE_KEEP};
use nsa_kernels::{KernelSpec, RenderedKernel};
use serde::Serialize;
use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// Environment variable naming the disk cache root.
pub const ENV_CACHE_DIR: &str = "NSA_CACHE_DIR";
/// Environment variable that, set to `off`, forbids compiling.
pub const ENV_JIT: &str = "NSA_JIT";

/// Whether a kernel missing from both layers may be compiled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JitPolicy {
    /// Compile on a miss (the default).
    #[default]
    Enabled,
    /// Never compile: a miss is [`Error::JitDisabledMiss`] (`NSA_JIT=off`).
    Off,
}

impl JitPolicy {
    /// Parses an `NSA_JIT` value: `off`/`0`/`false`/`no`/`disabled` → [`Off`](Self::Off),
    /// empty/`on`/`1`/`true`/`yes`/`enabled` → [`Enabled`](Self::Enabled), else `None`.
    pub fn parse(value: &str) -> Option<JitPolicy> {
        match value.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "false" | "no" | "disabled" => Some(JitPolicy::Off),
            "" | "on" | "1" | "true" | "yes" | "enabled" => Some(JitPolicy::Enabled),
            _ => None,
        }
    }
}

/// How long a process waits for another that is compiling the same key before
/// compiling it too (the default of [`CacheConfig::lock_wait`]).
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(600);

/// How a [`KernelCache`] is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Disk cache root; `None` = no disk layer (memory only).
    pub root: Option<PathBuf>,
    /// Whether misses may be compiled.
    pub jit: JitPolicy,
    /// How long to wait for another process compiling the same key; `None`
    /// takes no cross-process locks.
    pub lock_wait: Option<Duration>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { root: None, jit: JitPolicy::Enabled, lock_wait: Some(DEFAULT_LOCK_WAIT) }
    }
}

impl CacheConfig {
    /// From the process environment: `NSA_CACHE_DIR` (else `<user cache dir>/nsa`)
    /// and `NSA_JIT`.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// Like [`from_env`](Self::from_env), reading variables through `var` (for tests
    /// and embedders that keep their own environment). An empty `NSA_CACHE_DIR`
    /// counts as unset; a relative one is made absolute against the working
    /// directory now, so a later `chdir` does not move the cache; an unrecognised
    /// `NSA_JIT` is an error (a typo in an offline image must not silently turn
    /// compiling back on).
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<Self> {
        let root = match var(ENV_CACHE_DIR).filter(|v| !v.is_empty()) {
            Some(dir) => Some(std::path::absolute(&dir).map_err(|e| {
                crate::error::invalid(
                    ENV_CACHE_DIR,
                    format!("{dir:?}"),
                    format!("a directory path (made absolute against the working directory, which failed: {e})"),
                )
            })?),
            None => Self::default_root(),
        };
        let jit = match var(ENV_JIT) {
            None => JitPolicy::Enabled,
            Some(v) => {
                let s = v.to_string_lossy();
                JitPolicy::parse(&s).ok_or_else(|| {
                    crate::error::invalid(
                        ENV_JIT,
                        format!("{s:?}"),
                        "`off` (never compile: misses are errors) or `on` (the default); \
                         also accepted: 0/false/no/disabled and 1/true/yes/enabled",
                    )
                })?
            }
        };
        Ok(CacheConfig { root, jit, ..CacheConfig::default() })
    }

    /// `<user cache dir>/nsa` (e.g. `~/.cache/nsa`), if the platform has one.
    pub fn default_root() -> Option<PathBuf> {
        dirs::cache_dir().map(|d| d.join("nsa"))
    }

    /// Memory only, JIT enabled.
    pub fn memory_only() -> Self {
        CacheConfig::default()
    }

    /// Disk cache at `root`, JIT enabled.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        CacheConfig { root: Some(root.into()), ..CacheConfig::default() }
    }

    /// The same config waiting at most `wait` for another process's compile of a
    /// key (`None`: no cross-process locks).
    pub fn with_lock_wait(mut self, wait: Option<Duration>) -> Self {
        self.lock_wait = wait;
        self
    }

    /// The same config with `jit` as policy.
    pub fn with_jit(mut self, jit: JitPolicy) -> Self {
        self.jit = jit;
        self
    }
}

/// Where a [`CachedKernel`] came from when it entered the memory layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Compiled in this process; `elapsed` is the compiler's wall time.
    Compiled { elapsed: Duration },
    /// Loaded from the disk layer; `elapsed` covers reading and verifying.
    Disk { elapsed: Duration },
}

/// A compiled kernel, ready to load onto a device.
#[derive(Clone, Debug)]
pub struct CachedKernel {
    pub spec: KernelSpec,
    /// [`KernelSpec::id`].
    pub id: String,
    /// Entry point in the image.
    pub symbol: String,
    pub image: CompiledImage,
    /// `source.cu` of the disk entry (for profilers and humans); `None` without a
    /// writable disk layer.
    pub source_path: Option<PathBuf>,
    pub origin: Origin,
    /// [`CacheKey::digest`] (64 hex digits).
    pub key_digest: String,
}

/// Counters since the cache was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Look-ups answered by the memory layer (including callers that waited for a
    /// concurrent compile of the same key).
    pub memory_hits: u64,
    /// Look-ups answered by a verified disk entry.
    pub disk_hits: u64,
    /// Successful compiles.
    pub compiles: u64,
    /// Compiles that returned an error.
    pub compile_failures: u64,
    /// Bad disk entries found (moved to `quarantine/`, or deleted).
    pub quarantined: u64,
}

#[derive(Debug, Default)]
struct Counters {
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    compiles: AtomicU64,
    compile_failures: AtomicU64,
    quarantined: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// One key of the memory layer.
#[derive(Debug)]
struct Slot {
    kernel: RenderedKernel,
    key: CacheKey,
    key_json: serde_json::Value,
    digest: String,
    entry: String,
    ready: OnceLock<Arc<CachedKernel>>,
    /// Held while one caller fills `ready`; others wait on it.
    fill: Mutex<()>,
}

/// The two-layer kernel cache in front of one [`Compiler`]. `Send + Sync`; share it
/// behind an `Arc` (or a `static`).
pub struct KernelCache {
    compiler: Arc<dyn Compiler>,
    jit: JitPolicy,
    lock_wait: Option<Duration>,
    disk: Option<DiskStore>,
    /// Hot path: spec → slot, so a hit neither renders nor hashes.
    by_spec: RwLock<HashMap<KernelSpec, Arc<Slot>>>,
    /// Key digest → slot; the memory layer proper.
    by_digest: Mutex<HashMap<String, Arc<Slot>>>,
    counters: Counters,
}

impl fmt::Debug for KernelCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelCache")
            .field("compiler", self.compiler.identity())
            .field("jit", &self.jit)
            .field("root", &self.root())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<KernelCache>();
};

impl KernelCache {
    /// A cache in front of `compiler`. Creates nothing on disk until the first
    /// compile.
    pub fn new(compiler: Arc<dyn Compiler>, cfg: CacheConfig) -> Self {
        KernelCache {
            compiler,
            jit: cfg.jit,
            lock_wait: cfg.lock_wait,
            disk: cfg.root.map(DiskStore::new),
            by_spec: RwLock::default(),
            by_digest: Mutex::default(),
            counters: Counters::default(),
        }
    }

    /// The compiled kernel for `spec`: from memory, else from disk, else compiled
    /// (and published to disk). Renders `spec` only the first time.
    pub fn get(&self, spec: &KernelSpec) -> Result<Arc<CachedKernel>> {
        let slot = self.by_spec.read().unwrap_or_else(PoisonError::into_inner).get(spec).cloned();
        let slot = match slot {
            Some(slot) => slot,
            None => {
                let slot = self.slot_for(nsa_kernels::render(spec)?);
                self.by_spec.write().unwrap_or_else(PoisonError::into_inner).entry(*spec).or_insert(slot).clone()
            }
        };
        self.resolve(&slot)
    }

    /// Like [`get`](Self::get) for an already rendered kernel (hashes its source on
    /// every call; prefer `get` on hot paths).
    pub fn get_rendered(&self, kernel: &RenderedKernel) -> Result<Arc<CachedKernel>> {
        let slot = self.slot_for(kernel.clone());
        self.resolve(&slot)
    }

    /// The key `kernel` is cached under with this cache's compiler.
    pub fn key(&self, kernel: &RenderedKernel) -> CacheKey {
        CacheKey::new(&*self.compiler, kernel)
    }

    /// The disk cache root, if there is a disk layer.
    pub fn root(&self) -> Option<&Path> {
        self.disk.as_ref().map(DiskStore::root)
    }

    /// Where the disk entry for `key` lives (whether or not it exists yet).
    pub fn entry_dir(&self, key: &CacheKey) -> Option<PathBuf> {
        self.disk.as_ref().map(|d| d.entry_dir(&key.entry_name()))
    }

    /// Kernels this cache compiled but could not save to disk (a full disk, a
    /// read-only root, a bad entry that cannot be removed), with the reason:
    /// a later process compiles them again. Empty without a disk layer.
    pub fn unpersisted(&self) -> Vec<Unpersisted> {
        self.disk.as_ref().map(DiskStore::unpersisted).unwrap_or_default()
    }

    pub fn jit_policy(&self) -> JitPolicy {
        self.jit
    }

    pub fn compiler(&self) -> &Arc<dyn Compiler> {
        &self.compiler
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheStats {
            memory_hits: get(&c.memory_hits),
            disk_hits: get(&c.disk_hits),
            compiles: get(&c.compiles),
            compile_failures: get(&c.compile_failures),
            quarantined: get(&c.quarantined),
        }
    }

    fn slot_for(&self, kernel: RenderedKernel) -> Arc<Slot> {
        let key = self.key(&kernel);
        let digest = key.digest();
        self.by_digest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(digest.clone())
            .or_insert_with(|| {
                Arc::new(Slot {
                    key_json: serde_json::to_value(&key).expect("a CacheKey always serialises"),
                    entry: key::entry_name(&key.kernel_id, &digest),
                    digest,
                    key,
                    kernel,
                    ready: OnceLock::new(),
                    fill: Mutex::new(()),
                })
            })
            .clone()
    }

    fn resolve(&self, slot: &Slot) -> Result<Arc<CachedKernel>> {
        if let Some(k) = slot.ready.get() {
            bump(&self.counters.memory_hits);
            return Ok(k.clone());
        }
        // A panic in a compiler poisons this lock; the slot is still empty and
        // consistent, so the next caller simply tries again.
        let _filling = slot.fill.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(k) = slot.ready.get() {
            bump(&self.counters.memory_hits);
            return Ok(k.clone());
        }
        let k = Arc::new(self.fill(slot)?);
        let _ = slot.ready.set(k.clone());
        Ok(k)
    }

    /// Disk, else compile (and publish). Called with the slot's fill lock held.
    fn fill(&self, slot: &Slot) -> Result<CachedKernel> {
        let kernel = &slot.kernel;
        let made = |image, source_path, origin| CachedKernel {
            spec: kernel.spec,
            id: kernel.id.clone(),
            symbol: kernel.symbol.clone(),
            image,
            source_path,
            origin,
            key_digest: slot.digest.clone(),
        };
        let known = self.compiler.identity_known();
        let then = match (self.jit, known) {
            (JitPolicy::Off, _) => "NSA_JIT=off forbids compiling it",
            (JitPolicy::Enabled, true) => "recompiling",
            (JitPolicy::Enabled, false) => "the compiler was not found, so it cannot be recompiled",
        };
        let mut bad_entry = None;
        if let Some(disk) = &self.disk {
            if let Some(hit) = self.load_from_disk(disk, slot, known, then, &mut bad_entry) {
                return Ok(made(hit.0.image, Some(hit.0.source_path), Origin::Disk { elapsed: hit.1 }));
            }
        }

        if self.jit == JitPolicy::Off {
            return Err(Error::JitDisabledMiss {
                id: kernel.id.clone(),
                cache_dir: match self.root() {
                    Some(root) => root.display().to_string(),
                    None => "(none: no disk cache is configured)".to_string(),
                },
                bad_entry: bad_entry
                    .map(|reason| format!(" (its entry there was bad and was set aside: {reason})"))
                    .unwrap_or_default(),
            });
        }

        // One compile per key across processes: hold the key's lock, then look
        // again, for what a process that held it since our look-up published.
        let _lock = match (&self.disk, self.lock_wait) {
            (Some(disk), Some(wait)) if known => {
                let lock = disk.lock(&slot.entry, wait);
                if lock.is_some() {
                    if let Some(hit) = self.load_from_disk(disk, slot, known, then, &mut bad_entry) {
                        return Ok(made(hit.0.image, Some(hit.0.source_path), Origin::Disk { elapsed: hit.1 }));
                    }
                }
                lock
            }
            _ => None,
        };

        let t = Instant::now();
        let image = match self.compiler.compile(kernel) {
            Ok(image) => image,
            Err(e) => {
                bump(&self.counters.compile_failures);
                return Err(self.with_source_path(e, kernel));
            }
        };
        let elapsed = t.elapsed();
        bump(&self.counters.compiles);
        tracing::info!(
            id = %kernel.id,
            compiler = %self.compiler.identity().name,
            ?elapsed,
            bytes = image.bytes.len(),
            "kernel compiled"
        );
        let source_path = self
            .disk
            .as_ref()
            .and_then(|disk| disk.store(&slot.key, &slot.key_json, &slot.digest, &slot.entry, kernel, &image));
        Ok(made(image, source_path, Origin::Compiled { elapsed }))
    }

    /// The verified disk entry of `slot` (of any build of the compiler when its
    /// own is unknown), quarantining a bad one and noting why in `bad_entry`.
    fn load_from_disk(
        &self,
        disk: &DiskStore,
        slot: &Slot,
        known: bool,
        then: &str,
        bad_entry: &mut Option<String>,
    ) -> Option<(disk::Loaded, Duration)> {
        let t = Instant::now();
        let any_build;
        let (entry, key_json) = if known {
            (&slot.entry, &slot.key_json)
        } else {
            any_build = disk.find_any_build(&slot.key.kernel_id, &slot.key_json)?;
            (&any_build.0, &any_build.1)
        };
        match disk.load(&slot.key, key_json, entry) {
            Load::Hit(loaded) => {
                bump(&self.counters.disk_hits);
                let elapsed = t.elapsed();
                tracing::debug!(id = %slot.kernel.id, entry, ?elapsed, "kernel loaded from the disk cache");
                Some((loaded, elapsed))
            }
            Load::Miss => None,
            Load::Bad(reason) => {
                bump(&self.counters.quarantined);
                if let Quarantined::Stuck(e) = disk.quarantine(entry, &reason, then) {
                    *bad_entry = Some(format!("{reason}; it could not be removed: {e}"));
                } else {
                    *bad_entry = Some(reason);
                }
                None
            }
        }
    }

    /// Fills in an empty `source_path` of a compile error with a dumped copy.
    fn with_source_path(&self, e: Error, kernel: &RenderedKernel) -> Error {
        match e {
            Error::Compile { id, compiler, options, source_path, log } if source_path.is_empty() => Error::Compile {
                id,
                compiler,
                options,
                source_path: dump_source(kernel, self.root()).display().to_string(),
                log,
            },
            e => e,
        }
    }
}
