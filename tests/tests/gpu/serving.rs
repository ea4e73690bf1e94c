//! nsa inside a server's step loop: launching on the caller's stream (a cudarc
//! stream, or a raw borrowed `CUstream`), capture of an eager call into a CUDA
//! graph on that stream, runtimes per stream sharing one cache, and buffers nsa
//! does not own.

use super::assert_all;
use cudarc::driver::result::stream::StreamKind;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaStream};
use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::KvCacheFormat;
use nsa_runtime::device::Gpu;
use nsa_runtime::foreign::ForeignBuffer;
use nsa_runtime::ops::kv_cache::{self, MlaCacheMut};
use nsa_runtime::reference::kv_cache as reference;
use nsa_runtime::verify::{self, download, split_rows, upload};
use nsa_runtime::{testdata, Runtime};
use std::sync::Arc;

/// A stream the "server" made on device 0's primary context, which tracks no events
/// (so launches on it can be captured).
fn server_stream() -> Arc<CudaStream> {
    let ctx = CudaContext::new(0).unwrap();
    // SAFETY: this context object has no buffers yet.
    unsafe { ctx.disable_event_tracking() };
    ctx.new_stream().unwrap()
}

#[test]
fn a_runtime_on_the_caller_s_stream_launches_there() {
    let stream = server_stream();
    let rt = Runtime::on_gpu(Gpu::on_stream(stream.clone()).unwrap()).unwrap();
    assert!(Arc::ptr_eq(rt.gpu().stream(), &stream));
    assert_all(&[
        verify::store_mla(&rt, KvCacheFormat::Fp8, 1000, 3).unwrap(),
        verify::store_indexer(&rt, 1000, 4).unwrap(),
    ]);
}

#[test]
fn an_eager_call_captures_into_a_graph_on_the_caller_s_stream() {
    let stream = server_stream();
    let rt = Runtime::on_gpu(Gpu::on_stream(stream.clone()).unwrap()).unwrap();
    let n = 777;
    let pool = 2048;
    let rows = testdata::mla_rows(n, 9);
    let loc = testdata::distinct_slots(n, pool, 10);
    let d_rows = upload(&stream, &rows).unwrap();
    let d_loc = upload(&stream, &loc).unwrap();
    let mut d_cache = upload(&stream, &vec![0xa5u8; pool * FP8_TOKEN_BYTES]).unwrap();
    let (nope, rope) = verify::latent_views(&d_rows, n);
    // The kernel is compiled and loaded before capture (loading is not capturable).
    rt.kernel(nsa_kernels::KernelFamily::KvStore { format: KvCacheFormat::Fp8 }).unwrap();
    stream.synchronize().unwrap();

    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let stored =
        kv_cache::store_mla(&rt, &nope, &rope, &d_loc.slice(0..n), &mut MlaCacheMut::Fp8(d_cache.slice_mut(0..)));
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    stored.unwrap();
    let graph = graph.unwrap().expect("the call was captured, not run");
    // Captured, not run: the cache is untouched until the graph is launched.
    assert!(download(&stream, &d_cache, pool * FP8_TOKEN_BYTES).unwrap().iter().all(|&b| b == 0xa5));
    graph.launch().unwrap();
    let got = download(&stream, &d_cache, pool * FP8_TOKEN_BYTES).unwrap();
    let mut want = vec![0xa5u8; pool * FP8_TOKEN_BYTES];
    let (nope_h, rope_h) = split_rows(&rows);
    reference::store_fp8(&nope_h, &rope_h, &loc, &mut want);
    assert!(got == want, "the graph's store differs from the reference");
}

#[test]
fn a_borrowed_raw_stream_is_used_and_never_destroyed_by_nsa() {
    let ctx = CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    let raw = cudarc::driver::result::stream::create(StreamKind::NonBlocking).unwrap();
    {
        // SAFETY: `raw` lives until destroyed below, after the runtime is gone.
        let gpu = unsafe { Gpu::on_borrowed_stream(0, raw) }.unwrap();
        assert_eq!(gpu.stream().cu_stream(), raw);
        let rt = Runtime::on_gpu(gpu).unwrap();
        assert_all(&[verify::store_mla(&rt, KvCacheFormat::Bf16, 500, 5).unwrap()]);
    }
    // Still ours to destroy: nsa did not.
    // SAFETY: created above, destroyed once.
    unsafe { cudarc::driver::result::stream::destroy(raw) }.unwrap();
    // A null handle is the legacy default stream (PyTorch's default stream).
    // SAFETY: the legacy default stream always exists.
    let gpu = unsafe { Gpu::on_borrowed_stream(0, std::ptr::null_mut()) }.unwrap();
    assert!(gpu.stream().cu_stream().is_null());
    let rt = Runtime::on_gpu(gpu).unwrap();
    assert_all(&[verify::store_mla(&rt, KvCacheFormat::Bf16, 300, 7).unwrap()]);
}

#[test]
fn runtimes_per_stream_share_the_cache_and_loaded_kernels() {
    let first = server_stream();
    let a = Runtime::on_gpu(Gpu::on_stream(first.clone()).unwrap()).unwrap();
    assert_all(&[verify::store_mla(&a, KvCacheFormat::Fp8, 100, 6).unwrap()]);
    let before = a.cache().stats();
    let second = first.context().new_stream().unwrap();
    let b = a.with_stream(second.clone()).unwrap();
    assert!(Arc::ptr_eq(a.shared_cache(), b.shared_cache()));
    assert!(Arc::ptr_eq(b.gpu().stream(), &second));
    assert_all(&[verify::store_mla(&b, KvCacheFormat::Fp8, 100, 7).unwrap()]);
    let after = b.cache().stats();
    assert_eq!(
        (after.compiles, after.disk_hits),
        (before.compiles, before.disk_hits),
        "nothing compiled or loaded again"
    );
    assert!(after.memory_hits > before.memory_hits);
    // Runtimes are Send + Sync: launch from two threads, each on its own stream.
    std::thread::scope(|s| {
        s.spawn(|| assert_all(&[verify::store_indexer(&a, 300, 8).unwrap()]));
        s.spawn(|| assert_all(&[verify::store_indexer(&b, 300, 9).unwrap()]));
    });
}

#[test]
fn foreign_buffers_are_used_in_place_and_never_freed_by_nsa() {
    let stream = server_stream();
    let rt = Runtime::on_gpu(Gpu::on_stream(stream.clone()).unwrap()).unwrap();
    let (n, pool) = (300, 1024);
    let rows = testdata::mla_rows(n, 11);
    let loc = testdata::distinct_slots(n, pool, 12);
    let cache_bytes = pool * BF16_TOKEN_ELEMS * 2;
    stream.context().bind_to_thread().unwrap();
    // Memory the "server" allocated itself, outside nsa and cudarc's slices.
    // SAFETY: plain allocations, freed once at the end of the test.
    let (raw_cache, raw_loc) = unsafe {
        (cudarc::driver::result::malloc_sync(cache_bytes).unwrap(), cudarc::driver::result::malloc_sync(n * 4).unwrap())
    };
    {
        // SAFETY: both allocations outlive the buffers; all work is on `stream`.
        let mut cache =
            unsafe { ForeignBuffer::<bf16>::from_raw("kv_cache", &stream, raw_cache, pool * BF16_TOKEN_ELEMS) }
                .unwrap();
        let mut d_loc = unsafe { ForeignBuffer::<i32>::from_raw("out_cache_loc", &stream, raw_loc, n) }.unwrap();
        stream.memcpy_htod(&loc, &mut d_loc.view_mut()).unwrap();
        let init = vec![bf16::from_bits(0xa5a5); pool * BF16_TOKEN_ELEMS];
        stream.memcpy_htod(&init, &mut cache.view_mut()).unwrap();
        let d_rows = upload(&stream, &rows).unwrap();
        let (nope, rope) = verify::latent_views(&d_rows, n);
        kv_cache::store_mla(&rt, &nope, &rope, &d_loc.view(), &mut MlaCacheMut::Bf16(cache.view_mut())).unwrap();
        let mut got = vec![bf16::ZERO; pool * BF16_TOKEN_ELEMS];
        stream.memcpy_dtoh(&cache.view(), &mut got).unwrap();
        let mut want = init;
        let (nope_h, rope_h) = split_rows(&rows);
        reference::store_bf16(&nope_h, &rope_h, &loc, &mut want);
        // Bits, not values: the rows hold NaNs on purpose.
        let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
        assert!(bits(&got) == bits(&want), "the store into the foreign cache differs from the reference");

        // What cannot be right is refused, naming the buffer.
        // SAFETY: each is refused before it is used.
        let past =
            unsafe { ForeignBuffer::<bf16>::from_raw("kv_cache", &stream, raw_cache, pool * BF16_TOKEN_ELEMS + 1) };
        let err = past.unwrap_err().to_string();
        assert!(err.contains("`kv_cache`") && err.contains("inside its allocation"), "{err}");
        let odd = unsafe { ForeignBuffer::<u8>::from_raw("index_k", &stream, raw_cache + 1, 64) };
        assert!(odd.unwrap_err().to_string().contains("`index_k`"));
        let host = vec![0u8; 4096];
        let on_host = unsafe { ForeignBuffer::<u8>::from_raw("q", &stream, (host.as_ptr() as u64 + 15) & !15, 64) };
        let err = on_host.unwrap_err().to_string();
        assert!(err.contains("`q`"), "{err}");
    }
    stream.synchronize().unwrap();
    // The buffers are gone and the memory is still the server's to free, once.
    // SAFETY: allocated above; nsa never freed them.
    unsafe {
        cudarc::driver::result::free_sync(raw_cache).unwrap();
        cudarc::driver::result::free_sync(raw_loc).unwrap();
    }
}

/// The server-loop example (tests/server-loop): its own stream, pool, page table and
/// activations; chunked prefill with device-built metadata, decode through one CUDA
/// graph per batch size, requests retired and admitted between steps; every step
/// checked against the CPU reference.
#[test]
fn the_server_loop_example_serves_every_step_correctly() {
    let opts = nsa_server_loop::Options::default();
    let report = nsa_server_loop::run(&opts).unwrap();
    for c in &report.checks {
        eprintln!("{c}");
    }
    assert_eq!(report.decode_steps, opts.decode_steps);
    assert!(report.prefill_steps >= 8, "the prompts took {} chunked prefill steps", report.prefill_steps);
    assert_eq!(report.graphs, 2, "decode ran at two batch sizes, one graph each");
    assert_eq!((report.admitted, report.retired), (4, 4), "every request ran to its end");
    assert_eq!(report.checks.len(), 2 * (report.prefill_steps + report.decode_steps));
    assert_all(&report.checks);
}
