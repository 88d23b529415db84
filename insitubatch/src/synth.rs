//! Synthetic ERA5-like stores for demos, benchmarks and tests (`insitubatch make-dataset`).
//!
//! Fields are smooth float32 (a few planetary waves drifting with time) plus low-amplitude
//! deterministic noise, so that zstd compresses them about as well as it compresses ERA5, and
//! decoding costs what it costs on real data.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use zarrs::array::{Array, ArrayMetadata};
use zarrs::filesystem::FilesystemStore;

/// Compression of a synthetic store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// zstd at the given level.
    Zstd(i32),
    /// blosc with lz4 and byte shuffle, at the given level (v2 and v3).
    BloscLz4(u8),
    /// No compression.
    None,
}

/// What to build.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    /// Samples along the time (sample) axis.
    pub samples: u64,
    /// Latitude × longitude grid.
    pub grid: (u64, u64),
    /// Samples per chunk along time.
    pub sample_chunk: u64,
    /// Field-axis chunking (defaults to the whole grid).
    pub inner_chunks: Option<(u64, u64)>,
    /// 2 or 3.
    pub zarr_format: u8,
    /// Compression.
    pub codec: Codec,
    /// Sharded v3: samples per shard (a multiple of `sample_chunk`); the stored chunk is the
    /// shard.
    pub shard_samples: Option<u64>,
    /// Data variable names (each a (time, latitude, longitude) float32 field).
    pub variables: Vec<String>,
}

impl Default for SynthSpec {
    fn default() -> Self {
        Self {
            samples: 256,
            grid: (181, 360),
            sample_chunk: 8,
            inner_chunks: None,
            zarr_format: 3,
            codec: Codec::Zstd(3),
            shard_samples: None,
            variables: vec!["t2m".into(), "u10".into()],
        }
    }
}

/// Errors building a synthetic store.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// An argument that cannot work.
    #[error("invalid make-dataset argument `{argument}`: {message}")]
    Invalid {
        /// Argument name.
        argument: &'static str,
        /// What is wrong.
        message: String,
    },
    /// Writing failed.
    #[error("writing {path}: {message}")]
    Write {
        /// Where.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

impl SynthSpec {
    fn validate(&self) -> Result<(), SynthError> {
        let inv = |argument, message: String| Err(SynthError::Invalid { argument, message });
        if self.samples == 0 {
            return inv("samples", "must be at least 1".into());
        }
        if self.grid.0 == 0 || self.grid.1 == 0 {
            return inv("grid", "both dimensions must be at least 1".into());
        }
        if self.sample_chunk == 0 {
            return inv("sample_chunk", "must be at least 1".into());
        }
        if let Some((a, b)) = self.inner_chunks
            && (a == 0 || b == 0)
        {
            return inv("inner_chunks", "both dimensions must be at least 1".into());
        }
        if !matches!(self.zarr_format, 2 | 3) {
            return inv("format", format!("{} is not 2 or 3", self.zarr_format));
        }
        if let Some(s) = self.shard_samples {
            if self.zarr_format != 3 {
                return inv(
                    "shard_samples",
                    "sharding needs Zarr v3 (--format 3)".into(),
                );
            }
            if s == 0 || s % self.sample_chunk != 0 {
                return inv(
                    "shard_samples",
                    format!(
                        "{s} is not a positive multiple of sample_chunk {}",
                        self.sample_chunk
                    ),
                );
            }
        }
        if self.variables.is_empty() {
            return inv("variables", "at least one variable".into());
        }
        // Every core builds and encodes one stored chunk at a time in memory: a chunk too big
        // for that is refused here rather than found out by the OOM killer.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let limit = insitubatch_actors::planner::memory_limit()
            .map_or(u64::MAX, |m| m.bytes / (4 * threads));
        let stored = self.stored_chunk();
        let chunk_bytes = stored.iter().try_fold(4u64, |acc, d| acc.checked_mul(*d));
        match chunk_bytes {
            Some(b) if b <= limit => {}
            _ => {
                // One sample's tile too big is the grid's split to change; else the samples.
                let (lat, lon) = self.inner_chunks.unwrap_or(self.grid);
                let tile_bytes = lat.saturating_mul(lon).saturating_mul(4);
                let argument = if tile_bytes > limit {
                    "inner_chunks"
                } else {
                    "sample_chunk"
                };
                return inv(
                    argument,
                    format!(
                        "a stored chunk of {} would hold {} decoded, and each of the {threads} \
                         cores builds one in memory ({} here at most); split the grid with \
                         --inner-chunks or lower --sample-chunk (or --shard-samples)",
                        stored
                            .iter()
                            .map(u64::to_string)
                            .collect::<Vec<_>>()
                            .join(" x "),
                        chunk_bytes.map_or("more than 16 EiB".into(), crate::inspect::human_bytes),
                        crate::inspect::human_bytes(limit),
                    ),
                );
            }
        }
        Ok(())
    }

    /// Stored-chunk shape (the shard when sharded).
    pub fn stored_chunk(&self) -> Vec<u64> {
        let (lat, lon) = self.inner_chunks.unwrap_or(self.grid);
        match self.shard_samples {
            Some(s) => vec![s, self.grid.0, self.grid.1],
            None => vec![self.sample_chunk, lat, lon],
        }
    }

    /// Decoded bytes of every data variable together.
    pub fn decoded_bytes(&self) -> u64 {
        self.samples * self.grid.0 * self.grid.1 * 4 * self.variables.len() as u64
    }
}

fn compressor_v3(codec: Codec) -> Vec<Value> {
    match codec {
        Codec::Zstd(level) => {
            vec![json!({"name": "zstd", "configuration": {"level": level, "checksum": false}})]
        }
        Codec::BloscLz4(level) => vec![json!({"name": "blosc", "configuration":
            {"cname": "lz4", "clevel": level, "shuffle": "shuffle", "typesize": 4, "blocksize": 0}})],
        Codec::None => vec![],
    }
}

fn compressor_v2(codec: Codec) -> Value {
    match codec {
        Codec::Zstd(level) => json!({"id": "zstd", "level": level}),
        Codec::BloscLz4(level) => {
            json!({"id": "blosc", "cname": "lz4", "clevel": level, "shuffle": 1, "blocksize": 0})
        }
        Codec::None => Value::Null,
    }
}

/// A variable's metadata. Its fill value is NaN, as ERA5's: no field takes it, and readers that
/// treat the fill value as missing (xarray) leave every stored value alone.
fn array_meta(
    spec: &SynthSpec,
    shape: &[u64],
    chunks: &[u64],
    dims: &[&str],
    dtype: &str,
) -> Value {
    if spec.zarr_format == 2 {
        let dt = match dtype {
            "float32" => "<f4",
            "int64" => "<i8",
            _ => "<f4",
        };
        return json!({"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dt,
            "compressor": compressor_v2(spec.codec), "fill_value": "NaN", "order": "C", "filters": null,
            "dimension_separator": "."});
    }
    let mut codecs = vec![json!({"name": "bytes", "configuration": {"endian": "little"}})];
    codecs.extend(compressor_v3(spec.codec));
    json!({"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": "NaN", "codecs": codecs, "dimension_names": dims, "attributes": {}})
}

fn sharded_meta(spec: &SynthSpec, shape: &[u64], shard: &[u64], inner: &[u64]) -> Value {
    let mut inner_codecs = vec![json!({"name": "bytes", "configuration": {"endian": "little"}})];
    inner_codecs.extend(compressor_v3(spec.codec));
    json!({"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shard}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": "NaN",
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": inner, "codecs": inner_codecs,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}],
        "dimension_names": ["time", "latitude", "longitude"], "attributes": {}})
}

/// The value of variable `var` at (t, i, j): what tests compare against.
pub fn field_value(var: usize, t: u64, i: u64, j: u64, grid: (u64, u64)) -> f32 {
    let lat = std::f64::consts::PI * (i as f64 / grid.0.max(1) as f64 - 0.5);
    let lon = 2.0 * std::f64::consts::PI * j as f64 / grid.1.max(1) as f64;
    let phase = t as f64 * 0.07 + var as f64 * 1.3;
    let smooth = 280.0 - 30.0 * lat.sin().powi(2)
        + 8.0 * (3.0 * lon + phase).sin() * lat.cos()
        + 3.0 * (5.0 * lon - 2.0 * phase).cos() * (2.0 * lat).cos();
    // Deterministic noise of about 0.05 K: realistic low-order mantissa entropy.
    let mut h = (var as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ t.wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ i.wrapping_mul(0x94D0_49BB_1331_11EB)
        ^ j;
    h ^= h >> 31;
    h = h.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    h ^= h >> 32;
    let noise = (h & 0xFFFF) as f64 / 65536.0 - 0.5;
    (smooth + 0.1 * noise) as f32
}

enum CoordValues {
    I64(Vec<i64>),
    F32(Vec<f32>),
}

fn write_json(path: &Path, value: &Value) -> Result<(), SynthError> {
    std::fs::write(path, serde_json::to_vec_pretty(value).expect("json")).map_err(|e| {
        SynthError::Write {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    })
}

/// Writes the store at `dir` (created; must not hold a Zarr store already unless `overwrite`).
/// `progress` is called with (chunks written, chunks total).
pub fn make_dataset(
    dir: &Path,
    spec: &SynthSpec,
    overwrite: bool,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<(), SynthError> {
    spec.validate()?;
    let werr = |message: String| SynthError::Write {
        path: dir.to_path_buf(),
        message,
    };
    if dir.exists() {
        let has_zarr = ["zarr.json", ".zgroup", ".zarray"]
            .iter()
            .any(|f| dir.join(f).exists());
        if has_zarr && !overwrite {
            return Err(SynthError::Invalid {
                argument: "DIR",
                message: format!(
                    "{} already holds a Zarr store; pass --force to overwrite",
                    dir.display()
                ),
            });
        }
        if has_zarr {
            std::fs::remove_dir_all(dir).map_err(|e| werr(e.to_string()))?;
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| werr(e.to_string()))?;
    let store = Arc::new(FilesystemStore::new(dir).map_err(|e| werr(e.to_string()))?);
    let (nlat, nlon) = spec.grid;

    // Group and coordinates.
    if spec.zarr_format == 3 {
        write_json(
            &dir.join("zarr.json"),
            &json!({"zarr_format": 3, "node_type": "group", "attributes": group_attributes()}),
        )?;
    } else {
        write_json(&dir.join(".zgroup"), &json!({"zarr_format": 2}))?;
        write_json(&dir.join(".zattrs"), &group_attributes())?;
    }
    // Each coordinate with its CF attributes, as ERA5 stores them: time in hours since a
    // reference date, which readers decode to dates (`inspect`, `coordinate_values`).
    let coord = |name: &str,
                 len: u64,
                 values: CoordValues,
                 attrs: serde_json::Value|
     -> Result<(), SynthError> {
        let dtype = match values {
            CoordValues::I64(_) => "int64",
            CoordValues::F32(_) => "float32",
        };
        let mut meta = array_meta(spec, &[len], &[len], &[name], dtype);
        // No fill value a coordinate takes: readers such as xarray treat values equal to it as
        // missing (time 0 would become NaT).
        meta["fill_value"] = match (spec.zarr_format, &values) {
            (2, _) => Value::Null,
            (_, CoordValues::I64(_)) => json!(i64::MIN),
            (_, CoordValues::F32(_)) => json!("NaN"),
        };
        if spec.zarr_format == 3 {
            meta["attributes"] = attrs.clone();
        }
        let md: ArrayMetadata = serde_json::from_value(meta).map_err(|e| werr(e.to_string()))?;
        let a = Array::new_with_metadata(Arc::clone(&store), &format!("/{name}"), md)
            .map_err(|e| werr(e.to_string()))?;
        a.store_metadata().map_err(|e| werr(e.to_string()))?;
        match values {
            CoordValues::I64(v) => a.store_chunk(&[0], v),
            CoordValues::F32(v) => a.store_chunk(&[0], v),
        }
        .map_err(|e| werr(e.to_string()))?;
        if spec.zarr_format == 2 {
            let mut zattrs = attrs;
            zattrs["_ARRAY_DIMENSIONS"] = json!([name]);
            write_json(&dir.join(name).join(".zattrs"), &zattrs)?;
        }
        Ok(())
    };
    coord(
        "time",
        spec.samples,
        CoordValues::I64((0..spec.samples as i64).map(|t| t * 6).collect()),
        json!({"units": "hours since 1979-01-01 00:00:00", "calendar": "proleptic_gregorian",
               "standard_name": "time"}),
    )?;
    coord(
        "latitude",
        nlat,
        CoordValues::F32(
            (0..nlat)
                .map(|i| 90.0 - 180.0 * i as f32 / (nlat.max(2) - 1) as f32)
                .collect(),
        ),
        json!({"units": "degrees_north", "standard_name": "latitude"}),
    )?;
    coord(
        "longitude",
        nlon,
        CoordValues::F32((0..nlon).map(|j| 360.0 * j as f32 / nlon as f32).collect()),
        json!({"units": "degrees_east", "standard_name": "longitude"}),
    )?;

    let shape = [spec.samples, nlat, nlon];
    let stored = spec.stored_chunk();
    let mut arrays = Vec::new();
    for name in &spec.variables {
        let meta = match spec.shard_samples {
            Some(_) => {
                let (ilat, ilon) = spec.inner_chunks.unwrap_or(spec.grid);
                sharded_meta(spec, &shape, &stored, &[spec.sample_chunk, ilat, ilon])
            }
            None => array_meta(
                spec,
                &shape,
                &stored,
                &["time", "latitude", "longitude"],
                "float32",
            ),
        };
        let md: ArrayMetadata = serde_json::from_value(meta).map_err(|e| werr(e.to_string()))?;
        let a = Array::new_with_metadata(Arc::clone(&store), &format!("/{name}"), md)
            .map_err(|e| werr(e.to_string()))?;
        a.store_metadata().map_err(|e| werr(e.to_string()))?;
        if spec.zarr_format == 2 {
            write_json(
                &dir.join(name).join(".zattrs"),
                &json!({"_ARRAY_DIMENSIONS": ["time", "latitude", "longitude"]}),
            )?;
        }
        arrays.push(a);
    }

    // Chunks, encoded on every core.
    let grid: Vec<u64> = shape
        .iter()
        .zip(&stored)
        .map(|(s, c)| s.div_ceil(*c))
        .collect();
    let per_var: u64 = grid.iter().product();
    let total = per_var * arrays.len() as u64;
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let first_error = std::sync::Mutex::new(None::<String>);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= total || first_error.lock().map(|e| e.is_some()).unwrap_or(true) {
                        break;
                    }
                    let (var, flat) = ((k / per_var) as usize, k % per_var);
                    let idx = [
                        flat / (grid[1] * grid[2]),
                        (flat / grid[2]) % grid[1],
                        flat % grid[2],
                    ];
                    let mut values =
                        Vec::with_capacity((stored[0] * stored[1] * stored[2]) as usize);
                    for dt in 0..stored[0] {
                        for di in 0..stored[1] {
                            for dj in 0..stored[2] {
                                let (t, i, j) = (
                                    idx[0] * stored[0] + dt,
                                    idx[1] * stored[1] + di,
                                    idx[2] * stored[2] + dj,
                                );
                                let v = if t < shape[0] && i < shape[1] && j < shape[2] {
                                    field_value(var, t, i, j, spec.grid)
                                } else {
                                    0.0
                                };
                                values.push(v);
                            }
                        }
                    }
                    if let Err(e) = arrays[var].store_chunk(&idx, values) {
                        *first_error.lock().unwrap() = Some(e.to_string());
                        break;
                    }
                    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                    progress(d, total);
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap() {
        return Err(werr(e));
    }
    let mut names = vec!["time".to_string(), "latitude".into(), "longitude".into()];
    names.extend(spec.variables.iter().cloned());
    consolidate(dir, spec.zarr_format, &names)
}

/// The version of what `make-dataset` writes: raised whenever a store made by this version
/// would differ from one made by the last (values, attributes, fill values), so that tools
/// keeping stores between runs (`make bench-harness`) can tell a stale one and rebuild it.
/// 2: ERA5's CF attributes and fill values no value takes (thirtieth session).
pub const SYNTH_LAYOUT: u64 = 2;

/// The group's attributes: `{"insitubatch_synthetic": {"layout": SYNTH_LAYOUT}}`.
fn group_attributes() -> Value {
    json!({"insitubatch_synthetic": {"layout": SYNTH_LAYOUT}})
}

/// Writes consolidated metadata for the arrays `names` of the group at `dir`, as zarr-python's
/// `consolidate_metadata` does (v3: inline in the group's `zarr.json`; v2: `.zmetadata`), so
/// that the store opens without listing: an object store lists slowly, and a plain HTTP server
/// cannot list at all.
fn consolidate(dir: &Path, zarr_format: u8, names: &[String]) -> Result<(), SynthError> {
    let read = |path: &Path| -> Result<Value, SynthError> {
        let bytes = std::fs::read(path).map_err(|e| SynthError::Write {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        serde_json::from_slice(&bytes).map_err(|e| SynthError::Write {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    };
    let mut entries = serde_json::Map::new();
    if zarr_format == 3 {
        for name in names {
            entries.insert(name.clone(), read(&dir.join(name).join("zarr.json"))?);
        }
        let group = json!({
            "zarr_format": 3,
            "node_type": "group",
            "attributes": group_attributes(),
            "consolidated_metadata": {"kind": "inline", "must_understand": false, "metadata": entries},
        });
        write_json(&dir.join("zarr.json"), &group)
    } else {
        entries.insert(".zgroup".into(), json!({"zarr_format": 2}));
        entries.insert(".zattrs".into(), group_attributes());
        for name in names {
            for file in [".zarray", ".zattrs"] {
                entries.insert(format!("{name}/{file}"), read(&dir.join(name).join(file))?);
            }
        }
        let cons = json!({"zarr_consolidated_format": 1, "metadata": entries});
        write_json(&dir.join(".zmetadata"), &cons)
    }
}
