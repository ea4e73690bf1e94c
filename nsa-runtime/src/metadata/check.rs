//! Host checks of a batch description, run before anything is written. Each error
//! names the field, the offending value (with its index) and what is allowed.

use super::ReqToToken;
use crate::Result;

pub(crate) use crate::error::invalid;

/// `field` must have one entry per request, like `like`.
pub(crate) fn same_len(field: &'static str, got: usize, like: &str, want: usize) -> Result<()> {
    if got != want {
        return Err(invalid(field, format!("{got} entries"), format!("{want} entries (one per request, as `{like}`)")));
    }
    Ok(())
}

pub(crate) fn non_negative(field: &'static str, values: &[i32]) -> Result<()> {
    match values.iter().position(|&v| v < 0) {
        Some(i) => Err(invalid(field, format!("{field}[{i}] = {}", values[i]), "a length ≥ 0")),
        None => Ok(()),
    }
}

/// Query tokens of a request cannot exceed its KV length.
pub(crate) fn q_within_kv(field: &'static str, q: &[i32], kv_field: &str, kv: &[i32]) -> Result<()> {
    for (i, (&e, &l)) in q.iter().zip(kv).enumerate() {
        if e > l {
            return Err(invalid(
                field,
                format!("{field}[{i}] = {e}"),
                format!("at most {kv_field}[{i}] = {l} (a request's new tokens are part of its KV length)"),
            ));
        }
    }
    Ok(())
}

pub(crate) fn fits_i32(field: &'static str, total: i64, what: &str) -> Result<()> {
    if total > i32::MAX as i64 {
        return Err(invalid(field, format!("{what} = {total}"), "at most 2^31-1 (int32 metadata); split the batch"));
    }
    Ok(())
}

/// Every request's row exists in `req_to_token` and holds `kv_len(i)` columns.
pub(crate) fn rows_and_width(table: &ReqToToken<'_>, rpi: &[i32], max_kv: usize, what: &str) -> Result<()> {
    for (i, &r) in rpi.iter().enumerate() {
        if r < 0 || r as usize >= table.rows() {
            return Err(invalid(
                "req_pool_indices",
                format!("req_pool_indices[{i}] = {r}"),
                format!("a row of req_to_token, 0..{}", table.rows()),
            ));
        }
    }
    if max_kv > table.width() {
        return Err(invalid(
            "seq_lens",
            format!("{what} {max_kv}"),
            format!("at most the req_to_token width {} (max_context_len)", table.width()),
        ));
    }
    Ok(())
}

/// The error for the first bad slot, at position `p` of request `i`'s row.
fn slot_error(row: &[i32], r: i32, i: usize, p: usize, pool_slots: usize, page_size: u32) -> crate::Error {
    let s = row[p];
    let at = format!("slot {s} at row {r} (request {i}), position {p}");
    if s < 0 || s as usize >= pool_slots {
        return invalid("req_to_token", at, format!("a slot in 0..{pool_slots} (the KV pool's capacity)"));
    }
    let offset = p % page_size as usize;
    let after = if offset == 0 { String::new() } else { format!(", right after slot {}", row[p - 1]) };
    invalid(
        "req_to_token",
        at,
        format!("page-aligned slots for page_size {page_size}: position {p} at offset {offset} of its page{after}"),
    )
}

/// The slots a request reads (positions `0..kv_len`) are inside the pool and, with
/// pages larger than 1, page-aligned: position p sits at offset `p % page` of a page
/// whose slots run consecutively (spec §2.1).
pub(crate) fn slots(
    table: &ReqToToken<'_>,
    rpi: &[i32],
    kv_len: impl Fn(usize) -> usize,
    pool_slots: usize,
    page_size: u32,
) -> Result<()> {
    let page = page_size as usize;
    for (i, &r) in rpi.iter().enumerate() {
        let row = &table.row(r as usize)[..kv_len(i)];
        // Page by page: one division for the page start, then plain comparisons
        // (slot j of a page must be its first slot + j, which also keeps it ≥ 0).
        for (pg, chunk) in row.chunks(page).enumerate() {
            let s0 = chunk[0] as i64;
            let bad = if s0 < 0 || s0 as usize >= pool_slots || s0 % page as i64 != 0 {
                Some(0)
            } else {
                chunk.iter().enumerate().position(|(j, &s)| s as i64 != s0 + j as i64 || s as usize >= pool_slots)
            };
            if let Some(j) = bad {
                return Err(slot_error(row, r, i, pg * page + j, pool_slots, page_size));
            }
        }
    }
    Ok(())
}
