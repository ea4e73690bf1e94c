//! One runtime per (device, stream): the first stream of a device opens its
//! primary context (PyTorch's) and the kernel cache; later streams share both,
//! and the modules loaded there, through `Runtime::with_borrowed_stream`.

use crate::error::IntoPy;
use nsa_runtime::device::Gpu;
use nsa_runtime::Runtime;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex, OnceLock};

/// Restores the thread's current CUDA context when dropped. nsa makes the
/// tensors' device's primary context current for its calls; the CUDA runtime
/// reads the current context as the current device, so PyTorch's current device
/// must not change behind its back.
pub struct RestoreContext(cudarc::driver::sys::CUcontext);

impl RestoreContext {
    /// Saves the current context (after checking, once, that the driver loads,
    /// since cudarc panics where it does not, and initialising it).
    pub fn save() -> PyResult<Self> {
        static DRIVER: OnceLock<Result<(), String>> = OnceLock::new();
        DRIVER
            .get_or_init(|| {
                nsa_runtime::device::probe_driver().map_err(|e| e.to_string())?;
                cudarc::driver::result::init().map_err(|e| format!("no usable CUDA device: cuInit failed: {e}"))
            })
            .clone()
            .map_err(pyo3::exceptions::PyRuntimeError::new_err)?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the driver writes one handle (null when no context is current).
        unsafe { cudarc::driver::sys::cuCtxGetCurrent(&mut ctx) }
            .result()
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(format!("reading the current CUDA context: {e}")))?;
        Ok(RestoreContext(ctx))
    }
}

impl Drop for RestoreContext {
    fn drop(&mut self) {
        // SAFETY: the handle was current on this thread when saved (or null).
        let _ = unsafe { cudarc::driver::sys::cuCtxSetCurrent(self.0) };
    }
}

struct Entry {
    ordinal: i32,
    stream: usize,
    rt: Arc<Runtime>,
}

/// Streams seen so far. Servers use a handful (the default, a capture stream,
/// a few side streams), so a list scanned front to back is the fast path.
static RUNTIMES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Beyond this many, the oldest entry of the device is dropped (a stream handle can
/// be freed and reused by its owner; a stale entry is only ever matched by value).
/// Any other entry of the device still shares its cache with the next one.
const MAX_STREAMS: usize = 64;

/// The runtime launching on `stream` (a raw `CUstream` of device `ordinal`'s
/// primary context; 0: the legacy default stream).
pub fn runtime(ordinal: i32, stream: usize) -> PyResult<Arc<Runtime>> {
    let mut list = RUNTIMES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = list.iter().find(|e| e.ordinal == ordinal && e.stream == stream) {
        return Ok(e.rt.clone());
    }
    let base = list.iter().find(|e| e.ordinal == ordinal).map(|e| e.rt.clone());
    let raw = stream as cudarc::driver::sys::CUstream;
    let rt = match base {
        // SAFETY: the caller passed the handle of a live stream of this device
        // (torch's current stream), which its owner keeps alive while in use.
        Some(base) => unsafe { base.with_borrowed_stream(raw) }.py()?,
        None => {
            let ordinal = usize::try_from(ordinal)
                .map_err(|_| PyValueError::new_err(format!("device ordinal {ordinal}: expected ≥ 0")))?;
            // SAFETY: as above.
            let gpu = unsafe { Gpu::on_borrowed_stream(ordinal, raw) }.py()?;
            Runtime::on_gpu(gpu).py()?
        }
    };
    let rt = Arc::new(rt);
    if list.len() >= MAX_STREAMS {
        if let Some(i) = list.iter().position(|e| e.ordinal == ordinal) {
            list.remove(i);
        }
    }
    list.push(Entry { ordinal, stream, rt: rt.clone() });
    Ok(rt)
}

/// What plans need of device `ordinal` (its target and SM count), from any of
/// its runtimes (the legacy default stream's when none exists yet; nothing
/// launches there).
pub fn launch_target(ordinal: i32) -> PyResult<nsa_runtime::ops::LaunchTarget> {
    let _restore = RestoreContext::save()?;
    let known = {
        let list = RUNTIMES.lock().unwrap_or_else(|p| p.into_inner());
        list.iter().find(|e| e.ordinal == ordinal).map(|e| e.rt.launch_target())
    };
    match known {
        Some(t) => Ok(t),
        None => Ok(runtime(ordinal, 0)?.launch_target()),
    }
}

/// The kernel cache's counters, per device seen so far: `{ordinal: {...}}`.
#[pyfunction]
pub fn cache_stats(py: Python<'_>) -> PyResult<Py<pyo3::types::PyDict>> {
    let out = pyo3::types::PyDict::new(py);
    let list = RUNTIMES.lock().unwrap_or_else(|p| p.into_inner());
    for e in list.iter() {
        if out.contains(e.ordinal)? {
            continue;
        }
        let s = e.rt.cache().stats();
        let d = pyo3::types::PyDict::new(py);
        d.set_item("memory_hits", s.memory_hits)?;
        d.set_item("disk_hits", s.disk_hits)?;
        d.set_item("compiles", s.compiles)?;
        out.set_item(e.ordinal, d)?;
    }
    Ok(out.unbind())
}

/// The launch stream the Python wrapper found (torch's current stream).
pub fn launch_stream(stream: Option<usize>) -> PyResult<usize> {
    stream.ok_or_else(|| {
        PyValueError::new_err(
            "`stream`: None, expected the raw handle of the launch stream (torch.cuda.current_stream().cuda_stream)",
        )
    })
}
