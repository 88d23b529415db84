"""torch and JAX adapters (both optional). Tensors are made through DLPack from the batch's numpy
arrays, so they alias the Rust buffer: no copy on the CPU."""

from __future__ import annotations

from typing import Iterator

from . import errors
from ._core import _not_picklable


def to_torch(batch, device=None) -> dict:
    """label -> torch.Tensor aliasing the batch (moved to `device` if given)."""
    import torch

    out = {}
    for label, arr in batch.arrays.items():
        t = torch.from_dlpack(arr)
        out[label] = t.to(device) if device is not None else t
    return out


def to_jax(batch, device=None) -> dict:
    """label -> jax.Array (on `device`, default jax.devices()[0]); a CPU import aliases.

    JAX without 64-bit types (its default) narrows int64, uint64, float64 and complex128 on
    import without a word (2**40 becomes 0, 1e300 becomes inf); such a label is an
    `Unsupported` error instead, saying to enable `jax_enable_x64` or cast in a batch
    transform."""
    import jax

    out = {}
    for label, arr in batch.arrays.items():
        narrowed = jax.dtypes.canonicalize_dtype(arr.dtype)
        if narrowed != arr.dtype:
            raise errors.Unsupported(
                f"label {label!r} is {arr.dtype}, which JAX would silently narrow to {narrowed} "
                f"(64-bit types are disabled): call jax.config.update('jax_enable_x64', True) "
                f"before importing batches, or cast it in a batch transform"
            )
        x = jax.dlpack.from_dlpack(arr)
        out[label] = jax.device_put(x, device) if device is not None else x
    return out


def as_torch(view, device=None):
    """A torch IterableDataset over a view (`ds.train`): use it with
    `DataLoader(as_torch(ds.train), batch_size=None, num_workers=0)`; each item is a dict of
    tensors. Parallelism is inside insitubatch, so DataLoader workers add nothing."""
    import torch

    class _Iterable(torch.utils.data.IterableDataset):
        def __reduce__(self):
            # A DataLoader with workers under `spawn`/`forkserver` pickles the dataset.
            _not_picklable("as_torch(...)")

        def __iter__(self) -> Iterator[dict]:
            if torch.utils.data.get_worker_info() is not None:
                raise errors.WrongProcess(
                    "as_torch(...) runs inside a DataLoader worker process, where the dataset "
                    "opened in the parent cannot be used; pass num_workers=0 (insitubatch reads "
                    "and decodes in parallel itself)"
                )
            for batch in view:
                yield to_torch(batch, device)

        def __len__(self) -> int:
            # Batches per epoch: DataLoader(..., batch_size=None) reports it as its len().
            return len(view)

    return _Iterable()
