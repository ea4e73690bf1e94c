//! The top-k test cases, shared by the GPU tests (`tests/gpu/topk.rs`) and the CPU
//! emulation tests (`tests/emu_topk.rs`): both run exactly these.

use nsa_kernels::{TopkLayout, TopkScore, TopkTransform};
use nsa_runtime::testdata::{ScorePattern, SCORE_PATTERNS};
use nsa_runtime::verify::topk::{TopkCase, TopkPath};

/// Lengths around every boundary of k and of the kernel's shared-memory row cache.
pub fn edge_lengths(k: i32) -> Vec<i32> {
    vec![0, -3, 1, k - 1, k, k + 1, 2 * k + 7, 5000, 40_960, 40_961, 70_001]
}

/// A one-block case (the layout `choose_layout` picks) with random row starts.
pub fn case(
    k: u32,
    transform: TopkTransform,
    deterministic: bool,
    pattern: ScorePattern,
    lengths: Vec<i32>,
    seed: u64,
) -> TopkCase {
    TopkCase {
        k,
        transform,
        deterministic,
        pattern,
        lengths,
        row_starts: true,
        grouped: false,
        table_width: None,
        path: TopkPath::Single(None),
        score: TopkScore::F32,
        seed,
    }
}

pub fn every_variant_every_pattern_edge_lengths() -> Vec<TopkCase> {
    let mut cases = Vec::new();
    let mut seed = 100;
    for k in [512u32, 1024, 2048] {
        for transform in TopkTransform::ALL {
            for deterministic in [false, true] {
                for pattern in SCORE_PATTERNS {
                    seed += 1;
                    cases.push(case(k, transform, deterministic, pattern, edge_lengths(k as i32), seed));
                }
            }
        }
    }
    cases
}

pub fn both_layouts_every_pattern() -> Vec<TopkCase> {
    let mut cases = Vec::new();
    for layout in [TopkLayout::Latency, TopkLayout::Throughput] {
        for deterministic in [false, true] {
            for (i, pattern) in SCORE_PATTERNS.into_iter().enumerate() {
                let mut c =
                    case(2048, TopkTransform::Paged, deterministic, pattern, edge_lengths(2048), 300 + i as u64);
                c.path = TopkPath::Single(Some(layout));
                c.grouped = i % 2 == 0;
                cases.push(c);
            }
        }
    }
    cases
}

/// The sample filter (both layouts, non-deterministic rows): lengths around its list
/// capacities (latency 8192 keys, throughput 6144; shorter rows keep every key),
/// rows too long for the list (it declines before the pass: from 131072 keys in the
/// throughput layout, 1M in the latency layout), rows whose raised values the sample
/// over-counts (fewer than k kept: it declines), heavy ties (more than the list: it
/// declines), and rows up to 1M keys.
pub fn sample_filter_and_its_fallbacks() -> Vec<TopkCase> {
    let mut cases = Vec::new();
    let lengths = vec![6144, 6145, 8192, 8193, 24_576, 24_577, 32_768, 65_536, 131_072, 262_144, 1 << 20, 4097];
    let patterns = [
        ScorePattern::Strided,
        ScorePattern::Uniform,
        ScorePattern::Gaussian,
        ScorePattern::OneBucket,
        ScorePattern::FewDistinct,
        ScorePattern::NonFinite,
    ];
    for layout in [TopkLayout::Latency, TopkLayout::Throughput] {
        for (i, pattern) in patterns.into_iter().enumerate() {
            for k in [512, 2048] {
                let transform = TopkTransform::ALL[i % 3];
                let mut c = case(k, transform, false, pattern, lengths.clone(), 1000 + i as u64 + k as u64);
                c.path = TopkPath::Single(Some(layout));
                cases.push(c);
            }
        }
    }
    cases
}

pub fn split_path_every_transform_every_pattern() -> Vec<TopkCase> {
    let mut cases = Vec::new();
    for transform in TopkTransform::ALL {
        for (i, pattern) in SCORE_PATTERNS.into_iter().enumerate() {
            let mut c = case(2048, transform, false, pattern, edge_lengths(2048), 500 + i as u64);
            c.path = TopkPath::Split;
            c.grouped = transform == TopkTransform::Paged && i % 2 == 0;
            cases.push(c);
        }
    }
    let mut c = case(512, TopkTransform::Plain, false, ScorePattern::Gaussian, vec![1 << 20, 3, 131_072], 9);
    c.path = TopkPath::Split;
    cases.push(c);
    cases
}

pub fn cluster_path_every_size_transform_and_pattern() -> Vec<TopkCase> {
    let mut cases = Vec::new();
    // Around the list capacity (24576: shorter rows keep every key) and slice
    // boundaries of every cluster size.
    let mut lengths = edge_lengths(2048);
    lengths.extend([24_576, 24_577, 32_768, 32_769, 65_536, 65_537, 131_072, 131_073, 2049 + 7 * 4]);
    let mut seed = 700;
    for cluster in [2, 4, 8] {
        for transform in TopkTransform::ALL {
            for (i, pattern) in SCORE_PATTERNS.into_iter().enumerate() {
                seed += 1;
                let mut c = case(2048, transform, false, pattern, lengths.clone(), seed);
                c.path = TopkPath::Cluster(cluster);
                c.grouped = transform == TopkTransform::Paged && i % 2 == 0;
                cases.push(c);
            }
        }
    }
    for k in [512, 1024] {
        let mut c = case(k, TopkTransform::Ragged, false, ScorePattern::OneBucket, edge_lengths(k as i32), k as u64);
        c.path = TopkPath::Cluster(8);
        cases.push(c);
    }
    // Long rows: 1M keys (filtered), 2.2M (too long for the list: CTA 0 runs the
    // histogram path), heavy ties (the joined list overflows: the same), and rows
    // whose raised values the sample over-counts (fewer than k kept: the same).
    for (i, pattern) in [
        ScorePattern::Gaussian,
        ScorePattern::FewDistinct,
        ScorePattern::NonFinite,
        ScorePattern::Strided,
        ScorePattern::Uniform,
    ]
    .into_iter()
    .enumerate()
    {
        let lengths = vec![1 << 20, (1 << 20) + 13, 3, 2_200_000, 262_144];
        let mut c = case(2048, TopkTransform::ALL[i % 3], false, pattern, lengths, 40 + i as u64);
        c.path = TopkPath::Cluster([2, 4, 8][i % 3]);
        cases.push(c);
    }
    cases
}

pub fn paged_prefill_form_groups_rows_by_request() -> Vec<TopkCase> {
    let mut cases = Vec::new();
    for (i, pattern) in SCORE_PATTERNS.into_iter().enumerate() {
        let lengths: Vec<i32> = (0..37).map(|j| [5, 2047, 2048, 2049, 9000, 33_000][(i + j) % 6]).collect();
        let mut c = case(2048, TopkTransform::Paged, i % 2 == 0, pattern, lengths, 900 + i as u64);
        c.grouped = true;
        cases.push(c);
    }
    cases
}

pub fn many_rows_and_very_long_rows() -> Vec<TopkCase> {
    let mut cases = Vec::new();
    let mut rng = nsa_runtime::testdata::rng(5);
    let many: Vec<i32> = (0..4096).map(|_| rand::Rng::random_range(&mut rng, 0..6000)).collect();
    cases.push(case(2048, TopkTransform::Ragged, false, ScorePattern::Gaussian, many.clone(), 1));
    cases.push(case(2048, TopkTransform::Paged, true, ScorePattern::FewDistinct, many, 2));
    for (i, pattern) in
        [ScorePattern::Gaussian, ScorePattern::OneBucket, ScorePattern::FewDistinct, ScorePattern::NonFinite]
            .into_iter()
            .enumerate()
    {
        let long = vec![1 << 20, (1 << 20) + 13];
        cases.push(case(2048, TopkTransform::Plain, i % 2 == 1, pattern, long, 10 + i as u64));
    }
    cases.push(case(1024, TopkTransform::Plain, false, ScorePattern::Gaussian, vec![131_072; 64], 3));
    cases
}

/// bf16 scores on every path: one block (both layouts, deterministic or not, k =
/// 512 and 2048, every transform and pattern, around every boundary, rows starting
/// at every 2-byte alignment), the sample filter around its list capacities and
/// its fallbacks, the split path, and the cluster path (on gfx942 the split path)
/// up to 1M keys. Rounding to bf16 makes near-equal scores ties.
pub fn bf16_scores_every_path() -> Vec<TopkCase> {
    let bf16 = |mut c: TopkCase| {
        c.score = TopkScore::Bf16;
        c
    };
    let mut cases = Vec::new();
    let mut seed = 1300;
    for k in [512u32, 2048] {
        for (i, pattern) in SCORE_PATTERNS.into_iter().enumerate() {
            let transform = TopkTransform::ALL[i % 3];
            for deterministic in [false, true] {
                for layout in [TopkLayout::Latency, TopkLayout::Throughput] {
                    seed += 1;
                    let mut c = bf16(case(k, transform, deterministic, pattern, edge_lengths(k as i32), seed));
                    c.path = TopkPath::Single(Some(layout));
                    c.grouped = transform == TopkTransform::Paged && deterministic;
                    cases.push(c);
                }
            }
        }
    }
    let filter_lengths = vec![6144, 6145, 8192, 8193, 24_577, 131_072, 1 << 20, 4097];
    for (i, pattern) in
        [ScorePattern::Gaussian, ScorePattern::Uniform, ScorePattern::FewDistinct, ScorePattern::Strided]
            .into_iter()
            .enumerate()
    {
        let mut c =
            bf16(case(2048, TopkTransform::ALL[i % 3], false, pattern, filter_lengths.clone(), 1400 + i as u64));
        c.path = TopkPath::Single(Some([TopkLayout::Latency, TopkLayout::Throughput][i % 2]));
        cases.push(c);
    }
    for transform in TopkTransform::ALL {
        for (i, pattern) in
            [ScorePattern::Gaussian, ScorePattern::OneBucket, ScorePattern::NonFinite].into_iter().enumerate()
        {
            let mut lengths = edge_lengths(2048);
            lengths.extend([131_072, 1 << 20]);
            let mut c = bf16(case(2048, transform, false, pattern, lengths.clone(), 1500 + i as u64));
            c.path = TopkPath::Split;
            c.grouped = transform == TopkTransform::Paged && i % 2 == 0;
            cases.push(c.clone());
            c.path = TopkPath::Cluster([2, 8][i % 2]);
            c.seed += 50;
            cases.push(c);
        }
    }
    cases
}

/// One of each path: one block in either layout, split, and clusters of 4 (on gfx942
/// the emulator's tests take the split path for it).
const EVERY_PATH: [TopkPath; 4] = [
    TopkPath::Single(Some(TopkLayout::Latency)),
    TopkPath::Single(Some(TopkLayout::Throughput)),
    TopkPath::Split,
    TopkPath::Cluster(4),
];

/// PAGED over tables of pages (page sizes 64, 61 and 2; decode and prefill forms)
/// on every path: one block (both layouts, deterministic or not), the cluster path
/// (on gfx942 the split path) and the split path, around every length boundary
/// and the table's last page (a table of at least 2048 pages; rows that fill it,
/// one key short of it, and one key past it, which are rejected), up to 1M keys;
/// bf16 scores on every path at one page size; and a page_table_1's rows past its
/// table on every path.
pub fn paged_tables_of_pages_every_path() -> Vec<TopkCase> {
    let mut cases = Vec::new();
    let mut seed = 1700;
    let patterns =
        [ScorePattern::Gaussian, ScorePattern::OneBucket, ScorePattern::FewDistinct, ScorePattern::NonFinite];
    for (j, page_size) in [64u32, 61, 2].into_iter().enumerate() {
        let transform = TopkTransform::Pages(page_size);
        // Every edge length fits: the past-the-table row is the only one rejected.
        let pages = 2048.max(70_001usize.div_ceil(page_size as usize) + 1);
        let filled = (pages * page_size as usize) as i32;
        let mut lengths = edge_lengths(2048);
        lengths.extend([filled - 1, filled, filled + 1]);
        for (i, pattern) in patterns.into_iter().enumerate() {
            for deterministic in [false, true] {
                seed += 1;
                let mut c = case(2048, transform, deterministic, pattern, lengths.clone(), seed);
                c.grouped = (i + j) % 2 == 0;
                c.table_width = Some(pages);
                c.path = TopkPath::Single(Some([TopkLayout::Latency, TopkLayout::Throughput][(i + j) % 2]));
                cases.push(c);
            }
            if i < 2 {
                seed += 1;
                let mut long = lengths.clone();
                long.extend([24_577, 131_072, 1 << 20]);
                let mut c = case(2048, transform, false, pattern, long, seed);
                c.grouped = i == 1;
                c.path = if j == 2 { TopkPath::Split } else { TopkPath::Cluster([2, 8][i]) };
                cases.push(c);
            }
        }
        // Rows past the table on the split and cluster paths (the one-block rows above
        // cover the rest).
        for path in [TopkPath::Split, TopkPath::Cluster(2)] {
            seed += 1;
            let mut c = case(2048, transform, false, ScorePattern::OneBucket, vec![filled + 1, filled, 70_001], seed);
            c.table_width = Some(pages);
            c.path = path;
            cases.push(c);
        }
    }
    for (i, path) in EVERY_PATH.into_iter().enumerate() {
        seed += 1;
        let mut bf16 = case(2048, TopkTransform::Pages(61), false, ScorePattern::FewDistinct, edge_lengths(2048), seed);
        bf16.score = TopkScore::Bf16;
        bf16.grouped = i % 2 == 1;
        bf16.path = path;
        cases.push(bf16);
        seed += 1;
        let lengths = vec![4095, 4096, 4097, 0, 2049, 1 << 20];
        let mut past = case(2048, TopkTransform::Paged, i == 1, ScorePattern::Gaussian, lengths, seed);
        past.table_width = Some(4096);
        past.grouped = i % 2 == 0;
        past.path = path;
        cases.push(past);
    }
    cases
}

/// PAGED over tables of pages with a page missing (entry −1) on every path
/// (`verify::topk::page_holes_on`): short rows, rows of a few pages, long rows.
pub fn page_holes_every_path() -> Vec<TopkCase> {
    let mut cases = Vec::new();
    for (i, path) in EVERY_PATH.into_iter().enumerate() {
        for (j, page_size) in [64u32, 61].into_iter().enumerate() {
            let lengths = vec![300, 2047, 5000, 70_001, 2048];
            let mut c = case(2048, TopkTransform::Pages(page_size), i == 0, ScorePattern::Gaussian, lengths, 1950);
            c.seed += (2 * i + j) as u64;
            c.path = path;
            cases.push(c);
        }
    }
    cases
}

/// One `#[test]` per case list above, each handing its cases to `$run_all`
/// (`fn(Vec<TopkCase>)`): the GPU and the emulated targets run the same tests.
#[macro_export]
macro_rules! topk_case_tests {
    ($run_all:ident) => {
        $crate::topk_case_tests!(
            $run_all: every_variant_every_pattern_edge_lengths,
            both_layouts_every_pattern,
            sample_filter_and_its_fallbacks,
            split_path_every_transform_every_pattern,
            cluster_path_every_size_transform_and_pattern,
            paged_prefill_form_groups_rows_by_request,
            many_rows_and_very_long_rows,
            bf16_scores_every_path,
            paged_tables_of_pages_every_path,
            indexer_logits_every_path
        );
    };
    ($run_all:ident: $($name:ident),+) => {
        $(
            #[test]
            fn $name() {
                $run_all($crate::topk_cases::$name());
            }
        )+
    };
}

/// Indexer logits (clustered, most keys near 0 after the ReLU) through every path
/// the layer's decode rows take: a 16K-key row and a row cut off the page grid.
pub fn indexer_logits_every_path() -> Vec<TopkCase> {
    let paths = [
        TopkPath::Single(Some(TopkLayout::Latency)),
        TopkPath::Single(Some(TopkLayout::Throughput)),
        TopkPath::Split,
        TopkPath::Cluster(8),
    ];
    paths
        .into_iter()
        .enumerate()
        .map(|(i, path)| {
            let transform = if i % 2 == 0 { TopkTransform::Paged } else { TopkTransform::Plain };
            let mut c =
                case(2048, transform, false, ScorePattern::IndexerTopics, vec![16_384, 20_001], 1500 + i as u64);
            c.path = path;
            c
        })
        .collect()
}

/// The unfused page-table transform's cases: (k, prefill form).
pub const INDEX_TRANSFORM_CASES: [(u32, bool); 3] = [(2048, false), (2048, true), (512, true)];
