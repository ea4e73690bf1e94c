//! The CPU emulator itself (`tests/emu/selftest.cpp`): lanes regroup at a warp
//! collective as a GPU converges them, DSMEM and the cluster barrier order what they
//! should, and what would hang or be undefined on a GPU is an error, not a result.

use nsa_tests::emu::selftest;

fn run(name: &str, seed: u64) -> (Result<(), String>, [u32; 128]) {
    let mut out = [0u32; 128];
    let r = selftest(name, seed, &mut out);
    (r, out)
}

/// Runs self-test `name` (seed 1), which must fail with a message holding every one
/// of `expected`.
fn expect_error(name: &str, expected: &[&str]) {
    let e = run(name, 1).0.expect_err("the emulator must report an error");
    for text in expected {
        assert!(e.contains(text), "{name}: expected {text:?} in {e:?}");
    }
}

#[test]
fn lanes_regroup_after_a_detour() {
    let (r, out) = run("scan_after_detour", 1);
    r.unwrap();
    for block in 0..2 {
        for t in 0..64 {
            let lane = (t % 32) as u32;
            let appends = if t == 63 { 4 << 16 } else { 0 };
            assert_eq!(out[block * 64 + t], (lane + 1) * (lane + 2) / 2 + appends, "block {block} thread {t}");
        }
    }
}

#[test]
fn a_full_warp_scan_with_lanes_missing_is_an_error() {
    // The message names the call and its source position.
    expect_error("partial_warp_scan", &["warp_inclusive_scan", "needs lanes 0xffffffff", "selftest.cpp"]);
}

#[test]
fn threads_at_different_barriers_are_an_error() {
    expect_error("barrier_mismatch", &["32 threads wait at a block barrier while 32 wait at a cluster barrier"]);
}

#[test]
fn a_cluster_barrier_some_cta_never_reaches_is_an_error() {
    expect_error("cluster_barrier_missed", &["cluster barrier: 64 threads of the cluster exited"]);
}

#[test]
fn cluster_barrier_halves_out_of_order_are_an_error() {
    expect_error("arrive_twice", &["barrier.cluster.arrive twice without a wait between"]);
}

#[test]
fn dsmem_stores_are_visible_after_the_cluster_barrier() {
    for seed in 1..20 {
        let (r, out) = run("dsmem_sum", seed);
        r.unwrap();
        assert_eq!(out[0], 10, "seed {seed}");
    }
}

#[test]
fn dsmem_before_the_first_cluster_barrier_is_an_error() {
    expect_error("dsmem_too_early", &["DSMEM access before the cluster's first barrier"]);
}

#[test]
fn the_fiber_order_varies_with_the_seed() {
    // Without a barrier, thread 1 sees thread 0's store or the shared-memory poison,
    // depending on the order: both must occur over a few seeds.
    let seen: std::collections::BTreeSet<u32> = (1..40).map(|seed| run("missing_barrier", seed).1[0]).collect();
    assert_eq!(seen, [7, 0xa5a5_a5a5].into(), "values thread 1 read");
}

#[test]
fn a_stack_overrun_is_an_error() {
    expect_error("stack_overrun", &["a thread overran its 128 KiB emulated stack"]);
}

#[test]
fn an_async_copy_lands_when_its_thread_waits() {
    let (r, out) = run("async_copy_lands_at_the_wait", 1);
    r.unwrap();
    for t in 0..32 {
        assert_eq!(out[t], 1, "thread {t} before its wait sees the old word");
        assert_eq!(out[32 + t], 10 + t as u32, "thread {t} after its wait");
    }
}

#[test]
fn async_copies_never_waited_for_are_an_error() {
    expect_error("async_copy_unwaited", &["a thread ended with async copies it never waited for"]);
}

#[test]
fn a_global_only_atomic_counts_in_global_memory() {
    let (r, out) = run("global_add_to_global", 1);
    r.unwrap();
    assert_eq!(out[0], 32);
}

#[test]
fn a_global_only_atomic_on_a_shared_address_is_an_error() {
    expect_error("global_add_to_shared", &["atomic_add_global_u32 (red.global) on a shared-memory address"]);
}

#[test]
fn an_unknown_self_test_is_named() {
    assert_eq!(run("nope", 1).0.unwrap_err(), "no self-test nope");
}
