//! Deterministic inputs for GPU checks and benchmarks: ordinary values plus the
//! adversarial tiles the quantizers must get exactly right.

use crate::reference::fp8::e4m3_to_f32;
use half::bf16;
use nsa_kernels::layout::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub mod indexer_topics;

/// What one 128-element tile holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TilePattern {
    /// N(0, σ²) for σ = 1e-3, 1, 30 (cycled by tile).
    Gaussian,
    /// All zeros: scale 0, bytes 0.
    Zeros,
    /// amax exactly 448 (scale 1) and every other value an e4m3 midpoint: ties to even.
    Ties,
    /// One 1.0 and the rest small enough to land on e4m3 subnormals.
    Subnormal,
    /// Finite values mixed with NaN, +inf and −inf.
    NonFinite,
    /// Magnitudes near the bf16 maximum.
    Huge,
    /// Only values below ~1e-36 (stored as a zero tile).
    Tiny,
}

pub const PATTERNS: [TilePattern; 7] = [
    TilePattern::Gaussian,
    TilePattern::Zeros,
    TilePattern::Ties,
    TilePattern::Subnormal,
    TilePattern::NonFinite,
    TilePattern::Huge,
    TilePattern::Tiny,
];

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

fn gaussian(rng: &mut StdRng) -> f32 {
    let u1: f32 = rng.random_range(f32::EPSILON..1.0);
    let u2: f32 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

/// One tile of `len` values following `pattern`; `variant` picks σ and positions.
pub fn tile(pattern: TilePattern, len: usize, variant: usize, rng: &mut StdRng) -> Vec<f32> {
    let sign = |rng: &mut StdRng| if rng.random::<bool>() { 1.0 } else { -1.0 };
    let mut t: Vec<f32> = match pattern {
        TilePattern::Gaussian => {
            let sigma = [1e-3, 1.0, 30.0][variant % 3];
            (0..len).map(|_| sigma * gaussian(rng)).collect()
        }
        TilePattern::Zeros => vec![0.0; len],
        TilePattern::Ties => (0..len)
            .map(|_| {
                let code = rng.random_range(0u8..0x7d);
                sign(rng) * (e4m3_to_f32(code) + e4m3_to_f32(code + 1)) / 2.0
            })
            .collect(),
        TilePattern::Subnormal => (0..len).map(|_| sign(rng) * rng.random_range(1e-6..4e-5)).collect(),
        TilePattern::NonFinite => {
            let mut v: Vec<f32> = (0..len).map(|_| gaussian(rng)).collect();
            for (i, special) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY].into_iter().enumerate() {
                v[(variant * 7 + i * 31) % len] = special;
            }
            v
        }
        TilePattern::Huge => (0..len).map(|_| sign(rng) * rng.random_range(1e37..3e38)).collect(),
        TilePattern::Tiny => (0..len).map(|_| sign(rng) * rng.random_range(0.0..1e-37)).collect(),
    };
    match pattern {
        TilePattern::Ties => t[variant % len] = 448.0,
        TilePattern::Subnormal => t[variant % len] = 1.0,
        _ => {}
    }
    t
}

fn to_bf16(v: &[f32]) -> impl Iterator<Item = bf16> + '_ {
    v.iter().map(|&x| bf16::from_f32(x))
}

/// `n` MLA tokens as rows of 576 bf16 (`[nope 512 | rope 64]`, like the kv_a output
/// the store reads through strided views). Token t, tile i uses pattern
/// `PATTERNS[(t + i) % 7]`; rope holds random bit patterns (copied bit-exactly).
pub fn mla_rows(n: usize, seed: u64) -> Vec<bf16> {
    let mut rng = rng(seed);
    let mut out = Vec::with_capacity(n * BF16_TOKEN_ELEMS);
    for t in 0..n {
        for i in 0..FP8_SCALE_TILES {
            out.extend(to_bf16(&tile(PATTERNS[(t + i) % PATTERNS.len()], FP8_TILE, t, &mut rng)));
        }
        out.extend((0..ROPE_DIM).map(|_| bf16::from_bits(rng.random())));
    }
    out
}

/// `n` indexer keys (`[n, 128]` bf16), patterns cycled per token.
pub fn indexer_rows(n: usize, seed: u64) -> Vec<bf16> {
    let mut rng = rng(seed);
    let mut out = Vec::with_capacity(n * INDEXER_HEAD_DIM);
    for t in 0..n {
        out.extend(to_bf16(&tile(PATTERNS[t % PATTERNS.len()], INDEXER_HEAD_DIM, t, &mut rng)));
    }
    out
}

/// `n` distinct slots of a pool of `pool` slots, in random order (n ≤ pool).
pub fn distinct_slots(n: usize, pool: usize, seed: u64) -> Vec<i32> {
    assert!(n <= pool);
    let mut rng = rng(seed);
    let mut all: Vec<i32> = (0..pool as i32).collect();
    for i in 0..n {
        let j = rng.random_range(i..pool);
        all.swap(i, j);
    }
    all.truncate(n);
    all
}

/// Score rows for top-k tests, including the adversarial ones of spec §7.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScorePattern {
    /// Independent N(0, 1).
    Gaussian,
    /// Every value equal.
    AllEqual,
    /// Values from {0, 1, 2, 3}: thousands tie with the k-th.
    FewDistinct,
    /// All values inside one top-11-bit bucket (1.0 .. 1.0 + 2^-5): the round-0
    /// threshold bin holds the whole row (the candidate-overflow case).
    OneBucket,
    /// 1.0 + i·ulp: values differing only in the last mantissa bits.
    LastBits,
    /// Gaussian with NaN, +inf and −inf sprinkled in (1% each).
    NonFinite,
    /// Every value −inf.
    AllNegInf,
    /// Uniform in [0, 1) (the benchmark's rows): the top octave holds half the row.
    Uniform,
    /// Gaussian with every 32nd value raised by 100. The top-k sample filter's 1024
    /// runs of 8 keys hit raised values 3.5× as often as the row holds them (11% of
    /// sampled keys at 128K–1M keys), so for k 2048 at 128K and 256K keys its
    /// threshold sits high and keeps fewer than k: the filter must decline.
    Strided,
    /// Indexer logits (the CPU reference's) of one request over keys drawn around
    /// shared topics (`indexer_topics`): clustered as a model's, with every key of
    /// other topics near 0 after the ReLU. Slow to build (a reference dot product
    /// per key and head), so not in SCORE_PATTERNS.
    IndexerTopics,
}

pub const SCORE_PATTERNS: [ScorePattern; 9] = [
    ScorePattern::Gaussian,
    ScorePattern::AllEqual,
    ScorePattern::FewDistinct,
    ScorePattern::OneBucket,
    ScorePattern::LastBits,
    ScorePattern::NonFinite,
    ScorePattern::AllNegInf,
    ScorePattern::Uniform,
    ScorePattern::Strided,
];

/// `n` scores following `pattern`.
pub fn score_row(pattern: ScorePattern, n: usize, rng: &mut StdRng) -> Vec<f32> {
    match pattern {
        ScorePattern::Gaussian => (0..n).map(|_| gaussian(rng)).collect(),
        ScorePattern::AllEqual => vec![0.5; n],
        ScorePattern::FewDistinct => (0..n).map(|_| rng.random_range(0..4) as f32).collect(),
        ScorePattern::OneBucket => (0..n).map(|_| 1.0 + rng.random_range(0.0..1.0f32) / 32.0).collect(),
        ScorePattern::LastBits => {
            (0..n).map(|_| f32::from_bits(1.0f32.to_bits() + rng.random_range(0..4096))).collect()
        }
        ScorePattern::NonFinite => (0..n)
            .map(|_| match rng.random_range(0..100) {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                _ => gaussian(rng),
            })
            .collect(),
        ScorePattern::AllNegInf => vec![f32::NEG_INFINITY; n],
        ScorePattern::Uniform => (0..n).map(|_| rng.random::<f32>()).collect(),
        ScorePattern::Strided => (0..n).map(|i| gaussian(rng) + if i % 32 == 0 { 100.0 } else { 0.0 }).collect(),
        ScorePattern::IndexerTopics => indexer_topics::reference_logits(n, rng.random()),
    }
}
