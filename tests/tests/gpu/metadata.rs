//! CUDA-graph metadata on the GPU (included by gpu.rs): the device capture/replay
//! equals the host GraphState bit for bit, one launch per step, for every mode at
//! page sizes 1 and 64, and the multi-step draft backend in one launch.

use super::{assert_all, rt};
use nsa_runtime::metadata::graph_device::{DeviceGraphState, DeviceRequests};
use nsa_runtime::metadata::{GraphCapacity, GraphMode, MetadataParams};
use nsa_runtime::verify::metadata::{random_replays, ReplayCase};
use nsa_runtime::verify::{upload, Check};
use nsa_runtime::{DeviceChecks, Error};

const MODES: [GraphMode; 4] =
    [GraphMode::Decode, GraphMode::TargetVerify, GraphMode::DraftExtend, GraphMode::DraftExtendV2];

#[test]
fn device_replay_equals_host_replay_200_steps() {
    let rt = rt();
    let mut checks: Vec<Check> = Vec::new();
    for (i, mode) in MODES.into_iter().enumerate() {
        for page_size in [1, 64] {
            let case = ReplayCase::new(mode, page_size, 700 + 10 * i as u64 + page_size as u64);
            checks.push(random_replays(&rt, &case).unwrap());
        }
    }
    assert_all(&checks);
}

#[test]
fn device_replay_clips_at_deepseek_topk_and_wide_tables() {
    // top-k 2048 over tables wider than it, more requests than one block has threads.
    let rt = rt();
    let mut checks = Vec::new();
    for (i, mode) in MODES.into_iter().enumerate() {
        let mut case = ReplayCase::new(mode, 64, 900 + i as u64);
        case.topk = 2048;
        case.width = 2600;
        case.max_bs = if mode == GraphMode::Decode { 600 } else { 200 };
        case.iterations = 40;
        checks.push(random_replays(&rt, &case).unwrap());
    }
    assert_all(&checks);
}

#[test]
fn multi_step_backends_fill_in_one_launch() {
    let rt = rt();
    let mut checks = Vec::new();
    for steps in [2, 3, 5] {
        for page_size in [1, 64] {
            let mut case = ReplayCase::new(GraphMode::Decode, page_size, 1000 + steps as u64 + page_size as u64);
            case.steps = steps;
            case.iterations = 60;
            checks.push(random_replays(&rt, &case).unwrap());
        }
    }
    assert_all(&checks);
}

#[test]
fn a_bad_batch_writes_nothing_and_is_reported() {
    let mut rt = rt();
    let stream = rt.gpu().stream().clone();
    let width = 128;
    let table: Vec<i32> = (0..4 * width as i32).map(|s| s + 64).collect();
    let params = MetadataParams { page_size: 64, topk: 2048, draft_tokens: 0, pool_slots: 1 << 20, cp: None };
    let cap = GraphCapacity { max_bs: 4, max_tokens: 4, max_context_len: width };
    let mut g = DeviceGraphState::new(&rt, params, GraphMode::Decode, cap).unwrap();
    let before = g.download(&rt, 0).unwrap();
    let t = upload(&stream, &table).unwrap();
    let tv = t.slice(..);
    // Row 9 is not in the 4-row table; a KV length past the width; a negative length.
    for (rpi, lens) in [([0, 9], [5, 5]), ([0, 1], [5, width as i32 + 1]), ([0, 1], [-1, 5])] {
        let (r, l) = (upload(&stream, &rpi).unwrap(), upload(&stream, &lens).unwrap());
        let (rv, lv) = (r.slice(..), l.slice(..));
        let reqs =
            DeviceRequests { req_to_token: &tv, req_to_token_width: width, req_pool_indices: &rv, seq_lens: &lv };
        rt.set_checks(DeviceChecks::Skip).unwrap();
        g.replay_decode(&rt, &reqs).unwrap();
        assert_eq!(g.download(&rt, 0).unwrap(), before, "{rpi:?} {lens:?}");
        rt.set_checks(DeviceChecks::Report).unwrap();
        let err = g.replay_decode(&rt, &reqs).unwrap_err();
        assert!(matches!(err, Error::DeviceRejected { .. }), "{err}");
        rt.set_checks(DeviceChecks::Skip).unwrap();
        assert_eq!(g.download(&rt, 0).unwrap(), before, "{rpi:?} {lens:?}");
    }
    assert_eq!(g.launches(), 6);
    // Host-side checks launch nothing.
    let l = upload(&stream, &[1, 1, 1, 1, 1]).unwrap();
    let lv = l.slice(..);
    let reqs = DeviceRequests { req_to_token: &tv, req_to_token_width: width, req_pool_indices: &lv, seq_lens: &lv };
    assert!(matches!(g.replay_decode(&rt, &reqs), Err(Error::InvalidArgument { field: "bs", .. })));
    assert!(matches!(g.replay_target_verify(&rt, &reqs), Err(Error::InvalidArgument { field: "mode", .. })));
    assert_eq!(g.launches(), 6);
}

#[test]
fn device_extend_metadata_equals_the_host_builder() {
    use nsa_runtime::verify::metadata::random_extends;
    let rt = rt();
    let checks: Vec<Check> = [(1, 1100), (64, 1101), (61, 1102)]
        .iter()
        .map(|&(page, seed)| random_extends(&rt, page, 120, seed).unwrap())
        .collect();
    assert_all(&checks);
}

#[test]
fn a_bad_extend_batch_writes_nothing_and_is_reported() {
    use nsa_runtime::metadata::extend_device::{DeviceExtendState, ExtendCapacity};
    let mut rt = rt();
    let stream = rt.gpu().stream().clone();
    let width = 256;
    let table: Vec<i32> = (0..4 * width as i32).map(|s| s + 64).collect();
    let params = MetadataParams { page_size: 64, topk: 2048, draft_tokens: 0, pool_slots: 1 << 20, cp: None };
    let cap = ExtendCapacity { max_bs: 4, max_tokens: 300, max_keys: 300, max_context_len: width };
    let mut g = DeviceExtendState::new(&rt, params, cap).unwrap();
    let x = g.extent(&[0, 0], &[0, 0]).unwrap();
    let before = g.download(&rt, &x).unwrap();
    let t = upload(&stream, &table).unwrap();
    let tv = t.slice(..);
    // More new tokens than the request has; Σ seq_lens past max_keys (the host lengths
    // would have been refused); a row outside the table.
    for (rpi, lens, ext) in [([0, 1], [5, 5], [6, 1]), ([0, 1], [200, 200], [1, 1]), ([0, 7], [5, 5], [5, 5])] {
        let (r, l, e) =
            (upload(&stream, &rpi).unwrap(), upload(&stream, &lens).unwrap(), upload(&stream, &ext).unwrap());
        let (rv, lv, ev) = (r.slice(..), l.slice(..), e.slice(..));
        let reqs =
            DeviceRequests { req_to_token: &tv, req_to_token_width: width, req_pool_indices: &rv, seq_lens: &lv };
        rt.set_checks(DeviceChecks::Skip).unwrap();
        g.build(&rt, &reqs, &ev).unwrap();
        assert_eq!(g.download(&rt, &x).unwrap(), before, "{rpi:?} {lens:?} {ext:?}");
        rt.set_checks(DeviceChecks::Report).unwrap();
        let err = g.build(&rt, &reqs, &ev).unwrap_err();
        assert!(matches!(err, Error::DeviceRejected { .. }), "{err}");
    }
    rt.set_checks(DeviceChecks::Skip).unwrap();
    assert_eq!(g.launches(), 6);
    assert!(g.extent(&[200, 200], &[1, 1]).is_err(), "host lengths past max_keys are refused");
    assert!(g.extent(&[5], &[6]).is_err(), "more new tokens than the request has");
}
