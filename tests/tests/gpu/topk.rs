//! Top-k on the GPU against the CPU reference (included by gpu.rs).

use super::{assert_all, rt};
use nsa_runtime::ops::topk::{self, TopkOutput, TopkScores};
use nsa_runtime::verify::topk::{index_transform, run, TopkCase};
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
