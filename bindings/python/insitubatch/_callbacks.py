"""Python functions as chunk transforms, through the C ABI's callback transforms
(`isb_dataset_open_with_transforms`).

One trampoline serves every function: the library is handed the trampoline, a `release`
function and a key into `_live`, which holds each `transforms.Function` until the library
releases it. The trampoline runs on the library's executor threads (ctypes takes the GIL for
it), turns the chunk into numpy arrays, calls the function, checks and copies its result, and
turns any exception into a message the pass fails with: nothing raised in it escapes into
ctypes, which would print and report success.

At interpreter exit the library is told to stop calling Python (`isb_callbacks_shutdown`)
before Python tears itself down: a library thread entering Python during finalisation would be
ended by Python mid-call, and the process would abort.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
from dataclasses import dataclass

import numpy as np

from typing import TYPE_CHECKING, Sequence

from ._lib import lib

if TYPE_CHECKING:
    from .transforms import Function


class IsbChunk(ctypes.Structure):
    _fields_ = [
        ("array", ctypes.c_char_p),
        ("index", ctypes.c_uint64),
        ("ndim", ctypes.c_size_t),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("dtype", ctypes.c_char_p),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
    ]


TRANSFORM_FN = ctypes.CFUNCTYPE(
    ctypes.c_int32,
    ctypes.c_void_p,
    ctypes.POINTER(IsbChunk),
    ctypes.POINTER(IsbChunk),
    ctypes.c_void_p,
    ctypes.c_size_t,
)
RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class IsbTransformCallback(ctypes.Structure):
    _fields_ = [
        ("apply", TRANSFORM_FN),
        ("release", RELEASE_FN),
        ("user_data", ctypes.c_void_p),
        ("thread_exit", RELEASE_FN),
    ]


@dataclass(frozen=True)
class ChunkInfo:
    """Where a chunk comes from: the array's path, the chunk's index along the sample axis, and
    the sample index of its first row (``index * samples_per_chunk``)."""

    array: str
    index: int
    first_sample: int


# A library thread has no Python thread state of its own: ctypes makes one for each call and
# destroys it afterwards, which cost ~60 us per call here (a new frame stack each time, freshly
# mapped). The first call on a thread takes one more reference (PyGILState_Ensure), so the
# state lives between calls; the library's `thread_exit` drops it as the thread ends.
_ensure = ctypes.pythonapi.PyGILState_Ensure
_ensure.restype = ctypes.c_int
_ensure.argtypes = []
_release_state = ctypes.pythonapi.PyGILState_Release
_release_state.restype = None
_release_state.argtypes = [ctypes.c_int]
_thread = threading.local()

_lock = threading.Lock()
_live: dict[int, Function] = {}  # key -> transforms.Function, until the library releases it
_next_key = 1
_shutdown_registered = False


def _view(c: IsbChunk) -> np.ndarray:
    """The chunk's memory as a writable numpy array (no copy)."""
    shape = tuple(c.shape[i] for i in range(c.ndim))
    dtype = np.dtype(c.dtype.decode())
    if c.nbytes == 0:
        return np.zeros(shape, dtype)
    raw = (ctypes.c_char * c.nbytes).from_address(c.data)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _describe(f) -> str:
    name = getattr(f.fn, "__qualname__", None) or repr(f.fn)
    return f"Python function {name}"


def _apply(key, inp, out, message, message_len) -> int:
    if getattr(_thread, "kept", None) is None:
        _thread.kept = _ensure()
    f: Function | None = None
    try:
        f = _live[key]
        i, o = inp.contents, out.contents
        x = _view(i)
        if f.with_info:
            info = ChunkInfo(i.array.decode(), int(i.index), int(i.index) * int(i.shape[0]))
            y = f.fn(x, info)
        else:
            y = f.fn(x)
        y = np.asarray(y)
        out_shape = tuple(o.shape[k] for k in range(o.ndim))
        if y.shape != out_shape:
            hint = "" if f.shape is not None else "; declare another with Function(shape=...)"
            raise ValueError(
                f"it returned shape {y.shape} for a chunk whose output is {out_shape}{hint}"
            )
        if not (o.data == i.data and y is x):  # `x` changed in place is the output already
            np.copyto(_view(o), y, casting="same_kind")
        return 0
    except BaseException as e:  # noqa: BLE001 - nothing may escape into ctypes
        who = _describe(f) if f is not None else "a Python function"
        text = f"{who} raised {type(e).__name__}: {e}".encode("utf-8", "replace")
        text = text[: max(int(message_len) - 1, 0)] + b"\0"
        if message_len:
            ctypes.memmove(message, text, len(text))
        return 1


def _release(key) -> None:
    with _lock:
        _live.pop(key, None)


def _thread_exit(_key) -> None:
    kept = getattr(_thread, "kept", None)
    if kept is not None:  # once per thread, whichever function's exit comes first
        _thread.kept = None
        _release_state(kept)


# Module globals: they outlive every dataset, so the library never calls freed trampolines.
_APPLY = TRANSFORM_FN(_apply)
_RELEASE = RELEASE_FN(_release)
_THREAD_EXIT = RELEASE_FN(_thread_exit)


def callbacks(functions: Sequence[Function]) -> ctypes.Array:
    """The C array of callbacks for `functions` (in config order, at least one), each registered
    in `_live` until the library releases it."""
    global _next_key, _shutdown_registered
    arr = (IsbTransformCallback * len(functions))()
    with _lock:
        if not _shutdown_registered:
            atexit.register(_shutdown)
            _shutdown_registered = True
        for slot, f in zip(arr, functions):
            key, _next_key = _next_key, _next_key + 1
            _live[key] = f
            slot.apply, slot.release, slot.user_data = _APPLY, _RELEASE, key
            slot.thread_exit = _THREAD_EXIT
    return arr


def _shutdown() -> None:
    # Before Python finalises: no Python function may run on a library thread afterwards.
    lib.isb_callbacks_shutdown(10_000, None)
