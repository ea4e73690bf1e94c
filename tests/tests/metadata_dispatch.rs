//! Table tests of the batch-dependent dispatch (spec §5.1–5.2): MHA one-shot
//! eligibility, flashmla_auto, PAGED vs RAGGED, and the logged reason.

use nsa_kernels::KvCacheFormat::{self, Bf16, Fp8};
use nsa_runtime::metadata::{
    decide, AttnImpl, BatchSummary, DispatchPolicy, ExtendPlan, ForwardMode, PrefillBackend, TransformMethod,
};

const H200: (u32, u32) = (9, 0);
const B200: (u32, u32) = (10, 0);

fn policy(cc: (u32, u32), kv: KvCacheFormat, backend: PrefillBackend) -> DispatchPolicy {
    DispatchPolicy {
        compute_capability: cc,
        kv_cache: kv,
        prefill_backend: backend,
        topk: 2048,
        max_chunk_capacity: 16384,
        cp_enabled: false,
        force_mla: false,
    }
}

struct Case {
    what: &'static str,
    policy: DispatchPolicy,
    mode: ForwardMode,
    seq_lens: &'static [i32],
    extend_tokens: usize,
    use_mha: bool,
    prefill: AttnImpl,
    transform: TransformMethod,
    /// A fragment the reason must contain.
    reason: &'static str,
}

const AUTO: PrefillBackend = PrefillBackend::Auto;
const SPARSE: PrefillBackend = PrefillBackend::Fixed(AttnImpl::FlashMlaSparse);
const TRTLLM: PrefillBackend = PrefillBackend::Fixed(AttnImpl::Trtllm);
const COST128: PrefillBackend = PrefillBackend::Cost { heads: 128 };
use ForwardMode::{Decode, DraftExtend, Extend, TargetVerify};
use TransformMethod::{Paged, Ragged};

fn cases() -> Vec<Case> {
    let p = policy;
    let mut cp = p(H200, Bf16, AUTO);
    cp.cp_enabled = true;
    let mut forced = p(H200, Fp8, AUTO);
    forced.force_mla = true;
    let mut small_chunk = p(B200, Fp8, AUTO);
    small_chunk.max_chunk_capacity = 3000;
    vec![
        Case {
            what: "short extend on H200 bf16: MHA",
            policy: p(H200, Bf16, AUTO),
            mode: Extend,
            seq_lens: &[2048, 100],
            extend_tokens: 2148,
            use_mha: true,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Paged,
            reason: "MHA one-shot: max seq len 2048 ≤ 2048 (index_topk)",
        },
        Case {
            what: "one request over top-k: MLA",
            policy: p(H200, Bf16, AUTO),
            mode: Extend,
            seq_lens: &[2049, 100],
            extend_tokens: 10,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Paged,
            reason: "max seq len 2049 > 2048 (index_topk)",
        },
        Case {
            what: "decode never uses MHA",
            policy: p(H200, Fp8, AUTO),
            mode: Decode,
            seq_lens: &[10],
            extend_tokens: 1,
            use_mha: false,
            prefill: AttnImpl::FlashMlaKv,
            transform: Paged,
            reason: "decode batches always use MLA",
        },
        Case {
            what: "verify never uses MHA",
            policy: p(B200, Bf16, AUTO),
            mode: TargetVerify,
            seq_lens: &[10],
            extend_tokens: 3,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Paged,
            reason: "target_verify batches always use MLA",
        },
        Case {
            what: "sm_80 is not eligible",
            policy: p((8, 0), Bf16, AUTO),
            mode: Extend,
            seq_lens: &[100],
            extend_tokens: 100,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Paged,
            reason: "sm_80 is neither",
        },
        Case {
            what: "sm_120 is not eligible",
            policy: p((12, 0), Bf16, AUTO),
            mode: Extend,
            seq_lens: &[100],
            extend_tokens: 100,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Paged,
            reason: "sm_120",
        },
        Case {
            what: "sm_103 is eligible",
            policy: p((10, 3), Bf16, AUTO),
            mode: Extend,
            seq_lens: &[100],
            extend_tokens: 100,
            use_mha: true,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Paged,
            reason: "sm_103",
        },
        Case {
            what: "CP forbids MHA",
            policy: cp,
            mode: Extend,
            seq_lens: &[100],
            extend_tokens: 100,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Paged,
            reason: "context parallelism",
        },
        Case {
            what: "SGLANG_NSA_FORCE_MLA",
            policy: forced,
            mode: Extend,
            seq_lens: &[100],
            extend_tokens: 100,
            use_mha: false,
            prefill: AttnImpl::FlashMlaKv,
            transform: Paged,
            reason: "SGLANG_NSA_FORCE_MLA",
        },
        Case {
            what: "Σ seq lens over the chunk capacity",
            policy: small_chunk,
            mode: Extend,
            seq_lens: &[2000, 2000],
            extend_tokens: 4000,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Ragged,
            reason: "Σ seq lens 4000 > max chunk capacity 3000",
        },
        Case {
            what: "trtllm prefill: the limit is the chunk capacity",
            policy: p(B200, Bf16, TRTLLM),
            mode: Extend,
            seq_lens: &[10000],
            extend_tokens: 10000,
            use_mha: true,
            prefill: AttnImpl::Trtllm,
            transform: Paged,
            reason: "10000 ≤ 16384 (max chunk capacity (trtllm))",
        },
        Case {
            what: "fp8 on Hopper, long extend: flashmla_kv, PAGED",
            policy: p(H200, Fp8, AUTO),
            mode: Extend,
            seq_lens: &[100000],
            extend_tokens: 8,
            use_mha: false,
            prefill: AttnImpl::FlashMlaKv,
            transform: Paged,
            reason: "auto: fp8 on Hopper",
        },
        Case {
            what: "fp8 on Blackwell, many queries per KV: flashmla_sparse, RAGGED",
            policy: p(B200, Fp8, AUTO),
            mode: Extend,
            seq_lens: &[8000, 8000],
            extend_tokens: 8000,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Ragged,
            reason: "16000 < 512 × 8000",
        },
        Case {
            what: "fp8 on Blackwell, few queries per KV: flashmla_kv",
            policy: p(B200, Fp8, AUTO),
            mode: Extend,
            seq_lens: &[100000],
            extend_tokens: 100,
            use_mha: false,
            prefill: AttnImpl::FlashMlaKv,
            transform: Paged,
            reason: "100000 ≥ 512 × 100",
        },
        Case {
            what: "fp8 on Blackwell, draft-extend: flashmla_kv",
            policy: p(B200, Fp8, AUTO),
            mode: DraftExtend,
            seq_lens: &[100],
            extend_tokens: 2,
            use_mha: false,
            prefill: AttnImpl::FlashMlaKv,
            transform: Paged,
            reason: "fp8, draft_extend batch",
        },
        Case {
            what: "forced flashmla_sparse + fp8 in decode stays PAGED",
            policy: p(H200, Fp8, SPARSE),
            mode: Decode,
            seq_lens: &[100],
            extend_tokens: 1,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Paged,
            reason: "the reference would pick RAGGED",
        },
        Case {
            what: "forced flashmla_sparse + fp8 in extend: RAGGED",
            policy: p(H200, Fp8, SPARSE),
            mode: Extend,
            seq_lens: &[3000],
            extend_tokens: 3000,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Ragged,
            reason: "RAGGED: fp8 cache with flashmla_sparse",
        },
        Case {
            what: "cost: one 16K-token FP8 prompt at 128 heads takes dequantize + prefill",
            policy: p(H200, Fp8, COST128),
            mode: Extend,
            seq_lens: &[16384],
            extend_tokens: 16384,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Ragged,
            reason: "dequantize 16384 tokens + prefill kernel over 16384 rows ≈ 10 + 19339 = 19349 µs < decode kernel over them ≈ 26056 µs, h128",
        },
        Case {
            what: "cost: 16 new tokens over a 128K prefix keep the decode kernel",
            policy: p(H200, Fp8, COST128),
            mode: Extend,
            seq_lens: &[131_088],
            extend_tokens: 16,
            use_mha: false,
            prefill: AttnImpl::FlashMlaKv,
            transform: Paged,
            reason: "≥ decode kernel over them ≈ 25 µs, h128",
        },
        Case {
            what: "cost: a bf16 cache has one path",
            policy: p(H200, Bf16, COST128),
            mode: Extend,
            seq_lens: &[16384],
            extend_tokens: 16384,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Paged,
            reason: "prefill flashmla_sparse (cost: bf16 cache)",
        },
        Case {
            what: "cost: decode batches read the FP8 cache",
            policy: p(H200, Fp8, COST128),
            mode: Decode,
            seq_lens: &[16384, 9000],
            extend_tokens: 2,
            use_mha: false,
            prefill: AttnImpl::FlashMlaKv,
            transform: Paged,
            reason: "prefill flashmla_kv (cost: fp8, decode batch)",
        },
        Case {
            what: "empty extend batch: MLA",
            policy: p(H200, Bf16, AUTO),
            mode: Extend,
            seq_lens: &[],
            extend_tokens: 0,
            use_mha: false,
            prefill: AttnImpl::FlashMlaSparse,
            transform: Paged,
            reason: "empty batch",
        },
    ]
}

#[test]
fn dispatch_table() {
    for c in cases() {
        let batch = BatchSummary { mode: c.mode, seq_lens: c.seq_lens, extend_num_tokens: c.extend_tokens };
        let d = decide(&c.policy, Some(&batch));
        assert_eq!(d.use_mha, c.use_mha, "{}: {}", c.what, d.reason);
        assert_eq!(d.prefill_impl, c.prefill, "{}: {}", c.what, d.reason);
        assert_eq!(d.transform, c.transform, "{}: {}", c.what, d.reason);
        assert_eq!(d.mha_fp8_dequant, c.use_mha && c.policy.kv_cache == Fp8, "{}", c.what);
        assert!(d.reason.contains(c.reason), "{}: reason {:?} lacks {:?}", c.what, d.reason, c.reason);
        assert_eq!(d.extend_plan(), ExtendPlan { transform: d.transform, mha_fp8_dequant: d.mha_fp8_dequant });
    }
}

#[test]
fn mha_on_fp8_needs_the_dequant() {
    let batch = BatchSummary { mode: Extend, seq_lens: &[100, 200], extend_num_tokens: 300 };
    let d = decide(&policy(B200, Fp8, AUTO), Some(&batch));
    assert!(d.use_mha && d.mha_fp8_dequant, "{}", d.reason);
}

#[test]
fn graph_paths_without_a_batch() {
    for (kv, want) in [(Fp8, AttnImpl::FlashMlaKv), (Bf16, AttnImpl::FlashMlaSparse)] {
        for cc in [H200, B200] {
            let d = decide(&policy(cc, kv, AUTO), None);
            assert!(!d.use_mha);
            assert_eq!(d.prefill_impl, want);
            assert_eq!(d.transform, Paged);
            assert!(d.reason.contains("CUDA-graph"), "{}", d.reason);
        }
    }
}
