//! The packed layout of the device mirror (host part, no GPU): every present field
//! is copied verbatim at a 16-byte-aligned offset, absent fields have no range, and
//! the page-size-1 real table resolves to `page_table_1`.

mod metadata_util;

use metadata_util::Table;
use nsa_runtime::metadata::device::{host_field, pack_into, Field, FIELD_ALIGN};
use nsa_runtime::metadata::{ExtendBatch, ExtendPlan, NsaMetadata, Requests, TransformMethod};

fn check_packing(md: &NsaMetadata) {
    let mut staging = vec![123; 3]; // stale content is discarded
    let layout = pack_into(md, &mut staging);
    assert_eq!(layout.len(), staging.len());
    assert_eq!(staging.len() % FIELD_ALIGN, 0);
    let mut ends = Vec::new();
    for f in Field::ALL {
        match (host_field(md, f), layout.range(f)) {
            (Some(data), Some(r)) => {
                assert_eq!(r.start % FIELD_ALIGN, 0, "{f:?}");
                assert_eq!(&staging[r.clone()], data, "{f:?}");
                ends.push(r);
            }
            (None, Some(r)) => {
                assert_eq!(f, Field::RealPageTable, "{f:?} is absent but packed");
                assert_eq!(Some(r), layout.range(Field::PageTable1));
            }
            (None, None) => {}
            (Some(_), None) => panic!("{f:?} present but not packed"),
        }
    }
    // Fields do not overlap.
    ends.sort_by_key(|r| r.start);
    assert!(ends.windows(2).all(|w| w[0].end <= w[1].start));
}

#[test]
fn decode_packs_every_field_once() {
    for page in [1, 64] {
        let t = Table::paged(3, 200, page, None);
        let md = t
            .builder(2048, 0)
            .decode(&t.view(), Requests { req_pool_indices: &[2, 0, 1], seq_lens: &[5, 130, 7] })
            .unwrap();
        check_packing(&md);
        assert!(host_field(&md, Field::IndexerKs).is_none());
    }
}

#[test]
fn extend_packs_the_optional_fields() {
    let t = Table::paged(2, 64, 64, None);
    let batch =
        ExtendBatch { req_pool_indices: &[0, 1], seq_lens: &[6, 3], extend_lens: &[2, 3], prefix_lens: Some(&[4, 0]) };
    let plan = ExtendPlan { transform: TransformMethod::Ragged, mha_fp8_dequant: false };
    let md = t.builder(2048, 0).extend(&t.view(), batch, plan).unwrap();
    check_packing(&md);
    for f in [
        Field::PageTable1Flattened,
        Field::TopkIndicesOffset,
        Field::IndexerKs,
        Field::IndexerKe,
        Field::TokenToBatchIdx,
    ] {
        assert!(host_field(&md, f).is_some(), "{f:?}");
    }
}

#[test]
fn idle_packs_the_cu_arrays() {
    let t = Table::paged(1, 64, 64, None);
    let md = t.builder(2048, 0).idle();
    check_packing(&md);
    let mut staging = Vec::new();
    assert!(!pack_into(&md, &mut staging).is_empty()); // cu arrays hold a leading 0
}
