//! Pool slots holding only what a pass's patches read of each field.
//!
//! A patched row of a field stored as several chunks (or a shard's inner chunks) is decoded
//! straight into its batch row as the region its window covers (`crate::assembly`), but only
//! when one label reads the chunk and the order draws its samples within one shuffle block. A
//! chunk two labels read — `t2m` and a window `t2m_next` of it, a forecast's input and target
//! — feeds rows in two blocks, far apart in a shuffled order, so it goes through the pool,
//! where a whole field would be read and decoded for a few windows of it. Instead, such a slot
//! is loaded with only the stored (inner) chunks under the windows of the rows that read it in
//! this pass, whichever label's, each once; the gather cuts every row's patch from it as from a
//! whole field. The rest of the slot is never written, so the slot is this pass's alone
//! ([`insitubatch_pool::Owner::admit_private`]): never a hit for another pass or a later
//! epoch (whose windows differ), never written to a cache directory, dropped when released.
//!
//! [`RegionSlots::plan`] decides which slots load so, when the pass starts: those of a path
//! whose patched rows are read as regions ([`crate::patch::reads_patch_region`]), which every
//! label reading it cuts a patch from, without chunk transforms (they run on whole chunks), in
//! a pool without a cache directory (where whole chunks are worth keeping across runs), and
//! when the share of a field its windows are expected to touch
//! ([`crate::patch::expected_share_under_windows`]) is below the share of a later epoch's whole
//! slots the pool's budget would not keep (with a budget holding every chunk the pass reads,
//! none: whole fields are read once and hit after).

use crate::assembly::{DirectRows, PassInputs};
use crate::pass::IntoRows;
use crate::patch::{Origins, PatchDraw, expected_share_under_windows, reads_patch_region};
use crate::transform::Pipeline;

/// One row reading a region slot: its label, its row of the order and its sample within the
/// chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotRow {
    pub label: u32,
    pub row: u32,
    pub sample: u32,
}

/// Per plan slot loaded as a region slot, the rows that read it.
#[derive(Debug, Default)]
pub(crate) struct RegionSlots {
    /// Per plan slot: the range of `rows` reading it (empty: a whole slot, or rows).
    slots: Vec<std::ops::Range<u32>>,
    rows: Vec<SlotRow>,
}

impl RegionSlots {
    /// The plan slots of a pass loaded as region slots, of those `direct` does not decode into
    /// rows (see the module's documentation for which).
    pub fn plan(inputs: &PassInputs, direct: &DirectRows) -> Self {
        let (plan, order, pool) = (inputs.plan, inputs.order, inputs.pool);
        let Some(draw) = &plan.patch else {
            return Self::default();
        };
        let (pass_bytes, budget) = inputs.pass_bytes_and_budget();
        // Whole slots are worth their reads when a later epoch finds enough of them resident:
        // under LRU with each epoch's order shuffled, a budget holding a share `f` of the
        // pass's chunks serves about `f^2.5` of a later epoch's (4 % at a quarter, 15 % at
        // half, measured; `crate::assembly`). A region slot is read again every epoch, but
        // only the share its windows touch.
        let kept = (budget as f64 / pass_bytes.max(1) as f64).min(1.0);
        let whole_misses = match inputs.mode {
            IntoRows::Always => 1.0,
            IntoRows::Auto | IntoRows::Never => 1.0 - kept.powf(2.5),
        };
        let n_rows = order.rows.len();
        if whole_misses <= 0.0
            || pool.disk().is_some()
            || inputs.release_each_block
            || u32::try_from(n_rows).is_err()
        {
            return Self::default();
        }
        // As for rows read as regions: one window per sample, or drawn ones (a grid covers
        // the whole field).
        let drawn = matches!(draw.patch.origins, Origins::Random(_));
        let per_sample = PatchDraw::per_sample(draw);
        let mut labels = vec![0u64; plan.paths.len()];
        let mut cut = vec![true; plan.paths.len()];
        for l in &plan.labels {
            labels[l.path] += 1;
            cut[l.path] &= l.cut.is_some();
        }
        let eligible: Vec<bool> = plan
            .paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let inner = inputs.inner[i].as_deref();
                // Each sample is read by every label's rows: a window per label and patch.
                let windows = labels[i].saturating_mul(per_sample);
                let share = expected_share_under_windows(p, inner, &draw.patch, windows);
                (per_sample == 1 || drawn)
                    && cut[i]
                    && !p.geom.static_field
                    && inputs
                        .transforms
                        .get(&*p.path)
                        .is_none_or(Pipeline::is_empty)
                    && reads_patch_region(p, inner, &draw.patch)
                    && share < whole_misses
            })
            .collect();
        // One entry per row of each label reading an eligible path, indexed by `u32`.
        let labels_read = plan.labels.iter().filter(|l| eligible[l.path]).count();
        if !eligible.contains(&true) || u32::try_from(labels_read.saturating_mul(n_rows)).is_err() {
            return Self::default();
        }
        let mut by_slot: Vec<Vec<SlotRow>> = vec![Vec::new(); plan.slots.len()];
        for (l, label) in plan.labels.iter().enumerate() {
            if !eligible[label.path] {
                continue;
            }
            for i in 0..n_rows {
                let (s, w) = plan.locate(l, order.anchor(i), plan.block_of_row[i]);
                if direct.is_direct(s as usize) {
                    continue;
                }
                by_slot[s as usize].push(SlotRow {
                    label: l as u32,
                    row: i as u32,
                    sample: w as u32,
                });
            }
        }
        let mut out = Self::default();
        for rows in by_slot {
            let start = out.rows.len() as u32;
            out.rows.extend(rows);
            out.slots.push(start..out.rows.len() as u32);
        }
        out
    }

    /// The rows reading plan slot `slot`, when it is loaded as a region slot.
    pub fn rows_of(&self, slot: usize) -> Option<&[SlotRow]> {
        let r = self.slots.get(slot)?;
        (!r.is_empty()).then(|| &self.rows[r.start as usize..r.end as usize])
    }
}
