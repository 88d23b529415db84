//! The engine against zarr-python fixtures: every emitted sample equals zarr-python's value at
//! its read index, every valid anchor exactly once per epoch, splits, determinism, residency,
//! cancellation, bad chunks, concurrent iterations and every bad input of the engine issue.

use std::collections::BTreeSet;

use insitubatch::cachebench::drop_pages_where;
use insitubatch::{
    EngineError, InSituDataset, IntoRows, IoBackendChoice, OnBadChunk, TimedOut, split_by_chunk,
};
use insitubatch_tests::{
    FixtureArray, Lease, copy_dir, fixture_arrays, sample_of, threads_named, threads_named_settled,
    threads_named_stable,
};

mod common;
use common::{check_epoch, corrupt_copy, fixture, sample_axis_of, sorted};

#[test]
fn every_sample_of_every_fixture_equals_zarr_python_shuffled_and_sequential() {
    for f in fixture_arrays() {
        let axis = sample_axis_of(&f);
        let n = f.shape[axis];
        for (shuffle, bs, bc) in [(true, 3, 2), (false, 4, 1), (true, 64, 16)] {
            let ds = InSituDataset::builder(&f.store)
                .variable("v", f.array.clone())
                .sample_axis(axis)
                .batch_size(bs)
                .block_chunks(bc)
                .shuffle(shuffle)
                .max_inflight(3)
                .build()
                .unwrap_or_else(|e| panic!("{}/{}: {e}", f.case, f.array));
            let anchors = check_epoch(&ds, "train", &[("v", &f, axis)]);
            // The first pass of a dataset with the automatic budget: residency is the bound
            // (none when its chunks are decoded into batch rows).
            assert_eq!(
                ds.pool_stats().budget_bytes,
                ds.memory_need("train").unwrap().working_set
            );
            assert_eq!(
                sorted(anchors.clone()),
                (0..n).collect::<Vec<_>>(),
                "{}",
                f.case
            );
            if !shuffle {
                assert_eq!(anchors, (0..n).collect::<Vec<_>>(), "sequential order");
            }
            // `all` is sequential whatever `shuffle` says.
            assert_eq!(
                check_epoch(&ds, "all", &[("v", &f, axis)]),
                (0..n).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn windows_drop_anchors_that_read_off_the_array_and_decode_once() {
    let f = fixture("era5_v3", "t2m");
    let u = fixture("era5_v3", "u10");
    let ds = InSituDataset::builder(&f.store)
        .variable("x", "t2m")
        .window("y", "t2m", 5)
        .window("prev", "t2m", -2)
        .variable("u", "u10")
        .batch_size(2)
        .block_chunks(1)
        .build()
        .unwrap();
    for epoch in 0..3 {
        ds.set_epoch(epoch);
        let anchors = check_epoch(
            &ds,
            "train",
            &[("x", &f, 0), ("y", &f, 0), ("prev", &f, 0), ("u", &u, 0)],
        );
        // T = 12: anchors 2..=6 have both t-2 and t+5 inside the array.
        assert_eq!(sorted(anchors), (2..7).collect::<Vec<_>>());
    }
    let mut pass = ds.train().unwrap();
    for b in pass.by_ref() {
        b.unwrap();
    }
    let s = pass.stats();
    assert_eq!(s.dropped_anchors, 12 - 5);
    // t2m read once per chunk however many labels view it: 3 chunks of t2m + 3 of u10 at most.
    assert!(s.cache_misses + s.cache_hits <= 6, "{s:?}");
    assert_eq!(s.tiles_read, s.cache_misses);
    // A window that leaves a split no anchor: its length is the error iterating it gives.
    let geom = ds.variables()[0].geom.clone();
    let halves = split_by_chunk(&geom, &[0.5, 0.5], 0, true, None).unwrap();
    let far = InSituDataset::builder(&f.store)
        .variable("x", "t2m")
        .window("y", "t2m", 9)
        .manifest(halves)
        .build()
        .unwrap();
    assert_eq!(
        far.split_samples("train").unwrap(),
        3,
        "anchors 0..3 have t+9 inside"
    );
    let e = far.split_samples("val").unwrap_err().to_string();
    assert!(
        e.contains("split `val` is empty") && e.contains("reads off the array"),
        "{e}"
    );
    assert_eq!(e, far.val().unwrap_err().to_string());
}

#[test]
fn sample_axis_two_and_inner_chunked_and_sharded_fields() {
    for (case, axis) in [
        ("v3_tczyx", 2usize),
        ("v3_inner", 0),
        ("v3_sharded", 0),
        ("v2_forder", 0),
    ] {
        let f = fixture_arrays()
            .into_iter()
            .find(|f| f.case == case)
            .unwrap();
        let ds = InSituDataset::builder(&f.store)
            .variable("v", f.array.clone())
            .sample_axis(axis)
            .window("w", f.array.clone(), 1)
            .batch_size(2)
            .block_chunks(2)
            .build()
            .unwrap();
        let anchors = check_epoch(&ds, "train", &[("v", &f, axis), ("w", &f, axis)]);
        assert_eq!(
            sorted(anchors),
            (0..f.shape[axis] - 1).collect::<Vec<_>>(),
            "{case}"
        );
    }
}

#[test]
fn variables_chunked_1_and_30_pair_row_for_row_on_either_reference_grid() {
    let raw = fixture("paired", "raw");
    let mask = fixture("paired", "mask");
    for (reference, f) in [("raw", &raw), ("mask", &mask)] {
        let probe = InSituDataset::builder(&raw.store)
            .variable("r", reference)
            .build()
            .unwrap();
        let manifest =
            split_by_chunk(&probe.variables()[0].geom, &[0.7, 0.3], 3, true, None).unwrap();
        let _ = f;
        let ds = InSituDataset::builder(&raw.store)
            .variable("raw", "raw")
            .variable("mask", "mask")
            .manifest(manifest)
            .batch_size(5)
            .block_chunks(3)
            .build()
            .unwrap();
        let mut all = Vec::new();
        for split in ["train", "val"] {
            all.extend(check_epoch(
                &ds,
                split,
                &[("raw", &raw, 0), ("mask", &mask, 0)],
            ));
        }
        assert_eq!(
            sorted(all),
            (0..61).collect::<Vec<_>>(),
            "reference {reference}"
        );
    }
}

#[test]
fn splits_cover_every_sample_once_contiguous_or_not() {
    let f = fixture("paired", "raw");
    for contiguous in [true, false] {
        let probe = InSituDataset::builder(&f.store)
            .variable("r", "raw")
            .build()
            .unwrap();
        let m = split_by_chunk(
            &probe.variables()[0].geom,
            &[0.6, 0.2, 0.2],
            9,
            contiguous,
            None,
        )
        .unwrap();
        let back = insitubatch::SplitManifest::from_json(&m.to_json()).unwrap();
        assert_eq!(back, m, "JSON round trip");
        let ds = InSituDataset::builder(&f.store)
            .variable("r", "raw")
            .manifest(back)
            .batch_size(4)
            .build()
            .unwrap();
        let mut seen = BTreeSet::new();
        for split in ["train", "val", "test"] {
            for a in check_epoch(&ds, split, &[("r", &f, 0)]) {
                assert!(seen.insert(a), "sample {a} in two splits");
            }
        }
        assert_eq!(seen.len(), 61);
        if contiguous {
            let train = &m.splits["train"];
            assert!(train.windows(2).all(|w| w[1] == w[0] + 1), "contiguous run");
        }
    }
    // sample_range snaps out to whole chunks.
    let g = fixture("era5_v3", "t2m");
    let probe = InSituDataset::builder(&g.store)
        .variable("t", "t2m")
        .build()
        .unwrap();
    let m = split_by_chunk(&probe.variables()[0].geom, &[1.0], 0, true, Some((5, 7))).unwrap();
    assert_eq!(m.sample_range, [4, 8]);
    assert_eq!(m.splits["train"], vec![1]);
}

#[test]
fn splits_by_ranges_yield_each_sample_of_their_whole_chunks_once() {
    use insitubatch::{Snap, split_by_ranges};
    // 61 samples in chunks of 1 (raw) and 30 (mask): the manifest's grid is raw's, and the
    // mask's chunks are read under it.
    let f = fixture("paired", "raw");
    let probe = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .build()
        .unwrap();
    let geom = &probe.variables()[0].geom;
    let ranges = [("train", 0..40), ("val", 45..52), ("test", 52..61)];
    let m = split_by_ranges(geom, &ranges, Snap::Exact).unwrap();
    let ds = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .manifest(m)
        .batch_size(4)
        .build()
        .unwrap();
    for (split, r) in ranges {
        let mut got = check_epoch(&ds, split, &[("r", &f, 0)]);
        got.sort_unstable();
        assert_eq!(got, r.collect::<Vec<_>>(), "{split}");
    }
    // `all` runs over the gap between train and val.
    let mut all = check_epoch(&ds, "all", &[("r", &f, 0)]);
    all.sort_unstable();
    assert_eq!(all, (0..61).collect::<Vec<_>>());
    // On a grid of 4 samples per chunk (era5's t2m, 12 samples), inward leaves the cut chunks
    // out and outward takes them in.
    let g = fixture("era5_v3", "t2m");
    let probe = InSituDataset::builder(&g.store)
        .variable("t", "t2m")
        .build()
        .unwrap();
    let geom = &probe.variables()[0].geom;
    let ranges = [("train", 0..6), ("test", 8..12)];
    let inward = split_by_ranges(geom, &ranges, Snap::Inward).unwrap();
    assert_eq!(inward.splits["train"], vec![0]);
    assert_eq!(inward.splits["test"], vec![2]);
    let outward = split_by_ranges(geom, &ranges, Snap::Outward).unwrap();
    assert_eq!(outward.splits["train"], vec![0, 1]);
    assert_eq!(outward.splits["test"], vec![2]);
    let ds = InSituDataset::builder(&g.store)
        .variable("t", "t2m")
        .manifest(outward)
        .build()
        .unwrap();
    let mut train = check_epoch(&ds, "train", &[("t", &g, 0)]);
    train.sort_unstable();
    assert_eq!(train, (0..8).collect::<Vec<_>>());
    let e = split_by_ranges(geom, &ranges, Snap::Exact)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sample 6 falls inside chunk 1 (samples 4..8)"),
        "{e}"
    );
    let e = split_by_ranges(geom, &[("train", 0..6), ("test", 7..12)], Snap::Outward)
        .unwrap_err()
        .to_string();
    assert!(e.contains("would both take chunk 1"), "{e}");
}

#[test]
fn a_sample_stride_draws_every_kth_sample_and_reads_no_chunk_without_one() {
    // raw: 61 samples in chunks of 1; mask: chunks of 30, read under raw's grid; y reads 3
    // samples after each drawn one.
    let raw = fixture("paired", "raw");
    let mask = fixture("paired", "mask");
    let ds = InSituDataset::builder(&raw.store)
        .variable("r", "raw")
        .window("y", "raw", 3)
        .variable("m", "mask")
        .sample_stride(6, 4)
        .batch_size(4)
        .build()
        .unwrap();
    // 4, 10, ..., 52 (58 would read y = 61, off the array).
    let want: Vec<u64> = (4..58).step_by(6).collect();
    assert_eq!(ds.split_samples("train").unwrap(), want.len() as u64);
    for epoch in 0..2 {
        ds.set_epoch(epoch);
        let refs = [("r", &raw, 0), ("y", &raw, 0), ("m", &mask, 0)];
        let got = check_epoch(&ds, "train", &refs);
        assert_eq!(sorted(got), want, "epoch {epoch}");
    }
    let all = check_epoch(&ds, "all", &[("r", &raw, 0), ("m", &mask, 0)]);
    assert_eq!(all, want, "a sequential pass keeps sample order");
    ds.clear_cache();
    let mut pass = ds.train().unwrap();
    for b in pass.by_ref() {
        b.unwrap();
    }
    let s = pass.stats();
    // raw's chunks of the drawn samples and of y's (each 3 later), mask's two chunks: the
    // other 41 chunks of raw are not read.
    assert_eq!(s.tiles_read, 9 + 9 + 2, "{s:?}");
    assert_eq!(
        s.dropped_anchors, 1,
        "58 is on the stride and y would read off the array"
    );
    // Refusals by name, and a split that has no sample on the stride.
    let bad = |every, phase| {
        InSituDataset::builder(&raw.store)
            .variable("r", "raw")
            .sample_stride(every, phase)
            .build()
            .unwrap_err()
            .to_string()
    };
    assert!(bad(0, 0).contains("`sample_stride`"), "{}", bad(0, 0));
    assert!(bad(4, 4).contains("`sample_phase`"), "{}", bad(4, 4));
    let probe = InSituDataset::builder(&mask.store)
        .variable("m", "mask")
        .build()
        .unwrap();
    let one = insitubatch::split_by_ranges(
        &probe.variables()[0].geom,
        &[("val", 0..30)],
        insitubatch::Snap::Exact,
    )
    .unwrap();
    let sparse = InSituDataset::builder(&mask.store)
        .variable("m", "mask")
        .manifest(one)
        .sample_stride(40, 35)
        .build()
        .unwrap();
    let e = sparse.split_samples("val").unwrap_err().to_string();
    assert!(e.contains("sample_stride"), "{e}");
    assert!(
        sparse
            .iter("val")
            .unwrap_err()
            .to_string()
            .contains("sample_stride")
    );
}

fn order_of(threads: usize, io: IoBackendChoice, epoch: u64) -> Vec<u64> {
    let f = fixture("paired", "raw");
    let ds = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .variable("m", "mask")
        .executor_threads(threads)
        .io_backend(io)
        .seed(42)
        .batch_size(7)
        .block_chunks(4)
        .build()
        .unwrap();
    ds.set_epoch(epoch);
    let mut out = Vec::new();
    for b in ds.train().unwrap() {
        out.extend_from_slice(b.unwrap().sample_indices());
    }
    assert_eq!(
        out,
        ds.order("train").unwrap().anchors(),
        "planned == emitted"
    );
    out
}

#[test]
fn order_depends_on_seed_and_epoch_only() {
    let a = order_of(1, IoBackendChoice::Threads, 0);
    let b = order_of(2, IoBackendChoice::Auto, 0);
    let c = order_of(3, IoBackendChoice::Threads, 0);
    assert_eq!(a, b);
    assert_eq!(a, c);
    let d = order_of(2, IoBackendChoice::Auto, 1);
    assert_ne!(a, d, "a new epoch draws a new order");
    assert_eq!(sorted(a), sorted(d));
}

#[test]
fn dropping_an_iterator_mid_epoch_unpins_everything_and_dataset_drop_leaves_no_threads() {
    let f = fixture("paired", "raw");
    let before = threads_named_stable("isb");
    // Through the pool (pinned slots), and decoded into batch rows (batches being filled).
    for mode in [IntoRows::Never, IntoRows::Always] {
        let ds = InSituDataset::builder(&f.store)
            .variable("r", "raw")
            .batch_size(2)
            .block_chunks(4)
            .prefetch_depth(1)
            .executor_threads(2)
            .decode_into_batches(mode)
            .build()
            .unwrap();
        assert!(threads_named("isb") > before);
        // zarrs starts rayon's global pool when it first makes codec options: the store starts
        // it first with one thread of its own name. (Started by zarrs, it was one thread per
        // core, each named after the executor that asked.)
        assert_eq!(threads_named("isb-exec-"), 2, "one per executor");
        assert_eq!(threads_named("zarrs-rayon"), 1);
        let mut pass = ds.train().unwrap();
        pass.next().unwrap().unwrap();
        if mode == IntoRows::Always {
            assert!(pass.stats().tiles_into_batches > 0);
        } else {
            assert!(pass.pinned_slots() > 0);
        }
        drop(pass);
        let st = ds.pool_stats();
        assert_eq!(st.pinned_slots, 0, "{st:?}");
        assert_eq!(st.reserved_bytes, 0);
        // The dataset is reusable after an abandoned pass.
        assert_eq!(ds.train().unwrap().count(), 61usize.div_ceil(2));
    }
    assert_eq!(
        threads_named_settled("isb", before),
        before,
        "runtime threads joined"
    );
}

#[test]
fn a_pass_may_outlive_its_dataset_value() {
    let f = fixture("paired", "raw");
    let ds = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .build()
        .unwrap();
    let pass = ds.train().unwrap();
    drop(ds);
    assert_eq!(pass.map(|b| b.unwrap().len()).sum::<usize>(), 61);
}

/// Runs `pass` to its end; its stats.
/// A store of one variable `t` on an 8 x 16 grid: `samples` samples, `spc` per chunk.
fn t_store(samples: u64, spc: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    common::synth_store(&insitubatch::synth::SynthSpec {
        samples,
        grid: (8, 16),
        sample_chunk: spc,
        variables: vec!["t".into()],
        ..Default::default()
    })
}

fn drained(mut pass: insitubatch::Pass) -> insitubatch::PassStats {
    for b in pass.by_ref() {
        b.unwrap();
    }
    pass.stats()
}

/// Fixtures whose chunks are decoded straight into batch rows. One sample per chunk: zstd
/// decoded in place, then blosc with chunks never written, big-endian zstd and a one-sample
/// shard, which decode into a buffer first. Several: zstd (4 per chunk), blosc with a partial
/// final chunk (3), chunks never written (2) and a shard of 4 samples.
const INTO_ROWS: [(&str, &str); 8] = [
    ("paired", "raw"),
    ("one_per_chunk_v2_blosc", ""),
    ("one_per_chunk_be", ""),
    ("one_per_chunk_sharded", ""),
    ("era5_v3", "t2m"),
    ("v2_blosc_lz4", ""),
    ("v2_fill", ""),
    ("v3_sharded", ""),
];

#[test]
fn chunks_decoded_into_batch_rows_equal_the_pool_path_read_once() {
    for (case, array) in INTO_ROWS {
        let f = fixture(case, array);
        let n = f.shape[0];
        let spc = f.entry["shards"]
            .as_array()
            .map_or(f.entry["chunks"][0].as_u64().unwrap(), |s| {
                s[0].as_u64().unwrap()
            });
        let chunks = n.div_ceil(spc);
        for (shuffle, bs, threads) in [(true, 3, 2), (false, 4, 1), (true, 64, 2)] {
            let build = |mode: IntoRows| {
                InSituDataset::builder(&f.store)
                    .variable("v", array)
                    .batch_size(bs)
                    .block_chunks(2)
                    .shuffle(shuffle)
                    .executor_threads(threads)
                    .decode_into_batches(mode)
                    .build()
                    .unwrap()
            };
            let (rows, pooled) = (build(IntoRows::Always), build(IntoRows::Never));
            // Every sample equals zarr-python's, every anchor once.
            let anchors = check_epoch(&rows, "train", &[("v", &f, 0)]);
            assert_eq!(sorted(anchors), (0..n).collect::<Vec<_>>(), "{case}");
            for ds in [&rows, &pooled] {
                ds.set_epoch(1);
            }
            let got = batch_data(rows.train().unwrap(), &["v"]);
            assert_eq!(
                got,
                batch_data(pooled.train().unwrap(), &["v"]),
                "{case}: the same batches, in the same order"
            );
            let s = drained(rows.train().unwrap());
            // Each stored chunk read and decoded once, into its rows: no slot pinned.
            let want = (chunks, chunks);
            assert_eq!((s.tiles_read, s.tiles_into_batches), want, "{case}: {s:?}");
            assert_eq!((s.cache_misses, s.pinned_peak_bytes), (chunks, 0), "{case}");
            // A fresh pool (the one above kept this small split's chunks).
            let fresh = build(IntoRows::Never);
            fresh.set_epoch(1);
            let p = drained(fresh.train().unwrap());
            assert_eq!((p.tiles_read, p.tiles_into_batches), (chunks, 0), "{case}");
            assert_eq!(
                (p.bytes_read, p.bytes_decoded),
                (s.bytes_read, s.bytes_decoded),
                "{case}"
            );
        }
    }
}

#[test]
fn batches_filled_by_decoders_stay_within_the_memory_need() {
    // 256 samples in batches of 4. The planner issues chunks two blocks ahead of the gather
    // (the read-ahead bound), each taking its rows' batches: with 8 samples per chunk and
    // blocks of 4 chunks a chunk's rows spread over its block's 8 batches, so two blocks hold
    // 16; with one sample per chunk and blocks of 16, two blocks are 32 rows, 8 batches.
    for (spc, block_chunks, ahead) in [(8u64, 4usize, 16u64), (1, 16, 8)] {
        let (_dir, store) = t_store(256, spc);
        let builder = |mode: IntoRows| {
            InSituDataset::builder(&store)
                .variable("t", "t")
                .batch_size(4)
                .block_chunks(block_chunks)
                .prefetch_depth(2)
                .decode_into_batches(mode)
        };
        let build = |mode: IntoRows| builder(mode).build().unwrap();
        let (rows, pooled) = (build(IntoRows::Always), build(IntoRows::Never));
        let (need, pooled_need) = (
            rows.memory_need("train").unwrap(),
            pooled.memory_need("train").unwrap(),
        );
        assert_eq!(need.rows_batches, ahead, "{spc} per chunk: {need:?}");
        assert_eq!(need.batches, pooled_need.batches + ahead);
        assert_eq!(pooled_need.rows_batches, 0);
        // Their rows sit in batch buffers instead of the pool's slots.
        assert_eq!((need.working_set, need.pool), (0, 0), "{need:?}");
        assert!(pooled_need.working_set > 0);
        let mut most = 0;
        for epoch in 0..3 {
            rows.set_epoch(epoch);
            let s = drained(rows.train().unwrap());
            assert_eq!(s.tiles_into_batches, 256 / spc);
            assert_eq!(s.pinned_peak_bytes, 0);
            let held = rows.batch_buffers_allocated() * need.batch_bytes;
            assert!(
                held <= need.batches_bytes(),
                "{spc} per chunk: {held} bytes of batch buffers held at once, {} counted: \
                 {need:?}",
                need.batches_bytes()
            );
            most = most.max(held);
        }
        // The count is not slack: the planner did run ahead into the batches it counts.
        assert!(
            most > pooled_need.batches_bytes(),
            "{spc} per chunk: {most} bytes held, no more than a pass through the pool counts"
        );
        assert_eq!(
            rows.pool_stats().peak_resident_bytes,
            0,
            "no slot was admitted"
        );
        // A limit under the need refuses the pass, saying what fills the batches ahead.
        let tight = builder(IntoRows::Always)
            .memory_limit_bytes(need.total() - 1)
            .build()
            .unwrap();
        let e = tight.train().map(|_| ()).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "and {ahead} filled ahead of the gather by chunks decoded straight into batch rows"
            )) && e.contains("lower prefetch_depth, batch_size, block_chunks or max_inflight"),
            "{e}"
        );
    }
}

#[test]
fn a_pass_decoding_into_rows_reserves_none_of_the_pool_budget() {
    let (_dir, store) = t_store(64, 1);
    let build = |mode: IntoRows| {
        InSituDataset::builder(&store)
            .variable("t", "t")
            .batch_size(4)
            .block_chunks(4)
            .cache_budget_bytes(1)
            .decode_into_batches(mode)
            .build()
            .unwrap()
    };
    // Through the pool a budget of one byte cannot hold the working set.
    let e = build(IntoRows::Never)
        .train()
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("set cache_budget_bytes to at least"), "{e}");
    // Decoded into rows a pass pins nothing: it starts, and so does a second beside it.
    let ds = build(IntoRows::Auto);
    let (train, all) = (ds.train().unwrap(), ds.all().unwrap());
    let mut seen = Vec::new();
    for (t, a) in train.zip(all) {
        seen.extend_from_slice(t.unwrap().sample_indices());
        seen.extend_from_slice(a.unwrap().sample_indices());
    }
    seen.sort_unstable();
    let twice: Vec<u64> = (0..64).flat_map(|i| [i, i]).collect();
    assert_eq!(seen, twice, "every sample once per pass");
    assert_eq!(ds.pool_stats().peak_resident_bytes, 0);
    // A pass that also loads chunks through the pool (`x` and `y` read each chunk of `t`
    // twice; `u` goes to rows) reserves its whole read-ahead bound, as before.
    let (_dir, two) = common::synth_store(&insitubatch::synth::SynthSpec {
        samples: 64,
        grid: (8, 16),
        sample_chunk: 1,
        variables: vec!["t".into(), "u".into()],
        ..Default::default()
    });
    let mixed = |budget: u64| {
        InSituDataset::builder(&two)
            .variable("x", "t")
            .window("y", "t", 1)
            .variable("u", "u")
            .batch_size(4)
            .block_chunks(4)
            .cache_budget_bytes(budget)
            .decode_into_batches(IntoRows::Always)
            .build()
            .unwrap()
    };
    let bound = mixed(1 << 30).train().unwrap().read_ahead_bytes();
    let e = mixed(bound - 1)
        .train()
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("it needs {bound} bytes")), "{e}");
    let ds = mixed(bound);
    let s = drained(ds.train().unwrap());
    assert_eq!((s.tiles_into_batches, s.tiles_read), (63, 63 + 64));
    assert!(ds.memory_need("train").unwrap().working_set < bound);
}

#[test]
fn rows_decoded_in_place_only_where_one_row_reads_the_chunk_and_nothing_keeps_it() {
    let raw = fixture("paired", "raw");
    let mask = fixture("paired", "mask");
    // `x` and `y = shift(1)` read each chunk of raw twice: it stays a slot both copy from.
    let windows = InSituDataset::builder(&raw.store)
        .variable("x", "raw")
        .window("y", "raw", 1)
        .batch_size(5)
        .decode_into_batches(IntoRows::Always)
        .build()
        .unwrap();
    check_epoch(&windows, "train", &[("x", &raw, 0), ("y", &raw, 0)]);
    assert_eq!(drained(windows.train().unwrap()).tiles_into_batches, 0);
    // raw (one sample per chunk) beside mask (30): raw's rows in place, mask copied from slots,
    // into the same batches.
    let paired = InSituDataset::builder(&raw.store)
        .variable("r", "raw")
        .variable("m", "mask")
        .batch_size(4)
        .block_chunks(3)
        .decode_into_batches(IntoRows::Always)
        .build()
        .unwrap();
    check_epoch(&paired, "train", &[("r", &raw, 0), ("m", &mask, 0)]);
    let s = drained(paired.train().unwrap());
    assert_eq!(s.tiles_into_batches, 61, "{s:?}");
    assert_eq!(
        s.tiles_read + s.cache_hits,
        61 + 3,
        "and mask's three chunks through the pool: {s:?}"
    );
    // By default, a budget that keeps more than a quarter of the split for the next epoch
    // keeps the chunks in the pool (here the whole split: later epochs are all hits), the
    // automatic one included; one that keeps less decodes into rows.
    let auto = |b: insitubatch::DatasetBuilder| {
        b.variable("r", "raw")
            .batch_size(2)
            .block_chunks(2)
            .build()
            .unwrap()
    };
    let kept = auto(InSituDataset::builder(&raw.store).cache_budget_bytes(1 << 20));
    assert_eq!(drained(kept.train().unwrap()).tiles_into_batches, 0);
    let later = drained(kept.train().unwrap());
    assert_eq!((later.cache_hits, later.tiles_read), (61, 0));
    let working_set = auto(InSituDataset::builder(&raw.store));
    let pass = working_set.train().unwrap();
    let (read_ahead, split) = (pass.read_ahead_bytes(), 61 * 120);
    let s = drained(pass);
    assert_eq!(
        s.tiles_into_batches > 0,
        read_ahead * 4 <= split,
        "a working set of {read_ahead} of {split} bytes: {s:?}"
    );
    assert!(read_ahead * 4 <= split, "the case this checks");
    let quarter = auto(InSituDataset::builder(&raw.store).cache_budget_bytes(split / 4 + 120));
    assert_eq!(drained(quarter.train().unwrap()).tiles_into_batches, 0);
    let less = auto(InSituDataset::builder(&raw.store).cache_budget_bytes(split / 4));
    assert_eq!(drained(less.train().unwrap()).tiles_into_batches, 61);
    // `Never` and `Always` override it.
    let never = InSituDataset::builder(&raw.store)
        .variable("r", "raw")
        .decode_into_batches(IntoRows::Never)
        .build()
        .unwrap();
    assert_eq!(drained(never.train().unwrap()).tiles_into_batches, 0);
    let always = InSituDataset::builder(&raw.store)
        .variable("r", "raw")
        .cache_budget_bytes(1 << 20)
        .decode_into_batches(IntoRows::Always)
        .build()
        .unwrap();
    assert_eq!(drained(always.train().unwrap()).tiles_into_batches, 61);
    let later = drained(always.train().unwrap());
    assert_eq!((later.cache_hits, later.tiles_into_batches), (0, 61));
}

#[test]
fn a_corrupt_chunk_decoded_into_its_row_raises_naming_it_or_fills_the_row_with_nan() {
    let f = fixture("paired", "raw");
    let dir = corrupt_copy(&f, "raw/c/7/0/0");
    let build = |policy| {
        InSituDataset::builder(dir.path())
            .variable("r", "raw")
            .batch_size(4)
            .on_bad_chunk(policy)
            .decode_into_batches(IntoRows::Always)
            .build()
            .unwrap()
    };
    let err = build(OnBadChunk::Raise)
        .train()
        .unwrap()
        .find_map(|b| b.err())
        .expect("the corrupt chunk must surface as an error");
    assert!(err.to_string().contains("raw/c/7/0/0"), "{err}");
    assert!(matches!(err, EngineError::Store(_)), "{err:?}");
    let ds = build(OnBadChunk::Nan);
    let mut pass = ds.train().unwrap();
    let sb = 5 * 6;
    for b in pass.by_ref() {
        let b = b.unwrap();
        let v = b.array("r").unwrap().values::<f32>().unwrap();
        for (r, &idx) in b.sample_indices().iter().enumerate() {
            let row = &v[r * sb..(r + 1) * sb];
            if idx == 7 {
                assert!(row.iter().all(|x| x.is_nan()), "sample 7 should be NaN");
            } else {
                let want = sample_of(&f.reference, &f.shape, 0, idx, 4);
                let got: Vec<u8> = row.iter().flat_map(|x| x.to_ne_bytes()).collect();
                assert_eq!(got, want, "sample {idx}");
            }
        }
    }
    let s = pass.stats();
    assert_eq!(
        s.tiles_into_batches,
        61 - 1,
        "the bad chunk is not counted decoded"
    );
    assert_eq!(s.bad_chunks.len(), 1);
    assert_eq!(s.bad_chunks[0].key, "raw/c/7/0/0");
}

#[test]
fn corrupt_chunk_raises_naming_the_key_or_becomes_nan_and_is_listed() {
    let f = fixture("v3_zstd", "");
    let dir = corrupt_copy(&f, "c/1/0/0");
    let ds = InSituDataset::builder(dir.path())
        .variable("v", "")
        .batch_size(3)
        .build()
        .unwrap();
    let err = ds
        .all()
        .unwrap()
        .find_map(|b| b.err())
        .expect("the corrupt chunk must surface as an error");
    let msg = err.to_string();
    assert!(msg.contains("c/1/0/0"), "{msg}");
    assert!(matches!(err, EngineError::Store(_)), "{err:?}");

    let ds = InSituDataset::builder(dir.path())
        .variable("v", "")
        .batch_size(3)
        .on_bad_chunk(OnBadChunk::Nan)
        .build()
        .unwrap();
    let mut pass = ds.all().unwrap();
    let item = 8;
    let sb = 4 * 5 * item;
    for b in pass.by_ref() {
        let b = b.unwrap();
        let v = b.array("v").unwrap();
        for (r, idx) in b.sample_indices().iter().enumerate() {
            let got = &v.bytes()[r * sb..(r + 1) * sb];
            if (4..8).contains(idx) {
                let vals: &[f64] = &v.values::<f64>().unwrap()[r * 20..(r + 1) * 20];
                assert!(
                    vals.iter().all(|x| x.is_nan()),
                    "sample {idx} should be NaN"
                );
            } else {
                assert_eq!(got, &sample_of(&f.reference, &f.shape, 0, *idx, item)[..]);
            }
        }
    }
    let s = pass.stats();
    assert_eq!(s.bad_chunks.len(), 1);
    assert_eq!(s.bad_chunks[0].key, "c/1/0/0");
    assert_eq!(s.bad_chunks[0].chunk_index, vec![1, 0, 0]);
}

/// A copy of `f`'s store whose first chunk stalls: until the lease goes, opening it waits, as
/// on a file system that stopped answering. The first batch of a sequential pass needs it.
fn stalled_copy(f: &FixtureArray) -> (tempfile::TempDir, Lease) {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&f.store, dir.path());
    let lease = Lease::take(&dir.path().join("c/0/0/0"));
    (dir, lease)
}

fn in_batches_of_3(store: &std::path::Path) -> InSituDataset {
    InSituDataset::builder(store)
        .variable("v", "")
        .batch_size(3)
        .build()
        .unwrap()
}

#[test]
fn a_bounded_wait_for_a_batch_times_out_while_the_store_stalls_and_loses_nothing() {
    use std::time::Duration;
    let f = fixture("v3_zstd", "");
    let (dir, lease) = stalled_copy(&f);
    let ds = in_batches_of_3(dir.path());
    let mut pass = ds.all().unwrap();
    for _ in 0..3 {
        assert!(
            matches!(pass.next_timeout(Duration::from_millis(20)), Err(TimedOut)),
            "no batch can come while the store stalls"
        );
    }
    assert!(
        pass.stats().consumer_stall_us >= 60_000,
        "the timed-out waits count as stall"
    );
    drop(lease);
    let item = 8;
    let sb = 4 * 5 * item;
    let mut anchors = Vec::new();
    loop {
        let batch = match pass.next_timeout(Duration::from_secs(60)) {
            Ok(None) => break,
            Ok(Some(b)) => b.unwrap(),
            Err(TimedOut) => panic!("no batch within 60 s of the store answering again"),
        };
        let v = batch.array("v").unwrap();
        for (r, idx) in batch.sample_indices().iter().enumerate() {
            assert_eq!(
                &v.bytes()[r * sb..(r + 1) * sb],
                &sample_of(&f.reference, &f.shape, 0, *idx, item)[..],
                "sample {idx}"
            );
        }
        anchors.extend_from_slice(batch.sample_indices());
    }
    assert_eq!(
        anchors,
        (0..f.shape[0]).collect::<Vec<_>>(),
        "every sample once, in order"
    );
    assert!(matches!(
        pass.next_timeout(Duration::from_millis(1)),
        Ok(None)
    ));
}

#[test]
fn stopping_a_pass_does_not_wait_for_a_read_the_store_never_answers() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, mpsc};
    use std::time::Duration;
    let f = fixture("v3_zstd", "");
    let (dir, lease) = stalled_copy(&f);
    // The store answers again when the test says so, or on its own after 20 s: a stop that
    // waited for the stuck read would return only then.
    let (release, released) = mpsc::channel::<()>();
    let gave_up = Arc::new(AtomicBool::new(false));
    let holder = {
        let gave_up = Arc::clone(&gave_up);
        std::thread::spawn(move || {
            if released.recv_timeout(Duration::from_secs(20)).is_err() {
                gave_up.store(true, Ordering::SeqCst);
            }
            drop(lease);
        })
    };
    let ds = in_batches_of_3(dir.path());
    let mut pass = ds.all().unwrap();
    assert!(matches!(
        pass.next_timeout(Duration::from_millis(50)),
        Err(TimedOut)
    ));
    drop(pass);
    assert!(
        !gave_up.load(Ordering::SeqCst),
        "dropping the pass waited for the stalled read"
    );
    assert_eq!(ds.pool_stats().pinned_slots, 0);
    // While it stalls, an epoch that does not need the stalled chunk runs.
    let rest = split_by_chunk(
        &ds.variables()[0].geom,
        &[1.0],
        0,
        true,
        Some((4, f.shape[0])),
    )
    .unwrap();
    let tail = InSituDataset::builder(dir.path())
        .variable("v", "")
        .manifest(rest)
        .batch_size(3)
        .build()
        .unwrap();
    assert!(!check_epoch(&tail, "train", &[("v", &f, 0)]).is_empty());
    // Nor does dropping the dataset wait for it: io_uring cancels the read, and the thread
    // fallback leaves an IO thread stuck in a system call to finish on its own.
    drop(tail);
    drop(ds);
    assert!(
        !gave_up.load(Ordering::SeqCst),
        "dropping the dataset waited for the stalled read"
    );
    release.send(()).unwrap();
    holder.join().unwrap();
    let ds = in_batches_of_3(dir.path());
    let anchors = check_epoch(&ds, "all", &[("v", &f, 0)]);
    assert_eq!(anchors, (0..f.shape[0]).collect::<Vec<_>>());
}

#[test]
fn a_batch_size_beyond_the_split_gives_one_batch_of_the_whole_split() {
    // Batch buffers are sized by the rows a batch can have, not by the knob: a huge batch_size
    // is one batch, not an allocation that aborts the process.
    let f = fixture("v3_zstd", "");
    let ds = InSituDataset::builder(&f.store)
        .variable("v", "")
        .batch_size(usize::MAX)
        .build()
        .unwrap();
    let anchors = check_epoch(&ds, "all", &[("v", &f, 0)]);
    assert_eq!(sorted(anchors), (0..f.shape[0]).collect::<Vec<_>>());
    assert_eq!(ds.all().unwrap().count(), 1);
}

/// A root array of `samples` samples of `width` float32 values, one sample per chunk, no chunk
/// on disk, so every value is `fill` (hand-written metadata: a bad-input case, not
/// conformance).
fn wide_array(dir: &std::path::Path, samples: u64, width: u64, fill: f32) {
    std::fs::write(
        dir.join("zarr.json"),
        format!(
            r#"{{"zarr_format":3,"node_type":"array","shape":[{samples},{width}],
                "data_type":"float32",
                "chunk_grid":{{"name":"regular","configuration":{{"chunk_shape":[1,{width}]}}}},
                "chunk_key_encoding":{{"name":"default","configuration":{{"separator":"/"}}}},
                "fill_value":{fill:?},"codecs":[{{"name":"bytes","configuration":{{"endian":"little"}}}}]}}"#
        ),
    )
    .unwrap();
}

#[test]
fn an_array_too_long_to_plan_in_memory_is_an_error_and_a_sample_range_plans_part_of_it() {
    // 10^11 samples of four values each, no chunk on disk (every read is the fill value).
    let dir = tempfile::tempdir().unwrap();
    wide_array(dir.path(), 100_000_000_000, 4, 2.5);
    let e = InSituDataset::builder(dir.path())
        .build()
        .map(|_| ())
        .expect_err("planning 10^11 chunks cannot fit")
        .to_string();
    assert!(
        e.contains("`sample_range`")
            && ["more than this machine's", "cgroup", "ulimit -v"]
                .iter()
                .any(|m| e.contains(m)),
        "{e}"
    );
    let geoms = insitubatch::geometries(dir.path(), None, 0).unwrap();
    let geom = geoms.values().next().expect("the array");
    let part = split_by_chunk(geom, &[1.0], 0, true, Some((1000, 1100))).unwrap();
    let ds = InSituDataset::builder(dir.path())
        .manifest(part)
        .batch_size(16)
        .build()
        .unwrap();
    let mut seen = Vec::new();
    for b in ds.train().unwrap() {
        let b = b.unwrap();
        for (_, a) in b.arrays() {
            assert!(a.values::<f32>().unwrap().iter().all(|&v| v == 2.5));
        }
        seen.extend_from_slice(b.sample_indices());
    }
    assert_eq!(sorted(seen), (1000..1100).collect::<Vec<_>>());
}

#[test]
fn an_array_at_the_store_root_is_named_slash_and_an_empty_one_is_refused_by_name() {
    // A store that is itself an array has the empty path; messages call it `/`.
    let dir = tempfile::tempdir().unwrap();
    wide_array(dir.path(), 8, 4, 0.0);
    let geoms = insitubatch::geometries(dir.path(), None, 0).unwrap();
    let geom = geoms.values().next().expect("the array");
    let e = split_by_chunk(geom, &[1.0], 0, true, Some((4, 99)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("the length of `/` along axis 0"), "{e}");
    let other = tempfile::tempdir().unwrap();
    wide_array(other.path(), 6, 4, 0.0);
    let foreign = insitubatch::geometries(other.path(), None, 0).unwrap();
    let m = split_by_chunk(foreign.values().next().unwrap(), &[1.0], 0, true, None).unwrap();
    let e = InSituDataset::builder(dir.path())
        .manifest(m)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("made for array `/` (shape [6, 4]")
            && e.contains("used with array `/` (shape [8, 4]"),
        "{e}"
    );
    // Length 0 along the sample axis: nothing to split or load, said as such (it used to be
    // reported as a bad `sample_range` the caller never gave).
    let empty = tempfile::tempdir().unwrap();
    wide_array(empty.path(), 0, 4, 0.0);
    let e = InSituDataset::builder(empty.path()).build().unwrap_err();
    assert!(matches!(e, EngineError::NoSamples { axis: 0, .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("array `/` has no samples")
            && e.contains("[0, 4]")
            && !e.contains("sample_range"),
        "{e}"
    );
}

#[test]
fn a_pass_whose_working_set_exceeds_the_machine_is_refused_naming_what_to_change() {
    let total: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap()
        * 1024;
    let dir = tempfile::tempdir().unwrap();
    // Chunks of a quarter of the memory: 16 of them per block cannot be held.
    wide_array(dir.path(), 64, total / 4 / 4, 0.0);
    let ds = InSituDataset::builder(dir.path()).build().unwrap();
    let e = ds
        .all()
        .map(|_| ())
        .expect_err("64 quarters of memory")
        .to_string();
    assert!(
        e.contains("`block_chunks` = 16") && e.contains("lower block_chunks"),
        "{e}"
    );
    // One chunk larger than the memory: no knob helps.
    let dir = tempfile::tempdir().unwrap();
    wide_array(dir.path(), 4, total / 4 * 2, 0.0);
    let ds = InSituDataset::builder(dir.path())
        .block_chunks(1)
        .build()
        .unwrap();
    let e = ds
        .all()
        .map(|_| ())
        .expect_err("a chunk over memory")
        .to_string();
    assert!(e.contains("re-chunk that array smaller"), "{e}");
    // Batches the gather may run ahead with count too: samples of a 1024th of the memory, 64 per
    // batch, 1000 batches of prefetch in a 10,000-batch epoch.
    let dir = tempfile::tempdir().unwrap();
    wide_array(dir.path(), 640_000, total / 1024 / 4, 0.0);
    let ds = InSituDataset::builder(dir.path())
        .batch_size(64)
        .block_chunks(1)
        .prefetch_depth(1000)
        .build()
        .unwrap();
    let e = ds
        .all()
        .map(|_| ())
        .expect_err("1002 batches of memory")
        .to_string();
    let need = ds.memory_need("all").unwrap();
    assert!(
        e.contains("`prefetch_depth` = 1000")
            && e.contains("lower prefetch_depth, batch_size or max_inflight")
            && e.contains(&format!("comes to {} bytes", need.total())),
        "the refusal states the need the query gives, {need}: {e}"
    );
    assert!(
        !insitubatch::memory_need_json(&need)["fits"]
            .as_bool()
            .unwrap()
    );
    // The same with the default depth of 2: four batches fit.
    let ds = InSituDataset::builder(dir.path())
        .batch_size(2)
        .block_chunks(1)
        .build()
        .unwrap();
    assert!(ds.all().is_ok());
    let need = insitubatch::memory_need_json(&ds.memory_need("all").unwrap());
    assert_eq!(need["fits"], true, "{need}");
}

#[test]
fn the_memory_need_counts_what_a_pass_holds_and_is_the_figure_its_start_checks() {
    // 64 samples of 256 KiB, one per chunk, no chunk on disk.
    let chunk = 256u64 << 10;
    let dir = tempfile::tempdir().unwrap();
    wide_array(dir.path(), 64, chunk / 4, 0.0);
    let build = |b: insitubatch::DatasetBuilder| {
        b.batch_size(5)
            .block_chunks(4)
            .prefetch_depth(3)
            .max_inflight(6)
            .executor_threads(2)
            .build()
            .unwrap()
    };
    // Through the pool, then with chunks decoded into batch rows (the default here).
    let pooled = build(InSituDataset::builder(dir.path()).decode_into_batches(IntoRows::Never));
    let pooled = pooled.memory_need("train").unwrap();
    assert_eq!(
        pooled.batches,
        3 + 2,
        "prefetch_depth + the one filled + the one held"
    );
    let ds = build(InSituDataset::builder(dir.path()));
    let need = ds.memory_need("train").unwrap();
    let pass = ds.train().unwrap();
    assert_eq!(pooled.working_set, pass.read_ahead_bytes());
    assert_eq!(
        (pooled.pool, pooled.cache_budget),
        (pooled.working_set, None)
    );
    // Decoded into rows, no chunk is pinned in the pool: the rows the read-ahead reaches sit
    // in batch buffers instead.
    assert_eq!(
        (need.working_set, need.pool, need.cache_budget),
        (0, 0, None)
    );
    assert_eq!(need.batch_bytes, 5 * chunk, "five rows of one label");
    assert_eq!(
        (need.batches, need.rows_batches),
        (3 + 2 + 4, 4),
        "and the batches of rows 4b..4b+12, which the planner may issue ahead of the gather \
         (the read-ahead bound: a batch of 5 spans two blocks of 4, then the next block), and \
         which at most four batches of 5 span"
    );
    assert_eq!(
        need.reads,
        (6 + 2) * chunk,
        "max_inflight + one per executor"
    );
    let sized = 9 * need.batch_bytes + need.reads;
    assert_eq!(need.overhead(), (16 << 20) + sized / 8);
    assert_eq!(need.total(), sized + need.overhead());
    assert_eq!(need.without_cache(), need.total());
    let rows: usize = pass.map(|b| b.unwrap().len()).sum();
    assert_eq!(rows, 64);
    assert!(ds.pool_stats().peak_resident_bytes <= need.pool);

    // An epoch of one batch holds one.
    let one = InSituDataset::builder(dir.path())
        .batch_size(1000)
        .build()
        .unwrap();
    let n = one.memory_need("all").unwrap();
    assert_eq!((n.batches, n.batch_bytes), (1, 64 * chunk));

    // A cache directory's slot files being written count with the reads: of 256 KiB slots, 16
    // at once for an ephemeral spill and a persisted cache alike, each its slot's bytes and an
    // O_DIRECT copy of the 4 KiB header and the slot.
    for (persist, writes) in [(false, 16), (true, 16)] {
        let cache = tempfile::tempdir().unwrap();
        let cached = build(
            InSituDataset::builder(dir.path())
                .decode_into_batches(IntoRows::Never)
                .cache_dir(cache.path())
                .persist(persist),
        );
        let n = cached.memory_need("train").unwrap();
        assert_eq!(n.reads, pooled.reads + writes * (chunk + 4096 + chunk));
        assert_eq!(n.total() - pooled.total(), (n.reads - pooled.reads) * 9 / 8);
    }

    // A heap budget above the working set: the pool may keep it, or every chunk if fewer.
    // A budget that holds the whole split keeps its chunks for the next epoch, so none is
    // decoded into a batch row; one that holds under a quarter of it does not.
    // A pass decoding into rows puts nothing in it, whatever the budget.
    for (budget, held, into_rows) in [(7 << 19, 0, true), (1 << 30, 64 * chunk, false)] {
        let ds = build(InSituDataset::builder(dir.path()).cache_budget_bytes(budget));
        let n = ds.memory_need("train").unwrap();
        let without = if into_rows { &need } else { &pooled };
        assert_eq!(n.working_set, without.working_set, "{budget}");
        assert_eq!(n.without_cache(), without.total(), "{budget}");
        if into_rows {
            assert_eq!((n.pool, n.cache_budget), (0, None), "{budget}");
            assert_eq!(n.total(), need.total());
        } else {
            assert_eq!((n.pool, n.cache_budget), (held, Some(budget)), "{budget}");
            assert!(n.total() > n.without_cache());
        }
    }
    // What the pool holds already stays beside a pass: with a budget of 3 MiB (12 chunks, a
    // working set), val (16 chunks) goes through the pool and leaves its last chunks unpinned
    // there, train (48) is decoded into rows, and its need counts them.
    let geom = ds.variables()[0].geom.clone();
    let manifest = split_by_chunk(&geom, &[0.75, 0.25], 0, true, None).unwrap();
    let ds = build(
        InSituDataset::builder(dir.path())
            .manifest(manifest)
            .cache_budget_bytes(3 << 20),
    );
    assert_eq!(ds.memory_need("train").unwrap().pool, 0);
    let s = drained(ds.val().unwrap());
    assert_eq!(s.tiles_into_batches, 0, "val goes through the pool");
    let left = ds.pool_stats().resident_bytes;
    assert_eq!(left, 3 << 20, "val's last 12 chunks");
    let after = ds.memory_need("train").unwrap();
    assert_eq!((after.working_set, after.pool), (0, left));
    assert_eq!(drained(ds.train().unwrap()).tiles_into_batches, 48);
    // Slots in cache files are the page cache's.
    let cache = tempfile::tempdir().unwrap();
    let ds = build(
        InSituDataset::builder(dir.path())
            .cache_budget_bytes(1 << 30)
            .cache_dir(cache.path()),
    );
    assert_eq!(ds.memory_need("train").unwrap().pool, pooled.working_set);
    // A split the pass would refuse, refused alike.
    let e = ds.memory_need("nope").unwrap_err().to_string();
    assert_eq!(e, ds.iter("nope").map(|_| ()).unwrap_err().to_string());
}

#[test]
fn the_memory_need_counts_the_iterations_already_running_beside_it() {
    // 64 samples of 256 KiB, one per chunk, no chunk on disk.
    let chunk = 256u64 << 10;
    let dir = tempfile::tempdir().unwrap();
    wide_array(dir.path(), 64, chunk / 4, 0.0);
    let geom = InSituDataset::builder(dir.path())
        .build()
        .unwrap()
        .variables()[0]
        .geom
        .clone();
    let halves = split_by_chunk(&geom, &[0.5, 0.25, 0.25], 0, true, None).unwrap();
    let build = |b: insitubatch::DatasetBuilder| {
        b.batch_size(4)
            .block_chunks(2)
            .manifest(halves.clone())
            .build()
            .unwrap()
    };
    // A budget holding train's and val's working sets: the pool is counted once, train's
    // batches are what it adds.
    let ds = build(InSituDataset::builder(dir.path()).cache_budget_bytes(64 * chunk));
    let alone = ds.memory_need("val").unwrap();
    assert_eq!((alone.others, alone.other_passes), (0, 0));
    let train_need = ds.memory_need("train").unwrap();
    let mut train = ds.train().unwrap();
    assert!(train.next().unwrap().is_ok());
    let val = ds.memory_need("val").unwrap();
    assert_eq!(val.other_passes, 1);
    assert_eq!(val.others, train_need.batches_bytes());
    assert_eq!(val.alone(), alone.total());
    let sized = val.pool + val.batches_bytes() + val.reads + val.others;
    assert_eq!(val.overhead(), (16 << 20) + sized / 8);
    assert_eq!(val.total(), sized + val.overhead());
    let json = insitubatch::memory_need_json(&val);
    assert_eq!(
        (json["others_bytes"].as_u64(), json["other_passes"].as_u64()),
        (Some(val.others), Some(1))
    );
    assert_eq!(json["total_bytes"].as_u64(), Some(val.total()));
    // Zipped, both run to the end.
    let rows: usize = train
        .zip(ds.val().unwrap())
        .map(|(t, v)| t.unwrap().len() + v.unwrap().len())
        .sum();
    assert!(rows > 0);
    assert_eq!(ds.memory_need("val").unwrap().others, 0, "the passes left");

    // With the automatic budget the pool holds the working sets together.
    // (Its train pass decodes one-sample chunks into batch rows: no chunk is pinned in the
    // pool, and the two batches of the rows its planner may issue ahead of the gather, three
    // blocks of 2, are counted beside the ones above, whose budget keeps its chunks.)
    let auto = build(InSituDataset::builder(dir.path()));
    let auto_train_need = auto.memory_need("train").unwrap();
    assert_eq!(auto_train_need.batches, train_need.batches + 2);
    assert_eq!(auto_train_need.working_set, 0);
    let train = auto.train().unwrap();
    let val = auto.memory_need("val").unwrap();
    assert_eq!(
        val.others,
        auto_train_need.working_set + auto_train_need.batches_bytes()
    );
    drop(train);
    // A pass of another dataset holds its pool, batches and reads.
    let other = auto.all().unwrap();
    let other_need = {
        let d = build(InSituDataset::builder(dir.path()));
        d.memory_need("all").unwrap()
    };
    let need = ds.memory_need("val").unwrap();
    assert_eq!(
        need.others,
        other_need.pool + other_need.batches_bytes() + other_need.reads
    );
    drop(other);
    assert_eq!(ds.memory_need("val").unwrap().other_passes, 0);
}

#[test]
fn memory_limit_bytes_caps_what_a_dataset_may_hold_and_is_named() {
    use insitubatch::{MemoryLimit, MemorySource};
    // 64 samples of 1 MiB, one per chunk, no chunk on disk.
    let chunk = 1u64 << 20;
    let dir = tempfile::tempdir().unwrap();
    wide_array(dir.path(), 64, chunk / 4, 0.0);
    let limit = 64u64 << 20;
    let builder = || {
        InSituDataset::builder(dir.path())
            .batch_size(4)
            .max_inflight(4)
            .executor_threads(2)
    };
    let given = Some(MemoryLimit {
        bytes: limit,
        source: MemorySource::Given,
    });
    // Two blocks of 16 MiB, four batches of 4 MiB and six reads, with the library's slack,
    // come to ~77 MiB: more than the 64 MiB given, though far less than the machine.
    let big = builder().memory_limit_bytes(limit).build().unwrap();
    let need = big.memory_need("all").unwrap();
    assert_eq!(need.limit, given);
    assert!(!need.fits(), "{need}");
    let json = insitubatch::memory_need_json(&need);
    assert_eq!(
        (json["limit_source"].as_str(), json["limit_bytes"].as_u64()),
        (Some("memory_limit_bytes"), Some(limit))
    );
    let e = big.all().map(|_| ()).unwrap_err().to_string();
    assert!(
        e.contains("`prefetch_depth`")
            && e.contains(&format!(
                "more than the {limit} bytes of memory_limit_bytes"
            )),
        "{e}"
    );
    // Blocks of two chunks fit, and run.
    let small = builder()
        .block_chunks(2)
        .memory_limit_bytes(limit)
        .build()
        .unwrap();
    assert!(small.memory_need("all").unwrap().fits());
    let rows: usize = small.all().unwrap().map(|b| b.unwrap().len()).sum();
    assert_eq!(rows, 64);
    // Above the process's own limit, the process's binds; 0 is refused by name.
    let above = builder().memory_limit_bytes(u64::MAX).build().unwrap();
    assert_eq!(
        above.memory_need("all").unwrap().limit,
        insitubatch::memory_limit()
    );
    let e = builder()
        .memory_limit_bytes(0)
        .build()
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("`memory_limit_bytes` = 0"), "{e}");
}

#[test]
fn a_forked_child_counts_none_of_its_parents_passes_even_if_forked_mid_update() {
    use insitubatch::actors::planner::RunningPasses;
    let chunk = 256u64 << 10;
    let dir = tempfile::tempdir().unwrap();
    wide_array(dir.path(), 64, chunk / 4, 0.0);
    let ds = InSituDataset::builder(dir.path()).build().unwrap();
    let _running = ds.all().unwrap();
    let count = || RunningPasses::count_beside(Default::default(), 0).other_passes;
    assert_eq!(count(), 1);
    // Another thread holds the list while this one forks (a fork-started worker, say): the
    // child has no such thread, and must neither wait for it nor count the parent's pass.
    let (held, hold) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
    let holder = std::thread::spawn(move || {
        RunningPasses::while_locked(|| {
            held.0.send(()).unwrap();
            hold.1.recv().unwrap();
        })
    });
    held.1.recv().unwrap();
    // SAFETY: the child counts (a lock word, a list it replaces) and exits with `_exit`.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        let code = if count() == 0 { 0 } else { 1 };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // SAFETY: waitpid on our own child, WNOHANG.
    while unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == 0 {
        if std::time::Instant::now() > deadline {
            // SAFETY: kill and reap our own child.
            unsafe {
                libc::kill(child, libc::SIGKILL);
                libc::waitpid(child, &mut status, 0);
            }
            panic!("the child still waits for a lock its parent's thread held at the fork");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    hold.0.send(()).unwrap();
    holder.join().unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child counted its parent's pass (status {status})"
    );
    assert_eq!(count(), 1, "the parent still counts its own");
}

#[test]
fn a_pass_that_fits_alone_but_not_beside_a_running_one_is_refused_naming_it() {
    let limit = insitubatch::memory_limit().unwrap().bytes;
    // Chunks of 1 MiB, no chunk on disk, as many as half the limit; each dataset's budget
    // may keep them all, so either pass fits alone and the two do not fit together.
    let chunk = 1u64 << 20;
    let dir = tempfile::tempdir().unwrap();
    wide_array(dir.path(), limit / 2 / chunk, chunk / 4, 0.0);
    let build = || {
        InSituDataset::builder(dir.path())
            .block_chunks(1)
            .cache_budget_bytes(limit / 2)
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let alone = b.memory_need("all").unwrap();
    assert!(alone.fits(), "{alone}");
    let running = a.all().unwrap();
    let beside = b.memory_need("all").unwrap();
    assert!(!beside.fits(), "{beside}");
    let e = b
        .all()
        .map(|_| ())
        .expect_err("two halves of memory and more")
        .to_string();
    assert!(
        e.contains("`split` = all")
            && e.contains(&format!(
                "{} bytes more are held beside it by the iteration already running in this \
                 process (all#0): {} bytes in all",
                beside.others,
                beside.total()
            ))
            && e.contains("finish or drop those first"),
        "{e}"
    );
    drop(running);
    // It left: the same pass now starts.
    assert!(b.all().is_ok());
}

#[test]
fn a_panicking_decoder_reaches_the_consumer_as_an_error() {
    let f = fixture("paired", "raw");
    // Decoding into a slot, and into a batch row.
    for mode in [IntoRows::Never, IntoRows::Always] {
        let ds = InSituDataset::builder(&f.store)
            .variable("r", "raw")
            .panic_on_tile(5)
            .decode_into_batches(mode)
            .build()
            .unwrap();
        let results: Vec<_> = ds.train().unwrap().collect();
        let err = results
            .iter()
            .find_map(|r| r.as_ref().err())
            .expect("the panic must reach the consumer");
        assert!(err.to_string().contains("panicked"), "{mode:?}: {err}");
        // Nothing is pinned.
        assert_eq!(ds.pool_stats().pinned_slots, 0);
    }
}

#[test]
fn train_and_val_iterate_together_when_the_budget_holds_both() {
    let f = fixture("paired", "raw");
    let m = fixture("paired", "mask");
    let probe = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .build()
        .unwrap();
    let manifest = split_by_chunk(&probe.variables()[0].geom, &[0.5, 0.5], 0, true, None).unwrap();
    // Automatic budget: sized to one iteration, so a second concurrent one is refused.
    let build = |mode: IntoRows| {
        InSituDataset::builder(&f.store)
            .variable("r", "raw")
            .manifest(manifest.clone())
            .batch_size(4)
            .block_chunks(2)
            .decode_into_batches(mode)
            .build()
            .unwrap()
    };
    let ds = build(IntoRows::Never);
    let train = ds.train().unwrap();
    let err = ds.val().unwrap_err().to_string();
    assert!(err.contains("cache_budget_bytes to at least"), "{err}");
    assert!(
        err.contains("already reserved by train#"),
        "names the holder: {err}"
    );
    drop(train);
    // Unless they decode their chunks into batch rows: they pin nothing and reserve nothing.
    let ds = build(IntoRows::Always);
    let train = ds.train().unwrap();
    let val = ds.val().unwrap();
    let n: usize = train
        .zip(val)
        .map(|(t, v)| t.unwrap().len() + v.unwrap().len())
        .sum();
    assert!(n > 0);
    let ds = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .variable("m", "mask")
        .manifest(manifest)
        .batch_size(4)
        .block_chunks(2)
        .cache_budget_bytes(1 << 20)
        .build()
        .unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (t, v) in ds.train().unwrap().zip(ds.val().unwrap()) {
        let (t, v) = (t.unwrap(), v.unwrap());
        for (batch, out) in [(&t, &mut a), (&v, &mut b)] {
            for (r, idx) in batch.sample_indices().iter().enumerate() {
                let sb = 5 * 6 * 4;
                let want = sample_of(&f.reference, &f.shape, 0, *idx, 4);
                assert_eq!(
                    &batch.array("r").unwrap().bytes()[r * sb..(r + 1) * sb],
                    &want[..]
                );
                let mb = 5 * 6;
                let want = sample_of(&m.reference, &m.shape, 0, *idx, 1);
                assert_eq!(
                    &batch.array("m").unwrap().bytes()[r * mb..(r + 1) * mb],
                    &want[..]
                );
                out.push(*idx);
            }
        }
    }
    assert!(a.len() >= 28 && b.len() >= 28);
    assert!(a.iter().all(|x| !b.contains(x)));
}

/// A pass's batches as plain data: sample indices and each label's bytes (the batch itself
/// goes back to the pool).
fn batch_data(pass: insitubatch::Pass, labels: &[&str]) -> Vec<(Vec<u64>, Vec<Vec<u8>>)> {
    pass.map(|b| {
        let b = b.unwrap();
        let arrays = labels
            .iter()
            .map(|l| b.array(l).unwrap().bytes().to_vec())
            .collect();
        (b.sample_indices().to_vec(), arrays)
    })
    .collect()
}

#[test]
fn drop_last_yields_only_full_batches_the_first_ones_of_the_whole_epoch() {
    // 12 samples of t2m (and a window y = t + 1: 11 anchors), batches of 4: 3 batches, the
    // last of 3 rows, which drop_last leaves out.
    let f = fixture("era5_v3", "t2m");
    let build = |drop_last: bool, bs: usize| {
        InSituDataset::builder(&f.store)
            .variable("x", "t2m")
            .window("y", "t2m", 1)
            .batch_size(bs)
            .block_chunks(1)
            .drop_last(drop_last)
            .build()
            .unwrap()
    };
    let (whole_ds, ds) = (build(false, 4), build(true, 4));
    assert_eq!(whole_ds.split_batches("train").unwrap(), 3);
    assert_eq!(ds.split_batches("train").unwrap(), 2);
    assert_eq!(ds.split_samples("train").unwrap(), 8);
    for epoch in [0, 1, 2] {
        whole_ds.set_epoch(epoch);
        ds.set_epoch(epoch);
        for split in ["train", "all"] {
            let whole = batch_data(whole_ds.iter(split).unwrap(), &["x", "y"]);
            let pass = ds.iter(split).unwrap();
            let s = pass.stats();
            let kept = batch_data(pass, &["x", "y"]);
            assert_eq!(kept.len(), 2);
            assert!(kept.iter().all(|(i, _)| i.len() == 4), "every batch full");
            assert_eq!(
                kept,
                whole[..2],
                "epoch {epoch} {split}: the whole epoch's first batches"
            );
            assert_eq!(s.batches_total, 2);
        }
        // Resuming counts the batches of the epoch drop_last yields.
        let kept = batch_data(ds.train().unwrap(), &["x"]);
        assert_eq!(
            batch_data(ds.iter_from("train", 1).unwrap(), &["x"]),
            kept[1..]
        );
        assert!(ds.iter_from("train", 3).is_err());
    }
    // Ranks evened out, then whole batches: both ranks take the same full steps.
    let ranks: Vec<Vec<usize>> = (0..2)
        .map(|r| {
            let ds = InSituDataset::builder(&f.store)
                .variable("x", "t2m")
                .batch_size(4)
                .block_chunks(1)
                .shard(r, 2)
                .drop_last(true)
                .build()
                .unwrap();
            ds.train().unwrap().map(|b| b.unwrap().len()).collect()
        })
        .collect();
    assert_eq!(ranks[0], ranks[1]);
    assert!(
        !ranks[0].is_empty() && ranks[0].iter().all(|&n| n == 4),
        "{ranks:?}"
    );
    // A split smaller than one batch leaves nothing: named, with what to change.
    let e = build(true, 12)
        .iter("train")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`drop_last`") && e.contains("11 samples, fewer than batch_size 12"),
        "{e}"
    );
}

#[test]
fn drop_last_for_named_splits_leaves_the_others_whole() {
    // 12 samples in 3 chunks of 4, split 0.5 / 0.5 (train 2 chunks, val 1), batches of 3: train drops
    // its short last batch, val keeps its own, and so does all.
    let f = fixture("era5_v3", "t2m");
    let g = insitubatch::geometries(&f.store, None, 0).unwrap()["t2m"].clone();
    let manifest = insitubatch::split_by_chunk(&g, &[0.5, 0.5], 0, true, None).unwrap();
    let build = |b: insitubatch::DatasetBuilder| {
        b.variable("x", "t2m")
            .manifest(manifest.clone())
            .batch_size(3)
            .block_chunks(1)
            .build()
    };
    let ds = build(InSituDataset::builder(&f.store).drop_last_splits(&["train"])).unwrap();
    let whole = build(InSituDataset::builder(&f.store)).unwrap();
    for split in ["train", "val", "all"] {
        let sizes: Vec<usize> = ds.iter(split).unwrap().map(|b| b.unwrap().len()).collect();
        let full: Vec<usize> = whole
            .iter(split)
            .unwrap()
            .map(|b| b.unwrap().len())
            .collect();
        if split == "train" {
            assert_eq!(sizes, vec![3, 3], "train drops its short batch");
            assert_eq!(ds.split_batches(split).unwrap(), 2);
        } else {
            assert_eq!(sizes, full, "{split} keeps every sample");
            assert_eq!(
                sizes.iter().sum::<usize>() as u64,
                whole.split_samples(split).unwrap()
            );
            assert_eq!(ds.split_batches(split).unwrap(), full.len() as u64);
        }
        if split != "all" {
            assert!(
                full.last().is_some_and(|&n| n < 3),
                "{split} has a short batch: {full:?}"
            );
        }
    }
    // A name that is not a split is refused at build, naming the argument.
    let e = build(InSituDataset::builder(&f.store).drop_last_splits(&["training"]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`drop_last`") && e.contains("training"), "{e}");
}

#[test]
fn a_pass_resumed_at_a_batch_yields_the_rest_of_the_epoch_and_reads_only_its_chunks() {
    // Shuffled, with a window, blocks of two chunks and a short last batch.
    let f = fixture("era5_v3", "t2m");
    let ds = InSituDataset::builder(&f.store)
        .variable("x", "t2m")
        .window("y", "t2m", 2)
        .batch_size(3)
        .block_chunks(2)
        .build()
        .unwrap();
    let n = ds.split_batches("train").unwrap();
    assert!(n >= 3 && !ds.split_samples("train").unwrap().is_multiple_of(3));
    for epoch in [0, 1] {
        ds.set_epoch(epoch);
        let whole = batch_data(ds.train().unwrap(), &["x", "y"]);
        assert_eq!(whole.len() as u64, n);
        for k in 0..=n {
            let pass = ds.iter_from("train", k).unwrap();
            let s = pass.stats();
            assert_eq!((s.start_batch, s.batches_total), (k, n - k));
            let rest = batch_data(pass, &["x", "y"]);
            assert_eq!(
                rest,
                whole[k as usize..],
                "epoch {epoch}, resumed at batch {k}"
            );
            // Each batch knows its epoch and its place in the whole epoch, so a checkpoint of
            // (epoch, index + 1) resumes right after it.
            let positions: Vec<(u64, usize)> = ds
                .iter_from("train", k)
                .unwrap()
                .map(|b| b.map(|b| (b.epoch(), b.index())).unwrap())
                .collect();
            let want: Vec<(u64, usize)> = (k..n).map(|i| (epoch, i as usize)).collect();
            assert_eq!(positions, want, "epoch {epoch}, resumed at batch {k}");
        }
    }
    let e = ds
        .iter_from("train", n + 1)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("`start_batch` = {}", n + 1))
            && e.contains(&format!("has {n} batches of 3 (0 to {})", n - 1)),
        "{e}"
    );
    // A rank of two resumes within its own share.
    let rank = InSituDataset::builder(&f.store)
        .variable("x", "t2m")
        .batch_size(2)
        .block_chunks(1)
        .shard(1, 2)
        .build()
        .unwrap();
    rank.set_epoch(5);
    let whole = batch_data(rank.train().unwrap(), &["x"]);
    assert!(whole.len() >= 2);
    let rest = batch_data(rank.iter_from("train", 1).unwrap(), &["x"]);
    assert_eq!(rest, whole[1..]);
    // One sample per chunk: a resumed pass reads the chunks of the batches it yields only.
    let f = fixture("paired", "raw");
    let ds = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .batch_size(4)
        .block_chunks(4)
        .build()
        .unwrap();
    let (rows, n) = (
        ds.split_samples("train").unwrap(),
        ds.split_batches("train").unwrap(),
    );
    for k in [1, n / 2, n - 1, n] {
        ds.clear_cache();
        let mut pass = ds.iter_from("train", k).unwrap();
        let got: u64 = pass.by_ref().map(|b| b.unwrap().len() as u64).sum();
        assert_eq!(got, rows - (4 * k).min(rows), "resumed at {k}");
        let s = pass.stats();
        assert_eq!(s.tiles_read, got, "resumed at {k}: {s:?}");
        assert_eq!(s.batches, n - k);
    }
}

/// The distinct chunks of each block of `order`, in block order.
fn block_chunks_of(order: &insitubatch::EpochOrder) -> Vec<BTreeSet<u64>> {
    order
        .blocks
        .iter()
        .map(|b| order.rows[b.clone()].iter().map(|r| r.chunk).collect())
        .collect()
}

#[test]
fn fast_first_batch_ramps_the_blocks_up_from_one_batch_and_keeps_every_contract() {
    // zarr-python's values with a window: 12 samples in chunks of 4, batches of 3, blocks of 3
    // chunks: the first block is the one chunk that holds a batch, the next the other two.
    let f = fixture("era5_v3", "t2m");
    let ds = InSituDataset::builder(&f.store)
        .variable("x", "t2m")
        .window("y", "t2m", 2)
        .batch_size(3)
        .block_chunks(3)
        .fast_first_batch(true)
        .build()
        .unwrap();
    for epoch in 0..3 {
        ds.set_epoch(epoch);
        let anchors = check_epoch(&ds, "train", &[("x", &f, 0), ("y", &f, 0)]);
        assert_eq!(sorted(anchors), (0..10).collect::<Vec<_>>());
        let sizes: Vec<usize> = block_chunks_of(&ds.order("train").unwrap())
            .iter()
            .map(BTreeSet::len)
            .collect();
        assert_eq!(sizes, [1, 2], "epoch {epoch}");
    }

    // 317 samples in 40 chunks of 8 (the last short), batches of 12, blocks of 16: blocks of
    // 2, 4, 8 and 16 chunks, then the 10 left.
    let (_dir, store) = t_store(317, 8);
    let build = |fast: bool, mode: IntoRows| {
        InSituDataset::builder(&store)
            .variable("t", "t")
            .batch_size(12)
            .block_chunks(16)
            .fast_first_batch(fast)
            .decode_into_batches(mode)
            .build()
            .unwrap()
    };
    let (plain, fast, fast_rows) = (
        build(false, IntoRows::Never),
        build(true, IntoRows::Never),
        build(true, IntoRows::Always),
    );
    let need = fast_rows.memory_need("train").unwrap();
    assert!(need.rows_batches > 0, "{need:?}");
    for epoch in 0..3 {
        for ds in [&plain, &fast, &fast_rows] {
            ds.set_epoch(epoch);
        }
        let (p, q) = (
            block_chunks_of(&plain.order("train").unwrap()),
            block_chunks_of(&fast.order("train").unwrap()),
        );
        let sizes = |b: &[BTreeSet<u64>]| b.iter().map(BTreeSet::len).collect::<Vec<_>>();
        assert_eq!(sizes(&p), [16, 16, 8]);
        assert_eq!(sizes(&q), [2, 4, 8, 16, 10], "epoch {epoch}");
        // The same chunk permutation, cut differently: the ramp's first three blocks are 14 of
        // the plain first block's 16 chunks.
        let head: BTreeSet<u64> = q[..3].iter().flatten().copied().collect();
        assert!(head.is_subset(&p[0]), "epoch {epoch}: {q:?} against {p:?}");
        // The first batch draws from the two chunks of the first block alone.
        let whole = batch_data(fast.train().unwrap(), &["t"]);
        let chunks_of = |idx: &[u64]| idx.iter().map(|a| a / 8).collect::<BTreeSet<u64>>();
        assert!(chunks_of(&whole[0].0).is_subset(&q[0]));
        let plain_batches = batch_data(plain.train().unwrap(), &["t"]);
        assert!(chunks_of(&plain_batches[0].0).len() > 2);
        // Every sample once, with the value the plain order gives it.
        let by_anchor = |batches: &[(Vec<u64>, Vec<Vec<u8>>)]| {
            let mut m = std::collections::BTreeMap::new();
            for (idx, arrays) in batches {
                let sb = arrays[0].len() / idx.len();
                for (r, &a) in idx.iter().enumerate() {
                    assert!(
                        m.insert(a, arrays[0][r * sb..(r + 1) * sb].to_vec())
                            .is_none()
                    );
                }
            }
            m
        };
        let values = by_anchor(&whole);
        assert_eq!(values.len(), 317);
        assert!(values == by_anchor(&plain_batches), "epoch {epoch}");
        // Decoded into batch rows: the same batches, within the memory need.
        assert_eq!(batch_data(fast_rows.train().unwrap(), &["t"]), whole);
        let held = fast_rows.batch_buffers_allocated() * need.batch_bytes;
        assert!(held <= need.batches_bytes(), "{held} held: {need:?}");
        // A resumed pass is the rest of the same epoch.
        for k in [1, 3, whole.len()] {
            let rest = batch_data(fast.iter_from("train", k as u64).unwrap(), &["t"]);
            assert_eq!(rest, whole[k..], "epoch {epoch}, resumed at batch {k}");
        }
    }
    // Sequential views are not ramped.
    assert_eq!(
        fast.order("all").unwrap().blocks,
        plain.order("all").unwrap().blocks
    );
}

#[test]
fn a_budget_over_the_split_makes_later_epochs_all_hits() {
    let f = fixture("paired", "raw");
    let ds = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .block_chunks(4)
        .cache_budget_bytes(1 << 20)
        .build()
        .unwrap();
    let mut first = ds.train().unwrap();
    first.by_ref().for_each(|b| drop(b.unwrap()));
    let s0 = first.stats();
    assert_eq!((s0.cache_misses, s0.cache_hits), (61, 0));
    assert_eq!(s0.tiles_read, 61, "read-once: one read per stored chunk");
    drop(first);
    ds.set_epoch(1);
    let mut second = ds.train().unwrap();
    second.by_ref().for_each(|b| drop(b.unwrap()));
    let s1 = second.stats();
    assert_eq!((s1.cache_misses, s1.cache_hits, s1.tiles_read), (0, 61, 0));
}

#[test]
fn read_concurrency_defaults_to_a_few_reads_per_executor() {
    let f = fixture("paired", "raw");
    for threads in [1, 3] {
        let ds = InSituDataset::builder(&f.store)
            .variable("r", "raw")
            .executor_threads(threads)
            .build()
            .unwrap();
        assert_eq!(
            ds.max_inflight(),
            insitubatch::DEFAULT_INFLIGHT_PER_EXECUTOR * threads
        );
    }
    let ds = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .executor_threads(3)
        .max_inflight(5)
        .build()
        .unwrap();
    assert_eq!(ds.max_inflight(), 5);
}

#[test]
fn bad_arguments_are_errors_that_name_the_argument() {
    let f = fixture("paired", "raw");
    for (name, b) in [
        ("batch_size", InSituDataset::builder(&f.store).batch_size(0)),
        (
            "block_chunks",
            InSituDataset::builder(&f.store).block_chunks(0),
        ),
        (
            "max_inflight",
            InSituDataset::builder(&f.store).max_inflight(0),
        ),
        (
            "prefetch_depth",
            InSituDataset::builder(&f.store).prefetch_depth(0),
        ),
    ] {
        let e = b.variable("r", "raw").build().unwrap_err().to_string();
        assert!(e.contains(&format!("`{name}`")), "{e}");
    }
    // Every read in flight costs a task and a buffer: an absurd bound is refused, not spawned.
    let e = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .max_inflight(insitubatch::MAX_INFLIGHT + 1)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`max_inflight`") && e.contains("at most 4096"),
        "{e}"
    );
    let e = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .executor_threads(1_000_000)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::InvalidArgument {
                name: "executor_threads",
                ..
            }
        ),
        "{e}"
    );
    assert!(
        InSituDataset::builder(&f.store)
            .variable("r", "raw")
            .max_inflight(insitubatch::MAX_INFLIGHT)
            .build()
            .is_ok()
    );
    let raw = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .build()
        .unwrap();
    let geom = raw.variables()[0].geom.clone();
    for (fr, needle) in [
        (vec![-0.1, 0.5], "negative"),
        (vec![0.8, 0.5], "over 1"),
        (vec![], "1 to 3"),
    ] {
        let e = split_by_chunk(&geom, &fr, 0, true, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`fractions`") && e.contains(needle), "{e}");
    }
    let e = split_by_chunk(&geom, &[1.0], 0, true, Some((10, 99)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`sample_range`"), "{e}");
    let e = split_by_chunk(&geom, &[0.99, 0.001], 0, true, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("split `val` is empty"), "{e}");
    // A manifest made for another array.
    let short = InSituDataset::builder(&f.store)
        .variable("s", "short")
        .build()
        .unwrap();
    let other = split_by_chunk(&short.variables()[0].geom, &[1.0], 0, true, None).unwrap();
    let e = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .manifest(other)
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("made for array `short`"), "{e}");
    // Unequal sample-axis lengths.
    let e = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .variable("s", "short")
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("61") && e.contains("50") && e.contains("`s`"),
        "{e}"
    );
    // Unknown and empty splits.
    let m = split_by_chunk(&geom, &[1.0], 0, true, None).unwrap();
    let ds = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .manifest(m)
        .build()
        .unwrap();
    let e = ds.iter("validation").unwrap_err().to_string();
    assert!(e.contains("unknown split `validation`"), "{e}");
    let e = ds.val().unwrap_err().to_string();
    assert!(e.contains("split `val` is empty"), "{e}");
    // Unknown variable and missing store name the thing.
    let e = InSituDataset::builder(&f.store)
        .variable("x", "nope")
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope"), "{e}");
    let e = InSituDataset::builder("/definitely/not/here")
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("/definitely/not/here"), "{e}");
}

#[test]
fn chunks_read_from_the_device_give_the_batches_page_cache_hits_give() {
    // A read the page cache answers is decoded at once by the fetcher worker that made it; one
    // that waits for the device goes to the decoder's mailbox. Both paths, same batches (the
    // suite runs once per IO backend).
    let f = fixture("era5_v3", "t2m");
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&f.store, dir.path());
    let ds = InSituDataset::builder(dir.path())
        .variable("v", "t2m")
        .batch_size(3)
        .block_chunks(2)
        .build()
        .unwrap();
    let epoch = |ds: &InSituDataset| {
        ds.clear_cache();
        let mut pass = ds.train().unwrap();
        let batches: Vec<(Vec<u64>, Vec<u8>)> = pass
            .by_ref()
            .map(|b| {
                let b = b.unwrap();
                let bytes = b.array("v").unwrap().bytes().to_vec();
                (b.sample_indices().to_vec(), bytes)
            })
            .collect();
        (batches, pass.stats())
    };
    let (warm, _) = epoch(&ds);
    // Every sample once, each equal to zarr-python's value.
    assert_eq!(
        sorted(check_epoch(&ds, "train", &[("v", &f, 0)])),
        (0..12).collect::<Vec<_>>()
    );
    // The kernel may keep a page it was asked to drop (one still referenced from a per-CPU
    // batch, say; seen once in a loaded full-suite run, 5 attempts back to back), so try again,
    // a little later each time; every attempt must give the same batches.
    let mut waited = None;
    for attempt in 0..20u64 {
        std::thread::sleep(std::time::Duration::from_millis(10 * attempt));
        let files = std::cell::Cell::new(0);
        let dropped = drop_pages_where(dir.path(), &|_| {
            files.set(files.get() + 1);
            true
        })
        .unwrap();
        assert_eq!(dropped, files.get(), "posix_fadvise failed on some file");
        let (cold, stats) = epoch(&ds);
        assert!(stats.tiles_read_waited <= stats.tiles_read);
        assert_eq!(cold.len(), warm.len());
        for (i, (c, w)) in cold.iter().zip(&warm).enumerate() {
            assert_eq!(
                c.0, w.0,
                "attempt {attempt}, batch {i}: the same samples in order"
            );
            assert!(
                c.1 == w.1,
                "attempt {attempt}, batch {i}: device bytes differ"
            );
        }
        if stats.tiles_read_waited > 0 {
            waited = Some(stats.tiles_read_waited);
            break;
        }
    }
    assert!(
        waited.is_some(),
        "with the pages dropped, some reads must wait for the device"
    );
}

#[test]
fn batches_copied_by_every_core_equal_batches_copied_by_one() {
    // A batch of ≥ 4 MiB from resident slots (≥ 1 MiB from revived cache files) is copied by
    // every executor, each taking parts in turn; with one executor it is one copy. Same bytes.
    use insitubatch::synth::{SynthSpec, make_dataset};
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("big.zarr");
    let spec = SynthSpec {
        samples: 64,
        grid: (121, 240), // 116 KB a sample: a batch of 32 × 2 variables is 7.4 MB
        sample_chunk: 4,
        ..SynthSpec::default()
    };
    make_dataset(&store, &spec, false, &|_, _| {}).unwrap();
    let cache = dir.path().join("cache");
    let epoch_of = |threads: usize, revive: bool| {
        let mut b = InSituDataset::builder(&store)
            .executor_threads(threads)
            .cache_budget_bytes(1 << 30);
        if revive {
            b = b.cache_dir(&cache).persist(true);
        }
        let ds = b.build().unwrap();
        if !revive {
            // Fill the pool: the next epoch's slots are all resident hits.
            for b in ds.train().unwrap() {
                b.unwrap();
            }
        }
        ds.set_epoch(1);
        let mut pass = ds.train().unwrap();
        let batches: Vec<Vec<(String, Vec<u8>)>> = pass
            .by_ref()
            .map(|b| {
                let b = b.unwrap();
                b.arrays()
                    .map(|(l, a)| (l.to_string(), a.bytes().to_vec()))
                    .collect()
            })
            .collect();
        (batches, pass.stats())
    };
    let (one, _) = epoch_of(1, false);
    let (two, s) = epoch_of(2, false);
    assert_eq!(s.cache_misses, 0, "every slot resident");
    assert_eq!(one.len(), 2);
    assert!(
        one == two,
        "resident slots: a shared copy differs from a single one"
    );
    // Fill a persistent cache, then revive it with one and with two executors.
    {
        let ds = InSituDataset::builder(&store)
            .cache_dir(&cache)
            .persist(true)
            .cache_budget_bytes(1 << 30)
            .build()
            .unwrap();
        for b in ds.train().unwrap() {
            b.unwrap();
        }
    }
    let (one_rev, s1) = epoch_of(1, true);
    let (two_rev, s2) = epoch_of(2, true);
    assert_eq!((s1.tiles_read, s2.tiles_read), (0, 0), "revived, not read");
    assert!(s2.cache_revived > 0);
    assert!(
        one_rev == one,
        "revived slots copied by one core differ from resident ones"
    );
    assert!(
        two_rev == one,
        "revived slots copied by every core differ from resident ones"
    );
}

#[test]
fn ranks_share_each_split_once_and_train_evenly() {
    // Data-parallel ranks: each its own dataset, as each its own process would open it. Paired
    // variables chunked 1 and 30 on the mask's grid (three chunks of 30, 30 and 1) and on the
    // raw grid (61 chunks), with a window on the era5 fixture.
    let raw = fixture("paired", "raw");
    let mask = fixture("paired", "mask");
    let open = |reference: &str, rank, world_size| {
        let probe = InSituDataset::builder(&raw.store)
            .variable("r", reference)
            .build()
            .unwrap();
        let manifest = split_by_chunk(&probe.variables()[0].geom, &[1.0], 0, true, None).unwrap();
        InSituDataset::builder(&raw.store)
            .variable("raw", "raw")
            .variable("mask", "mask")
            .manifest(manifest)
            .batch_size(4)
            .block_chunks(2)
            .seed(9)
            .shard(rank, world_size)
            .build()
            .unwrap()
    };
    let refs = [("raw", &raw, 0), ("mask", &mask, 0)];
    for (reference, world_size) in [("mask", 2), ("mask", 3), ("raw", 2), ("raw", 4)] {
        let case = format!("{reference} grid, {world_size} ranks");
        for epoch in 0..2 {
            let (mut train, mut all) = (Vec::new(), Vec::new());
            let mut lengths = BTreeSet::new();
            for rank in 0..world_size {
                let ds = open(reference, rank, world_size);
                ds.set_epoch(epoch);
                let t = check_epoch(&ds, "train", &refs);
                lengths.insert(t.len());
                train.extend(t);
                all.extend(check_epoch(&ds, "all", &refs));
            }
            // `all`: every sample once across the ranks.
            assert_eq!(sorted(all), (0..61).collect::<Vec<_>>(), "{case}");
            // `train`: no sample twice, every rank the same length, the rest trimmed.
            assert_eq!(lengths.len(), 1, "{case}: rank lengths {lengths:?}");
            let n = train.len();
            let once: BTreeSet<u64> = train.iter().copied().collect();
            assert_eq!(once.len(), n, "{case}: a sample on two ranks");
            let even = *lengths.first().unwrap();
            assert_eq!(even * world_size, n);
            let per_chunk: u64 = if reference == "mask" { 30 } else { 1 };
            assert!(
                61 - n as u64 <= world_size as u64 * per_chunk,
                "{case}: {} trimmed",
                61 - n
            );
        }
    }
    // The trimmed rows are in the pass's stats; a rank's share is a contiguous run of chunks,
    // cut where the rows come closest to equal (30 and 31 rather than 60 and 1).
    let ds = open("mask", 0, 2);
    let mut pass = ds.train().unwrap();
    let seen: BTreeSet<u64> = pass
        .by_ref()
        .flat_map(|b| b.unwrap().sample_indices().to_vec())
        .collect();
    assert_eq!(
        pass.stats().trimmed_rows,
        0,
        "rank 0 holds the shortest share"
    );
    assert_eq!(
        seen,
        (0..30).collect(),
        "rank 0 of 2 reads the mask's chunk 0"
    );
    let ds = open("mask", 1, 2);
    let mut pass = ds.train().unwrap();
    let n: usize = pass.by_ref().map(|b| b.unwrap().len()).sum();
    assert_eq!(
        (n, pass.stats().trimmed_rows),
        (30, 1),
        "chunks 1 and 2: 31 rows, 30 kept"
    );
    // A window reaches into the next rank's chunks only at the end of a share: y = x.shift(1)
    // over 61 chunks of one sample, two ranks, each reads its 30 or 31 chunks and one more.
    for rank in 0..2 {
        let ds = InSituDataset::builder(&raw.store)
            .variable("x", "raw")
            .window("y", "raw", 1)
            .shard(rank, 2)
            .build()
            .unwrap();
        let mut pass = ds.all().unwrap();
        let rows: u64 = pass.by_ref().map(|b| b.unwrap().len() as u64).sum();
        let s = pass.stats();
        assert_eq!(s.tiles_read, rows + 1, "rank {rank}: {rows} rows");
    }
    // A window's dropped anchors count toward each rank's share: 12 samples in chunks of 4,
    // anchors 0..=6 valid with y = x shifted by 5, so chunk 2 holds none.
    let f = fixture("era5_v3", "t2m");
    let windowed = |rank, world_size| {
        InSituDataset::builder(&f.store)
            .variable("x", "t2m")
            .window("y", "t2m", 5)
            .batch_size(2)
            .shard(rank, world_size)
            .build()
            .unwrap()
    };
    let mut seen = Vec::new();
    for rank in 0..2 {
        let ds = windowed(rank, 2);
        assert_eq!(ds.split_samples("all").unwrap(), [4, 3][rank]);
        assert_eq!(ds.split_samples("train").unwrap(), 3);
        seen.extend(check_epoch(&ds, "all", &[("x", &f, 0), ("y", &f, 0)]));
    }
    assert_eq!(sorted(seen), (0..7).collect::<Vec<_>>());
    // Three ranks: the third's share is empty, and every rank is refused alike.
    for rank in 0..3 {
        let ds = windowed(rank, 3);
        for split in ["train", "all"] {
            let e = ds.iter(split).unwrap_err().to_string();
            assert!(e.contains("world_size") && e.contains(split), "{e}");
            assert_eq!(ds.split_samples(split).unwrap_err().to_string(), e);
        }
    }
    // More ranks than chunks, and bad ranks, are refused naming the argument.
    let e = windowed(0, 4).iter("all").unwrap_err().to_string();
    assert!(
        e.contains("`world_size` = 4")
            && e.contains(
                "3 chunks along the sample axis, fewer than the ranks, so rank 3 would get none"
            ),
        "{e}"
    );
    for (rank, world_size, name) in [(0, 0, "world_size"), (2, 2, "rank"), (5, 3, "rank")] {
        let e = InSituDataset::builder(&f.store)
            .shard(rank, world_size)
            .build()
            .unwrap_err();
        assert!(
            matches!(&e, EngineError::InvalidArgument { name: n, .. } if *n == name),
            "{e}"
        );
    }
}
