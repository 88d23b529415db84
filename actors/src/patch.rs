//! Patches: a window of one shape cut from every sample at an origin drawn per sample.
//!
//! A patch covers a sample's last `shape.len()` axes (the field's grid); axes before them are
//! carried whole. Every label of a row is cut at the same origin, so inputs, targets and
//! static fields stay co-registered. The origin is drawn from (seed, epoch, anchor, k) for
//! the train split, so it moves every epoch, and from (seed, anchor, k) for the others, so a
//! validation patch is the same patch every epoch; either way it is independent of thread
//! count, IO backend and batch order. An anchor gives one row per patch ([`Origins`]): `k`
//! counts its patches, one by default; a grid places them instead of drawing them. The pool
//! and the cache hold whole samples: the gather cuts the patch when it copies a row.

use std::sync::Arc;

use crate::planner::PathInfo;
use crate::rng::Rng;
use crate::tile::next_index;

/// Keys the origins' random stream apart from the order's.
const PATCH_STREAM: u64 = 0x7061_7463_6800_0001;

/// What keys a pass's origins: the epoch for train, one fixed key for every other split.
pub fn origin_key(split: &str, epoch: u64) -> u64 {
    if split == "train" { epoch } else { u64::MAX }
}

/// Whether a patched row of `path` is read as the region its patch covers, so that only the
/// stored chunks under the window are read: a chunk of a field (or a cropped view of one) of
/// several stored chunks, or of a shard's inner chunks (`inner`, their shape; with several
/// samples per chunk, inner chunks that split the field, since a shard of whole fields is read
/// whole for its samples anyway). A window that may run across the end of a periodic axis is
/// one region only where the view holds that axis whole (across a crop's end it would be two),
/// so a cropped view whose patch wraps along a cropped axis is read whole.
pub(crate) fn reads_patch_region(path: &PathInfo, inner: Option<&[u64]>, patch: &Patch) -> bool {
    let g = &path.geom;
    let wraps_a_crop = g.region.as_ref().is_some_and(|region| {
        let lead = region.len() - patch.shape.len();
        let shape: Vec<u64> = g.field_axes().map(|a| g.shape[a]).collect();
        (0..patch.shape.len()).any(|d| patch.wrap[d] && region[lead + d] != (0, shape[lead + d]))
    });
    let splits = inner.is_some_and(|inner| {
        path.samples_per_chunk == 1 || g.field_axes().any(|a| inner[a] < g.chunks[a])
    });
    (path.tiles > 1 || splits) && !wraps_a_crop
}

/// Bytes of the inner chunks (`inner` elements along each physical axis) that `rows` windows
/// of `patch` over one stored chunk of `path` can touch, one sample each: along each field axis
/// a window touches at most the inner chunks its extent straddles (one more across a periodic
/// axis's seam), never more than the chunk holds. What a read of a shard's rows as regions
/// holds, before the index and the copy the fetcher makes.
pub(crate) fn inner_bytes_under_windows(
    path: &PathInfo,
    inner: &[u64],
    patch: &Patch,
    rows: u64,
) -> u64 {
    let g = &path.geom;
    let lead = g.field_axes().count() - patch.shape.len();
    let mut window = (g.dtype.size_bytes() as u64).saturating_mul(inner[g.sample_axis]);
    for (f, (a, (start, end))) in g.field_axes().zip(g.field_ranges()).enumerate() {
        let (extent, wrap) = match f.checked_sub(lead) {
            Some(d) => (patch.shape[d], patch.wrap[d]),
            None => (end - start, false),
        };
        let straddled = extent.saturating_sub(1).div_ceil(inner[a]) + 1 + u64::from(wrap);
        let touched = straddled.min(g.chunks[a].div_ceil(inner[a]));
        window = window.saturating_mul(touched.saturating_mul(inner[a]));
    }
    window.saturating_mul(rows)
}

/// The share of a field of `path` that `windows` windows of `patch` over one of its samples,
/// each at a uniformly drawn origin, are expected to touch, counted in stored chunks (of a
/// shard, `inner` chunks): a window touches `1 + (extent - 1) / chunk` chunks along an axis on
/// average, so a share `q` of the field, and `windows` independent ones `1 - (1 - q)^windows`
/// of it. (64 x 64 windows of a 720 x 1440 field in 90 x 180 chunks: 2.3 of 64 chunks each;
/// two windows 7 %, eight 25 %, thirty-two 69 %, as measured.)
pub(crate) fn expected_share_under_windows(
    path: &PathInfo,
    inner: Option<&[u64]>,
    patch: &Patch,
    windows: u64,
) -> f64 {
    let g = &path.geom;
    let lead = g.field_axes().count() - patch.shape.len();
    let mut q = 1.0f64;
    for (f, (a, (start, end))) in g.field_axes().zip(g.field_ranges()).enumerate() {
        let Some(d) = f.checked_sub(lead) else {
            continue; // an axis the patch carries whole: every chunk along it
        };
        let chunk = inner.map_or(g.chunks[a], |i| i[a]).max(1) as f64;
        let along = ((end - start) as f64 / chunk).max(1.0);
        let touched = (1.0 + patch.shape[d].saturating_sub(1) as f64 / chunk).min(along);
        q *= touched / along;
    }
    1.0 - (1.0 - q).powf(windows as f64)
}

/// A patch as a dataset asks for it: the window's extent along each of the samples' last
/// axes, which of those axes are periodic, and where a sample's patches are placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    /// The window, one extent per patched axis.
    pub shape: Vec<u64>,
    /// Per patched axis, whether it is periodic (a window may run across its end).
    pub wrap: Vec<bool>,
    /// How many patches each sample gives, and where.
    pub origins: Origins,
}

/// Where a sample's patches are placed; each patch is a row of its own, drawn once per epoch
/// like any row (sample-once holds for (anchor, patch) pairs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origins {
    /// This many patches per sample (at least 1), each at an origin drawn uniformly.
    Random(u64),
    /// A grid over the field: origins every `stride` (one per patched axis, each from 1 to the
    /// patch's extent) from 0, the last one along an axis moved back so that its window ends
    /// at the field's end (along a periodic axis, the last one is the last start before the
    /// end, its window running across it), so that every element is in some patch. The same
    /// origins in every epoch and split: what tiling a field for inference needs.
    Grid(Vec<u64>),
}

impl Patch {
    /// Origins along each patched axis of a grid with `stride` over a `field`: how many.
    fn grid_counts(&self, stride: &[u64], field: &[u64]) -> Vec<u64> {
        (0..self.shape.len())
            .map(|d| {
                let (n, p, s) = (field[d], self.shape[d], stride[d]);
                if self.wrap[d] {
                    n.div_ceil(s)
                } else {
                    (n - p).div_ceil(s) + 1
                }
            })
            .collect()
    }

    /// The rows each anchor gives over a `field` (the extents of the patched axes).
    pub fn per_sample(&self, field: &[u64]) -> u64 {
        match &self.origins {
            Origins::Random(n) => *n,
            Origins::Grid(stride) => self
                .grid_counts(stride, field)
                .iter()
                .fold(1u64, |a, &c| a.saturating_mul(c)),
        }
    }
}

/// The patch of a pass, and the extent of the field's axes it covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchDraw {
    /// The window and its periodic axes.
    pub patch: Arc<Patch>,
    /// The extent of the patched axes in every label's samples (the same for all).
    pub field: Vec<u64>,
}

impl PatchDraw {
    /// The rows each anchor gives: its patches.
    pub fn per_sample(&self) -> u64 {
        self.patch.per_sample(&self.field)
    }

    /// The origin of anchor `anchor`'s patch `k` in a pass keyed `key` ([`origin_key`]): one
    /// index per patched axis, in `0..=field - shape`, or `0..field` along a periodic axis.
    pub fn origin(&self, seed: u64, key: u64, anchor: u64, k: u64) -> Vec<u64> {
        let Patch {
            shape,
            wrap,
            origins,
        } = &*self.patch;
        match origins {
            Origins::Random(_) => {
                let mut rng = Rng::keyed(&[seed, key, anchor, k, PATCH_STREAM]);
                (0..shape.len())
                    .map(|d| {
                        let (n, p) = (self.field[d], shape[d]);
                        rng.below(if wrap[d] { n } else { n - p + 1 })
                    })
                    .collect()
            }
            Origins::Grid(stride) => {
                // Patch k of the grid in C order (the last axis fastest).
                let counts = self.patch.grid_counts(stride, &self.field);
                let mut origin = vec![0; shape.len()];
                let mut rest = k;
                for d in (0..shape.len()).rev() {
                    let i = rest % counts[d];
                    rest /= counts[d];
                    let end = if wrap[d] {
                        self.field[d] - 1
                    } else {
                        self.field[d] - shape[d]
                    };
                    origin[d] = (i * stride[d]).min(end);
                }
                origin
            }
        }
    }
}

/// How one label's patch lies in a sample of its slot: contiguous lines along its axis
/// `first` (and every whole axis after it), `line_len` bytes each, line `i` at `src[i]` in the
/// sample (for origin 0) and `dst[i]` in the row. A line that runs across the end of a periodic
/// axis is two runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    /// Each line's start in a sample whose patch has origin 0, in bytes.
    src: Vec<usize>,
    /// Each line's start in the label's row, in bytes.
    dst: Vec<usize>,
    /// Bytes per line.
    line_len: usize,
    /// A row's shape: the sample's leading axes, then the patch.
    row: Vec<usize>,
    /// The sample's shape.
    inner: Vec<usize>,
    /// Bytes between neighbours along each axis of the sample.
    strides: Vec<usize>,
    /// Whether each axis of the sample is periodic (leading axes never are).
    wrap: Vec<bool>,
    /// The axis lines run along.
    first: usize,
}

impl Cut {
    /// The cut of a `shape` window over the last axes of samples shaped `inner` with elements
    /// of `esize` bytes, periodic along the patched axes where `wrap` says. The caller has
    /// checked `shape.len() <= inner.len()`, `wrap.len() == shape.len()` and that the window
    /// fits.
    pub fn new(inner: &[u64], shape: &[u64], wrap: &[bool], esize: usize) -> Self {
        let rank = inner.len();
        let lead = rank - shape.len();
        let inner: Vec<usize> = inner.iter().map(|&d| d as usize).collect();
        let row: Vec<usize> = inner[..lead]
            .iter()
            .copied()
            .chain(shape.iter().map(|&d| d as usize))
            .collect();
        let wrap: Vec<bool> = std::iter::repeat_n(false, lead)
            .chain(wrap.iter().copied())
            .collect();
        let mut strides = vec![esize; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * inner[d + 1];
        }
        // The lines: the longest run of axes at the end that the window spans whole (and does
        // not rotate, as a periodic axis may), with the axis before them, is contiguous.
        let mut first = rank.saturating_sub(1);
        while first > 0 && row[first] == inner[first] && !wrap[first] {
            first -= 1;
        }
        let line_len = row[first..].iter().product::<usize>() * esize;
        let lines: usize = row[..first].iter().product();
        let (mut src, mut dst) = (Vec::with_capacity(lines), Vec::with_capacity(lines));
        let mut index = vec![0usize; first];
        for i in 0..lines {
            src.push(index.iter().zip(&strides).map(|(&k, &s)| k * s).sum());
            dst.push(i * line_len);
            next_index(&mut index, &row);
        }
        Self {
            src,
            dst,
            line_len,
            row,
            inner,
            strides,
            wrap,
            first,
        }
    }

    /// Calls `run(src, dst, len)` for each contiguous run of the patch at `origin` (one index
    /// per patched axis): `len` bytes from `src` in the sample to `dst` in the row.
    pub fn runs(&self, origin: &[u64], mut run: impl FnMut(usize, usize, usize)) {
        let lead = self.inner.len() - origin.len();
        let at = |d: usize| {
            if d >= lead {
                origin[d - lead] as usize
            } else {
                0
            }
        };
        let crosses = (lead..self.inner.len()).any(|d| at(d) + self.row[d] > self.inner[d]);
        if !crosses {
            let base: usize = (lead..self.inner.len())
                .map(|d| at(d) * self.strides[d])
                .sum();
            for (&s, &d) in self.src.iter().zip(&self.dst) {
                run(base + s, d, self.line_len);
            }
            return;
        }
        // Across the end of a periodic axis: each line's place taken modulo the axis, and the
        // line itself cut in two where it runs past the end of its own axis.
        let f = self.first;
        let unit = self.line_len / self.row[f];
        let (o, p, n) = (at(f), self.row[f], self.inner[f]);
        let head = p.min(n - o);
        let mut index = vec![0usize; f];
        for &dst in &self.dst {
            let line: usize = (0..f)
                .map(|d| (index[d] + at(d)) % self.inner[d] * self.strides[d])
                .sum();
            run(line + o * self.strides[f], dst, head * unit);
            if head < p {
                run(line, dst + head * unit, (p - head) * unit);
            }
            next_index(&mut index, &self.row);
        }
    }

    /// A row's shape: the sample's leading axes, then the patch.
    pub fn row_shape(&self) -> &[usize] {
        &self.row
    }

    /// Bytes of one patch.
    pub fn bytes(&self) -> usize {
        self.dst.len() * self.line_len
    }

    /// Whether the patch is periodic along any axis.
    pub fn wraps(&self) -> bool {
        self.wrap.contains(&true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The patch cut by walking every element (indices modulo the axis), as the reference.
    fn cut_by_element(
        inner: &[usize],
        shape: &[usize],
        origin: &[usize],
        data: &[u32],
    ) -> Vec<u32> {
        let lead = inner.len() - shape.len();
        let row: Vec<usize> = inner[..lead].iter().chain(shape).copied().collect();
        let n: usize = row.iter().product();
        (0..n)
            .map(|mut flat| {
                let mut at = 0;
                let mut stride = 1;
                for d in (0..row.len()).rev() {
                    let k = flat % row[d];
                    flat /= row[d];
                    let o = if d >= lead { origin[d - lead] } else { 0 };
                    at += (k + o) % inner[d] * stride;
                    stride *= inner[d];
                }
                data[at]
            })
            .collect()
    }

    #[test]
    fn the_share_under_windows_is_what_random_windows_touch_on_average() {
        use insitubatch_store::{ArrayGeometry, DType};
        // 720 x 1440 in chunks of 90 x 180 (or a shard of the field with those inner chunks),
        // 64 x 64 windows: the figures measured on that store (7 %, 24 %, 66 % of the bytes).
        let path = |chunks: Vec<u64>| PathInfo {
            path: "t2m".into(),
            geom: ArrayGeometry {
                path: "t2m".into(),
                shape: vec![128, 720, 1440],
                chunks,
                dtype: DType::Float32,
                sample_axis: 0,
                offset: 0,
                region: None,
                static_field: false,
            },
            samples_per_chunk: 1,
            slot_bytes: 720 * 1440 * 4,
            sample_inner: vec![720, 1440],
            sample_dtype: DType::Float32,
            tiles: 64,
        };
        let patch = Patch {
            shape: vec![64, 64],
            wrap: vec![false, false],
            origins: Origins::Random(1),
        };
        let files = path(vec![1, 90, 180]);
        let shard = path(vec![1, 720, 1440]);
        let inner = [1u64, 90, 180];
        for (windows, want) in [(1, 0.0359), (2, 0.0705), (8, 0.254), (32, 0.690)] {
            let got = expected_share_under_windows(&files, None, &patch, windows);
            assert!((got - want).abs() < 0.002, "{windows} windows: {got}");
            let of_shard = expected_share_under_windows(&shard, Some(&inner), &patch, windows);
            assert!(
                (of_shard - got).abs() < 1e-12,
                "a shard's inner chunks count alike"
            );
        }
        // A field stored whole: one chunk, which any window touches.
        let whole = expected_share_under_windows(&shard, None, &patch, 1);
        assert!((whole - 1.0).abs() < 1e-12, "{whole}");
        // A window as wide as the field touches all of it.
        let wide = Patch {
            shape: vec![720, 1440],
            ..patch
        };
        let all = expected_share_under_windows(&files, None, &wide, 1);
        assert!((all - 1.0).abs() < 1e-12, "{all}");
    }

    #[test]
    fn runs_cut_the_same_values_as_walking_every_element() {
        let cases: &[(&[usize], &[usize], &[bool])] = &[
            (&[7, 9], &[3, 4], &[false, false]),
            (&[7, 9], &[7, 9], &[false, false]),
            (&[7, 9], &[2, 9], &[false, false]),
            (&[7, 9], &[4], &[false]),
            (&[3, 5, 6], &[2, 6], &[false, false]),
            (&[3, 5, 6], &[5, 6], &[false, false]),
            (&[3, 5, 6], &[1, 1], &[false, false]),
            (&[3, 5, 6], &[3, 5, 6], &[false, false, false]),
            (&[11], &[5], &[false]),
            // Periodic axes: a window across the end, a whole axis rotated, both axes.
            (&[7, 9], &[3, 4], &[false, true]),
            (&[7, 9], &[3, 9], &[false, true]),
            (&[7, 9], &[3, 4], &[true, true]),
            (&[7, 9], &[7, 4], &[true, false]),
            (&[3, 5, 6], &[2, 6], &[true, false]),
            (&[3, 5, 6], &[5, 6], &[false, true]),
            (&[3, 5, 6], &[5, 6], &[true, false]),
            (&[3, 5, 6], &[5, 3], &[true, true]),
            (&[11], &[11], &[true]),
        ];
        let mut rng = Rng::keyed(&[1]);
        for &(inner, shape, wrap) in cases {
            let n: usize = inner.iter().product();
            let data: Vec<u32> = (0..n as u32).collect();
            let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_ne_bytes()).collect();
            let inner64: Vec<u64> = inner.iter().map(|&d| d as u64).collect();
            let shape64: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
            let cut = Cut::new(&inner64, &shape64, wrap, 4);
            assert_eq!(cut.wraps(), wrap.contains(&true));
            let draw = PatchDraw {
                patch: Arc::new(Patch {
                    shape: shape64.clone(),
                    wrap: wrap.to_vec(),
                    origins: Origins::Random(1),
                }),
                field: inner64[inner.len() - shape.len()..].to_vec(),
            };
            for _ in 0..40 {
                let origin = draw.origin(rng.next_u64(), 0, 0, 0);
                let mut out = vec![0u8; cut.bytes()];
                let mut written = 0;
                cut.runs(&origin, |s, d, len| {
                    out[d..d + len].copy_from_slice(&bytes[s..s + len]);
                    written += len;
                });
                assert_eq!(written, cut.bytes(), "every byte of the patch once");
                let got: Vec<u32> = out
                    .chunks_exact(4)
                    .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
                    .collect();
                let origin: Vec<usize> = origin.iter().map(|&o| o as usize).collect();
                assert_eq!(
                    got,
                    cut_by_element(inner, shape, &origin, &data),
                    "{inner:?} {shape:?} {wrap:?} at {origin:?}"
                );
            }
        }
    }

    #[test]
    fn a_window_spanning_whole_trailing_axes_is_one_line_per_leading_index() {
        let cut = Cut::new(&[3, 5, 6], &[2, 6], &[false, false], 4);
        assert_eq!((cut.src.len(), cut.line_len), (3, 2 * 6 * 4));
        let whole = Cut::new(&[3, 5, 6], &[5, 6], &[false, false], 4);
        assert_eq!((whole.src.len(), whole.line_len), (1, 3 * 5 * 6 * 4));
        // A periodic axis may be rotated, so it is not merged into the line before it.
        let rotated = Cut::new(&[3, 5, 6], &[5, 6], &[false, true], 4);
        assert_eq!((rotated.src.len(), rotated.line_len), (15, 6 * 4));
    }

    #[test]
    fn origins_cover_every_position_and_follow_the_key() {
        let draw = PatchDraw {
            patch: Arc::new(Patch {
                shape: vec![3, 1],
                wrap: vec![false, false],
                origins: Origins::Random(1),
            }),
            field: vec![5, 4],
        };
        let mut seen = std::collections::HashSet::new();
        for anchor in 0..400 {
            let o = draw.origin(7, 0, anchor, 0);
            assert!(o[0] <= 2 && o[1] <= 3, "{o:?}");
            seen.insert(o);
        }
        assert_eq!(seen.len(), 3 * 4, "every origin is drawn");
        assert_eq!(draw.origin(7, 0, 5, 0), draw.origin(7, 0, 5, 0));
        let moved = (0..50).filter(|&a| draw.origin(7, 0, a, 0) != draw.origin(7, 1, a, 0));
        assert!(moved.count() > 25, "another epoch draws other origins");
        let other = (0..50).filter(|&a| draw.origin(7, 0, a, 0) != draw.origin(7, 0, a, 1));
        assert!(other.count() > 25, "an anchor's next patch is drawn apart");
        assert_eq!(origin_key("val", 3), origin_key("val", 9));
        assert_ne!(origin_key("train", 3), origin_key("train", 9));
        // Along a periodic axis a window starts anywhere.
        let periodic = PatchDraw {
            patch: Arc::new(Patch {
                shape: vec![3, 1],
                wrap: vec![true, false],
                origins: Origins::Random(1),
            }),
            ..draw
        };
        let starts: std::collections::HashSet<u64> =
            (0..400).map(|a| periodic.origin(7, 0, a, 0)[0]).collect();
        assert_eq!(starts.len(), 5);
    }

    /// Which elements of a `field` the patches of a grid cover, and how often.
    fn grid_cover(shape: &[u64], wrap: &[bool], stride: &[u64], field: &[u64]) -> Vec<u32> {
        let draw = PatchDraw {
            patch: Arc::new(Patch {
                shape: shape.to_vec(),
                wrap: wrap.to_vec(),
                origins: Origins::Grid(stride.to_vec()),
            }),
            field: field.to_vec(),
        };
        let (rows, cols) = (field[0] as usize, field[1] as usize);
        let mut cover = vec![0u32; rows * cols];
        let mut seen = std::collections::HashSet::new();
        for k in 0..draw.per_sample() {
            let o = draw.origin(1, 2, 3, k);
            assert_eq!(o, draw.origin(9, 8, 7, k), "a grid draws nothing");
            assert!(seen.insert(o.clone()), "patch {k} at {o:?} twice");
            for i in 0..shape[0] {
                for j in 0..shape[1] {
                    let (r, c) = (o[0] + i, o[1] + j);
                    assert!(wrap[0] || r < field[0], "{o:?} runs off axis 0");
                    assert!(wrap[1] || c < field[1], "{o:?} runs off axis 1");
                    cover[(r % field[0]) as usize * cols + (c % field[1]) as usize] += 1;
                }
            }
        }
        cover
    }

    #[test]
    fn a_grid_covers_every_element_each_patch_once() {
        // Tiles that divide the field: every element exactly once.
        let cover = grid_cover(&[3, 4], &[false, false], &[3, 4], &[9, 8]);
        assert!(cover.iter().all(|&c| c == 1), "{cover:?}");
        // A field the stride does not divide: the last tile moved back along each axis, so
        // some twice (four times where both last tiles meet).
        let cover = grid_cover(&[4, 4], &[false, false], &[4, 4], &[10, 9]);
        assert!(cover.iter().all(|&c| [1, 2, 4].contains(&c)), "{cover:?}");
        assert_eq!(cover.iter().filter(|&&c| c == 4).count(), 2 * 3);
        // Overlapping tiles (a stride below the patch), and the patch as large as the field.
        let cover = grid_cover(&[5, 9], &[false, false], &[2, 9], &[11, 9]);
        assert!(cover.iter().all(|&c| c >= 1), "{cover:?}");
        // A periodic axis: no tile moved back, the last one running across the end.
        let cover = grid_cover(&[3, 4], &[false, true], &[3, 4], &[6, 10]);
        assert!(cover.iter().all(|&c| (1..=2).contains(&c)), "{cover:?}");
        let draw = PatchDraw {
            patch: Arc::new(Patch {
                shape: vec![3, 4],
                wrap: vec![false, true],
                origins: Origins::Grid(vec![3, 4]),
            }),
            field: vec![6, 10],
        };
        assert_eq!(draw.per_sample(), 2 * 3);
        assert_eq!(draw.origin(0, 0, 0, 5), [3, 8]);
        assert_eq!(draw.origin(0, 0, 0, 1), [0, 4]);
        let wide = PatchDraw {
            field: vec![10, 9],
            patch: Arc::new(Patch {
                shape: vec![4, 4],
                wrap: vec![false, false],
                origins: Origins::Grid(vec![4, 4]),
            }),
        };
        assert_eq!(wide.per_sample(), 3 * 3);
        assert_eq!(wide.origin(0, 0, 0, 8), [6, 5]);
    }
}
