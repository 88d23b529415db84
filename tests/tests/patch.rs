//! Patches (`DatasetBuilder::patch`): every row of every label is zarr-python's sample at its
//! read index, cut at the row's origin; each valid anchor once per epoch; origins keyed on
//! (seed, epoch, anchor) for train and (seed, anchor) otherwise, whatever the thread count;
//! a revived cache file cut like memory; bad patches are errors naming `patch`; several
//! patches per sample and grids; cropped views read as regions; random stores and placements.

use std::collections::HashMap;

use insitubatch::{DatasetBuilder, EngineError, InSituDataset, IntoRows};
use insitubatch_tests::{FixtureArray, item_size, sample_of, window_of};

mod common;
use common::{fixture, sorted};

/// A label and what it reads: its fixture, sample axis, and whether it is a static field.
struct Ref {
    label: &'static str,
    f: FixtureArray,
    axis: usize,
    static_field: bool,
}

impl Ref {
    fn inner(&self) -> Vec<usize> {
        if self.static_field {
            return self.f.shape.iter().map(|&d| d as usize).collect();
        }
        (0..self.f.shape.len())
            .filter(|&a| a != self.axis)
            .map(|a| self.f.shape[a] as usize)
            .collect()
    }

    /// The whole sample this label reads at index `idx`.
    fn sample(&self, idx: u64) -> Vec<u8> {
        if self.static_field {
            return self.f.reference.clone();
        }
        sample_of(
            &self.f.reference,
            &self.f.shape,
            self.axis,
            idx,
            item_size(&self.f.dtype),
        )
    }
}

/// Runs one epoch of `split` and checks every row of every label (in its own array or its
/// channel of `stack`) against zarr-python's sample cut at the row's origin; returns the
/// anchors and each anchor's origin.
fn check_patched_epoch(
    ds: &InSituDataset,
    split: &str,
    refs: &[Ref],
    patch: &[usize],
    stack: Option<(&str, &[&str])>,
) -> (Vec<u64>, HashMap<u64, Vec<u64>>, insitubatch::PassStats) {
    let mut anchors = Vec::new();
    let mut origins = HashMap::new();
    let wrap = ds.patch().expect("a patched dataset").wrap.clone();
    let mut pass = ds.iter(split).unwrap();
    for batch in pass.by_ref() {
        let batch = batch.unwrap();
        let n = batch.len();
        let k = patch.len();
        let all = batch
            .patch_origins()
            .expect("a patched batch says its origins");
        assert_eq!(all.len(), n * k);
        for r in refs {
            let item = item_size(&r.f.dtype);
            let inner = r.inner();
            let lead = inner.len() - k;
            let row: Vec<usize> = inner[..lead].iter().chain(patch).copied().collect();
            let rb = row.iter().product::<usize>() * item;
            let mut shape = vec![n];
            let (arr, channel, channels) = match stack {
                Some((name, labels)) if labels.contains(&r.label) => {
                    let c = labels.iter().position(|l| *l == r.label).unwrap();
                    shape.push(labels.len());
                    (batch.array(name).unwrap(), c, labels.len())
                }
                _ => (batch.array(r.label).unwrap(), 0, 1),
            };
            shape.extend(&row);
            assert_eq!(arr.shape(), &shape[..], "{}", r.label);
            for (i, idx) in batch.read_indices(r.label).unwrap().into_iter().enumerate() {
                let origin: Vec<usize> = all[i * k..(i + 1) * k]
                    .iter()
                    .map(|&o| o as usize)
                    .collect();
                for d in 0..k {
                    let reach = if wrap[d] { 1 } else { patch[d] };
                    assert!(
                        origin[d] + reach <= inner[lead + d],
                        "origin {origin:?} in the field"
                    );
                }
                let want = window_of(&r.sample(idx), &inner, patch, &origin, item);
                let at = (i * channels + channel) * rb;
                assert!(
                    arr.bytes()[at..at + rb] == want[..],
                    "{}/{} label {} sample {idx} at {origin:?} differs from zarr-python",
                    r.f.case,
                    r.f.array,
                    r.label
                );
            }
        }
        for (i, &a) in batch.sample_indices().iter().enumerate() {
            origins.insert(a, all[i * patch.len()..(i + 1) * patch.len()].to_vec());
        }
        anchors.extend_from_slice(batch.sample_indices());
    }
    let stats = pass.stats();
    (anchors, origins, stats)
}

fn r(label: &'static str, f: FixtureArray) -> Ref {
    Ref {
        label,
        axis: if f.case == "v3_tczyx" { 2 } else { 0 },
        f,
        static_field: false,
    }
}

/// One case: a builder with its labels, the refs to check them by, the patch, a stack.
struct Case {
    name: &'static str,
    build: Box<dyn Fn() -> DatasetBuilder>,
    refs: Vec<Ref>,
    patch: Vec<usize>,
    stack: Option<(&'static str, &'static [&'static str])>,
    /// The anchors of one epoch.
    anchors: Vec<u64>,
    /// Whether `IntoRows::Always` decodes some of its chunks into rows (a chunk that is its
    /// samples byte for byte, of an array one label reads), cutting each row's patch there.
    into_rows: bool,
    /// Whether its chunks go to rows only as regions (a field of several stored chunks, or
    /// of inner chunks with several samples per shard): drawn patches, not a grid, which
    /// covers the whole field and goes through the pool.
    regions: bool,
}

fn cases() -> Vec<Case> {
    let (t2m, u10) = (fixture("era5_v3", "t2m"), fixture("era5_v3", "u10"));
    let era5 = t2m.store.clone();
    let era5_builder = move || {
        InSituDataset::builder(&era5)
            .variable("t2m", "t2m")
            .variable("u10", "u10")
            .window("t2m_next", "t2m", 1)
    };
    let era5_refs = || {
        vec![
            r("t2m", t2m.clone()),
            r("u10", u10.clone()),
            r("t2m_next", t2m.clone()),
        ]
    };
    let inner = fixture("v3_inner", "");
    let tczyx = fixture("v3_tczyx", "");
    let field = fixture("statics", "field");
    let orog = fixture("statics", "orog");
    let sharded = fixture("one_per_chunk_sharded", "");
    let shards = fixture("v3_sharded", "");
    let era5_b = era5_builder.clone();
    vec![
        Case {
            name: "era5 2-D patch",
            build: Box::new(era5_builder.clone()),
            refs: era5_refs(),
            patch: vec![4, 5],
            stack: None,
            anchors: (0..11).collect(),
            into_rows: true,
            regions: false,
        },
        Case {
            name: "era5 stacked",
            build: Box::new(move || era5_b().stack("x", ["u10", "t2m"])),
            refs: era5_refs(),
            patch: vec![9, 7],
            stack: Some(("x", &["u10", "t2m"])),
            anchors: (0..11).collect(),
            into_rows: true,
            regions: false,
        },
        Case {
            name: "era5 1-D patch",
            build: Box::new(era5_builder),
            refs: era5_refs(),
            patch: vec![16],
            stack: None,
            anchors: (0..11).collect(),
            into_rows: true,
            regions: false,
        },
        // Two samples per chunk of 3 x 4 of a 7 x 9 field: each row read as its region.
        root_array_case("inner chunks", &inner, vec![5, 4], 6, true),
        {
            let store = tczyx.store.clone();
            Case {
                name: "sample axis 2",
                build: Box::new(move || {
                    InSituDataset::builder(&store)
                        .variable("v", "")
                        .sample_axis(2)
                }),
                refs: vec![r("v", tczyx.clone())],
                patch: vec![3, 4],
                stack: None,
                anchors: (0..9).collect(),
                // A field of several stored chunks: each row read as its region.
                into_rows: true,
                regions: true,
            }
        },
        {
            let store = field.store.clone();
            Case {
                name: "static field",
                build: Box::new(move || {
                    InSituDataset::builder(&store)
                        .variable("field", "field")
                        .static_variable("orog", "orog")
                }),
                refs: vec![
                    r("field", field.clone()),
                    Ref {
                        static_field: true,
                        ..r("orog", orog.clone())
                    },
                ],
                patch: vec![4, 6],
                stack: None,
                anchors: (0..10).collect(),
                into_rows: true,
                regions: false,
            }
        },
        root_array_case(
            "one sample per chunk, sharded",
            &sharded,
            vec![3, 5],
            10,
            false,
        ),
        // Shards of 4 samples of 2 x 3 x 4 inner chunks: each row read as the inner chunks
        // under its window, of its sample (a shard covers the field, so a grid's rows too).
        root_array_case("shards of several samples", &shards, vec![4, 5], 9, false),
    ]
}

/// A case reading fixture `f`, a root array, as label `v`: `anchors` samples, each decoded into
/// rows under `IntoRows::Always` (only as `regions`, so not a grid's, when true).
fn root_array_case(
    name: &'static str,
    f: &FixtureArray,
    patch: Vec<usize>,
    anchors: u64,
    regions: bool,
) -> Case {
    let store = f.store.clone();
    Case {
        name,
        build: Box::new(move || InSituDataset::builder(&store).variable("v", "")),
        refs: vec![r("v", f.clone())],
        patch,
        stack: None,
        anchors: (0..anchors).collect(),
        into_rows: true,
        regions,
    }
}

/// How a case places its patches: one per sample, several drawn, or a grid.
#[derive(Clone, Copy, Debug)]
enum Placing {
    One,
    Three,
    Grid,
}

#[test]
fn every_patch_is_zarr_python_cut_at_its_origin_and_every_anchor_comes_once() {
    let placings = [Placing::One, Placing::Three, Placing::Grid];
    for (placing, case) in placings
        .into_iter()
        .flat_map(|p| cases().into_iter().map(move |c| (p, c)))
    {
        for (shuffle, bs, mode) in [(true, 5, IntoRows::Always), (false, 4, IntoRows::Never)] {
            let patch: Vec<u64> = case.patch.iter().map(|&d| d as u64).collect();
            let mut b = (case.build)()
                .patch(patch.clone())
                .batch_size(bs)
                .block_chunks(2)
                .shuffle(shuffle)
                .decode_into_batches(mode);
            b = match placing {
                Placing::One => b,
                Placing::Three => b.patches_per_sample(3),
                Placing::Grid => b.patch_grid(patch.clone()),
            };
            let ds = b
                .build()
                .unwrap_or_else(|e| panic!("{} {placing:?}: {e}", case.name));
            let per_sample = ds.patches_per_sample();
            match placing {
                Placing::One => assert_eq!(per_sample, 1),
                Placing::Three => assert_eq!(per_sample, 3),
                Placing::Grid => assert!(per_sample >= 1),
            }
            assert_eq!(ds.patch().map(|p| &p.shape), Some(&patch));
            for spec in ds.batch_arrays() {
                assert_eq!(
                    spec.row_shape[spec.row_shape.len() - patch.len()..],
                    patch[..],
                    "{}: {}",
                    case.name,
                    spec.name
                );
            }
            for epoch in 0..2 {
                ds.set_epoch(epoch);
                let (anchors, _, stats) =
                    check_patched_epoch(&ds, "train", &case.refs, &case.patch, case.stack);
                let want: Vec<u64> = case
                    .anchors
                    .iter()
                    .flat_map(|&a| std::iter::repeat_n(a, per_sample as usize))
                    .collect();
                assert_eq!(sorted(anchors), want, "{} {placing:?}", case.name);
                // A patch is cut from a whole sample in the decoder's scratch buffer for a chunk
                // that is its samples byte for byte, read as its region where the field is
                // several stored (inner) chunks (a grid's through the pool), else cut by the
                // gather from the pool.
                let grid = matches!(placing, Placing::Grid);
                let want = mode == IntoRows::Always && case.into_rows && !(grid && case.regions);
                assert_eq!(
                    stats.tiles_into_batches > 0,
                    want,
                    "{}: {stats:?}",
                    case.name
                );
                assert!(epoch > 0 || stats.tiles_read > 0, "{stats:?}");
            }
        }
    }
}

/// Each anchor's origin in one epoch of `split`.
fn origins(ds: &InSituDataset, split: &str, epoch: u64) -> HashMap<u64, Vec<u64>> {
    ds.set_epoch(epoch);
    rows(ds, split).into_iter().collect()
}

#[test]
fn origins_move_every_train_epoch_stay_for_other_splits_and_ignore_the_thread_count() {
    let f = fixture("era5_v3", "t2m");
    let build = |threads: usize, bs: usize| {
        InSituDataset::builder(&f.store)
            .variable("t2m", "t2m")
            .patch([3, 3])
            .seed(11)
            .batch_size(bs)
            .executor_threads(threads)
            .build()
            .unwrap()
    };
    let (one, two) = (build(1, 5), build(2, 3));
    for split in ["train", "all"] {
        for epoch in 0..2 {
            assert_eq!(
                origins(&one, split, epoch),
                origins(&two, split, epoch),
                "{split} epoch {epoch}: the same origins on 1 and 2 threads, any batch size"
            );
        }
    }
    let moved = |split: &str| {
        let (a, b) = (origins(&one, split, 0), origins(&one, split, 1));
        a.keys().filter(|k| a[*k] != b[*k]).count()
    };
    assert!(
        moved("train") >= 8,
        "train origins are drawn again each epoch"
    );
    assert_eq!(moved("all"), 0, "other splits keep their origins");
    // Another seed draws other origins.
    let other = InSituDataset::builder(&f.store)
        .variable("t2m", "t2m")
        .patch([3, 3])
        .seed(12)
        .build()
        .unwrap();
    let (a, b) = (origins(&one, "all", 0), origins(&other, "all", 0));
    assert!(a.keys().filter(|k| a[*k] != b[*k]).count() >= 8);
}

#[test]
fn a_revived_cache_file_is_cut_like_memory() {
    let (t2m, u10) = (fixture("era5_v3", "t2m"), fixture("era5_v3", "u10"));
    let refs = [r("t2m", t2m.clone()), r("u10", u10)];
    let cache = tempfile::tempdir().unwrap();
    let build = || {
        InSituDataset::builder(&t2m.store)
            .variable("t2m", "t2m")
            .variable("u10", "u10")
            .patch([5, 6])
            .batch_size(5)
            .cache_dir(cache.path())
            .persist(true)
            .build()
            .unwrap()
    };
    let (_, first, stats) = check_patched_epoch(&build(), "train", &refs, &[5, 6], None);
    assert_eq!(stats.cache_misses, 6, "{stats:?}");
    let ds = build();
    let (anchors, again, stats) = check_patched_epoch(&ds, "train", &refs, &[5, 6], None);
    assert_eq!(sorted(anchors), (0..12).collect::<Vec<_>>());
    assert_eq!((stats.cache_revived, stats.tiles_read), (6, 0), "{stats:?}");
    assert_eq!(stats.bytes_revived, stats.bytes_delivered, "{stats:?}");
    assert_eq!(first, again, "the same epoch cuts the same origins");
}

#[test]
fn a_periodic_axis_lets_a_patch_run_across_its_end() {
    let (t2m, u10) = (fixture("era5_v3", "t2m"), fixture("era5_v3", "u10"));
    let refs = [r("t2m", t2m.clone()), r("u10", u10)];
    for (shape, wrap) in [
        ([4, 10], [false, true]),
        ([9, 16], [true, true]),
        ([3, 16], [true, false]),
    ] {
        let ds = InSituDataset::builder(&t2m.store)
            .variable("t2m", "t2m")
            .variable("u10", "u10")
            .patch_wrapping(shape, wrap)
            .batch_size(4)
            .build()
            .unwrap();
        let patch = shape.map(|d| d as usize);
        let mut crossed = 0;
        for epoch in 0..4 {
            ds.set_epoch(epoch);
            let (anchors, origins, _) = check_patched_epoch(&ds, "train", &refs, &patch, None);
            assert_eq!(sorted(anchors), (0..12).collect::<Vec<_>>());
            crossed += origins
                .values()
                .filter(|o| (0..2).any(|d| wrap[d] && o[d] as usize + patch[d] > [9, 16][d]))
                .count();
            for o in origins.values() {
                assert!((0..2).all(|d| wrap[d] || o[d] as usize + patch[d] <= [9, 16][d]));
            }
        }
        assert!(
            crossed >= 8,
            "{shape:?} {wrap:?}: {crossed} windows across the end"
        );
    }
}

#[test]
fn a_batch_holds_patches_so_the_memory_need_counts_them() {
    let f = fixture("era5_v3", "t2m");
    let need = |patch: Option<[u64; 2]>| {
        let mut b = InSituDataset::builder(&f.store)
            .variable("t2m", "t2m")
            .variable("u10", "u10")
            .batch_size(4);
        if let Some(p) = patch {
            b = b.patch(p);
        }
        b.build().unwrap().memory_need("train").unwrap().batch_bytes
    };
    assert_eq!(need(None), 4 * 2 * 9 * 16 * 4);
    assert_eq!(need(Some([3, 8])), 4 * 2 * 3 * 8 * 4);
}

#[test]
fn several_patches_decoded_into_rows_stay_within_the_memory_need() {
    use insitubatch::synth::SynthSpec;
    // 128 samples, 8 per chunk, in batches of 4: a chunk's rows spread over its block's
    // batches, four times as many of them with four patches per sample.
    let (_dir, store) = common::synth_store(&SynthSpec {
        samples: 128,
        grid: (18, 36),
        sample_chunk: 8,
        variables: vec!["t".into()],
        ..Default::default()
    });
    let build = |n: u64| {
        InSituDataset::builder(&store)
            .variable("t", "t")
            .patch([6, 6])
            .patches_per_sample(n)
            .batch_size(4)
            .block_chunks(2)
            .decode_into_batches(IntoRows::Always)
            .build()
            .unwrap()
    };
    let (one, four) = (build(1), build(4));
    let (need_one, need) = (
        one.memory_need("train").unwrap(),
        four.memory_need("train").unwrap(),
    );
    assert_eq!(need.batch_bytes, 4 * 6 * 6 * 4);
    assert!(
        need.rows_batches > need_one.rows_batches,
        "{need:?} {need_one:?}"
    );
    let mut most = 0;
    for epoch in 0..3 {
        four.set_epoch(epoch);
        let s = common::run(&four, "train");
        assert_eq!((s.samples, s.tiles_into_batches), (512, 16), "{s:?}");
        let held = four.batch_buffers_allocated() * need.batch_bytes;
        assert!(
            held <= need.batches_bytes(),
            "{held} bytes of batch buffers held at once, {} counted: {need:?}",
            need.batches_bytes()
        );
        most = most.max(held);
    }
    assert!(
        most > need_one.batches_bytes(),
        "{most} bytes held: the patches' rows did open more batches"
    );
}

#[test]
fn a_patch_that_does_not_fit_every_label_is_an_error_naming_it() {
    let f = fixture("era5_v3", "t2m");
    let expect = |b: DatasetBuilder, needle: &str| match b.build() {
        Err(EngineError::InvalidArgument { name, hint, .. }) => {
            assert_eq!(name, "patch");
            assert!(hint.contains(needle), "{hint}");
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("built with a bad patch ({needle})"),
    };
    let era5 = || InSituDataset::builder(&f.store).variable("t2m", "t2m");
    expect(era5().patch([]), "each at least 1");
    expect(
        era5().patch_wrapping([3, 3], [true]),
        "one wrap flag per patched axis: 1 for a patch of 2",
    );
    expect(era5().patch([0, 3]), "each at least 1");
    expect(
        era5().patch([10, 3]),
        "larger than the field along its axis 0: 10 against 9",
    );
    expect(era5().patch([3, 17]), "axis 1: 17 against 16");
    expect(era5().patch([1, 3, 3]), "fewer than the patch's 3");
    expect(
        era5().variable("station", "station").patch([3]),
        "`station` has samples of 0 axes",
    );
    expect(
        era5()
            .cropped_window("crop", "u10", 0, &[(2, 7), (3, 11)])
            .patch([3, 3]),
        "`t2m` has [9, 16], `crop` has [5, 8]",
    );
    // The largest patch is the whole field.
    era5().patch([9, 16]).build().unwrap();
}

/// A synthetic store of 20 one-sample chunks of `t` and `u` on `grid`, each field stored as
/// 9 × 18 chunks (or, `sharded`, one shard of them).
fn tiled_store(grid: (u64, u64), sharded: bool) -> (tempfile::TempDir, std::path::PathBuf) {
    common::synth_store(&insitubatch::synth::SynthSpec {
        samples: 20,
        grid,
        sample_chunk: 1,
        inner_chunks: Some((9, 18)),
        shard_samples: sharded.then_some(1),
        variables: vec!["t".into(), "u".into()],
        ..Default::default()
    })
}

/// Checks every 8 × 8 patch of `t` and `u` in `batch` against the synthetic field, for a view
/// starting at `(lat0, lon0)` of the field and `width` wide (a patch runs across its end back
/// to its start); returns how many did.
fn check_synth_patches(
    batch: &insitubatch::Batch,
    grid: (u64, u64),
    (lat0, lon0, width): (u64, u64, u64),
    what: &str,
) -> usize {
    use insitubatch::synth::field_value;
    let origins = batch.patch_origins().unwrap();
    let mut crossed = 0;
    for (var, label) in ["t", "u"].into_iter().enumerate() {
        let v: &[f32] = batch.array(label).unwrap().values().unwrap();
        for (r, &s) in batch.sample_indices().iter().enumerate() {
            let (i0, j0) = (origins[2 * r], origins[2 * r + 1]);
            crossed += usize::from(j0 + 8 > width);
            for (k, got) in v[r * 64..(r + 1) * 64].iter().enumerate() {
                let i = lat0 + i0 + k as u64 / 8;
                let j = (lon0 + (j0 + k as u64 % 8) % width) % grid.1;
                assert_eq!(
                    *got,
                    field_value(var, s, i, j, grid),
                    "{what}: {label} sample {s} at ({i0}, {j0}), element {k}"
                );
            }
        }
    }
    crossed
}

#[test]
fn a_one_sample_chunk_is_read_as_the_region_its_patch_covers() {
    let grid = (36u64, 72u64);
    for sharded in [false, true] {
        let (_dir, store) = tiled_store(grid, sharded);
        for wrap in [false, true] {
            let what = format!("sharded {sharded}, periodic longitude {wrap}");
            let ds = InSituDataset::builder(&store)
                .variable("t", "t")
                .variable("u", "u")
                .patch_wrapping([8, 8], [false, wrap])
                .decode_into_batches(IntoRows::Always)
                .batch_size(4)
                .build()
                .unwrap();
            let mut crossed = 0;
            for epoch in 0..3 {
                ds.set_epoch(epoch);
                let mut pass = ds.train().unwrap();
                let mut anchors = Vec::new();
                for b in pass.by_ref() {
                    let b = b.unwrap();
                    crossed += check_synth_patches(&b, grid, (0, 0, grid.1), &what);
                    anchors.extend_from_slice(b.sample_indices());
                }
                assert_eq!(sorted(anchors), (0..20).collect::<Vec<_>>(), "{what}");
                let s = pass.stats();
                // Every chunk decoded into its row, and of each field only the stored (inner)
                // chunks under the window: an 8 x 8 window over 9 x 18 chunks touches at most
                // 2 x 2 of the 16.
                assert_eq!(
                    (s.tiles_into_batches, s.cache_misses),
                    (40, 40),
                    "{what}: {s:?}"
                );
                let tile_bytes = 9 * 18 * 4;
                assert!(s.bytes_decoded <= 20 * 2 * 4 * tile_bytes, "{what}: {s:?}");
                if !sharded {
                    assert!(s.tiles_read <= 20 * 2 * 4, "{what}: {s:?}");
                }
            }
            assert_eq!(crossed > 0, wrap, "{what}: windows across the seam");
        }
        // By default too, unless the pool's budget keeps every chunk the pass reads: then a
        // later epoch is all hits, and the whole fields are worth reading once.
        for (budget, region) in [(None, true), (Some(1u64 << 30), false)] {
            let mut b = InSituDataset::builder(&store)
                .variable("t", "t")
                .patch([8, 8])
                .batch_size(2)
                .block_chunks(2);
            if let Some(bytes) = budget {
                b = b.cache_budget_bytes(bytes);
            }
            let s = common::run(&b.build().unwrap(), "train");
            assert_eq!(s.tiles_into_batches == 20, region, "{budget:?}: {s:?}");
            if !sharded {
                assert_eq!(s.tiles_read < 20 * 16, region, "{budget:?}: {s:?}");
            }
        }
    }
}

/// A crop of latitude and longitude, whether longitude is periodic for the patch, and whether
/// rows are read as regions.
type CropCase = ([(i64, i64); 2], bool, bool);

#[test]
fn a_patch_of_a_cropped_view_reads_only_the_chunks_under_its_window() {
    let grid = (36u64, 72u64);
    for sharded in [false, true] {
        let (_dir, store) = tiled_store(grid, sharded);
        // (crop, periodic longitude, read as regions): a crop across the 0° meridian; latitudes
        // only, so that a window may run across the whole longitude's end; and a crop of
        // longitudes with a periodic patch, whose window across the crop's end would be two
        // regions, so the view is read whole.
        let cases: [CropCase; 3] = [
            ([(4, 30), (60, 100)], false, true),
            ([(4, 30), (0, 72)], true, true),
            ([(0, 36), (10, 50)], true, false),
        ];
        for (crop, wrap, regions) in cases {
            let what = format!("sharded {sharded}, crop {crop:?}, periodic longitude {wrap}");
            let ds = InSituDataset::builder(&store)
                .cropped_window_wrapping("t", "t", 0, &crop)
                .cropped_window_wrapping("u", "u", 0, &crop)
                .patch_wrapping([8, 8], [false, wrap])
                .decode_into_batches(IntoRows::Always)
                .batch_size(4)
                .build()
                .unwrap();
            let (lat0, lon0) = (crop[0].0 as u64, crop[1].0 as u64);
            let width = (crop[1].1 - crop[1].0) as u64;
            let mut crossed = 0;
            for epoch in 0..2 {
                ds.set_epoch(epoch);
                let mut pass = ds.train().unwrap();
                for b in pass.by_ref() {
                    let b = b.unwrap();
                    crossed += check_synth_patches(&b, grid, (lat0, lon0, width), &what);
                }
                let s = pass.stats();
                if regions {
                    // Each field read as its window: at most 2 x 2 of its stored chunks.
                    assert_eq!((s.tiles_into_batches, s.samples), (40, 20), "{what}: {s:?}");
                    assert!(s.bytes_decoded <= 20 * 2 * 4 * 9 * 18 * 4, "{what}: {s:?}");
                    if !sharded {
                        assert!(s.tiles_read <= 20 * 2 * 4, "{what}: {s:?}");
                    }
                } else {
                    assert_eq!(s.tiles_into_batches, 0, "{what}: {s:?}");
                }
            }
            assert_eq!(crossed > 0, wrap, "{what}: windows across the seam");
        }
    }
}

/// Every value of label `label`'s rows in `b`, 2-D patches `width` columns wide of a field of
/// `columns` columns (taken modulo them, for a periodic longitude): `(sample, i, j, value)`,
/// `(i, j)` its place in the field.
fn patch_values(
    b: &insitubatch::Batch,
    label: &str,
    width: u64,
    columns: u64,
) -> Vec<(u64, u64, u64, f32)> {
    let origins = b.patch_origins().unwrap();
    let v: &[f32] = b.array(label).unwrap().values().unwrap();
    let n = v.len() / b.len().max(1);
    let mut out = Vec::with_capacity(v.len());
    for (r, &s) in b.sample_indices().iter().enumerate() {
        let (i0, j0) = (origins[2 * r], origins[2 * r + 1]);
        for (k, &got) in v[r * n..(r + 1) * n].iter().enumerate() {
            let k = k as u64;
            out.push((s, i0 + k / width, (j0 + k % width) % columns, got));
        }
    }
    out
}

/// A store of `samples` 36 x 72 samples of `t` in 4 x 4 stored chunks of 9 x 18, one sample
/// per chunk, whose sample 3's stored chunk of rows 0..9 and columns 0..18 decodes to nothing;
/// and its grid.
fn store_with_a_bad_chunk(samples: u64) -> ((u64, u64), (tempfile::TempDir, std::path::PathBuf)) {
    let grid = (36u64, 72u64);
    let store = common::synth_store(&insitubatch::synth::SynthSpec {
        samples,
        grid,
        sample_chunk: 1,
        inner_chunks: Some((9, 18)),
        variables: vec!["t".into()],
        ..Default::default()
    });
    std::fs::write(store.1.join("t/c/3/0/0"), b"this is not zstd").unwrap();
    (grid, store)
}

#[test]
fn a_bad_stored_chunk_under_a_patch_read_as_a_region_is_nan_where_the_window_meets_it() {
    use insitubatch::OnBadChunk;
    use insitubatch::synth::field_value;
    let (grid, (_dir, store)) = store_with_a_bad_chunk(8);
    // One patch per sample, and three (the stored chunks under any of them read once).
    for per_sample in [1, 3] {
        let ds = InSituDataset::builder(&store)
            .variable("t", "t")
            .patch_wrapping([12, 24], [false, true])
            .patches_per_sample(per_sample)
            .decode_into_batches(IntoRows::Always)
            .on_bad_chunk(OnBadChunk::Nan)
            .batch_size(3)
            .build()
            .unwrap();
        let (mut bad_rows, mut good) = (0, 0);
        for epoch in 0..6 {
            ds.set_epoch(epoch);
            let mut pass = ds.train().unwrap();
            for b in pass.by_ref() {
                for (s, i, j, got) in patch_values(&b.unwrap(), "t", 24, grid.1) {
                    if s == 3 && i < 9 && j < 18 {
                        assert!(got.is_nan(), "sample 3 at ({i}, {j}) is the bad chunk's");
                        bad_rows += 1;
                    } else {
                        assert_eq!(got, field_value(0, s, i, j, grid), "sample {s} ({i}, {j})");
                        good += 1;
                    }
                }
            }
            let s = pass.stats();
            assert_eq!(s.tiles_into_batches, 8 - s.bad_chunks.len() as u64, "{s:?}");
            let bad: Vec<&str> = s.bad_chunks.iter().map(|b| b.key.as_str()).collect();
            assert!(bad.iter().all(|k| k.ends_with("c/3/0/0")), "{bad:?}");
            assert!(
                bad.len() <= 1,
                "read once for all of sample 3's patches: {bad:?}"
            );
        }
        assert!(
            bad_rows > 0 && good > 0,
            "the window met the bad chunk in some epoch ({per_sample} per sample)"
        );
    }
}

#[test]
fn a_bad_inner_chunk_under_one_of_several_windows_of_a_shard_makes_its_shard_nan() {
    use insitubatch::OnBadChunk;
    use insitubatch::synth::{SynthSpec, field_value};
    // One shard per sample of 4 x 4 inner chunks of 9 x 18.
    let grid = (36u64, 72u64);
    let (_dir, store) = common::synth_store(&SynthSpec {
        samples: 8,
        grid,
        sample_chunk: 1,
        inner_chunks: Some((9, 18)),
        shard_samples: Some(1),
        variables: vec!["t".into()],
        ..Default::default()
    });
    // Sample 3's inner chunk of rows 0..9 and columns 0..18 (the first of the shard's 16)
    // decodes to nothing; the index still holds.
    let file = store.join("t/c/3/0/0");
    let mut shard = std::fs::read(&file).unwrap();
    let bad = common::inner_chunk_bytes(&shard, 16, 0);
    shard[bad].fill(0xa5);
    std::fs::write(&file, &shard).unwrap();
    let build = |policy: OnBadChunk| {
        InSituDataset::builder(&store)
            .variable("t", "t")
            .patch_wrapping([12, 24], [false, true])
            .patches_per_sample(3)
            .decode_into_batches(IntoRows::Always)
            .on_bad_chunk(policy)
            .batch_size(3)
            .build()
            .unwrap()
    };
    // A shard is one stored chunk: when a window of sample 3 meets the bad inner chunk, the
    // shard's read fails and every row of sample 3 is its NaN stand-in, listed once; when
    // none does, the bad inner chunk is not read and sample 3 comes whole.
    let ds = build(OnBadChunk::Nan);
    let (mut met, mut missed) = (0, 0);
    for epoch in 0..8 {
        ds.set_epoch(epoch);
        let mut pass = ds.train().unwrap();
        let mut values = Vec::new();
        for b in pass.by_ref() {
            values.extend(patch_values(&b.unwrap(), "t", 24, grid.1));
        }
        let meets = values.iter().any(|&(s, i, j, _)| s == 3 && i < 9 && j < 18);
        for (s, i, j, got) in values {
            if s == 3 && meets {
                assert!(got.is_nan(), "epoch {epoch}: sample 3 at ({i}, {j}) is NaN");
            } else {
                assert_eq!(got, field_value(0, s, i, j, grid), "sample {s} ({i}, {j})");
            }
        }
        let s = pass.stats();
        let bad: Vec<&str> = s.bad_chunks.iter().map(|b| b.key.as_str()).collect();
        if meets {
            assert!(bad.len() == 1 && bad[0].ends_with("t/c/3/0/0"), "{bad:?}");
            met += 1;
        } else {
            assert!(
                bad.is_empty(),
                "epoch {epoch}: the bad inner chunk not read: {bad:?}"
            );
            missed += 1;
        }
        assert_eq!(s.tiles_into_batches, 8 - bad.len() as u64, "{s:?}");
    }
    assert!(
        met > 0 && missed > 0,
        "met in {met} epochs, missed in {missed}"
    );
    // Raised: the pass ends in an error naming the shard, and nothing hangs.
    let ds = build(OnBadChunk::Raise);
    for epoch in 0..8 {
        ds.set_epoch(epoch);
        if let Some(err) = ds.train().unwrap().find_map(Result::err) {
            assert!(err.to_string().contains("t/c/3/0/0"), "{err}");
            return;
        }
    }
    panic!("no epoch's windows met the bad inner chunk");
}

#[test]
fn several_patches_of_a_sample_stored_in_many_chunks_read_the_chunks_under_their_windows_once() {
    use insitubatch::synth::SynthSpec;
    // 8 x 8 stored chunks of 9 x 18 per sample, one sample per chunk, or shards of one and of
    // four samples holding them as inner chunks (one sample each); 32 samples (64 in shards of
    // four), more than the automatic budget holds, so that `auto` reads regions into rows too.
    let grid = (72u64, 144u64);
    let (tile_rows, tile_cols) = (9u64, 18u64);
    for shard in [None, Some(1), Some(4)] {
        let samples = if shard == Some(4) { 64 } else { 32 };
        let (_dir, store) = common::synth_store(&SynthSpec {
            samples,
            grid,
            sample_chunk: 1,
            inner_chunks: Some((tile_rows, tile_cols)),
            shard_samples: shard,
            variables: vec!["t".into()],
            ..Default::default()
        });
        let tiles = (tile_rows, tile_cols);
        check_several_patches_read_once(&store, (samples, grid), tiles, shard);
    }
}

/// The body of the test above, for one store of `n` samples: `shard` the samples of each shard
/// whose inner chunks are the `tile` stored chunks of each of its samples (`None`: chunk files).
fn check_several_patches_read_once(
    store: &std::path::Path,
    (n, grid): (u64, (u64, u64)),
    (tile_rows, tile_cols): (u64, u64),
    shard: Option<u64>,
) {
    use insitubatch::synth::field_value;
    let (ph, pw) = (8u64, 16u64);
    let tiles_per_field = (grid.0 / tile_rows) * (grid.1 / tile_cols);
    let tile_bytes = tile_rows * tile_cols * 4;
    // A shard's samples, and the size of its index (an offset and a length per inner chunk,
    // then a crc32c, at the file's end).
    let k = shard.unwrap_or(1);
    let index_len = k * tiles_per_field * 16 + 4;
    // The bytes of inner chunk (i, j) of sample `s` in its shard's file.
    let inner_bytes = |s: u64, (i, j): (u64, u64)| -> u64 {
        let shard = std::fs::read(store.join(format!("t/c/{}/0/0", s / k))).unwrap();
        let at = ((s % k) * (grid.0 / tile_rows) + i) * (grid.1 / tile_cols) + j;
        let n = (k * tiles_per_field) as usize;
        common::inner_chunk_bytes(&shard, n, at as usize).len() as u64
    };
    // Three drawn patches per sample (longitude periodic or not), one, and a grid of 8 x 16
    // tiles (which reads every stored chunk, so whole fields, through the pool).
    let build = |what: &str| {
        let b = InSituDataset::builder(store).variable("t", "t");
        match what {
            "three" => b.patch([ph, pw]).patches_per_sample(3),
            "three, periodic" => b
                .patch_wrapping([ph, pw], [false, true])
                .patches_per_sample(3),
            "grid" => b.patch([ph, pw]).patch_grid([ph, pw]),
            _ => b.patch([ph, pw]),
        }
    };
    for what in ["three", "three, periodic", "grid", "one"] {
        for mode in [IntoRows::Always, IntoRows::Auto] {
            let ds = build(what)
                .batch_size(5)
                .block_chunks(3)
                .decode_into_batches(mode)
                .build()
                .unwrap();
            let what = format!("{what}, shards of {shard:?}, {mode:?}");
            let per_sample = ds.patches_per_sample();
            for epoch in 0..2 {
                ds.set_epoch(epoch);
                let mut pass = ds.train().unwrap();
                // Each sample's stored chunks (tile row, tile column) under any of its windows.
                let mut under: HashMap<u64, std::collections::BTreeSet<(u64, u64)>> =
                    HashMap::new();
                let mut anchors = Vec::new();
                for b in pass.by_ref() {
                    let b = b.unwrap();
                    for (sample, i, j, got) in patch_values(&b, "t", pw, grid.1) {
                        let want = field_value(0, sample, i, j, grid);
                        assert_eq!(got, want, "{what}: sample {sample} at ({i}, {j})");
                        under
                            .entry(sample)
                            .or_default()
                            .insert((i / tile_rows, j / tile_cols));
                    }
                    anchors.extend_from_slice(b.sample_indices());
                }
                let want: Vec<u64> = (0..n)
                    .flat_map(|a| std::iter::repeat_n(a, per_sample as usize))
                    .collect();
                assert_eq!(sorted(anchors), want, "{what}: every (anchor, patch) once");
                let s = pass.stats();
                let under_any: u64 = under.values().map(|t| t.len() as u64).sum();
                // A chunk's stored chunks are its tiles, or one shard.
                let files = if shard.is_some() { 1 } else { tiles_per_field };
                let chunks = n / k;
                if what.starts_with("grid") {
                    // It covers every stored chunk: whole fields, read and decoded once each
                    // (tiles through the pool, whose later epochs hit what it kept; a shard,
                    // one stored chunk, may be cut into rows).
                    assert_eq!(under_any, n * tiles_per_field, "a grid covers them all");
                    assert_eq!(s.tiles_read, s.cache_misses * files, "{what}: {s:?}");
                    let field = tiles_per_field * tile_bytes;
                    assert_eq!(s.bytes_decoded, s.cache_misses * k * field, "{what}: {s:?}");
                    if shard.is_none() {
                        assert_eq!(s.tiles_into_batches, 0, "{what}: {s:?}");
                    }
                    continue;
                }
                assert!(under_any < n * tiles_per_field / 2, "{what}: {under_any}");
                assert_eq!(s.tiles_into_batches, chunks, "{what}: {s:?}");
                // Each stored (inner) chunk under a window read and decoded once (of a shard
                // of one sample under one window, zarrs decodes its inner chunks and hands
                // over the window).
                let decoded = if shard == Some(1) && per_sample == 1 {
                    n * ph * pw * 4
                } else {
                    under_any * tile_bytes
                };
                assert_eq!(s.bytes_decoded, decoded, "{what}: {s:?}");
                if shard.is_none() {
                    assert_eq!(s.tiles_read, under_any, "{what}: {s:?}");
                    continue;
                }
                // One read of each shard: its index (the first epoch; kept after) and the
                // inner chunks under the windows of its samples.
                assert_eq!(s.tiles_read, chunks, "{what}: {s:?}");
                let inner: u64 = under
                    .iter()
                    .flat_map(|(&s, t)| t.iter().map(move |&ij| (s, ij)))
                    .map(|(s, ij)| inner_bytes(s, ij))
                    .sum();
                let indexes = if epoch == 0 { chunks * index_len } else { 0 };
                assert_eq!(s.bytes_read, indexes + inner, "{what} epoch {epoch}: {s:?}");
            }
        }
    }
}

#[test]
fn a_field_a_window_also_reads_loads_only_the_chunks_under_the_windows_of_both_labels() {
    use insitubatch::synth::{SynthSpec, field_value};
    // `t` and a window `t_next` of it (a forecast's input and target) cut from the same
    // patches: each chunk of `t` feeds rows of both labels, in two shuffle blocks far apart,
    // so it goes through the pool, loaded with only the stored (inner) chunks under the
    // windows of the rows reading it in the pass. 8 x 8 stored chunks of 9 x 18 per sample:
    // chunk files, shards of one and of four samples.
    let grid = (72u64, 144u64);
    let (tile_rows, tile_cols) = (9u64, 18u64);
    let tiles_per_field = (grid.0 / tile_rows) * (grid.1 / tile_cols);
    let tile_bytes = tile_rows * tile_cols * 4;
    let (ph, pw) = (8u64, 16u64);
    for shard in [None, Some(1), Some(4)] {
        // Enough chunks that the automatic budget (a few blocks) never holds them all.
        let n = if shard == Some(4) { 128 } else { 32 };
        let (_dir, store) = common::synth_store(&SynthSpec {
            samples: n,
            grid,
            sample_chunk: 1,
            inner_chunks: Some((tile_rows, tile_cols)),
            shard_samples: shard,
            variables: vec!["t".into()],
            ..Default::default()
        });
        let k = shard.unwrap_or(1);
        let chunks = n / k;
        // The budget: the automatic one, which holds a few blocks; nine tenths of the chunks
        // the pass reads, which keep ~77 % of a later epoch's whole fields (`0.9^2.5`): worth
        // it against 32 windows a sample (touching ~81 % of each field), not against two
        // (~10 %); or one that keeps the split (whole fields then, read once, and later epochs
        // all hits).
        let field = tiles_per_field * tile_bytes;
        let pass_bytes = n * field;
        for (patches, budget, regions) in [
            (1, None, true),
            (3, None, true),
            (1, Some(pass_bytes * 9 / 10), true),
            (16, Some(pass_bytes * 9 / 10), false),
            (1, Some(1u64 << 30), false),
        ] {
            let mut b = InSituDataset::builder(&store)
                .variable("t", "t")
                .window("t_next", "t", 1)
                .patch([ph, pw])
                .patches_per_sample(patches)
                .batch_size(5)
                .block_chunks(3);
            if let Some(bytes) = budget {
                b = b.cache_budget_bytes(bytes);
            }
            let ds = b.build().unwrap();
            for epoch in 0..2 {
                let what =
                    format!("shards of {shard:?}, {patches} per sample, {budget:?}, epoch {epoch}");
                ds.set_epoch(epoch);
                let mut pass = ds.train().unwrap();
                // Each sample's stored chunks (tile row, tile column) under a window of either
                // label.
                let mut under: HashMap<u64, std::collections::BTreeSet<(u64, u64)>> =
                    HashMap::new();
                let mut rows = 0;
                for batch in pass.by_ref() {
                    let batch = batch.unwrap();
                    rows += batch.len();
                    for (label, shift) in [("t", 0), ("t_next", 1)] {
                        for (anchor, i, j, got) in patch_values(&batch, label, pw, grid.1) {
                            let sample = anchor + shift;
                            let want = field_value(0, sample, i, j, grid);
                            assert_eq!(
                                got, want,
                                "{what}: {label} of sample {sample} at ({i}, {j})"
                            );
                            under
                                .entry(sample)
                                .or_default()
                                .insert((i / tile_rows, j / tile_cols));
                        }
                    }
                }
                // Every anchor but the last (whose t_next is off the array), each patch once.
                assert_eq!(rows as u64, (n - 1) * patches, "{what}");
                let s = pass.stats();
                assert_eq!(s.tiles_into_batches, 0, "{what}: through the pool: {s:?}");
                if !regions {
                    // Whole fields, read once each: what the budget kept are the next epoch's
                    // hits (all of them, with a budget holding the split).
                    assert_eq!(s.cache_misses + s.cache_hits, chunks, "{what}: {s:?}");
                    if budget == Some(1 << 30) {
                        let misses = if epoch == 0 { chunks } else { 0 };
                        assert_eq!(s.cache_misses, misses, "{what}: {s:?}");
                    }
                    assert_eq!(s.region_slots, 0, "{what}: {s:?}");
                    assert_eq!(s.bytes_decoded, s.cache_misses * k * field, "{what}: {s:?}");
                    continue;
                }
                let under_any: u64 = under.values().map(|t| t.len() as u64).sum();
                assert!(under_any < n * tiles_per_field / 2, "{what}: {under_any}");
                // Every chunk a miss each epoch (a region slot is no later epoch's hit), each
                // stored (inner) chunk under a window read and decoded once.
                assert_eq!((s.cache_misses, s.cache_hits), (chunks, 0), "{what}: {s:?}");
                assert_eq!(s.region_slots, chunks, "{what}: {s:?}");
                assert_eq!(s.bytes_decoded, under_any * tile_bytes, "{what}: {s:?}");
                match shard {
                    None => assert_eq!(s.tiles_read, under_any, "{what}: {s:?}"),
                    // One read of each shard: its index and the inner chunks under the windows.
                    Some(_) => assert_eq!(s.tiles_read, chunks, "{what}: {s:?}"),
                }
            }
        }
    }
}

#[test]
fn a_bad_stored_chunk_under_a_window_of_either_label_is_nan_where_it_meets_the_window() {
    use insitubatch::OnBadChunk;
    use insitubatch::synth::field_value;
    // `t` of anchor 3 and `t_next` of anchor 2 read the bad chunk where their windows meet it.
    let (grid, (_dir, store)) = store_with_a_bad_chunk(24);
    let build = |on_bad| {
        InSituDataset::builder(&store)
            .variable("t", "t")
            .window("t_next", "t", 1)
            .patch_wrapping([12, 24], [false, true])
            .decode_into_batches(IntoRows::Always)
            .on_bad_chunk(on_bad)
            .batch_size(3)
            .block_chunks(2)
            .build()
            .unwrap()
    };
    let ds = build(OnBadChunk::Nan);
    let (mut bad_rows, mut good) = (0, 0);
    for epoch in 0..6 {
        ds.set_epoch(epoch);
        let mut pass = ds.train().unwrap();
        for b in pass.by_ref() {
            let b = b.unwrap();
            for (label, shift) in [("t", 0), ("t_next", 1)] {
                for (a, i, j, got) in patch_values(&b, label, 24, grid.1) {
                    let s = a + shift;
                    if s == 3 && i < 9 && j < 18 {
                        assert!(
                            got.is_nan(),
                            "{label}: sample 3 at ({i}, {j}) is the bad chunk's"
                        );
                        bad_rows += 1;
                    } else {
                        let want = field_value(0, s, i, j, grid);
                        assert_eq!(got, want, "{label}: sample {s} ({i}, {j})");
                        good += 1;
                    }
                }
            }
        }
        let s = pass.stats();
        assert_eq!(s.tiles_into_batches, 0, "through the pool: {s:?}");
        assert_eq!(s.region_slots, 24, "as the regions of their windows: {s:?}");
        let bad: Vec<&str> = s.bad_chunks.iter().map(|b| b.key.as_str()).collect();
        assert!(bad.iter().all(|k| k.ends_with("c/3/0/0")), "{bad:?}");
        assert!(bad.len() <= 1, "read once for both labels: {bad:?}");
    }
    assert!(
        bad_rows > 0 && good > 0,
        "a window met the bad chunk in some epoch"
    );
    // Raised, the error names the chunk, in the epoch whose windows meet it.
    let ds = build(OnBadChunk::Raise);
    let mut raised = 0;
    for epoch in 0..6 {
        ds.set_epoch(epoch);
        if let Some(Err(e)) = ds.train().unwrap().find(Result::is_err) {
            assert!(e.to_string().contains("c/3/0/0"), "{e}");
            raised += 1;
        }
    }
    assert!(raised > 0, "a window met the bad chunk in some epoch");
}

#[test]
fn the_memory_need_of_a_shard_read_as_regions_counts_the_inner_chunks_under_the_windows() {
    use insitubatch::synth::SynthSpec;
    // Shards of 4 samples of 72 x 144 in inner chunks of one sample and 9 x 18 (648 bytes).
    let (_dir, store) = common::synth_store(&SynthSpec {
        samples: 16,
        grid: (72, 144),
        sample_chunk: 1,
        inner_chunks: Some((9, 18)),
        shard_samples: Some(4),
        variables: vec!["t".into()],
        ..Default::default()
    });
    let need = |mode: IntoRows| {
        let ds = InSituDataset::builder(&store)
            .variable("t", "t")
            .patch([8, 16])
            .patches_per_sample(3)
            .executor_threads(2)
            .max_inflight(6)
            .decode_into_batches(mode)
            .build()
            .unwrap();
        let need = ds.memory_need("train").unwrap();
        // The need bounds what a pass holds: here, only what its reads pin in the pool.
        let s = common::run(&ds, "train");
        assert!(s.pinned_peak_bytes <= need.working_set, "{s:?} {need:?}");
        need
    };
    let (regions, whole) = (need(IntoRows::Always), need(IntoRows::Never));
    // Each of the 8 read buffers (6 in flight, one per decoder): a shard's index (4 x 64
    // entries of 16 bytes and a crc32c) and, twice (as read and compacted), the inner chunks
    // under its 12 rows' windows, each of which straddles at most 2 x 2 of them; and each
    // executor's scratch, the inner chunks under one window twice.
    let per_read = 4 * 64 * 16 + 4 + 2 * 12 * 4 * 648;
    assert_eq!(
        regions.reads,
        8 * per_read + 2 * (2 * 4 * 648),
        "{regions:?}"
    );
    // Read whole, a read buffer holds a whole shard of 4 samples.
    assert_eq!(whole.reads, 8 * 4 * 72 * 144 * 4, "{whole:?}");
}

#[test]
fn several_patches_read_as_regions_survive_an_abandoned_pass_and_run_zipped_with_val() {
    use insitubatch::split_by_chunk;
    use insitubatch::synth::{SynthSpec, field_value};
    let grid = (36u64, 72u64);
    let (_dir, store) = common::synth_store(&SynthSpec {
        samples: 24,
        grid,
        sample_chunk: 1,
        inner_chunks: Some((9, 18)),
        variables: vec!["t".into()],
        ..Default::default()
    });
    let build = |manifest: Option<insitubatch::SplitManifest>| {
        let b = InSituDataset::builder(&store)
            .variable("t", "t")
            .patch_wrapping([6, 12], [false, true])
            .patches_per_sample(4)
            .decode_into_batches(IntoRows::Always)
            .batch_size(5)
            .block_chunks(2)
            .prefetch_depth(1);
        match manifest {
            Some(m) => b.manifest(m),
            None => b,
        }
        .build()
        .unwrap()
    };
    // Every row of a batch is its sample's values at its window; returns its anchors.
    let check = |b: &insitubatch::Batch| -> Vec<u64> {
        for (s, i, j, got) in patch_values(b, "t", 12, grid.1) {
            assert_eq!(
                got,
                field_value(0, s, i, j, grid),
                "sample {s} at ({i}, {j})"
            );
        }
        b.sample_indices().to_vec()
    };
    // Abandoned after its first batch, with chunks of later rows being read: nothing stays
    // pinned or reserved, and the next pass delivers every (anchor, patch) once.
    let ds = build(None);
    let mut pass = ds.train().unwrap();
    check(&pass.next().unwrap().unwrap());
    assert!(pass.stats().tiles_into_batches > 0);
    drop(pass);
    let st = ds.pool_stats();
    assert_eq!((st.pinned_slots, st.reserved_bytes), (0, 0), "{st:?}");
    let mut anchors: Vec<u64> = ds
        .train()
        .unwrap()
        .flat_map(|b| check(&b.unwrap()))
        .collect();
    anchors.sort_unstable();
    let want: Vec<u64> = (0..24).flat_map(|a| [a; 4]).collect();
    assert_eq!(anchors, want);
    // Train and val zipped, one batch of each in turn: both whole and right.
    let geom = ds.variables()[0].geom.clone();
    let ds = build(Some(
        split_by_chunk(&geom, &[0.75, 0.25], 3, true, None).unwrap(),
    ));
    let (mut train, mut val) = (ds.train().unwrap(), ds.val().unwrap());
    let (mut seen_train, mut seen_val) = (Vec::new(), Vec::new());
    loop {
        let t = train.next().map(|b| check(&b.unwrap()));
        let v = val.next().map(|b| check(&b.unwrap()));
        if t.is_none() && v.is_none() {
            break;
        }
        seen_train.extend(t.unwrap_or_default());
        seen_val.extend(v.unwrap_or_default());
    }
    let mut all = [seen_train.clone(), seen_val.clone()].concat();
    all.sort_unstable();
    assert_eq!(all, want, "the two splits' patches together, each once");
    assert_eq!(seen_train.len(), 18 * 4);
    assert!(train.stats().tiles_into_batches > 0 && val.stats().tiles_into_batches > 0);
}

#[test]
fn a_bad_chunk_of_several_samples_cut_into_several_patches_each_is_nan_in_all_of_their_rows() {
    use insitubatch::OnBadChunk;
    use insitubatch::synth::{SynthSpec, field_value};
    let grid = (12u64, 24u64);
    let (_dir, store) = common::synth_store(&SynthSpec {
        samples: 8,
        grid,
        sample_chunk: 2,
        variables: vec!["t".into()],
        ..Default::default()
    });
    // Samples 2 and 3 are one stored chunk that decodes to nothing.
    std::fs::write(store.join("t/c/1/0/0"), b"this is not zstd").unwrap();
    let build = |policy: OnBadChunk| {
        InSituDataset::builder(&store)
            .variable("t", "t")
            .patch([5, 7])
            .patches_per_sample(3)
            .decode_into_batches(IntoRows::Always)
            .on_bad_chunk(policy)
            .batch_size(5)
            .block_chunks(2)
            .build()
            .unwrap()
    };
    let ds = build(OnBadChunk::Nan);
    for epoch in 0..3 {
        ds.set_epoch(epoch);
        let mut pass = ds.train().unwrap();
        let mut anchors = Vec::new();
        for b in pass.by_ref() {
            let b = b.unwrap();
            // 5 x 7 patches, none across the field's end.
            for (s, i, j, got) in patch_values(&b, "t", 7, grid.1) {
                if s == 2 || s == 3 {
                    assert!(got.is_nan(), "sample {s} at ({i}, {j}) is the bad chunk's");
                } else {
                    assert_eq!(got, field_value(0, s, i, j, grid), "sample {s} ({i}, {j})");
                }
            }
            anchors.extend_from_slice(b.sample_indices());
        }
        let want: Vec<u64> = (0..8).flat_map(|a| [a; 3]).collect();
        assert_eq!(sorted(anchors), want, "every anchor's three patches once");
        let s = pass.stats();
        assert!(s.tiles_into_batches > 0, "decoded into rows: {s:?}");
        let bad: Vec<&str> = s.bad_chunks.iter().map(|b| b.key.as_str()).collect();
        assert_eq!(bad.len(), 1, "read once for its six rows: {bad:?}");
        assert!(bad[0].ends_with("t/c/1/0/0"), "{bad:?}");
    }
    // Raised: the pass ends in an error naming the chunk, and nothing hangs.
    let ds = build(OnBadChunk::Raise);
    let err = ds
        .train()
        .unwrap()
        .find_map(Result::err)
        .expect("the bad chunk raises")
        .to_string();
    assert!(err.contains("t/c/1/0/0"), "{err}");
}

#[test]
fn a_patch_is_cut_from_what_the_chunk_transforms_make() {
    let f = fixture("era5_v3", "t2m");
    let build = |patch: Option<[u64; 2]>| {
        let mut b = InSituDataset::builder(&f.store)
            .variable("t2m", "t2m")
            .chunk_transforms_json(r#"[{"type": "coarsen", "factors": [2, 2]}]"#)
            .shuffle(false)
            .batch_size(5);
        if let Some(p) = patch {
            b = b.patch(p);
        }
        b.build().unwrap()
    };
    let (whole, patched) = (build(None), build(Some([3, 5])));
    let inner: Vec<usize> = whole.batch_arrays()[0]
        .row_shape
        .iter()
        .map(|&d| d as usize)
        .collect();
    assert_eq!(inner, [4, 8], "coarsened 9 x 16");
    let (mut a, mut b) = (whole.all().unwrap(), patched.all().unwrap());
    let mut rows = 0;
    for (x, y) in a.by_ref().zip(b.by_ref()) {
        let (x, y) = (x.unwrap(), y.unwrap());
        assert_eq!(x.sample_indices(), y.sample_indices());
        let origins = y.patch_origins().unwrap();
        let (xs, ys) = (
            x.array("t2m").unwrap().bytes(),
            y.array("t2m").unwrap().bytes(),
        );
        for r in 0..y.len() {
            let origin = [origins[2 * r] as usize, origins[2 * r + 1] as usize];
            let want = window_of(&xs[r * 128..(r + 1) * 128], &inner, &[3, 5], &origin, 4);
            assert_eq!(
                &ys[r * 60..(r + 1) * 60],
                &want[..],
                "row {r} at {origin:?}"
            );
            rows += 1;
        }
    }
    assert_eq!(rows, 12);
    // A label the transform does not reach has the field as stored, another extent.
    let err = InSituDataset::builder(&f.store)
        .variable("t2m", "t2m")
        .variable("u10", "u10")
        .chunk_transforms_json(r#"[{"type": "coarsen", "factors": [2, 2], "applies": ["t2m"]}]"#)
        .patch([3, 3])
        .build()
        .expect_err("labels of two extents");
    assert!(
        err.to_string()
            .contains("`t2m` has [4, 8], `u10` has [9, 16]"),
        "{err}"
    );
}

/// Every row of one epoch of `split`: its anchor and its patch's origin, in order.
fn rows(ds: &InSituDataset, split: &str) -> Vec<(u64, Vec<u64>)> {
    rows_from(ds, split, 0)
}

/// [`rows`] of the epoch resumed at batch `start`.
fn rows_from(ds: &InSituDataset, split: &str, start: u64) -> Vec<(u64, Vec<u64>)> {
    ds.iter_from(split, start)
        .unwrap()
        .flat_map(|b| {
            let b = b.unwrap();
            let o = b.patch_origins().unwrap().to_vec();
            let k = o.len() / b.len();
            b.sample_indices()
                .iter()
                .enumerate()
                .map(|(i, &a)| (a, o[i * k..(i + 1) * k].to_vec()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The origins of every anchor's patches, sorted.
fn origins_by_anchor(rows: &[(u64, Vec<u64>)]) -> HashMap<u64, Vec<Vec<u64>>> {
    let mut out: HashMap<u64, Vec<Vec<u64>>> = HashMap::new();
    for (a, o) in rows {
        out.entry(*a).or_default().push(o.clone());
    }
    for o in out.values_mut() {
        o.sort();
    }
    out
}

#[test]
fn several_patches_per_sample_are_rows_of_their_own_each_once_from_one_read() {
    let (t2m, u10) = (fixture("era5_v3", "t2m"), fixture("era5_v3", "u10"));
    let refs = [
        r("t2m", t2m.clone()),
        r("u10", u10),
        r("t2m_next", t2m.clone()),
    ];
    let build = |threads: usize, bs: usize, into_rows: IntoRows| {
        InSituDataset::builder(&t2m.store)
            .variable("t2m", "t2m")
            .variable("u10", "u10")
            .window("t2m_next", "t2m", 1)
            .patch([3, 4])
            .patches_per_sample(3)
            .batch_size(bs)
            .block_chunks(2)
            .executor_threads(threads)
            .decode_into_batches(into_rows)
            .build()
            .unwrap()
    };
    let ds = build(2, 5, IntoRows::Auto);
    // The window drops anchor 11: 11 anchors of three patches each.
    assert_eq!(ds.split_samples("train").unwrap(), 33);
    assert_eq!(ds.split_batches("train").unwrap(), 7);
    for epoch in 0..2 {
        ds.set_epoch(epoch);
        let (anchors, _, stats) = check_patched_epoch(&ds, "train", &refs, &[3, 4], None);
        let want: Vec<u64> = (0..11).flat_map(|a| [a; 3]).collect();
        assert_eq!(sorted(anchors), want, "every anchor's three patches once");
        if epoch == 0 {
            assert_eq!(
                stats.tiles_read, 6,
                "each chunk read once for its patches: {stats:?}"
            );
        }
        let rows = rows(&ds, "train");
        let by_anchor = origins_by_anchor(&rows);
        let apart = by_anchor
            .values()
            .filter(|o| o[0] != o[1] || o[1] != o[2])
            .count();
        assert!(
            apart >= 9,
            "an anchor's patches are drawn apart: {by_anchor:?}"
        );
        // Shuffled: an anchor's patches rarely follow one another.
        let next = rows.windows(2).filter(|w| w[0].0 == w[1].0).count();
        assert!(next <= 12, "{next} of 32 neighbours share an anchor");
        // Decoded into rows, each sample's patches cut from the decoder's scratch buffer:
        // the same rows, and every chunk read once (u10's three; t2m, read by two labels,
        // through the pool).
        let forced = build(1, 4, IntoRows::Always);
        forced.set_epoch(epoch);
        let (_, _, stats) = check_patched_epoch(&forced, "train", &refs, &[3, 4], None);
        assert_eq!(
            (stats.tiles_read, stats.tiles_into_batches),
            (6, 3),
            "{stats:?}"
        );
        let never = build(2, 3, IntoRows::Never);
        never.set_epoch(epoch);
        let (_, _, stats) = check_patched_epoch(&never, "train", &refs, &[3, 4], None);
        assert_eq!(stats.tiles_into_batches, 0, "{stats:?}");
        assert_eq!(
            origins_by_anchor(&rows),
            origins_by_anchor(&self::rows(&forced, "train")),
            "the same patches on 1 and 2 threads, any batch size"
        );
    }
    ds.set_epoch(0);
    let first = origins_by_anchor(&rows(&ds, "train"));
    ds.set_epoch(1);
    let second = origins_by_anchor(&rows(&ds, "train"));
    assert!(first.keys().filter(|a| first[*a] != second[*a]).count() >= 8);
    // Resumed mid-epoch: the rest of the whole epoch's rows.
    let whole = rows(&ds, "train");
    assert_eq!(rows_from(&ds, "train", 3), whole[15..]);
}

#[test]
fn ranks_and_whole_batches_count_rows_of_patches() {
    let f = fixture("era5_v3", "t2m");
    let build = |rank: usize, world: usize| {
        InSituDataset::builder(&f.store)
            .variable("t2m", "t2m")
            .window("next", "t2m", 1)
            .patch([3, 3])
            .patches_per_sample(2)
            .batch_size(4)
            .drop_last(true)
            .shard(rank, world)
            .build()
            .unwrap()
    };
    let whole = build(0, 1);
    // 11 anchors, 22 rows, five whole batches of four.
    assert_eq!(whole.split_samples("train").unwrap(), 20);
    let got = rows(&whole, "train");
    assert_eq!(got.len(), 20);
    let (a, b) = (build(0, 2), build(1, 2));
    let (ra, rb) = (rows(&a, "train"), rows(&b, "train"));
    // The ranks stop at the shorter share's rows: 5 anchors (10 rows) beside 6, two batches.
    assert_eq!((ra.len(), rb.len()), (8, 8));
    assert_eq!(a.split_samples("train").unwrap(), 8);
    let (sa, sb): (Vec<u64>, Vec<u64>) = (
        ra.iter().map(|r| r.0 / 2).collect(),
        rb.iter().map(|r| r.0 / 2).collect(),
    );
    assert!(sa.iter().all(|c| !sb.contains(c)), "the ranks read apart");
}

/// Each sample of `f` stitched back from its patches' rows of one epoch of `split`; every
/// element written at least once, and the same value each time.
fn stitch(ds: &InSituDataset, split: &str, f: &FixtureArray, patch: [usize; 2]) -> Vec<Vec<u8>> {
    let item = item_size(&f.dtype);
    let (n, h, w) = (
        f.shape[0] as usize,
        f.shape[1] as usize,
        f.shape[2] as usize,
    );
    let mut fields = vec![vec![None::<Vec<u8>>; h * w]; n];
    for b in ds.iter_from(split, 0).unwrap() {
        let b = b.unwrap();
        let o = b.patch_origins().unwrap();
        let bytes = b.array("x").unwrap().bytes();
        for (r, &s) in b.sample_indices().iter().enumerate() {
            let (i0, j0) = (o[2 * r] as usize, o[2 * r + 1] as usize);
            for i in 0..patch[0] {
                for j in 0..patch[1] {
                    let at = ((r * patch[0] + i) * patch[1] + j) * item;
                    let v = bytes[at..at + item].to_vec();
                    let cell = &mut fields[s as usize][(i0 + i) * w + (j0 + j) % w];
                    if let Some(old) = cell {
                        assert_eq!(*old, v, "overlapping patches agree");
                    }
                    *cell = Some(v);
                }
            }
        }
    }
    fields
        .into_iter()
        .map(|f| {
            f.into_iter()
                .flat_map(|c| c.expect("every element in some patch"))
                .collect()
        })
        .collect()
}

#[test]
fn a_grid_tiles_every_field_and_stitches_back_to_zarr_pythons_samples() {
    let f = fixture("era5_v3", "t2m");
    let item = item_size(&f.dtype);
    let want: Vec<Vec<u8>> = (0..12)
        .map(|s| sample_of(&f.reference, &f.shape, 0, s, item))
        .collect();
    // The 9 × 16 field: tiles that divide it, tiles moved back at the edge, overlapping
    // tiles, and a periodic axis whose last tile runs across the end.
    for (patch, wrap, stride, per_sample) in [
        ([3, 4], [false, false], [3, 4], 3 * 4),
        ([4, 6], [false, false], [4, 6], 3 * 3),
        ([5, 6], [false, false], [2, 3], 3 * 5),
        ([4, 6], [false, true], [4, 6], 3 * 3),
        ([9, 16], [false, false], [9, 16], 1),
    ] {
        let ds = InSituDataset::builder(&f.store)
            .variable("x", "t2m")
            .patch_wrapping(patch.map(|d| d as u64), wrap)
            .patch_grid(stride.map(|d| d as u64))
            .batch_size(7)
            .build()
            .unwrap();
        assert_eq!(ds.split_samples("all").unwrap(), 12 * per_sample);
        let grid = origins_by_anchor(&rows(&ds, "all"));
        assert_eq!(grid.len(), 12);
        for epoch in 0..2 {
            ds.set_epoch(epoch);
            for split in ["train", "all"] {
                let got = stitch(&ds, split, &f, patch);
                assert!(
                    got == want,
                    "{patch:?} every {stride:?}: {split} stitched back"
                );
                assert_eq!(
                    origins_by_anchor(&rows(&ds, split)),
                    grid,
                    "{patch:?}: the same grid in every epoch and split"
                );
            }
        }
        for o in grid.values() {
            assert_eq!(o.len() as u64, per_sample);
            assert_eq!(o, &grid[&0], "every sample tiled alike");
        }
    }
}

#[test]
fn origins_placed_badly_are_errors_naming_their_argument() {
    let f = fixture("era5_v3", "t2m");
    let expect = |b: DatasetBuilder, arg: &str, needle: &str| match b.build() {
        Err(EngineError::InvalidArgument { name, hint, .. }) => {
            assert_eq!(name, arg);
            assert!(hint.contains(needle), "{hint}");
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("built with bad origins ({needle})"),
    };
    let era5 = || InSituDataset::builder(&f.store).variable("t2m", "t2m");
    expect(
        era5().patch([3, 3]).patches_per_sample(0),
        "patches_per_sample",
        "at least 1",
    );
    expect(
        era5().patches_per_sample(4),
        "patches_per_sample",
        "no patch is set",
    );
    expect(era5().patch_grid([3, 3]), "patch_grid", "no patch is set");
    expect(
        era5().patch([3, 3]).patch_grid([3]),
        "patch_grid",
        "one stride per patched axis: 2 for the patch [3, 3]",
    );
    expect(
        era5().patch([3, 3]).patch_grid([3, 0]),
        "patch_grid",
        "axis 1 must be from 1",
    );
    expect(
        era5().patch([3, 3]).patch_grid([4, 3]),
        "patch_grid",
        "axis 0 must be from 1 to the patch's extent there (3)",
    );
    // A stride of 1 along both axes: every origin, (9 - 2) × (16 - 2) of them.
    let all = era5().patch([3, 3]).patch_grid([1, 1]).build().unwrap();
    assert_eq!(all.split_samples("all").unwrap(), 12 * 7 * 14);
}

/// Grid origins along one axis, written here by stepping (independently of the engine).
fn grid_starts(n: u64, p: u64, stride: u64, wrap: bool) -> Vec<u64> {
    if wrap {
        return (0..n).step_by(stride as usize).collect();
    }
    let mut starts: Vec<u64> = (0..=n - p).step_by(stride as usize).collect();
    if starts.last().is_some_and(|&s| s + p < n) {
        starts.push(n - p);
    }
    starts
}

#[test]
fn random_stores_and_placements_cut_every_patch_from_the_field() {
    use insitubatch::synth::{SynthSpec, field_value};
    let cases: u64 = std::env::var("ISB_PATCH_CASES").map_or(100, |n| n.parse().unwrap());
    // Regions read (of a cropped view), rows decoded in place, several, grid, crop, periodic,
    // several drawn patches of a shard read as regions, rows of several samples per chunk read
    // as regions.
    let mut covered = [0u32; 10];
    for case in 0..cases {
        let mut r = insitubatch_tests::Rng::new(case);
        let grid = (r.range(4, 14), r.range(4, 24));
        let spc = if r.chance(0.5) { 1 } else { r.range(2, 3) };
        let sharded = r.chance(0.25);
        // A shard's inner chunks divide it; chunk files may end short at the field's edge.
        let divisor = |r: &mut insitubatch_tests::Rng, n: u64| {
            let d: Vec<u64> = (2..=n).filter(|d| n.is_multiple_of(*d)).collect();
            d[r.range(0, d.len() as u64 - 1) as usize]
        };
        let inner = if sharded {
            Some((divisor(&mut r, grid.0), divisor(&mut r, grid.1)))
        } else {
            r.chance(0.6)
                .then(|| (r.range(2, grid.0), r.range(2, grid.1)))
        };
        let samples = r.range(4, 12);
        let (_dir, store) = common::synth_store(&SynthSpec {
            samples,
            grid,
            sample_chunk: spc,
            inner_chunks: inner,
            shard_samples: sharded.then_some(spc),
            variables: vec!["t".into(), "u".into()],
            ..Default::default()
        });
        // A crop of the field (latitudes inside, longitudes maybe across the end), or none.
        let crop = r.chance(0.5).then(|| {
            let (a, b) = (r.range(0, grid.0 - 2), r.range(2, grid.0));
            let (lat0, lat1) = (a.min(b - 1), a.max(b - 1) + 1);
            let lon0 = r.range(0, grid.1 - 1) as i64;
            let width = r.range(2, grid.1) as i64;
            [(lat0 as i64, lat1 as i64), (lon0, lon0 + width)]
        });
        let view = crop.map_or((0, 0, grid.0, grid.1), |c| {
            (
                c[0].0 as u64,
                c[1].0 as u64,
                (c[0].1 - c[0].0) as u64,
                (c[1].1 - c[1].0) as u64,
            )
        });
        let (lat0, lon0, h, w) = view;
        let patch = [r.range(1, h), r.range(1, w)];
        // Longitude periodic for the patch only where the view holds it whole or wraps freely.
        let wrap = r.chance(0.4);
        let placing = if r.chance(0.45) { 0 } else { r.range(1, 2) };
        let stride = [
            r.range(patch[0].div_ceil(2), patch[0]),
            r.range(patch[1].div_ceil(2), patch[1]),
        ];
        // Mostly `Always`: on stores this small `Auto` keeps the pool, which holds everything.
        let mode = [
            IntoRows::Always,
            IntoRows::Always,
            IntoRows::Auto,
            IntoRows::Never,
        ][r.range(0, 3) as usize];
        let mut b = InSituDataset::builder(&store);
        for label in ["t", "u"] {
            b = match crop {
                Some(c) => b.cropped_window_wrapping(label, label, 0, &c),
                None => b.variable(label, label),
            };
        }
        // The next sample of `t` beside it (a forecast's target), cut from the same patches:
        // the anchors lose the last sample, and `t`'s chunks feed two labels.
        let next = r.chance(0.3);
        if next {
            b = match crop {
                Some(c) => b.cropped_window_wrapping("t_next", "t", 1, &c),
                None => b.window("t_next", "t", 1),
            };
        }
        let anchors = samples - u64::from(next);
        b = b
            .patch_wrapping(patch, [false, wrap])
            .batch_size(r.range(1, 7) as usize)
            .block_chunks(r.range(1, 3) as usize)
            .shuffle(r.chance(0.7))
            .executor_threads(r.range(1, 2) as usize)
            .decode_into_batches(mode);
        b = match placing {
            0 => b,
            1 => b.patches_per_sample(r.range(2, 3)),
            _ => b.patch_grid(stride),
        };
        let ds = b.build().unwrap_or_else(|e| panic!("case {case}: {e}"));
        let per_sample = ds.patches_per_sample();
        let what = format!(
            "case {case}: grid {grid:?}, {spc}/chunk, inner {inner:?}, sharded {sharded}, crop \
             {crop:?}, patch {patch:?} wrap {wrap}, placing {placing} ({per_sample}/sample), \
             {mode:?}, t_next {next}"
        );
        if placing == 2 {
            let want: u64 = (0..2)
                .map(|d| grid_starts([h, w][d], patch[d], stride[d], d == 1 && wrap).len() as u64)
                .product();
            assert_eq!(per_sample, want, "{what}");
        }
        for epoch in 0..2 {
            ds.set_epoch(epoch);
            let mut pass = ds.train().unwrap();
            let mut by_anchor: HashMap<u64, Vec<Vec<u64>>> = HashMap::new();
            for batch in pass.by_ref() {
                let batch = batch.unwrap_or_else(|e| panic!("{what}: {e}"));
                let origins = batch.patch_origins().unwrap();
                let n = (patch[0] * patch[1]) as usize;
                let labels = [("t", 0, 0), ("u", 1, 0), ("t_next", 0, 1)];
                for (label, var, shift) in labels.into_iter().take(2 + usize::from(next)) {
                    let v: &[f32] = batch.array(label).unwrap().values().unwrap();
                    for (row, &a) in batch.sample_indices().iter().enumerate() {
                        let s = a + shift;
                        let (i0, j0) = (origins[2 * row], origins[2 * row + 1]);
                        assert!(i0 + patch[0] <= h && (wrap || j0 + patch[1] <= w), "{what}");
                        for (k, got) in v[row * n..(row + 1) * n].iter().enumerate() {
                            let (di, dj) = (k as u64 / patch[1], k as u64 % patch[1]);
                            let (i, j) = (lat0 + i0 + di, (lon0 + (j0 + dj) % w) % grid.1);
                            assert_eq!(
                                *got,
                                field_value(var, s, i, j, grid),
                                "{what}: {label} sample {s} at ({i0}, {j0}), element {k}"
                            );
                        }
                        if label == "t" {
                            by_anchor.entry(a).or_default().push(vec![i0, j0]);
                        }
                    }
                }
            }
            assert_eq!(by_anchor.len() as u64, anchors, "{what}");
            for (a, o) in &mut by_anchor {
                assert_eq!(o.len() as u64, per_sample, "{what}: sample {a}'s patches");
                if placing == 2 {
                    o.sort();
                    let rows = grid_starts(h, patch[0], stride[0], false);
                    let cols = grid_starts(w, patch[1], stride[1], wrap);
                    let want: Vec<Vec<u64>> = rows
                        .iter()
                        .flat_map(|&i| cols.iter().map(move |&j| vec![i, j]))
                        .collect();
                    assert_eq!(*o, want, "{what}: sample {a}'s grid");
                }
            }
            let s = pass.stats();
            let region = per_sample == 1 && spc == 1 && s.tiles_into_batches > 0;
            covered[0] += u32::from(region && inner.is_some());
            covered[1] += u32::from(region && inner.is_some() && crop.is_some());
            covered[2] += u32::from(s.tiles_into_batches > 0);
            // Several drawn patches of a one-sample shard: its inner chunks under any window.
            covered[7] +=
                u32::from(placing == 1 && spc == 1 && sharded && s.tiles_into_batches > 0);
            // Rows of a chunk of several samples read as their regions: tiles or inner chunks
            // that split the field, decoded into rows, no grid.
            let splits = inner.is_some_and(|i| i != grid);
            covered[8] += u32::from(spc > 1 && splits && placing != 2 && s.tiles_into_batches > 0);
            // Chunks of a field two labels read, loaded as the regions of their windows.
            covered[9] += u32::from(s.region_slots > 0);
        }
        covered[3] += u32::from(placing == 1);
        covered[4] += u32::from(placing == 2);
        covered[5] += u32::from(crop.is_some());
        covered[6] += u32::from(wrap);
    }
    eprintln!(
        "regions (of crops), rows in place, several, grids, crops, periodic, several of a \
         shard, several samples as regions, region slots: {covered:?}"
    );
    if cases >= 100 {
        assert!(covered.iter().all(|&c| c >= 4), "coverage {covered:?}");
    }
}
