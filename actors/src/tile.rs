//! Where a stored chunk (tile) lands in its slot.
//!
//! A slot is `[samples_per_chunk, *inner_shape]` in C order, sample axis first whatever the
//! physical axis order. A tile is one stored chunk in physical order. When the array is
//! sampled along axis 0 and one tile covers the whole field, the decoded tile already is the
//! slot and is adopted without a copy; otherwise its rectangle is copied in (the one copy that
//! assembling an inner-chunked field, or moving the sample axis first, costs).

use insitubatch_store::ArrayGeometry;

/// Tile geometry of one array.
#[derive(Clone, Debug)]
pub struct TileLayout {
    geom: ArrayGeometry,
    field_axes: Vec<usize>,
    field_grid: Vec<u64>,
    elem: usize,
    chunk_dims: Vec<u64>,
    slot_strides: Vec<usize>,
}

impl TileLayout {
    /// Layout of `geom`'s tiles.
    pub fn new(geom: &ArrayGeometry) -> Self {
        let nd = geom.shape.len();
        let field_axes: Vec<usize> = (0..nd).filter(|&a| a != geom.sample_axis).collect();
        let field_grid = field_axes
            .iter()
            .map(|&a| geom.shape[a].div_ceil(geom.chunks[a]))
            .collect();
        let elem = geom.dtype.size_bytes();
        // Slot dims: [spc, field dims in physical order]; strides in bytes.
        let mut dims = vec![geom.samples_per_chunk()];
        dims.extend(field_axes.iter().map(|&a| geom.shape[a]));
        let mut slot_strides = vec![0usize; dims.len()];
        let mut acc = elem;
        for d in (0..dims.len()).rev() {
            slot_strides[d] = acc;
            acc *= dims[d] as usize;
        }
        Self {
            geom: geom.clone(),
            field_axes,
            field_grid,
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
        self.field_grid.iter().product()
    }

    /// True when a decoded tile is byte-for-byte the slot.
    pub fn can_adopt(&self) -> bool {
        self.geom.sample_axis == 0
            && self
                .field_axes
                .iter()
                .all(|&a| self.geom.chunks[a] == self.geom.shape[a])
    }

    fn field_coords(&self, tile: u64) -> Vec<u64> {
        let mut coords = vec![0u64; self.field_grid.len()];
        let mut t = tile;
        for d in (0..self.field_grid.len()).rev() {
            coords[d] = t % self.field_grid[d];
            t /= self.field_grid[d];
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

    /// Copies decoded tile `tile` (a full stored chunk, physical C order) into `slot`.
    pub fn copy_into_slot(&self, tile: u64, src: &[u8], slot: &mut [u8]) {
        let g = &self.geom;
        let nd = g.shape.len();
        let coords = self.field_coords(tile);
        // Per physical axis: extent to copy, source stride, destination stride and origin.
        let mut extent = vec![0usize; nd];
        let mut src_stride = vec![0usize; nd];
        let mut dst_stride = vec![0usize; nd];
        let mut dst_base = 0usize;
        let mut acc = self.elem;
        for d in (0..nd).rev() {
            src_stride[d] = acc;
            acc *= g.chunks[d] as usize;
        }
        assert_eq!(
            src.len(),
            acc,
            "tile {tile} of `{}` has the wrong size",
            g.path
        );
        for d in 0..nd {
            if d == g.sample_axis {
                extent[d] = g.chunks[d] as usize;
                dst_stride[d] = self.slot_strides[0];
            } else {
                let f = self
                    .field_axes
                    .iter()
                    .position(|&a| a == d)
                    .expect("field axis");
                let origin = coords[f] * g.chunks[d];
                extent[d] = (g.chunks[d].min(g.shape[d] - origin)) as usize;
                dst_stride[d] = self.slot_strides[f + 1];
                dst_base += origin as usize * dst_stride[d];
            }
        }
        let last = nd - 1;
        let contiguous = src_stride[last] == self.elem && dst_stride[last] == self.elem;
        let outer: usize = extent[..last].iter().product();
        let mut idx = vec![0usize; last];
        for _ in 0..outer {
            let mut s = 0;
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
                let mut src = Vec::new();
                for i in 0..g.chunks[0] {
                    for j in 0..g.chunks[1] {
                        for k in 0..g.chunks[2] {
                            let c = [
                                ci[0] * g.chunks[0] + i,
                                ci[1] * g.chunks[1] + j,
                                ci[2] * g.chunks[2] + k,
                            ];
                            src.push(value(&c));
                        }
                    }
                }
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
}
