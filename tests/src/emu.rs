//! The CPU emulator of the top-k kernels (`tests/emu/`, built by `tests/build.rs`)
//! as a [`TopkDevice`], of the scalar dense kernel as a [`DenseDevice`], and of the
//! KV cache's step store and reads ([`Emulator::step_store`], [`Emulator::read_rows`],
//! [`Emulator::gather_indexer_k`]): the
//! sm_90a and gfx942 kernels' own code, with each CTA's
//! threads as fibers, run on the host so that CI (no GPU) checks the kernels' logic
//! against the CPU reference. It proves what the kernels compute, not how fast, and not the
//! GPU-only parts (the arch layer's PTX, memory ordering between real warps).

use half::bf16;
use nsa_kernels::{KernelFamily, KernelSpec, KvCacheFormat, Target, TopkScore};
use nsa_runtime::ops::dense_prefill::{DensePrefillParams, DenseShape};
use nsa_runtime::ops::topk::page_divisor;
use nsa_runtime::verify::dense::{DenseDevice, DenseHostInputs};
use nsa_runtime::verify::topk::{HostPageTable, TopkDevice, TopkInputs, TopkKernel, CHECK_SPLIT_CHUNK};
use nsa_runtime::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;

/// Compute units of the GPU whose launch plans the emulator follows: an H200 for
/// sm_90a, an MI300X for gfx942.
pub fn emulated_sms(target: Target) -> u32 {
    match target {
        Target::Gfx942 => 304,
        _ => 132,
    }
}

/// `nsa::topk::Params` (topk.cuh); tests/emu/launch.cpp pins the same size.
#[repr(C)]
struct TopkParams {
    scores: *const c_void,
    lengths: *const i32,
    row_starts: *const i32,
    page_table: *const i32,
    cu_seqlens_q: *const i32,
    offsets: *const i32,
    out: *mut i32,
    row_stride: i64,
    table_stride: i64,
    rows: i32,
    row_capacity: i32,
    table_rows: i32,
    table_width: i32,
    page_size: i32,
    page_shift: i32,
    page_magic: u64,
}
const _: () = assert!(size_of::<TopkParams>() == 104);

/// `nsa::topk::Split`.
#[repr(C)]
struct SplitParams {
    state: *mut u32,
    cand_idx: *mut u32,
    cand_key: *mut u32,
    chunk: i32,
    chunks: i32,
    cand_cap: i32,
}
const _: () = assert!(size_of::<SplitParams>() == 40);

/// `nsa::index_transform::Params`.
#[repr(C)]
struct TransformParams {
    idx: *const i32,
    page_table: *const i32,
    cu_seqlens_q: *const i32,
    out: *mut i32,
    table_stride: i64,
    rows: i32,
    table_rows: i32,
    table_width: i32,
}
const _: () = assert!(size_of::<TransformParams>() == 56);

// `nsa::dense::Params` (dense_common.cuh): tests/emu/smem.cpp pins the same size.
const _: () = assert!(size_of::<DensePrefillParams>() == 88);

/// Heads of the emulated dense kernels (tests/build.rs).
pub const EMU_DENSE_HEADS: u32 = 3;

/// `EmuStepStoreArgs` (kernels.h).
#[repr(C)]
struct StepStoreArgs {
    k_nope: *const bf16,
    nope_stride: i64,
    k_rope: *const bf16,
    rope_stride: i64,
    index_k: *const bf16,
    index_stride: i64,
    loc: *const i32,
    num_tokens: i32,
    pad: i32,
    cache: *mut c_void,
    pool_slots: i64,
    index_cache: *mut u8,
    index_pool_slots: i64,
}
const _: () = assert!(size_of::<StepStoreArgs>() == 96);

/// `EmuReadArgs` (kernels.h).
#[repr(C)]
struct ReadArgs {
    cache: *const c_void,
    pool_slots: i64,
    idx: *const i32,
    num_tokens: i32,
    pad: i32,
    out: *mut c_void,
    scales: *mut f32,
}
const _: () = assert!(size_of::<ReadArgs>() == 48);

/// The MLA cache a step store writes: FP8-656 records or bf16 rows.
#[derive(Debug)]
pub enum EmuMlaCache<'a> {
    Fp8(&'a mut [u8]),
    Bf16(&'a mut [bf16]),
}

/// `EmuShape` (launch.cpp).
#[repr(C)]
struct Shape {
    grid: u32,
    block_threads: u32,
    cluster: u32,
    smem_bytes: u32,
    groups: u32,
    pad: u32,
    seed: u64,
}

unsafe extern "C" {
    fn nsa_emu_topk(
        id: *const c_char,
        shape: *const Shape,
        p: *const TopkParams,
        status: *mut u32,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn nsa_emu_topk_split(
        id: *const c_char,
        shape: *const Shape,
        p: *const TopkParams,
        split: *const SplitParams,
        status: *mut u32,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn nsa_emu_selftest(name: *const c_char, seed: u64, out: *mut u32, err: *mut c_char, err_len: usize) -> c_int;
    fn nsa_emu_sample_expected_kept(cap: u32, k: u32, n: i32, out: *mut u64) -> c_int;
    fn nsa_emu_dense(
        id: *const c_char,
        shape: *const Shape,
        p: *const DensePrefillParams,
        status: *mut u32,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn nsa_emu_step_store(
        id: *const c_char,
        shape: *const Shape,
        a: *const StepStoreArgs,
        status: *mut u32,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn nsa_emu_read(
        id: *const c_char,
        shape: *const Shape,
        a: *const ReadArgs,
        status: *mut u32,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn nsa_emu_index_transform(
        id: *const c_char,
        shape: *const Shape,
        p: *const TransformParams,
        status: *mut u32,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// Runs one of the emulator's own test kernels (`tests/emu/selftest.cpp`) with
/// fiber order `seed`; `out` must hold what the kernel writes (at most 128 words).
pub fn selftest(name: &str, seed: u64, out: &mut [u32; 128]) -> std::result::Result<(), String> {
    let name = CString::new(name).expect("no NUL");
    let mut err = vec![0 as c_char; 1024];
    // SAFETY: the self-test kernels write at most 128 words of `out`, and a
    // NUL-terminated message into `err`.
    let rc = unsafe { nsa_emu_selftest(name.as_ptr(), seed, out.as_mut_ptr(), err.as_mut_ptr(), err.len()) };
    // SAFETY: as above.
    let msg = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
    if rc == 0 {
        Ok(())
    } else {
        Err(msg)
    }
}

/// `Sample<cap>::expected_kept<k>(n)` as the top-k kernels compute it (topk.cuh,
/// compiled for the host): cap 2048, 8192 or 24576, k 512, 1024 or 2048; None for
/// others.
pub fn kernel_sample_expected_kept(cap: u32, k: u32, n: i32) -> Option<u64> {
    let mut out = 0u64;
    // SAFETY: the entry writes one u64 through `out` and reads nothing else.
    let rc = unsafe { nsa_emu_sample_expected_kept(cap, k, n, &mut out) };
    (rc == 0).then_some(out)
}

/// Runs the sm_90a or gfx942 top-k kernels on the CPU.
#[derive(Clone, Debug)]
pub struct Emulator {
    /// Sm90a (32-lane warps, clusters) or Gfx942 (64-lane wavefronts, no clusters).
    pub target: Target,
    /// Seeds each CTA's fiber order (a missing barrier then shows as a wrong result).
    pub seed: u64,
    /// Clusters (or blocks) run at once, each on OS threads of its own.
    pub groups: u32,
}

impl Emulator {
    pub fn new(target: Target) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        Emulator { target, seed: 1, groups: cores.min(4) }
    }
}

impl Default for Emulator {
    fn default() -> Self {
        Emulator::new(Target::Sm90a)
    }
}

fn or_null<T>(v: Option<&[T]>) -> *const T {
    v.map_or(ptr::null(), <[T]>::as_ptr)
}

impl Emulator {
    fn shape(&self, spec: &KernelSpec, items: usize, cluster: u32) -> Result<Shape> {
        let grid = items.div_ceil(spec.tokens_per_block() as usize);
        Ok(Shape {
            grid: u32::try_from(grid).map_err(|_| Error::Other(format!("{}: grid of {grid} blocks", spec.id())))?,
            block_threads: spec.block_threads(),
            cluster,
            smem_bytes: spec.dynamic_smem_bytes(),
            groups: self.groups,
            pad: 0,
            seed: self.seed,
        })
    }

    /// Calls one of the C entry points, turning its status into an error naming `id`.
    fn call(id: &str, f: impl FnOnce(*const c_char, *mut c_char, usize) -> c_int) -> Result<()> {
        let cid = CString::new(id).expect("kernel ids have no NUL");
        let mut err = vec![0 as c_char; 1024];
        match f(cid.as_ptr(), err.as_mut_ptr(), err.len()) {
            0 => Ok(()),
            _ => {
                // SAFETY: the entry points write a NUL-terminated message into `err`.
                let msg = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
                Err(Error::Other(format!("emulated {id}: {msg}")))
            }
        }
    }
}

impl TopkDevice for Emulator {
    fn target(&self) -> Target {
        self.target
    }

    fn sm_count(&self) -> u32 {
        emulated_sms(self.target)
    }

    fn topk(&self, kernel: TopkKernel, inputs: &TopkInputs) -> Result<Vec<i32>> {
        let family = kernel.family;
        let spec = KernelSpec::new(family, self.target);
        let id = spec.id();
        let rows = inputs.rows();
        let mut out = vec![i32::MIN; rows * inputs.k as usize];
        if rows == 0 {
            return Ok(out);
        }
        let table = inputs.table.as_ref();
        let bf16_scores = if inputs.score == TopkScore::Bf16 { inputs.scores_bf16() } else { Vec::new() };
        let (page_magic, page_shift) = page_divisor(table.map_or(0, |t| t.page_size as u32));
        let params = TopkParams {
            scores: match inputs.score {
                TopkScore::F32 => inputs.scores.as_ptr().cast(),
                TopkScore::Bf16 => bf16_scores.as_ptr().cast(),
            },
            lengths: inputs.lengths.as_ptr(),
            row_starts: or_null(inputs.row_starts.as_deref()),
            page_table: or_null(table.map(|t| &t.table[..])),
            cu_seqlens_q: or_null(table.and_then(|t| t.cu_seqlens_q.as_deref())),
            offsets: or_null((!inputs.offsets.is_empty()).then_some(&inputs.offsets[..])),
            out: out.as_mut_ptr(),
            row_stride: inputs.row_stride as i64,
            table_stride: table.map_or(0, |t| t.width as i64),
            rows: rows as i32,
            row_capacity: inputs.row_capacity as i32,
            table_rows: table.map_or(0, |t| t.rows as i32),
            table_width: table.map_or(0, |t| t.width as i32),
            page_size: table.map_or(0, |t| t.page_size as i32),
            page_shift,
            page_magic,
        };
        match family {
            KernelFamily::TopkSplit { .. } => {
                let chunks = inputs.row_capacity.div_ceil(CHECK_SPLIT_CHUNK);
                let cap = spec.topk_split_list() as usize;
                // Zeroed once; every run must leave it zero again (the next reads it).
                let mut state = vec![0u32; rows * 2];
                let mut cand_idx = vec![0u32; rows * cap];
                let mut cand_key = vec![0u32; rows * cap];
                let split = SplitParams {
                    state: state.as_mut_ptr(),
                    cand_idx: cand_idx.as_mut_ptr(),
                    cand_key: cand_key.as_mut_ptr(),
                    chunk: CHECK_SPLIT_CHUNK as i32,
                    chunks: chunks as i32,
                    cand_cap: cap as i32,
                };
                let shape = self.shape(&spec, rows * chunks, 1)?;
                for run in 0..2 {
                    Self::call(&id, |cid, err, len| {
                        // SAFETY: every pointer covers what the kernel reads and writes for
                        // these rows (the launcher's checks hold for test inputs).
                        unsafe { nsa_emu_topk_split(cid, &shape, &params, &split, ptr::null_mut(), err, len) }
                    })?;
                    if let Some(i) = state.iter().position(|&w| w != 0) {
                        return Err(Error::Other(format!(
                            "emulated {id}: run {run} left split state word {i} at {} (must be zero)",
                            state[i]
                        )));
                    }
                }
            }
            KernelFamily::TopK { .. } | KernelFamily::TopkCluster { .. } => {
                let cluster = kernel.cluster;
                let shape = self.shape(&spec, rows * cluster as usize, cluster)?;
                Self::call(&id, |cid, err, len| {
                    // SAFETY: as above.
                    unsafe { nsa_emu_topk(cid, &shape, &params, ptr::null_mut(), err, len) }
                })?;
            }
            other => return Err(Error::Other(format!("{other:?} is not a top-k family"))),
        }
        Ok(out)
    }

    fn page_table_transform(&self, k: u32, idx: &[i32], table: &HostPageTable) -> Result<Vec<i32>> {
        // As the GPU launcher: the unfused transform reads a page_table_1.
        if table.page_size != 1 {
            return Err(Error::Other(format!(
                "emulated index transform: page_table.page_size is {}, must be 1 (a page_table_1)",
                table.page_size
            )));
        }
        let spec = KernelSpec::new(KernelFamily::IndexTransform { k }, self.target);
        let mut out = vec![i32::MIN; idx.len()];
        let params = TransformParams {
            idx: idx.as_ptr(),
            page_table: table.table.as_ptr(),
            cu_seqlens_q: or_null(table.cu_seqlens_q.as_deref()),
            out: out.as_mut_ptr(),
            table_stride: table.width as i64,
            rows: (idx.len() / k as usize) as i32,
            table_rows: table.rows as i32,
            table_width: table.width as i32,
        };
        let shape = self.shape(&spec, idx.len(), 1)?;
        Self::call(&spec.id(), |cid, err, len| {
            // SAFETY: idx and out hold rows × k elements, the table rows × width.
            unsafe { nsa_emu_index_transform(cid, &shape, &params, ptr::null_mut(), err, len) }
        })?;
        Ok(out)
    }
}

impl DenseDevice for Emulator {
    fn target(&self) -> Target {
        self.target
    }

    /// The scalar kernel only (the one gfx942 runs), at [`EMU_DENSE_HEADS`] heads.
    fn dense(&self, shape: &DenseShape, x: &DenseHostInputs<'_>) -> Result<(Vec<bf16>, Vec<f32>)> {
        let family =
            KernelFamily::DensePrefill { heads: shape.heads, d_qk: shape.d_qk, d_v: shape.d_v, kernel: shape.kernel };
        let spec = KernelSpec::new(family, self.target);
        let (h, dv) = (shape.heads as usize, shape.d_v as usize);
        let mut out = vec![bf16::from_f32(7.0); shape.rows * h * dv];
        let mut lse = vec![7.0f32; shape.rows * h];
        let grid = shape.grid(emulated_sms(self.target));
        if grid == 0 {
            return Ok((out, lse));
        }
        let addr = |p: *const u8| p as u64;
        let addrs = [
            addr(x.q.as_ptr().cast()),
            addr(x.k.as_ptr().cast()),
            addr(x.v.as_ptr().cast()),
            addr(x.cu_seqlens_q.as_ptr().cast()),
            addr(x.cu_seqlens_k.as_ptr().cast()),
            addr(out.as_mut_ptr().cast()),
            addr(lse.as_mut_ptr().cast()),
        ];
        let params = DensePrefillParams::new(shape, addrs, x.sm_scale, emulated_sms(self.target));
        let launch = Shape {
            grid: u32::try_from(grid).map_err(|_| Error::Other(format!("{}: grid of {grid} blocks", spec.id())))?,
            block_threads: spec.block_threads(),
            cluster: 1,
            smem_bytes: spec.dynamic_smem_bytes(),
            groups: self.groups,
            pad: 0,
            seed: self.seed,
        };
        let mut status = [0u32; 4];
        // SAFETY: every pointer covers what the kernel reads or writes for `shape`
        // (the buffers are sized from it above and by the caller), and `status` the
        // kernel's report words.
        Self::call(&spec.id(), |cid, err, len| unsafe {
            nsa_emu_dense(cid, &launch, &params, status.as_mut_ptr(), err, len)
        })?;
        if status[0] != 0 {
            return Err(Error::Other(format!("{}: the kernel reported {} bad sequence(s)", spec.id(), status[0])));
        }
        Ok((out, lse))
    }
}

impl Emulator {
    /// The step store of `loc.len()` tokens: `rows` (`[n, 576]` bf16, nope then
    /// rope) into `cache` and `keys` (`[n, 128]` bf16) into `index_cache`
    /// (`[pages, 8448]` bytes), one launch. Returns the rejected tokens the kernel
    /// counted (its status word).
    pub fn step_store(
        &self,
        rows: &[bf16],
        keys: &[bf16],
        loc: &[i32],
        cache: EmuMlaCache<'_>,
        index_cache: &mut [u8],
    ) -> Result<u32> {
        use nsa_kernels::layout::*;
        let n = loc.len();
        assert!(rows.len() == n * BF16_TOKEN_ELEMS && keys.len() == n * INDEXER_HEAD_DIM, "rows and keys of n tokens");
        assert!(index_cache.len() % INDEXER_PAGE_BYTES == 0, "whole indexer pages");
        let (format, cache_bytes, pool): (_, &mut [u8], _) = match cache {
            EmuMlaCache::Fp8(c) => {
                let pool = c.len() / FP8_TOKEN_BYTES;
                (KvCacheFormat::Fp8, c, pool)
            }
            EmuMlaCache::Bf16(c) => {
                let pool = c.len() / BF16_TOKEN_ELEMS;
                // SAFETY: bf16 is two plain bytes; the view covers the same memory.
                let bytes = unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr().cast::<u8>(), c.len() * 2) };
                (KvCacheFormat::Bf16, bytes, pool)
            }
        };
        let spec = KernelSpec::new(KernelFamily::StepStore { format }, self.target);
        let blocks = nsa_kernels::spec::step_store_blocks(n);
        if blocks == 0 {
            return Ok(0);
        }
        // The kernel moves 16-byte vectors: every buffer goes through 16-byte-aligned copies.
        let (rows_a, keys_a) = (Aligned::of(rows), Aligned::of(keys));
        let (mut cache_a, mut index_a) = (Aligned::of(cache_bytes), Aligned::of(index_cache));
        let args = StepStoreArgs {
            k_nope: rows_a.ptr().cast(),
            nope_stride: BF16_TOKEN_ELEMS as i64,
            k_rope: rows_a.ptr().cast::<bf16>().wrapping_add(KV_LORA_RANK),
            rope_stride: BF16_TOKEN_ELEMS as i64,
            index_k: keys_a.ptr().cast(),
            index_stride: INDEXER_HEAD_DIM as i64,
            loc: loc.as_ptr(),
            num_tokens: i32::try_from(n).map_err(|_| Error::Other(format!("{n} tokens")))?,
            pad: 0,
            cache: cache_a.ptr_mut().cast(),
            pool_slots: pool as i64,
            index_cache: index_a.ptr_mut(),
            index_pool_slots: (index_cache.len() / INDEXER_PAGE_BYTES * INDEXER_PAGE_TOKENS) as i64,
        };
        let shape = self.shape(&spec, blocks, 1)?;
        let mut status = [0u32; 4];
        // SAFETY: the pointers cover n rows, n keys, `pool` cache rows and the index
        // pages; the kernel writes only slots inside each pool.
        Self::call(&spec.id(), |cid, err, len| unsafe {
            nsa_emu_step_store(cid, &shape, &args, status.as_mut_ptr(), err, len)
        })?;
        cache_a.copy_to(cache_bytes);
        index_a.copy_to(index_cache);
        Ok(status[0])
    }
}

impl Emulator {
    /// The MLA cache read back as bf16 rows (`kv_dequant`): FP8-656 `cache` bytes
    /// dequantized, or bf16 rows (`cache` holding their bytes) copied, for slots
    /// `idx`. Returns the rows and the rejected slots the kernel counted.
    pub fn read_rows(&self, format: KvCacheFormat, cache: &[u8], idx: &[i32]) -> Result<(Vec<bf16>, u32)> {
        use nsa_kernels::layout::*;
        let row_bytes = if format == KvCacheFormat::Fp8 { FP8_TOKEN_BYTES } else { 2 * BF16_TOKEN_ELEMS };
        let mut out = Aligned::of(&vec![0xa5u8; idx.len() * 2 * BF16_TOKEN_ELEMS]);
        let spec = KernelSpec::new(KernelFamily::KvDequant { format }, self.target);
        let counted = self.read(&spec, cache, cache.len() / row_bytes, idx, out.ptr_mut(), ptr::null_mut())?;
        let mut rows = vec![bf16::ZERO; idx.len() * BF16_TOKEN_ELEMS];
        // SAFETY: bf16 is two plain bytes; the view covers the same memory.
        out.copy_to(unsafe { std::slice::from_raw_parts_mut(rows.as_mut_ptr().cast::<u8>(), rows.len() * 2) });
        Ok((rows, counted))
    }

    /// The indexer keys and scales of `slots` out of the paged indexer cache
    /// (`[pages, 8448]` bytes). Returns keys, scales and the rejected slots counted.
    pub fn gather_indexer_k(&self, cache: &[u8], slots: &[i32]) -> Result<(Vec<u8>, Vec<f32>, u32)> {
        use nsa_kernels::layout::*;
        let n = slots.len();
        let mut keys = Aligned::of(&vec![0xa5u8; n * INDEXER_HEAD_DIM]);
        let mut scales = vec![f32::from_bits(0xa5a5_a5a5); n];
        let spec = KernelSpec::new(KernelFamily::IndexerKGather, self.target);
        let pool = cache.len() / INDEXER_PAGE_BYTES * INDEXER_PAGE_TOKENS;
        let counted = self.read(&spec, cache, pool, slots, keys.ptr_mut(), scales.as_mut_ptr())?;
        let mut key_bytes = vec![0u8; n * INDEXER_HEAD_DIM];
        keys.copy_to(&mut key_bytes);
        Ok((key_bytes, scales, counted))
    }

    /// Launches one cache read over `idx.len()` tokens of a `pool`-slot cache.
    fn read(
        &self,
        spec: &KernelSpec,
        cache: &[u8],
        pool: usize,
        idx: &[i32],
        out: *mut u8,
        scales: *mut f32,
    ) -> Result<u32> {
        let n = idx.len();
        if n == 0 {
            return Ok(0);
        }
        let cache_a = Aligned::of(cache);
        let args = ReadArgs {
            cache: cache_a.ptr().cast(),
            pool_slots: pool as i64,
            idx: idx.as_ptr(),
            num_tokens: i32::try_from(n).map_err(|_| Error::Other(format!("{n} tokens")))?,
            pad: 0,
            out: out.cast(),
            scales,
        };
        let shape = self.shape(spec, n, 1)?;
        let mut status = [0u32; 4];
        // SAFETY: `cache` covers `pool` slots, `out` (and `scales`) n tokens' output.
        Self::call(&spec.id(), |cid, err, len| unsafe {
            nsa_emu_read(cid, &shape, &args, status.as_mut_ptr(), err, len)
        })?;
        Ok(status[0])
    }
}

/// A 16-byte-aligned copy of a buffer's bytes.
struct Aligned {
    words: Vec<u128>,
    len: usize,
}

impl Aligned {
    fn of<T: Copy>(data: &[T]) -> Aligned {
        let len = std::mem::size_of_val(data);
        let mut words = vec![0u128; len.div_ceil(16)];
        // SAFETY: `words` holds at least `len` bytes; the source is `len` plain bytes.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr().cast::<u8>(), words.as_mut_ptr().cast::<u8>(), len) };
        Aligned { words, len }
    }

    fn ptr(&self) -> *const u8 {
        self.words.as_ptr().cast()
    }

    fn ptr_mut(&mut self) -> *mut u8 {
        self.words.as_mut_ptr().cast()
    }

    fn copy_to(&self, out: &mut [u8]) {
        assert_eq!(out.len(), self.len);
        // SAFETY: both hold `len` bytes and do not overlap.
        unsafe { ptr::copy_nonoverlapping(self.ptr(), out.as_mut_ptr(), self.len) };
    }
}
