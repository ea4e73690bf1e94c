//! The CUDA device: probing the driver without panicking, reading its caps once,
//! and loading compiled images into launchable functions.

use crate::{Error, Result};
use cudarc::driver::sys::{CUdevice_attribute as Attr, CUstream};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
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

/// One GPU, the stream nsa launches on, and the functions loaded on it (one module
/// per kernel).
///
/// The stream is nsa's own ([`open`](Self::open)) or the caller's
/// ([`on_stream`](Self::on_stream), [`on_borrowed_stream`](Self::on_borrowed_stream)):
/// every launch and copy nsa makes goes to it, in the order of the calls, and
/// nsa never synchronises it on the launch path (only where a call says so, e.g.
/// [`DeviceChecks::Report`](crate::DeviceChecks::Report)). `Send + Sync`; several
/// `Gpu`s made with [`with_stream`](Self::with_stream) share one table of loaded
/// functions, so each kernel's module is loaded once per context.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    caps: DeviceCaps,
    functions: Arc<Mutex<HashMap<String, CudaFunction>>>,
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Gpu>();
};

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("caps", &self.caps).finish_non_exhaustive()
    }
}

impl Gpu {
    /// Opens device `ordinal` (its primary context, the one PyTorch and candle
    /// use) with a stream of nsa's own. Errors (never panics) without a driver or device.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        let ctx = primary_context(ordinal)?;
        // One stream carries every launch and copy, so cudarc's cross-stream event
        // tracking is not needed; without it, no event is recorded per launch and
        // launches can be captured into CUDA graphs (the legacy default stream
        // cannot be captured, hence a stream of our own).
        // SAFETY: called before any buffer exists; all work is ordered on `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(Error::driver("creating a stream"))?;
        Gpu::on_stream(stream)
    }

    /// Launches on `stream`, a cudarc stream the caller owns (candle's, or one a
    /// server made), in that stream's context. nsa keeps the `Arc`, so the stream
    /// lives as long as this `Gpu`. nsa's launches are ordered by this stream alone:
    /// they take no part in cudarc's cross-stream event tracking, so work on other
    /// streams that reads or writes nsa's buffers is ordered by the caller. The
    /// context should not track events (`CudaContext::disable_event_tracking`,
    /// before its first buffer): cudarc otherwise records events around nsa's
    /// copies, and capturing them into a CUDA graph fails.
    pub fn on_stream(stream: Arc<CudaStream>) -> Result<Gpu> {
        let ctx = stream.context().clone();
        if ctx.is_event_tracking() {
            tracing::warn!(
                target: "nsa::device",
                "the stream's context tracks events: nsa's launches take no part in that tracking (order other \
                 streams' work on nsa's buffers yourself), its copies record events, and capturing them into a \
                 CUDA graph fails (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED); call \
                 CudaContext::disable_event_tracking before allocating, if all work is ordered on one stream"
            );
        }
        let caps = caps_of(&ctx)?;
        Ok(Gpu { ctx, stream, caps, functions: Arc::default() })
    }

    /// Launches on `stream`, a raw `CUstream` another library owns (e.g.
    /// `torch.cuda.current_stream().cuda_stream`), of device `ordinal`'s primary
    /// context. A null handle is that context's legacy default stream (PyTorch's
    /// default), which works but cannot be captured into CUDA graphs. A stream of
    /// another context is an error naming `stream`.
    ///
    /// # Safety
    /// `stream` must be a valid stream, and its owner must keep it alive while this
    /// `Gpu` (or a runtime made from it) is used; ordering nsa's work with work the
    /// owner submits elsewhere is the caller's.
    pub unsafe fn on_borrowed_stream(ordinal: usize, stream: CUstream) -> Result<Gpu> {
        let ctx = primary_context(ordinal)?;
        // SAFETY: no buffer of this context object exists yet; every nsa launch goes
        // to the one stream below.
        unsafe { ctx.disable_event_tracking() };
        // SAFETY: forwarded from the caller.
        let stream = unsafe { borrow_stream(&ctx, ordinal, stream) }?;
        Gpu::on_stream(stream)
    }

    /// [`with_stream`](Self::with_stream) for a raw `CUstream` another library
    /// owns (null: the legacy default stream), checked to belong to this context.
    ///
    /// # Safety
    /// As [`on_borrowed_stream`](Self::on_borrowed_stream).
    pub unsafe fn with_borrowed_stream(&self, stream: CUstream) -> Result<Gpu> {
        // SAFETY: forwarded from the caller.
        let stream = unsafe { borrow_stream(&self.ctx, self.caps.ordinal, stream) }?;
        self.with_stream(stream)
    }

    /// The same device and loaded functions, launching on `stream` (of the same
    /// context; another context's stream is an error naming `stream`).
    pub fn with_stream(&self, stream: Arc<CudaStream>) -> Result<Gpu> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(crate::error::invalid(
                "stream",
                format!("{:p}", stream.cu_stream()),
                format!("a stream of the context this GPU runs in (device {})", self.caps.ordinal),
            ));
        }
        Ok(Gpu { ctx: self.ctx.clone(), stream, caps: self.caps.clone(), functions: self.functions.clone() })
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

/// Device `ordinal`'s primary context, after checking that a driver and the device exist.
fn primary_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    probe_driver()?;
    cudarc::driver::result::init().map_err(|e| Error::NoDevice(format!("cuInit failed: {e}")))?;
    let count = cudarc::driver::result::device::get_count().map_err(Error::driver("counting devices"))?;
    if ordinal >= count as usize {
        return Err(Error::NoDevice(format!("device {ordinal} requested but the driver reports {count} device(s)")));
    }
    CudaContext::new(ordinal).map_err(Error::driver("creating a context"))
}

fn caps_of(ctx: &Arc<CudaContext>) -> Result<DeviceCaps> {
    let attr = |a: Attr| ctx.attribute(a).map(|v| v as u32).map_err(Error::driver("reading device attributes"));
    let cc = (
        attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    Ok(DeviceCaps {
        ordinal: ctx.ordinal(),
        name: ctx.name().map_err(Error::driver("reading the device name"))?,
        compute_capability: cc,
        sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        max_smem_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        target: Target::from_compute_capability(cc),
    })
}

/// `stream` (null: the legacy default stream) wrapped without taking ownership,
/// after checking it belongs to `ctx`.
///
/// # Safety
/// `stream` is valid and outlives every use of the wrapper.
unsafe fn borrow_stream(ctx: &Arc<CudaContext>, ordinal: usize, stream: CUstream) -> Result<Arc<CudaStream>> {
    if stream.is_null() {
        return Ok(ctx.default_stream());
    }
    let mut owner: cudarc::driver::sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `stream` is valid (the caller's promise); the driver writes one handle.
    unsafe { cudarc::driver::sys::cuStreamGetCtx(stream, &mut owner) }
        .result()
        .map_err(Error::driver("reading the context of the stream"))?;
    if owner != ctx.cu_ctx() {
        return Err(crate::error::invalid(
            "stream",
            format!("{stream:p}"),
            format!("a stream of device {ordinal}'s primary context (this one belongs to another context)"),
        ));
    }
    // SAFETY: checked to belong to this context; kept alive by the caller.
    Ok(unsafe { ctx.wrap_borrowed_stream(stream) })
}
