//! The CLI answers bad input with a non-zero exit and a message naming the thing, and
//! `make-dataset` + `inspect` round-trip.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `insitubatch inspect STORE --json`, parsed.
fn inspect_json(store: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&run_ok(cli().arg("inspect").arg(store).arg("--json"))).unwrap()
}

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_insitubatch"))
}

#[test]
fn bad_paths_and_arguments_exit_non_zero_with_the_name() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing.zarr");
    let out = cli().arg("inspect").arg(&missing).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("missing.zarr") && err.contains("does not exist"),
        "{err}"
    );

    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let out = cli().arg("inspect").arg(&plain).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a Zarr group"));

    let store = tmp.path().join("s.zarr");
    let out = cli()
        .args([
            "make-dataset",
            "--samples",
            "6",
            "--grid",
            "4x5",
            "--sample-chunk",
            "0",
        ])
        .arg(&store)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sample_chunk"));

    // A stored chunk bigger than the machine can build is refused before anything is written
    // (it used to allocate until the OOM killer came), naming the argument to change.
    let huge = tmp.path().join("huge.zarr");
    for (grid, needle) in [
        ("100000x100000", "inner_chunks"),
        ("4000000000x4000000000", "EiB"),
    ] {
        let mut make = cli();
        make.args(["make-dataset", "--samples", "2", "--grid", grid])
            .arg(&huge);
        fails_with(&mut make, &[needle, "--inner-chunks"]);
        assert!(!huge.exists(), "nothing written for {grid}");
    }

    // A manifest that cannot be written or read is an IO error naming the file, not "invalid".
    run_ok(
        cli()
            .args(["make-dataset", "--samples", "64", "--grid", "4x5"])
            .arg(&store),
    );
    let unwritable = tmp.path().join("no-dir").join("split.json");
    let mut split = cli();
    split.arg("split").arg(&store).arg("-o").arg(&unwritable);
    fails_with(&mut split, &["cannot write the split manifest", "no-dir"]);
    let mut bench = cli();
    bench
        .arg("bench")
        .arg(&store)
        .arg("--manifest")
        .arg(&unwritable);
    fails_with(&mut bench, &["cannot read the split manifest", "no-dir"]);
    // Counts of zero are refused by name, not run as nothing.
    for (cmd, flag) in [("bench", "--epochs"), ("bench-read", "--repeat")] {
        let out = cli()
            .arg(cmd)
            .arg(&store)
            .args([flag, "0"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{cmd} {flag} 0");
        assert!(String::from_utf8_lossy(&out.stderr).contains(flag));
    }
}

#[test]
fn make_dataset_then_inspect_json() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("s.zarr");
    run_ok(
        cli()
            .args([
                "make-dataset",
                "--samples",
                "10",
                "--grid",
                "6x8",
                "--sample-chunk",
                "4",
                "--inner-chunks",
                "3x8",
            ])
            .arg(&store),
    );
    let v = inspect_json(&store);
    // Consolidated metadata, so that a store copied to a server that cannot list still opens.
    assert_eq!(v["discovery"], "consolidated");
    let vars = v["variables"].as_array().unwrap();
    assert_eq!(vars.len(), 2, "coordinates are not data variables");
    assert_eq!(vars[0]["path"], "t2m");
    assert_eq!(vars[0]["shape"], serde_json::json!([10, 6, 8]));
    assert_eq!(vars[0]["chunks"], serde_json::json!([4, 3, 8]));
    assert_eq!(vars[0]["tiles_per_sample_chunk"], 2);
    assert_eq!(vars[0]["stored_chunks"], 6);
    assert_eq!(vars[0]["stored_chunks_present"], 6);
    assert_eq!(vars[0]["regime"], "moderate");
    // Each axis by name, with its coordinate's first and last values (times 6 h apart in CF
    // hours since 1979, shown as dates; latitudes falling from 90, longitudes from 0 by 45):
    // what --coords takes.
    assert_eq!(
        vars[0]["dimensions"],
        serde_json::json!([
            {"name": "time", "length": 10, "coordinate": [0.0, 54.0],
             "times": ["1979-01-01T00:00", "1979-01-03T06:00"]},
            {"name": "latitude", "length": 6, "coordinate": [90.0, -90.0], "times": null},
            {"name": "longitude", "length": 8, "coordinate": [0.0, 315.0], "times": null},
        ])
    );
    let text = run_ok(cli().arg("inspect").arg(&store));
    assert!(
        text.contains(
            "dimensions: time 10 (1979-01-01T00:00 .. 1979-01-03T06:00), latitude 6 (90 .. -90), \
             longitude 8 (0 .. 315)"
        ),
        "{text}"
    );
    let out = cli()
        .args(["inspect", "--sample-axis", "3"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sample_axis 3"));
}

/// Runs `cmd`, which must fail with every one of `needles` in its stderr.
fn fails_with(cmd: &mut Command, needles: &[&str]) {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{cmd:?} succeeded");
    assert!(needles.iter().all(|n| err.contains(n)), "{cmd:?}: {err}");
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A 40-sample store (4 per chunk) in `dir` and its 0.6/0.2/0.2 split manifest: (store,
/// manifest, what `split` printed).
fn store_and_split(dir: &Path, make_args: &[&str]) -> (PathBuf, PathBuf, String) {
    let store = dir.join("s.zarr");
    run_ok(
        cli()
            .args(["make-dataset", "--samples", "40", "--grid", "6x8"])
            .args(["--sample-chunk", "4"])
            .args(make_args)
            .arg(&store),
    );
    let manifest = dir.join("m.json");
    let out = run_ok(
        cli()
            .arg("split")
            .arg(&store)
            .args(["--fractions", "0.6,0.2,0.2", "-o"])
            .arg(&manifest),
    );
    (store, manifest, out)
}

/// `insitubatch bench STORE --manifest MANIFEST`, to be completed.
fn bench_with(store: &Path, manifest: &Path) -> Command {
    let mut c = cli();
    c.arg("bench").arg(store).arg("--manifest").arg(manifest);
    c
}

/// The JSON of a planning command (`memory`, `order`) over `store` with `manifest`, batches of 4
/// and blocks of 4 chunks, and `extra` arguments.
fn planned(command: &str, store: &Path, manifest: &Path, extra: &[&str]) -> serde_json::Value {
    let out = run_ok(
        cli()
            .arg(command)
            .arg(store)
            .arg("--manifest")
            .arg(manifest)
            .args(["--batch-size", "4", "--block-chunks", "4", "--json"])
            .args(extra),
    );
    serde_json::from_str(&out).unwrap()
}

#[test]
fn split_then_bench_with_the_manifest_reads_once_and_hits_when_the_budget_holds_the_split() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, out) = store_and_split(tmp.path(), &["--inner-chunks", "3x8"]);
    assert!(out.contains("train 6 chunks"), "{out}");
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    assert_eq!(m["splits"]["train"], serde_json::json!([0, 1, 2, 3, 4, 5]));
    assert_eq!(m["splits"]["test"], serde_json::json!([8, 9]));
    let out = run_ok(
        bench_with(&store, &manifest)
            .args([
                "--epochs",
                "2",
                "--batch-size",
                "5",
                "--cache-budget-bytes",
                "split",
            ])
            .arg("--json"),
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let e = v["epochs"].as_array().unwrap();
    // 6 chunks x 4 samples, batches of 5: 5 batches, the last short.
    assert_eq!(e[0]["stats"]["samples"], 24);
    assert_eq!(e[0]["stats"]["batches"], 5);
    // Two variables x 6 sample chunks, two tiles each: read once, then all hits.
    assert_eq!(e[0]["stats"]["cache_misses"], 12);
    assert_eq!(e[0]["stats"]["tiles_read"], 24);
    assert_eq!(e[1]["stats"]["cache_hits"], 12);
    assert_eq!(e[1]["stats"]["tiles_read"], 0);
    // --fast-first-batch ramps the blocks: with batches of one chunk and blocks of 4, the
    // train split's 6 chunks are cut 1, 2, 3 instead of 4, 2, so the working set (a block and
    // the next) is 5 chunks instead of 6.
    let working_set = |extra: &[&str]| {
        planned("memory", &store, &manifest, extra)["working_set_bytes"]
            .as_u64()
            .unwrap()
    };
    let full = working_set(&[]);
    assert!(full > 0, "the chunks go through the pool");
    assert_eq!(working_set(&["--fast-first-batch"]) * 6, full * 5);
    // A region of the field: of the two 3 x 8 tiles per sample chunk, rows 3..6 touch one.
    let out = run_ok(bench_with(&store, &manifest).args([
        "--variables",
        "t2m,u10",
        "--region",
        "3:6,2:8",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &v["epochs"][0]["stats"];
    assert_eq!(
        (&s["samples"], &s["tiles_read"]),
        (&24.into(), &12.into()),
        "{s}"
    );
    fails_with(
        bench_with(&store, &manifest).args(["--variables", "t2m", "--region", "3:6,2:9"]),
        &["`t2m`", "axis 2 has length 8"],
    );
    // Across the end of an axis with --wrap: rows 4, 5, 0, 1 touch both row tiles, columns
    // 6, 7, 0, 1 the one column tile (read once).
    let out = run_ok(bench_with(&store, &manifest).args([
        "--variables",
        "t2m,u10",
        "--region",
        "-2:2,6:10",
        "--wrap",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &v["epochs"][0]["stats"];
    assert_eq!(
        (&s["samples"], &s["tiles_read"]),
        (&24.into(), &24.into()),
        "{s}"
    );
    fails_with(
        bench_with(&store, &manifest).args(["--variables", "t2m", "--region", "-2:2,0:8"]),
        &["--region", "--wrap"],
    );
    // (samples, stored chunks read, bytes delivered) of a pass with `extra` arguments.
    let stats = |extra: &[&str]| {
        let out = run_ok(
            bench_with(&store, &manifest)
                .args(["--variables", "t2m,u10", "--json"])
                .args(extra),
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let s = &v["epochs"][0]["stats"];
        [&s["samples"], &s["tiles_read"], &s["bytes_delivered"]].map(|x| x.as_u64().unwrap())
    };
    // The same regions in coordinate values (latitude 90, 54, 18, -18, -54, -90; longitude 0
    // to 315 by 45): rows 3..6 and columns 2..8, then every row and the columns from 270° to
    // 45° across 0°.
    for (coords, tiles) in [
        (&["--coords", "latitude=-18:-90,longitude=90:315"][..], 12),
        (
            &[
                "--coords",
                "longitude=270:45",
                "--periodic",
                "longitude=360",
            ][..],
            24,
        ),
    ] {
        let [samples, tiles_read, _] = stats(coords);
        assert_eq!((samples, tiles_read), (24, tiles), "{coords:?}");
    }
    let refused: [(&[&str], &[&str]); 11] = [
        (
            &["--coords", "level=0:1"],
            &["`level` is not a dimension", "latitude"],
        ),
        (&["--coords", "latitude=1-2"], &["--coords", "START:STOP"]),
        (
            &["--coords", "latitude=0:90", "--region", "0:2,0:8"],
            &["--coords", "--region"],
        ),
        (&["--stack", "x=t2m,v10"], &["`stacks`", "no label `v10`"]),
        (&["--stack", "t2m"], &["--stack", "NAME=LABEL"]),
        (&["--patch", "3xa"], &["--patch", "64x64"]),
        (
            &["--patch", "3x4", "--patch-wrap", "2"],
            &["--patch-wrap 2", "axes 0 to 1"],
        ),
        (
            &["--patch", "3x4", "--ceilings"],
            &["`patch`", "without a patch"],
        ),
        (
            &["--patch", "30x4"],
            &["`patch`", "larger than the field along its axis 0"],
        ),
        (
            &["--patch", "3x4", "--patch-grid", "4x4"],
            &["`patch_grid`", "axis 0 must be from 1"],
        ),
        (
            &[
                "--patch",
                "3x4",
                "--patch-grid",
                "3x4",
                "--patches-per-sample",
                "2",
            ],
            &["--patches-per-sample", "--patch-grid"],
        ),
    ];
    for (args, needles) in refused {
        fails_with(
            bench_with(&store, &manifest)
                .args(["--variables", "t2m"])
                .args(args),
            needles,
        );
    }
    // Labels stacked as channels read and deliver what they do unstacked.
    let own = stats(&[]);
    assert_eq!(own[0], 24);
    assert_eq!(stats(&["--stack", "x=u10,t2m"]), own);
    // A patch reads what the whole field does and delivers 3 x 4 of it per row and variable.
    assert_eq!(stats(&["--patch", "3x4"]), [24, own[1], 24 * 2 * 3 * 4 * 4]);
    let periodic = ["--patch", "3x8", "--patch-wrap", "0,1"];
    assert_eq!(stats(&periodic), [24, own[1], 24 * 2 * 3 * 8 * 4]);
    // Three patches per sample: three times the rows from the same chunks; a grid of 3 x 4
    // tiles over the 6 x 8 field, 2 x 2 of them.
    let three = ["--patch", "3x4", "--patches-per-sample", "3"];
    assert_eq!(stats(&three), [72, own[1], 72 * 2 * 3 * 4 * 4]);
    let tiled = ["--patch", "3x4", "--patch-grid", "3x4"];
    assert_eq!(stats(&tiled), [96, own[1], 96 * 2 * 3 * 4 * 4]);
    fails_with(
        bench_with(&store, &manifest).args(["--variables", "t2m", "--region", "3-6"]),
        &["--region", "START:STOP"],
    );
    let out = bench_with(&store, &manifest)
        .args(["--split", "holdout"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown split `holdout`"));
    let out = cli()
        .arg("split")
        .arg(&store)
        .args(["--fractions", "0.9,0.3", "-o"])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("`fractions`"));
}

#[test]
fn bench_with_prefetch_next_epoch_starts_every_later_epoch_early_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    // A budget that holds two iterations' read-ahead.
    let args = [
        "--epochs",
        "3",
        "--batch-size",
        "5",
        "--cache-budget-bytes",
        "100000000",
    ];
    let started_ahead = |extra: &[&str]| -> Vec<bool> {
        let out = run_ok(
            bench_with(&store, &manifest)
                .args(args)
                .args(extra)
                .arg("--json"),
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["epochs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["stats"]["started_ahead"].as_bool().unwrap())
            .collect()
    };
    assert_eq!(
        started_ahead(&["--prefetch-next-epoch"]),
        [false, true, true]
    );
    assert_eq!(started_ahead(&[]), [false, false, false]);
    let text = run_ok(
        bench_with(&store, &manifest)
            .args(args)
            .arg("--prefetch-next-epoch"),
    );
    assert_eq!(
        text.matches("(started while the epoch before ran)").count(),
        2,
        "{text}"
    );
}

#[test]
fn split_by_ranges_of_dates_or_indices_takes_whole_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    // 40 six-hourly samples from 1979-01-01 (make-dataset's time), 4 per chunk: a day each.
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    let split = |ranges: &str, extra: &[&str]| {
        let mut c = cli();
        c.arg("split")
            .arg(&store)
            .args(["--ranges", ranges])
            .args(extra)
            .arg("-o")
            .arg(&manifest);
        c
    };
    let chunks = |name: &str| {
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
        m["splits"][name].clone()
    };
    let out = run_ok(&mut split(
        "train=1979-01-01..1979-01-08,val=1979-01-08..1979-01-09T00:00,test=32..40",
        &[],
    ));
    assert!(
        out.contains("val 1 chunks (samples 28..32, 1979-01-08T00:00 .. 1979-01-08T18:00)"),
        "{out}"
    );
    assert_eq!(chunks("train"), serde_json::json!([0, 1, 2, 3, 4, 5, 6]));
    assert_eq!(chunks("val"), serde_json::json!([7]));
    assert_eq!(chunks("test"), serde_json::json!([8, 9]));
    // The manifest drives a pass: val yields its day's four samples.
    let out = run_ok(bench_with(&store, &manifest).args(["--split", "val", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["epochs"][0]["stats"]["samples"], 4);
    // Noon of 1979-01-08 is sample 30, inside chunk 7.
    let noon = "train=1979-01-01..1979-01-08T12:00";
    fails_with(
        &mut split(noon, &[]),
        &[
            "`ranges`",
            "sample 30 falls inside chunk 7 (samples 28..32)",
        ],
    );
    run_ok(&mut split(noon, &["--snap", "inward"]));
    assert_eq!(chunks("train"), serde_json::json!([0, 1, 2, 3, 4, 5, 6]));
    run_ok(&mut split(noon, &["--snap", "outward"]));
    assert_eq!(chunks("train"), serde_json::json!([0, 1, 2, 3, 4, 5, 6, 7]));
    fails_with(&mut split("train=0..8,val=4..12", &[]), &["overlap"]);
    fails_with(
        &mut split("holdout=0..8", &[]),
        &["holdout", "train, val or test"],
    );
    fails_with(&mut split("train=0", &[]), &["NAME=START..STOP"]);
    fails_with(
        &mut split("train=0..8", &["--fractions", "1"]),
        &["--fractions"],
    );
}

#[test]
fn a_sample_stride_orders_and_benches_every_kth_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    // The train split's 24 samples, every 4th from 1: 1, 5, ..., 21.
    let stride = ["--sample-stride", "4", "--sample-phase", "1"];
    let v = planned("order", &store, &manifest, &stride);
    let mut samples: Vec<u64> = v["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    samples.sort_unstable();
    assert_eq!(samples, (1..24).step_by(4).collect::<Vec<u64>>());
    let out = run_ok(bench_with(&store, &manifest).args(stride).arg("--json"));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["epochs"][0]["stats"]["samples"], 6);
    fails_with(
        bench_with(&store, &manifest).args(["--sample-stride", "4", "--sample-phase", "4"]),
        &["`sample_phase`", "below sample_stride (4)"],
    );
}

#[test]
fn bench_reads_variables_of_a_mounted_store_and_refuses_a_name_the_store_uses() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    let other = tmp.path().join("other.zarr");
    run_ok(
        cli()
            .args(["make-dataset", "--samples", "40", "--grid", "6x8"])
            .args(["--sample-chunk", "8", "--format", "2"])
            .arg(&other),
    );
    let mount = format!("more={}", other.display());
    let out = run_ok(bench_with(&store, &manifest).args([
        "--mount",
        &mount,
        "--variables",
        "t2m,more/u10",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stats = &v["epochs"][0]["stats"];
    // The train split's 24 samples: 6 chunks of t2m (4 samples each) and 3 of the mounted
    // u10 (8 each), each read once.
    assert_eq!(stats["samples"], 24, "{stats}");
    assert_eq!(stats["tiles_read"], 9, "{stats}");
    fails_with(
        bench_with(&store, &manifest).args(["--mount", &format!("t2m={}", other.display())]),
        &["cannot mount", "as `t2m`", "already has an array `t2m`"],
    );
    fails_with(
        bench_with(&store, &manifest).args(["--mount", "more"]),
        &["NAME=STORE", "is not KEY=VALUE"],
    );

    // Aligned: the mounted store starting 20 samples before this one covers the train split's
    // anchors 0..20 only (u10 read at 20..40); its last t2m chunk is then not read. On `time`
    // the two synthetic stores start together.
    let aligned = |at: &str| {
        let out = run_ok(bench_with(&store, &manifest).args([
            "--mount",
            &mount,
            "--align-mount",
            at,
            "--variables",
            "t2m,more/u10",
            "--json",
        ]));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["epochs"][0]["stats"].clone()
    };
    let stats = aligned("more=-20");
    assert_eq!(
        (
            &stats["samples"],
            &stats["dropped_anchors"],
            &stats["tiles_read"]
        ),
        (&20.into(), &4.into(), &8.into()),
        "{stats}"
    );
    for on_time in ["more=time", "more=containing:time", "more=nearest:time"] {
        let stats = aligned(on_time);
        assert_eq!(
            (&stats["samples"], &stats["tiles_read"]),
            (&24.into(), &9.into()),
            "{on_time}: {stats}"
        );
    }
    fails_with(
        bench_with(&store, &manifest).args(["--mount", &mount, "--align-mount", "other=3"]),
        &["`mounts` = other", "names no mount"],
    );
}

#[test]
fn bench_reads_a_climatology_at_each_samples_day_of_year() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    let clim = tmp.path().join("clim.zarr");
    run_ok(
        cli()
            .args(["make-dataset", "--samples", "366", "--grid", "6x8"])
            .args(["--sample-chunk", "1"])
            .arg(&clim),
    );
    let mount = format!("clim={}", clim.display());
    let out = run_ok(bench_with(&store, &manifest).args([
        "--mount",
        &mount,
        "--variables",
        "t2m",
        "--cycle",
        "c=clim/t2m:dayofyear",
        "--stack",
        "x=t2m,c",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stats = &v["epochs"][0]["stats"];
    // The train split's 24 samples, 6-hourly from 1979-01-01: six days, so six of the
    // climatology's one-day chunks beside t2m's six chunks, each read once.
    assert_eq!(
        (&stats["samples"], &stats["tiles_read"]),
        (&24.into(), &12.into()),
        "{stats}"
    );
    // Indexed by the time of the first of --variables where it lives: here a second store
    // mounted beside the climatology (no manifest, so no other array names the times). Placed
    // at other times by --align-mount, its times are not the samples', which is said.
    let other = tmp.path().join("other.zarr");
    run_ok(
        cli()
            .args(["make-dataset", "--samples", "40", "--grid", "6x8"])
            .args(["--sample-chunk", "4"])
            .arg(&other),
    );
    let other_mount = format!("other={}", other.display());
    let mounted = |extra: &[&str]| {
        let mut c = cli();
        c.arg("bench").arg(&store);
        c.args(["--mount", &mount, "--mount", &other_mount]);
        c.args([
            "--variables",
            "other/t2m",
            "--cycle",
            "c=clim/t2m:dayofyear",
        ]);
        c.args(extra);
        c
    };
    let out = run_ok(&mut mounted(&["--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stats = &v["epochs"][0]["stats"];
    // 40 samples, 6-hourly from 1979-01-01: ten of other/t2m's chunks and ten days.
    assert_eq!(
        (&stats["samples"], &stats["tiles_read"]),
        (&40.into(), &20.into()),
        "{stats}"
    );
    fails_with(
        &mut mounted(&["--align-mount", "other=time"]),
        &[
            "--cycle",
            "`other/t2m`",
            "--align-mount",
            "put a variable of this store first",
        ],
    );
    fails_with(
        bench_with(&store, &manifest).args(["--cycle", "c=clim/t2m:week"]),
        &["`week` is not a cycle", "dayofyear, month or hour"],
    );
    fails_with(
        bench_with(&store, &manifest).args(["--cycle", "c=t2m:month"]),
        &["--cycle needs --variables"],
    );
}

#[test]
fn bench_reads_a_static_field_once_a_pass_beside_the_sampled_variables() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    // u10 read whole as a static field: its 10 chunks of 4 samples once, as one slot, beside
    // the train split's 6 chunks of t2m.
    let out = run_ok(bench_with(&store, &manifest).args([
        "--variables",
        "t2m",
        "--static",
        "s=u10",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stats = &v["epochs"][0]["stats"];
    assert_eq!(stats["samples"], 24, "{stats}");
    assert_eq!(stats["tiles_read"], 6 + 10, "{stats}");
    assert_eq!(stats["cache_misses"], 6 + 1, "{stats}");
    fails_with(
        bench_with(&store, &manifest).args(["--static", "s=u10"]),
        &["--static needs --variables"],
    );
    // `warm` fills a cache with the static field too, which a readonly reader then revives.
    let cache = tmp.path().join("cache");
    let warm = |statics: &[&str]| {
        let mut c = cli();
        c.arg("warm")
            .arg(&store)
            .arg("--cache-dir")
            .arg(&cache)
            .arg("--manifest")
            .arg(&manifest)
            .args(["--split", "train", "--variables", "t2m"])
            .args(statics);
        c
    };
    let readonly = || {
        let mut c = bench_with(&store, &manifest);
        c.arg("--cache-dir").arg(&cache).args([
            "--readonly-cache",
            "--variables",
            "t2m",
            "--static",
            "s=u10",
            "--json",
        ]);
        c
    };
    run_ok(&mut warm(&[]));
    fails_with(&mut readonly(), &["u10"]);
    run_ok(&mut warm(&["--static", "s=u10"]));
    let v: serde_json::Value = serde_json::from_str(&run_ok(&mut readonly())).unwrap();
    let stats = &v["epochs"][0]["stats"];
    assert_eq!(
        (stats["tiles_read"].as_u64(), stats["samples"].as_u64()),
        (Some(0), Some(24)),
        "{stats}"
    );
    fails_with(
        bench_with(&store, &manifest).args(["--variables", "t2m", "--static", "s=t2m"]),
        &["one as a static field"],
    );
}

#[test]
fn bench_reads_a_window_beside_its_variable_and_a_patch_of_both_as_regions() {
    let tmp = tempfile::tempdir().unwrap();
    // 24 one-sample chunks of 24 x 48, each stored as 4 x 4 chunks of 6 x 12.
    let store = tmp.path().join("w.zarr");
    run_ok(
        cli()
            .args(["make-dataset", "--samples", "24", "--grid", "24x48"])
            .args([
                "--sample-chunk",
                "1",
                "--inner-chunks",
                "6x12",
                "--variables",
                "t2m",
            ])
            .arg(&store),
    );
    let bench = |extra: &[&str]| {
        let mut c = cli();
        c.arg("bench")
            .arg(&store)
            .args(["--variables", "t2m"])
            .args(extra);
        c
    };
    // The next sample beside each: the last anchor is dropped, every chunk read once.
    let out = run_ok(&mut bench(&["--window", "t2m_next=t2m:1", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stats = &v["epochs"][0]["stats"];
    assert_eq!(
        (stats["samples"].as_u64(), stats["cache_misses"].as_u64()),
        (Some(23), Some(24)),
        "{stats}"
    );
    assert_eq!(stats["dropped_anchors"], 1, "{stats}");
    // With a patch of both, forced onto region slots: every chunk loaded as the stored chunks
    // under the two labels' windows, fewer than its 16.
    let out = run_ok(
        bench(&["--window", "t2m_next=t2m:1", "--patch", "4x8", "--json"])
            .env("INSITUBATCH_DECODE_INTO_BATCHES", "always"),
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stats = &v["epochs"][0]["stats"];
    assert_eq!(stats["region_slots"], 24, "{stats}");
    assert!(
        stats["tiles_read"].as_u64().unwrap() < 24 * 16 / 2,
        "{stats}"
    );
    // A window of the sample before: the first anchor is dropped instead.
    let out = run_ok(&mut bench(&["--window", "t2m_prev=t2m:-1", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["epochs"][0]["stats"]["samples"], 23);
    fails_with(
        cli()
            .arg("bench")
            .arg(&store)
            .args(["--window", "t2m_next=t2m:1"]),
        &["--window needs --variables"],
    );
    fails_with(
        &mut bench(&["--window", "t2m_next=t2m:next"]),
        &["--window", "not a whole number of samples"],
    );
    fails_with(
        &mut bench(&["--window", "t2m_next"]),
        &["--window", "t2m_next"],
    );
}

#[test]
fn stats_prints_each_arrays_statistics_over_the_split() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    let stats = |extra: &[&str]| -> serde_json::Value {
        let out = run_ok(
            cli()
                .arg("stats")
                .arg(&store)
                .arg("--manifest")
                .arg(&manifest)
                .arg("--json")
                .args(extra),
        );
        serde_json::from_str(&out).unwrap()
    };
    // The train split's 24 samples of 6 x 8 (val: 8 samples, 8 values per latitude each).
    let whole = stats(&[]);
    for name in ["t2m", "u10"] {
        assert_eq!(
            whole[name]["count"],
            serde_json::json!([24 * 48]),
            "{whole}"
        );
        let (mean, std) = (
            whole[name]["mean"][0].as_f64().unwrap(),
            whole[name]["std"][0].as_f64().unwrap(),
        );
        let (lo, hi) = (
            whole[name]["min"][0].as_f64().unwrap(),
            whole[name]["max"][0].as_f64().unwrap(),
        );
        assert!(lo < mean && mean < hi && std > 0.0, "{whole}");
    }
    let per_lat = stats(&["--axis", "0", "--split", "val"]);
    assert_eq!(
        per_lat["t2m"]["count"],
        serde_json::json!(vec![8 * 8; 6]),
        "{per_lat}"
    );
    let table = run_ok(
        cli()
            .arg("stats")
            .arg(&store)
            .arg("--manifest")
            .arg(&manifest),
    );
    assert!(
        table.contains("split train") && table.contains("t2m"),
        "{table}"
    );
    fails_with(
        cli().arg("stats").arg(&store).args(["--axis", "2"]),
        &["`axis`", "2 axes"],
    );
    // Quantiles: one list per index, within [min, max], in order, the extremes exact.
    let q = stats(&["--axis", "0", "--quantiles", "0,0.5,0.99,1"]);
    let t2m = &q["t2m"];
    assert_eq!(
        t2m["quantiles"],
        serde_json::json!([0.0, 0.5, 0.99, 1.0]),
        "{q}"
    );
    let rows = t2m["quantile_values"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{q}");
    for (i, row) in rows.iter().enumerate() {
        let v: Vec<f64> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert!(v.windows(2).all(|w| w[0] <= w[1]), "{v:?}");
        assert_eq!(v[0], t2m["min"][i].as_f64().unwrap(), "{q}");
        assert_eq!(v[3], t2m["max"][i].as_f64().unwrap(), "{q}");
    }
    let table = run_ok(
        cli()
            .arg("stats")
            .arg(&store)
            .args(["--quantiles", "0.01,0.99"]),
    );
    assert!(
        table.contains("q0.01") && table.contains("q0.99"),
        "{table}"
    );
    fails_with(
        cli().arg("stats").arg(&store).args(["--quantiles", "1.5"]),
        &["`quantiles`", "between 0 and 1"],
    );
}

#[test]
fn order_prints_the_epoch_the_library_plans_and_each_epoch_its_own() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    let order = |extra: &[&str]| {
        let v = planned("order", &store, &manifest, extra);
        let ints = |k: &str| -> Vec<u64> {
            v[k].as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect()
        };
        (ints("samples"), ints("block_ends"))
    };
    // The train split's 6 chunks of 4 samples, in blocks of 4 and 2 chunks.
    let (one, ends) = order(&["--epoch", "1"]);
    assert_eq!(ends, [16, 24]);
    let mut sorted = one.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..24).collect::<Vec<u64>>(),
        "every train sample once"
    );
    assert_eq!(order(&["--epoch", "1"]).0, one, "the same in every process");
    assert_ne!(order(&["--epoch", "2"]).0, one, "each epoch its own order");
    // What the library plans (and its iterations emit) for the same dataset and epoch.
    let ds = insitubatch::InSituDataset::builder(&store)
        .manifest(insitubatch::SplitManifest::load(&manifest).unwrap())
        .batch_size(4)
        .block_chunks(4)
        .build()
        .unwrap();
    ds.set_epoch(1);
    assert_eq!(ds.order("train").unwrap().anchors(), one);
    // The ramp: batches of one chunk, so blocks of 1, 2 and 3 chunks.
    assert_eq!(order(&["--fast-first-batch"]).1, [4, 12, 24]);
    // A sequential split, and the text form.
    let (val, _) = order(&["--split", "val"]);
    assert_eq!(val, (24..32).collect::<Vec<u64>>());
    let out = run_ok(
        cli()
            .arg("order")
            .arg(&store)
            .arg("--manifest")
            .arg(&manifest)
            .args(["--split", "val", "--block-chunks", "1"]),
    );
    assert!(
        out.starts_with("epoch 0 of split `val`: 8 samples in 2 blocks"),
        "{out}"
    );
    assert!(out.contains("block 1 (rows 4..8): 28 29 30 31\n"), "{out}");
    fails_with(
        cli()
            .arg("order")
            .arg(&store)
            .args(["--manifest"])
            .arg(&manifest)
            .args(["--split", "holdout"]),
        &["unknown split `holdout`"],
    );
}

#[test]
fn demo_runs_two_epochs_and_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run_ok(
        cli()
            .args(["demo", "--samples", "64", "--grid", "8x16", "--dir"])
            .arg(tmp.path().join("demo.zarr")),
    );
    for needle in [
        "epoch 0:",
        "epoch 1:",
        "first batch",
        "p99",
        "peak RSS",
        "64 samples",
        "pool budget",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    // The pool line says why its budget is what it is: empty when every chunk went straight
    // into batch rows.
    let rows = out.contains("decoded into batch rows");
    assert_eq!(
        out.contains("pool budget 0 B (no chunk went through the pool)"),
        rows,
        "{out}"
    );
    assert_eq!(out.contains("(the working set)"), !rows, "{out}");
}

#[test]
fn warm_fills_a_cache_that_readonly_benches_read_without_decoding() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    let cache = tmp.path().join("cache");
    let warm = |split: &str| {
        run_ok(
            cli()
                .arg("warm")
                .arg(&store)
                .arg("--cache-dir")
                .arg(&cache)
                .arg("--manifest")
                .arg(&manifest)
                .args(["--split", split]),
        )
    };
    let out = warm("train");
    // 6 train chunks x 2 variables.
    assert!(out.contains("12 chunks written"), "{out}");
    let out = warm("train");
    assert!(
        out.contains("0 chunks written") && out.contains("12 already cached"),
        "{out}"
    );
    let bench = |split: &str| {
        bench_with(&store, &manifest)
            .args([
                "--split",
                split,
                "--epochs",
                "1",
                "--json",
                "--readonly-cache",
            ])
            .arg("--cache-dir")
            .arg(&cache)
            .output()
            .unwrap()
    };
    let out = bench("train");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["epochs"][0]["stats"];
    assert_eq!(
        (s["tiles_read"].as_u64(), s["cache_revived"].as_u64()),
        (Some(0), Some(12))
    );
    // The cache directory's counters: a reader writes nothing.
    let c = &v["cache"];
    assert_eq!(
        (c["writes"].as_u64(), c["writes_skipped"].as_u64()),
        (Some(0), Some(0)),
        "{c}"
    );
    assert_eq!(c["revived"].as_u64(), Some(12), "{c}");
    // The text report says where the hits came from.
    let out = run_ok(
        bench_with(&store, &manifest)
            .args(["--split", "train", "--epochs", "1", "--readonly-cache"])
            .arg("--cache-dir")
            .arg(&cache),
    );
    assert!(out.contains("12 hits (12 revived from cache_dir)"), "{out}");
    // val was never warmed: a readonly reader's miss names the chunk.
    let out = bench("val");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("readonly_cache") && err.contains("[chunk 6]"),
        "{err}"
    );
    // A cache warmed with a region serves readers of that region, and is stale for others.
    let cropped = tmp.path().join("cropped");
    let region = ["--variables", "t2m,u10", "--region", "1:5,2:8"];
    let out = run_ok(
        cli()
            .arg("warm")
            .arg(&store)
            .arg("--cache-dir")
            .arg(&cropped)
            .args(["--manifest"])
            .arg(&manifest)
            .args(["--split", "train"])
            .args(region),
    );
    assert!(out.contains("12 chunks written"), "{out}");
    let read = |extra: &[&str]| {
        bench_with(&store, &manifest)
            .args(["--epochs", "1", "--json", "--readonly-cache", "--cache-dir"])
            .arg(&cropped)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = read(&region);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    let s = &v["epochs"][0]["stats"];
    assert_eq!(
        (s["tiles_read"].as_u64(), s["cache_revived"].as_u64()),
        (Some(0), Some(12))
    );
    let out = read(&["--variables", "t2m,u10"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("stale"), "{err}");
}

#[test]
fn a_rank_warms_its_whole_share_and_reads_it_readonly_in_every_shuffled_epoch() {
    // 6 train chunks over 4 ranks: the shares are chunks [0], [1, 2], [3] and [4, 5], so rank 1's
    // train epochs stop after 4 samples and leave out a whole chunk's worth, a different draw
    // every epoch. The warm must cache both its chunks all the same.
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    let cache = tmp.path().join("cache-rank1");
    let ranked = |c: &mut Command| {
        c.args(["--rank", "1", "--world-size", "4"]);
    };
    let mut warm = cli();
    warm.arg("warm")
        .arg(&store)
        .arg("--cache-dir")
        .arg(&cache)
        .arg("--manifest")
        .arg(&manifest)
        .args(["--split", "train"]);
    ranked(&mut warm);
    let out = run_ok(&mut warm);
    assert!(
        out.contains("4 chunks written"),
        "2 chunks x 2 variables: {out}"
    );
    let mut bench = bench_with(&store, &manifest);
    bench
        .args([
            "--epochs",
            "6",
            "--batch-size",
            "3",
            "--json",
            "--readonly-cache",
        ])
        .arg("--cache-dir")
        .arg(&cache);
    ranked(&mut bench);
    let v: serde_json::Value = serde_json::from_str(&run_ok(&mut bench)).unwrap();
    for e in v["epochs"].as_array().unwrap() {
        let s = &e["stats"];
        assert_eq!(
            (s["samples"].as_u64(), s["trimmed_rows"].as_u64()),
            (Some(4), Some(4))
        );
        assert_eq!(s["tiles_read"], 0, "{s}");
    }
    // Bad ranks are refused naming the argument.
    let mut bad = bench_with(&store, &manifest);
    bad.args(["--rank", "4", "--world-size", "4"]);
    fails_with(&mut bad, &["`rank` = 4", "world_size = 4"]);
    let mut bad = bench_with(&store, &manifest);
    bad.args(["--rank", "0", "--world-size", "7"]);
    fails_with(
        &mut bad,
        &["`world_size` = 7", "split `train` has 6 chunks"],
    );
}

/// A float32 array of `samples` rows of `width` values, one row per chunk, with no chunk on
/// disk (every read is the fill value), in `dir`.
fn unwritten_array(dir: &Path, samples: u64, width: u64) {
    std::fs::write(
        dir.join("zarr.json"),
        format!(
            r#"{{"zarr_format":3,"node_type":"array","shape":[{samples},{width}],"data_type":"float32",
            "chunk_grid":{{"name":"regular","configuration":{{"chunk_shape":[1,{width}]}}}},
            "chunk_key_encoding":{{"name":"default","configuration":{{"separator":"/"}}}},
            "fill_value":0.0,"codecs":[{{"name":"bytes","configuration":{{"endian":"little"}}}}]}}"#
        ),
    )
    .unwrap();
}

/// `insitubatch bench STORE args` under an address-space limit of `limit` bytes.
fn bench_under_ulimit_v(store: &Path, args: &[&str], limit: u64) -> Output {
    under_ulimit_v("bench", store, args, limit)
}

/// `insitubatch COMMAND STORE args` under an address-space limit of `limit` bytes.
fn under_ulimit_v(command: &str, store: &Path, args: &[&str], limit: u64) -> Output {
    use std::os::unix::process::CommandExt;

    let mut bench = cli();
    bench.arg(command).arg(store).args(args);
    // SAFETY: the closure only calls setrlimit, which is async-signal-safe, between fork and
    // exec.
    unsafe {
        bench.pre_exec(move || {
            let rl = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &rl) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    bench.output().unwrap()
}

#[test]
fn a_working_set_over_ulimit_v_is_refused_by_name_not_aborted() {
    // 64 samples of 64 MiB each: 16 per block need 1 GiB, against an address-space limit of
    // 512 MiB.
    let tmp = tempfile::tempdir().unwrap();
    unwritten_array(tmp.path(), 64, 16 << 20);
    let out = bench_under_ulimit_v(tmp.path(), &["--epochs", "1"], 512 << 20);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a clean error exit, not an abort: {err}"
    );
    assert!(
        err.contains("block_chunks") && err.contains("ulimit -v"),
        "{err}"
    );
}

#[test]
fn a_cache_budget_the_memory_limit_cannot_hold_is_refused_by_name_and_one_it_can_runs() {
    // 64 samples of 4 MiB, no chunk on disk: a working set of two chunks, but 256 MiB of
    // chunks that a heap pool with a large budget keeps, against an address-space limit of
    // 320 MiB. Before this was checked, a budget like this got the process killed for memory
    // once the pool had filled (under a cgroup limit: exit 137).
    let tmp = tempfile::tempdir().unwrap();
    unwritten_array(tmp.path(), 64, 1 << 20);
    let knobs = ["--epochs", "1", "--block-chunks", "1", "--batch-size", "1"];
    let with_budget = |b: &'static str| [&knobs[..], &["--cache-budget-bytes", b]].concat();
    let out = bench_under_ulimit_v(tmp.path(), &with_budget("1000000000"), 320 << 20);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a clean refusal: {err}");
    assert!(
        err.contains("`cache_budget_bytes` = 1000000000")
            && err.contains("268435456 bytes of decoded chunks")
            && err.contains("ulimit -v")
            && err.contains("cache_dir"),
        "{err}"
    );
    // A budget the limit holds, and the automatic one, run the epoch.
    for args in [with_budget("60000000"), knobs.to_vec()] {
        let out = bench_under_ulimit_v(tmp.path(), &args, 320 << 20);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("epoch 0: 64 samples"),
            "{args:?}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn memory_states_the_need_a_pass_is_checked_against_and_fails_where_the_pass_would() {
    // 64 samples of 4 MiB, no chunk on disk, a heap budget that keeps all 256 MiB.
    let tmp = tempfile::tempdir().unwrap();
    unwritten_array(tmp.path(), 64, 1 << 20);
    let knobs = [
        "--block-chunks",
        "1",
        "--batch-size",
        "1",
        "--cache-budget-bytes",
        "1000000000",
    ];
    let out = run_ok(
        cli()
            .arg("memory")
            .arg(tmp.path())
            .args(knobs)
            .arg("--json"),
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    assert_eq!(
        n("pool_bytes"),
        64 << 22,
        "every chunk, under the budget: {v}"
    );
    assert_eq!(n("cache_budget_bytes"), 1_000_000_000);
    assert_eq!((n("batches"), n("batch_bytes")), (4, 4 << 20));
    let total = n("total_bytes");
    let parts = n("pool_bytes") + n("batches") * n("batch_bytes") + n("read_bytes");
    assert_eq!(total, parts + n("overhead_bytes"), "{v}");
    assert_eq!(v["fits"], true);
    assert!(
        n("process_rss_bytes") > 1 << 20,
        "the CLI's own resident memory: {v}"
    );
    // A kibibyte short of it: `memory` exits 1 with the refusal the pass itself gives, and
    // `bench` is refused stating the same total; at exactly the need, it fits.
    let short = (total - 1) / 1024 * 1024;
    for command in ["memory", "bench"] {
        let out = under_ulimit_v(command, tmp.path(), &knobs, short);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}: {err}");
        assert!(
            err.contains("`cache_budget_bytes` = 1000000000")
                && err.contains(&format!("comes to {total} bytes"))
                && err.contains("ulimit -v"),
            "{command}: {err}"
        );
    }
    let out = under_ulimit_v("memory", tmp.path(), &knobs, short);
    assert!(String::from_utf8_lossy(&out.stdout).contains("does NOT fit"));
    let out = under_ulimit_v("memory", tmp.path(), &knobs, total);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("fits in"), "{text}");
    // The same kibibyte short as `--memory-limit-bytes`, without a ulimit: refused alike,
    // naming the knob; at the need, it fits.
    let short_arg = short.to_string();
    let out = cli()
        .arg("memory")
        .arg(tmp.path())
        .args(knobs)
        .args(["--memory-limit-bytes", &short_arg])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "comes to {total} bytes, more than the {short} bytes of memory_limit_bytes"
        )),
        "{err}"
    );
    let total_arg = total.to_string();
    let out = run_ok(
        cli()
            .arg("memory")
            .arg(tmp.path())
            .args(knobs)
            .args(["--memory-limit-bytes", &total_arg]),
    );
    assert!(
        out.contains(&format!("fits in the {total} bytes of memory_limit_bytes")),
        "{out}"
    );
}

#[test]
fn make_dataset_writes_consolidated_metadata_in_either_format() {
    for format in ["2", "3"] {
        let tmp = tempfile::tempdir().unwrap();
        let store = tmp.path().join("s.zarr");
        run_ok(
            cli()
                .args([
                    "make-dataset",
                    "--samples",
                    "6",
                    "--grid",
                    "4x5",
                    "--format",
                    format,
                ])
                .arg(&store),
        );
        let v = inspect_json(&store);
        assert_eq!(v["discovery"], "consolidated", "format {format}");
        let vars: Vec<_> = v["variables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["path"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(vars, ["t2m", "u10"], "format {format}");
    }
}

#[test]
fn check_transform_reports_one_chunk_and_warm_caches_what_readers_ask_for() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    let kelvin = r#"[{"type": "affine", "offset": -273.15, "applies": ["t2m"]},
                     {"type": "clip", "min": -1000, "max": 1000}]"#;
    let check = |args: &[&str]| {
        let mut c = cli();
        c.arg("check-transform").arg(&store).args(args);
        c
    };
    let out = run_ok(&mut check(&[
        "--var",
        "t2m",
        "--transform",
        kelvin,
        "--chunk",
        "2",
        "--json",
    ]));
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["slot_shape"], serde_json::json!([4, 6, 8]), "{r}");
    assert_eq!(r["samples"], serde_json::json!([8, 12]), "{r}");
    assert_eq!(r["transforms"].as_array().unwrap().len(), 2, "{r}");
    // The synthetic fields are ERA5-like temperatures: shifted by exactly the offset.
    let (before, after) = (&r["before"], &r["after"]);
    for k in ["min", "max"] {
        let shift = after[k].as_f64().unwrap() - before[k].as_f64().unwrap();
        assert!((shift + 273.15).abs() < 1e-3, "{k}: {r}");
    }
    // The JSON of u10 (only the clip applies) carries another fingerprint than t2m's.
    let u: serde_json::Value = serde_json::from_str(&run_ok(&mut check(&[
        "--var",
        "u10",
        "--transform",
        kelvin,
        "--json",
    ])))
    .unwrap();
    assert_eq!(u["transforms"].as_array().unwrap().len(), 1, "{u}");
    assert_ne!(u["fingerprint"], r["fingerprint"]);
    // Bad input names the thing.
    fails_with(
        &mut check(&["--var", "t2m", "--transform", r#"{"type": "log"}"#]),
        &["chunk_transforms", "unknown transform type `log`"],
    );
    fails_with(
        &mut check(&[
            "--var",
            "t2m",
            "--transform",
            r#"{"type": "fill_nan", "value": 0}"#,
            "--chunk",
            "10",
        ]),
        &["`chunk` = 10", "10 chunks"],
    );
    fails_with(
        &mut check(&["--var", "t2m", "--transform", "@/no/such/file.json"]),
        &["/no/such/file.json"],
    );

    // warm applies the transforms readers will use, and readers with them read without
    // decoding; a reader with other transforms finds t2m stale.
    let file = tmp.path().join("t.json");
    std::fs::write(&file, kelvin).unwrap();
    let cache = tmp.path().join("cache");
    let at_file = format!("@{}", file.display());
    let out = run_ok(
        cli()
            .arg("warm")
            .arg(&store)
            .arg("--cache-dir")
            .arg(&cache)
            .arg("--manifest")
            .arg(&manifest)
            .args(["--split", "train", "--chunk-transforms", &at_file]),
    );
    assert!(out.contains("12 chunks written"), "{out}");
    let bench = |transforms: &str| {
        bench_with(&store, &manifest)
            .args(["--epochs", "1", "--json", "--readonly-cache"])
            .args(["--chunk-transforms", transforms])
            .arg("--cache-dir")
            .arg(&cache)
            .output()
            .unwrap()
    };
    let out = bench(&at_file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["epochs"][0]["stats"];
    assert_eq!(
        (s["tiles_read"].as_u64(), s["cache_revived"].as_u64()),
        (Some(0), Some(12))
    );
    let out = bench(r#"[{"type": "clip", "min": -1000, "max": 1000}]"#);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[t2m]") && !err.contains("u10"), "{err}");
}

#[test]
fn storage_options_are_key_value_and_refused_for_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, manifest, _) = store_and_split(tmp.path(), &[]);
    for cmd in ["inspect", "bench", "warm", "split", "check-transform"] {
        let mut c = cli();
        c.arg(cmd)
            .arg(&store)
            .args(["--storage-option", "aws_region=eu-west-1"]);
        match cmd {
            "warm" => c.arg("--cache-dir").arg(tmp.path().join("cache")),
            "split" => c.arg("-o").arg(tmp.path().join("m2.json")),
            "check-transform" => c.args([
                "--var",
                "t2m",
                "--transform",
                r#"{"type": "clip", "min": 0, "max": 1}"#,
            ]),
            "bench" => c.arg("--manifest").arg(&manifest),
            _ => &mut c,
        };
        fails_with(&mut c, &["aws_region", "local directory"]);
    }
    fails_with(
        cli()
            .arg("inspect")
            .arg(&store)
            .args(["--storage-option", "aws_region"]),
        &["KEY=VALUE"],
    );
}
