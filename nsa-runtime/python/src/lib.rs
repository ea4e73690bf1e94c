//! `nsa._nsa`, the extension module under the `nsa` Python package: tensors
//! arrive over DLPack (zero-copy), every launch goes to the stream the caller
//! names (torch's current stream, found by the Python wrappers), and nsa's
//! argument errors become `ValueError`/`TypeError` naming the argument.

mod config;
mod device;
mod error;
mod indexer;
mod layer;
mod mha;
mod mla;
mod plan;
mod tensor;
mod topk;

use pyo3::prelude::*;

#[pymodule]
fn _nsa(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(topk::topk, m)?)?;
    m.add_function(wrap_pyfunction!(mla::sparse_decode, m)?)?;
    m.add_function(wrap_pyfunction!(mla::sparse_prefill, m)?)?;
    m.add_function(wrap_pyfunction!(indexer::indexer_paged_logits, m)?)?;
    m.add_function(wrap_pyfunction!(indexer::indexer_ragged_logits, m)?)?;
    m.add_class::<mla::DecodePlan>()?;
    m.add_class::<config::Config>()?;
    m.add_class::<layer::Layer>()?;
    m.add_class::<plan::Plan>()?;
    m.add_function(wrap_pyfunction!(tensor::device_of, m)?)?;
    m.add_function(wrap_pyfunction!(device::cache_stats, m)?)?;
    Ok(())
}
