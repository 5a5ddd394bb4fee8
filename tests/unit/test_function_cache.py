"""The per-process cache of exact-mode function paths keeps what fits in
``CURATOR_FUNCTION_CACHE_MB`` (least recently used dropped first, never the newest), so a
grantee cycling through many small functions no longer forces an O(t^3) replay of each (the
old cache held 4 whatever their size)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from service.config import get_settings
from service.functions import service as functions


@dataclass
class _Path:
    t: int
    q: int


def _entry(t: int) -> Any:
    return functions._Entry(version=1, fitted=None, path=_Path(t, 3))  # type: ignore[arg-type]


def test_evictions_drop_the_oldest_until_the_rest_fit() -> None:
    assert functions.evictions([10, 10, 10], budget=30, max_count=5) == 0
    assert functions.evictions([10, 10, 10], budget=25, max_count=5) == 1
    assert functions.evictions([50, 5, 5], budget=10, max_count=5) == 1
    assert functions.evictions([1, 1, 1, 1], budget=100, max_count=2) == 2
    # the newest stays even when it alone is over the budget
    assert functions.evictions([10, 10, 500], budget=100, max_count=5) == 2
    assert functions.evictions([], budget=1, max_count=1) == 0


def test_entry_bytes_grow_with_the_square_of_the_answered_points() -> None:
    assert functions.entry_bytes(0, 3) == 0
    assert functions.entry_bytes(1000, 3) == 8 * 1000 * 1000 + 8 * 1000 * 7
    assert functions.entry_bytes(2000, 3) > 3.9 * functions.entry_bytes(1000, 3)


def test_many_small_functions_stay_cached_and_large_ones_fit_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CURATOR_FUNCTION_CACHE_MB", "1")
    get_settings.cache_clear()
    functions.forget()
    try:
        for i in range(12):  # 12 functions of 50 points: 20 kB each
            functions._remember(f"small-{i}", _entry(50))
        assert all(functions._cached(f"small-{i}") is not None for i in range(12))
        for i in range(3):  # 300 points: 0.73 MB each, one fits in 1 MiB with the small ones
            functions._remember(f"large-{i}", _entry(300))
        assert functions._cached("large-2") is not None
        assert functions._cached("large-0") is None
        assert functions._cached("large-1") is None
        assert functions._cached("small-0") is None  # the oldest went first
        total = sum(functions._size(e) for e in functions._cache.values())
        assert total <= 1024 * 1024
    finally:
        functions.forget()
        get_settings.cache_clear()
