//! nsa-kernels: everything that decides *what* to compile, with no GPU and no I/O.
//!
//! [`NsaConfig`] (validated) → [`catalog::kernel_set`] → [`KernelSpec`]s → [`render::render`]
//! gives self-contained device source plus the embedded headers it includes.

pub mod catalog;
pub mod config;
pub mod families;
pub mod render;
pub mod spec;
pub mod target;

pub use catalog::{deterministic_topk_set, kernel_set};
pub use config::{excerpt, ConfigError, ConfigIssue, KvCacheFormat, NsaConfig, PRESETS};
pub use render::{render, RenderError, RenderedKernel, HEADERS};
pub use spec::{KernelFamily, KernelSpec, TopkEntries, TopkLayout, TopkScore, TopkTransform};
pub use target::{OutputKind, Target, Toolchain, Vendor};

/// Constants of the DeepSeek V3.2 attention layout (spec §1–§2).
pub mod layout {
    /// Latent ("nope") width of the MLA cache, also the absorbed V dim.
    pub const KV_LORA_RANK: usize = 512;
    /// RoPE width of the MLA cache.
    pub const ROPE_DIM: usize = 64;
    /// Elements per token of the bf16 MLA cache.
    pub const BF16_TOKEN_ELEMS: usize = KV_LORA_RANK + ROPE_DIM;
    /// Bytes per token of the FP8 MLA cache: 512 e4m3, 4 f32 scales, 64 bf16 rope.
    pub const FP8_TOKEN_BYTES: usize = KV_LORA_RANK + 4 * FP8_SCALE_TILES + 2 * ROPE_DIM;
    /// Elements covered by one FP8 scale.
    pub const FP8_TILE: usize = 128;
    /// Scales per FP8 token.
    pub const FP8_SCALE_TILES: usize = KV_LORA_RANK / FP8_TILE;
    /// Byte offset of the scales inside an FP8 token.
    pub const FP8_SCALES_OFFSET: usize = KV_LORA_RANK;
    /// Byte offset of the rope part inside an FP8 token.
    pub const FP8_ROPE_OFFSET: usize = KV_LORA_RANK + 4 * FP8_SCALE_TILES;
    /// Largest finite e4m3fn magnitude.
    pub const E4M3_MAX: f32 = 448.0;
    /// Indexer key width (one quantisation block).
    pub const INDEXER_HEAD_DIM: usize = 128;
    /// Tokens per page of the indexer K cache (fixed by its layout, spec §2.5).
    pub const INDEXER_PAGE_TOKENS: usize = 64;
    /// Bytes per token of the indexer K cache: 128 e4m3 + one f32 scale.
    pub const INDEXER_TOKEN_BYTES: usize = INDEXER_HEAD_DIM + 4;
    /// Bytes per indexer page: values of all 64 tokens, then their 64 scales.
    pub const INDEXER_PAGE_BYTES: usize = INDEXER_PAGE_TOKENS * INDEXER_TOKEN_BYTES;
    /// DeepSeek V3.2 softmax scale (`layer.scaling`, spec §1): 192^-0.5 · mscale²
    /// with the V3 yarn settings.
    pub const DEEPSEEK_V32_SM_SCALE: f32 = 0.135_233_77;
    /// Floor of the indexer amax before the power-of-two scale is taken.
    pub const INDEXER_AMAX_FLOOR: f32 = 1e-4;

    const _: () = assert!(FP8_TOKEN_BYTES == 656);
    const _: () = assert!(INDEXER_PAGE_BYTES == 8448);
}
