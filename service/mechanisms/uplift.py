"""epsilon-ADUM (Betlei et al. 2021): a DP uplift table on a public regular grid.

What it releases:
    for every cell k of a public regular grid over the public covariate box and every arm t,
    a noisy count ``C[k, t]`` and a noisy centred outcome sum ``S[k, t]`` (Laplace, on the
    public lattice via OpenDP), and their post-processing: the guarded cell means
    ``y[k, t] = clip(m_y + S / max(C, c_min), y_lo, y_hi)``, the uplift ``u[k] = y[k, 1] -
    y[k, 0]``, a low-count flag per cell (noisy count below a public threshold) and the
    delta-method noise sd of each uplift. Predictions are lookups ``u[cell(x)]`` (free).

Neighbouring relation:
    replace-one on (X, A, Y), n public (adum.md §3.2).

Claim:
    ``run`` is (epsilon, 0)-DP. The 2p counts (one per cell and arm) have replace-one L1
    sensitivity 2 (a replaced record leaves one group and enters one, or stays); the 2p
    centred sums of ``y - m_y`` with ``|y - m_y| <= W / 2`` have L1 sensitivity ``W`` (``W =
    y_hi - y_lo``). Each vector gets the Laplace mechanism at epsilon / 2 with those
    sensitivities (scales 4 / epsilon and 2 W / epsilon = 4 D_y / epsilon, D_y = W / 2), plus
    the lattice inflation; sequential composition gives epsilon. The grid is public (declared
    box and analyst-chosen bins), so the partition costs nothing. Shrinkage ``"ate"`` (the
    default, >= 2 cells) first spends 10 % of the table's epsilon on the arms' centred second
    moments (Laplace, L1 sensitivity W^2 / 2); the anchor (the count-weighted mean of the cell
    uplifts) and the James–Stein factor are post-processing. Exception (proof step 6): with
    shrinkage ``"ate"``, a one-cell grid on an observational design adjusts for no covariate
    (its uplift is a confounded difference in means), so the release is the strict DP AIPW ATE
    at its public defaults instead (``ate_strict.default_params``: the ``ate`` kind's default
    release), (epsilon, delta)-DP at the request's epsilon and that ATE's public default delta;
    the record is that ATE's. Proof: docs/proofs/uplift_table.md.

Causal reading: uplift = CATE only under an RCT, or when the cells form a valid adjustment set
(declared by the analyst with ``adjustment_partition=True``; adum.md §1). The one-cell
observational default (step 6) is the ATE under unconfoundedness given all covariates (the
``ate`` kind's reading) and needs no assertion.

References:
    Betlei, Gregoir, Rahier, Bissuel, Diemert, Amini (2021). Differentially private individual
    treatment effect estimation from aggregated data. HAL hal-03339723.
    McSherry (2009). Privacy integrated queries. SIGMOD (parallel composition).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.mechanisms import ate_strict, versus_ate
from service.mechanisms.anchor import james_stein_factor
from service.mechanisms.ate_strict import split_share
from service.mechanisms.calibration import validate_epsilon, validate_finite_positive
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters, ReleaseFailed
from service.mechanisms.noise import LaplaceCalibration, NoiseSampler, calibrate_laplace
from service.mechanisms.records import Composition, Guarantee, MechanismRecord, NoiseEvent

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


@dataclass(frozen=True)
class Plan:
    params: UpliftParams
    cells: int
    counts: LaplaceCalibration | None  # None: the adjusted one-cell release (proof step 6)
    sums: LaplaceCalibration | None
    record: MechanismRecord
    kmeans_counts: LaplaceCalibration | None = None  # per iteration
    kmeans_sums: LaplaceCalibration | None = None  # per iteration
    shrinks: bool = False  # shrinkage "ate" (proof step 5)
    second_moments: LaplaceCalibration | None = None  # shrinkage "ate" with >= 2 cells
    # proof step 6: shrinkage "ate", one cell, observational design: the whole release is the
    # strict DP AIPW ATE at its public defaults (no table is drawn; counts and sums unused).
    adjusted: ate_strict.Plan | None = None


def adjusted_one_cell(domain: PublicDomain, shrinkage: str, cells: int) -> bool:
    """Public rule (proof step 6): with shrinkage "ate", a one-cell partition on an
    observational design releases the adjusted DP ATE instead of the table. One cell adjusts for
    no covariate, so its uplift is an unadjusted difference in means (confounded unless the
    design is randomised), whatever ``adjustment_partition`` asserts."""
    return shrinkage == "ate" and cells == 1 and domain.design != StudyDesign.RCT


def make_plan(domain: PublicDomain, params: UpliftParams) -> Plan:
    """Validate and calibrate from public inputs only."""
    epsilon = validate_epsilon(params.epsilon, minimum=MIN_EPSILON, maximum=MAX_EPSILON)
    shrinkage = params.shrinkage or "ate"
    if shrinkage not in ("ate", "none"):
        raise InvalidParameters("shrinkage must be 'ate' or 'none'")
    if params.partition == "grid" and adjusted_one_cell(
        domain, shrinkage, _grid_cells(domain, params.bins)
    ):
        return _adjusted_plan(domain, params, epsilon)
    if domain.design != StudyDesign.RCT and not params.adjustment_partition:
        raise InvalidParameters(
            "uplift_table is causal only for an RCT design; for observational data set "
            "adjustment_partition=true to assert the grid cells are a valid adjustment set "
            "(or request one cell with shrinkage 'ate': the adjusted DP ATE)"
        )
    kmeans_events: list[NoiseEvent] = []
    kmeans_counts: LaplaceCalibration | None = None
    kmeans_sums: LaplaceCalibration | None = None
    if params.partition == "grid":
        cells = _grid_cells(domain, params.bins)
        epsilon_table = epsilon
    elif params.partition == "kmeans":
        if params.bins:
            raise InvalidParameters("bins are for partition='grid' only")
        cells = params.clusters
        if isinstance(cells, bool) or not isinstance(cells, int) or not 1 <= cells <= MAX_CLUSTERS:
            raise InvalidParameters(f"clusters must be an integer in [1, {MAX_CLUSTERS}]")
        iterations = params.kmeans_iterations
        if not isinstance(iterations, int) or not 1 <= iterations <= MAX_KMEANS_ITERATIONS:
            raise InvalidParameters(
                f"kmeans_iterations must be an integer in [1, {MAX_KMEANS_ITERATIONS}]"
            )
        share = float(params.kmeans_share)
        if not 0.0 < share < 1.0:
            raise InvalidParameters("kmeans_share must be in (0, 1)")
        # proof step 4: DPLloyd, T iterations, each eps_km / (2T) on counts and on sums.
        epsilon_kmeans = epsilon * share
        epsilon_table = epsilon - epsilon_kmeans
        per_statistic = epsilon_kmeans / (2 * iterations)
        kmeans_counts = calibrate_laplace(per_statistic, 2.0, dim=cells)
        sum_l1 = sum_sensitivity(2.0 * domain.q, domain.n)
        kmeans_sums = calibrate_laplace(per_statistic, sum_l1, dim=cells * domain.q)
        for t in range(iterations):
            kmeans_events.append(_event(f"kmeans_{t}_counts", kmeans_counts, 2.0, module="kmeans"))
            kmeans_events.append(
                _event(f"kmeans_{t}_sums", kmeans_sums, 2.0 * domain.q, module="kmeans")
            )
    else:
        raise InvalidParameters("partition must be 'grid' or 'kmeans'")
    if not params.min_count >= 1.0 or not math.isfinite(params.min_count):
        raise InvalidParameters("min_count must be a finite number >= 1")
    validate_finite_positive(params.low_count_threshold, "low_count_threshold")
    width = domain.outcome_range
    validate_finite_positive(width, "outcome range")
    # proof step 5: with at least 2 cells, shrinkage "ate" spends SECOND_MOMENT_SHARE of the
    # table's epsilon on the arms' centred second moments (L1 sensitivity W^2 / 2); exact split.
    second_moments: LaplaceCalibration | None = None
    second_events: tuple[NoiseEvent, ...] = ()
    if shrinkage == "ate" and cells >= 2:
        epsilon_second, epsilon_table = split_share(epsilon_table, SECOND_MOMENT_SHARE)
        second_moments = calibrate_laplace(
            epsilon_second, second_moment_sensitivity(width, domain.n), dim=2
        )
        second_events = (_event("centred_second_moments", second_moments, width * width / 2.0),)
    # proof steps 1-2: replace-one L1 sensitivities 2 (counts) and W (centred sums), eps / 2 each.
    epsilon_counts = epsilon_table * COUNT_SHARE
    epsilon_sums = epsilon_table - epsilon_counts
    counts = calibrate_laplace(epsilon_counts, 2.0, dim=2 * cells)
    sums = calibrate_laplace(epsilon_sums, sum_sensitivity(width, domain.n), dim=2 * cells)
    events = (
        *kmeans_events,
        *second_events,
        _event("counts", counts, 2.0),
        _event("centred_sums", sums, width),
    )
    record = MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=Guarantee.STRICT,
        n=domain.n,
        fold_sizes={"all": domain.n},
        composition=Composition.CELLS if not kmeans_events else Composition.SEQUENTIAL,
        events=events,
        epsilon=math.fsum(e.epsilon for e in events),
        delta=0.0,
    )
    return Plan(
        params,
        cells,
        counts,
        sums,
        record,
        kmeans_counts,
        kmeans_sums,
        shrinks=shrinkage == "ate",
        second_moments=second_moments,
    )


def _adjusted_plan(domain: PublicDomain, params: UpliftParams, epsilon: float) -> Plan:
    """proof step 6: the record is the strict ATE default's at the request's epsilon (its
    events, folds, composition and delta), under this mechanism's name and version."""
    if not params.min_count >= 1.0 or not math.isfinite(params.min_count):
        raise InvalidParameters("min_count must be a finite number >= 1")
    validate_finite_positive(params.low_count_threshold, "low_count_threshold")
    state = ate_strict.make_plan(domain, ate_strict.default_params(domain, epsilon))
    inner = state.record
    record = MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=Guarantee.STRICT,
        n=domain.n,
        fold_sizes=dict(inner.fold_sizes),
        composition=inner.composition,
        events=inner.events,
        epsilon=inner.epsilon,
        delta=inner.delta,
    )
    return Plan(params, 1, None, None, record, shrinks=True, adjusted=state)


def _grid_cells(domain: PublicDomain, bins: tuple[int, ...]) -> int:
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


def _event(
    statistic: str, calibration: LaplaceCalibration, sensitivity: float, *, module: str = "all"
) -> NoiseEvent:
    return NoiseEvent(
        type="laplace",
        module=module,
        epsilon=calibration.epsilon,
        delta=0.0,
        params={
            "statistic": statistic,
            "sampler": "opendp discrete laplace on 2^k lattice",
            "sensitivity_l1_nominal": sensitivity,
            "sensitivity_l1": calibration.sensitivity_l1,
            "sensitivity_l1_effective": calibration.sensitivity_l1_effective,
            "dim": calibration.dim,
            "lattice_exponent": calibration.lattice_exponent,
            "scale": calibration.scale,
        },
    )


def plan(domain: PublicDomain, params: UpliftParams) -> MechanismRecord:
    """The record (cost) of a request; ``InvalidParameters`` before any charge."""
    return make_plan(domain, params).record


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


def quote(domain: PublicDomain, params: UpliftParams) -> dict[str, Any]:
    """Public preview: noise scales, the expected noise sd of a cell uplift, the p heuristic."""
    state = make_plan(domain, params)
    p_treat = domain.treatment_probability or 0.5
    if state.adjusted is not None:
        return _adjusted_quote(domain, state, p_treat)
    width = domain.outcome_range
    if state.counts is None or state.sums is None:  # pragma: no cover - only when adjusted
        raise ValueError("no table calibration")
    b_c, b_s = state.counts.scale, state.sums.scale
    per_cell = domain.n / state.cells
    arms = {"treated": per_cell * p_treat, "control": per_cell * (1.0 - p_treat)}
    # delta method (adum.md §5) with |centred mean| <= W / 2 and outcome sd <= W / 2.
    variance = 0.0
    for size in arms.values():
        size = max(size, params.min_count)
        variance += (width / 2) ** 2 / size + (2 * b_s**2 + (width / 2) ** 2 * 2 * b_c**2) / size**2
    return {
        "mode": "strict",
        "guarantee": "strict",
        "epsilon": state.record.epsilon,
        "delta": 0.0,
        "cells": state.cells,
        "partition": params.partition,
        "bins": list(params.bins),
        "count_noise_scale": b_c,
        "sum_noise_scale": b_s,
        "expected_records_per_cell": per_cell,
        "approx_uplift_sd_per_cell": math.sqrt(variance),
        **_shrinkage_fields(state),
        **suggested_bins(domain, state.record.epsilon, treated_share=p_treat),
    }


def _adjusted_quote(domain: PublicDomain, state: Plan, p_treat: float) -> dict[str, Any]:
    """proof step 6: the one-cell observational default quotes the strict ATE it releases; the
    cell's noise sd is that ATE's (public) noise sd ``s_theta``."""
    if state.adjusted is None:  # pragma: no cover - guarded by the caller
        raise ValueError("not an adjusted plan")
    params = state.params
    inner = ate_strict.quote(domain, state.adjusted.params)
    return {
        "mode": "strict",
        "guarantee": "strict",
        "epsilon": state.record.epsilon,
        "delta": state.record.delta,
        "cells": 1,
        "partition": params.partition,
        "bins": list(params.bins),
        "count_noise_scale": None,
        "sum_noise_scale": None,
        "expected_records_per_cell": float(domain.n),
        "approx_uplift_sd_per_cell": float(inner["s_theta"]),
        "adjusted_ate": inner,
        **_shrinkage_fields(state),
        **suggested_bins(domain, state.record.epsilon, treated_share=p_treat),
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


def aggregates(
    x: NDArray[np.float64],
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    domain: PublicDomain,
    bins: tuple[int, ...],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Exact counts and centred sums per (cell, arm), flattened as ``2 * cell + arm``.

    NEVER released: only their noisy versions are. Replacing one row changes the count vector
    by at most 2 in L1 and the centred-sum vector by at most W in L1 (proof step 1).
    """
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    return aggregates_by_cell(cell_index(x, lower, upper, bins), a, y, domain, int(np.prod(bins)))


def aggregates_by_cell(
    cell: NDArray[np.int64],
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    domain: PublicDomain,
    cells: int,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Exact counts and centred sums per (cell, arm) for any public cell assignment rule."""
    group = 2 * cell + np.where(a >= 0.5, 1, 0)
    midpoint = (domain.y_lower + domain.y_upper) / 2.0
    centred = np.clip(y, domain.y_lower, domain.y_upper) - midpoint
    counts = np.bincount(group, minlength=2 * cells).astype(np.float64)
    # Correctly rounded sums per group (math.fsum): a replaced row then moves the vector by at
    # most W (1 + n 2^-53) in L1, covered by ``sum_sensitivity`` (proof step 1).
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(2 * cells + 1))
    ordered = centred[order]
    sums = np.array(
        [math.fsum(ordered[bounds[g] : bounds[g + 1]].tolist()) for g in range(2 * cells)],
        dtype=np.float64,
    )
    return counts, sums


def sum_sensitivity(width: float, n: int) -> float:
    """Replace-one L1 sensitivity of the centred sums, with the float slack of fsum.

    Nominal ``W``; each correctly rounded group sum is off by at most ``2^-53 |S| <= 2^-53 n W /
    2``, and two groups change, so ``W (1 + (n + 8) 2^-50)`` covers the rounding.
    """
    return math.nextafter(width * (1.0 + (n + 8) * 2.0**-50), math.inf)


def second_moment_sensitivity(width: float, n: int) -> float:
    """Replace-one L1 sensitivity of the arms' centred second moments ``sum (y - m_y)^2`` (proof
    step 5): each term is in [0, W^2 / 4] and a replaced record changes at most two arms' sums,
    so ``W^2 / 2``, with fsum's float slack as in ``sum_sensitivity``."""
    nominal = width * width / 2.0
    return math.nextafter(nominal * (1.0 + (n + 8) * 2.0**-50), math.inf)


def second_moment_sums(
    a: NDArray[np.float64], y: NDArray[np.float64], domain: PublicDomain
) -> NDArray[np.float64]:
    """Exact ``sum (y - m_y)^2`` of the control and the treated arm (NEVER released)."""
    midpoint = (domain.y_lower + domain.y_upper) / 2.0
    centred = np.clip(y, domain.y_lower, domain.y_upper) - midpoint
    treated = a >= 0.5
    return np.array(
        [
            math.fsum((centred[~treated] ** 2).tolist()),
            math.fsum((centred[treated] ** 2).tolist()),
        ]
    )


def shrink_to_anchor(
    released: dict[str, Any],
    noisy_counts: NDArray[np.float64],
    noisy_sums: NDArray[np.float64],
    noisy_second: NDArray[np.float64] | None,
    domain: PublicDomain,
    params: UpliftParams,
    *,
    count_scale: float,
    sum_scale: float,
) -> dict[str, Any]:
    """proof step 5 (post-processing of the DP counts, sums and second moments): the anchor
    ``a = sum_k w_k u_k`` with ``w_k`` the cells' shares of the noisy counts, and the released
    uplifts ``a + lambda (u_k - a)``, lambda the positive-part James–Stein factor of
    ``anchor.james_stein_factor`` on the count-weighted deviations ``sqrt(w_k) (u_k - a)``
    against their covariance under no heterogeneity: ``W^1/2 (I - 1 w') V (I - w 1') W^1/2``,
    ``V = diag(v_k)``, ``v_k`` the cell's privacy-noise variance (delta method, as
    ``uplift_noise_sd``) plus its sampling variance ``s_1^2 / c_k1 + s_0^2 / c_k0`` with ``s_t^2``
    the arm's variance from the DP second moment (an upper bound of the within-cell variance).
    One cell: the release is its own uplift, the anchor (lambda = 0)."""
    width = domain.outcome_range
    midpoint = (domain.y_lower + domain.y_upper) / 2.0
    uplift = np.asarray(released["uplift"], dtype=np.float64)
    counts = noisy_counts.reshape(-1, 2)
    floor = np.maximum(counts, params.min_count)
    size = np.maximum(counts, 0.0).sum(axis=1)
    total = float(size.sum())
    weights = size / total if total > 0.0 else np.full(uplift.size, 1.0 / uplift.size)
    anchor = float(np.clip(np.dot(weights, uplift), -width, width))
    factor = 0.0
    variances = [0.0, 0.0]
    if uplift.size >= 2 and noisy_second is not None:
        sums = noisy_sums.reshape(-1, 2)
        arm_counts = np.maximum(counts.sum(axis=0), params.min_count)
        arm_means = np.clip(sums.sum(axis=0) / arm_counts, -width / 2.0, width / 2.0)
        variances = [
            float(np.clip(noisy_second[t] / arm_counts[t] - arm_means[t] ** 2, 0.0, width**2 / 4))
            for t in (0, 1)
        ]
        means = np.column_stack(
            [np.asarray(released["mean_control"]), np.asarray(released["mean_treated"])]
        )
        centred = means - midpoint
        privacy = (2 * sum_scale**2 + centred**2 * 2 * count_scale**2) / floor**2
        sampling = np.column_stack([variances[0] / floor[:, 0], variances[1] / floor[:, 1]])
        v = (privacy + sampling).sum(axis=1)
        trace, trace_squared = _deviation_traces(weights, v)
        prior = width / versus_ate.DEFAULT_HETEROGENEITY_RANGE_RATIO
        factor = james_stein_factor(
            np.sqrt(weights) * (uplift - anchor), trace, trace_squared, prior
        )
    shrunk = np.clip(anchor + factor * (uplift - anchor), -width, width)
    return {
        **released,
        "uplift": shrunk.tolist(),
        "uplift_unshrunk": uplift.tolist(),
        "ate_anchor": anchor,
        "shrinkage_factor": factor,
        "arm_variance": {"control": variances[0], "treated": variances[1]},
    }


def _deviation_traces(weights: NDArray[np.float64], v: NDArray[np.float64]) -> tuple[float, float]:
    """``tr M`` and ``tr M^2`` of ``M = W^1/2 (I - 1 w') V (I - w 1') W^1/2`` in O(p):
    ``M_ij = sqrt(w_i w_j) (v_i [i = j] + c - a_i - a_j)`` with ``a = w v``, ``c = sum w a``."""
    a = weights * v
    c = float(np.dot(weights, a))
    total = float(weights.sum())
    b1 = float(np.dot(weights, a))
    b2 = float(np.dot(weights, a * a))
    diagonal_e = c - 2.0 * a
    trace = float(np.dot(weights, v + diagonal_e))
    off = c * c * total * total + 2.0 * total * b2 - 4.0 * c * total * b1 + 2.0 * b1 * b1
    trace_squared = float(np.dot(weights * weights, v * v + 2.0 * v * diagonal_e)) + off
    return trace, max(trace_squared, 0.0)


def unit_scale(x: NDArray[np.float64], domain: PublicDomain) -> NDArray[np.float64]:
    """Points mapped to [-1, 1]^q by the public box (clipped)."""
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    u = 2.0 * (np.atleast_2d(np.asarray(x, dtype=np.float64)) - lower) / (upper - lower) - 1.0
    return np.asarray(np.clip(u, -1.0, 1.0), dtype=np.float64)


def nearest(u: NDArray[np.float64], centroids: NDArray[np.float64]) -> NDArray[np.int64]:
    """Index of the nearest centroid (ties: the lowest index); a public rule."""
    distances = ((u[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
    return np.asarray(np.argmin(distances, axis=1), dtype=np.int64)


def cluster_statistics(
    u: NDArray[np.float64], assignment: NDArray[np.int64], clusters: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Exact counts and correctly rounded coordinate sums per cluster (never released).

    Replacing one row moves the counts by <= 2 and the sums by <= 2q (1 + (n + 8) 2^-50) in L1.
    """
    q = u.shape[1]
    counts = np.bincount(assignment, minlength=clusters).astype(np.float64)
    order = np.argsort(assignment, kind="stable")
    bounds = np.searchsorted(assignment[order], np.arange(clusters + 1))
    ordered = u[order]
    sums = np.array(
        [
            [math.fsum(ordered[bounds[k] : bounds[k + 1], j].tolist()) for j in range(q)]
            for k in range(clusters)
        ],
        dtype=np.float64,
    )
    return counts, sums


def dp_kmeans(
    u: NDArray[np.float64],
    state: Plan,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
) -> NDArray[np.float64]:
    """DPLloyd under replace-one (adum.md §4 (c)); returns centroids in [-1, 1]^q.

    proof step 4: data-independent initial centroids; each iteration releases noisy counts
    (L1 sensitivity 2) and noisy coordinate sums (L1 sensitivity 2q, plus float slack) at
    eps_km / (2T) each; the new centroids are post-processing.
    """
    counts_cal, sums_cal = state.kmeans_counts, state.kmeans_sums
    if counts_cal is None or sums_cal is None:
        raise ValueError("not a k-means plan")
    clusters, q = state.cells, u.shape[1]
    centroids = rng.uniform(-1.0, 1.0, size=(clusters, q))
    for _ in range(state.params.kmeans_iterations):
        counts, sums = cluster_statistics(u, nearest(u, centroids), clusters)
        noisy_counts = noise.laplace(counts, scale=counts_cal.scale, sensitivity_l1=2.0)
        noisy_sums = noise.laplace(
            sums.ravel(), scale=sums_cal.scale, sensitivity_l1=sums_cal.sensitivity_l1
        ).reshape(clusters, q)
        centroids = np.clip(noisy_sums / np.maximum(noisy_counts, 1.0)[:, None], -1.0, 1.0)
    return np.asarray(centroids, dtype=np.float64)


def table(
    noisy_counts: NDArray[np.float64],
    noisy_sums: NDArray[np.float64],
    domain: PublicDomain,
    params: UpliftParams,
    *,
    count_scale: float,
    sum_scale: float,
) -> dict[str, Any]:
    """Post-processing of the DP counts and sums into the guarded uplift table."""
    midpoint = (domain.y_lower + domain.y_upper) / 2.0
    counts = noisy_counts.reshape(-1, 2)
    sums = noisy_sums.reshape(-1, 2)
    floor = np.maximum(counts, params.min_count)
    means = np.clip(midpoint + sums / floor, domain.y_lower, domain.y_upper)
    uplift = means[:, 1] - means[:, 0]
    centred = means - midpoint
    # delta-method noise variance of each arm's mean (adum.md §5), DP plug-ins only.
    noise_var = (2 * sum_scale**2 + centred**2 * 2 * count_scale**2) / floor**2
    return {
        "counts_control": counts[:, 0].tolist(),
        "counts_treated": counts[:, 1].tolist(),
        "mean_control": means[:, 0].tolist(),
        "mean_treated": means[:, 1].tolist(),
        "uplift": uplift.tolist(),
        "uplift_noise_sd": np.sqrt(noise_var.sum(axis=1)).tolist(),
        "low_count": (np.min(counts, axis=1) < params.low_count_threshold).tolist(),
    }


def run(
    arrays: Arrays,
    domain: PublicDomain,
    params: UpliftParams,
    *,
    noise: NoiseSampler,
    progress: Progress,
    rng: np.random.Generator | None = None,
) -> dict[str, Any]:
    """Release the DP table after the charge; ``ReleaseFailed`` on any data-time failure.

    ``rng`` (``secure_rng()`` in production) draws the k-means initial centroids.
    """
    state = make_plan(domain, params)
    try:
        return _run(arrays, domain, state, noise=noise, progress=progress, rng=rng)
    except Exception:
        raise ReleaseFailed() from None


def _run(
    arrays: Arrays,
    domain: PublicDomain,
    state: Plan,
    *,
    noise: NoiseSampler,
    progress: Progress,
    rng: np.random.Generator | None,
) -> dict[str, Any]:
    params = state.params
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    if state.adjusted is not None:
        if rng is None:
            raise ValueError("the adjusted ATE needs a generator")
        return _run_adjusted(arrays, domain, state, noise=noise, progress=progress, rng=rng)
    if state.counts is None or state.sums is None:  # pragma: no cover - only when adjusted
        raise ValueError("no table calibration")
    x = np.asarray(arrays.x, dtype=np.float64)
    a = np.asarray(arrays.a, dtype=np.float64)
    y = np.asarray(arrays.y, dtype=np.float64)
    if x.shape != (domain.n, domain.q) or a.shape != (domain.n,) or y.shape != (domain.n,):
        raise ValueError("arrays do not match the public domain")
    x = np.clip(np.where(np.isfinite(x), x, lower), lower, upper)
    y = np.where(np.isfinite(y), y, domain.y_lower)
    partition: dict[str, Any]
    if params.partition == "kmeans":
        if rng is None:
            raise ValueError("k-means needs a generator")
        u = unit_scale(x, domain)
        centroids = dp_kmeans(u, state, rng=rng, noise=noise)
        progress(0.5, "kmeans")
        counts, sums = aggregates_by_cell(nearest(u, centroids), a, y, domain, state.cells)
        del u
        partition = {
            "type": "kmeans",
            "centroids_unit": centroids.tolist(),
            "lower": [float(v) for v in lower],
            "upper": [float(v) for v in upper],
            "scaling": "u = 2 (x - lower) / (upper - lower) - 1, clipped to [-1, 1]",
        }
    else:
        counts, sums = aggregates(x, a, y, domain, params.bins)
        partition = {
            "type": "grid",
            "bins": list(params.bins),
            "lower": [float(v) for v in lower],
            "upper": [float(v) for v in upper],
            "order": "row-major over covariates",
        }
    noisy_second: NDArray[np.float64] | None = None
    if state.second_moments is not None:
        # proof step 5: the arms' centred second moments, Laplace at their public scale.
        noisy_second = noise.laplace(
            second_moment_sums(a, y, domain),
            scale=state.second_moments.scale,
            sensitivity_l1=state.second_moments.sensitivity_l1,
        )
    del x, a, y
    # proof step 3: two Laplace vectors with public scales.
    noisy_counts = noise.laplace(counts, scale=state.counts.scale, sensitivity_l1=2.0)
    noisy_sums = noise.laplace(
        sums, scale=state.sums.scale, sensitivity_l1=state.sums.sensitivity_l1
    )
    del counts, sums
    progress(0.9, "noise")
    out = table(
        noisy_counts,
        noisy_sums,
        domain,
        params,
        count_scale=state.counts.scale,
        sum_scale=state.sums.scale,
    )
    if state.shrinks:
        out = shrink_to_anchor(
            out,
            noisy_counts,
            noisy_sums,
            noisy_second,
            domain,
            params,
            count_scale=state.counts.scale,
            sum_scale=state.sums.scale,
        )
    progress(1.0, "done")
    return {
        "mode": "strict",
        "guarantee": "strict",
        "epsilon": state.record.epsilon,
        "delta": 0.0,
        "grid" if params.partition == "grid" else "partition": partition,
        "cells": state.cells,
        "count_noise_scale": state.counts.scale,
        "sum_noise_scale": state.sums.scale,
        "min_count": params.min_count,
        "low_count_threshold": params.low_count_threshold,
        **_shrinkage_fields(state),
        **out,
    }


def _run_adjusted(
    arrays: Arrays,
    domain: PublicDomain,
    state: Plan,
    *,
    noise: NoiseSampler,
    progress: Progress,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """proof step 6: the strict DP AIPW ATE at its public defaults (the whole charge); the one
    cell's uplift is that ATE. No table noise is drawn, so no counts or cell means exist."""
    if state.adjusted is None:  # pragma: no cover - guarded by the caller
        raise ValueError("not an adjusted plan")
    ate = ate_strict.run(
        arrays, domain, state.adjusted.params, rng=rng, noise=noise, progress=progress
    )
    estimate = float(ate["estimate"])
    width = domain.outcome_range
    uplift = float(np.clip(estimate, -width, width))
    return {
        "mode": "strict",
        "guarantee": "strict",
        "epsilon": state.record.epsilon,
        "delta": state.record.delta,
        "grid": {
            "type": "grid",
            "bins": [1] * domain.q,
            "lower": [float(v) for v in domain.x_lower],
            "upper": [float(v) for v in domain.x_upper],
            "order": "row-major over covariates",
        },
        "cells": 1,
        "count_noise_scale": None,
        "sum_noise_scale": None,
        "min_count": state.params.min_count,
        "low_count_threshold": state.params.low_count_threshold,
        **_shrinkage_fields(state),
        "uplift": [uplift],
        "uplift_unshrunk": None,
        "uplift_noise_sd": [float(ate["s_theta"])],
        "low_count": [False],
        "ate_anchor": uplift,
        "shrinkage_factor": 0.0,
        "adjusted_ate": ate,
    }


def _shrinkage_fields(state: Plan) -> dict[str, Any]:
    """Public fields of the shrinkage rule (proof step 5): the anchor costs no budget (it is
    post-processing of the table); the second moments take their share of the table's. The
    one-cell observational default (proof step 6) spends everything on the adjusted ATE."""
    if state.adjusted is not None:
        return {
            "shrinkage": "ate",
            "anchor": "adjusted_ate",
            "anchor_share": 1.0,
            "second_moment_share": 0.0,
        }
    return {
        "shrinkage": "ate" if state.shrinks else "none",
        "anchor": "table" if state.shrinks else None,
        "anchor_share": 0.0,
        "second_moment_share": SECOND_MOMENT_SHARE if state.second_moments is not None else 0.0,
    }


def predict(result: dict[str, Any], points: NDArray[np.float64]) -> NDArray[np.float64]:
    """Lookup ``u[cell(x)]`` in a stored table (post-processing)."""
    if "partition" in result:  # DP k-means cells: the nearest DP centroid
        part = result["partition"]
        lower = np.asarray(part["lower"], dtype=np.float64)
        upper = np.asarray(part["upper"], dtype=np.float64)
        u = np.clip(2.0 * (np.atleast_2d(points) - lower) / (upper - lower) - 1.0, -1.0, 1.0)
        cell = nearest(u, np.asarray(part["centroids_unit"], dtype=np.float64))
        return np.asarray(result["uplift"], dtype=np.float64)[cell]
    grid = result["grid"]
    index = cell_index(
        points,
        np.asarray(grid["lower"], dtype=np.float64),
        np.asarray(grid["upper"], dtype=np.float64),
        tuple(int(b) for b in grid["bins"]),
    )
    return np.asarray(result["uplift"], dtype=np.float64)[index]
