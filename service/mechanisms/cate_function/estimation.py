"""cate_function's run (after the charge): nuisances, pseudo-targets, the anchor, the
second stage and the shrinkage factor at the public reference points (proof §7)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import scipy.linalg
from numpy.typing import NDArray

from service.mechanisms import ate_strict, gp, versus_ate
from service.mechanisms import dp_ebm as dp_ebm_lib
from service.mechanisms.anchor import draw_ate_anchor, james_stein_factor
from service.mechanisms.cate_function.calibration import (
    CateFunctionParams,
    FloatArray,
    Learner,
    Plan,
    Progress,
    plan,
    public_parameters,
)
from service.mechanisms.cate_function.function import (
    FittedFunction,
    ReferenceDraw,
    _centre_metric,
    canonicalise,
    scale_to_unit,
    second_stage,
)
from service.mechanisms.domain import (
    Arrays,
    PublicDomain,
    project_covariates,
    project_domain,
)
from service.mechanisms.errors import ReleaseFailed
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.partition import prepare_arrays, random_folds

# ---- running (after the charge) -------------------------------------------------------------


def _paper_nuisances(
    x: FloatArray,
    a: FloatArray,
    y: FloatArray,
    folds: dict[str, NDArray[np.intp]],
    x2: FloatArray,
    state: Plan,
    domain: PublicDomain,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Non-private nuisances on D_1 (paper mode only)."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if state.propensity is not None:
            pi_hat = np.full(x2.shape[0], state.propensity)
        else:
            idx = folds["propensity"]
            classes = np.unique(a[idx])
            if classes.size < 2:
                pi_hat = np.full(x2.shape[0], 0.5)
            else:
                model = LogisticRegression(max_iter=500).fit(x[idx], a[idx])
                pi_hat = model.predict_proba(x2)[:, 1]
        if "outcome" in folds:
            idx = folds["outcome"]
            reg = HistGradientBoostingRegressor(max_iter=100).fit(
                np.column_stack([a[idx], x[idx]]), y[idx]
            )
            ones = np.ones(x2.shape[0])
            mu1 = reg.predict(np.column_stack([ones, x2]))
            mu0 = reg.predict(np.column_stack([0.0 * ones, x2]))
        else:
            mu0 = mu1 = np.full(x2.shape[0], (domain.y_lower + domain.y_upper) / 2.0)
    return (
        np.asarray(pi_hat, np.float64),
        np.asarray(mu0, np.float64),
        np.asarray(mu1, np.float64),
    )


def _dp_nuisances(
    x: FloatArray,
    a: FloatArray,
    y: FloatArray,
    folds: dict[str, NDArray[np.intp]],
    x2: FloatArray,
    state: Plan,
    domain: PublicDomain,
    progress: Progress,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """DP-EBM nuisances on their own folds (strict mode), the ATE's shared first stage, on
    the schema's declared adjustment set (proof §8: a public row-wise projection), else on
    every covariate."""
    low, high = domain.y_lower, domain.y_upper
    columns = domain.adjustment_set
    x, x2 = project_covariates(x, columns), project_covariates(x2, columns)
    domain = project_domain(domain, columns)
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)

    def accounting() -> dp_ebm_lib.DpEbmAccounting:
        if state.dp_ebm is None:
            raise ValueError("no DP-EBM accounting in this plan")
        return state.dp_ebm

    if state.propensity is not None:
        pi_hat = np.full(x2.shape[0], state.propensity, dtype=np.float64)
    else:
        idx = folds["propensity"]
        # pseudo_targets clips to [kappa, 1 - kappa] again; here only NaN and [0, 1] matter.
        pi_hat = dp_ebm_lib.propensity_scores(
            x[idx], a[idx], x2, lower, upper, accounting(), clip=0.0
        )
        progress(0.35, "propensity")
    if state.params.nuisance == "none":
        mid = (low + high) / 2.0
        mu0 = np.full(x2.shape[0], mid, dtype=np.float64)
        mu1 = mu0
    else:
        idx = folds["outcome"]
        mu0, mu1 = dp_ebm_lib.outcome_predictions(
            x[idx], a[idx], y[idx], x2, lower, upper, low, high, accounting()
        )
        progress(0.7, "outcome")
    return pi_hat, mu0, mu1


def pseudo_targets(
    learner: Learner,
    a: FloatArray,
    y: FloatArray,
    pi_hat: FloatArray,
    mu0: FloatArray,
    mu1: FloatArray,
    *,
    domain: PublicDomain,
    propensity_bound: float,
) -> tuple[FloatArray, FloatArray]:
    """(targets, weights) of the second-stage loss ``(targets_i - weights_i g(x_i))^2`` (§3.2).

    Nuisances are clipped to public ranges first (proof step 2): pi in [kappa, 1 - kappa],
    mu in the outcome bounds, so |r| <= R_max, |w| <= 1 (R) and |phi| <= R_max / kappa (DR).
    """
    low, high = domain.y_lower, domain.y_upper
    pi = np.clip(np.nan_to_num(pi_hat, nan=0.5), propensity_bound, 1.0 - propensity_bound)
    mu0 = np.clip(np.nan_to_num(mu0, nan=low), low, high)
    mu1 = np.clip(np.nan_to_num(mu1, nan=low), low, high)
    if learner == "r":
        m_hat = np.clip(pi * mu1 + (1.0 - pi) * mu0, low, high)
        targets = np.clip(y - m_hat, -(high - low), high - low)
        weights = a - pi
        return np.asarray(targets, np.float64), np.asarray(weights, np.float64)
    phi = ate_strict.pseudo_outcomes(a, y, pi, mu0, mu1, bound=(high - low) / propensity_bound)
    return phi, np.ones_like(phi)


def run(
    arrays: Arrays,
    domain: PublicDomain,
    params: CateFunctionParams,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> tuple[dict[str, Any], FittedFunction]:
    """Fit the function (after the charge): returns (public result, secret fitted function).

    ``rng`` draws the data-independent partition and random frequencies; ``noise`` the unit
    normals of the finite bases' coefficient noise.

    Raises:
        InvalidParameters: invalid parameters (before the data is touched).
        ReleaseFailed: any failure after the data is touched (generic by construction).
    """
    state = plan(domain, params)
    try:
        return _run(arrays, domain, state, rng=rng, noise=noise, progress=progress)
    except Exception:
        raise ReleaseFailed() from None


def _run(
    arrays: Arrays,
    domain: PublicDomain,
    state: Plan,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> tuple[dict[str, Any], FittedFunction]:
    anchor: float | None = state.fixed_anchor
    interval: dict[str, float] | None = None
    if state.anchor is not None:
        # proof §7 step 1: the whole-data anchor, the strict single-release ate default on all n
        # rows.
        anchor, interval = draw_ate_anchor(
            arrays,
            domain,
            state.anchor,
            rng=rng,
            noise=noise,
            progress=lambda fraction, stage: progress(0.3 * fraction, f"anchor: {stage}"),
        )
        progress(0.3, "anchor")
    x, a, y = prepare_arrays(arrays, domain)
    # proof step 1: uniformly random partition at public sizes.
    folds = random_folds(rng, domain.n, state.modules, state.fold_sizes)
    progress(0.32, "partition")
    est = folds["estimation"]
    x2, a2, y2 = x[est], a[est], y[est]
    # proof step 2: nuisances on their own folds only.
    if state.params.mode == "strict":
        pi_hat, mu0, mu1 = _dp_nuisances(x, a, y, folds, x2, state, domain, progress)
    else:
        pi_hat, mu0, mu1 = _paper_nuisances(x, a, y, folds, x2, state, domain)
    targets, weights = pseudo_targets(
        state.params.learner,
        a2,
        y2,
        pi_hat,
        mu0,
        mu1,
        domain=domain,
        propensity_bound=state.propensity_bound,
    )
    if anchor is not None:
        bound = state.scale.target_bound
        targets = np.clip(targets - weights * anchor, -bound, bound)
    lower = np.asarray(domain.x_lower, np.float64)
    upper = np.asarray(domain.x_upper, np.float64)
    fitted = second_stage(
        state,
        scale_to_unit(x2, lower, upper),
        targets,
        weights,
        rng=rng,
        normals=noise.standard_normal,
    )
    if not (np.all(np.isfinite(fitted.coef)) and math.isfinite(fitted.r0)):
        raise ValueError("non-finite fit")
    progress(0.9, "second stage")
    result = {**public_parameters(state), "n2": state.n2}
    if anchor is not None:
        shrink(fitted, state, anchor, noise)
        result["ate_anchor"] = fitted.anchor
        if interval is not None:
            result["ate_anchor_interval"] = interval
        result["shrinkage_factor"] = fitted.shrink
    return result, fitted


def reference_points(state: Plan) -> tuple[NDArray[np.int64], FloatArray]:
    """The public reference points: the first Sobol points of [0, 1]^q, canonicalised."""
    return canonicalise(gp.sobol_centres(state.reference_points, state.q))


def shrink(fitted: FittedFunction, state: Plan, anchor: float, noise: NoiseSampler) -> None:
    """proof §7 step 4: read the released deviation ``g(x) + noise`` at the public reference
    points, and set ``fitted.shrink`` to the James–Stein factor against its public noise
    covariance ``Sigma`` (post-processing of the DP function). For the exact basis the GP path is
    drawn there now and kept as the function's first answers (``fitted.reference``)."""
    codes, points = reference_points(state)
    r0 = fitted.r0
    mean = fitted.mean(points)
    unit: FloatArray | None = None
    if fitted.kind == "gp":
        path = gp.GpPath(state.q, fitted.bandwidth, capacity=points.shape[0])
        draw = path.draw(points, normals=noise.standard_normal, jitter=state.params.jitter)
        unit = draw.values
        deviations = mean + r0 * unit
        covariance = gp.gaussian_kernel(points, points, fitted.bandwidth) + np.diag(draw.jitters)
    elif fitted.kind == "centres":
        cross = gp.gaussian_kernel(points, fitted.support, fitted.bandwidth)
        factor = scipy.linalg.cholesky(_centre_metric(fitted.support, fitted.bandwidth), lower=True)
        half = scipy.linalg.solve_triangular(factor, cross.T, lower=True)  # L^-1 B^T
        deviations = mean
        covariance = half.T @ half  # B M^-1 B^T
    else:
        features = gp.random_features(points, fitted.support)
        deviations = mean
        covariance = features @ features.T
    covariance = (r0 * r0) * covariance
    prior = state.value_bound / versus_ate.DEFAULT_HETEROGENEITY_RANGE_RATIO
    fitted.anchor = anchor
    fitted.shrink = james_stein_factor(
        deviations,
        float(np.trace(covariance)),
        float(np.sum(covariance * covariance)),
        prior,
    )
    if unit is not None:
        fitted.reference = ReferenceDraw(
            codes=codes,
            values=unit,
            answers=fitted.released(mean, unit),
            jitters=draw.jitters,
        )
