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
    # small paths: a page per factor column; large ones: the triangle
    assert functions.entry_bytes(10, 3) == 4 * 100 + 4096 * 10 + 8 * 10 * 7
    assert functions.entry_bytes(20000, 3) > 3.5 * functions.entry_bytes(10000, 3)


def test_many_small_functions_stay_cached_and_large_ones_fit_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CURATOR_FUNCTION_CACHE_MB", "4")
    get_settings.cache_clear()
    functions.forget()
    budget = 4 * 1024 * 1024
    try:
        names = [f"small-{i}" for i in range(12)]
        for name in names:  # 12 functions of 50 points, 0.22 MB each: more than the old 4
            functions._remember(name, _entry(50))
        assert all(functions._cached(name) is not None for name in names)
        for i in range(3):  # 300 points: 1.6 MB each
            names.append(f"large-{i}")
            functions._remember(names[-1], _entry(300))
            total = sum(functions._size(e) for e in functions._cache.values())
            assert total <= budget
        kept = list(functions._cache)
        assert kept[-1] == "large-2"
        assert kept == names[len(names) - len(kept) :]  # the least recently used went first
        assert "small-0" not in kept
        assert len(kept) < len(names)
    finally:
        functions.forget()
        get_settings.cache_clear()
