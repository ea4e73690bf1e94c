//! The CUDA device: probing the driver without panicking, reading its caps once,
//! and loading compiled images into launchable functions.

use crate::{Error, Result};
use cudarc::driver::{sys::CUdevice_attribute as Attr, CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;
use nsa_kernels::Target;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What dispatch needs to know about the device, read once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    /// Opt-in dynamic shared memory per block.
    pub max_smem_per_block: u32,
    pub l2_bytes: u32,
    /// The arch we generate for on this device (sm_90a on H100/H200).
    pub target: Option<Target>,
}

/// Loads the driver library the way cudarc will, but returns an error instead of panicking.
pub fn probe_driver() -> Result<()> {
    let mut tried = Vec::new();
    for name in ["libcuda.so", "libcuda.so.1"] {
        // SAFETY: loading libcuda runs only its initialisers.
        match unsafe { libloading::Library::new(name) } {
            Ok(_) => return Ok(()),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(Error::NoDevice(format!(
        "the NVIDIA driver library is not loadable ({}); this machine has no NVIDIA driver. \
         Compiling kernels (`nsa compile`) works without one; launching needs a GPU.",
        tried.join("; ")
    )))
}

/// One GPU with a stream, and the functions loaded on it (one module per kernel).
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    caps: DeviceCaps,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("caps", &self.caps).finish_non_exhaustive()
    }
}

impl Gpu {
    /// Opens device `ordinal`. Errors (never panics) without a driver or device.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        probe_driver()?;
        cudarc::driver::result::init().map_err(|e| Error::NoDevice(format!("cuInit failed: {e}")))?;
        let count = cudarc::driver::result::device::get_count().map_err(Error::driver("counting devices"))?;
        if ordinal >= count as usize {
            return Err(Error::NoDevice(format!(
                "device {ordinal} requested but the driver reports {count} device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(Error::driver("creating a context"))?;
        let attr = |a: Attr| ctx.attribute(a).map(|v| v as u32).map_err(Error::driver("reading device attributes"));
        let cc = (
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let caps = DeviceCaps {
            ordinal,
            name: ctx.name().map_err(Error::driver("reading the device name"))?,
            compute_capability: cc,
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            max_smem_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            target: Target::from_compute_capability(cc),
        };
        // One stream carries every launch and copy, so cudarc's cross-stream event
        // tracking is not needed; without it, no event is recorded per launch and
        // launches can be captured into CUDA graphs (the legacy default stream
        // cannot be captured, hence a stream of our own).
        // SAFETY: called before any buffer exists; all work is ordered on `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(Error::driver("creating a stream"))?;
        Ok(Gpu { ctx, stream, caps, functions: Mutex::new(HashMap::new()) })
    }

    pub fn caps(&self) -> &DeviceCaps {
        &self.caps
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The target kernels must be compiled for to run here.
    pub fn target(&self) -> Result<Target> {
        self.caps.target.ok_or_else(|| {
            Error::NoDevice(format!(
                "{} has compute capability {}.{}; nsa generates for sm_90a (9.0) and sm_100a (10.0)",
                self.caps.name, self.caps.compute_capability.0, self.caps.compute_capability.1
            ))
        })
    }

    /// The function `symbol` of CUBIN `image`, loaded once per `key` (the cache digest),
    /// allowed `dynamic_smem` bytes of dynamic shared memory.
    pub fn function(&self, key: &str, symbol: &str, image: &[u8], dynamic_smem: u32) -> Result<CudaFunction> {
        let mut functions = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = functions.get(key) {
            return Ok(f.clone());
        }
        let module = self
            .ctx
            .load_module(Ptx::from_binary(image.to_vec()))
            .map_err(Error::driver(format!("loading the CUBIN of {symbol}")))?;
        let f = module.load_function(symbol).map_err(Error::driver(format!("finding {symbol} in its CUBIN")))?;
        if dynamic_smem > self.caps.max_smem_per_block {
            return Err(Error::NoDevice(format!(
                "{symbol} needs {dynamic_smem} bytes of shared memory per block; {} allows {}",
                self.caps.name, self.caps.max_smem_per_block
            )));
        }
        if dynamic_smem > 48 * 1024 {
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dynamic_smem as i32,
            )
            .map_err(Error::driver(format!("allowing {symbol} {dynamic_smem} bytes of shared memory")))?;
        }
        functions.insert(key.to_string(), f.clone());
        Ok(f)
    }
}
