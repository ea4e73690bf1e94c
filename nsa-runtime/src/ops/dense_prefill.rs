//! Dense causal attention over variable-length sequences (the MHA one-shot
//! prefill, spec §5.1): the launcher. Sequence b has query rows `cu_seqlens_q[b] ..
//! cu_seqlens_q[b+1]` and key rows `cu_seqlens_k[b] .. cu_seqlens_k[b+1]`; its query
//! row i sees its keys `0 ..= lk − lq + i` (the first `lk − lq` are the prefix).

use super::{check_aligned, check_count_fits_i32, check_len, check_target, invalid};
use crate::error::Error;
use crate::runtime::Runtime;
use crate::Result;
use cudarc::driver::{sys, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr};
use half::bf16;
use nsa_kernels::spec::{DenseKernel, DENSE_HEAD_DIMS, DENSE_WG_KEYS, DENSE_WG_ROWS};
use nsa_kernels::{KernelFamily, Target};

/// The shape of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseShape {
    pub heads: u32,
    /// Q/K width per head (192 = 128 nope + 64 rope for DeepSeek V3.2, or 128).
    pub d_qk: u32,
    /// V width per head (128).
    pub d_v: u32,
    /// Sequences (`cu_seqlens_*` hold `batch + 1` offsets).
    pub batch: usize,
    /// Query rows in all (`cu_seqlens_q[batch]`).
    pub rows: usize,
    /// Key rows in all (`cu_seqlens_k[batch]`).
    pub keys: usize,
    /// At least every sequence's query rows: the grid covers this many per sequence
    /// (a sequence with more is reported through the launch's status, not computed).
    pub max_seqlen_q: usize,
    pub target: Target,
    /// The kernel: mma.sync (every NVIDIA target) or warp-group (sm_90a).
    pub kernel: DenseKernel,
}

impl DenseShape {
    /// Row tiles per (sequence, head): the longest sequence in the kernel's tiles
    /// (64 rows mma.sync, 128 warp-group).
    pub fn row_tiles(&self) -> usize {
        self.max_seqlen_q.div_ceil(self.kernel.rows() as usize)
    }

    /// Work tiles of the launch: row tiles × heads × batch (a CTA each, but for
    /// the warp-group kernel's persistent CTAs: [`DenseShape::grid`]).
    pub fn tiles(&self) -> usize {
        self.row_tiles() * self.heads as usize * self.batch
    }

    /// CTAs launched on a GPU of `sm_count` SMs: a tile each, or for the warp-group
    /// kernel one an SM at most (its shared memory allows one), each taking tiles
    /// until none is left.
    pub fn grid(&self, sm_count: u32) -> usize {
        match self.kernel {
            DenseKernel::WarpGroup => self.tiles().min(sm_count as usize),
            DenseKernel::MmaSync | DenseKernel::Scalar => self.tiles(),
        }
    }

    /// The warp-group kernel's (sequence, head) pairs whose row tiles run
    /// interleaved, heaviest first: about two waves of CTAs, so the pairs in flight
    /// share their K and V in L2 (a smaller grid is one group: longest tiles first).
    pub fn pair_group(&self, sm_count: u32) -> usize {
        let pairs = (self.heads as usize * self.batch).max(1);
        (2 * sm_count as usize).div_ceil(self.row_tiles().max(1)).clamp(1, pairs)
    }

    fn check(&self) -> Result<()> {
        if !(1..=128).contains(&self.heads) {
            return Err(invalid("heads", self.heads.to_string(), "1..=128 query heads"));
        }
        if !DENSE_HEAD_DIMS.contains(&(self.d_qk, self.d_v)) {
            return Err(invalid(
                "d_qk, d_v",
                format!("{}, {}", self.d_qk, self.d_v),
                format!("one of {DENSE_HEAD_DIMS:?}"),
            ));
        }
        if !self.kernel.runs_on(self.target) {
            let allowed = match self.kernel {
                DenseKernel::MmaSync => "an NVIDIA target (sm_90a, sm_100a)",
                DenseKernel::WarpGroup => "sm_90a for the warp-group kernel (DenseKernel::MmaSync elsewhere)",
                DenseKernel::Scalar => "any target",
            };
            return Err(invalid("target", format!("{} with {:?}", self.target, self.kernel), allowed));
        }
        if self.max_seqlen_q > self.rows {
            return Err(invalid(
                "max_seqlen_q",
                self.max_seqlen_q.to_string(),
                format!("at most the query rows in all ({})", self.rows),
            ));
        }
        check_count_fits_i32("rows", self.rows)?;
        check_count_fits_i32("keys", self.keys)?;
        check_count_fits_i32("tiles (row tiles × heads × batch)", self.tiles())?;
        Ok(())
    }
}

/// bf16 inputs: `q` `[rows, heads, d_qk]`, `k` `[keys, heads, d_qk]`, `v` `[keys,
/// heads, d_v]`, contiguous; the offsets as int32.
#[derive(Debug)]
pub struct DenseInputs<'a> {
    pub q: CudaView<'a, bf16>,
    pub k: CudaView<'a, bf16>,
    pub v: CudaView<'a, bf16>,
    pub cu_seqlens_q: CudaView<'a, i32>,
    pub cu_seqlens_k: CudaView<'a, i32>,
    pub sm_scale: f32,
}

/// `out` bf16 `[rows, heads, d_v]`; `lse` f32 `[rows, heads]` (natural log, +inf
/// and zero output for a row that sees no key).
#[derive(Debug)]
pub struct DenseOutputs<'a, 'b> {
    pub out: &'a mut CudaViewMut<'b, bf16>,
    pub lse: &'a mut CudaViewMut<'b, f32>,
}

/// Mirrors `nsa::dense::Params` (dense_prefill.cuh) field for field.
/// The kernels' parameter block, also for launchers other than [`dense_prefill`]
/// (the CPU emulator of the tests, which passes host addresses).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DensePrefillParams {
    q: u64,
    k: u64,
    v: u64,
    cu_seqlens_q: u64,
    cu_seqlens_k: u64,
    out: u64,
    lse: u64,
    batch: i32,
    row_tiles: i32,
    rows: i32,
    keys: i32,
    sm_scale: f32,
    pair_group: i32,
    tile_counter: u64,
}
// SAFETY: plain old data with the C layout the kernel declares.
unsafe impl DeviceRepr for DensePrefillParams {}

impl DensePrefillParams {
    /// `shape`'s parameters over the addresses `[q, k, v, cu_seqlens_q,
    /// cu_seqlens_k, out, lse]`, for a GPU of `sm_count` SMs.
    pub fn new(shape: &DenseShape, addrs: [u64; 7], sm_scale: f32, sm_count: u32) -> Self {
        let [q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse] = addrs;
        DensePrefillParams {
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            out,
            lse,
            batch: shape.batch as i32,
            row_tiles: shape.row_tiles() as i32,
            rows: shape.rows as i32,
            keys: shape.keys as i32,
            sm_scale,
            pair_group: shape.pair_group(sm_count) as i32,
            tile_counter: 0,
        }
    }

    /// The warp-group kernel's tile counter: two u32 words, zero at launch (the
    /// kernel leaves them zero).
    pub fn with_tile_counter(self, tile_counter: u64) -> Self {
        DensePrefillParams { tile_counter, ..self }
    }
}

/// Mirrors `nsa::dense_wg::TensorMaps` (dense_prefill_wg.cuh): Q, K and V as the
/// warp-group kernel's TMA copies read them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DenseTensorMaps {
    q: sys::CUtensorMap,
    k: sys::CUtensorMap,
    v: sys::CUtensorMap,
}
// SAFETY: plain old data with the C layout the kernel declares.
unsafe impl DeviceRepr for DenseTensorMaps {}
// The kernel's parameter is three 128-byte maps; the driver copies that many bytes.
const _: () = assert!(std::mem::size_of::<DenseTensorMaps>() == 3 * 128);

/// Dims of one 128-byte swizzle span of bf16: a box's width.
const WG_BOX_DIMS: u32 = 64;

/// A 3-D tensor map's shape, innermost dimension first: the tensor's extents, the
/// byte strides of its outer two dimensions, and the box one copy moves.
#[derive(Debug, PartialEq, Eq)]
struct TensorMapGeometry {
    dims: [u64; 3],
    strides: [u64; 2],
    boxes: [u32; 3],
}

/// `[rows, heads, dim]` bf16 as dims, strides and a box of 64 dims of one head over
/// `box_rows` rows.
fn tensor_map_geometry(rows: usize, heads: u32, dim: u32, box_rows: u32) -> TensorMapGeometry {
    let (dim, heads) = (dim as u64, heads as u64);
    TensorMapGeometry {
        dims: [dim, heads, rows as u64],
        strides: [dim * 2, heads * dim * 2],
        boxes: [WG_BOX_DIMS, 1, box_rows],
    }
}

/// `[rows, heads, dim]` bf16 at `ptr` as a 3-D tensor map whose box is 64 dims of one
/// head over `box_rows` rows, 128-byte swizzle (a 64-dim block of the kernel's tiles).
fn rows_tensor_map(
    name: &'static str,
    ptr: u64,
    rows: usize,
    heads: u32,
    dim: u32,
    box_rows: u32,
) -> Result<sys::CUtensorMap> {
    let TensorMapGeometry { dims, strides, boxes } = tensor_map_geometry(rows, heads, dim, box_rows);
    let steps: [u32; 3] = [1, 1, 1];
    // SAFETY: all-zero bytes are a valid opaque map; the encoder overwrites them.
    let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
    // SAFETY: the arrays hold `rank` entries (strides rank - 1); the encoder only reads
    // them and writes `map`. It does not touch `ptr`, which the launch checked.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            3,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(Error::driver(format!("encoding the tensor map of {name} ({rows} rows × {heads} heads × {dim})")))?;
    Ok(map)
}

/// The softmax scale the kernels take: finite and positive (the warp-group kernel
/// takes row maxima of the unscaled scores).
fn check_scale(sm_scale: f32) -> Result<()> {
    if !(sm_scale.is_finite() && sm_scale > 0.0) {
        return Err(invalid("sm_scale", sm_scale.to_string(), "a finite softmax scale > 0 (e.g. 1/sqrt(d_qk))"));
    }
    Ok(())
}

/// `out[t, h] = Σ_j softmax_j(sm_scale · q[t, h]·k[j, h]) · v[j, h]` over the keys
/// query row t sees, and `lse[t, h]`.
pub fn dense_prefill(
    rt: &Runtime,
    shape: &DenseShape,
    inputs: &DenseInputs<'_>,
    outputs: DenseOutputs<'_, '_>,
) -> Result<()> {
    check_target("shape.target", shape.target, rt)?;
    shape.check()?;
    check_scale(inputs.sm_scale)?;
    let (h, dq, dv) = (shape.heads as usize, shape.d_qk as usize, shape.d_v as usize);
    check_len("q", inputs.q.len(), shape.rows * h * dq, "rows × heads × d_qk")?;
    check_len("k", inputs.k.len(), shape.keys * h * dq, "keys × heads × d_qk")?;
    check_len("v", inputs.v.len(), shape.keys * h * dv, "keys × heads × d_v")?;
    check_len("cu_seqlens_q", inputs.cu_seqlens_q.len(), shape.batch + 1, "batch + 1 offsets")?;
    check_len("cu_seqlens_k", inputs.cu_seqlens_k.len(), shape.batch + 1, "batch + 1 offsets")?;
    check_len("out", outputs.out.len(), shape.rows * h * dv, "rows × heads × d_v")?;
    check_len("lse", outputs.lse.len(), shape.rows * h, "rows × heads")?;
    if shape.tiles() == 0 {
        return Ok(());
    }
    let stream = rt.gpu().stream();
    check_aligned("q", &inputs.q, 16, stream)?;
    check_aligned("k", &inputs.k, 16, stream)?;
    check_aligned("v", &inputs.v, 16, stream)?;
    check_aligned("out", outputs.out, 16, stream)?;
    let family =
        KernelFamily::DensePrefill { heads: shape.heads, d_qk: shape.d_qk, d_v: shape.d_v, kernel: shape.kernel };
    let kernel = rt.kernel(family)?;
    let (q, _g1) = inputs.q.device_ptr(stream);
    let (k, _g2) = inputs.k.device_ptr(stream);
    let (v, _g3) = inputs.v.device_ptr(stream);
    let (cu_q, _g4) = inputs.cu_seqlens_q.device_ptr(stream);
    let (cu_k, _g5) = inputs.cu_seqlens_k.device_ptr(stream);
    let (out, _g6) = outputs.out.device_ptr_mut(stream);
    let (lse, _g7) = outputs.lse.device_ptr_mut(stream);
    let addrs = [q, k, v, cu_q, cu_k, out, lse];
    let sm_count = rt.gpu().caps().sm_count;
    let mut params = DensePrefillParams::new(shape, addrs, inputs.sm_scale, sm_count);
    // The persistent CTAs' tile counter: the runtime's, or while a graph is captured,
    // the graph's own (allocated and zeroed in it, freed after the launch).
    let mut graph_counter = None;
    let counter = match shape.kernel {
        DenseKernel::WarpGroup => match rt.work_counter()? {
            Some(words) => Some(words),
            None => Some(&*graph_counter.insert(
                stream.alloc_zeros::<u32>(2).map_err(Error::driver("allocating the dense kernel's tile counter"))?,
            )),
        },
        DenseKernel::MmaSync | DenseKernel::Scalar => None,
    };
    let _counter_guard = counter.map(|c| {
        let (ptr, guard) = c.device_ptr(stream);
        params = params.with_tile_counter(ptr);
        guard
    });
    let maps = match shape.kernel {
        // No key rows: no block is copied, and the encoder takes no empty tensor.
        DenseKernel::WarpGroup if shape.keys > 0 => Some(DenseTensorMaps {
            q: rows_tensor_map("q", q, shape.rows, shape.heads, shape.d_qk, DENSE_WG_ROWS)?,
            k: rows_tensor_map("k", k, shape.keys, shape.heads, shape.d_qk, DENSE_WG_KEYS)?,
            v: rows_tensor_map("v", v, shape.keys, shape.heads, shape.d_v, DENSE_WG_KEYS)?,
        }),
        // SAFETY: zero bytes as a placeholder map, never read.
        DenseKernel::WarpGroup => Some(unsafe { std::mem::zeroed() }),
        DenseKernel::MmaSync | DenseKernel::Scalar => None,
    };
    let mut args = rt.args();
    args.arg(&params);
    if let Some(maps) = &maps {
        args.arg(maps);
    }
    rt.launch(
        &kernel,
        args,
        shape.grid(sm_count),
        "cu_seqlens_q",
        "non-decreasing offsets inside q/k (cu_seqlens_k too) with every sequence's query rows ≤ max_seqlen_q",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> DenseShape {
        DenseShape {
            heads: 128,
            d_qk: 192,
            d_v: 128,
            batch: 2,
            rows: 4096,
            keys: 6000,
            max_seqlen_q: 2048,
            target: Target::Sm90a,
            kernel: DenseKernel::MmaSync,
        }
    }

    #[test]
    fn tensor_maps_describe_token_major_rows_in_swizzle_spans() {
        // k of 1000 keys × 16 heads × 192 dims: a key row of one head is 384 bytes, a
        // token's heads 6144 bytes apart; a box is one 128-byte swizzle span (64 bf16)
        // of one head over a key block.
        let g = tensor_map_geometry(1000, 16, 192, DENSE_WG_KEYS);
        assert_eq!(g, TensorMapGeometry { dims: [192, 16, 1000], strides: [384, 6144], boxes: [64, 1, 128] });
        for (d_qk, d_v) in DENSE_HEAD_DIMS {
            for dim in [d_qk, d_v] {
                let g = tensor_map_geometry(7, 128, dim, DENSE_WG_ROWS);
                // The encoder takes strides in multiples of 16 bytes; 128-byte swizzle,
                // boxes at most 128 bytes wide, each 64-dim block a whole box.
                assert!(g.strides.iter().all(|s| s % 16 == 0), "{g:?}");
                assert_eq!(g.boxes[0] * 2, 128);
                assert_eq!(dim % g.boxes[0], 0, "d {dim} in whole boxes");
            }
        }
    }

    #[test]
    fn grid_and_argument_errors() {
        assert_eq!(shape().tiles(), 32 * 128 * 2);
        assert_eq!(DenseShape { kernel: DenseKernel::WarpGroup, ..shape() }.tiles(), 16 * 128 * 2);
        assert_eq!(shape().grid(132), 32 * 128 * 2);
        assert_eq!(DenseShape { kernel: DenseKernel::WarpGroup, ..shape() }.grid(132), 132);
        let one_tile = DenseShape { kernel: DenseKernel::WarpGroup, heads: 8, batch: 1, max_seqlen_q: 100, ..shape() };
        assert_eq!(one_tile.grid(132), 8);
        assert!(shape().check().is_ok());
        let err = |s: DenseShape| s.check().unwrap_err().to_string();
        assert!(err(DenseShape { heads: 0, ..shape() }).contains("`heads`"));
        assert!(err(DenseShape { d_qk: 576, ..shape() }).contains("`d_qk, d_v`"));
        assert!(err(DenseShape { max_seqlen_q: 5000, ..shape() }).contains("`max_seqlen_q`"));
        assert!(err(DenseShape { target: Target::Gfx942, ..shape() }).contains("`target`"));
        let wg_on_sm100 = DenseShape { target: Target::Sm100a, kernel: DenseKernel::WarpGroup, ..shape() };
        assert!(err(wg_on_sm100).contains("`target`"));
        for bad in [0.0, -0.1, f32::NAN, f32::INFINITY] {
            assert!(check_scale(bad).unwrap_err().to_string().contains("`sm_scale`"), "{bad}");
        }
        assert!(check_scale(0.0723).is_ok());
    }

    #[test]
    fn pair_groups_cover_two_waves_and_a_small_grid_whole() {
        let wg = |heads, batch, max_seqlen_q| DenseShape {
            heads,
            batch,
            rows: batch * max_seqlen_q,
            max_seqlen_q,
            kernel: DenseKernel::WarpGroup,
            ..shape()
        };
        // 16 row tiles: 17 pairs make two waves of 132 SMs.
        assert_eq!(wg(128, 16, 2048).pair_group(132), 17);
        // 16 heads of one sequence: every pair in one group.
        assert_eq!(wg(16, 1, 2048).pair_group(132), 16);
        // One row tile per pair: capped at the pairs there are.
        assert_eq!(wg(8, 2, 100).pair_group(132), 16);
    }
}
