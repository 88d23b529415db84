//! `regrid`: onto another rectilinear grid along two inner axes.

use serde::{Deserialize, Serialize};

use super::*;

/// Onto another rectilinear grid along two inner axes, first along `axes[0]`, then along
/// `axes[1]`. Linear (bilinear, the default) computes in f64, each pass exactly as
/// `numpy.interp` does: target coordinates outside the source range take the edge value.
/// Nearest copies the value at the nearest source coordinate, of any element type.
/// Conservative takes each target cell's area-weighted mean of the source cells it overlaps
/// (see [`RegridMethod::Conservative`]). Source coordinates may run either way (ERA5's
/// latitudes fall from 90 to -90).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Regrid {
    /// The two inner axes the grid spans (`[0, 1]` for a `(latitude, longitude)` field).
    pub axes: [usize; 2],
    /// Source coordinates along each axis, strictly monotonic, one per index.
    pub src: [Vec<f64>; 2],
    /// Target coordinates along each axis.
    pub dst: [Vec<f64>; 2],
    /// How a target between source coordinates is read. Left out of the JSON when linear, so
    /// caches written before there was a choice keep their fingerprint.
    #[serde(default, skip_serializing_if = "RegridMethod::is_linear")]
    pub method: RegridMethod,
    /// For [`RegridMethod::Conservative`] only: `axes[0]` is latitude and `axes[1]` longitude,
    /// in degrees, so a cell's area is that of its patch of the sphere (proportional to its
    /// width in longitude times the difference of the sines of its edge latitudes), latitude
    /// edges stop at the poles and longitude wraps around at 360°. Otherwise a cell's area is
    /// the product of its widths. Left out of the JSON when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sphere: bool,
}

/// How [`Regrid`] reads the source between its coordinates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegridMethod {
    /// Linear along each axis in turn, as `numpy.interp` (float arrays).
    #[default]
    Linear,
    /// The value at the nearest source coordinate, a tie going to the smaller coordinate, of
    /// any element type and copied exactly: for categories and masks, which a mean would turn
    /// into values that are none of them.
    Nearest,
    /// First-order conservative remapping (float arrays): a target cell gets the area-weighted
    /// mean of the source cells it overlaps, each weighted by the area of the overlap, so the
    /// area integral of the field over the cells both grids cover is kept (a mass, a flux, a
    /// precipitation total). Cells are the spans between midpoints of neighbouring coordinates,
    /// the outer ones reaching half a step past the first and the last; target coordinates must
    /// then be strictly monotonic too. NaN source cells are left out and the rest re-weighted;
    /// a target cell that overlaps no valid source cell is NaN.
    Conservative,
}

impl RegridMethod {
    fn is_linear(&self) -> bool {
        *self == Self::Linear
    }
}

impl Regrid {
    /// Bilinear interpolation from `src` to `dst` coordinates along inner axes `axes`.
    pub fn new(axes: [usize; 2], src: [Vec<f64>; 2], dst: [Vec<f64>; 2]) -> Result<Self, String> {
        Self::with_method(axes, src, dst, RegridMethod::Linear)
    }

    /// From `src` to `dst` coordinates along inner axes `axes`, reading the source as
    /// `method` says.
    pub fn with_method(
        axes: [usize; 2],
        src: [Vec<f64>; 2],
        dst: [Vec<f64>; 2],
        method: RegridMethod,
    ) -> Result<Self, String> {
        Self::validated(axes, src, dst, method, false)
    }

    /// Conservative remapping from `src` to `dst` cell centres along inner axes `axes`; with
    /// `sphere`, `axes` are (latitude, longitude) in degrees (see [`Regrid::sphere`]).
    pub fn conservative(
        axes: [usize; 2],
        src: [Vec<f64>; 2],
        dst: [Vec<f64>; 2],
        sphere: bool,
    ) -> Result<Self, String> {
        Self::validated(axes, src, dst, RegridMethod::Conservative, sphere)
    }

    fn validated(
        axes: [usize; 2],
        src: [Vec<f64>; 2],
        dst: [Vec<f64>; 2],
        method: RegridMethod,
        sphere: bool,
    ) -> Result<Self, String> {
        let t = Self {
            axes,
            src,
            dst,
            method,
            sphere,
        };
        t.validate()?;
        Ok(t)
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.axes[0] == self.axes[1] {
            return Err(format!(
                "`axes` must be two different inner axes, not {:?}",
                self.axes
            ));
        }
        for k in 0..2 {
            let (src, dst) = (&self.src[k], &self.dst[k]);
            if src.len() < 2 || dst.is_empty() {
                return Err(format!(
                    "axis {}: `src` needs at least 2 coordinates and `dst` at least 1",
                    self.axes[k]
                ));
            }
            if src.iter().chain(dst).any(|x| !x.is_finite()) {
                return Err(format!("axis {}: coordinates must be finite", self.axes[k]));
            }
            let rising = src.windows(2).all(|w| w[0] < w[1]);
            let falling = src.windows(2).all(|w| w[0] > w[1]);
            if !rising && !falling {
                return Err(format!(
                    "axis {}: `src` coordinates must rise or fall strictly",
                    self.axes[k]
                ));
            }
        }
        if self.method != RegridMethod::Conservative {
            if self.sphere {
                return Err(
                    "`sphere` is for \"method\": \"conservative\" (cell areas on the sphere); \
                     linear and nearest read coordinates, not areas: drop it"
                        .into(),
                );
            }
            return Ok(());
        }
        for k in 0..2 {
            let (name, dst) = (format!("axis {}", self.axes[k]), &self.dst[k]);
            let rising = dst.windows(2).all(|w| w[0] < w[1]);
            let falling = dst.windows(2).all(|w| w[0] > w[1]);
            if dst.len() < 2 || !(rising || falling) {
                return Err(format!(
                    "{name}: conservative regridding needs at least 2 `dst` coordinates that \
                     rise or fall strictly (its cells are the spans between their midpoints)"
                ));
            }
            if self.sphere {
                let cells = [("src", &self.src[k]), ("dst", dst)];
                for (which, coords) in cells {
                    let edges = cell_edges(&ascending(coords).0);
                    let (lo, hi) = (edges[0], edges[edges.len() - 1]);
                    if k == 0 && coords.iter().any(|x| x.abs() > 90.0) {
                        return Err(format!(
                            "{name}: with `sphere` it is latitude, and `{which}` has a \
                             coordinate beyond ±90°"
                        ));
                    }
                    if k == 1 && hi - lo > 360.0 + 1e-9 {
                        return Err(format!(
                            "{name}: with `sphere` it is longitude, and the cells of `{which}` \
                             span {:.6}° (from {lo} to {hi}), more than once around; give each \
                             longitude once",
                            hi - lo
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Per axis, each target cell's overlaps with the source cells: (source index, its share
    /// of the target's extent along this axis).
    fn overlaps(&self) -> [Vec<Vec<(usize, f64)>>; 2] {
        [0, 1].map(|k| {
            let measure = match (self.sphere, k) {
                (true, 0) => Measure::SineOfLatitude,
                (true, _) => Measure::Periodic(360.0),
                (false, _) => Measure::Length,
            };
            normalized(overlaps(&self.src[k], &self.dst[k], measure))
        })
    }
}

/// How the extent of a cell along one axis is measured.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Measure {
    /// Its length.
    Length,
    /// Latitude in degrees on the sphere: `sin(hi) - sin(lo)`, edges clamped to the poles.
    SineOfLatitude,
    /// A length on a circle of this circumference (longitude): overlaps count across the seam.
    Periodic(f64),
}

/// The `n + 1` edges of the cells around `n >= 2` ascending centres: midpoints between
/// neighbours, and half a step past either end.
fn cell_edges(xp: &[f64]) -> Vec<f64> {
    let n = xp.len();
    let mut edges = Vec::with_capacity(n + 1);
    edges.push(xp[0] - (xp[1] - xp[0]) / 2.0);
    edges.extend(xp.windows(2).map(|w| (w[0] + w[1]) / 2.0));
    edges.push(xp[n - 1] + (xp[n - 1] - xp[n - 2]) / 2.0);
    edges
}

/// For each cell of `dst` (in its index order), the cells of `src` it overlaps, as (index into
/// `src`, extent of the overlap by `measure`), in ascending source coordinate.
fn overlaps(src: &[f64], dst: &[f64], measure: Measure) -> Vec<Vec<(usize, f64)>> {
    let (sp, s_falling) = ascending(src);
    let (dp, d_falling) = ascending(dst);
    let (mut se, mut de) = (cell_edges(&sp), cell_edges(&dp));
    if measure == Measure::SineOfLatitude {
        for e in se.iter_mut().chain(de.iter_mut()) {
            *e = e.clamp(-90.0, 90.0);
        }
    }
    let extent = |lo: f64, hi: f64| match measure {
        Measure::SineOfLatitude => hi.to_radians().sin() - lo.to_radians().sin(),
        _ => hi - lo,
    };
    let shifts: &[f64] = match measure {
        Measure::Periodic(c) => &[-c, 0.0, c],
        _ => &[0.0],
    };
    let (ns, nd) = (sp.len(), dp.len());
    let mut out = vec![Vec::new(); nd];
    for (i, cell) in out.iter_mut().enumerate() {
        let (a, b) = (de[i], de[i + 1]);
        for &shift in shifts {
            // Source cells [se[p] + shift, se[p + 1] + shift] that reach into (a, b).
            let first = se.partition_point(|&e| e + shift <= a).saturating_sub(1);
            for p in first..ns {
                let (c, d) = (se[p] + shift, se[p + 1] + shift);
                if c >= b {
                    break;
                }
                let (lo, hi) = (a.max(c), b.min(d));
                if hi > lo {
                    let w = extent(lo, hi);
                    if w > 0.0 {
                        cell.push((if s_falling { ns - 1 - p } else { p }, w));
                    }
                }
            }
        }
    }
    if d_falling {
        out.reverse();
    }
    out
}

/// `values` (dims `dims`, C order) along dim `d` summed with `weights`: target `i` is
/// `sum(w * values[p])` over its (p, w).
fn weigh_axis(values: &[f64], dims: &[usize], d: usize, weights: &[Vec<(usize, f64)>]) -> Vec<f64> {
    let n = dims[d];
    let inner: usize = dims[d + 1..].iter().product();
    let outer: usize = dims[..d].iter().product();
    let mut out = vec![0f64; outer * weights.len() * inner];
    if inner == 1 {
        // The last axis: one sum per target, read straight from the row.
        for (src_row, dst_row) in values
            .chunks_exact(n)
            .zip(out.chunks_exact_mut(weights.len()))
        {
            for (taps, o) in weights.iter().zip(dst_row) {
                *o = taps.iter().map(|&(p, w)| w * src_row[p]).sum();
            }
        }
        return out;
    }
    for (src_block, dst_block) in values
        .chunks_exact(n * inner)
        .zip(out.chunks_exact_mut(weights.len() * inner))
    {
        for (taps, dst_row) in weights.iter().zip(dst_block.chunks_exact_mut(inner)) {
            for &(p, w) in taps {
                let src_row = &src_block[p * inner..(p + 1) * inner];
                for (o, &x) in dst_row.iter_mut().zip(src_row) {
                    *o += w * x;
                }
            }
        }
    }
    out
}

/// Conservative remapping of `values` (dims `dims`) along dims `d[0]` then `d[1]` with
/// [`normalized`] weights: the weighted sum of the valid (non-NaN) source values over the
/// weight they carry.
fn conservative(
    values: Vec<f64>,
    dims: &mut [usize],
    d: [usize; 2],
    weights: &[Vec<Vec<(usize, f64)>>; 2],
) -> Vec<f64> {
    if !values.iter().any(|x| x.is_nan()) {
        // Every target's weights sum to 1 (or are NaN for a target outside the source).
        let mut sums = values;
        for k in 0..2 {
            sums = weigh_axis(&sums, dims, d[k], &weights[k]);
            dims[d[k]] = weights[k].len();
        }
        return sums;
    }
    let mut covered: Vec<f64> = values
        .iter()
        .map(|x| f64::from(u8::from(!x.is_nan())))
        .collect();
    let mut sums: Vec<f64> = values
        .iter()
        .map(|&x| if x.is_nan() { 0.0 } else { x })
        .collect();
    for k in 0..2 {
        sums = weigh_axis(&sums, dims, d[k], &weights[k]);
        covered = weigh_axis(&covered, dims, d[k], &weights[k]);
        dims[d[k]] = weights[k].len();
    }
    // `covered > 0` is false for NaN too: a target outside the source.
    sums.iter()
        .zip(&covered)
        .map(|(&s, &c)| if c > 0.0 { s / c } else { f64::NAN })
        .collect()
}

/// Each target's overlaps scaled to sum to 1; a target that overlaps nothing gets one NaN
/// weight, so that it comes out NaN.
fn normalized(mut weights: Vec<Vec<(usize, f64)>>) -> Vec<Vec<(usize, f64)>> {
    for taps in &mut weights {
        let total: f64 = taps.iter().map(|t| t.1).sum();
        if total > 0.0 {
            for t in taps.iter_mut() {
                t.1 /= total;
            }
        } else {
            *taps = vec![(0, f64::NAN)];
        }
    }
    weights
}

/// How one target coordinate reads the source, decided once per target as `numpy.interp`
/// decides it: an edge or an exact hit copies a source value, anything else interpolates
/// between two neighbours (`lo` and `lo + 1` in ascending order).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tap {
    Copy(usize),
    Lerp { lo: usize, dx: f64, step: f64 },
}

/// The taps of targets `dst` over ascending coordinates `xp`.
fn taps(xp: &[f64], dst: &[f64]) -> Vec<Tap> {
    let n = xp.len();
    dst.iter()
        .map(|&x| {
            if x <= xp[0] {
                return Tap::Copy(0);
            }
            if x >= xp[n - 1] {
                return Tap::Copy(n - 1);
            }
            // The last j with xp[j] <= x (x is inside, so 0 <= j < n - 1).
            let j = xp.partition_point(|&p| p <= x) - 1;
            if x == xp[j] {
                Tap::Copy(j)
            } else {
                Tap::Lerp {
                    lo: j,
                    dx: x - xp[j],
                    step: xp[j + 1] - xp[j],
                }
            }
        })
        .collect()
}

/// Strictly monotonic coordinates in ascending order, and whether they fell.
fn ascending(src: &[f64]) -> (Vec<f64>, bool) {
    let falling = src.first() > src.last();
    let xp = if falling {
        src.iter().rev().copied().collect()
    } else {
        src.to_vec()
    };
    (xp, falling)
}

/// For each target coordinate, the index into `src` (rising or falling) of the nearest source
/// coordinate; a tie goes to the smaller coordinate, and a target past either end takes the
/// end.
fn nearest_indices(src: &[f64], dst: &[f64]) -> Vec<usize> {
    let n = src.len();
    let (xp, falling) = ascending(src);
    dst.iter()
        .map(|&x| {
            // The first coordinate at or above x; the nearest is it or the one before.
            let i = xp.partition_point(|&p| p < x);
            let j = if i == 0 {
                0
            } else if i == n || x - xp[i - 1] <= xp[i] - x {
                i - 1
            } else {
                i
            };
            if falling { n - 1 - j } else { j }
        })
        .collect()
}

/// The elements of `bytes` (dims `dims`, C order, `elem` bytes each) at indices `picks` along
/// dim `d`: whole rows copied, whatever the element type.
fn pick_along(bytes: &[u8], elem: usize, dims: &[usize], d: usize, picks: &[usize]) -> Vec<u8> {
    let row = dims[d + 1..].iter().product::<usize>() * elem;
    let outer: usize = dims[..d].iter().product();
    let mut out = vec![0u8; outer * picks.len() * row];
    if out.is_empty() {
        return out;
    }
    let blocks = bytes
        .chunks_exact(dims[d] * row)
        .zip(out.chunks_exact_mut(picks.len() * row));
    for (src, dst) in blocks {
        // Along the last axis a row is one element: copied as a fixed-size value, not by a
        // call per element.
        match row {
            1 => pick_rows::<1>(src, dst, picks),
            2 => pick_rows::<2>(src, dst, picks),
            4 => pick_rows::<4>(src, dst, picks),
            8 => pick_rows::<8>(src, dst, picks),
            16 => pick_rows::<16>(src, dst, picks),
            _ => {
                for (o, &i) in dst.chunks_exact_mut(row).zip(picks) {
                    o.copy_from_slice(&src[i * row..(i + 1) * row]);
                }
            }
        }
    }
    out
}

/// `dst`'s rows of `N` bytes are `src`'s rows at `picks`.
fn pick_rows<const N: usize>(src: &[u8], dst: &mut [u8], picks: &[usize]) {
    let (src, _) = src.as_chunks::<N>();
    let (dst, _) = dst.as_chunks_mut::<N>();
    for (o, &i) in dst.iter_mut().zip(picks) {
        *o = src[i];
    }
}

/// Interpolates `values` (dims `dims`, C order) along dim `d` from `src` to `dst` coordinates,
/// each value as `numpy.interp` computes it: `(f[j + 1] - f[j]) / (x[j + 1] - x[j]) * (x -
/// x[j]) + f[j]`.
fn interp_axis(values: &[f64], dims: &[usize], d: usize, src: &[f64], dst: &[f64]) -> Vec<f64> {
    let n = src.len();
    // `at` maps an ascending position back to the source index.
    let (xp, falling) = ascending(src);
    let at = |i: usize| if falling { n - 1 - i } else { i };
    let taps = taps(&xp, dst);
    let outer: usize = dims[..d].iter().product();
    let inner: usize = dims[d + 1..].iter().product();
    let mut out = vec![0f64; outer * dst.len() * inner];
    let lerp = |a: f64, b: f64, dx: f64, step: f64| (b - a) / step * dx + a;
    if inner == 1 {
        // The last axis: one value per tap, read straight from the row.
        for (src_row, dst_row) in values.chunks_exact(n).zip(out.chunks_exact_mut(dst.len())) {
            for (tap, o) in taps.iter().zip(dst_row) {
                *o = match *tap {
                    Tap::Copy(i) => src_row[at(i)],
                    Tap::Lerp { lo, dx, step } => {
                        lerp(src_row[at(lo)], src_row[at(lo + 1)], dx, step)
                    }
                };
            }
        }
        return out;
    }
    for (src_block, dst_block) in values
        .chunks_exact(n * inner)
        .zip(out.chunks_exact_mut(dst.len() * inner))
    {
        let row = |i: usize| &src_block[at(i) * inner..(at(i) + 1) * inner];
        for (tap, dst_row) in taps.iter().zip(dst_block.chunks_exact_mut(inner)) {
            match *tap {
                Tap::Copy(i) => dst_row.copy_from_slice(row(i)),
                Tap::Lerp { lo, dx, step } => {
                    let (f0, f1) = (row(lo), row(lo + 1));
                    for ((o, &a), &b) in dst_row.iter_mut().zip(f0).zip(f1) {
                        *o = lerp(a, b, dx, step);
                    }
                }
            }
        }
    }
    debug_assert_eq!(values.len(), outer * n * inner);
    out
}

builtin! {
    Regrid, "regrid",
    fn output(&self, inner_shape: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String> {
        if self.method != RegridMethod::Nearest {
            check_float(dtype).map_err(|e| {
                format!("{e}; or regrid with \"method\": \"nearest\", which copies values")
            })?;
        }
        let mut out = inner_shape.to_vec();
        for k in 0..2 {
            let a = self.axes[k];
            let Some(&n) = inner_shape.get(a) else {
                return Err(format!(
                    "`axes` names inner axis {a} but the chunks have {} (inner shape \
                     {inner_shape:?})",
                    inner_shape.len()
                ));
            };
            if n != self.src[k].len() as u64 {
                return Err(format!(
                    "inner axis {a} has {n} indices but `src` gives {} coordinates for it",
                    self.src[k].len()
                ));
            }
            out[a] = self.dst[k].len() as u64;
        }
        Ok((out, dtype))
    }
    fn apply(&self, chunk: &mut Chunk) -> Result<(), String> {
        let mut dims: Vec<usize> = chunk.shape.iter().map(|&d| d as usize).collect();
        if self.method == RegridMethod::Nearest {
            let elem = chunk.dtype.size_bytes();
            for k in 0..2 {
                let d = self.axes[k] + 1; // the chunk's dim 0 is the sample axis
                let picks = nearest_indices(&self.src[k], &self.dst[k]);
                chunk.bytes = pick_along(&chunk.bytes, elem, &dims, d, &picks);
                dims[d] = picks.len();
            }
            chunk.shape = dims.iter().map(|&d| d as u64).collect();
            return Ok(());
        }
        let mut values: Vec<f64> = on_float!(chunk, |T| elements::<T>(&chunk.bytes)
            .iter()
            .map(|x| x.to_f64())
            .collect());
        // The chunk's dim 0 is the sample axis.
        let d = self.axes.map(|a| a + 1);
        if self.method == RegridMethod::Conservative {
            values = conservative(values, &mut dims, d, &self.overlaps());
        } else {
            for k in 0..2 {
                values = interp_axis(&values, &dims, d[k], &self.src[k], &self.dst[k]);
                dims[d[k]] = self.dst[k].len();
            }
        }
        let mut bytes = Vec::with_capacity(values.len() * chunk.dtype.size_bytes());
        on_float!(chunk, |T| {
            for v in &values {
                T::of(*v).write_to(&mut bytes);
            }
        });
        chunk.bytes = bytes;
        chunk.shape = dims.iter().map(|&d| d as u64).collect();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::tests::{back, f32s};

    #[test]
    fn regrid_interpolates_as_numpy_interp_along_each_axis() {
        // numpy.interp semantics: edges clamp, exact hits copy, else the two neighbours.
        let xp = [0.0, 1.0, 3.0];
        let got = taps(&xp, &[-1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 7.0]);
        assert_eq!(
            got,
            vec![
                Tap::Copy(0),
                Tap::Copy(0),
                Tap::Lerp {
                    lo: 0,
                    dx: 0.5,
                    step: 1.0
                },
                Tap::Copy(1),
                Tap::Lerp {
                    lo: 1,
                    dx: 1.0,
                    step: 2.0
                },
                Tap::Copy(2),
                Tap::Copy(2),
            ]
        );
        // A falling axis (latitudes 90..-90) reads the same values as its rising mirror.
        let v = [10.0, 20.0, 40.0]; // at 3, 1, 0 when falling
        let falling = interp_axis(&v, &[3], 0, &[3.0, 1.0, 0.0], &[2.0, 0.5]);
        assert_eq!(falling, vec![15.0, 30.0]);
        // Two axes of a [1, 2, 3] chunk: rows interpolated, then columns.
        let t = Regrid::new(
            [0, 1],
            [vec![0.0, 1.0], vec![0.0, 1.0, 2.0]],
            [vec![0.5], vec![0.5, 2.0]],
        )
        .unwrap();
        let mut c = Chunk {
            array: "a".into(),
            index: 0,
            shape: vec![1, 2, 3],
            dtype: DType::Float32,
            bytes: f32s(&[0.0, 2.0, 4.0, 10.0, 12.0, 14.0]),
        };
        assert_eq!(
            t.output(&[2, 3], DType::Float32).unwrap(),
            (vec![1, 2], DType::Float32)
        );
        t.apply(&mut c).unwrap();
        assert_eq!(
            (c.shape.clone(), back(&c.bytes)),
            (vec![1, 1, 2], vec![6.0, 9.0])
        );
        assert!(
            t.output(&[3, 3], DType::Float32)
                .unwrap_err()
                .contains("3 indices")
        );
        assert!(
            Regrid::new(
                [1, 1],
                [vec![0.0, 1.0], vec![0.0, 1.0]],
                [vec![0.0], vec![0.0]]
            )
            .is_err()
        );
        assert!(
            Regrid::new(
                [0, 1],
                [vec![0.0, 2.0, 1.0], vec![0.0, 1.0]],
                [vec![0.0], vec![0.0]]
            )
            .unwrap_err()
            .contains("strictly")
        );
    }

    #[test]
    fn regrid_nearest_copies_the_nearest_source_value_of_any_type() {
        // Ties go to the smaller coordinate; past the ends, the end; either direction.
        let rising = [0.0, 1.0, 3.0];
        let dst = [-1.0, 0.4, 0.5, 0.6, 2.0, 2.1, 9.0];
        assert_eq!(nearest_indices(&rising, &dst), vec![0, 0, 0, 1, 1, 2, 2]);
        let falling = [3.0, 1.0, 0.0];
        assert_eq!(nearest_indices(&falling, &dst), vec![2, 2, 2, 1, 1, 0, 0]);
        // An int16 [1, 2, 3] chunk (a mask): rows, then columns, values copied exactly.
        let t = Regrid::with_method(
            [0, 1],
            [vec![0.0, 1.0], vec![0.0, 1.0, 2.0]],
            [vec![1.0, 0.2, 0.5], vec![2.0, 0.5]],
            RegridMethod::Nearest,
        )
        .unwrap();
        let int16 = |v: &[i16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let mut c = Chunk {
            array: "mask".into(),
            index: 0,
            shape: vec![1, 2, 3],
            dtype: DType::Int16,
            bytes: int16(&[1, 2, 3, -4, -5, -6]),
        };
        assert_eq!(
            t.output(&[2, 3], DType::Int16).unwrap(),
            (vec![3, 2], DType::Int16)
        );
        t.apply(&mut c).unwrap();
        assert_eq!(c.shape, vec![1, 3, 2]);
        assert_eq!(c.bytes, int16(&[-6, -4, 3, 1, 3, 1]));
        // Linear refuses integers, and says what would do.
        let linear = Regrid::new([0, 1], t.src.clone(), t.dst.clone()).unwrap();
        let e = linear.output(&[2, 3], DType::Int16).unwrap_err();
        assert!(
            e.contains("int16") && e.contains("\"method\": \"nearest\""),
            "{e}"
        );
        // In JSON; a linear regrid's identity (its cache fingerprint) has no method, as before
        // there was a choice.
        let mut ts = ChunkTransforms::default();
        ts.extend_from_json(
            r#"[{"type": "regrid", "axes": [0, 1], "src": [[0, 1], [0, 1, 2]],
                 "dst": [[1], [2]], "method": "nearest"},
                {"type": "regrid", "axes": [0, 1], "src": [[0, 1], [0, 1, 2]],
                 "dst": [[1], [2]]}]"#,
        )
        .unwrap();
        let ids: Vec<String> = ts.entries.iter().map(|e| e.transform.identity()).collect();
        assert!(ids[0].ends_with(r#""method":"nearest"}"#), "{ids:?}");
        assert_eq!(
            ids[1],
            r#"regrid{"axes":[0,1],"src":[[0.0,1.0],[0.0,1.0,2.0]],"dst":[[1.0],[2.0]]}"#
        );
        let e = ChunkTransforms::default()
            .extend_from_json(
                r#"[{"type": "regrid", "axes": [0, 1], "src": [[0, 1], [0, 1]],
                     "dst": [[1], [1]], "method": "cubic"}]"#,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("cubic") && e.contains("nearest"), "{e}");
    }

    fn f64_chunk(shape: &[u64], v: &[f64]) -> Chunk {
        Chunk {
            array: "a".into(),
            index: 0,
            shape: shape.to_vec(),
            dtype: DType::Float64,
            bytes: v.iter().flat_map(|x| x.to_ne_bytes()).collect(),
        }
    }

    fn f64s(b: &[u8]) -> Vec<f64> {
        b.chunks_exact(8)
            .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Equal, NaN where the other is NaN, else within `tol` of it (relative to 1).
    fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g.is_nan() && w.is_nan()) || (g - w).abs() <= tol * w.abs().max(1.0),
                "{what}: element {i} is {g}, want {w}"
            );
        }
    }

    #[test]
    fn conservative_regrid_takes_overlap_weighted_means_of_the_valid_cells() {
        // Axis 0: source cells [0,1], [1,2], [2,3]; target cells [0,1.5], [1.5,3]. Axis 1 kept.
        let t = Regrid::conservative(
            [0, 1],
            [vec![0.5, 1.5, 2.5], vec![0.0, 1.0]],
            [vec![0.75, 2.25], vec![0.0, 1.0]],
            false,
        )
        .unwrap();
        assert_eq!(
            t.output(&[3, 2], DType::Float64).unwrap(),
            (vec![2, 2], DType::Float64)
        );
        let x = [1.0, 10.0, 4.0, 40.0, 7.0, 70.0]; // [p][q]
        let mut c = f64_chunk(&[1, 3, 2], &x);
        t.apply(&mut c).unwrap();
        let mean = |a: f64, b: f64, c: f64| (a + 0.5 * b + 0.0 * c) / 1.5;
        assert_close(
            &f64s(&c.bytes),
            &[
                mean(1.0, 4.0, 0.0),
                mean(10.0, 40.0, 0.0),
                mean(7.0, 4.0, 0.0),
                mean(70.0, 40.0, 0.0),
            ],
            1e-15,
            "plane",
        );
        // NaN cells are left out and the rest re-weighted; a target with no valid cell is NaN.
        let nan = f64::NAN;
        let mut c = f64_chunk(&[1, 3, 2], &[1.0, nan, nan, nan, 7.0, 70.0]);
        t.apply(&mut c).unwrap();
        assert_close(&f64s(&c.bytes), &[1.0, nan, 7.0, 70.0], 1e-15, "NaN");
        // Falling coordinates (the source mirrored on both axes, the target on one) read the
        // same cells.
        let falling = Regrid::conservative(
            [0, 1],
            [vec![2.5, 1.5, 0.5], vec![1.0, 0.0]],
            [vec![2.25, 0.75], vec![1.0, 0.0]],
            false,
        )
        .unwrap();
        let mut c = f64_chunk(&[1, 3, 2], &[70.0, 7.0, 40.0, 4.0, 10.0, 1.0]);
        falling.apply(&mut c).unwrap();
        assert_close(
            &f64s(&c.bytes),
            &[
                mean(70.0, 40.0, 0.0),
                mean(7.0, 4.0, 0.0),
                mean(10.0, 40.0, 0.0),
                mean(1.0, 4.0, 0.0),
            ],
            1e-15,
            "falling",
        );
        // A target cell outside the source is NaN; one half outside is the mean of its half in.
        let outside = Regrid::conservative(
            [0, 1],
            [vec![0.5, 1.5, 2.5], vec![0.0, 1.0]],
            [vec![2.5, 3.5, 10.0], vec![0.0, 1.0]],
            false,
        )
        .unwrap();
        let mut c = f64_chunk(&[1, 3, 2], &x);
        outside.apply(&mut c).unwrap();
        assert_close(
            &f64s(&c.bytes),
            &[7.0, 70.0, nan, nan, nan, nan],
            1e-15,
            "outside",
        );
        // float32 computes in f64 and rounds once.
        let mut c = Chunk {
            dtype: DType::Float32,
            bytes: f32s(&[1.0, 10.0, 4.0, 40.0, 7.0, 70.0]),
            ..f64_chunk(&[1, 3, 2], &[])
        };
        t.apply(&mut c).unwrap();
        assert_eq!(back(&c.bytes)[0], (mean(1.0, 4.0, 0.0)) as f32);
    }

    /// Deterministic values in [0, 1).
    fn noise(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 11) as f64 / (1u64 << 53) as f64
            })
            .collect()
    }

    /// Centres `start, start + step, ...`, `n` of them.
    fn centres(start: f64, step: f64, n: usize) -> Vec<f64> {
        (0..n).map(|i| start + step * i as f64).collect()
    }

    /// Area of a (latitude, longitude) cell on the unit sphere, edges in degrees.
    fn area(lat: (f64, f64), lon: (f64, f64)) -> f64 {
        (lat.1.to_radians().sin() - lat.0.to_radians().sin()).abs()
            * (lon.1 - lon.0).abs().to_radians()
    }

    /// Cell edges of each centre, in its own order: (lower, upper) edge.
    fn edges_of(c: &[f64], clamp: bool) -> Vec<(f64, f64)> {
        let (xp, falling) = ascending(c);
        let e = cell_edges(&xp);
        let fix = |x: f64| if clamp { x.clamp(-90.0, 90.0) } else { x };
        let mut out: Vec<(f64, f64)> = (0..xp.len()).map(|i| (fix(e[i]), fix(e[i + 1]))).collect();
        if falling {
            out.reverse();
        }
        out
    }

    /// The conservative remapping of `x` (dims `dims`, sample axis first) along dims `d` from
    /// `src` to `dst` centres, summed directly: for every target cell, every source cell's
    /// overlap area (a product of per-axis overlaps; in sin(latitude) and across the 360° seam
    /// with `sphere`), NaN cells left out.
    fn direct_sum(
        x: &[f64],
        dims: &[usize],
        d: [usize; 2],
        src: [&[f64]; 2],
        dst: [&[f64]; 2],
        sphere: bool,
    ) -> Vec<f64> {
        let overlap = |a: (f64, f64), b: (f64, f64)| (a.1.min(b.1) - a.0.max(b.0)).max(0.0);
        let extent = |k: usize, a: (f64, f64), b: (f64, f64)| -> f64 {
            match (sphere, k) {
                (true, 0) => {
                    let (lo, hi) = (a.0.max(b.0), a.1.min(b.1));
                    if hi > lo {
                        hi.to_radians().sin() - lo.to_radians().sin()
                    } else {
                        0.0
                    }
                }
                (true, _) => [-360.0, 0.0, 360.0]
                    .iter()
                    .map(|s| overlap(a, (b.0 + s, b.1 + s)))
                    .sum(),
                (false, _) => overlap(a, b),
            }
        };
        let cells = |k: usize, c: &[f64]| edges_of(c, sphere && k == 0);
        let (s_cells, d_cells) = (
            [cells(0, src[0]), cells(1, src[1])],
            [cells(0, dst[0]), cells(1, dst[1])],
        );
        let mut out_dims = dims.to_vec();
        out_dims[d[0]] = dst[0].len();
        out_dims[d[1]] = dst[1].len();
        let strides = |dims: &[usize]| -> Vec<usize> {
            (0..dims.len())
                .map(|i| dims[i + 1..].iter().product())
                .collect()
        };
        let (in_strides, n_out) = (strides(dims), out_dims.iter().product::<usize>());
        let out_strides = strides(&out_dims);
        let mut out = Vec::with_capacity(n_out);
        for flat in 0..n_out {
            let idx: Vec<usize> = (0..dims.len())
                .map(|a| flat / out_strides[a] % out_dims[a])
                .collect();
            let base: usize = (0..dims.len())
                .filter(|a| !d.contains(a))
                .map(|a| idx[a] * in_strides[a])
                .sum();
            let (mut sum, mut weight) = (0.0, 0.0);
            for (p, &sp) in s_cells[0].iter().enumerate() {
                let w0 = extent(0, d_cells[0][idx[d[0]]], sp);
                if w0 <= 0.0 {
                    continue;
                }
                for (q, &sq) in s_cells[1].iter().enumerate() {
                    let w = w0 * extent(1, d_cells[1][idx[d[1]]], sq);
                    let v = x[base + p * in_strides[d[0]] + q * in_strides[d[1]]];
                    if w > 0.0 && !v.is_nan() {
                        sum += w * v;
                        weight += w;
                    }
                }
            }
            out.push(sum / weight);
        }
        out
    }

    /// `n` strictly rising values in `[lo, hi)`, at least `(hi - lo) / (4n)` apart, unevenly.
    fn rising(rng: &mut impl FnMut() -> f64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        let steps: Vec<f64> = (0..n).map(|_| 0.25 + rng()).collect();
        let total: f64 = steps.iter().sum::<f64>() + 0.25 + rng();
        let mut at = lo;
        steps
            .iter()
            .map(|s| {
                at += s / total * (hi - lo);
                at
            })
            .collect()
    }

    #[test]
    fn conservative_regrid_matches_a_direct_sum_on_random_grids() {
        // Uneven grids either way round, targets partly or wholly outside the source (plane),
        // longitudes from different origins (sphere: the seam falls anywhere), axes in either
        // order among three inner axes, and NaN holes.
        let mut state = noise(4096, 11).into_iter().cycle();
        let mut rng = move || state.next().unwrap();
        for case in 0..40 {
            let sphere = case % 2 == 0;
            let mut size = |lo: usize| lo + (rng() * 9.0) as usize;
            let n = [size(2), size(2), size(2), size(2)];
            let (mut src0, mut src1, mut dst0, mut dst1) = if sphere {
                let (s, t) = (rng() * 360.0 - 180.0, rng() * 360.0 - 180.0);
                (
                    rising(&mut rng, n[0], -89.0, 89.0),
                    rising(&mut rng, n[1], s, s + 300.0),
                    rising(&mut rng, n[2], -89.0, 89.0),
                    rising(&mut rng, n[3], t, t + 300.0),
                )
            } else {
                (
                    rising(&mut rng, n[0], 0.0, 10.0),
                    rising(&mut rng, n[1], 0.0, 10.0),
                    rising(&mut rng, n[2], -3.0, 13.0),
                    rising(&mut rng, n[3], -3.0, 13.0),
                )
            };
            for c in [&mut src0, &mut src1, &mut dst0, &mut dst1] {
                if rng() < 0.5 {
                    c.reverse();
                }
            }
            // Inner axes (3 of them): the two regridded ones somewhere, in either order.
            let axes = match case % 6 {
                0 | 1 => [0, 1],
                2 => [1, 0],
                3 => [0, 2],
                4 => [2, 1],
                _ => [1, 2],
            };
            let mut inner = [3usize; 3];
            inner[axes[0]] = src0.len();
            inner[axes[1]] = src1.len();
            let dims: Vec<usize> = [2].into_iter().chain(inner.iter().copied()).collect();
            let mut x: Vec<f64> = (0..dims.iter().product::<usize>())
                .map(|_| rng() * 100.0 - 50.0)
                .collect();
            if case % 4 == 1 {
                for i in (0..x.len()).step_by(5) {
                    x[i] = f64::NAN;
                }
            }
            let t = Regrid::conservative(
                axes,
                [src0.clone(), src1.clone()],
                [dst0.clone(), dst1.clone()],
                sphere,
            )
            .unwrap();
            let shape: Vec<u64> = dims.iter().map(|&v| v as u64).collect();
            let mut c = f64_chunk(&shape, &x);
            t.apply(&mut c).unwrap();
            let want = direct_sum(
                &x,
                &dims,
                axes.map(|a| a + 1),
                [&src0, &src1],
                [&dst0, &dst1],
                sphere,
            );
            assert_close(
                &f64s(&c.bytes),
                &want,
                1e-9,
                &format!(
                    "case {case}: axes {axes:?}, sphere {sphere}, {src0:?} {src1:?} -> {dst0:?} {dst1:?}"
                ),
            );
        }
    }

    #[test]
    fn conservative_regrid_on_the_sphere_keeps_the_area_integral_and_matches_a_direct_sum() {
        // A 2° global source (latitudes rising) onto 2.8125° cells with falling latitudes, whose
        // first longitude cell straddles 0°: the seam must be counted from both sides.
        let (src_lat, src_lon) = (centres(-89.0, 2.0, 90), centres(1.0, 2.0, 180));
        let (dst_lat, dst_lon) = (centres(88.59375, -2.8125, 64), centres(0.0, 2.8125, 128));
        let t = Regrid::conservative(
            [0, 1],
            [src_lat.clone(), src_lon.clone()],
            [dst_lat.clone(), dst_lon.clone()],
            true,
        )
        .unwrap();
        let n_src = 90 * 180;
        let mut x = noise(2 * n_src, 7);
        for v in &mut x {
            *v = 250.0 + 50.0 * *v;
        }
        let (s_lat, s_lon) = (edges_of(&src_lat, true), edges_of(&src_lon, false));
        let (d_lat, d_lon) = (edges_of(&dst_lat, true), edges_of(&dst_lon, false));
        // Holes in the second sample: the direct sum leaves them out the same way.
        for i in (0..n_src).step_by(37) {
            x[n_src + i] = f64::NAN;
        }
        let mut c = f64_chunk(&[2, 90, 180], &x);
        t.apply(&mut c).unwrap();
        assert_eq!(c.shape, vec![2, 64, 128]);
        let y = f64s(&c.bytes);

        // The area integral of the first sample is kept.
        let integral = |v: &[f64], lat: &[(f64, f64)], lon: &[(f64, f64)]| -> f64 {
            let mut total = 0.0;
            for (i, &la) in lat.iter().enumerate() {
                for (j, &lo) in lon.iter().enumerate() {
                    total += v[i * lon.len() + j] * area(la, lo);
                }
            }
            total
        };
        let (before, after) = (
            integral(&x[..n_src], &s_lat, &s_lon),
            integral(&y[..64 * 128], &d_lat, &d_lon),
        );
        assert!(
            ((after - before) / before).abs() < 1e-12,
            "integral {before} became {after}"
        );

        // Every target, both samples, against the overlap areas summed cell by cell.
        let want = direct_sum(
            &x,
            &[2, 90, 180],
            [1, 2],
            [&src_lat, &src_lon],
            [&dst_lat, &dst_lon],
            true,
        );
        assert_close(&y, &want, 1e-12, "sphere");
        // A constant field stays constant.
        let mut c = f64_chunk(&[1, 90, 180], &vec![3.25; n_src]);
        t.apply(&mut c).unwrap();
        assert_close(&f64s(&c.bytes), &vec![3.25; 64 * 128], 1e-14, "constant");
    }

    #[test]
    fn conservative_regrid_refuses_what_it_cannot_do_and_names_it() {
        let g = |src0: Vec<f64>, dst0: Vec<f64>, sphere| {
            Regrid::conservative(
                [0, 1],
                [src0, vec![0.0, 90.0, 180.0, 270.0]],
                [dst0, vec![0.0, 180.0]],
                sphere,
            )
        };
        let e = g(vec![0.0, 1.0], vec![0.5], false).unwrap_err();
        assert!(e.contains("at least 2 `dst`"), "{e}");
        let e = g(vec![0.0, 1.0], vec![0.5, 0.6, 0.55], false).unwrap_err();
        assert!(e.contains("strictly"), "{e}");
        let e = g(vec![-95.0, 0.0], vec![-45.0, 45.0], true).unwrap_err();
        assert!(e.contains("latitude") && e.contains("`src`"), "{e}");
        // Longitudes given twice (0° and 360°) would count the seam's cells twice.
        let e = Regrid::conservative(
            [0, 1],
            [vec![-45.0, 45.0], centres(0.0, 90.0, 5)],
            [vec![0.0, 1.0], vec![0.0, 180.0]],
            true,
        )
        .unwrap_err();
        assert!(
            e.contains("longitude") && e.contains("more than once around"),
            "{e}"
        );
        // `sphere` is only for conservative; integers need a cast first.
        let mut linear = g(vec![0.0, 1.0], vec![0.5, 0.6], false).unwrap();
        linear.method = RegridMethod::Linear;
        linear.sphere = true;
        assert!(linear.validate().unwrap_err().contains("`sphere`"));
        let t = g(vec![0.0, 1.0], vec![0.5, 0.6], false).unwrap();
        let e = t.output(&[2, 4], DType::Int16).unwrap_err();
        assert!(e.contains("int16") && e.contains("cast"), "{e}");
        // JSON, and an identity that carries the method and `sphere`.
        let mut ts = ChunkTransforms::default();
        ts.extend_from_json(
            r#"[{"type": "regrid", "axes": [0, 1], "src": [[-45, 45], [0, 180]],
                 "dst": [[-60, 0, 60], [90, 270]], "method": "conservative", "sphere": true}]"#,
        )
        .unwrap();
        let id = ts.entries[0].transform.identity();
        assert!(
            id.ends_with(r#""method":"conservative","sphere":true}"#),
            "{id}"
        );
        let e = ChunkTransforms::default()
            .extend_from_json(
                r#"[{"type": "regrid", "axes": [0, 1], "src": [[0, 1], [0, 1]],
                     "dst": [[1], [1]], "sphere": true}]"#,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("`sphere`"), "{e}");
    }
}
