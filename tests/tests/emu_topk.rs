//! The top-k kernels' logic on the CPU: every GPU top-k case (`nsa_tests::topk_cases`)
//! run on the CPU emulation of the sm_90a kernels (`tests/emu/`) and checked against
//! the CPU reference; then again on the gfx942 kernels (64-lane wavefronts), which no
//! other test runs. No GPU is needed, so CI runs them; timings mean nothing here.

use nsa_kernels::Target;
use nsa_runtime::verify::topk::{index_transform_on, page_holes_on, run_on, TopkCase, TopkPath};
use nsa_runtime::verify::Check;
use nsa_tests::emu::Emulator;
use nsa_tests::topk_cases as cases;

fn run_on_target(target: Target, cases: Vec<TopkCase>) {
    let emu = Emulator::new(target);
    let checks: Vec<Check> = cases.iter().map(|c| run_on(&emu, c).unwrap()).collect();
    for c in &checks {
        eprintln!("{c}");
    }
    assert!(checks.iter().all(Check::passed), "some checks failed (see above)");
}

fn run_all(cases: Vec<TopkCase>) {
    run_on_target(Target::Sm90a, cases);
}

nsa_tests::topk_case_tests!(run_all);

#[test]
fn unfused_page_table_transform_decode_and_prefill() {
    for target in [Target::Sm90a, Target::Gfx942] {
        let emu = Emulator::new(target);
        for &(k, prefill) in &cases::INDEX_TRANSFORM_CASES {
            let check = index_transform_on(&emu, k, prefill, k as u64).unwrap();
            eprintln!("{check}");
            assert!(check.passed());
        }
    }
}

#[test]
fn pages_missing_from_the_table_give_minus_one() {
    for target in [Target::Sm90a, Target::Gfx942] {
        let emu = Emulator::new(target);
        for case in cases::page_holes_every_path() {
            let case = match (target, case.path) {
                (Target::Gfx942, TopkPath::Cluster(_)) => TopkCase { path: TopkPath::Split, ..case },
                _ => case,
            };
            let check = page_holes_on(&emu, &case).unwrap();
            eprintln!("{check}");
            assert!(check.passed());
        }
    }
}

/// The same cases on the gfx942 kernels. gfx942 has no clusters: the cluster cases
/// take the split path there, as `topk` would.
mod gfx942 {
    use super::*;

    fn run_all(cases: Vec<TopkCase>) {
        let cases = cases
            .into_iter()
            .map(|c| match c.path {
                TopkPath::Cluster(_) => TopkCase { path: TopkPath::Split, ..c },
                _ => c,
            })
            .collect();
        run_on_target(Target::Gfx942, cases);
    }

    nsa_tests::topk_case_tests!(run_all);
}
