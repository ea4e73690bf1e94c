//! nsa's errors as Python exceptions: an argument nsa refuses is a `ValueError`
//! (its message names the argument, the value and what is allowed); anything
//! else (no device, no NVRTC, a compile or driver failure) a `RuntimeError`.

use nsa_runtime::Error;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::PyErr;

pub fn to_py(err: Error) -> PyErr {
    match err {
        Error::InvalidArgument { .. } | Error::DeviceRejected { .. } | Error::Config(_) => {
            PyValueError::new_err(err.to_string())
        }
        _ => PyRuntimeError::new_err(err.to_string()),
    }
}

pub trait IntoPy<T> {
    /// The result with nsa's error turned into the matching Python exception.
    fn py(self) -> pyo3::PyResult<T>;
}

impl<T> IntoPy<T> for nsa_runtime::Result<T> {
    fn py(self) -> pyo3::PyResult<T> {
        self.map_err(to_py)
    }
}
