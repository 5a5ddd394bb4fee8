"""Public accuracy previews of the strict ATE (no data, no charge): the expected CI half-width
and the epsilon needed for a target half-width.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtr, ndtri

from service.mechanisms.ate_strict.calibration import (
    ADAPTIVE_CLIP_LEVEL,
    Plan,
    adaptive_calibrations,
    adaptive_clip_bound,
    adaptive_clip_candidates,
    adaptive_clip_inflation,
    make_plan,
    public_parameters,
)
from service.mechanisms.ate_strict.rules import (
    DEFAULT_FOLDS_OBSERVATIONAL,
    DEFAULT_FOLDS_OBSERVATIONAL_DP_LINEAR,
    DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON,
    MAX_EPSILON,
    MIN_EPSILON,
    AteStrictParams,
    resolved_shares,
    small_folds_fit,
    split_share,
)
from service.mechanisms.calibration import (
    round_up_significant,
    validate_finite_positive,
)
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.noise import (
    calibrate_gaussian,
    quantile_scale,
)

# Quote only: the pseudo-outcome sd assumed for the expected half-width is R / this (public).
ADAPTIVE_QUOTE_RANGE_RATIO = 6.0
# Quote only, nuisance "none": the outcome model is the midpoint m of the declared bounds, so the
# pseudo-outcome is A (Y - m) / e - (1 - A) (Y - m) / (1 - e), whose sd is about
# rms(Y - m) sqrt(1 / p + 1 / (1 - p)). rms(Y - m) is assumed R / this: a skewed outcome with
# honest bounds sits near one end of them (R / rms(Y - m) was 2.9-3.5 on the realistic studies
# and 3.4 on a walkthrough's trial, where R / 6 had quoted 1.37 for a 2.22 half-width).
MIDPOINT_QUOTE_RANGE_RATIO = 3.0


# Quote only: the outcome sd assumed where the quote needs sd(Y) itself (a difference in means),
# R / this; a declared binary outcome's sd is at most R / 2 (its largest, at a risk of 1/2).
OUTCOME_QUOTE_RANGE_RATIO = 12.0
BINARY_OUTCOME_QUOTE_RANGE_RATIO = 2.0


def assumed_outcome_sd(domain: PublicDomain) -> float:
    """Quote only: the public assumption sd(Y) = R / 12 (honest bounds about 12 outcome sds
    wide), or R / 2 for a declared binary outcome (the most a 0/1 variable's sd can be)."""
    ratio = BINARY_OUTCOME_QUOTE_RANGE_RATIO if domain.y_binary else OUTCOME_QUOTE_RANGE_RATIO
    return domain.outcome_range / ratio


def _arm_spread(domain: PublicDomain) -> float:
    """sqrt(1 / p + 1 / (1 - p)), p the declared assignment probability (observational: 0.5,
    the least such factor)."""
    p = domain.treatment_probability
    if domain.design != StudyDesign.RCT or p is None:
        p = 0.5
    return math.sqrt(1.0 / p + 1.0 / (1.0 - p))


def assumed_pseudo_outcome_sd(domain: PublicDomain, nuisance: str | None = None) -> float:
    """Quote only: the public scale assumption R / ``ADAPTIVE_QUOTE_RANGE_RATIO``; with nuisance
    ``"none"`` (no outcome model: the bounds' midpoint) R / ``MIDPOINT_QUOTE_RANGE_RATIO`` times
    sqrt(1 / p + 1 / (1 - p)), p the declared assignment probability (observational: 0.5, the
    least such factor). A declared binary outcome: R / 2 times that factor with either nuisance
    (|Y - 1/2| is exactly R / 2, and a fitted model's residual sd is at most it), about twice
    its sd where R / 6 would be a third of it (a walkthrough's trial: 0.91 against 0.167)."""
    if domain.y_binary:
        return assumed_outcome_sd(domain) * _arm_spread(domain)
    if nuisance == "none":
        return domain.outcome_range / MIDPOINT_QUOTE_RANGE_RATIO * _arm_spread(domain)
    return domain.outcome_range / ADAPTIVE_QUOTE_RANGE_RATIO


# Gauss-Hermite nodes over a DP second moment's noise (the quotes of this module and ate_ipw).
_QUOTE_NODES = 40


def standard_normal_quadrature() -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Nodes and weights (summing to 1) of the quotes' Gauss-Hermite rule for E f(Z), Z ~ N(0, 1):
    the mean released half-width over the noise of a DP second moment. Quote only."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(_QUOTE_NODES)
    return nodes, weights / weights.sum()


def expected_declared_half_width(
    domain: PublicDomain, state: Plan, z: float, *, sigmas: tuple[float, float] | None = None
) -> float:
    """The quote's expected half-width with a public clip (the declared B or a given K): the
    pseudo-outcomes' sd assumed ``assumed_pseudo_outcome_sd`` (R / 6, as the adaptive quote),
    the released variance estimate ``max(0, m2_DP - theta_DP^2 + s_theta^2)`` (plus
    ``z_{1 - alpha_v} s_2`` with ``variance_inflation``) spread by the second moment's noise
    ``s_2``, and the half-width ``z sqrt(V / n2 + s_theta^2)`` averaged over that noise by
    Gauss-Hermite quadrature. Public inputs only; the noise-only ``z s_theta`` is
    ``min_half_width``. ``sigmas`` = (s_theta, s_2) at another epsilon (the inverse's search);
    by default the plan's."""
    nodes, weights = standard_normal_quadrature()
    sd = assumed_pseudo_outcome_sd(domain, state.nuisance)
    s_theta, s_2 = sigmas or (state.mean.sigma, state.second_moment.sigma)
    variance = np.maximum(0.0, sd * sd + s_theta * s_theta + s_2 * nodes)
    if state.params.variance_inflation:
        variance = variance + float(ndtri(1.0 - state.params.alpha_v)) * s_2
    widths = z * np.sqrt(variance / state.n2 + s_theta * s_theta)
    return float(weights @ widths)


# Points of the grid on which the quantile's law is integrated (quote only).
_LAW_GRID = 2001
# The grid spans this many noise scales above the best utility (exp(-40): negligible mass).
_LAW_SPAN = 40.0


def assumed_clip(domain: PublicDomain, state: Plan) -> float:
    """The clip K at the assumed scale without the quantile's noise: kappa(n2) times the
    0.9-quantile of |N(0, sd^2)| (the value the noise scatters around)."""
    sd = assumed_pseudo_outcome_sd(domain, state.nuisance)
    quantile = float(ndtri(0.5 + ADAPTIVE_CLIP_LEVEL / 2.0)) * sd
    return adaptive_clip_bound(quantile, state.bound, state.n2)


def quantile_law(
    fractions_below: NDArray[np.float64], level: float, n: int, epsilon: float
) -> NDArray[np.float64]:
    """The exact law of the candidate OpenDP's ``make_private_quantile`` releases (quote only).

    OpenDP 0.16 releases the candidate maximising ``-|L(c) - level n| + E_c`` with independent
    exponential noise ``E_c`` of scale ``quantile_scale(epsilon)`` (report-noisy-max, the
    permute-and-flip law), where ``L(c)`` is the number of values below ``c``. Given the
    expected counts ``L(c) = n * fractions_below(c)`` the probability that candidate i wins is
    ``int f_i(t) prod_{j != i} F_j(t) dt``, integrated here on a fixed grid. Public inputs only.
    """
    all_utility = -np.abs(np.asarray(fractions_below, dtype=np.float64) * n - level * n)
    scale = quantile_scale(epsilon)
    top = float(all_utility.max())
    # a candidate more than _LAW_SPAN scales below the best wins with probability < e^-40
    near = all_utility >= top - _LAW_SPAN * scale
    utility = all_utility[near]
    grid = np.linspace(top, top + _LAW_SPAN * scale, _LAW_GRID)
    gap = (grid[None, :] - utility[:, None]) / scale  # >= 0: the grid starts at the best
    cdf = -np.expm1(-gap)  # F_j(t)
    density = np.exp(-gap) / scale  # f_j(t)
    # prod_{j != i} F_j(t) as prefix times suffix products (no division by an F_i of 0)
    ones = np.ones((1, grid.size), dtype=np.float64)
    prefix = np.cumprod(np.vstack([ones, cdf[:-1]]), axis=0)
    suffix = np.cumprod(np.vstack([ones, cdf[:0:-1]]), axis=0)[::-1]
    others = prefix * suffix
    weights = np.trapezoid(density * others, grid, axis=1)
    law = np.zeros(all_utility.size, dtype=np.float64)
    law[near] = np.maximum(weights, 0.0)
    return np.asarray(law / law.sum(), dtype=np.float64)


def expected_adaptive_half_width(domain: PublicDomain, state: Plan, z: float) -> dict[str, float]:
    """The quote's expected half-width with the adaptive clip: the pseudo-outcomes' |Gamma|
    assumed half-normal with sd ``assumed_pseudo_outcome_sd``; the DP quantile's exact law
    (``quantile_law``) at the expected counts gives the law of the clip ``K = min(B, kappa Q)``,
    and the half-width ``z sqrt(sd^2 / n2 + s_theta(K)^2)`` is averaged over it (``s_theta``
    proportional to K). Public inputs only."""
    if state.quantile_epsilon is None:
        raise ValueError("no adaptive clip in this plan")
    sd = assumed_pseudo_outcome_sd(domain, state.nuisance)
    candidates = adaptive_clip_candidates(state.bound)
    law = quantile_law(
        2.0 * ndtr(candidates / sd) - 1.0, ADAPTIVE_CLIP_LEVEL, state.n2, state.quantile_epsilon
    )
    clips = np.minimum(state.bound, adaptive_clip_inflation(state.n2) * candidates)
    sigmas = state.mean.sigma * clips / state.bound
    widths = z * np.sqrt(sd * sd / state.n2 + sigmas * sigmas)
    return {
        "half_width": float(law @ widths),
        "clip": float(law @ clips),
        "s_theta": float(math.sqrt(law @ (sigmas * sigmas))),
    }


def quote(
    domain: PublicDomain, params: AteStrictParams, *, target_half_width: float | None = None
) -> dict[str, Any]:
    """Public accuracy preview (ate_ci.md §3.6): no data, no charge.

    The CI half-width is at least ``z_{1 - alpha/2} s_theta`` (``min_half_width``); the
    ``expected_half_width`` adds the sampling error at the assumed pseudo-outcome scale R / 6
    (``expected_declared_half_width``, or ``expected_adaptive_half_width`` with the adaptive
    clip). With ``target_half_width``, also returns the smallest epsilon (other parameters
    fixed) whose expected half-width is at most the target, or None if no epsilon up to
    ``MAX_EPSILON`` reaches it.

    Raises:
        InvalidParameters: invalid parameters.
    """
    state = make_plan(domain, params)
    z = float(ndtri(1.0 - state.params.alpha / 2.0))
    out: dict[str, Any] = {
        **public_parameters(state),
        "ci_level": 1.0 - state.params.alpha,
        "min_half_width": z * state.mean.sigma,
        "expected_half_width": expected_declared_half_width(domain, state, z),
        "half_width_basis": "assumed_scale",
        "assumed_pseudo_outcome_sd": assumed_pseudo_outcome_sd(domain, state.nuisance),
        "s_theta": state.mean.sigma,
        "s_2": state.second_moment.sigma,
        "n2": state.n2,
    }
    if state.quantile_epsilon is not None:
        # proof §13: the noise follows the released clip K; the quote assumes a public scale.
        smallest = adaptive_clip_bound(
            float(adaptive_clip_candidates(state.bound)[0]), state.bound, state.n2
        )
        expected = expected_adaptive_half_width(domain, state, z)
        _, expected_second = adaptive_calibrations(state, expected["clip"])
        out.update(
            {
                "min_half_width": z * adaptive_calibrations(state, smallest)[0].sigma,
                "max_noise_half_width": z * state.mean.sigma,
                "expected_half_width": expected["half_width"],
                "expected_clip": expected["clip"],
                "s_theta": expected["s_theta"],
                "s_2": expected_second.sigma,
            }
        )
    if target_half_width is not None:
        out["target_half_width"] = target_half_width
        out["epsilon_for_target_half_width"] = epsilon_for_half_width(
            domain, params, target_half_width
        )
    return out


def epsilon_for_half_width(
    domain: PublicDomain, params: AteStrictParams, half_width: float
) -> float | None:
    """Smallest epsilon (rounded up) whose quoted ``expected_half_width`` is <= half_width.

    Bisection on the public formula, all other parameters (delta, given folds) fixed; the plan
    is re-made at each epsilon, so the public rules that depend on it (shares) are re-resolved
    exactly as the release would.

    Returns:
        epsilon in [MIN_EPSILON, MAX_EPSILON], or None if unreachable at MAX_EPSILON.

    Raises:
        InvalidParameters: invalid parameters or half-width.
    """
    target = validate_finite_positive(half_width, "target_half_width")
    make_plan(domain, params)  # validate the request as given
    if (
        params.nuisance == "dp_linear"
        and not params.cross_fit
        and params.fold_fractions is None
        and domain.design == StudyDesign.OBSERVATIONAL
        and small_folds_fit(domain.n)
    ):
        # The default folds switch from (0.2, 0.2, 0.6) to (0.25, 0.25, 0.5) above
        # n eps = DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON, where the half-width jumps up: solve with
        # each fold set pinned; the small folds' answer counts only below the switch.
        switch = DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON / domain.n
        small = _epsilon_for_half_width_pinned(
            domain, replace(params, fold_fractions=DEFAULT_FOLDS_OBSERVATIONAL_DP_LINEAR), target
        )
        if small is not None and small <= switch:
            return small
        return _epsilon_for_half_width_pinned(
            domain, replace(params, fold_fractions=DEFAULT_FOLDS_OBSERVATIONAL), target
        )
    return _epsilon_for_half_width_pinned(domain, params, target)


def _epsilon_for_half_width_pinned(
    domain: PublicDomain, params: AteStrictParams, target: float
) -> float | None:
    base = make_plan(domain, params)
    z = float(ndtri(1.0 - base.params.alpha / 2.0))
    delta = base.record.delta
    adaptive = base.quantile_epsilon is not None

    def reaches(epsilon: float) -> bool:
        if adaptive:
            # the same expected half-width as the quote: the whole plan at this total epsilon
            state = make_plan(domain, replace(params, epsilon=epsilon))
            return expected_adaptive_half_width(domain, state, z)["half_width"] <= target
        # the shares may depend on epsilon (public cross-fitting rule): re-resolve them and
        # split epsilon and delta exactly as make_plan does (the nuisance fits do not change
        # the half-width, so they are not re-planned).
        nuisance_share, share = resolved_shares(domain, epsilon, delta, base.bound, base.params)
        delta_stat = delta
        if nuisance_share is not None:
            _, epsilon = split_share(epsilon, nuisance_share)
            _, delta_stat = split_share(delta, nuisance_share)
        epsilon_theta, epsilon_v = split_share(epsilon, share)
        delta_theta, delta_v = split_share(delta_stat, share)
        s_theta = calibrate_gaussian(epsilon_theta, delta_theta, base.mean.sensitivity_l2).sigma
        s_2 = calibrate_gaussian(epsilon_v, delta_v, base.second_moment.sensitivity_l2).sigma
        width = expected_declared_half_width(domain, base, z, sigmas=(s_theta, s_2))
        return width <= target

    if not reaches(MAX_EPSILON):
        return None
    if reaches(MIN_EPSILON):
        return MIN_EPSILON
    lower, upper = MIN_EPSILON, MAX_EPSILON
    for _ in range(200):
        if upper - lower <= 1e-12 * upper:
            break
        middle = math.sqrt(lower * upper)
        if reaches(middle):
            upper = middle
        else:
            lower = middle
    rounded = min(round_up_significant(upper, 10), MAX_EPSILON)
    return rounded if reaches(rounded) else upper
