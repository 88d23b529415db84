//! The NVMe tier against zarr-python fixtures: warm runs decode nothing, a killed writer keeps
//! exactly what it finished, one writer per directory, readonly readers, stale and damaged
//! caches, ENOSPC, and the windowed + shuffled + persist residency rule.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use insitubatch::pool::disk::LOG_NAME;
use insitubatch::{EngineError, InSituDataset};
use insitubatch_tests::{FixtureArray, sample_of};

mod common;
use common::{check_epoch, fixture, run, sorted};

fn npy_files(dir: &Path) -> usize {
    slot_files(dir, false)
}

/// Slot files in `dir`, and with `temporaries` those still being written too.
fn slot_files(dir: &Path, temporaries: bool) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.flatten()
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.ends_with(".npy") || (temporaries && name.contains(".npy.tmp."))
            })
            .count()
    })
}

fn log_lines(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join(LOG_NAME)).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn era5(cache: &Path) -> insitubatch::DatasetBuilder {
    let f = fixture("era5_v3", "t2m");
    InSituDataset::builder(&f.store)
        .variable("t", "t2m")
        .variable("u", "u10")
        .batch_size(5)
        .block_chunks(2)
        .cache_dir(cache)
}

/// The error message of a build that must fail.
fn build_err(b: insitubatch::DatasetBuilder) -> String {
    b.build().unwrap_err().to_string()
}

#[test]
fn a_warm_run_revives_every_chunk_and_decodes_nothing() {
    let t = fixture("era5_v3", "t2m");
    let u = fixture("era5_v3", "u10");
    let cache = tempfile::tempdir().unwrap();
    let refs = [("t", &t, 0usize), ("u", &u, 0)];
    {
        let ds = era5(cache.path()).persist(true).build().unwrap();
        let anchors = check_epoch(&ds, "train", &refs);
        assert_eq!(sorted(anchors), (0..12).collect::<Vec<_>>());
        assert_eq!(
            log_lines(cache.path()).len(),
            6,
            "3 chunks x 2 arrays logged"
        );
        assert_eq!(ds.cache_stats().unwrap().writes, 6);
    }
    for epoch in 0..2 {
        let ds = era5(cache.path()).persist(true).build().unwrap();
        ds.set_epoch(epoch);
        let anchors = check_epoch(&ds, "train", &refs);
        assert_eq!(sorted(anchors), (0..12).collect::<Vec<_>>());
        let s = run(&ds, "train");
        assert_eq!(
            (s.tiles_read, s.bytes_decoded, s.cache_misses),
            (0, 0, 0),
            "{s:?}"
        );
        assert_eq!(ds.cache_stats().unwrap().writes, 0, "nothing rewritten");
        // A second pass copies from the slots' mappings (mapped when they went to rest).
        assert!(s.bytes_revived <= s.bytes_delivered, "{s:?}");
        // Self-deduplicating: the log still holds one line per chunk.
        assert_eq!(log_lines(cache.path()).len(), 6);
    }
    // The first pass of the fresh dataset counts its revivals as hits.
    let ds = era5(cache.path()).persist(true).build().unwrap();
    let s = run(&ds, "all");
    assert_eq!((s.cache_hits, s.cache_revived, s.cache_misses), (6, 6, 0));
    // Revived rows were read from the files straight into the batches, once each.
    assert_eq!(s.bytes_revived, s.bytes_delivered, "{s:?}");
}

#[test]
fn inner_chunked_and_sharded_slots_are_cached_assembled_and_revive_equal() {
    for case in ["v3_inner", "v3_sharded"] {
        let f = insitubatch_tests::fixture_arrays()
            .into_iter()
            .find(|f| f.case == case)
            .unwrap();
        let cache = tempfile::tempdir().unwrap();
        for round in 0..2 {
            let ds = InSituDataset::builder(&f.store)
                .variable("v", f.array.clone())
                .batch_size(2)
                .cache_dir(cache.path())
                .persist(true)
                .build()
                .unwrap();
            check_epoch(&ds, "train", &[("v", &f, 0)]);
            let s = run(&ds, "all");
            if round == 1 {
                assert_eq!(s.tiles_read, 0, "{case}: {s:?}");
            }
        }
    }
}

/// An ephemeral spill of `paired/raw` (61 one-sample slots of 120 bytes) in batches of 4 and
/// blocks of 4 chunks, so the automatic budget holds 8 slots; its fixture and directory.
fn paired_spill() -> (FixtureArray, tempfile::TempDir, InSituDataset) {
    let f = fixture("paired", "raw");
    let cache = tempfile::tempdir().unwrap();
    let ds = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .batch_size(4)
        .block_chunks(4)
        .cache_dir(cache.path())
        .build()
        .unwrap();
    (f, cache, ds)
}

#[test]
fn ephemeral_spill_bounds_files_by_the_budget_and_removes_them() {
    let (_, cache, ds) = paired_spill();
    let slot = 5 * 6 * 4;
    let mut pass = ds.train().unwrap();
    let mut most = 0;
    for b in pass.by_ref() {
        b.unwrap();
        most = most.max(npy_files(cache.path()));
    }
    let s = pass.stats();
    drop(pass); // joins the writes still in flight
    most = most.max(npy_files(cache.path()));
    // Each slot went to a file, unless it was evicted before its write's turn came (then the
    // write was skipped rather than landed and unlinked).
    let disk = ds.cache_stats().unwrap();
    assert!(disk.writes > 0, "{disk:?}");
    assert_eq!(disk.writes + disk.writes_skipped, 61, "{disk:?}");
    assert!(
        (most * slot) as u64 <= s.budget_bytes,
        "{most} files over a budget of {}",
        s.budget_bytes
    );
    assert!(
        !cache.path().join(LOG_NAME).exists(),
        "no log without persist"
    );
    drop(ds);
    assert_eq!(npy_files(cache.path()), 0, "files unlinked on close");
}

#[test]
fn an_ephemeral_spill_never_holds_more_files_than_its_budget_even_mid_write() {
    // Every slot file in the directory, temporaries being written included, counted by a
    // thread polling throughout three epochs: a slot evicted while its file is written keeps
    // its room in the budget until the file is gone, so an admission waits for that instead of
    // going over. 61 slots of 120 bytes, a budget of 8 (two blocks of 4), 16 writes in flight.
    let (f, cache, ds) = paired_spill();
    let slot = 5 * 6 * 4;
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (stop, dir) = (Arc::clone(&stop), cache.path().to_path_buf());
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(Ordering::Relaxed) {
                most = most.max(slot_files(&dir, true));
            }
            most
        })
    };
    let mut budget = 0;
    for epoch in 0..3 {
        ds.set_epoch(epoch);
        let anchors = check_epoch(&ds, "train", &[("r", &f, 0)]);
        assert_eq!(sorted(anchors), (0..61).collect::<Vec<_>>());
        budget = ds.pool_stats().budget_bytes;
    }
    stop.store(true, Ordering::Relaxed);
    let most = poller.join().unwrap();
    assert_eq!(budget, 8 * slot as u64);
    assert!(
        most > 0 && most * slot <= budget as usize,
        "{most} slot files at once over a budget of {budget} bytes"
    );
    let disk = ds.cache_stats().unwrap();
    assert!(
        disk.writes > 0 && disk.writes + disk.writes_skipped >= 61,
        "{disk:?}"
    );
}

#[test]
fn an_ephemeral_spill_pass_dropped_at_any_batch_releases_everything_and_its_files() {
    // A planner may be waiting for an evicted slot's write to end when its pass is dropped:
    // every drop point leaves nothing pinned or reserved, the dataset iterates on, and the
    // files go with it.
    let (f, cache, ds) = paired_spill();
    for stop in 0..16 {
        ds.set_epoch(stop as u64);
        let mut pass = ds.train().unwrap();
        for _ in 0..stop {
            pass.next().unwrap().unwrap();
        }
        drop(pass);
        let st = ds.pool_stats();
        assert_eq!(
            (st.pinned_slots, st.reserved_bytes),
            (0, 0),
            "after {stop}: {st:?}"
        );
        assert!(st.resident_bytes <= st.budget_bytes);
    }
    let anchors = check_epoch(&ds, "train", &[("r", &f, 0)]);
    assert_eq!(sorted(anchors), (0..61).collect::<Vec<_>>());
    drop(ds);
    assert_eq!(npy_files(cache.path()), 0, "files unlinked on close");
}

#[test]
fn numpy_readable_slot_files_hold_the_chunk() {
    let f = fixture("era5_v3", "t2m");
    let cache = tempfile::tempdir().unwrap();
    let ds = era5(cache.path()).persist(true).build().unwrap();
    run(&ds, "all");
    let entry = log_lines(cache.path())
        .into_iter()
        .find(|e| e["array"] == "t2m" && e["chunk"] == 1)
        .unwrap();
    assert_eq!(entry["shape"], serde_json::json!([4, 9, 16]));
    assert_eq!(entry["dtype"], "<f4");
    let bytes = std::fs::read(cache.path().join(entry["file"].as_str().unwrap())).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let data = &bytes[insitubatch::pool::disk::HEADER_LEN..];
    for s in 0..4u64 {
        let want = sample_of(&f.reference, &f.shape, 0, 4 + s, 4);
        let n = want.len();
        assert_eq!(&data[s as usize * n..(s as usize + 1) * n], &want[..]);
    }
}

#[test]
fn one_writer_per_directory_and_readonly_readers_share() {
    let cache = tempfile::tempdir().unwrap();
    let writer = era5(cache.path()).persist(true).build().unwrap();
    let err = era5(cache.path()).persist(true).build().unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, EngineError::Cache(_)), "{err:?}");
    assert!(
        msg.contains(&format!("pid {}", std::process::id()))
            && msg.contains("One writer per cache_dir"),
        "{msg}"
    );
    // An ephemeral writer is a writer too: it writes the same file names.
    assert!(era5(cache.path()).build().is_err());
    // A reader beside a writer fails fast: the cache is being written.
    let msg = era5(cache.path())
        .readonly_cache(true)
        .build()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("shared (readonly_cache)"), "{msg}");
    run(&writer, "all");
    drop(writer);

    let r1 = era5(cache.path()).readonly_cache(true).build().unwrap();
    let r2 = era5(cache.path()).readonly_cache(true).build().unwrap();
    let s = run(&r1, "train");
    assert_eq!((s.tiles_read, s.cache_misses), (0, 0));
    run(&r2, "all");
    let msg = build_err(era5(cache.path()).persist(true));
    assert!(msg.contains("readonly_cache readers"), "{msg}");
    assert_eq!(r1.cache_stats().unwrap().writes, 0, "readers write nothing");
}

#[test]
fn a_forked_child_does_not_keep_the_writer_lock() {
    let cache = tempfile::tempdir().unwrap();
    let writer = era5(cache.path()).persist(true).build().unwrap();
    // A child made by fork (a fork-started DataLoader worker, say) that outlives the dataset.
    // It lets go of the lock as it starts (a fork handler, before `fork` returns in the child),
    // so it tells the parent when it has started: until then it holds a copy of the descriptor,
    // and on a loaded machine a child can wait tens of milliseconds for its first time slice.
    let mut started = [0i32; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(started.as_mut_ptr()) }, 0);
    // SAFETY: the child makes only async-signal-safe calls (write, sleep, _exit).
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        // SAFETY: see above.
        unsafe {
            libc::write(started[1], [1u8].as_ptr().cast(), 1);
            libc::sleep(30);
            libc::_exit(0);
        }
    }
    let mut byte = [0u8];
    // SAFETY: reads one byte into a live buffer, then closes our pipe ends.
    unsafe {
        assert_eq!(libc::read(started[0], byte.as_mut_ptr().cast(), 1), 1);
        libc::close(started[0]);
        libc::close(started[1]);
    }
    drop(writer);
    // SAFETY: waitpid on our own child, WNOHANG.
    let alive = unsafe { libc::waitpid(child, std::ptr::null_mut(), libc::WNOHANG) } == 0;
    let next = era5(cache.path()).persist(true).build();
    // SAFETY: kill and reap our own child.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    assert!(
        alive,
        "the child was still running when the lock was taken again"
    );
    let next = next.expect("the writer lock is free once its dataset is dropped");
    run(&next, "all");
}

#[test]
fn a_readonly_miss_names_the_array_and_chunk() {
    let cache = tempfile::tempdir().unwrap();
    {
        // Warm only t2m.
        let f = fixture("era5_v3", "t2m");
        let ds = InSituDataset::builder(&f.store)
            .variable("t", "t2m")
            .cache_dir(cache.path())
            .persist(true)
            .build()
            .unwrap();
        run(&ds, "all");
    }
    let ds = era5(cache.path()).readonly_cache(true).build().unwrap();
    let err = ds.all().unwrap().find_map(|b| b.err()).unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("readonly_cache") && msg.contains("u10[chunk 0]"),
        "{msg}"
    );
    let msg = era5(cache.path())
        .readonly_cache(true)
        .reset_stale_cache(true)
        .build()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("writes nothing"), "{msg}");
    let missing = cache.path().join("never-warmed");
    let msg = era5(&missing)
        .readonly_cache(true)
        .build()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("never-warmed"), "{msg}");
}

fn rewrite_log(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let text = std::fs::read_to_string(dir.join(LOG_NAME)).unwrap();
    let mut lines = text.lines();
    let mut out = format!("{}\n", lines.next().unwrap());
    for l in lines {
        let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
        edit(&mut v);
        out.push_str(&format!("{v}\n"));
    }
    std::fs::write(dir.join(LOG_NAME), out).unwrap();
}

#[test]
fn a_stale_array_raises_and_reset_rebuilds_only_that_array() {
    let cache = tempfile::tempdir().unwrap();
    run(&era5(cache.path()).persist(true).build().unwrap(), "all");
    rewrite_log(cache.path(), |v| {
        if v["array"] == "t2m" {
            v["fingerprint"] = "0000000000000000".into();
        }
    });
    let msg = build_err(era5(cache.path()).persist(true));
    assert!(
        msg.contains("[t2m]") && !msg.contains("u10") && msg.contains("reset_stale_cache"),
        "{msg}"
    );
    let ds = era5(cache.path())
        .persist(true)
        .reset_stale_cache(true)
        .build()
        .unwrap();
    let lines = log_lines(cache.path());
    assert!(lines.iter().all(|e| e["array"] == "u10"), "{lines:?}");
    assert_eq!(npy_files(cache.path()), 3, "only t2m's files were deleted");
    let s = run(&ds, "all");
    assert_eq!((s.cache_revived, s.cache_misses), (3, 3), "{s:?}");
    assert_eq!(log_lines(cache.path()).len(), 6, "t2m rebuilt and logged");
}

#[test]
fn damage_raises_but_a_missing_file_or_other_geometry_is_a_loud_miss() {
    let cache = tempfile::tempdir().unwrap();
    run(&era5(cache.path()).persist(true).build().unwrap(), "all");
    let log = cache.path().join(LOG_NAME);
    let good = std::fs::read_to_string(&log).unwrap();

    std::fs::write(
        &log,
        format!("garbage\n{}", good.split_once('\n').unwrap().1),
    )
    .unwrap();
    let msg = build_err(era5(cache.path()).persist(true));
    assert!(
        msg.contains("unreadable format header") && msg.contains(LOG_NAME),
        "{msg}"
    );
    // Even reset_stale_cache does not paper over damage.
    assert!(
        era5(cache.path())
            .persist(true)
            .reset_stale_cache(true)
            .build()
            .is_err()
    );

    let mut lines: Vec<&str> = good.lines().collect();
    lines.insert(2, "{\"array\": 5}");
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    let msg = build_err(era5(cache.path()).persist(true));
    assert!(msg.contains("line 3") && msg.contains("malformed"), "{msg}");

    std::fs::write(&log, &good).unwrap();
    rewrite_log(cache.path(), |v| {
        if v["chunk"] == 2 {
            v["file"] = "/etc/passwd".into();
        }
    });
    let msg = build_err(era5(cache.path()).persist(true));
    assert!(msg.contains("not a bare file name"), "{msg}");

    // Every file gone: each entry is consulted, rejected and refetched, and the epoch warns.
    std::fs::write(&log, &good).unwrap();
    for e in std::fs::read_dir(cache.path()).unwrap().flatten() {
        if e.file_name().to_string_lossy().ends_with(".npy") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    let t = fixture("era5_v3", "t2m");
    let ds = era5(cache.path()).persist(true).build().unwrap();
    check_epoch(&ds, "all", &[("t", &t, 0)]);
    drop(ds);
    let ds = era5(cache.path()).persist(true).build().unwrap();
    let s = run(&ds, "all");
    assert_eq!(s.cache_revived, 6, "rewritten by the first pass: {s:?}");
    drop(ds);
    rewrite_log(cache.path(), |v| v["shape"] = serde_json::json!([4, 9, 15]));
    let ds = era5(cache.path()).persist(true).build().unwrap();
    let s = run(&ds, "all");
    assert_eq!((s.cache_hits, s.cache_rejected, s.cache_misses), (0, 6, 6));
    assert_eq!(s.warnings.len(), 1, "{s:?}");
    assert!(s.warnings[0].contains("served 0 hits"), "{:?}", s.warnings);
    assert!(
        s.warnings[0].contains("6 entries were consulted and rejected")
            && !s.warnings[0].contains("  "),
        "one readable sentence: {:?}",
        s.warnings
    );
    assert_eq!(log_lines(cache.path()).len(), 6, "compacted and rewritten");
}

#[test]
fn enospc_keeps_the_pass_going_from_memory_and_logs_only_complete_files() {
    let t = fixture("era5_v3", "t2m");
    let u = fixture("era5_v3", "u10");
    let cache = tempfile::tempdir().unwrap();
    let ds = era5(cache.path())
        .persist(true)
        .cache_fail_writes_after(2)
        .build()
        .unwrap();
    check_epoch(&ds, "train", &[("t", &t, 0), ("u", &u, 0)]);
    let st = ds.cache_stats().unwrap();
    assert_eq!((st.writes, st.write_errors), (2, 4), "{st:?}");
    let warnings = ds.warnings();
    assert_eq!(warnings.len(), 1, "warned once: {warnings:?}");
    assert!(warnings[0].contains("No space left"), "{warnings:?}");
    drop(ds);
    let lines = log_lines(cache.path());
    assert_eq!(lines.len(), 2);
    assert_eq!(npy_files(cache.path()), 2, "no partial file left behind");
    let ds = era5(cache.path()).persist(true).build().unwrap();
    let s = run(&ds, "all");
    assert_eq!((s.cache_revived, s.cache_misses), (2, 4));
}

#[test]
fn a_substituted_bad_chunk_is_never_cached() {
    let f = fixture("v3_zstd", "");
    let dir = common::corrupt_copy(&f, "c/1/0/0");
    let cache = tempfile::tempdir().unwrap();
    let build = || {
        InSituDataset::builder(dir.path())
            .variable("v", "")
            .on_bad_chunk(insitubatch::OnBadChunk::Nan)
            .cache_dir(cache.path())
            .persist(true)
            .build()
            .unwrap()
    };
    let s = run(&build(), "all");
    assert_eq!(s.bad_chunks.len(), 1);
    let logged: Vec<u64> = log_lines(cache.path())
        .iter()
        .map(|e| e["chunk"].as_u64().unwrap())
        .collect();
    assert!(!logged.contains(&1), "{logged:?}");
    let s = run(&build(), "all");
    assert_eq!((s.cache_misses, s.bad_chunks.len()), (1, 1), "{s:?}");
}

#[test]
fn an_unwritable_cache_dir_is_a_clear_error() {
    // Root ignores directory permissions; sysfs refuses new directories to everyone (EPERM, or
    // EROFS where it is mounted read-only).
    let parent = tempfile::tempdir().unwrap();
    // SAFETY: geteuid has no preconditions.
    let target = if unsafe { libc::geteuid() } == 0 {
        std::path::PathBuf::from("/sys/insitubatch-cache-test/cache")
    } else {
        let locked = parent.path().join("ro");
        std::fs::create_dir(&locked).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
        locked.join("cache")
    };
    let msg = build_err(era5(&target).persist(true));
    assert!(
        msg.contains(&*target.to_string_lossy())
            && msg.contains("cannot create the cache directory")
            && (msg.contains("permission denied") || msg.contains("read-only")),
        "{msg}"
    );
    let err = InSituDataset::builder(&fixture("era5_v3", "t2m").store)
        .persist(true)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("needs a cache_dir"), "{err}");
    // An empty path would be the working directory: refused, naming the argument.
    let msg = build_err(era5(Path::new("")));
    assert!(
        msg.contains("`cache_dir`") && msg.contains("is empty"),
        "{msg}"
    );
    // A file where the directory should be, or on its path.
    let file = parent.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for target in [file.clone(), file.join("cache")] {
        let msg = build_err(era5(&target).persist(true));
        assert!(
            msg.contains(&*target.to_string_lossy()) && msg.contains("a file is in the way"),
            "{msg}"
        );
    }
}

#[test]
fn windowed_shuffled_persisted_passes_release_each_block_and_revive_from_disk() {
    let f = fixture("paired", "raw");
    let cache = tempfile::tempdir().unwrap();
    let build = |persist: bool| {
        let b = InSituDataset::builder(&f.store)
            .variable("x", "raw")
            .window("y", "raw", 24)
            .batch_size(3)
            .block_chunks(3)
            .seed(7);
        if persist {
            b.cache_dir(cache.path()).persist(true)
        } else {
            b
        }
        .build()
        .unwrap()
    };
    let held = build(false);
    let released = build(true);
    let (a, b) = (held.train().unwrap(), released.train().unwrap());
    // Same samples, far less residency: a few blocks x 2 labels x 3 chunks (blocks thinned by
    // dropped anchors let a batch straddle several), instead of most of the split. The spec's
    // exact figures are checked on the read plan itself.
    assert_eq!(a.order().rows, b.order().rows);
    let slot = 5 * 6 * 4;
    assert!(
        b.read_ahead_bytes() < a.read_ahead_bytes() && b.read_ahead_bytes() <= 24 * slot,
        "released {} held {}",
        b.read_ahead_bytes(),
        a.read_ahead_bytes()
    );
    drop((a, b));
    let anchors = check_epoch(&released, "train", &[("x", &f, 0), ("y", &f, 0)]);
    assert_eq!(sorted(anchors), (0..61 - 24).collect::<Vec<_>>());
    let s = run(&released, "train");
    assert!(s.pinned_peak_bytes <= 24 * slot, "{s:?}");
    // Chunks read by blocks far apart came back from their files, not from the store.
    assert_eq!(s.tiles_read, 0, "{s:?}");
    assert!(s.cache_revived > 0, "{s:?}");
}

#[test]
fn a_bad_chunk_read_again_for_a_later_block_is_listed_once_and_nan_in_every_row() {
    // Chunk 30 is x's sample at anchor 30 and y's (24 ahead) at anchor 6: two blocks apart,
    // each block's chunks released as it drains and revived from the cache for the next. A
    // stand-in is never written to the cache, so the later block reads the bad chunk again.
    let f = fixture("paired", "raw");
    let dir = common::corrupt_copy(&f, "raw/c/30/0/0");
    let cache = tempfile::tempdir().unwrap();
    let ds = InSituDataset::builder(dir.path())
        .variable("x", "raw")
        .window("y", "raw", 24)
        .batch_size(3)
        .block_chunks(3)
        .seed(7)
        .on_bad_chunk(insitubatch::OnBadChunk::Nan)
        .cache_dir(cache.path())
        .persist(true)
        .build()
        .unwrap();
    let item = 4;
    let sample = |index: u64| {
        let bytes = sample_of(&f.reference, &f.shape, 0, index, item);
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect::<Vec<f32>>()
    };
    for epoch in 0..2 {
        ds.set_epoch(epoch);
        let mut pass = ds.train().unwrap();
        let mut nan_rows = 0;
        for b in pass.by_ref() {
            let b = b.unwrap();
            for (label, shift) in [("x", 0), ("y", 24)] {
                let v: &[f32] = b.array(label).unwrap().values().unwrap();
                for (r, &a) in b.sample_indices().iter().enumerate() {
                    let row = &v[r * 30..(r + 1) * 30];
                    if a + shift == 30 {
                        assert!(row.iter().all(|x| x.is_nan()), "{label} at anchor {a}");
                        nan_rows += 1;
                    } else {
                        assert_eq!(row, sample(a + shift), "{label} at anchor {a}");
                    }
                }
            }
        }
        assert_eq!(nan_rows, 2, "x at anchor 30 and y at anchor 6");
        let s = pass.stats();
        let keys: Vec<&str> = s.bad_chunks.iter().map(|b| b.key.as_str()).collect();
        assert_eq!(keys, ["raw/c/30/0/0"], "listed once: {s:?}");
    }
}

/// Runs in a child process (see the next test): a slow persisting epoch, to be killed.
#[test]
fn child_slow_persisting_writer() {
    let Ok(cache) = std::env::var("INSITUBATCH_TEST_CHILD_CACHE") else {
        return; // only meaningful as the child of the kill test
    };
    let f = fixture("paired", "raw");
    let ds = InSituDataset::builder(&f.store)
        .variable("r", "raw")
        .batch_size(1)
        .block_chunks(1)
        .max_inflight(1)
        .prefetch_depth(1)
        .cache_dir(&cache)
        .persist(true)
        .build()
        .unwrap();
    for b in ds.train().unwrap() {
        b.unwrap();
        std::thread::sleep(Duration::from_millis(40));
    }
    panic!("the parent should have killed this process before the epoch ended");
}

#[test]
fn sigkill_mid_epoch_keeps_exactly_the_finished_chunks() {
    let f: FixtureArray = fixture("paired", "raw");
    let cache = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_slow_persisting_writer", "--nocapture"])
        .env("INSITUBATCH_TEST_CHILD_CACHE", cache.path())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while log_lines(cache.path()).len() < 10 {
        assert!(
            Instant::now() < deadline,
            "the child never logged 10 chunks"
        );
        assert!(child.try_wait().unwrap().is_none(), "the child ended early");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let logged = log_lines(cache.path()).len() as u64;
    assert!((10..61).contains(&logged), "{logged}");

    // The lock died with the child: exactly the logged chunks revive, the rest are fetched...
    let build = || {
        InSituDataset::builder(&f.store)
            .variable("r", "raw")
            .batch_size(4)
            .cache_dir(cache.path())
            .persist(true)
            .build()
            .unwrap()
    };
    let s = run(&build(), "all");
    assert_eq!(
        (s.cache_revived, s.cache_misses),
        (logged, 61 - logged),
        "{s:?}"
    );
    // ...and every value, the child's files included, equals zarr-python's.
    let ds = build();
    let anchors = check_epoch(&ds, "train", &[("r", &f, 0)]);
    assert_eq!(sorted(anchors), (0..61).collect::<Vec<_>>());
    let s = run(&ds, "all");
    assert_eq!((s.cache_misses, s.tiles_read), (0, 0), "{s:?}");
}

/// A tmpfs of `bytes` mounted for the test (root only), unmounted when dropped.
struct SmallTmpfs(tempfile::TempDir);

impl SmallTmpfs {
    fn mount(bytes: usize) -> Option<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .ok()?
            .success();
        ok.then_some(Self(dir))
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn a_full_device_keeps_the_pass_going_and_logs_only_complete_files() {
    // A real ENOSPC: a 32 KiB tmpfs holds the lock, the log and three of the six slot files.
    let Some(fs) = SmallTmpfs::mount(32 << 10) else {
        eprintln!("skipped: needs root and mount (the injected-ENOSPC test covers the logic)");
        return;
    };
    let t = fixture("era5_v3", "t2m");
    let u = fixture("era5_v3", "u10");
    let cache = fs.0.path().join("cache");
    let ds = era5(&cache).persist(true).build().unwrap();
    check_epoch(&ds, "train", &[("t", &t, 0), ("u", &u, 0)]);
    let st = ds.cache_stats().unwrap();
    assert!(
        st.write_errors > 0 && st.writes + st.write_errors == 6,
        "{st:?}"
    );
    let warnings = ds.warnings();
    assert!(
        warnings.iter().any(|w| w.contains("No space left")),
        "{warnings:?}"
    );
    drop(ds);
    // Every logged file is complete; nothing half-written is left behind.
    let slot = 4 * 9 * 16 * 4;
    for e in log_lines(&cache) {
        let len = std::fs::metadata(cache.join(e["file"].as_str().unwrap()))
            .unwrap()
            .len();
        assert!(
            len >= (insitubatch::pool::disk::HEADER_LEN + slot) as u64,
            "{e}"
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // The next run revives what was logged and fetches the rest.
    let logged = log_lines(&cache).len() as u64;
    let ds = era5(&cache).persist(true).build().unwrap();
    let s = run(&ds, "all");
    assert_eq!(
        (s.cache_revived, s.cache_misses),
        (logged, 6 - logged),
        "{s:?}"
    );
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn revived_slots_at_rest_hold_no_descriptor_and_a_vanished_file_is_refetched() {
    let t = fixture("era5_v3", "t2m");
    let cache = tempfile::tempdir().unwrap();
    run(&era5(cache.path()).persist(true).build().unwrap(), "all");
    // A budget that keeps the whole split resident: revived slots rest in the pool between
    // passes, with their files closed.
    let probe = era5(cache.path()).persist(true).build().unwrap();
    let split = probe.split_bytes("train").unwrap();
    drop(probe);
    let ds = era5(cache.path())
        .persist(true)
        .cache_budget_bytes(split)
        .build()
        .unwrap();
    let before = open_fds();
    let s = run(&ds, "train");
    assert_eq!(s.cache_revived, 6, "{s:?}");
    assert!(
        open_fds() <= before,
        "{} descriptors open after the pass, {before} before",
        open_fds()
    );
    // Resident hits reopen their files...
    let s = run(&ds, "train");
    assert_eq!(
        (s.cache_hits, s.cache_revived, s.tiles_read),
        (6, 0, 0),
        "{s:?}"
    );
    // ...and a file deleted meanwhile is a miss, fetched again, with the right values.
    for e in std::fs::read_dir(cache.path()).unwrap().flatten() {
        if e.file_name().to_string_lossy().ends_with(".npy") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    check_epoch(&ds, "train", &[("t", &t, 0)]);
    let s = run(&ds, "train");
    assert_eq!(s.cache_misses, 0, "rewritten by the pass before: {s:?}");
}

#[test]
fn lookups_ahead_beside_fetches_deliver_every_value_and_end_with_the_pass() {
    // The planner looks cached chunks' files up ahead of their admissions while it sends the
    // misses to the fetchers. With one read in flight, a pass half revived and half fetched must
    // still deliver every value and count each chunk once, and a pass dropped early must leave
    // no descriptor open.
    let refs = [
        ("t", &fixture("era5_v3", "t2m"), 0usize),
        ("u", &fixture("era5_v3", "u10"), 0),
    ];
    let cache = tempfile::tempdir().unwrap();
    let probe = era5(cache.path()).build().unwrap();
    let manifest =
        insitubatch::split_by_chunk(&probe.variables()[0].geom, &[0.67, 0.33], 0, true, None)
            .unwrap();
    drop(probe);
    let partly = |max_inflight: usize| {
        era5(cache.path())
            .manifest(manifest.clone())
            .persist(true)
            .max_inflight(max_inflight)
            .build()
            .unwrap()
    };
    // The train split's chunks in the cache, the other split's not.
    let train_only = || {
        let _ = std::fs::remove_dir_all(cache.path());
        run(&partly(32), "train").cache_misses
    };
    let cached = train_only();
    assert_eq!(log_lines(cache.path()).len() as u64, cached);
    let all = run(&partly(32), "all");
    let all = all.cache_hits + all.cache_misses;
    assert!(all > cached, "the other split has chunks of its own");
    train_only();
    check_epoch(&partly(1), "all", &refs);
    train_only();
    let s = run(&partly(1), "all");
    assert_eq!(
        (s.cache_revived, s.cache_misses),
        (cached, all - cached),
        "{s:?}"
    );

    // Everything cached now: a pass dropped after its first batch, lookups still ahead of it.
    let ds = partly(32);
    let before = open_fds();
    let mut pass = ds.iter("all").unwrap();
    pass.next().unwrap().unwrap();
    drop(pass);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while open_fds() > before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        open_fds() <= before,
        "{} descriptors open after the pass was dropped, {before} before",
        open_fds()
    );
}

/// Runs in a child process (see the next test): a revival pass with the process out of
/// descriptors, then one with them back.
#[test]
fn child_revival_out_of_descriptors() {
    let Ok(cache) = std::env::var("INSITUBATCH_TEST_CHILD_NOFILE") else {
        return; // only meaningful as the child of the next test
    };
    let ds = era5(Path::new(&cache)).persist(true).build().unwrap();
    let fds = || -> Vec<i32> {
        let entries = std::fs::read_dir("/proc/self/fd").unwrap().flatten();
        entries
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    };
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0);
    // No descriptor left: the limit just above the highest one open, every hole below filled.
    let low = libc::rlimit {
        rlim_cur: fds().into_iter().max().unwrap() as u64 + 1,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads the struct we pass; this process is ours alone.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
    let mut fillers = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        fillers.push(f);
    }
    let err = match ds.iter("train") {
        Err(e) => e.to_string(),
        Ok(pass) => pass
            .filter_map(|b| b.err())
            .next()
            .expect("a pass with no descriptor left fails")
            .to_string(),
    };
    drop(fillers);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    assert!(
        err.contains(".npy") && err.contains("open-file limit"),
        "{err}"
    );
    // Not the files' fault: every entry stays and revives.
    let s = run(&ds, "train");
    assert_eq!(
        (s.cache_revived, s.cache_rejected, s.cache_misses),
        (6, 0, 0),
        "{s:?}"
    );
    println!("CHILD OK");
}

#[test]
fn a_process_out_of_descriptors_fails_the_revival_and_keeps_the_cache() {
    let cache = tempfile::tempdir().unwrap();
    run(&era5(cache.path()).persist(true).build().unwrap(), "train");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_revival_out_of_descriptors", "--nocapture"])
        .env("INSITUBATCH_TEST_CHILD_NOFILE", cache.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("CHILD OK"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
