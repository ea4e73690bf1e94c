//! Random top-k cases on the CPU emulation of the sm_90a and gfx942 kernels (`tests/emu/`):
//! any k, transform, path, score type and pattern, mix of row lengths (around k, the list and
//! cache capacities, and long rows), row starts, request grouping and PAGED page size, checked
//! against the CPU reference. Explores combinations the fixed GPU case lists do not.

use nsa_kernels::{Target, TopkLayout, TopkScore, TopkTransform};
use nsa_runtime::testdata::SCORE_PATTERNS;
use nsa_runtime::verify::topk::{run_on, TopkCase, TopkPath};
use nsa_tests::emu::Emulator;
use proptest::prelude::*;

/// A row length: mostly short or around a boundary of some path, sometimes long.
fn length(k: i32) -> impl Strategy<Value = i32> {
    prop_oneof![
        4 => -2i32..3000,
        3 => prop::sample::select(vec![k - 1, k, k + 1, 6144, 6145, 8192, 8193, 24_576, 24_577, 40_960, 40_961]),
        2 => 3000i32..70_000,
        1 => 70_000i32..300_000,
    ]
}

fn path() -> impl Strategy<Value = TopkPath> {
    prop_oneof![
        Just(TopkPath::Single(None)),
        Just(TopkPath::Single(Some(TopkLayout::Latency))),
        Just(TopkPath::Single(Some(TopkLayout::Throughput))),
        Just(TopkPath::Split),
        prop::sample::select(vec![2u32, 4, 8]).prop_map(TopkPath::Cluster),
    ]
}

fn topk_case() -> impl Strategy<Value = TopkCase> {
    (prop::sample::select(vec![512u32, 1024, 2048]), 0usize..4, path(), 0..SCORE_PATTERNS.len(), any::<u64>())
        .prop_flat_map(|(k, t, path, pattern, seed)| {
            let spread = !matches!(path, TopkPath::Single(_));
            (
                prop::collection::vec(length(k as i32), 1..6),
                any::<bool>(),
                // The split and cluster paths are unordered: never deterministic.
                any::<bool>().prop_map(move |d| d && !spread),
                any::<bool>(),
                // bf16 scores where the emulator has them (k = 512, 2048).
                any::<bool>().prop_map(move |b| if b && k != 1024 { TopkScore::Bf16 } else { TopkScore::F32 }),
                // PAGED over a table of pages (emulated at k = 2048, f32): its page size.
                prop::sample::select(vec![64u32, 61, 2]),
            )
                .prop_map(move |(lengths, row_starts, deterministic, grouped, score, page_size)| {
                    let pages = t == 3 && k == 2048 && score == TopkScore::F32;
                    let transform = if pages { TopkTransform::Pages(page_size) } else { TopkTransform::ALL[t % 3] };
                    TopkCase {
                        k,
                        transform,
                        deterministic,
                        pattern: SCORE_PATTERNS[pattern],
                        lengths,
                        row_starts,
                        grouped: grouped && transform.is_paged(),
                        table_width: None,
                        path,
                        score,
                        seed,
                    }
                })
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn random_cases_match_the_reference(case in topk_case(), gfx942: bool) {
        // gfx942 has no clusters: those cases take the split path there.
        let (target, case) = match (gfx942, case.path) {
            (false, _) => (Target::Sm90a, case),
            (true, TopkPath::Cluster(_)) => (Target::Gfx942, TopkCase { path: TopkPath::Split, ..case }),
            (true, _) => (Target::Gfx942, case),
        };
        let check = run_on(&Emulator::new(target), &case).unwrap();
        prop_assert!(check.passed(), "{check}\n{case:?}");
    }
}
