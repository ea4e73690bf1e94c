//! Dense causal attention over variable-length sequences: the MHA one-shot
//! prefill (spec §5.1), each head with its own q, k (`d_qk`) and v (`d_v`), the head
//! count a constant (no padding). Warp-group (wgmma) kernel on sm_90a, mma.sync on
//! the other NVIDIA targets.

use super::{number_after, FamilyRules};
use crate::spec::{KernelFamily, KernelSpec};
use crate::target::{Target, Vendor};
use serde_json::{json, Map, Value};

pub(crate) struct Dense;

/// Threads of an mma.sync CTA (4 warps of 16 query rows each).
const BLOCK_THREADS: u32 = 128;
/// Query rows per mma.sync CTA and keys per block (`nsa::dense::kRows`, `kKeys`).
pub const DENSE_ROWS: u32 = 64;
const DENSE_KEYS: u32 = 64;
/// The warp-group kernel (`nsa::dense_wg`): two consumer groups of 64 query rows and
/// a producer group; 128 keys per block.
const WG_THREADS: u32 = 384;
pub const DENSE_WG_ROWS: u32 = 128;
const DENSE_WG_KEYS: u32 = 128;

/// Whether `target` runs the warp-group kernel.
fn warp_group(target: Target) -> bool {
    target == Target::Sm90a
}

/// Query rows per CTA of the dense kernel on `target` (the launcher's grid).
pub fn dense_rows(target: Target) -> u32 {
    if warp_group(target) {
        DENSE_WG_ROWS
    } else {
        DENSE_ROWS
    }
}

/// Dynamic shared memory of the warp-group kernel; mirrors `nsa::dense_wg::Smem`:
/// the Q tile, two K and two V tiles (unpadded, swizzled) and 1024 bytes of alignment.
pub fn dense_wg_smem_bytes(d_qk: u32, d_v: u32) -> u32 {
    DENSE_WG_ROWS * d_qk * 2 + 2 * DENSE_WG_KEYS * (d_qk + d_v) * 2 + 1024
}

/// Dynamic shared memory; mirrors `nsa::dense::Smem` (dense_prefill.cuh): the Q
/// tile and two K and two V buffers of 64 rows padded by 16 bytes, and each of the 4
/// warps' 16 P rows of 64 bf16 (padded).
pub fn dense_smem_bytes(d_qk: u32, d_v: u32) -> u32 {
    let rows = |d: u32| DENSE_KEYS * (d * 2 + 16);
    3 * rows(d_qk) + 2 * rows(d_v) + 4 * 16 * (DENSE_KEYS * 2 + 16)
}

/// DeepSeek V3.2's expanded heads, (q/k, v): 128 nope + 64 rope, and 128.
pub const MHA_HEAD_DIMS: (u32, u32) = (192, 128);

/// The head shapes the family is built and tested for: V3.2's expanded heads and a
/// plain 128/128.
pub const DENSE_HEAD_DIMS: [(u32, u32); 2] = [MHA_HEAD_DIMS, (128, 128)];

impl FamilyRules for Dense {
    fn name(&self, _spec: &KernelSpec) -> &'static str {
        "dense_prefill"
    }

    fn knobs(&self, spec: &KernelSpec) -> Vec<String> {
        match spec.family {
            KernelFamily::DensePrefill { heads, d_qk, d_v } => {
                vec![format!("h{heads}"), format!("d{d_qk}"), format!("v{d_v}")]
            }
            _ => unreachable!("not the dense prefill family"),
        }
    }

    fn template(&self, spec: &KernelSpec) -> &'static str {
        if warp_group(spec.target) {
            "dense_prefill_wg.cu.tera"
        } else {
            "dense_prefill.cu.tera"
        }
    }

    fn block_threads(&self, spec: &KernelSpec) -> u32 {
        if warp_group(spec.target) {
            WG_THREADS
        } else {
            BLOCK_THREADS
        }
    }

    fn dynamic_smem_bytes(&self, spec: &KernelSpec) -> u32 {
        match spec.family {
            KernelFamily::DensePrefill { d_qk, d_v, .. } if warp_group(spec.target) => dense_wg_smem_bytes(d_qk, d_v),
            KernelFamily::DensePrefill { d_qk, d_v, .. } => dense_smem_bytes(d_qk, d_v),
            _ => 0,
        }
    }

    fn context(&self, spec: &KernelSpec, ctx: &mut Map<String, Value>) {
        if let KernelFamily::DensePrefill { heads, d_qk, d_v } = spec.family {
            ctx.insert("heads".into(), json!(heads));
            ctx.insert("d_qk".into(), json!(d_qk));
            ctx.insert("d_v".into(), json!(d_v));
            ctx.insert("smem_bytes".into(), json!(self.dynamic_smem_bytes(spec)));
        }
    }

    /// On NVIDIA: 128 and 16 heads (a whole node and TP8 of V3.2) at both head shapes,
    /// and 8, 32 and 64 heads at V3.2's.
    fn representatives(&self, target: Target) -> Vec<KernelFamily> {
        if target.vendor() != Vendor::Nvidia {
            return Vec::new();
        }
        let mut families = Vec::new();
        for (d_qk, d_v) in DENSE_HEAD_DIMS {
            for heads in [16, 128] {
                families.push(KernelFamily::DensePrefill { heads, d_qk, d_v });
            }
        }
        for heads in [8, 32, 64] {
            families.push(KernelFamily::DensePrefill { heads, d_qk: 192, d_v: 128 });
        }
        families
    }

    fn parse(&self, name: &str, knobs: &[&str]) -> Option<KernelFamily> {
        match (name, knobs) {
            ("dense_prefill", [h, d, v]) => Some(KernelFamily::DensePrefill {
                heads: number_after(h, 'h')?,
                d_qk: number_after(d, 'd')?,
                d_v: number_after(v, 'v')?,
            }),
            _ => None,
        }
    }
}
