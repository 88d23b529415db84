"""Loading libinsitubatch and declaring every C function's signature (ctypes defaults truncate
pointers, so each function gets its restype and argtypes)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

ABI_VERSION = 23
_LIB_NAME = "libinsitubatch.so"


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]


def _candidates() -> list[Path]:
    out = []
    env = os.environ.get("INSITUBATCH_LIB")
    if env:
        out.append(Path(env))
    here = Path(__file__).resolve().parent
    out.append(here / _LIB_NAME)
    # A source checkout: bindings/python/insitubatch -> target/release.
    out.append(here.parents[2] / "target" / "release" / _LIB_NAME)
    return out


def _load() -> ctypes.CDLL:
    tried = []
    for path in _candidates():
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            break
        tried.append(str(path))
    else:
        raise ImportError(
            "insitubatch: cannot find libinsitubatch.so (tried: "
            + ", ".join(tried)
            + "). Build it with `cargo build --release` at the repository root and set "
            "INSITUBATCH_LIB=target/release/libinsitubatch.so, or `pip install ./bindings/python`."
        )
    lib.isb_abi_version.restype = ctypes.c_uint32
    lib.isb_abi_version.argtypes = []
    found = lib.isb_abi_version()
    if found != ABI_VERSION:
        raise ImportError(
            f"insitubatch: {path} has ABI version {found}, this Python package expects "
            f"{ABI_VERSION}; rebuild the library from the same checkout (`cargo build --release`) "
            "or reinstall the package (`pip install ./bindings/python`)."
        )
    P = ctypes.c_void_p
    S = ctypes.c_char_p
    U32 = ctypes.c_uint32
    ERR = ctypes.POINTER(ctypes.c_void_p)
    OUT_STR = ctypes.POINTER(ctypes.c_void_p)
    sigs = {
        "isb_error_status": (U32, [P]),
        "isb_error_message": (S, [P]),
        "isb_error_free": (None, [P]),
        "isb_string_free": (None, [P]),
        "isb_open_geometries": (U32, [S, U32, OUT_STR, ERR]),
        "isb_open_geometries_with": (U32, [S, S, OUT_STR, ERR]),
        "isb_coordinate_region": (U32, [S, S, OUT_STR, ERR]),
        "isb_coordinate_values": (U32, [S, S, OUT_STR, ERR]),
        "isb_split_by_chunk": (U32, [S, S, S, OUT_STR, ERR]),
        "isb_dataset_open": (U32, [S, ctypes.POINTER(P), ERR]),
        "isb_dataset_open_with_transforms": (
            U32,
            [S, P, ctypes.c_size_t, ctypes.POINTER(P), ERR],
        ),
        "isb_callbacks_shutdown": (U32, [ctypes.c_uint64, ERR]),
        "isb_dataset_free": (None, [P]),
        "isb_dataset_set_epoch": (U32, [P, ctypes.c_uint64, ERR]),
        "isb_dataset_stats_json": (U32, [P, OUT_STR, ERR]),
        "isb_dataset_memory_json": (U32, [P, S, OUT_STR, ERR]),
        "isb_dataset_split_len": (
            U32,
            [P, S, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64), ERR],
        ),
        "isb_dataset_order": (
            U32,
            [P, S, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
             ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ERR],
        ),
        "isb_iter_start_at": (U32, [P, S, ctypes.c_uint64, ctypes.POINTER(P), ERR]),
        "isb_iter_next": (U32, [P, ctypes.POINTER(P), ERR]),
        "isb_iter_next_timeout": (U32, [P, ctypes.c_uint64, ctypes.POINTER(P), ERR]),
        "isb_iter_stats_json": (U32, [P, OUT_STR, ERR]),
        "isb_iter_free": (None, [P]),
        "isb_batch_len": (U32, [P, ctypes.POINTER(ctypes.c_size_t), ERR]),
        "isb_batch_position": (
            U32, [P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64), ERR],
        ),
        "isb_batch_sample_indices": (
            U32,
            [P, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ERR],
        ),
        "isb_batch_patch_origins": (
            U32,
            [P, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ERR],
        ),
        "isb_batch_label_count": (U32, [P, ctypes.POINTER(ctypes.c_size_t), ERR]),
        "isb_batch_label": (U32, [P, ctypes.c_size_t, ctypes.POINTER(S), ERR]),
        "isb_batch_export": (U32, [P, S, ctypes.POINTER(ctypes.c_void_p), ERR]),
        "isb_dlpack_delete": (None, [P]),
        "isb_batch_free": (None, [P]),
        "isb_statistics_new": (U32, [P, S, ctypes.POINTER(P), ERR]),
        "isb_statistics_add": (U32, [P, P, ERR]),
        "isb_statistics_json": (U32, [P, OUT_STR, ERR]),
        "isb_statistics_free": (None, [P]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = _load()

# Byte offset of `dl_tensor.data` inside DLManagedTensorVersioned: the shim reads the data
# pointer straight from an exported tensor's address.
DATA_OFFSET = DLManagedTensorVersioned.dl_tensor.offset + DLTensor.data.offset
