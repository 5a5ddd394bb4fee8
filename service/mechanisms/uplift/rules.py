"""uplift_table's public rules and constants: the request parameters, the grid's cells, the
partition-size heuristic and the one-cell observational switch. Public inputs only; no data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.calibration import validate_epsilon
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters

MECHANISM = "uplift_table"
# 2: shrinkage "ate" (the default, proof step 5); 3: its one-cell observational release is the
# adjusted DP ATE (proof step 6)
VERSION = "3"
Progress = Callable[[float, str], None]

MIN_EPSILON = 0.01
MAX_EPSILON = 1000.0
MAX_CELLS = 20_000
MAX_BINS_PER_FEATURE = 1_000
MAX_CLUSTERS = 1_000
MAX_KMEANS_ITERATIONS = 20
COUNT_SHARE = 0.5  # epsilon / 2 for counts, epsilon / 2 for sums (Betlei et al. Alg. 1)
# proof step 5 (shrinkage "ate", at least 2 cells): the share of the table's epsilon spent on the
# two arms' centred second moments, which bound the cells' sampling variance for the factor.
SECOND_MOMENT_SHARE = 0.1


@dataclass(frozen=True)
class UpliftParams:
    """Public request parameters.

    Attributes:
        epsilon: the charged epsilon (delta = 0).
        bins: cells per covariate of the regular grid (one entry per covariate; 1 = no cut).
        min_count: c_min >= 1, the floor on noisy counts before dividing.
        low_count_threshold: cells whose noisy count in an arm is below this are flagged.
        adjustment_partition: for observational data, the analyst asserts the grid cells are a
            valid adjustment set (otherwise only RCT designs are accepted).
        partition: ``"grid"`` (public regular grid, free) or ``"kmeans"`` (DP k-means, charged:
            adum.md §4 (c)).
        clusters: number of k-means cells (``"kmeans"`` only).
        kmeans_share: share of epsilon spent on the k-means (the rest on the table).
        kmeans_iterations: T public DPLloyd iterations.
        shrinkage: ``"ate"`` (default; proof step 5): the released cell uplifts are shrunk
            toward the table's own DP ATE (the count-weighted mean of the cell uplifts,
            post-processing) by a James–Stein factor against their variance (the public
            privacy-noise variance plus a sampling variance from a charged DP second moment
            of each arm, ``SECOND_MOMENT_SHARE`` of the table's epsilon), so a table whose cell
            differences the noise can explain falls back to that ATE. One grid cell on an
            observational design: the strict DP AIPW ATE instead (proof step 6). ``"none"``:
            the raw table (Betlei et al.).
    """

    epsilon: float
    bins: tuple[int, ...] = ()
    min_count: float = 1.0
    low_count_threshold: float = 10.0
    adjustment_partition: bool = False
    partition: str = "grid"
    clusters: int = 0
    kmeans_share: float = 0.5
    kmeans_iterations: int = 5
    shrinkage: str | None = None


def adjusted_one_cell(domain: PublicDomain, shrinkage: str, cells: int) -> bool:
    """Public rule (proof step 6): with shrinkage "ate", a one-cell partition on an
    observational design releases the adjusted DP ATE instead of the table. One cell adjusts for
    no covariate, so its uplift is an unadjusted difference in means (confounded unless the
    design is randomised), whatever ``adjustment_partition`` asserts."""
    return shrinkage == "ate" and cells == 1 and domain.design != StudyDesign.RCT


def grid_cells(domain: PublicDomain, bins: tuple[int, ...]) -> int:
    if len(bins) != domain.q:
        raise InvalidParameters(f"bins must have one entry per covariate ({domain.q})")
    cells = 1
    for b in bins:
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BINS_PER_FEATURE:
            raise InvalidParameters(
                f"each bins entry must be an integer in [1, {MAX_BINS_PER_FEATURE}]"
            )
        cells *= b
        if cells > MAX_CELLS:
            raise InvalidParameters(f"the grid may have at most {MAX_CELLS} cells")
    return cells


def suggested_bins(
    domain: PublicDomain,
    epsilon: float,
    *,
    lipschitz: float | None = None,
    noise_sd: float | None = None,
    treated_share: float = 0.5,
) -> dict[str, Any]:
    """Partition-size heuristic from public quantities only (adum.md §6.3-6.4, sharpened).

    The argmin over m (a regular grid of m cells per covariate, p = m^q) of an approximate
    expected PEHE of the released table, the three terms of Betlei et al.'s bound (7) with
    second-order constants instead of the bound's loose ones:

    * bias ``L^2 / (12 m^2)``: a function whose gradient has L2 norm <= L on the box scaled to
      [0, 1]^q deviates from its cell mean with mean square <= L^2 h^2 / 12 on cells of side
      h = 1 / m (to first order);
    * sampling variance ``s^2 p / (n pi (1 - pi))``: a difference of two cell means with
      n pi / p and n (1 - pi) / p records;
    * DP noise ``sum over arms of 2 (b_s^2 + D_y^2 b_c^2) / c_arm^2`` with c_arm the arm's
      records per cell and the service's replace-one Laplace scales at a table of charge
      epsilon (``b_c = 2 / (eps / 2)`` for counts, ``b_s = W / (eps / 2)`` for the centred sums):
      the delta-method variance of a noisy mean, with |centred mean| <= D_y = W / 2.

    A categorical covariate (``domain.x_codes``) gets at most the bins that separate its codes.
    Units: ``lipschitz`` is the largest change of the uplift per unit of the box scaled to
    [0, 1]^q (so an effect with slope g on an axis of public width w has L = g w); default W,
    the full outcome range across the box. ``noise_sd`` defaults to W / 4. bench/uplift.py
    measures the rule against the tuned optimum (benchmarks.md §6.4 A5). The bound's own
    constants (``2 L^2 D_x^2``, ``4 (2 s^2 + L^2 D_x^2)``, ``(48 D_y)^2``) picked p 2x too small
    where the DP noise is negligible.
    """
    width = domain.outcome_range
    q = domain.q
    big_l = width if lipschitz is None else lipschitz
    s = width / 4.0 if noise_sd is None else noise_sd
    d_y = width / 2.0
    n = domain.n
    caps = _categorical_caps(domain)
    count_scale = 2.0 / (epsilon * COUNT_SHARE)
    sum_scale = width / (epsilon * (1.0 - COUNT_SHARE))
    dp_numerator = 2.0 * (sum_scale**2 + d_y**2 * count_scale**2)
    shares = (treated_share, 1.0 - treated_share)
    best_bins, best_value = [1] * q, math.inf
    for m in range(1, 501):
        bins = [m if cap is None else min(m, cap) for cap in caps]
        p = float(math.prod(bins))
        if p > MAX_CELLS:
            break
        value = (
            big_l**2 / (12.0 * m**2)
            + s**2 * p / (n * treated_share * (1.0 - treated_share))
            + sum(dp_numerator * (p / (n * share)) ** 2 for share in shares)
        )
        if value < best_value:
            best_bins, best_value = bins, value
    return {
        "suggested_bins": best_bins,
        "suggested_cells": math.prod(best_bins),
        "approx_pehe_at_suggestion": best_value,
        "assumptions": {"lipschitz": big_l, "noise_sd": s, "box_scaled_to_unit": True},
    }


def cell_index(
    x: NDArray[np.float64],
    lower: NDArray[np.float64],
    upper: NDArray[np.float64],
    bins: tuple[int, ...],
) -> NDArray[np.int64]:
    """Row-major cell index of each point on the regular grid (points clipped to the box)."""
    points = np.clip(np.atleast_2d(np.asarray(x, dtype=np.float64)), lower, upper)
    bins_arr = np.asarray(bins, dtype=np.int64)
    scaled = (points - lower) / (upper - lower) * bins_arr
    per_axis = np.clip(np.floor(scaled).astype(np.int64), 0, bins_arr - 1)
    index = np.zeros(points.shape[0], dtype=np.int64)
    for j in range(len(bins)):
        index = index * bins_arr[j] + per_axis[:, j]
    return index


def _categorical_caps(domain: PublicDomain) -> list[int | None]:
    """Per covariate: None (numeric) or the fewest regular bins on [min code, max code] that
    put every declared code of a categorical covariate in a cell of its own (more bins would
    only add empty cells)."""
    if domain.x_codes is None:
        return [None] * domain.q
    caps: list[int | None] = []
    for codes in domain.x_codes:
        if codes is None:
            caps.append(None)
            continue
        values = np.asarray(sorted(codes), dtype=np.float64)
        lower, upper = values[:1], values[-1:]
        cap = min(int(values[-1] - values[0]) + 1, MAX_BINS_PER_FEATURE)
        for k in range(len(values), cap + 1):
            cells = cell_index(values[:, None], lower, upper, (k,))
            if np.unique(cells).size == values.size:
                cap = k
                break
        caps.append(cap)
    return caps


def default_bins(domain: PublicDomain, epsilon: float) -> tuple[int, ...]:
    """The grid of an ``uplift_table`` request that omits ``bins``: ``suggested_bins`` at the
    charged epsilon with its public defaults (the declared treatment share of an RCT, else
    1/2). A function of the public schema and the request only."""
    validate_epsilon(epsilon, minimum=MIN_EPSILON, maximum=MAX_EPSILON)
    share = domain.treatment_probability or 0.5
    return tuple(suggested_bins(domain, epsilon, treated_share=share)["suggested_bins"])
