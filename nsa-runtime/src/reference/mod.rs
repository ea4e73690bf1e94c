//! CPU references: plain, obviously-correct Rust that every GPU kernel is tested against.

pub mod dense_mha;
pub mod fp8;
pub mod indexer;
pub mod kv_cache;
pub mod sparse_mla;
pub mod topk;
