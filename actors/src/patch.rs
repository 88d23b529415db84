//! Patches: a window of one shape cut from every sample at an origin drawn per sample.
//!
//! A patch covers a sample's last `shape.len()` axes (the field's grid); axes before them are
//! carried whole. Every label of a row is cut at the same origin, so inputs, targets and
//! static fields stay co-registered. The origin is drawn from (seed, epoch, anchor) for the
//! train split, so it moves every epoch, and from (seed, anchor) for the others, so a
//! validation patch is the same patch every epoch; either way it is independent of thread
//! count, IO backend and batch order. The pool and the cache hold whole samples: the gather
//! cuts the patch when it copies a row (the stored chunks read are those of the whole field).

use crate::rng::Rng;

/// Keys the origins' random stream apart from the order's.
const PATCH_STREAM: u64 = 0x7061_7463_6800_0001;

/// What keys a pass's origins: the epoch for train, one fixed key for every other split.
pub fn origin_key(split: &str, epoch: u64) -> u64 {
    if split == "train" { epoch } else { u64::MAX }
}

/// The patch of a pass: its shape over the field's last axes, and that field's extent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchDraw {
    /// The window, one extent per patched axis (the sample's last axes).
    pub shape: Vec<u64>,
    /// The extent of those axes in every label's samples (the same for all).
    pub field: Vec<u64>,
}

impl PatchDraw {
    /// The origin of anchor `anchor`'s patch in a pass keyed `key` ([`origin_key`]): one
    /// index per patched axis, each in `0..=field - shape`.
    pub fn origin(&self, seed: u64, key: u64, anchor: u64) -> Vec<u64> {
        let mut rng = Rng::keyed(&[seed, key, anchor, PATCH_STREAM]);
        self.field
            .iter()
            .zip(&self.shape)
            .map(|(&n, &p)| rng.below(n - p + 1))
            .collect()
    }
}

/// How one label's patch lies in a sample of its slot: contiguous lines of `line_len` bytes,
/// each at `src[i]` in the sample (for origin 0) and `dst[i]` in the row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    /// Each line's start in a sample whose patch has origin 0, in bytes.
    pub src: Vec<usize>,
    /// Each line's start in the label's row, in bytes.
    pub dst: Vec<usize>,
    /// Bytes per line.
    pub line_len: usize,
    /// Bytes between neighbours along each patched axis of the sample.
    strides: Vec<usize>,
}

impl Cut {
    /// The cut of a `shape` window over the last axes of samples shaped `inner` with elements
    /// of `esize` bytes. The caller has checked `shape.len() <= inner.len()` and that the
    /// window fits.
    pub fn new(inner: &[u64], shape: &[u64], esize: usize) -> Self {
        let rank = inner.len();
        let lead = rank - shape.len();
        let row: Vec<usize> = inner[..lead]
            .iter()
            .chain(shape)
            .map(|&d| d as usize)
            .collect();
        let mut strides = vec![esize; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * inner[d + 1] as usize;
        }
        // The lines: the longest run of axes at the end that the window spans whole, with the
        // axis before them, is contiguous in the sample.
        let mut first = rank.saturating_sub(1);
        while first > 0 && row[first] == inner[first] as usize {
            first -= 1;
        }
        let line_len = row[first..].iter().product::<usize>() * esize;
        let lines: usize = row[..first].iter().product();
        let (mut src, mut dst) = (Vec::with_capacity(lines), Vec::with_capacity(lines));
        let mut index = vec![0usize; first];
        for i in 0..lines {
            src.push(index.iter().zip(&strides).map(|(&k, &s)| k * s).sum());
            dst.push(i * line_len);
            for d in (0..first).rev() {
                index[d] += 1;
                if index[d] < row[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Self {
            src,
            dst,
            line_len,
            strides: strides[lead..].to_vec(),
        }
    }

    /// Where the patch at `origin` starts in a sample, in bytes.
    pub fn offset(&self, origin: &[u64]) -> usize {
        origin
            .iter()
            .zip(&self.strides)
            .map(|(&o, &s)| o as usize * s)
            .sum()
    }

    /// Bytes of one patch.
    pub fn bytes(&self) -> usize {
        self.src.len() * self.line_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The patch cut by walking every element, as the reference.
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
                    at += (k + o) * stride;
                    stride *= inner[d];
                }
                data[at]
            })
            .collect()
    }

    #[test]
    fn lines_cut_the_same_values_as_walking_every_element() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[7, 9], &[3, 4]),
            (&[7, 9], &[7, 9]),
            (&[7, 9], &[2, 9]),
            (&[7, 9], &[4]),
            (&[3, 5, 6], &[2, 6]),
            (&[3, 5, 6], &[5, 6]),
            (&[3, 5, 6], &[1, 1]),
            (&[3, 5, 6], &[3, 5, 6]),
            (&[11], &[5]),
        ];
        let mut rng = Rng::keyed(&[1]);
        for &(inner, shape) in cases {
            let n: usize = inner.iter().product();
            let data: Vec<u32> = (0..n as u32).collect();
            let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_ne_bytes()).collect();
            let inner64: Vec<u64> = inner.iter().map(|&d| d as u64).collect();
            let shape64: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
            let cut = Cut::new(&inner64, &shape64, 4);
            let draw = PatchDraw {
                shape: shape64.clone(),
                field: inner64[inner.len() - shape.len()..].to_vec(),
            };
            for _ in 0..20 {
                let origin = draw.origin(rng.next_u64(), 0, 0);
                let at = cut.offset(&origin);
                let mut out = vec![0u8; cut.bytes()];
                for (&s, &d) in cut.src.iter().zip(&cut.dst) {
                    out[d..d + cut.line_len].copy_from_slice(&bytes[at + s..at + s + cut.line_len]);
                }
                let got: Vec<u32> = out
                    .chunks_exact(4)
                    .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
                    .collect();
                let origin: Vec<usize> = origin.iter().map(|&o| o as usize).collect();
                assert_eq!(
                    got,
                    cut_by_element(inner, shape, &origin, &data),
                    "{inner:?} {shape:?} at {origin:?}"
                );
            }
        }
    }

    #[test]
    fn a_window_spanning_whole_trailing_axes_is_one_line_per_leading_index() {
        let cut = Cut::new(&[3, 5, 6], &[2, 6], 4);
        assert_eq!((cut.src.len(), cut.line_len), (3, 2 * 6 * 4));
        let whole = Cut::new(&[3, 5, 6], &[5, 6], 4);
        assert_eq!((whole.src.len(), whole.line_len), (1, 3 * 5 * 6 * 4));
    }

    #[test]
    fn origins_cover_every_position_and_follow_the_key() {
        let draw = PatchDraw {
            shape: vec![3, 1],
            field: vec![5, 4],
        };
        let mut seen = std::collections::HashSet::new();
        for anchor in 0..400 {
            let o = draw.origin(7, 0, anchor);
            assert!(o[0] <= 2 && o[1] <= 3, "{o:?}");
            seen.insert(o);
        }
        assert_eq!(seen.len(), 3 * 4, "every origin is drawn");
        assert_eq!(draw.origin(7, 0, 5), draw.origin(7, 0, 5));
        let moved = (0..50).filter(|&a| draw.origin(7, 0, a) != draw.origin(7, 1, a));
        assert!(moved.count() > 25, "another epoch draws other origins");
        assert_eq!(origin_key("val", 3), origin_key("val", 9));
        assert_ne!(origin_key("train", 3), origin_key("train", 9));
    }
}
