"""torch and JAX adapters (both optional). Tensors are made through DLPack from the batch's numpy
arrays, so they alias the Rust buffer: no copy on the CPU.

Each adapter takes a `device_transform`, the spec's third transform stage: a function of the
dict of tensors once they are on `device`, for work that is cheap there (normalisation,
batched interpolation, FFTs). Its result is what the adapter returns."""

from __future__ import annotations

from typing import Iterator

from . import errors
from . import _core
from ._core import _not_picklable


def _checked(device_transform):
    if device_transform is not None and not callable(device_transform):
        raise TypeError(
            f"`device_transform` must be a function of the dict of tensors, not "
            f"{type(device_transform).__name__}"
        )
    return device_transform


def to_torch(batch, device=None, device_transform=None):
    """label -> torch.Tensor aliasing the batch (moved to `device` if given), or what
    `device_transform` makes of that dict."""
    import torch

    _checked(device_transform)
    out = {}
    for label, arr in batch.arrays.items():
        t = torch.from_dlpack(arr)
        out[label] = t.to(device) if device is not None else t
    return device_transform(out) if device_transform is not None else out


def to_jax(batch, device=None, device_transform=None):
    """label -> jax.Array (on `device`, default jax.devices()[0]); a CPU import aliases. With
    `device_transform`, what it makes of that dict (wrap it in `jax.jit` to compile it once).

    JAX without 64-bit types (its default) narrows int64, uint64, float64 and complex128 on
    import without a word (2**40 becomes 0, 1e300 becomes inf); such a label is an
    `Unsupported` error instead, saying to enable `jax_enable_x64` or cast in a batch
    transform."""
    import jax

    _checked(device_transform)
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
    return device_transform(out) if device_transform is not None else out


def as_torch(view, device=None, device_transform=None, start_batch=0):
    """A torch IterableDataset over a view (`ds.train`): use it with
    `DataLoader(as_torch(ds.train), batch_size=None, num_workers=0)`; each item is a dict of
    tensors (on `device` if given), or what `device_transform` makes of it. Parallelism is
    inside insitubatch, so DataLoader workers add nothing. `start_batch` resumes the first
    epoch iterated at that batch (`view.from_batch`), for a job restarted from a checkpoint;
    later iterations are whole epochs, and `len()` is the batches the next iteration yields."""
    import torch

    _checked(device_transform)
    pending = [_core._check_int("start_batch", start_batch, 0)]

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
            start, pending[0] = pending[0], 0
            epoch = view.from_batch(start) if start else iter(view)
            for batch in epoch:
                yield to_torch(batch, device, device_transform)

        def __len__(self) -> int:
            # Batches of the next iteration: DataLoader(..., batch_size=None) reports it.
            return len(view) - pending[0]

    return _Iterable()
