//! The disk layer: one directory per key, published atomically, verified on load,
//! set aside (never trusted, never a panic) when anything about it is off.
//!
//! ```text
//! <root>/v<schema>/<kernel id>-<32 hex of digest>/{image.bin, meta.json, source.cu}
//! <root>/v<schema>/.tmp-*            entries being written (renamed into place)
//! <root>/quarantine/<entry>-<unix ms> bad entries, kept for inspection
//! <root>/failed/<id>-<16 hex>.cu     sources of failed compiles
//! ```

use super::key::{CacheKey, CACHE_SCHEMA};
use crate::jit::{CompiledImage, ResourceUsage};
use nsa_kernels::RenderedKernel;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// A cache root on disk. Every failure to write is tolerated (logged once at warn).
#[derive(Debug)]
pub(crate) struct DiskStore {
    root: PathBuf,
    write_warned: AtomicBool,
}

impl DiskStore {
    pub fn new(root: PathBuf) -> Self {
        DiskStore { root, write_warned: AtomicBool::new(false) }
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

    /// Looks `key` up and verifies what is found.
    pub fn load(&self, key: &CacheKey, key_json: &serde_json::Value, entry: &str) -> Load {
        let dir = self.entry_dir(entry);
        match fs::metadata(&dir) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => return Load::Bad("the entry is not a directory".into()),
            // Absent, or the root is unreadable / not a directory: nothing to load.
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::debug!(path = %dir.display(), error = %e, "cache entry unreadable; treating as a miss");
                }
                return Load::Miss;
            }
        }
        let meta_path = dir.join(META_FILE);
        let meta_text = match fs::read(&meta_path) {
            Ok(t) => t,
            Err(e) => return Load::Bad(format!("{META_FILE} unreadable: {e}")),
        };
        let meta: EntryMeta = match serde_json::from_slice(&meta_text) {
            Ok(m) => m,
            Err(e) => return Load::Bad(format!("{META_FILE} does not parse: {e}")),
        };
        if &meta.key != key_json {
            return Load::Bad(format!("the key in {META_FILE} differs from the looked-up key"));
        }
        let image_path = dir.join(IMAGE_FILE);
        let bytes = match fs::read(&image_path) {
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
        Load::Hit(Loaded {
            image: CompiledImage { kind: key.output_kind, bytes, log: meta.log, resources: meta.resources },
            source_path: dir.join(SOURCE_FILE),
        })
    }

    /// Moves a bad entry to `<root>/quarantine/`, or deletes it when that fails.
    pub fn quarantine(&self, entry: &str, reason: &str) {
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
        match moved {
            Ok(dest) => tracing::warn!(
                entry,
                reason,
                moved_to = %dest.display(),
                "bad kernel cache entry quarantined; recompiling"
            ),
            Err(move_err) => {
                let removed = if src.is_dir() { fs::remove_dir_all(&src) } else { fs::remove_file(&src) };
                match removed {
                    Ok(()) => tracing::warn!(
                        entry,
                        reason,
                        quarantine_error = %move_err,
                        "bad kernel cache entry deleted (could not quarantine it); recompiling"
                    ),
                    Err(e) => tracing::warn!(
                        entry,
                        reason,
                        path = %src.display(),
                        error = %e,
                        "bad kernel cache entry could neither be quarantined nor deleted; ignoring it"
                    ),
                }
            }
        }
    }

    /// Publishes an entry atomically. Returns the path of its `source.cu` (ours, or
    /// that of a process that published the same key first), or `None` when the
    /// root cannot be written.
    pub fn store(
        &self,
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
                fs::write(tmp.path().join(SOURCE_FILE), kernel.source.as_bytes())?;
                fs::write(tmp.path().join(IMAGE_FILE), &image.bytes)?;
                // meta.json last: an entry with a meta has everything before it.
                fs::write(tmp.path().join(META_FILE), meta)?;
                Ok(tmp)
            });
        let tmp = match staged {
            Ok(tmp) => tmp,
            Err(e) => {
                self.warn_write(&schema_dir, &e);
                return None;
            }
        };
        match fs::rename(tmp.path(), &final_dir) {
            Ok(()) => {
                // The directory now lives under its final name: nothing to clean up.
                let _ = tmp.keep();
                tracing::debug!(entry, path = %final_dir.display(), "kernel cache entry published");
                Some(final_dir.join(SOURCE_FILE))
            }
            // Another process published the same key first: keep theirs (same key,
            // same content); ours is removed when `tmp` drops.
            Err(_) if final_dir.is_dir() => {
                tracing::debug!(entry, "kernel cache entry published concurrently by another process; keeping theirs");
                Some(final_dir.join(SOURCE_FILE))
            }
            Err(e) => {
                self.warn_write(&final_dir, &e);
                None
            }
        }
    }

    fn warn_write(&self, path: &Path, e: &io::Error) {
        if !self.write_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                root = %self.root.display(),
                path = %path.display(),
                error = %e,
                "kernel cache root is not writable; compiled kernels are kept in memory only (further write failures are logged at debug)"
            );
        } else {
            tracing::debug!(path = %path.display(), error = %e, "kernel cache write failed");
        }
    }
}

/// Writes `kernel`'s source where a human can find it after a failed compile and
/// returns that path: `<root>/failed/<id>-<16 hex of the source's blake3>.cu`, or
/// the same name under `<system temp>/nsa-failed/` when there is no root or it is
/// not writable. Best effort: the path is returned even if every write failed
/// (that is logged at warn).
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
            Ok(()) => return path,
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
