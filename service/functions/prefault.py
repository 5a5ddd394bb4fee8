"""Fault memory in ahead of use, off the request path (Linux ``MADV_POPULATE_WRITE``).

An exact-basis function's GP factor grows by a batch's columns into a buffer sized at its
public capacity ``t_max`` up front; the pages of those columns are first touched when the batch
is appended. Where first touches are slow (a virtual machine backs guest memory on demand:
about 2 ms per MB measured on the benchmark machine, 0.27 s for one 1000-point batch's columns
at t = 10^4, a quarter of that batch's time), that cost lands inside the next request. After
each batch this module asks the kernel, on one background thread, to populate the pages the
next batch will write. ``MADV_POPULATE_WRITE`` (Linux 5.14) faults pages in without changing
their contents, so it races with nothing; where it is missing this is a no-op.

The pages are the process's own cache of public-size buffers: no private data is read, and the
work depends only on ``t``, ``t_max`` and ``batch_max``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from numpy.typing import NDArray

log = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # <linux/mman.h>

_guard = threading.Lock()
_madvise: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]
_unsupported = not sys.platform.startswith("linux")
_executor: ThreadPoolExecutor | None = None


def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    global _madvise, _unsupported
    with _guard:
        if _madvise is None and not _unsupported:
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
                fn = libc.madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
                _madvise = fn
            except (OSError, AttributeError):
                _unsupported = True
        return _madvise


def _populate_range(madvise: ctypes._CFuncPtr, start: int, length: int) -> bool:  # type: ignore[name-defined]
    page = mmap.PAGESIZE
    aligned = start - start % page
    if madvise(aligned, start + length - aligned, MADV_POPULATE_WRITE) == 0:
        return True
    global _unsupported
    if ctypes.get_errno() == 22:  # EINVAL: a kernel older than 5.14; stop asking
        _unsupported = True
    return False


def populate(region: NDArray[np.float64]) -> None:
    """Fault in a 1-D contiguous array, or each column of a 2-D view whose columns are
    contiguous (a Fortran-ordered buffer's columns), synchronously; best effort."""
    madvise = _function()
    if madvise is None or region.size == 0:
        return
    if region.ndim == 1:
        if region.strides[0] == region.itemsize:
            _populate_range(madvise, region.ctypes.data, region.nbytes)
        return
    rows, cols = region.shape
    if region.strides[0] != region.itemsize:
        return
    base, stride, length = region.ctypes.data, region.strides[1], rows * region.itemsize
    for j in range(cols):
        if not _populate_range(madvise, base + j * stride, length):
            return


def populate_later(regions: list[NDArray[np.float64]]) -> list[Future[None]]:
    """``populate`` each region on the background thread (the views keep their buffers alive
    until it is done); the futures are for tests."""
    global _executor
    if _unsupported or not regions:
        return []
    with _guard:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefault")
        executor = _executor
    return [executor.submit(_quietly, region) for region in regions]


def _quietly(region: NDArray[np.float64]) -> None:
    try:
        populate(region)
    except Exception:  # best effort: a failure costs only the page faults it would have saved
        log.debug("prefault failed", exc_info=True)
