//! The content-addressed cache key.
//!
//! Never `std::hash::Hash`: that hash is neither stable across Rust releases nor
//! meant to identify content. The key is a plain serde struct; its digest is
//! blake3 over its canonical JSON (fields in declaration order, no maps), so the
//! same inputs give the same digest in every process, on every machine.

use crate::jit::{Compiler, CompilerIdentity};
use nsa_kernels::{OutputKind, RenderedKernel};
use serde::{Deserialize, Serialize};

/// Version of the on-disk layout and of the key itself. Bump it whenever either
/// changes meaning; entries then live under a fresh `v<schema>/` directory and
/// old ones are simply never looked at again.
pub const CACHE_SCHEMA: u32 = 2;

/// Hex digits of the key digest kept in an entry's directory name.
pub const ENTRY_DIGEST_HEX: usize = 32;

/// Everything that decides the bytes of a compiled image.
///
/// Two equal keys must give interchangeable images; anything that could change
/// the image but is not a field here is a bug.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheKey {
    /// [`CACHE_SCHEMA`] at the time the key was made.
    pub schema: u32,
    /// Version of the nsa-runtime crate that made the key.
    pub nsa_version: String,
    /// [`KernelSpec::id`](nsa_kernels::KernelSpec::id), e.g. `kv_store.fp8_656.sm_90a`.
    pub kernel_id: String,
    /// Arch string the image is for (`sm_90a`, `gfx942`).
    pub target: String,
    /// What the compiler produces for that target.
    pub output_kind: OutputKind,
    /// Who compiles (name + version).
    pub compiler: CompilerIdentity,
    /// The full option list, in the order the compiler gets it.
    pub options: Vec<String>,
    /// blake3 (hex) of the rendered source bytes.
    pub source_blake3: String,
    /// [`nsa_kernels::render::headers_digest`]: the embedded headers the source includes.
    pub headers_blake3: String,
}

impl CacheKey {
    /// The key of `kernel` as `compiler` would build it.
    pub fn new(compiler: &dyn Compiler, kernel: &RenderedKernel) -> CacheKey {
        let target = kernel.spec.target;
        CacheKey {
            schema: CACHE_SCHEMA,
            nsa_version: env!("CARGO_PKG_VERSION").to_string(),
            kernel_id: kernel.id.clone(),
            target: target.arch().to_string(),
            output_kind: target.output_kind(),
            compiler: compiler.identity().clone(),
            options: compiler.options(target),
            source_blake3: blake3::hash(kernel.source.as_bytes()).to_hex().to_string(),
            headers_blake3: headers_digest().to_string(),
        }
    }

    /// The canonical JSON the digest is taken over.
    pub fn canonical_json(&self) -> String {
        serde_json::to_string(self).expect("a CacheKey always serialises")
    }

    /// blake3 (64 hex digits) of [`canonical_json`](Self::canonical_json).
    pub fn digest(&self) -> String {
        blake3::hash(self.canonical_json().as_bytes()).to_hex().to_string()
    }

    /// Directory name of the disk entry: `<kernel id>-<first 32 hex of the digest>`.
    pub fn entry_name(&self) -> String {
        entry_name(&self.kernel_id, &self.digest())
    }
}

/// `<kernel id>-<first 32 hex of digest>`.
pub(crate) fn entry_name(kernel_id: &str, digest: &str) -> String {
    let n = digest.len().min(ENTRY_DIGEST_HEX);
    format!("{kernel_id}-{}", &digest[..n])
}

/// The headers digest, computed once per process.
fn headers_digest() -> &'static str {
    static DIGEST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DIGEST.get_or_init(nsa_kernels::render::headers_digest)
}
