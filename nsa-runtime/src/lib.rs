//! nsa-runtime: everything that touches a compiler or a device.
//!
//! * [`jit`]: compilers (NVRTC → CUBIN, clang/hipRTC → code object) behind one trait.
//! * [`cache`]: memory layer (one compile per key) over a content-addressed disk layer.
//! * [`device`]: the CUDA device, its caps, and loading/launching compiled kernels.
//! * [`ops`]: typed launchers, one module per kernel family.
//! * [`model`]: [`NsaModel`], a compile-time model config (`#[derive(NsaKernels)]`) and its typed entry points.
//! * [`reference`]: CPU references, the oracle of every GPU test.

pub mod cache;
pub mod device;
pub mod error;
pub mod foreign;
pub mod fsread;
pub mod jit;
pub mod layer;
pub mod metadata;
pub mod model;
pub mod ops;
pub mod reference;
pub mod runtime;
pub mod testdata;
pub mod verify;

pub use error::{Error, Result};
pub use model::NsaModel;
pub use nsa_kernels as kernels;
pub use runtime::{DeviceChecks, Runtime};
