//! Compilers behind one trait, so the cache does not care which one ran.

pub mod clang_hip;
pub mod nvrtc;
pub mod nvrtc_lib;

use nsa_kernels::{OutputKind, RenderedKernel, Target};
use serde::{Deserialize, Serialize};

/// Who compiled an image: part of every cache key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CompilerIdentity {
    /// `nvrtc`, `clang-hip`, …
    pub name: String,
    /// Version as the compiler reports it (e.g. `13.0`).
    pub version: String,
}

/// A compiled, loadable image plus what the compiler said about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompiledImage {
    pub kind: OutputKind,
    pub bytes: Vec<u8>,
    /// Compiler log (warnings, ptxas -v lines); may be empty.
    pub log: String,
    pub resources: ResourceUsage,
}

/// Per-kernel resources as ptxas reports them (`-v`), when known: the entry
/// function's registers and shared memory, and the spills of every function in
/// the image (the entry and any callee compiled apart).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceUsage {
    pub registers: Option<u32>,
    pub smem_bytes: Option<u32>,
    pub spill_store_bytes: Option<u32>,
    pub spill_load_bytes: Option<u32>,
}

/// Turns rendered source into an image for one target.
pub trait Compiler: Send + Sync {
    fn identity(&self) -> &CompilerIdentity;
    /// The full option list used for `target` (part of the cache key).
    fn options(&self, target: Target) -> Vec<String>;
    /// Compiles `kernel` for its target.
    fn compile(&self, kernel: &RenderedKernel) -> crate::Result<CompiledImage>;
}
