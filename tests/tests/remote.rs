//! Object stores, exercised through a plain HTTP server over the zarr-python fixtures (the
//! same `object_store` client path as S3, GCS and Azure, minus the signing): every sample equals
//! zarr-python's, the batches equal the local store's, and every failure names the URL.

use std::time::Duration;

use insitubatch::{
    DEFAULT_INFLIGHT_PER_EXECUTOR, DEFAULT_REMOTE_INFLIGHT_PER_EXECUTOR, EngineError,
    InSituDataset, OnBadChunk, StoreError,
};
use insitubatch_tests::{
    FixtureArray, HttpServer, fixture_arrays, fixtures_dir, sample_of, threads_named_settled,
};

mod common;
use common::{check_epoch, fixture, sample_axis_of};

/// The fixture's store directory name, which is its path under the served directory.
fn store_name(f: &FixtureArray) -> String {
    f.store.file_name().unwrap().to_str().unwrap().to_string()
}

/// Groups written without consolidated metadata, which a server that cannot list cannot open.
fn needs_listing(f: &FixtureArray) -> bool {
    matches!(f.case.as_str(), "era5_v2" | "paired")
}

fn dataset(root: &str, f: &FixtureArray) -> Result<InSituDataset, EngineError> {
    InSituDataset::builder(root)
        .variable("v", f.array.clone())
        .sample_axis(sample_axis_of(f))
        .batch_size(3)
        .block_chunks(2)
        .seed(7)
        .build()
}

#[test]
fn every_fixture_served_over_http_equals_zarr_python_and_the_local_store() {
    let server = HttpServer::serve(&fixtures_dir(), &[]);
    let mut checked = 0;
    for f in fixture_arrays().into_iter().filter(|f| !needs_listing(f)) {
        let url = server.url(&store_name(&f));
        let remote = dataset(&url, &f).unwrap_or_else(|e| panic!("{}/{}: {e}", f.case, f.array));
        let local = dataset(f.store.to_str().unwrap(), &f).unwrap();
        // Reads are requests of tens of milliseconds: more of them in flight by default.
        assert_eq!(
            remote.max_inflight(),
            local.max_inflight() / DEFAULT_INFLIGHT_PER_EXECUTOR
                * DEFAULT_REMOTE_INFLIGHT_PER_EXECUTOR
        );
        let axis = sample_axis_of(&f);
        for split in ["train", "all"] {
            let got = check_epoch(&remote, split, &[("v", &f, axis)]);
            let want = check_epoch(&local, split, &[("v", &f, axis)]);
            assert_eq!(got, want, "{}/{} {split}: order differs", f.case, f.array);
        }
        // Never-written chunks (404) are the fill value, as zarr-python reads them.
        if f.entry.get("unwritten").is_some() {
            let mut pass = remote.iter("all").unwrap();
            for b in pass.by_ref() {
                b.unwrap();
            }
            let stats = pass.stats();
            assert!(stats.bad_chunks.is_empty(), "{stats:?}");
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} fixture arrays served");
}

#[test]
fn a_region_of_a_sharded_array_over_http_reads_byte_ranges_or_says_the_server_cannot() {
    for case in ["v3_sharded", "v3_sharded_start"] {
        let f = fixture_arrays()
            .into_iter()
            .find(|f| f.case == case)
            .unwrap();
        let build = |root: &str| {
            InSituDataset::builder(root)
                .cropped_window("x", "", 0, &[(3, 6), (4, 8)])
                .batch_size(4)
                .build()
                .unwrap()
        };
        let epoch = |ds: &InSituDataset| {
            let mut pass = ds.all().unwrap();
            let bytes: Vec<Vec<u8>> = pass
                .by_ref()
                .map(|b| b.unwrap().array("x").unwrap().bytes().to_vec())
                .collect();
            (bytes, pass.stats())
        };
        let server = HttpServer::serve(&fixtures_dir(), &[]);
        let (remote, remote_stats) = epoch(&build(&server.url(&store_name(&f))));
        let (local, local_stats) = epoch(&build(f.store.to_str().unwrap()));
        assert_eq!(remote, local, "{case}");
        assert_eq!(remote_stats.bytes_read, local_stats.bytes_read, "{case}");
        assert!(remote_stats.bad_chunks.is_empty());
        // A server that answers every GET whole cannot serve part of a shard: the read fails
        // naming the chunk's URL and why.
        let plain = HttpServer::serve_without_ranges(&fixtures_dir());
        let url = plain.url(&store_name(&f));
        let err = build(&url)
            .all()
            .unwrap()
            .find_map(Result::err)
            .expect("a shard's index cannot be read by range")
            .to_string();
        assert!(
            err.contains(&url) && err.contains("byte-range requests"),
            "{case}: {err}"
        );
    }
}

#[test]
fn a_group_that_cannot_be_listed_says_to_consolidate_it() {
    let server = HttpServer::serve(&fixtures_dir(), &[]);
    let url = server.url("era5_v2.zarr");
    let err = InSituDataset::builder(&url)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&url) && err.contains("consolidate_metadata"),
        "{err}"
    );
}

#[test]
fn a_missing_store_and_a_refused_connection_name_the_url() {
    let server = HttpServer::serve(&fixtures_dir(), &[]);
    let url = server.url("no_such.zarr");
    let err = InSituDataset::builder(&url).build().unwrap_err();
    assert!(
        matches!(&err, EngineError::Store(s) if matches!(**s, StoreError::NotZarr { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains(&url), "{err}");

    // A port nobody listens on: refused at once, retried a bounded number of times.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/era5_v3.zarr");
    let started = std::time::Instant::now();
    let err = InSituDataset::builder(&url).build().unwrap_err();
    assert!(
        matches!(&err, EngineError::Store(s) if matches!(**s, StoreError::Remote { .. })),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains(&format!("{url}/zarr.json")), "{text}");
    // Not a timing assertion on the machine's speed: the retry budget is 60 s, and a client
    // left at its defaults would retry a refused connection for three minutes.
    assert!(started.elapsed() < Duration::from_secs(60), "{text}");
}

#[test]
fn a_chunk_the_server_fails_raises_naming_its_url_or_reads_as_nan() {
    let f = fixture("era5_v3", "t2m");
    let server = HttpServer::serve(&fixtures_dir(), &["era5_v3.zarr/t2m/c/1/"]);
    let url = server.url("era5_v3.zarr");
    let ds = dataset(&url, &f).unwrap();
    let err = ds
        .iter("all")
        .unwrap()
        .find_map(Result::err)
        .expect("the pass fails");
    let text = err.to_string();
    assert!(
        text.contains(&format!("{url}/t2m/c/1/0/0")) && text.contains("500"),
        "{text}"
    );

    let ds = InSituDataset::builder(&url)
        .variable("v", "t2m")
        .batch_size(5)
        .on_bad_chunk(OnBadChunk::Nan)
        .build()
        .unwrap();
    let mut pass = ds.all().unwrap();
    let sb = 9 * 16 * 4;
    for b in pass.by_ref() {
        let b = b.unwrap();
        let v = b.array("v").unwrap();
        for (r, idx) in b.sample_indices().iter().enumerate() {
            if (4..8).contains(idx) {
                let vals: &[f32] = &v.values::<f32>().unwrap()[r * 144..(r + 1) * 144];
                assert!(vals.iter().all(|x| x.is_nan()), "sample {idx}");
            } else {
                let want = sample_of(&f.reference, &f.shape, 0, *idx, 4);
                assert_eq!(&v.bytes()[r * sb..(r + 1) * sb], &want[..], "sample {idx}");
            }
        }
    }
    let s = pass.stats();
    assert_eq!(s.bad_chunks.len(), 1, "{s:?}");
    assert_eq!(s.bad_chunks[0].key, "t2m/c/1/0/0");
    assert!(s.bad_chunks[0].message.contains("500"), "{s:?}");
}

#[test]
fn a_dataset_over_http_leaves_no_client_threads_once_dropped() {
    let f = fixture("era5_v3", "t2m");
    let server = HttpServer::serve(&fixtures_dir(), &[]);
    // Three client threads asked for (insitubatch's own storage option, beside the crate's).
    let ds = InSituDataset::builder(server.url("era5_v3.zarr"))
        .variable("v", f.array.clone())
        .batch_size(3)
        .storage_option("client_threads", "3")
        .storage_option("timeout", "20s")
        .build()
        .unwrap();
    let mut pass = ds.train().unwrap();
    pass.next().unwrap().unwrap();
    assert_eq!(threads_named_settled("isb-objstore", 3), 3);
    // Dropped mid-epoch, with reads possibly in flight.
    drop(pass);
    drop(ds);
    assert_eq!(threads_named_settled("isb-objstore", 0), 0);
}

#[test]
fn storage_options_are_refused_for_a_local_directory_and_checked_for_a_url() {
    let f = fixture("era5_v3", "t2m");
    let err = InSituDataset::builder(&f.store)
        .storage_option("aws_region", "eu-west-1")
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("aws_region") && err.contains("local directory"),
        "{err}"
    );
    let err = InSituDataset::builder("s3://bucket/era5.zarr")
        .storage_option("aws_no_such_option", "1")
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("aws_no_such_option"), "{err}");
    let err = InSituDataset::builder("ftp://host/era5.zarr")
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("ftp://") && err.contains("s3://"), "{err}");
}

#[test]
fn a_pass_that_stops_abandons_its_requests_in_flight() {
    let f = fixture("era5_v3", "t2m");
    // Chunk reads are held 3 s; metadata is answered at once.
    let hold = Duration::from_secs(3);
    let server = HttpServer::serve_slow(&fixtures_dir(), "era5_v3.zarr/t2m/c/", hold);
    let ds = dataset(&server.url("era5_v3.zarr"), &f).unwrap();
    let pass = ds.train().unwrap();
    // Wait until the pass's first reads are with the server, then stop the pass while the
    // dataset (and its client) lives on.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while server.held_stats().0 == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no read reached the server"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(pass);
    std::thread::sleep(hold + Duration::from_millis(500));
    let (held, abandoned, answered) = server.held_stats();
    assert!(held >= 1);
    assert_eq!(
        (abandoned, answered),
        (held, 0),
        "a stopped pass left requests to run to completion"
    );
    drop(ds);
}
