//! Typed launchers, one module per kernel family. Every argument is checked on the
//! host (sizes, strides, alignment) before anything is launched.

pub mod dense_prefill;
pub mod indexer;
pub mod kv_cache;
pub mod metadata;
pub mod sparse_decode;
pub mod sparse_prefill;
pub mod topk;

use crate::Result;
use cudarc::driver::{CudaStream, DevicePtr};
use nsa_kernels::Target;

/// What a launch plan needs to know about the GPU: the kernel variants differ by
/// target, the split counts by SM count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchTarget {
    pub target: Target,
    pub sm_count: u32,
}

/// `count` rows of `width` elements, `stride` elements apart, on the device.
#[derive(Debug)]
pub struct Rows<'a, T> {
    pub data: cudarc::driver::CudaView<'a, T>,
    pub count: usize,
    pub width: usize,
    pub stride: usize,
}

impl<'a, T> Rows<'a, T> {
    /// Dense rows (stride = width).
    pub fn dense(data: cudarc::driver::CudaView<'a, T>, width: usize) -> Self {
        let count = data.len() / width.max(1);
        Rows { data, count, width, stride: width }
    }

    /// Checks the rows fit the view and allow 16-byte vector access.
    pub(crate) fn check(&self, field: &'static str, stream: &CudaStream) -> Result<()> {
        let elem = std::mem::size_of::<T>();
        let per_vec = 16 / elem;
        if self.stride < self.width || self.stride % per_vec != 0 {
            return Err(invalid(
                field,
                format!("stride {}", self.stride),
                format!("a row stride ≥ the row width {} and a multiple of {per_vec} elements (16 bytes)", self.width),
            ));
        }
        let needed = if self.count == 0 { 0 } else { (self.count - 1) * self.stride + self.width };
        if self.data.len() < needed {
            return Err(invalid(
                field,
                format!("{} elements", self.data.len()),
                format!(
                    "at least {needed} elements for {} rows of {} with stride {}",
                    self.count, self.width, self.stride
                ),
            ));
        }
        if self.count == 0 {
            return Ok(()); // nothing is read; an empty view may start anywhere
        }
        check_aligned(field, &self.data, 16, stream)
    }
}

/// Heads per CTA of a sparse MLA kernel on `target` (`head_tile`: the family's rule,
/// `sparse_mla_head_tile` or `sparse_prefill_head_tile`; both accept the same head
/// counts), after checking `heads` and `topk`.
pub(crate) fn check_sparse_mla_heads_topk(
    heads: u32,
    topk: u32,
    target: Target,
    head_tile: fn(u32, Target) -> Option<u32>,
) -> Result<u32> {
    let tile = head_tile(heads, target).ok_or_else(|| {
        invalid("heads", heads.to_string(), "1..=16, or a multiple of 16 up to 128 (query heads on this GPU)")
    })?;
    if topk == 0 || topk % nsa_kernels::spec::DECODE_BLOCK_TOKENS != 0 || topk > 4096 {
        return Err(invalid(
            "topk",
            topk.to_string(),
            "a multiple of 64 in 64..=4096 (index rows are padded with -1 to it)",
        ));
    }
    Ok(tile)
}

/// A plan or shape made for another GPU generation picks kernel variants (head
/// tiles, thread counts) this GPU does not run.
pub(crate) fn check_target(field: &'static str, planned: Target, rt: &crate::runtime::Runtime) -> Result<()> {
    if planned != rt.target() {
        return Err(invalid(
            field,
            planned.arch(),
            format!("this GPU's {} (build it with Runtime::target / Runtime::launch_target)", rt.target().arch()),
        ));
    }
    Ok(())
}

pub(crate) use crate::error::invalid;

pub(crate) fn check_aligned<T, P: DevicePtr<T>>(
    field: &'static str,
    p: &P,
    align: u64,
    stream: &CudaStream,
) -> Result<()> {
    let (ptr, _sync) = p.device_ptr(stream);
    if ptr % align != 0 {
        return Err(invalid(
            field,
            format!("device address {ptr:#x}"),
            format!("a {align}-byte aligned start (slice at a multiple of {align} bytes)"),
        ));
    }
    Ok(())
}

pub(crate) fn check_len(field: &'static str, got: usize, want: usize, what: &str) -> Result<()> {
    if got != want {
        return Err(invalid(field, format!("length {got}"), format!("length {want} ({what})")));
    }
    Ok(())
}

pub(crate) fn check_count_fits_i32(field: &'static str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| invalid(field, n.to_string(), "at most 2^31-1 entries per launch; split the batch"))
}
