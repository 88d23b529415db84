//! Statistics of a split's samples (count, mean, standard deviation, min, max), for fitting a
//! `Standardize` transform on the training split at the loader's speed: one pass over the
//! split's batches, each value accumulated in `f64`.
//!
//! Each run of values (a sample's field, or its part at one index of the axis) is reduced in
//! one pass as sums of differences from its first value, and runs are merged with Chan et
//! al.'s pairwise update, so a field whose mean is large against its spread (temperatures in
//! kelvin) keeps its variance. NaN values are left out and counted.
//!
//! Quantiles, when asked for, come from a histogram of every value in log-linear buckets
//! ([`Sketch`]): 128 per power of two, so a quantile is within 1/256 of its value (relative)
//! of numpy's, at a table lookup per value, in memory that grows with the powers of two the
//! values span, not with their count.

use std::collections::BTreeMap;

use insitubatch_actors::transform::{Standardize, Values};
use insitubatch_actors::{Batch, BatchArray, EngineError};
use insitubatch_store::DType;

use crate::InSituDataset;

/// The statistics of one batch array over a split: one entry per index along `axis` (an inner
/// axis of the samples, 0 the first after the sample axis), or a single entry for the whole
/// sample when `axis` is `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct Statistics {
    /// The inner axis the entries run along, or `None` for one entry over whole samples.
    pub axis: Option<usize>,
    /// Values that are not NaN.
    pub count: Vec<u64>,
    /// NaN values (left out of the rest).
    pub nan_count: Vec<u64>,
    /// Mean of the values (NaN where there are none).
    pub mean: Vec<f64>,
    /// Population standard deviation (divided by the count, as numpy's default `ddof=0`).
    pub std: Vec<f64>,
    /// Least value (NaN where there are none).
    pub min: Vec<f64>,
    /// Greatest value (NaN where there are none).
    pub max: Vec<f64>,
    /// The probabilities asked for (empty unless quantiles were asked for).
    pub quantiles: Vec<f64>,
    /// Per index, the value at each of `quantiles` (numpy's default, linear between the order
    /// statistics around it), within 1/256 of it (relative; the least and greatest exact); NaN
    /// where there are no values.
    pub quantile_values: Vec<Vec<f64>>,
}

impl Statistics {
    /// The `Standardize` chunk transform these statistics describe (one mean and spread, or one
    /// per index along the same axis): `(x - mean) / std`. An error where a spread is zero or
    /// not finite (a constant field, an index without values), which nothing can standardize.
    pub fn standardize(&self) -> Result<Standardize, EngineError> {
        if let Some(bad) = self.std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(EngineError::arg(
                "std",
                bad,
                "standardizing needs a positive, finite spread at every index (a constant or \
                 empty index has none)",
            ));
        }
        let values = |v: &[f64]| match self.axis {
            None => Values::One(v[0]),
            Some(_) => Values::PerIndex(v.to_vec()),
        };
        Ok(Standardize {
            mean: values(&self.mean),
            std: values(&self.std),
            axis: self.axis,
        })
    }

    /// As JSON: `{"axis", "count", "nan_count", "mean", "std", "min", "max"}`, lists of one
    /// value per index (NaN, which JSON lacks, as null), and with quantiles `"quantiles"` (the
    /// probabilities) and `"quantile_values"` (per index, a list of one value per probability).
    pub fn to_json(&self) -> serde_json::Value {
        let floats = |v: &[f64]| -> Vec<serde_json::Value> {
            v.iter()
                .map(|x| {
                    serde_json::Number::from_f64(*x).map_or(serde_json::Value::Null, Into::into)
                })
                .collect()
        };
        let mut out = serde_json::json!({
            "axis": self.axis,
            "count": self.count,
            "nan_count": self.nan_count,
            "mean": floats(&self.mean),
            "std": floats(&self.std),
            "min": floats(&self.min),
            "max": floats(&self.max),
        });
        if !self.quantiles.is_empty() {
            out["quantiles"] = floats(&self.quantiles).into();
            out["quantile_values"] = self
                .quantile_values
                .iter()
                .map(|v| serde_json::Value::from(floats(v)))
                .collect();
        }
        out
    }
}

/// Mantissa bits kept per bucket: 128 buckets per power of two.
const SKETCH_BITS: u32 = 7;

/// A histogram of values in log-linear buckets, for quantiles: the buckets are the values'
/// `f64` bit patterns cut to sign, exponent and the top [`SKETCH_BITS`] of the mantissa,
/// ordered as the values are (negative ones with their bits inverted), so each covers 1/128 of
/// a power of two and a value is known to 1/256 of itself from its bucket's middle. Kept as one
/// block of 128 counts per (sign, exponent) the values reach, found through a table of the
/// 4,096 (sign, exponent) pairs (8 KB).
#[derive(Clone, Debug)]
struct Sketch {
    /// Per (sign, exponent), 1 + its block's place in `blocks`, or 0 while no value had it.
    index: Box<[u16; 1 << 12]>,
    blocks: Vec<[u64; 1 << SKETCH_BITS]>,
    n: u64,
}

impl Default for Sketch {
    fn default() -> Self {
        Self {
            index: Box::new([0; 1 << 12]),
            blocks: Vec::new(),
            n: 0,
        }
    }
}

impl Sketch {
    /// Bits below a bucket.
    const SHIFT: u32 = 64 - 12 - SKETCH_BITS;

    /// The bucket of `v` (not NaN), in the values' order.
    fn bucket(v: f64) -> u64 {
        let bits = v.to_bits();
        let key = if bits >> 63 == 1 {
            !bits
        } else {
            bits | 1 << 63
        };
        key >> Self::SHIFT
    }

    /// The value in the middle of bucket `b`.
    fn middle(b: u64) -> f64 {
        let key = (b << Self::SHIFT) | (1 << (Self::SHIFT - 1));
        let bits = if key >> 63 == 1 {
            key & !(1 << 63)
        } else {
            !key
        };
        let v = f64::from_bits(bits);
        // The buckets of the least exponent hold zero (and the subnormals, within 2^-1022 of
        // it); those of the largest the infinities (NaN is never counted).
        if (bits >> 52) & 0x7ff == 0 {
            0.0
        } else if v.is_nan() {
            if bits >> 63 == 1 {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            }
        } else {
            v
        }
    }

    fn add(&mut self, v: f64) {
        if v.is_nan() {
            return;
        }
        let b = Self::bucket(v);
        let (block, slot) = (
            (b >> SKETCH_BITS) as usize,
            (b & ((1 << SKETCH_BITS) - 1)) as usize,
        );
        let at = &mut self.index[block];
        if *at == 0 {
            self.blocks.push([0; 1 << SKETCH_BITS]);
            *at = self.blocks.len() as u16;
        }
        self.blocks[usize::from(*at) - 1][slot] += 1;
        self.n += 1;
    }

    /// The middle of the bucket holding the `rank`-th value in order (from 0). (Placing it in
    /// the bucket by its rank among the bucket's values, as if they were spread evenly, was
    /// closer on smooth fields but up to a whole bucket off where a bucket holds few values.)
    fn at_rank(&self, rank: u64) -> f64 {
        let mut seen = 0u64;
        for (id, &at) in self.index.iter().enumerate() {
            let Some(block) = usize::from(at).checked_sub(1).map(|b| &self.blocks[b]) else {
                continue;
            };
            for (j, &c) in block.iter().enumerate() {
                seen += c;
                if seen > rank {
                    return Self::middle(((id as u64) << SKETCH_BITS) | j as u64);
                }
            }
        }
        f64::NAN
    }

    /// The value at probability `q` as numpy's default computes it (linear between the order
    /// statistics at `q * (n - 1)`), each from its bucket, kept within `[min, max]`.
    fn quantile(&self, q: f64, (min, max): (f64, f64)) -> f64 {
        if self.n == 0 {
            return f64::NAN;
        }
        let h = q * (self.n - 1) as f64;
        let (lo, frac) = (h.floor(), h - h.floor());
        let a = self.at_rank(lo as u64);
        let v = if frac > 0.0 {
            let b = self.at_rank(lo as u64 + 1);
            a + (b - a) * frac
        } else {
            a
        };
        // The extremes are known exactly.
        if q <= 0.0 {
            min
        } else if q >= 1.0 {
            max
        } else {
            v.clamp(min, max)
        }
    }
}

/// Running moments of one index.
#[derive(Clone, Copy, Debug)]
struct Moments {
    n: u64,
    nan: u64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
}

impl Moments {
    const EMPTY: Moments = Moments {
        n: 0,
        nan: 0,
        mean: 0.0,
        m2: 0.0,
        min: f64::INFINITY,
        max: f64::NEG_INFINITY,
    };

    /// The moments of `n` values (and `nan` NaN) from their sums of differences from a shift
    /// `c`: `s1` of the differences, `s2` of their squares.
    fn from_shifted(c: f64, n: u64, nan: u64, s1: f64, s2: f64, min: f64, max: f64) -> Moments {
        if n == 0 {
            return Moments {
                nan,
                ..Moments::EMPTY
            };
        }
        let mean_shift = s1 / n as f64;
        Moments {
            n,
            nan,
            mean: c + mean_shift,
            // The squared deviations from the mean: s2 - n * shift², never below zero.
            m2: (s2 - s1 * mean_shift).max(0.0),
            min,
            max,
        }
    }

    /// Chan et al.'s pairwise merge.
    fn merge(&mut self, o: &Moments) {
        self.nan += o.nan;
        if o.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = Moments {
                nan: self.nan,
                ..*o
            };
            return;
        }
        let n = self.n + o.n;
        let delta = o.mean - self.mean;
        self.mean += delta * o.n as f64 / n as f64;
        self.m2 += o.m2 + delta * delta * (self.n as f64 * o.n as f64 / n as f64);
        self.n = n;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }
}

/// Independent partial sums per pass: they break the chain of dependent additions, so the
/// compiler keeps several in flight (and in vector registers).
const LANES: usize = 8;

/// The moments of `run`'s values (NaN left out and counted) in one pass, as sums of their
/// differences from a shift `c`, the run's first value that is not NaN: with `c` inside the
/// run's range, the sum of squares does not dwarf the variance the way it would from zero (a
/// field in kelvin has values near 280 and a spread of a few), so subtracting the squared
/// mean loses no digits that matter. `f` reads one element as `f64`.
fn moments<T: Copy>(run: &[T], f: impl Fn(T) -> f64 + Copy) -> Moments {
    let Some(c) = run.iter().map(|&x| f(x)).find(|v| !v.is_nan()) else {
        return Moments {
            nan: run.len() as u64,
            ..Moments::EMPTY
        };
    };
    let (mut n, mut s1, mut s2) = ([0u64; LANES], [0.0f64; LANES], [0.0f64; LANES]);
    let (mut min, mut max) = ([f64::INFINITY; LANES], [f64::NEG_INFINITY; LANES]);
    // A NaN adds nothing, counts nothing, and compares false (written as selects, these
    // compile to the processor's min and max instructions).
    let mut take = |l: usize, v: f64| {
        let ok = !v.is_nan();
        let d = if ok { v - c } else { 0.0 };
        n[l] += u64::from(ok);
        s1[l] += d;
        s2[l] += d * d;
        min[l] = if v < min[l] { v } else { min[l] };
        max[l] = if v > max[l] { v } else { max[l] };
    };
    let lanes = run.chunks_exact(LANES);
    let rest = lanes.remainder();
    for (i, chunk) in lanes.enumerate() {
        prefetch(
            run.as_ptr()
                .cast::<u8>()
                .wrapping_add((i * LANES) * std::mem::size_of::<T>() + PREFETCH_AHEAD),
        );
        for (l, &x) in chunk.iter().enumerate() {
            take(l, f(x));
        }
    }
    for &x in rest {
        take(0, f(x));
    }
    let n: u64 = n.iter().sum();
    Moments::from_shifted(
        c,
        n,
        run.len() as u64 - n,
        s1.iter().sum(),
        s2.iter().sum(),
        min.iter().copied().fold(f64::INFINITY, f64::min),
        max.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

/// Runs shorter than this many values are summed per index over a whole batch
/// ([`Accumulator::add_short_runs`]) rather than reduced and merged one by one.
const SHORT_RUN: usize = 64;

/// How far ahead of the values being read [`moments`] asks for memory. A batch was written by
/// the gather on another core moments before, and the hardware prefetcher alone did not keep
/// up here: asking 4 KB ahead doubled the rate on the family's 181 x 360 fields
/// (`bench/statistics.py`).
const PREFETCH_AHEAD: usize = 4096;

/// Asks for the cache line at `p` to be loaded (a hint: any address is allowed, none faults).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults, whatever the address; SSE is part of
    // the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// An IEEE 754 half-precision value.
fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f64::from(h & 0x3ff);
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

/// The accumulator of one batch array: running moments per index along the axis.
pub(crate) struct Accumulator {
    /// The inner axis the indices run along (`None`: one index, whole samples).
    axis: Option<usize>,
    dtype: DType,
    /// Elements before the axis, along it, and after it, in one sample.
    outer: usize,
    len: usize,
    inner: usize,
    moments: Vec<Moments>,
    /// The probabilities of the quantiles asked for, and per index the histogram they are
    /// read from (both empty without).
    quantiles: Vec<f64>,
    sketches: Vec<Sketch>,
}

impl Accumulator {
    /// For the batch array `name` of rows shaped `row` (a sample, or a stack's channels and
    /// sample), per index along inner axis `axis`.
    pub(crate) fn new(
        name: &str,
        dtype: DType,
        row: &[usize],
        axis: Option<usize>,
    ) -> Result<Self, EngineError> {
        if matches!(dtype, DType::Complex64 | DType::Complex128) {
            return Err(EngineError::arg(
                "statistics",
                name,
                format!(
                    "`{name}` is {}: a mean and a spread need real numbers",
                    dtype.name()
                ),
            ));
        }
        let (outer, len, inner) = match axis {
            None => (1, 1, row.iter().product()),
            Some(k) if k < row.len() => (
                row[..k].iter().product(),
                row[k],
                row[k + 1..].iter().product(),
            ),
            Some(k) => {
                return Err(EngineError::arg(
                    "axis",
                    k,
                    format!(
                        "`{name}`'s rows have {} axes ({row:?}); axis 0 is the first after the \
                         sample axis",
                        row.len()
                    ),
                ));
            }
        };
        Ok(Self {
            axis,
            dtype,
            outer,
            len,
            inner,
            moments: vec![Moments::EMPTY; len],
            quantiles: Vec::new(),
            sketches: Vec::new(),
        })
    }

    /// Keeps the quantiles at probabilities `quantiles` too (checked by the caller).
    fn keep_quantiles(&mut self, quantiles: &[f64]) {
        if !quantiles.is_empty() {
            self.quantiles = quantiles.to_vec();
            self.sketches = vec![Sketch::default(); self.len];
        }
    }

    /// Adds every row of `array`.
    pub(crate) fn add(&mut self, array: &BatchArray) {
        macro_rules! typed {
            ($t:ty) => {
                self.add_values(array.values::<$t>().expect("the array's own dtype"), |x| {
                    x as f64
                })
            };
        }
        match self.dtype {
            DType::Float32 => typed!(f32),
            DType::Float64 => typed!(f64),
            DType::Int8 => typed!(i8),
            DType::Int16 => typed!(i16),
            DType::Int32 => typed!(i32),
            DType::Int64 => typed!(i64),
            DType::Uint8 => typed!(u8),
            DType::Uint16 => typed!(u16),
            DType::Uint32 => typed!(u32),
            DType::Uint64 => typed!(u64),
            DType::Bool => self.add_values(array.bytes(), f64::from),
            DType::Float16 => {
                let halves: Vec<u16> = array
                    .bytes()
                    .chunks_exact(2)
                    .map(|b| u16::from_ne_bytes([b[0], b[1]]))
                    .collect();
                self.add_values(&halves, f16_to_f64);
            }
            DType::Complex64 | DType::Complex128 => unreachable!("refused by `new`"),
        }
    }

    fn add_values<T: Copy>(&mut self, values: &[T], f: impl Fn(T) -> f64 + Copy) {
        let row = self.outer * self.len * self.inner;
        let rows = values.len() / row.max(1);
        if self.inner < SHORT_RUN {
            return self.add_short_runs(values, rows, f);
        }
        // Run by run, in memory order (a whole sample of a 181 x 360 float32 field is one run
        // of 260 KB), each run's moments merged into its index's.
        for r in 0..rows {
            for o in 0..self.outer {
                for (j, m) in self.moments.iter_mut().enumerate() {
                    let at = ((r * self.outer + o) * self.len + j) * self.inner;
                    let run = &values[at..at + self.inner];
                    m.merge(&moments(run, f));
                    // Again while the run is in cache.
                    if let Some(sketch) = self.sketches.get_mut(j) {
                        run.iter().for_each(|&x| sketch.add(f(x)));
                    }
                }
            }
        }
    }

    /// [`Accumulator::add_values`] where runs are a few values long (an axis near the end of
    /// the row: per longitude, or per variable of a `(..., variable)` layout): a merge per run
    /// would cost more than the run. Each index keeps sums of differences from a shift of its
    /// own (its first value in the batch that is not NaN) over the whole batch, walked in
    /// memory order, and the batch's moments are merged once per index.
    fn add_short_runs<T: Copy>(&mut self, values: &[T], rows: usize, f: impl Fn(T) -> f64 + Copy) {
        let (len, inner) = (self.len, self.inner);
        let runs = rows * self.outer; // of `len * inner` values each
        let mut shift = vec![f64::NAN; len];
        let mut missing = len;
        for run in 0..runs {
            for (j, c) in shift.iter_mut().enumerate() {
                if c.is_nan() {
                    let at = (run * len + j) * inner;
                    if let Some(v) = values[at..at + inner]
                        .iter()
                        .map(|&x| f(x))
                        .find(|v| !v.is_nan())
                    {
                        *c = v;
                        missing -= 1;
                    }
                }
            }
            if missing == 0 {
                break;
            }
        }
        // Per index: values, NaN, sums of the differences from its shift and of their
        // squares, least and greatest.
        let mut acc = vec![(0u64, 0u64, 0.0f64, 0.0f64, f64::INFINITY, f64::NEG_INFINITY); len];
        for run in 0..runs {
            let block = &values[run * len * inner..(run + 1) * len * inner];
            for (j, part) in block.chunks_exact(inner).enumerate() {
                if let Some(sketch) = self.sketches.get_mut(j) {
                    part.iter().for_each(|&x| sketch.add(f(x)));
                }
                let ((n, nan, s1, s2, min, max), c) = (&mut acc[j], shift[j]);
                for &x in part {
                    let v = f(x);
                    if v.is_nan() {
                        *nan += 1;
                    } else {
                        let d = v - c;
                        *n += 1;
                        *s1 += d;
                        *s2 += d * d;
                        *min = if v < *min { v } else { *min };
                        *max = if v > *max { v } else { *max };
                    }
                }
            }
        }
        for ((m, &(n, nan, s1, s2, min, max)), &c) in self.moments.iter_mut().zip(&acc).zip(&shift)
        {
            m.merge(&Moments::from_shifted(c, n, nan, s1, s2, min, max));
        }
    }

    pub(crate) fn finish(&self) -> Statistics {
        let m = &self.moments;
        let or_nan = |n: u64, v: f64| if n == 0 { f64::NAN } else { v };
        Statistics {
            axis: self.axis,
            count: m.iter().map(|m| m.n).collect(),
            nan_count: m.iter().map(|m| m.nan).collect(),
            mean: m.iter().map(|m| or_nan(m.n, m.mean)).collect(),
            std: m
                .iter()
                .map(|m| or_nan(m.n, (m.m2 / m.n.max(1) as f64).sqrt()))
                .collect(),
            min: m.iter().map(|m| or_nan(m.n, m.min)).collect(),
            max: m.iter().map(|m| or_nan(m.n, m.max)).collect(),
            quantiles: self.quantiles.clone(),
            quantile_values: self
                .sketches
                .iter()
                .zip(m)
                .map(|(sk, m)| {
                    let q = |q: f64| sk.quantile(q, (m.min, m.max));
                    self.quantiles.iter().map(|&p| q(p)).collect()
                })
                .collect(),
        }
    }
}

/// The most quantiles one accumulator keeps.
const MAX_QUANTILES: usize = 64;

/// Statistics accumulated batch by batch, for a loop that iterates the batches itself (the
/// C API and Python feed it each batch they receive); [`InSituDataset::statistics`] runs an
/// epoch through one.
pub struct StatisticsAccumulator {
    /// Each array's moments.
    arrays: BTreeMap<String, Accumulator>,
}

impl StatisticsAccumulator {
    /// For the batch arrays of `ds` (each label's, each stack's), per index along inner axis
    /// `axis` (0 is the first after the sample axis: per level, or a stack's channels), or over
    /// whole samples with `None`. An array whose rows lack the axis (a scalar series beside
    /// fields) is taken over whole samples, and its statistics say `axis` none; an axis no
    /// array has, and complex arrays, are errors.
    pub fn new(ds: &InSituDataset, axis: Option<usize>) -> Result<Self, EngineError> {
        let specs = ds.batch_arrays();
        let rows: Vec<Vec<usize>> = specs
            .iter()
            .map(|s| s.row_shape.iter().map(|&d| d as usize).collect())
            .collect();
        let deepest = rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut arrays = BTreeMap::new();
        for (spec, row) in specs.iter().zip(&rows) {
            // Past every array's axes the first one's error says what the rows are.
            let own = axis.filter(|&k| k < row.len() || k >= deepest);
            let a = Accumulator::new(&spec.name, spec.dtype, row, own)?;
            arrays.insert(spec.name.clone(), a);
        }
        Ok(Self { arrays })
    }

    /// Keeps the quantiles at probabilities `quantiles` too (each in `[0, 1]`; at most 64):
    /// [`Statistics::quantile_values`]. An error names a probability out of range.
    pub fn with_quantiles(mut self, quantiles: &[f64]) -> Result<Self, EngineError> {
        if quantiles.len() > MAX_QUANTILES {
            return Err(EngineError::arg(
                "quantiles",
                quantiles.len(),
                format!("ask for at most {MAX_QUANTILES} quantiles at once"),
            ));
        }
        if let Some(bad) = quantiles.iter().find(|q| !(0.0..=1.0).contains(*q)) {
            return Err(EngineError::arg(
                "quantiles",
                bad,
                "a quantile's probability is between 0 and 1 (0.99 for the 99th percentile)",
            ));
        }
        for a in self.arrays.values_mut() {
            a.keep_quantiles(quantiles);
        }
        Ok(self)
    }

    /// Adds every row of `batch` (a batch of the dataset this was made for: an array of another
    /// shape or type is an error naming it, and nothing is added).
    pub fn add(&mut self, batch: &Batch) -> Result<(), EngineError> {
        for (name, array) in batch.arrays() {
            let foreign = |what: String| {
                EngineError::arg(
                    "batch",
                    name,
                    format!("{what}: add batches of the dataset the statistics were made for"),
                )
            };
            let a = self
                .arrays
                .get(name)
                .ok_or_else(|| foreign("the dataset's batches hold no such array".into()))?;
            let row = a.outer * a.len * a.inner;
            if array.dtype() != a.dtype || array.shape()[1..].iter().product::<usize>() != row {
                return Err(foreign(format!(
                    "`{name}` is {} {:?} here, not rows of {row} {} elements",
                    array.dtype().name(),
                    array.shape(),
                    a.dtype.name()
                )));
            }
        }
        for (name, array) in batch.arrays() {
            if let Some(a) = self.arrays.get_mut(name) {
                a.add(array);
            }
        }
        Ok(())
    }

    /// The statistics so far, by batch array name.
    pub fn finish(&self) -> BTreeMap<String, Statistics> {
        self.arrays
            .iter()
            .map(|(name, a)| (name.clone(), a.finish()))
            .collect()
    }

    /// [`StatisticsAccumulator::finish`] as JSON, an object by array name.
    pub fn to_json(&self) -> serde_json::Value {
        self.finish()
            .into_iter()
            .map(|(name, s)| (name, s.to_json()))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

impl InSituDataset {
    /// The statistics of every batch array (each label's, each stack's) over one epoch of
    /// `split` as this dataset yields it (its stride, ranks and `drop_last` included): per
    /// index along inner axis `axis` (0 is the first axis after the sample axis: per level, or
    /// per channel of a stack), or over whole samples with `None`. The values are those the
    /// batches hold, after chunk transforms: fit a `Standardize` on a dataset without it.
    ///
    /// ```
    /// use insitubatch::synth::{SynthSpec, make_dataset};
    /// use insitubatch::{InSituDataset, Snap, sample_ranges, split_by_ranges, SampleBound};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("isb-stats-doc-{}", std::process::id()));
    /// # let store = dir.join("era5.zarr");
    /// # make_dataset(&store, &SynthSpec { samples: 40, grid: (9, 16), sample_chunk: 4,
    /// #     ..Default::default() }, true, &|_, _| {})?;
    /// // Six-hourly fields from 1979-01-01: train on the first week, validate on the next day.
    /// let probe = InSituDataset::builder(&store).variable("t2m", "t2m").build()?;
    /// let geom = &probe.variables()[0].geom;
    /// let date = |d: &str| SampleBound::Time(d.to_string());
    /// let periods = [
    ///     ("train".to_string(), date("1979-01-01"), date("1979-01-08")),
    ///     ("val".to_string(), date("1979-01-08"), date("1979-01-09")),
    /// ];
    /// let ranges = sample_ranges(&store, geom, &periods, &[])?;
    /// assert_eq!(ranges[0].1, 0..28);
    /// let ranges: Vec<(&str, std::ops::Range<u64>)> =
    ///     ranges.iter().map(|(n, r)| (n.as_str(), r.clone())).collect();
    /// let manifest = split_by_ranges(geom, &ranges, Snap::Exact)?;
    ///
    /// // Per-latitude statistics of the training week, then a dataset standardized by them.
    /// let raw = InSituDataset::builder(&store)
    ///     .variable("t2m", "t2m")
    ///     .manifest(manifest.clone())
    ///     .build()?;
    /// let fitted = raw.statistics("train", Some(0))?;
    /// assert_eq!(fitted["t2m"].count, vec![28 * 16; 9]);
    /// let ds = InSituDataset::builder(&store)
    ///     .variable("t2m", "t2m")
    ///     .manifest(manifest)
    ///     .chunk_transform_for(["t2m"], fitted["t2m"].standardize()?)
    ///     .build()?;
    /// let after = &ds.statistics("train", Some(0))?["t2m"];
    /// assert!(after.mean.iter().all(|m| m.abs() < 1e-5));
    /// assert!(after.std.iter().all(|s| (s - 1.0).abs() < 1e-5));
    /// # drop((raw, probe, ds));
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub fn statistics(
        &self,
        split: &str,
        axis: Option<usize>,
    ) -> Result<BTreeMap<String, Statistics>, EngineError> {
        self.statistics_with_quantiles(split, axis, &[])
    }

    /// [`InSituDataset::statistics`] with the quantiles at probabilities `quantiles` too (each
    /// in `[0, 1]`, at most 64: `[0.01, 0.99]` for robust bounds to clip to), from a histogram
    /// of every value, within 1/256 of numpy's (relative; the least and greatest exact):
    /// [`Statistics::quantile_values`].
    pub fn statistics_with_quantiles(
        &self,
        split: &str,
        axis: Option<usize>,
        quantiles: &[f64],
    ) -> Result<BTreeMap<String, Statistics>, EngineError> {
        let mut acc = StatisticsAccumulator::new(self, axis)?.with_quantiles(quantiles)?;
        for batch in self.iter(split)? {
            acc.add(&batch?)?;
        }
        Ok(acc.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_moments_are_those_of_all_the_values() {
        // Temperatures in kelvin: a large mean against a small spread.
        let values: Vec<f64> = (0..1000)
            .map(|i| 280.0 + ((i * 37) % 101) as f64 * 0.01)
            .collect();
        let whole = moments(&values, |v| v);
        let mut merged = Moments::EMPTY;
        for part in values.chunks(7) {
            merged.merge(&moments(part, |v| v));
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        for m in [whole, merged] {
            assert_eq!(m.n, 1000);
            assert!((m.mean - mean).abs() < 1e-9, "{m:?}");
            assert!((m.m2 / n - var).abs() < 1e-9 * var, "{m:?} {var}");
        }
        // A mean a hundred million times the spread: the shift keeps the variance.
        let far: Vec<f64> = (0..1000)
            .map(|i| 1e6 + ((i * 37) % 101) as f64 * 1e-4)
            .collect();
        let mean = far.iter().sum::<f64>() / 1000.0;
        let var = far.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 1000.0;
        let mut merged = Moments::EMPTY;
        for part in far.chunks(13) {
            merged.merge(&moments(part, |v| v));
        }
        assert!(
            (merged.m2 / 1000.0 - var).abs() < 1e-6 * var,
            "{merged:?} {var}"
        );
        let with_nan = moments(&[1.0, f64::NAN, 3.0], |v| v);
        assert_eq!((with_nan.n, with_nan.nan, with_nan.mean), (2, 1, 2.0));
        assert_eq!((with_nan.min, with_nan.max), (1.0, 3.0));
    }

    #[test]
    fn quantiles_from_the_sketch_are_numpys_within_a_bucket() {
        // Values of both signs over several powers of two, zeros, repeats and an infinity.
        let mut values: Vec<f64> = (0..20_000)
            .map(|i| {
                let x = ((i * 7919) % 10_007) as f64 / 10_007.0;
                (x - 0.3) * 1000.0 * (1.0 + (i % 13) as f64)
            })
            .collect();
        values.extend([0.0, 0.0, -0.0, 5.0, 5.0, 5.0, f64::INFINITY]);
        let mut sketch = Sketch::default();
        values.iter().for_each(|&v| sketch.add(v));
        sketch.add(f64::NAN);
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        let (min, max) = (sorted[0], *sorted.last().unwrap());
        let n = sorted.len();
        for q in [0.0, 0.001, 0.01, 0.25, 0.3, 0.5, 0.75, 0.99, 0.999, 1.0] {
            // numpy's default: linear between the order statistics around q * (n - 1).
            let h = q * (n - 1) as f64;
            let (lo, frac) = (h.floor() as usize, h - h.floor());
            let want = if frac > 0.0 {
                sorted[lo] + (sorted[lo + 1] - sorted[lo]) * frac
            } else {
                sorted[lo]
            };
            let got = sketch.quantile(q, (min, max));
            let tolerance = want.abs() / 256.0 + 1e-12;
            let close = got == want || (got - want).abs() <= tolerance;
            assert!(close, "q {q}: {got} against {want}");
        }
        assert_eq!(sketch.quantile(1.0, (min, max)), f64::INFINITY);
        assert_eq!(sketch.quantile(0.0, (min, max)), min);
        // The buckets keep the values' order, so the middle of each is inside it.
        for v in [-3.5e10, -1.0, -1e-300, 0.0, 1e-300, 0.75, 1.0, 2.0, 1e300] {
            let m = Sketch::middle(Sketch::bucket(v));
            assert!((m - v).abs() <= v.abs() / 256.0, "{v}: {m}");
            assert_eq!(Sketch::bucket(m), Sketch::bucket(v), "{v}");
        }
        // Zero is exact (a field half of zeros, precipitation, has a median of 0).
        assert_eq!(Sketch::middle(Sketch::bucket(0.0)), 0.0);
        assert!(
            Sketch::default()
                .quantile(0.5, (f64::NAN, f64::NAN))
                .is_nan()
        );
    }

    #[test]
    fn half_precision_values_convert_exactly() {
        for (bits, want) in [
            (0x3c00u16, 1.0),
            (0xc000, -2.0),
            (0x7bff, 65504.0),
            (0x0001, 2f64.powi(-24)),
            (0x3555, 0.333_251_953_125),
        ] {
            assert_eq!(f16_to_f64(bits), want, "{bits:#x}");
        }
        assert!(f16_to_f64(0x7e00).is_nan());
        assert_eq!(f16_to_f64(0xfc00), f64::NEG_INFINITY);
    }
}
