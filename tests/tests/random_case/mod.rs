//! The random cases of `engine_random.rs`: what a case draws (a store of one to three arrays,
//! the views over them, a split, the knobs) and how its store is written, with the value every
//! element must read as.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use insitubatch::{InSituDataset, IntoRows, OnBadChunk};
use serde_json::json;
use zarrs::array::{Array, ArrayMetadata};
use zarrs::filesystem::FilesystemStore;

/// The name the second store is mounted under.
pub const MOUNT: &str = "m";

/// How a mounted store's `time` is matched with the root's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// `MountAlignment::Coordinate`: read where the times meet.
    Exact,
    /// `MountAlignment::Containing`: the last sample at or before each anchor's time.
    Containing,
    /// `MountAlignment::Nearest`: the nearest sample, the later on a tie.
    Nearest,
}

/// The `time` coordinates of a case whose mount is aligned on them, in hours since
/// 2000-01-01: the root's sample `i` at `i * root_step`, the mount's `j` at `mount_start + j *
/// mount_step`.
#[derive(Debug)]
pub struct Times {
    pub root_step: i64,
    pub mount_start: i64,
    pub mount_step: i64,
    pub how: How,
}

impl Times {
    /// One anchor in this many lands on a sample of the mount (`Exact`; at another rate the
    /// others fall between two).
    pub fn every(&self) -> i64 {
        self.mount_step / gcd(self.root_step, self.mount_step)
    }

    /// The mount's sample at the root's anchor `a`, before any window, from the two times:
    /// `None` where the anchor falls between two of its samples and `how` is `Exact`.
    pub fn sample_at(&self, a: u64) -> Option<i64> {
        let (d, step) = (
            a as i64 * self.root_step - self.mount_start,
            self.mount_step,
        );
        match self.how {
            How::Exact => (d.rem_euclid(step) == 0).then(|| d.div_euclid(step)),
            How::Containing => Some(d.div_euclid(step)),
            How::Nearest => Some((2 * d + step).div_euclid(2 * step)),
        }
    }

    /// Writes the `time` array of a store whose sample `j` is at `start + j * step` hours.
    pub fn write_coordinate(root: &Path, v3: bool, n: u64, start: i64, step: i64) {
        let dir = root.join("time");
        std::fs::create_dir_all(&dir).unwrap();
        let units = "hours since 2000-01-01 00:00";
        let (meta, file, key) = if v3 {
            let meta = json!({"zarr_format": 3, "node_type": "array", "shape": [n],
                "data_type": "int64", "chunk_grid": {"name": "regular", "configuration":
                {"chunk_shape": [n]}}, "chunk_key_encoding": {"name": "default"},
                "fill_value": 0, "codecs": [{"name": "bytes", "configuration":
                {"endian": "little"}}], "dimension_names": ["time"],
                "attributes": {"units": units}});
            (meta, "zarr.json", "c/0")
        } else {
            let attrs = json!({"_ARRAY_DIMENSIONS": ["time"], "units": units});
            std::fs::write(dir.join(".zattrs"), attrs.to_string()).unwrap();
            let meta = json!({"zarr_format": 2, "shape": [n], "chunks": [n], "dtype": "<i8",
                "compressor": null, "fill_value": 0, "order": "C", "filters": null});
            (meta, ".zarray", "0")
        };
        std::fs::write(dir.join(file), meta.to_string()).unwrap();
        let bytes: Vec<u8> = (0..n as i64)
            .flat_map(|j| (start + j * step).to_le_bytes())
            .collect();
        let chunk = dir.join(key);
        std::fs::create_dir_all(chunk.parent().unwrap()).unwrap();
        std::fs::write(chunk, bytes).unwrap();
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

pub use insitubatch_tests::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dt {
    U16,
    U32,
    U64,
}

impl Dt {
    pub fn size(self) -> usize {
        match self {
            Dt::U16 => 2,
            Dt::U32 => 4,
            Dt::U64 => 8,
        }
    }

    pub fn mask(self) -> u64 {
        match self {
            Dt::U16 => 0xffff,
            Dt::U32 => 0xffff_ffff,
            Dt::U64 => u64::MAX,
        }
    }

    fn v3_name(self) -> &'static str {
        match self {
            Dt::U16 => "uint16",
            Dt::U32 => "uint32",
            Dt::U64 => "uint64",
        }
    }

    fn encode(self, value: u64, big_endian: bool, out: &mut Vec<u8>) {
        let bytes = value.to_le_bytes();
        let mut item = bytes[..self.size()].to_vec();
        if big_endian {
            item.reverse();
        }
        out.extend_from_slice(&item);
    }
}

/// A compressor after the `bytes` codec (or as the v2 `compressor`).
#[derive(Clone, Copy, Debug)]
pub enum Codec {
    None,
    Zstd,
    Gzip,
    BloscLz4,
}

impl Codec {
    fn v3(self, dt: Dt) -> Option<serde_json::Value> {
        match self {
            Codec::None => None,
            Codec::Zstd => {
                Some(json!({"name": "zstd", "configuration": {"level": 1, "checksum": false}}))
            }
            Codec::Gzip => Some(json!({"name": "gzip", "configuration": {"level": 1}})),
            Codec::BloscLz4 => Some(json!({"name": "blosc", "configuration": {"cname": "lz4",
                "clevel": 5, "shuffle": "shuffle", "typesize": dt.size(), "blocksize": 0}})),
        }
    }

    fn v2(self, _dt: Dt) -> serde_json::Value {
        match self {
            Codec::None => serde_json::Value::Null,
            Codec::Zstd => json!({"id": "zstd", "level": 1}),
            Codec::Gzip => json!({"id": "gzip", "level": 1}),
            Codec::BloscLz4 => json!({"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1,
                "blocksize": 0}),
        }
    }
}

/// One array of a case's store, and the value of every element.
#[derive(Debug)]
pub struct ArrayCase {
    pub name: String,
    pub id: u64,
    pub shape: Vec<u64>,
    pub chunks: Vec<u64>,
    pub dt: Dt,
    pub fill: u64,
    pub big_endian: bool,
    pub f_order: bool,
    pub codec: Codec,
    /// The inner chunk shape when the stored chunk is a shard (v3 only).
    pub inner: Option<Vec<u64>>,
    /// Units (chunks, or inner chunks of a shard) never written: they read as the fill value.
    pub unwritten: HashSet<Vec<u64>>,
    /// Stored chunks (shards) overwritten with garbage after writing: with `on_bad_chunk =
    /// nan` an integer array delivers its fill value there.
    pub corrupt: HashSet<Vec<u64>>,
    /// In a second store mounted as `m`, its sample 0 at the root's sample `k`
    /// (`MountAlignment::Samples(k)`), with a length of its own along the sample axis.
    pub mounted_at: Option<i64>,
    /// The region of the field every view of the array reads
    /// (`DatasetBuilder::cropped_window_wrapping`): one `(start, end)` per field axis in
    /// physical order, a negative `start` wrapping around the axis's end.
    pub region: Option<Vec<(i64, i64)>>,
    /// Its dimension names (the sample axis's is `time`), when its store has a `time`
    /// coordinate.
    pub dims: Option<Vec<String>>,
}

impl ArrayCase {
    /// The array's path in the dataset's store (a mounted one's under its mount).
    pub fn path(&self) -> String {
        match self.mounted_at {
            Some(_) => format!("{MOUNT}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// The directory of the store holding the array, given the root store's.
    pub fn store_root(&self, root: &Path) -> std::path::PathBuf {
        match self.mounted_at {
            Some(_) => root.with_file_name("mount.zarr"),
            None => root.to_path_buf(),
        }
    }

    /// The unit a never-written region covers: the inner chunk of a shard, else the chunk.
    pub fn unit(&self) -> &[u64] {
        self.inner.as_deref().unwrap_or(&self.chunks)
    }

    pub fn unit_grid(&self) -> Vec<u64> {
        self.shape
            .iter()
            .zip(self.unit())
            .map(|(s, c)| s.div_ceil(*c))
            .collect()
    }

    pub fn grid(&self) -> Vec<u64> {
        self.shape
            .iter()
            .zip(&self.chunks)
            .map(|(s, c)| s.div_ceil(*c))
            .collect()
    }

    /// The element at `idx`: the fill value inside a chunk never written, else a value unique
    /// to (array, position) up to the dtype's width.
    pub fn value(&self, idx: &[u64]) -> u64 {
        let unit: Vec<u64> = idx.iter().zip(self.unit()).map(|(i, c)| i / c).collect();
        if self.unwritten.contains(&unit) {
            return self.fill;
        }
        let linear = idx
            .iter()
            .zip(&self.shape)
            .fold(0u64, |acc, (i, s)| acc * s + i);
        (self.id * 1_000_003 + linear + 1) & self.dt.mask()
    }

    /// What the engine must deliver at `idx`: the stored value, or the fill value inside a
    /// corrupt stored chunk (the stand-in of `on_bad_chunk = nan` for integers).
    pub fn delivered(&self, idx: &[u64]) -> u64 {
        let chunk: Vec<u64> = idx.iter().zip(&self.chunks).map(|(i, c)| i / c).collect();
        if self.corrupt.contains(&chunk) {
            self.fill
        } else {
            self.value(idx)
        }
    }

    /// The file of stored chunk `chunk` under the store's root.
    pub fn chunk_file(
        &self,
        root: &Path,
        v3: bool,
        sep: &str,
        chunk: &[u64],
    ) -> std::path::PathBuf {
        let parts: Vec<String> = chunk.iter().map(u64::to_string).collect();
        let key = if v3 {
            format!("c{sep}{}", parts.join(sep))
        } else {
            parts.join(sep)
        };
        root.join(&self.name).join(key)
    }

    /// The indices a sample reads along physical axis `d` (not `axis`, the sample axis), in
    /// order: the region's (wrapped around the axis's end), or all of them.
    pub fn field_indices(&self, axis: usize, d: usize) -> Vec<u64> {
        let n = self.shape[d] as i64;
        match &self.region {
            Some(region) => {
                let (start, end) = region[if d < axis { d } else { d - 1 }];
                (start..end).map(|i| i.rem_euclid(n) as u64).collect()
            }
            None => (0..self.shape[d]).collect(),
        }
    }

    /// A sample's shape: the region's lengths, or the field's.
    pub fn inner_shape(&self, axis: usize) -> Vec<u64> {
        (0..self.shape.len())
            .filter(|&d| d != axis)
            .map(|d| self.field_indices(axis, d).len() as u64)
            .collect()
    }

    /// Per physical axis, the chunk indices a sample's region touches (the sample axis: none).
    fn touched(&self, axis: usize) -> Vec<Vec<u64>> {
        (0..self.shape.len())
            .map(|d| {
                if d == axis {
                    return Vec::new();
                }
                let mut c: Vec<u64> = self
                    .field_indices(axis, d)
                    .iter()
                    .map(|i| i / self.chunks[d])
                    .collect();
                c.sort_unstable();
                c.dedup();
                c
            })
            .collect()
    }

    /// How many stored chunks a sample's region spans.
    pub fn chunks_per_sample(&self, axis: usize) -> u64 {
        let touched = self.touched(axis);
        (0..self.shape.len())
            .filter(|&d| d != axis)
            .map(|d| touched[d].len() as u64)
            .product()
    }

    /// The stored chunks a reader of sample `s` along `axis` reads: those its region touches.
    pub fn chunks_of_sample(&self, axis: usize, s: u64) -> Vec<Vec<u64>> {
        let touched = self.touched(axis);
        let counts: Vec<u64> = (0..self.shape.len())
            .map(|d| {
                if d == axis {
                    1
                } else {
                    touched[d].len() as u64
                }
            })
            .collect();
        let mut out = Vec::new();
        for_each_index(&counts, false, |k| {
            let c = (0..k.len())
                .map(|d| {
                    if d == axis {
                        s / self.chunks[axis]
                    } else {
                        touched[d][k[d] as usize]
                    }
                })
                .collect();
            out.push(c);
        });
        out
    }

    /// The sample at index `s` along `axis` (its region, when cropped), C order over the other
    /// axes, native-endian bytes.
    pub fn sample(&self, axis: usize, s: u64) -> Vec<u8> {
        let lists: Vec<Vec<u64>> = (0..self.shape.len())
            .map(|d| {
                if d == axis {
                    vec![s]
                } else {
                    self.field_indices(axis, d)
                }
            })
            .collect();
        let counts: Vec<u64> = lists.iter().map(|l| l.len() as u64).collect();
        let mut out = Vec::new();
        for_each_index(&counts, false, |k| {
            let idx: Vec<u64> = k.iter().zip(&lists).map(|(i, l)| l[*i as usize]).collect();
            let v = self.delivered(&idx);
            out.extend_from_slice(&v.to_ne_bytes()[..self.dt.size()]);
        });
        out
    }

    /// The array's metadata document.
    fn metadata(&self, v3: bool, sep: &str) -> serde_json::Value {
        if !v3 {
            let dtype = format!(
                "{}u{}",
                if self.big_endian { ">" } else { "<" },
                self.dt.size()
            );
            return json!({"zarr_format": 2, "shape": self.shape, "chunks": self.chunks,
                "dtype": dtype, "compressor": self.codec.v2(self.dt), "fill_value": self.fill,
                "order": if self.f_order { "F" } else { "C" }, "filters": null,
                "dimension_separator": sep});
        }
        let mut codecs = Vec::new();
        if self.f_order {
            let order: Vec<usize> = (0..self.shape.len()).rev().collect();
            codecs.push(json!({"name": "transpose", "configuration": {"order": order}}));
        }
        let endian = if self.big_endian { "big" } else { "little" };
        codecs.push(json!({"name": "bytes", "configuration": {"endian": endian}}));
        codecs.extend(self.codec.v3(self.dt));
        if let Some(inner) = &self.inner {
            codecs = vec![json!({"name": "sharding_indexed", "configuration": {
                "chunk_shape": inner, "codecs": codecs,
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "crc32c"}],
                "index_location": if self.id.is_multiple_of(2) { "end" } else { "start" }}})];
        }
        let mut meta = json!({"zarr_format": 3, "node_type": "array", "shape": self.shape,
            "data_type": self.dt.v3_name(),
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": self.chunks}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": sep}},
            "fill_value": self.fill, "codecs": codecs, "attributes": {}});
        if let Some(dims) = &self.dims {
            meta["dimension_names"] = json!(dims);
        }
        meta
    }

    pub fn write(&self, root: &Path, v3: bool, sep: &str) {
        if matches!(self.codec, Codec::None) && self.inner.is_none() {
            self.write_by_hand(root, v3, sep);
        } else {
            self.write_with_zarrs(root, v3, sep);
        }
        if let (Some(dims), false) = (&self.dims, v3) {
            let attrs = json!({"_ARRAY_DIMENSIONS": dims});
            std::fs::write(root.join(&self.name).join(".zattrs"), attrs.to_string()).unwrap();
        }
    }

    /// Compressed or sharded arrays go through zarrs, which leaves out chunks (and a shard's
    /// inner chunks) that hold only the fill value.
    fn write_with_zarrs(&self, root: &Path, v3: bool, sep: &str) {
        let store = Arc::new(FilesystemStore::new(root).unwrap());
        let md: ArrayMetadata = serde_json::from_value(self.metadata(v3, sep)).unwrap();
        let array = Array::new_with_metadata(store, &format!("/{}", self.name), md).unwrap();
        array.store_metadata().unwrap();
        let mut values = Vec::new();
        for_each_index(&self.shape, false, |idx| values.push(self.value(idx)));
        let all = array.subset_all();
        match self.dt {
            Dt::U16 => {
                array.store_array_subset(&all, values.iter().map(|v| *v as u16).collect::<Vec<_>>())
            }
            Dt::U32 => {
                array.store_array_subset(&all, values.iter().map(|v| *v as u32).collect::<Vec<_>>())
            }
            Dt::U64 => array.store_array_subset(&all, values),
        }
        .unwrap();
    }

    /// Uncompressed arrays are written here, byte by byte, with garbage past the array's edge.
    fn write_by_hand(&self, root: &Path, v3: bool, sep: &str) {
        let dir = root.join(&self.name);
        std::fs::create_dir_all(&dir).unwrap();
        let meta = self.metadata(v3, sep);
        let meta_file = if v3 { "zarr.json" } else { ".zarray" };
        std::fs::write(dir.join(meta_file), meta.to_string()).unwrap();
        for_each_index(&self.grid(), false, |chunk| {
            if self.unwritten.contains(chunk) {
                return;
            }
            let mut bytes = Vec::new();
            for_each_index(&self.chunks, self.f_order, |local| {
                let idx: Vec<u64> = chunk
                    .iter()
                    .zip(&self.chunks)
                    .zip(local)
                    .map(|((c, n), l)| c * n + l)
                    .collect();
                let inside = idx.iter().zip(&self.shape).all(|(i, s)| i < s);
                // Past the array's edge a partial chunk holds bytes no reader may deliver.
                let v = if inside {
                    self.value(&idx)
                } else {
                    0xa5a5_a5a5_a5a5_a5a5
                };
                self.dt
                    .encode(v & self.dt.mask(), self.big_endian, &mut bytes);
            });
            let file = self.chunk_file(root, v3, sep, chunk);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, bytes).unwrap();
        });
    }
}

/// Calls `f` with every index of `shape`, the last axis fastest (C order) or the first (F).
pub fn for_each_index(shape: &[u64], f_order: bool, mut f: impl FnMut(&[u64])) {
    if shape.contains(&0) {
        return;
    }
    let n = shape.len();
    let mut idx = vec![0u64; n];
    loop {
        f(&idx);
        let axes: Vec<usize> = if f_order {
            (0..n).collect()
        } else {
            (0..n).rev().collect()
        };
        let mut carried = true;
        for a in axes {
            idx[a] += 1;
            if idx[a] < shape[a] {
                carried = false;
                break;
            }
            idx[a] = 0;
        }
        if carried {
            return;
        }
    }
}

/// A view the dataset reads: a label over an array at a sample offset, or through an index.
#[derive(Debug)]
pub struct View {
    pub label: String,
    pub array: usize,
    pub offset: i64,
    /// Sample `index[anchor]` of the array at each anchor (`DatasetBuilder::index`).
    pub index: Option<Vec<u64>>,
}

/// The arguments of `split_by_chunk` a case draws.
#[derive(Debug)]
pub struct SplitCase {
    pub fractions: Vec<f64>,
    pub contiguous: bool,
    pub sample_range: Option<(u64, u64)>,
}

/// The pool budget a case draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaseBudget {
    /// The automatic budget: the first pass's working set.
    Auto,
    /// A budget that holds every chunk of the store.
    Everything,
    /// A few KiB: above some passes' working sets (evicting as they go), below others' (which
    /// must then refuse to start, naming the budget they need).
    Bytes(u64),
}

/// Everything one case draws.
#[derive(Debug)]
pub struct Case {
    pub v3: bool,
    pub sep: &'static str,
    pub axis: usize,
    pub n_samples: u64,
    pub arrays: Vec<ArrayCase>,
    pub views: Vec<View>,
    /// A manifest from `split_by_chunk` over the first view's array, or none.
    pub split: Option<SplitCase>,
    pub batch_size: usize,
    pub block_chunks: usize,
    pub max_inflight: usize,
    pub prefetch_depth: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub executor_threads: usize,
    pub budget: CaseBudget,
    /// Read through a persisted cache, then revive it in a fresh dataset.
    pub persist: bool,
    /// Overwrite a stored chunk with garbage after writing (`on_bad_chunk = nan`).
    pub corrupt: bool,
    /// Wait for each batch in slices of this many microseconds (`next_timeout`).
    pub wait_us: Option<u64>,
    /// When chunks are decoded straight into batch rows.
    pub into_rows: IntoRows,
    /// Shuffled blocks ramp up from one batch's chunks.
    pub fast_first_batch: bool,
    /// Train's next epoch starts once this one has loaded every chunk it reads.
    pub prefetch_next_epoch: bool,
    /// Slots spilled into an ephemeral cache directory (when not `persist`).
    pub spill: bool,
    /// Views (by index, in channel order) stacked as the channels of one batch array `s`.
    pub stack: Option<Vec<usize>>,
    /// Every `.0`-th sample from `.1` (`(1, 0)`: every sample).
    pub stride: (u64, u64),
    /// The mount aligned on `time` coordinates instead of a sample offset.
    pub times: Option<Times>,
    /// A patch cut from every row, over the samples' last axes, and which of them are
    /// periodic.
    pub patch: Option<(Vec<u64>, Vec<bool>)>,
    /// Patches drawn from every sample (1: one, the default).
    pub patches_per_sample: u64,
    /// A grid's stride placing the patches instead (`DatasetBuilder::patch_grid`).
    pub patch_grid: Option<Vec<u64>>,
}

impl Case {
    pub fn draw(n: u64) -> Case {
        let mut r = Rng::new(n);
        let axis = r.range(0, 2) as usize;
        let n_samples = r.range(1, 40);
        let v3 = r.chance(0.5);
        let sep = if r.chance(0.5) { "/" } else { "." };
        let arrays = (0..r.range(1, 3))
            .map(|id| {
                let ndim = r.range((axis as u64 + 1).max(2), 4) as usize;
                let shape: Vec<u64> = (0..ndim)
                    .map(|a| if a == axis { n_samples } else { r.range(1, 5) })
                    .collect();
                let chunks: Vec<u64> = shape.iter().map(|s| r.range(1, s + 1)).collect();
                let dt = [Dt::U16, Dt::U32, Dt::U64][r.range(0, 2) as usize];
                let mut a = ArrayCase {
                    name: format!("a{id}"),
                    id,
                    shape,
                    chunks,
                    dt,
                    fill: r.next_u64() & dt.mask(),
                    big_endian: r.chance(0.3),
                    f_order: r.chance(0.3),
                    codec: Codec::None,
                    inner: None,
                    unwritten: HashSet::new(),
                    corrupt: HashSet::new(),
                    mounted_at: None,
                    region: None,
                    dims: None,
                };
                if r.chance(0.4) {
                    a.codec = [Codec::Zstd, Codec::Gzip, Codec::BloscLz4][r.range(0, 2) as usize];
                }
                if v3 && r.chance(0.35) {
                    // Inner chunks divide the shard.
                    let inner = a.chunks.iter().map(|c| {
                        let divisors: Vec<u64> = (1..=*c).filter(|d| c % d == 0).collect();
                        divisors[r.range(0, divisors.len() as u64 - 1) as usize]
                    });
                    a.inner = Some(inner.collect());
                }
                for_each_index(&a.unit_grid(), false, |c| {
                    if r.chance(0.1) {
                        a.unwritten.insert(c.to_vec());
                    }
                });
                a
            })
            .collect::<Vec<_>>();
        let mut views: Vec<View> = (0..arrays.len())
            .map(|i| View {
                label: format!("v{i}"),
                array: i,
                offset: 0,
                index: None,
            })
            .collect();
        for w in 0..r.range(0, 2) {
            let offset = r.range(1, 3) as i64 * if r.chance(0.5) { -1 } else { 1 };
            views.push(View {
                label: format!("w{w}"),
                array: r.range(0, arrays.len() as u64 - 1) as usize,
                offset,
                index: None,
            });
        }
        if r.chance(0.3) {
            // The first view need not read at offset 0.
            views[0].offset = r.range(1, 2) as i64;
        }
        let split = r.chance(0.75).then(|| {
            let fractions = match r.range(0, 3) {
                0 => vec![1.0],
                1 => vec![0.5, 0.5],
                2 => vec![0.6, 0.2, 0.2],
                _ => vec![0.3, 0.3],
            };
            let range = r.chance(0.4).then(|| {
                let start = r.range(0, n_samples - 1);
                (start, r.range(start + 1, n_samples))
            });
            SplitCase {
                fractions,
                contiguous: r.chance(0.5),
                sample_range: range,
            }
        });
        Case {
            v3,
            sep,
            axis,
            n_samples,
            arrays,
            views,
            split,
            batch_size: r.range(1, 12) as usize,
            block_chunks: r.range(1, 4) as usize,
            max_inflight: r.range(1, 5) as usize,
            prefetch_depth: r.range(1, 3) as usize,
            shuffle: r.chance(0.7),
            seed: r.next_u64() % 1000,
            executor_threads: r.range(1, 2) as usize,
            budget: match r.range(0, 7) {
                0 | 1 => CaseBudget::Everything,
                2 | 3 => CaseBudget::Bytes(r.range(128, 16 << 10)),
                _ => CaseBudget::Auto,
            },
            persist: r.chance(0.3),
            corrupt: r.chance(0.15),
            wait_us: r.chance(0.25).then(|| r.range(1, 300)),
            // Drawn last, so the cases drawn before it was added are unchanged.
            into_rows: match r.range(0, 3) {
                0 => IntoRows::Always,
                1 => IntoRows::Never,
                _ => IntoRows::Auto,
            },
            // After `into_rows`, for the same reason.
            fast_first_batch: r.chance(0.5),
            // After `into_rows`, for the same reason.
            spill: r.chance(0.25),
            stack: None,
            stride: (1, 0),
            times: None,
            patch: None,
            patches_per_sample: 1,
            patch_grid: None,
            prefetch_next_epoch: false,
        }
        .with_stack(&mut r)
        .with_stride(&mut r)
        .with_mount(&mut r)
        .with_index(&mut r)
        .with_crop(&mut r)
        .with_times(&mut r)
        .with_patch(&mut r)
        .with_prefetch_next_epoch(&mut r)
    }

    /// The case with, a third of the time, train's next epoch started early (drawn last, for
    /// the same reason as the others).
    fn with_prefetch_next_epoch(mut self, r: &mut Rng) -> Case {
        self.prefetch_next_epoch = r.chance(0.35);
        self
    }

    /// The case with, a third of the time, a patch over the last one or two axes of every
    /// view's samples, when those axes have one extent in all of them (drawn last, for the
    /// same reason as the others).
    fn with_patch(mut self, r: &mut Rng) -> Case {
        if !r.chance(0.35) {
            return self;
        }
        let inners: Vec<Vec<u64>> = self
            .views
            .iter()
            .map(|v| self.arrays[v.array].inner_shape(self.axis))
            .collect();
        let last = |i: &Vec<u64>, k: usize| i[i.len() - k..].to_vec();
        let rank = inners.iter().map(Vec::len).min().unwrap_or(0);
        let Some(k) = (1..=rank.min(2))
            .rev()
            .find(|&k| inners.iter().all(|i| last(i, k) == last(&inners[0], k)))
        else {
            return self;
        };
        let shape: Vec<u64> = last(&inners[0], k).iter().map(|&n| r.range(1, n)).collect();
        let wrap = shape.iter().map(|_| r.chance(0.3)).collect();
        // A third of them several patches per sample, a third a grid (no stride below half the
        // patch, so that a case stays small).
        if r.chance(0.35) {
            self.patches_per_sample = r.range(2, 3);
        } else if r.chance(0.55) {
            self.patch_grid = Some(shape.iter().map(|&p| r.range(p.div_ceil(2), p)).collect());
        }
        self.patch = Some((shape, wrap));
        self
    }

    /// The rows each anchor gives: its patches. A grid's, counted here by stepping along each
    /// axis (independently of the engine's formula).
    pub fn rows_per_anchor(&self) -> u64 {
        let (Some((shape, wrap)), Some(stride)) = (&self.patch, &self.patch_grid) else {
            return self.patches_per_sample;
        };
        let field = self.patch_field();
        (0..shape.len())
            .map(|d| {
                let end = if wrap[d] {
                    field[d]
                } else {
                    field[d] - shape[d] + 1
                };
                // Starts 0, s, 2s, ... below the end, and one more at the end when the last
                // window stops short of it.
                let starts = (0..end).step_by(stride[d] as usize).count() as u64;
                let last = (starts - 1) * stride[d];
                starts + u64::from(!wrap[d] && last + shape[d] < field[d])
            })
            .product()
    }

    /// The extents of the axes the patch covers (the last ones of every view's samples).
    pub fn patch_field(&self) -> Vec<u64> {
        let k = self.patch.as_ref().map_or(0, |p| p.0.len());
        let inner = self.arrays[self.views[0].array].inner_shape(self.axis);
        inner[inner.len() - k..].to_vec()
    }

    /// The row shape of view `v`: its samples' inner shape, cut to the patch.
    pub fn row_shape(&self, v: usize) -> Vec<usize> {
        let inner = self.arrays[self.views[v].array].inner_shape(self.axis);
        let shape = self.patch.as_ref().map(|p| &p.0[..]).unwrap_or_default();
        inner[..inner.len() - shape.len()]
            .iter()
            .chain(shape)
            .map(|&n| n as usize)
            .collect()
    }

    /// The case with, often when it has a mount, both stores given CF `time` coordinates that
    /// step at rates of their own, and the mount aligned on them: where the times meet (the
    /// stride then draws only those anchors), or at the sample before or nearest each anchor's
    /// time (drawn after the crop, for the same reason).
    fn with_times(mut self, r: &mut Rng) -> Case {
        if self.mounted().is_none() || !r.chance(0.6) {
            return self;
        }
        let root_step = [1, 2, 3, 6][r.range(0, 3) as usize];
        let mount_step = [1, 2, 3, 4, 6, 12][r.range(0, 5) as usize];
        let how = [How::Exact, How::Containing, How::Nearest][r.range(0, 2) as usize];
        let g = gcd(root_step, mount_step);
        let mount_start = match how {
            // On one grid: the mount's times fall on the root's wherever both have one.
            How::Exact => g * (r.range(0, 16) as i64 - 8),
            _ => r.range(0, 40) as i64 - 20,
        };
        let times = Times {
            root_step,
            mount_start,
            mount_step,
            how,
        };
        let every = times.every();
        if how == How::Exact && every > 1 {
            // Only the anchors on one of the mount's samples can be drawn.
            let phase = (0..every)
                .find(|a| (a * root_step - mount_start).rem_euclid(mount_step) == 0)
                .unwrap();
            self.stride = (every as u64, phase as u64);
        }
        let axis = self.axis;
        for a in &mut self.arrays {
            let dims = (0..a.shape.len())
                .map(|d| {
                    if d == axis {
                        "time".into()
                    } else {
                        format!("d{d}")
                    }
                })
                .collect();
            a.dims = Some(dims);
        }
        self.times = Some(times);
        self
    }

    /// Whether the times cannot say a store's period: a containing or nearest alignment with
    /// a store of one sample, refused when built.
    pub fn one_time(&self) -> bool {
        let m = self.mounted().map_or(0, |a| a.shape[self.axis]);
        self.times.as_ref().is_some_and(|t| t.how != How::Exact) && (self.n_samples < 2 || m < 2)
    }

    /// The case with, a third of the time, one array outside the stack read as a region of its
    /// field, wrapping around some axes' ends (drawn after the index, for the same reason).
    fn with_crop(mut self, r: &mut Rng) -> Case {
        if !r.chance(0.35) {
            return self;
        }
        let stacked: HashSet<usize> = self
            .stack
            .iter()
            .flatten()
            .map(|&v| self.views[v].array)
            .collect();
        let free: Vec<usize> = (0..self.arrays.len())
            .filter(|i| !stacked.contains(i))
            .collect();
        if free.is_empty() {
            return self;
        }
        let i = free[r.range(0, free.len() as u64 - 1) as usize];
        let a = &mut self.arrays[i];
        let region = (0..a.shape.len())
            .filter(|&d| d != self.axis)
            .map(|d| {
                let n = a.shape[d] as i64;
                if n >= 2 && r.chance(0.3) {
                    let start = -(r.range(1, n as u64 - 1) as i64);
                    (start, r.range(1, (start + n) as u64) as i64)
                } else {
                    let start = r.range(0, n as u64 - 1) as i64;
                    (start, r.range(start as u64 + 1, n as u64) as i64)
                }
            })
            .collect();
        a.region = Some(region);
        self
    }

    /// The case with, often when it has two arrays or more, one of them (not the first view's,
    /// whose samples are the anchors) in a second store of another length along the sample
    /// axis, placed 5 samples before to 5 after the root's first (drawn after the stride, so
    /// the cases drawn before mounts were added are unchanged).
    fn with_mount(mut self, r: &mut Rng) -> Case {
        let reference = self.views[0].array;
        if self.arrays.len() < 2 || !r.chance(0.4) {
            return self;
        }
        let others: Vec<usize> = (0..self.arrays.len()).filter(|&i| i != reference).collect();
        let i = others[r.range(0, others.len() as u64 - 1) as usize];
        let n = r.range(1, 40);
        let k = r.range(0, 10) as i64 - 5;
        let a = &mut self.arrays[i];
        a.shape[self.axis] = n;
        a.mounted_at = Some(k);
        self
    }

    /// The case with, sometimes, a view `i0` that reads a random array through a random index
    /// (drawn after the mount, for the same reason).
    fn with_index(mut self, r: &mut Rng) -> Case {
        if !r.chance(0.3) {
            return self;
        }
        let array = r.range(0, self.arrays.len() as u64 - 1) as usize;
        let len = self.arrays[array].shape[self.axis];
        let index = (0..self.n_samples).map(|_| r.range(0, len - 1)).collect();
        self.views.push(View {
            label: "i0".into(),
            array,
            offset: 0,
            index: Some(index),
        });
        self
    }

    /// The sample view `v` reads at `anchor` along its array's sample axis: `None` outside the
    /// array (the anchor is then not valid).
    pub fn read(&self, v: usize, anchor: u64) -> Option<u64> {
        let view = &self.views[v];
        let a = &self.arrays[view.array];
        if let Some(index) = &view.index {
            return Some(index[anchor as usize]);
        }
        let at = match (&self.times, a.mounted_at) {
            (Some(t), Some(_)) => t.sample_at(anchor)?,
            (_, k) => anchor as i64 - k.unwrap_or(0),
        };
        let s = at + view.offset;
        (s >= 0 && (s as u64) < a.shape[self.axis]).then_some(s as u64)
    }

    /// Whether every view reads inside its array at `anchor` (an indexed one always does).
    pub fn valid(&self, anchor: u64) -> bool {
        (0..self.views.len()).all(|v| self.read(v, anchor).is_some())
    }

    /// The array mounted from the second store, if any.
    pub fn mounted(&self) -> Option<&ArrayCase> {
        self.arrays.iter().find(|a| a.mounted_at.is_some())
    }

    /// The case with, a quarter of the time, a sample stride of 2 to 5 at a random phase
    /// (drawn after the stack, so the cases drawn before strides were added are unchanged).
    fn with_stride(mut self, r: &mut Rng) -> Case {
        if r.chance(0.25) {
            let every = r.range(2, 5);
            self.stride = (every, r.range(0, every - 1));
        }
        self
    }

    /// True when anchor `a` is on the case's stride.
    pub fn on_stride(&self, a: u64) -> bool {
        a % self.stride.0 == self.stride.1
    }

    /// The case with, a third of the time, some views of one sample shape and type (drawn
    /// last, so the cases drawn before stacks were added are unchanged) stacked in a random
    /// channel order.
    fn with_stack(mut self, r: &mut Rng) -> Case {
        if !r.chance(0.35) {
            return self;
        }
        let kind = |v: &View| {
            let a = &self.arrays[v.array];
            let inner: Vec<u64> = (0..a.shape.len())
                .filter(|&x| x != self.axis)
                .map(|x| a.shape[x])
                .collect();
            (inner, a.dt)
        };
        let first = r.range(0, self.views.len() as u64 - 1) as usize;
        let mut alike: Vec<usize> = (0..self.views.len())
            .filter(|&i| kind(&self.views[i]) == kind(&self.views[first]))
            .collect();
        for i in (1..alike.len()).rev() {
            alike.swap(i, r.range(0, i as u64) as usize);
        }
        alike.truncate(r.range(1, alike.len() as u64) as usize);
        self.stack = Some(alike);
        self
    }

    /// View `v`'s rows in `batch`, one sample after another: its own array's bytes, or its
    /// channel of the stack (whose shape is checked).
    pub fn view_rows(&self, batch: &insitubatch::Batch, v: usize) -> Vec<u8> {
        let own = batch.array(&self.views[v].label);
        let Some(stack) = &self.stack else {
            return own.unwrap().bytes().to_vec();
        };
        let Some(channel) = stack.iter().position(|&s| s == v) else {
            return own.unwrap().bytes().to_vec();
        };
        assert!(
            own.is_none(),
            "stacked label {} has its own array",
            self.views[v].label
        );
        let s = batch.array("s").unwrap();
        let c = stack.len();
        assert_eq!(s.shape()[..2], [batch.len(), c], "stack shape");
        let row = s.bytes().len() / batch.len();
        let sb = row / c;
        (0..batch.len())
            .flat_map(|r| &s.bytes()[r * row + channel * sb..r * row + (channel + 1) * sb])
            .copied()
            .collect()
    }

    pub fn builder(&self, root: &Path) -> insitubatch::DatasetBuilder {
        let mut b = InSituDataset::builder(root)
            .sample_axis(self.axis)
            .batch_size(self.batch_size)
            .block_chunks(self.block_chunks)
            .max_inflight(self.max_inflight)
            .prefetch_depth(self.prefetch_depth)
            .shuffle(self.shuffle)
            .seed(self.seed)
            .decode_into_batches(self.into_rows)
            .fast_first_batch(self.fast_first_batch)
            .prefetch_next_epoch(self.prefetch_next_epoch)
            .sample_stride(self.stride.0, self.stride.1);
        if let Some(m) = self.mounted() {
            use insitubatch::MountAlignment as A;
            let alignment = match self.times.as_ref().map(|t| t.how) {
                None => A::Samples(m.mounted_at.unwrap()),
                Some(How::Exact) => A::Coordinate("time".into()),
                Some(How::Containing) => A::Containing("time".into()),
                Some(How::Nearest) => A::Nearest("time".into()),
            };
            b = b
                .mount(MOUNT, m.store_root(root))
                .align_mount(MOUNT, alignment);
        }
        for v in &self.views {
            let a = &self.arrays[v.array];
            b = match &a.region {
                Some(region) => {
                    b.cropped_window_wrapping(v.label.clone(), a.path(), v.offset, region)
                }
                None => b.window(v.label.clone(), a.path(), v.offset),
            };
            if let Some(index) = &v.index {
                b = b.index(v.label.clone(), index.clone());
            }
        }
        if let Some(stack) = &self.stack {
            b = b.stack("s", stack.iter().map(|&v| self.views[v].label.clone()));
        }
        if let Some((shape, wrap)) = &self.patch {
            b = b.patch_wrapping(shape.clone(), wrap.clone());
            if self.patches_per_sample > 1 {
                b = b.patches_per_sample(self.patches_per_sample);
            }
            if let Some(stride) = &self.patch_grid {
                b = b.patch_grid(stride.clone());
            }
        }
        match self.budget {
            CaseBudget::Auto => {}
            CaseBudget::Everything => b = b.cache_budget_bytes(1 << 30),
            CaseBudget::Bytes(n) => b = b.cache_budget_bytes(n),
        }
        if self.corrupt {
            b = b.on_bad_chunk(OnBadChunk::Nan);
        }
        b
    }
}
