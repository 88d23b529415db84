//! The epoch order: the ledger for sample-once.
//!
//! Chunks are permuted per epoch with a generator keyed on (seed, epoch) only; consecutive
//! windows of `block_chunks` chunks form blocks, and within a block every valid anchor is
//! shuffled together. Unshuffled passes keep chunks and samples in order.
//!
//! With a ramp (`first_block_chunks` below `block_chunks`) the first window is smaller and each
//! next one doubles until windows are full: the first batch then waits for a few chunks
//! instead of a whole block, and the epoch's first batches mix fewer chunks.

use std::ops::Range;

use crate::error::EngineError;
use crate::rng::Rng;
use crate::sample_map::SampleMap;

/// Stream tag for epoch orders.
const ORDER_STREAM: u64 = 0x004f_5244_4552; // "ORDER"

/// One drawn row: reference chunk and position within it (`anchor = chunk * spc + within`),
/// and which of the anchor's patches it is (0 without patches, or with one per sample).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Row {
    /// Reference chunk index along the sample axis.
    pub chunk: u64,
    /// Position within the chunk.
    pub within: u32,
    /// The anchor's patch this row is cut to (`crate::patch::Origins`).
    pub patch: u32,
}

/// One epoch's draw order over a split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochOrder {
    /// Samples-per-chunk of the reference grid.
    pub samples_per_chunk: u64,
    /// Every valid anchor exactly once, in emission order.
    pub rows: Vec<Row>,
    /// Row ranges of the shuffle blocks, in order (blocks whose anchors were all dropped are
    /// omitted).
    pub blocks: Vec<Range<usize>>,
    /// Anchors skipped because a windowed view would read off the array.
    pub dropped_anchors: u64,
    /// Rows cut from the end of the order by [`OrderSpec::row_limit`] (ranks evened out).
    pub trimmed_rows: u64,
}

impl EpochOrder {
    /// An error naming `split` when every anchor was dropped (a pass over it would yield
    /// nothing).
    pub fn check_nonempty(&self, split: &str) -> Result<(), EngineError> {
        if self.rows.is_empty() {
            return Err(EngineError::every_anchor_dropped(
                split,
                self.dropped_anchors,
            ));
        }
        Ok(())
    }

    /// Anchor (global sample index on the reference grid) of row `i`.
    pub fn anchor(&self, i: usize) -> u64 {
        let r = self.rows[i];
        r.chunk * self.samples_per_chunk + r.within as u64
    }

    /// Which of its anchor's patches row `i` is.
    pub fn patch(&self, i: usize) -> u64 {
        u64::from(self.rows[i].patch)
    }

    /// All anchors in emission order.
    pub fn anchors(&self) -> Vec<u64> {
        (0..self.rows.len()).map(|i| self.anchor(i)).collect()
    }

    /// Drops the first `n` rows (at most all): what a pass resumed past them still draws, in
    /// the same order and the same blocks (a block the cut falls in keeps its later rows).
    pub fn skip_front(&mut self, n: usize) {
        let n = n.min(self.rows.len());
        self.rows.drain(..n);
        self.blocks.retain(|b| b.end > n);
        for b in &mut self.blocks {
            *b = b.start.saturating_sub(n)..b.end - n;
        }
    }
}

/// Which samples of the reference grid are drawn: every `every`-th from `phase` (hourly data
/// with `every` 6 gives 00, 06, 12 and 18 UTC when sample 0 is at 00 UTC). [`Stride::ALL`]
/// draws every sample. A chunk is still read and decoded whole, once; only its samples on the
/// stride become rows, and a chunk with none is not read at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stride {
    /// Draw every `every`-th sample (at least 1).
    pub every: u64,
    /// Starting at this sample (below `every`).
    pub phase: u64,
}

impl Stride {
    /// Every sample.
    pub const ALL: Stride = Stride { every: 1, phase: 0 };

    /// `every` and `phase` as given, or an error naming the one that cannot work.
    pub fn new(every: u64, phase: u64) -> Result<Self, EngineError> {
        if every == 0 {
            return Err(EngineError::arg(
                "sample_stride",
                every,
                "must be at least 1 (1 draws every sample)",
            ));
        }
        if phase >= every {
            return Err(EngineError::arg(
                "sample_phase",
                phase,
                format!("must be below sample_stride ({every}): the first sample drawn"),
            ));
        }
        Ok(Self { every, phase })
    }

    /// True when sample `a` is on the stride.
    pub fn takes(&self, a: u64) -> bool {
        a % self.every == self.phase
    }

    /// How many samples of `range` are on the stride.
    pub fn count(&self, range: Range<u64>) -> u64 {
        // The first sample at or after range.start on the stride.
        let first = if range.start <= self.phase {
            self.phase
        } else {
            let past = range.start - self.phase;
            self.phase
                .saturating_add(past.div_ceil(self.every).saturating_mul(self.every))
        };
        if first >= range.end {
            0
        } else {
            (range.end - 1 - first) / self.every + 1
        }
    }
}

/// Inputs of [`epoch_order`].
#[derive(Clone, Debug)]
pub struct OrderSpec<'a> {
    /// The split's reference chunks.
    pub chunks: &'a [u64],
    /// Reference samples per chunk.
    pub samples_per_chunk: u64,
    /// Length of the reference array's sample axis: the anchors are its samples.
    pub n_samples: u64,
    /// What each variable reads along its sample axis; an anchor is valid when every one of
    /// them reads inside its array.
    pub reaches: &'a [Reach],
    /// The samples drawn; chunks with none on it are left out of the order.
    pub stride: Stride,
    /// Seed.
    pub seed: u64,
    /// Epoch.
    pub epoch: u64,
    /// Permute chunks and shuffle within blocks.
    pub shuffle: bool,
    /// Chunks per shuffle block.
    pub block_chunks: usize,
    /// Chunks of the first block; each next block doubles it until it reaches `block_chunks`
    /// (equal to `block_chunks`: no ramp, every block full).
    pub first_block_chunks: usize,
    /// Emit at most this many rows, the first ones of the order (every rank of a sharded train
    /// split stops at the same length, so each takes the same number of steps).
    pub row_limit: Option<u64>,
    /// Rows per valid anchor, shuffled within its block like any (its patches; at least 1).
    pub per_anchor: u32,
}

/// Where one variable reads along its sample axis, as an anchor sees it: its map from anchors
/// to samples (a window offset, and for a store mounted with an alignment its place on the
/// anchors' axis) and its array's length, which may differ from the reference's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reach {
    /// Anchor to sample.
    pub map: SampleMap,
    /// Samples of the array along its sample axis.
    pub len: u64,
}

#[cfg(test)]
impl Reach {
    /// Views at `offsets` of arrays of the anchors' store, all of the reference's `n` samples.
    pub(crate) fn same_length(n: u64, offsets: &[i64]) -> Vec<Reach> {
        offsets
            .iter()
            .map(|&offset| Reach {
                map: SampleMap::window(offset),
                len: n,
            })
            .collect()
    }
}

/// The anchors of `0..n` at which every reach reads inside its array (all of `0..n` with no
/// reaches). Empty when they share no sample. For a store at another rate, the range holds
/// anchors that fall between two of its samples too: which anchors land on one is the
/// dataset's sample stride's to say (checked when it is built).
pub fn valid_anchors(n: u64, reaches: &[Reach]) -> Range<u64> {
    let (mut lo, mut hi) = (0i128, i128::from(n));
    for r in reaches {
        let within = r.map.within(r.len);
        lo = lo.max(within.start);
        hi = hi.min(within.end);
    }
    let hi = hi.max(lo);
    (lo as u64)..(hi as u64)
}

/// The rows [`epoch_order`] would emit for these fields of its spec, and the anchors it would
/// drop, counted without building the order (the same for every epoch, seed and block size).
pub fn count_rows(
    chunks: &[u64],
    samples_per_chunk: u64,
    n_samples: u64,
    reaches: &[Reach],
    stride: Stride,
) -> (u64, u64) {
    let valid = valid_anchors(n_samples, reaches);
    chunks.iter().fold((0, 0), |(rows, dropped), &c| {
        let (kept, lost) = chunk_rows(c, samples_per_chunk, n_samples, &valid, stride);
        (rows + kept, dropped + lost)
    })
}

/// The samples of chunk `c` (only its real length, for the short final chunk).
fn chunk_samples(c: u64, samples_per_chunk: u64, n_samples: u64) -> Range<u64> {
    let start = c.saturating_mul(samples_per_chunk).min(n_samples);
    start..start.saturating_add(samples_per_chunk).min(n_samples)
}

/// The anchors of chunk `c` on the stride inside `valid`, and those on the stride outside it.
fn chunk_rows(
    c: u64,
    samples_per_chunk: u64,
    n_samples: u64,
    valid: &Range<u64>,
    stride: Stride,
) -> (u64, u64) {
    let all = chunk_samples(c, samples_per_chunk, n_samples);
    let inside = all.start.max(valid.start)..all.end.min(valid.end);
    let kept = if inside.is_empty() {
        0
    } else {
        stride.count(inside)
    };
    (kept, stride.count(all) - kept)
}

/// One rank's share of a split when several processes train together (data-parallel ranks):
/// the split's chunk list cut into `world_size` contiguous runs, rank `r` taking the `r`-th. The
/// cuts fall where the runs' valid rows come closest to equal (a short final chunk or the anchors
/// a window drops make chunks unequal), each run holding at least one chunk. The share is the same
/// every epoch, so each rank reads (and caches) its own part of the data; it is contiguous so that
/// a window (`y = x.shift(h)`) reaches into another rank's chunks only at the run's end, not from
/// every chunk; and the ranks together cover the split once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
}

/// A split's valid rows per chunk, as prefix sums (`prefix[i]`: the rows of its first `i` chunks).
fn row_prefix(
    split: &[u64],
    samples_per_chunk: u64,
    n_samples: u64,
    reaches: &[Reach],
    stride: Stride,
) -> Vec<u64> {
    let valid = valid_anchors(n_samples, reaches);
    let mut prefix = Vec::with_capacity(split.len() + 1);
    prefix.push(0);
    for &c in split {
        let rows = chunk_rows(c, samples_per_chunk, n_samples, &valid, stride).0;
        prefix.push(prefix.last().copied().unwrap_or(0) + rows);
    }
    prefix
}

impl Shard {
    /// The whole split (one rank).
    pub const WHOLE: Shard = Shard {
        rank: 0,
        world_size: 1,
    };

    /// Where the runs start in the split's chunk list (`world_size + 1` indices, the last the
    /// list's length), given its row prefix sums. Needs at least `world_size` chunks.
    fn bounds(&self, prefix: &[u64]) -> Vec<usize> {
        let w = self.world_size.max(1);
        let len = prefix.len() - 1;
        let total = u128::from(prefix[len]);
        let mut bounds = vec![0; w + 1];
        bounds[w] = len;
        for k in 1..w {
            // Leave every rank before and after at least one chunk.
            let lo = (bounds[k - 1] + 1).min(len);
            let hi = len.saturating_sub(w - k).max(lo);
            // The cut whose rows before it come closest to k/w of the total (the lower on a tie).
            let miss = |b: usize| (u128::from(prefix[b]) * w as u128).abs_diff(total * k as u128);
            let first_over = lo
                + prefix[lo..=hi]
                    .partition_point(|&p| u128::from(p) * (w as u128) < total * k as u128);
            bounds[k] = [first_over.saturating_sub(1).max(lo), first_over.min(hi)]
                .into_iter()
                .min_by_key(|&b| (miss(b), b))
                .unwrap_or(lo);
        }
        bounds
    }

    /// This rank's chunks of `split`, in split order, and the valid rows of the rank with the
    /// fewest (where every rank stops so that all take the same number of steps). `split` must
    /// hold at least `world_size` chunks.
    pub fn share(
        &self,
        split: &[u64],
        samples_per_chunk: u64,
        n_samples: u64,
        reaches: &[Reach],
        stride: Stride,
    ) -> (Vec<u64>, u64) {
        let prefix = row_prefix(split, samples_per_chunk, n_samples, reaches, stride);
        let bounds = self.bounds(&prefix);
        let even = bounds
            .windows(2)
            .map(|b| prefix[b[1]] - prefix[b[0]])
            .min()
            .unwrap_or(0);
        let rank = self.rank.min(bounds.len() - 2);
        (split[bounds[rank]..bounds[rank + 1]].to_vec(), even)
    }
}

/// The chunk counts of successive blocks: `first` doubling up to `full`, then `full` on.
fn block_sizes(first: usize, full: usize) -> impl Iterator<Item = usize> {
    std::iter::successors(Some(first.clamp(1, full)), move |&n| {
        Some(n.saturating_mul(2).min(full))
    })
}

/// Builds the epoch order; an error only when it cannot be held in memory.
pub fn epoch_order(spec: &OrderSpec<'_>) -> Result<EpochOrder, EngineError> {
    assert!(spec.block_chunks > 0 && spec.samples_per_chunk > 0 && spec.per_anchor > 0);
    let spc = spec.samples_per_chunk;
    let valid = valid_anchors(spec.n_samples, spec.reaches);
    let mut chunks = spec.chunks.to_vec();
    // A chunk with no valid anchor on the stride yields nothing: it takes no place in a block
    // (the anchors it drops are counted all the same).
    let mut dropped = 0u64;
    chunks.retain(|&c| {
        let (kept, lost) = chunk_rows(c, spc, spec.n_samples, &valid, spec.stride);
        if kept == 0 {
            dropped += lost;
        }
        kept > 0
    });
    let mut rng = Rng::keyed(&[spec.seed, spec.epoch, ORDER_STREAM]);
    if spec.shuffle {
        rng.shuffle(&mut chunks);
    }
    let n_rows = (spec.chunks.len() as u64)
        .saturating_mul(spc)
        .min(spec.n_samples)
        .saturating_mul(u64::from(spec.per_anchor));
    let mut rows = super::plan_vec(n_rows, "the epoch's sample order")?;
    let mut blocks = Vec::new();
    let mut rest = &chunks[..];
    for size in block_sizes(spec.first_block_chunks, spec.block_chunks) {
        if rest.is_empty() {
            break;
        }
        let (block, tail) = rest.split_at(size.min(rest.len()));
        rest = tail;
        let start = rows.len();
        for &c in block {
            for w in 0..spc {
                let a = c * spc + w;
                if a >= spec.n_samples {
                    break; // the short final chunk: only its real length
                }
                if !spec.stride.takes(a) {
                    continue;
                }
                if valid.contains(&a) {
                    rows.extend((0..spec.per_anchor).map(|patch| Row {
                        chunk: c,
                        within: w as u32,
                        patch,
                    }));
                } else {
                    dropped += 1;
                }
            }
        }
        if spec.shuffle {
            rng.shuffle(&mut rows[start..]);
        }
        if rows.len() > start {
            blocks.push(start..rows.len());
        }
    }
    let mut trimmed = 0;
    if let Some(limit) = spec.row_limit
        && let Ok(limit) = usize::try_from(limit)
        && limit < rows.len()
    {
        trimmed = (rows.len() - limit) as u64;
        rows.truncate(limit);
        blocks.retain(|b| b.start < limit);
        if let Some(last) = blocks.last_mut() {
            last.end = last.end.min(limit);
        }
    }
    Ok(EpochOrder {
        samples_per_chunk: spc,
        rows,
        blocks,
        dropped_anchors: dropped,
        trimmed_rows: trimmed,
    })
}

/// How close `order` (sample indices in emission order) comes to a perfect global shuffle:
/// 1.0 is indistinguishable from one, 0.0 is sequential.
///
/// It is the mean of two scores. Chunk mixing: how rarely consecutive samples share a chunk
/// of `samples_per_chunk`, relative to a uniform shuffle. Order decorrelation: one minus the
/// absolute Spearman rank correlation between emission position and sample index.
pub fn shuffle_quality(order: &[u64], samples_per_chunk: u64) -> f64 {
    let n = order.len();
    if n < 3 || samples_per_chunk == 0 {
        return 1.0;
    }
    let same = order
        .windows(2)
        .filter(|w| w[0] / samples_per_chunk == w[1] / samples_per_chunk)
        .count() as f64
        / (n - 1) as f64;
    let expected = ((samples_per_chunk.min(n as u64) - 1) as f64 / (n - 1) as f64).min(1.0);
    let mixing = if expected >= 1.0 {
        1.0
    } else {
        (1.0 - (same - expected).max(0.0) / (1.0 - expected)).clamp(0.0, 1.0)
    };
    // Spearman over ranks of the sample values against positions.
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by_key(|&i| order[i]);
    let mut rank = vec![0f64; n];
    for (r, &i) in idx.iter().enumerate() {
        rank[i] = r as f64;
    }
    let mean = (n - 1) as f64 / 2.0;
    let (mut num, mut den) = (0.0, 0.0);
    for (pos, r) in rank.iter().enumerate() {
        num += (pos as f64 - mean) * (r - mean);
        den += (pos as f64 - mean).powi(2);
    }
    let rho = if den > 0.0 { num / den } else { 0.0 };
    (mixing + (1.0 - rho.abs())) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Views at `offsets` of arrays of the reference's 38 samples.
    fn at(offsets: &[i64]) -> Vec<Reach> {
        Reach::same_length(38, offsets)
    }

    fn spec<'a>(chunks: &'a [u64], reaches: &'a [Reach], shuffle: bool) -> OrderSpec<'a> {
        OrderSpec {
            chunks,
            samples_per_chunk: 4,
            n_samples: 38,
            reaches,
            stride: Stride::ALL,
            seed: 5,
            epoch: 0,
            shuffle,
            block_chunks: 3,
            first_block_chunks: 3,
            row_limit: None,
            per_anchor: 1,
        }
    }

    #[test]
    fn every_valid_anchor_once_with_partial_final_chunk_and_windows() {
        let chunks: Vec<u64> = (0..10).collect();
        for shuffle in [false, true] {
            let o = epoch_order(&spec(&chunks, &at(&[0]), shuffle)).unwrap();
            let mut a = o.anchors();
            a.sort_unstable();
            assert_eq!(a, (0..38).collect::<Vec<_>>(), "shuffle={shuffle}");
            assert_eq!(o.dropped_anchors, 0);
            let w = epoch_order(&spec(&chunks, &at(&[0, 5, -2]), shuffle)).unwrap();
            let mut a = w.anchors();
            a.sort_unstable();
            assert_eq!(a, (2..33).collect::<Vec<_>>());
            assert_eq!(w.dropped_anchors, 38 - 31);
        }
        let seq = epoch_order(&spec(&chunks, &at(&[0]), false)).unwrap();
        assert_eq!(seq.anchors(), (0..38).collect::<Vec<_>>());
        assert_eq!(seq.blocks.len(), 4);
    }

    /// Every sample, and strides with and without a phase, longer and shorter than a chunk.
    fn strides() -> impl Iterator<Item = Stride> {
        [(1, 0), (2, 0), (2, 1), (3, 2), (5, 1)]
            .into_iter()
            .map(|(every, phase)| Stride::new(every, phase).unwrap())
    }

    #[test]
    fn a_stride_counts_the_samples_of_a_range_on_it() {
        for stride in strides() {
            for start in 0..12u64 {
                for end in start..14 {
                    let want = (start..end).filter(|a| stride.takes(*a)).count() as u64;
                    assert_eq!(stride.count(start..end), want, "{stride:?} {start}..{end}");
                }
            }
        }
        assert!(
            Stride::new(0, 0)
                .unwrap_err()
                .to_string()
                .contains("`sample_stride`")
        );
        let e = Stride::new(6, 6).unwrap_err().to_string();
        assert!(
            e.contains("`sample_phase`") && e.contains("below sample_stride (6)"),
            "{e}"
        );
    }

    #[test]
    fn counting_rows_agrees_with_building_the_order() {
        let offset_sets: [&[i64]; 7] = [&[], &[0], &[0, 5, -2], &[3], &[-4, -1], &[0, 40], &[-40]];
        for n in 1..=13u64 {
            for spc in 1..=4u64 {
                let grid = n.div_ceil(spc);
                // Every chunk, the odd ones, and the last one alone.
                let all: Vec<u64> = (0..grid).collect();
                let odd: Vec<u64> = (0..grid).filter(|c| c % 2 == 1).collect();
                for chunks in [all, odd, vec![grid - 1]] {
                    for (offsets, stride) in offset_sets
                        .iter()
                        .flat_map(|o| strides().map(move |s| (*o, s)))
                    {
                        let reaches = Reach::same_length(n, offsets);
                        let s = OrderSpec {
                            chunks: &chunks,
                            samples_per_chunk: spc,
                            n_samples: n,
                            reaches: &reaches,
                            stride,
                            seed: 1,
                            epoch: 2,
                            shuffle: true,
                            block_chunks: 2,
                            first_block_chunks: 2,
                            row_limit: None,
                            per_anchor: 1,
                        };
                        let o = epoch_order(&s).unwrap();
                        let case = format!(
                            "n {n}, spc {spc}, chunks {chunks:?}, offsets {offsets:?}, {stride:?}"
                        );
                        assert_eq!(
                            count_rows(&chunks, spc, n, &reaches, stride),
                            (o.rows.len() as u64, o.dropped_anchors),
                            "{case}"
                        );
                        // Every anchor on the stride that no window drops, once; the dropped
                        // ones are those on the stride the windows drop.
                        let valid = valid_anchors(n, &reaches);
                        let on_stride: Vec<u64> = chunks
                            .iter()
                            .flat_map(|&c| chunk_samples(c, spc, n))
                            .filter(|a| a % stride.every == stride.phase)
                            .collect();
                        let mut got = o.anchors();
                        got.sort_unstable();
                        let want: Vec<u64> = on_stride
                            .iter()
                            .copied()
                            .filter(|a| valid.contains(a))
                            .collect();
                        assert_eq!(got, want, "{case}");
                        assert_eq!(
                            o.dropped_anchors,
                            (on_stride.len() - want.len()) as u64,
                            "{case}"
                        );
                        // Chunks with no sample on the stride take no place in a block: the
                        // blocks of two chunks are at most those of the others.
                        let on = chunks
                            .iter()
                            .filter(|&&c| stride.count(chunk_samples(c, spc, n)) > 0)
                            .count();
                        assert!(o.blocks.len() <= on.div_ceil(2), "{case}: {:?}", o.blocks);
                    }
                }
            }
        }
    }

    #[test]
    fn ranks_take_contiguous_near_equal_runs_and_the_limit_evens_them_out() {
        let offset_sets: [&[i64]; 3] = [&[0], &[0, 5, -2], &[3]];
        for n in 1..=13u64 {
            for spc in 1..=4u64 {
                let all: Vec<u64> = (0..n.div_ceil(spc)).collect();
                let per_chunk =
                    |reaches: &[Reach], c: u64| count_rows(&[c], spc, n, reaches, Stride::ALL).0;
                for world_size in 1..=all.len().min(4) {
                    for offsets in offset_sets {
                        let reaches = Reach::same_length(n, offsets);
                        let reaches = &reaches[..];
                        let whole = count_rows(&all, spc, n, reaches, Stride::ALL).0;
                        let shares: Vec<(Vec<u64>, u64)> = (0..world_size)
                            .map(|rank| {
                                Shard { rank, world_size }.share(&all, spc, n, reaches, Stride::ALL)
                            })
                            .collect();
                        let even = shares[0].1;
                        let case = format!("n {n}, spc {spc}, {world_size} ranks, {offsets:?}");
                        // Contiguous runs that together are the split, none empty.
                        let joined: Vec<u64> = shares.iter().flat_map(|s| s.0.clone()).collect();
                        assert_eq!(joined, all, "{case}");
                        assert!(
                            shares.iter().all(|s| !s.0.is_empty() && s.1 == even),
                            "{case}"
                        );
                        // Near-equal rows when every chunk has some: within a chunk of the mean.
                        let rows: Vec<u64> = shares
                            .iter()
                            .map(|s| count_rows(&s.0, spc, n, reaches, Stride::ALL).0)
                            .collect();
                        assert_eq!(even, *rows.iter().min().unwrap(), "{case}");
                        let biggest = all.iter().map(|&c| per_chunk(reaches, c)).max().unwrap();
                        if all.iter().all(|&c| per_chunk(reaches, c) > 0) {
                            for r in &rows {
                                assert!(
                                    (*r as i128 * world_size as i128 - whole as i128).abs()
                                        <= (world_size as u64 * biggest) as i128,
                                    "{case}: rows {rows:?}"
                                );
                            }
                        }
                        for (rank, (chunks, _)) in shares.iter().enumerate() {
                            let mut s = OrderSpec {
                                chunks,
                                samples_per_chunk: spc,
                                n_samples: n,
                                reaches,
                                stride: Stride::ALL,
                                seed: 3,
                                epoch: 1,
                                shuffle: true,
                                block_chunks: 2,
                                first_block_chunks: 2,
                                row_limit: None,
                                per_anchor: 1,
                            };
                            let full = epoch_order(&s).unwrap();
                            s.row_limit = Some(even);
                            let cut = epoch_order(&s).unwrap();
                            let case = format!("{case}, rank {rank}");
                            // The first `even` rows of the same order, the rest counted.
                            assert_eq!(cut.rows.len() as u64, even, "{case}");
                            assert_eq!(cut.rows[..], full.rows[..even as usize], "{case}");
                            assert_eq!(cut.trimmed_rows, full.rows.len() as u64 - even, "{case}");
                            // Blocks still tile the rows, none empty.
                            let mut at = 0;
                            for b in &cut.blocks {
                                assert!(b.start == at && b.end > b.start, "{case}: {cut:?}");
                                at = b.end;
                            }
                            assert_eq!(at, cut.rows.len(), "{case}");
                        }
                    }
                }
            }
        }
        // Equal chunks: the cut nearest half the rows, the lower one on a tie.
        let split = [3, 4, 9, 10, 11];
        let s = |rank| Shard {
            rank,
            world_size: 2,
        };
        assert_eq!(
            s(0).share(&split, 4, 48, &Reach::same_length(48, &[0]), Stride::ALL),
            (vec![3, 4], 8)
        );
        assert_eq!(
            s(1).share(&split, 4, 48, &Reach::same_length(48, &[0]), Stride::ALL),
            (vec![9, 10, 11], 8)
        );
        assert_eq!(
            Shard::WHOLE
                .share(&split, 4, 48, &Reach::same_length(48, &[0]), Stride::ALL)
                .0,
            split
        );
        // A short final chunk (30, 30 and 1 rows): 30 and 31 rows, not 60 and 1.
        assert_eq!(
            s(0).share(
                &[0, 1, 2],
                30,
                61,
                &Reach::same_length(61, &[0]),
                Stride::ALL
            ),
            (vec![0], 30)
        );
        assert_eq!(
            s(1).share(
                &[0, 1, 2],
                30,
                61,
                &Reach::same_length(61, &[0]),
                Stride::ALL
            ),
            (vec![1, 2], 30)
        );
    }

    #[test]
    fn blocks_hold_exactly_their_chunks_and_epochs_differ() {
        let chunks: Vec<u64> = (0..10).collect();
        let zero = at(&[0]);
        let mut s = spec(&chunks, &zero, true);
        let e0 = epoch_order(&s).unwrap();
        for b in &e0.blocks {
            let mut cs: Vec<u64> = e0.rows[b.clone()].iter().map(|r| r.chunk).collect();
            cs.sort_unstable();
            cs.dedup();
            assert!(cs.len() <= 3);
        }
        assert_eq!(
            e0,
            epoch_order(&s).unwrap(),
            "same (seed, epoch), same order"
        );
        s.epoch = 1;
        assert_ne!(e0.rows, epoch_order(&s).unwrap().rows);
    }

    #[test]
    fn a_ramp_doubles_the_first_block_up_to_full_ones() {
        let sizes = |first, full| block_sizes(first, full).take(6).collect::<Vec<_>>();
        assert_eq!(sizes(2, 16), [2, 4, 8, 16, 16, 16]);
        assert_eq!(sizes(3, 16), [3, 6, 12, 16, 16, 16]);
        assert_eq!(sizes(0, 3), [1, 2, 3, 3, 3, 3], "at least one chunk");
        assert_eq!(sizes(5, 3), [3; 6], "never over block_chunks");
        assert_eq!(sizes(usize::MAX, usize::MAX), [usize::MAX; 6]);
        // Over an order: 40 chunks of 4 samples, the last blocks what is left; every anchor once.
        let chunks: Vec<u64> = (0..40).collect();
        let mut s = OrderSpec {
            chunks: &chunks,
            samples_per_chunk: 4,
            n_samples: 160,
            reaches: &Reach::same_length(160, &[0]),
            stride: Stride::ALL,
            seed: 9,
            epoch: 1,
            shuffle: true,
            block_chunks: 16,
            first_block_chunks: 3,
            row_limit: None,
            per_anchor: 1,
        };
        let o = epoch_order(&s).unwrap();
        let rows: Vec<usize> = o.blocks.iter().map(|b| b.len()).collect();
        assert_eq!(rows, [12, 24, 48, 64, 12]);
        let mut a = o.anchors();
        a.sort_unstable();
        assert_eq!(a, (0..160).collect::<Vec<_>>());
        s.first_block_chunks = 16;
        let rows: Vec<usize> = epoch_order(&s)
            .unwrap()
            .blocks
            .iter()
            .map(|b| b.len())
            .collect();
        assert_eq!(rows, [64, 64, 32]);
    }

    #[test]
    fn each_patch_of_an_anchor_is_a_row_once_in_its_anchors_block() {
        let chunks: Vec<u64> = (0..20).collect();
        let mut s = OrderSpec {
            chunks: &chunks,
            samples_per_chunk: 4,
            n_samples: 78,
            reaches: &Reach::same_length(78, &[0, 1]),
            stride: Stride::ALL,
            seed: 3,
            epoch: 2,
            shuffle: true,
            block_chunks: 4,
            first_block_chunks: 4,
            row_limit: None,
            per_anchor: 3,
        };
        let o = epoch_order(&s).unwrap();
        // The window drops anchor 77; every other anchor gives three rows, one per patch.
        assert_eq!(o.rows.len(), 77 * 3);
        assert_eq!(o.dropped_anchors, 1, "anchors dropped, not rows");
        let mut keys: Vec<(u64, u64)> = (0..o.rows.len())
            .map(|i| (o.anchor(i), o.patch(i)))
            .collect();
        keys.sort_unstable();
        let want: Vec<(u64, u64)> = (0..77).flat_map(|a| (0..3).map(move |k| (a, k))).collect();
        assert_eq!(keys, want);
        let mut block_of = std::collections::HashMap::new();
        for (n, b) in o.blocks.iter().enumerate() {
            for i in b.clone() {
                let first = *block_of.entry(o.anchor(i)).or_insert(n);
                assert_eq!(first, n, "anchor {}'s patches in one block", o.anchor(i));
            }
        }
        let apart = (1..o.rows.len())
            .filter(|&i| o.anchor(i) != o.anchor(i - 1))
            .count();
        assert!(
            apart > o.rows.len() * 3 / 4,
            "an anchor's patches are shuffled apart"
        );
        // Unshuffled: each anchor's patches in order, one after the other.
        s.shuffle = false;
        let o = epoch_order(&s).unwrap();
        assert_eq!(
            (0..6)
                .map(|i| (o.anchor(i), o.patch(i)))
                .collect::<Vec<_>>(),
            [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
        );
        // A row limit counts rows, not anchors.
        s.row_limit = Some(10);
        assert_eq!(epoch_order(&s).unwrap().rows.len(), 10);
    }

    #[test]
    fn quality_scores_sequential_low_and_shuffled_high() {
        let seq: Vec<u64> = (0..4096).collect();
        assert!(shuffle_quality(&seq, 8) < 0.1);
        let mut shuf = seq.clone();
        Rng::keyed(&[1]).shuffle(&mut shuf);
        assert!(shuffle_quality(&shuf, 8) > 0.9);
        let chunks: Vec<u64> = (0..512).collect();
        let o = epoch_order(&OrderSpec {
            chunks: &chunks,
            samples_per_chunk: 8,
            n_samples: 4096,
            reaches: &Reach::same_length(4096, &[0]),
            stride: Stride::ALL,
            seed: 0,
            epoch: 0,
            shuffle: true,
            block_chunks: 16,
            first_block_chunks: 16,
            row_limit: None,
            per_anchor: 1,
        })
        .unwrap();
        let q = shuffle_quality(&o.anchors(), 8);
        assert!(q > 0.8, "block shuffle over permuted chunks scores {q}");
    }
}
