//! Top-k on the GPU against the CPU reference (included by gpu.rs).

use super::{assert_all, rt};
use nsa_kernels::{TopkLayout, TopkTransform};
use nsa_runtime::ops::topk::{self, TopkOutput, TopkScores};
use nsa_runtime::testdata::{ScorePattern, SCORE_PATTERNS};
use nsa_runtime::verify::topk::{index_transform, run, TopkCase, TopkPath};
use nsa_runtime::verify::{download, upload, Check};
use nsa_runtime::{DeviceChecks, Error};

/// Lengths around every boundary of k and of the kernel's shared-memory row cache.
fn edge_lengths(k: i32) -> Vec<i32> {
    vec![0, -3, 1, k - 1, k, k + 1, 2 * k + 7, 5000, 40_960, 40_961, 70_001]
}

fn case(
    k: u32,
    transform: TopkTransform,
    deterministic: bool,
    pattern: ScorePattern,
    lengths: Vec<i32>,
    seed: u64,
) -> TopkCase {
    TopkCase {
        k,
        transform,
        deterministic,
        pattern,
        lengths,
        row_starts: true,
        grouped: false,
        path: TopkPath::Single(None),
        seed,
    }
}

#[test]
fn every_variant_every_pattern_edge_lengths() {
    let rt = rt();
    let mut checks: Vec<Check> = Vec::new();
    let mut seed = 100;
    for k in [512u32, 1024, 2048] {
        for transform in TopkTransform::ALL {
            for deterministic in [false, true] {
                for pattern in SCORE_PATTERNS {
                    seed += 1;
                    let c = case(k, transform, deterministic, pattern, edge_lengths(k as i32), seed);
                    checks.push(run(&rt, &c).unwrap());
                }
            }
        }
    }
    assert_all(&checks);
}

#[test]
fn both_layouts_every_pattern() {
    let rt = rt();
    let mut checks = Vec::new();
    for layout in [TopkLayout::Latency, TopkLayout::Throughput] {
        for deterministic in [false, true] {
            for (i, pattern) in SCORE_PATTERNS.into_iter().enumerate() {
                let mut c =
                    case(2048, TopkTransform::Paged, deterministic, pattern, edge_lengths(2048), 300 + i as u64);
                c.path = TopkPath::Single(Some(layout));
                c.grouped = i % 2 == 0;
                checks.push(run(&rt, &c).unwrap());
            }
        }
    }
    assert_all(&checks);
}

/// The sample filter (both layouts, non-deterministic rows): lengths around its list
/// capacities (latency 8192 keys, throughput 6144; shorter rows keep every key),
/// rows too long for the list (it declines before the pass: from 131072 keys in the
/// throughput layout, 1M in the latency layout), rows whose raised values the sample
/// over-counts (fewer than k kept: it declines), heavy ties (more than the list: it
/// declines), and rows up to 1M keys.
#[test]
fn sample_filter_and_its_fallbacks() {
    let rt = rt();
    let mut checks = Vec::new();
    let lengths = vec![6144, 6145, 8192, 8193, 24_576, 24_577, 32_768, 65_536, 131_072, 262_144, 1 << 20, 4097];
    let patterns = [
        ScorePattern::Strided,
        ScorePattern::Uniform,
        ScorePattern::Gaussian,
        ScorePattern::OneBucket,
        ScorePattern::FewDistinct,
        ScorePattern::NonFinite,
    ];
    for layout in [TopkLayout::Latency, TopkLayout::Throughput] {
        for (i, pattern) in patterns.into_iter().enumerate() {
            for k in [512, 2048] {
                let transform = TopkTransform::ALL[i % 3];
                let mut c = case(k, transform, false, pattern, lengths.clone(), 1000 + i as u64 + k as u64);
                c.path = TopkPath::Single(Some(layout));
                checks.push(run(&rt, &c).unwrap());
            }
        }
    }
    assert_all(&checks);
}

#[test]
fn split_path_every_transform_every_pattern() {
    let rt = rt();
    let mut checks = Vec::new();
    for transform in TopkTransform::ALL {
        for (i, pattern) in SCORE_PATTERNS.into_iter().enumerate() {
            let mut c = case(2048, transform, false, pattern, edge_lengths(2048), 500 + i as u64);
            c.path = TopkPath::Split;
            c.grouped = transform == TopkTransform::Paged && i % 2 == 0;
            checks.push(run(&rt, &c).unwrap());
        }
    }
    let mut c = case(512, TopkTransform::Plain, false, ScorePattern::Gaussian, vec![1 << 20, 3, 131_072], 9);
    c.path = TopkPath::Split;
    checks.push(run(&rt, &c).unwrap());
    assert_all(&checks);
}

#[test]
fn cluster_path_every_size_transform_and_pattern() {
    let rt = rt();
    let mut checks = Vec::new();
    // Around the list capacity (24576: shorter rows keep every key) and slice
    // boundaries of every cluster size.
    let mut lengths = edge_lengths(2048);
    lengths.extend([24_576, 24_577, 32_768, 32_769, 65_536, 65_537, 131_072, 131_073, 2049 + 7 * 4]);
    let mut seed = 700;
    for cluster in [2, 4, 8] {
        for transform in TopkTransform::ALL {
            for (i, pattern) in SCORE_PATTERNS.into_iter().enumerate() {
                seed += 1;
                let mut c = case(2048, transform, false, pattern, lengths.clone(), seed);
                c.path = TopkPath::Cluster(cluster);
                c.grouped = transform == TopkTransform::Paged && i % 2 == 0;
                checks.push(run(&rt, &c).unwrap());
            }
        }
    }
    for k in [512, 1024] {
        let mut c = case(k, TopkTransform::Ragged, false, ScorePattern::OneBucket, edge_lengths(k as i32), k as u64);
        c.path = TopkPath::Cluster(8);
        checks.push(run(&rt, &c).unwrap());
    }
    // Long rows: 1M keys (filtered), 2.2M (too long for the list: CTA 0 runs the
    // histogram path), heavy ties (the joined list overflows: the same), and rows
    // whose raised values the sample over-counts (fewer than k kept: the same).
    for (i, pattern) in [
        ScorePattern::Gaussian,
        ScorePattern::FewDistinct,
        ScorePattern::NonFinite,
        ScorePattern::Strided,
        ScorePattern::Uniform,
    ]
    .into_iter()
    .enumerate()
    {
        let lengths = vec![1 << 20, (1 << 20) + 13, 3, 2_200_000, 262_144];
        let mut c = case(2048, TopkTransform::ALL[i % 3], false, pattern, lengths, 40 + i as u64);
        c.path = TopkPath::Cluster([2, 4, 8][i % 3]);
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

#[test]
fn paged_prefill_form_groups_rows_by_request() {
    let rt = rt();
    let mut checks = Vec::new();
    for (i, pattern) in SCORE_PATTERNS.into_iter().enumerate() {
        let lengths: Vec<i32> = (0..37).map(|j| [5, 2047, 2048, 2049, 9000, 33_000][(i + j) % 6]).collect();
        let mut c = case(2048, TopkTransform::Paged, i % 2 == 0, pattern, lengths, 900 + i as u64);
        c.grouped = true;
        checks.push(run(&rt, &c).unwrap());
    }
    assert_all(&checks);
}

#[test]
fn many_rows_and_very_long_rows() {
    let rt = rt();
    let mut checks = Vec::new();
    let mut rng = nsa_runtime::testdata::rng(5);
    let many: Vec<i32> = (0..4096).map(|_| rand::Rng::random_range(&mut rng, 0..6000)).collect();
    checks.push(run(&rt, &case(2048, TopkTransform::Ragged, false, ScorePattern::Gaussian, many.clone(), 1)).unwrap());
    checks.push(run(&rt, &case(2048, TopkTransform::Paged, true, ScorePattern::FewDistinct, many, 2)).unwrap());
    for (i, pattern) in
        [ScorePattern::Gaussian, ScorePattern::OneBucket, ScorePattern::FewDistinct, ScorePattern::NonFinite]
            .into_iter()
            .enumerate()
    {
        let long = vec![1 << 20, (1 << 20) + 13];
        checks.push(run(&rt, &case(2048, TopkTransform::Plain, i % 2 == 1, pattern, long, 10 + i as u64)).unwrap());
    }
    checks.push(
        run(&rt, &case(1024, TopkTransform::Plain, false, ScorePattern::Gaussian, vec![131_072; 64], 3)).unwrap(),
    );
    assert_all(&checks);
}

#[test]
fn out_of_window_rows_are_rejected_not_read() {
    let mut rt = rt();
    let stream = rt.gpu().stream().clone();
    let scores = upload(&stream, &vec![1.0f32; 4 * 100]).unwrap();
    // Row 1 asks for 50 values from start 60 of a 100-wide row; row 3 has a negative start.
    let lengths = upload(&stream, &[30i32, 50, 3000, 10]).unwrap();
    let starts = upload(&stream, &[0i32, 60, 0, -1]).unwrap();
    for checks in [DeviceChecks::Skip, DeviceChecks::Report] {
        rt.set_checks(checks).unwrap();
        let mut out = upload(&stream, &vec![7i32; 4 * 512]).unwrap();
        let (sv, lv, st) = (scores.slice(0..), lengths.slice(0..), starts.slice(0..));
        let input = TopkScores { scores: &sv, row_stride: 100, row_capacity: 100, lengths: &lv, row_starts: Some(&st) };
        let r = topk::topk(&rt, 512, false, &input, &TopkOutput::Plain, &mut out.slice_mut(0..), None);
        match (checks, r) {
            (DeviceChecks::Skip, Ok(())) => {}
            (DeviceChecks::Report, Err(Error::DeviceRejected { count: 3, field: "lengths", .. })) => {}
            (c, other) => panic!("{c:?}: unexpected {other:?}"),
        }
        let got = download(&stream, &out, 4 * 512).unwrap();
        assert_eq!(&got[..30], &(0..30).collect::<Vec<i32>>()[..]);
        for row in 1..4 {
            assert!(got[row * 512..][..512].iter().all(|&v| v == -1), "row {row} must be all -1");
        }
    }
    rt.set_checks(DeviceChecks::Skip).unwrap();
}

#[test]
fn unfused_page_table_transform_decode_and_prefill() {
    let rt = rt();
    let checks: Vec<Check> = [(2048, false), (2048, true), (512, true)]
        .iter()
        .map(|&(k, p)| index_transform(&rt, k, p, k as u64))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_all(&checks);
}
