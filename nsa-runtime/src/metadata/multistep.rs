//! The multi-step draft backend's CUDA-graph metadata (spec §9.4), host side.

use super::build::MetadataParams;
use super::check::invalid;
use super::graph::{GraphCapacity, GraphMode, GraphShape, GraphState, ReplayExtent};
use super::{ReqToToken, Requests};
use crate::Result;

/// The multi-step draft backend (§9.4): `speculative_num_steps − 1` step states, all
/// decode graphs receiving identical metadata. Replay computes once (step 0) and
/// copies into the rest, as the precomputed path does.
///
/// Graph rows are `bs` per step; the reference captures with `num_tokens = bs ×
/// eagle_topk` but binds `bs` rows, so eagle top-k > 1 is not represented here either.
#[derive(Clone, Debug)]
pub struct MultiStepGraphs {
    states: Vec<GraphState>,
}

impl MultiStepGraphs {
    pub fn new(params: MetadataParams, capacity: GraphCapacity, speculative_num_steps: usize) -> Result<Self> {
        if speculative_num_steps == 0 {
            return Err(invalid("speculative_num_steps", "0", "at least 1 (steps − 1 draft backends)"));
        }
        let states = (1..speculative_num_steps)
            .map(|_| GraphState::new(params, GraphMode::Decode, capacity))
            .collect::<Result<Vec<_>>>()?;
        Ok(MultiStepGraphs { states })
    }

    pub fn states(&self) -> &[GraphState] {
        &self.states
    }

    /// Captures every step backend (always DECODE); `None` when there are none.
    pub fn capture(&mut self, seq_lens: &[i32]) -> Result<Option<GraphShape>> {
        let mut shape = None;
        for s in &mut self.states {
            shape = Some(s.capture(seq_lens)?);
        }
        Ok(shape)
    }

    /// Replays step 0 and copies its writes into every other step.
    pub fn replay(&mut self, table: &ReqToToken<'_>, reqs: Requests<'_>) -> Result<Option<ReplayExtent>> {
        let Some((first, rest)) = self.states.split_first_mut() else { return Ok(None) };
        let extent = first.replay_decode(table, reqs)?;
        for s in rest {
            s.copy_replay_from(first, extent)?;
        }
        Ok(Some(extent))
    }
}
