"""Prefaulting is best effort and never changes memory contents."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from service.functions import prefault


def test_populate_keeps_contents_of_columns_and_flat_arrays() -> None:
    buffer = np.zeros((300, 300), order="F")
    buffer[:100, :100] = np.arange(10_000, dtype=np.float64).reshape(100, 100)
    before = buffer.copy()
    prefault.populate(buffer[:200, 50:250])  # in-use and fresh pages alike
    prefault.populate(buffer.reshape(-1, order="F"))
    prefault.populate(buffer[::2, :3])  # rows not contiguous: skipped, not an error
    assert np.array_equal(buffer, before)


def test_populate_later_runs_in_the_background() -> None:
    buffer = np.zeros((512, 512), order="F")
    buffer[:, 0] = 7.0
    futures = prefault.populate_later([buffer[:, :256], buffer.reshape(-1, order="F")])
    for future in futures:
        assert future.result(timeout=10) is None
    assert np.all(buffer[:, 0] == 7.0)
    assert not buffer[:, 1:].any()


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_populate_faults_the_pages_in() -> None:
    fresh = np.zeros((4096, 2048), order="F")  # 64 MiB, untouched
    before = _resident_bytes()
    prefault.populate(fresh[:, :1024])  # the first half of the columns
    grown = _resident_bytes() - before
    if prefault._unsupported:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    assert 30 * 2**20 <= grown <= 50 * 2**20  # 32 MiB (plus a huge page at either end)
    assert not fresh.any()
