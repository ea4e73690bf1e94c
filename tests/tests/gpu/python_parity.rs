//! The Rust side of the Python package's bit-for-bit check: each op the package
//! exposes runs here on seeded random inputs, twice (the results must agree in
//! every bit), and with `NSA_PARITY_DIR` set, its inputs and outputs are written
//! there (`manifest.json` + one raw little-endian file per array) for
//! `nsa-runtime/python/tests/test_parity_gpu.py`, which runs the same inputs
//! through `nsa`'s Python functions and compares the bits.

use super::rt;
use cudarc::driver::{CudaSlice, DeviceRepr};
use half::bf16;
use nsa_kernels::layout::*;
use nsa_runtime::ops::indexer::{self, IndexerQuery, LogitsOut, PagedIndexerKeys, RaggedIndexerKeys};
use nsa_runtime::ops::sparse_decode::{self, DecodePlan, DecodeShape, Fp8PagedCache, SparseDecodeInputs};
use nsa_runtime::ops::sparse_prefill::{self, PrefillQuery, PrefillShape, SparsePrefillInputs, SparsePrefillOutputs};
use nsa_runtime::ops::topk::{self, PageTable, TopkOutput, TopkScores};
use nsa_runtime::ops::Rows;
use nsa_runtime::verify::{download, upload};
use nsa_runtime::Runtime;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::path::PathBuf;

/// Arrays of one case, written as `<case>.<name>.bin` with their dtype and shape.
struct Dump {
    dir: Option<PathBuf>,
    manifest: Map<String, Value>,
}

/// How an element is written and named for numpy.
trait Elem: DeviceRepr + Default + Copy {
    const DTYPE: &'static str;
    fn bytes(v: &[Self]) -> Vec<u8>;
}

macro_rules! elem {
    ($t:ty, $name:literal, $to:expr) => {
        impl Elem for $t {
            const DTYPE: &'static str = $name;
            fn bytes(v: &[Self]) -> Vec<u8> {
                v.iter().flat_map($to).collect()
            }
        }
    };
}
elem!(u8, "uint8", |x: &u8| [*x]);
elem!(i32, "int32", |x: &i32| x.to_le_bytes());
elem!(f32, "float32", |x: &f32| x.to_le_bytes());
elem!(bf16, "bfloat16", |x: &bf16| x.to_bits().to_le_bytes());

impl Dump {
    fn new() -> Dump {
        let dir = std::env::var_os("NSA_PARITY_DIR").map(PathBuf::from);
        if let Some(d) = &dir {
            std::fs::create_dir_all(d).expect("creating NSA_PARITY_DIR");
        }
        Dump { dir, manifest: Map::new() }
    }

    fn put<T: Elem>(&mut self, case: &str, name: &str, shape: &[usize], data: &[T]) {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "{case}.{name}: shape and length differ");
        let file = format!("{case}.{name}.bin");
        if let Some(d) = &self.dir {
            std::fs::write(d.join(&file), T::bytes(data)).expect("writing a parity array");
        }
        let entry = self.manifest.entry(case.to_string()).or_insert_with(|| json!({}));
        entry[name] = json!({ "dtype": T::DTYPE, "shape": shape, "file": file });
    }

    fn finish(self) {
        if let Some(d) = &self.dir {
            let text = serde_json::to_string_pretty(&Value::Object(self.manifest)).unwrap();
            std::fs::write(d.join("manifest.json"), text).expect("writing the parity manifest");
        }
    }
}

fn up<T: DeviceRepr + Copy + Default>(rt: &Runtime, v: &[T]) -> CudaSlice<T> {
    upload(rt.gpu().stream(), v).unwrap()
}

fn down<T: DeviceRepr + Copy + Default>(rt: &Runtime, v: &CudaSlice<T>) -> Vec<T> {
    download(rt.gpu().stream(), v, v.len()).unwrap()
}

/// Runs `op` twice into fresh outputs; the two must agree in every bit.
fn twice<T: PartialEq + std::fmt::Debug>(what: &str, mut op: impl FnMut() -> T) -> T {
    let (a, b) = (op(), op());
    assert!(a == b, "{what}: two runs on the same inputs differ");
    a
}

fn uniform_f32(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

fn uniform_bf16(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    (0..n).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect()
}

/// Finite e4m3 bytes (exponent field never all ones).
fn e4m3_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.random::<u8>() & 0x77).collect()
}

fn topk_cases(rt: &Runtime, dump: &mut Dump, rng: &mut StdRng) {
    let (rows, n, k) = (4usize, 8192usize, 2048usize);
    let scores = uniform_f32(rng, rows * n, 0.0, 1.0);
    let lengths = vec![n as i32, 100, 5000, 0];
    let starts = vec![0, 7, 64, 0];
    let table: Vec<i32> = (0..rows * n).map(|_| rng.random_range(0..1 << 20)).collect();
    let offsets = vec![0, 10, 20_000, 7];
    let (d_s, d_l, d_st) = (up(rt, &scores), up(rt, &lengths), up(rt, &starts));
    let (d_t, d_o) = (up(rt, &table), up(rt, &offsets));
    for case in ["topk_plain", "topk_paged", "topk_ragged"] {
        let got = twice(case, || {
            let (sv, lv, stv, tv, ov) = (d_s.slice(..), d_l.slice(..), d_st.slice(..), d_t.slice(..), d_o.slice(..));
            let scores =
                TopkScores { scores: &sv, row_stride: n, row_capacity: n, lengths: &lv, row_starts: Some(&stv) };
            let output = match case {
                "topk_paged" => TopkOutput::Paged(PageTable {
                    table: &tv,
                    rows,
                    width: n,
                    stride: n,
                    page_size: 1,
                    cu_seqlens_q: None,
                }),
                "topk_ragged" => TopkOutput::Ragged { offsets: &ov },
                _ => TopkOutput::Plain,
            };
            let mut out: CudaSlice<i32> = up(rt, &vec![0; rows * k]);
            topk::topk(rt, k as u32, false, &scores, &output, &mut out.slice_mut(..), None).unwrap();
            down(rt, &out)
        });
        dump.put(case, "score", &[rows, n], &scores);
        dump.put(case, "lengths", &[rows], &lengths);
        dump.put(case, "row_starts", &[rows], &starts);
        match case {
            "topk_paged" => dump.put(case, "page_table", &[rows, n], &table),
            "topk_ragged" => dump.put(case, "offsets", &[rows], &offsets),
            _ => {}
        }
        dump.put(case, "out", &[rows, k], &got);
    }
}

/// `tokens` FP8-656 records: finite e4m3 values, scales in [0.002, 0.02), bf16 rope.
fn fp8_records(rng: &mut StdRng, tokens: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(tokens * FP8_TOKEN_BYTES);
    for _ in 0..tokens {
        out.extend(e4m3_bytes(rng, KV_LORA_RANK));
        for _ in 0..FP8_SCALE_TILES {
            out.extend(rng.random_range(0.002f32..0.02).to_le_bytes());
        }
        for r in uniform_bf16(rng, ROPE_DIM) {
            out.extend(r.to_bits().to_le_bytes());
        }
    }
    out
}

fn decode_case(rt: &Runtime, dump: &mut Dump, rng: &mut StdRng) {
    let (b, s_q, h, k, page, pages) = (3usize, 2usize, 64u32, 2048u32, 64usize, 96usize);
    let tokens = pages * page;
    let q = uniform_bf16(rng, b * s_q * h as usize * BF16_TOKEN_ELEMS);
    let cache = fp8_records(rng, tokens);
    // Distinct slots a row, with -1 holes.
    let indices: Vec<i32> = (0..b * s_q)
        .flat_map(|_| {
            let mut row: Vec<i32> = (0..tokens as i32).collect();
            for i in 0..k as usize {
                let j = rng.random_range(i..tokens);
                row.swap(i, j);
            }
            row.truncate(k as usize);
            row.iter_mut().step_by(7).for_each(|v| *v = -1);
            row
        })
        .collect();
    let topk_length: Vec<i32> = (0..b * s_q).map(|r| [k as i32, 1000, 64, 0, 2047, 513][r % 6]).collect();
    let shape = DecodeShape { batch: b, s_q, heads: h, topk: k, page_size: page as u32 };
    let plan = DecodePlan::new(shape, rt.launch_target()).unwrap();
    let (d_q, d_c, d_i, d_tl) = (up(rt, &q), up(rt, &cache), up(rt, &indices), up(rt, &topk_length));
    let rows = b * s_q * h as usize;
    let sm_scale = DEEPSEEK_V32_SM_SCALE;
    let (out, lse) = twice("sparse_decode", || {
        let mut o: CudaSlice<bf16> = up(rt, &vec![bf16::ZERO; rows * KV_LORA_RANK]);
        let mut l: CudaSlice<f32> = up(rt, &vec![0.0; rows]);
        let mut ws: CudaSlice<f32> = up(rt, &vec![0.0; plan.workspace_floats().max(1)]);
        let inputs = SparseDecodeInputs {
            q: d_q.slice(..),
            cache: Fp8PagedCache { data: d_c.slice(..), page_size: page as u32, page_stride: page * FP8_TOKEN_BYTES },
            indices: d_i.slice(..),
            topk_length: Some(d_tl.slice(..)),
            sm_scale,
        };
        sparse_decode::sparse_decode(
            rt,
            &plan,
            &inputs,
            &mut o.slice_mut(..),
            &mut l.slice_mut(..),
            &mut ws.slice_mut(..),
        )
        .unwrap();
        (
            down(rt, &o).iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            down(rt, &l).iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        )
    });
    let c = "sparse_decode";
    dump.put(c, "q", &[b, s_q, h as usize, BF16_TOKEN_ELEMS], &q);
    dump.put(c, "k_cache", &[pages, page, 1, FP8_TOKEN_BYTES], &cache);
    dump.put(c, "indices", &[b, s_q, k as usize], &indices);
    dump.put(c, "topk_length", &[b * s_q], &topk_length);
    dump.put(c, "sm_scale", &[1], &[sm_scale]);
    dump.put(
        c,
        "out",
        &[b, s_q, h as usize, KV_LORA_RANK],
        &out.iter().map(|&v| bf16::from_bits(v)).collect::<Vec<_>>(),
    );
    dump.put(c, "lse", &[b, s_q, h as usize], &lse.iter().map(|&v| f32::from_bits(v)).collect::<Vec<_>>());
}

fn prefill_case(rt: &Runtime, dump: &mut Dump, rng: &mut StdRng) {
    let (s_q, h, k, s_kv) = (40usize, 64u32, 2048u32, 5000usize);
    let d = BF16_TOKEN_ELEMS;
    let q = uniform_bf16(rng, s_q * h as usize * d);
    let kv = uniform_bf16(rng, s_kv * d);
    // Any index: -1 and >= s_kv are masked.
    let indices: Vec<i32> = (0..s_q * k as usize).map(|_| rng.random_range(-1..s_kv as i32 + 3)).collect();
    let topk_length: Vec<i32> = (0..s_q).map(|r| [k as i32, 1, 700, 0][r % 4]).collect();
    let shape = PrefillShape { s_q, heads: h, topk: k, d_qk: d as u32, target: rt.target() };
    let (d_q, d_kv, d_i, d_tl) = (up(rt, &q), up(rt, &kv), up(rt, &indices), up(rt, &topk_length));
    let rows = s_q * h as usize;
    let sm_scale = 0.0417f32;
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let (out, max_logits, lse) = twice("sparse_prefill", || {
        let mut o: CudaSlice<bf16> = up(rt, &vec![bf16::ZERO; rows * KV_LORA_RANK]);
        let (mut m, mut l): (CudaSlice<f32>, CudaSlice<f32>) = (up(rt, &vec![0.0; rows]), up(rt, &vec![0.0; rows]));
        let inputs = SparsePrefillInputs {
            query: PrefillQuery {
                q: d_q.slice(..),
                indices: d_i.slice(..),
                topk_length: Some(d_tl.slice(..)),
                sm_scale,
            },
            kv: Rows { data: d_kv.slice(..), count: s_kv, width: d, stride: d },
        };
        let outputs = SparsePrefillOutputs {
            out: &mut o.slice_mut(..),
            max_logits: &mut m.slice_mut(..),
            lse: &mut l.slice_mut(..),
        };
        sparse_prefill::sparse_prefill(rt, &shape, &inputs, outputs).unwrap();
        (down(rt, &o).iter().map(|v| v.to_bits()).collect::<Vec<_>>(), bits(down(rt, &m)), bits(down(rt, &l)))
    });
    let c = "sparse_prefill";
    let f = |v: &[u32]| v.iter().map(|&x| f32::from_bits(x)).collect::<Vec<_>>();
    dump.put(c, "q", &[s_q, h as usize, d], &q);
    dump.put(c, "kv", &[s_kv, 1, d], &kv);
    dump.put(c, "indices", &[s_q, 1, k as usize], &indices);
    dump.put(c, "topk_length", &[s_q], &topk_length);
    dump.put(c, "sm_scale", &[1], &[sm_scale]);
    dump.put(c, "out", &[s_q, h as usize, KV_LORA_RANK], &out.iter().map(|&v| bf16::from_bits(v)).collect::<Vec<_>>());
    dump.put(c, "max_logits", &[s_q, h as usize], &f(&max_logits));
    dump.put(c, "lse", &[s_q, h as usize], &f(&lse));
}

fn indexer_cases(rt: &Runtime, dump: &mut Dump, rng: &mut StdRng) {
    let h = 64usize;
    // PAGED: 3 requests, next_n 2, tables of 20 pages over a pool of 48.
    let (batch, next_n, width, pages) = (3usize, 2usize, 20usize, 48usize);
    let mut cache = e4m3_bytes(rng, pages * INDEXER_PAGE_BYTES);
    for p in 0..pages {
        for t in 0..INDEXER_PAGE_TOKENS {
            let at = p * INDEXER_PAGE_BYTES + INDEXER_PAGE_TOKENS * INDEXER_HEAD_DIM + 4 * t;
            cache[at..at + 4].copy_from_slice(&rng.random_range(0.001f32..0.02).to_le_bytes());
        }
    }
    let table: Vec<i32> = (0..batch * width).map(|_| rng.random_range(0..pages as i32)).collect();
    let context_lens = vec![1280, 65, 700];
    let q = e4m3_bytes(rng, batch * next_n * h * INDEXER_HEAD_DIM);
    let weights = uniform_f32(rng, batch * next_n * h, -0.05, 0.05);
    let logits_w = width * INDEXER_PAGE_TOKENS;
    let (d_c, d_t, d_l, d_q, d_w) =
        (up(rt, &cache), up(rt, &table), up(rt, &context_lens), up(rt, &q), up(rt, &weights));
    let paged = twice("indexer_paged", || {
        let mut out: CudaSlice<f32> = up(rt, &vec![0.0; batch * next_n * logits_w]);
        let query = IndexerQuery { heads: h as u32, q: d_q.slice(..), weights: d_w.slice(..) };
        let keys = PagedIndexerKeys {
            cache: d_c.slice(..),
            block_table: d_t.slice(..),
            table_width: width,
            context_lens: d_l.slice(..),
            next_n,
        };
        indexer::paged_logits(rt, &query, &keys, LogitsOut::new(&mut out.slice_mut(..), logits_w)).unwrap();
        down(rt, &out).iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    });
    let c = "indexer_paged";
    dump.put(c, "q", &[batch, next_n, h, INDEXER_HEAD_DIM], &q);
    dump.put(c, "kv_cache", &[pages, INDEXER_PAGE_TOKENS, 1, INDEXER_TOKEN_BYTES], &cache);
    dump.put(c, "weights", &[batch * next_n, h], &weights);
    dump.put(c, "context_lens", &[batch], &context_lens);
    dump.put(c, "block_table", &[batch, width], &table);
    dump.put(c, "out", &[batch * next_n, logits_w], &paged.iter().map(|&v| f32::from_bits(v)).collect::<Vec<_>>());

    // RAGGED: 9 rows over 3000 keys, each row its own window.
    let (rows, keys_n) = (9usize, 3000usize);
    let k = e4m3_bytes(rng, keys_n * INDEXER_HEAD_DIM);
    let scales = uniform_f32(rng, keys_n, 0.001, 0.02);
    let ks: Vec<i32> = (0..rows).map(|r| [0, 5, 64, 0, 1000, 2999, 17, 0, 300][r]).collect();
    let ke: Vec<i32> = (0..rows).map(|r| [1, 70, 3000, 0, 2000, 3000, 18, 2048, 301][r]).collect();
    let rq = e4m3_bytes(rng, rows * h * INDEXER_HEAD_DIM);
    let rw = uniform_f32(rng, rows * h, -0.05, 0.05);
    let (d_k, d_s, d_ks, d_ke, d_rq, d_rw) =
        (up(rt, &k), up(rt, &scales), up(rt, &ks), up(rt, &ke), up(rt, &rq), up(rt, &rw));
    let ragged = twice("indexer_ragged", || {
        let mut out: CudaSlice<f32> = up(rt, &vec![0.0; rows * keys_n]);
        let query = IndexerQuery { heads: h as u32, q: d_rq.slice(..), weights: d_rw.slice(..) };
        let keys =
            RaggedIndexerKeys { keys: d_k.slice(..), scales: d_s.slice(..), ks: d_ks.slice(..), ke: d_ke.slice(..) };
        indexer::ragged_logits(rt, &query, &keys, LogitsOut::new(&mut out.slice_mut(..), keys_n)).unwrap();
        // Only [ks, ke) of a row is written: compare that.
        let all = down(rt, &out);
        (0..rows)
            .flat_map(|r| all[r * keys_n + ks[r] as usize..r * keys_n + ke[r] as usize].to_vec())
            .map(f32::to_bits)
            .collect::<Vec<_>>()
    });
    let c = "indexer_ragged";
    dump.put(c, "q", &[rows, h, INDEXER_HEAD_DIM], &rq);
    dump.put(c, "k", &[keys_n, INDEXER_HEAD_DIM], &k);
    dump.put(c, "k_scales", &[keys_n], &scales);
    dump.put(c, "weights", &[rows, h], &rw);
    dump.put(c, "ks", &[rows], &ks);
    dump.put(c, "ke", &[rows], &ke);
    dump.put(c, "out_in_windows", &[ragged.len()], &ragged.iter().map(|&v| f32::from_bits(v)).collect::<Vec<_>>());
}

/// Every op the Python package exposes, twice on the same inputs (equal bits),
/// dumped for the Python side when `NSA_PARITY_DIR` is set.
#[test]
fn python_parity_ops_repeat_bit_for_bit_and_dump() {
    let rt = rt();
    let mut rng = StdRng::seed_from_u64(2026);
    let mut dump = Dump::new();
    topk_cases(&rt, &mut dump, &mut rng);
    decode_case(&rt, &mut dump, &mut rng);
    prefill_case(&rt, &mut dump, &mut rng);
    indexer_cases(&rt, &mut dump, &mut rng);
    dump.finish();
}
