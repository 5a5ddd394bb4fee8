"""uplift_table's calibration and privacy map: the plan (Laplace scales of the counts and sums,
the second moments' share, the adjusted ATE's plan) and the record it charges, from public
inputs only (docs/proofs/uplift_table.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from service.mechanisms import ate_strict
from service.mechanisms.ate_strict import aggregate, split_share
from service.mechanisms.calibration import validate_epsilon, validate_finite_positive
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import LaplaceCalibration, calibrate_laplace
from service.mechanisms.records import Composition, Guarantee, MechanismRecord, NoiseEvent
from service.mechanisms.uplift.rules import (
    COUNT_SHARE,
    MAX_CLUSTERS,
    MAX_EPSILON,
    MAX_KMEANS_ITERATIONS,
    MECHANISM,
    MIN_EPSILON,
    QUANTILE_CANDIDATES,
    QUANTILE_CUTS_SHARE,
    SECOND_MOMENT_SHARE,
    VERSION,
    UpliftParams,
    adjusted_one_cell,
    checked_quantile_cuts,
    grid_cells,
    grid_shape,
)


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
    # ate kind's default at the request's (epsilon, delta) (no table is drawn; counts and sums
    # unused): the single release's plan, or in chunks (``adjusted_chunks``) one chunk's plan.
    adjusted: ate_strict.Plan | None = None
    adjusted_chunks: aggregate.AggregateParams | None = None
    # proof step 8: each DP quantile's epsilon where quantile_cuts are asked for (None: none)
    quantile_epsilon: float | None = None


def make_plan(domain: PublicDomain, params: UpliftParams) -> Plan:
    """Validate and calibrate from public inputs only."""
    epsilon = validate_epsilon(params.epsilon, minimum=MIN_EPSILON, maximum=MAX_EPSILON)
    shrinkage = params.shrinkage or "ate"
    if shrinkage not in ("ate", "none"):
        raise InvalidParameters("shrinkage must be 'ate' or 'none'")
    if params.partition == "grid" and adjusted_one_cell(
        domain, shrinkage, grid_cells(domain, grid_shape(domain, params))
    ):
        return _adjusted_plan(domain, params, epsilon)
    if params.delta is not None:
        raise InvalidParameters(
            "the epsilon-ADUM table is pure epsilon-DP (delta 0): leave delta out (it applies "
            "only where the release is the adjusted DP ATE or the ebm estimator's model)"
        )
    if domain.design != StudyDesign.RCT and not params.adjustment_partition:
        adjusted = "the declared adjustment set" if domain.adjustment_set else "every covariate"
        modifiers = (
            "cut every declared effect modifier ("
            + ", ".join(domain.names[j] for j in domain.effect_modifiers)
            + ") and no other covariate, with no table-only field"
            if domain.effect_modifiers
            else "name effect_columns"
        )
        raise InvalidParameters(
            "uplift_table is causal only for an RCT design; for observational data set "
            "adjustment_partition=true to assert the grid cells are a valid adjustment set, "
            f"or {modifiers} (the table is then the ebm_cate model over them, adjusted for "
            f"{adjusted}), or request one cell with shrinkage 'ate' (the adjusted DP ATE)"
        )
    kmeans_events: list[NoiseEvent] = []
    kmeans_counts: LaplaceCalibration | None = None
    kmeans_sums: LaplaceCalibration | None = None
    quantile_events: list[NoiseEvent] = []
    quantile_epsilon: float | None = None
    if params.partition == "grid":
        cells = grid_cells(domain, grid_shape(domain, params))
        epsilon_table = epsilon
        measured = sum(k - 1 for k in checked_quantile_cuts(domain, params.quantile_cuts) if k >= 2)
        if measured:
            # proof step 8: a public share of epsilon buys the cut points, split evenly (each
            # quantile a hair below its even share, so that they add up to at most the share)
            epsilon_cuts, epsilon_table = split_share(epsilon, QUANTILE_CUTS_SHARE)
            quantile_epsilon = math.nextafter(epsilon_cuts / measured, 0.0)
            quantile_events.append(
                NoiseEvent(
                    type="exponential_quantile",
                    module="cut_points",
                    epsilon=epsilon_cuts,
                    delta=0.0,
                    params={
                        "statistic": "cut_point_quantiles",
                        "sampler": "opendp make_private_quantile (replace-one, sized)",
                        "quantiles": measured,
                        "epsilon_each": quantile_epsilon,
                        "candidates": QUANTILE_CANDIDATES,
                    },
                )
            )
    elif params.partition == "kmeans":
        if params.bins:
            raise InvalidParameters("bins are for partition='grid' only")
        if params.cut_points is not None or params.quantile_cuts is not None:
            raise InvalidParameters("cut_points and quantile_cuts are for partition='grid' only")
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
    validate_min_count(params.min_count, domain.n)
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
        *quantile_events,
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
        composition=(
            Composition.CELLS
            if not kmeans_events and not quantile_events
            else Composition.SEQUENTIAL
        ),
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
        quantile_epsilon=quantile_epsilon,
    )


def validate_min_count(min_count: float, n: int) -> None:
    """The floor on noisy counts lies in [1, n] (public n): no cell holds more than n records,
    so a larger floor only divides every cell's sums by itself (an HTTP walkthrough's 1e300
    overflowed the quote and released a table of zeros with noise sd 0)."""
    if not (math.isfinite(min_count) and 1.0 <= min_count <= n):
        raise InvalidParameters(f"min_count must be a number in [1, n] = [1, {n}]")


def _adjusted_plan(domain: PublicDomain, params: UpliftParams, epsilon: float) -> Plan:
    """proof step 6: the record is the ate kind's default's at the request's epsilon (its
    events, folds, composition and delta; in chunks where its chunks rule applies, else the
    single release's), under this mechanism's name and version."""
    validate_min_count(params.min_count, domain.n)
    validate_finite_positive(params.low_count_threshold, "low_count_threshold")
    chunked = aggregate.default_release(domain, epsilon, params.delta)
    if chunked is not None:
        state = ate_strict.make_plan(aggregate.chunk_domain(domain, chunked.chunks), chunked.chunk)
        inner = aggregate.plan(domain, chunked)
    else:
        state = ate_strict.make_plan(
            domain, ate_strict.default_params(domain, epsilon, params.delta)
        )
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
    return Plan(
        params, 1, None, None, record, shrinks=True, adjusted=state, adjusted_chunks=chunked
    )


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


def shrinkage_fields(state: Plan) -> dict[str, Any]:
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
