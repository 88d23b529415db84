//! The data-variable rule of `open_geometries`, `ArrayGeometry`, and every bad input the read
//! layer must answer with a clear error naming the thing.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// A local store that counts the reads in flight at once (of keys ending with `suffix`; `""`
/// for all): each read yields to the executor before it starts, so reads issued together
/// overlap.
struct Counting {
    inner: LocalStore,
    suffix: &'static str,
    now: AtomicUsize,
    peak: AtomicUsize,
    reads: AtomicUsize,
}

impl Counting {
    fn new(root: &std::path::Path, suffix: &'static str) -> Self {
        Self {
            inner: LocalStore::new(root).unwrap(),
            suffix,
            now: 0.into(),
            peak: 0.into(),
            reads: 0.into(),
        }
    }
}

impl insitubatch_store::Store for Counting {
    fn locate(&self, key: &str) -> std::path::PathBuf {
        self.inner.locate(key)
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if !key.ends_with(self.suffix) {
            return self.inner.get(key).await;
        }
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.reads.fetch_add(1, Ordering::SeqCst);
        insitubatch_runtime::yield_now().await;
        let got = self.inner.get(key).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        got
    }

    async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        self.inner.exists(key).await
    }

    async fn list_dir(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list_dir(prefix).await
    }

    fn size_of(&self, key: &str) -> Option<u64> {
        self.inner.size_of(key)
    }
}

#[test]
fn a_group_without_consolidated_metadata_reads_its_arrays_metadata_together() {
    // 40 arrays in each format, listed (no consolidated metadata): their metadata documents
    // are read 16 at a time, not one after another, and every array is found.
    let tmp = tempfile::tempdir().unwrap();
    for (fmt, per_array) in [(3, 1), (2, 2)] {
        let root = tmp.path().join(format!("many_v{fmt}.zarr"));
        std::fs::create_dir_all(&root).unwrap();
        if fmt == 3 {
            std::fs::write(
                root.join("zarr.json"),
                r#"{"zarr_format": 3, "node_type": "group"}"#,
            )
            .unwrap();
        } else {
            std::fs::write(root.join(".zgroup"), r#"{"zarr_format": 2}"#).unwrap();
        }
        for k in 0..40 {
            let dir = root.join(format!("a{k:02}"));
            std::fs::create_dir_all(&dir).unwrap();
            if fmt == 3 {
                let meta = serde_json::json!({"zarr_format": 3, "node_type": "array",
                    "shape": [4, 2], "data_type": "float32",
                    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
                    "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
                    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "attributes": {"k": k}});
                std::fs::write(dir.join("zarr.json"), meta.to_string()).unwrap();
            } else {
                let meta = serde_json::json!({"zarr_format": 2, "shape": [4, 2], "chunks": [2, 2],
                    "dtype": "<f4", "compressor": null, "fill_value": 0, "order": "C",
                    "filters": null});
                std::fs::write(dir.join(".zarray"), meta.to_string()).unwrap();
                std::fs::write(dir.join(".zattrs"), format!(r#"{{"k": {k}}}"#)).unwrap();
            }
        }
        let (peak, reads, found) = rt()
            .block_on(move || async move {
                let store = Counting::new(&root, "");
                let h = open_hierarchy(&store).await.unwrap();
                assert_eq!(h.discovery, "listing");
                let attrs: Vec<_> = h
                    .arrays
                    .values()
                    .map(|a| a.attributes()["k"].clone())
                    .collect();
                assert_eq!(
                    attrs,
                    (0..40).map(serde_json::Value::from).collect::<Vec<_>>()
                );
                (
                    store.peak.into_inner(),
                    store.reads.into_inner(),
                    h.arrays.len(),
                )
            })
            .unwrap();
        assert_eq!(found, 40, "v{fmt}");
        assert_eq!(peak, 16, "v{fmt}: reads in flight at once");
        // The root's documents, then each array's (v2: `.zarray` and `.zattrs`).
        assert!(
            reads >= 40 * per_array && reads <= 40 * per_array + 4,
            "v{fmt}: {reads} reads"
        );
    }
}

#[test]
fn a_v2_group_of_groups_without_consolidated_metadata_reads_their_zgroups_together() {
    // 20 subgroups of one array each: the entries that are not arrays have their `.zgroup`
    // read 16 at a time (one after another before), and every array is found.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("nested_v2.zarr");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join(".zgroup"), r#"{"zarr_format": 2}"#).unwrap();
    let meta = serde_json::json!({"zarr_format": 2, "shape": [4, 2], "chunks": [2, 2],
        "dtype": "<f4", "compressor": null, "fill_value": 0, "order": "C", "filters": null});
    for k in 0..20 {
        let group = root.join(format!("g{k:02}"));
        std::fs::create_dir_all(group.join("x")).unwrap();
        std::fs::write(group.join(".zgroup"), r#"{"zarr_format": 2}"#).unwrap();
        std::fs::write(group.join("x/.zarray"), meta.to_string()).unwrap();
    }
    let (peak, reads, paths) = rt()
        .block_on(move || async move {
            let store = Counting::new(&root, ".zgroup");
            let h = open_hierarchy(&store).await.unwrap();
            let paths: Vec<String> = h.arrays.keys().cloned().collect();
            (store.peak.into_inner(), store.reads.into_inner(), paths)
        })
        .unwrap();
    assert_eq!(
        paths,
        (0..20).map(|k| format!("g{k:02}/x")).collect::<Vec<_>>()
    );
    assert_eq!(peak, 16, "`.zgroup` reads in flight at once");
    // The root's, each subgroup's, and each subgroup's entry `x` (an array: not asked).
    assert_eq!(reads, 1 + 20, "{reads} `.zgroup` reads");
}
