//! Where a stored chunk (tile) lands in its slot.
//!
//! A slot is `[samples_per_chunk, *inner_shape]` in C order, sample axis first whatever the
//! physical axis order. A tile is one stored chunk in physical order. When the array is
//! sampled along axis 0 and one tile covers the whole field, the decoded tile already is the
//! slot and is adopted without a copy; otherwise its rectangle is copied in (the one copy that
//! assembling an inner-chunked field, or moving the sample axis first, costs). A chunk decoded
//! straight into batch rows (`crate::assembly`) has each sample's rectangle copied into its row
//! instead ([`TileLayout::copy_into_rows`]).

use std::ops::Range;

use insitubatch_store::{ArrayGeometry, AxisTile};

/// Tile geometry of one array (of its region, on a cropped view).
#[derive(Clone, Debug)]
pub struct TileLayout {
    geom: ArrayGeometry,
    field_axes: Vec<usize>,
    /// Per field axis, the stored chunks read along it, in the sample's order, with the
    /// stretches of each the view reads (all of them, whole, without a crop).
    axis_tiles: Vec<Vec<AxisTile>>,
    elem: usize,
    chunk_dims: Vec<u64>,
    slot_strides: Vec<usize>,
}

/// One box of a tile a view reads: per physical axis (the sample axis whole), the chunk-local
/// range and where it starts in the slot's axis.
struct TileBox {
    within: Vec<Range<u64>>,
    at: Vec<u64>,
}

impl TileBox {
    fn extent(&self) -> Vec<usize> {
        self.within
            .iter()
            .map(|r| (r.end - r.start) as usize)
            .collect()
    }
}

impl TileLayout {
    /// Layout of `geom`'s tiles.
    pub fn new(geom: &ArrayGeometry) -> Self {
        let field_axes: Vec<usize> = geom.field_axes().collect();
        let elem = geom.dtype.size_bytes();
        // Slot dims: [spc, field dims in physical order]; strides in bytes.
        let mut dims = vec![geom.samples_per_chunk()];
        dims.extend(geom.inner_shape());
        let mut slot_strides = vec![0usize; dims.len()];
        let mut acc = elem;
        for d in (0..dims.len()).rev() {
            slot_strides[d] = acc;
            acc *= dims[d] as usize;
        }
        Self {
            geom: geom.clone(),
            field_axes,
            axis_tiles: geom.axis_tiles(),
            elem,
            chunk_dims: dims,
            slot_strides,
        }
    }

    /// The geometry (and region) these tiles are of.
    pub fn geom(&self) -> &ArrayGeometry {
        &self.geom
    }

    /// A whole decoded chunk's shape, sample-first: `[samples_per_chunk, *inner_shape]` (what
    /// the first chunk transform sees; the slot has it too unless a transform reshapes it).
    pub fn chunk_shape(&self) -> &[u64] {
        &self.chunk_dims
    }

    /// Bytes of a whole decoded chunk, assembled sample-first (before chunk transforms).
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_dims.iter().product::<u64>() as usize * self.elem
    }

    /// Stored chunks per slot.
    pub fn tiles(&self) -> u64 {
        self.axis_tiles.iter().map(|t| t.len() as u64).product()
    }

    /// True when a decoded tile is byte-for-byte the slot.
    pub fn can_adopt(&self) -> bool {
        self.geom.sample_axis == 0
            && self.geom.region.is_none()
            && self
                .field_axes
                .iter()
                .all(|&a| self.geom.chunks[a] == self.geom.shape[a])
    }

    /// Tile `tile`'s entry along each field axis.
    fn field_tiles(&self, tile: u64) -> Vec<&AxisTile> {
        let mut out = Vec::with_capacity(self.axis_tiles.len());
        let mut t = tile;
        for tiles in self.axis_tiles.iter().rev() {
            let n = tiles.len() as u64;
            out.push(&tiles[(t % n) as usize]);
            t /= n;
        }
        out.reverse();
        out
    }

    /// Physical stored-chunk index of tile `tile` of sample-axis chunk `chunk`.
    pub fn chunk_index(&self, chunk: u64, tile: u64) -> Vec<u64> {
        let mut index = vec![0u64; self.geom.shape.len()];
        index[self.geom.sample_axis] = chunk;
        for (&a, t) in self.field_axes.iter().zip(self.field_tiles(tile)) {
            index[a] = t.index;
        }
        index
    }

    /// The boxes of tile `tile` the view reads, one per combination of one stretch per axis
    /// (a single box unless a wrapping range starts and ends in this tile), and whether the
    /// range holding them all is the whole tile inside the array.
    fn tile_boxes(&self, tile: u64) -> (Vec<TileBox>, bool) {
        let g = &self.geom;
        let nd = g.shape.len();
        let spc = g.chunks[g.sample_axis];
        let mut stretches = vec![vec![(0..spc, 0)]; nd];
        let mut whole = true;
        for (&d, t) in self.field_axes.iter().zip(self.field_tiles(tile)) {
            stretches[d] = t
                .stretches
                .iter()
                .map(|s| (s.within.clone(), s.at))
                .collect();
            let span = t.span();
            let inside = g.chunks[d].min(g.shape[d] - t.index * g.chunks[d]);
            whole &= span.start == 0 && span.end == inside;
        }
        let mut boxes = Vec::new();
        let mut pick = vec![0usize; nd];
        loop {
            let (within, at) = (0..nd).map(|d| stretches[d][pick[d]].clone()).unzip();
            boxes.push(TileBox { within, at });
            let Some(d) = (0..nd).rev().find(|&d| pick[d] + 1 < stretches[d].len()) else {
                break;
            };
            pick[d] += 1;
            pick[d + 1..].fill(0);
        }
        (boxes, whole)
    }

    /// The chunk-local parts of tile `tile` a cropped view reads, when they are less than the
    /// tile (`None`: the view reads the whole tile, or the part of it inside the array): one
    /// range per physical axis each, a single part unless a wrapping range starts and ends in
    /// this tile (then the parts leave out the tile between its two ends).
    pub fn tile_parts(&self, tile: u64) -> Option<Vec<Vec<Range<u64>>>> {
        self.geom.region.as_ref()?;
        let (boxes, whole) = self.tile_boxes(tile);
        (!whole).then(|| boxes.into_iter().map(|b| b.within).collect())
    }

    /// The inner chunks of tile `tile` (a shard holding chunks of `inner` elements along each
    /// physical axis) that the view reads of the chunk's sample `sample`, as chunk-local ranges
    /// in C order of the inner grid, each once however many of the view's boxes touch it.
    pub fn inner_parts(&self, tile: u64, inner: &[u64], sample: u64) -> Vec<Vec<Range<u64>>> {
        let (chunk, sa) = (&self.geom.chunks, self.geom.sample_axis);
        let (boxes, _) = self.tile_boxes(tile);
        let mut out: Vec<Vec<Range<u64>>> = Vec::new();
        for b in &boxes {
            // Per axis, the inner chunks the box's range (of the one sample) touches.
            let spans: Vec<Range<u64>> = b
                .within
                .iter()
                .zip(inner)
                .enumerate()
                .map(|(d, (r, &i))| {
                    let r = if d == sa {
                        sample..sample + 1
                    } else {
                        r.clone()
                    };
                    r.start / i..r.end.div_ceil(i)
                })
                .collect();
            let extent: Vec<usize> = spans.iter().map(|s| (s.end - s.start) as usize).collect();
            let mut idx = vec![0usize; extent.len()];
            for _ in 0..extent.iter().product::<usize>() {
                let part = idx
                    .iter()
                    .zip(&spans)
                    .zip(inner.iter().zip(chunk))
                    .map(|((&k, s), (&i, &c))| {
                        let k = s.start + k as u64;
                        k * i..((k + 1) * i).min(c)
                    })
                    .collect();
                out.push(part);
                next_index(&mut idx, &extent);
            }
        }
        out.sort_by_key(|p| p.iter().map(|r| r.start).collect::<Vec<_>>());
        out.dedup();
        out
    }

    /// The chunk-local range of tile `tile` the view reads along each physical axis: the span
    /// of its boxes (what a part must meet to hold any of it).
    pub fn tile_span(&self, tile: u64) -> Vec<Range<u64>> {
        let (boxes, _) = self.tile_boxes(tile);
        let mut span = boxes[0].within.clone();
        for b in &boxes[1..] {
            for (s, r) in span.iter_mut().zip(&b.within) {
                *s = s.start.min(r.start)..s.end.max(r.end);
            }
        }
        span
    }

    /// Copies what the view reads of the chunk's sample `sample` in tile `tile` inside `part`
    /// (chunk-local ranges, one per physical axis) into `row`, that sample's region: `src` is
    /// `part` decoded, in physical C order. Pieces of the view's boxes outside `part` are left
    /// to the parts holding them.
    pub fn copy_part_into_row(
        &self,
        (tile, sample): (u64, u64),
        part: &[Range<u64>],
        src: &[u8],
        row: &mut [u8],
    ) {
        let g = &self.geom;
        let nd = part.len();
        let part_extent: Vec<usize> = part.iter().map(|r| (r.end - r.start) as usize).collect();
        let src_stride = byte_strides(self.elem, &part_extent);
        assert_eq!(
            src.len(),
            part_extent.iter().product::<usize>() * self.elem,
            "a part of tile {tile} of `{}` is not the size of its ranges",
            g.path
        );
        let dst_stride = self.dst_strides();
        let (boxes, _) = self.tile_boxes(tile);
        for b in &boxes {
            // The box's overlap with the part, of the one sample: its extent, where it starts
            // in the part and where in the row (the sample axis is the row itself).
            let mut extent = Vec::with_capacity(nd);
            let (mut from, mut to) = (0usize, 0usize);
            for d in 0..nd {
                let (mut lo, mut hi) = (
                    b.within[d].start.max(part[d].start),
                    b.within[d].end.min(part[d].end),
                );
                if d == g.sample_axis {
                    (lo, hi) = (lo.max(sample), hi.min(sample + 1));
                }
                if lo >= hi {
                    break;
                }
                extent.push((hi - lo) as usize);
                from += (lo - part[d].start) as usize * src_stride[d];
                if d != g.sample_axis {
                    to += (b.at[d] + lo - b.within[d].start) as usize * dst_stride[d];
                }
            }
            if extent.len() == nd {
                self.copy_box(src, row, &extent, (from, &src_stride), (to, &dst_stride));
            }
        }
    }

    /// Copies decoded tile `tile` into `slot`: the part of it inside the view's region, at its
    /// place in the region. `src` is either the whole stored chunk, in physical C order, or
    /// the parts [`TileLayout::tile_parts`] names, each in physical C order, one after
    /// another; its length says which.
    pub fn copy_into_slot(&self, tile: u64, src: &[u8], slot: &mut [u8]) {
        let dst_stride = self.dst_strides();
        self.for_each_box(tile, src, |b, extent, from| {
            let to =
                b.at.iter()
                    .zip(&dst_stride)
                    .map(|(&at, s)| at as usize * s)
                    .sum::<usize>();
            self.copy_box(src, slot, extent, from, (to, &dst_stride));
        });
    }

    /// Copies inner chunks `parts` of tile `tile` (a shard; chunk-local ranges, `src` each of
    /// them decoded in physical C order, one after another) into `slot`: what the view reads
    /// of them, of each sample they hold, at its place. The slot's other bytes are left as
    /// they are (a region slot holds only the inner chunks under its rows' windows).
    pub fn copy_parts_into_slot(
        &self,
        tile: u64,
        parts: &[Vec<Range<u64>>],
        src: &[u8],
        slot: &mut [u8],
    ) {
        let spc = self.chunk_dims[0] as usize;
        let sample_bytes = slot.len() / spc.max(1);
        let sa = self.geom.sample_axis;
        let mut at = 0usize;
        for part in parts {
            let len = part
                .iter()
                .map(|r| (r.end - r.start) as usize)
                .product::<usize>();
            let bytes = &src[at..at + len * self.elem];
            at += len * self.elem;
            for s in part[sa].clone() {
                let row = &mut slot[s as usize * sample_bytes..][..sample_bytes];
                self.copy_part_into_row((tile, s), part, bytes, row);
            }
        }
        assert_eq!(
            at,
            src.len(),
            "the parts of tile {tile} are not what was decoded"
        );
    }

    /// Copies decoded tile `tile` (`src` as for [`TileLayout::copy_into_slot`]) into its
    /// samples' batch rows instead of a slot: `rows[k]` is sample `k` of the slot, one sample
    /// of the view's region (`None`: no row reads it).
    pub fn copy_into_rows(&self, tile: u64, src: &[u8], rows: &mut [Option<&mut [u8]>]) {
        let dst_stride = self.dst_strides();
        let sa = self.geom.sample_axis;
        self.for_each_box(tile, src, |b, extent, (src_base, src_stride)| {
            // Where the box starts within one sample; each of its samples goes to its own row.
            let within_sample =
                b.at.iter()
                    .zip(&dst_stride)
                    .enumerate()
                    .filter(|&(d, _)| d != sa)
                    .map(|(_, (&at, s))| at as usize * s)
                    .sum::<usize>();
            let first = b.at[sa] as usize;
            if sa + 1 == extent.len() && sa > 0 {
                // The samples are the chunk's fastest axis: one pass over the box, each
                // point's run of samples scattered to the same place in every row.
                let rows = rows.get_mut(first..).unwrap_or_default();
                let from = (src_base, src_stride);
                return scatter_samples(
                    self.elem,
                    src,
                    rows,
                    extent,
                    from,
                    (within_sample, &dst_stride),
                );
            }
            let mut one = extent.to_vec();
            one[sa] = 1;
            for j in 0..extent[sa] {
                if let Some(Some(row)) = rows.get_mut(first + j) {
                    let from = (src_base + j * src_stride[sa], src_stride);
                    self.copy_box(src, row, &one, from, (within_sample, &dst_stride));
                }
            }
        });
    }

    /// Per physical axis, the stride in bytes of the slot's dimension it becomes.
    fn dst_strides(&self) -> Vec<usize> {
        (0..self.geom.shape.len())
            .map(|d| match self.field_axes.iter().position(|&a| a == d) {
                Some(f) => self.slot_strides[f + 1],
                None => self.slot_strides[0],
            })
            .collect()
    }

    /// Calls `f` with each box of tile `tile` the view reads, its extent and where it starts in
    /// `src` (the whole stored chunk or the parts, as [`TileLayout::copy_into_slot`] takes it)
    /// with `src`'s strides in bytes.
    fn for_each_box(
        &self,
        tile: u64,
        src: &[u8],
        mut f: impl FnMut(&TileBox, &[usize], (usize, &[usize])),
    ) {
        let g = &self.geom;
        let (boxes, _) = self.tile_boxes(tile);
        let strides = |dims: &[usize]| byte_strides(self.elem, dims);
        let chunk: Vec<usize> = g.chunks.iter().map(|&c| c as usize).collect();
        if src.len() == chunk.iter().product::<usize>() * self.elem {
            let src_stride = strides(&chunk);
            for b in &boxes {
                let src_base = b
                    .within
                    .iter()
                    .zip(&src_stride)
                    .map(|(r, s)| r.start as usize * s)
                    .sum();
                f(b, &b.extent(), (src_base, &src_stride));
            }
            return;
        }
        let parts: usize = boxes
            .iter()
            .map(|b| b.extent().iter().product::<usize>() * self.elem)
            .sum();
        assert_eq!(
            src.len(),
            parts,
            "tile {tile} of `{}` is neither the stored chunk nor the parts the view reads",
            g.path
        );
        let mut offset = 0;
        for b in &boxes {
            let extent = b.extent();
            f(b, &extent, (offset, &strides(&extent)));
            offset += extent.iter().product::<usize>() * self.elem;
        }
    }

    /// Copies a box of `extent` elements per physical axis from `src` (at its base offset,
    /// with its strides in bytes) to `dst` (likewise).
    fn copy_box(
        &self,
        src: &[u8],
        dst: &mut [u8],
        extent: &[usize],
        (src_base, src_stride): (usize, &[usize]),
        (dst_base, dst_stride): (usize, &[usize]),
    ) {
        let last = extent.len() - 1;
        if last > 0 && dst_stride[last] != self.elem && dst_stride[last - 1] == self.elem {
            // The last axis moves (the sample axis coming first): a row of the box at a time,
            // for each step of the last axis the run along the one before it, so the writes are
            // contiguous and the source row stays in cache.
            let k = last - 1;
            let at = ((src_base, src_stride), (dst_base, dst_stride));
            for_each_point(&extent[..k], at, |s, t| {
                for j in 0..extent[last] {
                    let from = (s + j * src_stride[last], src_stride[k]);
                    let to = (t + j * dst_stride[last], self.elem);
                    copy_strided(self.elem, src, from, dst, to, extent[k]);
                }
            });
            return;
        }
        let contiguous = src_stride[last] == self.elem && dst_stride[last] == self.elem;
        let at = ((src_base, src_stride), (dst_base, dst_stride));
        for_each_point(&extent[..last], at, |s, t| {
            if contiguous {
                let n = extent[last] * self.elem;
                dst[t..t + n].copy_from_slice(&src[s..s + n]);
            } else {
                let (from, to) = ((s, src_stride[last]), (t, dst_stride[last]));
                copy_strided(self.elem, src, from, dst, to, extent[last]);
            }
        });
    }
}

/// The strides in bytes of a C-order box of `dims` elements of `elem` bytes.
fn byte_strides(elem: usize, dims: &[usize]) -> Vec<usize> {
    let mut out = vec![0usize; dims.len()];
    let mut acc = elem;
    for d in (0..dims.len()).rev() {
        out[d] = acc;
        acc *= dims[d];
    }
    out
}

/// Copies `n` elements of `elem` bytes from `src` (from its offset, `step` bytes apart) to
/// `dst` (likewise): one fixed-size move per element for the common sizes, where a copy of a
/// run-time length would call `memcpy` for each (the copy that moves a sample axis first ran
/// at half the decode's speed that way).
fn copy_strided(
    elem: usize,
    src: &[u8],
    from: (usize, usize),
    dst: &mut [u8],
    to: (usize, usize),
    n: usize,
) {
    fn each<const N: usize>(
        src: &[u8],
        (s, ss): (usize, usize),
        dst: &mut [u8],
        (t, ts): (usize, usize),
        n: usize,
    ) {
        let Some(last) = n.checked_sub(1) else {
            return;
        };
        // The last element of each side in bounds, checked once for the run.
        assert!(
            s + last * ss + N <= src.len() && t + last * ts + N <= dst.len(),
            "a strided copy past its buffers"
        );
        let (from, to) = (src.as_ptr(), dst.as_mut_ptr());
        for i in 0..n {
            // SAFETY: `i <= last`, so both elements lie within the ranges checked above, and
            // `dst` is borrowed mutably, so the two do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(from.add(s + i * ss), to.add(t + i * ts), N) }
        }
    }
    match elem {
        1 => each::<1>(src, from, dst, to, n),
        2 => each::<2>(src, from, dst, to, n),
        4 => each::<4>(src, from, dst, to, n),
        8 => each::<8>(src, from, dst, to, n),
        16 => each::<16>(src, from, dst, to, n),
        _ => {
            let ((s, ss), (t, ts)) = (from, to);
            for i in 0..n {
                let (a, b) = (s + i * ss, t + i * ts);
                dst[b..b + elem].copy_from_slice(&src[a..a + elem]);
            }
        }
    }
}

/// Copies a box of `extent` elements per physical axis, the last of them the sample axis, from
/// `src` (at its base offset, with its strides in bytes) into `rows` (sample `j` of the box into
/// `rows[j]`, at the base offset with the strides of one sample): a row of the box at a time
/// (a run along the axis before the samples, which stays in cache), each sample's elements of
/// it written one after another into its row.
fn scatter_samples(
    elem: usize,
    src: &[u8],
    rows: &mut [Option<&mut [u8]>],
    extent: &[usize],
    (src_base, src_stride): (usize, &[usize]),
    (dst_base, dst_stride): (usize, &[usize]),
) {
    let last = extent.len() - 1;
    let k = last - 1;
    let samples = extent[last].min(rows.len());
    let at = ((src_base, src_stride), (dst_base, dst_stride));
    for_each_point(&extent[..k], at, |s, t| {
        for (j, row) in rows[..samples].iter_mut().enumerate() {
            if let Some(row) = row {
                let from = (s + j * src_stride[last], src_stride[k]);
                copy_strided(elem, src, from, row, (t, dst_stride[k]), extent[k]);
            }
        }
    });
}

/// One side of a copy: its base offset and its strides in bytes, per axis.
type Side<'a> = (usize, &'a [usize]);

/// Calls `f` with the source and destination offsets of every point of `extent` (the leading
/// axes of a box, the last fastest), from the bases and the strides in bytes of each side.
fn for_each_point(
    extent: &[usize],
    ((src_base, src_stride), (dst_base, dst_stride)): (Side, Side),
    mut f: impl FnMut(usize, usize),
) {
    let mut idx = vec![0usize; extent.len()];
    for _ in 0..extent.iter().product::<usize>() {
        let (mut s, mut t) = (src_base, dst_base);
        for (d, &i) in idx.iter().enumerate() {
            s += i * src_stride[d];
            t += i * dst_stride[d];
        }
        f(s, t);
        next_index(&mut idx, extent);
    }
}

/// Steps `index` to the next point of a box of `extent` in C order (the last axis fastest),
/// wrapping to all zeros after the last.
pub(crate) fn next_index(index: &mut [usize], extent: &[usize]) {
    for d in (0..index.len()).rev() {
        index[d] += 1;
        if index[d] < extent[d] {
            return;
        }
        index[d] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitubatch_store::DType;

    /// A `uint8` array of `shape` in `chunks`, sampled along axis 0, whole.
    fn geometry(shape: Vec<u64>, chunks: Vec<u64>) -> ArrayGeometry {
        ArrayGeometry {
            path: "a".into(),
            shape,
            chunks,
            dtype: DType::Uint8,
            sample_axis: 0,
            offset: 0,
            region: None,
            static_field: false,
        }
    }

    /// Element (physical coords) value used to check placement.
    fn value(c: &[u64]) -> u8 {
        (c.iter().fold(0u64, |a, x| a * 31 + x) % 251) as u8
    }

    /// A decoded 3-d tile at stored-chunk index `ci`: every element `value` of its physical
    /// coordinates, C order.
    fn tile_values(g: &ArrayGeometry, ci: &[u64]) -> Vec<u8> {
        let mut src = Vec::new();
        for i in 0..g.chunks[0] {
            for j in 0..g.chunks[1] {
                for k in 0..g.chunks[2] {
                    src.push(value(&[
                        ci[0] * g.chunks[0] + i,
                        ci[1] * g.chunks[1] + j,
                        ci[2] * g.chunks[2] + k,
                    ]));
                }
            }
        }
        src
    }

    #[test]
    fn tiles_assemble_sample_first_for_any_axis_and_partial_edges() {
        // shape (5, 7, 3), chunks (2, 3, 2): sample axis 1, so slot = [3, 5, 3].
        for sample_axis in 0..3 {
            let g = ArrayGeometry {
                path: "a".into(),
                shape: vec![5, 7, 3],
                chunks: vec![2, 3, 2],
                dtype: DType::Uint8,
                sample_axis,
                offset: 0,
                region: None,
                static_field: false,
            };
            let layout = TileLayout::new(&g);
            let spc = g.chunks[sample_axis];
            let inner: Vec<u64> = (0..3)
                .filter(|&a| a != sample_axis)
                .map(|a| g.shape[a])
                .collect();
            let chunk = 1u64;
            let mut slot = vec![0u8; (spc * inner[0] * inner[1]) as usize];
            for t in 0..layout.tiles() {
                let ci = layout.chunk_index(chunk, t);
                let src = tile_values(&g, &ci);
                layout.copy_into_slot(t, &src, &mut slot);
            }
            for w in 0..spc {
                for p in 0..inner[0] {
                    for q in 0..inner[1] {
                        let mut phys = [0u64; 3];
                        let mut fi = [p, q].into_iter();
                        for (a, slot_c) in phys.iter_mut().enumerate() {
                            *slot_c = if a == sample_axis {
                                chunk * spc + w
                            } else {
                                fi.next().unwrap()
                            };
                        }
                        let got = slot[((w * inner[0] + p) * inner[1] + q) as usize];
                        assert_eq!(got, value(&phys), "axis {sample_axis} at {phys:?}");
                    }
                }
            }
            assert!(!layout.can_adopt());
        }
    }

    /// Assembles every tile of sample-axis chunk `chunk` into a slot (each element's value is
    /// `value` of its physical coordinates) and returns it with the tiles read.
    fn assemble(g: &ArrayGeometry, chunk: u64) -> (Vec<u8>, Vec<Vec<u64>>, usize) {
        let layout = TileLayout::new(g);
        let mut partial = 0;
        let mut slot = vec![0u8; layout.chunk_bytes()];
        let mut read = Vec::new();
        for t in 0..layout.tiles() {
            let ci = layout.chunk_index(chunk, t);
            let src = tile_values(g, &ci);
            layout.copy_into_slot(t, &src, &mut slot);
            // The parts the view reads, handed over alone one after another (a sharded
            // array's partial decode), land in the same place.
            if let Some(parts) = layout.tile_parts(t) {
                let mut part = Vec::new();
                for sub in parts {
                    for i in sub[0].clone() {
                        for j in sub[1].clone() {
                            for k in sub[2].clone() {
                                let at = (i * g.chunks[1] + j) * g.chunks[2] + k;
                                part.push(src[at as usize]);
                            }
                        }
                    }
                }
                let mut again = slot.clone();
                again.fill(0);
                let mut whole = again.clone();
                layout.copy_into_slot(t, &part, &mut again);
                layout.copy_into_slot(t, &src, &mut whole);
                assert_eq!(
                    again, whole,
                    "tile {t}: the part lands where the whole tile's does"
                );
                partial += 1;
            }
            read.push(ci);
        }
        (slot, read, partial)
    }

    #[test]
    fn a_cropped_view_reads_only_the_tiles_its_region_touches_and_places_the_region() {
        // shape (5, 11, 9), chunks (2, 3, 4); regions across tile edges, inside one tile, and
        // ending at a partial edge tile.
        for sample_axis in 0..3 {
            let whole = ArrayGeometry {
                path: "a".into(),
                shape: vec![5, 11, 9],
                chunks: vec![2, 3, 4],
                dtype: DType::Uint8,
                sample_axis,
                offset: 0,
                region: None,
                static_field: false,
            };
            let axes: Vec<usize> = whole.field_axes().collect();
            let regions: Vec<Vec<(u64, u64)>> = vec![
                axes.iter().map(|&a| (1, whole.shape[a] - 1)).collect(),
                axes.iter().map(|_| (1, 2)).collect(),
                axes.iter().map(|&a| (2, whole.shape[a])).collect(),
            ];
            for region in regions {
                let g = whole.crop(&region).unwrap();
                assert_eq!(
                    g.inner_shape(),
                    region.iter().map(|(lo, hi)| hi - lo).collect::<Vec<_>>()
                );
                let (slot, read, partial) = assemble(&g, 1);
                assert!(partial > 0, "every region here cuts some tile");
                // Exactly the tiles that intersect the region, each once.
                let mut expect = Vec::new();
                for (f, &a) in axes.iter().enumerate() {
                    let (lo, hi) = region[f];
                    let c = whole.chunks[a];
                    expect.push(
                        (0..whole.shape[a].div_ceil(c))
                            .filter(move |t| t * c < hi && (t + 1) * c > lo)
                            .count(),
                    );
                }
                assert_eq!(read.len(), expect.iter().product::<usize>(), "{region:?}");
                assert_eq!(g.tiles_per_sample_chunk(), read.len() as u64);
                let inner = g.inner_shape();
                let spc = whole.chunks[sample_axis];
                for w in 0..spc {
                    for p in 0..inner[0] {
                        for q in 0..inner[1] {
                            let mut phys = [0u64; 3];
                            let mut fi = [p + region[0].0, q + region[1].0].into_iter();
                            for (a, c) in phys.iter_mut().enumerate() {
                                *c = if a == sample_axis {
                                    spc + w
                                } else {
                                    fi.next().unwrap()
                                };
                            }
                            let got = slot[((w * inner[0] + p) * inner[1] + q) as usize];
                            assert_eq!(
                                got,
                                value(&phys),
                                "axis {sample_axis} {region:?} at {phys:?}"
                            );
                        }
                    }
                }
                assert!(!TileLayout::new(&g).can_adopt());
            }
        }
    }

    #[test]
    fn a_wrapping_region_reads_each_tile_once_and_places_the_range_across_the_seam() {
        // (shape, chunks, a wrapping range per field axis for sample axis 0): ranges that cross
        // the end of their axis; one that starts and ends in the same tile (two stretches of
        // it); a whole axis rotated.
        type Case = (Vec<u64>, Vec<u64>, Vec<(i64, i64)>);
        let cases: [Case; 4] = [
            (vec![4, 11, 9], vec![2, 3, 4], vec![(-2, 3), (7, 12)]),
            (vec![4, 11, 9], vec![2, 3, 4], vec![(1, 4), (-1, 1)]),
            (vec![4, 7, 6], vec![2, 7, 6], vec![(5, 9), (-2, 3)]),
            (vec![4, 7, 6], vec![2, 7, 3], vec![(0, 7), (-3, 3)]),
        ];
        for (shape, chunks, region) in cases {
            let whole = geometry(shape.clone(), chunks.clone());
            let g = whole.crop_wrapping(&region).unwrap();
            let extent: Vec<u64> = region.iter().map(|(lo, hi)| (hi - lo) as u64).collect();
            assert_eq!(g.inner_shape(), extent, "{region:?}");
            let (slot, read, _) = assemble(&g, 1);
            // Each stored chunk the range touches is read once, however many stretches of it
            // the sample holds.
            let mut distinct = read.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), read.len(), "{region:?}: {read:?}");
            let touched: usize = (1..3)
                .map(|a| {
                    let (lo, hi) = region[a - 1];
                    let mut t: Vec<i64> = (lo..hi)
                        .map(|x| x.rem_euclid(shape[a] as i64) / chunks[a] as i64)
                        .collect();
                    t.sort();
                    t.dedup();
                    t.len()
                })
                .product();
            assert_eq!(read.len(), touched, "{region:?}");
            assert_eq!(g.tiles_per_sample_chunk(), touched as u64);
            for w in 0..chunks[0] {
                for p in 0..extent[0] {
                    for q in 0..extent[1] {
                        let wrap = |f: usize, i: u64| {
                            (region[f].0 + i as i64).rem_euclid(shape[f + 1] as i64) as u64
                        };
                        let phys = [chunks[0] + w, wrap(0, p), wrap(1, q)];
                        let got = slot[((w * extent[0] + p) * extent[1] + q) as usize];
                        assert_eq!(got, value(&phys), "{region:?} at {phys:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_region_of_a_shard_is_placed_from_its_inner_chunks_decoded_one_by_one() {
        // Shape (6, 11, 7): shards of one sample and of three, of (12, 8) covering the field
        // whole and of (6, 4), inner chunks of (1, 3, 2) (past the array's edge in the last
        // ones); regions inside one inner chunk, across several, at the edge, and across the
        // seam of both axes; each of a chosen sample of the shard.
        type Case = (Vec<u64>, Vec<(i64, i64)>, u64);
        let inner = [1u64, 3, 2];
        let cases: [Case; 7] = [
            (vec![1, 12, 8], vec![(3, 6), (2, 4)], 0),
            (vec![1, 12, 8], vec![(1, 8), (3, 7)], 0),
            (vec![3, 12, 8], vec![(-2, 4), (5, 10)], 1),
            (vec![1, 6, 4], vec![(4, 11), (1, 7)], 0),
            (vec![1, 6, 4], vec![(-3, 2), (-1, 3)], 0),
            (vec![3, 6, 4], vec![(4, 11), (1, 7)], 2),
            (vec![3, 6, 4], vec![(-3, 2), (-1, 3)], 0),
        ];
        for (chunks, region, w) in cases {
            let what = format!("{chunks:?} {region:?} sample {w}");
            let whole = geometry(vec![6, 11, 7], chunks.clone());
            let g = whole.crop_wrapping(&region).unwrap();
            let layout = TileLayout::new(&g);
            let row_bytes: usize = g.inner_shape().iter().product::<u64>() as usize;
            let (mut from_parts, mut from_whole) = (vec![0u8; row_bytes], vec![0u8; row_bytes]);
            for t in 0..layout.tiles() {
                let ci = layout.chunk_index(1, t);
                let src = tile_values(&g, &ci);
                let mut rows: Vec<Option<&mut [u8]>> = (0..w).map(|_| None).collect();
                rows.push(Some(&mut from_whole[..]));
                layout.copy_into_rows(t, &src, &mut rows);
                let parts = layout.inner_parts(t, &inner, w);
                // Exactly the inner chunks of sample `w` holding an element of the region,
                // each once.
                let mut touched = Vec::new();
                for i in 0..chunks[1].div_ceil(inner[1]) {
                    for j in 0..chunks[2].div_ceil(inner[2]) {
                        let holds = |a: usize, k: u64| {
                            let lo = ci[a] * chunks[a] + k * inner[a];
                            let hi = (lo + inner[a]).min((ci[a] + 1) * chunks[a]);
                            let (s, e) = region[a - 1];
                            let n = whole.shape[a] as i64;
                            (s..e).any(|x| (lo..hi).contains(&(x.rem_euclid(n) as u64)))
                        };
                        if holds(1, i) && holds(2, j) {
                            touched.push(vec![w..w + 1, i * 3..i * 3 + 3, j * 2..j * 2 + 2]);
                        }
                    }
                }
                assert_eq!(parts, touched, "{what}: tile {t}");
                for part in &parts {
                    let mut decoded = Vec::new();
                    for i in part[0].clone() {
                        for j in part[1].clone() {
                            for k in part[2].clone() {
                                let at = (i * chunks[1] + j) * chunks[2] + k;
                                decoded.push(src[at as usize]);
                            }
                        }
                    }
                    layout.copy_part_into_row((t, w), part, &decoded, &mut from_parts);
                }
            }
            assert_eq!(from_parts, from_whole, "{what}");
            // Every element written: the row is the region of sample `w` of chunk 1.
            let extent = g.inner_shape();
            for p in 0..extent[0] {
                for q in 0..extent[1] {
                    let wrap = |f: usize, i: u64| {
                        (region[f].0 + i as i64).rem_euclid(whole.shape[f + 1] as i64) as u64
                    };
                    let got = from_parts[(p * extent[1] + q) as usize];
                    let sample = chunks[0] + w;
                    assert_eq!(got, value(&[sample, wrap(0, p), wrap(1, q)]), "{what}");
                }
            }
        }
    }

    #[test]
    fn inner_chunks_copied_into_a_slot_land_where_the_whole_tile_would() {
        // Shards of one and of three samples over (6, 11, 7), inner chunks (1, 3, 2); the whole
        // field and a view across both seams. Each sample's inner chunks, decoded one by one,
        // fill exactly that sample's part of the slot, as the whole decoded tiles do.
        let inner = [1u64, 3, 2];
        for chunks in [vec![1u64, 6, 4], vec![3, 6, 4], vec![3, 12, 8]] {
            for region in [None, Some(vec![(-3i64, 2i64), (-1, 3)])] {
                let whole = geometry(vec![6, 11, 7], chunks.clone());
                let g = match &region {
                    Some(r) => whole.crop_wrapping(r).unwrap(),
                    None => whole.clone(),
                };
                let layout = TileLayout::new(&g);
                let n = layout.chunk_bytes();
                let mut want = vec![0u8; n];
                for t in 0..layout.tiles() {
                    layout.copy_into_slot(
                        t,
                        &tile_values(&g, &layout.chunk_index(1, t)),
                        &mut want,
                    );
                }
                let sample_bytes = n / chunks[0] as usize;
                for w in 0..chunks[0] {
                    let what = format!("{chunks:?} {region:?} sample {w}");
                    let mut got = vec![0xEEu8; n];
                    for t in 0..layout.tiles() {
                        let ci = layout.chunk_index(1, t);
                        let src = tile_values(&g, &ci);
                        let parts = layout.inner_parts(t, &inner, w);
                        let mut decoded = Vec::new();
                        for part in &parts {
                            for i in part[0].clone() {
                                for j in part[1].clone() {
                                    for k in part[2].clone() {
                                        let at = (i * chunks[1] + j) * chunks[2] + k;
                                        decoded.push(src[at as usize]);
                                    }
                                }
                            }
                        }
                        layout.copy_parts_into_slot(t, &parts, &decoded, &mut got);
                    }
                    for (s, (got, want)) in got
                        .chunks(sample_bytes)
                        .zip(want.chunks(sample_bytes))
                        .enumerate()
                    {
                        if s as u64 == w {
                            assert_eq!(got, want, "{what}");
                        } else {
                            assert!(got.iter().all(|&b| b == 0xEE), "{what}: sample {s} written");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_region_is_checked_and_a_whole_one_is_no_crop() {
        let g = ArrayGeometry {
            path: "t2m".into(),
            shape: vec![8, 4, 6],
            chunks: vec![2, 4, 6],
            dtype: DType::Float32,
            sample_axis: 0,
            offset: 0,
            region: None,
            static_field: false,
        };
        assert_eq!(g.crop(&[(0, 4), (0, 6)]).unwrap().region, None);
        assert!(TileLayout::new(&g.crop(&[(0, 4), (0, 6)]).unwrap()).can_adopt());
        for (bad, says) in [
            (vec![(0, 4)], "one (start, end) per field axis"),
            (vec![(0, 4), (3, 3)], "0 <= start < end <= 6"),
            (vec![(0, 5), (0, 6)], "axis 1 has length 4"),
        ] {
            let e = g.crop(&bad).unwrap_err().to_string();
            assert!(e.contains("`t2m`") && e.contains(says), "{e}");
        }
        // Past the end of an axis is a wrapping crop's, and the message says so; a wrapping
        // range longer than its axis or starting outside it is refused.
        let e = g.crop(&[(0, 4), (4, 8)]).unwrap_err().to_string();
        assert!(
            e.contains("axis 2 has length 6") && e.contains("crop_wrapping"),
            "{e}"
        );
        assert_eq!(
            g.crop_wrapping(&[(0, 4), (-2, 2)]).unwrap().region,
            Some(vec![(0, 4), (4, 8)])
        );
        assert_eq!(
            g.crop_wrapping(&[(0, 4), (4, 8)]).unwrap(),
            g.crop_wrapping(&[(0, 4), (-2, 2)]).unwrap()
        );
        assert_eq!(
            g.crop_wrapping(&[(0, 4), (1, 3)]).unwrap(),
            g.crop(&[(0, 4), (1, 3)]).unwrap()
        );
        for bad in [
            vec![(0, 4), (-2, 5)],
            vec![(0, 4), (-7, -3)],
            vec![(0, 4), (6, 8)],
        ] {
            let e = g.crop_wrapping(&bad).unwrap_err().to_string();
            assert!(
                e.contains("`t2m`") && e.contains("-6 <= start < 6 and start < end <= start + 6"),
                "{e}"
            );
        }
    }
}
