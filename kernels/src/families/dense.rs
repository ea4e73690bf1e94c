//! Dense causal attention over variable-length sequences: the MHA one-shot
//! prefill (spec §5.1), each head with its own q, k (`d_qk`) and v (`d_v`), the head
//! count a constant (no padding). Three kernels: mma.sync on every NVIDIA target,
//! a warp-group (wgmma) kernel on sm_90a, and a scalar one on every target (the
//! one gfx942 has).

use super::{number_after, FamilyRules};
use crate::spec::{KernelFamily, KernelSpec};
use crate::target::{Target, Vendor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Which dense kernel a spec builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenseKernel {
    /// mma.sync m16n8k16: 64 query rows per CTA of 4 warps (every NVIDIA target).
    MmaSync,
    /// wgmma (sm_90a only): persistent CTAs of two consumer warp groups and a
    /// producer warp, 128 query rows a tile.
    WarpGroup,
    /// No matrix instructions (every target; gfx942's): 64 query rows per CTA of 64
    /// threads, one row per thread.
    Scalar,
}

impl DenseKernel {
    pub const ALL: [DenseKernel; 3] = [DenseKernel::MmaSync, DenseKernel::WarpGroup, DenseKernel::Scalar];

    /// Whether `target` can run this kernel.
    pub fn runs_on(self, target: Target) -> bool {
        match self {
            DenseKernel::MmaSync => target.vendor() == Vendor::Nvidia,
            DenseKernel::WarpGroup => target == Target::Sm90a,
            DenseKernel::Scalar => true,
        }
    }

    /// Query rows per CTA (the launcher's grid).
    pub fn rows(self) -> u32 {
        match self {
            DenseKernel::MmaSync => DENSE_ROWS,
            DenseKernel::WarpGroup => DENSE_WG_ROWS,
            DenseKernel::Scalar => DENSE_SCALAR_ROWS,
        }
    }
}

pub(crate) struct Dense;

/// Threads of an mma.sync CTA (4 warps of 16 query rows each).
const BLOCK_THREADS: u32 = 128;
/// Query rows per mma.sync CTA and keys per block (`nsa::dense::kRows`, `kKeys`).
pub const DENSE_ROWS: u32 = 64;
const DENSE_KEYS: u32 = 64;
/// The warp-group kernel (`nsa::dense_wg`): two consumer groups of 64 query rows and
/// a producer group (one warp of it works); 128 keys per block.
const WG_THREADS: u32 = 384;
pub const DENSE_WG_ROWS: u32 = 128;
pub const DENSE_WG_KEYS: u32 = 128;
/// The scalar kernel (`nsa::dense_scalar`): one thread per query row, 32 keys per block.
pub const DENSE_SCALAR_ROWS: u32 = 64;
const DENSE_SCALAR_KEYS: u32 = 32;

/// Dynamic shared memory of the scalar kernel; mirrors `nsa::dense_scalar::Smem`: Q
/// rows padded by one bf16 pair, one K and one V block, and the block's f32 scores.
pub fn dense_scalar_smem_bytes(d_qk: u32, d_v: u32) -> u32 {
    DENSE_SCALAR_ROWS * (d_qk + 2) * 2
        + DENSE_SCALAR_KEYS * (d_qk + d_v) * 2
        + DENSE_SCALAR_KEYS * DENSE_SCALAR_ROWS * 4
}

fn kernel_of(spec: &KernelSpec) -> DenseKernel {
    match spec.family {
        KernelFamily::DensePrefill { kernel, .. } => kernel,
        _ => unreachable!("not the dense prefill family"),
    }
}

/// Dynamic shared memory of the warp-group kernel; mirrors `nsa::dense_wg::Smem`:
/// the Q tile, two K and two V tiles (unpadded, swizzled), ten mbarriers (full and
/// empty of each), the announced tile (48 bytes) and 1024 bytes of alignment.
pub fn dense_wg_smem_bytes(d_qk: u32, d_v: u32) -> u32 {
    DENSE_WG_ROWS * d_qk * 2 + 2 * DENSE_WG_KEYS * (d_qk + d_v) * 2 + 10 * 8 + 48 + 1024
}

/// Dynamic shared memory; mirrors `nsa::dense::Smem` (dense_prefill.cuh): the Q
/// tile and two K and two V buffers of 64 rows padded by 16 bytes, and each of the 4
/// warps' 16 P rows of 64 bf16 (padded).
pub fn dense_smem_bytes(d_qk: u32, d_v: u32) -> u32 {
    let rows = |d: u32| DENSE_KEYS * (d * 2 + 16);
    3 * rows(d_qk) + 2 * rows(d_v) + 4 * 16 * (DENSE_KEYS * 2 + 16)
}

/// The kernel the catalog and the layer's MHA one-shot path take on `target`: the
/// warp-group kernel where it runs (about 2.6× the mma.sync kernel on an H100), mma.sync
/// on other NVIDIA targets, the scalar kernel on the rest.
pub fn mha_kernel(target: Target) -> DenseKernel {
    [DenseKernel::WarpGroup, DenseKernel::MmaSync]
        .into_iter()
        .find(|k| k.runs_on(target))
        .unwrap_or(DenseKernel::Scalar)
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
            KernelFamily::DensePrefill { heads, d_qk, d_v, kernel } => {
                let mut knobs = vec![format!("h{heads}"), format!("d{d_qk}"), format!("v{d_v}")];
                match kernel {
                    DenseKernel::WarpGroup => knobs.push("wg".into()),
                    DenseKernel::Scalar => knobs.push("scalar".into()),
                    DenseKernel::MmaSync => {}
                }
                knobs
            }
            _ => unreachable!("not the dense prefill family"),
        }
    }

    fn template(&self, spec: &KernelSpec) -> &'static str {
        match kernel_of(spec) {
            DenseKernel::WarpGroup => "dense_prefill_wg.cu.tera",
            DenseKernel::MmaSync => "dense_prefill.cu.tera",
            DenseKernel::Scalar => "dense_prefill_scalar.cu.tera",
        }
    }

    fn block_threads(&self, spec: &KernelSpec) -> u32 {
        match kernel_of(spec) {
            DenseKernel::WarpGroup => WG_THREADS,
            DenseKernel::MmaSync => BLOCK_THREADS,
            DenseKernel::Scalar => DENSE_SCALAR_ROWS,
        }
    }

    fn dynamic_smem_bytes(&self, spec: &KernelSpec) -> u32 {
        match spec.family {
            KernelFamily::DensePrefill { d_qk, d_v, kernel: DenseKernel::WarpGroup, .. } => {
                dense_wg_smem_bytes(d_qk, d_v)
            }
            KernelFamily::DensePrefill { d_qk, d_v, kernel: DenseKernel::MmaSync, .. } => dense_smem_bytes(d_qk, d_v),
            KernelFamily::DensePrefill { d_qk, d_v, kernel: DenseKernel::Scalar, .. } => {
                dense_scalar_smem_bytes(d_qk, d_v)
            }
            _ => 0,
        }
    }

    fn context(&self, spec: &KernelSpec, ctx: &mut Map<String, Value>) {
        if let KernelFamily::DensePrefill { heads, d_qk, d_v, .. } = spec.family {
            ctx.insert("heads".into(), json!(heads));
            ctx.insert("d_qk".into(), json!(d_qk));
            ctx.insert("d_v".into(), json!(d_v));
            ctx.insert("smem_bytes".into(), json!(self.dynamic_smem_bytes(spec)));
        }
    }

    /// 128 and 16 heads (a whole node and TP8 of V3.2) at both head shapes, and 8, 32
    /// and 64 heads at V3.2's; each with every kernel the target runs.
    fn representatives(&self, target: Target) -> Vec<KernelFamily> {
        let mut shapes = Vec::new();
        for (d_qk, d_v) in DENSE_HEAD_DIMS {
            shapes.extend([16, 128].map(|heads| (heads, d_qk, d_v)));
        }
        shapes.extend([8, 32, 64].map(|heads| (heads, MHA_HEAD_DIMS.0, MHA_HEAD_DIMS.1)));
        let kernels = DenseKernel::ALL.into_iter().filter(|k| k.runs_on(target));
        kernels
            .flat_map(|kernel| {
                shapes.iter().map(move |&(heads, d_qk, d_v)| KernelFamily::DensePrefill { heads, d_qk, d_v, kernel })
            })
            .collect()
    }

    fn exists(&self, spec: &KernelSpec) -> bool {
        kernel_of(spec).runs_on(spec.target)
    }

    fn parse(&self, name: &str, knobs: &[&str]) -> Option<KernelFamily> {
        match (name, knobs) {
            ("dense_prefill", [h, d, v, rest @ ..]) => Some(KernelFamily::DensePrefill {
                heads: number_after(h, 'h')?,
                d_qk: number_after(d, 'd')?,
                d_v: number_after(v, 'v')?,
                kernel: match rest {
                    [] => DenseKernel::MmaSync,
                    ["wg"] => DenseKernel::WarpGroup,
                    ["scalar"] => DenseKernel::Scalar,
                    _ => return None,
                },
            }),
            _ => None,
        }
    }
}
