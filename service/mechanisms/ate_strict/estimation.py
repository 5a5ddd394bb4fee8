"""Running the strict ATE after the charge: partition, DP nuisances, pseudo-outcomes, the DP
mean and second moment (with the adaptive clip when planned) and the CI (post-processing).

Every noise draw goes through a ``NoiseSampler`` at a scale fixed by ``calibration``; any
failure after the data is touched is one generic ``ReleaseFailed``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri

from service.mechanisms import dp_linear
from service.mechanisms.ate_strict.calibration import (
    ADAPTIVE_CLIP_LEVEL,
    Plan,
    adaptive_calibrations,
    adaptive_clip_bound,
    adaptive_clip_candidates,
    make_plan,
    public_parameters,
)
from service.mechanisms.ate_strict.rules import AteStrictParams, Progress
from service.mechanisms.domain import (
    Arrays,
    PublicDomain,
    checked_columns,
    project,
)
from service.mechanisms.dp_ebm import (
    DpEbmAccounting,
    outcome_predictions,
    propensity_scores,
)
from service.mechanisms.errors import ReleaseFailed
from service.mechanisms.noise import (
    GaussianCalibration,
    NoiseSampler,
    release_gaussian,
)
from service.mechanisms.partition import (
    prepare_arrays,
    random_folds,
)
from service.mechanisms.quantile_bins import transform


def pseudo_outcomes(
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    pi_hat: NDArray[np.float64],
    mu0_hat: NDArray[np.float64],
    mu1_hat: NDArray[np.float64],
    *,
    bound: float,
) -> NDArray[np.float64]:
    """AIPW pseudo-outcomes, clipped to [-bound, bound] (ate_ci.md §3.2 step 5).

    ``Gamma = mu1 - mu0 + a (y - mu1) / pi - (1 - a)(y - mu0) / (1 - pi)``. With pi in [c, 1 - c]
    and y, mu0, mu1 in [y_lo, y_hi], |Gamma| <= R / c (§3.3), so the clip only removes float
    rounding, unless ``bound`` is a tighter public K. Non-finite values map to 0 (a row-wise,
    public rule), so the result always lies in [-bound, bound].

    Args:
        a: treatment in {0, 1}.
        y: outcome.
        pi_hat: clipped propensity at the rows.
        mu0_hat: clipped outcome model at (x, 0).
        mu1_hat: clipped outcome model at (x, 1).
        bound: the public bound B (or K).

    Returns:
        Gamma, one value per row, in [-bound, bound].
    """
    with np.errstate(all="ignore"):
        gamma = (
            mu1_hat
            - mu0_hat
            + a * (y - mu1_hat) / pi_hat
            - (1.0 - a) * (y - mu0_hat) / (1.0 - pi_hat)
        )
    gamma = np.where(np.isfinite(gamma), gamma, 0.0)
    return np.asarray(np.clip(gamma, -bound, bound), dtype=np.float64)


def d2_statistics(gamma: NDArray[np.float64], *, bound: float) -> tuple[float, float]:
    """The non-private statistics theta_hat = mean(Gamma) and m2_hat = mean(Gamma^2).

    Sums are exact-then-rounded (``math.fsum``), so replacing one row moves theta_hat by at
    most ``2 bound / n2`` and m2_hat by at most ``bound^2 / n2``, up to the float slack
    accounted for in calibration. NEVER release these values.

    Args:
        gamma: pseudo-outcomes in [-bound, bound].
        bound: the public bound B.

    Returns:
        (theta_hat, m2_hat).
    """
    values = np.clip(np.asarray(gamma, dtype=np.float64), -bound, bound)
    n2 = int(values.size)
    if n2 == 0:
        raise ValueError("empty estimation fold")
    squares = np.minimum(values * values, bound * bound)
    theta_hat = math.fsum(values.tolist()) / n2
    m2_hat = math.fsum(squares.tolist()) / n2
    return theta_hat, m2_hat


def interval_half_width(variance: float, *, s_theta: float, n2: int, alpha: float) -> float:
    """``z_{1 - alpha/2} sqrt(V / n2 + s_theta^2)`` (ate_ci.md §3.2 step 9; post-processing)."""
    return float(ndtri(1.0 - alpha / 2.0)) * math.sqrt(variance / n2 + s_theta**2)


def confidence_interval(
    theta_dp: float,
    m2_dp: float,
    *,
    s_theta: float,
    s_2: float,
    n2: int,
    alpha: float,
    variance_inflation: bool = False,
    alpha_v: float = 0.05,
) -> dict[str, float]:
    """CI from DP values and public constants only (ate_ci.md §3.2 steps 8–9; post-processing).

    ``V_hat = max(0, m2_DP - theta_DP^2 + s_theta^2)``; optionally ``V_hat + z_{1-alpha_v} s_2``;
    ``theta_DP +- z_{1 - alpha/2} sqrt(V / n2 + s_theta^2)``.

    Returns:
        ``variance_estimate`` (V_hat), ``variance_used``, ``half_width``, ``ci_lower``,
        ``ci_upper``.
    """
    variance = max(0.0, m2_dp - theta_dp * theta_dp + s_theta * s_theta)
    variance_used = variance + float(ndtri(1.0 - alpha_v)) * s_2 if variance_inflation else variance
    half_width = interval_half_width(variance_used, s_theta=s_theta, n2=n2, alpha=alpha)
    return {
        "variance_estimate": variance,
        "variance_used": variance_used,
        "half_width": half_width,
        "ci_lower": theta_dp - half_width,
        "ci_upper": theta_dp + half_width,
    }


def _dp_ebm(state: Plan) -> DpEbmAccounting:
    if state.dp_ebm is None:
        raise ValueError("no DP-EBM accounting in this plan")
    return state.dp_ebm


def _dp_ebm_outcome(state: Plan) -> DpEbmAccounting:
    """The outcome model's accounting (proof §16: less than the propensity model's by the
    measured range's share; the same without the range)."""
    if state.dp_ebm_outcome is None:
        raise ValueError("no DP-EBM accounting in this plan")
    return state.dp_ebm_outcome


def _release(value: float, calibration: GaussianCalibration, noise: NoiseSampler) -> float:
    return float(release_gaussian(np.array([value], dtype=np.float64), calibration, noise)[0])


def run(
    arrays: Arrays,
    domain: PublicDomain,
    params: AteStrictParams,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    """Run the strict DP AIPW release (after the charge).

    Args:
        arrays: the private data (already clipped to the public box at ingest).
        domain: the public domain.
        params: the request (validated again here, before any data access).
        rng: generator for the partition (``secure_rng()`` in production).
        noise: the noise sampler (``OpenDPSampler()`` in production).
        progress: called as ``progress(fraction, stage)`` at stage boundaries.

    Returns:
        DP and public values only: ``estimate``, ``ci_lower``, ``ci_upper``, ``ci_level``,
        ``half_width``, ``variance_estimate``, ``s_theta``, ``s_2``, ``n2`` and the public
        parameters.

    Raises:
        InvalidParameters: invalid parameters (before the data is touched).
        ReleaseFailed: any failure after the data is touched (generic by construction).
    """
    state = make_plan(domain, params)
    # proof §15: the release on the records' projection onto the adjustment columns (public).
    columns = checked_columns(domain, params.adjustment_columns, "adjustment_columns")
    arrays, domain = project(arrays, domain, columns)
    try:
        return _run(arrays, domain, state, rng=rng, noise=noise, progress=progress)
    except Exception:
        # threats.md §3: one generic error, no cause chain (it could quote data).
        raise ReleaseFailed() from None


def _run(
    arrays: Arrays,
    domain: PublicDomain,
    state: Plan,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    params = state.params
    x, a, y = prepare_arrays(arrays, domain)

    # proof step 4: a uniformly random permutation (CSPRNG-seeded) cut at public sizes.
    folds = random_folds(rng, domain.n, state.modules, state.fold_sizes)
    progress(0.05, "partition")

    if state.cross_fit:
        gamma = _cross_fit_pseudo_outcomes(x, a, y, folds, domain, state, noise, progress)
        return _estimate(gamma, state, noise, progress)

    estimation = folds["estimation"]
    x2, a2, y2 = x[estimation], a[estimation], y[estimation]
    low, high = domain.y_lower, domain.y_upper
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)

    # proof step 2: nuisances, each fitted only on its own fold; predictions on D_2 are
    # row-wise post-processing of the DP models.
    if state.propensity is not None:
        pi_hat = np.full(x2.shape[0], state.propensity, dtype=np.float64)
    elif state.dp_logistic is not None:
        pi_fold = folds["propensity"]
        pi_hat = _linear_propensity(x[pi_fold], a[pi_fold], x2, domain, state, noise)
        progress(0.40, "propensity")
    else:
        # proof step 2a: ``fit_classifier`` adds two public anchor rows (A = 0 and A = 1 at the
        # box centre), so interpret's data-derived ``classes_`` is constant; the fit on D_pi +
        # anchors is a DP function of D_pi.
        pi_fold = folds["propensity"]
        x_fit, x_at, low_x, high_x = _binned(state, x[pi_fold], x2, lower, upper, noise)
        pi_hat = propensity_scores(
            x_fit,
            a[pi_fold],
            x_at,
            low_x,
            high_x,
            _dp_ebm(state),
            clip=params.propensity_clip,
            learning_rate=state.learning_rates[0],
        )
        progress(0.40, "propensity")

    if state.nuisance == "none":
        midpoint = (low + high) / 2.0
        mu0_hat = np.full(x2.shape[0], midpoint, dtype=np.float64)
        mu1_hat = mu0_hat
    elif state.dp_ridge is not None:
        mu_fold = folds["outcome"]
        mu0_hat, mu1_hat = _linear_outcome(
            x[mu_fold], a[mu_fold], y[mu_fold], x2, domain, state, noise
        )
        progress(0.75, "outcome")
    else:
        # proof step 2b: A is a continuous feature on (0, 1) and Y is centred on the public
        # midpoint (dp_ebm_learners.md §3.2, §7.4).
        mu_fold = folds["outcome"]
        x_fit, x_at, low_x, high_x = _binned(state, x[mu_fold], x2, lower, upper, noise)
        # proof §16: the model's range, two DP quantiles of the fold's outcomes (or declared).
        fit_low, fit_high = low, high
        if state.outcome_range is not None:
            fit_low, fit_high = state.outcome_range.measure(y[mu_fold], low, high, noise)
        mu0_hat, mu1_hat = outcome_predictions(
            x_fit,
            a[mu_fold],
            y[mu_fold],
            x_at,
            low_x,
            high_x,
            fit_low,
            fit_high,
            _dp_ebm_outcome(state),
            learning_rate=state.learning_rates[1],
        )
        progress(0.75, "outcome")

    # proof step 1 (applied): |Gamma| <= B by construction, then clip to [-B, B] (or K).
    gamma = pseudo_outcomes(a2, y2, pi_hat, mu0_hat, mu1_hat, bound=state.bound)
    del x2, a2, y2, pi_hat, mu0_hat, mu1_hat
    return _estimate(gamma, state, noise, progress)


def _binned(
    state: Plan,
    x_fit: NDArray[np.float64],
    x_at: NDArray[np.float64],
    lower: NDArray[np.float64],
    upper: NDArray[np.float64],
    noise: NoiseSampler,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """A DP-EBM module's covariates: as given, or (proof §14) the fit fold's continuous
    covariates measured by noisy histograms and both the fit rows and the prediction rows
    replaced by the released CDF values, with bounds [0, 1] (post-processing)."""
    bins = state.quantile_bins
    if bins is None:
        return x_fit, x_at, lower, upper
    knots = bins.measure(x_fit, lower, upper, noise)
    binned_fit, new_lower, new_upper = transform(x_fit, lower, upper, bins.columns, knots)
    binned_at = transform(x_at, lower, upper, bins.columns, knots)[0]
    return binned_fit, binned_at, new_lower, new_upper


def _linear_propensity(
    x_fit: NDArray[np.float64],
    a_fit: NDArray[np.float64],
    x_predict: NDArray[np.float64],
    domain: PublicDomain,
    state: Plan,
    noise: NoiseSampler,
) -> NDArray[np.float64]:
    """proof step 8: DP logistic regression on one fold, clipped predictions on another."""
    model = state.dp_logistic
    if model is None:
        raise ValueError("no DP logistic plan")
    z_fit = dp_linear.unit_ball_features(x_fit, domain.x_lower, domain.x_upper)
    w_tilde = model.release(z_fit, a_fit, noise)
    z_predict = dp_linear.unit_ball_features(x_predict, domain.x_lower, domain.x_upper)
    clip = state.params.propensity_clip
    pi_hat = np.nan_to_num(dp_linear.predict_propensity(w_tilde, z_predict), nan=0.5)
    return np.asarray(np.clip(pi_hat, clip, 1.0 - clip), dtype=np.float64)


def _linear_outcome(
    x_fit: NDArray[np.float64],
    a_fit: NDArray[np.float64],
    y_fit: NDArray[np.float64],
    x_predict: NDArray[np.float64],
    domain: PublicDomain,
    state: Plan,
    noise: NoiseSampler,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """proof step 8: DP per-arm ridge on one fold, clipped predictions on another."""
    model = state.dp_ridge
    if model is None:
        raise ValueError("no DP ridge plan")
    low, high = domain.y_lower, domain.y_upper
    z_fit = dp_linear.unit_ball_features(x_fit, domain.x_lower, domain.x_upper)
    w0, w1 = model.release(z_fit, a_fit, y_fit, y_lower=low, y_upper=high, noise=noise)
    z_predict = dp_linear.unit_ball_features(x_predict, domain.x_lower, domain.x_upper)
    return (
        dp_linear.predict_outcome(w0, z_predict, y_lower=low, y_upper=high),
        dp_linear.predict_outcome(w1, z_predict, y_lower=low, y_upper=high),
    )


def _cross_fit_pseudo_outcomes(
    x: NDArray[np.float64],
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    folds: dict[str, NDArray[np.intp]],
    domain: PublicDomain,
    state: Plan,
    noise: NoiseSampler,
    progress: Progress,
) -> NDArray[np.float64]:
    """proof step 9 (§12): each half's Gamma uses DP nuisances fitted on the other half."""
    parts: list[NDArray[np.float64]] = []
    halves = (folds["half_1"], folds["half_2"])
    for index, (fit, target) in enumerate(((halves[0], halves[1]), (halves[1], halves[0]))):
        if state.propensity is not None:
            pi_hat = np.full(target.size, state.propensity, dtype=np.float64)
        else:
            pi_hat = _linear_propensity(x[fit], a[fit], x[target], domain, state, noise)
        mu0_hat, mu1_hat = _linear_outcome(x[fit], a[fit], y[fit], x[target], domain, state, noise)
        parts.append(
            pseudo_outcomes(a[target], y[target], pi_hat, mu0_hat, mu1_hat, bound=state.bound)
        )
        progress(0.35 * (index + 1), f"nuisance fold {index + 1}")
    return np.concatenate(parts)


def adaptive_clip(
    gamma: NDArray[np.float64], bound: float, epsilon: float, noise: NoiseSampler
) -> float:
    """proof §13: the epsilon-DP quantile Q of |Gamma| on the public grid in [B / 1000, B], then
    the clip ``K = min(B, kappa(n2) Q)`` (post-processing)."""
    quantile = noise.quantile(
        np.abs(gamma),
        candidates=adaptive_clip_candidates(bound),
        level=ADAPTIVE_CLIP_LEVEL,
        epsilon=epsilon,
    )
    return adaptive_clip_bound(quantile, bound, int(gamma.size))


def _estimate(
    gamma: NDArray[np.float64], state: Plan, noise: NoiseSampler, progress: Progress
) -> dict[str, Any]:
    """proof steps 3, 5, 7: DP mean and second moment of Gamma, then the CI."""
    params = state.params
    # proof step 3 (applied): exact-then-rounded sums; the sensitivities include the slack.
    if gamma.size != state.n2:
        raise ValueError("estimation size differs from the plan")
    bound, mean, second = state.bound, state.mean, state.second_moment
    if state.quantile_epsilon is not None:
        # proof §13: an epsilon_q-DP quantile of |Gamma| on the public grid sets the clip K.
        bound = adaptive_clip(gamma, state.bound, state.quantile_epsilon, noise)
        mean, second = adaptive_calibrations(state, bound)
    theta_hat, m2_hat = d2_statistics(gamma, bound=bound)
    del gamma
    # proof step 5: two lattice Gaussian releases with public (or DP-derived) sigma.
    theta_dp = _release(theta_hat, mean, noise)
    m2_dp = _release(m2_hat, second, noise)
    del theta_hat, m2_hat
    progress(0.95, "estimation")

    # proof step 7: post-processing of (theta_DP, m2_DP) and public constants only.
    interval = confidence_interval(
        theta_dp,
        m2_dp,
        s_theta=mean.sigma,
        s_2=second.sigma,
        n2=state.n2,
        alpha=params.alpha,
        variance_inflation=params.variance_inflation,
        alpha_v=params.alpha_v,
    )
    result: dict[str, Any] = {
        "estimate": theta_dp,
        "ci_lower": interval["ci_lower"],
        "ci_upper": interval["ci_upper"],
        "ci_level": 1.0 - params.alpha,
        "half_width": interval["half_width"],
        "variance_estimate": interval["variance_estimate"],
        "s_theta": mean.sigma,
        "s_2": second.sigma,
        "n2": state.n2,
        **public_parameters(state),
        "bound": bound,  # the clip used: B, a public K, or the DP-derived adaptive K
    }
    progress(1.0, "done")
    return result
