//! The data-variable rule of `open_geometries`, `ArrayGeometry`, and every bad input the read
//! layer must answer with a clear error naming the thing.

use std::path::Path;

use insitubatch_runtime::{Runtime, RuntimeBuilder};
use insitubatch_store::{Hierarchy, LocalStore, StoreError, open_geometries, open_hierarchy};
use insitubatch_tests::{copy_dir, fixtures_dir};

fn rt() -> Runtime {
    RuntimeBuilder::new().executor_threads(1).build().unwrap()
}

fn open(rt: &Runtime, path: &Path) -> Result<Hierarchy, StoreError> {
    let path = path.to_path_buf();
    rt.block_on(move || async move {
        let store = LocalStore::new(&path)?;
        open_hierarchy(&store).await
    })
    .unwrap()
}

#[test]
fn data_variables_skip_coordinates_and_0d_arrays() {
    let rt = rt();
    for store in ["era5_v3.zarr", "era5_v2.zarr"] {
        let h = open(&rt, &fixtures_dir().join(store)).unwrap();
        assert_eq!(
            h.discovery,
            if store.contains("v3") {
                "consolidated"
            } else {
                "listing"
            }
        );
        let g = open_geometries(&h, None, 0).unwrap();
        let names: Vec<&str> = g.keys().map(String::as_str).collect();
        // time/latitude/longitude are coordinates, spatial_ref is 0-D; a station series over
        // ('time',) is data.
        assert_eq!(names, ["station", "t2m", "u10"], "{store}");
        let t2m = &g["t2m"];
        assert_eq!(t2m.shape, [12, 9, 16]);
        assert_eq!(t2m.n_samples(), 12);
        assert_eq!(t2m.samples_per_chunk(), 4);
        assert_eq!(t2m.n_sample_chunks(), 3);
        assert_eq!(t2m.inner_shape(), [9, 16]);
        assert_eq!(t2m.tiles_per_sample_chunk(), 1);
        assert_eq!(t2m.sample_bytes(), 9 * 16 * 4);
        let y = t2m.shift(3);
        assert_eq!((y.offset, y.path.as_str()), (3, "t2m"));
        assert_eq!(y.shift(-1).offset, 2);
        // Naming arrays bypasses the rule.
        let named = open_geometries(&h, Some(&["time".to_string(), "t2m".to_string()]), 0).unwrap();
        assert_eq!(named.len(), 2);
        assert_eq!(named["time"].inner_shape(), Vec::<u64>::new());
    }
}

#[test]
fn sample_axis_two_of_a_5d_array() {
    let rt = rt();
    let h = open(&rt, &fixtures_dir().join("v3_tczyx.zarr")).unwrap();
    let g = open_geometries(&h, None, 2).unwrap();
    let z = &g[""];
    assert_eq!(z.n_samples(), 9);
    assert_eq!(z.samples_per_chunk(), 2);
    assert_eq!(z.inner_shape(), [2, 2, 5, 6]);
    assert_eq!(z.inner_chunks(), [1, 2, 5, 6]);
    assert_eq!(z.tiles_per_sample_chunk(), 2);
    assert_eq!(z.chunk_grid(), [2, 1, 5, 1, 1]);
}

#[test]
fn bad_inputs_name_the_thing() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();

    let missing = tmp.path().join("nope.zarr");
    let e = open(&rt, &missing).unwrap_err();
    assert!(matches!(e, StoreError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("nope.zarr"));

    let empty = tmp.path().join("plain_dir");
    std::fs::create_dir(&empty).unwrap();
    let e = open(&rt, &empty).unwrap_err();
    assert!(matches!(e, StoreError::NotZarr { .. }), "{e}");
    assert!(e.to_string().contains("plain_dir"));

    let bad_json = tmp.path().join("bad.zarr");
    std::fs::create_dir(&bad_json).unwrap();
    std::fs::write(
        bad_json.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "gro"#,
    )
    .unwrap();
    let e = open(&rt, &bad_json).unwrap_err();
    assert!(matches!(e, StoreError::BadMetadata { .. }), "{e}");
    assert!(
        e.to_string().contains("zarr.json") && e.to_string().contains("truncated"),
        "{e}"
    );

    // Metadata that is JSON but not a valid array document.
    let bad_meta = tmp.path().join("badmeta.zarr");
    std::fs::create_dir(&bad_meta).unwrap();
    std::fs::write(
        bad_meta.join(".zarray"),
        br#"{"zarr_format": 2, "shape": [4]}"#,
    )
    .unwrap();
    let e = open(&rt, &bad_meta).unwrap_err();
    assert!(matches!(e, StoreError::BadMetadata { .. }), "{e}");
    assert!(e.to_string().contains(".zarray"), "{e}");

    // An unknown codec and an unsupported data type.
    let codec = tmp.path().join("codec.zarr");
    std::fs::create_dir(&codec).unwrap();
    std::fs::write(
        codec.join("zarr.json"),
        br#"{"zarr_format":3,"node_type":"array","shape":[4],"data_type":"float32",
            "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2]}},
            "chunk_key_encoding":{"name":"default"},"fill_value":0,
            "codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"mystery_zip"}]}"#,
    )
    .unwrap();
    let e = open(&rt, &codec).unwrap_err();
    assert!(matches!(e, StoreError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("mystery_zip"), "{e}");
    let dtype = tmp.path().join("dtype.zarr");
    std::fs::create_dir(&dtype).unwrap();
    std::fs::write(
        dtype.join("zarr.json"),
        br#"{"zarr_format":3,"node_type":"array","shape":[4],"data_type":"string",
            "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2]}},
            "chunk_key_encoding":{"name":"default"},"fill_value":"",
            "codecs":[{"name":"vlen-utf8"}]}"#,
    )
    .unwrap();
    let e = open(&rt, &dtype).unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Unsupported {
                what: "data type",
                ..
            }
        ),
        "{e}"
    );

    // sample_axis out of range and an unknown variable.
    let h = open(&rt, &fixtures_dir().join("era5_v3.zarr")).unwrap();
    let e = open_geometries(&h, None, 3).unwrap_err();
    assert!(matches!(e, StoreError::SampleAxis { axis: 3, .. }), "{e}");
    assert!(
        e.to_string().contains("station") || e.to_string().contains("t2m"),
        "{e}"
    );
    let e = open_geometries(&h, Some(&["t3m".to_string()]), 0).unwrap_err();
    assert!(
        e.to_string().contains("t3m") && e.to_string().contains("t2m"),
        "{e}"
    );
}

#[test]
fn corrupt_truncated_directory_and_unreadable_chunks() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let store_dir = tmp.path().join("v3_zstd.zarr");
    copy_dir(&fixtures_dir().join("v3_zstd.zarr"), &store_dir);
    // Chunk (0,0,0): truncated. Chunk (1,0,0): garbage. Chunk (2,0,0): a directory.
    let c0 = store_dir.join("c/0/0/0");
    let bytes = std::fs::read(&c0).unwrap();
    std::fs::write(&c0, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(store_dir.join("c/1/0/0"), b"not zstd at all").unwrap();
    let c2 = store_dir.join("c/2/0/0");
    std::fs::remove_file(&c2).unwrap();
    std::fs::create_dir(&c2).unwrap();

    let dir = store_dir.clone();
    let errors = rt
        .block_on(move || async move {
            let store = LocalStore::new(&dir).unwrap();
            let h = open_hierarchy(&store).await.unwrap();
            let a = &h.arrays[""];
            let mut out = Vec::new();
            for i in 0..3u64 {
                out.push(a.read_chunk(&store, &[i, 0, 0]).await.unwrap_err());
            }
            // The grid is 3 chunks long: an index outside it is an error too.
            out.push(a.read_chunk(&store, &[3, 0, 0]).await.unwrap_err());
            out
        })
        .unwrap();
    for (i, e) in errors.iter().take(2).enumerate() {
        let msg = e.to_string();
        assert!(matches!(e, StoreError::CorruptChunk { .. }), "{msg}");
        assert!(
            msg.contains(&format!("c/{i}/0/0")) && msg.contains("v3_zstd.zarr"),
            "{msg}"
        );
    }
    let msg = errors[2].to_string();
    assert!(
        msg.contains("c/2/0/0") && msg.contains("directory"),
        "{msg}"
    );
    assert!(
        matches!(errors[3], StoreError::ChunkIndex { .. }),
        "{}",
        errors[3]
    );

    // A well-formed zstd frame of the wrong size (another array's chunk put in this one's
    // place) is a corrupt chunk naming it, never a short or padded chunk.
    let other = std::fs::read(fixtures_dir().join("v3_v2keys.zarr/0.0")).unwrap();
    std::fs::write(store_dir.join("c/0/0/0"), &other).unwrap();
    let e = chunk_error(&rt, &store_dir, [0, 0, 0]);
    assert!(matches!(e, StoreError::CorruptChunk { .. }), "{e}");
    assert!(e.to_string().contains("c/0/0/0"), "{e}");

    // Unreadable chunk file (permission denied). Root bypasses permissions, so only check when
    // the mode actually blocks us.
    use std::os::unix::fs::PermissionsExt;
    let c3 = store_dir.join("c/1/0/0");
    std::fs::set_permissions(&c3, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::read(&c3).is_err() {
        let e = chunk_error(&rt, &store_dir, [1, 0, 0]);
        assert!(e.to_string().contains("c/1/0/0"), "{e}");
    }
}

/// The error reading stored chunk `index` of the root array of the store at `dir`.
fn chunk_error(rt: &Runtime, dir: &Path, index: [u64; 3]) -> StoreError {
    let dir = dir.to_path_buf();
    rt.block_on(move || async move {
        let store = LocalStore::new(&dir).unwrap();
        let h = open_hierarchy(&store).await.unwrap();
        h.arrays[""].read_chunk(&store, &index).await.unwrap_err()
    })
    .unwrap()
}
