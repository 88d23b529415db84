//! How an anchor becomes a sample of a variable's array. Anchors are samples of the manifest's
//! array; a variable of the same store reads `anchor + offset` (its window offset). A variable
//! of a store mounted with an alignment reads the sample of its own store at the anchor's time:
//! its store may start elsewhere and step at another rate (6-hourly targets beside hourly
//! inputs), so in general the sample is `(anchor * mul + add) / div + offset`, read only at the
//! anchors where the division is exact.

use std::ops::Range;
use std::sync::Arc;

/// Where a store's samples sit on the sample axis of the dataset's store: its sample `j` is at
/// the root's sample `(start + j * step) / per` (a fraction when it falls between two). The
/// root itself is `{0, 1, 1}`; a store of the root's rate starting at its sample `k` is
/// `{k, 1, 1}`; a 6-hourly store beside an hourly root starting with it is `{0, 6, 1}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreAxis {
    /// Where sample 0 is, in `1 / per` of the root's samples.
    pub start: i64,
    /// One sample's step, in `1 / per` of the root's samples.
    pub step: u64,
    /// Parts of a root sample the other two count in.
    pub per: u64,
}

impl StoreAxis {
    /// The dataset's own store.
    pub const ROOT: StoreAxis = StoreAxis {
        start: 0,
        step: 1,
        per: 1,
    };

    /// A store of the root's rate whose sample 0 is the root's sample `k`.
    pub fn starting_at(k: i64) -> Self {
        Self {
            start: k,
            step: 1,
            per: 1,
        }
    }

    /// A store whose sample 0 comes `start` time units after the root's and which steps by
    /// `step` where the root steps by `root_step` (both positive, in one unit: microseconds),
    /// in lowest terms.
    pub fn from_times(start: i64, step: u64, root_step: u64) -> Self {
        let g = gcd(
            gcd(u128::from(step), u128::from(root_step)),
            u128::from(start.unsigned_abs()),
        )
        .max(1);
        Self {
            start: (i128::from(start) / g as i128) as i64,
            step: (u128::from(step) / g) as u64,
            per: (u128::from(root_step) / g) as u64,
        }
    }

    /// The same store as a containing placement reads it to give each anchor its nearest
    /// sample, the later on a tie: each sample's period is taken to begin half a step before
    /// it (a daily mean stamped at noon holds the hours from midnight to midnight), so the
    /// sample before an anchor's time on this axis is the nearest on the store's own. In half
    /// steps, so that it stays exact; `None` when a number does not fit.
    pub fn nearest_as_before(self) -> Option<Self> {
        Some(Self {
            start: self
                .start
                .checked_mul(2)?
                .checked_sub(i64::try_from(self.step).ok()?)?,
            step: self.step.checked_mul(2)?,
            per: self.per.checked_mul(2)?,
        })
    }
}

/// Where a variable's store sits against the anchors: before its window offset, anchor `a`
/// reads sample `(a * mul + add) / div`, at the anchors where the division is exact (the
/// others fall between two of its samples), or with `containing` at every anchor, rounded
/// down (the sample whose period holds the anchor's time: a day's for each of its hours).
/// `{1, 0, 1}` for the anchors' own store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Multiplies the anchor.
    pub mul: u64,
    /// Added to the product.
    pub add: i64,
    /// Divides the sum.
    pub div: u64,
    /// Anchors between two samples read the one before, instead of none.
    pub containing: bool,
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl Placement {
    /// The anchors' own store: anchor `a` reads sample `a`.
    pub const SAME: Placement = Placement {
        mul: 1,
        add: 0,
        div: 1,
        containing: false,
    };

    /// Anchor `a` reads sample `a + add` (a store of the anchors' rate, started elsewhere).
    pub fn shifted(add: i64) -> Self {
        Self {
            mul: 1,
            add,
            div: 1,
            containing: false,
        }
    }

    /// The placement of a store on `var` when the anchors are samples of a store on
    /// `reference` (both as [`StoreAxis`] of the root), reduced so that its three numbers
    /// share no factor; `None` when a number does not fit.
    pub fn between(reference: StoreAxis, var: StoreAxis) -> Option<Self> {
        // Anchor a is at (r.start + a r.step) / r.per; sample j of var at (v.start + j v.step)
        // / v.per. Equal when j = (a r.step v.per + r.start v.per - v.start r.per) / (r.per
        // v.step).
        let (r, v) = (reference, var);
        let mul = u128::from(r.step) * u128::from(v.per);
        let add = i128::from(r.start) * i128::from(v.per) - i128::from(v.start) * i128::from(r.per);
        let div = u128::from(r.per) * u128::from(v.step);
        let g = gcd(gcd(mul, div), add.unsigned_abs()).max(1);
        Some(Self {
            mul: u64::try_from(mul / g).ok()?,
            add: i64::try_from(add / g as i128).ok()?,
            div: u64::try_from(div / g).ok()?,
            containing: false,
        })
    }

    /// The same placement read at every anchor, rounding down between two samples (a
    /// containing or nearest alignment). A store at least as fine as the anchors (read nearest,
    /// say) has every anchor on a sample: the division is then exact, `a (mul / div) +
    /// floor(add / div)`, and each sample is one row's again.
    pub fn rounding_down(self) -> Self {
        if self.mul.is_multiple_of(self.div) {
            Self {
                mul: self.mul / self.div,
                add: self.add.div_euclid(self.div as i64),
                div: 1,
                containing: true,
            }
        } else {
            Self {
                containing: true,
                ..self
            }
        }
    }

    /// Whether several anchors may read one sample (a containing placement of a coarser
    /// store): then a sample is not one row's.
    pub fn shares_samples(&self) -> bool {
        self.containing && self.div > 1
    }

    /// The anchors that land exactly on a sample: those `a` with `a % modulus == residue`
    /// (`(1, 0)`: every anchor); `None` when no anchor does.
    pub fn congruence(&self) -> Option<(u64, u64)> {
        // a mul ≡ -add (mod div): solvable when g = gcd(mul, div) divides add; then
        // a ≡ (-add / g) (mul / g)^-1 (mod div / g).
        let (mul, div) = (u128::from(self.mul), u128::from(self.div));
        let g = gcd(mul, div).max(1);
        let add = i128::from(self.add);
        if add.rem_euclid(g as i128) != 0 {
            return None;
        }
        let m = div / g;
        if m <= 1 {
            return Some((1, 0));
        }
        let target = (-add / g as i128).rem_euclid(m as i128) as u128;
        let unit = (mul / g) % m;
        // m is small (a ratio of time steps): search the inverse.
        let inverse = (1..m).find(|x| unit * x % m == 1)?;
        Some((m as u64, (target * inverse % m) as u64))
    }
}

/// A view's whole map from anchors to samples of its array: its store's placement, then its
/// window offset in the array's own samples (`y.shift(1)` of 6-hourly targets is the next
/// target, six hours on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleMap {
    /// Where its store sits against the anchors.
    pub placement: Placement,
    /// The window offset, in the array's samples.
    pub offset: i64,
}

impl SampleMap {
    /// A view of the anchors' own store at window offset `offset`.
    pub fn window(offset: i64) -> Self {
        Self {
            placement: Placement::SAME,
            offset,
        }
    }

    /// The sample anchor `anchor` reads (the one before it where it falls between two; below
    /// 0 or past the array's end for an anchor outside [`within`](Self::within)).
    pub fn sample(&self, anchor: u64) -> i128 {
        let p = self.placement;
        let at = if p.mul == 1 && p.div == 1 {
            // A store at the anchors' rate (every store but one aligned at another): no
            // division on the planner's per-row path.
            i128::from(anchor) + i128::from(p.add)
        } else {
            (i128::from(anchor) * i128::from(p.mul) + i128::from(p.add))
                .div_euclid(i128::from(p.div))
        };
        at + i128::from(self.offset)
    }

    /// The anchors of those that land on a sample (every anchor for a containing placement)
    /// whose sample lies in an array of `len`: `(a * mul + add) / div + offset` in `0..len`
    /// (possibly negative or empty).
    pub fn within(&self, len: u64) -> Range<i128> {
        let p = self.placement;
        let (mul, add, div) = (i128::from(p.mul), i128::from(p.add), i128::from(p.div));
        let offset = i128::from(self.offset);
        // j + offset >= 0 with a mul + add = j div: a >= ceil((-offset div - add) / mul).
        let lo = (-offset * div - add).div_euclid(mul)
            + i128::from((-offset * div - add).rem_euclid(mul) != 0);
        let hi = if p.containing {
            // floor((a mul + add) / div) + offset < len: a mul + add < (len - offset) div.
            let top = (i128::from(len) - offset) * div - add;
            top.div_euclid(mul) + i128::from(top.rem_euclid(mul) != 0)
        } else {
            // j + offset <= len - 1: a <= floor(((len - 1 - offset) div - add) / mul).
            ((i128::from(len) - 1 - offset) * div - add).div_euclid(mul) + 1
        };
        lo..hi.max(lo)
    }
}

/// How a label turns an anchor into a sample of its array: through its store's placement and
/// its window offset, or through a table of one sample per anchor (an indexed variable: a
/// climatology of 366 days read at each anchor's day of year).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnchorMap {
    /// `(anchor * mul + add) / div + offset`.
    Affine(SampleMap),
    /// `table[anchor]`.
    Table(Arc<[u64]>),
}

impl AnchorMap {
    /// The sample anchor `anchor` reads (-1 for an anchor past a table's end).
    pub fn sample(&self, anchor: u64) -> i128 {
        match self {
            Self::Affine(m) => m.sample(anchor),
            Self::Table(t) => usize::try_from(anchor)
                .ok()
                .and_then(|a| t.get(a))
                .map_or(-1, |&s| i128::from(s)),
        }
    }

    /// Whether several anchors may read one sample of the array: a table, or a containing
    /// placement of a coarser store.
    pub fn shares_samples(&self) -> bool {
        match self {
            Self::Affine(m) => m.placement.shares_samples(),
            Self::Table(_) => true,
        }
    }

    /// The window offset (0 for a table).
    pub fn offset(&self) -> i64 {
        match self {
            Self::Affine(m) => m.offset,
            Self::Table(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every anchor of `0..n` that lands exactly on a sample, with the sample, by brute force.
    fn landing(map: &SampleMap, n: u64) -> Vec<(u64, i128)> {
        let p = map.placement;
        (0..n)
            .filter(|&a| {
                (i128::from(a) * i128::from(p.mul) + i128::from(p.add))
                    .rem_euclid(i128::from(p.div))
                    == 0
            })
            .map(|a| (a, map.sample(a)))
            .collect()
    }

    #[test]
    fn a_window_of_the_anchors_store_is_anchor_plus_offset() {
        let m = SampleMap::window(3);
        assert_eq!(m.sample(5), 8);
        assert_eq!(m.within(10), -3..7);
        assert_eq!(SampleMap::window(-2).within(10), 2..12);
        assert_eq!(Placement::SAME.congruence(), Some((1, 0)));
    }

    #[test]
    fn placements_between_stores_agree_with_their_times_and_ranges_with_brute_force() {
        // Stores on the root's axis: the root, one started 7 later, one 6-hourly beside the
        // hourly root from its sample 2, one at twice the root's rate from half a sample before.
        let axes = [
            StoreAxis::ROOT,
            StoreAxis::starting_at(7),
            StoreAxis::starting_at(-3),
            StoreAxis {
                start: 2,
                step: 6,
                per: 1,
            },
            StoreAxis {
                start: -1,
                step: 1,
                per: 2,
            },
            StoreAxis {
                start: 3,
                step: 4,
                per: 6,
            },
        ];
        let time = |s: StoreAxis, j: i128| {
            // In 1/lcm parts, compared as fractions: (start + j step) / per.
            (
                i128::from(s.start) + j * i128::from(s.step),
                i128::from(s.per),
            )
        };
        for r in axes {
            for v in axes {
                let p = Placement::between(r, v).unwrap();
                for offset in [-2i64, 0, 1] {
                    let map = SampleMap {
                        placement: p,
                        offset,
                    };
                    let lands = landing(&map, 120);
                    for &(a, j) in &lands {
                        // Anchor a and the sample it reads (before the window) are one time.
                        let (an, ad) = time(r, i128::from(a));
                        let (vn, vd) = time(v, j - i128::from(offset));
                        assert_eq!(an * vd, vn * ad, "{r:?} {v:?} anchor {a}");
                    }
                    // The congruence picks exactly the landing anchors.
                    match p.congruence() {
                        Some((m, res)) => {
                            let want: Vec<u64> = lands.iter().map(|l| l.0).collect();
                            let got: Vec<u64> = (0..120).filter(|a| a % m == res).collect();
                            assert_eq!(got, want, "{r:?} {v:?}");
                        }
                        None => assert!(lands.is_empty(), "{r:?} {v:?}"),
                    }
                    // `within` holds exactly the landing anchors whose sample is in the array.
                    for len in [0u64, 1, 5, 40] {
                        let range = map.within(len);
                        for &(a, j) in &lands {
                            assert_eq!(
                                range.contains(&i128::from(a)),
                                (0..i128::from(len)).contains(&j),
                                "{r:?} {v:?} offset {offset} len {len} anchor {a}"
                            );
                        }
                    }
                }
            }
        }
        // Containing: every anchor reads the sample before it; `within` holds exactly those
        // whose sample is in the array.
        for r in axes {
            for v in axes {
                let mut placement = Placement::between(r, v).unwrap();
                placement.containing = true;
                for offset in [-2i64, 0, 1] {
                    let map = SampleMap { placement, offset };
                    for len in [0u64, 1, 5, 40] {
                        let range = map.within(len);
                        for a in 0..120u64 {
                            let j = map.sample(a);
                            assert_eq!(
                                range.contains(&i128::from(a)),
                                (0..i128::from(len)).contains(&j),
                                "{r:?} {v:?} containing, offset {offset} len {len} anchor {a}"
                            );
                            // The sample before the anchor's time, and the next one after it.
                            let (an, ad) = time(r, i128::from(a));
                            let (vn, vd) = time(v, j - i128::from(offset));
                            let (wn, wd) = time(v, j - i128::from(offset) + 1);
                            assert!(vn * ad <= an * vd && an * wd < wn * ad, "{r:?} {v:?} {a}");
                        }
                    }
                }
            }
        }
        // Nearest: the containing placement on the shifted axis reads the sample nearest the
        // anchor's time, the later of two equally near.
        for r in axes {
            for v in axes {
                let mut placement = Placement::between(r, v.nearest_as_before().unwrap()).unwrap();
                placement.containing = true;
                let map = SampleMap {
                    placement,
                    offset: 0,
                };
                for a in 0..120u64 {
                    let j = map.sample(a);
                    // |time(v, k) - time(r, a)| as a fraction over per_v * per_r.
                    let (an, ad) = time(r, i128::from(a));
                    let gap = |k: i128| {
                        let (vn, vd) = time(v, k);
                        (vn * ad - an * vd).abs()
                    };
                    let nearest = (j - 3..=j + 3).min_by_key(|&k| (gap(k), -k)).unwrap();
                    assert_eq!(j, nearest, "{r:?} {v:?} nearest, anchor {a}");
                }
            }
        }
        // Placing a store against itself is the identity.
        for s in axes {
            assert_eq!(Placement::between(s, s), Some(Placement::SAME));
        }
    }
}
