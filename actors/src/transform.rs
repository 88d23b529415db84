//! Chunk transforms: deterministic work the decoder runs on each decoded chunk before the pool
//! holds it, so that every sample drawn from the chunk, in this epoch and every later one (and,
//! with a persistent cache directory, every later run), gets it for free.
//!
//! A transform sees one array's chunk at a time, assembled sample-first
//! (`[samples_per_chunk, *inner_shape]`, C order) whatever the array's physical axis order and
//! inner chunking, and changes it in place (scaling, standardisation, unit conversion, NaN
//! repair, clipping) or replaces it with another inner shape or element type (a cast, a coarser
//! grid), which it declares up front so that the pool, the cache and batches are sized by it; the
//! sample axis is the engine's and never changes. It runs on every chunk of every array in its scope, including fill-value
//! chunks and the stand-ins `on_bad_chunk = "nan"` delivers (so `fill_nan` can repair them), and
//! never on a chunk revived from the cache (that chunk was transformed when it was written).
//!
//! Transforms are declared in one ordered list; an entry without a scope runs on every array,
//! one with `applies` only on the arrays (paths, not labels) it names. An array's pipeline is
//! the list filtered by scope, and its identity — every step's kind and full parameters — is the
//! array's cache fingerprint: change a parameter and the arrays it applies to are stale, the
//! others stay valid.
//!
//! Built-ins, as JSON (the C config's and Python's `chunk_transforms`):
//!
//! ```json
//! [
//!   {"type": "affine", "scale": 1.0, "offset": -273.15, "applies": ["t2m"]},
//!   {"type": "standardize", "mean": [280.1, 250.3], "std": [12.0, 9.5], "axis": 0},
//!   {"type": "fill_nan", "value": 0.0},
//!   {"type": "clip", "min": -5.0, "max": 5.0},
//!   {"type": "cast", "dtype": "float32"},
//!   {"type": "coarsen", "factors": [2, 2]},
//!   {"type": "regrid", "axes": [0, 1], "src": [[90.0, 0.0, -90.0], [0.0, 180.0]],
//!    "dst": [[45.0, -45.0], [90.0]]}
//! ]
//! ```
//!
//! `axis` (of `affine` and `standardize`) names an inner axis (0 is the first axis after the
//! sample axis is taken out, physical order otherwise) along which the parameters are lists, one
//! value per index: per-level statistics of a 3-D field. Arithmetic is in the element type
//! (`float32` or `float64`; `cast` an integer array first), exactly as numpy computes `x *
//! float32(scale) + float32(offset)` and `(x - float32(mean)) / float32(std)`. `cast` converts
//! as numpy's `astype` does; `coarsen` takes block means (summed in f64) with one factor per
//! inner axis and drops the elements past the last whole block of an axis; `regrid`
//! interpolates linearly along two inner axes in turn, each pass as `numpy.interp` does, or
//! with `"method": "nearest"` copies the value at the nearest source coordinate (any element
//! type: masks, categories), or with `"method": "conservative"` takes each target cell's
//! area-weighted mean of the source cells it overlaps (`"sphere": true` for latitude and
//! longitude in degrees). Each
//! step's [`ChunkTransform::output`] says what it makes of its input, or refuses it, when the
//! dataset is built.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use insitubatch_store::DType;
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::tile::next_index;

/// One decoded chunk on its way through an array's transforms.
#[derive(Clone, Debug, PartialEq)]
pub struct Chunk {
    /// The path of the array the chunk belongs to.
    pub array: String,
    /// The chunk's index along the sample axis: its first row is sample `index * shape[0]`.
    pub index: u64,
    /// `[samples_per_chunk, *inner_shape]`, sample axis first, C order. The last chunk of an
    /// array is full size too; its rows past the end are never emitted.
    pub shape: Vec<u64>,
    /// The element type.
    pub dtype: DType,
    /// The elements, native-endian.
    pub bytes: Vec<u8>,
}

/// A deterministic per-chunk transform.
///
/// The result is cached with the chunk, so `apply` must depend on nothing but the chunk and the
/// transform's parameters, and [`identity`](Self::identity) must change whenever a parameter
/// does: it is the cache fingerprint, and a transform whose identity stays while its output
/// changes makes a persisted cache serve the old output.
///
/// A transform of your own, for float32 arrays:
///
/// ```
/// use insitubatch_actors::transform::{Chunk, ChunkTransform};
/// use insitubatch_store::DType;
///
/// /// Relative humidity in percent to a fraction, capped at 1.
/// #[derive(Debug)]
/// struct PercentToFraction;
///
/// impl ChunkTransform for PercentToFraction {
///     fn kind(&self) -> &'static str {
///         "percent_to_fraction"
///     }
///     fn identity(&self) -> String {
///         "percent_to_fraction v1".into() // no parameters; bump the version if `apply` changes
///     }
///     fn output(&self, inner: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String> {
///         match dtype {
///             DType::Float32 => Ok((inner.to_vec(), dtype)),
///             other => Err(format!("needs float32, not {}", other.name())),
///         }
///     }
///     fn apply(&self, chunk: &mut Chunk) -> Result<(), String> {
///         for b in chunk.bytes.chunks_exact_mut(4) {
///             let x = f32::from_ne_bytes(b.try_into().unwrap());
///             b.copy_from_slice(&(x / 100.0).min(1.0).to_ne_bytes());
///         }
///         Ok(())
///     }
/// }
///
/// let mut chunk = Chunk {
///     array: "rh".into(),
///     index: 0,
///     shape: vec![1, 2],
///     dtype: DType::Float32,
///     bytes: [55.0f32, 120.0].iter().flat_map(|x| x.to_ne_bytes()).collect(),
/// };
/// PercentToFraction.apply(&mut chunk).unwrap();
/// assert_eq!(chunk.bytes[..4], 0.55f32.to_ne_bytes());
/// assert_eq!(chunk.bytes[4..], 1.0f32.to_ne_bytes());
/// // A dataset takes it like a built-in:
/// // InSituDataset::builder(store).chunk_transform_for(["rh"], PercentToFraction)
/// ```
pub trait ChunkTransform: Send + Sync + fmt::Debug {
    /// A short name for messages (`"affine"`).
    fn kind(&self) -> &'static str;
    /// The kind and every parameter, exactly (floats to their last bit).
    fn identity(&self) -> String;
    /// The inner shape and element type this transform makes of chunks with `inner_shape` and
    /// `dtype` (its input unchanged for a shape- and type-preserving one), or why it cannot run
    /// on them. Called when the dataset is built, before any chunk is read; the pool and the
    /// cache size every slot by the last step's answer. The sample axis is the engine's: it is
    /// not in `inner_shape` and a transform cannot change it.
    fn output(&self, inner_shape: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String>;
    /// Transforms the chunk, in place or by replacing its bytes, shape and type with what
    /// [`output`](Self::output) promised. Whatever can be known when the dataset is built
    /// belongs in `output`; an error here (a callback into other code that failed) fails the
    /// pass, and so does a chunk that does not come out as promised, each with a message naming
    /// this transform, the array and the chunk (see [`Pipeline::apply`]).
    fn apply(&self, chunk: &mut Chunk) -> Result<(), String>;
}

/// A parameter given once for the whole chunk or once per index along an inner axis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Values {
    /// One value for every element.
    One(f64),
    /// One value per index along the transform's `axis`.
    PerIndex(Vec<f64>),
}

impl Values {
    fn len(&self) -> Option<usize> {
        match self {
            Values::One(_) => None,
            Values::PerIndex(v) => Some(v.len()),
        }
    }

    fn all(&self) -> &[f64] {
        match self {
            Values::One(v) => std::slice::from_ref(v),
            Values::PerIndex(v) => v,
        }
    }

    /// The value at index `i` along the axis (a single value serves every index).
    fn at(&self, i: usize) -> f64 {
        match self {
            Values::One(v) => *v,
            Values::PerIndex(v) => v[i],
        }
    }
}

impl From<f64> for Values {
    fn from(v: f64) -> Self {
        Values::One(v)
    }
}

impl From<Vec<f64>> for Values {
    fn from(v: Vec<f64>) -> Self {
        Values::PerIndex(v)
    }
}

/// `x * scale + offset` (unit conversion, a fixed normalisation).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Affine {
    /// Multiplier (default 1).
    #[serde(default = "one")]
    pub scale: Values,
    /// Added after scaling (default 0).
    #[serde(default = "zero")]
    pub offset: Values,
    /// The inner axis lists run along.
    #[serde(default)]
    pub axis: Option<usize>,
}

/// `(x - mean) / std` with statistics fitted beforehand (never per chunk).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Standardize {
    /// Mean.
    pub mean: Values,
    /// Standard deviation (positive and finite).
    pub std: Values,
    /// The inner axis lists run along.
    #[serde(default)]
    pub axis: Option<usize>,
}

/// NaN becomes `value` (repairs the holes `on_bad_chunk = "nan"` leaves).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FillNan {
    /// The replacement.
    pub value: f64,
}

/// Values below `min` become `min`, above `max` become `max`; NaN stays NaN (as `numpy.clip`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clip {
    /// Lower bound.
    pub min: f64,
    /// Upper bound (at least `min`).
    pub max: f64,
}

/// Converts every element to `dtype` (`float32` or `float64`) as numpy's `astype` does, so
/// that integer arrays can be scaled and float64 ones halved in memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cast {
    /// The element type after the cast.
    pub dtype: DType,
}

/// Block means over the inner axes: each output element is the mean of a block of
/// `factors[0] × factors[1] × ...` input elements (a coarser grid). Elements past the last
/// whole block of an axis are dropped, as xarray's `coarsen(..., boundary="trim")` does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Coarsen {
    /// One factor per inner axis (1 keeps an axis).
    pub factors: Vec<u64>,
}

fn one() -> Values {
    Values::One(1.0)
}

fn zero() -> Values {
    Values::One(0.0)
}

impl Affine {
    /// `x * scale + offset` over the whole chunk.
    pub fn new(scale: f64, offset: f64) -> Result<Self, String> {
        let t = Self {
            scale: scale.into(),
            offset: offset.into(),
            axis: None,
        };
        t.validate()?;
        Ok(t)
    }

    fn validate(&self) -> Result<(), String> {
        finite("scale", &self.scale)?;
        finite("offset", &self.offset)?;
        per_index_lengths(
            self.axis,
            &[("scale", &self.scale), ("offset", &self.offset)],
        )
    }
}

impl Standardize {
    /// `(x - mean) / std` over the whole chunk.
    pub fn new(mean: f64, std: f64) -> Result<Self, String> {
        Self::per_index(None, mean, std)
    }

    /// `(x - mean[i]) / std[i]` where `i` is the index along inner axis `axis` (or scalars).
    pub fn per_index(
        axis: Option<usize>,
        mean: impl Into<Values>,
        std: impl Into<Values>,
    ) -> Result<Self, String> {
        let t = Self {
            mean: mean.into(),
            std: std.into(),
            axis,
        };
        t.validate()?;
        Ok(t)
    }

    fn validate(&self) -> Result<(), String> {
        finite("mean", &self.mean)?;
        finite("std", &self.std)?;
        if let Some(s) = self.std.all().iter().find(|s| **s <= 0.0) {
            return Err(format!(
                "`std` must be positive, not {s}; a constant field has nothing to standardise \
                 (use affine with an offset)"
            ));
        }
        per_index_lengths(self.axis, &[("mean", &self.mean), ("std", &self.std)])
    }
}

impl FillNan {
    /// NaN becomes `value`.
    pub fn new(value: f64) -> Self {
        Self { value }
    }
}

impl Clip {
    /// Clamps to `[min, max]`.
    pub fn new(min: f64, max: f64) -> Result<Self, String> {
        let t = Self { min, max };
        t.validate()?;
        Ok(t)
    }

    fn validate(&self) -> Result<(), String> {
        if self.min.is_nan() || self.max.is_nan() {
            return Err("`min` and `max` must be numbers, not NaN".into());
        }
        if self.min > self.max {
            return Err(format!(
                "`min` ({}) is above `max` ({}); swap them",
                self.min, self.max
            ));
        }
        Ok(())
    }
}

impl Cast {
    /// A cast to `dtype`.
    pub fn new(dtype: DType) -> Result<Self, String> {
        let t = Self { dtype };
        t.validate()?;
        Ok(t)
    }

    fn validate(&self) -> Result<(), String> {
        match self.dtype {
            DType::Float32 | DType::Float64 => Ok(()),
            other => Err(format!(
                "casts to float32 or float64 are built, not to {}",
                other.name()
            )),
        }
    }
}

impl Coarsen {
    /// Block means with one factor per inner axis.
    pub fn new(factors: Vec<u64>) -> Result<Self, String> {
        let t = Self { factors };
        t.validate()?;
        Ok(t)
    }

    fn validate(&self) -> Result<(), String> {
        if self.factors.is_empty() || self.factors.contains(&0) {
            return Err(format!(
                "`factors` must be one positive integer per inner axis, not {:?}",
                self.factors
            ));
        }
        Ok(())
    }
}

fn finite(name: &str, v: &Values) -> Result<(), String> {
    match v.all().iter().find(|x| !x.is_finite()) {
        Some(x) => Err(format!("`{name}` must be finite, not {x}")),
        None => Ok(()),
    }
}

/// Lists need an axis, an axis needs a list, and the lists agree on their length.
fn per_index_lengths(axis: Option<usize>, params: &[(&str, &Values)]) -> Result<(), String> {
    let lists: Vec<(&str, usize)> = params
        .iter()
        .filter_map(|(n, v)| v.len().map(|l| (*n, l)))
        .collect();
    match (axis, lists.first()) {
        (None, Some((name, _))) => Err(format!(
            "`{name}` is a list, so `axis` must say which inner axis it runs along (0 is the \
             first axis after the sample axis)"
        )),
        (Some(a), None) => Err(format!(
            "`axis` = {a} is given but every parameter is a single number; give lists, one \
             value per index along the axis, or drop `axis`"
        )),
        (_, Some(&(first, len))) => match lists.iter().find(|(_, l)| *l != len) {
            Some((other, l)) => Err(format!(
                "`{first}` has {len} values but `{other}` has {l}; give one per index along \
                 the axis"
            )),
            None if len == 0 => Err(format!("`{first}` is an empty list")),
            None => Ok(()),
        },
        (None, None) => Ok(()),
    }
}

/// Float element types the built-ins compute in.
trait Float: Copy {
    const SIZE: usize;
    fn of(v: f64) -> Self;
    fn read(b: &[u8]) -> Self;
    fn write(self, b: &mut [u8]);
    fn to_f64(self) -> f64;
    fn write_to(self, out: &mut Vec<u8>);
}

macro_rules! float {
    ($t:ty) => {
        impl Float for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn of(v: f64) -> Self {
                v as $t
            }
            fn read(b: &[u8]) -> Self {
                <$t>::from_ne_bytes(b.try_into().expect("element width"))
            }
            fn write(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_ne_bytes())
            }
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
            fn write_to(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_ne_bytes())
            }
        }
    };
}
float!(f32);
float!(f64);

/// Runs `op(index along axis, elements)` over the chunk: the whole chunk as one run with index 0
/// when `axis` is `None`, else every run of elements that share an index along inner axis
/// `axis`.
fn runs<T: Float>(
    shape: &[u64],
    bytes: &mut [u8],
    axis: Option<usize>,
    mut op: impl FnMut(usize, &mut [T]),
) {
    let (lead, len, tail) = match axis {
        None => (1usize, 1usize, bytes.len() / T::SIZE),
        Some(a) => {
            // The sample axis is dim 0 of the chunk, inner axis `a` is dim `a + 1`.
            let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            let lead = dims[..=a].iter().product();
            let tail = dims[a + 2..].iter().product();
            (lead, dims[a + 1], tail)
        }
    };
    if lead * len * tail == 0 {
        return;
    }
    // SAFETY: every bit pattern is a valid f32 / f64, and `align_to_mut` only reinterprets the
    // aligned middle of the byte slice, which it borrows mutably for the closure's duration.
    let (head, elems, rest) = unsafe { bytes.align_to_mut::<T>() };
    if head.is_empty() && rest.is_empty() {
        for (i, run) in elems.chunks_exact_mut(tail).enumerate() {
            op(i % len, run);
        }
        debug_assert_eq!(elems.len(), lead * len * tail);
        return;
    }
    // A decoded buffer is always aligned in practice; this keeps a misaligned one correct.
    let mut copy: Vec<T> = bytes.chunks_exact(T::SIZE).map(T::read).collect();
    for (i, run) in copy.chunks_exact_mut(tail).enumerate() {
        op(i % len, run);
    }
    for (x, b) in copy.iter().zip(bytes.chunks_exact_mut(T::SIZE)) {
        x.write(b);
    }
}

/// The elements of `bytes`, borrowed when aligned (a decoded buffer always is in practice) and
/// copied when not.
fn elements<T: Float>(bytes: &[u8]) -> std::borrow::Cow<'_, [T]> {
    // SAFETY: every bit pattern is a valid f32 / f64; `align_to` only reinterprets the aligned
    // middle of the slice, borrowed for as long as `bytes` is.
    let (head, elems, rest) = unsafe { bytes.align_to::<T>() };
    if head.is_empty() && rest.is_empty() {
        std::borrow::Cow::Borrowed(elems)
    } else {
        std::borrow::Cow::Owned(bytes.chunks_exact(T::SIZE).map(T::read).collect())
    }
}

/// Per-index parameters in the element type: `values.at(i)` for every index along the axis.
fn params<T: Float>(v: &Values, axis_len: usize) -> Vec<T> {
    (0..axis_len.max(1)).map(|i| T::of(v.at(i))).collect()
}

fn axis_len(shape: &[u64], axis: Option<usize>) -> usize {
    axis.map_or(1, |a| shape[a + 1] as usize)
}

/// Checks an `axis` and the list lengths against an array's inner shape, and the dtype.
fn check_float_and_axis(
    axis: Option<usize>,
    lists: &[(&str, &Values)],
    inner_shape: &[u64],
    dtype: DType,
) -> Result<(), String> {
    check_float(dtype)?;
    let Some(a) = axis else { return Ok(()) };
    let Some(&n) = inner_shape.get(a) else {
        return Err(format!(
            "`axis` = {a} but the array has {} inner axes (inner shape {inner_shape:?}); inner \
             axes count from 0 after the sample axis is taken out",
            inner_shape.len()
        ));
    };
    for (name, v) in lists {
        if let Some(l) = v.len()
            && l as u64 != n
        {
            return Err(format!(
                "`{name}` has {l} values but inner axis {a} has {n} indices (inner shape \
                 {inner_shape:?})"
            ));
        }
    }
    Ok(())
}

fn check_float(dtype: DType) -> Result<(), String> {
    match dtype {
        DType::Float32 | DType::Float64 => Ok(()),
        other => Err(format!(
            "it computes in float32 or float64 and the chunks reaching it are {}; put a cast \
             before it ({{\"type\": \"cast\", \"dtype\": \"float32\"}})",
            other.name()
        )),
    }
}

/// Dispatches a generic kernel on the chunk's float type.
macro_rules! on_float {
    ($chunk:expr, |$t:ident| $body:expr) => {
        match $chunk.dtype {
            DType::Float32 => {
                type $t = f32;
                $body
            }
            DType::Float64 => {
                type $t = f64;
                $body
            }
            other => unreachable!("check refused {other:?}"),
        }
    };
}

/// `x = op(x, a[i], b[i])` for every element, `i` its index along inner axis `axis` (single
/// values serve every index), in the chunk's element type.
fn per_index<T: Float>(
    chunk: &mut Chunk,
    axis: Option<usize>,
    a: &Values,
    b: &Values,
    op: impl Fn(T, T, T) -> T,
) {
    let n = axis_len(&chunk.shape, axis);
    let (a, b) = (params::<T>(a, n), params::<T>(b, n));
    runs::<T>(&chunk.shape, &mut chunk.bytes, axis, |i, run| {
        let (a, b) = (a[i], b[i]);
        for x in run {
            *x = op(*x, a, b);
        }
    })
}

fn identity_of(kind: &str, params: &impl Serialize) -> String {
    // Serde writes floats in their shortest round-trip form, so equal identities mean equal
    // parameters to the last bit; fields come in declaration order.
    let json = serde_json::to_string(params).expect("parameters serialise");
    format!("{kind}{json}")
}

/// A built-in's `impl ChunkTransform`: its kind, its identity (the kind and its parameters as
/// serde writes them), and the `output` and `apply` given.
macro_rules! builtin {
    ($ty:ty, $kind:literal, $($methods:tt)*) => {
        impl ChunkTransform for $ty {
            fn kind(&self) -> &'static str {
                $kind
            }
            fn identity(&self) -> String {
                identity_of($kind, self)
            }
            $($methods)*
        }
    };
}

builtin! {
    Affine, "affine",
    fn output(&self, inner_shape: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String> {
        let lists = [("scale", &self.scale), ("offset", &self.offset)];
        check_float_and_axis(self.axis, &lists, inner_shape, dtype)?;
        Ok((inner_shape.to_vec(), dtype))
    }
    fn apply(&self, chunk: &mut Chunk) -> Result<(), String> {
        let (a, b) = (&self.scale, &self.offset);
        on_float!(chunk, |T| per_index::<T>(
            chunk,
            self.axis,
            a,
            b,
            |x, s, o| x * s + o
        ));
        Ok(())
    }
}

builtin! {
    Standardize, "standardize",
    fn output(&self, inner_shape: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String> {
        let lists = [("mean", &self.mean), ("std", &self.std)];
        check_float_and_axis(self.axis, &lists, inner_shape, dtype)?;
        Ok((inner_shape.to_vec(), dtype))
    }
    fn apply(&self, chunk: &mut Chunk) -> Result<(), String> {
        let (a, b) = (&self.mean, &self.std);
        on_float!(chunk, |T| per_index::<T>(
            chunk,
            self.axis,
            a,
            b,
            |x, m, s| (x - m) / s
        ));
        Ok(())
    }
}

builtin! {
    FillNan, "fill_nan",
    fn output(&self, inner_shape: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String> {
        check_float(dtype)?;
        Ok((inner_shape.to_vec(), dtype))
    }
    fn apply(&self, chunk: &mut Chunk) -> Result<(), String> {
        on_float!(chunk, |T| {
            let v = T::of(self.value);
            runs::<T>(&chunk.shape, &mut chunk.bytes, None, |_, run| {
                // A select rather than a branch, so that it vectorises.
                for x in run {
                    *x = if x.is_nan() { v } else { *x };
                }
            })
        });
        Ok(())
    }
}

builtin! {
    Clip, "clip",
    fn output(&self, inner_shape: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String> {
        check_float(dtype)?;
        Ok((inner_shape.to_vec(), dtype))
    }
    fn apply(&self, chunk: &mut Chunk) -> Result<(), String> {
        on_float!(chunk, |T| {
            let (lo, hi) = (T::of(self.min), T::of(self.max));
            runs::<T>(&chunk.shape, &mut chunk.bytes, None, |_, run| {
                // Comparisons with NaN are false, so NaN passes through as numpy's does. Two
                // selects rather than branches, so that it vectorises (to max and min).
                for x in run {
                    let y = if *x < lo { lo } else { *x };
                    *x = if y > hi { hi } else { y };
                }
            })
        });
        Ok(())
    }
}

/// Appends each element of `bytes` (of type `$src`) to `out` converted with `as $dst`: the
/// conversion numpy's `astype` makes (round to nearest, even on ties).
macro_rules! cast_each {
    ($bytes:expr, $out:expr, $src:ty, $dst:ty) => {{
        let n = $bytes.len() / std::mem::size_of::<$src>();
        $out.resize(n * std::mem::size_of::<$dst>(), 0);
        let src = $bytes.chunks_exact(std::mem::size_of::<$src>());
        for (b, o) in src.zip($out.chunks_exact_mut(std::mem::size_of::<$dst>())) {
            let x = <$src>::from_ne_bytes(b.try_into().expect("element width"));
            o.copy_from_slice(&(x as $dst).to_ne_bytes());
        }
    }};
}

/// `bytes` of type `from` converted to `$dst`, straight from each source type (never through
/// a wider float, which could round twice).
macro_rules! cast_to {
    ($bytes:expr, $from:expr, $dst:ty) => {{
        let mut out: Vec<u8> = Vec::new();
        match $from {
            DType::Bool | DType::Uint8 => cast_each!($bytes, out, u8, $dst),
            DType::Int8 => cast_each!($bytes, out, i8, $dst),
            DType::Int16 => cast_each!($bytes, out, i16, $dst),
            DType::Int32 => cast_each!($bytes, out, i32, $dst),
            DType::Int64 => cast_each!($bytes, out, i64, $dst),
            DType::Uint16 => cast_each!($bytes, out, u16, $dst),
            DType::Uint32 => cast_each!($bytes, out, u32, $dst),
            DType::Uint64 => cast_each!($bytes, out, u64, $dst),
            DType::Float32 => cast_each!($bytes, out, f32, $dst),
            DType::Float64 => cast_each!($bytes, out, f64, $dst),
            other => unreachable!("output refused {other:?}"),
        }
        out
    }};
}

builtin! {
    Cast, "cast",
    fn output(&self, inner_shape: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String> {
        match dtype {
            DType::Float16 | DType::Complex64 | DType::Complex128 => Err(format!(
                "casts from {} are not built (bool, integers, float32 and float64 are)",
                dtype.name()
            )),
            _ => Ok((inner_shape.to_vec(), self.dtype)),
        }
    }
    fn apply(&self, chunk: &mut Chunk) -> Result<(), String> {
        if chunk.dtype == self.dtype {
            return Ok(());
        }
        chunk.bytes = match self.dtype {
            DType::Float32 => cast_to!(chunk.bytes, chunk.dtype, f32),
            DType::Float64 => cast_to!(chunk.bytes, chunk.dtype, f64),
            other => unreachable!("validate refused {other:?}"),
        };
        chunk.dtype = self.dtype;
        Ok(())
    }
}

/// The block means of a `[samples, *inner]` chunk: each output element the mean (summed in
/// f64) of its block; trailing elements that fill no whole block are skipped.
fn coarsen<T: Float>(shape: &[u64], bytes: &[u8], factors: &[u64]) -> (Vec<u64>, Vec<u8>) {
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    let f: Vec<usize> = factors.iter().map(|&x| x as usize).collect();
    let inner = &dims[1..];
    let out_inner: Vec<usize> = inner.iter().zip(&f).map(|(d, f)| d / f).collect();
    let last = inner.len() - 1;
    let (row_len, out_row_len, f_last) = (inner[last], out_inner[last], f[last]);
    let rows_per_sample: usize = inner[..last].iter().product();
    let out_per_sample: usize = out_inner.iter().product();
    let block = f.iter().product::<usize>() as f64;
    let mut out = Vec::with_capacity(dims[0] * out_per_sample * T::SIZE);
    let mut sums = vec![0f64; out_per_sample];
    let mut idx = vec![0usize; last];
    // Rows that add to the same output row are summed element by element first (a loop the
    // compiler vectorises), and folded into blocks along the last axis once per output row.
    let mut row_sums = vec![0f64; out_row_len * f_last];
    let fold = |r: usize, row_sums: &mut [f64], sums: &mut [f64]| {
        let dst = &mut sums[r * out_row_len..(r + 1) * out_row_len];
        if f_last == 1 {
            for (d, a) in dst.iter_mut().zip(row_sums.iter()) {
                *d += a;
            }
        } else {
            for (d, run) in dst.iter_mut().zip(row_sums.chunks_exact(f_last)) {
                *d += run.iter().sum::<f64>();
            }
        }
        row_sums.fill(0.0);
    };
    let elems = elements::<T>(bytes);
    for sample in elems.chunks_exact(rows_per_sample * row_len) {
        sums.fill(0.0);
        idx.fill(0);
        let mut pending: Option<usize> = None;
        for row in sample.chunks_exact(row_len) {
            // The output row this input row adds to, unless it is past the last whole block.
            let target = idx
                .iter()
                .zip(&f)
                .zip(&out_inner)
                .try_fold(0usize, |acc, ((&i, &f), &o)| {
                    (i / f < o).then_some(acc * o + i / f)
                });
            if let Some(r) = target {
                if let Some(p) = pending.filter(|&p| p != r) {
                    fold(p, &mut row_sums, &mut sums);
                }
                pending = Some(r);
                // `row_sums` ends at the last whole block: the zip trims the rest of the row.
                for (a, x) in row_sums.iter_mut().zip(row) {
                    *a += x.to_f64();
                }
            }
            next_index(&mut idx, &inner[..last]);
        }
        if let Some(p) = pending {
            fold(p, &mut row_sums, &mut sums);
        }
        for sum in &sums {
            T::of(sum / block).write_to(&mut out);
        }
    }
    let mut out_shape = vec![shape[0]];
    out_shape.extend(out_inner.iter().map(|&d| d as u64));
    (out_shape, out)
}

builtin! {
    Coarsen, "coarsen",
    fn output(&self, inner_shape: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String> {
        check_float(dtype)?;
        if self.factors.len() != inner_shape.len() {
            return Err(format!(
                "`factors` has {} values but the chunks have {} inner axes (inner shape \
                 {inner_shape:?}); give one per inner axis, 1 to keep one",
                self.factors.len(),
                inner_shape.len()
            ));
        }
        let mut out = Vec::with_capacity(inner_shape.len());
        for (a, (&d, &f)) in inner_shape.iter().zip(&self.factors).enumerate() {
            if d < f {
                return Err(format!(
                    "inner axis {a} has {d} elements, fewer than its factor {f}"
                ));
            }
            out.push(d / f);
        }
        Ok((out, dtype))
    }
    fn apply(&self, chunk: &mut Chunk) -> Result<(), String> {
        let (shape, bytes) = on_float!(chunk, |T| coarsen::<T>(
            &chunk.shape,
            &chunk.bytes,
            &self.factors
        ));
        chunk.shape = shape;
        chunk.bytes = bytes;
        Ok(())
    }
}

mod regrid;
pub use regrid::{Regrid, RegridMethod};

/// `json` as an error message shows it: whole when short, else its start and its length (a
/// regrid's coordinate lists run to thousands of characters).
fn abbreviated(json: &str) -> String {
    const SHOWN: usize = 160;
    match json.char_indices().nth(SHOWN) {
        None => json.to_string(),
        Some((cut, _)) => format!("{}… ({} characters)", &json[..cut], json.len()),
    }
}

/// The kinds [`ChunkTransforms::extend_from_json`] knows.
pub const BUILTIN_KINDS: [&str; 7] = [
    "affine",
    "standardize",
    "fill_nan",
    "clip",
    "cast",
    "coarsen",
    "regrid",
];

/// Parses one built-in from its JSON object (without `type` and `applies`).
fn builtin(
    kind: &str,
    params: serde_json::Value,
    known: &str,
) -> Result<Arc<dyn ChunkTransform>, String> {
    /// `T` from its JSON fields, checked by `validate`.
    fn make<T: serde::de::DeserializeOwned + ChunkTransform + 'static>(
        params: serde_json::Value,
        validate: impl Fn(&T) -> Result<(), String>,
    ) -> Result<Arc<dyn ChunkTransform>, String> {
        let t: T = serde_json::from_value(params).map_err(|e| e.to_string())?;
        validate(&t)?;
        Ok(Arc::new(t))
    }
    match kind {
        "affine" => make(params, Affine::validate),
        "standardize" => make(params, Standardize::validate),
        "fill_nan" => make(params, |t: &FillNan| {
            if t.value.is_nan() {
                Err("`value` must be a number, not NaN".into())
            } else {
                Ok(())
            }
        }),
        "clip" => make(params, Clip::validate),
        "cast" => make(params, Cast::validate),
        "coarsen" => make(params, Coarsen::validate),
        "regrid" => make(params, Regrid::validate),
        other => Err(format!(
            "unknown transform type `{other}`; the kinds are {known}"
        )),
    }
}

/// One entry of the list: a transform and the arrays it applies to (`None`: every array).
#[derive(Clone, Debug)]
struct Entry {
    applies: Option<Vec<String>>,
    transform: Arc<dyn ChunkTransform>,
}

/// The ordered list of chunk transforms a dataset was given, with their scopes.
#[derive(Clone, Debug, Default)]
pub struct ChunkTransforms {
    entries: Vec<Entry>,
}

impl ChunkTransforms {
    /// Adds `transform`, for the arrays at `applies` (`None`: every array).
    pub fn push(&mut self, applies: Option<Vec<String>>, transform: Arc<dyn ChunkTransform>) {
        self.entries.push(Entry { applies, transform });
    }

    /// Appends the built-ins of a JSON list (see the module docs). Errors name the entry.
    pub fn extend_from_json(&mut self, json: &str) -> Result<(), EngineError> {
        self.extend_from_json_with(json, &[], |_, _| unreachable!("no other kinds"))
    }

    /// [`extend_from_json`](Self::extend_from_json), with more kinds than the built-ins: an
    /// entry whose `type` is one of `kinds` is made by `make(kind, params)` from its other
    /// fields (without `type` and `applies`), in list order with the built-ins. The C ABI's
    /// callback transforms are made this way.
    pub fn extend_from_json_with(
        &mut self,
        json: &str,
        kinds: &[&str],
        mut make: impl FnMut(&str, serde_json::Value) -> Result<Arc<dyn ChunkTransform>, String>,
    ) -> Result<(), EngineError> {
        let known = BUILTIN_KINDS
            .iter()
            .chain(kinds)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        let whole = |msg: String| EngineError::arg("chunk_transforms", abbreviated(json), msg);
        let list: serde_json::Value =
            serde_json::from_str(json).map_err(|e| whole(format!("not valid JSON: {e}")))?;
        let serde_json::Value::Array(list) = list else {
            return Err(whole("must be a list of transforms".into()));
        };
        for (i, item) in list.into_iter().enumerate() {
            let shown = abbreviated(&item.to_string());
            let bad =
                |msg: String| EngineError::arg("chunk_transforms", format!("[{i}] {shown}"), msg);
            let serde_json::Value::Object(mut obj) = item else {
                return Err(bad("each transform is an object with a `type`".into()));
            };
            let kind = match obj.remove("type") {
                Some(serde_json::Value::String(k)) => k,
                _ => return Err(bad(format!("needs a string `type`: one of {known}"))),
            };
            let applies = match obj.remove("applies") {
                None | Some(serde_json::Value::Null) => None,
                Some(v) => Some(
                    serde_json::from_value::<Vec<String>>(v)
                        .map_err(|_| bad("`applies` must be a list of array paths".into()))?,
                ),
            };
            let params = serde_json::Value::Object(obj);
            let transform = if kinds.contains(&kind.as_str()) {
                make(&kind, params)
            } else {
                builtin(&kind, params, &known)
            }
            .map_err(|e| bad(format!("{kind}: {e}")))?;
            self.push(applies, transform);
        }
        Ok(())
    }

    /// The transforms that apply to the array at `path`, in order, unscoped.
    pub fn restricted_to(&self, path: &str) -> Self {
        let entries = self
            .entries
            .iter()
            .filter(|e| {
                e.applies
                    .as_ref()
                    .is_none_or(|a| a.iter().any(|p| p == path))
            })
            .map(|e| Entry {
                applies: None,
                transform: Arc::clone(&e.transform),
            })
            .collect();
        Self { entries }
    }

    /// Appends every transform of `other`, with its scope.
    pub fn extend(&mut self, other: &Self) {
        self.entries.extend(other.entries.iter().cloned());
    }

    /// Every array path a scope names, once each, in order.
    pub fn scoped_paths(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for p in self.entries.iter().flat_map(|e| e.applies.iter().flatten()) {
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        out
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Each array's pipeline, checked against its inner shape and dtype. `arrays` maps every
    /// array the dataset reads to `(inner_shape, dtype)`. A scope naming no such array is an
    /// error, and so is a transform that cannot run on an array in its scope.
    pub fn pipelines(
        &self,
        arrays: &HashMap<String, (Vec<u64>, DType)>,
    ) -> Result<HashMap<String, Pipeline>, EngineError> {
        let mut known: Vec<&str> = arrays.keys().map(String::as_str).collect();
        known.sort_unstable();
        for (i, e) in self.entries.iter().enumerate() {
            for p in e.applies.iter().flatten() {
                if !arrays.contains_key(p) {
                    return Err(EngineError::arg(
                        "chunk_transforms",
                        format!("[{i}] {}", e.transform.identity()),
                        format!(
                            "`applies` names `{p}`, which is not an array this dataset reads \
                             ([{}]); scopes are array paths, not labels",
                            known.join(", ")
                        ),
                    ));
                }
            }
        }
        let mut out = HashMap::new();
        for (path, (inner, dtype)) in arrays {
            let mut steps = Vec::new();
            let mut format = (inner.clone(), *dtype);
            for (i, e) in self.entries.iter().enumerate() {
                if e.applies.as_ref().is_some_and(|a| !a.contains(path)) {
                    continue;
                }
                format = e.transform.output(&format.0, format.1).map_err(|why| {
                    EngineError::arg(
                        "chunk_transforms",
                        format!("[{i}] {}", e.transform.identity()),
                        format!("cannot apply to array `{path}`: {why}"),
                    )
                })?;
                if format.0.contains(&0) {
                    return Err(EngineError::arg(
                        "chunk_transforms",
                        format!("[{i}] {}", e.transform.identity()),
                        format!(
                            "it leaves array `{path}`'s samples empty (inner shape {:?})",
                            format.0
                        ),
                    ));
                }
                steps.push(Step {
                    transform: Arc::clone(&e.transform),
                    inner: format.0.clone(),
                    dtype: format.1,
                });
            }
            let (output_inner, output_dtype) = format;
            out.insert(
                path.clone(),
                Pipeline {
                    steps,
                    output_inner,
                    output_dtype,
                },
            );
        }
        Ok(out)
    }
}

/// A transform of a pipeline and the inner shape and dtype it promised to make.
#[derive(Clone, Debug)]
struct Step {
    transform: Arc<dyn ChunkTransform>,
    inner: Vec<u64>,
    dtype: DType,
}

/// One array's chunk transforms, in order, and what its chunks become.
#[derive(Clone, Debug)]
pub struct Pipeline {
    steps: Vec<Step>,
    output_inner: Vec<u64>,
    output_dtype: DType,
}

impl Pipeline {
    /// No transform: chunks stay as decoded (`inner_shape`, `dtype`).
    pub fn none(inner_shape: Vec<u64>, dtype: DType) -> Self {
        Self {
            steps: Vec::new(),
            output_inner: inner_shape,
            output_dtype: dtype,
        }
    }

    /// True when the array's chunks are cached as decoded.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Every step's identity, in order (the array's cache fingerprint is made of these).
    pub fn identities(&self) -> Vec<String> {
        self.steps.iter().map(|s| s.transform.identity()).collect()
    }

    /// The inner shape of a sample after the transforms (what batches and the cache hold).
    pub fn output_inner(&self) -> &[u64] {
        &self.output_inner
    }

    /// The element type after the transforms.
    pub fn output_dtype(&self) -> DType {
        self.output_dtype
    }

    /// Runs every step on a decoded chunk of array `array`, `index` along the sample axis, of
    /// `shape` (`[samples_per_chunk, *inner_shape]`) and returns the transformed bytes, which
    /// have the shape and type the steps promised. An error names the step that failed, with
    /// its reason, or that broke its promise (a [`ChunkTransform`] written outside this crate
    /// whose `apply` disagrees with its `output`), so that a wrongly sized chunk never reaches
    /// the pool.
    pub fn apply(
        &self,
        array: &str,
        index: u64,
        shape: &[u64],
        dtype: DType,
        bytes: Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        if self.steps.is_empty() {
            return Ok(bytes);
        }
        let mut chunk = Chunk {
            array: array.to_owned(),
            index,
            shape: shape.to_vec(),
            dtype,
            bytes,
        };
        for Step {
            transform: step,
            inner,
            dtype,
        } in &self.steps
        {
            step.apply(&mut chunk)
                .map_err(|why| format!("chunk transform {} failed: {why}", step.identity()))?;
            let elements = chunk.shape.iter().product::<u64>() as usize;
            if chunk.shape[0] != shape[0]
                || chunk.shape[1..] != inner[..]
                || chunk.dtype != *dtype
                || chunk.bytes.len() != elements * dtype.size_bytes()
            {
                return Err(format!(
                    "chunk transform {} made a {:?} {} chunk of {} bytes, not the [{}, {}] {} its \
                     `output` promised; fix its `apply` or its `output`",
                    step.identity(),
                    chunk.shape,
                    chunk.dtype.name(),
                    chunk.bytes.len(),
                    shape[0],
                    inner
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    dtype.name()
                ));
            }
        }
        Ok(chunk.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    pub(super) fn back(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn run(t: &dyn ChunkTransform, shape: &[u64], v: &[f32]) -> Vec<f32> {
        let mut c = Chunk {
            array: "a".into(),
            index: 0,
            shape: shape.to_vec(),
            dtype: DType::Float32,
            bytes: f32s(v),
        };
        t.apply(&mut c).unwrap();
        back(&c.bytes)
    }

    #[test]
    fn per_index_parameters_follow_the_inner_axis() {
        // 2 samples × 3 levels × 2 points: level i gets (x - mean[i]) / std[i].
        let t =
            Standardize::per_index(Some(0), vec![0.0, 10.0, 100.0], vec![1.0, 2.0, 4.0]).unwrap();
        let x: Vec<f32> = (0..12).map(|i| i as f32 * 10.0).collect();
        let got = run(&t, &[2, 3, 2], &x);
        let want: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let level = (i / 2) % 3;
                (v - [0.0f32, 10.0, 100.0][level]) / [1.0f32, 2.0, 4.0][level]
            })
            .collect();
        assert_eq!(got, want);
        // Along the last axis instead: the point index picks the parameter.
        let t = Affine {
            scale: vec![2.0, 3.0].into(),
            offset: 1.0.into(),
            axis: Some(1),
        };
        let got = run(&t, &[2, 3, 2], &x);
        let want: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, v)| v * [2.0f32, 3.0][i % 2] + 1.0)
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn misaligned_bytes_give_the_same_result() {
        let x: Vec<f32> = (0..9).map(|i| i as f32).collect();
        let mut buf = vec![0u8; 1];
        buf.extend(f32s(&x));
        runs::<f32>(&[9], &mut buf[1..], None, |_, run| {
            for v in run {
                *v = *v * 0.5 - 3.0;
            }
        });
        let want: Vec<f32> = x.iter().map(|v| v * 0.5 - 3.0).collect();
        assert_eq!(back(&buf[1..]), want);
    }

    #[test]
    fn fill_nan_and_clip_treat_nan_as_numpy_does() {
        let x = [f32::NAN, -9.0, 0.5, 9.0];
        assert_eq!(run(&FillNan::new(7.0), &[4], &x), vec![7.0, -9.0, 0.5, 9.0]);
        let c = run(&Clip::new(-1.0, 1.0).unwrap(), &[4], &x);
        assert!(c[0].is_nan());
        assert_eq!(&c[1..], &[-1.0, 0.5, 1.0]);
    }

    #[test]
    fn float64_arrays_compute_in_float64() {
        let t = Affine::new(0.1, 0.0).unwrap();
        let mut c = Chunk {
            array: "a".into(),
            index: 0,
            shape: vec![1],
            dtype: DType::Float64,
            bytes: 3.0f64.to_ne_bytes().to_vec(),
        };
        t.apply(&mut c).unwrap();
        assert_eq!(f64::from_ne_bytes(c.bytes.try_into().unwrap()), 3.0 * 0.1);
    }

    #[test]
    fn casts_round_straight_from_the_source_type() {
        // 2^24 + 1 is not a float32: it rounds to 2^24 (ties to even), and i64::MAX to 2^63.
        let v: [i64; 3] = [-7, (1 << 24) + 1, i64::MAX];
        let mut c = Chunk {
            array: "a".into(),
            index: 0,
            shape: vec![3],
            dtype: DType::Int64,
            bytes: v.iter().flat_map(|x| x.to_ne_bytes()).collect(),
        };
        Cast::new(DType::Float32).unwrap().apply(&mut c).unwrap();
        assert_eq!(c.dtype, DType::Float32);
        assert_eq!(back(&c.bytes), vec![-7.0, 16_777_216.0, 9.223_372e18]);
        let t = Cast::new(DType::Float64).unwrap();
        assert!(t.output(&[2], DType::Complex64).is_err());
        assert_eq!(
            t.output(&[2], DType::Uint8).unwrap(),
            (vec![2], DType::Float64)
        );
        assert!(Cast::new(DType::Int32).is_err());
    }

    #[test]
    fn coarsen_takes_block_means_and_trims_partial_blocks() {
        // 2 samples of 3 × 5 with factors (2, 2): a 1 × 2 output; row 2 and column 4 dropped.
        let x: Vec<f32> = (0..30).map(|i| i as f32).collect();
        let t = Coarsen::new(vec![2, 2]).unwrap();
        assert_eq!(
            t.output(&[3, 5], DType::Float32).unwrap(),
            (vec![1, 2], DType::Float32)
        );
        let mut c = Chunk {
            array: "a".into(),
            index: 0,
            shape: vec![2, 3, 5],
            dtype: DType::Float32,
            bytes: f32s(&x),
        };
        t.apply(&mut c).unwrap();
        assert_eq!(c.shape, vec![2, 1, 2]);
        // Sample 0: (0+1+5+6)/4, (2+3+7+8)/4; sample 1 adds 15.
        assert_eq!(back(&c.bytes), vec![3.0, 5.0, 18.0, 20.0]);
        // A NaN in a block makes that block's mean NaN (skipna=False), and no other.
        let mut holed = x.clone();
        holed[6] = f32::NAN;
        let got = run(&t, &[2, 3, 5], &holed);
        assert!(got[0].is_nan(), "{got:?}");
        assert_eq!(got[1..], [5.0, 18.0, 20.0]);
        assert!(
            t.output(&[1, 5], DType::Float32)
                .unwrap_err()
                .contains("fewer than")
        );
        assert!(
            t.output(&[4], DType::Float32)
                .unwrap_err()
                .contains("inner axes")
        );
        assert!(Coarsen::new(vec![2, 0]).is_err());
    }

    #[test]
    fn a_pipeline_threads_shape_and_type_through_its_steps() {
        let mut ts = ChunkTransforms::default();
        ts.extend_from_json(
            r#"[{"type": "cast", "dtype": "float32"}, {"type": "coarsen", "factors": [2, 1]},
                {"type": "affine", "scale": 2}]"#,
        )
        .unwrap();
        let arrays = [("a".to_string(), (vec![4, 3], DType::Int16))].into();
        let p = ts.pipelines(&arrays).unwrap().remove("a").unwrap();
        assert_eq!(
            (p.output_inner(), p.output_dtype()),
            (&[2u64, 3][..], DType::Float32)
        );
        let x: Vec<i16> = (0..12).collect();
        let bytes = x.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let out = p.apply("a", 0, &[1, 4, 3], DType::Int16, bytes).unwrap();
        // Rows (0,1,2)+(3,4,5) and (6,7,8)+(9,10,11), halved, doubled.
        assert_eq!(back(&out), vec![3.0, 5.0, 7.0, 15.0, 17.0, 19.0]);
        // Without the cast the affine sees int16 and says what to put before it.
        let mut ts = ChunkTransforms::default();
        ts.extend_from_json(r#"[{"type": "affine", "scale": 2}]"#)
            .unwrap();
        let msg = ts.pipelines(&arrays).unwrap_err().to_string();
        assert!(msg.contains("int16") && msg.contains("cast"), "{msg}");
    }

    #[test]
    fn identities_change_with_every_parameter_bit() {
        let a = Affine::new(1.0, -273.15).unwrap().identity();
        let b = Affine::new(1.0, f64::from_bits((-273.15f64).to_bits() + 1))
            .unwrap()
            .identity();
        assert_ne!(a, b);
        assert_eq!(a, Affine::new(1.0, -273.15).unwrap().identity());
        assert_ne!(
            Standardize::new(1.0, 2.0).unwrap().identity(),
            Affine::new(1.0, 2.0).unwrap().identity()
        );
    }

    #[test]
    fn bad_parameters_are_refused_with_the_reason() {
        let err = |json: &str| {
            ChunkTransforms::default()
                .extend_from_json(json)
                .unwrap_err()
                .to_string()
        };
        let cases = [
            (r#"[{"type": "scale"}]"#, "unknown transform type `scale`"),
            (r#"[{"scale": 2}]"#, "needs a string `type`"),
            (r#"[{"type": "affine", "scal": 2}]"#, "unknown field `scal`"),
            (
                r#"[{"type": "standardize", "mean": 0, "std": 0}]"#,
                "must be positive",
            ),
            (
                r#"[{"type": "standardize", "mean": [0, 1], "std": 1}]"#,
                "`axis` must say",
            ),
            (
                r#"[{"type": "affine", "scale": 2, "axis": 0}]"#,
                "drop `axis`",
            ),
            (
                r#"[{"type": "affine", "scale": [1, 2], "offset": [1], "axis": 0}]"#,
                "`offset` has 1",
            ),
            (r#"[{"type": "clip", "min": 2, "max": 1}]"#, "swap them"),
            (
                r#"[{"type": "affine", "applies": "t2m"}]"#,
                "list of array paths",
            ),
            (r#"{"type": "affine"}"#, "must be a list"),
            (r#"[1]"#, "an object with a `type`"),
        ];
        for (json, want) in cases {
            let msg = err(json);
            assert!(
                msg.contains(want) && msg.contains("chunk_transforms"),
                "{json}: {msg}"
            );
        }
        // The entry's position is named.
        assert!(err(r#"[{"type": "clip", "min": 0, "max": 1}, {"type": "x"}]"#).contains("[1]"));
        // A long entry (a regrid's coordinates) is shown by its start and its length; the
        // reason stays whole.
        let src: Vec<String> = (0..2000).map(|i| format!("{i}.5")).collect();
        let json = format!(
            r#"[{{"type": "regrid", "axes": [0, 1], "src": [[{}], [0, 1]], "dst": [[1, 2], [0]], "sphere": true}}]"#,
            src.join(", ")
        );
        let msg = err(&json);
        assert!(
            msg.len() < 600
                && msg.contains("characters)")
                && msg.contains("[0] {\"type\":\"regrid\""),
            "{msg}"
        );
        assert!(msg.contains("`sphere` is for"), "{msg}");
    }

    #[test]
    fn scopes_and_array_checks_name_the_array() {
        let mut ts = ChunkTransforms::default();
        ts.extend_from_json(
            r#"[{"type": "affine", "offset": 1, "applies": ["t2m"]},
                {"type": "standardize", "mean": [1, 2], "std": [1, 1], "axis": 0}]"#,
        )
        .unwrap();
        let mut arrays = HashMap::new();
        arrays.insert("t2m".to_string(), (vec![2, 5], DType::Float32));
        arrays.insert("u10".to_string(), (vec![2, 5], DType::Float64));
        let p = ts.pipelines(&arrays).unwrap();
        assert_eq!(p["t2m"].identities().len(), 2);
        assert_eq!(p["u10"].identities().len(), 1);
        assert!(p["u10"].identities()[0].starts_with("standardize"));

        arrays.insert("mask".to_string(), (vec![2, 5], DType::Uint8));
        let msg = ts.pipelines(&arrays).unwrap_err().to_string();
        assert!(msg.contains("`mask`") && msg.contains("uint8"), "{msg}");
        arrays.remove("mask");
        arrays.insert("levels".to_string(), (vec![3, 5], DType::Float32));
        let msg = ts.pipelines(&arrays).unwrap_err().to_string();
        assert!(
            msg.contains("`levels`") && msg.contains("inner axis 0 has 3"),
            "{msg}"
        );

        let mut ts = ChunkTransforms::default();
        ts.extend_from_json(r#"[{"type": "fill_nan", "value": 0, "applies": ["t"]}]"#)
            .unwrap();
        let msg = ts.pipelines(&arrays).unwrap_err().to_string();
        assert!(
            msg.contains("names `t`") && msg.contains("not labels"),
            "{msg}"
        );
    }
}
