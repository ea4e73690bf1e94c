//! [`LayerWorkspace`]: the device scratch of a layer call, allocated once for the
//! largest step (or a CUDA graph's capacity) and shared by every layer.

use super::plan::WorkspaceNeeds;
use crate::error::invalid;
use crate::ops::topk::TopkWorkspace;
use crate::runtime::Runtime;
use crate::{Error, Result};
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use half::bf16;
use nsa_kernels::layout::INDEXER_HEAD_DIM;

#[derive(Debug)]
pub struct LayerWorkspace {
    pub(super) needs: WorkspaceNeeds,
    pub(super) logits: CudaSlice<f32>,
    pub(super) indices: CudaSlice<i32>,
    pub(super) topk: Option<TopkWorkspace>,
    pub(super) partials: CudaSlice<f32>,
    pub(super) max_logits: CudaSlice<f32>,
    pub(super) keys: CudaSlice<u8>,
    pub(super) key_scales: CudaSlice<f32>,
    pub(super) ragged_kv: CudaSlice<bf16>,
}

fn alloc<T: DeviceRepr + ValidAsZeroBits>(rt: &Runtime, n: usize) -> Result<CudaSlice<T>> {
    rt.gpu().stream().alloc_zeros(n.max(1)).map_err(Error::driver("allocating the layer workspace"))
}

impl LayerWorkspace {
    /// Allocates for `needs` (take [`WorkspaceNeeds::max`] over the steps it serves).
    pub fn new(rt: &Runtime, needs: WorkspaceNeeds) -> Result<Self> {
        Ok(LayerWorkspace {
            needs,
            logits: alloc(rt, needs.logits)?,
            indices: alloc(rt, needs.indices)?,
            topk: (needs.topk_split_rows > 0).then(|| TopkWorkspace::new(rt, needs.topk_split_rows)).transpose()?,
            partials: alloc(rt, needs.decode_partials)?,
            max_logits: alloc(rt, needs.max_logits)?,
            keys: alloc(rt, needs.gathered_keys * INDEXER_HEAD_DIM)?,
            key_scales: alloc(rt, needs.gathered_keys)?,
            ragged_kv: alloc(rt, needs.ragged_kv)?,
        })
    }

    pub fn needs(&self) -> WorkspaceNeeds {
        self.needs
    }

    /// Errors naming the first buffer too small for `want`.
    pub(super) fn check(&self, want: &WorkspaceNeeds) -> Result<()> {
        let have = &self.needs;
        for (name, h, w) in [
            ("logits", have.logits, want.logits),
            ("indices", have.indices, want.indices),
            ("decode_partials", have.decode_partials, want.decode_partials),
            ("max_logits", have.max_logits, want.max_logits),
            ("gathered_keys", have.gathered_keys, want.gathered_keys),
            ("ragged_kv", have.ragged_kv, want.ragged_kv),
        ] {
            if h < w {
                return Err(invalid(
                    "workspace",
                    format!("{name} holds {h} elements"),
                    format!(
                        "at least {w} for this step: allocate with LayerWorkspace::new(rt, plan.needs()) (or the max over the steps it serves)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The top-k output of the last call, `[T, topk]` (slots for PAGED, ragged rows
    /// for RAGGED, −1 padded). For checks and debugging.
    pub fn indices(&self) -> &CudaSlice<i32> {
        &self.indices
    }

    /// The logits of the last chunk of the last call (row stride
    /// [`super::StepDecisions::logits_stride`]).
    pub fn logits(&self) -> &CudaSlice<f32> {
        &self.logits
    }
}
