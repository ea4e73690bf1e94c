//! The KV cache's kernels on the CPU emulator against the reference, bit for bit:
//! the layer's step store (the KV and indexer-K stores in one launch; slots each
//! pool rejects, each rejected token counted once) and the reads (the MLA cache
//! back as bf16 rows, FP8 dequantized or bf16 copied; the indexer-K gather), with
//! 32-lane warps (as on NVIDIA) and 64-lane wavefronts (gfx942), both MLA cache
//! formats, and token counts that leave a block or a wavefront partly empty. No
//! GPU is needed, so CI runs it.

use half::bf16;
use nsa_kernels::layout::*;
use nsa_kernels::{KvCacheFormat, Target};
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

/// Slots to read: `n` random ones of a `pool`-slot cache, repeats included; with
/// at least 3, token 1 reads slot -1 and the last one slot `pool` (both rejected).
fn read_slots(n: usize, pool: usize, seed: u64) -> Vec<i32> {
    let mut idx: Vec<i32> = (0..n).map(|i| ((i as u64 * 7919 + seed * 104_729) % pool as u64) as i32).collect();
    if n >= 3 {
        idx[1] = -1;
        idx[n - 1] = pool as i32;
    }
    idx
}

#[test]
fn the_cache_reads_back_every_count_with_rejects_on_both_warp_widths() {
    for target in [Target::Sm90a, Target::Gfx942] {
        let emu = Emulator::new(target);
        for (i, &n) in COUNTS.iter().enumerate() {
            let seed = 31 + i as u64;
            let pool = 97;
            let idx = read_slots(n, pool, seed);
            let rejected = idx.iter().filter(|&&s| s < 0 || s as usize >= pool).count() as u32;
            // FP8: a cache written by the reference quantizer.
            let rows = testdata::mla_rows(pool, seed);
            let (nope, rope) = split_rows(&rows);
            let mut fp8 = vec![0u8; pool * FP8_TOKEN_BYTES];
            reference::store_fp8(&nope, &rope, &(0..pool as i32).collect::<Vec<_>>(), &mut fp8);
            let (got, counted) = emu.read_rows(KvCacheFormat::Fp8, &fp8, &idx).unwrap();
            let (want, _) = reference::dequant_fp8(&fp8, &idx);
            let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
            assert!(bits(&got) == bits(&want), "{target} n={n}: FP8 dequant differs from the reference");
            assert_eq!(counted, rejected, "{target} n={n}: FP8 dequant rejects");
            // bf16: the rows themselves.
            let bytes: Vec<u8> = rows.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
            let (got, counted) = emu.read_rows(KvCacheFormat::Bf16, &bytes, &idx).unwrap();
            let (want, _) = reference::gather_bf16(&rows, &idx);
            assert!(bits(&got) == bits(&want), "{target} n={n}: bf16 gather differs from the reference");
            assert_eq!(counted, rejected, "{target} n={n}: bf16 gather rejects");
            // The indexer cache: two pages, stored by the reference.
            let index_pool = 2 * INDEXER_PAGE_TOKENS;
            let keys = testdata::indexer_rows(index_pool, seed ^ 9);
            let mut index = vec![0x3cu8; 2 * INDEXER_PAGE_BYTES];
            reference::store_indexer_k(&keys, &(0..index_pool as i32).collect::<Vec<_>>(), &mut index);
            let slots = read_slots(n, index_pool, seed);
            let index_rejected = slots.iter().filter(|&&s| s < 0 || s as usize >= index_pool).count() as u32;
            let (got_keys, got_scales, counted) = emu.gather_indexer_k(&index, &slots).unwrap();
            let (want_keys, want_scales, _) = reference::gather_indexer_k(&index, &slots);
            assert!(got_keys == want_keys, "{target} n={n}: indexer keys differ from the reference");
            let scale_bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert!(scale_bits(&got_scales) == scale_bits(&want_scales), "{target} n={n}: indexer scales differ");
            assert_eq!(counted, index_rejected, "{target} n={n}: indexer gather rejects");
        }
    }
}
