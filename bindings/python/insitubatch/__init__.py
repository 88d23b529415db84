"""insitubatch: shuffled, split-aware batches from Zarr arrays read in place.

A thin ctypes shim over the Rust library (`libinsitubatch.so`): batch arrays are numpy arrays that
alias Rust memory, and hand over to torch and JAX through DLPack without a copy
(`insitubatch.frameworks`).

    import insitubatch as isb
    geoms = isb.open_geometries("era5.zarr")
    manifest = isb.split_by_chunk(geoms["t2m"], (0.8, 0.1, 0.1))
    with isb.InSituDataset("era5.zarr", manifest, batch_size=64) as ds:
        for epoch in range(2):
            ds.set_epoch(epoch)
            for batch in ds.train:
                x = batch.arrays["t2m"]          # numpy, (64, 181, 360), no copy
"""

from ._core import (
    ArrayGeometry,
    Batch,
    EpochOrder,
    InSituDataset,
    SplitManifest,
    Statistics,
    coordinate_region,
    coordinate_values,
    open_geometries,
    shuffle_quality,
    split_by_chunk,
    split_by_ranges,
)
from ._lib import ABI_VERSION
from .transforms import applies
from .errors import (
    BadData,
    BudgetError,
    CacheLocked,
    CacheMiss,
    CacheWarning,
    Cancelled,
    Closed,
    Error,
    InternalError,
    InvalidArgument,
    IOFailure,
    NotFound,
    StaleCache,
    TransformError,
    Unsupported,
    WrongProcess,
)

__all__ = [
    "ABI_VERSION",
    "applies",
    "ArrayGeometry",
    "BadData",
    "Batch",
    "BudgetError",
    "CacheLocked",
    "CacheMiss",
    "CacheWarning",
    "Cancelled",
    "Closed",
    "EpochOrder",
    "Error",
    "InSituDataset",
    "IOFailure",
    "InternalError",
    "InvalidArgument",
    "NotFound",
    "SplitManifest",
    "StaleCache",
    "TransformError",
    "Unsupported",
    "WrongProcess",
    "coordinate_region",
    "coordinate_values",
    "open_geometries",
    "shuffle_quality",
    "split_by_chunk",
    "split_by_ranges",
    "Statistics",
]
__version__ = "0.1.0"
