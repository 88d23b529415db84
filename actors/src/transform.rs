//! Chunk transforms: deterministic work the decoder runs on each decoded chunk before the pool
//! holds it, so that every sample drawn from the chunk, in this epoch and every later one (and,
//! with a persistent cache directory, every later run), gets it for free.
//!
//! A transform sees one array's chunk at a time, assembled sample-first
//! (`[samples_per_chunk, *inner_shape]`, C order) whatever the array's physical axis order and
//! inner chunking, and changes it in place: scaling, standardisation, unit conversion, NaN
//! repair, clipping. It runs on every chunk of every array in its scope, including fill-value
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
//!   {"type": "clip", "min": -5.0, "max": 5.0}
//! ]
//! ```
//!
//! `axis` (of `affine` and `standardize`) names an inner axis (0 is the first axis after the
//! sample axis is taken out, physical order otherwise) along which the parameters are lists, one
//! value per index: per-level statistics of a 3-D field. Arithmetic is in the array's element
//! type (`float32` or `float64`), exactly as numpy computes `x * float32(scale) +
//! float32(offset)` and `(x - float32(mean)) / float32(std)`.
//!
//! Reshaping transforms (a regrid, a dtype cast), which change a slot's inner shape or type, are
//! not built: every built-in keeps shape and dtype, and [`ChunkTransform::check`] refuses
//! arrays it cannot run on.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use insitubatch_store::DType;
use serde::{Deserialize, Serialize};

use crate::error::EngineError;

/// One decoded chunk, as a transform sees it.
pub struct ChunkMut<'a> {
    /// `[samples_per_chunk, *inner_shape]`, sample axis first, C order. The last chunk of an
    /// array is full size too; its rows past the end are never emitted.
    pub shape: &'a [u64],
    /// The element type (a transform's [`check`](ChunkTransform::check) accepted it).
    pub dtype: DType,
    /// The elements, native-endian.
    pub bytes: &'a mut [u8],
}

/// A deterministic, shape- and dtype-preserving per-chunk transform.
///
/// The result is cached with the chunk, so `apply` must depend on nothing but the chunk and the
/// transform's parameters, and [`identity`](Self::identity) must change whenever a parameter
/// does: it is the cache fingerprint, and a transform whose identity stays while its output
/// changes makes a persisted cache serve the old output.
pub trait ChunkTransform: Send + Sync + fmt::Debug {
    /// A short name for messages (`"affine"`).
    fn kind(&self) -> &'static str;
    /// The kind and every parameter, exactly (floats to their last bit).
    fn identity(&self) -> String;
    /// Whether the transform can run on an array of this inner shape and type; an error says
    /// why not. Called when the dataset is built, before any chunk is read.
    fn check(&self, inner_shape: &[u64], dtype: DType) -> Result<(), String>;
    /// Transforms the chunk in place. Cannot fail: everything that could is refused by `check`.
    fn apply(&self, chunk: ChunkMut<'_>);
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
trait Float: Copy + PartialOrd + std::ops::Mul<Output = Self> + std::ops::Add<Output = Self> {
    const SIZE: usize;
    fn of(v: f64) -> Self;
    fn sub(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn read(b: &[u8]) -> Self;
    fn write(self, b: &mut [u8]);
}

macro_rules! float {
    ($t:ty) => {
        impl Float for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn of(v: f64) -> Self {
                v as $t
            }
            fn sub(self, o: Self) -> Self {
                self - o
            }
            fn div(self, o: Self) -> Self {
                self / o
            }
            fn read(b: &[u8]) -> Self {
                <$t>::from_ne_bytes(b.try_into().expect("element width"))
            }
            fn write(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_ne_bytes())
            }
        }
    };
}
float!(f32);
float!(f64);

/// Runs `op(index along axis, elements)` over the chunk: the whole chunk as one run with index 0
/// when `axis` is `None`, else every run of elements that share an index along inner axis
/// `axis`.
fn runs<T: Float>(chunk: ChunkMut<'_>, axis: Option<usize>, mut op: impl FnMut(usize, &mut [T])) {
    let (lead, len, tail) = match axis {
        None => (1usize, 1usize, chunk.bytes.len() / T::SIZE),
        Some(a) => {
            // The sample axis is dim 0 of the chunk, inner axis `a` is dim `a + 1`.
            let dims: Vec<usize> = chunk.shape.iter().map(|&d| d as usize).collect();
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
    let (head, elems, rest) = unsafe { chunk.bytes.align_to_mut::<T>() };
    if head.is_empty() && rest.is_empty() {
        for (i, run) in elems.chunks_exact_mut(tail).enumerate() {
            op(i % len, run);
        }
        debug_assert_eq!(elems.len(), lead * len * tail);
        return;
    }
    // A decoded buffer is always aligned in practice; this keeps a misaligned one correct.
    let mut copy: Vec<T> = chunk.bytes.chunks_exact(T::SIZE).map(T::read).collect();
    for (i, run) in copy.chunks_exact_mut(tail).enumerate() {
        op(i % len, run);
    }
    for (x, b) in copy.iter().zip(chunk.bytes.chunks_exact_mut(T::SIZE)) {
        x.write(b);
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
            "it computes in float32 or float64 and the array is {}; a dtype-changing cast is \
             not built yet, so apply it in a batch transform",
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

fn identity_of(kind: &str, params: &impl Serialize) -> String {
    // Serde writes floats in their shortest round-trip form, so equal identities mean equal
    // parameters to the last bit; fields come in declaration order.
    let json = serde_json::to_string(params).expect("parameters serialise");
    format!("{kind}{json}")
}

impl ChunkTransform for Affine {
    fn kind(&self) -> &'static str {
        "affine"
    }
    fn identity(&self) -> String {
        identity_of(self.kind(), self)
    }
    fn check(&self, inner_shape: &[u64], dtype: DType) -> Result<(), String> {
        let lists = [("scale", &self.scale), ("offset", &self.offset)];
        check_float_and_axis(self.axis, &lists, inner_shape, dtype)
    }
    fn apply(&self, chunk: ChunkMut<'_>) {
        let n = axis_len(chunk.shape, self.axis);
        on_float!(chunk, |T| {
            let (scale, offset) = (params::<T>(&self.scale, n), params::<T>(&self.offset, n));
            runs::<T>(chunk, self.axis, |i, run| {
                let (s, o) = (scale[i], offset[i]);
                for x in run {
                    *x = *x * s + o;
                }
            })
        })
    }
}

impl ChunkTransform for Standardize {
    fn kind(&self) -> &'static str {
        "standardize"
    }
    fn identity(&self) -> String {
        identity_of(self.kind(), self)
    }
    fn check(&self, inner_shape: &[u64], dtype: DType) -> Result<(), String> {
        let lists = [("mean", &self.mean), ("std", &self.std)];
        check_float_and_axis(self.axis, &lists, inner_shape, dtype)
    }
    fn apply(&self, chunk: ChunkMut<'_>) {
        let n = axis_len(chunk.shape, self.axis);
        on_float!(chunk, |T| {
            let (mean, std) = (params::<T>(&self.mean, n), params::<T>(&self.std, n));
            runs::<T>(chunk, self.axis, |i, run| {
                let (m, s) = (mean[i], std[i]);
                for x in run {
                    *x = x.sub(m).div(s);
                }
            })
        })
    }
}

impl ChunkTransform for FillNan {
    fn kind(&self) -> &'static str {
        "fill_nan"
    }
    fn identity(&self) -> String {
        identity_of(self.kind(), self)
    }
    fn check(&self, _inner_shape: &[u64], dtype: DType) -> Result<(), String> {
        check_float(dtype)
    }
    fn apply(&self, chunk: ChunkMut<'_>) {
        on_float!(chunk, |T| {
            let v = T::of(self.value);
            runs::<T>(chunk, None, |_, run| {
                // A select rather than a branch, so that it vectorises.
                for x in run {
                    *x = if x.is_nan() { v } else { *x };
                }
            })
        })
    }
}

impl ChunkTransform for Clip {
    fn kind(&self) -> &'static str {
        "clip"
    }
    fn identity(&self) -> String {
        identity_of(self.kind(), self)
    }
    fn check(&self, _inner_shape: &[u64], dtype: DType) -> Result<(), String> {
        check_float(dtype)
    }
    fn apply(&self, chunk: ChunkMut<'_>) {
        on_float!(chunk, |T| {
            let (lo, hi) = (T::of(self.min), T::of(self.max));
            runs::<T>(chunk, None, |_, run| {
                // Comparisons with NaN are false, so NaN passes through as numpy's does. Two
                // selects rather than branches, so that it vectorises (to max and min).
                for x in run {
                    let y = if *x < lo { lo } else { *x };
                    *x = if y > hi { hi } else { y };
                }
            })
        })
    }
}

/// The kinds [`ChunkTransforms::extend_from_json`] knows.
pub const BUILTIN_KINDS: [&str; 4] = ["affine", "standardize", "fill_nan", "clip"];

/// Parses one built-in from its JSON object (without `type` and `applies`).
fn builtin(kind: &str, params: serde_json::Value) -> Result<Arc<dyn ChunkTransform>, String> {
    fn parse<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }
    Ok(match kind {
        "affine" => {
            let t: Affine = parse(params)?;
            t.validate()?;
            Arc::new(t)
        }
        "standardize" => {
            let t: Standardize = parse(params)?;
            t.validate()?;
            Arc::new(t)
        }
        "fill_nan" => {
            let t: FillNan = parse(params)?;
            if t.value.is_nan() {
                return Err("`value` must be a number, not NaN".into());
            }
            Arc::new(t)
        }
        "clip" => {
            let t: Clip = parse(params)?;
            t.validate()?;
            Arc::new(t)
        }
        other => {
            return Err(format!(
                "unknown transform type `{other}`; the built-ins are {}",
                BUILTIN_KINDS.join(", ")
            ));
        }
    })
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
        let whole = |msg: String| EngineError::arg("chunk_transforms", json, msg);
        let list: serde_json::Value =
            serde_json::from_str(json).map_err(|e| whole(format!("not valid JSON: {e}")))?;
        let serde_json::Value::Array(list) = list else {
            return Err(whole("must be a list of transforms".into()));
        };
        for (i, item) in list.into_iter().enumerate() {
            let shown = item.to_string();
            let bad =
                |msg: String| EngineError::arg("chunk_transforms", format!("[{i}] {shown}"), msg);
            let serde_json::Value::Object(mut obj) = item else {
                return Err(bad("each transform is an object with a `type`".into()));
            };
            let kind = match obj.remove("type") {
                Some(serde_json::Value::String(k)) => k,
                _ => {
                    let kinds = BUILTIN_KINDS.join(", ");
                    return Err(bad(format!("needs a string `type`: one of {kinds}")));
                }
            };
            let applies = match obj.remove("applies") {
                None | Some(serde_json::Value::Null) => None,
                Some(v) => Some(
                    serde_json::from_value::<Vec<String>>(v)
                        .map_err(|_| bad("`applies` must be a list of array paths".into()))?,
                ),
            };
            let transform = builtin(&kind, serde_json::Value::Object(obj))
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
            for (i, e) in self.entries.iter().enumerate() {
                if e.applies.as_ref().is_some_and(|a| !a.contains(path)) {
                    continue;
                }
                e.transform.check(inner, *dtype).map_err(|why| {
                    EngineError::arg(
                        "chunk_transforms",
                        format!("[{i}] {}", e.transform.identity()),
                        format!("cannot apply to array `{path}`: {why}"),
                    )
                })?;
                steps.push(Arc::clone(&e.transform));
            }
            out.insert(path.clone(), Pipeline { steps });
        }
        Ok(out)
    }
}

/// One array's chunk transforms, in order.
#[derive(Clone, Debug, Default)]
pub struct Pipeline {
    steps: Vec<Arc<dyn ChunkTransform>>,
}

impl Pipeline {
    /// True when the array's chunks are cached as decoded.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Every step's identity, in order (the array's cache fingerprint is made of these).
    pub fn identities(&self) -> Vec<String> {
        self.steps.iter().map(|s| s.identity()).collect()
    }

    /// Runs every step on a chunk of `shape` (`[samples_per_chunk, *inner_shape]`).
    pub fn apply(&self, shape: &[u64], dtype: DType, bytes: &mut [u8]) {
        debug_assert_eq!(
            shape.iter().product::<u64>() as usize * dtype.size_bytes(),
            bytes.len()
        );
        for step in &self.steps {
            step.apply(ChunkMut {
                shape,
                dtype,
                bytes: &mut *bytes,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    fn back(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn run(t: &dyn ChunkTransform, shape: &[u64], v: &[f32]) -> Vec<f32> {
        let mut b = f32s(v);
        t.apply(ChunkMut {
            shape,
            dtype: DType::Float32,
            bytes: &mut b,
        });
        back(&b)
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
        let t = Affine::new(0.5, -3.0).unwrap();
        let x: Vec<f32> = (0..9).map(|i| i as f32).collect();
        let mut buf = vec![0u8; 1];
        buf.extend(f32s(&x));
        t.apply(ChunkMut {
            shape: &[9],
            dtype: DType::Float32,
            bytes: &mut buf[1..],
        });
        assert_eq!(back(&buf[1..]), run(&t, &[9], &x));
        assert_eq!(back(&buf[1..])[4], -1.0);
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
        let mut b: Vec<u8> = 3.0f64.to_ne_bytes().to_vec();
        t.apply(ChunkMut {
            shape: &[1],
            dtype: DType::Float64,
            bytes: &mut b,
        });
        assert_eq!(f64::from_ne_bytes(b.try_into().unwrap()), 3.0 * 0.1);
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
