//! The top-k kernels' logic on the CPU: every GPU top-k case (`nsa_tests::topk_cases`)
//! run on the CPU emulation of the sm_90a kernels (`tests/emu/`) and checked against
//! the CPU reference. No GPU is needed, so CI runs them; timings mean nothing here.

use nsa_runtime::verify::topk::{index_transform_on, run_on, TopkCase};
use nsa_runtime::verify::Check;
use nsa_tests::emu::Emulator;
use nsa_tests::topk_cases as cases;

fn run_all(cases: Vec<TopkCase>) {
    let emu = Emulator::default();
    let checks: Vec<Check> = cases.iter().map(|c| run_on(&emu, c).unwrap()).collect();
    for c in &checks {
        eprintln!("{c}");
    }
    assert!(checks.iter().all(Check::passed), "some checks failed (see above)");
}

nsa_tests::topk_case_tests!(run_all);

#[test]
fn unfused_page_table_transform_decode_and_prefill() {
    let emu = Emulator::default();
    for &(k, prefill) in &cases::INDEX_TRANSFORM_CASES {
        let check = index_transform_on(&emu, k, prefill, k as u64).unwrap();
        eprintln!("{check}");
        assert!(check.passed());
    }
}
