//! `isb_dataset_open` over thousands of random configs: valid ones with one part replaced by
//! something of the wrong type, range or shape, and random keys added. Whatever the config, the
//! call returns a status and (unless it opened) an error with a message; never a panic
//! (`ISB_PANIC`) or an internal error. A config that opens is iterated for a few batches of
//! each split with a bounded wait, which must end in a batch, the end of the epoch or an error
//! of the same kinds. The store is written by hand: an hourly field in chunks of four with a CF
//! `time`, a second field chunked by three, a static field and a seven-day climatology.

use std::ffi::{CStr, CString};
use std::path::Path;

use serde_json::{Value, json};

use crate::api::*;
use crate::status::*;

/// SplitMix64, seeded per case so that a failure names a case that can be rerun.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Writes an uncompressed v3 array (C order, little endian) of `values` in chunks.
fn array(root: &Path, name: &str, shape: &[u64], chunks: &[u64], dtype: &str, attrs: Value) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let dims: Vec<&str> = match shape.len() {
        1 => vec!["time"],
        2 => vec!["y", "x"],
        _ => vec!["time", "y", "x"],
    };
    let meta = json!({"zarr_format": 3, "node_type": "array", "shape": shape,
        "data_type": dtype, "chunk_grid": {"name": "regular", "configuration":
        {"chunk_shape": chunks}}, "chunk_key_encoding": {"name": "default"},
        "fill_value": 0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "dimension_names": dims, "attributes": attrs});
    std::fs::write(dir.join("zarr.json"), meta.to_string()).unwrap();
    let grid: Vec<u64> = shape
        .iter()
        .zip(chunks)
        .map(|(s, c)| s.div_ceil(*c))
        .collect();
    let n_chunks: u64 = grid.iter().product();
    let per_chunk: u64 = chunks.iter().product();
    let item = if dtype == "int64" { 8 } else { 4 };
    for k in 0..n_chunks {
        // The chunk's grid index, last axis fastest.
        let mut rest = k;
        let mut idx = vec![0u64; grid.len()];
        for d in (0..grid.len()).rev() {
            idx[d] = rest % grid[d];
            rest /= grid[d];
        }
        let bytes: Vec<u8> = (0..per_chunk)
            .flat_map(|i| {
                let v = (k * per_chunk + i) as i64;
                if item == 8 {
                    v.to_le_bytes().to_vec()
                } else {
                    (v as f32).to_le_bytes().to_vec()
                }
            })
            .collect();
        let key: Vec<String> = idx.iter().map(u64::to_string).collect();
        let file = dir.join("c").join(key.join("/"));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, bytes).unwrap();
    }
}

fn store(root: &Path) {
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(
        root.join("zarr.json"),
        json!({"zarr_format": 3, "node_type": "group"}).to_string(),
    )
    .unwrap();
    array(root, "t2m", &[24, 3, 4], &[4, 3, 4], "float32", json!({}));
    array(root, "u10", &[24, 3, 4], &[3, 3, 4], "float32", json!({}));
    let hours = json!({"units": "hours since 2000-01-01 00:00"});
    array(root, "time", &[24], &[24], "int64", hours);
    array(root, "orog", &[3, 4], &[2, 4], "float32", json!({}));
    array(root, "clim", &[7, 3, 4], &[2, 3, 4], "float32", json!({}));
}

/// A config that opens: every feature the config has, each used once.
fn valid(store: &str, mount: &str, cache: &str) -> Value {
    json!({
        "store": store,
        "variables": [
            "t2m",
            {"label": "y", "path": "t2m", "offset": 2},
            {"label": "u", "path": "u10", "region": [[0, 2], [-1, 3]], "wrap": true},
            {"label": "o", "path": "orog", "static": true},
            {"label": "c", "path": "clim", "index": (0..24).map(|i| i % 7).collect::<Vec<_>>()},
            {"label": "m", "path": "again/t2m"}
        ],
        "mounts": {"again": {"store": mount, "align": {"nearest": "time"}}},
        "stacks": {"x": ["t2m", "y"]},
        "patch": {"shape": [3], "wrap": [true], "per_sample": 2},
        "batch_size": 5, "block_chunks": 2, "fast_first_batch": true,
        "prefetch_next_epoch": true, "sample_stride": 2,
        "sample_phase": 1, "max_inflight": 3, "prefetch_depth": 2, "seed": 4, "shuffle": true,
        "cache_budget_bytes": 1 << 20, "memory_limit_bytes": 1u64 << 34, "on_bad_chunk": "nan",
        "executor_threads": 1, "io_backend": "threads", "cache_dir": cache, "persist": false,
        "reset_stale_cache": false, "readonly_cache": false, "cache_direct_io": false,
        "rank": 0, "world_size": 1, "even_train": true, "drop_last": ["train"],
        "storage_options": {},
        "chunk_transforms": [{"type": "affine", "scale": 2.0, "offset": 1.0}],
        "manifest": null
    })
}

/// Something of another type, range or shape than what a key takes.
fn odd_value(r: &mut Rng, cfg: &Value) -> Value {
    let long = "x".repeat(5000);
    let choices = [
        Value::Null,
        json!(true),
        json!(false),
        json!(0),
        json!(1),
        json!(-1),
        json!(-9_223_372_036_854_775_807i64),
        json!(u64::MAX),
        json!(1u64 << 40),
        json!(4097),
        json!(2.5),
        json!(1e300),
        json!(""),
        json!("x"),
        json!(long),
        json!("/"),
        json!(".."),
        json!("again/t2m"),
        json!("t2m"),
        json!("time"),
        json!("1979-01-01"),
        json!([]),
        json!([1, "a", null]),
        json!([[0, 1]]),
        json!([[5, 2]]),
        json!([[-9, 9], [0, 99]]),
        json!({}),
        json!({"a": 1}),
        json!({"containing": "time"}),
        json!({"nearest": 3}),
        json!({"x": ["t2m", "t2m"]}),
        json!({"train": [0, 8], "val": ["2000-01-02", 30]}),
        json!([{"type": "clip", "min": 1.0, "max": 0.0}]),
        json!([{"type": "coarsen", "factors": [0, 2]}]),
        json!(["t2m", {"label": "t2m", "path": "u10"}]),
        json!((0..24).map(|i| i * 3).collect::<Vec<_>>()),
    ];
    match r.below(choices.len() + 1) {
        // A part of the valid config somewhere else.
        i if i == choices.len() => {
            let keys: Vec<&String> = cfg.as_object().unwrap().keys().collect();
            cfg[r.pick(&keys).as_str()].clone()
        }
        i => choices[i].clone(),
    }
}

/// Replaces one value somewhere inside `v` (any depth) with an odd one, or drops it.
fn mutate(r: &mut Rng, v: &mut Value, whole: &Value) {
    match v {
        Value::Object(map) if !map.is_empty() && r.below(3) != 0 => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = r.pick(&keys).clone();
            match r.below(5) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    let odd = odd_value(r, whole);
                    map.insert(key, odd);
                }
                _ => mutate(r, map.get_mut(&key).unwrap(), whole),
            }
        }
        Value::Array(items) if !items.is_empty() && r.below(3) != 0 => {
            let i = r.below(items.len());
            match r.below(4) {
                0 => {
                    items.remove(i);
                }
                1 => items[i] = odd_value(r, whole),
                _ => mutate(r, &mut items[i], whole),
            }
        }
        _ => *v = odd_value(r, whole),
    }
}

/// The status of `status` is one a caller can act on, and a failure carries a message.
fn check_outcome(case: u64, what: &str, status: IsbStatus, err: *mut IsbError, cfg: &Value) {
    let message = if err.is_null() {
        String::new()
    } else {
        // SAFETY: a live error this library returned, read before it is freed.
        let m = unsafe { CStr::from_ptr(isb_error_message(err)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: the same error, freed once.
        unsafe { isb_error_free(err) };
        m
    };
    assert!(
        !matches!(status, IsbStatus::IsbPanic | IsbStatus::IsbInternal),
        "case {case}, {what}: {status:?} {message}\nconfig: {cfg}"
    );
    if !matches!(
        status,
        IsbStatus::IsbOk | IsbStatus::IsbEndOfEpoch | IsbStatus::IsbTimedOut
    ) {
        assert!(
            !message.is_empty(),
            "case {case}, {what}: {status:?} without a message"
        );
    }
}

/// Opens `cfg` and, when it opens, reads a few batches of each split.
fn exercise(case: u64, cfg: &Value) -> bool {
    let text = CString::new(cfg.to_string()).unwrap();
    let mut ds: *mut IsbDataset = std::ptr::null_mut();
    let mut err: *mut IsbError = std::ptr::null_mut();
    // SAFETY: a NUL-terminated config and writable out-pointers.
    let status = unsafe { isb_dataset_open(text.as_ptr(), &mut ds, &mut err) };
    check_outcome(case, "open", status, err, cfg);
    if status != IsbStatus::IsbOk {
        assert!(
            ds.is_null(),
            "case {case}: a failed open handed out a dataset"
        );
        return false;
    }
    for split in [c"train", c"val", c"all"] {
        let mut it: *mut IsbIter = std::ptr::null_mut();
        let mut err: *mut IsbError = std::ptr::null_mut();
        // SAFETY: a live dataset, a NUL-terminated split name, writable out-pointers.
        let status = unsafe { isb_iter_start(ds, split.as_ptr(), &mut it, &mut err) };
        check_outcome(case, "start", status, err, cfg);
        if status != IsbStatus::IsbOk {
            continue;
        }
        let mut waits = 0;
        for _ in 0..4 {
            let mut b: *mut IsbBatch = std::ptr::null_mut();
            let mut err: *mut IsbError = std::ptr::null_mut();
            // SAFETY: a live iteration and writable out-pointers.
            let status = unsafe { isb_iter_next_timeout(it, 2_000, &mut b, &mut err) };
            check_outcome(case, "next", status, err, cfg);
            // SAFETY: NULL or a batch this call returned.
            unsafe { isb_batch_free(b) };
            waits += (status == IsbStatus::IsbTimedOut) as u32;
            assert!(waits < 3, "case {case}: no batch in 6 s\nconfig: {cfg}");
            if status != IsbStatus::IsbOk && status != IsbStatus::IsbTimedOut {
                break;
            }
        }
        // SAFETY: a live iteration, freed once (mid-epoch: it stops the pass).
        unsafe { isb_iter_free(it) };
    }
    // SAFETY: a live dataset, freed once.
    unsafe { isb_dataset_free(ds) };
    true
}

#[test]
fn random_configs_get_a_status_and_a_message_never_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store.zarr");
    store(&root);
    let cache = tmp.path().join("cache");
    let base = valid(
        root.to_str().unwrap(),
        root.to_str().unwrap(),
        cache.to_str().unwrap(),
    );
    assert!(exercise(u64::MAX, &base), "the base config opens");
    // Every numeric knob at the extremes of its type, one at a time (a `prefetch_depth` of
    // 2^64 - 1 once overflowed the prefetch channel's capacity).
    for (i, (key, _)) in base.as_object().unwrap().iter().enumerate() {
        for extreme in [json!(u64::MAX), json!(i64::MIN), json!(0)] {
            if base[key].is_number() {
                let mut cfg = base.clone();
                cfg[key] = extreme;
                exercise(u64::MAX - 1 - i as u64, &cfg);
            }
        }
    }
    let cases: u64 = std::env::var("ISB_CONFIG_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(600);
    let mut opened = 0;
    for case in 0..cases {
        let mut r = Rng(case.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let mut cfg = base.clone();
        for _ in 0..1 + r.below(3) {
            mutate(&mut r, &mut cfg, &base);
        }
        if r.below(4) == 0 {
            // A key the config does not know, or a known one with an odd value.
            let key = *r.pick(&["extra", "batch", "variables", "mounts", "stacks", "index"]);
            let odd = odd_value(&mut r, &base);
            cfg.as_object_mut().map(|m| m.insert(key.into(), odd));
        }
        // A cache directory made odd stays inside the test's directory (a relative one would
        // land in the working directory).
        if let Some(dir) = cfg["cache_dir"].as_str()
            && !dir.is_empty()
            && dir != cache.to_str().unwrap()
        {
            let inside = tmp.path().join("odd").join(dir.replace(['/', '.'], "_"));
            cfg["cache_dir"] = json!(inside.to_str().unwrap());
        }
        opened += exercise(case, &cfg) as u64;
    }
    // The mutations leave some configs valid, so that iteration is exercised too.
    eprintln!("{opened} of {cases} random configs opened");
    assert!(
        opened >= cases / 20,
        "only {opened} of {cases} configs opened"
    );
}
