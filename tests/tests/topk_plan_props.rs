//! Property tests of the top-k launch plan (host only): whatever the batch, device
//! and options, `choose_plan` returns a plan the launchers can run, and spreads a
//! row over blocks or a cluster only where the tables say it pays.

use nsa_kernels::{kernel_set, KernelSpec, NsaConfig, Target, TopkEntries, TopkScore};
use nsa_runtime::ops::topk::{
    choose_layout, choose_plan, TopkPlan, CLUSTER_MIN_ROW, CLUSTER_SMS_PER_ROW, ONE_BLOCK_FILTER_MAX_ROW,
    SPLIT_MIN_CHUNK, SPLIT_MIN_ROW, SPLIT_SMS_PER_ROW,
};
use proptest::prelude::*;

proptest! {
    #[test]
    fn plans_are_runnable_and_spread_only_few_long_rows(
        rows in 0usize..5000,
        cap in 0usize..3_000_000,
        sms in 1u32..320,
        deterministic: bool,
        workspace: bool,
        clusters: bool,
    ) {
        let (plan, why) = choose_plan(rows, cap, sms, deterministic, workspace, clusters);
        prop_assert!(!why.is_empty());
        let spread = |per_row: usize, min_row: usize| {
            !deterministic && rows > 0 && per_row * rows <= sms as usize && cap >= min_row
        };
        let few_long = if clusters {
            spread(CLUSTER_SMS_PER_ROW, CLUSTER_MIN_ROW)
        } else {
            spread(SPLIT_SMS_PER_ROW, SPLIT_MIN_ROW)
        };
        // Rows past the one-block filter take clusters while every cluster of 2 fits.
        let past_one_block = !deterministic && rows > 0 && cap > ONE_BLOCK_FILTER_MAX_ROW && 2 * rows <= sms as usize;
        match plan {
            TopkPlan::Single(layout) => {
                prop_assert!(!few_long || (!clusters && !workspace), "few long rows left in one block");
                prop_assert!(!(past_one_block && clusters), "rows past the one-block filter left in one block");
                prop_assert_eq!(layout, choose_layout(rows, cap, sms).0);
            }
            TopkPlan::Cluster { size } => {
                prop_assert!((few_long || past_one_block) && clusters);
                // Every cluster of the batch runs at once, one CTA per SM (few long rows: 8 CTAs).
                if few_long {
                    prop_assert_eq!(size, 8);
                }
                prop_assert!(rows * size as usize <= sms as usize);
            }
            TopkPlan::Split { chunk, chunks } => {
                prop_assert!(few_long && workspace && !clusters);
                prop_assert!(chunk >= SPLIT_MIN_CHUNK && chunk % 1024 == 0, "chunk {}", chunk);
                // The chunks cover the row, and none is empty.
                prop_assert!(chunk * chunks >= cap && chunk * (chunks - 1) < cap, "{} x {} for {}", chunk, chunks, cap);
            }
        }
    }
}

proptest! {
    /// Whatever unordered plan a batch gets, its kernel is in the configuration's
    /// kernel set for every transform, so `nsa compile` bakes it and a layer warms
    /// it (with `NSA_JIT=off` a kernel outside the set is an error).
    #[test]
    fn every_unordered_plan_is_in_the_kernel_set(
        // Few rows half the time: the cluster and split plans.
        rows in prop_oneof![1usize..=20, 1usize..5000],
        cap in 0usize..3_000_000,
        target in prop::sample::select(Target::ALL.to_vec()),
        workspace: bool,
    ) {
        let mut cfg = NsaConfig::preset("deepseek-v3.2").unwrap();
        cfg.targets = vec![target];
        let set = kernel_set(&cfg);
        let sms = if target == Target::Gfx942 { 304 } else { 132 };
        let (plan, _) = choose_plan(rows, cap, sms, false, workspace, target.has_clusters());
        for entries in TopkEntries::CALLS {
            let spec = KernelSpec::new(plan.family(cfg.topk, false, TopkScore::F32, entries), target);
            prop_assert!(set.contains(&spec), "{} ({plan:?}) is not in the kernel set", spec.id());
        }
    }
}
