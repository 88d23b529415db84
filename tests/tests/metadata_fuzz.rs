//! Stores whose array metadata was damaged at random: a copy of a zarr-python fixture (v2 and
//! v3, compressed, sharded, inner-chunked, F order, big-endian, with fill values) whose
//! `zarr.json` or `.zarray` had one to three of its values replaced by others of another type,
//! range or shape (or dropped, or the document cut short). Whatever it says, building a dataset
//! over it and iterating up to 20 batches either works or ends in an error with a message that
//! is not a panic or an internal error; never a panic on the caller's thread, never a wait of
//! more than 10 s for a batch. `ISB_METADATA_CASES=n` runs more than the 300 of a CI run.

use std::path::Path;
use std::time::Duration;

use insitubatch::{Cycle, EngineError, InSituDataset, MountAlignment, SampleBound, TimedOut};
use insitubatch_tests::{Rng, copy_dir, fixture_arrays, panic_message};
use serde_json::{Value, json};

/// Cases per test: 300, or `ISB_METADATA_CASES`.
fn cases() -> u64 {
    std::env::var("ISB_METADATA_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300)
}

/// Array-root fixtures, one of each layout.
const STORES: [&str; 10] = [
    "v2_blosc_lz4",
    "v2_zstd_slash",
    "v2_forder",
    "v2_fill",
    "v3_zstd",
    "v3_bigendian",
    "v3_inner",
    "v3_sharded",
    "v3_sharded_start",
    "v3_fill",
];

/// A value a metadata field might wrongly hold.
fn odd(r: &mut Rng) -> Value {
    let choices = [
        Value::Null,
        json!(true),
        json!(0),
        json!(-1),
        json!(1),
        json!(3),
        json!(1e300),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(""),
        json!("x"),
        json!("<f4"),
        json!(">u8"),
        json!("|b1"),
        json!("float128"),
        json!("int8"),
        json!("uint64"),
        json!("complex64"),
        json!("string"),
        json!("NaN"),
        json!("C"),
        json!("F"),
        json!("/"),
        json!([]),
        json!([0]),
        json!([1]),
        json!([0, 0, 0]),
        json!([1, 1, 1]),
        json!([-1, 2, 3]),
        json!([1_000_000_000_000u64, 2, 2]),
        json!([[1]]),
        json!({}),
        json!({"name": "zstd"}),
        json!({"name": "zstd", "configuration": {"level": "x"}}),
        json!({"name": "blosc"}),
        json!({"name": "nope"}),
        json!({"name": "sharding_indexed", "configuration": {}}),
        json!({"name": "regular", "configuration": {"chunk_shape": [0, 1, 1]}}),
        json!([{"name": "bytes"}]),
        json!([{"name": "transpose", "configuration": {"order": [0, 0, 1]}}]),
    ];
    choices[r.range(0, choices.len() as u64 - 1) as usize].clone()
}

/// Replaces, drops or descends into one value of `v`.
fn mutate(r: &mut Rng, v: &mut Value) {
    match v {
        Value::Object(map) if !map.is_empty() && !r.chance(0.2) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = keys[r.range(0, keys.len() as u64 - 1) as usize].clone();
            match r.range(0, 4) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    map.insert(key, odd(r));
                }
                _ => mutate(r, map.get_mut(&key).unwrap()),
            }
        }
        Value::Array(items) if !items.is_empty() && !r.chance(0.2) => {
            let i = r.range(0, items.len() as u64 - 1) as usize;
            match r.range(0, 3) {
                0 => {
                    items.remove(i);
                }
                1 => items[i] = odd(r),
                _ => mutate(r, &mut items[i]),
            }
        }
        _ => *v = odd(r),
    }
}

/// An error a caller can act on: a message, and no panic or internal error behind it.
fn check(case: u64, what: &str, e: &EngineError, meta: &str) {
    let message = e.to_string();
    assert!(
        !matches!(e, EngineError::ActorPanicked { .. })
            && !message.contains("panicked")
            && !message.contains("internal error")
            && !message.is_empty(),
        "case {case}, {what}: {message}\nmetadata: {meta}"
    );
}

/// Opens the damaged store and reads up to 20 batches of every sample; returns how many it read.
fn exercise(case: u64, store: &Path, meta: &str) -> usize {
    let ds = match InSituDataset::builder(store)
        .variable("x", "")
        .batch_size(3)
        .executor_threads(1 + (case % 2) as usize)
        .build()
    {
        Ok(ds) => ds,
        Err(e) => {
            check(case, "build", &e, meta);
            return 0;
        }
    };
    let mut pass = match ds.all() {
        Ok(pass) => pass,
        Err(e) => {
            check(case, "start", &e, meta);
            return 0;
        }
    };
    let mut read = 0;
    while read < 20 {
        match pass.next_timeout(Duration::from_secs(10)) {
            Ok(Some(Ok(_))) => read += 1,
            Ok(Some(Err(e))) => {
                check(case, "next", &e, meta);
                break;
            }
            Ok(None) => break,
            Err(TimedOut) => panic!("case {case}: no batch in 10 s\nmetadata: {meta}"),
        }
    }
    read
}

#[test]
fn damaged_array_metadata_is_a_clear_error_or_reads_never_a_panic() {
    let cases = cases();
    let tmp = tempfile::tempdir().unwrap();
    let fixtures = fixture_arrays();
    let mut read = 0;
    for case in 0..cases {
        let mut r = Rng::new(case);
        let name = STORES[(case % STORES.len() as u64) as usize];
        let fx = fixtures.iter().find(|f| f.case == name).unwrap();
        let store = tmp.path().join(format!("{case}.zarr"));
        copy_dir(&fx.store, &store);
        let file = ["zarr.json", ".zarray"]
            .iter()
            .map(|f| store.join(f))
            .find(|p| p.exists())
            .unwrap();
        let mut meta: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        for _ in 0..r.range(1, 3) {
            mutate(&mut r, &mut meta);
        }
        let mut text = meta.to_string();
        if r.chance(0.05) {
            // A document cut short.
            text.truncate(r.range(0, text.len() as u64) as usize);
        }
        std::fs::write(&file, &text).unwrap();
        match std::panic::catch_unwind(|| exercise(case, &store, &text)) {
            Ok(batches) => read += (batches > 0) as u64,
            Err(e) => {
                let msg = panic_message(&*e);
                panic!("case {case} ({}): {msg}\nmetadata: {text}", fx.case);
            }
        }
        std::fs::remove_dir_all(&store).unwrap();
    }
    // Some damage leaves a readable array (an attribute, a fill value): reading is exercised.
    eprintln!("{read} of {cases} damaged stores read batches");
    assert!(
        read >= cases / 100,
        "only {read} of {cases} damaged stores read a batch"
    );
}

#[test]
fn arrays_whose_field_is_empty_or_too_large_are_refused_naming_them() {
    // The fuzz's finds: a field axis of length 0 left every sample-axis chunk without a stored
    // chunk to read, and the pass waited for it forever; a field of 2^64 - 1 elements
    // overflowed a sample's byte count.
    let fx = fixture_arrays()
        .into_iter()
        .find(|f| f.case == "v3_fill")
        .unwrap();
    for (length, want) in [
        (json!(0), vec!["`variables` = x", "[8, 0]", "holds nothing"]),
        (json!(u64::MAX), vec!["zarr.json", "more than 2^64 bytes"]),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        copy_dir(&fx.store, tmp.path());
        let file = tmp.path().join("zarr.json");
        let mut meta: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        meta["shape"][1] = length;
        std::fs::write(&file, meta.to_string()).unwrap();
        let Err(e) = InSituDataset::builder(tmp.path()).variable("x", "").build() else {
            panic!("a field of {} elements built a dataset", meta["shape"][1]);
        };
        let msg = e.to_string();
        assert!(want.iter().all(|w| msg.contains(w)), "{msg}");
    }
}

/// A `units` a time coordinate might wrongly (or oddly but rightly) carry.
const UNITS: [&str; 27] = [
    "hours since 1979-01-01 00:00:00",
    "days since 1979-01-01",
    "seconds since 1970-01-01T00:00:00Z",
    "minutes since 9999-12-31T23:59:59",
    "hours since 0001-01-01",
    "days since -4713-01-01",
    "hours since",
    "since 1979-01-01",
    "hours",
    "",
    "hours since 1979-13-45",
    "hours since 1979-01-01 25:61:61",
    "years since 2000-01-01",
    "months since 2000-01-01",
    "microseconds since 1970-01-01",
    "nanoseconds since 1970-01-01",
    "weeks since 2000-01-01",
    "hours since 1979-01-01 00:00:00 +05:00",
    "hours since 1979-01-01T00:00:00.123456789",
    "hours since 1e300",
    "hours since 292277026596-12-04",
    "days since 2000-02-30",
    "h since 2000-01-01",
    "hours  since  2000-01-01",
    "HOURS SINCE 2000-01-01",
    "days since 1979-1-1",
    "hours since 1979-01-01 00:00:00 UTC",
];

/// Reads the time coordinate every way the library does: its values and dates, a cycle index,
/// a split by dates, and the store mounted in itself aligned on it three ways.
fn exercise_times(case: u64, store: &Path, meta: &str) {
    let fail = |what: &str, e: EngineError| check(case, what, &e, meta);
    match insitubatch::coordinate_values(store, "x", Some("time"), 0, &[]) {
        Ok(cv) => {
            let n = cv.as_f64().map_or(0, |v| v.len());
            for i in 0..n {
                let _ = cv.time_at(i);
            }
            let _ = cv.to_json();
            for cycle in [Cycle::DayOfYear, Cycle::Month, Cycle::HourOfDay] {
                if let Err(e) = insitubatch::cycle_index(&cv, cycle) {
                    fail("cycle", e);
                }
            }
        }
        Err(e) => fail("coordinate_values", e),
    }
    let ds = match InSituDataset::builder(store).variable("x", "x").build() {
        Ok(ds) => ds,
        Err(e) => return fail("build", e),
    };
    let ranges = [(
        "train".to_string(),
        SampleBound::Time("1979-01-02".into()),
        SampleBound::Time("1979-01-04T06:00".into()),
    )];
    if let Err(e) = insitubatch::sample_ranges(store, &ds.variables()[0].geom, &ranges, &[]) {
        fail("sample_ranges", e);
    }
    for alignment in [
        MountAlignment::Coordinate("time".into()),
        MountAlignment::Containing("time".into()),
        MountAlignment::Nearest("time".into()),
    ] {
        let built = InSituDataset::builder(store)
            .mount("m", store)
            .align_mount("m", alignment)
            .variable("x", "x")
            .variable("y", "m/x")
            .batch_size(4)
            .build();
        let ds = match built {
            Ok(ds) => ds,
            Err(e) => {
                fail("build aligned", e);
                continue;
            }
        };
        match ds.all() {
            Ok(pass) => {
                for b in pass.take(5) {
                    if let Err(e) = b {
                        fail("next aligned", e);
                        break;
                    }
                }
            }
            Err(e) => fail("start aligned", e),
        }
    }
}

#[test]
fn damaged_time_coordinates_are_a_clear_error_never_a_panic() {
    let cases = cases();
    let fx = fixture_arrays()
        .into_iter()
        .find(|f| f.case == "aligned")
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let odd_fill = [
        json!(i64::MAX),
        json!(i64::MIN),
        json!(-1),
        json!(1e300),
        json!("NaN"),
    ];
    let calendars = [
        json!("standard"),
        json!("proleptic_gregorian"),
        json!("noleap"),
        json!("360_day"),
        json!("julian"),
        json!("none"),
        json!(""),
        json!(7),
    ];
    for case in 0..cases {
        let mut r = Rng::new(case ^ 0x7153);
        let store = tmp.path().join(format!("{case}.zarr"));
        copy_dir(&fx.store, &store);
        let root = store.join("zarr.json");
        let mut doc: Value = serde_json::from_slice(&std::fs::read(&root).unwrap()).unwrap();
        let time = &mut doc["consolidated_metadata"]["metadata"]["time"];
        let pick = |r: &mut Rng, n: usize| r.range(0, n as u64 - 1) as usize;
        if r.chance(0.8) {
            time["attributes"]["units"] = json!(UNITS[pick(&mut r, UNITS.len())]);
        }
        if r.chance(0.3) {
            time["attributes"]["calendar"] = calendars[pick(&mut r, calendars.len())].clone();
        }
        if r.chance(0.3) {
            // Every time the fill value: the chunks are gone.
            time["fill_value"] = odd_fill[pick(&mut r, odd_fill.len())].clone();
            std::fs::remove_dir_all(store.join("time/c")).unwrap();
        }
        if r.chance(0.2) {
            let types = ["float64", "float32", "int32", "uint8", "bool"];
            time["data_type"] = json!(types[pick(&mut r, types.len())]);
        }
        if r.chance(0.2) {
            mutate(&mut r, time);
        }
        let text = time.to_string();
        std::fs::write(&root, doc.to_string()).unwrap();
        if let Err(e) = std::panic::catch_unwind(|| exercise_times(case, &store, &text)) {
            let msg = panic_message(&*e);
            panic!("time case {case}: {msg}\ntime: {text}");
        }
        std::fs::remove_dir_all(&store).unwrap();
    }
}

#[test]
fn damaged_group_metadata_is_a_clear_error_never_a_panic() {
    // A consolidated v3 group (its `zarr.json` holds every array's document) and a listed v2
    // group (`.zgroup`, `.zattrs` and each array's `.zattrs`, with `_ARRAY_DIMENSIONS`), one
    // document damaged per case; the data variables are then found, opened and read.
    let cases = cases();
    let fixtures = fixture_arrays();
    let tmp = tempfile::tempdir().unwrap();
    let documents: [(&str, &[&str]); 2] = [
        ("era5_v3", &["zarr.json"]),
        (
            "era5_v2",
            &[
                ".zgroup",
                ".zattrs",
                "t2m/.zattrs",
                "time/.zattrs",
                "station/.zattrs",
            ],
        ),
    ];
    for case in 0..cases {
        let mut r = Rng::new(case ^ 0x6709);
        let (name, files) = documents[(case % 2) as usize];
        let fx = fixtures.iter().find(|f| f.case == name).unwrap();
        let store = tmp.path().join(format!("{case}.zarr"));
        copy_dir(&fx.store, &store);
        let file = store.join(files[r.range(0, files.len() as u64 - 1) as usize]);
        let mut doc: Value = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(json!({}));
        for _ in 0..r.range(1, 3) {
            mutate(&mut r, &mut doc);
        }
        let text = doc.to_string();
        std::fs::write(&file, &text).unwrap();
        let outcome = std::panic::catch_unwind(|| {
            if let Err(e) = insitubatch::geometries(&store, None, 0) {
                check(case, "geometries", &e, &text);
            }
            let ds = match InSituDataset::builder(&store).batch_size(4).build() {
                Ok(ds) => ds,
                Err(e) => return check(case, "build", &e, &text),
            };
            match ds.all() {
                Ok(pass) => {
                    for b in pass.take(10) {
                        if let Err(e) = b {
                            check(case, "next", &e, &text);
                            break;
                        }
                    }
                }
                Err(e) => check(case, "start", &e, &text),
            }
        });
        if let Err(e) = outcome {
            let msg = panic_message(&*e);
            panic!(
                "group case {case} ({name}, {}): {msg}\n{text}",
                file.display()
            );
        }
        std::fs::remove_dir_all(&store).unwrap();
    }
}
