//! `nsa.Config`: one attention configuration (a preset or a JSON/TOML text, with
//! keyword overrides applied before validation), its kernel set, and baking that
//! set into the kernel cache ahead of the first launch.

use crate::error::IntoPy;
use nsa_runtime::cache::prebuild::{compile_all, select, Caches};
use nsa_runtime::cache::Origin;
use nsa_runtime::kernels::config::{nearest_name, FIELDS};
use nsa_runtime::kernels::{deterministic_topk_set, kernel_set, ConfigError, KernelSpec, NsaConfig, PRESETS};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

#[derive(Clone, Debug, PartialEq)]
#[pyclass(frozen, eq, module = "nsa._nsa")]
pub struct Config {
    cfg: NsaConfig,
}

fn config_error(e: ConfigError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// `base` with `overrides` (field = value, as in the JSON form) applied, validated
/// (every problem at once).
fn build(py: Python<'_>, base: NsaConfig, overrides: Option<&Bound<'_, PyDict>>) -> PyResult<Config> {
    let mut value = serde_json::to_value(&base).map_err(|e| PyValueError::new_err(e.to_string()))?;
    if let Some(over) = overrides {
        let text: String = py
            .import("json")?
            .call_method1("dumps", (over,))
            .map_err(|e| {
                PyTypeError::new_err(format!(
                    "config overrides: {e} (values are ints, bools, strings or lists of strings)"
                ))
            })?
            .extract()?;
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| PyValueError::new_err(e.to_string()))?;
        for (key, v) in map {
            if !FIELDS.contains(&key.as_str()) {
                let guess = nearest_name(&key, &FIELDS).map(|n| format!(" (did you mean `{n}`?)")).unwrap_or_default();
                return Err(PyTypeError::new_err(format!(
                    "unknown config field `{key}`{guess}; the fields are {}",
                    FIELDS.join(", ")
                )));
            }
            value[key] = v;
        }
    }
    let cfg: NsaConfig = serde_path_to_error::deserialize(value)
        .map_err(|e| PyValueError::new_err(format!("invalid NSA config: `{}`: {}", e.path(), e.inner())))?;
    cfg.validate().map_err(config_error)?;
    Ok(Config { cfg })
}

impl Config {
    /// The validated model configuration.
    pub fn model(&self) -> &NsaConfig {
        &self.cfg
    }

    fn specs(&self, deterministic_topk: bool) -> Vec<KernelSpec> {
        let mut specs = kernel_set(&self.cfg);
        if deterministic_topk {
            specs.extend(deterministic_topk_set(&self.cfg));
        }
        specs
    }
}

#[pymethods]
impl Config {
    /// A preset (`nsa.Config.presets()`), with keyword overrides of its fields.
    #[new]
    #[pyo3(signature = (preset = "deepseek-v3.2", **overrides))]
    fn new(py: Python<'_>, preset: &str, overrides: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        build(py, NsaConfig::preset(preset).map_err(config_error)?, overrides)
    }

    /// A config from JSON (text starting with `{`) or TOML, with keyword overrides.
    #[staticmethod]
    #[pyo3(signature = (text, **overrides))]
    fn from_text(py: Python<'_>, text: &str, overrides: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        build(py, NsaConfig::parse_text(text).map_err(config_error)?, overrides)
    }

    /// `[(name, description)]` of the presets.
    #[staticmethod]
    fn presets() -> Vec<(&'static str, &'static str)> {
        PRESETS.to_vec()
    }

    /// This config with some fields changed (validated again).
    #[pyo3(signature = (**overrides))]
    fn replace(&self, py: Python<'_>, overrides: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        build(py, self.cfg.clone(), overrides)
    }

    /// The JSON form, which `Config.from_text` reads back.
    fn to_json(&self) -> PyResult<String> {
        serde_json::to_string_pretty(&self.cfg).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    #[getter]
    fn page_size(&self) -> u32 {
        self.cfg.page_size
    }
    #[getter]
    fn topk(&self) -> u32 {
        self.cfg.topk
    }
    #[getter]
    fn num_q_heads(&self) -> u32 {
        self.cfg.num_q_heads
    }
    #[getter]
    fn kv_lora_rank(&self) -> u32 {
        self.cfg.kv_lora_rank
    }
    #[getter]
    fn qk_rope_head_dim(&self) -> u32 {
        self.cfg.qk_rope_head_dim
    }
    #[getter]
    fn index_n_heads(&self) -> u32 {
        self.cfg.index_n_heads
    }
    #[getter]
    fn index_head_dim(&self) -> u32 {
        self.cfg.index_head_dim
    }
    /// "bf16" or "fp8".
    #[getter]
    fn kv_cache(&self) -> String {
        serde_json::to_value(self.cfg.kv_cache).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
    }
    #[getter]
    fn targets(&self) -> Vec<&'static str> {
        self.cfg.targets.iter().map(|t| t.arch()).collect()
    }
    #[getter]
    fn topk_bf16_scores(&self) -> bool {
        self.cfg.topk_bf16_scores
    }

    fn summary(&self) -> String {
        self.cfg.summary()
    }

    fn __repr__(&self) -> String {
        format!("nsa.Config({})", self.cfg.summary())
    }

    /// Ids of the config's kernel set (plus the deterministic top-k kernels).
    #[pyo3(signature = (deterministic_topk = false))]
    fn kernel_ids(&self, deterministic_topk: bool) -> Vec<String> {
        self.specs(deterministic_topk).iter().map(|s| s.id()).collect()
    }

    /// Compiles the kernel set (or the kernels whose id matches a glob of `only`)
    /// into the kernel cache (`NSA_CACHE_DIR`; `NSA_JIT=off` forbids compiling),
    /// one worker per core, without a GPU. Returns one dict per kernel: `id`,
    /// `target`, `origin` ("compiled" or "disk") and `ms`.
    #[pyo3(signature = (only = None, deterministic_topk = false))]
    fn compile(
        &self,
        py: Python<'_>,
        only: Option<Vec<String>>,
        deterministic_topk: bool,
    ) -> PyResult<Vec<Py<PyDict>>> {
        let only = only.unwrap_or_default();
        let specs = select(self.specs(deterministic_topk), &only, "only", "Config.kernel_ids() lists them").py()?;
        let done =
            py.detach(|| Caches::for_specs(&specs).and_then(|caches| compile_all(&caches, &specs, |_, _| {}))).py()?;
        done.iter()
            .map(|k| {
                let d = PyDict::new(py);
                d.set_item("id", &k.id)?;
                d.set_item("target", k.spec.target.arch())?;
                let (origin, elapsed) = match k.origin {
                    Origin::Compiled { elapsed } => ("compiled", elapsed),
                    Origin::Disk { elapsed } => ("disk", elapsed),
                };
                d.set_item("origin", origin)?;
                d.set_item("ms", elapsed.as_secs_f64() * 1e3)?;
                Ok(d.unbind())
            })
            .collect()
    }
}
