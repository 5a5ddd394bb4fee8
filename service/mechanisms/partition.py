"""Row-wise public clean-up of the private arrays and the random partition into folds.

Shared by every mechanism that fits on disjoint folds (Niu et al. Theorem 6 needs a uniformly
random partition with public fold sizes, the assignment never stored or released).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.calibration import validate_finite_positive
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.errors import InvalidParameters

# Every fold of every mechanism holds at least this many records (a public constant).
MIN_FOLD_SIZE = 100
_FOLD_SUM_TOLERANCE = 1e-9


def at_least_min_fold(fraction: float, n: int) -> float:
    """``fraction`` raised where ``fraction * n`` is under ``MIN_FOLD_SIZE`` records (by half a
    record, so ``floor(fraction * n)`` in ``fold_sizes`` cannot round below it). Public n only."""
    return max(fraction, (MIN_FOLD_SIZE + 0.5) / max(n, 1))


def fold_sizes(n: int, fractions: Sequence[float]) -> tuple[int, ...]:
    """Public fold sizes: ``floor(fraction * n)`` per fold; the last fold takes the rest."""
    sizes = [math.floor(fraction * n) for fraction in fractions[:-1]]
    return (*sizes, n - sum(sizes))


def checked_fractions(
    n: int, names: Sequence[str], fractions: Sequence[float]
) -> tuple[float, ...]:
    """``fractions`` checked: one per fold name, each positive, summing to 1, and every fold
    of at least ``MIN_FOLD_SIZE`` records; ``InvalidParameters`` (before any charge) otherwise."""
    if len(fractions) != len(names):
        raise InvalidParameters(
            f"fold_fractions must have {len(names)} entries ({', '.join(names)})"
        )
    checked = tuple(validate_finite_positive(f, "each fold fraction") for f in fractions)
    if abs(math.fsum(checked) - 1.0) > _FOLD_SUM_TOLERANCE:
        raise InvalidParameters("fold_fractions must sum to 1")
    sizes = fold_sizes(n, checked)
    if min(sizes) < MIN_FOLD_SIZE:
        raise InvalidParameters(
            f"every fold needs at least {MIN_FOLD_SIZE} records (fold sizes {list(sizes)})"
        )
    return checked


def prepare_arrays(
    arrays: Arrays, domain: PublicDomain
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Impute non-finite values with public constants, clip to the public box, binarise A.

    Ingest already enforces the schema; this is the mechanisms' own guarantee that every value
    lies in the box the sensitivities assume (a row-wise public map, so it costs no privacy).
    """
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    x = np.asarray(arrays.x, dtype=np.float64)
    a = np.asarray(arrays.a, dtype=np.float64)
    y = np.asarray(arrays.y, dtype=np.float64)
    if x.shape != (domain.n, domain.q) or a.shape != (domain.n,) or y.shape != (domain.n,):
        raise ValueError("arrays do not match the public domain")
    x = np.clip(np.where(np.isfinite(x), x, lower), lower, upper)
    a = np.where(a >= 0.5, 1.0, 0.0)
    y = np.clip(np.where(np.isfinite(y), y, domain.y_lower), domain.y_lower, domain.y_upper)
    return x, a, y


def random_folds(
    rng: np.random.Generator, n: int, names: Sequence[str], sizes: Sequence[int]
) -> dict[str, NDArray[np.intp]]:
    """A uniformly random permutation of range(n) cut at the public ``sizes``, in order."""
    permutation = rng.permutation(n)
    folds: dict[str, NDArray[np.intp]] = {}
    start = 0
    for name, size in zip(names, sizes, strict=True):
        folds[name] = permutation[start : start + size]
        start += size
    return folds
