"""Running uplift_table after the charge: cells (grid or DP k-means), the noisy table, the
shrinkage toward its own DP ATE (or the adjusted ATE of the one-cell observational default),
and predictions at public points (lookups, post-processing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri

from service.mechanisms import ate_strict, versus_ate
from service.mechanisms.anchor import heterogeneity_factor, james_stein_factor
from service.mechanisms.ate_strict import aggregate
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.errors import ReleaseFailed
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.uplift.calibration import (
    Plan,
    make_plan,
    shrinkage_fields,
)
from service.mechanisms.uplift.rules import (
    Progress,
    UpliftParams,
    cell_centres,
    cell_index,
    checked_quantile_cuts,
    edge_index,
    grid_edges,
    grid_shape,
    quantile_candidates,
    quantile_levels,
)

# The arms' variances in the factor are read at this upper confidence level of their noisy
# second moments (proof step 5, item 3).
SECOND_MOMENT_UPPER_LEVEL = 0.95


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


def grid_aggregates(
    x: NDArray[np.float64],
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    domain: PublicDomain,
    params: UpliftParams,
    edges: list[list[float]] | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Exact counts and centred sums per (cell, arm) on the request's grid: at ``edges`` (the
    grid with its released DP quantile cuts, proof step 8), else at its cut points
    (``grid_edges``), else its regular ``bins``. NEVER released (proof step 1: any partition
    fixed before the table, public or DP, has the same sensitivities)."""
    if edges is None:
        edges = grid_edges(domain, params)
    if edges is None:
        return aggregates(x, a, y, domain, params.bins)
    cells = math.prod(len(e) - 1 for e in edges)
    return aggregates_by_cell(edge_index(x, edges), a, y, domain, cells)


def measure_cut_points(
    x: NDArray[np.float64],
    domain: PublicDomain,
    params: UpliftParams,
    epsilon_each: float,
    noise: NoiseSampler,
) -> dict[int, list[float]]:
    """proof step 8: per covariate with k >= 2 quantile cells, its k - 1 DP quantiles (levels
    i / k) on the public grid of its declared bounds, each at ``epsilon_each``."""
    measured: dict[int, list[float]] = {}
    for j, k in enumerate(checked_quantile_cuts(domain, params.quantile_cuts)):
        if k < 2:
            continue
        lower, upper = float(domain.x_lower[j]), float(domain.x_upper[j])
        values = np.clip(x[:, j], lower, upper)
        grid = quantile_candidates(lower, upper)
        measured[j] = [
            noise.quantile(values, candidates=grid, level=level, epsilon=epsilon_each)
            for level in quantile_levels(k)
        ]
    return measured


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
    second_scale: float = 0.0,
) -> dict[str, Any]:
    """proof step 5 (post-processing of the DP counts, sums and second moments): the anchor
    ``a = sum_k w_k u_k`` with ``w_k`` the cells' shares of the noisy counts, and the released
    uplifts ``a + lambda (u_k - a)``. With ``v_k`` the cell's variance under no heterogeneity,
    its privacy-noise variance (delta method, as ``uplift_noise_sd``) plus its sampling variance
    ``s_1^2 / c_k1 + s_0^2 / c_k0``, ``s_t^2`` the arm's marginal variance from the DP second
    moment (in expectation at least the average within-cell variance) raised by
    ``z_0.95`` times that estimate's noise sd (``second_scale``: the Laplace noise of the second
    moments can take it to 0, and a variance read too small would detect noise): from 3 cells
    lambda is ``anchor.heterogeneity_factor`` (Cochran's Q, each cell at its own precision); with
    2 the prior form of ``anchor.james_stein_factor`` on the count-weighted deviations
    ``sqrt(w_k) (u_k - a)`` and their covariance ``W^1/2 (I - 1 w') V (I - w 1') W^1/2``.
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
    variances: list[float] | None = None  # not measured (one cell, or no second moments)
    if uplift.size >= 2 and noisy_second is not None:
        sums = noisy_sums.reshape(-1, 2)
        arm_counts = np.maximum(counts.sum(axis=0), params.min_count)
        arm_means = np.clip(sums.sum(axis=0) / arm_counts, -width / 2.0, width / 2.0)
        raise_by = float(ndtri(SECOND_MOMENT_UPPER_LEVEL)) * math.sqrt(2.0) * second_scale
        variances = [
            min(
                float(np.clip(noisy_second[t] / arm_counts[t] - arm_means[t] ** 2, 0.0, None))
                + raise_by / float(arm_counts[t]),
                width**2 / 4,
            )
            for t in (0, 1)
        ]
        means = np.column_stack(
            [np.asarray(released["mean_control"]), np.asarray(released["mean_treated"])]
        )
        centred = means - midpoint
        privacy = (2 * sum_scale**2 + centred**2 * 2 * count_scale**2) / floor**2
        sampling = np.column_stack([variances[0] / floor[:, 0], variances[1] / floor[:, 1]])
        v = (privacy + sampling).sum(axis=1)
        if uplift.size >= 3:
            factor = heterogeneity_factor(uplift, v)
        else:
            trace, trace_squared = _deviation_traces(weights, v)
            prior = width / versus_ate.DEFAULT_HETEROGENEITY_RANGE_RATIO
            factor = james_stein_factor(
                np.sqrt(weights) * (uplift - anchor), trace, trace_squared, prior
            )
    shrunk = np.clip(anchor + factor * (uplift - anchor), -width, width)
    anchor_sd, released_sd = released_noise_sds(
        np.asarray(released["uplift_noise_sd"], dtype=np.float64), weights, factor, width
    )
    return {
        **released,
        "uplift": shrunk.tolist(),
        "uplift_unshrunk": uplift.tolist(),
        "released_noise_sd": released_sd.tolist(),
        "ate_anchor": anchor,
        "ate_anchor_noise_sd": anchor_sd,
        "shrinkage_factor": factor,
        "arm_variance": (
            None if variances is None else {"control": variances[0], "treated": variances[1]}
        ),
    }


def released_noise_sds(
    noise_sd: NDArray[np.float64], weights: NDArray[np.float64], factor: float, width: float
) -> tuple[float, NDArray[np.float64]]:
    """The privacy-noise sd of the anchor ``a = sum_k w_k u_k`` and of each released value
    ``a + lambda (u_k - a)``, from the unshrunk uplifts' noise sds (``uplift_noise_sd``, delta
    method), the weights and the factor taken as fixed: ``(1 - lambda)^2 V_a + lambda^2 v_k +
    2 lambda (1 - lambda) w_k v_k``, ``V_a = sum_k w_k^2 v_k``. At factor 0 every cell's is the
    anchor's. Capped at R_Y (a released value lies in [-R_Y, R_Y]; a near-empty cell's delta-
    method sd can exceed it). Post-processing of public quantities."""
    v = noise_sd * noise_sd
    anchor_var = float(np.sum(weights * weights * v))
    keep = 1.0 - factor
    cell_var = keep * keep * anchor_var + factor * factor * v + 2.0 * factor * keep * weights * v
    capped = np.minimum(np.sqrt(np.maximum(cell_var, 0.0)), width)
    return min(math.sqrt(anchor_var), width), capped


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
        measured: dict[int, list[float]] = {}
        if state.quantile_epsilon is not None:
            # proof step 8: the DP quantile cut points first, then the table on their grid
            measured = measure_cut_points(x, domain, params, state.quantile_epsilon, noise)
            progress(0.3, "cut points")
        edges = grid_edges(domain, params, measured)
        counts, sums = grid_aggregates(x, a, y, domain, params, edges)
        partition = {
            "type": "grid",
            "bins": list(grid_shape(domain, params)),
            **({"edges": edges} if edges is not None else {}),
            **(
                {"quantile_cuts": list(params.quantile_cuts)}
                if params.quantile_cuts is not None
                else {}
            ),
            "lower": [float(v) for v in lower],
            "upper": [float(v) for v in upper],
            "order": "row-major over covariates",
            **grid_codes(domain),
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
            second_scale=0.0 if state.second_moments is None else state.second_moments.scale,
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
        **shrinkage_fields(state),
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
    """proof step 6: the ate kind's default at the request's (epsilon, delta) (the whole
    charge; in chunks where its chunks rule applies); the one cell's uplift is that ATE. No table
    noise is drawn, so no counts or cell means exist."""
    if state.adjusted is None:  # pragma: no cover - guarded by the caller
        raise ValueError("not an adjusted plan")
    chunked = state.adjusted_chunks
    if chunked is not None:
        ate = aggregate.run(arrays, domain, chunked, rng=rng, noise=noise, progress=progress)
        noise_sd = aggregate.mean_noise_sd(chunked, ate["chunk_s_theta"])
    else:
        ate = ate_strict.run(
            arrays, domain, state.adjusted.params, rng=rng, noise=noise, progress=progress
        )
        noise_sd = float(ate["s_theta"])
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
            **grid_codes(domain),
        },
        "cells": 1,
        "count_noise_scale": None,
        "sum_noise_scale": None,
        "min_count": state.params.min_count,
        "low_count_threshold": state.params.low_count_threshold,
        **shrinkage_fields(state),
        "uplift": [uplift],
        "uplift_unshrunk": None,
        "uplift_noise_sd": [noise_sd],
        "low_count": [False],
        "ate_anchor": uplift,
        "shrinkage_factor": 0.0,
        "adjusted_ate": ate,
    }


def ebm_table(
    cate: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    domain: PublicDomain,
    edges: list[list[float]],
) -> dict[str, Any]:
    """proof step 7 (post-processing of a released CATE model): the table of ``cate`` at the
    public centres of the grid's cells (``cell_centres``), clipped to [-R_Y, R_Y]; lookups read
    it by the cell edges (``predict``)."""
    width = domain.outcome_range
    values = np.clip(np.asarray(cate(cell_centres(domain, edges)), dtype=np.float64), -width, width)
    return {
        "grid": {
            "type": "grid",
            "bins": [len(e) - 1 for e in edges],
            "edges": [list(e) for e in edges],
            "lower": [float(v) for v in domain.x_lower],
            "upper": [float(v) for v in domain.x_upper],
            "order": "row-major over covariates",
            **grid_codes(domain),
            "cell_value": "the CATE model at the cell's centre (a categorical covariate: its "
            "declared code in the cell)",
        },
        "cells": int(values.size),
        "uplift": values.tolist(),
    }


def grid_codes(domain: PublicDomain) -> dict[str, Any]:
    """A grid's categorical covariates' declared codes (None for a numeric one), so a reader
    labels a cell by the codes in it ("diabetes = 1") instead of the range between them; empty
    where the schema declares none."""
    if domain.x_codes is None or all(c is None for c in domain.x_codes):
        return {}
    return {"codes": [None if c is None else sorted(int(v) for v in c) for c in domain.x_codes]}


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
    if "edges" in grid:  # proof step 7: the ebm estimator's table
        index = edge_index(points, grid["edges"])
        return np.asarray(result["uplift"], dtype=np.float64)[index]
    index = cell_index(
        points,
        np.asarray(grid["lower"], dtype=np.float64),
        np.asarray(grid["upper"], dtype=np.float64),
        tuple(int(b) for b in grid["bins"]),
    )
    return np.asarray(result["uplift"], dtype=np.float64)[index]
