//! `regrid`: onto another rectilinear grid along two inner axes.

use serde::{Deserialize, Serialize};

use super::*;

/// Onto another rectilinear grid along two inner axes, first along `axes[0]`, then along
/// `axes[1]`. Linear (bilinear, the default) computes in f64, each pass exactly as
/// `numpy.interp` does: target coordinates outside the source range take the edge value.
/// Nearest copies the value at the nearest source coordinate, of any element type. Source
/// coordinates may run either way (ERA5's latitudes fall from 90 to -90).
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
        let t = Self {
            axes,
            src,
            dst,
            method,
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
        Ok(())
    }
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
        if self.method == RegridMethod::Linear {
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
        for k in 0..2 {
            let d = self.axes[k] + 1; // the chunk's dim 0 is the sample axis
            values = interp_axis(&values, &dims, d, &self.src[k], &self.dst[k]);
            dims[d] = self.dst[k].len();
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
}
