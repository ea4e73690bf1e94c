//! `nsa.Plan`: one step's plan, made by `Layer.plan` (eager, metadata built on the
//! device from the server's tables, decisions from its host lengths) or
//! `Layer.graph_plan` (a CUDA graph's fixed buffers, rewritten by `Layer.replay`).
//!
//! A plan owns its metadata state. States are kept in the layer's pools: a dropped
//! plan hands its state to the next plan of that mode, so a server allocates
//! them once. Reuse is ordered by the stream: the next plan's metadata launch
//! runs after the dropped plan's last forward on the same stream.

use nsa_runtime::layer::{LayerWorkspace, MhaPlan, StepPlan};
use nsa_runtime::metadata::extend_device::DeviceExtendState;
use nsa_runtime::metadata::graph_device::DeviceGraphState;
use nsa_runtime::metadata::GraphMode;
use ouroboros::self_referencing;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex, MutexGuard};

/// An eager decode-like plan and the state its metadata lives in.
#[self_referencing(pub_extras)]
pub struct GraphHeld {
    state: DeviceGraphState,
    #[borrows(mut state)]
    #[covariant]
    pub plan: StepPlan<'this>,
}

/// An eager extend plan and the state its metadata lives in.
#[self_referencing(pub_extras)]
pub struct ExtendHeld {
    state: DeviceExtendState,
    #[borrows(mut state)]
    #[covariant]
    pub plan: StepPlan<'this>,
}

/// A CUDA graph's state and workspace: fixed addresses, captured once per batch size.
#[derive(Debug)]
pub struct GraphBuffers {
    pub state: DeviceGraphState,
    pub ws: LayerWorkspace,
    pub bs: usize,
}

pub enum Held {
    Decode(GraphHeld),
    Extend(ExtendHeld),
    Graph(GraphBuffers),
    /// An MHA one-shot extend step (its offsets and slots copied out of the pooled
    /// extend state, which went back to the pool when the plan was made).
    Mha(MhaPlan),
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Held::Decode(h) => h.with_plan(|p| f.debug_tuple("Decode").field(p).finish()),
            Held::Extend(h) => h.with_plan(|p| f.debug_tuple("Extend").field(p).finish()),
            Held::Graph(g) => f.debug_tuple("Graph").field(g).finish(),
            Held::Mha(p) => f.debug_tuple("Mha").field(p).finish(),
        }
    }
}

/// Metadata states no live plan holds, per layer.
#[derive(Debug, Default)]
pub struct Pools {
    graph: Mutex<Vec<DeviceGraphState>>,
    extend: Mutex<Vec<DeviceExtendState>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pools {
    pub fn take_graph(&self, mode: GraphMode) -> Option<DeviceGraphState> {
        let mut list = lock(&self.graph);
        let i = list.iter().position(|s| s.mode() == mode)?;
        Some(list.swap_remove(i))
    }

    pub fn put_graph(&self, state: DeviceGraphState) {
        lock(&self.graph).push(state);
    }

    pub fn take_extend(&self) -> Option<DeviceExtendState> {
        lock(&self.extend).pop()
    }

    pub fn put_extend(&self, state: DeviceExtendState) {
        lock(&self.extend).push(state);
    }
}

/// One step's plan; see the [module docs](self).
#[derive(Debug)]
#[pyclass(frozen, module = "nsa._nsa")]
pub struct Plan {
    pub held: Mutex<Option<Held>>,
    pools: Arc<Pools>,
    pub device: i32,
    pub mode: &'static str,
    pub rows: usize,
    pub padded_rows: usize,
    /// Keys of an MHA one-shot step (`None` for sparse steps).
    pub mha_keys: Option<usize>,
    explain: String,
    /// The layer that made it (a plan runs only there).
    pub layer_id: usize,
}

impl Plan {
    pub fn new(held: Held, pools: Arc<Pools>, device: i32, layer_id: usize, explain: String) -> Self {
        let (mode, rows, padded_rows) = match &held {
            Held::Decode(h) => h.with_plan(|p| (p.decisions().mode.name(), p.rows(), p.padded_rows())),
            Held::Extend(h) => h.with_plan(|p| (p.decisions().mode.name(), p.rows(), p.padded_rows())),
            Held::Graph(g) => {
                let rows = g.state.shape(g.bs).rows;
                (g.state.mode().name(), rows, rows)
            }
            Held::Mha(p) => ("extend", p.rows(), p.rows()),
        };
        let mha_keys = match &held {
            Held::Mha(p) => Some(p.keys()),
            _ => None,
        };
        Plan { held: Mutex::new(Some(held)), pools, device, mode, rows, padded_rows, mha_keys, explain, layer_id }
    }

    /// The held plan or buffers, locked for a call.
    pub fn lock(&self) -> MutexGuard<'_, Option<Held>> {
        lock(&self.held)
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        match lock(&self.held).take() {
            Some(Held::Decode(h)) => self.pools.put_graph(h.into_heads().state),
            Some(Held::Extend(h)) => self.pools.put_extend(h.into_heads().state),
            Some(Held::Graph(_) | Held::Mha(_)) | None => {}
        }
    }
}

#[pymethods]
impl Plan {
    /// `"decode"`, `"target_verify"`, `"draft_extend"`, `"draft_extend_v2"` or `"extend"`.
    #[getter]
    fn mode(&self) -> &'static str {
        self.mode
    }

    /// Query tokens the step computes.
    #[getter]
    fn rows(&self) -> usize {
        self.rows
    }

    /// Query rows `forward` takes: `rows` plus DP padding rows.
    #[getter]
    fn padded_rows(&self) -> usize {
        self.padded_rows
    }

    /// Whether this plan is a CUDA graph's (from `Layer.graph_plan`).
    #[getter]
    fn is_graph(&self) -> bool {
        matches!(*self.lock(), Some(Held::Graph(_)))
    }

    /// Whether the step runs MHA one-shot (`Layer.mha_store` + `Layer.mha_attend`, the
    /// model expanding the heads) rather than `Layer.forward`.
    #[getter]
    fn use_mha(&self) -> bool {
        self.mha_keys.is_some()
    }

    /// An MHA one-shot step's keys (Σ seq_lens: the rows of `latent`, `k` and `v`);
    /// `None` for sparse steps.
    #[getter]
    fn keys(&self) -> Option<usize> {
        self.mha_keys
    }

    #[getter]
    fn device(&self) -> i32 {
        self.device
    }

    /// One line per stage: which kernel variant runs and why.
    fn explain(&self) -> String {
        self.explain.clone()
    }

    fn __repr__(&self) -> String {
        let kind = match (self.is_graph(), self.use_mha()) {
            (true, _) => "graph",
            (false, true) => "eager, MHA one-shot",
            (false, false) => "eager",
        };
        format!("Plan(mode={:?}, rows={}, {kind}, device={})", self.mode, self.rows, self.device)
    }
}
