//! Where a stored chunk (tile) lands in its slot.
//!
//! A slot is `[samples_per_chunk, *inner_shape]` in C order, sample axis first whatever the
//! physical axis order. A tile is one stored chunk in physical order. When the array is
//! sampled along axis 0 and one tile covers the whole field, the decoded tile already is the
//! slot and is adopted without a copy; otherwise its rectangle is copied in (the one copy that
//! assembling an inner-chunked field, or moving the sample axis first, costs).

use insitubatch_store::ArrayGeometry;

/// Tile geometry of one array (of its region, on a cropped view).
#[derive(Clone, Debug)]
pub struct TileLayout {
    geom: ArrayGeometry,
    field_axes: Vec<usize>,
    /// Per field axis, the range of stored-chunk indices read (all of them without a crop).
    tile_ranges: Vec<(u64, u64)>,
    /// Per field axis, the range of elements read.
    field_ranges: Vec<(u64, u64)>,
    elem: usize,
    chunk_dims: Vec<u64>,
    slot_strides: Vec<usize>,
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
            tile_ranges: geom.tile_ranges().collect(),
            field_ranges: geom.field_ranges().collect(),
            elem,
            chunk_dims: dims,
            slot_strides,
        }
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
        self.tile_ranges.iter().map(|(lo, hi)| hi - lo).product()
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

    /// Stored-chunk index of tile `tile` on each field axis.
    fn field_coords(&self, tile: u64) -> Vec<u64> {
        let mut coords = vec![0u64; self.tile_ranges.len()];
        let mut t = tile;
        for d in (0..self.tile_ranges.len()).rev() {
            let (lo, hi) = self.tile_ranges[d];
            coords[d] = lo + t % (hi - lo);
            t /= hi - lo;
        }
        coords
    }

    /// Physical stored-chunk index of tile `tile` of sample-axis chunk `chunk`.
    pub fn chunk_index(&self, chunk: u64, tile: u64) -> Vec<u64> {
        let mut index = vec![0u64; self.geom.shape.len()];
        index[self.geom.sample_axis] = chunk;
        for (&a, c) in self.field_axes.iter().zip(self.field_coords(tile)) {
            index[a] = c;
        }
        index
    }

    /// The part of tile `tile` the view reads, as one chunk-local half-open range per
    /// physical axis (the sample axis whole); where it lands in the slot (per physical axis,
    /// the offset into the region); and whether it is all of the tile inside the array.
    fn tile_box(&self, tile: u64) -> (Vec<std::ops::Range<u64>>, Vec<u64>, bool) {
        let g = &self.geom;
        let coords = self.field_coords(tile);
        let mut range = vec![0..g.chunks[g.sample_axis]; g.shape.len()];
        let mut at = vec![0u64; g.shape.len()];
        let mut whole = true;
        for (f, &d) in self.field_axes.iter().enumerate() {
            let origin = coords[f] * g.chunks[d];
            let (lo, hi) = self.field_ranges[f];
            let first = origin.max(lo);
            let end = (origin + g.chunks[d]).min(hi);
            range[d] = first - origin..end - origin;
            at[d] = first - lo;
            whole &= end - first == g.chunks[d].min(g.shape[d] - origin);
        }
        (range, at, whole)
    }

    /// The chunk-local part of tile `tile` a cropped view reads, when it is less than the
    /// tile (`None`: the view reads the whole tile, or the part of it inside the array).
    pub fn tile_subset(&self, tile: u64) -> Option<Vec<std::ops::Range<u64>>> {
        self.geom.region.as_ref()?;
        let (range, _, whole) = self.tile_box(tile);
        (!whole).then_some(range)
    }

    /// Copies decoded tile `tile` into `slot`: the part of it inside the view's region, at its
    /// place in the region. `src` is either the whole stored chunk or just that part (what
    /// [`TileLayout::tile_subset`] names), in physical C order; its length says which.
    pub fn copy_into_slot(&self, tile: u64, src: &[u8], slot: &mut [u8]) {
        let g = &self.geom;
        let nd = g.shape.len();
        let (range, at, _) = self.tile_box(tile);
        let whole: usize = g.chunks.iter().product::<u64>() as usize * self.elem;
        let part: usize = range
            .iter()
            .map(|r| (r.end - r.start) as usize)
            .product::<usize>()
            * self.elem;
        // The source's dims and where the part starts in it.
        let (dims, start): (Vec<u64>, Vec<u64>) = if src.len() == whole {
            (g.chunks.clone(), range.iter().map(|r| r.start).collect())
        } else {
            assert_eq!(
                src.len(),
                part,
                "tile {tile} of `{}` is neither the stored chunk nor the part the view reads",
                g.path
            );
            (range.iter().map(|r| r.end - r.start).collect(), vec![0; nd])
        };
        // Per physical axis: extent to copy, source stride, destination stride and origins.
        let mut extent = vec![0usize; nd];
        let mut src_stride = vec![0usize; nd];
        let mut dst_stride = vec![0usize; nd];
        let mut src_base = 0usize;
        let mut dst_base = 0usize;
        let mut acc = self.elem;
        for d in (0..nd).rev() {
            src_stride[d] = acc;
            acc *= dims[d] as usize;
        }
        for d in 0..nd {
            extent[d] = (range[d].end - range[d].start) as usize;
            dst_stride[d] = if d == g.sample_axis {
                self.slot_strides[0]
            } else {
                let f = self
                    .field_axes
                    .iter()
                    .position(|&a| a == d)
                    .expect("field axis");
                self.slot_strides[f + 1]
            };
            src_base += start[d] as usize * src_stride[d];
            dst_base += at[d] as usize * dst_stride[d];
        }
        let last = nd - 1;
        let contiguous = src_stride[last] == self.elem && dst_stride[last] == self.elem;
        let outer: usize = extent[..last].iter().product();
        let mut idx = vec![0usize; last];
        for _ in 0..outer {
            let mut s = src_base;
            let mut t = dst_base;
            for d in 0..last {
                s += idx[d] * src_stride[d];
                t += idx[d] * dst_stride[d];
            }
            if contiguous {
                let n = extent[last] * self.elem;
                slot[t..t + n].copy_from_slice(&src[s..s + n]);
            } else {
                for i in 0..extent[last] {
                    let a = s + i * src_stride[last];
                    let b = t + i * dst_stride[last];
                    slot[b..b + self.elem].copy_from_slice(&src[a..a + self.elem]);
                }
            }
            // Odometer over the outer axes.
            for d in (0..last).rev() {
                idx[d] += 1;
                if idx[d] < extent[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitubatch_store::DType;

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
            // The part the view reads, handed over alone (a sharded array's partial decode),
            // lands in the same place.
            if let Some(sub) = layout.tile_subset(t) {
                let mut part = Vec::new();
                for i in sub[0].clone() {
                    for j in sub[1].clone() {
                        for k in sub[2].clone() {
                            let at = (i * g.chunks[1] + j) * g.chunks[2] + k;
                            part.push(src[at as usize]);
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
    fn a_region_is_checked_and_a_whole_one_is_no_crop() {
        let g = ArrayGeometry {
            path: "t2m".into(),
            shape: vec![8, 4, 6],
            chunks: vec![2, 4, 6],
            dtype: DType::Float32,
            sample_axis: 0,
            offset: 0,
            region: None,
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
    }
}
