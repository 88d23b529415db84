//! `insitubatch inspect`: what is in a store and how the loader will see it.

use serde::Serialize;

use insitubatch_runtime::Handle;
use insitubatch_store::{AnyStore, ArrayGeometry, StoreError, open_geometries, open_hierarchy};

/// One variable's report.
#[derive(Clone, Debug, Serialize)]
pub struct VariableReport {
    /// Array path.
    pub path: String,
    /// Physical shape.
    pub shape: Vec<u64>,
    /// Stored-chunk shape (shard when sharded).
    pub chunks: Vec<u64>,
    /// Inner chunk shape inside a shard.
    pub inner_chunks: Option<Vec<u64>>,
    /// Element type.
    pub dtype: String,
    /// Codec pipeline.
    pub codecs: Vec<String>,
    /// Zarr format.
    pub zarr_format: u8,
    /// Stored chunks.
    pub stored_chunks: u64,
    /// Stored chunks present on disk (null when the store cannot be listed: a plain HTTP
    /// server).
    pub stored_chunks_present: Option<u64>,
    /// Bytes on disk of all present stored chunks (null when unknown).
    pub stored_bytes_on_disk: Option<u64>,
    /// Mean bytes on disk per present stored chunk (null when unknown).
    pub stored_chunk_bytes_mean: Option<u64>,
    /// Decoded bytes per stored chunk.
    pub stored_chunk_bytes_decoded: u64,
    /// Samples per stored chunk along the sample axis.
    pub samples_per_chunk: u64,
    /// Stored chunks (tiles) per sample-axis chunk.
    pub tiles_per_sample_chunk: u64,
    /// The axes' dimension names with their lengths and the first and last values of their
    /// coordinate arrays (null when the array names no dimensions): what a region in
    /// coordinate values (`--coords`) is given in.
    pub dimensions: Option<Vec<DimensionReport>>,
    /// The regime the spec's trade-offs name, with a one-line hint.
    pub regime: String,
    /// What it means for reading.
    pub hint: String,
}

/// One axis of a variable, by name.
#[derive(Clone, Debug, Serialize)]
pub struct DimensionReport {
    /// The dimension's name.
    pub name: String,
    /// Its length.
    pub length: u64,
    /// The first and last values of the 1-D coordinate array of that name beside the
    /// variable (null when there is none).
    pub coordinate: Option<(f64, f64)>,
    /// The same two values as dates and times (`1979-01-01T00:00`), when the coordinate's
    /// `units` are CF time units in a Gregorian calendar (null otherwise).
    pub times: Option<(String, String)>,
}

/// Whole report.
#[derive(Clone, Debug, Serialize)]
pub struct InspectReport {
    /// Store path.
    pub path: String,
    /// Sample axis used.
    pub sample_axis: usize,
    /// IO backend in use.
    pub io_backend: String,
    /// Why io_uring is not used, if it is not.
    pub io_fallback_reason: Option<String>,
    /// How arrays were discovered.
    pub discovery: String,
    /// The data variables.
    pub variables: Vec<VariableReport>,
}

/// Names the regime of the spec's trade-offs for a geometry.
pub fn regime(g: &ArrayGeometry) -> (&'static str, &'static str) {
    let spc = g.samples_per_chunk();
    let tiles = g.tiles_per_sample_chunk();
    if spc == 1 {
        (
            "GRIB",
            "one sample per stored chunk: nothing to amortise, every sample is its own read",
        )
    } else if spc >= 8 && tiles > 1 {
        (
            "fat spatial",
            "many samples per chunk, split into inner tiles: the sweet spot (cheap concurrency, high reuse)",
        )
    } else if spc >= 8 {
        (
            "fat single inner",
            "many samples per chunk in one tile: high reuse, but each in-flight read costs a whole chunk of memory",
        )
    } else {
        (
            "moderate",
            "a few samples per chunk: some amortisation; larger sample chunks read faster",
        )
    }
}

/// Where the sizes of an array's stored chunks come from.
enum Sizes {
    /// A local file's size each (a `stat`, no request).
    PerFile,
    /// One listing of an object store's array prefix, by key.
    Listed(std::collections::HashMap<String, u64>),
    /// A store that cannot be listed: unknown.
    Unknown,
}

/// Builds the report (runs metadata reads on the runtime).
pub fn inspect(
    handle: &Handle,
    path: &std::path::Path,
    variables: Option<Vec<String>>,
    sample_axis: usize,
    storage_options: &[(String, String)],
) -> Result<InspectReport, StoreError> {
    let store = AnyStore::open(path, storage_options)?;
    let st = store.clone();
    let hierarchy = handle.block_on(move || async move { open_hierarchy(&st).await })??;
    let geoms = open_geometries(&hierarchy, variables.as_deref(), sample_axis)?;
    let mut out = Vec::new();
    // The first and last values of each coordinate array, read once however many variables
    // name it.
    let mut ends: std::collections::HashMap<String, Option<(f64, f64)>> = Default::default();
    for (name, g) in &geoms {
        let a = &hierarchy.arrays[name];
        // An object store's sizes come from one listing of the array, not a request per chunk;
        // a store that cannot be listed (a plain HTTP server) leaves them unknown.
        let sizes = match &store {
            AnyStore::Local(_) => Sizes::PerFile,
            AnyStore::Remote(remote) => {
                let (remote, prefix) = (remote.clone(), name.clone());
                match handle.block_on(move || async move { remote.sizes_under(&prefix).await })? {
                    Ok(listed) => Sizes::Listed(listed),
                    Err(_) => Sizes::Unknown,
                }
            }
        };
        let (mut present, mut bytes) = (0u64, 0u64);
        for idx in a.chunk_indices() {
            let size = match &sizes {
                Sizes::PerFile => a.stored_size(&store, &idx),
                Sizes::Listed(listed) => {
                    a.chunk_key(&idx).ok().and_then(|k| listed.get(&k).copied())
                }
                Sizes::Unknown => break,
            };
            if let Some(n) = size.filter(|n| *n > 0) {
                present += 1;
                bytes += n;
            }
        }
        let known = |n: u64| (!matches!(sizes, Sizes::Unknown)).then_some(n);
        let dimensions = a.dimension_names().map(|names| {
            names
                .iter()
                .zip(a.shape())
                .map(|(dim, &length)| {
                    let coord = crate::coords::coordinate_array(&hierarchy.arrays, name, dim)
                        .ok()
                        .filter(|(_, c)| c.shape() == [length]);
                    let coordinate = coord.clone().and_then(|(path, coord)| {
                        *ends.entry(path).or_insert_with(|| {
                            let (st, coord) = (store.clone(), coord.clone());
                            handle
                                .block_on(move || async move {
                                    crate::coords::coordinate_ends(&st, &coord).await
                                })
                                .ok()
                                .flatten()
                        })
                    });
                    let times = coord.zip(coordinate).and_then(|((_, c), (first, last))| {
                        let attr = |k: &str| c.attributes().get(k).and_then(|v| v.as_str());
                        let units = attr("units")?;
                        let time = |v| crate::coords::cf_time(v, units, attr("calendar"));
                        Some((time(first)?, time(last)?))
                    });
                    DimensionReport {
                        name: dim.clone(),
                        length,
                        coordinate,
                        times,
                    }
                })
                .collect()
        });
        let (reg, hint) = regime(g);
        out.push(VariableReport {
            path: name.clone(),
            shape: a.shape().to_vec(),
            chunks: a.chunk_shape().to_vec(),
            inner_chunks: a.inner_chunk_shape().map(<[u64]>::to_vec),
            dtype: a.dtype().to_string(),
            codecs: a.codecs().to_vec(),
            zarr_format: a.zarr_format(),
            stored_chunks: a.num_chunks(),
            stored_chunks_present: known(present),
            stored_bytes_on_disk: known(bytes),
            stored_chunk_bytes_mean: known(bytes.checked_div(present).unwrap_or(0)),
            stored_chunk_bytes_decoded: a.chunk_bytes_decoded(),
            samples_per_chunk: g.samples_per_chunk(),
            tiles_per_sample_chunk: g.tiles_per_sample_chunk(),
            dimensions,
            regime: reg.to_string(),
            hint: hint.to_string(),
        });
    }
    Ok(InspectReport {
        path: path.display().to_string(),
        sample_axis,
        io_backend: handle.io_backend().to_string(),
        io_fallback_reason: handle.fallback_reason().map(|r| r.to_string()),
        discovery: hierarchy.discovery.to_string(),
        variables: out,
    })
}

/// Human-readable bytes.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl InspectReport {
    /// The text the CLI prints.
    pub fn render(&self) -> String {
        let mut s = format!(
            "{} (sample axis {}, metadata by {})\n",
            self.path, self.sample_axis, self.discovery
        );
        match &self.io_fallback_reason {
            None => s += &format!("IO backend: {}\n", self.io_backend),
            Some(r) => s += &format!("IO backend: {} (io_uring not used: {r})\n", self.io_backend),
        }
        for v in &self.variables {
            s += &format!("\n{}  {} zarr v{}\n", v.path, v.dtype, v.zarr_format);
            s += &format!("  shape {:?}  stored chunk {:?}", v.shape, v.chunks);
            if let Some(inner) = &v.inner_chunks {
                s += &format!("  (sharded, inner {inner:?})");
            }
            s += &format!("\n  codecs: {}\n", v.codecs.join(" -> "));
            if let Some(dims) = &v.dimensions {
                let shown: Vec<String> = dims
                    .iter()
                    .map(|d| match (&d.times, d.coordinate) {
                        (Some((first, last)), _) => {
                            format!("{} {} ({first} .. {last})", d.name, d.length)
                        }
                        (None, Some((first, last))) => {
                            format!("{} {} ({first} .. {last})", d.name, d.length)
                        }
                        (None, None) => format!("{} {}", d.name, d.length),
                    })
                    .collect();
                s += &format!("  dimensions: {}\n", shown.join(", "));
            }
            match (
                v.stored_chunks_present,
                v.stored_bytes_on_disk,
                v.stored_chunk_bytes_mean,
            ) {
                (Some(present), Some(bytes), Some(mean)) => {
                    s += &format!(
                        "  stored chunks: {} ({present} on disk), {} on disk, {} mean per chunk, {} decoded per chunk ({:.2}x)\n",
                        v.stored_chunks,
                        human_bytes(bytes),
                        human_bytes(mean),
                        human_bytes(v.stored_chunk_bytes_decoded),
                        v.stored_chunk_bytes_decoded as f64 / mean.max(1) as f64,
                    );
                }
                _ => {
                    s += &format!(
                        "  stored chunks: {} (sizes unknown: the store cannot be listed), {} decoded per chunk\n",
                        v.stored_chunks,
                        human_bytes(v.stored_chunk_bytes_decoded),
                    );
                }
            }
            s += &format!(
                "  samples per chunk: {}, tiles per sample chunk: {}\n  regime: {} — {}\n",
                v.samples_per_chunk, v.tiles_per_sample_chunk, v.regime, v.hint
            );
        }
        s
    }
}
