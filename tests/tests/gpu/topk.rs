//! Top-k on the GPU against the CPU reference (included by gpu.rs).

use super::{assert_all, rt};
use nsa_kernels::{TopkLayout, TopkTransform};
use nsa_runtime::ops::topk::{self, PageTable, TopkOutput, TopkScores};
use nsa_runtime::testdata::ScorePattern;
use nsa_runtime::verify::topk::{
    index_transform, page_holes_on, run, topk_then_transform, transform_then_topk, TopkCase, TopkPath,
};
use nsa_runtime::verify::{download, upload, Check};
use nsa_runtime::{DeviceChecks, Error};
use nsa_tests::topk_cases as cases;

/// Runs every case of a shared list on the GPU.
fn run_all(cases: Vec<TopkCase>) {
    let rt = rt();
    let checks: Vec<Check> = cases.iter().map(|c| run(&rt, c).unwrap()).collect();
    assert_all(&checks);
}

nsa_tests::topk_case_tests!(run_all);

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

/// PAGED over a table of pages: a row may hold up to width × page_size positions.
/// Row 1 asks for one position past its table's 2 pages of 64 and is rejected (all
/// −1, reported); row 0 fills them exactly and is translated page by page.
#[test]
fn paged_rows_past_their_pages_are_rejected() {
    let mut rt = rt();
    let stream = rt.gpu().stream().clone();
    let scores = upload(&stream, &(0..2 * 129).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    let lengths = upload(&stream, &[128i32, 129]).unwrap();
    let table = upload(&stream, &[5i32, 3, 9, 1]).unwrap();
    let (sv, lv, tv) = (scores.slice(0..), lengths.slice(0..), table.slice(0..));
    let input = TopkScores { scores: &sv, row_stride: 129, row_capacity: 129, lengths: &lv, row_starts: None };
    let pt = PageTable { table: &tv, rows: 2, stride: 2, width: 2, page_size: 64, cu_seqlens_q: None };
    rt.set_checks(DeviceChecks::Report).unwrap();
    let mut out = upload(&stream, &vec![7i32; 2 * 512]).unwrap();
    let r = topk::topk(&rt, 512, false, &input, &TopkOutput::Paged(pt), &mut out.slice_mut(0..), None);
    rt.set_checks(DeviceChecks::Skip).unwrap();
    assert!(matches!(r, Err(Error::DeviceRejected { count: 1, field: "lengths", .. })), "{r:?}");
    let got = download(&stream, &out, 2 * 512).unwrap();
    let want: Vec<i32> = (0..128).map(|p| [5, 3][p / 64] * 64 + (p % 64) as i32).collect();
    assert_eq!(&got[..128], &want[..]);
    assert!(got[128..].iter().all(|&v| v == -1), "row 0's padding and all of row 1 must be -1");
    // A page size of 0 is refused before any launch, as is a table of pages for the
    // unfused transform (it reads a page_table_1).
    let zero = PageTable { table: &tv, rows: 2, stride: 2, width: 2, page_size: 0, cu_seqlens_q: None };
    let err = topk::topk(&rt, 512, false, &input, &TopkOutput::Paged(zero), &mut out.slice_mut(0..), None);
    let err = err.unwrap_err().to_string();
    assert!(err.contains("page_table.page_size") && err.contains("1 (a page_table_1"), "{err}");
    let pages = PageTable { table: &tv, rows: 2, stride: 2, width: 2, page_size: 64, cu_seqlens_q: None };
    let idx = upload(&stream, &vec![0i32; 512]).unwrap();
    let err = topk::page_table_transform(&rt, 512, &idx.slice(0..), &pages, &mut out.slice_mut(0..512));
    let err = err.unwrap_err().to_string();
    assert!(err.contains("page_table.page_size") && err.contains("page_table_1"), "{err}");
}

#[test]
fn pages_missing_from_the_table_give_minus_one() {
    let rt = rt();
    let checks: Vec<Check> = cases::page_holes_every_path().iter().map(|c| page_holes_on(&*rt, c).unwrap()).collect();
    assert_all(&checks);
}

#[test]
fn unfused_page_table_transform_decode_and_prefill() {
    let rt = rt();
    let checks: Vec<Check> = cases::INDEX_TRANSFORM_CASES
        .iter()
        .map(|&(k, p)| index_transform(&rt, k, p, k as u64))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_all(&checks);
}

/// PDL (`Runtime::set_pdl`): a launch may start while the previous kernel of the
/// stream runs, so every top-k and transform kernel must wait before it reads.
/// Both directions, back to back: the transform reads a top-k's positions (1 and 4
/// rows over clusters, 64 rows in the latency layout, 300 in the throughput layout:
/// the plans `topk` picks), and every top-k path reads lengths a transform has just
/// written (without its wait, the row would read as empty). Then the cluster, split
/// and one-block paths' own PAGED checks. Device-input checks are off here: their
/// status read would synchronise between the launches.
#[test]
fn pdl_launches_wait_for_the_previous_kernel() {
    let mut rt = rt();
    let (pdl, checks) = (rt.pdl(), rt.checks());
    rt.set_pdl(true).unwrap();
    rt.set_checks(DeviceChecks::Skip).unwrap();
    let mut results = Vec::new();
    for (rows, n) in [(1, 131_072), (4, 65_536), (64, 32_768), (300, 4096)] {
        results.push(topk_then_transform(&rt, 2048, rows, n, 5, rows as u64));
    }
    let paths = [
        (TopkPath::Cluster(8), 2, 131_072),
        (TopkPath::Split, 2, 131_072),
        (TopkPath::Single(Some(TopkLayout::Latency)), 64, 32_768),
        (TopkPath::Single(Some(TopkLayout::Throughput)), 300, 8192),
    ];
    for (path, rows, n) in paths {
        results.push(transform_then_topk(&rt, 2048, rows, n, path, 11));
    }
    for path in [TopkPath::Cluster(8), TopkPath::Split, TopkPath::Single(Some(TopkLayout::Latency))] {
        let mut c =
            cases::case(2048, TopkTransform::Paged, false, ScorePattern::Gaussian, vec![70_001, 131_072, 5000], 7);
        c.path = path;
        results.push(run(&rt, &c));
    }
    // As before before anything can panic: the runtime is shared with the other tests.
    rt.set_pdl(pdl).unwrap();
    rt.set_checks(checks).unwrap();
    let checks: Vec<Check> = results.into_iter().collect::<Result<_, _>>().unwrap();
    assert_all(&checks);
}
