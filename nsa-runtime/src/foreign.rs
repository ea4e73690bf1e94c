//! Device buffers that nsa does not own (a PyTorch or candle allocation, a
//! server's memory pool), seen through the cudarc views every nsa call takes,
//! without a copy and never freed by nsa.
//!
//! ```ignore
//! // A server's KV pool of `bytes` bytes at `ptr`, on the runtime's device:
//! let mut pool = unsafe { ForeignBuffer::<u8>::from_raw("kv_cache", rt.gpu().stream(), ptr, bytes)? };
//! kv_cache::store_mla(&rt, &k_nope, &k_rope, &loc, &mut MlaCacheMut::Fp8(pool.view_mut()))?;
//! drop(pool); // the memory stays the server's
//! ```
//!
//! A buffer nsa allocated itself (a `CudaSlice`) needs none of this: its views
//! work as they are.

use crate::error::invalid;
use crate::{Error, Result};
use cudarc::driver::sys::{self, CUdeviceptr, CUpointer_attribute};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// The alignment every nsa kernel may assume of a buffer's start (16-byte vector
/// loads and stores).
pub const BASE_ALIGN: u64 = 16;

/// `len` elements of `T` at a device address nsa does not own. Views of it go
/// wherever nsa takes a `CudaView`/`CudaViewMut`; dropping it leaves the memory
/// to its owner.
#[derive(Debug)]
pub struct ForeignBuffer<T> {
    name: &'static str,
    slice: ManuallyDrop<CudaSlice<T>>,
}

impl<T> ForeignBuffer<T> {
    /// Wraps `len` elements at `ptr` for launches on `stream`, after checking
    /// what can be checked: a non-null pointer aligned to [`BASE_ALIGN`] (and to
    /// `T`), a length whose byte size does not overflow, memory of `stream`'s
    /// device, and an allocation that holds all `len` elements past `ptr`. Each
    /// failure is an error naming `name`.
    ///
    /// # Safety
    /// The memory must stay allocated, and must not be used by its owner in a way
    /// that races nsa's launches, while this buffer or a view of it is in use; the
    /// caller orders the owner's work with `stream`.
    pub unsafe fn from_raw(name: &'static str, stream: &Arc<CudaStream>, ptr: CUdeviceptr, len: usize) -> Result<Self> {
        let bytes = check_shape::<T>(name, ptr, len)?;
        if bytes > 0 {
            check_on_device(name, stream, ptr, bytes)?;
        }
        // SAFETY: checked above to lie inside one live allocation of this device;
        // the caller keeps it alive. The slice is never dropped (see `Drop`).
        let slice = unsafe { stream.upgrade_device_ptr::<T>(ptr, len) };
        Ok(ForeignBuffer { name, slice: ManuallyDrop::new(slice) })
    }

    /// [`from_raw`](Self::from_raw) without its driver queries (device and
    /// allocation range), for memory whose device and extent a producer already
    /// vouches for: a DLPack tensor of the stream's device (the Python package's
    /// path, where three pointer queries per tensor would cost more than the
    /// launch). The host checks (null, alignment, overflow) remain.
    ///
    /// # Safety
    /// As [`from_raw`](Self::from_raw), and `[ptr, ptr + len · size_of::<T>())`
    /// must lie inside one live allocation of `stream`'s device.
    pub unsafe fn from_raw_trusted(
        name: &'static str,
        stream: &Arc<CudaStream>,
        ptr: CUdeviceptr,
        len: usize,
    ) -> Result<Self> {
        check_shape::<T>(name, ptr, len)?;
        // SAFETY: the caller vouches for the device and the extent; the slice is
        // never dropped (see `Drop`).
        let slice = unsafe { stream.upgrade_device_ptr::<T>(ptr, len) };
        Ok(ForeignBuffer { name, slice: ManuallyDrop::new(slice) })
    }

    /// The name errors give this buffer.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn len(&self) -> usize {
        self.slice.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    /// A read view for nsa's calls.
    pub fn view(&self) -> CudaView<'_, T> {
        self.slice.slice(..)
    }

    /// A write view for nsa's calls.
    pub fn view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice.slice_mut(..)
    }
}

impl<T> Drop for ForeignBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; leaking hands the pointer back without freeing it.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        let _ = slice.leak();
    }
}

/// The host-side checks of [`ForeignBuffer::from_raw`]; returns the size in bytes.
pub fn check_shape<T>(name: &'static str, ptr: CUdeviceptr, len: usize) -> Result<u64> {
    let elem = std::mem::size_of::<T>() as u64;
    let align = BASE_ALIGN.max(std::mem::align_of::<T>() as u64);
    if ptr == 0 {
        return Err(invalid(name, "a null pointer", "the device address of the buffer"));
    }
    if ptr % align != 0 {
        return Err(invalid(
            name,
            format!("pointer {ptr:#x}"),
            format!("an address aligned to {align} bytes (nsa's kernels load {BASE_ALIGN} bytes at a time); pass an aligned base and offset into it"),
        ));
    }
    (len as u64).checked_mul(elem).filter(|b| ptr.checked_add(*b).is_some()).ok_or_else(|| {
        invalid(
            name,
            format!("{len} elements of {elem} bytes at {ptr:#x}"),
            "a length whose byte range fits in 64 bits",
        )
    })
}

/// That `[ptr, ptr + bytes)` is device memory of `stream`'s device inside one allocation.
fn check_on_device(name: &'static str, stream: &Arc<CudaStream>, ptr: CUdeviceptr, bytes: u64) -> Result<()> {
    stream.context().bind_to_thread().map_err(Error::driver("making the context current"))?;
    let attribute = |attr: CUpointer_attribute| -> Result<u64> {
        let mut value = 0u64;
        // SAFETY: every attribute read here writes at most 8 bytes.
        unsafe { sys::cuPointerGetAttribute((&mut value as *mut u64).cast(), attr, ptr) }
            .result()
            .map_err(|e| invalid(name, format!("pointer {ptr:#x}"), format!("device memory the driver knows ({e})")))?;
        Ok(value)
    };
    let ordinal = attribute(CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)? as u32 as usize;
    let device = stream.context().ordinal();
    if ordinal != device {
        return Err(invalid(
            name,
            format!("memory of device {ordinal}"),
            format!("memory of device {device}, where the stream runs"),
        ));
    }
    let start = attribute(CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)?;
    let size = attribute(CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE)?;
    let available = (start + size).saturating_sub(ptr);
    if bytes > available {
        return Err(invalid(
            name,
            format!("{bytes} bytes at {ptr:#x}"),
            format!("a range inside its allocation, which holds {available} bytes from there"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_checks_name_the_buffer() {
        let err = check_shape::<u16>("q", 0, 4).unwrap_err().to_string();
        assert!(err.contains("`q`") && err.contains("null"), "{err}");
        let err = check_shape::<f32>("lse", 0x1000_0004, 4).unwrap_err().to_string();
        assert!(err.contains("`lse`") && err.contains("aligned to 16"), "{err}");
        let err = check_shape::<u64>("table", 0x1000, usize::MAX).unwrap_err().to_string();
        assert!(err.contains("`table`") && err.contains("64 bits"), "{err}");
        assert_eq!(check_shape::<u16>("q", 0x1000, 8).unwrap(), 16);
        assert_eq!(check_shape::<u8>("q", 0x1000, 0).unwrap(), 0);
    }
}
