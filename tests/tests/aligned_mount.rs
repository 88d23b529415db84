//! Stores that cover different times, mounted with an alignment
//! (`DatasetBuilder::align_mount`): each anchor reads every store at the same time, found from
//! their time coordinates (in different CF units and formats) or given as a sample offset; the
//! values equal zarr-python's at each label's read index; anchors outside what the stores share
//! are dropped and counted; and coordinates that do not align are refused naming why.

use insitubatch::actors::Placement;
use insitubatch::{EngineError, InSituDataset, IntoRows, MountAlignment};
use insitubatch_tests::{FixtureArray, fixtures_dir};

mod common;
use common::{check_epoch, fixture, run, sorted};

fn on_time() -> MountAlignment {
    MountAlignment::Coordinate("time".into())
}

/// `x` of the inputs (20 samples 6-hourly from 1979-01-01T00) and `tp` of a mounted store.
fn builder(mount: &str, alignment: MountAlignment) -> insitubatch::DatasetBuilder {
    InSituDataset::builder(fixture("aligned", "x").store)
        .mount("m", fixtures_dir().join(mount))
        .align_mount("m", alignment)
        .variable("x", "x")
        .variable("y", "m/tp")
        .batch_size(4)
        .seed(2)
}

fn targets() -> FixtureArray {
    fixture("aligned_targets", "tp")
}

#[test]
fn a_later_store_aligned_on_time_is_read_at_each_anchors_time() {
    // The targets (days since 1979, float64, v2) start at the inputs' eighth time and run past
    // their end: anchors 7..20 read both, `y` at anchor - 7.
    let x = fixture("aligned", "x");
    let tp = targets();
    for alignment in [on_time(), MountAlignment::Samples(7)] {
        let ds = builder("aligned_targets.zarr", alignment.clone())
            .window("x_next", "x", 1)
            .build()
            .unwrap();
        assert_eq!(
            ds.anchor_range(),
            7..19,
            "{alignment:?}: the window ends it at 19"
        );
        let placements: Vec<Placement> = ds.variables().iter().map(|v| v.placement).collect();
        let (same, behind) = (Placement::SAME, Placement::shifted(-7));
        assert_eq!(placements, [same, behind, same], "{alignment:?}");
        for split in ["train", "all"] {
            let mut pass = ds.iter(split).unwrap();
            let mut anchors = Vec::new();
            for b in pass.by_ref() {
                let b = b.unwrap();
                let at: Vec<u64> = b.sample_indices().to_vec();
                let y: Vec<u64> = b.read_indices("y").unwrap();
                assert_eq!(y, at.iter().map(|a| a - 7).collect::<Vec<_>>());
                anchors.extend(at);
            }
            assert_eq!(sorted(anchors), (7..19).collect::<Vec<_>>(), "{split}");
            // The anchors before the targets start and the last (its next is off `x`).
            assert_eq!(pass.stats().dropped_anchors, 8, "{split}");
            drop(pass);
            let refs = [("x", &x, 0), ("y", &tp, 0), ("x_next", &x, 0)];
            assert_eq!(sorted(check_epoch(&ds, split, &refs)).len(), 12);
        }
    }
}

#[test]
fn an_earlier_store_aligned_on_time_covers_the_first_anchors() {
    // `early` starts 18 hours (three samples) before the inputs and has ten samples: anchors
    // 0..7, `y` at anchor + 3.
    let x = fixture("aligned", "x");
    let early = fixture("aligned_early", "tp");
    let ds = builder("aligned_early.zarr", on_time()).build().unwrap();
    assert_eq!(ds.anchor_range(), 0..7);
    let refs = [("x", &x, 0), ("y", &early, 0)];
    for split in ["train", "all"] {
        assert_eq!(
            sorted(check_epoch(&ds, split, &refs)),
            (0..7).collect::<Vec<_>>()
        );
    }
    let stats = run(
        &builder("aligned_early.zarr", on_time()).build().unwrap(),
        "all",
    );
    assert_eq!(stats.dropped_anchors, 13);
    // Only the chunks the shared anchors need are read: 2 of `x`'s 5 (anchors 0..7, in chunks
    // of 4) and 3 of `early`'s 4 (samples 3..10, in chunks of 3).
    assert_eq!(stats.tiles_read, 2 + 3, "{stats:?}");
}

#[test]
fn splitting_by_the_mounted_array_puts_the_anchors_on_its_samples() {
    // A manifest made on the targets' own geometry: anchors are their samples, and `x` is read
    // seven samples later; the targets' samples past the inputs' end are dropped.
    let x = fixture("aligned", "x");
    let tp = targets();
    let geoms = insitubatch::geometries(&tp.store, Some(&["tp".to_string()]), 0).unwrap();
    let manifest = insitubatch::split_by_chunk(&geoms["tp"], &[1.0], 0, true, None).unwrap();
    let ds = builder("aligned_targets.zarr", on_time())
        .manifest(manifest)
        .build()
        .unwrap();
    assert_eq!(ds.manifest().array, "m/tp");
    assert_eq!(ds.anchor_range(), 0..13);
    let placements: Vec<Placement> = ds.variables().iter().map(|v| v.placement).collect();
    assert_eq!(placements, [Placement::shifted(7), Placement::SAME]);
    let refs = [("x", &x, 0), ("y", &tp, 0)];
    assert_eq!(
        sorted(check_epoch(&ds, "train", &refs)),
        (0..13).collect::<Vec<_>>()
    );
}

#[test]
fn a_split_over_the_anchor_range_leaves_the_rest_out() {
    // Split over the samples the stores share: the splits hold only the chunks that overlap
    // them (chunk 1, anchors 4..8, across its start: its first three are dropped), and train
    // and val together are that range.
    let x = fixture("aligned", "x");
    let tp = targets();
    let probe = builder("aligned_targets.zarr", on_time()).build().unwrap();
    let shared = probe.anchor_range();
    let geoms = insitubatch::geometries(&x.store, Some(&["x".to_string()]), 0).unwrap();
    let range = (shared.start, shared.end);
    let manifest =
        insitubatch::split_by_chunk(&geoms["x"], &[0.75, 0.25], 4, true, Some(range)).unwrap();
    let ds = builder("aligned_targets.zarr", on_time())
        .manifest(manifest)
        .build()
        .unwrap();
    let refs = [("x", &x, 0), ("y", &tp, 0)];
    let mut all = check_epoch(&ds, "train", &refs);
    all.extend(check_epoch(&ds, "val", &refs));
    assert_eq!(sorted(all), (7..20).collect::<Vec<_>>());
    let dropped = run(&ds, "train").dropped_anchors + run(&ds, "val").dropped_anchors;
    assert_eq!(dropped, 3, "7 without the range");
    assert_eq!(
        run(
            &builder("aligned_targets.zarr", on_time()).build().unwrap(),
            "all"
        )
        .dropped_anchors,
        7
    );
}

fn refusal(b: insitubatch::DatasetBuilder) -> String {
    match b.build() {
        Err(e @ (EngineError::InvalidArgument { .. } | EngineError::UnequalSampleAxis { .. })) => {
            e.to_string()
        }
        Err(e) => panic!("another error: {e:?}"),
        Ok(_) => panic!("built"),
    }
}

#[test]
fn stores_that_do_not_align_are_refused_saying_why() {
    let misaligned = |group: &str| {
        InSituDataset::builder(fixture("aligned", "x").store)
            .mount("m", fixtures_dir().join("misaligned.zarr"))
            .align_mount("m", on_time())
            .variable("x", "x")
            .variable("y", format!("m/{group}/tp"))
    };
    let cases = [
        ("gap", "part: aligned at `time`[7] = `m/gap/time`[0]"),
        (
            "uneven",
            "`time` steps by 6 h and `m/uneven/time` by 12 h, and stores at different rates \
             align only when each steps evenly, but `m/uneven/time` steps by 24 h from its index 2",
        ),
        ("offgrid", "not on one grid"),
        ("after", "share no `time`"),
        (
            "steps",
            "`time` has CF time units and `m/steps/time` units \"steps\"",
        ),
        (
            "falling",
            "the values of `m/falling/time` do not rise strictly",
        ),
        (
            "untimed",
            "no coordinate array `m/untimed/time` beside `m/untimed/tp`",
        ),
        (
            "short",
            "the coordinate `m/short/time` has shape [5] but `m/short/tp` has 8 samples",
        ),
    ];
    for (group, needle) in cases {
        let e = refusal(misaligned(group));
        assert!(
            e.contains("`mounts` = m") && e.contains(needle),
            "{group}: {e}"
        );
    }
    // The first place they part is named with both times.
    let e = refusal(misaligned("gap"));
    assert!(
        e.contains("`m/gap/time`[2] is 1979-01-03T12:00 where `time`[9] is 1979-01-03T06:00"),
        "{e}"
    );
    // A 12-hourly store from the inputs' eighth time aligns, but only every second anchor
    // from the seventh on meets one of its times: the stride must draw those.
    let e = refusal(misaligned("coarse"));
    assert!(
        e.contains("`sample_stride` = 1 (phase 0)")
            && e.contains("`y` has a sample at one anchor in 2 only")
            && e.contains("sample_stride 2, sample_phase 1"),
        "{e}"
    );
    let ds = misaligned("coarse").sample_stride(2, 1).build().unwrap();
    assert_eq!(ds.anchor_range(), 7..20);

    // An offset under which no anchor reads inside both arrays.
    let e = refusal(builder("aligned_targets.zarr", MountAlignment::Samples(25)));
    assert!(
        e.contains("share no anchor") && e.contains("`x` 0..20") && e.contains("`y` 25..42"),
        "{e}"
    );
    // An alignment of a name that is not mounted, and one given twice.
    let e = refusal(builder("aligned_targets.zarr", on_time()).align_mount("n", on_time()));
    assert!(
        e.contains("`mounts` = n") && e.contains("names no mount"),
        "{e}"
    );
    let e = refusal(builder("aligned_targets.zarr", on_time()).align_mount("m", on_time()));
    assert!(e.contains("aligned twice"), "{e}");
    // Without an alignment, unequal lengths are refused as before, pointing at alignment.
    let e = refusal(
        InSituDataset::builder(fixture("aligned", "x").store)
            .mount("m", fixtures_dir().join("aligned_targets.zarr"))
            .variable("x", "x")
            .variable("y", "m/tp"),
    );
    assert!(
        e.contains("`x` has 20 samples") && e.contains("`y` has 17") && e.contains("align_mount"),
        "{e}"
    );
}

#[test]
fn a_daily_store_beside_six_hourly_inputs_is_read_at_every_fourth_anchor() {
    // Daily targets from 1979-01-02: the inputs' anchors 4, 8, 12 and 16 meet them (their
    // samples 0..4; the last two days are past the inputs' end). The stride draws those.
    let x = fixture("aligned", "x");
    let daily = fixture("aligned_daily", "tp");
    let b = || builder("aligned_daily.zarr", on_time());
    let e = refusal(b());
    assert!(e.contains("sample_stride 4, sample_phase 0"), "{e}");
    let ds = b()
        .sample_stride(4, 0)
        .window("y_next", "m/tp", 1)
        .build()
        .unwrap();
    let placement = Placement {
        mul: 1,
        add: -4,
        div: 4,
        containing: false,
    };
    let placements: Vec<Placement> = ds.variables().iter().map(|v| v.placement).collect();
    assert_eq!(placements, [Placement::SAME, placement, placement]);
    // A window of a daily store is the next day.
    let refs = [("x", &x, 0), ("y", &daily, 0), ("y_next", &daily, 0)];
    for split in ["train", "all"] {
        let mut pass = ds.iter(split).unwrap();
        for b in pass.by_ref() {
            let b = b.unwrap();
            let days: Vec<u64> = b.sample_indices().iter().map(|a| (a - 4) / 4).collect();
            assert_eq!(b.read_indices("y").unwrap(), days);
            let next: Vec<u64> = days.iter().map(|d| d + 1).collect();
            assert_eq!(b.read_indices("y_next").unwrap(), next);
        }
        assert_eq!(
            pass.stats().dropped_anchors,
            1,
            "anchor 0 is before the first day"
        );
        drop(pass);
        assert_eq!(sorted(check_epoch(&ds, split, &refs)), [4, 8, 12, 16]);
    }
}

#[test]
fn a_three_hourly_store_beside_six_hourly_inputs_is_read_at_every_second_sample() {
    // 3-hourly targets (minutes since 1979-01-01) from 03:00: anchor a (6a hours) reads their
    // sample 2a - 1, for anchors 1..16 (the targets end at 90 hours).
    let x = fixture("aligned", "x");
    let fine = fixture("aligned_3hourly", "tp");
    let ds = builder("aligned_3hourly.zarr", on_time()).build().unwrap();
    assert_eq!(
        ds.variables()[1].placement,
        Placement {
            mul: 2,
            add: -1,
            div: 1,
            containing: false,
        }
    );
    assert_eq!(ds.anchor_range(), 1..16);
    let refs = [("x", &x, 0), ("y", &fine, 0)];
    let mut pass = ds.iter("all").unwrap();
    for b in pass.by_ref() {
        let b = b.unwrap();
        let want: Vec<u64> = b.sample_indices().iter().map(|a| 2 * a - 1).collect();
        assert_eq!(b.read_indices("y").unwrap(), want);
    }
    drop(pass);
    assert_eq!(
        sorted(check_epoch(&ds, "train", &refs)),
        (1..16).collect::<Vec<_>>()
    );
    // Split on the 3-hourly store's own chunks: anchors are its samples, and only its odd ones
    // meet an input (the stride draws them), `x` at (j + 1) / 2.
    let geoms = insitubatch::geometries(&fine.store, Some(&["tp".to_string()]), 0).unwrap();
    let manifest = insitubatch::split_by_chunk(&geoms["tp"], &[1.0], 0, true, None).unwrap();
    let b = || builder("aligned_3hourly.zarr", on_time()).manifest(manifest.clone());
    let e = refusal(b());
    assert!(e.contains("sample_stride 2, sample_phase 1"), "{e}");
    let ds = b().sample_stride(2, 1).build().unwrap();
    // The range counts the even anchors too (between two inputs); the stride leaves them out.
    assert_eq!(ds.anchor_range(), 0..30);
    let anchors = sorted(check_epoch(&ds, "train", &refs));
    assert_eq!(anchors, (1..30).step_by(2).collect::<Vec<_>>());
}

#[test]
fn ranks_share_the_anchors_an_aligned_mount_covers_once() {
    // Two and three ranks of the later targets' dataset: together every shared anchor once,
    // each rank's rows equal zarr-python's.
    let x = fixture("aligned", "x");
    let tp = targets();
    let refs = [("x", &x, 0), ("y", &tp, 0)];
    for world_size in [2, 3] {
        let mut all = Vec::new();
        for rank in 0..world_size {
            let ds = builder("aligned_targets.zarr", on_time())
                .shard(rank, world_size)
                .even_train(false)
                .build()
                .unwrap();
            all.extend(check_epoch(&ds, "train", &refs));
        }
        assert_eq!(
            sorted(all),
            (7..20).collect::<Vec<_>>(),
            "{world_size} ranks"
        );
    }
}

#[test]
fn a_cache_directory_revives_an_aligned_mount_with_nothing_decoded() {
    // The cache keys on array path and chunk: an aligned mount's chunks are cached and revived
    // like any, and the revived rows are still each anchor's time.
    let x = fixture("aligned", "x");
    let daily = fixture("aligned_daily", "tp");
    let cache = tempfile::tempdir().unwrap();
    let b = || {
        builder("aligned_daily.zarr", on_time())
            .sample_stride(4, 0)
            .cache_dir(cache.path())
            .persist(true)
    };
    let refs = [("x", &x, 0), ("y", &daily, 0)];
    {
        let ds = b().build().unwrap();
        assert_eq!(sorted(check_epoch(&ds, "train", &refs)), [4, 8, 12, 16]);
    }
    let ds = b().readonly_cache(true).build().unwrap();
    let s = run(&ds, "train");
    // x's chunks 1..5 (anchors 4..16) and the daily store's chunks 0 and 1 (days 0..4).
    assert_eq!(
        (s.tiles_read, s.bytes_decoded, s.cache_hits),
        (0, 0, 6),
        "{s:?}"
    );
    assert_eq!(sorted(check_epoch(&ds, "train", &refs)), [4, 8, 12, 16]);
}

/// The day (sample of the daily store, midnight of 1979-01-02 on) anchor `a` (6a hours) reads,
/// by brute force: the last at or before its time, or the nearest (the later on a tie).
fn day_of(alignment: &MountAlignment, a: u64) -> Option<u64> {
    let gap = |j: u64| 6 * a as i64 - 24 * (1 + j) as i64;
    match alignment {
        MountAlignment::Containing(_) => (0..6u64).rev().find(|&j| gap(j) >= 0),
        _ => (0..6u64).min_by_key(|&j| (gap(j).abs(), std::cmp::Reverse(j))),
    }
}

#[test]
fn rounding_alignments_read_a_day_at_every_anchor_with_no_stride() {
    // Daily targets from 1979-01-02 beside 6-hourly inputs. Containing: every anchor from the
    // fourth reads the day holding its time, (a - 4) / 4, through the sixth day's last hours
    // (anchor 19 is the inputs' last). Nearest: (a - 2) / 4, a day's sample read from 12:00 the
    // day before (a tie, which goes to the later day) through 06:00 of its day; anchors 0 and 1
    // are nearer a day before the store's first. Each day's sample is copied into its four
    // rows, in every into-rows mode (decoding it straight into one row would give it one).
    let x = fixture("aligned", "x");
    let daily = fixture("aligned_daily", "tp");
    let refs = [("x", &x, 0), ("y", &daily, 0)];
    let cases = [
        (MountAlignment::Containing("time".into()), -4, 4..20),
        (MountAlignment::Nearest("time".into()), -2, 2..20),
    ];
    for (alignment, add, valid) in cases {
        for (into_rows, block_chunks) in [(IntoRows::Always, 16), (IntoRows::Never, 1)] {
            let ds = builder("aligned_daily.zarr", alignment.clone())
                .decode_into_batches(into_rows)
                .block_chunks(block_chunks)
                .build()
                .unwrap();
            let p = ds.variables()[1].placement;
            assert!(
                p.containing && (p.mul, p.add, p.div) == (1, add, 4),
                "{p:?}"
            );
            assert_eq!(ds.anchor_range(), valid);
            for split in ["train", "all"] {
                let anchors = check_epoch(&ds, split, &refs);
                assert_eq!(
                    sorted(anchors),
                    valid.clone().collect::<Vec<_>>(),
                    "{alignment:?} {into_rows:?}"
                );
            }
            for b in ds.iter("all").unwrap() {
                let b = b.unwrap();
                let days: Vec<u64> = b
                    .sample_indices()
                    .iter()
                    .map(|&a| day_of(&alignment, a).unwrap())
                    .collect();
                assert_eq!(b.read_indices("y").unwrap(), days, "{alignment:?}");
            }
            assert_eq!(run(&ds, "all").dropped_anchors, valid.start);
        }
        // Steps that are not CF times cannot be set against the inputs' times.
        let e = refusal(
            InSituDataset::builder(fixture("aligned", "x").store)
                .mount("m", fixtures_dir().join("misaligned.zarr"))
                .align_mount("m", alignment.clone())
                .variable("x", "x")
                .variable("y", "m/steps/tp"),
        );
        assert!(
            e.contains("`mounts` = m") && e.contains("cannot align"),
            "{e}"
        );
    }
}
