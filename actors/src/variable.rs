//! A variable is a labelled view of an array: `(label, path, offset)`. Several labels may view
//! one path at different offsets (`x` and `y = x.shift(h)`); they decode once.

use insitubatch_store::ArrayGeometry;

/// One labelled view. `geom.offset` is the window offset along the sample axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variable {
    /// Key of the array in each batch.
    pub label: String,
    /// The array and its offset.
    pub geom: ArrayGeometry,
}

impl Variable {
    /// The view `label` of `geom`.
    pub fn new(label: impl Into<String>, geom: ArrayGeometry) -> Self {
        Self {
            label: label.into(),
            geom,
        }
    }
}
