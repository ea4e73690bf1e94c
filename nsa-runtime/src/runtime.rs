//! [`Runtime`]: one GPU, one kernel cache, and the launch plumbing every typed
//! launcher in [`crate::ops`] shares.

use crate::cache::{CacheConfig, CachedKernel, KernelCache};
use crate::device::Gpu;
use crate::error::invalid;
use crate::jit::nvrtc::NvrtcCompiler;
use crate::{Error, Result};
use cudarc::driver::{sys, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use nsa_kernels::{KernelFamily, KernelSpec, Target};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

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

/// A GPU, the stream it launches on, and the kernel cache that feeds it.
///
/// `Send + Sync`. Launches through one runtime go to its stream in call order; to
/// launch from several threads or onto several streams, make a runtime per
/// stream with [`with_stream`](Self::with_stream): they share the kernel cache
/// (one compile or disk load per kernel) and the loaded modules (one load per
/// kernel and context), and each keeps its own settings.
#[derive(Debug)]
pub struct Runtime {
    gpu: Gpu,
    cache: Arc<KernelCache>,
    target: Target,
    checks: DeviceChecks,
    /// Rejected-entry counter + example index, allocated when checks are reported.
    status: Option<CudaSlice<u32>>,
    /// Launch kernels that wait for their predecessor with programmatic dependent
    /// launch ([`Runtime::set_pdl`]).
    pdl: bool,
    /// Live [`Runtime::hold_pdl`] guards that hold PDL off (a count, so guards of
    /// several threads may drop in any order).
    pdl_holds: AtomicU32,
    /// [`Runtime::work_counter`]'s words, allocated on first use.
    work_counter: OnceLock<CudaSlice<u32>>,
}

impl Runtime {
    /// GPU `ordinal`, NVRTC, and the cache configured from the environment
    /// (`NSA_CACHE_DIR`, `NSA_JIT`, `NSA_CHECK_DEVICE_INPUTS`, `NSA_PDL`).
    pub fn new(ordinal: usize) -> Result<Runtime> {
        Runtime::on_gpu(Gpu::open(ordinal)?)
    }

    /// Like [`new`](Self::new) on a [`Gpu`] the caller set up, e.g. on the
    /// caller's stream ([`Gpu::on_stream`], [`Gpu::on_borrowed_stream`]).
    pub fn on_gpu(gpu: Gpu) -> Result<Runtime> {
        let cache = KernelCache::new(Arc::new(NvrtcCompiler::new()?), CacheConfig::from_env()?);
        let checks = match env_flag("NSA_CHECK_DEVICE_INPUTS", CHECKS_UNSET)? {
            Some(true) => DeviceChecks::Report,
            Some(false) | None => DeviceChecks::Skip,
        };
        let mut rt = Runtime::with_cache(gpu, cache, checks)?;
        if let Some(on) = env_flag("NSA_PDL", PDL_UNSET)? {
            rt.set_pdl(on)?;
        }
        Ok(rt)
    }

    /// A runtime on `gpu` over `cache` (owned, or shared with other runtimes).
    pub fn with_cache(gpu: Gpu, cache: impl Into<Arc<KernelCache>>, checks: DeviceChecks) -> Result<Runtime> {
        let cache = cache.into();
        let target = gpu.target()?;
        // PDL by default where the target has it (H200: 1 × 128K top-k 17.0 -> 15.6 µs,
        // December 2026); its kernels wait on the device either way.
        let pdl = target.has_pdl();
        let mut rt = Runtime {
            gpu,
            cache,
            target,
            checks: DeviceChecks::Skip,
            status: None,
            pdl,
            pdl_holds: AtomicU32::new(0),
            work_counter: OnceLock::new(),
        };
        rt.set_checks(checks)?;
        Ok(rt)
    }

    /// The same device, kernel cache, loaded modules and settings, launching on
    /// `stream` (a stream of the same context; another is an error naming it).
    pub fn with_stream(&self, stream: Arc<cudarc::driver::CudaStream>) -> Result<Runtime> {
        let mut rt = Runtime::with_cache(self.gpu.with_stream(stream)?, self.cache.clone(), self.checks)?;
        rt.pdl = self.pdl;
        Ok(rt)
    }

    /// [`with_stream`](Self::with_stream) for a raw `CUstream` another library
    /// owns (PyTorch's current stream; null: the legacy default stream).
    ///
    /// # Safety
    /// As [`Gpu::on_borrowed_stream`].
    pub unsafe fn with_borrowed_stream(&self, stream: cudarc::driver::sys::CUstream) -> Result<Runtime> {
        // SAFETY: forwarded from the caller.
        let gpu = unsafe { self.gpu.with_borrowed_stream(stream) }?;
        let mut rt = Runtime::with_cache(gpu, self.cache.clone(), self.checks)?;
        rt.pdl = self.pdl;
        Ok(rt)
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The kernel cache, shared with the runtimes made by [`with_stream`](Self::with_stream).
    pub fn shared_cache(&self) -> &Arc<KernelCache> {
        &self.cache
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

    pub fn pdl(&self) -> bool {
        self.pdl
    }

    /// Holds PDL off, when `hold`, for this runtime's launches until the returned
    /// guard drops (they wait for the whole previous kernel).
    pub(crate) fn hold_pdl(&self, hold: bool) -> PdlHold<'_> {
        if hold {
            self.pdl_holds.fetch_add(1, Ordering::Relaxed);
        }
        PdlHold { holds: &self.pdl_holds, held: hold }
    }

    /// Programmatic dependent launch (PDL) for every kernel
    /// ([`KernelSpec::waits_for_prior_grids`]): a launch may start while the previous
    /// kernel of the stream still runs, and its blocks wait on the device until that
    /// kernel is done, so the launch latency overlaps the previous kernel. On by
    /// default on targets that have it (NVIDIA); `NSA_PDL=0` or `set_pdl(false)`
    /// turns it off. The layer's sparse steps (`NsaLayer::forward`) hold it off
    /// above [`crate::layer::PDL_MAX_ROWS`] query rows.
    pub fn set_pdl(&mut self, on: bool) -> Result<()> {
        if on && !self.target.has_pdl() {
            return Err(invalid(
                "pdl",
                format!("on for {}", self.target),
                "an NVIDIA target (sm_90a, sm_100a); leave it off on this GPU",
            ));
        }
        self.pdl = on;
        Ok(())
    }

    /// Two u32 words, zero between launches, for a kernel whose CTAs take work from
    /// an atomic counter and whose last CTA zeroes it again (the dense warp-group
    /// kernel): this runtime's own, so launches in its stream's order never share
    /// them with another stream's. None while the stream captures a graph: the
    /// launch then allocates its own in the graph (the runtime's words, allocated
    /// there, would belong to the graph).
    pub(crate) fn work_counter(&self) -> Result<Option<&CudaSlice<u32>>> {
        let stream = self.gpu.stream();
        let capturing = stream.capture_status().map_err(Error::driver("querying the stream's capture status"))?
            != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        if capturing {
            return Ok(None);
        }
        if let Some(words) = self.work_counter.get() {
            return Ok(Some(words));
        }
        let words = stream.alloc_zeros(2).map_err(Error::driver("allocating the work counter"))?;
        // Another thread may have set it meanwhile: either is zero and unused.
        Ok(Some(self.work_counter.get_or_init(|| words)))
    }

    /// The variant of `family` for this device, compiled (or loaded) and ready to launch.
    pub fn kernel(&self, family: KernelFamily) -> Result<LoadedKernel> {
        let cached = self.cache.get(&KernelSpec::new(family, self.target))?;
        let smem = cached.spec.dynamic_smem_bytes();
        let function = self.gpu.function(&cached.key_digest, &cached.symbol, &cached.image.bytes, smem)?;
        Ok(LoadedKernel { cached, function })
    }

    /// Starts the argument list of a launch on this runtime's stream.
    pub(crate) fn args(&self) -> KernelArgs<'_> {
        KernelArgs::new(self.gpu.stream())
    }

    /// Appends the trailing status pointer and launches `kernel` over `items` work
    /// items (`spec.tokens_per_block()` per block) through `cuLaunchKernelEx`: with
    /// PDL on ([`Runtime::set_pdl`]) the launch may start while the previous kernel
    /// of the stream still runs (every kernel waits for it at its top). With
    /// [`DeviceChecks::Report`] it synchronises and turns entries the kernel rejected
    /// into an error naming `field`.
    pub(crate) fn launch(
        &self,
        kernel: &LoadedKernel,
        args: KernelArgs<'_>,
        items: usize,
        field: &'static str,
        expected: &str,
    ) -> Result<()> {
        self.launch_clustered(kernel, args, items, 1, field, expected)
    }

    /// [`Runtime::launch`] with the blocks grouped into thread-block clusters of
    /// `cluster` (1: none), set as a launch attribute: `items` must come to a whole
    /// number of clusters.
    pub(crate) fn launch_clustered(
        &self,
        kernel: &LoadedKernel,
        mut args: KernelArgs<'_>,
        items: usize,
        cluster: u32,
        field: &'static str,
        expected: &str,
    ) -> Result<()> {
        if items == 0 {
            return Ok(());
        }
        let stream = self.gpu.stream();
        let report = match (&self.status, self.checks) {
            (Some(status), DeviceChecks::Report) => Some(status),
            _ => None,
        };
        // The counter only grows: the delta across this launch is what it rejected.
        let before = match report {
            Some(status) => stream.clone_dtoh(status).map_err(Error::driver("reading the status word"))?[0],
            None => 0,
        };
        // Null when nothing is reported: kernels test for it.
        args.device_address(report.map_or(0, |s| s.device_ptr(stream).0));
        self.launch_ex(kernel, &mut args, items, cluster)
            .map_err(Error::driver(format!("launching {}", kernel.cached.id)))?;
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

    /// `cuLaunchKernelEx` of `kernel` over `items` work items with its launch
    /// attributes: PDL where on and not held, and the cluster size.
    fn launch_ex(
        &self,
        kernel: &LoadedKernel,
        args: &mut KernelArgs<'_>,
        items: usize,
        cluster: u32,
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        let spec = kernel.cached.spec;
        let held = self.pdl_holds.load(Ordering::Relaxed) > 0;
        let pdl = self.pdl && !held && spec.waits_for_prior_grids();
        // SAFETY: zeroed attributes are valid; the union field written is the one
        // each attribute id selects.
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        let mut n_attrs = 0;
        if pdl {
            attrs[n_attrs].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n_attrs].value.programmaticStreamSerializationAllowed = 1;
            n_attrs += 1;
        }
        if cluster > 1 {
            attrs[n_attrs].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[n_attrs].value.clusterDim.x = cluster;
            attrs[n_attrs].value.clusterDim.y = 1;
            attrs[n_attrs].value.clusterDim.z = 1;
            n_attrs += 1;
        }
        let stream = self.gpu.stream();
        let config = sys::CUlaunchConfig {
            gridDimX: items.div_ceil(spec.tokens_per_block() as usize) as u32,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: spec.block_threads(),
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: spec.dynamic_smem_bytes(),
            hStream: stream.cu_stream(),
            attrs: if n_attrs > 0 { attrs.as_mut_ptr() } else { std::ptr::null_mut() },
            numAttrs: n_attrs as u32,
        };
        stream.context().bind_to_thread()?;
        let mut ptrs = args.pointers();
        // SAFETY: `ptrs` holds one pointer per kernel parameter, each to a live value
        // of the type the kernel declares (launchers check every buffer's size and
        // alignment and build the parameter structs from the kernels' mirrored
        // layouts); `args`, the config and the attributes outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(&config, kernel.function.cu_function(), ptrs.as_mut_ptr(), std::ptr::null_mut())
        }
        .result()
    }
}

/// Gives back the hold [`Runtime::hold_pdl`] took, if any, when dropped.
pub(crate) struct PdlHold<'a> {
    holds: &'a AtomicU32,
    held: bool,
}

impl Drop for PdlHold<'_> {
    fn drop(&mut self) {
        if self.held {
            self.holds.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A kernel's parameters in its order, each passed to the launch by address: values
/// by their own address (read at launch), device buffers by an address held here.
/// Held inline: a launch allocates nothing.
#[derive(Debug)]
pub(crate) struct KernelArgs<'a> {
    stream: &'a CudaStream,
    slots: [ArgSlot; MAX_KERNEL_PARAMS],
    len: usize,
}

#[derive(Clone, Copy, Debug)]
enum ArgSlot {
    Value(*const c_void),
    Device(u64),
}

/// More than the widest kernel takes (the step store: 13, status included).
const MAX_KERNEL_PARAMS: usize = 16;

impl<'a> KernelArgs<'a> {
    fn new(stream: &'a CudaStream) -> Self {
        KernelArgs { stream, slots: [ArgSlot::Device(0); MAX_KERNEL_PARAMS], len: 0 }
    }

    /// Appends `value`, passed by value to the kernel (read at launch).
    pub(crate) fn arg<T: DeviceRepr>(&mut self, value: &'a T) -> &mut Self {
        self.push(ArgSlot::Value(value as *const T as *const c_void))
    }

    /// Appends the device address of `buf`, passed as a pointer parameter.
    pub(crate) fn buf<T>(&mut self, buf: &'a impl DevicePtr<T>) -> &mut Self {
        let (ptr, _record) = buf.device_ptr(self.stream);
        self.device_address(ptr)
    }

    fn device_address(&mut self, ptr: u64) -> &mut Self {
        self.push(ArgSlot::Device(ptr))
    }

    fn push(&mut self, slot: ArgSlot) -> &mut Self {
        assert!(self.len < MAX_KERNEL_PARAMS, "raise MAX_KERNEL_PARAMS for a kernel with more parameters");
        self.slots[self.len] = slot;
        self.len += 1;
        self
    }

    /// The parameter pointers `cuLaunchKernelEx` takes, valid while `self` is
    /// neither moved nor changed.
    fn pointers(&mut self) -> [*mut c_void; MAX_KERNEL_PARAMS] {
        let mut ptrs = [std::ptr::null_mut(); MAX_KERNEL_PARAMS];
        for (ptr, slot) in ptrs.iter_mut().zip(&mut self.slots[..self.len]) {
            *ptr = match slot {
                ArgSlot::Value(v) => *v as *mut c_void,
                ArgSlot::Device(addr) => addr as *mut u64 as *mut c_void,
            };
        }
        ptrs
    }
}

/// A cached kernel loaded on the device.
#[derive(Debug, Clone)]
pub struct LoadedKernel {
    pub cached: Arc<CachedKernel>,
    pub function: CudaFunction,
}

/// An on/off environment variable: `1`/`true` on, `0`/`false` off, unset `None`;
/// anything else is an error naming the variable and what unset means.
/// What an unset `NSA_PDL` means.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Runtime>();
};

const PDL_UNSET: &str = "programmatic dependent launch on where the target has it";
/// What an unset `NSA_CHECK_DEVICE_INPUTS` means.
const CHECKS_UNSET: &str = "off: kernels do not count rejected entries";

/// Every environment variable nsa reads.
pub const ENV_VARS: [&str; 9] = [
    crate::cache::ENV_CACHE_DIR,
    crate::cache::ENV_JIT,
    crate::jit::nvrtc_lib::ENV_NVRTC_PATH,
    "NSA_HIP_CLANG",
    "NSA_CHECK_DEVICE_INPUTS",
    "NSA_PDL",
    "NSA_LOG",
    "NSA_SKIP_HIP",
    "NSA_COMPILE_ALL_DUMP",
];

/// Checks every `NSA_*` variable of the process environment up front, whatever
/// will use it: a flag with a value other than those documented is an error
/// naming it, and so is an unknown `NSA_*` name that looks like a misspelling of
/// one nsa reads (a typo must not silently leave a setting at its default).
pub fn check_environment() -> Result<()> {
    check_environment_with(std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v))))
}

fn check_environment_with(vars: impl Iterator<Item = (String, std::ffi::OsString)>) -> Result<()> {
    let vars: Vec<(String, std::ffi::OsString)> = vars.collect();
    let get = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.to_string_lossy().into_owned());
    parse_flag("NSA_PDL", get("NSA_PDL").as_deref(), PDL_UNSET)?;
    parse_flag("NSA_CHECK_DEVICE_INPUTS", get("NSA_CHECK_DEVICE_INPUTS").as_deref(), CHECKS_UNSET)?;
    CacheConfig::from_vars(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))?;
    for (name, _) in vars.iter().filter(|(k, _)| k.starts_with("NSA_") && !ENV_VARS.contains(&k.as_str())) {
        match nsa_kernels::config::nearest_name(name, &ENV_VARS) {
            Some(near) => {
                return Err(invalid(
                    "environment",
                    name.clone(),
                    format!("a variable nsa reads: did you mean {near}? (all: {})", ENV_VARS.join(", ")),
                ))
            }
            None => tracing::warn!(name, "not a variable nsa reads; ignored"),
        }
    }
    Ok(())
}

fn env_flag(name: &'static str, unset_means: &str) -> Result<Option<bool>> {
    parse_flag(name, std::env::var(name).ok().as_deref(), unset_means)
}

fn parse_flag(name: &'static str, value: Option<&str>, unset_means: &str) -> Result<Option<bool>> {
    match value {
        None => Ok(None),
        Some("1") | Some("true") => Ok(Some(true)),
        Some("0") | Some("false") => Ok(Some(false)),
        Some(other) => Err(invalid(
            name,
            format!("{other:?}"),
            format!("1 or true (on), 0 or false (off), or unset ({unset_means})"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_check_names_bad_values_and_misspelt_variables() {
        let env = |pairs: &[(&str, &str)]| {
            let v: Vec<(String, std::ffi::OsString)> = pairs.iter().map(|(k, v)| (k.to_string(), v.into())).collect();
            check_environment_with(v.into_iter())
        };
        assert!(env(&[("NSA_PDL", "1"), ("NSA_JIT", "off"), ("NSA_OTHER_TOOL_SETTING", "x")]).is_ok());
        let err = env(&[("NSA_PDL", "maybe")]).unwrap_err().to_string();
        assert!(err.contains("NSA_PDL") && err.contains("maybe"), "{err}");
        let err = env(&[("NSA_JIT", "of")]).unwrap_err().to_string();
        assert!(err.contains("NSA_JIT"), "{err}");
        let err = env(&[("NSA_JTI", "off")]).unwrap_err().to_string();
        assert!(err.contains("NSA_JTI") && err.contains("did you mean NSA_JIT"), "{err}");
    }

    #[test]
    fn flags_take_one_zero_true_false_or_unset_and_reject_the_rest() {
        assert_eq!(parse_flag("NSA_PDL", None, "").unwrap(), None);
        assert_eq!(parse_flag("NSA_PDL", Some("1"), "").unwrap(), Some(true));
        assert_eq!(parse_flag("NSA_PDL", Some("false"), "").unwrap(), Some(false));
        let err = parse_flag("NSA_CHECK_DEVICE_INPUTS", Some("yes"), "x").unwrap_err().to_string();
        assert!(
            err.contains("NSA_CHECK_DEVICE_INPUTS") && err.contains("\"yes\"") && err.contains("0 or false"),
            "{err}"
        );
    }
}
