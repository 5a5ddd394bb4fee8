"""DP inverse-propensity-weighted ATE with a private propensity (Lee et al.; private_propensity.md).

What it releases:
    strict (``run``): ``theta_DP``, the DP mean of the trimmed, centred Horvitz–Thompson terms
    ``h_i = t_i y_i / pi_i - (1 - t_i) y_i / (1 - pi_i)`` on the estimation fold D_n, with the
    propensity ``pi_i = clip(sigmoid(w_tilde . z_i), xi, 1 - xi)`` from a DP logistic
    regression ``w_tilde`` fitted on the disjoint fit fold D_m; a DP second moment; the CI of
    private_propensity.md §6 (Gaussian noise, so the normal quantile is valid for the privacy
    part) and the public noise scales. Never ``w_hat``, ``w_tilde`` (not needed by this kind),
    the h_i, the fraction trimmed, fold membership or the non-private mean (threats.md §9).

    With ``normalization="hajek"`` (or ``"auto"`` when the public weight-sum noise is small)
    the estimation stage instead releases DP per-arm weighted sums and weight sums (a 4-vector)
    and per-arm second moments (a 6-vector), and returns the Hajek ratio difference with a
    delta-method CI (proof §7): it removes the Horvitz-Thompson level bias of a shrunk or
    misspecified DP propensity.

    paper (``run_paper``, benchmark harness only): the paper's release, DP for D_m only; the
    IPTW on D_n is computed in the clear. It is NOT a service release (private_propensity.md
    table "Service modes"): the ``ate`` kind refuses it.

Neighbouring relation:
    replace-one, n public; fold sizes public functions of n.

Claim (strict):
    ``run`` is (epsilon, delta)-DP: the DP logistic fit on D_m is (epsilon, delta)-DP
    (output perturbation with replace-one sensitivity ``2 / (m lam) + 2 g_tol / lam``,
    ``dp_linear``); on D_n, given w_tilde, ``|h_i| <= B = C_y / xi`` with ``C_y = R / 2``
    (centred outcome), so the mean has sensitivity ``2 B / n`` and the second moment ``B^2 / n``;
    two lattice Gaussians at (f eps, f delta) and ((1 - f) eps, (1 - f) delta) compose to
    (eps, delta); the folds are disjoint from a data-independent permutation, so Theorem 6 of
    Niu et al. charges the max, (eps, delta). Proof: ``docs/proofs/ate_ipw.md``.

References:
    Lee, K., Gresele, L., Park, M. and Muandet, K. (2019). Private causal inference using
    propensity scores. arXiv:1905.12592.
    Chaudhuri, K., Monteleoni, C. and Sarwate, A. D. (2011). Differentially private empirical
    risk minimization. JMLR 12.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri

from service.mechanisms import dp_linear
from service.mechanisms.ate_rct import solve_epsilon
from service.mechanisms.ate_strict import (
    MAX_EPSILON,
    MIN_EPSILON,
    assumed_pseudo_outcome_sd,
    confidence_interval,
    d2_statistics,
    gaussian_event,
    split_share,
    standard_normal_quadrature,
)
from service.mechanisms.calibration import (
    classic_gaussian_multiplier,
    default_delta,
    validate_alpha,
    validate_delta,
    validate_epsilon,
    validate_finite_positive,
)
from service.mechanisms.domain import (
    Arrays,
    PublicDomain,
    StudyDesign,
    checked_columns,
    project,
    project_domain,
)
from service.mechanisms.errors import InvalidParameters, ReleaseFailed
from service.mechanisms.noise import (
    GaussianCalibration,
    NoiseSampler,
    calibrate_gaussian,
    release_gaussian,
)
from service.mechanisms.partition import checked_fractions, fold_sizes, prepare_arrays
from service.mechanisms.records import Composition, Guarantee, MechanismRecord, NoiseEvent

MECHANISM = "ate_ipw_private_propensity"
VERSION = "2"  # 2: Hajek normalisation with DP arm weights ("auto" default), issue 3
Progress = Callable[[float, str], None]
DEFAULT_FOLDS = (0.5, 0.5)  # fit (D_m), estimation (D_n)
DEFAULT_TRIM = 0.05
DEFAULT_MEAN_SHARE = 0.8  # share f of the estimation budget for the mean
PAPER_REGULARIZATION = 0.1  # Lee et al. lambda
Normalization = Literal["auto", "horvitz_thompson", "hajek"]
NORMALIZATIONS: tuple[str, ...] = ("auto", "horvitz_thompson", "hajek")
# Hajek: the DP arm weight sums are floored at this public value before dividing (they estimate
# E[pi / pi_tilde] ~ 1); "auto" uses Hajek only when the noise sd on each weight sum (a public
# function of n, epsilon, delta, xi) is at most HAJEK_AUTO_MAX_WEIGHT_NOISE, where the ratio's
# delta-method CI is accurate, and Horvitz-Thompson (linear, exact Gaussian noise) otherwise.
HAJEK_WEIGHT_FLOOR = 0.25
HAJEK_AUTO_MAX_WEIGHT_NOISE = 0.05
# L2 sensitivities (times n2, in units of C_y = R / 2 for outcomes) of the Hajek statistics:
# per row (a y~/pi, a/pi, (1-a) y~/(1-pi), (1-a)/(1-pi)) with y~ in [-1, 1], each weight in
# [0, 1/xi]: replace-one moves at most sqrt((2/xi)^2 + (1/xi)^2) = sqrt(5)/xi (same arm) or
# 2/xi (other arm); second moments (y~^2, y~, 1)/pi^2 per arm: sqrt(6)/xi^2 either way.
HAJEK_SUMS_SENSITIVITY_XI = math.sqrt(5.0)
HAJEK_SECOND_SENSITIVITY_XI2 = math.sqrt(6.0)
_FLOAT_SLACK_BITS = 50


@dataclass(frozen=True)
class AteIpwParams:
    """Public request parameters of the private-propensity IPW ATE.

    Attributes:
        epsilon: total epsilon (each fold's module gets (epsilon, delta); Theorem 6).
        delta: total delta.
        alpha: miscoverage of the CI.
        trim: xi; the propensity is clipped to [xi, 1 - xi] (>= the dataset's minimum clip).
        fold_fractions: (fit, estimation) fractions of n; default (0.5, 0.5).
        mean_share: share f of the estimation budget for the mean.
        regularization: logistic ridge lambda; None means ``m^(-1/2)`` (strict; IPW is not
            doubly robust, so less shrinkage than the AIPW preset) or Lee et al.'s 0.1 (paper).
        normalization: strict only: ``"horvitz_thompson"`` (one DP mean of the HT terms),
            ``"hajek"`` (DP per-arm weighted sums and weight sums, ratio per arm) or
            ``"auto"`` (Hajek when its public weight-sum noise is small; proof §7).
        adjustment_columns: the covariate positions the propensity model adjusts for (the
            release runs on the records' projection onto them, a public row-wise map;
            ate_strict proof §15); None means every covariate.
    """

    epsilon: float
    delta: float
    alpha: float = 0.05
    trim: float = DEFAULT_TRIM
    fold_fractions: tuple[float, float] | None = None
    mean_share: float = DEFAULT_MEAN_SHARE
    regularization: float | None = None
    normalization: Normalization = "auto"
    adjustment_columns: tuple[int, ...] | None = None


@dataclass(frozen=True)
class _Plan:
    params: AteIpwParams
    fit_size: int
    n2: int
    bound: float
    propensity: dp_linear.DpLogistic
    mean: GaussianCalibration
    second_moment: GaussianCalibration
    record: MechanismRecord
    normalization: str  # resolved: "horvitz_thompson" or "hajek"


def _slack(nominal: float, n: int) -> float:
    return math.nextafter(nominal * (1.0 + (n + 8) * 2.0**-_FLOAT_SLACK_BITS), math.inf)


def _fractions(domain: PublicDomain, params: AteIpwParams) -> tuple[int, int]:
    if isinstance(domain.n, bool) or not isinstance(domain.n, int) or domain.n < 1:
        raise InvalidParameters("the dataset size n must be a positive integer")
    fractions = DEFAULT_FOLDS if params.fold_fractions is None else params.fold_fractions
    checked = checked_fractions(domain.n, ("fit", "estimation"), fractions)
    fit_size, n2 = fold_sizes(domain.n, checked)
    return fit_size, n2


def _columns(domain: PublicDomain, params: AteIpwParams) -> tuple[int, ...] | None:
    return checked_columns(domain, params.adjustment_columns, "adjustment_columns")


def default_delta_for(domain: PublicDomain, fold_fractions: tuple[float, float] | None) -> float:
    """README §1.7 default delta over this release's folds."""
    fit_size, n2 = _fractions(domain, AteIpwParams(1.0, 1e-9, fold_fractions=fold_fractions))
    return default_delta(min(fit_size, n2))


def _make_plan(domain: PublicDomain, params: AteIpwParams, *, paper: bool = False) -> _Plan:
    domain = project_domain(domain, _columns(domain, params))
    if domain.design not in (StudyDesign.OBSERVATIONAL, StudyDesign.RCT):
        raise InvalidParameters("unknown study design")
    if not (math.isfinite(domain.y_lower) and math.isfinite(domain.y_upper)):
        raise InvalidParameters("outcome bounds must be finite")
    validate_finite_positive(domain.outcome_range, "outcome range")
    epsilon = validate_epsilon(params.epsilon, minimum=MIN_EPSILON, maximum=MAX_EPSILON)
    fit_size, n2 = _fractions(domain, params)
    delta = validate_delta(params.delta, n_min=min(fit_size, n2))
    validate_alpha(params.alpha)
    mean_share = validate_alpha(params.mean_share, name="mean_share")
    trim = validate_finite_positive(params.trim, "trim")
    if trim < domain.min_propensity_clip:
        raise InvalidParameters(
            f"trim must be at least the dataset's minimum propensity clip "
            f"{domain.min_propensity_clip}"
        )
    if trim >= 0.5:
        raise InvalidParameters("trim must be below 0.5")
    if params.regularization is not None:
        validate_finite_positive(params.regularization, "regularization")
    default_lam = PAPER_REGULARIZATION if paper else 1.0 / math.sqrt(fit_size)
    lam = params.regularization or default_lam
    if paper and not epsilon < 1.0:
        raise InvalidParameters("the paper's classic Gaussian calibration needs epsilon < 1")

    # proof step 1: DP logistic regression on D_m at (epsilon, delta).
    propensity = dp_linear.DpLogistic.plan(fit_size, domain.q + 1, epsilon, delta, lam)
    # proof step 2: |h| <= B = (R / 2) / xi; sensitivities 2B / n2 and B^2 / n2 (+ float slack).
    bound = (domain.outcome_range / 2.0) / trim
    epsilon_theta, epsilon_v = split_share(epsilon, mean_share)
    delta_theta, delta_v = split_share(delta, mean_share)
    normalization = params.normalization
    if normalization not in NORMALIZATIONS:
        raise InvalidParameters(f"normalization must be one of {list(NORMALIZATIONS)}")
    if paper:
        normalization = "horvitz_thompson"
    # proof §7: Hajek statistics, 4-vector and 6-vector lattice Gaussians (units of C_y).
    hajek_sums = calibrate_gaussian(
        epsilon_theta, delta_theta, _slack(HAJEK_SUMS_SENSITIVITY_XI / (trim * n2), n2), dim=4
    )
    if normalization == "auto":
        small = hajek_sums.sigma <= HAJEK_AUTO_MAX_WEIGHT_NOISE
        normalization = "hajek" if small else "horvitz_thompson"
    if normalization == "hajek":
        mean = hajek_sums
        second = calibrate_gaussian(
            epsilon_v,
            delta_v,
            _slack(HAJEK_SECOND_SENSITIVITY_XI2 / (trim * trim * n2), n2),
            dim=6,
        )
        estimation_events = (
            gaussian_event(
                "hajek_arm_sums", HAJEK_SUMS_SENSITIVITY_XI / (trim * n2), mean, 1.0 / trim
            ),
            gaussian_event(
                "hajek_arm_second_moments",
                HAJEK_SECOND_SENSITIVITY_XI2 / (trim * trim * n2),
                second,
                1.0 / (trim * trim),
            ),
        )
    else:
        mean = calibrate_gaussian(epsilon_theta, delta_theta, _slack(2.0 * bound / n2, n2))
        second = calibrate_gaussian(epsilon_v, delta_v, _slack(bound * bound / n2, n2))
        estimation_events = (
            gaussian_event("mean_ipw_term", 2.0 * bound / n2, mean, bound),
            gaussian_event("second_moment_ipw_term", bound * bound / n2, second, bound),
        )
    events = (
        NoiseEvent(
            type="gaussian",
            module="propensity",
            epsilon=epsilon,
            delta=delta,
            params={
                "statistic": "dp_logistic_regression_weights",
                "sampler": "opendp discrete gaussian on 2^k lattice",
                "fit_size": fit_size,
                "regularization": lam,
                "intercept": dp_linear.INTERCEPT,
                "dim": propensity.calibration.dim,
                "sensitivity_l2": propensity.calibration.sensitivity_l2,
                "sensitivity_l2_effective": propensity.calibration.sensitivity_l2_effective,
                "sigma": propensity.calibration.sigma,
                "mu": propensity.calibration.mu,
            },
        ),
        *estimation_events,
    )
    # proof step 3: Theorem 6 over the two disjoint folds: max of (eps, delta) and (eps, delta).
    record = MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=Guarantee.PAPER if paper else Guarantee.STRICT,
        n=domain.n,
        fold_sizes={"propensity": fit_size, "estimation": n2},
        composition=Composition.THEOREM6_MAX,
        events=events,
        epsilon=epsilon,
        delta=delta,
    )
    return _Plan(params, fit_size, n2, bound, propensity, mean, second, record, normalization)


def plan(domain: PublicDomain, params: AteIpwParams) -> MechanismRecord:
    """Validate the strict request and compute its record (no data).

    Raises:
        InvalidParameters: invalid parameters.
    """
    return _make_plan(domain, params).record


def ipw_terms(
    a: NDArray[np.float64],
    y_centred: NDArray[np.float64],
    pi: NDArray[np.float64],
    *,
    bound: float,
) -> NDArray[np.float64]:
    """``h = a y / pi - (1 - a) y / (1 - pi)``, non-finite -> 0, clipped to [-B, B]."""
    with np.errstate(all="ignore"):
        h = a * y_centred / pi - (1.0 - a) * y_centred / (1.0 - pi)
    h = np.where(np.isfinite(h), h, 0.0)
    return np.asarray(np.clip(h, -bound, bound), dtype=np.float64)


def _public_parameters(state: _Plan, *, paper: bool = False) -> dict[str, Any]:
    params = state.params
    return {
        "mode": "paper" if paper else "strict",
        "guarantee": str(Guarantee.PAPER if paper else Guarantee.STRICT),
        "estimator": "ipw",
        "epsilon": state.record.epsilon,
        "delta": state.record.delta,
        "alpha": params.alpha,
        "trim": params.trim,
        "bound": state.bound,
        "fold_sizes": dict(state.record.fold_sizes),
        "mean_share": params.mean_share,
        "regularization": state.propensity.regularization,
        "normalization": state.normalization,
        "adjustment_columns": None
        if params.adjustment_columns is None
        else sorted(params.adjustment_columns),
        "estimand": "IPW functional at the DP propensity (biased if it is misspecified)",
    }


def _noise_sd(state: _Plan) -> float:
    """Public sd of the privacy noise in the estimate (Hajek: at unit weight sums, arm means 0)."""
    if state.normalization == "hajek":
        return state.bound * state.params.trim * state.mean.sigma * math.sqrt(2.0)
    return state.mean.sigma


def _second_scale(state: _Plan, domain: PublicDomain) -> float:
    """Public noise sd of the second moment(s), in outcome units squared."""
    if state.normalization == "hajek":
        half_range = domain.outcome_range / 2.0
        return half_range * half_range * state.second_moment.sigma
    return state.second_moment.sigma


def hajek_statistics(
    a: NDArray[np.float64], y_scaled: NDArray[np.float64], pi: NDArray[np.float64], *, trim: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per-arm Hajek sums / n2 (4-vector) and second moments / n2 (6-vector), exact-then-rounded.

    Rows: ``(a y/pi, a/pi, (1-a) y/(1-pi), (1-a)/(1-pi))`` and
    ``(a y^2/pi^2, a y/pi^2, a/pi^2, (1-a) y^2/(1-pi)^2, (1-a) y/(1-pi)^2, (1-a)/(1-pi)^2)``
    with ``y`` the outcome scaled to [-1, 1] by the public midpoint and half-range; every
    coordinate is clipped to its public box ([-1/xi, 1/xi] or [0, 1/xi]; squares with xi^2), so
    one row moves the 4-vector by at most sqrt(5)/(xi n2) and the 6-vector by sqrt(6)/(xi^2 n2)
    in L2 (proof §7). NEVER release without noise.
    """
    n2 = a.size
    y = np.clip(np.nan_to_num(y_scaled, nan=0.0), -1.0, 1.0)
    treated = a == 1.0
    arm_weight = np.where(treated, 1.0 / pi, 1.0 / (1.0 - pi))
    arm_weight = np.clip(np.nan_to_num(arm_weight, nan=0.0, posinf=0.0), 0.0, 1.0 / trim)
    top, top2 = 1.0 / trim, 1.0 / (trim * trim)
    rows = []
    for mask in (treated, ~treated):
        w = np.where(mask, arm_weight, 0.0)
        rows.append(np.clip(w * y, -top, top))
        rows.append(w)
    second = []
    for mask in (treated, ~treated):
        w2 = np.clip(np.where(mask, arm_weight * arm_weight, 0.0), 0.0, top2)
        second.append(np.clip(w2 * y * y, 0.0, top2))
        second.append(np.clip(w2 * y, -top2, top2))
        second.append(w2)
    sums = np.array([math.fsum(r) / n2 for r in rows], dtype=np.float64)
    moments = np.array([math.fsum(r) / n2 for r in second], dtype=np.float64)
    return sums, moments


def hajek_interval(
    sums_dp: NDArray[np.float64],
    moments_dp: NDArray[np.float64],
    *,
    sigma_sums: float,
    half_range: float,
    n2: int,
    alpha: float,
) -> dict[str, float]:
    """Post-processing of the DP Hajek statistics (proof §7): estimate, delta-method CI.

    Per arm ``m_a = clip(s_a / max(w_a, floor), -1, 1)``; estimate ``C_y (m_1 - m_0)``; the
    sandwich variance ``sum_a (q2_a - 2 m_a q1_a + m_a^2 q0_a)^+ / w_a^2`` and the privacy
    variance ``sigma^2 sum_a (1 + m_a^2) / w_a^2`` (gradient of s/w), both times C_y^2.
    """
    z = float(ndtri(1.0 - alpha / 2.0))
    means, weights, sandwich, privacy = [], [], 0.0, 0.0
    for arm in (0, 1):
        s_a, w_a = float(sums_dp[2 * arm]), max(float(sums_dp[2 * arm + 1]), HAJEK_WEIGHT_FLOOR)
        m_a = min(1.0, max(-1.0, s_a / w_a))
        q2, q1, q0 = (float(v) for v in moments_dp[3 * arm : 3 * arm + 3])
        sandwich += max(0.0, q2 - 2.0 * m_a * q1 + m_a * m_a * q0) / (w_a * w_a)
        privacy += sigma_sums * sigma_sums * (1.0 + m_a * m_a) / (w_a * w_a)
        means.append(m_a)
        weights.append(w_a)
    estimate = half_range * (means[0] - means[1])
    variance = half_range * half_range * sandwich
    noise_sd = half_range * math.sqrt(privacy)
    half_width = z * math.sqrt(variance / n2 + noise_sd * noise_sd)
    return {
        "estimate": estimate,
        "ci_lower": estimate - half_width,
        "ci_upper": estimate + half_width,
        "half_width": half_width,
        "variance_estimate": variance,
        "noise_sd": noise_sd,
    }


def _epsilon_for_target(
    domain: PublicDomain, params: AteIpwParams, z: float, target: float
) -> float | None:
    """Smallest epsilon whose expected half-width (``expected_half_width``) is <= target; None
    where none up to ``MAX_EPSILON`` reaches it (the assumed sampling error sets a floor).

    With a pinned normalization the half-width is non-increasing in epsilon (bisection). With
    ``"auto"`` it jumps up once, at the smallest epsilon ``e_s`` where Hajek is chosen, so the
    answer is the Horvitz-Thompson solution if it lies below ``e_s``, else the larger of the
    Hajek solution and ``e_s``.
    """

    def half_width(normalization: Normalization) -> Callable[[float], float]:
        def at(eps: float) -> float:
            pinned = replace(params, epsilon=eps, normalization=normalization)
            return expected_half_width(domain, _make_plan(domain, pinned), z)

        return at

    if params.normalization != "auto":
        return solve_epsilon(half_width(params.normalization), target)

    def weight_noise(eps: float) -> float:
        pinned = replace(params, epsilon=eps, normalization="hajek")
        return _make_plan(domain, pinned).mean.sigma

    switch = solve_epsilon(weight_noise, HAJEK_AUTO_MAX_WEIGHT_NOISE)
    horvitz = solve_epsilon(half_width("horvitz_thompson"), target)
    if horvitz is not None and (switch is None or horvitz < switch):
        return horvitz
    if switch is None:
        return None
    hajek = solve_epsilon(half_width("hajek"), target)
    if hajek is None:
        return None
    candidate = max(hajek, switch)
    return candidate if half_width("auto")(candidate) <= target else None


def assumed_arm_shares(domain: PublicDomain) -> tuple[float, float]:
    """Quote only: the treated and control shares assumed (the declared p, else 1/2)."""
    p = domain.treatment_probability if domain.treatment_probability is not None else 0.5
    return p, 1.0 - p


def expected_half_width(domain: PublicDomain, state: _Plan, z: float) -> float:
    """The quote's expected half-width at an assumed outcome scale (public inputs only).

    Assumed: the outcome sd ``s = assumed_pseudo_outcome_sd(domain)`` (R / 6, the strict
    quote's scale) in each arm, centred at the public midpoint, the propensity at the arm
    shares ``p_a`` (``assumed_arm_shares``) and the DP weight sums at 1. Then the IPW terms'
    variance is ``V = sum_a s^2 / p_a`` and the released interval's variance estimate is that
    plus the DP second moments' noise, floored at 0 as ``run`` does (Horvitz-Thompson: one
    second moment; Hajek: one per arm, each ``V_a = s^2 / p_a``). The half-width
    ``z sqrt(V_hat / n2 + noise_sd^2)`` is averaged over that noise by Gauss-Hermite quadrature.
    The noise-only figure is ``min_half_width``.
    """
    nodes, weights = standard_normal_quadrature()
    scale = assumed_pseudo_outcome_sd(domain)
    shares = assumed_arm_shares(domain)
    noise_sd = _noise_sd(state)
    if state.normalization == "hajek":
        half_range = domain.outcome_range / 2.0
        spread = state.second_moment.sigma * half_range * half_range  # outcome units squared
        arms = [np.maximum(0.0, scale * scale / share + spread * nodes) for share in shares]
        variance = arms[0][:, None] + arms[1][None, :]
        mass = weights[:, None] * weights[None, :]
    else:
        total = sum(scale * scale / share for share in shares)
        variance = np.maximum(0.0, total + state.second_moment.sigma * nodes)
        mass = weights
    widths = z * np.sqrt(variance / state.n2 + noise_sd * noise_sd)
    return float(np.sum(mass * widths))


def quote(
    domain: PublicDomain, params: AteIpwParams, *, target_half_width: float | None = None
) -> dict[str, Any]:
    """Public preview: the expected half-width at an assumed outcome scale
    (``expected_half_width``), the noise-only ``z s_theta`` (``min_half_width``); optionally
    the epsilon at which the expected half-width reaches a target."""
    state = _make_plan(domain, params)
    z = float(ndtri(1.0 - params.alpha / 2.0))
    out: dict[str, Any] = {
        **_public_parameters(state),
        "ci_level": 1.0 - params.alpha,
        "expected_half_width": expected_half_width(domain, state, z),
        "half_width_basis": "assumed_scale",
        "assumed_outcome_sd": assumed_pseudo_outcome_sd(domain),
        "min_half_width": z * _noise_sd(state),
        "s_theta": _noise_sd(state),
        "s_2": _second_scale(state, domain),
        "n2": state.n2,
    }
    if target_half_width is not None:
        target = validate_finite_positive(target_half_width, "target_half_width")
        out["target_half_width"] = target
        out["epsilon_for_target_half_width"] = _epsilon_for_target(domain, params, z, target)
    return out


def run(
    arrays: Arrays,
    domain: PublicDomain,
    params: AteIpwParams,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    """Strict end-to-end private IPW release (after the charge).

    Returns:
        ``estimate``, ``ci_lower``, ``ci_upper``, ``ci_level``, ``half_width``,
        ``variance_estimate``, ``s_theta``, ``s_2``, ``n2`` and public parameters.

    Raises:
        InvalidParameters: before data access.
        ReleaseFailed: any failure after data access (generic).
    """
    state = _make_plan(domain, params)
    arrays, domain = project(arrays, domain, _columns(domain, params))  # public, row-wise
    try:
        return _run(arrays, domain, state, rng=rng, noise=noise, progress=progress)
    except Exception:
        raise ReleaseFailed() from None


def _propensity_on_estimation_fold(
    arrays: Arrays,
    domain: PublicDomain,
    state: _Plan,
    rng: np.random.Generator,
    noise: NoiseSampler,
    *,
    paper: bool,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    x, a, y = prepare_arrays(arrays, domain)
    # proof step 4: data-independent permutation cut at the public sizes.
    permutation = rng.permutation(domain.n)
    fit, estimation = permutation[: state.fit_size], permutation[state.fit_size :]
    del permutation
    z_fit = dp_linear.unit_ball_features(x[fit], domain.x_lower, domain.x_upper)
    if paper:
        # Lee et al. Definition 2: the classic multiplier, sensitivity 2 / (m lam) (+ g_tol).
        sigma = (
            classic_gaussian_multiplier(state.params.epsilon, state.params.delta)
            * state.propensity.sensitivity_l2
        )
        w = dp_linear.fit_logistic(z_fit, a[fit], regularization=state.propensity.regularization)
        w_tilde = noise.gaussian(w, sigma=sigma, sensitivity_l2=state.propensity.sensitivity_l2)
    else:
        w_tilde = state.propensity.release(z_fit, a[fit], noise)
    z2 = dp_linear.unit_ball_features(x[estimation], domain.x_lower, domain.x_upper)
    trim = state.params.trim
    pi = np.clip(np.nan_to_num(dp_linear.predict_propensity(w_tilde, z2), nan=0.5), trim, 1 - trim)
    return a[estimation], y[estimation], pi


def _run(
    arrays: Arrays,
    domain: PublicDomain,
    state: _Plan,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    a2, y2, pi = _propensity_on_estimation_fold(arrays, domain, state, rng, noise, paper=False)
    progress(0.5, "propensity")
    midpoint = (domain.y_lower + domain.y_upper) / 2.0
    if state.normalization == "hajek":
        return _run_hajek(a2, y2, pi, domain, state, noise, progress)
    h = ipw_terms(a2, y2 - midpoint, pi, bound=state.bound)
    del a2, y2, pi
    theta_hat, m2_hat = d2_statistics(h, bound=state.bound)
    del h
    # proof step 5: two lattice Gaussian releases with public sigma.
    theta_dp = float(release_gaussian(np.array([theta_hat]), state.mean, noise)[0])
    m2_dp = float(release_gaussian(np.array([m2_hat]), state.second_moment, noise)[0])
    del theta_hat, m2_hat
    # proof step 6: post-processing (private_propensity.md §6 step 6).
    interval = confidence_interval(
        theta_dp,
        m2_dp,
        s_theta=state.mean.sigma,
        s_2=state.second_moment.sigma,
        n2=state.n2,
        alpha=state.params.alpha,
    )
    progress(1.0, "done")
    return {
        "estimate": theta_dp,
        "ci_lower": interval["ci_lower"],
        "ci_upper": interval["ci_upper"],
        "ci_level": 1.0 - state.params.alpha,
        "half_width": interval["half_width"],
        "variance_estimate": interval["variance_estimate"],
        "s_theta": state.mean.sigma,
        "s_2": state.second_moment.sigma,
        "n2": state.n2,
        **_public_parameters(state),
    }


def _run_hajek(
    a2: NDArray[np.float64],
    y2: NDArray[np.float64],
    pi: NDArray[np.float64],
    domain: PublicDomain,
    state: _Plan,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    """proof §7: DP per-arm sums and second moments, then the Hajek ratio and its CI."""
    midpoint = (domain.y_lower + domain.y_upper) / 2.0
    half_range = domain.outcome_range / 2.0
    sums, moments = hajek_statistics(a2, (y2 - midpoint) / half_range, pi, trim=state.params.trim)
    del a2, y2, pi
    sums_dp = release_gaussian(sums, state.mean, noise)
    moments_dp = release_gaussian(moments, state.second_moment, noise)
    del sums, moments
    interval = hajek_interval(
        sums_dp,
        moments_dp,
        sigma_sums=state.mean.sigma,
        half_range=half_range,
        n2=state.n2,
        alpha=state.params.alpha,
    )
    progress(1.0, "done")
    return {
        "estimate": interval["estimate"],
        "ci_lower": interval["ci_lower"],
        "ci_upper": interval["ci_upper"],
        "ci_level": 1.0 - state.params.alpha,
        "half_width": interval["half_width"],
        "variance_estimate": interval["variance_estimate"],
        "s_theta": interval["noise_sd"],
        "s_2": _second_scale(state, domain),
        "n2": state.n2,
        **_public_parameters(state),
    }


def run_paper(
    arrays: Arrays,
    domain: PublicDomain,
    params: AteIpwParams,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
) -> dict[str, Any]:
    """Lee et al.'s release (benchmark harness only; NOT DP for the estimation fold).

    DP logistic weights on D_m with the paper's classic calibration (epsilon < 1, lambda 0.1
    by default, the service's public unit-ball features with an intercept), then the trimmed
    Horvitz–Thompson IPTW on D_n in the clear (uncentred outcome, eq. 5 with trimming), with
    a non-private normal CI conditional on ``w_tilde``. Labelled ``paper``.
    """
    state = _make_plan(domain, params, paper=True)
    arrays, domain = project(arrays, domain, _columns(domain, params))
    a2, y2, pi = _propensity_on_estimation_fold(arrays, domain, state, rng, noise, paper=True)
    terms = a2 * y2 / pi - (1.0 - a2) * y2 / (1.0 - pi)
    estimate = float(np.mean(terms))
    half_width = (
        float(ndtri(1.0 - params.alpha / 2.0)) * float(np.std(terms)) / math.sqrt(terms.size)
    )
    return {
        "estimate": estimate,
        "ci_lower": estimate - half_width,
        "ci_upper": estimate + half_width,
        "ci_level": 1.0 - params.alpha,
        "half_width": half_width,
        **_public_parameters(state, paper=True),
        "note": "DP for the fit fold only; the estimation fold is used in the clear",
    }
