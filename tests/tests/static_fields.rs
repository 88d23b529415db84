//! Static fields (`DatasetBuilder::static_variable`): an array without a sample axis
//! (orography) is zarr-python's whole array in every row of every batch, alone or as a channel
//! of a stack, on every path a slot is filled by (tiles with partial edges, a shard's inner
//! chunks, a cropped region, a cache directory's revived file, decoding into rows for the
//! sampled variables beside it); it leaves the sampled variables' anchors and windows as they
//! were; and every static field a dataset cannot read is refused naming it.

use insitubatch::{EngineError, InSituDataset, IntoRows};
use insitubatch_tests::{FixtureArray, sample_of};

mod common;
use common::{check_epoch, fixture, run, sorted};

/// Every row of `label` in one epoch of `split` equals `want` (the bytes of one row); returns
/// the anchors drawn.
fn rows_equal(ds: &InSituDataset, split: &str, label: &str, want: &[u8]) -> Vec<u64> {
    let mut anchors = Vec::new();
    for b in ds.iter(split).unwrap() {
        let b = b.unwrap();
        let a = b.array(label).unwrap();
        assert_eq!(a.bytes().len(), b.len() * want.len(), "{label}");
        for (r, row) in a.bytes().chunks(want.len()).enumerate() {
            assert!(row == want, "{label}: row {r} is not the static field");
        }
        anchors.extend_from_slice(b.sample_indices());
    }
    anchors
}

fn statics() -> (FixtureArray, FixtureArray, FixtureArray) {
    (
        fixture("statics", "field"),
        fixture("statics", "orog"),
        fixture("statics", "orog_sharded"),
    )
}

#[test]
fn a_static_field_is_zarr_pythons_whole_array_in_every_row() {
    let (field, orog, sharded) = statics();
    // One block per epoch too (16 chunks a block): the static slot is then read within one
    // block, and still never decoded into rows (every row reads it).
    for (mode, block_chunks) in [
        (IntoRows::Never, 2),
        (IntoRows::Always, 2),
        (IntoRows::Always, 16),
        (IntoRows::Auto, 2),
    ] {
        for split in ["train", "all"] {
            let ds = InSituDataset::builder(&field.store)
                .variable("x", "field")
                .window("x_next", "field", 2)
                .static_variable("orog", "orog")
                .static_variable("sharded", "orog_sharded")
                .batch_size(3)
                .block_chunks(block_chunks)
                .decode_into_batches(mode)
                .build()
                .unwrap();
            // The sampled variables' values and anchors are what they are without the statics:
            // the window drops the last two anchors, the static fields drop none.
            let refs = [("x", &field, 0), ("x_next", &field, 0)];
            assert_eq!(
                sorted(check_epoch(&ds, split, &refs)),
                (0..8).collect::<Vec<_>>()
            );
            for (label, f) in [("orog", &orog), ("sharded", &sharded)] {
                let anchors = rows_equal(&ds, split, label, &f.reference);
                assert_eq!(
                    sorted(anchors),
                    (0..8).collect::<Vec<_>>(),
                    "{mode:?} {split}"
                );
            }
        }
    }
}

#[test]
fn a_static_field_stacks_as_a_channel_beside_sampled_variables() {
    let (field, orog, sharded) = statics();
    let ds = InSituDataset::builder(&field.store)
        .variable("x", "field")
        .static_variable("orog", "orog")
        .static_variable("sharded", "orog_sharded")
        .stack("inputs", ["orog", "x", "sharded"])
        .batch_size(4)
        .build()
        .unwrap();
    let sb = 9 * 16 * 4;
    let mut rows = 0;
    for b in ds.train().unwrap() {
        let b = b.unwrap();
        let a = b.array("inputs").unwrap();
        assert_eq!(a.shape(), [b.len(), 3, 9, 16]);
        for (r, &anchor) in b.sample_indices().iter().enumerate() {
            let row = &a.bytes()[r * 3 * sb..(r + 1) * 3 * sb];
            assert_eq!(&row[..sb], &orog.reference[..]);
            assert_eq!(
                &row[sb..2 * sb],
                &sample_of(&field.reference, &field.shape, 0, anchor, 4)[..]
            );
            assert_eq!(&row[2 * sb..], &sharded.reference[..]);
        }
        rows += b.len();
    }
    assert_eq!(rows, 10);
}

#[test]
fn a_cropped_static_field_is_its_region_and_stacks_with_cropped_variables() {
    // Rows 2..7 and columns 12..16 then 0..3 (across the end of the axis, a periodic longitude).
    let (field, orog, sharded) = statics();
    let region = [(2i64, 7i64), (-4, 3)];
    let ds = InSituDataset::builder(&field.store)
        .cropped_window_wrapping("x", "field", 0, &region)
        .cropped_static("orog", "orog", &region)
        .cropped_static("sharded", "orog_sharded", &region)
        .stack("inputs", ["x", "orog", "sharded"])
        .batch_size(5)
        .build()
        .unwrap();
    let crop = |full: &[u8], cols: u64| -> Vec<u8> {
        let mut out = Vec::new();
        for i in 2..7u64 {
            for j in (12..16u64).chain(0..3) {
                let at = ((i * cols + j) * 4) as usize;
                out.extend_from_slice(&full[at..at + 4]);
            }
        }
        out
    };
    let (want_orog, want_sharded) = (crop(&orog.reference, 16), crop(&sharded.reference, 16));
    let cb = 5 * 7 * 4;
    for b in ds.all().unwrap() {
        let b = b.unwrap();
        let a = b.array("inputs").unwrap();
        assert_eq!(a.shape(), [b.len(), 3, 5, 7]);
        for (r, &anchor) in b.sample_indices().iter().enumerate() {
            let row = &a.bytes()[r * 3 * cb..(r + 1) * 3 * cb];
            let x = crop(&sample_of(&field.reference, &field.shape, 0, anchor, 4), 16);
            assert_eq!(&row[..cb], &x[..]);
            assert_eq!(&row[cb..2 * cb], &want_orog[..]);
            assert_eq!(&row[2 * cb..], &want_sharded[..]);
        }
    }
}

#[test]
fn a_static_field_is_read_once_a_pass_and_revived_from_a_cache_directory() {
    let (field, orog, _) = statics();
    let cache = tempfile::tempdir().unwrap();
    let builder = || {
        InSituDataset::builder(&field.store)
            .variable("x", "field")
            .static_variable("orog", "orog")
            .batch_size(2)
            .block_chunks(1)
            .cache_dir(cache.path())
            .persist(true)
    };
    let ds = builder().build().unwrap();
    let s = run(&ds, "train");
    // The field's 4 chunks of 3 samples, and the static field's 3 x 3 tiles once, as one
    // slot kept for the whole pass.
    assert_eq!((s.tiles_read, s.cache_misses), (4 + 9, 4 + 1), "{s:?}");
    drop(ds);
    let ds = builder().build().unwrap();
    let mut pass = ds.train().unwrap();
    let mut rows = 0;
    for b in pass.by_ref() {
        let b = b.unwrap();
        let a = b.array("orog").unwrap();
        for row in a.bytes().chunks(orog.reference.len()) {
            assert_eq!(row, &orog.reference[..]);
        }
        rows += b.len();
    }
    let s = pass.stats();
    assert_eq!((rows, s.tiles_read, s.bytes_decoded), (10, 0, 0), "{s:?}");
}

#[test]
fn static_fields_a_dataset_cannot_read_are_refused_naming_them() {
    let (field, _, _) = statics();
    let b = || InSituDataset::builder(&field.store);
    let err = |b: insitubatch::DatasetBuilder| match b.build() {
        Err(e) => e,
        Ok(_) => panic!("built"),
    };
    // Nothing sampled: no samples for the batches to draw.
    let e = err(b().static_variable("o", "orog"));
    assert!(
        matches!(e, EngineError::InvalidArgument { .. })
            && e.to_string().contains("every variable is a static field"),
        "{e}"
    );
    // One array both static and sampled.
    let e = err(b().variable("x", "field").static_variable("f", "field"));
    assert!(e.to_string().contains("one as a static field"), "{e}");
    // An array the store does not have lists what it has.
    let e = err(b().variable("x", "field").static_variable("o", "orography"));
    assert!(
        e.to_string().contains("`orography`") && e.to_string().contains("orog_sharded"),
        "{e}"
    );
    // A static field in a stack of another shape.
    let e = err(b()
        .variable("x", "field")
        .static_variable("o", "orog")
        .cropped_static("c", "orog_sharded", &[(0, 4), (0, 4)])
        .stack("s", ["o", "c"]));
    assert!(e.to_string().contains("`stacks`"), "{e}");
    // A region that does not fit the array names it.
    let e = err(b()
        .variable("x", "field")
        .cropped_static("o", "orog", &[(0, 10), (0, 4)]));
    assert!(e.to_string().contains("orog"), "{e}");
}

#[test]
fn chunk_transforms_run_on_a_static_field() {
    let (field, orog, _) = statics();
    let ds = InSituDataset::builder(&field.store)
        .variable("x", "field")
        .static_variable("orog", "orog")
        .chunk_transforms_json(
            r#"[{"type": "affine", "scale": 0.5, "offset": -1.0, "applies": ["orog"]}]"#,
        )
        .batch_size(4)
        .build()
        .unwrap();
    let want: Vec<u8> = orog
        .reference
        .chunks(4)
        .flat_map(|b| (f32::from_le_bytes(b.try_into().unwrap()) * 0.5 - 1.0).to_ne_bytes())
        .collect();
    assert_eq!(
        sorted(rows_equal(&ds, "train", "orog", &want)),
        (0..10).collect::<Vec<_>>()
    );
    let refs = [("x", &field, 0)];
    check_epoch(&ds, "train", &refs);
}
