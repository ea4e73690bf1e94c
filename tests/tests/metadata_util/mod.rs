//! Shared helpers of the metadata tests: page-aligned request→slot tables.
#![allow(dead_code)]

use nsa_runtime::metadata::{MetadataBuilder, MetadataParams, ReqToToken};

/// A `req_to_token` table whose rows hold page-aligned slots.
#[derive(Clone, Debug)]
pub struct Table {
    pub data: Vec<i32>,
    pub width: usize,
    pub page: u32,
    /// Slots in the pool (every slot of the table is below it).
    pub pool_slots: usize,
}

impl Table {
    /// `rows` rows of `width` positions; page k of row r is page `order[r * pages + k]`
    /// (default: `1 + r * pages + k`, page 0 left free as the dummy page).
    pub fn paged(rows: usize, width: usize, page: u32, order: Option<&[u32]>) -> Table {
        let p = page as usize;
        let pages = width.div_ceil(p);
        let mut data = Vec::with_capacity(rows * width);
        for r in 0..rows {
            for pos in 0..width {
                let k = r * pages + pos / p;
                let page_id = order.map_or(1 + k, |o| o[k] as usize);
                data.push((page_id * p + pos % p) as i32);
            }
        }
        let max_page = order.map_or(rows * pages, |o| o.iter().copied().max().unwrap_or(0) as usize);
        Table { data, width, page, pool_slots: (max_page + 2) * p }
    }

    pub fn view(&self) -> ReqToToken<'_> {
        ReqToToken::new(&self.data, self.width).unwrap()
    }

    pub fn row(&self, r: usize) -> &[i32] {
        &self.data[r * self.width..(r + 1) * self.width]
    }

    pub fn params(&self, topk: u32, draft_tokens: u32) -> MetadataParams {
        MetadataParams { page_size: self.page, topk, draft_tokens, pool_slots: self.pool_slots, cp: None }
    }

    pub fn builder(&self, topk: u32, draft_tokens: u32) -> MetadataBuilder {
        MetadataBuilder::new(self.params(topk, draft_tokens)).unwrap()
    }
}

/// `cu(x)`, written out plainly as the oracle.
pub fn cu(x: &[i32]) -> Vec<i32> {
    let mut out = vec![0];
    for v in x {
        out.push(out.last().unwrap() + v);
    }
    out
}

pub fn arange(n: usize) -> Vec<i32> {
    (0..n as i32).collect()
}

/// The real page table of `rows` (each `width` wide), computed directly from §2.2.
pub fn real_of(rows: &[&[i32]], width: usize, page: u32) -> Vec<i32> {
    let p = page as usize;
    let mut out = Vec::new();
    for row in rows {
        for c in 0..width.div_ceil(p) {
            out.push(row[c * p].div_euclid(page as i32));
        }
    }
    out
}
