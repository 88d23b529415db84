//! The CLI answers bad input with a non-zero exit and a message naming the thing, and
//! `make-dataset` + `inspect` round-trip.

use std::process::Command;

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
}

#[test]
fn make_dataset_then_inspect_json() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("s.zarr");
    let out = cli()
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
        .arg(&store)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli()
        .arg("inspect")
        .arg(&store)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let vars = v["variables"].as_array().unwrap();
    assert_eq!(vars.len(), 2, "coordinates are not data variables");
    assert_eq!(vars[0]["path"], "t2m");
    assert_eq!(vars[0]["shape"], serde_json::json!([10, 6, 8]));
    assert_eq!(vars[0]["chunks"], serde_json::json!([4, 3, 8]));
    assert_eq!(vars[0]["tiles_per_sample_chunk"], 2);
    assert_eq!(vars[0]["stored_chunks"], 6);
    assert_eq!(vars[0]["stored_chunks_present"], 6);
    assert_eq!(vars[0]["regime"], "moderate");
    let out = cli()
        .args(["inspect", "--sample-axis", "3"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sample_axis 3"));
}
