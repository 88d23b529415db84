//! One Zarr array: its metadata, its stored-chunk grid, and the IO-free decode of a stored chunk.
//!
//! The stored chunk is what one `get` returns: a chunk, or a whole shard on a sharded v3 array.
//! Decoding runs the array's own `zarrs` codec chain on bytes we read ourselves, so no codec is
//! hand-written here and every codec zarrs knows is supported.

use std::borrow::Cow;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use zarrs::array::codec::CodecChain;
use zarrs::array::{Array, ArrayMetadata};
use zarrs::array::{ArrayToBytesCodecTraits, CodecOptions};
use zarrs::plugin::ZarrVersion;

use crate::dtype::DType;
use crate::error::StoreError;
use crate::store::Store;

/// A decoded stored chunk: dense, C order, native-endian, in a buffer we own.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedChunk {
    /// Shape of the stored chunk (the full chunk, including any part past the array's end).
    pub shape: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// `shape.product() * dtype.size_bytes()` bytes.
    pub bytes: Vec<u8>,
    /// True when the key was missing and the chunk is the fill value.
    pub is_fill: bool,
}

/// An opened Zarr array (v2 or v3, sharded or not).
#[derive(Clone)]
pub struct ZarrArray {
    path: String,
    zarr_format: u8,
    inner: Arc<Array<()>>,
    dtype: DType,
    chunk_shape: Vec<u64>,
    inner_chunk_shape: Option<Vec<u64>>,
    dimension_names: Option<Vec<String>>,
    /// User attributes: v3 `attributes`, or the v2 `.zattrs` document.
    attributes: serde_json::Map<String, Value>,
    codecs: Vec<String>,
    /// The codec chain chunks are decoded with: zarrs', with its zstd codec keeping a context
    /// per thread (`crate::zstd`).
    chain: Arc<CodecChain>,
    /// The chain is zstd over bytes in this machine's order, decoded in place
    /// (`crate::zstd::is_plain_zstd`).
    in_place: bool,
    options: CodecOptions,
    /// How to read part of a shard (`None`: not sharded, or a layout we read whole).
    shard: Option<Arc<crate::shard::ShardLayout>>,
}

impl std::fmt::Debug for ZarrArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZarrArray")
            .field("path", &self.path)
            .field("shape", &self.shape())
            .field("chunks", &self.chunk_shape)
            .field("dtype", &self.dtype)
            .finish()
    }
}

fn unsupported(array: &str, what: &'static str, message: impl Into<String>) -> StoreError {
    StoreError::Unsupported {
        array: array.to_string(),
        what,
        message: message.into(),
    }
}

/// The codec options every array decodes with: on the calling thread (`concurrent_target` 1),
/// since we run on our own executors, one per core, and must not fan a decode out to a second
/// (rayon) pool. zarrs' `CodecOptions::default()` asks rayon for its thread count, which starts
/// rayon's global pool: one thread per core that nothing uses, named after whichever thread
/// asked (an executor). So the pool is started first here, with one thread named
/// `zarrs-rayon`; where that thread cannot start (under `ulimit -v`), opening an array is an
/// error instead of a panic inside zarrs. A host that started rayon's pool itself keeps its own.
fn codec_options() -> Result<CodecOptions, String> {
    static OPTIONS: std::sync::OnceLock<Result<CodecOptions, String>> = std::sync::OnceLock::new();
    OPTIONS
        .get_or_init(|| {
            let started = rayon_core::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(|_| "zarrs-rayon".into())
                .build_global();
            match started {
                Err(e) if !e.to_string().contains("already been initialized") => Err(format!(
                    "could not start a thread for the codec library ({e}); this process is out \
                     of threads or address space (ulimit -u, ulimit -v)"
                )),
                _ => Ok(CodecOptions::default().with_concurrent_target(1)),
            }
        })
        .clone()
}

/// How messages name the array at `path`: the path itself, or `/` for an array at the store's
/// root (whose path is empty).
pub fn array_label(path: &str) -> &str {
    if path.is_empty() { "/" } else { path }
}

impl ZarrArray {
    /// Builds an array from its metadata document: `zarr.json` (v3) or `.zarray` (v2, with the
    /// `.zattrs` document, if any, in `attrs`). `path` is the array's key prefix in the store
    /// (`""` for an array at the store root). `meta_file` is only used in error messages.
    pub fn from_metadata(
        path: &str,
        meta: &Value,
        attrs: Option<&Value>,
        meta_file: PathBuf,
    ) -> Result<Self, StoreError> {
        let bad = |message: String| StoreError::BadMetadata {
            path: meta_file.clone(),
            message,
        };
        let label = array_label(path);
        // Before any call into zarrs, which may make codec options of its own.
        let options = codec_options().map_err(|message| unsupported(label, "runtime", message))?;
        let zarr_format = meta.get("zarr_format").and_then(Value::as_u64).unwrap_or(0);
        let attributes = match zarr_format {
            3 => meta.get("attributes"),
            _ => attrs,
        }
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
        let (metadata, dimension_names, inner_chunk_shape, codecs) = match zarr_format {
            3 => {
                if meta.get("node_type").and_then(Value::as_str) != Some("array") {
                    return Err(bad("node_type is not \"array\"".into()));
                }
                let v3: zarrs::metadata::v3::ArrayMetadataV3 =
                    serde_json::from_value(meta.clone()).map_err(|e| bad(e.to_string()))?;
                let dims = meta
                    .get("dimension_names")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .map(|v| v.as_str().unwrap_or("").to_string())
                            .collect::<Vec<_>>()
                    });
                let (inner, codecs) = describe_v3_codecs(meta);
                (ArrayMetadata::V3(v3), dims, inner, codecs)
            }
            2 => {
                // zarrs turns `order: "F"` into a transpose codec; the conformance suite checks
                // that the result matches zarr-python's C-order read.
                let v2: zarrs::metadata::v2::ArrayMetadataV2 =
                    serde_json::from_value(meta.clone()).map_err(|e| bad(e.to_string()))?;
                let dims = attrs
                    .and_then(|a| a.get("_ARRAY_DIMENSIONS"))
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .map(|v| v.as_str().unwrap_or("").to_string())
                            .collect::<Vec<_>>()
                    });
                (ArrayMetadata::V2(v2), dims, None, describe_v2_codecs(meta))
            }
            other => return Err(bad(format!("zarr_format {other} is neither 2 nor 3"))),
        };
        let node_path = format!("/{path}");
        let inner = Array::new_with_metadata(Arc::new(()), &node_path, metadata).map_err(|e| {
            let msg = e.to_string();
            let what = if msg.contains("codec") {
                "codec"
            } else if msg.contains("data type") {
                "data type"
            } else if msg.contains("chunk grid") {
                "chunk grid"
            } else {
                "metadata"
            };
            unsupported(label, what, msg)
        })?;
        let type_name = inner
            .data_type()
            .name(ZarrVersion::V3)
            .map(|n| n.to_string())
            .unwrap_or_else(|| inner.data_type().to_string());
        let dtype = DType::from_zarr_name(&type_name).ok_or_else(|| {
            unsupported(
                label,
                "data type",
                format!("`{type_name}` (insitubatch reads fixed-size numeric and bool arrays)"),
            )
        })?;
        let zero = vec![0u64; inner.dimensionality()];
        let chunk_shape: Vec<u64> = if inner.dimensionality() == 0 {
            Vec::new()
        } else {
            inner
                .chunk_shape(&zero)
                .map_err(|e| unsupported(label, "chunk grid", e.to_string()))?
                .iter()
                .map(|c| c.get())
                .collect()
        };
        if inner.dimensionality() > 0 {
            // Only regular grids: every chunk has the first chunk's shape.
            let last: Vec<u64> = inner
                .chunk_grid_shape()
                .iter()
                .map(|g| g.saturating_sub(1))
                .collect();
            let last_shape: Vec<u64> = inner
                .chunk_shape(&last)
                .map_err(|e| unsupported(label, "chunk grid", e.to_string()))?
                .iter()
                .map(|c| c.get())
                .collect();
            if last_shape != chunk_shape {
                return Err(unsupported(
                    label,
                    "chunk grid",
                    "irregular chunk grids are not supported",
                ));
            }
        }
        // Every size the engine counts in bytes (the array, a chunk, a sample) fits 64 bits.
        let item = dtype.size_bytes() as u64;
        let fits = |dims: &[u64]| {
            dims.iter()
                .try_fold(item, |n, &d| n.checked_mul(d))
                .is_some()
        };
        if !fits(inner.shape()) || !fits(&chunk_shape) {
            return Err(bad(format!(
                "shape {:?} with chunks {:?} of {item}-byte elements is more than 2^64 bytes",
                inner.shape(),
                chunk_shape
            )));
        }
        let shard = crate::shard::ShardLayout::of(&inner.codecs(), &chunk_shape).map(Arc::new);
        let chain =
            crate::zstd::reuse_contexts(&inner.codecs()).map_or_else(|| inner.codecs(), Arc::new);
        Ok(Self {
            path: path.to_string(),
            zarr_format: zarr_format as u8,
            inner: Arc::new(inner),
            dtype,
            chunk_shape,
            inner_chunk_shape,
            dimension_names,
            attributes,
            codecs,
            in_place: crate::zstd::is_plain_zstd(&chain),
            chain,
            options,
            shard,
        })
    }

    /// zarrs' array (metadata and its own codec chain), for tests.
    #[cfg(test)]
    pub(crate) fn zarrs(&self) -> &Array<()> {
        &self.inner
    }

    /// Key prefix of the array in its store (`""` at the root).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Last path component (the variable name).
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or("")
    }

    /// 2 or 3.
    pub fn zarr_format(&self) -> u8 {
        self.zarr_format
    }

    /// Array shape.
    pub fn shape(&self) -> &[u64] {
        self.inner.shape()
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.inner.dimensionality()
    }

    /// Shape of one stored chunk (the shard on a sharded array).
    pub fn chunk_shape(&self) -> &[u64] {
        &self.chunk_shape
    }

    /// Inner chunk shape of a sharded array (the read granularity inside a shard).
    pub fn inner_chunk_shape(&self) -> Option<&[u64]> {
        self.inner_chunk_shape.as_deref()
    }

    /// Stored chunks per dimension.
    pub fn chunk_grid(&self) -> &[u64] {
        self.inner.chunk_grid_shape()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Dimension names from `dimension_names` (v3) or `_ARRAY_DIMENSIONS` (v2).
    pub fn dimension_names(&self) -> Option<&[String]> {
        self.dimension_names.as_deref()
    }

    /// User attributes (v3 `attributes`, v2 `.zattrs`): `units`, `calendar`, `long_name`...
    pub fn attributes(&self) -> &serde_json::Map<String, Value> {
        &self.attributes
    }

    /// The codec pipeline, outermost last, as names (`bytes`, `zstd(level=3)`, `sharding_indexed`...).
    pub fn codecs(&self) -> &[String] {
        &self.codecs
    }

    /// Decoded bytes of one stored chunk.
    pub fn chunk_bytes_decoded(&self) -> u64 {
        self.chunk_shape.iter().product::<u64>() * self.dtype.size_bytes() as u64
    }

    /// Total number of stored chunks.
    pub fn num_chunks(&self) -> u64 {
        self.chunk_grid().iter().product()
    }

    fn check_index(&self, index: &[u64]) -> Result<(), StoreError> {
        let grid = self.chunk_grid();
        if index.len() != grid.len() || index.iter().zip(grid).any(|(i, g)| i >= g) {
            return Err(StoreError::ChunkIndex {
                array: self.label().to_string(),
                index: index.to_vec(),
                grid: grid.to_vec(),
            });
        }
        Ok(())
    }

    fn label(&self) -> &str {
        array_label(&self.path)
    }

    /// The store key of the stored chunk at `index` (v2 `.`/`/` separators, v3 default or v2
    /// key encodings, as the metadata says).
    pub fn chunk_key(&self, index: &[u64]) -> Result<String, StoreError> {
        self.check_index(index)?;
        Ok(self.inner.chunk_key(index).as_str().to_string())
    }

    /// The fill-value chunk (what a never-written chunk reads as).
    pub fn fill_chunk(&self) -> DecodedChunk {
        self.fill_of(self.chunk_shape.clone())
    }

    /// The fill value over `shape`.
    fn fill_of(&self, shape: Vec<u64>) -> DecodedChunk {
        let n = shape.iter().product::<u64>() as usize;
        DecodedChunk {
            shape,
            dtype: self.dtype,
            bytes: self.inner.fill_value().as_ne_bytes().repeat(n),
            is_fill: true,
        }
    }

    /// The error for the stored chunk at `index` that does not decode.
    fn corrupt(&self, index: &[u64], path: PathBuf, message: String) -> StoreError {
        StoreError::CorruptChunk {
            array: self.label().to_string(),
            key: self.inner.chunk_key(index).as_str().to_string(),
            path,
            message,
        }
    }

    /// The stored chunk's shape as the codecs take it.
    fn codec_shape(&self) -> Vec<NonZeroU64> {
        self.chunk_shape
            .iter()
            .map(|&c| NonZeroU64::new(c).expect("zarr chunk dimensions are non-zero"))
            .collect()
    }

    /// Checks a decoder's output against the `shape` it was asked for.
    fn check_decoded(&self, bytes: Vec<u8>, shape: &[u64]) -> Result<Vec<u8>, String> {
        let expect = shape.iter().product::<u64>() as usize * self.dtype.size_bytes();
        if bytes.len() != expect {
            return Err(format!("decoded {} bytes, expected {expect}", bytes.len()));
        }
        Ok(bytes)
    }

    /// Decodes the encoded bytes of the stored chunk at `index` (`None`: the key is missing,
    /// which is the fill value). IO-free: the caller read the bytes. `file` names the source in
    /// errors.
    pub fn decode_chunk(
        &self,
        index: &[u64],
        encoded: Option<Vec<u8>>,
        file: impl FnOnce() -> PathBuf,
    ) -> Result<DecodedChunk, StoreError> {
        self.decode_chunk_cow(index, encoded.map(Cow::Owned), file)
    }

    /// [`ZarrArray::decode_chunk`] from borrowed bytes, so the caller keeps (and can recycle)
    /// the read buffer.
    pub fn decode_chunk_from(
        &self,
        index: &[u64],
        encoded: Option<&[u8]>,
        file: impl FnOnce() -> PathBuf,
    ) -> Result<DecodedChunk, StoreError> {
        self.decode_chunk_cow(index, encoded.map(Cow::Borrowed), file)
    }

    /// Decodes the stored chunk at `index` straight into `out`, which must be its decoded size
    /// (`None`: the key is missing, the fill value). When the chunk is zstd frames of bytes in
    /// this machine's order ([`ZarrArray::decodes_in_place`]) they are decompressed into `out`
    /// with no buffer between; any other chain decodes into a buffer that is then copied.
    pub fn decode_chunk_into(
        &self,
        index: &[u64],
        encoded: Option<&[u8]>,
        out: &mut [u8],
        file: impl FnOnce() -> PathBuf,
    ) -> Result<(), StoreError> {
        self.check_index(index)?;
        let size = self.chunk_bytes_decoded();
        assert_eq!(
            out.len() as u64,
            size,
            "decode_chunk_into needs a buffer of the chunk's decoded size"
        );
        let Some(encoded) = encoded else {
            let fill = self.inner.fill_value().as_ne_bytes();
            for element in out.chunks_exact_mut(fill.len().max(1)) {
                element.copy_from_slice(fill);
            }
            return Ok(());
        };
        let decoded = if self.decodes_in_place() {
            crate::zstd::decompress_into(encoded, out)
        } else {
            self.decode_bytes(Cow::Borrowed(encoded))
                .map(|bytes| out.copy_from_slice(&bytes))
        };
        decoded.map_err(|message| self.corrupt(index, file(), message))
    }

    /// True when [`ZarrArray::decode_chunk_into`] decodes with no buffer between the encoded
    /// bytes and its output (a chunk of zstd frames, nothing else).
    pub fn decodes_in_place(&self) -> bool {
        self.in_place
    }

    /// The part `subset` (one chunk-local half-open range per axis) of the stored chunk at
    /// `index`, from its encoded bytes (`None`: the key is missing, the fill value). On a
    /// sharded array only the inner chunks the subset touches are decoded (zarrs' sharding
    /// partial decoder over the shard's bytes); other chains decode the whole chunk first. The
    /// returned chunk's shape is the subset's extent.
    ///
    /// The encoded bytes are the decoder's input for as long as it runs, so they are taken by
    /// value and handed back (to be recycled) with the result.
    pub fn decode_chunk_subset(
        &self,
        index: &[u64],
        encoded: Option<Vec<u8>>,
        subset: &[std::ops::Range<u64>],
        file: impl FnOnce() -> PathBuf,
    ) -> (Result<DecodedChunk, StoreError>, Option<Vec<u8>>) {
        let (mut out, missing) = (None, encoded.is_none());
        let subsets = std::slice::from_ref(&subset);
        let (decoded, encoded) =
            self.decode_chunk_subsets(index, encoded, subsets, file, |_, b| {
                out = Some(b);
            });
        let chunk = decoded.map(|_| DecodedChunk {
            shape: subset.iter().map(|r| r.end - r.start).collect(),
            dtype: self.dtype,
            is_fill: missing,
            bytes: out.unwrap_or_default(),
        });
        (chunk, encoded)
    }

    /// [`ZarrArray::decode_chunk_subset`] for several `subsets` of one stored chunk, from one
    /// partial decoder (a shard's index is decoded once): each is handed to `each` with its
    /// decoded bytes (C order of its extent) as it comes, so none need be held with another.
    /// Returns the bytes decoded, or the first error, and the encoded bytes.
    pub fn decode_chunk_subsets<R: AsRef<[std::ops::Range<u64>]>>(
        &self,
        index: &[u64],
        encoded: Option<Vec<u8>>,
        subsets: &[R],
        file: impl FnOnce() -> PathBuf,
        mut each: impl FnMut(&[std::ops::Range<u64>], Vec<u8>),
    ) -> (Result<u64, StoreError>, Option<Vec<u8>>) {
        if let Err(e) = self.check_index(index) {
            return (Err(e), encoded);
        }
        let chunk = self.codec_shape();
        for subset in subsets {
            let subset = subset.as_ref();
            let within = subset.len() == chunk.len()
                && subset
                    .iter()
                    .zip(&chunk)
                    .all(|(r, c)| r.start < r.end && r.end <= c.get());
            if !within {
                let message = format!(
                    "the subset {subset:?} is not inside the chunk shape {:?}",
                    self.chunk_shape
                );
                return (Err(self.corrupt(index, file(), message)), encoded);
            }
        }
        let Some(encoded) = encoded else {
            let mut n = 0;
            for subset in subsets {
                let shape = subset.as_ref().iter().map(|r| r.end - r.start).collect();
                let fill = self.fill_of(shape).bytes;
                n += fill.len() as u64;
                each(subset.as_ref(), fill);
            }
            return (Ok(n), None);
        };
        // The partial decoder owns its input; it gets the buffer itself, which comes back
        // once the decoder (its only other holder) is dropped.
        let input = Arc::new(encoded);
        let decoded = (|| {
            let decoder = Arc::clone(&self.chain)
                .partial_decoder(
                    Arc::clone(&input) as Arc<_>,
                    &chunk,
                    self.inner.data_type(),
                    self.inner.fill_value(),
                    &self.options,
                )
                .map_err(|e| e.to_string())?;
            let mut n = 0;
            for subset in subsets {
                let subset = subset.as_ref();
                let shape: Vec<u64> = subset.iter().map(|r| r.end - r.start).collect();
                let region = zarrs::array::ArraySubset::new_with_ranges(subset);
                let bytes = decoder
                    .partial_decode(&region, &self.options)
                    .map_err(|e| e.to_string())?
                    .into_fixed()
                    .map_err(|e| e.to_string())?;
                let bytes = self.check_decoded(bytes.into_owned(), &shape)?;
                n += bytes.len() as u64;
                each(subset, bytes);
            }
            Ok(n)
        })();
        let decoded = decoded.map_err(|message| self.corrupt(index, file(), message));
        (decoded, Arc::try_unwrap(input).ok())
    }

    fn decode_chunk_cow(
        &self,
        index: &[u64],
        encoded: Option<Cow<'_, [u8]>>,
        file: impl FnOnce() -> PathBuf,
    ) -> Result<DecodedChunk, StoreError> {
        self.check_index(index)?;
        let Some(encoded) = encoded else {
            return Ok(self.fill_chunk());
        };
        let bytes = self
            .decode_bytes(encoded)
            .map_err(|message| self.corrupt(index, file(), message))?;
        Ok(DecodedChunk {
            shape: self.chunk_shape.clone(),
            dtype: self.dtype,
            bytes,
            is_fill: false,
        })
    }

    fn decode_bytes(&self, encoded: Cow<'_, [u8]>) -> Result<Vec<u8>, String> {
        let shape = self.codec_shape();
        let decoded = self
            .chain
            .decode(
                encoded,
                &shape,
                self.inner.data_type(),
                self.inner.fill_value(),
                &self.options,
            )
            .map_err(|e| e.to_string())?;
        let bytes = decoded
            .into_fixed()
            .map_err(|e| e.to_string())?
            .into_owned();
        self.check_decoded(bytes, &self.chunk_shape)
    }

    /// Reads from `store` what decoding `parts` (each one chunk-local range per axis) of the
    /// stored chunk with store key `key` needs: on a sharded array, its index and the inner
    /// chunks the parts touch (each once), as a compact shard (see `shard.rs`) that
    /// [`ZarrArray::decode_chunk_subset`] decodes like the whole one, part by part; otherwise
    /// the whole chunk. `None` when the key does not exist. Also returns the bytes fetched from
    /// the store: a shard's index is read once and kept for the array's later reads of that
    /// shard (up to a bound), so a later part costs its inner chunks only.
    pub async fn read_chunk_part<S: Store>(
        &self,
        store: &S,
        key: &str,
        parts: &[Vec<std::ops::Range<u64>>],
    ) -> Result<(Option<Vec<u8>>, u64), StoreError> {
        let Some(shard) = &self.shard else {
            let whole = store.get(key).await?;
            let n = whole.as_ref().map_or(0, |b| b.len() as u64);
            return Ok((whole, n));
        };
        let corrupt = |message: String| self.shard_corrupt(store, key, message);
        let mut fetched = 0;
        let index = match shard.cached_index(key) {
            Some(index) => index,
            None => {
                let Some(index) = self.read_shard_index(store, key, shard).await? else {
                    return Ok((None, 0));
                };
                fetched += shard.index_len();
                shard.keep_index(key, Arc::clone(&index));
                index
            }
        };
        let (entries, len) = (&index.0, index.1);
        let mut wanted = Vec::new();
        let mut ranges = Vec::new();
        let mut touched: Vec<usize> = parts.iter().flat_map(|p| shard.touched(p)).collect();
        touched.sort_unstable();
        touched.dedup();
        for i in touched {
            let (offset, n) = entries[i];
            if offset == u64::MAX && n == u64::MAX {
                continue; // never written: the fill value
            }
            let end = offset.checked_add(n).filter(|&e| e <= len).ok_or_else(|| {
                corrupt(format!(
                    "index puts inner chunk {i} at bytes {offset}..+{n}, past its end ({len})"
                ))
            })?;
            wanted.push(i);
            ranges.push(offset..end);
        }
        let parts = if ranges.is_empty() {
            Vec::new()
        } else {
            match store.get_ranges(key, &ranges).await? {
                Some(parts) => parts,
                None => return Ok((None, fetched)),
            }
        };
        fetched += parts.iter().map(|p| p.len() as u64).sum::<u64>();
        for (part, range) in parts.iter().zip(&ranges) {
            if part.len() as u64 != range.end - range.start {
                return Err(corrupt(format!(
                    "ended inside inner chunk bytes {}..{}",
                    range.start, range.end
                )));
            }
        }
        let compact = shard
            .compact(wanted.into_iter().zip(parts).collect())
            .map_err(corrupt)?;
        Ok((Some(compact), fetched))
    }

    /// Reads and decodes the index of the shard at `key` (`None`: the key does not exist).
    async fn read_shard_index<S: Store>(
        &self,
        store: &S,
        key: &str,
        shard: &crate::shard::ShardLayout,
    ) -> Result<Option<crate::shard::ShardIndex>, StoreError> {
        let index_len = shard.index_len();
        let (encoded_index, len) = if shard.index_at_end() {
            match store.get_suffix(key, index_len).await? {
                Some(got) => got,
                None => return Ok(None),
            }
        } else {
            let head = 0..index_len;
            match store.get_ranges(key, std::slice::from_ref(&head)).await? {
                Some(mut parts) => (parts.pop().unwrap_or_default(), u64::MAX),
                None => return Ok(None),
            }
        };
        if (encoded_index.len() as u64) < index_len {
            let message = format!(
                "is {} bytes, shorter than its {index_len}-byte index",
                encoded_index.len()
            );
            return Err(self.shard_corrupt(store, key, message));
        }
        let entries = shard
            .decode_index(&encoded_index)
            .map_err(|m| self.shard_corrupt(store, key, m))?;
        Ok(Some(Arc::new((entries, len))))
    }

    /// A shard that does not hold together, named by key and file.
    fn shard_corrupt<S: Store>(&self, store: &S, key: &str, message: String) -> StoreError {
        StoreError::CorruptChunk {
            array: self.label().to_string(),
            key: key.to_string(),
            path: store.locate(key),
            message: format!("the shard {message}"),
        }
    }

    /// True when [`ZarrArray::read_chunk_part`] reads less than the whole chunk (a sharded
    /// array whose layout it knows).
    pub fn reads_chunk_parts(&self) -> bool {
        self.shard.is_some()
    }

    /// The most bytes [`ZarrArray::read_chunk_part`] reads of one stored chunk for `parts`
    /// (each one chunk-local range per axis): the index, and the inner chunks the parts touch
    /// at their decoded size (what their encoded bytes rarely exceed). `None` when parts are
    /// read whole.
    pub fn chunk_part_bytes(&self, parts: &[Vec<std::ops::Range<u64>>]) -> Option<u64> {
        let shard = self.shard.as_ref()?;
        let elements = parts
            .iter()
            .map(|p| shard.touched_span(p))
            .fold(0u64, u64::saturating_add);
        let data = elements.saturating_mul(self.dtype.size_bytes() as u64);
        Some(data.saturating_add(shard.index_len()))
    }

    /// Reads the stored chunk at `index` from `store` and decodes it.
    pub async fn read_chunk<S: Store>(
        &self,
        store: &S,
        index: &[u64],
    ) -> Result<DecodedChunk, StoreError> {
        let key = self.chunk_key(index)?;
        let encoded = store.get(&key).await?;
        self.decode_chunk(index, encoded, || store.locate(&key))
    }

    /// Encoded size on disk of the stored chunk at `index`, if the store knows it (0 if missing).
    pub fn stored_size<S: Store>(&self, store: &S, index: &[u64]) -> Option<u64> {
        let key = self.chunk_key(index).ok()?;
        Some(store.size_of(&key).unwrap_or(0))
    }

    /// Iterates every stored-chunk index in C order.
    pub fn chunk_indices(&self) -> impl Iterator<Item = Vec<u64>> + '_ {
        let grid = self.chunk_grid().to_vec();
        let total: u64 = grid.iter().product();
        (0..total).map(move |mut flat| {
            let mut idx = vec![0u64; grid.len()];
            for d in (0..grid.len()).rev() {
                idx[d] = flat % grid[d];
                flat /= grid[d];
            }
            idx
        })
    }
}

fn codec_label(name: &str, config: Option<&Value>) -> String {
    let mut label = name.to_string();
    if let Some(cfg) = config.and_then(Value::as_object) {
        let keys = ["cname", "clevel", "level", "shuffle"];
        let parts: Vec<String> = keys
            .iter()
            .filter_map(|k| {
                cfg.get(*k)
                    .map(|v| format!("{k}={}", v.to_string().trim_matches('"')))
            })
            .collect();
        if !parts.is_empty() {
            label = format!("{label}({})", parts.join(","));
        }
    }
    label
}

fn describe_v3_codecs(meta: &Value) -> (Option<Vec<u64>>, Vec<String>) {
    let mut inner = None;
    let mut out = Vec::new();
    for c in meta
        .get("codecs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = c.get("name").and_then(Value::as_str).unwrap_or("?");
        let cfg = c.get("configuration");
        if name == "sharding_indexed" {
            inner = cfg
                .and_then(|c| c.get("chunk_shape"))
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).collect());
            let nested: Vec<String> = cfg
                .and_then(|c| c.get("codecs"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|c| {
                    codec_label(
                        c.get("name").and_then(Value::as_str).unwrap_or("?"),
                        c.get("configuration"),
                    )
                })
                .collect();
            out.push(format!("sharding_indexed[{}]", nested.join(", ")));
        } else {
            out.push(codec_label(name, cfg));
        }
    }
    (inner, out)
}

fn describe_v2_codecs(meta: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for f in meta
        .get("filters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.push(codec_label(
            f.get("id").and_then(Value::as_str).unwrap_or("?"),
            Some(f),
        ));
    }
    match meta.get("compressor") {
        Some(Value::Null) | None => out.push("raw".into()),
        Some(c) => out.push(codec_label(
            c.get("id").and_then(Value::as_str).unwrap_or("?"),
            Some(c),
        )),
    }
    out
}
