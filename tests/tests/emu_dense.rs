//! The scalar dense attention kernel (the one gfx942 runs) on the CPU emulator,
//! against the CPU reference: 32-lane warps (as on NVIDIA) and 64-lane wavefronts
//! (gfx942), both head shapes, sequences of 1–300 rows with and without prefixes,
//! rows that see no key, empty sequences and an empty batch. No GPU is needed, so
//! CI runs it; timings mean nothing here.

use nsa_kernels::spec::{DenseKernel, DENSE_HEAD_DIMS};
use nsa_kernels::Target;
use nsa_runtime::verify::dense::{run_on, DenseCase};
use nsa_tests::emu::{Emulator, EMU_DENSE_HEADS};

fn check(target: Target, seqs: Vec<(usize, usize)>, seed: u64) {
    let emu = Emulator::new(target);
    for (d_qk, d_v) in DENSE_HEAD_DIMS {
        let case =
            DenseCase { heads: EMU_DENSE_HEADS, d_qk, d_v, seqs: seqs.clone(), seed, kernel: DenseKernel::Scalar };
        let check = run_on(&emu, &case).unwrap();
        eprintln!("{check}");
        assert!(check.passed(), "{check}");
    }
}

#[test]
fn tile_edges_and_prefixes_on_both_warp_widths() {
    // (query rows, key rows): tile edges of the 64-row CTAs and 32-key blocks, and
    // prefixes (more keys than rows).
    let seqs = vec![(1, 1), (2, 2), (31, 31), (33, 33), (63, 63), (64, 64), (65, 65), (100, 300), (70, 140)];
    for target in [Target::Sm90a, Target::Gfx942] {
        check(target, seqs.clone(), 7);
    }
}

#[test]
fn rows_without_keys_empty_sequences_and_an_empty_batch() {
    for target in [Target::Sm90a, Target::Gfx942] {
        // Fewer keys than rows: the first rows see none (zeros and +inf).
        check(target, vec![(5, 2), (0, 0), (3, 0), (0, 9), (40, 41)], 11);
        check(target, vec![], 13);
    }
}
