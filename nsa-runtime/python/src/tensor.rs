//! Tensors over DLPack: imported without a copy (`copy=False`), described by
//! dtype, shape, strides and device, and checked argument by argument before
//! anything reaches the GPU. A CUDA tensor is imported for the launch stream,
//! so its producer orders its own work before nsa's (a no-op when the stream is
//! the producer's current one, as the Python wrappers arrange).

use crate::error::IntoPy;
use dlpark::ffi::{DLDataTypeCode, DLDevice, DLDeviceType};
use dlpark::python::consumer::stream::{self, DlpackStream, StreamArg};
use dlpark::python::{ImportRequest, ImportedDlpack};
use nsa_runtime::foreign::ForeignBuffer;
use nsa_runtime::Runtime;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::ffi::c_void;

/// The element types nsa's kernels read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    Bf16,
    I32,
    U8,
    F8E4M3,
    Other { code: u8, bits: u8, lanes: u16 },
}

impl DType {
    fn of(code: DLDataTypeCode, bits: u8, lanes: u16) -> DType {
        match (code, bits, lanes) {
            (DLDataTypeCode::FLOAT, 32, 1) => DType::F32,
            (DLDataTypeCode::BFLOAT, 16, 1) => DType::Bf16,
            (DLDataTypeCode::INT, 32, 1) => DType::I32,
            (DLDataTypeCode::UINT, 8, 1) => DType::U8,
            (DLDataTypeCode::FLOAT8_E4M3FN, 8, 1) => DType::F8E4M3,
            (code, bits, lanes) => DType::Other { code: code.0, bits, lanes },
        }
    }

    /// The name torch and numpy give it.
    pub fn name(self) -> String {
        match self {
            DType::F32 => "float32".into(),
            DType::Bf16 => "bfloat16".into(),
            DType::I32 => "int32".into(),
            DType::U8 => "uint8".into(),
            DType::F8E4M3 => "float8_e4m3fn".into(),
            DType::Other { code, bits, lanes } => {
                let kind = match DLDataTypeCode(code) {
                    DLDataTypeCode::INT => "int",
                    DLDataTypeCode::UINT => "uint",
                    DLDataTypeCode::FLOAT => "float",
                    DLDataTypeCode::BFLOAT => "bfloat",
                    DLDataTypeCode::BOOL => "bool",
                    DLDataTypeCode::COMPLEX => "complex",
                    _ => "dlpack-code-",
                };
                let lanes = if lanes == 1 { String::new() } else { format!("x{lanes}") };
                format!("{kind}{bits}{lanes}")
            }
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::Bf16 => 2,
            DType::U8 | DType::F8E4M3 => 1,
            DType::Other { bits, lanes, .. } => (bits as usize * lanes as usize).div_ceil(8),
        }
    }
}

/// The launch stream, as DLPack's consumer (`None`: not known, so the producer
/// is asked not to synchronise; nsa then refuses to launch).
struct Consumer(Option<usize>);

// SAFETY: the stream named is the one nsa launches on; producers synchronise to it.
unsafe impl DlpackStream for Consumer {
    fn as_python_arg(&self, _py: Python<'_>, _device: DLDevice) -> PyResult<StreamArg> {
        Ok(match self.0 {
            Some(s) => stream::cuda(s as *mut c_void),
            None => stream::no_sync(),
        })
    }

    unsafe fn wait_for_producer(&self, _device: DLDevice, producer: *mut c_void) -> PyResult<bool> {
        // The producer's current stream is the launch stream: already ordered.
        // Otherwise the import falls back to `__dlpack__(stream=...)`, where the
        // producer orders its stream before ours.
        Ok(self.0.is_none_or(|s| producer as usize == s))
    }
}

/// One imported argument. Holding it keeps the producer's memory alive.
pub struct Tensor {
    pub name: &'static str,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// In elements, one per dimension.
    pub strides: Vec<i64>,
    pub device: DLDevice,
    read_only: bool,
    ptr: u64,
    _owner: ImportedDlpack,
}

/// `obj` (any DLPack producer: a torch tensor, a numpy array) as argument `name`.
/// `stream`: the launch stream, for CUDA producers to order their work before it.
pub fn import(name: &'static str, obj: &Bound<'_, PyAny>, stream: Option<usize>) -> PyResult<Tensor> {
    let not_a_tensor = |why: String| {
        PyTypeError::new_err(format!(
            "`{name}`: expected a tensor (a torch.Tensor on a CUDA device, or another DLPack producer), got {}{why}",
            type_name(obj)
        ))
    };
    // What is not a DLPack producer fails here or in the import; only then is the
    // attribute looked up, to say which.
    let refused = |e: PyErr, stage: &str| -> PyErr {
        if obj.hasattr("__dlpack__").unwrap_or(false) {
            PyTypeError::new_err(format!("`{name}`: the DLPack {stage} failed: {e}"))
        } else {
            not_a_tensor(String::new())
        }
    };
    let request = ImportRequest::new(obj.as_borrowed()).map_err(|e| refused(e, "discovery"))?;
    let cuda = request.device().is_ok_and(|d| d.device_type == DLDeviceType::CUDA);
    let imported = if cuda { request.import(Some(&Consumer(stream)), Some(false)) } else { request.import(None, None) }
        .map_err(|e| refused(e, "import"))?;
    let view = imported.validate().map_err(|e| PyValueError::new_err(format!("`{name}`: {e}")))?;
    let dtype = view.dtype();
    let shape: Vec<usize> = view.shape().iter().map(|&d| d as usize).collect();
    let strides = view.strides_or_compact().map_err(|e| PyValueError::new_err(format!("`{name}`: {e}")))?.into_owned();
    let device = view.device();
    let ptr = view.data_ptr() as u64 + view.byte_offset();
    let read_only = imported.flags().contains(dlpark::DlpackFlags::READ_ONLY);
    Ok(Tensor {
        name,
        dtype: DType::of(dtype.code, dtype.bits, dtype.lanes),
        shape,
        strides,
        device,
        read_only,
        ptr,
        _owner: imported,
    })
}

/// [`import`] of an optional argument.
pub fn import_opt(
    name: &'static str,
    obj: Option<&Bound<'_, PyAny>>,
    stream: Option<usize>,
) -> PyResult<Option<Tensor>> {
    obj.filter(|o| !o.is_none()).map(|o| import(name, o, stream)).transpose()
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().fully_qualified_name().map(|n| n.to_string()).unwrap_or_else(|_| "an object".into())
}

fn shape_str(shape: &[usize]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

impl Tensor {
    /// The dtype, if one of `allowed`; a `TypeError` naming both otherwise.
    pub fn dtype_in(&self, allowed: &[DType]) -> PyResult<DType> {
        if allowed.contains(&self.dtype) {
            return Ok(self.dtype);
        }
        let names: Vec<String> = allowed.iter().map(|d| d.name()).collect();
        Err(PyTypeError::new_err(format!(
            "`{}`: dtype {}, expected {}",
            self.name,
            self.dtype.name(),
            names.join(" or ")
        )))
    }

    /// That the tensor has `dims` dimensions (`what` names them, e.g. "(rows, keys)").
    pub fn ndim(&self, dims: usize, what: &str) -> PyResult<()> {
        if self.shape.len() == dims {
            return Ok(());
        }
        Err(PyValueError::new_err(format!(
            "`{}`: shape {} ({} dimensions), expected {dims} dimensions {what}",
            self.name,
            shape_str(&self.shape),
            self.shape.len()
        )))
    }

    /// That the shape is exactly `want` (`what` says where it comes from).
    pub fn shape_is(&self, want: &[usize], what: &str) -> PyResult<()> {
        if self.shape == want {
            return Ok(());
        }
        Err(PyValueError::new_err(format!(
            "`{}`: shape {}, expected {} ({what})",
            self.name,
            shape_str(&self.shape),
            shape_str(want)
        )))
    }

    /// That dimensions `from..` are packed row-major (the leading ones may have any
    /// stride): nsa's kernels read those with vector loads.
    pub fn packed_from(&self, from: usize) -> PyResult<()> {
        let mut expect = 1i64;
        for axis in (from..self.shape.len()).rev() {
            if self.shape[axis] != 1 && self.strides[axis] != expect {
                return Err(PyValueError::new_err(format!(
                    "`{}`: strides {:?} for shape {}, expected {} (pass .contiguous())",
                    self.name,
                    self.strides,
                    shape_str(&self.shape),
                    if from == 0 {
                        "a contiguous tensor".to_string()
                    } else {
                        format!("dimensions {from}.. packed (stride 1 along the last)")
                    }
                )));
            }
            expect *= self.shape[axis] as i64;
        }
        Ok(())
    }

    /// [`packed_from`](Self::packed_from)`(0)`.
    pub fn contiguous(&self) -> PyResult<()> {
        self.packed_from(0)
    }

    /// The stride of `axis` in elements, which must not be negative.
    pub fn stride(&self, axis: usize) -> PyResult<usize> {
        usize::try_from(self.strides[axis]).map_err(|_| {
            PyValueError::new_err(format!(
                "`{}`: stride {} along dimension {axis}, expected ≥ 0",
                self.name, self.strides[axis]
            ))
        })
    }

    /// That the tensor lives on CUDA device `ordinal` (`None`: any CUDA device);
    /// returns the ordinal.
    pub fn on_cuda(&self, ordinal: Option<i32>) -> PyResult<i32> {
        on_cuda(self.name, self.device, ordinal)
    }

    /// That nsa may write the tensor (an output).
    pub fn writable(&self) -> PyResult<()> {
        if self.read_only {
            return Err(PyValueError::new_err(format!(
                "`{}`: a read-only tensor, expected a writable one (nsa writes its results there)",
                self.name
            )));
        }
        Ok(())
    }

    /// Elements from the first to one past the last addressed one.
    fn span(&self) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        1 + self.shape.iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s.max(0) as usize).sum::<usize>()
    }

    /// The tensor's memory as a buffer of `T` for launches on `rt`'s stream (never
    /// freed by nsa). `T` must have the dtype's size; `rt` must run on the tensor's
    /// device (an error otherwise: the DLPack descriptor is trusted for nothing else).
    pub fn buffer<T>(&self, rt: &Runtime) -> PyResult<ForeignBuffer<T>> {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.bytes());
        on_cuda(self.name, self.device, Some(rt.gpu().caps().ordinal as i32))?;
        // SAFETY: the producer keeps the memory alive while `self` (which holds the
        // DLPack owner) lives, the import ordered its work before the stream, and
        // the DLPack descriptor vouches for the device (checked to be the runtime's
        // by the caller) and for the extent its shape and strides span.
        unsafe { ForeignBuffer::from_raw_trusted(self.name, rt.gpu().stream(), self.ptr, self.span()) }.py()
    }
}

/// That `device` (argument `name`'s) is CUDA device `ordinal` (`None`: any);
/// returns the ordinal.
pub fn on_cuda(name: &str, device: DLDevice, ordinal: Option<i32>) -> PyResult<i32> {
    let here = device_str(device);
    if device.device_type != DLDeviceType::CUDA {
        return Err(PyValueError::new_err(format!(
            "`{name}`: on {here}, expected a CUDA tensor{} (nsa never copies between devices: move it with .cuda())",
            ordinal.map(|o| format!(" on cuda:{o}")).unwrap_or_default()
        )));
    }
    match ordinal {
        Some(o) if o != device.device_id => Err(PyValueError::new_err(format!(
            "`{name}`: on {here}, expected cuda:{o}, the device of the other arguments"
        ))),
        _ => Ok(device.device_id),
    }
}

fn device_str(d: DLDevice) -> String {
    match d.device_type {
        DLDeviceType::CPU => "cpu".into(),
        DLDeviceType::CUDA => format!("cuda:{}", d.device_id),
        DLDeviceType::CUDAHOST => "cuda pinned host memory".into(),
        DLDeviceType::CUDAMANAGED => "cuda managed memory".into(),
        DLDeviceType::ROCM => format!("rocm:{}", d.device_id),
        t => format!("DLPack device type {} ({})", t.0, d.device_id),
    }
}

/// The CUDA device `tensor` lives on (an error naming it as `name` otherwise),
/// read without importing it.
#[pyfunction]
#[pyo3(signature = (tensor, name="tensor"))]
pub fn device_of(tensor: &Bound<'_, PyAny>, name: &str) -> PyResult<i32> {
    if !tensor.hasattr("__dlpack_device__")? {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "`{name}`: expected a tensor (a torch.Tensor on a CUDA device), got {}",
            tensor.get_type().name()?
        )));
    }
    let device = dlpark::python::dlpack_device(tensor.as_borrowed())?;
    crate::tensor::on_cuda(name, device, None)
}

/// That every tensor is on one CUDA device (`expected`, unless negative: the
/// first tensor's); returns it.
pub fn same_device<'a>(expected: i32, mut tensors: impl Iterator<Item = &'a Tensor>) -> PyResult<i32> {
    let first = tensors.next().expect("at least one tensor");
    let ordinal = first.on_cuda((expected >= 0).then_some(expected))?;
    for t in tensors {
        t.on_cuda(Some(ordinal))?;
    }
    Ok(ordinal)
}
