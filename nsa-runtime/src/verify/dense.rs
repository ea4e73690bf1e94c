//! Dense causal varlen attention (the MHA one-shot prefill) on the GPU against the
//! CPU reference (`reference::dense_mha`).
//!
//! Tolerance: the kernel rounds P to bf16 before P·V and the output to bf16 (each
//! at most 2⁻⁹ relative; |v| ≤ 1 here) and uses the approximate exp2/log2: every
//! output value within `2⁻⁸ · (1 + |out|)` of the f64 reference and every lse within
//! `10⁻⁴ · max(1, |lse|)` (its sum is of unrounded f32 terms); a row that sees no
//! key must give exactly zeros and +inf.

use super::{download, upload, Check};
use crate::ops::dense_prefill::{dense_prefill, DenseInputs, DenseOutputs, DenseShape};
use crate::reference::dense_mha::{dense_causal, DenseBatch, DenseOut};
use crate::runtime::Runtime;
use crate::testdata;
use crate::Result;
use half::bf16;
use nsa_kernels::spec::DenseKernel;
use nsa_kernels::{KernelFamily, KernelSpec};
use rand::Rng;

/// One case: sequences of (query rows, key rows), key rows ≥ query rows where the
/// sequence has a prefix (fewer key rows: the first query rows see nothing).
#[derive(Clone, Debug)]
pub struct DenseCase {
    pub heads: u32,
    pub d_qk: u32,
    pub d_v: u32,
    pub seqs: Vec<(usize, usize)>,
    pub seed: u64,
    pub kernel: DenseKernel,
}

pub(crate) fn offsets(lens: impl Iterator<Item = usize>) -> Vec<i32> {
    let mut cu = vec![0i32];
    for l in lens {
        cu.push(cu.last().unwrap() + l as i32);
    }
    cu
}

/// Where a dense case runs: the GPU ([`Runtime`]) or a CPU emulation of the kernels.
pub trait DenseDevice {
    fn target(&self) -> nsa_kernels::Target;
    /// The kernel of `shape` over `inputs`: `(out, lse)` as the kernel wrote them.
    fn dense(&self, shape: &DenseShape, inputs: &DenseHostInputs<'_>) -> Result<(Vec<bf16>, Vec<f32>)>;
}

/// A case's inputs on the host.
#[derive(Clone, Copy, Debug)]
pub struct DenseHostInputs<'a> {
    pub q: &'a [bf16],
    pub k: &'a [bf16],
    pub v: &'a [bf16],
    pub cu_seqlens_q: &'a [i32],
    pub cu_seqlens_k: &'a [i32],
    pub sm_scale: f32,
}

impl DenseDevice for Runtime {
    fn target(&self) -> nsa_kernels::Target {
        Runtime::target(self)
    }

    fn dense(&self, shape: &DenseShape, x: &DenseHostInputs<'_>) -> Result<(Vec<bf16>, Vec<f32>)> {
        dense_on_gpu(self, shape, x, false)
    }
}

/// A runtime whose dense launch is also captured in a CUDA graph: one eager launch
/// (the runtime's tile counter), then two replays of the graph (its own counter),
/// the outputs poisoned before each; the second replay's outputs are returned, so
/// every launch must leave its counter zero for the next.
#[derive(Clone, Copy, Debug)]
pub struct GraphReplays<'a>(pub &'a Runtime);

impl DenseDevice for GraphReplays<'_> {
    fn target(&self) -> nsa_kernels::Target {
        self.0.target()
    }

    fn dense(&self, shape: &DenseShape, x: &DenseHostInputs<'_>) -> Result<(Vec<bf16>, Vec<f32>)> {
        dense_on_gpu(self.0, shape, x, true)
    }
}

fn dense_on_gpu(
    rt: &Runtime,
    shape: &DenseShape,
    x: &DenseHostInputs<'_>,
    graph: bool,
) -> Result<(Vec<bf16>, Vec<f32>)> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let stream = rt.gpu().stream();
    let driver = crate::Error::driver;
    let (rows, h, dv) = (shape.rows, shape.heads as usize, shape.d_v as usize);
    let (d_q, d_k, d_v) = (upload(stream, x.q)?, upload(stream, x.k)?, upload(stream, x.v)?);
    let (d_cq, d_ck) = (upload(stream, x.cu_seqlens_q)?, upload(stream, x.cu_seqlens_k)?);
    let poison_out = vec![bf16::from_f32(7.0); (rows * h * dv).max(1)];
    let poison_lse = vec![7.0f32; (rows * h).max(1)];
    let mut d_out = upload(stream, &poison_out)?;
    let mut d_lse = upload(stream, &poison_lse)?;
    let inputs = DenseInputs {
        q: d_q.slice(0..x.q.len()),
        k: d_k.slice(0..x.k.len()),
        v: d_v.slice(0..x.v.len()),
        cu_seqlens_q: d_cq.slice(0..x.cu_seqlens_q.len()),
        cu_seqlens_k: d_ck.slice(0..x.cu_seqlens_k.len()),
        sm_scale: x.sm_scale,
    };
    let launch = |d_out: &mut cudarc::driver::CudaSlice<bf16>, d_lse: &mut cudarc::driver::CudaSlice<f32>| {
        let (mut out_view, mut lse_view) = (d_out.slice_mut(0..rows * h * dv), d_lse.slice_mut(0..rows * h));
        dense_prefill(rt, shape, &inputs, DenseOutputs { out: &mut out_view, lse: &mut lse_view })
    };
    launch(&mut d_out, &mut d_lse)?;
    if graph {
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver("beginning a graph capture"))?;
        let captured = launch(&mut d_out, &mut d_lse);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(driver("ending the graph capture"))?;
        captured?;
        // Only a launch without tiles records nothing.
        match graph {
            Some(graph) => {
                for _ in 0..2 {
                    stream.memcpy_htod(&poison_out, &mut d_out).map_err(driver("poisoning out"))?;
                    stream.memcpy_htod(&poison_lse, &mut d_lse).map_err(driver("poisoning lse"))?;
                    graph.launch().map_err(driver("launching the dense graph"))?;
                }
            }
            None if shape.tiles() == 0 => {}
            None => return Err(crate::Error::Other("the captured dense launch recorded no graph".into())),
        }
    }
    Ok((download(stream, &d_out, rows * h * dv)?, download(stream, &d_lse, rows * h)?))
}

pub fn run(rt: &Runtime, case: &DenseCase) -> Result<Check> {
    run_on(rt, case)
}

/// `case` on `dev` against the CPU reference.
pub fn run_on(dev: &impl DenseDevice, case: &DenseCase) -> Result<Check> {
    let (h, dq, dv) = (case.heads as usize, case.d_qk as usize, case.d_v as usize);
    let cu_q = offsets(case.seqs.iter().map(|s| s.0));
    let cu_k = offsets(case.seqs.iter().map(|s| s.1));
    let (rows, keys) = (*cu_q.last().unwrap() as usize, *cu_k.last().unwrap() as usize);
    let mut rng = testdata::rng(case.seed);
    let mut values = |n: usize| -> Vec<bf16> { (0..n).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect() };
    let (q, k, v) = (values(rows * h * dq), values(keys * h * dq), values(keys * h * dv));
    let sm_scale = 1.0 / (dq as f32).sqrt();
    let shape = DenseShape {
        heads: case.heads,
        d_qk: case.d_qk,
        d_v: case.d_v,
        batch: case.seqs.len(),
        rows,
        keys,
        max_seqlen_q: case.seqs.iter().map(|s| s.0).max().unwrap_or(0),
        target: dev.target(),
        kernel: case.kernel,
    };
    let inputs = DenseHostInputs { q: &q, k: &k, v: &v, cu_seqlens_q: &cu_q, cu_seqlens_k: &cu_k, sm_scale };
    let (got_out, got_lse) = dev.dense(&shape, &inputs)?;

    let f = |x: &[bf16]| x.iter().map(|b| b.to_f32()).collect::<Vec<f32>>();
    let (qf, kf, vf) = (f(&q), f(&k), f(&v));
    let want = dense_causal(&DenseBatch {
        q: &qf,
        k: &kf,
        v: &vf,
        cu_seqlens_q: &cu_q,
        cu_seqlens_k: &cu_k,
        heads: h,
        d_qk: dq,
        d_v: dv,
        sm_scale,
    })?;
    let (bad, first) = compare(&got_out, &got_lse, &want, h, dv, |_| true);
    let family = KernelFamily::DensePrefill { heads: case.heads, d_qk: case.d_qk, d_v: case.d_v, kernel: case.kernel };
    Ok(Check {
        kernel: KernelSpec::new(family, dev.target()).id(),
        case: format!("{} seqs, {rows} rows, {keys} keys", case.seqs.len()),
        items: rows * h,
        mismatches: bad,
        first_mismatch: first,
    })
}

/// Rows × heads of `got` outside the tolerance of `want` among the query rows
/// `checked` accepts, and the first of them.
pub(crate) fn compare(
    got_out: &[bf16],
    got_lse: &[f32],
    want: &DenseOut,
    h: usize,
    dv: usize,
    checked: impl Fn(usize) -> bool,
) -> (usize, Option<String>) {
    let (mut bad, mut first) = (0, None);
    for r in (0..got_lse.len()).filter(|r| checked(r / h)) {
        let (g_out, w_out) = (&got_out[r * dv..][..dv], &want.out[r * dv..][..dv]);
        let (g_lse, w_lse) = (got_lse[r], want.lse[r]);
        let miss = if w_lse == f32::INFINITY {
            g_lse != f32::INFINITY || g_out.iter().any(|x| x.to_f32() != 0.0)
        } else {
            // NaN from the GPU is a miss: `within` is false for it.
            let within = |d: f32, tol: f32| d.abs() <= tol;
            let out_ok = g_out.iter().zip(w_out).all(|(g, w)| within(g.to_f32() - w, (1.0 + w.abs()) / 256.0));
            !(out_ok && within(g_lse - w_lse, 1e-4 * w_lse.abs().max(1.0)))
        };
        if miss {
            bad += 1;
            first.get_or_insert_with(|| {
                format!(
                    "row {} head {}: lse gpu {g_lse} vs {w_lse}, out[0] gpu {} vs {}",
                    r / h,
                    r % h,
                    g_out[0],
                    w_out[0]
                )
            });
        }
    }
    (bad, first)
}
