"""uplift_table's public rules and constants: the request parameters, the grid's cells, the
partition-size heuristic and the one-cell observational switch. Public inputs only; no data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.calibration import validate_epsilon
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters

MECHANISM = "uplift_table"
# 2: shrinkage "ate" (the default, proof step 5); 3: its one-cell observational release is the
# adjusted DP ATE (proof step 6); 4: the ebm estimator (the ebm_cate release read at the cell
# centres of a grid over the effect columns, proof step 7); 5: from 3 cells the factor is
# Cochran's Q at each cell's own precision, the arms' variances read at an upper confidence
# level (proof step 5); 6: the one-cell observational release is the ate kind's default, in
# chunks where its chunks rule applies (subsample and aggregate, proof step 6)
VERSION = "6"
Progress = Callable[[float, str], None]

MIN_EPSILON = 0.01
MAX_EPSILON = 1000.0
MAX_CELLS = 20_000
MAX_BINS_PER_FEATURE = 1_000
MAX_CLUSTERS = 1_000
MAX_KMEANS_ITERATIONS = 20
COUNT_SHARE = 0.5  # epsilon / 2 for counts, epsilon / 2 for sums (Betlei et al. Alg. 1)
# proof step 8 (quantile_cuts): the share of the request's epsilon spent on the DP quantiles that
# cut the covariates asked for, split evenly among them; each quantile is OpenDP's exponential
# mechanism over QUANTILE_CANDIDATES equally spaced points of the covariate's declared bounds.
QUANTILE_CUTS_SHARE = 0.1
QUANTILE_CANDIDATES = 1001
MAX_QUANTILE_CELLS = 20
# proof step 5 (shrinkage "ate", at least 2 cells): the share of the table's epsilon spent on the
# two arms' centred second moments, which bound the cells' sampling variance for the factor.
SECOND_MOMENT_SHARE = 0.1


@dataclass(frozen=True)
class UpliftParams:
    """Public request parameters.

    Attributes:
        epsilon: the charged epsilon (delta = 0).
        delta: only for the one-cell observational default (proof step 6: the adjusted DP ATE,
            (epsilon, delta)-DP); None there means that ATE's public default delta. The table
            itself is pure epsilon-DP and refuses a delta.
        bins: cells per covariate of the regular grid (one entry per covariate; 1 = no cut).
        cut_points: instead of ``bins``, the grid's public cut points per covariate (one entry
            per covariate, each strictly increasing and strictly inside the covariate's
            declared bounds; an empty entry = no cut): a cell runs from one cut to the next,
            ``[c_k, c_{k+1})``, the outermost to the declared bounds. Grid only.
        quantile_cuts: per covariate, k >= 2 cells cut at k - 1 DP quantiles (levels i / k) of
            its values, charged (proof step 8: ``QUANTILE_CUTS_SHARE`` of epsilon); 0 or 1 = not
            cut this way. Numeric covariates only; with ``cut_points`` on other covariates, not
            with ``bins``. Grid only.
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
    delta: float | None = None
    bins: tuple[int, ...] = ()
    cut_points: tuple[tuple[float, ...], ...] | None = None
    quantile_cuts: tuple[int, ...] | None = None
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


def declared_edges(
    domain: PublicDomain, cut_points: tuple[tuple[float, ...], ...]
) -> list[list[float]]:
    """The cell edges of a grid given by public cut points (``UpliftParams.cut_points``): per
    covariate its declared lower bound, its cut points and its declared upper bound. Public
    inputs only.

    Raises:
        InvalidParameters: not one entry per covariate, or an entry that is not finite,
            strictly increasing and strictly inside the covariate's declared bounds, or more
            than ``MAX_BINS_PER_FEATURE`` cells on a covariate.
    """
    if len(cut_points) != domain.q:
        raise InvalidParameters(f"cut_points must have one entry per covariate ({domain.q})")
    edges = []
    for j, cuts in enumerate(cut_points):
        lower, upper = float(domain.x_lower[j]), float(domain.x_upper[j])
        name = domain.names[j]
        values = [float(c) for c in cuts]
        if len(values) > MAX_BINS_PER_FEATURE - 1:
            raise InvalidParameters(
                f"at most {MAX_BINS_PER_FEATURE - 1} cut points per covariate ('{name}')"
            )
        if not all(math.isfinite(c) and lower < c < upper for c in values):
            raise InvalidParameters(
                f"the cut points of '{name}' must lie strictly inside its declared bounds "
                f"({lower:.6g}, {upper:.6g})"
            )
        if any(b <= a for a, b in pairwise(values)):
            raise InvalidParameters(f"the cut points of '{name}' must be strictly increasing")
        edges.append([lower, *values, upper])
    return edges


def grid_shape(domain: PublicDomain, params: UpliftParams) -> tuple[int, ...]:
    """Cells per covariate of a grid request: its ``bins``, or one more than its cut points,
    or its quantile cells.

    Raises:
        InvalidParameters: ``bins`` with cut points or quantile cells, a covariate with both,
            quantile cells on a categorical covariate or out of range, or invalid cut points
            (``declared_edges``).
    """
    if params.cut_points is None and params.quantile_cuts is None:
        return params.bins
    if params.bins:
        what = "cut_points" if params.quantile_cuts is None else "quantile_cuts"
        raise InvalidParameters(f"give bins or {what}, not both")
    q = domain.q
    cuts = params.cut_points if params.cut_points is not None else ((),) * q
    edges = declared_edges(domain, cuts)
    quantiles = checked_quantile_cuts(domain, params.quantile_cuts)
    shape = []
    for j in range(q):
        if len(edges[j]) > 2 and quantiles[j] >= 2:
            raise InvalidParameters(
                f"'{domain.names[j]}' has both cut points and quantile cells: give one"
            )
        shape.append(len(edges[j]) - 1 if len(edges[j]) > 2 else max(quantiles[j], 1))
    return tuple(shape)


def checked_quantile_cuts(
    domain: PublicDomain, quantile_cuts: tuple[int, ...] | None
) -> tuple[int, ...]:
    """The request's quantile cells per covariate (0: none), validated.

    Raises:
        InvalidParameters: not one entry per covariate, an entry outside [0,
            ``MAX_QUANTILE_CELLS``], or quantile cells on a categorical covariate.
    """
    if quantile_cuts is None:
        return (0,) * domain.q
    if len(quantile_cuts) != domain.q:
        raise InvalidParameters(f"quantile_cuts must have one entry per covariate ({domain.q})")
    for j, k in enumerate(quantile_cuts):
        name = domain.names[j]
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_QUANTILE_CELLS:
            raise InvalidParameters(
                f"the quantile cells of '{name}' must be an integer in [2, {MAX_QUANTILE_CELLS}]"
            )
        codes = None if domain.x_codes is None else domain.x_codes[j]
        if k >= 2 and codes is not None:
            raise InvalidParameters(
                f"'{name}' is categorical: cut it with cut_points between its codes, not at "
                "quantiles"
            )
    return tuple(quantile_cuts)


def quantile_levels(k: int) -> list[float]:
    """The levels of the k - 1 DP quantiles that cut a covariate into k cells: i / k."""
    return [i / k for i in range(1, k)]


def quantile_candidates(lower: float, upper: float) -> NDArray[np.float64]:
    """The public grid of a cut-point quantile: ``QUANTILE_CANDIDATES`` equally spaced points of
    the covariate's declared bounds (both included)."""
    grid = np.linspace(lower, upper, QUANTILE_CANDIDATES)
    grid[0], grid[-1] = lower, upper
    return np.asarray(grid, dtype=np.float64)


def grid_edges(
    domain: PublicDomain, params: UpliftParams, measured: dict[int, list[float]] | None = None
) -> list[list[float]] | None:
    """The edges of a grid cut at points (the request's, or its released DP quantiles
    ``measured``: ``measured_edges``); None for the regular grid of ``bins``."""
    if params.cut_points is None and params.quantile_cuts is None:
        return None
    return measured_edges(domain, params, measured or {})


def measured_edges(
    domain: PublicDomain, params: UpliftParams, measured: dict[int, list[float]]
) -> list[list[float]]:
    """The grid's edges per covariate (post-processing of the DP quantiles, proof step 8): the
    declared cut points where given, the released quantiles (sorted, inside the bounds) where
    measured, else the declared bounds alone. Equal quantiles leave an empty cell, so the grid
    keeps its public shape."""
    cuts = params.cut_points if params.cut_points is not None else ((),) * domain.q
    edges = declared_edges(domain, cuts)
    for j, values in measured.items():
        lower, upper = edges[j][0], edges[j][-1]
        inner = sorted(min(max(float(v), lower), upper) for v in values)
        edges[j] = [lower, *inner, upper]
    return edges


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
        # the sum above is a mean squared error; the PEHE is its root
        "approx_pehe_at_suggestion": math.sqrt(best_value),
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


def _even_edges(lower: float, upper: float, cells: int) -> list[float]:
    """The ``cells + 1`` edges of ``cells`` equal-width cells of [lower, upper], at 12
    significant digits (15, not 15.000000000000002); the bounds exactly."""
    inner = lower + (upper - lower) * np.arange(1, cells) / cells
    return [float(lower), *(float(f"{v:.12g}") for v in inner), float(upper)]


def regular_edges(domain: PublicDomain, bins: tuple[int, ...]) -> list[list[float]]:
    """The cell edges of the regular grid ``bins`` on the declared box, per covariate."""
    return [
        _even_edges(float(lo), float(hi), b)
        for lo, hi, b in zip(domain.x_lower, domain.x_upper, bins, strict=True)
    ]


def ebm_edges(
    domain: PublicDomain, columns: list[int], cuts: list[list[float]]
) -> list[list[float]]:
    """The ebm estimator's default grid (proof step 7; post-processing of the released model):
    per effect column ``columns[k]`` the model's own DP cut points ``cuts[k]`` (a categorical
    column: the fewest regular cells that separate its declared codes), every other covariate
    uncut, so the table is the model itself. Where the product exceeds ``MAX_CELLS`` each
    numeric column keeps at most m cells (evenly spaced among its cuts), m the largest that
    fits.

    Raises:
        InvalidParameters: the categorical effect columns alone exceed ``MAX_CELLS``.
    """
    caps = _categorical_caps(domain)
    edges = [[float(lo), float(hi)] for lo, hi in zip(domain.x_lower, domain.x_upper, strict=True)]
    fixed, numeric = 1, {}
    for j, cut in zip(columns, cuts, strict=True):
        lo, hi = edges[j]
        cap = caps[j]
        if cap is not None:
            cells = max(cap, 1)
            edges[j] = _even_edges(lo, hi, cells)
            fixed *= cells
        else:
            inner = sorted({float(c) for c in cut if lo < float(c) < hi})
            numeric[j] = inner
    if fixed > MAX_CELLS:
        raise InvalidParameters(
            f"a table cutting every effect column exceeds {MAX_CELLS} cells; name fewer "
            "effect_columns or give bins"
        )
    most = max((len(c) + 1 for c in numeric.values()), default=1)
    while most > 1 and fixed * math.prod(min(len(c) + 1, most) for c in numeric.values()) > (
        MAX_CELLS
    ):
        most -= 1
    for j, inner in numeric.items():
        if len(inner) + 1 > most:
            keep = np.unique(np.round(np.linspace(0, len(inner) - 1, most - 1)).astype(int))
            inner = [inner[i] for i in keep] if most > 1 else []
        edges[j] = [edges[j][0], *inner, edges[j][1]]
    return edges


def ebm_grid(domain: PublicDomain, columns: list[int], max_bins: int) -> tuple[int, ...]:
    """The most cells the ebm estimator's default table can have (public, before the fit):
    every effect column cut, a categorical one into the fewest regular cells that separate its
    declared codes, a numeric one into at most ``max_bins`` (the effect model's DP binning's
    limit: ``ebm_edges`` uses its own bins), within ``MAX_CELLS``.

    Raises:
        InvalidParameters: no such grid fits in ``MAX_CELLS`` (name fewer effect columns or
            give ``bins``).
    """
    widest = [
        _even_edges(float(domain.x_lower[j]), float(domain.x_upper[j]), max_bins)[1:-1]
        for j in columns
    ]
    return tuple(len(edge) - 1 for edge in ebm_edges(domain, columns, widest))


def uncut_columns(bins: tuple[int, ...], columns: list[int]) -> list[int]:
    """The effect columns a grid leaves uncut (one cell): the ebm estimator refuses them, since
    its table reads the model at the cell centres (proof step 7)."""
    return [j for j in sorted(set(columns)) if bins[j] < 2]


def edge_index(x: NDArray[np.float64], edges: list[list[float]]) -> NDArray[np.int64]:
    """Row-major cell index of each point on a grid given by its cell edges per covariate
    (points outside the box fall in the outermost cells)."""
    points = np.atleast_2d(np.asarray(x, dtype=np.float64))
    index = np.zeros(points.shape[0], dtype=np.int64)
    for j, edge in enumerate(edges):
        inner = np.asarray(edge[1:-1], dtype=np.float64)
        per_axis = np.searchsorted(inner, points[:, j], side="right")
        index = index * (len(edge) - 1) + per_axis
    return index


def cell_centres(domain: PublicDomain, edges: list[list[float]]) -> NDArray[np.float64]:
    """The public point of every cell of a grid given by its edges, row-major like
    ``edge_index`` (proof step 7): per covariate the centre of its cell, or, for a categorical
    covariate, the declared code in that cell where there is exactly one."""
    axes = []
    for j, edge in enumerate(edges):
        bounds = np.asarray(edge, dtype=np.float64)
        centres = (bounds[:-1] + bounds[1:]) / 2.0
        codes = None if domain.x_codes is None else domain.x_codes[j]
        if codes is not None:
            values = np.asarray(sorted(codes), dtype=np.float64)
            cells = np.searchsorted(bounds[1:-1], values, side="right")
            for k in range(centres.size):
                inside = values[cells == k]
                if inside.size == 1:
                    centres[k] = inside[0]
        axes.append(centres)
    sizes = [a.size for a in axes]
    cells_total = math.prod(sizes)
    out = np.empty((cells_total, len(axes)), dtype=np.float64)
    rest = np.arange(cells_total, dtype=np.int64)
    for j in range(len(axes) - 1, -1, -1):  # row-major: the last covariate varies fastest
        out[:, j] = axes[j][rest % sizes[j]]
        rest //= sizes[j]
    return out
