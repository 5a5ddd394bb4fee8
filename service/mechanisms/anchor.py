"""Anchoring a CATE release at a DP ATE, and shrinking it towards that ATE (pure numerics).

A CATE whose privacy noise exceeds the heterogeneity it estimates is worse than the constant
ATE. The strict CATE kinds therefore spend a public share of their budget on a DP ATE, the
*anchor*, fit the CATE to targets centred at it (so regularisation shrinks towards the ATE, not
towards zero: a row-wise map with a DP constant, adaptive sequential composition) and release
``anchor + lambda * deviation``. This module holds:

1. the effect-fold anchor (``plan_anchor`` / ``draw_anchor``, ``anchor_pseudo_outcomes``), used
   by ``ebm_cate`` on observational designs (docs/proofs/ebm_cate.md step 6.1): a DP ATE of its
   effect fold at ``ebm_cate``'s share (``ANCHOR_SHARE`` or ``ANCHOR_SHARE_NOISY``) of that
   fold's budget; a pure-DP quantile of the anchor pseudo-outcomes sets the clip K, then a
   lattice Gaussian mean calibrated at 2K / n2, as in ``ate_strict``'s adaptive clipping (proof
   §13 there).
2. the whole-data anchor (``AteAnchorPlan``, ``plan_ate_anchor`` / ``draw_ate_anchor``): the
   strict ``ate`` kind's single-release default (``chunks: 1``) on all n rows at the public share
   ``ate_anchor_share`` of (epsilon, delta) (on a trial below ``ate_rct.DEFAULT_BELOW_N_EPSILON``
   the DP difference in means, pure epsilon), composed sequentially with the CATE's own folds; used
   by ``cate_vector`` and ``cate_function`` (docs/proofs/cate_vector.md step 7,
   docs/proofs/cate_function.md §7, where the share rule is stated) and by ``ebm_cate`` in
   randomised designs (its step 6.1).
3. ``james_stein_factor``: the factor lambda, computed from DP outputs and public noise
   covariances only (post-processing): lambda = 0 unless the released deviations' spread
   exceeds the 0.99 quantile of what the noise alone would give (cate_vector, cate_function,
   uplift_table; ebm_cate calibrates its own factor).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri
from scipy.stats import chi2

from service.mechanisms import ate_rct, ate_strict
from service.mechanisms.ate_strict import pseudo_outcomes
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import NoiseSampler, release_gaussian
from service.mechanisms.records import ANCHOR_PREFIX, MechanismRecord, NoiseEvent

# The anchor's share of the estimation budget (a public constant of each kind's rule), the
# share of the anchor's epsilon spent on the quantile that sets its clip (more than ate_strict's
# 0.1: the anchor is the whole answer where the CATE is noisy), and the propensity clip of the
# R learner's anchor pseudo-outcome (a CATE's clip of 0.05 would make the bound R / 0.05).
ANCHOR_SHARE = 0.2
# ... or ANCHOR_SHARE_NOISY where the CATE's own noise at ANCHOR_SHARE is at least half the
# default heterogeneity R_Y / 24 (the release will then mostly be the anchor: give it the budget)
ANCHOR_SHARE_NOISY = 0.8
ANCHOR_QUANTILE_SHARE = 0.25
ANCHOR_PROPENSITY_CLIP = 0.1
JAMES_STEIN_LEVEL = 0.99  # pure noise keeps lambda = 0 with probability about 0.99


@dataclass(frozen=True)
class AnchorPlan:
    """The anchor ATE of the estimation fold: a DP quantile sets the clip K of the anchor
    pseudo-outcomes (bound ``bound``), then a Gaussian mean at (epsilon, delta)."""

    bound: float
    quantile_epsilon: float
    epsilon: float
    delta: float
    propensity_clip: float = 0.0  # R learner: pi clipped to [c_a, 1 - c_a] for Gamma_R


def plan_anchor(
    learner: str,
    epsilon_anchor: float,
    delta_anchor: float,
    *,
    outcome_range: float,
    propensity_clip: float,
    dr_bound: float,
    n2: int,
) -> tuple[AnchorPlan, list[NoiseEvent]]:
    """The anchor's public plan and its two ledger events (quantile, then the mean).

    R: pi clipped to [c_a, 1 - c_a], c_a = max(c, ANCHOR_PROPENSITY_CLIP) (c itself in an RCT
    with c = 0.5), so ``|Gamma_R| = |a - pi||y - m| / (pi (1 - pi)) <= R / c_a``; DR: the
    AIPW pseudo-outcome's public bound ``dr_bound``.
    """
    epsilon_q, epsilon_mean = ate_strict.split_share(epsilon_anchor, ANCHOR_QUANTILE_SHARE)
    anchor_clip = (
        max(propensity_clip, ANCHOR_PROPENSITY_CLIP) if propensity_clip < 0.5 else propensity_clip
    )
    bound = outcome_range / anchor_clip if learner == "r" else dr_bound
    plan = AnchorPlan(bound, epsilon_q, epsilon_mean, delta_anchor, propensity_clip=anchor_clip)
    worst = ate_strict.mean_calibration(epsilon_mean, delta_anchor, bound, n2)
    events = [
        ate_strict.quantile_event(
            epsilon_q, bound, n2, ("share_of_anchor_epsilon", ANCHOR_QUANTILE_SHARE)
        ),
        ate_strict.adaptive_gaussian_event("anchor_ate_mean", "2 K / n2", worst, bound),
    ]
    return plan, events


def anchor_pseudo_outcomes(
    learner: str,
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    pi_hat: NDArray[np.float64],
    mu0: NDArray[np.float64],
    mu1: NDArray[np.float64],
    bound: float,
) -> NDArray[np.float64]:
    """Row-wise pseudo-outcomes of the anchor ATE, in [-bound, bound].

    R: ``(a - pi)(y - m) / (pi (1 - pi))`` (its conditional mean is tau(x) when pi is right;
    ``|.| <= R / c``); DR: the AIPW pseudo-outcome clipped to the public K.
    """
    if learner == "dr":
        return pseudo_outcomes(a, y, pi_hat, mu0, mu1, bound=bound)
    m = pi_hat * mu1 + (1.0 - pi_hat) * mu0
    with np.errstate(all="ignore"):
        gamma = (a - pi_hat) * (y - m) / (pi_hat * (1.0 - pi_hat))
    gamma = np.where(np.isfinite(gamma), gamma, 0.0)
    return np.asarray(np.clip(gamma, -bound, bound), dtype=np.float64)


def draw_anchor(
    gamma: NDArray[np.float64], anchor: AnchorPlan, cate_bound: float, noise: NoiseSampler
) -> float:
    """The DP anchor ATE: an epsilon_q-DP quantile of |Gamma| sets K, then the mean of Gamma
    clipped to K plus a lattice Gaussian calibrated at 2K / n2; clipped to the public CATE
    range [-cate_bound, cate_bound] (post-processing)."""
    clip = ate_strict.adaptive_clip(gamma, anchor.bound, anchor.quantile_epsilon, noise)
    mean, _ = ate_strict.d2_statistics(gamma, bound=clip)
    calibration = ate_strict.mean_calibration(anchor.epsilon, anchor.delta, clip, gamma.size)
    value = float(release_gaussian(np.array([mean]), calibration, noise)[0])
    return float(np.clip(value, -cate_bound, cate_bound))


def james_stein_factor(
    deviations: NDArray[np.float64],
    noise_trace: float,
    noise_trace_squared: float,
    prior_sd: float,
) -> float:
    """The factor lambda of ``anchor + lambda * deviation`` (post-processing).

    ``noise_trace`` and ``noise_trace_squared`` are ``tr(Sigma)`` and ``tr(Sigma^2)`` of the
    deviations' public noise covariance. With at least 3 points, a positive-part James–Stein
    factor that keeps only the spread the noise cannot explain:
    ``max(0, 1 - t / sum(dev^2))`` with ``t`` the 0.99 quantile of ``sum(dev^2)`` under pure
    noise in Satterthwaite's approximation (``tr Sigma / k`` times a chi-square with
    ``k = (tr Sigma)^2 / tr(Sigma^2)`` degrees of freedom: correlated points have fewer
    effective dimensions and a heavier tail). So the release falls back to the anchor unless
    heterogeneity is detectable. With fewer points, ``prior^2 / (prior^2 + tr Sigma / d)``.
    """
    d = int(deviations.size)
    if d >= 3:
        spread = float(np.sum(deviations * deviations))
        if spread <= 0.0 or noise_trace <= 0.0:
            return 0.0
        dof = noise_trace * noise_trace / noise_trace_squared
        threshold = noise_trace / dof * float(chi2.ppf(JAMES_STEIN_LEVEL, dof))
        return max(0.0, 1.0 - threshold / spread)
    noise = noise_trace / max(d, 1)
    return prior_sd * prior_sd / (prior_sd * prior_sd + noise)


def heterogeneity_factor(estimates: NDArray[np.float64], variances: NDArray[np.float64]) -> float:
    """The factor lambda for independent estimates with variances ``v_k`` under no
    heterogeneity (post-processing of DP outputs): Cochran's Q, ``sum (u_k - c)^2 / v_k`` about
    the precision-weighted centre ``c``, a chi-square with ``k - 1`` degrees of freedom when
    every estimate has the same mean, and ``max(0, 1 - t / Q)`` with ``t`` its
    ``JAMES_STEIN_LEVEL`` quantile: pure noise keeps lambda = 0 with probability about 0.99.
    Each estimate is weighed by its own precision, so one noisy estimate (a near-empty cell)
    cannot hide a clear difference between the others, as it does in the unweighted spread of
    ``james_stein_factor`` (whose Satterthwaite degrees of freedom it drives to about 2: an
    observational walkthrough's 6-cell table, two cells of about 1 000 patients 3.5 apart at
    noise sd 0.65, was released flat beside a cell of 78 patients)."""
    u = np.asarray(estimates, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)
    if u.size < 2 or not (np.all(np.isfinite(v)) and np.all(v > 0.0)):
        return 0.0
    precision = 1.0 / v
    centre = float(np.dot(precision, u) / precision.sum())
    q = float(np.sum(precision * (u - centre) ** 2))
    if not (math.isfinite(q) and q > 0.0):
        return 0.0
    threshold = float(chi2.ppf(JAMES_STEIN_LEVEL, u.size - 1))
    return max(0.0, 1.0 - threshold / q)


# ---- the whole-data anchor: the strict ``ate`` default on all n rows ---------------------------


AnchorParams = ate_strict.AteStrictParams | ate_rct.AteRctParams


@dataclass(frozen=True)
class AteAnchorPlan:
    """A whole-data anchor (docs/proofs/cate_function.md §7): the strict ``ate`` kind's default
    release (``ate_anchor_params``: ``ate_strict.default_params``, or on a trial below
    ``ate_rct.DEFAULT_BELOW_N_EPSILON`` the DP difference in means) at ``(epsilon, delta)`` on
    all n rows, run before the CATE's own folds and composed sequentially with them. Its
    estimate is as good as an ``ate`` release at that budget: the estimation-fold anchor above
    reads one fold at a share of the fold's budget with the CATE's own nuisances, and was
    1.5-14x worse than the constant DP ATE on the realistic studies where the CATE is mostly its
    anchor (bench/README.md)."""

    params: AnchorParams
    record: MechanismRecord
    n2: int  # the rows the anchor's DP mean averages (public)

    @property
    def epsilon(self) -> float:
        return self.record.epsilon

    @property
    def delta(self) -> float:
        return self.record.delta

    def events(self) -> list[NoiseEvent]:
        """The anchor's events for the CATE's record: modules prefixed ``anchor/``, each naming
        the anchor release's own composition rule."""
        return [
            replace(
                event,
                module=ANCHOR_PREFIX + event.module,
                params={**event.params, "anchor_composition": str(self.record.composition)},
            )
            for event in self.record.events
        ]

    def fold_sizes(self) -> dict[str, int]:
        return {ANCHOR_PREFIX + name: size for name, size in self.record.fold_sizes.items()}

    def compose(
        self,
        events: list[NoiseEvent],
        fold_sizes: dict[str, int],
        rest: tuple[float, float],
        requested: tuple[float, float],
    ) -> tuple[list[NoiseEvent], dict[str, int]]:
        """The CATE's record parts with the anchor first (composition
        ``anchor_then_theorem6_max``): its events and folds prefixed ``anchor/`` before the
        CATE's own. The anchor's cost plus the rest's (``rest``: the CATE's own modules' cost)
        must be the requested (epsilon, delta) exactly (sequential composition of exact
        splits); anything else is refused before any charge."""
        if (self.epsilon + rest[0], self.delta + rest[1]) != requested:
            raise InvalidParameters("internal budget accounting mismatch")
        return [*self.events(), *events], {**self.fold_sizes(), **fold_sizes}

    def public(self) -> dict[str, object]:
        """Public description (for the release's parameters)."""
        params = self.params
        if isinstance(params, ate_rct.AteRctParams):
            return {
                "kind": "ate",
                "mechanism": self.record.mechanism,
                "estimator": "rct_difference",
                "nuisance": "none",
                "epsilon": self.epsilon,
                "delta": self.delta,
            }
        return {
            "kind": "ate",
            "mechanism": self.record.mechanism,
            "estimator": "aipw",
            "nuisance": params.nuisance,
            "cross_fit": params.cross_fit,
            "clip": "adaptive" if params.adaptive_clip else "declared",
            "mean_share": params.mean_share,
            "epsilon": self.epsilon,
            "delta": self.delta,
        }


# The whole-data anchor's public share rule (``ate_anchor_share``): the smallest share on this
# grid whose anchor is expected to be within ATE_ANCHOR_ACCURACY_RATIO of the error of an ``ate``
# release at the whole budget; the CATE's own fit gets the rest. Where privacy noise dominates the
# ATE (small n epsilon) that is the largest share, so the release, mostly its anchor there, is
# about as accurate as the constant DP ATE (issue 12: PEHE <= 1.1x the constant DP ATE's).
ATE_ANCHOR_SHARES = (0.2, 0.35, 0.5, 0.65, 0.8, 0.95)
ATE_ANCHOR_ACCURACY_RATIO = 1.1
# ... except below n * epsilon = ANCHOR_ALL_IN_N_EPSILON, where the anchor takes the largest
# share outright: no CATE kind resolved heterogeneity there on any benchmark (its factor was 0),
# so the release is the anchor, and the error model above (a public scale assumption) was
# optimistic at the smallest sizes: at n 1000, eps 1 on the realistic trials the anchor at 0.8
# had 1.43-1.62x the RMSE of the ate release at the whole budget (40 samples,
# bench/results/rct-anchor-shared-rule.json), at 0.95 1.06x.
ANCHOR_ALL_IN_N_EPSILON = 10_000.0
# ... and on observational designs at every size: there the ate default's error is mostly its DP
# nuisance models' bias, which grows as their budget shrinks (+0.18 / +0.29 / +0.58 at
# eps 16 / 4 / 1, n 20 000: bench/results/nuisance_bias.json) and which the error model (noise
# and sampling only) does not see; at the 0.8 it chose, the realistic observational cells at
# n 20 000, eps 4 gave the CATE kinds 1.8-2.6x the constant DP ATE's PEHE (3 releases,
# bench/results/realistic-cate-whole-anchor-obs.json). No observational CATE gain at these sizes
# came from cate_function or cate_vector.
# The CATE uses only the anchor release's estimate, so nearly all of its estimation budget goes
# to the mean; the second moment it also draws, at the rest, serves only the anchor's released
# interval (anchor_interval). At 0.8 (the ate default's) the anchor's noise sd would be 1.25x
# larger.
ANCHOR_MEAN_SHARE = 0.98
# The anchor's interval inflates its noisy variance estimate by z_{1 - this} times its noise sd.
ANCHOR_INTERVAL_ALPHA_V = 0.05


def ate_default_params(
    domain: PublicDomain, epsilon: float, delta: float | None = None
) -> AnchorParams:
    """The ``ate`` kind's single-release default (``chunks: 1``) at ``(epsilon, delta)`` (its
    estimator rule, public inputs only): the DP difference in means on a trial below
    ``ate_rct.DEFAULT_BELOW_N_EPSILON`` (pure epsilon: ``delta`` is not spent), else
    ``ate_strict.default_params``."""
    if ate_rct.is_trial_default(domain, epsilon):
        return ate_rct.AteRctParams(epsilon=epsilon)
    return ate_strict.default_params(domain, epsilon, delta)


def ate_anchor_params(
    domain: PublicDomain, epsilon: float, delta: float | None, whole_epsilon: float | None = None
) -> AnchorParams:
    """The anchor release's public parameters: the ``ate`` kind's single-release default at
    ``(epsilon, delta)``. On a trial below n epsilon = ``ate_rct.DEFAULT_BELOW_N_EPSILON`` (the
    anchor's own epsilon) that is the DP difference in means, pure epsilon (the ``ate`` default
    there since its estimator rule; the anchor had stayed ``aipw``, and an ``ebm_cate`` release that
    was its anchor had 1.4-1.8x the constant DP ATE's PEHE on trials of n 3000-5000 at eps 1).
    Otherwise ``ate_strict.default_params`` with mean share ``ANCHOR_MEAN_SHARE`` and the nuisance
    class the ``ate`` default picks at ``whole_epsilon``, the CATE's whole budget (the anchor stands
    in for that release: on observational designs at 95 % of it, and a 5 % step must not cross the
    rule's switch from DP linear to DP-EBM models: at n 5000, eps 4 on the realistic studies it did,
    and the anchor's RMSE was 1.50x the whole-budget release's, 1.32x with this rule;
    bench/README.md, "The anchor's interval"). Its cross-fitting, clip, folds and outcome-range
    rules follow its own share."""
    if ate_rct.is_trial_default(domain, epsilon):
        return ate_rct.AteRctParams(epsilon=epsilon)
    params = ate_strict.default_params(domain, epsilon, delta, nuisance_epsilon=whole_epsilon)
    return replace(params, mean_share=ANCHOR_MEAN_SHARE)


def ate_anchor_error_sd(domain: PublicDomain, params: AnchorParams) -> float:
    """The expected error sd of a strict ATE release with these parameters:
    ``sqrt(sd^2 / n2 + s_theta^2)`` with ``sd`` the quote's public pseudo-outcome scale
    assumption (R / 6) and ``s_theta`` the privacy-noise sd of the mean (with the adaptive clip:
    at the clip that scale assumption gives, ``ate_strict.assumed_clip``; the quote's exact law
    of the DP quantile is too slow for a rule evaluated on every plan); the difference in means,
    ``ate_rct.expected_error_sd`` (the same sampling assumption per arm). Public inputs only."""
    if isinstance(params, ate_rct.AteRctParams):
        return ate_rct.expected_error_sd(domain, params)
    state = ate_strict.make_plan(domain, params)
    if state.quantile_epsilon is not None:
        clip = ate_strict.assumed_clip(domain, state)
        noise = ate_strict.adaptive_calibrations(state, clip)[0].sigma
    else:
        noise = state.mean.sigma
    sd = ate_strict.assumed_pseudo_outcome_sd(domain)
    return math.sqrt(sd * sd / state.n2 + noise * noise)


def no_room_for_anchor() -> InvalidParameters:
    """The error where even the largest share leaves the anchor below the ``ate`` minimum."""
    minimum = ate_strict.MIN_EPSILON / ATE_ANCHOR_SHARES[-1]
    return InvalidParameters(
        f"shrinkage 'ate' needs epsilon >= {minimum:.3g} for its anchor (the strict ate "
        "default on all rows at a share of the budget); use shrinkage 'none'"
    )


def ate_anchor_share(domain: PublicDomain, epsilon: float, delta: float) -> float | None:
    """The whole-data anchor's public share of ``(epsilon, delta)``: the smallest of
    ``ATE_ANCHOR_SHARES`` whose anchor (``ate_anchor_params``) is expected within
    ``ATE_ANCHOR_ACCURACY_RATIO`` of the error of the ``ate`` default at the whole budget (else the
    largest; the largest outright below n epsilon = ``ANCHOR_ALL_IN_N_EPSILON`` and on
    observational designs), or None where
    even the largest share cannot run (below the ``ate`` minimum)."""
    if ATE_ANCHOR_SHARES[-1] * epsilon < ate_strict.MIN_EPSILON:
        return None
    if domain.n * epsilon < ANCHOR_ALL_IN_N_EPSILON or domain.design != StudyDesign.RCT:
        return ATE_ANCHOR_SHARES[-1]
    whole = ate_anchor_error_sd(domain, ate_default_params(domain, epsilon))
    for share in ATE_ANCHOR_SHARES:
        epsilon_a = ate_strict.split_share(epsilon, share)[0]
        if epsilon_a < ate_strict.MIN_EPSILON:
            continue
        delta_a = ate_strict.split_share(delta, share)[0]
        try:
            error = ate_anchor_error_sd(
                domain, ate_anchor_params(domain, epsilon_a, delta_a, epsilon)
            )
        except InvalidParameters:
            continue
        if error <= ATE_ANCHOR_ACCURACY_RATIO * whole:
            return share
    return ATE_ANCHOR_SHARES[-1]


def plan_ate_anchor(
    domain: PublicDomain, epsilon: float, delta: float, whole_epsilon: float | None = None
) -> AteAnchorPlan:
    """The whole-data anchor's plan at ``(epsilon, delta)``, its nuisance class that of the
    ``ate`` default at the CATE's ``whole_epsilon`` (``ate_anchor_params``; public inputs only).
    A difference-in-means anchor's record spends no delta.

    Raises:
        InvalidParameters: the anchor's share of delta is not valid for the ``ate`` default's
            folds (only with an explicit delta and custom CATE folds).
    """
    params = ate_anchor_params(domain, epsilon, delta, whole_epsilon)
    try:
        if isinstance(params, ate_rct.AteRctParams):
            return AteAnchorPlan(params=params, record=ate_rct.plan(domain, params), n2=domain.n)
        state = ate_strict.make_plan(domain, params)
    except InvalidParameters as error:
        raise InvalidParameters(
            "the anchor (the strict single-release ate default on all rows, at a share of the "
            f"budget) cannot run at this epsilon/delta: {error}; use a smaller delta, "
            "shrinkage 'none' or a given anchor"
        ) from None
    return AteAnchorPlan(params=params, record=state.record, n2=state.n2)


def split_for_anchor(
    domain: PublicDomain, epsilon: float, delta: float, share: float
) -> tuple[AteAnchorPlan, float, float]:
    """The whole-data anchor at the public ``share`` of ``(epsilon, delta)`` and the rest
    ``(epsilon_rest, delta_rest)`` the CATE's own modules spend (exact splits, ``split_share``):
    the anchor plus the rest is the request exactly. A difference-in-means anchor is pure
    epsilon, so the rest keeps the whole delta."""
    epsilon_anchor, epsilon_rest = ate_strict.split_share(epsilon, share)
    delta_anchor, delta_rest = ate_strict.split_share(delta, share)
    anchor = plan_ate_anchor(domain, epsilon_anchor, delta_anchor, epsilon)
    if anchor.delta == 0.0:
        delta_rest = delta
    return anchor, epsilon_rest, delta_rest


def anchor_interval(out: Mapping[str, float], *, bound: float) -> dict[str, float]:
    """The anchor release's interval for the ATE (post-processing of its DP outputs and public
    constants): ``ate_strict.confidence_interval`` at the release's level with the variance
    inflated by ``z_{1 - ANCHOR_INTERVAL_ALPHA_V} s_2``, its ends clipped to the public range
    ``[-bound, bound]``. The anchor draws its second moment at 2 % of its estimation budget
    (``ANCHOR_MEAN_SHARE``), so the variance it reads is noisy; the inflation keeps the interval
    at its level where that noise would shrink it (proof: ate_ci.md §3.2, step 8's option)."""
    inflation = float(ndtri(1.0 - ANCHOR_INTERVAL_ALPHA_V)) * float(out["s_2"])
    half = ate_strict.interval_half_width(
        float(out["variance_estimate"]) + inflation,
        s_theta=float(out["s_theta"]),
        n2=int(out["n2"]),
        alpha=1.0 - float(out["ci_level"]),
    )
    estimate = float(out["estimate"])
    return {
        "lower": float(np.clip(estimate - half, -bound, bound)),
        "upper": float(np.clip(estimate + half, -bound, bound)),
        "level": float(out["ci_level"]),
    }


def draw_ate_anchor(
    arrays: Arrays,
    domain: PublicDomain,
    anchor: AteAnchorPlan,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Callable[[float, str], None],
) -> tuple[float, dict[str, float]]:
    """Run the anchor release on all rows (after the charge): its DP estimate clipped to the
    public CATE range ``[-R_Y, R_Y]`` and its interval (``anchor_interval``), both
    post-processing. Nothing else of it is kept."""
    bound = domain.outcome_range
    if isinstance(anchor.params, ate_rct.AteRctParams):
        # its own delta-method interval (docs/proofs/ate_rct.md), ends clipped to [-R, R]
        out = ate_rct.run(arrays, domain, anchor.params, rng=rng, noise=noise, progress=progress)
        interval = {
            "lower": float(np.clip(float(out["ci_lower"]), -bound, bound)),
            "upper": float(np.clip(float(out["ci_upper"]), -bound, bound)),
            "level": float(out["ci_level"]),
        }
    else:
        out = ate_strict.run(arrays, domain, anchor.params, rng=rng, noise=noise, progress=progress)
        interval = anchor_interval(out, bound=bound)
    estimate = float(np.clip(float(out["estimate"]), -bound, bound))
    return estimate, interval
