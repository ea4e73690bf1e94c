//! [`Runtime`]: one GPU, one kernel cache, and the launch plumbing every typed
//! launcher in [`crate::ops`] shares.

use crate::cache::{CacheConfig, CachedKernel, KernelCache};
use crate::device::Gpu;
use crate::jit::nvrtc::NvrtcCompiler;
use crate::{Error, Result};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchArgs, LaunchConfig, PushKernelArg};
use nsa_kernels::{KernelFamily, KernelSpec, Target};
use std::sync::Arc;

/// How launchers treat device-side input errors (e.g. a slot outside the pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChecks {
    /// Kernels skip bad entries (never touching memory for them) and nothing is
    /// reported: no synchronisation, CUDA-graph capturable. The default.
    Skip,
    /// Kernels count bad entries; the launcher synchronises and returns
    /// [`Error::DeviceRejected`]. For debugging and tests (`NSA_CHECK_DEVICE_INPUTS=1`).
    Report,
}

/// A GPU plus the kernel cache that feeds it.
#[derive(Debug)]
pub struct Runtime {
    gpu: Gpu,
    cache: KernelCache,
    target: Target,
    checks: DeviceChecks,
    /// Rejected-entry counter + example index, allocated when checks are reported.
    status: Option<CudaSlice<u32>>,
}

impl Runtime {
    /// GPU `ordinal`, NVRTC, and the cache configured from the environment
    /// (`NSA_CACHE_DIR`, `NSA_JIT`, `NSA_CHECK_DEVICE_INPUTS`).
    pub fn new(ordinal: usize) -> Result<Runtime> {
        let gpu = Gpu::open(ordinal)?;
        let cache = KernelCache::new(Arc::new(NvrtcCompiler::new()?), CacheConfig::from_env()?);
        let checks = match std::env::var("NSA_CHECK_DEVICE_INPUTS").as_deref() {
            Ok("1") | Ok("true") => DeviceChecks::Report,
            _ => DeviceChecks::Skip,
        };
        Runtime::with_cache(gpu, cache, checks)
    }

    pub fn with_cache(gpu: Gpu, cache: KernelCache, checks: DeviceChecks) -> Result<Runtime> {
        let target = gpu.target()?;
        let mut rt = Runtime { gpu, cache, target, checks: DeviceChecks::Skip, status: None };
        rt.set_checks(checks)?;
        Ok(rt)
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub fn cache(&self) -> &KernelCache {
        &self.cache
    }

    pub fn target(&self) -> Target {
        self.target
    }

    /// The target and SM count launch plans are made for.
    pub fn launch_target(&self) -> crate::ops::LaunchTarget {
        crate::ops::LaunchTarget { target: self.target, sm_count: self.gpu.caps().sm_count }
    }

    pub fn checks(&self) -> DeviceChecks {
        self.checks
    }

    pub fn set_checks(&mut self, checks: DeviceChecks) -> Result<()> {
        if checks == DeviceChecks::Report && self.status.is_none() {
            let status = self.gpu.stream().alloc_zeros(2).map_err(Error::driver("allocating the status word"))?;
            self.status = Some(status);
        }
        self.checks = checks;
        Ok(())
    }

    /// The variant of `family` for this device, compiled (or loaded) and ready to launch.
    pub fn kernel(&self, family: KernelFamily) -> Result<LoadedKernel> {
        let cached = self.cache.get(&KernelSpec::new(family, self.target))?;
        let smem = cached.spec.dynamic_smem_bytes();
        let function = self.gpu.function(&cached.key_digest, &cached.symbol, &cached.image.bytes, smem)?;
        Ok(LoadedKernel { cached, function })
    }

    /// Starts the argument list of `kernel` on this runtime's stream.
    pub fn args<'a>(&'a self, kernel: &'a LoadedKernel) -> LaunchArgs<'a> {
        self.gpu.stream().launch_builder(&kernel.function)
    }

    /// Appends the trailing status pointer and launches `kernel` over `items` work
    /// items (`spec.tokens_per_block()` per block). With [`DeviceChecks::Report`] it
    /// synchronises and turns entries the kernel rejected into an error naming `field`.
    pub fn launch<'a>(
        &'a self,
        kernel: &'a LoadedKernel,
        mut args: LaunchArgs<'a>,
        items: usize,
        field: &'static str,
        expected: &str,
    ) -> Result<()> {
        if items == 0 {
            return Ok(());
        }
        let spec = kernel.cached.spec;
        let per_block = spec.tokens_per_block() as usize;
        let cfg = LaunchConfig {
            grid_dim: (items.div_ceil(per_block) as u32, 1, 1),
            block_dim: (spec.block_threads(), 1, 1),
            shared_mem_bytes: spec.dynamic_smem_bytes(),
        };
        let stream = self.gpu.stream();
        let report = match (&self.status, self.checks) {
            (Some(status), DeviceChecks::Report) => Some(status),
            _ => None,
        };
        // The counter only grows: the delta across this launch is what it rejected.
        let before = match report {
            Some(status) => {
                args.arg(status);
                stream.clone_dtoh(status).map_err(Error::driver("reading the status word"))?[0]
            }
            None => {
                args.arg(&NULL_STATUS);
                0
            }
        };
        // SAFETY: launchers check every argument's size and alignment against the
        // kernel's signature before calling here.
        unsafe { args.launch(cfg) }.map_err(Error::driver(format!("launching {}", kernel.cached.id)))?;
        let Some(status) = report else { return Ok(()) };
        let s = stream.clone_dtoh(status).map_err(Error::driver("reading the status word"))?;
        let count = s[0].wrapping_sub(before);
        if count == 0 {
            return Ok(());
        }
        Err(Error::DeviceRejected {
            id: kernel.cached.id.clone(),
            field,
            count,
            example: s[1],
            expected: expected.to_string(),
        })
    }
}

/// Passed as the status pointer when nothing is reported: kernels test for null.
static NULL_STATUS: u64 = 0;

/// A cached kernel loaded on the device.
#[derive(Debug, Clone)]
pub struct LoadedKernel {
    pub cached: Arc<CachedKernel>,
    pub function: CudaFunction,
}
