//! Reading part of a shard: its index first, then only the inner chunks a region touches.
//!
//! A sharded array's stored chunk is the shard, which holds many inner chunks and an index of
//! where each one lies (offset and length, `u64::MAX` twice for an inner chunk never written).
//! A cropped view that needs a few of them reads the index (a suffix of the shard, or its
//! start), then the byte ranges of the inner chunks it touches, and hands the decoder a
//! *compact* shard: those inner chunks back to back, with an index rewritten to point at them
//! and to mark every other inner chunk absent. zarrs' sharding codec decodes that like any
//! shard, so decoding stays zarrs'; only the IO is ours.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU64;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use zarrs::array::codec::api::{ArrayToBytesCodecTraits, CodecMetadataOptions, CodecOptions};
use zarrs::array::codec::{
    CodecChain, ShardingCodec, ShardingCodecConfiguration, ShardingIndexLocation,
};
use zarrs::array::{ArrayBytes, BytesRepresentation, FillValue};
use zarrs::plugin::ZarrVersion;

/// What reading part of a shard needs to know about the array's sharding.
#[derive(Debug)]
pub(crate) struct ShardLayout {
    /// Inner chunk shape.
    inner: Vec<u64>,
    /// Inner chunks per shard, per axis.
    grid: Vec<u64>,
    /// The index's codecs, its encoded length and where it lies.
    index_chain: Arc<CodecChain>,
    index_len: u64,
    at_end: bool,
    options: CodecOptions,
    /// Shard indexes decoded so far, by store key.
    indexes: Mutex<IndexCache>,
}

/// A decoded shard index and the shard's length (`u64::MAX` when the index is at the start,
/// where reading it does not tell the length).
pub(crate) type ShardIndex = Arc<(Vec<(u64, u64)>, u64)>;

/// Decoded shard indexes kept for the next read of the same shard (the next epoch's): a part
/// read then costs one request, not two. Bounded by [`INDEX_CACHE_BYTES`], oldest out first. A
/// dataset assumes its store does not change while it is open, as its pool's hits do.
#[derive(Debug, Default)]
struct IndexCache {
    map: HashMap<String, ShardIndex>,
    order: VecDeque<String>,
    bytes: usize,
}

/// The most bytes of decoded shard indexes one array keeps: 4 MiB, 2,048 indexes of 128 inner
/// chunks each (a shard an epoch reads more of than fit is read with its index every time).
pub(crate) const INDEX_CACHE_BYTES: usize = 4 << 20;

impl IndexCache {
    fn cost(key: &str, index: &ShardIndex) -> usize {
        key.len() + index.0.len() * 16 + 64
    }

    fn insert(&mut self, key: &str, index: ShardIndex) {
        let cost = Self::cost(key, &index);
        if cost > INDEX_CACHE_BYTES || self.map.contains_key(key) {
            return;
        }
        while self.bytes + cost > INDEX_CACHE_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(gone) = self.map.remove(&old) {
                self.bytes -= Self::cost(&old, &gone);
            }
        }
        self.bytes += cost;
        self.order.push_back(key.to_string());
        self.map.insert(key.to_string(), index);
    }
}

/// An inner chunk's entry in a decoded index: where its bytes are, or absent.
const ABSENT: u64 = u64::MAX;

impl ShardLayout {
    /// The layout of `chain` when it is a sharding codec alone (no codec before or after it,
    /// so that a region of the shard is a region of its inner chunks) whose index has a fixed
    /// encoded size; `None` otherwise (such shards are read whole).
    pub(crate) fn of(chain: &CodecChain, shard: &[u64]) -> Option<Self> {
        if !chain.array_to_array_codecs().is_empty() || !chain.bytes_to_bytes_codecs().is_empty() {
            return None;
        }
        let codec = chain.array_to_bytes_codec();
        if !codec.as_any().is::<ShardingCodec>() {
            return None;
        }
        let configuration =
            codec.configuration(ZarrVersion::V3, &CodecMetadataOptions::default())?;
        let ShardingCodecConfiguration::V1(c) = configuration.to_typed().ok()? else {
            return None;
        };
        let inner: Vec<u64> = c.chunk_shape.iter().map(|n| n.get()).collect();
        if inner.len() != shard.len() || shard.iter().zip(&inner).any(|(s, i)| s % i != 0) {
            return None;
        }
        let grid: Vec<u64> = shard.iter().zip(&inner).map(|(s, i)| s / i).collect();
        let index_chain = Arc::new(CodecChain::from_metadata(&c.index_codecs).ok()?);
        let index_len = match index_chain
            .encoded_representation(&index_shape(&grid)?, &uint64(), &FillValue::from(ABSENT))
            .ok()?
        {
            BytesRepresentation::FixedSize(n) => n,
            _ => return None,
        };
        Some(Self {
            inner,
            grid,
            index_chain,
            index_len,
            at_end: matches!(c.index_location, ShardingIndexLocation::End),
            options: CodecOptions::default(),
            indexes: Mutex::default(),
        })
    }

    /// The decoded index of the shard at `key`, if an earlier read kept it.
    pub(crate) fn cached_index(&self, key: &str) -> Option<ShardIndex> {
        let cache = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
        cache.map.get(key).cloned()
    }

    /// Keeps the decoded index of the shard at `key` for later reads.
    pub(crate) fn keep_index(&self, key: &str, index: ShardIndex) {
        let mut cache = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
        cache.insert(key, index);
    }

    /// Bytes of the encoded index.
    pub(crate) fn index_len(&self) -> u64 {
        self.index_len
    }

    /// True when the index is at the end of the shard (the default).
    pub(crate) fn index_at_end(&self) -> bool {
        self.at_end
    }

    /// The decoded index: `(offset, length)` per inner chunk, in C order.
    pub(crate) fn decode_index(&self, encoded: &[u8]) -> Result<Vec<(u64, u64)>, String> {
        let shape = index_shape(&self.grid).ok_or("an empty shard grid")?;
        let decoded = self
            .index_chain
            .decode(
                std::borrow::Cow::Borrowed(encoded),
                &shape,
                &uint64(),
                &FillValue::from(ABSENT),
                &self.options,
            )
            .map_err(|e| format!("its index does not decode: {e}"))?
            .into_fixed()
            .map_err(|e| e.to_string())?;
        let words: Vec<u64> = decoded
            .chunks_exact(8)
            .map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
            .collect();
        Ok(words.chunks_exact(2).map(|p| (p[0], p[1])).collect())
    }

    /// Elements of the inner chunks `subset` (one shard-local range per axis) touches.
    pub(crate) fn touched_span(&self, subset: &[Range<u64>]) -> u64 {
        subset
            .iter()
            .zip(&self.inner)
            .map(|(r, &i)| {
                let inner = inner_chunks(r.clone(), i);
                (inner.end - inner.start).saturating_mul(i)
            })
            .fold(1u64, u64::saturating_mul)
    }

    /// The inner chunks (flat C-order indices into the shard's grid) that `subset` (one
    /// shard-local range per axis) touches.
    pub(crate) fn touched(&self, subset: &[Range<u64>]) -> Vec<usize> {
        let ranges: Vec<Range<u64>> = subset
            .iter()
            .zip(&self.inner)
            .map(|(r, &i)| inner_chunks(r.clone(), i))
            .collect();
        let mut out = Vec::new();
        let mut at: Vec<u64> = ranges.iter().map(|r| r.start).collect();
        if ranges.iter().any(|r| r.is_empty()) {
            return out;
        }
        loop {
            out.push(at.iter().zip(&self.grid).fold(0u64, |f, (a, g)| f * g + a) as usize);
            // Odometer, last axis fastest.
            let mut d = at.len();
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                at[d] += 1;
                if at[d] < ranges[d].end {
                    break;
                }
                at[d] = ranges[d].start;
            }
        }
    }

    /// A compact shard: the inner chunks `parts` (flat index and bytes, in any order) back to
    /// back, and an index that points at them and marks every other inner chunk absent. Each
    /// part is freed as it is copied in.
    pub(crate) fn compact(&self, parts: Vec<(usize, Vec<u8>)>) -> Result<Vec<u8>, String> {
        let n = self.grid.iter().product::<u64>() as usize;
        let mut index = vec![ABSENT; 2 * n];
        let base = if self.at_end { 0 } else { self.index_len };
        let mut at = base;
        for (i, bytes) in &parts {
            index[2 * i] = at;
            index[2 * i + 1] = bytes.len() as u64;
            at += bytes.len() as u64;
        }
        let shape = index_shape(&self.grid).ok_or("an empty shard grid")?;
        let raw: Vec<u8> = index.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let encoded = self
            .index_chain
            .encode(
                ArrayBytes::from(raw),
                &shape,
                &uint64(),
                &FillValue::from(ABSENT),
                &self.options,
            )
            .map_err(|e| format!("re-encoding its index: {e}"))?;
        let data_len = (at - base) as usize;
        let mut out = Vec::with_capacity(data_len + encoded.len());
        if !self.at_end {
            out.extend_from_slice(&encoded);
        }
        for (_, bytes) in parts {
            out.extend_from_slice(&bytes);
        }
        if self.at_end {
            out.extend_from_slice(&encoded);
        }
        Ok(out)
    }
}

/// The indices of the inner chunks of size `inner` that the elements `range` fall in.
fn inner_chunks(range: Range<u64>, inner: u64) -> Range<u64> {
    range.start / inner..range.end.div_ceil(inner)
}

/// The shape of a shard index: the inner grid, then 2 (offset, length).
fn index_shape(grid: &[u64]) -> Option<Vec<NonZeroU64>> {
    grid.iter()
        .copied()
        .chain([2])
        .map(NonZeroU64::new)
        .collect()
}

fn uint64() -> zarrs::array::DataType {
    zarrs::array::data_type::uint64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_cache_keeps_its_bound_and_lets_the_oldest_go_first() {
        let mut cache = IndexCache::default();
        // 128 inner chunks: 2 KiB of entries each.
        let index = || Arc::new((vec![(0u64, 1u64); 128], 1 << 20));
        let n = INDEX_CACHE_BYTES / IndexCache::cost("c/0/0/0", &index()) + 10;
        for i in 0..n {
            cache.insert(&format!("c/{i}/0/0"), index());
            assert!(cache.bytes <= INDEX_CACHE_BYTES);
            assert_eq!(cache.map.len(), cache.order.len());
        }
        assert!(!cache.map.contains_key("c/0/0/0"), "the oldest went first");
        assert!(cache.map.contains_key(&format!("c/{}/0/0", n - 1)));
        // Full to within one index: nothing was let go that fitted.
        let kept = cache.map.len();
        let one = IndexCache::cost(&format!("c/{}/0/0", n - 1), &index());
        assert!(
            cache.bytes + one > INDEX_CACHE_BYTES && kept < n,
            "{kept} of {n}"
        );
        // An index larger than the whole bound is not kept, and evicts nothing.
        cache.insert(
            "huge",
            Arc::new((vec![(0, 0); INDEX_CACHE_BYTES / 16 + 1], 0)),
        );
        assert_eq!(
            (cache.map.len(), cache.map.contains_key("huge")),
            (kept, false)
        );
    }
}
