//! Compilers behind one trait, so the cache does not care which one ran.

pub mod clang_hip;
pub mod elf_check;
pub mod nvrtc;
pub mod nvrtc_api;
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
    /// The exact build (e.g. `13.0.88; libnvrtc <build-id>; builtins <build-id>`):
    /// two builds of one version never share cache entries.
    pub build: String,
}

impl CompilerIdentity {
    /// The identity of a compiler `name` that was not found.
    pub fn unknown(name: &str) -> Self {
        CompilerIdentity { name: name.into(), version: "unknown".into(), build: "unknown".into() }
    }
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
    /// False when the compiler was not found: its version and build are unknown,
    /// the cache then serves entries made by any build of the compiler `name`
    /// (nothing else could be run), and compiling returns an error.
    fn identity_known(&self) -> bool {
        true
    }
    /// The full option list used for `target` (part of the cache key).
    fn options(&self, target: Target) -> Vec<String>;
    /// Compiles `kernel` for its target.
    fn compile(&self, kernel: &RenderedKernel) -> crate::Result<CompiledImage>;
}
