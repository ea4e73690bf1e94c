//! Structured lightning-indexer inputs: queries and keys drawn around a few shared
//! "topics", so the logits the indexer computes from them are clustered the way a
//! model's are (many keys of a request's topics scoring close together near the
//! top, the rest spread below), unlike uniform or Gaussian score rows. Top-k
//! benchmarks run on the logits the indexer kernel itself produces from these.

use super::{gaussian, rng};
use crate::reference::fp8::f32_to_e4m3_satfinite;
use crate::reference::indexer::{paged_logits, PagedKeys, INDEX_HEADS};
use nsa_kernels::layout::{INDEXER_HEAD_DIM, INDEXER_PAGE_BYTES, INDEXER_PAGE_TOKENS};
use rand::rngs::StdRng;
use rand::Rng;

/// Topics the keys are drawn around.
pub const TOPICS: usize = 64;

/// Paged indexer inputs of `requests` requests of `context` keys each (one query
/// row a request, 64 heads): what `ops::indexer::paged_logits` and the CPU
/// reference take. The requests share one pool of `context` keys, each reading it
/// through its own page order, so large batches cost no more to build than one
/// request; each request's queries are its own.
#[derive(Clone, Debug)]
pub struct StructuredIndexer {
    /// `[requests, 64, 128]` e4m3 bytes.
    pub q: Vec<u8>,
    /// `[requests, 64]` positive gates.
    pub weights: Vec<f32>,
    /// The paged cache: `context / 64` pages of 64 keys.
    pub cache: Vec<u8>,
    /// `[requests, width]` page ids: every request reads every page once, in an
    /// order of its own.
    pub block_table: Vec<i32>,
    /// Pages per request.
    pub width: usize,
    pub context_lens: Vec<i32>,
    /// Each request's two topics (its heads mix them), and each cached key's (by
    /// slot: page · 64 + offset), to check the structure.
    pub request_topics: Vec<[usize; 2]>,
    pub key_topics: Vec<usize>,
}

fn unit_vector(rng: &mut StdRng) -> Vec<f32> {
    let v: Vec<f32> = (0..INDEXER_HEAD_DIM).map(|_| gaussian(rng)).collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / norm).collect()
}

/// e4m3 bytes of `v` with the per-vector scale that maps its largest magnitude to
/// 448 (the cache's format: scale · e4m3 ≈ v), and that scale.
fn quantize(v: &[f32]) -> (Vec<u8>, f32) {
    let amax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let scale = if amax > 0.0 { amax / 448.0 } else { 1.0 };
    (v.iter().map(|&x| f32_to_e4m3_satfinite(x / scale)).collect(), scale)
}

/// `requests` requests of `context` keys (a multiple of 64). Topic popularity
/// falls as 1 / (rank + 1), so a few topics hold many keys; a key is its topic's
/// direction times a strength in [0.5, 1.5) plus noise of a third of that; a query
/// head mixes its request's topics with weights of its own plus noise.
pub fn structured_indexer(requests: usize, context: usize, seed: u64) -> StructuredIndexer {
    assert!(context % INDEXER_PAGE_TOKENS == 0, "context is whole pages");
    let mut rng = rng(seed);
    let topics: Vec<Vec<f32>> = (0..TOPICS).map(|_| unit_vector(&mut rng)).collect();
    let popularity: Vec<f32> = (0..TOPICS).map(|c| 1.0 / (c + 1) as f32).collect();
    let total: f32 = popularity.iter().sum();
    let draw_topic = |rng: &mut StdRng| {
        let mut u = rng.random::<f32>() * total;
        for (c, &p) in popularity.iter().enumerate() {
            if u < p {
                return c;
            }
            u -= p;
        }
        TOPICS - 1
    };

    let width = context / INDEXER_PAGE_TOKENS;
    let mut cache = vec![0u8; width * INDEXER_PAGE_BYTES];
    let mut key_topics = Vec::with_capacity(context);
    // Per-dimension noise of sd 1 / (3 √128): a noise vector of a third of the unit topic's length.
    let noise_sd = 1.0 / (3.0 * (INDEXER_HEAD_DIM as f32).sqrt());
    for slot in 0..context {
        let c = draw_topic(&mut rng);
        key_topics.push(c);
        let strength = rng.random_range(0.5..1.5f32);
        let key: Vec<f32> = topics[c].iter().map(|&t| strength * (t + gaussian(&mut rng) * noise_sd)).collect();
        let (bytes, scale) = quantize(&key);
        let (page, off) = (slot / INDEXER_PAGE_TOKENS, slot % INDEXER_PAGE_TOKENS);
        let base = page * INDEXER_PAGE_BYTES;
        cache[base + off * INDEXER_HEAD_DIM..][..INDEXER_HEAD_DIM].copy_from_slice(&bytes);
        let at = base + INDEXER_PAGE_TOKENS * INDEXER_HEAD_DIM + 4 * off;
        cache[at..at + 4].copy_from_slice(&scale.to_le_bytes());
    }
    let block_table: Vec<i32> = (0..requests).flat_map(|_| super::distinct_slots(width, width, rng.random())).collect();

    let mut q = Vec::with_capacity(requests * INDEX_HEADS * INDEXER_HEAD_DIM);
    let mut weights = Vec::with_capacity(requests * INDEX_HEADS);
    let mut request_topics = Vec::with_capacity(requests);
    for _ in 0..requests {
        let mine = [draw_topic(&mut rng), draw_topic(&mut rng)];
        request_topics.push(mine);
        for _ in 0..INDEX_HEADS {
            let mix = rng.random::<f32>();
            let head: Vec<f32> = (0..INDEXER_HEAD_DIM)
                .map(|d| 8.0 * (mix * topics[mine[0]][d] + (1.0 - mix) * topics[mine[1]][d]) + gaussian(&mut rng) / 4.0)
                .collect();
            // The gates absorb the query's scale, as the model's q_scale folding does.
            let (bytes, scale) = quantize(&head);
            q.extend_from_slice(&bytes);
            weights.push(rng.random_range(0.5..1.5f32) * scale / INDEX_HEADS as f32);
        }
    }
    StructuredIndexer {
        q,
        weights,
        cache,
        block_table,
        width,
        context_lens: vec![context as i32; requests],
        request_topics,
        key_topics,
    }
}

/// The CPU reference's logits of one request over `n` structured keys (built for
/// the next multiple of 64 and cut to `n`).
pub fn reference_logits(n: usize, seed: u64) -> Vec<f32> {
    if n == 0 {
        return Vec::new();
    }
    let context = n.next_multiple_of(INDEXER_PAGE_TOKENS);
    let s = structured_indexer(1, context, seed);
    let (mut logits, _) = paged_logits(&s.q, &s.weights, s.keys(), 1, context);
    logits.truncate(n);
    logits
}

impl StructuredIndexer {
    /// The keys as the reference's paged logits take them.
    pub fn keys(&self) -> PagedKeys<'_> {
        PagedKeys {
            cache: &self.cache,
            block_table: &self.block_table,
            width: self.width,
            context_lens: &self.context_lens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The logits carry the structure: a request's highest-scoring keys are those of
    /// its own topics (as many as it has, up to k), and no logit is negative or
    /// non-finite (ReLU and positive gates).
    #[test]
    fn top_keys_come_from_the_request_topics() {
        let (requests, context, k) = (4, 4096, 512);
        let s = structured_indexer(requests, context, 7);
        let (logits, _) = paged_logits(&s.q, &s.weights, s.keys(), 1, context);
        for r in 0..requests {
            let row = &logits[r * context..][..context];
            assert!(row.iter().all(|x| x.is_finite() && *x >= 0.0), "request {r}");
            let slot = |i: usize| {
                s.block_table[r * s.width + i / INDEXER_PAGE_TOKENS] as usize * INDEXER_PAGE_TOKENS
                    + i % INDEXER_PAGE_TOKENS
            };
            let is_own = |i: usize| s.request_topics[r].contains(&s.key_topics[slot(i)]);
            let m = (0..context).filter(|&i| is_own(i)).count().min(k);
            assert!(m > 0, "request {r} has no key of its topics");
            let mut order: Vec<usize> = (0..context).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            let own = order[..m].iter().filter(|&&i| is_own(i)).count();
            assert!(own * 10 >= m * 9, "request {r}: {own} of its top {m} keys from its topics");
        }
    }
}
