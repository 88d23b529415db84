//! Indexed variables (`DatasetBuilder::index`): a climatology read at an index per anchor (a
//! day of year) equals zarr-python's sample at that index in every row, beside windows and as a
//! channel of a stack, on every path a batch is filled by; each of its chunks is read once a
//! pass however the shuffle scatters its uses; and every index a dataset cannot read is refused
//! naming the variable.

use insitubatch::{EngineError, InSituDataset, IntoRows};
use insitubatch_tests::sample_of;

mod common;
use common::{check_epoch, fixture, run, sorted};

/// The anchors' index into the seven-"day" climatology: scattered, every entry used.
fn days() -> Vec<u64> {
    (0..20).map(|a| a * 3 % 7).collect()
}

fn builder() -> insitubatch::DatasetBuilder {
    InSituDataset::builder(fixture("climatology", "x").store)
        .variable("x", "x")
        .variable("c", "clim")
        .window("x_next", "x", 1)
        .index("c", days())
        .batch_size(3)
        .seed(4)
}

#[test]
fn an_indexed_climatology_is_zarr_pythons_sample_at_each_anchors_index() {
    let x = fixture("climatology", "x");
    let clim = fixture("climatology", "clim");
    let refs = [("x", &x, 0), ("c", &clim, 0), ("x_next", &x, 0)];
    for (into_rows, block_chunks) in [
        (IntoRows::Never, 1),
        (IntoRows::Always, 1),
        (IntoRows::Auto, 2),
    ] {
        let ds = builder()
            .decode_into_batches(into_rows)
            .block_chunks(block_chunks)
            .build()
            .unwrap();
        let case = format!("{into_rows:?}, blocks of {block_chunks}");
        // It takes no part in which anchors are valid: the window drops the last one only.
        assert_eq!(ds.anchor_range(), 0..19, "{case}");
        for split in ["train", "all"] {
            let anchors = check_epoch(&ds, split, &refs);
            assert_eq!(
                sorted(anchors),
                (0..19).collect::<Vec<_>>(),
                "{case} {split}"
            );
        }
        for b in ds.iter("train").unwrap() {
            let b = b.unwrap();
            let want: Vec<u64> = b
                .sample_indices()
                .iter()
                .map(|&a| days()[a as usize])
                .collect();
            assert_eq!(b.read_indices("c").unwrap(), want, "{case}");
            assert_eq!(b.offset("c"), Some(0));
        }
        // Read once a pass: the climatology's 4 chunks and x's 5, whatever the blocks.
        ds.clear_cache();
        let stats = run(&ds, "train");
        assert_eq!(
            (stats.tiles_read, stats.dropped_anchors),
            (9, 1),
            "{case}: {stats:?}"
        );
    }
}

#[test]
fn a_sample_several_anchors_read_is_copied_into_each_of_their_rows() {
    // Each of x's chunks of four samples is one "day": its four anchors read one climatology
    // sample, in one block (decoding straight into a row would give it one row only).
    let x = fixture("climatology", "x");
    let clim = fixture("climatology", "clim");
    let refs = [("x", &x, 0), ("c", &clim, 0)];
    for (into_rows, block_chunks) in [(IntoRows::Always, 1), (IntoRows::Always, 16)] {
        let ds = InSituDataset::builder(fixture("climatology", "x").store)
            .variable("x", "x")
            .variable("c", "clim")
            .index("c", (0..20).map(|a| a / 4).collect::<Vec<u64>>())
            .decode_into_batches(into_rows)
            .block_chunks(block_chunks)
            .batch_size(4)
            .build()
            .unwrap();
        for split in ["train", "all"] {
            let anchors = check_epoch(&ds, split, &refs);
            assert_eq!(
                sorted(anchors),
                (0..20).collect::<Vec<_>>(),
                "{into_rows:?}"
            );
        }
    }
}

#[test]
fn an_indexed_variable_stacks_beside_the_field_it_describes() {
    let x = fixture("climatology", "x");
    let clim = fixture("climatology", "clim");
    let ds = builder().stack("xc", ["x", "c"]).build().unwrap();
    let row = 5 * 6 * 4;
    let mut rows = 0;
    for b in ds.iter("train").unwrap() {
        let b = b.unwrap();
        let xc = b.array("xc").unwrap().bytes();
        for (r, &a) in b.sample_indices().iter().enumerate() {
            let (xs, cs) = xc[r * 2 * row..(r + 1) * 2 * row].split_at(row);
            assert_eq!(xs, &sample_of(&x.reference, &x.shape, 0, a, 4)[..]);
            let day = days()[a as usize];
            assert_eq!(cs, &sample_of(&clim.reference, &clim.shape, 0, day, 4)[..]);
        }
        rows += b.len();
    }
    assert_eq!(rows, 19);
}

fn refusal(b: insitubatch::DatasetBuilder) -> String {
    match b.build() {
        Err(e @ EngineError::InvalidArgument { .. }) => e.to_string(),
        Err(e) => panic!("another error: {e:?}"),
        Ok(_) => panic!("built"),
    }
}

#[test]
fn indexes_a_dataset_cannot_read_are_refused_naming_the_variable() {
    let store = fixture("climatology", "x").store;
    let b = || {
        InSituDataset::builder(&store)
            .variable("x", "x")
            .variable("c", "clim")
    };
    let e = refusal(b().index("c", vec![0; 19]));
    assert!(
        e.contains("`indexes` = c") && e.contains("19 entries") && e.contains("20 anchors"),
        "{e}"
    );
    let mut past = days();
    past[11] = 7;
    let e = refusal(b().index("c", past));
    assert!(
        e.contains("sample 7 at anchor 11") && e.contains("`clim` has 7 samples"),
        "{e}"
    );
    let e = refusal(b().index("d", days()));
    assert!(
        e.contains("`indexes` = d") && e.contains("names no variable"),
        "{e}"
    );
    let e = refusal(b().window("c1", "clim", 1).index("c1", days()));
    assert!(
        e.contains("`indexes` = c1") && e.contains("window offset"),
        "{e}"
    );
    let e = refusal(b().index("c", days()).index("c", days()));
    assert!(e.contains("indexed twice"), "{e}");
    let e = refusal(
        InSituDataset::builder(&store)
            .variable("c", "clim")
            .index("c", days()),
    );
    assert!(
        e.contains("every variable is a static field or indexed"),
        "{e}"
    );
}
