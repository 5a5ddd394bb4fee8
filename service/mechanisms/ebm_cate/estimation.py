"""Running ebm_cate after the charge: the partition, the DP nuisances, the pseudo-outcomes, the
effect model (anchored: the anchor, the calibration sums and the factor) and predictions at
public points (post-processing of the released model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.anchor import (
    anchor_pseudo_outcomes,
    draw_anchor,
    draw_ate_anchor,
)
from service.mechanisms.ate_strict import pseudo_outcomes
from service.mechanisms.calibration import public_propensity
from service.mechanisms.domain import (
    Arrays,
    PublicDomain,
    project_covariates,
    project_domain,
)
from service.mechanisms.dp_ebm import (
    DP_EBM_MAX_ROUNDS,
    SafeEbm,
    fit_regressor,
    interpret_guard,
    outcome_predictions,
    propensity_scores,
)
from service.mechanisms.ebm_cate.calibration import (
    Plan,
    anchor_bound,
    deviation_bound,
    make_plan,
    public_parameters,
)
from service.mechanisms.ebm_cate.rules import (
    CALIBRATION_LEVEL,
    EbmCateParams,
    Progress,
)
from service.mechanisms.errors import ReleaseFailed
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.partition import (
    prepare_arrays,
    random_folds,
)


def run(
    arrays: Arrays,
    domain: PublicDomain,
    params: EbmCateParams,
    *,
    rng: np.random.Generator,
    progress: Progress,
    feature_names: list[str] | None = None,
    noise: NoiseSampler | None = None,
) -> dict[str, Any]:
    """Fit the learner after the charge; ``ReleaseFailed`` on any data-time failure.

    ``noise`` draws the anchor's and the calibration statistics' noise (shrinkage ``"ate"``;
    interpret draws the DP-EBMs' own)."""
    state = make_plan(domain, params)
    try:
        return run_plan(
            arrays, domain, state, rng=rng, progress=progress, names=feature_names, noise=noise
        )
    except Exception:
        raise ReleaseFailed() from None


def run_plan(
    arrays: Arrays,
    domain: PublicDomain,
    state: Plan,
    *,
    rng: np.random.Generator,
    progress: Progress,
    names: list[str] | None,
    noise: NoiseSampler | None = None,
) -> dict[str, Any]:
    """The release of a validated ``plan`` (``run`` without the generic failure wrapper: the
    audits call it to see the data-time path itself)."""
    params = state.params
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    q = domain.q
    feature_names = list(names) if names is not None else list(domain.names)
    x, a, y = prepare_arrays(arrays, domain)
    low, high = domain.y_lower, domain.y_upper

    rct_anchor: float | None = None
    rct_interval: dict[str, float] | None = None
    if state.rct_anchor is not None:
        # proof step 6.1 (RCT): the anchor release on all n records (its own partition), at the
        # anchor's share; its DP estimate clipped to [-R_Y, R_Y] and its interval are kept.
        if noise is None:
            raise ValueError("the anchor needs the noise sampler")
        rct_anchor, rct_interval = draw_ate_anchor(
            arrays,
            domain,
            state.rct_anchor,
            rng=rng,
            noise=noise,
            progress=lambda fraction, stage: None,
        )

    # proof step 4: uniformly random permutation cut at public sizes; never stored.
    folds = random_folds(rng, domain.n, state.modules, state.fold_sizes)
    progress(0.05, "partition")
    a_lower = np.concatenate([[0.0], lower])
    a_upper = np.concatenate([[1.0], upper])

    if params.learner == "s":
        rows = folds["outcome"]
        model, midpoint = fit_regressor(
            np.column_stack([a[rows], x[rows]]),
            y[rows],
            a_lower,
            a_upper,
            low,
            high,
            state.accounting,
            max_bins=params.max_bins,
            max_rounds=params.max_rounds,
        )
        safe = SafeEbm.from_model(model, offset=midpoint, names=["treatment", *feature_names])
        centre = ((lower + upper) / 2.0)[None, :]
        effect = float(
            safe.predict(np.column_stack([[1.0], centre]))[0]
            - safe.predict(np.column_stack([[0.0], centre]))[0]
        )
        progress(1.0, "done")
        return {
            **public_parameters(state, domain),
            "ate": effect,
            "model": {"kind": "s_learner", "outcome": safe.to_dict()},
            "shape_functions": safe.shape_functions([(0, 1), *_codes(domain)]),
        }

    effect_rows = folds["effect"]
    x2, a2, y2 = x[effect_rows], a[effect_rows], y[effect_rows]
    # proof step 8: the nuisance models see the adjustment columns only (all q by default), a
    # public row-wise projection of their folds and of the effect fold they predict on.
    adjust = state.params.adjustment_columns
    xa, xa2 = project_covariates(x, adjust), project_covariates(x2, adjust)
    adjusted = project_domain(domain, adjust)
    lower_a = np.asarray(adjusted.x_lower, dtype=np.float64)
    upper_a = np.asarray(adjusted.x_upper, dtype=np.float64)
    # proof step 2: first-stage DP models, each on its own fold; predictions on the effect fold
    # are row-wise post-processing.
    if state.propensity is not None:
        e_hat = np.full(x2.shape[0], state.propensity)
    else:
        rows = folds["propensity"]
        e_hat = propensity_scores(
            xa[rows],
            a[rows],
            xa2,
            lower_a,
            upper_a,
            state.accounting,
            clip=params.propensity_clip,
            max_bins=params.max_bins,
            max_rounds=DP_EBM_MAX_ROUNDS,  # first stage: interpret default
        )
    progress(0.35, "propensity")
    rows = folds["outcome"]
    k = state.clip_k
    if params.learner == "dr":
        # proof step 10: the model's range, two DP quantiles of the fold's outcomes (or the
        # declared bounds); its predictions lie inside it, so inside the declared bounds.
        fit_low, fit_high, outcome_accounting = low, high, state.accounting
        if state.outcome_range is not None and state.outcome_accounting is not None:
            if noise is None:
                raise ValueError("the measured range needs the noise sampler")
            fit_low, fit_high = state.outcome_range.measure(y[rows], low, high, noise)
            outcome_accounting = state.outcome_accounting
        mu0, mu1 = outcome_predictions(
            xa[rows],
            a[rows],
            y[rows],
            xa2,
            lower_a,
            upper_a,
            fit_low,
            fit_high,
            outcome_accounting,
            max_bins=params.max_bins,
            max_rounds=DP_EBM_MAX_ROUNDS,  # first stage: interpret default
        )
        progress(0.65, "outcome")
        # proof step 1 (applied): row-wise AIPW pseudo-outcome, clipped to [-K, K].
        psi = pseudo_outcomes(a2, y2, e_hat, mu0, mu1, bound=k)
        weight = None
        if state.anchored:
            if noise is None:
                raise ValueError("the anchor needs the noise sampler")
            return _run_anchored(
                x2,
                a2,
                y2,
                e_hat,
                mu0,
                mu1,
                domain,
                state,
                noise,
                feature_names,
                rct_anchor,
                rct_interval,
            )
    else:
        eta_model, mid = fit_regressor(
            xa[rows],
            y[rows],
            lower_a,
            upper_a,
            low,
            high,
            state.accounting,
            max_bins=params.max_bins,
            max_rounds=DP_EBM_MAX_ROUNDS,  # first stage: interpret default
        )
        with interpret_guard():
            eta = np.asarray(eta_model.predict(xa2)) + mid
        eta = np.clip(np.nan_to_num(eta, nan=mid), low, high)
        del eta_model
        progress(0.65, "outcome")
        residual_a = a2 - e_hat  # |.| >= c since a in {0, 1} and e_hat in [c, 1 - c]
        psi = np.clip((y2 - eta) / residual_a, -k, k)
        weight = residual_a**2  # data-dependent: the R-learner is paper-label only
    # proof step 7: the effect model sees the effect columns only (all q by default).
    cols = effect_columns(state, q)
    effect_model, offset = fit_regressor(
        x2[:, cols],
        psi,
        lower[cols],
        upper[cols],
        -k,
        k,
        state.accounting,
        sample_weight=weight,
        max_bins=params.max_bins,
        max_rounds=params.max_rounds,
    )
    safe = SafeEbm.from_model(effect_model, offset=offset, names=[feature_names[j] for j in cols])
    del effect_model, psi, x2, a2, y2
    progress(1.0, "done")
    return {
        **public_parameters(state, domain),
        # The effect model's terms are centred (noisy bin weights of the effect fold), so the
        # intercept plus offset is the model's average effect (dp_ebm_learners.md §5).
        "ate": safe.offset + safe.intercept,
        "model": {"kind": "effect", "effect": safe.to_dict(), **_columns_field(state)},
        "shape_functions": safe.shape_functions(_codes(domain, cols)),
    }


def _run_anchored(
    x2: NDArray[np.float64],
    a2: NDArray[np.float64],
    y2: NDArray[np.float64],
    e_hat: NDArray[np.float64],
    mu0: NDArray[np.float64],
    mu1: NDArray[np.float64],
    domain: PublicDomain,
    state: Plan,
    noise: NoiseSampler,
    feature_names: list[str],
    rct_anchor: float | None = None,
    rct_interval: dict[str, float] | None = None,
) -> dict[str, Any]:
    """proof step 6: the anchor (the effect fold's, or the RCT anchor release's ``rct_anchor``),
    the centred effect model on the fitting rows, the DP calibration sums on the calibration
    rows, and the factor (post-processing)."""
    calibration, accounting = state.calibration, state.effect_accounting
    if calibration is None or accounting is None:
        raise ValueError("not an anchored plan")
    params = state.params
    k = state.clip_k
    big_r = domain.outcome_range
    # step 6.1: the DP anchor ATE: observationally of the whole effect fold (the AIPW
    # pseudo-outcome up to the public anchor_bound, the adaptive clip K_a below it; pi_hat is
    # already in [c, 1 - c]); in an RCT the anchor release's estimate, drawn before the folds.
    _, clip = public_propensity(domain, params.propensity_clip)
    gamma = anchor_pseudo_outcomes("dr", a2, y2, e_hat, mu0, mu1, anchor_bound(domain, clip, k))
    if state.given_anchor is not None:
        anchor = state.given_anchor  # step 6.5: the request's public anchor, nothing drawn
    elif rct_anchor is not None:
        anchor = rct_anchor
    elif state.anchor is not None:
        anchor = draw_anchor(gamma, state.anchor, big_r, noise)
    else:
        raise ValueError("not an anchored plan")
    # step 6.2: targets centred at the anchor, clipped to [-K, K] (row-wise, DP constant)
    targets = np.clip(gamma - anchor, -k, k)
    del gamma
    # The effect fold's rows are in uniformly random order (random_folds): the first
    # effect_fit_size fit the model, the rest are the calibration rows (public sizes).
    fit, held = slice(0, state.effect_fit_size), slice(state.effect_fit_size, None)
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    # proof step 7: the effect model sees the effect columns only (all q by default); step 9:
    # or the screen's DP choice of them, made on the fitting rows' centred targets.
    if state.screen is not None:
        cols = list(state.screen.select(targets[fit], x2[fit], lower, upper, noise))
    else:
        cols = effect_columns(state, domain.q)
    effect_model, offset = fit_regressor(
        x2[fit][:, cols],
        targets[fit],
        lower[cols],
        upper[cols],
        -k,
        k,
        accounting,
        max_bins=params.max_bins,
        max_rounds=params.max_rounds,
    )
    safe = SafeEbm.from_model(effect_model, offset=offset, names=[feature_names[j] for j in cols])
    del effect_model
    centre = safe.offset + safe.intercept
    # step 6.3: calibration sums on the held-out rows: g = the released deviation (a DP
    # output of the fitting rows) at each row, in [-G, G], r = its centred target, in [-K, K].
    bound = deviation_bound(k)
    g = np.clip(np.nan_to_num(safe.predict(x2[held][:, cols]) - centre), -bound, bound)
    r = targets[held]
    sums = np.array(
        [
            math.fsum((g * g).tolist()),
            math.fsum((r * g).tolist()),
            bound / k * math.fsum((r * r).tolist()),
        ]
    )
    del g, r, targets
    noisy = noise.gaussian(sums, sigma=calibration.sigma, sensitivity_l2=calibration.sensitivity_l2)
    # step 6.4 (post-processing): the factor from the DP sums and the public sigma.
    noisy[2] *= k / bound  # post-processing: back to sum r^2 (its noise sd is sigma K / G)
    factor = calibration_factor(noisy, calibration.sigma, state.calibration_size)
    shapes = safe.shape_functions(_codes(domain, cols))
    for shape in shapes:
        for key in ("values", "code_values"):
            if key in shape:
                shape[key] = [factor * float(v) for v in shape[key]]
    screened = {} if state.screen is None else {"screened_columns": [int(j) for j in cols]}
    return {
        **public_parameters(state, domain),
        **screened,
        "ate": anchor,
        "ate_anchor": anchor,
        **({} if rct_interval is None else {"ate_anchor_interval": rct_interval}),
        "shrinkage_factor": factor,
        "anchor_centre": centre,
        "model": {
            "kind": "effect",
            "effect": safe.to_dict(),
            **_columns_field(state, cols),
            "shrinkage": {
                "anchor": anchor,
                "factor": factor,
                "centre": centre,
                "deviation_bound": bound,
                "value_bound": big_r,
            },
        },
        "shape_functions": shapes,
    }


def _codes(domain: PublicDomain, cols: Sequence[int] | None = None) -> list[tuple[int, ...] | None]:
    """The declared codes of the covariates at ``cols`` (all q by default), None where numeric:
    what the shape functions list a value per category for."""
    codes = domain.x_codes or (None,) * domain.q
    return [codes[j] for j in (range(domain.q) if cols is None else cols)]


def effect_columns(state: Plan, q: int) -> list[int]:
    """The covariate positions the effect model is fitted on (proof step 7): the request's
    ``effect_columns``, else all q."""
    columns = state.params.effect_columns
    return list(range(q)) if columns is None else list(columns)


def _columns_field(state: Plan, chosen: list[int] | None = None) -> dict[str, Any]:
    """The stored model's ``columns`` (the effect columns, or the screen's ``chosen`` ones),
    only where they are a subset, so a release on every covariate reads as before."""
    if state.screen is not None and chosen is not None:
        return {"columns": [int(j) for j in chosen]}
    columns = state.params.effect_columns
    return {} if columns is None else {"columns": list(columns)}


def effect_values(model: dict[str, Any], points: NDArray[np.float64]) -> NDArray[np.float64]:
    """The effect model of a stored ``model`` at public points of all q covariates (it reads
    its ``columns`` where it has them)."""
    x = np.atleast_2d(np.asarray(points, dtype=np.float64))
    columns = model.get("columns")
    if columns is not None:
        x = x[:, [int(j) for j in columns]]
    return SafeEbm.from_dict(model["effect"]).predict(x)


def calibration_factor(sums: NDArray[np.float64], sigma: float, rows: int) -> float:
    """proof step 6.4: lambda in [0, 1] from the DP sums ``(S_gg, S_rg, S_rr)`` of the
    calibration rows and their public noise sd (post-processing).

    The least-squares slope of the centred targets on the deviations is ``S_rg / S_gg``. With no
    heterogeneity the targets' conditional mean is constant, so ``S_rg`` has mean about 0 and
    variance at most ``S_gg S_rr / m + sigma^2`` (``S_rr / m`` bounds the targets' variance from
    above; ``sigma^2`` is the privacy noise); ``t = S_rg / sqrt(that)``. lambda is 0 unless
    ``t`` exceeds the ``CALIBRATION_LEVEL`` normal quantile z, else the slope (at most 1)
    times the positive-part James–Stein factor ``1 - (z / t)^2``.
    """
    from scipy.stats import norm

    s_gg, s_rg, s_rr = (float(v) for v in sums)
    if not (math.isfinite(s_gg) and math.isfinite(s_rg) and math.isfinite(s_rr)):
        return 0.0
    if s_gg <= 0.0 or s_rg <= 0.0:
        return 0.0
    spread = s_gg * max(s_rr, 0.0) / max(rows, 1) + sigma * sigma
    t = s_rg / math.sqrt(spread)
    z = float(norm.ppf(CALIBRATION_LEVEL))
    if t <= z:
        return 0.0
    return min(1.0, s_rg / s_gg) * (1.0 - (z / t) ** 2)


def predict(result: dict[str, Any], points: NDArray[np.float64]) -> NDArray[np.float64]:
    """CATE at public points from a stored result (post-processing of the DP model).

    Anchored (shrinkage ``"ate"``): ``anchor + lambda * clip(model(x) - centre, -G, G)``,
    clipped to the public CATE range [-R_Y, R_Y]."""
    model = result["model"]
    x = np.atleast_2d(np.asarray(points, dtype=np.float64))
    if model["kind"] == "s_learner":
        safe = SafeEbm.from_dict(model["outcome"])
        ones = np.ones((x.shape[0], 1))
        return safe.predict(np.hstack([ones, x])) - safe.predict(np.hstack([0.0 * ones, x]))
    values = effect_values(model, x)
    shrink = model.get("shrinkage")
    if shrink is None:
        return values
    bound = float(shrink["deviation_bound"])
    deviation = np.clip(np.nan_to_num(values - float(shrink["centre"])), -bound, bound)
    out = float(shrink["anchor"]) + float(shrink["factor"]) * deviation
    value_bound = float(shrink["value_bound"])
    return np.asarray(np.clip(out, -value_bound, value_bound), dtype=np.float64)
