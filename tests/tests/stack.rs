//! Labels stacked as the channels of one batch array (`DatasetBuilder::stack`): each channel
//! holds what the label's own array would, on every path the gather and the decoders write
//! rows by (slots copied by the gather, chunks decoded straight into rows, inner-chunked tiles,
//! cropped views, revived cache files), and every bad stack is an error naming it.

use insitubatch::{DatasetBuilder, InSituDataset, IntoRows};
use insitubatch_tests::{item_size, sample_of};

mod common;
use common::{fixture, sorted};

/// A label's view: (label, array path, window offset, field region).
type View = (&'static str, &'static str, i64, Option<Vec<(u64, u64)>>);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Path {
    IntoRows,
    Both,
    Pool,
}

/// One case: the labels (label, path, offset, region), the stacks over them, and the store.
struct Case {
    name: &'static str,
    store: std::path::PathBuf,
    labels: Vec<View>,
    stacks: Vec<(&'static str, Vec<&'static str>)>,
    /// Where `IntoRows::Always` writes the stored chunks from: a chunk that one row reads is
    /// decoded into that row, a chunk that two windows read goes through the pool whatever
    /// the mode.
    always: Path,
    _dir: Option<tempfile::TempDir>,
}

impl Case {
    fn builder(&self, stacked: bool) -> DatasetBuilder {
        let mut b = InSituDataset::builder(&self.store);
        for (label, path, offset, region) in &self.labels {
            b = match region {
                None => b.window(*label, *path, *offset),
                Some(r) => b.cropped_window(*label, *path, *offset, r),
            };
        }
        if stacked {
            for (name, labels) in &self.stacks {
                b = b.stack(*name, labels.iter().copied());
            }
        }
        b
    }
}

fn cases() -> Vec<Case> {
    let era5 = fixture("era5_v3", "t2m").store;
    vec![
        // Channels in another order than declared, a 1-D label left unstacked between them, a
        // window of one of them stacked alone (a channel axis of 1).
        Case {
            name: "era5",
            store: era5.clone(),
            labels: vec![
                ("t2m", "t2m", 0, None),
                ("station", "station", 0, None),
                ("u10", "u10", 0, None),
                ("t2m_next", "t2m", 1, None),
            ],
            stacks: vec![("x", vec!["u10", "t2m"]), ("y", vec!["t2m_next"])],
            always: Path::Both,
            _dir: None,
        },
        // Two variables of one sample per chunk: zstd decodes each frame straight into its
        // channel of a row.
        {
            let (dir, store) = common::synth_store(&insitubatch::synth::SynthSpec {
                samples: 23,
                grid: (8, 16),
                sample_chunk: 1,
                variables: vec!["t".into(), "u".into()],
                ..Default::default()
            });
            Case {
                name: "one per chunk",
                store,
                labels: vec![("t", "t", 0, None), ("u", "u", 0, None)],
                stacks: vec![("tu", vec!["u", "t"])],
                always: Path::IntoRows,
                _dir: Some(dir),
            }
        },
        // One sample per chunk (decoded straight into strided rows): the previous step and
        // the current one as channels, the pattern of a model that takes a short history.
        Case {
            name: "history",
            store: fixture("paired", "raw").store,
            labels: vec![("prev", "raw", -1, None), ("now", "raw", 0, None)],
            stacks: vec![("x", vec!["prev", "now"])],
            always: Path::Pool,
            _dir: None,
        },
        // Inner-chunked fields: each sample assembled from tiles into its channel.
        Case {
            name: "tiles",
            store: fixture("v3_inner", "").store,
            labels: vec![("a", "", 0, None), ("b", "", 1, None)],
            stacks: vec![("ab", vec!["a", "b"])],
            always: Path::Pool,
            _dir: None,
        },
        // Cropped views: the region's box of each variable in its channel.
        Case {
            name: "region",
            store: era5,
            labels: vec![
                ("t2m", "t2m", 0, Some(vec![(2, 7), (3, 11)])),
                ("u10", "u10", 0, Some(vec![(2, 7), (3, 11)])),
            ],
            stacks: vec![("x", vec!["t2m", "u10"])],
            always: Path::IntoRows,
            _dir: None,
        },
    ]
}

/// Every batch of one epoch: (sample indices, each array's shape and bytes by name).
type Epoch = Vec<(Vec<u64>, Vec<(String, Vec<usize>, Vec<u8>)>)>;

fn epoch(ds: &InSituDataset) -> (Epoch, insitubatch::PassStats) {
    let mut pass = ds.train().unwrap();
    let batches = pass
        .by_ref()
        .map(|b| {
            let b = b.unwrap();
            let arrays = b
                .arrays()
                .map(|(name, a)| (name.to_string(), a.shape().to_vec(), a.bytes().to_vec()))
                .collect();
            (b.sample_indices().to_vec(), arrays)
        })
        .collect();
    (batches, pass.stats())
}

#[test]
fn a_stacked_channel_holds_what_the_labels_own_array_holds_on_every_write_path() {
    for case in cases() {
        for mode in [IntoRows::Always, IntoRows::Never] {
            for (shuffle, bs) in [(true, 7), (false, 8)] {
                let build = |stacked: bool| {
                    case.builder(stacked)
                        .batch_size(bs)
                        .block_chunks(2)
                        .shuffle(shuffle)
                        .executor_threads(2)
                        .decode_into_batches(mode)
                        .build()
                        .unwrap_or_else(|e| panic!("{}: {e}", case.name))
                };
                let (own, stacked) = (build(false), build(true));
                let what = format!("{} {mode:?} shuffle={shuffle}", case.name);
                // The arrays a batch will hold, known before it runs.
                let specs = stacked.batch_arrays();
                let ((a, _), (b, stats)) = (epoch(&own), epoch(&stacked));
                // The write path this mode asks for: stored chunks into their rows, or none.
                let into_rows = stats.tiles_into_batches;
                let path = match (into_rows, stats.tiles_read) {
                    (0, _) => Path::Pool,
                    (i, r) if i == r => Path::IntoRows,
                    _ => Path::Both,
                };
                let want = if mode == IntoRows::Always {
                    case.always
                } else {
                    Path::Pool
                };
                assert_eq!(path, want, "{what}: {stats:?}");
                assert_eq!(a.len(), b.len(), "{what}");
                assert!(
                    a.last().unwrap().0.len() < bs,
                    "{what}: a short final batch"
                );
                for ((ia, arrays), (ib, stacks)) in a.iter().zip(&b) {
                    assert_eq!(ia, ib, "{what}: the same rows in the same order");
                    let names: Vec<&str> = stacks.iter().map(|s| s.0.as_str()).collect();
                    let spec_names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                    assert_eq!(names, spec_names, "{what}");
                    for ((name, shape, bytes), spec) in stacks.iter().zip(&specs) {
                        let n = ia.len();
                        let mut want_shape = vec![n];
                        want_shape.extend(spec.row_shape.iter().map(|&d| d as usize));
                        assert_eq!(shape, &want_shape, "{what}: {name}");
                        let row = bytes.len() / n;
                        let sb = row / spec.labels.len();
                        for (c, label) in spec.labels.iter().enumerate() {
                            let (_, own_shape, own_bytes) =
                                arrays.iter().find(|x| x.0 == *label).unwrap();
                            if spec.stacked {
                                assert_eq!(&own_shape[1..], &shape[2..], "{what}: {label}");
                            }
                            for r in 0..n {
                                assert!(
                                    bytes[r * row + c * sb..r * row + (c + 1) * sb]
                                        == own_bytes[r * sb..(r + 1) * sb],
                                    "{what}: {name} channel {c} ({label}) row {r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn stacked_channels_are_zarr_python_at_each_labels_read_index_and_read_once() {
    let t2m = fixture("era5_v3", "t2m");
    let u10 = fixture("era5_v3", "u10");
    let item = item_size(&t2m.dtype);
    let ds = InSituDataset::builder(&t2m.store)
        .variable("t2m", "t2m")
        .variable("u10", "u10")
        .window("t2m_next", "t2m", 1)
        .stack("x", ["u10", "t2m", "t2m_next"])
        .batch_size(5)
        .block_chunks(2)
        .build()
        .unwrap();
    let specs = ds.batch_arrays();
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0].labels, ["u10", "t2m", "t2m_next"]);
    assert_eq!(specs[0].row_shape, [3, 9, 16]);
    let mut anchors = Vec::new();
    let mut pass = ds.train().unwrap();
    for batch in pass.by_ref() {
        let batch = batch.unwrap();
        assert_eq!(batch.names(), ["x"]);
        assert_eq!(batch.labels(), ["t2m", "u10", "t2m_next"]);
        assert!(
            batch.array("t2m").is_none(),
            "a stacked label has no array of its own"
        );
        let x = batch.array("x").unwrap();
        assert_eq!(x.shape(), [batch.len(), 3, 9, 16]);
        let sb = 9 * 16 * item;
        for (c, (label, f)) in [("u10", &u10), ("t2m", &t2m), ("t2m_next", &t2m)]
            .into_iter()
            .enumerate()
        {
            for (r, idx) in batch.read_indices(label).unwrap().into_iter().enumerate() {
                let want = sample_of(&f.reference, &f.shape, 0, idx, item);
                let at = (r * 3 + c) * sb;
                assert!(
                    x.bytes()[at..at + sb] == want[..],
                    "channel {c} ({label}) of row {r}: sample {idx} differs from zarr-python"
                );
            }
        }
        anchors.extend_from_slice(batch.sample_indices());
    }
    // Every valid anchor once (the window drops the last), each stored chunk read once.
    assert_eq!(sorted(anchors), (0..11).collect::<Vec<_>>());
    let s = pass.stats();
    assert_eq!(s.tiles_read, 6, "{s:?}");
}

#[test]
fn bad_stacks_are_errors_naming_the_stack_and_what_to_change() {
    let f = fixture("era5_v3", "t2m");
    let base = || {
        InSituDataset::builder(&f.store)
            .variable("t2m", "t2m")
            .variable("u10", "u10")
            .variable("station", "station")
    };
    let cases: Vec<(DatasetBuilder, &str)> = vec![
        (base().stack("x", ["t2m", "station"]), "one sample shape"),
        (base().stack("x", ["t2m", "v10"]), "no label `v10`"),
        (
            base().stack("x", Vec::<String>::new()),
            "at least one label",
        ),
        (base().stack("", ["t2m"]), "needs a name"),
        (base().stack("u10", ["t2m"]), "already names a label"),
        (
            base().stack("x", ["t2m"]).stack("x", ["u10"]),
            "already names a label or another stack",
        ),
        (
            base().stack("x", ["t2m", "u10"]).stack("y", ["u10"]),
            "already in stack `x`",
        ),
        (base().stack("x", ["t2m", "t2m"]), "already in stack `x`"),
        // A transform that changes one label's dtype makes the channels disagree.
        (
            base()
                .chunk_transforms_json(
                    r#"[{"type": "cast", "dtype": "float64", "applies": ["u10"]}]"#,
                )
                .stack("x", ["t2m", "u10"]),
            "after their chunk transforms",
        ),
    ];
    for (b, want) in cases {
        let e = b.build().unwrap_err().to_string();
        assert!(e.contains("`stacks`") && e.contains(want), "{want}: {e}");
    }
    // The same cast on both makes them agree, and the stack holds float64.
    let ds = base()
        .chunk_transforms_json(
            r#"[{"type": "cast", "dtype": "float64", "applies": ["t2m", "u10"]}]"#,
        )
        .stack("x", ["t2m", "u10"])
        .build()
        .unwrap();
    let specs = ds.batch_arrays();
    assert_eq!(specs[0].dtype, insitubatch::store::DType::Float64);
    let b = ds.train().unwrap().next().unwrap().unwrap();
    assert_eq!(b.array("x").unwrap().shape(), [12, 2, 9, 16]);
    assert_eq!(
        b.array("x").unwrap().values::<f64>().unwrap().len(),
        12 * 2 * 9 * 16
    );
}

#[test]
fn stacked_channels_read_from_a_persistent_cache_equal_the_decoded_ones() {
    let f = fixture("era5_v3", "t2m");
    let cache = tempfile::tempdir().unwrap();
    let build = || {
        InSituDataset::builder(&f.store)
            .variable("t2m", "t2m")
            .variable("u10", "u10")
            .stack("x", ["u10", "t2m"])
            .batch_size(5)
            .block_chunks(2)
            .cache_dir(cache.path())
            .persist(true)
            .build()
            .unwrap()
    };
    let (decoded, filled) = epoch(&build());
    assert_eq!(filled.tiles_read, 6, "{filled:?}");
    // A fresh dataset over the same directory revives every chunk from its file, which the
    // gather reads row by row into the channels.
    let (revived, stats) = epoch(&build());
    assert_eq!((stats.tiles_read, stats.cache_revived), (0, 6), "{stats:?}");
    assert_eq!(revived, decoded);
}
