//! Indexer logits on the GPU against the CPU reference (included by gpu.rs).
//! Tolerance: nsa_runtime::verify::indexer (module docs).

use super::{assert_all, rt};
use nsa_runtime::verify::indexer::{run, run_filled, IndexerCase};

#[test]
fn paged_every_next_n_and_lengths_around_topk() {
    let rt = rt();
    let mut checks = Vec::new();
    for next_n in 1..=4 {
        // Lengths below, at and above top-k (2048), a page edge, one key, and a row
        // shorter than next_n (its first queries see nothing).
        let context_lens = vec![1, 2, 63, 64, 65, 2047, 2048, 2049, 5000, 8192];
        let case =
            IndexerCase::Paged { context_lens, next_n, table_width: 128, pages: 300, seed: 2000 + next_n as u64 };
        checks.push(run(&rt, &case, 64).unwrap());
        // The fill once (the CPU reference dominates this test's time).
        if next_n == 2 {
            checks.push(run_filled(&rt, &case, 64).unwrap());
        }
    }
    assert_all(&checks);
}

#[test]
fn paged_long_context_and_many_requests() {
    let rt = rt();
    let mut checks = Vec::new();
    let lens: Vec<i32> = (0..64).map(|i| 1 + (i * 977) % 20_000).collect();
    checks.push(
        run(&rt, &IndexerCase::Paged { context_lens: lens, next_n: 1, table_width: 320, pages: 400, seed: 2100 }, 64)
            .unwrap(),
    );
    checks.push(
        run(
            &rt,
            &IndexerCase::Paged { context_lens: vec![65_536], next_n: 2, table_width: 1024, pages: 1100, seed: 2101 },
            64,
        )
        .unwrap(),
    );
    assert_all(&checks);
}

#[test]
fn ragged_windows() {
    let rt = rt();
    let mut checks = Vec::new();
    // Empty windows, windows inside one block, across blocks, to the end, ks > 0.
    let ks = vec![0, 0, 3, 64, 100, 0, 4000, 10, 0];
    let ke = vec![0, 1, 60, 128, 4097, 4097, 4097, 11, 2048];
    let case = IndexerCase::Ragged { ks, ke, num_keys: 4097, seed: 2200 };
    checks.push(run(&rt, &case, 64).unwrap());
    checks.push(run_filled(&rt, &case, 64).unwrap());
    // Causal extend windows: row t sees [0, prefix + t + 1).
    let rows = 300;
    let ks = vec![0; rows];
    let ke: Vec<i32> = (0..rows as i32).map(|t| 700 + t + 1).collect();
    checks.push(run(&rt, &IndexerCase::Ragged { ks, ke, num_keys: 1000, seed: 2201 }, 64).unwrap());
    assert_all(&checks);
}

#[test]
fn empty_inputs_launch_nothing() {
    let rt = rt();
    let c = run(&rt, &IndexerCase::Ragged { ks: vec![], ke: vec![], num_keys: 64, seed: 2300 }, 64).unwrap();
    let d = run(&rt, &IndexerCase::Paged { context_lens: vec![], next_n: 1, table_width: 4, pages: 4, seed: 2301 }, 64)
        .unwrap();
    assert_all(&[c, d]);
}

#[test]
fn filled_rows_without_keys() {
    let rt = rt();
    // Keys exist but no row sees one (whole rows of -inf), and a paged table of no pages.
    let ragged = IndexerCase::Ragged { ks: vec![0, 7, 9], ke: vec![0, 7, 3], num_keys: 130, seed: 2400 };
    let paged = IndexerCase::Paged { context_lens: vec![0, 0], next_n: 2, table_width: 3, pages: 4, seed: 2401 };
    assert_all(&[run_filled(&rt, &ragged, 64).unwrap(), run_filled(&rt, &paged, 64).unwrap()]);
}
