"""Putting predictions made on a grid's tiles back into whole fields, for inference over fields
too large for a model.

A dataset with `patch_grid=` delivers every field as tiles (`docs/python-api.md`, "Several
patches per sample, and tiling a field for inference"); a `Stitcher` takes each batch's
predictions, adds each tile into its sample's field at the row's `patch_origins` (modulo a
periodic axis), and hands back a field as soon as its last tile is in, averaged where tiles
overlap (optionally weighted, so that a tile's edges count less than its centre):

    import insitubatch as isb
    from insitubatch.tiling import Stitcher

    ds = isb.InSituDataset(store, geometries=..., patch=(64, 64), patch_grid=(48, 48),
                           shuffle=False)
    stitcher = Stitcher(ds)
    for batch in ds.all:                      # or a manifest's test split
        for sample, field in stitcher.add(batch, model(batch.arrays["x"])):
            write(sample, field)              # (*leading axes of the prediction, *field)
    stitcher.close()                          # every field finished

Fields in progress are held until their last tile comes: one or two at a time for a pass in
order, more for a shuffled one (a shuffle block's samples).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import errors


class Stitcher:
    """Adds predictions for a grid's tiles into whole fields (see the module's documentation).

    `ds` is a dataset with a `patch_grid`. `weight`, shaped like the patch, weighs each tile's
    values where tiles overlap (a taper such as an outer product of `np.hanning` windows, kept
    above zero, hides the seams); `None` averages them evenly. Fields are accumulated in
    float64 and returned in `dtype`."""

    def __init__(self, ds: Any, weight: Any = None, dtype: Any = np.float32):
        if getattr(ds, "patch_grid", None) is None:
            raise errors.InvalidArgument(
                "a Stitcher puts a grid's tiles back into whole fields, and this dataset has no "
                "`patch_grid` (drawn patches need not cover a field): open it with "
                "patch_grid=True or a stride"
            )
        self.patch = tuple(ds.patch)
        self.wrap = tuple(ds.patch_wrap)
        self.per_sample = int(ds.patches_per_sample)
        shape = next(iter(ds.sample_formats.values()))[0]
        self.field = tuple(shape[len(shape) - len(self.patch):])
        self.dtype = np.dtype(dtype)
        if weight is None:
            self.weight = None
        else:
            w = np.asarray(weight, dtype=np.float64)
            if w.shape != self.patch:
                raise ValueError(f"`weight` must be shaped like the patch {self.patch}, not {w.shape}")
            if not (np.isfinite(w).all() and (w > 0).all()):
                raise ValueError("`weight` must be finite and above zero everywhere (a zero "
                                 "weight leaves an element of a field no value)")
            self.weight = w
        # Every field is tiled alike, so the weights summed at each element are one field's:
        # summed from the origins of the first field finished, then kept.
        self._weights: np.ndarray | None = None
        # Per field in progress: [weighted sum, tiles added, its tiles' origins until the
        # weights are known]; finished sums kept for reuse (a fresh one is fresh pages, which
        # cost more than zeroing a used one).
        self._fields: dict[int, list[Any]] = {}
        self._spare: list[np.ndarray] = []

    @property
    def pending(self) -> list[int]:
        """The samples whose fields are waiting for tiles, in order."""
        return sorted(self._fields)

    def _indices(self, origin) -> tuple[Any, ...]:
        """Where a tile at `origin` lies in a field: slices, or index arrays for a tile across
        the end of a periodic axis (taken modulo the axis)."""
        origin = [int(o) for o in origin]
        if all(o + p <= n for o, p, n in zip(origin, self.patch, self.field)):
            return tuple(slice(o, o + p) for o, p in zip(origin, self.patch))
        axes = [(o + np.arange(p)) % n for o, p, n in zip(origin, self.patch, self.field)]
        return np.ix_(*axes)

    def add(self, batch: Any, predictions: Any) -> list[tuple[int, np.ndarray]]:
        """Adds `predictions` for `batch`'s rows, shaped `(len(batch), *leading, *patch)` (the
        leading axes are the model's, channels say), and returns the fields finished by them
        as `(sample index, field)` pairs, each field shaped `(*leading, *field)`."""
        values = np.asarray(predictions)
        k = len(self.patch)
        n = len(batch)
        if values.ndim < 1 + k or values.shape[0] != n or tuple(values.shape[-k:]) != self.patch:
            raise ValueError(
                f"`predictions` must be shaped (rows, ..., {', '.join(map(str, self.patch))}) "
                f"with {n} rows, one per tile of the batch, not {values.shape}"
            )
        origins = batch.patch_origins
        lead = values.shape[1:-k]
        done = []
        for r, sample in enumerate(batch.sample_indices.tolist()):
            state = self._fields.get(sample)
            if state is None:
                if self._spare and self._spare[-1].shape == lead + self.field:
                    total = self._spare.pop()
                    total.fill(0.0)
                else:
                    total = np.zeros(lead + self.field)
                state = [total, 0, []]
                self._fields[sample] = state
            elif state[0].shape[:-k] != lead:
                raise ValueError(f"predictions for sample {sample} changed shape: {lead} "
                                 f"after {state[0].shape[:-k]}")
            at = self._indices(origins[r])
            if self.weight is None:
                state[0][(...,) + at] += values[r]
            else:
                state[0][(...,) + at] += values[r] * self.weight
            state[1] += 1
            if self._weights is None:
                state[2].append(at)
            if state[1] == self.per_sample:
                total, _, placed = self._fields.pop(sample)
                if self._weights is None:
                    self._weights = np.zeros(self.field)
                    for where in placed:
                        self._weights[where] += 1.0 if self.weight is None else self.weight
                total /= self._weights
                done.append((sample, total.astype(self.dtype)))
                if len(self._spare) < 4:
                    self._spare.append(total)
        return done

    def close(self) -> None:
        """Checks that every field was finished: an error naming the samples still waiting for
        tiles (a pass stopped early, `drop_last`, or a rank's share cut mid-field)."""
        if self._fields:
            waiting = {s: self.per_sample - st[1] for s, st in sorted(self._fields.items())}
            raise errors.InvalidArgument(
                f"{len(waiting)} of the fields never got all of their {self.per_sample} tiles "
                f"(sample: tiles missing) {waiting}; finish the pass, and do not use drop_last "
                f"or an evened train split for inference"
            )
