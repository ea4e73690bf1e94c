//! The disk layer: one directory per key, published atomically, verified on load,
//! set aside (never trusted, never a panic) when anything about it is off.
//!
//! ```text
//! <root>/v<schema>/<kernel id>-<32 hex of digest>/{image.bin, meta.json, source.cu}
//! <root>/v<schema>/<kernel id>-<32 hex of digest>.lock   held while one process compiles the key
//! <root>/v<schema>/.tmp-*            entries being written (renamed into place)
//! <root>/quarantine/<entry>-<unix ms> bad entries, kept for inspection (the newest few)
//! <root>/failed/<id>-<16 hex>.cu     sources of failed compiles (the newest few)
//! ```

use super::key::{CacheKey, CACHE_SCHEMA};
use crate::fsread;
use crate::jit::{CompiledImage, ResourceUsage};
use nsa_kernels::RenderedKernel;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Compiled image inside an entry.
pub const IMAGE_FILE: &str = "image.bin";
/// Metadata inside an entry ([`EntryMeta`]).
pub const META_FILE: &str = "meta.json";
/// Rendered source inside an entry (for humans and profilers; not read back).
pub const SOURCE_FILE: &str = "source.cu";
/// Directory under the root that bad entries are moved to.
pub const QUARANTINE_DIR: &str = "quarantine";
/// Directory under the root that sources of failed compiles are dumped to.
pub const FAILED_DIR: &str = "failed";
/// Suffix of the per-key lock files beside the entries.
pub const LOCK_SUFFIX: &str = ".lock";
/// Bad entries kept in `quarantine/`; older ones are deleted.
pub const QUARANTINE_KEEP: usize = 16;
/// Failed-compile sources kept in `failed/`; older ones are deleted.
pub const FAILED_KEEP: usize = 64;
/// A staging directory this old is removed even where locks cannot tell whether
/// its writer is alive (filesystems without locks).
pub const STALE_STAGING_AGE: Duration = Duration::from_secs(3600);
/// Largest `meta.json` read (it holds the compiler's log).
pub const META_LIMIT: u64 = 16 << 20;
/// Largest `image.bin` read; real images are a few MB at most.
pub const IMAGE_LIMIT: u64 = 256 << 20;

/// Contents of an entry's `meta.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntryMeta {
    /// The full key, as JSON; must equal the looking-up key's JSON exactly.
    pub key: serde_json::Value,
    /// blake3 of the key's canonical JSON.
    pub key_digest: String,
    /// Entry point of the kernel in the image.
    pub symbol: String,
    /// blake3 (hex) of `image.bin`.
    pub image_blake3: String,
    /// Size of `image.bin` in bytes.
    pub image_size: u64,
    /// The compiler's log.
    pub log: String,
    /// Resources the compiler reported.
    pub resources: ResourceUsage,
    /// When the entry was written, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
}

/// A verified entry.
pub(crate) struct Loaded {
    pub image: CompiledImage,
    pub source_path: PathBuf,
}

pub(crate) enum Load {
    Hit(Loaded),
    Miss,
    /// The entry exists but cannot be trusted; the reason is for the log.
    Bad(String),
}

/// What happened to a bad entry.
pub(crate) enum Quarantined {
    Moved,
    Deleted,
    /// Neither moved nor deleted: it stays where it is and shadows the key.
    Stuck(String),
}

/// A compiled kernel that could not be saved, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unpersisted {
    pub entry: String,
    pub reason: String,
}

/// A cache root on disk. Every failure to write is tolerated: the first is logged
/// at warn, and all are listed by [`unpersisted`](Self::unpersisted).
#[derive(Debug)]
pub(crate) struct DiskStore {
    root: PathBuf,
    write_warned: AtomicBool,
    unpersisted: Mutex<Vec<Unpersisted>>,
    housekeeping: Once,
    /// Entry names under the schema directory, listed once (any-build look-ups).
    listing: OnceLock<Vec<String>>,
}

impl DiskStore {
    pub fn new(root: PathBuf) -> Self {
        DiskStore {
            root,
            write_warned: AtomicBool::new(false),
            unpersisted: Mutex::default(),
            housekeeping: Once::new(),
            listing: OnceLock::new(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn schema_dir(&self) -> PathBuf {
        self.root.join(format!("v{CACHE_SCHEMA}"))
    }

    pub fn entry_dir(&self, entry: &str) -> PathBuf {
        self.schema_dir().join(entry)
    }

    fn lock_path(&self, entry: &str) -> PathBuf {
        self.schema_dir().join(format!("{entry}{LOCK_SUFFIX}"))
    }

    /// Kernels compiled by this store's cache that are not on disk, and why.
    pub fn unpersisted(&self) -> Vec<Unpersisted> {
        self.unpersisted.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Looks `key` up and verifies what is found against `key_json`.
    pub fn load(&self, key: &CacheKey, key_json: &serde_json::Value, entry: &str) -> Load {
        self.housekeeping.call_once(|| self.clean_up());
        let dir = self.entry_dir(entry);
        match fs::symlink_metadata(&dir) {
            Ok(md) if md.is_dir() => {}
            Ok(md) if md.file_type().is_symlink() => return Load::Bad("the entry is a symbolic link".into()),
            Ok(_) => return Load::Bad("the entry is not a directory".into()),
            // Absent, or the root is unreadable / not a directory: nothing to load.
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::debug!(path = %dir.display(), error = %e, "cache entry unreadable; treating as a miss");
                }
                return Load::Miss;
            }
        }
        let meta = match read_meta(&dir) {
            Ok(m) => m,
            Err(reason) => return Load::Bad(reason),
        };
        if &meta.key != key_json {
            return Load::Bad(format!("the key in {META_FILE} differs from the looked-up key"));
        }
        let bytes = match fsread::read_bounded(&dir.join(IMAGE_FILE), IMAGE_LIMIT, false) {
            Ok(b) => b,
            Err(e) => return Load::Bad(format!("{IMAGE_FILE} unreadable: {e}")),
        };
        if bytes.len() as u64 != meta.image_size {
            return Load::Bad(format!("{IMAGE_FILE} has {} bytes, {META_FILE} says {}", bytes.len(), meta.image_size));
        }
        let hash = blake3::hash(&bytes).to_hex();
        if hash.as_str() != meta.image_blake3 {
            return Load::Bad(format!("{IMAGE_FILE} hashes to {hash}, {META_FILE} says {}", meta.image_blake3));
        }
        // The symbol is checked against the image itself, not only against the meta
        // that vouches for the image: a swapped image of another kernel is caught.
        let symbol = format!("{}\0", meta.symbol);
        if meta.symbol.is_empty() || memchr::memmem::find(&bytes, symbol.as_bytes()).is_none() {
            return Load::Bad(format!("{IMAGE_FILE} does not define the kernel's entry point `{}`", meta.symbol));
        }
        Load::Hit(Loaded {
            image: CompiledImage { kind: key.output_kind, bytes, log: meta.log, resources: meta.resources },
            source_path: dir.join(SOURCE_FILE),
        })
    }

    /// The entry of `kernel_id` whose key equals `key_json` but for the
    /// compiler's version and build (the newest, if several): for a process whose
    /// compiler was not found and so cannot name its exact build.
    pub fn find_any_build(&self, kernel_id: &str, key_json: &serde_json::Value) -> Option<(String, serde_json::Value)> {
        let listing = self.listing.get_or_init(|| fsread::dir_names(&self.schema_dir()));
        let prefix = format!("{kernel_id}-");
        let wanted = without_compiler_build(key_json);
        listing
            .iter()
            .filter(|n| n.strip_prefix(&prefix).is_some_and(|d| d.len() == super::ENTRY_DIGEST_HEX))
            .filter_map(|n| {
                let meta = read_meta(&self.entry_dir(n)).ok()?;
                (without_compiler_build(&meta.key) == wanted).then(|| (meta.created_unix_ms, n.clone(), meta.key))
            })
            .max_by_key(|(created, ..)| *created)
            .map(|(_, name, key)| (name, key))
    }

    /// Takes the cross-process lock of `entry`, waiting up to `wait` for the
    /// process that holds it. `None` when the root has no usable locks (read-only,
    /// or a filesystem without them) or the wait ran out: the caller then compiles
    /// without one, as two processes did before locks.
    pub fn lock(&self, entry: &str, wait: Duration) -> Option<EntryLock> {
        let path = self.lock_path(entry);
        let file = fs::create_dir_all(self.schema_dir())
            .and_then(|()| fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path));
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "no cross-process lock (cannot open the lock file)");
                return None;
            }
        };
        let started = Instant::now();
        let mut pause = Duration::from_millis(2);
        let mut waited = false;
        loop {
            match fsread::try_lock_exclusive(&file) {
                Ok(true) => return Some(EntryLock { _file: file }),
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "no cross-process lock (locking unsupported)");
                    return None;
                }
            }
            if !waited {
                tracing::info!(entry, "another process is compiling this kernel; waiting for it");
                waited = true;
            }
            if started.elapsed() >= wait {
                tracing::warn!(entry, ?wait, "gave up waiting for another process's compile; compiling here too");
                return None;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Moves a bad entry to `<root>/quarantine/`, or deletes it when that fails.
    pub fn quarantine(&self, entry: &str, reason: &str, then: &str) -> Quarantined {
        let src = self.entry_dir(entry);
        let qdir = self.root.join(QUARANTINE_DIR);
        let moved = fs::create_dir_all(&qdir).and_then(|()| {
            let stamp = unix_ms();
            let mut last = io::Error::other("no free quarantine name");
            for n in 0..16 {
                let name = if n == 0 { format!("{entry}-{stamp}") } else { format!("{entry}-{stamp}-{n}") };
                let dest = qdir.join(name);
                if dest.exists() {
                    continue;
                }
                match fs::rename(&src, &dest) {
                    Ok(()) => return Ok(dest),
                    Err(e) => last = e,
                }
            }
            Err(last)
        });
        let outcome = match moved {
            Ok(dest) => {
                tracing::warn!(entry, reason, moved_to = %dest.display(), "bad kernel cache entry quarantined; {then}");
                Quarantined::Moved
            }
            Err(move_err) => {
                let removed = if src.is_dir() { fs::remove_dir_all(&src) } else { fs::remove_file(&src) };
                match removed {
                    Ok(()) => {
                        tracing::warn!(entry, reason, quarantine_error = %move_err, "bad kernel cache entry deleted (could not quarantine it); {then}");
                        Quarantined::Deleted
                    }
                    Err(e) => {
                        tracing::warn!(entry, reason, path = %src.display(), error = %e, "bad kernel cache entry could neither be quarantined nor deleted; {then}; delete it by hand");
                        Quarantined::Stuck(format!("{e}"))
                    }
                }
            }
        };
        prune(&qdir, QUARANTINE_KEEP);
        outcome
    }

    /// Publishes an entry atomically (files and directory synced before the
    /// rename). Returns the path of its `source.cu` (ours, or that of a process
    /// that published the same key first), or `None` when it could not be saved
    /// (recorded in [`unpersisted`](Self::unpersisted)).
    pub fn store(
        &self,
        key: &CacheKey,
        key_json: &serde_json::Value,
        digest: &str,
        entry: &str,
        kernel: &RenderedKernel,
        image: &CompiledImage,
    ) -> Option<PathBuf> {
        let schema_dir = self.schema_dir();
        let final_dir = schema_dir.join(entry);
        let staged = fs::create_dir_all(&schema_dir)
            .and_then(|()| tempfile::Builder::new().prefix(&format!(".tmp-{entry}-")).tempdir_in(&schema_dir))
            .and_then(|tmp| {
                let meta = EntryMeta {
                    key: key_json.clone(),
                    key_digest: digest.to_string(),
                    symbol: kernel.symbol.clone(),
                    image_blake3: blake3::hash(&image.bytes).to_hex().to_string(),
                    image_size: image.bytes.len() as u64,
                    log: image.log.clone(),
                    resources: image.resources,
                    created_unix_ms: unix_ms(),
                };
                let meta = serde_json::to_vec_pretty(&meta).map_err(io::Error::other)?;
                write_synced(&tmp.path().join(SOURCE_FILE), kernel.source.as_bytes())?;
                write_synced(&tmp.path().join(IMAGE_FILE), &image.bytes)?;
                // meta.json last: an entry with a meta has everything before it.
                write_synced(&tmp.path().join(META_FILE), &meta)?;
                File::open(tmp.path())?.sync_all()?;
                Ok(tmp)
            });
        let tmp = match staged {
            Ok(tmp) => tmp,
            Err(e) => {
                self.record_unpersisted(entry, &schema_dir, &e.to_string());
                return None;
            }
        };
        match fs::rename(tmp.path(), &final_dir) {
            Ok(()) => {
                // The directory now lives under its final name: nothing to clean up.
                let _ = tmp.keep();
                // The rename itself survives a crash only once the parent is synced.
                if let Err(e) = File::open(&schema_dir).and_then(|d| d.sync_all()) {
                    tracing::debug!(path = %schema_dir.display(), error = %e, "could not sync the cache directory");
                }
                tracing::debug!(entry, path = %final_dir.display(), "kernel cache entry published");
                Some(final_dir.join(SOURCE_FILE))
            }
            // Another process published the same key first: keep theirs (same key,
            // same content) if it is sound; ours is removed when `tmp` drops.
            Err(e) if final_dir.is_dir() => match self.load(key, key_json, entry) {
                Load::Hit(_) => {
                    tracing::debug!(
                        entry,
                        "kernel cache entry published concurrently by another process; keeping theirs"
                    );
                    Some(final_dir.join(SOURCE_FILE))
                }
                Load::Bad(reason) => {
                    let why = format!("a bad entry ({reason}) is in the way and cannot be replaced ({e}); delete it");
                    self.record_unpersisted(entry, &final_dir, &why);
                    None
                }
                Load::Miss => {
                    self.record_unpersisted(entry, &final_dir, &e.to_string());
                    None
                }
            },
            Err(e) => {
                self.record_unpersisted(entry, &final_dir, &e.to_string());
                None
            }
        }
    }

    fn record_unpersisted(&self, entry: &str, path: &Path, reason: &str) {
        if !self.write_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                root = %self.root.display(),
                path = %path.display(),
                error = reason,
                "a compiled kernel could not be saved to the cache; it is kept in memory only and a later run compiles it again (further failures are listed at the end of `nsa compile`)"
            );
        } else {
            tracing::debug!(path = %path.display(), error = reason, "kernel cache write failed");
        }
        let mut list = self.unpersisted.lock().unwrap_or_else(PoisonError::into_inner);
        list.push(Unpersisted { entry: entry.to_string(), reason: format!("{}: {reason}", path.display()) });
    }

    /// Removes what crashed or killed processes left: staging directories whose
    /// writer is gone (its key's lock is free, or it is older than
    /// [`STALE_STAGING_AGE`] where locks do not work), and quarantine and failed
    /// sources beyond the newest few. Runs once per process, on first use;
    /// failures (a read-only root) are ignored.
    fn clean_up(&self) {
        let schema_dir = self.schema_dir();
        for name in fsread::dir_names(&schema_dir).into_iter().filter(|n| n.starts_with(".tmp-")) {
            let path = schema_dir.join(&name);
            let entry = staging_entry(&name);
            let writer_gone = match entry.map(|e| self.lock_path(e)).and_then(|p| File::open(p).ok()) {
                Some(lock) => match fsread::try_lock_exclusive(&lock) {
                    Ok(taken) => taken,
                    Err(_) => older_than(&path, STALE_STAGING_AGE),
                },
                None => older_than(&path, STALE_STAGING_AGE),
            };
            if writer_gone {
                match fs::remove_dir_all(&path) {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), "removed a staging directory left by a killed compile")
                    }
                    Err(e) => {
                        tracing::debug!(path = %path.display(), error = %e, "could not remove a stale staging directory")
                    }
                }
            }
        }
        prune(&self.root.join(QUARANTINE_DIR), QUARANTINE_KEEP);
        prune(&self.root.join(FAILED_DIR), FAILED_KEEP);
    }
}

/// Held while one process compiles and publishes a key; the OS releases it when
/// the process dies, so a killed compiler never blocks the others.
#[derive(Debug)]
pub(crate) struct EntryLock {
    _file: File,
}

fn read_meta(dir: &Path) -> Result<EntryMeta, String> {
    let text = fsread::read_bounded(&dir.join(META_FILE), META_LIMIT, false)
        .map_err(|e| format!("{META_FILE} unreadable: {e}"))?;
    serde_json::from_slice(&text).map_err(|e| format!("{META_FILE} does not parse: {e}"))
}

/// The key with the compiler's version and build blanked, for any-build matches.
fn without_compiler_build(key: &serde_json::Value) -> serde_json::Value {
    let mut key = key.clone();
    if let Some(compiler) = key.get_mut("compiler").and_then(serde_json::Value::as_object_mut) {
        compiler.remove("version");
        compiler.remove("build");
    }
    key
}

/// The entry a staging directory `.tmp-<entry>-<random>` was writing.
fn staging_entry(name: &str) -> Option<&str> {
    name.strip_prefix(".tmp-")?.rsplit_once('-').map(|(entry, _)| entry)
}

fn older_than(path: &Path, age: Duration) -> bool {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|elapsed| elapsed > age)
}

/// Deletes all but the `keep` most recently modified items of `dir`.
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let mut items: Vec<(SystemTime, PathBuf)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            Some((e.metadata().ok()?.modified().ok()?, e.path()))
        })
        .collect();
    if items.len() <= keep {
        return;
    }
    items.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    for (_, path) in items.drain(keep..) {
        let removed = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
        if let Err(e) = removed {
            tracing::debug!(path = %path.display(), error = %e, "could not prune an old cache item");
        }
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Writes `kernel`'s source where a human can find it after a failed compile and
/// returns that path: `<root>/failed/<id>-<16 hex of the source's blake3>.cu`, or
/// the same name under `<system temp>/nsa-failed/` when there is no root or it is
/// not writable. Best effort: the path is returned even if every write failed
/// (that is logged at warn). Only the newest [`FAILED_KEEP`] sources are kept.
///
/// Compilers may call this themselves when building an
/// [`Error::Compile`](crate::Error::Compile); a `Compile` error whose `source_path` is empty gets
/// it filled in by the cache with this function.
pub fn dump_source(kernel: &RenderedKernel, root: Option<&Path>) -> PathBuf {
    let hash = blake3::hash(kernel.source.as_bytes()).to_hex();
    let name = format!("{}-{}.cu", kernel.id, &hash.as_str()[..16]);
    let tmp_dir = std::env::temp_dir().join("nsa-failed");
    let dirs = root.map(|r| r.join(FAILED_DIR)).into_iter().chain(std::iter::once(tmp_dir.clone()));
    let mut last_err = None;
    for dir in dirs {
        let path = dir.join(&name);
        match fs::create_dir_all(&dir).and_then(|()| fs::write(&path, kernel.source.as_bytes())) {
            Ok(()) => {
                prune(&dir, FAILED_KEEP);
                return path;
            }
            Err(e) => last_err = Some((path, e)),
        }
    }
    if let Some((path, e)) = last_err {
        tracing::warn!(path = %path.display(), error = %e, "could not dump the source of a failed compile");
    }
    tmp_dir.join(name)
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names_give_their_entry() {
        assert_eq!(staging_entry(".tmp-topk.k2048.sm_90a-0123abcd-XyZ12"), Some("topk.k2048.sm_90a-0123abcd"));
        assert_eq!(staging_entry("kv_store-01"), None);
    }

    #[test]
    fn prune_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5u64 {
            let p = dir.path().join(format!("f{i}"));
            fs::write(&p, b"x").unwrap();
            let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + i);
            File::options().write(true).open(&p).unwrap().set_modified(t).unwrap();
        }
        prune(dir.path(), 2);
        assert_eq!(fsread::dir_names(dir.path()), ["f3", "f4"]);
    }
}
