//! The plan's mirror of the kernels' sample arithmetic (`ops::topk::sample_expected_kept`,
//! behind `split_list_suffices`) against the kernels' own code (`Sample<kCap>` in
//! topk.cuh, compiled for the host by the emulator build): if either changes alone,
//! plans would stop matching what the kernels do.

use nsa_runtime::ops::topk::sample_expected_kept;
use nsa_tests::emu::kernel_sample_expected_kept;
use proptest::prelude::*;

const CAPS: [u32; 3] = [2048, 8192, 24_576];
const KS: [u32; 3] = [512, 1024, 2048];

fn check(cap: u32, k: u32, n: i32) {
    let kernel = kernel_sample_expected_kept(cap, k, n).expect("a (cap, k) the emulator builds");
    let mirror = sample_expected_kept(cap as usize, k as usize, n as usize) as u64;
    assert_eq!(mirror, kernel, "cap {cap}, k {k}, n {n}");
}

#[test]
fn mirror_matches_the_kernels_at_the_edges() {
    for cap in CAPS {
        for k in KS {
            for n in [cap as i32 + 1, 16_384, 131_071, 131_072, 262_144, 262_145, 1 << 20, i32::MAX / 8] {
                if n > cap as i32 {
                    check(cap, k, n);
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn mirror_matches_the_kernels(cap_i in 0usize..3, k_i in 0usize..3, extra in 1i32..4_000_000) {
        let (cap, k) = (CAPS[cap_i], KS[k_i]);
        check(cap, k, cap as i32 + extra);
    }
}

#[test]
fn unknown_shapes_are_refused() {
    assert_eq!(kernel_sample_expected_kept(4096, 2048, 100_000), None);
    assert_eq!(kernel_sample_expected_kept(8192, 64, 100_000), None);
}
