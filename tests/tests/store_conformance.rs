//! Every stored chunk we decode equals zarr-python's read of the same region, on both IO
//! backends, for every fixture layout (v2 blosc/zstd, '/' separator, F order, v3 zstd, inner
//! chunks, sharded, 5-D, partial final chunks, never-written chunks with non-zero fill, big-endian
//! v2 and v3 data).

use insitubatch_runtime::{IoBackendChoice, RuntimeBuilder, probe};
use insitubatch_store::{LocalStore, open_hierarchy};
use insitubatch_tests::{chunk_region_pair, fixture_arrays};

fn backends() -> Vec<IoBackendChoice> {
    let mut v = vec![IoBackendChoice::Threads];
    if probe().unavailable.is_none() {
        v.push(IoBackendChoice::Uring);
    }
    v
}

#[test]
fn every_stored_chunk_matches_zarr_python_on_both_backends() {
    let fixtures = fixture_arrays();
    assert!(fixtures.len() >= 16, "fixture manifest lists every case");
    for choice in backends() {
        let rt = RuntimeBuilder::new()
            .executor_threads(2)
            .io_backend(choice)
            .build()
            .unwrap();
        for fx in fixtures.clone() {
            let label = format!("{} / {:?} ({choice:?})", fx.case, fx.array);
            let fx2 = fx.clone();
            let checked = rt
                .block_on(move || async move {
                    let fx = fx2;
                    let store = LocalStore::new(&fx.store).unwrap();
                    let h = open_hierarchy(&store).await.unwrap();
                    let a = h
                        .arrays
                        .get(&fx.array)
                        .unwrap_or_else(|| panic!("array {:?} found", fx.array));
                    assert_eq!(a.shape(), fx.shape.as_slice());
                    assert_eq!(a.dtype().name(), fx.dtype);
                    if let Some(shards) = fx.entry.get("shards") {
                        let shards: Vec<u64> = shards
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|v| v.as_u64().unwrap())
                            .collect();
                        assert_eq!(
                            a.chunk_shape(),
                            shards.as_slice(),
                            "the stored chunk is the shard"
                        );
                        assert!(a.inner_chunk_shape().is_some());
                    }
                    let unwritten: Vec<Vec<u64>> = fx
                        .entry
                        .get("unwritten")
                        .and_then(|u| u.as_array())
                        .map(|u| {
                            u.iter()
                                .map(|i| {
                                    i.as_array()
                                        .unwrap()
                                        .iter()
                                        .map(|v| v.as_u64().unwrap())
                                        .collect()
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    let item = a.dtype().size_bytes();
                    let mut n = 0;
                    for index in a.chunk_indices() {
                        let chunk = a.read_chunk(&store, &index).await.unwrap();
                        assert_eq!(chunk.shape, a.chunk_shape());
                        assert_eq!(
                            chunk.is_fill,
                            unwritten.contains(&index),
                            "chunk {index:?} fill state"
                        );
                        let (want, got) = chunk_region_pair(
                            &fx.reference,
                            &fx.shape,
                            &chunk.bytes,
                            &chunk.shape,
                            &index,
                            item,
                        );
                        assert!(want == got, "chunk {index:?} differs from zarr-python");
                        n += 1;
                    }
                    n
                })
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            assert!(checked > 0, "{label}: no chunk checked");
        }
    }
}

#[test]
fn chunk_keys_follow_each_encoding() {
    let fixtures = fixture_arrays();
    let rt = RuntimeBuilder::new().executor_threads(1).build().unwrap();
    let keys = rt
        .block_on(move || async move {
            let mut keys = Vec::new();
            for fx in fixtures.iter().filter(|f| {
                ["v2_blosc_lz4", "v2_zstd_slash", "v3_zstd", "v3_v2keys"].contains(&f.case.as_str())
            }) {
                let store = LocalStore::new(&fx.store).unwrap();
                let h = open_hierarchy(&store).await.unwrap();
                let a = &h.arrays[&fx.array];
                let index = vec![1u64; a.ndim()]
                    .into_iter()
                    .enumerate()
                    .map(|(d, v)| if d == 0 { v } else { 0 })
                    .collect::<Vec<_>>();
                let key = a.chunk_key(&index).unwrap();
                assert!(store.locate(&key).is_file(), "{key} exists on disk");
                keys.push((fx.case.clone(), key));
            }
            keys
        })
        .unwrap();
    let find = |c: &str| {
        keys.iter()
            .find(|(k, _)| k == c)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(find("v2_blosc_lz4"), "1.0.0");
    assert_eq!(find("v2_zstd_slash"), "1/0/0");
    assert_eq!(find("v3_zstd"), "c/1/0/0");
    assert_eq!(find("v3_v2keys"), "1.0");
}

use insitubatch_store::Store;
