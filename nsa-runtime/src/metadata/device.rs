//! Device mirror of [`NsaMetadata`]: every int32 field in one device buffer, uploaded
//! with one copy (one launch-independent transfer per forward instead of ~14).
//!
//! Each field starts on a 16-byte boundary so kernels may use vector loads. The
//! packing ([`pack_into`]) is plain host code; the upload only copies its result.

use super::host::{NsaMetadata, RealPageTable};
use crate::{Error, Result};
use cudarc::driver::{CudaSlice, CudaStream, CudaView};
use std::ops::Range;
use std::sync::Arc;

/// The device-side fields of [`NsaMetadata`] (host-only values stay on the host).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    CacheSeqlens,
    CuSeqlensQ,
    CuSeqlensK,
    PageTable1,
    RealPageTable,
    SeqlensExpanded,
    NsaCacheSeqlens,
    NsaCuSeqlensK,
    NsaCuSeqlensQ,
    PageTable1Flattened,
    TopkIndicesOffset,
    IndexerKs,
    IndexerKe,
    TokenToBatchIdx,
}

impl Field {
    pub const ALL: [Field; 14] = [
        Field::CacheSeqlens,
        Field::CuSeqlensQ,
        Field::CuSeqlensK,
        Field::PageTable1,
        Field::RealPageTable,
        Field::SeqlensExpanded,
        Field::NsaCacheSeqlens,
        Field::NsaCuSeqlensK,
        Field::NsaCuSeqlensQ,
        Field::PageTable1Flattened,
        Field::TopkIndicesOffset,
        Field::IndexerKs,
        Field::IndexerKe,
        Field::TokenToBatchIdx,
    ];
}

/// Elements each field is aligned to (16 bytes of int32).
pub const FIELD_ALIGN: usize = 4;

/// The host data of `f`: `None` when the field is absent, and for the real page
/// table when it aliases `page_table_1` (page size 1).
pub fn host_field(md: &NsaMetadata, f: Field) -> Option<&[i32]> {
    let ranges = md.indexer.as_ref();
    Some(match f {
        Field::CacheSeqlens => &md.cache_seqlens,
        Field::CuSeqlensQ => &md.cu_seqlens_q,
        Field::CuSeqlensK => &md.cu_seqlens_k,
        Field::PageTable1 => &md.page_table_1.data,
        Field::RealPageTable => match &md.real_page_table {
            RealPageTable::Aliased => return None,
            RealPageTable::Table(t) => &t.data,
        },
        Field::SeqlensExpanded => &md.nsa_seqlens_expanded,
        Field::NsaCacheSeqlens => &md.nsa_cache_seqlens,
        Field::NsaCuSeqlensK => &md.nsa_cu_seqlens_k,
        Field::NsaCuSeqlensQ => &md.nsa_cu_seqlens_q,
        Field::PageTable1Flattened => md.page_table_1_flattened.as_deref()?,
        Field::TopkIndicesOffset => md.topk_indices_offset.as_deref()?,
        Field::IndexerKs => &ranges?.ks,
        Field::IndexerKe => &ranges?.ke,
        Field::TokenToBatchIdx => &ranges?.token_to_batch_idx,
    })
}

/// Where each field lives in the packed buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackedLayout {
    ranges: [Option<Range<usize>>; Field::ALL.len()],
    len: usize,
}

impl PackedLayout {
    /// Element range of `f`; the aliased real page table resolves to `page_table_1`.
    pub fn range(&self, f: Field) -> Option<Range<usize>> {
        match (&self.ranges[f as usize], f) {
            (None, Field::RealPageTable) => self.ranges[Field::PageTable1 as usize].clone(),
            (r, _) => r.clone(),
        }
    }

    /// Total elements, padding included.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Packs every present field of `md` into `staging` (cleared first, capacity reused).
pub fn pack_into(md: &NsaMetadata, staging: &mut Vec<i32>) -> PackedLayout {
    staging.clear();
    let mut layout = PackedLayout::default();
    for f in Field::ALL {
        if let Some(data) = host_field(md, f) {
            let start = staging.len();
            staging.extend_from_slice(data);
            layout.ranges[f as usize] = Some(start..staging.len());
            staging.resize(staging.len().next_multiple_of(FIELD_ALIGN), 0);
        }
    }
    layout.len = staging.len();
    layout
}

/// [`NsaMetadata`] on the device: one buffer, one view per field.
#[derive(Debug)]
pub struct DeviceNsaMetadata {
    buf: CudaSlice<i32>,
    layout: PackedLayout,
}

impl DeviceNsaMetadata {
    /// Packs `md` and copies it to a new device buffer on `stream`. The staging
    /// buffer is pageable memory, which the driver stages before the call returns,
    /// so dropping it afterwards is safe.
    pub fn upload(md: &NsaMetadata, stream: &Arc<CudaStream>) -> Result<Self> {
        let mut staging = Vec::new();
        let layout = pack_into(md, &mut staging);
        let buf = if staging.is_empty() {
            stream.null().map_err(Error::driver("allocating empty NSA metadata"))?
        } else {
            stream.clone_htod(&staging).map_err(Error::driver("uploading NSA metadata"))?
        };
        Ok(DeviceNsaMetadata { buf, layout })
    }

    /// The device view of `f`, or `None` when the host field is absent.
    pub fn field(&self, f: Field) -> Option<CudaView<'_, i32>> {
        self.layout.range(f).map(|r| self.buf.slice(r))
    }

    pub fn layout(&self) -> &PackedLayout {
        &self.layout
    }
}
