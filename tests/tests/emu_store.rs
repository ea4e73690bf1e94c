//! The layer's step store (the KV and indexer-K stores in one launch) on the CPU
//! emulator, against the reference stores, bit for bit: 32-lane warps (as on
//! NVIDIA) and 64-lane wavefronts (gfx942), both MLA cache formats, token counts
//! that leave a block or a wavefront partly empty, and slots each pool rejects
//! (each rejected token counted once). No GPU is needed, so CI runs it.

use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::Target;
use nsa_runtime::reference::kv_cache as reference;
use nsa_runtime::testdata;
use nsa_runtime::verify::split_rows;
use nsa_tests::emu::{EmuMlaCache, Emulator};

/// Token counts: none, one (a wavefront half empty), partial and whole blocks of
/// the latent store (8 tokens) and of the indexer store (64), and several blocks.
const COUNTS: [usize; 7] = [0, 1, 7, 9, 64, 65, 300];

/// `n` tokens at distinct slots of a `pool`-row latent cache with `pages` indexer
/// pages; with at least 3 tokens, token 1 gets slot -1 and the last a slot only
/// one pool holds (or neither, when the pools are equal). Checks both caches and
/// the count of rejected tokens.
fn check(target: Target, fp8: bool, n: usize, pool: usize, pages: usize, seed: u64) {
    let index_pool = pages * INDEXER_PAGE_TOKENS;
    let rows = testdata::mla_rows(n, seed);
    let keys = testdata::indexer_rows(n, seed ^ 3);
    let mut loc = testdata::distinct_slots(n, pool.min(index_pool), seed ^ 5);
    if n >= 3 {
        loc[1] = -1;
        loc[n - 1] = pool.min(index_pool) as i32;
    }
    let rejected = loc.iter().filter(|&&s| s < 0 || s as usize >= pool || s as usize >= index_pool).count();
    let (nope, rope) = split_rows(&rows);
    let mut index = vec![0x5au8; pages * INDEXER_PAGE_BYTES];
    let mut want_index = index.clone();
    reference::store_indexer_k(&keys, &loc, &mut want_index);
    let emu = Emulator::new(target);
    let what = format!("{target} {} n={n} pool={pool} pages={pages}", if fp8 { "fp8" } else { "bf16" });
    let counted = if fp8 {
        let mut cache = vec![0xa5u8; pool * FP8_TOKEN_BYTES];
        let mut want = cache.clone();
        reference::store_fp8(&nope, &rope, &loc, &mut want);
        let counted = emu.step_store(&rows, &keys, &loc, EmuMlaCache::Fp8(&mut cache), &mut index).unwrap();
        assert!(cache == want, "{what}: latent cache differs from the reference");
        counted
    } else {
        let mut cache = vec![bf16::from_bits(0xa5a5); pool * BF16_TOKEN_ELEMS];
        let mut want = cache.clone();
        reference::store_bf16(&nope, &rope, &loc, &mut want);
        let counted = emu.step_store(&rows, &keys, &loc, EmuMlaCache::Bf16(&mut cache), &mut index).unwrap();
        let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
        assert!(bits(&cache) == bits(&want), "{what}: latent cache differs from the reference");
        counted
    };
    assert!(index == want_index, "{what}: indexer cache differs from the reference");
    assert_eq!(counted as usize, rejected, "{what}: rejected tokens counted");
}

#[test]
fn every_count_both_formats_both_warp_widths() {
    for target in [Target::Sm90a, Target::Gfx942] {
        for fp8 in [true, false] {
            for (i, &n) in COUNTS.iter().enumerate() {
                let pool = n + n / 3 + 8;
                check(target, fp8, n, pool, pool.div_ceil(INDEXER_PAGE_TOKENS), 17 + i as u64);
            }
        }
    }
}

/// A slot only the latent pool rejects (latent pool 40, one 64-slot page) and one
/// only the indexer pool rejects (latent pool 100, one page).
#[test]
fn a_slot_one_pool_rejects_is_skipped_there_and_counted_once() {
    for target in [Target::Sm90a, Target::Gfx942] {
        for fp8 in [true, false] {
            check(target, fp8, 30, 40, 1, 5);
            check(target, fp8, 30, 100, 1, 6);
        }
    }
}
