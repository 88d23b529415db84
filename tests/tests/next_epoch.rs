//! `prefetch_next_epoch`: train's next epoch starts once the one before it has loaded its last
//! chunk, while its last batches are gathered and consumed. The early pass must be the epoch asked for (zarr-python's values, the order of a
//! dataset without it), be dropped when another is asked for, step aside for a pass the caller
//! starts, say once why it could not start, and leave nothing behind.

use insitubatch::{InSituDataset, IntoRows, split_by_chunk};
use insitubatch_tests::{FixtureArray, threads_named_settled, threads_named_stable};

mod common;
use common::{check_epoch, check_pass, fixture, sorted};

/// Waits (at most 10 s) until `ds` has started train's epoch `epoch` early: its pass before
/// has loaded its last chunk, which may come a moment after its last batch.
fn wait_prefetched(ds: &InSituDataset, epoch: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ds.prefetched_epoch() != Some(epoch) {
        assert!(
            std::time::Instant::now() < deadline,
            "epoch {epoch} was not started early: {:?}",
            ds.prefetched_epoch()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Samples of the `paired` fixture's `raw` array (one per chunk).
const SAMPLES: u64 = 61;

fn builder(f: &FixtureArray, early: bool, mode: IntoRows) -> insitubatch::DatasetBuilder {
    InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .batch_size(4)
        .block_chunks(3)
        .prefetch_next_epoch(early)
        .decode_into_batches(mode)
}

#[test]
fn the_next_epoch_started_early_is_the_epoch_asked_for_with_zarr_pythons_values() {
    let f = fixture("paired", "raw");
    let refs = [("r", &f, 0)];
    // Decoded into batch rows (no pool budget reserved), through the pool with a budget that
    // holds two iterations, and through the pool under the automatic budget, which holds one
    // iteration's working set: there the early pass loads into the room the running one gives
    // back as its last batches are taken, and the pool never holds more than the budget.
    let cases = [
        (IntoRows::Always, None),
        (IntoRows::Never, Some(1 << 24)),
        (IntoRows::Never, None),
    ];
    for (mode, budget) in cases {
        let build = |early: bool| {
            let b = builder(&f, early, mode);
            match budget {
                Some(x) => b.cache_budget_bytes(x),
                None => b,
            }
            .build()
            .unwrap()
        };
        let (ds, plain) = (build(true), build(false));
        for epoch in 0..4 {
            ds.set_epoch(epoch);
            plain.set_epoch(epoch);
            let (anchors, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
            assert_eq!(
                anchors,
                check_epoch(&plain, "train", &refs),
                "{mode:?} epoch {epoch}: the order of a dataset without prefetch_next_epoch"
            );
            assert_eq!(sorted(anchors), (0..SAMPLES).collect::<Vec<_>>());
            assert_eq!(stats.epoch, epoch);
            assert_eq!(
                stats.started_ahead,
                epoch > 0,
                "{mode:?} epoch {epoch}: every epoch after the first was started early"
            );
            if mode == IntoRows::Never && budget.is_none() {
                let st = ds.pool_stats();
                assert_eq!(
                    st.budget_bytes,
                    plain.pool_stats().budget_bytes,
                    "the automatic budget is one iteration's working set"
                );
                assert!(
                    st.peak_resident_bytes <= st.budget_bytes,
                    "epoch {epoch}: {st:?}"
                );
            }
        }
        assert!(ds.warnings().is_empty(), "{:?}", ds.warnings());
    }
}

#[test]
fn the_memory_check_counts_one_working_set_for_the_early_pass_and_the_epoch_before() {
    let f = fixture("paired", "raw");
    let refs = [("r", &f, 0)];
    // Through the pool under the automatic budget. A limit one byte below what a second,
    // independent train pass beside the first needs: the early pass, which takes the first's
    // room over, counts the larger of their working sets, not both, and fits.
    let probe = builder(&f, false, IntoRows::Never).build().unwrap();
    let first = probe.train().unwrap();
    probe.set_epoch(1);
    let two = probe.memory_need("train").unwrap();
    assert!(two.working_set > 0 && two.other_passes == 1, "{two}");
    drop(first);
    let ds = builder(&f, true, IntoRows::Never)
        .memory_limit_bytes(two.total() - 1)
        .build()
        .unwrap();
    let mut held = ds.train().unwrap();
    assert!(held.by_ref().map(|b| b.unwrap().len()).sum::<usize>() as u64 == SAMPLES);
    // Started beside it while it is still held.
    wait_prefetched(&ds, 1);
    drop(held);
    ds.set_epoch(1);
    let (anchors, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
    assert!(stats.started_ahead);
    assert_eq!(sorted(anchors), (0..SAMPLES).collect::<Vec<_>>());
    assert!(ds.warnings().is_empty(), "{:?}", ds.warnings());
    // An independent second pass is still counted in full, and refused.
    let _first = ds.train().unwrap();
    ds.set_epoch(9);
    let err = ds.train().unwrap_err().to_string();
    assert!(
        err.contains("memory_limit_bytes") || err.contains("more than"),
        "{err}"
    );
}

#[test]
fn an_early_pass_that_cannot_start_is_said_once_and_the_epoch_starts_when_asked() {
    let f = fixture("paired", "raw");
    let refs = [("r", &f, 0)];
    // A memory limit that holds one train pass and not two.
    let probe = builder(&f, false, IntoRows::Always).build().unwrap();
    let alone = probe.memory_need("train").unwrap().total();
    let ds = builder(&f, true, IntoRows::Always)
        .memory_limit_bytes(alone)
        .build()
        .unwrap();
    let plain = builder(&f, false, IntoRows::Always).build().unwrap();
    let mut first = ds.train().unwrap();
    for b in first.by_ref() {
        b.unwrap();
    }
    // Its successor started beside it (it is not dropped yet) and did not fit.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ds.warnings().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no warning");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(ds.prefetched_epoch(), None);
    drop(first);
    for epoch in 1..4 {
        ds.set_epoch(epoch);
        plain.set_epoch(epoch);
        let (anchors, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
        if epoch == 1 {
            assert!(!stats.started_ahead);
        }
        assert_eq!(
            anchors,
            check_epoch(&plain, "train", &refs),
            "epoch {epoch}"
        );
    }
    let warnings = ds.warnings();
    assert_eq!(warnings.len(), 1, "said once: {warnings:?}");
    let w = &warnings[0];
    assert!(
        w.contains("prefetch_next_epoch")
            && w.contains("train's epoch 1 could not start")
            && w.contains("already running in this process (train#0")
            && w.contains("memory_limit_bytes"),
        "{w}"
    );
}

#[test]
fn an_early_pass_is_not_handed_over_while_the_epoch_before_still_pins_its_room() {
    // Its loads wait for the room the epoch before pins: a caller that asks for the next epoch
    // while still holding the last one unfinished must get what it would without
    // prefetch_next_epoch (here the budget's error), never a pass waiting on batches nobody
    // takes.
    let f = fixture("paired", "raw");
    let ds = builder(&f, true, IntoRows::Never)
        .block_chunks(16)
        .prefetch_depth(1)
        .build()
        .unwrap();
    let batches = ds.split_batches("train").unwrap();
    let mut first = ds.train().unwrap();
    for _ in 0..batches - 4 {
        first.next().unwrap().unwrap();
    }
    wait_prefetched(&ds, 1);
    assert!(
        first.pinned_slots() > 0,
        "the last batches' chunks are pinned"
    );
    ds.set_epoch(1);
    let err = ds.train().unwrap_err().to_string();
    assert!(
        err.contains("cache_budget_bytes") && err.contains("train#0"),
        "{err}"
    );
    assert_eq!(ds.prefetched_epoch(), None, "dropped, not handed over");
    let rest = first.by_ref().map(|b| b.unwrap().len()).sum::<usize>();
    assert_eq!(rest, SAMPLES as usize - (batches as usize - 4) * 4);
    drop(first);
    let refs = [("r", &f, 0)];
    let (anchors, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
    assert!(!stats.started_ahead);
    assert_eq!(sorted(anchors), (0..SAMPLES).collect::<Vec<_>>());
}

#[test]
fn asking_for_another_epoch_or_resuming_drops_the_early_pass_and_gets_what_was_asked() {
    let f = fixture("paired", "raw");
    let refs = [("r", &f, 0)];
    let ds = builder(&f, true, IntoRows::Always).build().unwrap();
    let plain = builder(&f, false, IntoRows::Always).build().unwrap();
    check_epoch(&ds, "train", &refs);
    // Epoch 1 was started early; epoch 5 is asked for.
    ds.set_epoch(5);
    plain.set_epoch(5);
    let (anchors, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
    assert!(!stats.started_ahead);
    assert_eq!(anchors, check_epoch(&plain, "train", &refs));
    // Epoch 6 was started early; epoch 6 is resumed at batch 2.
    ds.set_epoch(6);
    plain.set_epoch(6);
    let mut resumed = ds.iter_from("train", 2).unwrap();
    let got: Vec<u64> = resumed
        .by_ref()
        .flat_map(|b| b.unwrap().sample_indices().to_vec())
        .collect();
    assert!(!resumed.stats().started_ahead);
    let whole: Vec<u64> = plain
        .train()
        .unwrap()
        .flat_map(|b| b.unwrap().sample_indices().to_vec())
        .collect();
    assert_eq!(got, whole[8..], "batches 2.. of epoch 6");
    drop(resumed);
    // A resumed pass starts the next epoch early too.
    ds.set_epoch(7);
    let (_, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
    assert!(stats.started_ahead);
    let st = ds.pool_stats();
    assert_eq!((st.pinned_slots, st.reserved_bytes), (0, 0), "{st:?}");
}

#[test]
fn a_pass_dropped_before_its_end_takes_its_early_successor_with_it() {
    let f = fixture("paired", "raw");
    let refs = [("r", &f, 0)];
    // Through the pool with a budget for two, so that the successor pins and reserves.
    let ds = builder(&f, true, IntoRows::Never)
        .cache_budget_bytes(1 << 24)
        .build()
        .unwrap();
    let batches = ds.split_batches("train").unwrap();
    let mut pass = ds.train().unwrap();
    // Every batch but the last, which the gather has assembled ahead: every chunk was loaded
    // and the successor started.
    for _ in 0..batches - 1 {
        pass.next().unwrap().unwrap();
    }
    wait_prefetched(&ds, 1);
    drop(pass);
    assert_eq!(ds.prefetched_epoch(), None);
    let st = ds.pool_stats();
    assert_eq!((st.pinned_slots, st.reserved_bytes), (0, 0), "{st:?}");
    ds.set_epoch(1);
    let (_, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
    assert!(
        !stats.started_ahead,
        "the successor went with the abandoned pass"
    );
    // A pass that ran to its end leaves its successor for the next epoch.
    ds.set_epoch(2);
    let (_, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
    assert!(stats.started_ahead);
    // So does one whose consumer took every batch and stopped there (`take(n)`, `zip` with a
    // step count) without asking for the end.
    ds.set_epoch(3);
    let mut pass = ds.train().unwrap();
    for _ in 0..batches {
        pass.next().unwrap().unwrap();
    }
    wait_prefetched(&ds, 4);
    drop(pass);
    assert_eq!(ds.prefetched_epoch(), Some(4));
    ds.set_epoch(4);
    let (_, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
    assert!(stats.started_ahead);
}

#[test]
fn validation_between_epochs_leaves_the_early_pass_waiting_or_when_it_does_not_fit_stops_it() {
    // Decoded into rows, val fits beside the early pass. Through the pool under the automatic
    // budget the early pass takes over train's room, and val, which needs room of its own,
    // drops it: from then on val's pass starts train's next epoch once it has loaded its last
    // chunk, taking over val's room (rather than being dropped for it every epoch).
    let f = fixture("paired", "raw");
    let refs = [("r", &f, 0)];
    for (mode, fits) in [(IntoRows::Always, true), (IntoRows::Never, false)] {
        let probe = builder(&f, false, mode).build().unwrap();
        let geom = &probe.variables()[0].geom;
        let manifest = split_by_chunk(geom, &[0.5, 0.5], 0, true, None).unwrap();
        let ds = builder(&f, true, mode).manifest(manifest).build().unwrap();
        let mut seen = Vec::new();
        for epoch in 0..3 {
            ds.set_epoch(epoch);
            let (train, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
            assert_eq!(stats.started_ahead, epoch > 0, "{mode:?} epoch {epoch}");
            if fits || epoch == 0 {
                // Started by train (to be dropped for val, the first time, when it does not fit).
                wait_prefetched(&ds, epoch + 1);
            } else {
                assert_eq!(ds.prefetched_epoch(), None, "left to val");
            }
            let (val, stats) = check_pass(&ds, ds.val().unwrap(), "val", &refs);
            assert!(!stats.started_ahead, "only train starts early");
            // Waiting through val, or started by it.
            wait_prefetched(&ds, epoch + 1);
            let mut all = [train, val].concat();
            all.sort_unstable();
            seen.push(all);
        }
        assert!(seen.iter().all(|s| *s == (0..SAMPLES).collect::<Vec<_>>()));
        let warnings = ds.warnings();
        if fits {
            assert!(warnings.is_empty(), "{warnings:?}");
        } else {
            assert_eq!(warnings.len(), 1, "said once: {warnings:?}");
            assert!(
                warnings[0].contains("room for `val`")
                    && warnings[0].contains("once `val`'s iteration has loaded its last chunk"),
                "{}",
                warnings[0]
            );
        }
    }
}

#[test]
fn the_early_pass_follows_the_last_split_before_train_and_a_split_dropping_it_twice_stops_it() {
    // Through the pool under the automatic budget, none of val and test fits beside the early
    // pass. Train, val and test each epoch: val drops train's early pass (val starts it from
    // then on), test drops val's (test starts it from then on), and from epoch 1 every train
    // epoch is started early, by test. Train, val and val each epoch: the second val drops
    // the early pass the first started, and then none starts.
    let f = fixture("paired", "raw");
    let refs = [("r", &f, 0)];
    let probe = builder(&f, false, IntoRows::Never).build().unwrap();
    let geom = &probe.variables()[0].geom;
    let manifest = split_by_chunk(geom, &[0.5, 0.25, 0.25], 0, true, None).unwrap();
    for (loop_, want) in [
        (["train", "val", "test"], [false, true, true, true]),
        (["train", "val", "val"], [false; 4]),
    ] {
        let ds = builder(&f, true, IntoRows::Never)
            .manifest(manifest.clone())
            .build()
            .unwrap();
        let full = loop_[2] == "test";
        let mut started = Vec::new();
        for epoch in 0..4 {
            ds.set_epoch(epoch);
            let mut anchors = Vec::new();
            for (i, split) in loop_.into_iter().enumerate() {
                let (got, stats) = check_pass(&ds, ds.iter(split).unwrap(), split, &refs);
                if split == "train" {
                    started.push(stats.started_ahead);
                } else {
                    assert!(!stats.started_ahead, "only train starts early");
                }
                // At epoch 0 each split starts the early pass, to be dropped for the next (but
                // the second val, which turns it off); from then on only test starts it.
                let starts = if full {
                    epoch == 0 || i == 2
                } else {
                    epoch == 0 && i < 2
                };
                if starts {
                    wait_prefetched(&ds, epoch + 1);
                } else {
                    assert_eq!(ds.prefetched_epoch(), None, "{loop_:?} {epoch} {split}");
                }
                anchors.push(got);
            }
            if full {
                assert_eq!(sorted(anchors.concat()), (0..SAMPLES).collect::<Vec<_>>());
            } else {
                assert_eq!(anchors[1], anchors[2], "val twice, the same samples");
                let mut both = [anchors[0].clone(), anchors[1].clone()].concat();
                both.sort_unstable();
                both.dedup();
                assert_eq!(both.len(), anchors[0].len() + anchors[1].len(), "disjoint");
            }
        }
        assert_eq!(started, want, "{loop_:?}");
        let warnings = ds.warnings();
        assert_eq!(warnings.len(), 2, "each said once: {warnings:?}");
        assert!(
            warnings[0].contains("room for `val`")
                && warnings[0].contains("once `val`'s iteration has loaded its last chunk"),
            "{}",
            warnings[0]
        );
        let last = loop_[2];
        if last == "test" {
            assert!(
                warnings[1].contains("room for `test`")
                    && warnings[1].contains("once `test`'s iteration has loaded its last chunk"),
                "{}",
                warnings[1]
            );
        } else {
            assert!(
                warnings[1].contains("room for `val`") && warnings[1].contains("starts when asked"),
                "{}",
                warnings[1]
            );
        }
    }
}

#[test]
fn a_pass_that_does_not_fit_beside_the_early_one_drops_it_and_starts() {
    // Measured without a limit: `one` is train's need beside one running train pass (the
    // early pass's start), `val_one` and `val_two` are val's beside one and two. A limit that
    // admits the early pass and val beside one pass, but not val beside two, makes val's
    // start drop the early pass and try again.
    let f = fixture("paired", "raw");
    let probe_of = |limit: Option<u64>| {
        let probe = builder(&f, false, IntoRows::Always).build().unwrap();
        let manifest =
            split_by_chunk(&probe.variables()[0].geom, &[0.5, 0.5], 0, true, None).unwrap();
        let b = builder(&f, limit.is_some(), IntoRows::Always).manifest(manifest);
        match limit {
            Some(l) => b.memory_limit_bytes(l),
            None => b,
        }
        .build()
        .unwrap()
    };
    let probe = probe_of(None);
    let first = probe.train().unwrap();
    let one = probe.memory_need("train").unwrap().total();
    let val_one = probe.memory_need("val").unwrap().total();
    probe.set_epoch(1);
    let second = probe.train().unwrap();
    let val_two = probe.memory_need("val").unwrap().total();
    drop((first, second));
    let limit = one.max(val_one);
    assert!(limit < val_two, "{one} {val_one} {val_two}");

    let refs = [("r", &f, 0)];
    let ds = probe_of(Some(limit));
    let mut train = ds.train().unwrap();
    // Run to its end but not dropped: it still counts, beside its successor.
    for b in train.by_ref() {
        b.unwrap();
    }
    wait_prefetched(&ds, 1);
    let mut val = ds.val().unwrap();
    assert!(val.by_ref().map(|b| b.unwrap().len()).sum::<usize>() > 0);
    // Dropped for val, train's next epoch is started by val's pass from then on (a loop
    // running val between epochs would have it dropped every epoch). This first time it
    // could not start: beside the first train pass and val, both still held.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ds.warnings().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "{:?}", ds.warnings());
        assert_eq!(ds.prefetched_epoch(), None);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    drop((val, train));
    ds.set_epoch(1);
    let (_, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
    assert!(!stats.started_ahead, "dropped to make room for val");
    assert_eq!(ds.prefetched_epoch(), None, "train starts none now");
    check_pass(&ds, ds.val().unwrap(), "val", &refs);
    wait_prefetched(&ds, 2);
    ds.set_epoch(2);
    let (_, stats) = check_pass(&ds, ds.train().unwrap(), "train", &refs);
    assert!(stats.started_ahead, "started by val");
    let warnings = ds.warnings();
    assert_eq!(warnings.len(), 2, "each said once: {warnings:?}");
    assert!(
        warnings[0].contains("train's epoch 1 was started early and then dropped")
            && warnings[0].contains("room for `val`")
            && warnings[0].contains("once `val`'s iteration has loaded its last chunk"),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[1].contains("train's epoch 1 could not start")
            && warnings[1].contains("(train#0, val#0)"),
        "{}",
        warnings[1]
    );
}

#[test]
fn a_dataset_dropped_with_an_early_pass_waiting_or_before_its_pass_ends_leaves_no_threads() {
    let f = fixture("paired", "raw");
    let before = threads_named_stable("isb");
    // An early pass waiting to be asked for.
    let ds = builder(&f, true, IntoRows::Always)
        .executor_threads(2)
        .build()
        .unwrap();
    assert_eq!(ds.train().unwrap().count() as u64, SAMPLES.div_ceil(4));
    drop(ds);
    assert_eq!(threads_named_settled("isb", before), before);
    // A pass that outlives its dataset: its successor has nowhere to go and does not start.
    let ds = builder(&f, true, IntoRows::Always)
        .executor_threads(2)
        .build()
        .unwrap();
    let pass = ds.train().unwrap();
    drop(ds);
    let rows: usize = pass.map(|b| b.unwrap().len()).sum();
    assert_eq!(rows as u64, SAMPLES);
    assert_eq!(threads_named_settled("isb", before), before);
}
