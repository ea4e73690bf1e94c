//! One error type for the runtime; every variant says what to do about it.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] nsa_kernels::ConfigError),

    #[error(transparent)]
    Render(#[from] nsa_kernels::RenderError),

    /// libnvrtc (or libnvrtc-builtins) could not be found or loaded.
    #[error("{0}")]
    NvrtcNotFound(String),

    /// The compiler rejected a kernel.
    #[error("compiling `{id}` failed ({compiler}).\noptions: {options}\nsource dumped to: {source_path}\n--- compiler log ---\n{log}")]
    Compile { id: String, compiler: String, options: String, source_path: String, log: String },

    /// `NSA_JIT=off` and the disk cache had no entry for this kernel.
    #[error("kernel `{id}` is not in the disk cache at {cache_dir}{bad_entry} and NSA_JIT=off forbids compiling it; run `nsa compile` for this config (same nsa version, compiler and options; `--deterministic-topk` for a layer with deterministic top-k, `topk_bf16_scores` in the config for bf16 scores) to bake the cache, or unset NSA_JIT")]
    JitDisabledMiss {
        id: String,
        cache_dir: String,
        /// Empty, or ` (its entry there was bad …: <reason>)`.
        bad_entry: String,
    },

    /// No CUDA driver / device.
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),

    #[error("CUDA driver call failed while {context}: {source}")]
    Driver { context: String, source: cudarc::driver::DriverError },

    /// A launcher argument is wrong; checked on the host before any launch.
    #[error("invalid argument `{field}` = {value}: {expected}")]
    InvalidArgument { field: &'static str, value: String, expected: String },

    /// A kernel counted rejected entries (e.g. a slot outside the pool).
    #[error("kernel `{id}` rejected {count} entr{} of `{field}` (one of them at position {example}): {expected}", if *count == 1 { "y" } else { "ies" })]
    DeviceRejected { id: String, field: &'static str, count: u32, example: u32, expected: String },

    #[error("I/O on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    #[error("{0}")]
    Other(String),
}

/// [`Error::InvalidArgument`]: `field` holds `value`, and `expected` says what is
/// allowed and how to fix it.
pub(crate) fn invalid(field: &'static str, value: impl Into<String>, expected: impl Into<String>) -> Error {
    Error::InvalidArgument { field, value: value.into(), expected: expected.into() }
}

impl Error {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    pub fn driver(context: impl Into<String>) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
        let context = context.into();
        move |source| Error::Driver { context, source }
    }
}
