//! Context-parallel round-robin split of an extend batch (spec §4.7): the batch's
//! query tokens are numbered g = 0..T request-major, and rank r owns `g % size == r`.

use super::check::invalid;
use crate::Result;

/// This rank's place in the CP group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpRank {
    pub rank: u32,
    pub size: u32,
}

impl CpRank {
    pub fn new(rank: u32, size: u32) -> Result<Self> {
        if size == 0 || rank >= size {
            return Err(invalid("cp", format!("rank {rank} of size {size}"), "a size ≥ 1 and a rank in 0..size"));
        }
        Ok(CpRank { rank, size })
    }

    /// Whether the split happens at all: more than one rank and some tokens.
    pub fn splits(self, total_tokens: usize) -> bool {
        self.size > 1 && total_tokens > 0
    }

    /// Global tokens in `start..start + len` this rank owns.
    pub fn owned_in(self, start: usize, len: usize) -> usize {
        let below = |n: usize| (n + self.size as usize - 1 - self.rank as usize) / self.size as usize;
        below(start + len) - below(start)
    }
}

/// `x[rank::size]`, appended to `out` (works for any length, including empty).
pub fn split_data_into<T: Copy>(x: &[T], cp: CpRank, out: &mut Vec<T>) {
    out.extend(x.iter().skip(cp.rank as usize).step_by(cp.size as usize).copied());
}

pub fn split_data<T: Copy>(x: &[T], cp: CpRank) -> Vec<T> {
    let mut out = Vec::new();
    split_data_into(x, cp, &mut out);
    out
}

/// This rank's share of each request's query tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QSplit {
    /// Non-zero per-request counts, in request order.
    pub counts: Vec<i32>,
    /// The requests those counts belong to.
    pub bs_idx: Vec<i32>,
}

/// `nsa_cp_round_robin_split_q_seqs`: per request, how many of its tokens this rank
/// owns; requests with none are dropped.
pub fn split_q_seqs(extend_lens: &[i32], cp: CpRank) -> QSplit {
    let mut split = QSplit::default();
    let mut start = 0usize;
    for (i, &e) in extend_lens.iter().enumerate() {
        let n = cp.owned_in(start, e as usize);
        if n > 0 {
            split.counts.push(n as i32);
            split.bs_idx.push(i as i32);
        }
        start += e as usize;
    }
    split
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_counts_equal_counting() {
        for size in 1..6 {
            for rank in 0..size {
                let cp = CpRank::new(rank, size).unwrap();
                for start in 0..13 {
                    for len in 0..13 {
                        let want = (start..start + len).filter(|g| g % size as usize == rank as usize).count();
                        assert_eq!(cp.owned_in(start, len), want);
                    }
                }
            }
        }
    }

    #[test]
    fn split_of_short_and_empty_lists() {
        let cp = CpRank::new(2, 3).unwrap();
        assert_eq!(split_data(&[0, 1, 2, 3, 4, 5, 6], cp), [2, 5]);
        assert_eq!(split_data(&[0, 1], cp), Vec::<i32>::new());
        assert_eq!(split_data::<i32>(&[], cp), Vec::<i32>::new());
    }
}
