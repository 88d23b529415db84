//! Regions of a field given in coordinate values (degrees of latitude and longitude, metres,
//! levels) instead of indices. An array's dimension names (Zarr v3 `dimension_names`, or the
//! `_ARRAY_DIMENSIONS` attribute xarray writes to v2) name the 1-D coordinate arrays beside it;
//! those are read, and each range of values becomes the run of indices whose coordinates lie in
//! it: the region [`ArrayGeometry::crop`] (or, across the seam of a periodic axis,
//! [`ArrayGeometry::crop_wrapping`]) takes.

use std::cmp::Ordering;
use std::path::Path;

use insitubatch_actors::StoreAxis;
use insitubatch_store::{DType, ZarrArray};

use crate::dataset::open_store;
use crate::{ArrayGeometry, EngineError};

/// A range of one dimension's coordinate values, both ends included (to the coordinate's own
/// precision: a float32 coordinate matches a bound it rounds to).
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinateBounds {
    /// The dimension's name, which is also the name of its coordinate array.
    pub dim: String,
    /// One end of the range.
    pub start: f64,
    /// The other end.
    pub stop: f64,
    /// For a periodic coordinate (longitude in degrees: 360), the range runs upward from
    /// `start` to `stop` round the circle, across the seam if it must (`start` 335 or -25 and
    /// `stop` 45 is the 70° from 25°W to 45°E). Without a period the ends may come in either
    /// order.
    pub period: Option<f64>,
}

/// A field region from coordinate bounds: one `(start, end)` index range per field axis, in
/// physical order (the whole axis where no bounds were given), and whether a range runs across
/// the end of its axis (then crop with [`ArrayGeometry::crop_wrapping`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinateRegion {
    /// Index ranges, half-open; with `wrap`, an end past the axis length continues from its
    /// start.
    pub region: Vec<(i64, i64)>,
    /// True when a range runs across the end of its axis.
    pub wrap: bool,
}

impl CoordinateRegion {
    /// `geom` cropped to this region (a wrapping crop whose ranges do not wrap is a plain
    /// one).
    pub fn crop(&self, geom: &ArrayGeometry) -> Result<ArrayGeometry, EngineError> {
        Ok(geom.crop_wrapping(&self.region)?)
    }
}

/// The region of array `array` of the store at `root` (sampled along `sample_axis`) that
/// `bounds` describe. Reads the coordinate arrays the bounds name.
pub fn coordinate_region(
    root: impl AsRef<Path>,
    array: &str,
    sample_axis: usize,
    bounds: &[CoordinateBounds],
    storage_options: &[(String, String)],
) -> Result<CoordinateRegion, EngineError> {
    let (store, hierarchy, runtime) = open_store(root.as_ref(), storage_options, &[])?;
    let arr = array_in(&hierarchy, array)?;
    if sample_axis >= arr.ndim() {
        return Err(EngineError::arg(
            "sample_axis",
            sample_axis,
            format!("array `{array}` has {} axes", arr.ndim()),
        ));
    }
    let dims = arr.dimension_names().ok_or_else(|| {
        EngineError::arg(
            "bounds",
            array,
            "the array has no dimension names (Zarr v3 `dimension_names`, or the v2 attribute \
             `_ARRAY_DIMENSIONS`), so its axes have no coordinates: crop it by index",
        )
    })?;
    let field: Vec<usize> = (0..arr.ndim()).filter(|&a| a != sample_axis).collect();
    let mut region: Vec<(i64, i64)> = field.iter().map(|&a| (0, arr.shape()[a] as i64)).collect();
    let mut wrap = false;
    for (k, b) in bounds.iter().enumerate() {
        if bounds[..k].iter().any(|o| o.dim == b.dim) {
            return Err(EngineError::arg(
                "bounds",
                &b.dim,
                "this dimension is given twice",
            ));
        }
        let axis = dims.iter().position(|d| *d == b.dim);
        let Some(slot) = axis.and_then(|a| field.iter().position(|&f| f == a)) else {
            let field_dims: Vec<&str> = field.iter().map(|&a| dims[a].as_str()).collect();
            let why = if axis == Some(sample_axis) {
                "is the sample axis, which splits and manifests divide (`sample_range`), not \
                 crops"
            } else {
                "is not a dimension of the array"
            };
            return Err(EngineError::arg(
                "bounds",
                &b.dim,
                format!(
                    "`{}` {why}; the field dimensions of `{array}` are {field_dims:?}",
                    b.dim
                ),
            ));
        };
        let (coord_path, coord) =
            coordinate_array(&hierarchy.arrays, array, &b.dim).map_err(|why| {
                EngineError::arg("bounds", &b.dim, format!("{why}; crop that axis by index"))
            })?;
        let n = arr.shape()[field[slot]];
        if coord.shape() != [n] {
            return Err(EngineError::arg(
                "bounds",
                &b.dim,
                format!(
                    "the coordinate array `{coord_path}` has shape {:?}, but `{array}` has {n} \
                     along `{}`: it is not that axis's coordinate",
                    coord.shape(),
                    b.dim
                ),
            ));
        }
        let bytes = read_whole(&runtime, &store, coord)?;
        let values = numbers(coord.dtype(), &bytes).ok_or_else(|| {
            EngineError::arg(
                "bounds",
                coord.path(),
                format!(
                    "a coordinate of {} cannot be compared with numbers",
                    coord.dtype().name()
                ),
            )
        })?;
        let tolerance = if coord.dtype() == DType::Float32 {
            f64::from(f32::EPSILON)
        } else {
            4.0 * f64::EPSILON
        };
        let (range, wraps) = index_range(&values, b, tolerance)
            .map_err(|why| EngineError::arg("bounds", &b.dim, format!("{coord_path}: {why}")))?;
        region[slot] = range;
        wrap |= wraps;
    }
    Ok(CoordinateRegion { region, wrap })
}

/// The values of one dimension's coordinate array, as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinateValues {
    /// The dimension.
    pub dim: String,
    /// The coordinate array's path.
    pub path: String,
    /// Element type.
    pub dtype: DType,
    /// One native-endian element per index along the dimension.
    pub bytes: Vec<u8>,
    /// The coordinate array's attributes (`units` and `calendar` say what a time is).
    pub attributes: serde_json::Map<String, serde_json::Value>,
}

impl CoordinateValues {
    /// The values as `f64` (`None` for a type that is not a real number).
    pub fn as_f64(&self) -> Option<Vec<f64>> {
        numbers(self.dtype, &self.bytes)
    }

    /// Value `i` as a date and time when the coordinate is a CF time axis of a Gregorian
    /// calendar ([`cf_time`]), else `None`.
    pub fn time_at(&self, i: usize) -> Option<String> {
        let attr = |k: &str| self.attributes.get(k).and_then(|v| v.as_str());
        let size = self.dtype.size_bytes();
        let one = self.bytes.get(i * size..(i + 1) * size)?;
        cf_time(
            *numbers(self.dtype, one)?.first()?,
            attr("units")?,
            attr("calendar"),
        )
    }

    /// The values as JSON: `{"dimension", "path", "dtype", "values", "attributes"}`, integers
    /// exactly, floats as numbers (NaN and infinities, which JSON lacks, as null).
    pub fn to_json(&self) -> serde_json::Value {
        let values: Vec<serde_json::Value> = elements(self.dtype, &self.bytes)
            .unwrap_or_default()
            .into_iter()
            .map(|e| match e {
                Element::Int(i) => i.into(),
                Element::Uint(u) => u.into(),
                Element::Float(f) => f.into(),
            })
            .collect();
        serde_json::json!({
            "dimension": self.dim,
            "path": self.path,
            "dtype": self.dtype.name(),
            "values": values,
            "attributes": self.attributes,
        })
    }
}

/// The coordinate values of dimension `dim` of array `array` (default: the sample axis's
/// dimension, `time` for an ERA5-like variable) in the store at `root`: the 1-D array named by
/// the dimension, beside `array`, read whole. With the batch's `read_indices` they give each
/// sample's time.
pub fn coordinate_values(
    root: impl AsRef<Path>,
    array: &str,
    dim: Option<&str>,
    sample_axis: usize,
    storage_options: &[(String, String)],
) -> Result<CoordinateValues, EngineError> {
    let (store, hierarchy, runtime) = open_store(root.as_ref(), storage_options, &[])?;
    let arr = array_in(&hierarchy, array)?;
    let dims = arr.dimension_names().ok_or_else(|| {
        EngineError::arg(
            "dimension",
            array,
            "the array has no dimension names (Zarr v3 `dimension_names`, or the v2 attribute \
             `_ARRAY_DIMENSIONS`), so its axes have no coordinate arrays",
        )
    })?;
    let axis = match dim {
        Some(d) => dims.iter().position(|x| x == d).ok_or_else(|| {
            EngineError::arg(
                "dimension",
                d,
                format!("`{d}` is not a dimension of `{array}`, whose dimensions are {dims:?}"),
            )
        })?,
        None if sample_axis < dims.len() => sample_axis,
        None => {
            return Err(EngineError::arg(
                "sample_axis",
                sample_axis,
                format!("array `{array}` has {} axes", dims.len()),
            ));
        }
    };
    let dim = dims[axis].clone();
    let (path, coord) = coordinate_array(&hierarchy.arrays, array, &dim)
        .map_err(|why| EngineError::arg("dimension", &dim, why))?;
    let n = arr.shape()[axis];
    if coord.shape() != [n] || numbers(coord.dtype(), &[]).is_none() {
        return Err(EngineError::arg(
            "dimension",
            &dim,
            format!(
                "the coordinate array `{path}` is {:?} {}, but `{array}` has {n} along `{dim}`: \
                 a coordinate is one real number per index",
                coord.shape(),
                coord.dtype().name()
            ),
        ));
    }
    let bytes = read_whole(&runtime, &store, coord)?;
    Ok(CoordinateValues {
        dim,
        path,
        dtype: coord.dtype(),
        bytes,
        attributes: coord.attributes().clone(),
    })
}

/// A coordinate value in CF time units (`units` such as `"hours since 1900-01-01 00:00:00"`)
/// as an ISO 8601 date and time (`1979-01-01T06:00`, seconds shown when there are any), for
/// the Gregorian calendars (`standard`, `gregorian`, `proleptic_gregorian`, or none given);
/// `None` for other units or calendars, a reference date it cannot read, or a value that is
/// not finite. What `insitubatch inspect` shows a time axis in.
pub fn cf_time(value: f64, units: &str, calendar: Option<&str>) -> Option<String> {
    let (step, origin) = cf_units(units, calendar)?;
    let t = instant(value, step, origin)?;
    let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    Some(if ss == 0 {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}")
    } else {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}")
    })
}

/// Seconds from 1970-01-01T00:00 to `value` units of `step` seconds after `origin` (as
/// [`cf_units`] gives them), rounded to the second; `None` when it is not finite or an `i64`
/// does not hold it.
fn instant(value: f64, step: f64, origin: i64) -> Option<i64> {
    let s = (value * step).round();
    (s.is_finite() && s.abs() < 9.0e18).then(|| origin.checked_add(s as i64))?
}

/// CF time `units` (`"hours since 1900-01-01"`) in a Gregorian `calendar` (`standard`,
/// `gregorian`, `proleptic_gregorian`, or none given) as (seconds per unit, seconds from
/// 1970-01-01T00:00 to the reference date); `None` for anything else.
fn cf_units(units: &str, calendar: Option<&str>) -> Option<(f64, i64)> {
    let calendar = calendar.unwrap_or("standard").to_ascii_lowercase();
    if !matches!(
        calendar.as_str(),
        "standard" | "gregorian" | "proleptic_gregorian"
    ) {
        return None;
    }
    let (unit, since) = units.split_once(" since ")?;
    let step = match unit.trim().to_ascii_lowercase().as_str() {
        "days" | "day" | "d" => 86_400.0,
        "hours" | "hour" | "hr" | "h" => 3_600.0,
        "minutes" | "minute" | "min" => 60.0,
        "seconds" | "second" | "sec" | "s" => 1.0,
        "milliseconds" | "millisecond" | "ms" => 1e-3,
        "microseconds" | "microsecond" | "us" => 1e-6,
        _ => return None,
    };
    Some((step, reference_seconds(since.trim())?))
}

/// The first index of time coordinate `coord` at or after `date` (`2016-01-01`,
/// `2016-01-01T06:00`, `2016-01-01 06:00:00`; UTC, to the second), or its length when every
/// time is earlier: where a half-open range of dates starts or stops, as numpy's
/// `searchsorted(times, date)`. The coordinate must be in CF time units of a Gregorian
/// calendar and rise strictly.
pub fn time_index(coord: &CoordinateValues, date: &str) -> Result<u64, EngineError> {
    let attr = |k: &str| coord.attributes.get(k).and_then(|v| v.as_str());
    let what = format!("the time coordinate `{}`", coord.path);
    let (step, origin) = attr("units")
        .and_then(|u| cf_units(u, attr("calendar")))
        .ok_or_else(|| {
            EngineError::arg(
                "ranges",
                date,
                format!(
                    "{what} has units {:?} and calendar {:?}; a date needs CF time units (\"hours \
                     since 1979-01-01\") in a Gregorian calendar: give sample indices instead",
                    attr("units").unwrap_or("(none)"),
                    attr("calendar").unwrap_or("(none)")
                ),
            )
        })?;
    let target = reference_seconds(date.trim()).ok_or_else(|| {
        EngineError::arg(
            "ranges",
            date,
            "not a date: write it as 2016-01-01, 2016-01-01T06:00 or 2016-01-01 06:00:00",
        )
    })?;
    // Microseconds from the reference date, so that 1/24 of a day is an hour exactly.
    let micros = |seconds: f64| (seconds * 1e6).round() as i64;
    let values = numbers(coord.dtype, &coord.bytes).unwrap_or_default();
    let times: Vec<i64> = values.iter().map(|v| micros(v * step)).collect();
    if values.iter().any(|v| !v.is_finite()) || times.windows(2).any(|w| w[0] >= w[1]) {
        return Err(EngineError::arg(
            "ranges",
            date,
            format!("{what} does not rise strictly, so a date is not a place along it"),
        ));
    }
    let at = micros((target - origin) as f64);
    Ok(times.partition_point(|t| *t < at) as u64)
}

/// A coordinate's values as keys that compare across stores: CF times as microseconds since
/// 1970 (so that `hours since 1979-01-01` meets `days since 1900-01-01`), other numbers as
/// they are, with their `units`.
#[derive(Clone, Debug, PartialEq)]
enum CoordinateKeys {
    Instants(Vec<i64>),
    Numbers(Vec<f64>, Option<String>),
}

impl CoordinateKeys {
    fn of(coord: &ZarrArray, bytes: &[u8]) -> Option<Self> {
        let attr = |k: &str| coord.attributes().get(k).and_then(|v| v.as_str());
        let values = numbers(coord.dtype(), bytes)?;
        Some(
            match attr("units").and_then(|u| cf_units(u, attr("calendar"))) {
                // (Saturating: a time past the year 292,000 is not one, and shows as a
                // coordinate that does not rise strictly.)
                Some((step, origin)) => Self::Instants(
                    values
                        .iter()
                        .map(|v| {
                            (origin * 1_000_000).saturating_add((v * step * 1e6).round() as i64)
                        })
                        .collect(),
                ),
                None => Self::Numbers(values, attr("units").map(str::to_string)),
            },
        )
    }

    fn len(&self) -> usize {
        match self {
            Self::Instants(v) => v.len(),
            Self::Numbers(v, _) => v.len(),
        }
    }

    /// Value `i` for a message: a date and time, or the number.
    fn show(&self, i: usize) -> String {
        match self {
            Self::Instants(v) => cf_time(v[i] as f64 / 1e6, "seconds since 1970-01-01", None)
                .unwrap_or_else(|| v[i].to_string()),
            Self::Numbers(v, _) => v[i].to_string(),
        }
    }

    /// How value `i` of `self` compares with value `j` of `other` (`None` for a NaN).
    fn cmp_at(&self, i: usize, other: &Self, j: usize) -> Option<Ordering> {
        match (self, other) {
            (Self::Instants(a), Self::Instants(b)) => Some(a[i].cmp(&b[j])),
            (Self::Numbers(a, _), Self::Numbers(b, _)) => a[i].partial_cmp(&b[j]),
            _ => None,
        }
    }

    fn rises(&self) -> bool {
        (1..self.len()).all(|i| self.cmp_at(i - 1, self, i) == Some(Ordering::Less))
    }
}

/// Where the store mounted as `mount` sits on the sample axis of the dataset's store, from the
/// coordinates `dim` of both (the root's beside `root_array`, or at its top without one; the
/// mount's beside `mount_array`). Stepping alike: it starts at the index `k` of the root's
/// coordinate equal to the mount's first value (or minus the index of the mount's value equal
/// to the root's first, when it starts earlier), and every value the two share a place for
/// must match. Stepping at different rates: both must be CF times stepping evenly, and the
/// mount's sample `j` is at the root's `(start + j step) / per`, as it is when `rounds` (a
/// containing or nearest alignment: each anchor reads the sample before or nearest it, so the
/// times need not meet, nor the stores overlap, but each needs two times for a step). Each
/// coordinate must rise strictly and be as long as its array along the sample axis.
pub(crate) fn mount_start(
    runtime: &insitubatch_runtime::Runtime,
    store: &insitubatch_store::MountedStore,
    hierarchy: &insitubatch_store::Hierarchy,
    (mount, dim): (&str, &str),
    root_array: Option<(&str, u64)>,
    mount_array: (&str, u64),
    rounds: bool,
) -> Result<StoreAxis, EngineError> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let refuse = |why: String| EngineError::arg("mounts", mount, why);
    let keys = |array: Option<(&str, u64)>| -> Result<(String, CoordinateKeys), EngineError> {
        // Without a variable of the root store, its coordinate at the top of its hierarchy.
        let (array, n) = array.map_or(("", None), |(a, n)| (a, Some(n)));
        let (path, coord) = match coordinate_array(&hierarchy.arrays, array, dim) {
            Ok(found) => found,
            Err(_) if array.is_empty() => {
                return Err(refuse(format!(
                    "cannot align on `{dim}`: the dataset's store has no coordinate array \
                     `{dim}` at its root"
                )));
            }
            Err(why) => return Err(refuse(format!("cannot align on `{dim}`: {why}"))),
        };
        if let Some(n) = n
            && coord.shape() != [n]
        {
            return Err(refuse(format!(
                "cannot align on `{dim}`: the coordinate `{path}` has shape {:?} but \
                 `{array}` has {n} samples along its sample axis",
                coord.shape()
            )));
        }
        let bytes = read_whole(runtime, store, coord)?;
        let keys = CoordinateKeys::of(coord, &bytes).ok_or_else(|| {
            refuse(format!(
                "cannot align on `{dim}`: `{path}` holds {}, not numbers",
                coord.dtype().name()
            ))
        })?;
        if !keys.rises() {
            return Err(refuse(format!(
                "cannot align on `{dim}`: the values of `{path}` do not rise strictly"
            )));
        }
        Ok((path, keys))
    };
    let (root_path, root) = keys(root_array)?;
    let (mount_path, mounted) = keys(Some(mount_array))?;
    if root.len() == 0 || mounted.len() == 0 {
        return Ok(StoreAxis::ROOT);
    }
    if root.cmp_at(0, &mounted, 0).is_none() {
        let units = |k: &CoordinateKeys| match k {
            CoordinateKeys::Instants(_) => "CF time units".to_string(),
            CoordinateKeys::Numbers(_, u) => {
                format!("units {:?}", u.as_deref().unwrap_or("(none)"))
            }
        };
        return Err(refuse(format!(
            "cannot align on `{dim}`: `{root_path}` has {} and `{mount_path}` {}; give the \
             alignment as a sample offset instead",
            units(&root),
            units(&mounted)
        )));
    }
    if let CoordinateKeys::Numbers(_, u) = &root
        && let CoordinateKeys::Numbers(_, v) = &mounted
        && u != v
    {
        return Err(refuse(format!(
            "cannot align on `{dim}`: `{root_path}` is in units {u:?} and `{mount_path}` in \
             {v:?}; give the alignment as a sample offset instead"
        )));
    }
    let (last_r, last_m) = (root.len() - 1, mounted.len() - 1);
    let range = |k: &CoordinateKeys, path: &str, last: usize| {
        format!("`{path}` runs from {} to {}", k.show(0), k.show(last))
    };
    if rounds {
        // The period a sample stands for is its step: one time has none.
        for (k, path) in [(&root, &root_path), (&mounted, &mount_path)] {
            if k.len() < 2 {
                return Err(refuse(format!(
                    "a containing or nearest alignment needs each store's time step, and \
                     `{path}` holds one time; align on `{dim}` or give a sample offset instead"
                )));
            }
        }
    }
    // (Read at the sample before or nearest each time, stores that do not overlap may still
    // have anchors to read, within a step of either end: left to the anchor check.)
    if !rounds
        && (mounted.cmp_at(0, &root, last_r) == Some(Greater)
            || mounted.cmp_at(last_m, &root, 0) == Some(Less))
    {
        return Err(refuse(format!(
            "the stores share no `{dim}`: {} and {}",
            range(&root, &root_path, last_r),
            range(&mounted, &mount_path, last_m)
        )));
    }
    // Stores stepping at different rates (6-hourly targets beside hourly inputs): CF times
    // only, each stepping evenly; sample j of the mount is at the root's (d + j dm) / dr.
    let steps = |k: &CoordinateKeys| match k {
        CoordinateKeys::Instants(v) if v.len() > 1 => Some((v[1] - v[0]) as f64),
        CoordinateKeys::Numbers(v, _) if v.len() > 1 => Some(v[1] - v[0]),
        _ => None,
    };
    if let (Some(dr), Some(dm)) = (steps(&root), steps(&mounted))
        && (dr != dm || rounds)
    {
        let (CoordinateKeys::Instants(r), CoordinateKeys::Instants(m)) = (&root, &mounted) else {
            let what = if rounds {
                "a containing or nearest alignment reads".to_string()
            } else {
                format!(
                    "`{root_path}` steps by {dr} and `{mount_path}` by {dm}: stores at different rates align"
                )
            };
            return Err(refuse(format!(
                "{what} only on CF times (units such as \"hours since 1979-01-01\")"
            )));
        };
        let even =
            |v: &[i64], path: &str| match v.windows(2).position(|w| w[1] - w[0] != v[1] - v[0]) {
                None => Ok(v[1] - v[0]),
                Some(i) => Err(refuse(format!(
                    "`{root_path}` steps by {} and `{mount_path}` by {}, and stores at different \
                 rates align only when each steps evenly, but `{path}` steps by {} from its \
                 index {i}",
                    duration(r[1] - r[0]),
                    duration(m[1] - m[0]),
                    duration(v[i + 1] - v[i])
                ))),
            };
        let (dr, dm) = (even(r, &root_path)?, even(m, &mount_path)?);
        // Both rise strictly, so both steps are positive.
        return Ok(StoreAxis::from_times(
            m[0] - r[0],
            dm.unsigned_abs(),
            dr.unsigned_abs(),
        ));
    }
    // The first shared value: the mount's first in the root, or the root's first in the mount.
    let find = |within: &CoordinateKeys, of: &CoordinateKeys, i: usize| {
        let (mut lo, mut hi) = (0, within.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if within.cmp_at(mid, of, i) == Some(Less) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (lo < within.len() && within.cmp_at(lo, of, i) == Some(Equal)).then_some(lo)
    };
    let start = if mounted.cmp_at(0, &root, 0) != Some(Less) {
        find(&root, &mounted, 0).map(|p| p as i64)
    } else {
        find(&mounted, &root, 0).map(|p| -(p as i64))
    };
    let Some(k) = start else {
        return Err(refuse(format!(
            "the `{dim}` values of the two stores are not on one grid: {} and {} share no \
             value where they meet; resample one store, or give a sample offset",
            range(&root, &root_path, last_r),
            range(&mounted, &mount_path, last_m)
        )));
    };
    // Every place the two share must hold the same value (the same step, no gap in one).
    for j in 0..mounted.len() {
        let i = j as i64 + k;
        if i < 0 {
            continue;
        }
        if i as usize > last_r {
            break;
        }
        if mounted.cmp_at(j, &root, i as usize) != Some(Equal) {
            return Err(refuse(format!(
                "the `{dim}` values of the two stores part: aligned at `{root_path}`[{k}] = \
                 `{mount_path}`[0], `{mount_path}`[{j}] is {} where `{root_path}`[{i}] is {} \
                 (a gap in one store, or uneven steps); only stores on one grid align",
                mounted.show(j),
                root.show(i as usize)
            )));
        }
    }
    Ok(StoreAxis::starting_at(k))
}

/// A time step in microseconds, for a message: `6 h`, `30 min`, `90 s`.
fn duration(micros: i64) -> String {
    let (hour, minute, second) = (3_600_000_000, 60_000_000, 1_000_000);
    if micros % hour == 0 {
        format!("{} h", micros / hour)
    } else if micros % minute == 0 {
        format!("{} min", micros / minute)
    } else if micros % second == 0 {
        format!("{} s", micros / second)
    } else {
        format!("{micros} µs")
    }
}

/// A calendar cycle a field may vary over rather than along the archive: which part of each
/// time a climatology is indexed by ([`cycle_index`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cycle {
    /// The day of the year, 0 for January 1 (365 for December 31 of a leap year): 366 entries.
    DayOfYear,
    /// The month, 0 for January: 12 entries.
    Month,
    /// The hour of the day (UTC), 0 to 23: 24 entries.
    HourOfDay,
}

impl std::str::FromStr for Cycle {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "dayofyear" => Ok(Self::DayOfYear),
            "month" => Ok(Self::Month),
            "hour" => Ok(Self::HourOfDay),
            other => Err(format!(
                "`{other}` is not a cycle: use dayofyear, month or hour"
            )),
        }
    }
}

/// Each value of the CF time coordinate `coord` as its place in `cycle`, from 0: the index a
/// climatology by that cycle is read at for each sample (`DatasetBuilder::index`). The
/// coordinate must be in CF time units of a Gregorian calendar; a value that is not finite is
/// refused naming its index.
pub fn cycle_index(coord: &CoordinateValues, cycle: Cycle) -> Result<Vec<u64>, EngineError> {
    let attr = |k: &str| coord.attributes.get(k).and_then(|v| v.as_str());
    let (step, origin) = attr("units")
        .and_then(|u| cf_units(u, attr("calendar")))
        .ok_or_else(|| {
            EngineError::arg(
                "index",
                &coord.path,
                format!(
                    "a cycle index needs CF time units (\"hours since 1979-01-01\") in a \
                     Gregorian calendar; `{}` has units {:?} and calendar {:?}",
                    coord.path,
                    attr("units").unwrap_or("(none)"),
                    attr("calendar").unwrap_or("(none)")
                ),
            )
        })?;
    let values = numbers(coord.dtype, &coord.bytes).unwrap_or_default();
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            if !v.is_finite() {
                return Err(EngineError::arg(
                    "index",
                    &coord.path,
                    format!("its value {i} is {v}, not a time"),
                ));
            }
            let Some(t) = instant(*v, step, origin) else {
                return Err(EngineError::arg(
                    "index",
                    &coord.path,
                    format!("its value {i} is {v}, past any date its units can say"),
                ));
            };
            let days = t.div_euclid(86_400);
            let (y, m, _) = civil_from_days(days);
            Ok(match cycle {
                Cycle::DayOfYear => (days - days_from_civil(y, 1, 1)) as u64,
                Cycle::Month => (m - 1) as u64,
                Cycle::HourOfDay => (t.rem_euclid(86_400) / 3_600) as u64,
            })
        })
        .collect()
}

/// One end of a split's range of samples: a sample index, or a date on the time coordinate of
/// the array (the first sample at or after it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SampleBound {
    /// A sample index along the sample axis.
    Index(u64),
    /// A date such as `2016-01-01` or `2016-01-01T06:00` (UTC, to the second).
    Time(String),
}

/// `ranges` (a split's name and the two ends of its half-open range) as ranges of sample
/// indices of `geom`, what [`crate::split_by_ranges`] takes. Dates are looked up on the time
/// coordinate of `geom`'s sample axis ([`time_index`]), read once and only if a date is given.
pub fn sample_ranges(
    root: impl AsRef<Path>,
    geom: &ArrayGeometry,
    ranges: &[(String, SampleBound, SampleBound)],
    storage_options: &[(String, String)],
) -> Result<Vec<(String, std::ops::Range<u64>)>, EngineError> {
    let mut coord: Option<CoordinateValues> = None;
    let mut index = |b: &SampleBound| -> Result<u64, EngineError> {
        match b {
            SampleBound::Index(i) => Ok(*i),
            SampleBound::Time(date) => {
                let c = match &mut coord {
                    Some(c) => c,
                    none => none.insert(coordinate_values(
                        root.as_ref(),
                        &geom.path,
                        None,
                        geom.sample_axis,
                        storage_options,
                    )?),
                };
                time_index(c, date)
            }
        }
    };
    let mut out = Vec::with_capacity(ranges.len());
    for (name, a, b) in ranges {
        out.push((name.clone(), index(a)?..index(b)?));
    }
    Ok(out)
}

/// Seconds from 1970-01-01T00:00 to a CF reference date (`1900-01-01`, `1900-01-01 00:00:00.0`,
/// `2000-01-01T00:00:00Z`; UTC only).
fn reference_seconds(text: &str) -> Option<i64> {
    let text = text
        .trim_end_matches("UTC")
        .trim_end_matches('Z')
        .trim_end_matches("+00:00")
        .trim();
    let (date, clock) = match text.split_once(['T', ' ']) {
        Some((d, c)) => (d, c.trim()),
        None => (text, ""),
    };
    let mut ymd = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (
        ymd.next()??,
        ymd.next().flatten().unwrap_or(1),
        ymd.next().flatten().unwrap_or(1),
    );
    // (Years within 100,000 of year 0, so that every instant in microseconds fits 64 bits.)
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || !(-100_000..=100_000).contains(&y) {
        return None;
    }
    let mut hms = clock
        .split(':')
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<f64>().ok());
    let (h, mi, sec) = (
        hms.next().map_or(Some(0.0), |v| v)?,
        hms.next().map_or(Some(0.0), |v| v)?,
        hms.next().map_or(Some(0.0), |v| v)?,
    );
    if !((0.0..=24.0).contains(&h) && (0.0..60.0).contains(&mi) && (0.0..61.0).contains(&sec)) {
        return None;
    }
    Some(days_from_civil(y, m, d) * 86_400 + (h * 3600.0 + mi * 60.0 + sec).round() as i64)
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (eras of 400 years of
/// 146,097 days, each year counted from March so that the leap day ends it).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (m + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + d - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date `days` after 1970-01-01 in the proleptic Gregorian calendar (the inverse of
/// [`days_from_civil`]).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let d = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let m = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let y = year_of_era + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Array `array` of a store's hierarchy, or an error naming it and the arrays there are.
fn array_in<'a>(
    hierarchy: &'a insitubatch_store::Hierarchy,
    array: &str,
) -> Result<&'a ZarrArray, EngineError> {
    hierarchy.arrays.get(array).ok_or_else(|| {
        let names: Vec<&str> = hierarchy.arrays.keys().map(String::as_str).collect();
        EngineError::arg(
            "array",
            array,
            format!("the store has no such array; it has {names:?}"),
        )
    })
}

/// Every element of 1-D array `coord`, native-endian, read on `runtime`.
fn read_whole(
    runtime: &insitubatch_runtime::Runtime,
    store: &insitubatch_store::MountedStore,
    coord: &ZarrArray,
) -> Result<Vec<u8>, EngineError> {
    runtime
        .block_on({
            let (store, coord) = (store.clone(), coord.clone());
            move || async move { read_elements(&store, &coord).await }
        })
        .map_err(|e| EngineError::Runtime(e.to_string()))?
}

/// Every element of 1-D array `coord`, native-endian, read chunk by chunk (the last chunk's
/// part past the end left out).
async fn read_elements<S: insitubatch_store::Store>(
    store: &S,
    coord: &ZarrArray,
) -> Result<Vec<u8>, EngineError> {
    let size = coord.dtype().size_bytes();
    let total = coord.shape()[0] as usize * size;
    let mut bytes = Vec::with_capacity(total);
    for index in coord.chunk_indices() {
        let chunk = coord.read_chunk(store, &index).await?;
        let take = chunk.bytes.len().min(total - bytes.len());
        bytes.extend_from_slice(&chunk.bytes[..take]);
    }
    Ok(bytes)
}

/// The coordinate array of dimension `dim` of `array`: the array named `dim` in the same group;
/// or why there is none.
pub(crate) fn coordinate_array<'a>(
    arrays: &'a std::collections::BTreeMap<String, ZarrArray>,
    array: &str,
    dim: &str,
) -> Result<(String, &'a ZarrArray), String> {
    let path = match array.rsplit_once('/') {
        Some((group, _)) => format!("{group}/{dim}"),
        None => dim.to_string(),
    };
    match arrays.get(&path) {
        Some(coord) if coord.ndim() == 1 => Ok((path, coord)),
        Some(coord) => Err(format!(
            "`{path}` has {} axes; a coordinate array has one",
            coord.ndim()
        )),
        None => Err(format!(
            "there is no coordinate array `{path}` beside `{array}` to read its values from"
        )),
    }
}

/// The first and last values of 1-D coordinate array `coord`, from its first and last stored
/// chunks; `None` when it is empty or cannot be read as numbers. For `insitubatch inspect`.
pub(crate) async fn coordinate_ends<S: insitubatch_store::Store>(
    store: &S,
    coord: &ZarrArray,
) -> Option<(f64, f64)> {
    let n = coord.shape()[0];
    if n == 0 {
        return None;
    }
    let per_chunk = coord.chunk_shape()[0];
    let last_chunk = (n - 1) / per_chunk;
    let first = coord.read_chunk(store, &[0]).await.ok()?;
    let first = *numbers(first.dtype, &first.bytes)?.first()?;
    let last = coord.read_chunk(store, &[last_chunk]).await.ok()?;
    let last = *numbers(last.dtype, &last.bytes)?.get(((n - 1) % per_chunk) as usize)?;
    Some((first, last))
}

/// One element of a real numeric array, kept exact.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Element {
    Int(i64),
    Uint(u64),
    Float(f64),
}

impl Element {
    fn as_f64(self) -> f64 {
        match self {
            Element::Int(i) => i as f64,
            Element::Uint(u) => u as f64,
            Element::Float(f) => f,
        }
    }
}

/// Native-endian elements of a real numeric type (booleans as 0 and 1); `None` for float16
/// and complex types.
fn elements(dtype: DType, bytes: &[u8]) -> Option<Vec<Element>> {
    macro_rules! each {
        ($t:ty, $kind:ident, $wide:ty) => {
            bytes
                .chunks_exact(std::mem::size_of::<$t>())
                .map(|b| {
                    Element::$kind(<$wide>::from(<$t>::from_ne_bytes(
                        b.try_into().expect("element width"),
                    )))
                })
                .collect()
        };
    }
    Some(match dtype {
        DType::Bool | DType::Uint8 => each!(u8, Uint, u64),
        DType::Int8 => each!(i8, Int, i64),
        DType::Int16 => each!(i16, Int, i64),
        DType::Int32 => each!(i32, Int, i64),
        DType::Int64 => each!(i64, Int, i64),
        DType::Uint16 => each!(u16, Uint, u64),
        DType::Uint32 => each!(u32, Uint, u64),
        DType::Uint64 => each!(u64, Uint, u64),
        DType::Float32 => each!(f32, Float, f64),
        DType::Float64 => each!(f64, Float, f64),
        DType::Float16 | DType::Complex64 | DType::Complex128 => return None,
    })
}

/// Native-endian elements of a real numeric type (booleans as 0 and 1) as f64; `None` for
/// float16 and complex types. An int64 beyond 2^53 rounds.
pub(crate) fn numbers(dtype: DType, bytes: &[u8]) -> Option<Vec<f64>> {
    Some(
        elements(dtype, bytes)?
            .into_iter()
            .map(Element::as_f64)
            .collect(),
    )
}

/// The run of indices of `coords` inside `b` (ends included, widened by `tolerance` relative
/// to the bound), and whether it runs across the end of the axis; or why there is none.
fn index_range(
    coords: &[f64],
    b: &CoordinateBounds,
    tolerance: f64,
) -> Result<((i64, i64), bool), String> {
    let n = coords.len();
    let rising = coords.windows(2).all(|w| w[0] < w[1]);
    let falling = coords.windows(2).all(|w| w[0] > w[1]);
    if coords.iter().any(|c| !c.is_finite()) || !(rising || falling) {
        return Err(
            "its values do not rise or fall strictly, so a range of them is not a \
                    run of indices"
                .into(),
        );
    }
    if !(b.start.is_finite() && b.stop.is_finite()) {
        return Err(format!(
            "the bounds {} and {} must be finite",
            b.start, b.stop
        ));
    }
    let slack = |x: f64| tolerance * x.abs().max(1.0);
    let described = || {
        format!(
            "no coordinate lies between {} and {} (they run from {} to {})",
            b.start,
            b.stop,
            coords[0],
            coords[n - 1]
        )
    };
    let Some(period) = b.period else {
        let (lo, hi) = (b.start.min(b.stop), b.start.max(b.stop));
        let inside = |c: f64| c >= lo - slack(lo) && c <= hi + slack(hi);
        let first = coords
            .iter()
            .position(|&c| inside(c))
            .ok_or_else(described)?;
        let count = coords[first..].iter().take_while(|&&c| inside(c)).count();
        return Ok(((first as i64, (first + count) as i64), false));
    };
    if !(period.is_finite() && period > 0.0) {
        return Err(format!("the period must be positive, not {period}"));
    }
    // Going upward from `start`: each coordinate's distance round the circle, and the span.
    let span = if b.stop - b.start >= period {
        period
    } else {
        (b.stop - b.start).rem_euclid(period)
    };
    let ahead: Vec<f64> = coords
        .iter()
        .map(|&c| (c - b.start).rem_euclid(period))
        .collect();
    let inside: Vec<bool> = ahead
        .iter()
        .map(|&d| d <= span + slack(b.stop) || period - d <= slack(b.start))
        .collect();
    let count = inside.iter().filter(|&&x| x).count();
    if count == 0 {
        return Err(described());
    }
    // The run starts at the selected index whose predecessor round the axis is not; when all
    // are selected, at the coordinate nearest `start` going upward.
    let first = if count == n {
        let nearest = |i: usize| {
            let d = ahead[i];
            if period - d <= slack(b.start) { 0.0 } else { d }
        };
        (0..n)
            .min_by(|&i, &j| nearest(i).total_cmp(&nearest(j)))
            .unwrap_or(0)
    } else {
        (0..n)
            .find(|&i| inside[i] && !inside[(i + n - 1) % n])
            .expect("a partial cyclic selection has a start")
    };
    if (0..count).any(|k| !inside[(first + k) % n]) {
        return Err(format!(
            "the coordinates between {} and {} are not one run of indices round the axis",
            b.start, b.stop
        ));
    }
    let end = first + count;
    Ok(((first as i64, end as i64), end > n))
}

#[cfg(test)]
mod cf_tests {
    use super::*;

    #[test]
    fn times_past_what_64_bits_hold_are_no_date_rather_than_an_overflow() {
        // (Each once overflowed an `i64`: the first found by the metadata fuzz, the others by
        // reading the code around it.)
        assert_eq!(
            cf_time(i64::MAX as f64, "hours since 2000-01-01", None),
            None
        );
        assert_eq!(cf_time(1e300, "seconds since 1970-01-01", None), None);
        assert_eq!(reference_seconds("292277026596-12-04"), None);
        assert_eq!(reference_seconds("2000-01-01 1e300:00"), None);
        assert_eq!(reference_seconds("1979-01-01 25:00"), None);
        assert_eq!(reference_seconds("1970-01-01 06:00"), Some(21_600));
        assert_eq!(
            cf_time(6.0, "hours since 1979-01-01 00:00:00", None).as_deref(),
            Some("1979-01-01T06:00")
        );
        let coord = CoordinateValues {
            dim: "time".into(),
            path: "time".into(),
            dtype: DType::Float64,
            bytes: [0.0f64, 1e18]
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect(),
            attributes: serde_json::from_str(r#"{"units": "days since 2000-01-01"}"#).unwrap(),
        };
        let e = cycle_index(&coord, Cycle::DayOfYear)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("value 1 is 1000000000000000000") && e.contains("past any date"),
            "{e}"
        );
    }

    #[test]
    fn cycle_indexes_are_each_times_day_month_and_hour_against_the_calendar() {
        // Hours since 1979-01-01: its first hour, 06:00, March 1 of a common year (day 59),
        // December 31 of a leap year at 18:00 (day 365), 2000-02-29 (day 59 of a leap year),
        // and a day before the reference (1978-12-31, day 364).
        let hours = [
            0.0,
            6.0,
            59.0 * 24.0,
            (365.0 + 365.0) * 24.0 + 18.0,
            24.0 * (365.0 * 21.0 + 5.0 + 31.0 + 28.0),
            -24.0,
        ];
        let t = time_coord(&hours, "hours since 1979-01-01", None);
        for (i, h) in hours.iter().enumerate() {
            let shown = cf_time(*h, "hours since 1979-01-01", None).unwrap();
            assert!(
                [
                    "1979-01-01T00:00",
                    "1979-01-01T06:00",
                    "1979-03-01T00:00",
                    "1980-12-31T18:00",
                    "2000-02-29T00:00",
                    "1978-12-31T00:00"
                ][i] == shown,
                "{i}: {shown}"
            );
        }
        assert_eq!(
            cycle_index(&t, Cycle::DayOfYear).unwrap(),
            [0, 0, 59, 365, 59, 364]
        );
        assert_eq!(cycle_index(&t, Cycle::Month).unwrap(), [0, 0, 2, 11, 1, 11]);
        assert_eq!(
            cycle_index(&t, Cycle::HourOfDay).unwrap(),
            [0, 6, 0, 18, 0, 0]
        );
        // Days as floats give the same.
        let days: Vec<f64> = hours.iter().map(|h| h / 24.0).collect();
        let d = time_coord(&days, "days since 1979-01-01 00:00", None);
        assert_eq!(
            cycle_index(&d, Cycle::DayOfYear).unwrap(),
            [0, 0, 59, 365, 59, 364]
        );
        assert_eq!(
            cycle_index(&d, Cycle::HourOfDay).unwrap(),
            [0, 6, 0, 18, 0, 0]
        );
        // Not CF, or not a time: refused naming the coordinate.
        let e = cycle_index(&time_coord(&[0.0], "steps", None), Cycle::Month)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`index` = time") && e.contains("CF time units"),
            "{e}"
        );
        let e = cycle_index(
            &time_coord(&[0.0, f64::NAN], "hours since 1979-01-01", None),
            Cycle::Month,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("its value 1 is NaN"), "{e}");
        assert_eq!("DayOfYear".parse::<Cycle>(), Ok(Cycle::DayOfYear));
        assert!("week".parse::<Cycle>().is_err());
    }

    #[test]
    fn cf_times_are_gregorian_dates_and_other_calendars_are_none() {
        let h = "hours since 1900-01-01 00:00:00.0";
        assert_eq!(cf_time(0.0, h, None).unwrap(), "1900-01-01T00:00");
        // ERA5's hours since 1900: 1979-01-01 is 692,496 hours on; 2000-02-29 a leap day.
        assert_eq!(
            cf_time(692_496.0, h, Some("gregorian")).unwrap(),
            "1979-01-01T00:00"
        );
        assert_eq!(
            cf_time(876_582.0, h, Some("proleptic_gregorian")).unwrap(),
            "2000-01-01T06:00"
        );
        let d = "days since 2000-01-01T00:00:00Z";
        assert_eq!(cf_time(59.0, d, None).unwrap(), "2000-02-29T00:00");
        assert_eq!(cf_time(-0.5, d, None).unwrap(), "1999-12-31T12:00");
        assert_eq!(
            cf_time(1.0 / 86_400.0, d, None).unwrap(),
            "2000-01-01T00:00:01"
        );
        assert_eq!(
            cf_time(
                1_700_000_000.0,
                "seconds since 1970-01-01",
                Some("standard")
            )
            .unwrap(),
            "2023-11-14T22:13:20"
        );
        assert_eq!(
            cf_time(1.0, "days since 1600-03-01", None).unwrap(),
            "1600-03-02T00:00"
        );
        assert_eq!(cf_time(1.0, "days since 2000-01-01", Some("noleap")), None);
        assert_eq!(cf_time(1.0, "metres", None), None);
        assert_eq!(cf_time(1.0, "fortnights since 2000-01-01", None), None);
        assert_eq!(cf_time(f64::NAN, d, None), None);
        // Every day of 800 years round-trips through the date.
        for days in -146_097..146_097 {
            let (y, m, dd) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, dd), days);
        }
    }

    fn time_coord(values: &[f64], units: &str, calendar: Option<&str>) -> CoordinateValues {
        let mut attributes = serde_json::Map::new();
        attributes.insert("units".into(), units.into());
        if let Some(c) = calendar {
            attributes.insert("calendar".into(), c.into());
        }
        CoordinateValues {
            dim: "time".into(),
            path: "time".into(),
            dtype: DType::Float64,
            bytes: values.iter().flat_map(|v| v.to_ne_bytes()).collect(),
            attributes,
        }
    }

    #[test]
    fn a_date_is_the_first_index_at_or_after_it() {
        // Hourly, as fractions of a day (1/24 is not exact in binary).
        let hourly: Vec<f64> = (0..96).map(|h| f64::from(h) / 24.0).collect();
        let c = time_coord(
            &hourly,
            "days since 2015-12-30",
            Some("proleptic_gregorian"),
        );
        assert_eq!(time_index(&c, "2015-12-30").unwrap(), 0);
        assert_eq!(time_index(&c, "2015-12-31").unwrap(), 24);
        assert_eq!(time_index(&c, "2016-01-01T06:00").unwrap(), 54);
        assert_eq!(time_index(&c, "2016-01-01 06:00:01").unwrap(), 55);
        assert_eq!(time_index(&c, "2016-01-01T05:59:59").unwrap(), 54);
        assert_eq!(time_index(&c, "1900-01-01").unwrap(), 0);
        assert_eq!(
            time_index(&c, "2016-01-03").unwrap(),
            96,
            "after the last time: the end"
        );
        // Six-hourly in hours since 1900, integers as ERA5 stores them.
        let era5: Vec<f64> = (0..8).map(|i| 692_496.0 + 6.0 * f64::from(i)).collect();
        let c = time_coord(&era5, "hours since 1900-01-01 00:00:00.0", None);
        assert_eq!(time_index(&c, "1979-01-02").unwrap(), 4);
        assert_eq!(time_index(&c, "1979-01-01T13:00").unwrap(), 3);
        let refused = |c: &CoordinateValues, date: &str, says: &str| {
            let e = time_index(c, date).unwrap_err().to_string();
            assert!(e.contains("`ranges`") && e.contains(says), "{e}");
        };
        refused(&c, "1979-13-01", "not a date");
        refused(&c, "sometime", "not a date");
        refused(
            &time_coord(&era5, "hours since 1900-01-01", Some("noleap")),
            "1979-01-02",
            "noleap",
        );
        refused(
            &time_coord(&era5, "metres", None),
            "1979-01-02",
            "give sample indices",
        );
        let mut falling = era5.clone();
        falling.reverse();
        refused(
            &time_coord(&falling, "hours since 1900-01-01", None),
            "1979-01-02",
            "rise",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(start: f64, stop: f64, period: Option<f64>) -> CoordinateBounds {
        CoordinateBounds {
            dim: "d".into(),
            start,
            stop,
            period,
        }
    }

    #[test]
    fn a_range_of_values_is_the_run_of_indices_inside_it() {
        let lat: Vec<f64> = (0..9).map(|i| 90.0 - 22.5 * i as f64).collect(); // 90 .. -90
        let r = |a, b| index_range(&lat, &bounds(a, b, None), 1e-12);
        // Either order of the ends, both included; falling coordinates.
        assert_eq!(r(67.5, 0.0), Ok(((1, 5), false)));
        assert_eq!(r(0.0, 67.5), Ok(((1, 5), false)));
        assert_eq!(r(60.0, 10.0), Ok(((2, 4), false)));
        assert_eq!(r(-100.0, 100.0), Ok(((0, 9), false)));
        assert!(
            r(10.0, 20.0)
                .unwrap_err()
                .contains("no coordinate lies between 10 and 20")
        );
        // A float32 coordinate matches the bound it rounds to.
        let c = [35.0_f32 as f64, 35.1_f32 as f64, 35.2_f32 as f64];
        let f32_tolerance = f64::from(f32::EPSILON);
        assert_eq!(
            index_range(&c, &bounds(35.1, 35.2, None), f32_tolerance),
            Ok(((1, 3), false))
        );
        let unsorted = [0.0, 2.0, 1.0];
        assert!(
            index_range(&unsorted, &bounds(0.0, 1.0, None), 0.0)
                .unwrap_err()
                .contains("rise or fall")
        );
    }

    #[test]
    fn a_periodic_range_runs_upward_across_the_seam() {
        let lon: Vec<f64> = (0..16).map(|i| 22.5 * i as f64).collect(); // 0 .. 337.5
        let r = |a, b| index_range(&lon, &bounds(a, b, Some(360.0)), 1e-12);
        // 25°W .. 45°E: 337.5, then 0, 22.5, 45.
        assert_eq!(r(-25.0, 45.0), Ok(((15, 19), true)));
        assert_eq!(r(335.0, 45.0), Ok(((15, 19), true)));
        // Within the axis: no wrap. The other way round the circle is the rest of it.
        assert_eq!(r(45.0, 90.0), Ok(((2, 5), false)));
        assert_eq!(r(90.0, 45.0), Ok(((4, 19), true)));
        // A whole turn starting at 180° (a 0..360 grid read as -180..180).
        assert_eq!(r(-180.0, 180.0), Ok(((8, 24), true)));
        assert_eq!(r(0.0, 360.0), Ok(((0, 16), false)));
        assert!(r(1.0, 2.0).unwrap_err().contains("no coordinate"));
        // A -180..180 grid, a range given in 0..360 terms.
        let west: Vec<f64> = (0..16).map(|i| -180.0 + 22.5 * i as f64).collect();
        assert_eq!(
            index_range(&west, &bounds(315.0, 22.5, Some(360.0)), 1e-12),
            Ok(((6, 10), false))
        );
        assert!(
            index_range(&lon, &bounds(0.0, 1.0, Some(0.0)), 0.0)
                .unwrap_err()
                .contains("period")
        );
    }
}
