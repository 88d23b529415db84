//! Stores mounted as groups of the dataset's store (`DatasetBuilder::mount`): variables read
//! from two stores equal zarr-python's values, whatever each store's format, layout or
//! location (a directory, a lone array, an HTTP server); the cache directory revives them; and
//! every mount that would read the wrong array, or none, is refused naming it.

use insitubatch::{
    DEFAULT_INFLIGHT_PER_EXECUTOR, DEFAULT_REMOTE_INFLIGHT_PER_EXECUTOR, EngineError,
    InSituDataset, StoreError,
};
use insitubatch_tests::{HttpServer, fixtures_dir};

mod common;
use common::{check_epoch, fixture, run, sorted, synth_store};

fn all_samples(n: u64) -> Vec<u64> {
    (0..n).collect()
}

#[test]
fn variables_of_a_v3_group_and_a_mounted_v2_group_equal_zarr_python() {
    let t2m = fixture("era5_v3", "t2m");
    let u10_v2 = fixture("era5_v2", "u10");
    let t2m_v2 = fixture("era5_v2", "t2m");
    for block_chunks in [1, 2] {
        let ds = InSituDataset::builder(&t2m.store)
            .mount("v2", &u10_v2.store)
            .variable("t", "t2m")
            .variable("u", "v2/u10")
            // A window of a mounted array: the next sample of the v2 store's t2m.
            .window("t_next", "v2/t2m", 1)
            .batch_size(5)
            .block_chunks(block_chunks)
            .seed(3)
            .build()
            .unwrap();
        let refs = [("t", &t2m, 0), ("u", &u10_v2, 0), ("t_next", &t2m_v2, 0)];
        for split in ["train", "all"] {
            let anchors = check_epoch(&ds, split, &refs);
            // The window drops the last anchor, whose next sample is off the array.
            assert_eq!(sorted(anchors), all_samples(11), "{split}");
        }
        let paths: Vec<&str> = ds
            .variables()
            .iter()
            .map(|v| v.geom.path.as_str())
            .collect();
        assert_eq!(paths, ["t2m", "v2/u10", "v2/t2m"]);
        assert_eq!(
            ds.mounts().collect::<Vec<_>>(),
            [("v2", u10_v2.store.as_path())]
        );
    }
}

#[test]
fn without_variables_every_data_variable_of_every_store_is_read() {
    let t2m = fixture("era5_v3", "t2m");
    let v2 = fixture("era5_v2", "t2m");
    let ds = InSituDataset::builder(&t2m.store)
        .mount("archive", &v2.store)
        .build()
        .unwrap();
    let mut labels: Vec<&str> = ds.variables().iter().map(|v| v.label.as_str()).collect();
    labels.sort_unstable();
    // Coordinates (`station` is a data variable here) are skipped in both stores alike.
    assert_eq!(
        labels,
        [
            "archive/station",
            "archive/t2m",
            "archive/u10",
            "station",
            "t2m",
            "u10"
        ]
    );
    let refs = [("archive/t2m", &v2, 0), ("t2m", &t2m, 0)];
    assert_eq!(sorted(check_epoch(&ds, "train", &refs)), all_samples(12));
}

#[test]
fn a_lone_sharded_array_mounted_reads_as_one_variable() {
    // A store that is one array (no group) mounts as the variable of its name; its shards are
    // read through the mount, inner chunks and all.
    let sharded = fixture("one_per_chunk_sharded", "");
    let (_dir, root) = synth_store(&insitubatch::synth::SynthSpec {
        samples: sharded.shape[0],
        grid: (4, 8),
        sample_chunk: 3,
        variables: vec!["t2m".into()],
        ..Default::default()
    });
    let ds = InSituDataset::builder(&root)
        .mount("sharded", &sharded.store)
        .variable("t", "t2m")
        .variable("s", "sharded")
        .batch_size(4)
        .block_chunks(2)
        .build()
        .unwrap();
    let refs = [("s", &sharded, 0)];
    assert_eq!(
        sorted(check_epoch(&ds, "train", &refs)),
        all_samples(sharded.shape[0])
    );
}

#[test]
fn a_store_mounted_over_http_equals_zarr_python_and_its_failures_name_the_url() {
    // A local v2 group (listed) with a consolidated v3 group served over HTTP mounted in it.
    let local = fixture("era5_v2", "t2m");
    let remote = fixture("era5_v3", "u10");
    let server = HttpServer::serve(&fixtures_dir(), &["era5_v3.zarr/u10/c/2/"]);
    let url = server.url("era5_v3.zarr");
    let ds = InSituDataset::builder(&local.store)
        .mount("remote", &url)
        .variable("t", "t2m")
        .variable("u", "remote/u10")
        .batch_size(4)
        .build()
        .unwrap();
    // A mounted remote store gives the dataset the concurrency of a remote one.
    let alone = InSituDataset::builder(&local.store).build().unwrap();
    assert_eq!(
        ds.max_inflight(),
        alone.max_inflight() / DEFAULT_INFLIGHT_PER_EXECUTOR * DEFAULT_REMOTE_INFLIGHT_PER_EXECUTOR
    );
    let err = ds
        .iter("all")
        .unwrap()
        .find_map(Result::err)
        .expect("the chunk the server fails fails the pass");
    let text = err.to_string();
    assert!(
        text.contains(&format!("{url}/u10/c/2/0/0")) && text.contains("500"),
        "{text}"
    );

    let server = HttpServer::serve(&fixtures_dir(), &[]);
    let ds = InSituDataset::builder(&local.store)
        .mount("remote", server.url("era5_v3.zarr"))
        .variable("t", "t2m")
        .variable("u", "remote/u10")
        .batch_size(4)
        .build()
        .unwrap();
    let refs = [("t", &local, 0), ("u", &remote, 0)];
    assert_eq!(sorted(check_epoch(&ds, "train", &refs)), all_samples(12));
}

#[test]
fn a_cache_directory_revives_the_chunks_of_a_mounted_store() {
    let t2m = fixture("era5_v3", "t2m");
    let u10 = fixture("era5_v2", "u10");
    let cache = tempfile::tempdir().unwrap();
    let builder = || {
        InSituDataset::builder(&t2m.store)
            .mount("v2", &u10.store)
            .variable("t", "t2m")
            .variable("u", "v2/u10")
            .batch_size(5)
            .cache_dir(cache.path())
            .persist(true)
    };
    let refs = [("t", &t2m, 0), ("u", &u10, 0)];
    {
        let ds = builder().build().unwrap();
        check_epoch(&ds, "train", &refs);
    }
    let ds = builder().build().unwrap();
    let s = run(&ds, "train");
    assert_eq!((s.tiles_read, s.bytes_decoded), (0, 0), "{s:?}");
    assert_eq!(s.cache_hits, 6, "3 chunks of each array revived: {s:?}");
    check_epoch(&ds, "train", &refs);
}

/// The message of a build that must fail with an invalid argument.
fn refused(b: insitubatch::DatasetBuilder) -> String {
    match b.build() {
        Err(
            e @ (EngineError::Store(_)
            | EngineError::UnequalSampleAxis { .. }
            | EngineError::ManifestMismatch { .. }),
        ) => e.to_string(),
        Err(e) => panic!("another error: {e:?}"),
        Ok(_) => panic!("built"),
    }
}

#[test]
fn mounts_that_would_hide_an_array_or_name_nothing_are_refused() {
    let v3 = fixture("era5_v3", "t2m").store;
    let v2 = fixture("era5_v2", "t2m").store;
    let b = || InSituDataset::builder(&v3);

    // A name the root store uses: its arrays would hide the root's.
    let e = refused(b().mount("t2m", &v2));
    assert!(
        e.contains("as `t2m`") && e.contains("already has an array `t2m`"),
        "{e}"
    );
    for (name, says) in [
        ("", "give a name"),
        ("a/b", "cannot contain `/`"),
        ("..", "give a name"),
        ("__meta", "reserves names starting with `__`"),
    ] {
        let e = refused(b().mount(name, &v2));
        assert!(e.contains(says), "{name:?}: {e}");
    }
    let e = refused(b().mount("x", &v2).mount("x", &v2));
    assert!(e.contains("already mounted under this name"), "{e}");

    // A store that is not there names its path.
    let missing = v2.with_file_name("not_there.zarr");
    match b().mount("x", &missing).build() {
        Err(EngineError::Store(s)) => match *s {
            StoreError::NotFound { ref path } => assert_eq!(path, &missing),
            ref other => panic!("{other:?}"),
        },
        other => panic!("{:?}", other.err()),
    }

    // A root that is one array has no groups to mount into.
    let lone = fixture("v3_zstd", "").store;
    let e = refused(InSituDataset::builder(&lone).mount("x", &v2));
    assert!(e.contains("is an array, not a group"), "{e}");

    // A variable the mount does not have lists what the stores have, mounted paths included.
    let e = refused(b().mount("v2", &v2).variable("w", "v2/w10"));
    assert!(e.contains("`v2/w10`") && e.contains("v2/u10"), "{e}");

    // Two stores of different lengths along the sample axis.
    let paired = fixture("paired", "raw").store;
    let e = refused(
        b().mount("p", &paired)
            .variable("t", "t2m")
            .variable("r", "p/raw"),
    );
    assert!(
        e.contains("`t`") && e.contains("`r`") && e.contains("61"),
        "{e}"
    );
}

#[test]
fn a_manifest_made_on_the_mounted_store_splits_its_array_in_the_dataset() {
    // Split by the mounted store's own `u10` (chunks of 4 samples, 3 chunks): the dataset
    // reads that array as `v2/u10` and takes the manifest as made for it.
    let t2m = fixture("era5_v3", "t2m");
    let u10 = fixture("era5_v2", "u10");
    let geoms = insitubatch::geometries(&u10.store, Some(&["u10".to_string()]), 0).unwrap();
    let manifest =
        insitubatch::split_by_chunk(&geoms["u10"], &[2.0 / 3.0, 1.0 / 3.0], 0, true, None).unwrap();
    let b = || {
        InSituDataset::builder(&t2m.store)
            .mount("v2", &u10.store)
            .variable("u", "v2/u10")
            .variable("t", "t2m")
            .manifest(manifest.clone())
            .batch_size(3)
    };
    let ds = b().build().unwrap();
    assert_eq!(ds.manifest().array, "v2/u10");
    let refs = [("u", &u10, 0), ("t", &t2m, 0)];
    assert_eq!(sorted(check_epoch(&ds, "train", &refs)), all_samples(8));
    assert_eq!(
        sorted(check_epoch(&ds, "val", &refs)),
        (8..12).collect::<Vec<_>>()
    );

    // Two mounts that both have a `u10`: which one the manifest was made on is not known.
    let e = refused(b().mount("again", &u10.store).variable("u2", "again/u10"));
    assert!(e.contains("made for array `u10`"), "{e}");
}
