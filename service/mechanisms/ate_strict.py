"""Strict DP AIPW average treatment effect with a confidence interval (ate_ci.md §3).

What it releases:
    ``theta_DP``, a DP estimate of the AIPW functional at DP nuisances (the ATE under
    unconfoundedness and positivity), a (1 - alpha) confidence interval built only from
    ``theta_DP``, a DP second moment ``m2_DP`` and public constants, the DP sandwich-variance
    estimate ``V_hat``, and the public noise scales ``s_theta`` and ``s_2``. Never the
    non-private ``theta_hat`` / ``m2_hat``, per-row pseudo-outcomes, fold membership or the
    nuisance models' non-DP internals (ate_ci.md §3.8, threats.md §9).

Neighbouring relation:
    replace-one on records (X, A, Y), with n public (spec README §1.2). Fold sizes are fixed
    public functions of n.

Claim:
    ``run`` is (epsilon, delta)-DP, where (epsilon, delta) is the cost in ``plan``'s record:

    * propensity DP-EBM on D_pi: mu_pi-GDP under replace-one with ``delta(epsilon; mu_pi) <=
      delta`` (epsilon_p rule of README §1.2, with the mu values interpret actually uses);
    * outcome DP-EBM on D_mu: likewise;
    * on D_2 two lattice Gaussians with sensitivities ``2B/n2`` and ``B^2/n2`` (plus float and
      lattice slack), calibrated by the analytic Gaussian to (f eps, f delta) and
      ((1 - f) eps, (1 - f) delta): sequential composition gives (eps, delta);
    * the folds are disjoint, of public sizes, drawn by a uniformly random permutation, and
      the pseudo-outcome is row-wise given the nuisances, so Niu et al.'s Theorem 6 gives the
      max over modules, (eps, delta);
    * the CI and V_hat are post-processing.

    Proof: ``docs/proofs/ate_strict.md``. Steps are labelled ``# proof step N`` below.

Nuisance presets:
    * ``"dp_ebm"`` (default): interpret DP-EBM classifier / regressor (proof §2);
    * ``"dp_linear"``: DP logistic regression by output perturbation for pi and DP per-arm
      ridge regression by sufficient-statistics perturbation for mu
      (``service.mechanisms.dp_linear``; proof §10–§11). Fast enough for hundreds of
      benchmark repetitions at n = 10^6;
    * ``"none"`` (RCT only).

Cross-fitting (``cross_fit=True``, ``dp_linear`` only; proof §12):
    two halves of public sizes from a uniformly random permutation; each half's nuisances (DP,
    at (epsilon_nuis, delta_nuis) split between pi and mu) are fitted on the other half, and
    the DP mean and second moment are taken over all n records. The nuisance fits are parallel
    over the disjoint halves; the estimation composes sequentially with them: the release
    costs ``(epsilon_nuis + epsilon_stat, delta_nuis + delta_stat) = (epsilon, delta)``, with
    ``epsilon_nuis = nuisance_share * epsilon`` (public).

Designs:
    * observational: three folds (propensity, outcome, estimation), default (0.25, 0.25, 0.5);
      B = R / c_pi.
    * RCT with public assignment probability p: pi_hat = p, no propensity fold; default folds
      (0.5, 0.5) for (outcome, estimation); B = R / min(p, 1 - p).
    * RCT with ``nuisance="none"``: mu_hat = the midpoint of the public outcome bounds (a
      Horvitz-Thompson estimator), a single estimation fold (all n records);
      B = R / (2 min(p, 1 - p)), since |Y - midpoint| <= R / 2.

References:
    Schroeder, Hartenstein, Feuerriegel (2025). PrivATE. NeurIPS (arXiv 2505.21641v1).
    Niu, Nori, Quistorff, Caruana, Ngwe, Kannan (2022). Differentially private estimation of
    heterogeneous causal effects. CLeaR (Theorem 6).
    Balle and Wang (2018). Improving the Gaussian mechanism for differential privacy. ICML.
    Dong, Roth and Su (2019). Gaussian differential privacy. arXiv:1905.02383.
    Canonne, Kamath and Steinke (2020). The discrete Gaussian for differential privacy.
    Nori, Caruana, Zhong, Hsu, Sharma (2021). Accuracy, interpretability, and differential
    privacy via explainable boosting. ICML (DP-EBM; interpret-core 0.7.8).
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
from service.mechanisms.calibration import (
    analytic_gaussian_multiplier,
    default_delta,
    round_up_significant,
    validate_alpha,
    validate_delta,
    validate_epsilon,
    validate_finite_positive,
)
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.dp_ebm import (
    DpEbmAccounting,
    nuisance_event,
    outcome_predictions,
    propensity_scores,
    solve_dp_ebm_epsilon_p,
)
from service.mechanisms.errors import InvalidParameters, ReleaseFailed
from service.mechanisms.noise import (
    GaussianCalibration,
    NoiseSampler,
    calibrate_gaussian,
    release_gaussian,
)
from service.mechanisms.partition import (
    MIN_FOLD_SIZE,
    checked_fractions,
    fold_sizes,
    prepare_arrays,
    random_folds,
)
from service.mechanisms.records import (
    Composition,
    Guarantee,
    MechanismRecord,
    NoiseEvent,
)

MECHANISM = "ate_strict"
VERSION = "2"  # 2: public default rules (ridge floor, cross-fitting shares), issue 3

Nuisance = Literal["dp_ebm", "dp_linear", "none"]
NUISANCES: tuple[str, ...] = ("dp_ebm", "dp_linear", "none")
Progress = Callable[[float, str], None]

# ---- public constants (part of the mechanism version) ---------------------------------------
MIN_EPSILON = 0.01
MAX_EPSILON = 100.0
# Minimum-n guard: every fold (each module's input) has at least this many records.
DEFAULT_FOLDS_OBSERVATIONAL = (0.25, 0.25, 0.5)  # propensity, outcome, estimation
# dp_linear preset (observational, no cross-fitting), public rule: where the privacy noise
# dominates (n * epsilon <= DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON) the nuisance folds shrink to
# 0.2 n each, so n2 = 0.6 n narrows the noise-only CI by 1/6; the low-dimensional DP fits lose
# little there. Above it (and when epsilon is not given) the spec's (0.25, 0.25, 0.5).
DEFAULT_FOLDS_OBSERVATIONAL_DP_LINEAR = (0.2, 0.2, 0.6)
DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON = 5000.0
DEFAULT_FOLDS_RCT = (0.5, 0.5)  # outcome, estimation
DEFAULT_FOLDS_RCT_NO_NUISANCE = (1.0,)  # estimation
DEFAULT_NUISANCE_SHARE = (
    0.5  # cross-fitting: largest default share of (epsilon, delta) for nuisances
)
# Cross-fitting default nuisance share (public rule, proof §12): clip(K / (n epsilon), MIN, MAX):
# the nuisance fits get at least about K "record-epsilons" n * epsilon_nuis while that costs
# at most half the budget; at large n epsilon almost all of it goes to the DP mean.
CROSS_FIT_SHARE_RECORD_EPSILONS = 50_000.0
MIN_NUISANCE_SHARE = 0.05
DEFAULT_MEAN_SHARE = 0.8  # sample splitting: share f of the D_2 budget for the mean
# Cross-fitting default mean share (public rule, proof §12): HIGH when the second moment's noise
# sd at the HIGH share, s_2 = B^2 sigma_G((1 - HIGH) eps_stat, (1 - HIGH) delta_stat) / n, is at
# most SECOND_MOMENT_NOISE_LIMIT (R/2)^2 (the variance of an outcome spread over its public
# range), else DEFAULT_MEAN_SHARE: a noisy V_hat under-covers when sampling variance dominates.
CROSS_FIT_MEAN_SHARE_HIGH = 0.9
SECOND_MOMENT_NOISE_LIMIT = 0.05
CROSS_FIT_FOLDS = (0.5, 0.5)  # cross-fitting: two halves

# Float summation slack (module helper ``_float_slack``): fsum and one division add at most
# about 2.01 * 2^-53 * B of error on each side of a mean of values in [-B, B].
_FLOAT_SLACK_BITS = 50
# Charged adaptive clipping (proof §13): a public share of the estimation budget buys an
# epsilon-DP quantile Q of |Gamma| on a public geometric grid in [B / RANGE, B]; the clip is then
# K = min(B, kappa(n2) Q) with the public inflation kappa(n2) = 2 + 0.5 log10(n2).
ADAPTIVE_CLIP_SHARE = 0.1
ADAPTIVE_CLIP_LEVEL = 0.9
ADAPTIVE_CLIP_CANDIDATES = 200
ADAPTIVE_CLIP_RANGE = 1000.0
# Quote only: the pseudo-outcome sd assumed for the expected half-width is R / this (public).
ADAPTIVE_QUOTE_RANGE_RATIO = 6.0


@dataclass(frozen=True)
class AteStrictParams:
    """Public request parameters of the strict ATE (ate_ci.md §3.1).

    Attributes:
        epsilon: total epsilon of the release.
        delta: total delta of the release (0 < delta < 1 / smallest fold).
        alpha: miscoverage of the CI.
        propensity_clip: c_pi; pi_hat is clipped to [c_pi, 1 - c_pi] (observational only).
        pseudo_outcome_clip: optional public K < B; pseudo-outcomes are clipped to [-K, K].
        fold_fractions: fractions of n per fold; None means the design's default
            ((0.25, 0.25, 0.5) observational, (0.2, 0.2, 0.6) observational with
            ``dp_linear`` when n epsilon <= 5000, (0.5, 0.5) RCT, (1.0,) RCT without nuisance).
        mean_share: f, the share of the estimation budget spent on the mean; None means the
            public default (``DEFAULT_MEAN_SHARE``; with cross-fitting the rule of
            ``cross_fit_mean_share``).
        variance_inflation: use V_hat + z_{1 - alpha_v} s_2 in the CI (§3.2 step 9).
        alpha_v: level of the variance inflation.
        nuisance: ``"dp_ebm"``, ``"dp_linear"`` or ``"none"`` (RCT only: mu_hat = midpoint
            of the bounds).
        cross_fit: 2-fold cross-fitting (``dp_linear`` only; fold_fractions must be None).
        nuisance_share: cross-fitting only: the share of (epsilon, delta) spent on the
            nuisance fits; the rest goes to the DP mean and second moment over all n. None
            means the public rule ``default_nuisance_share(n, epsilon)``.
        regularization: ``dp_linear`` ridge lambda (logistic and outcome); None means the
            public rules ``m^(-1/3)`` (logistic) and ``min(m^(-1/2), sqrt(d) sigma / m)`` (ridge
            floor; sigma the public noise sd of the ridge statistics) for m fit records.
        adaptive_clip: charged adaptive clipping (proof §13): spend ``ADAPTIVE_CLIP_SHARE`` of
            the estimation budget on a DP quantile of |Gamma| and clip at
            ``K = min(B, kappa(n2) Q)`` instead of B. Excludes ``pseudo_outcome_clip``.
    """

    epsilon: float
    delta: float
    alpha: float = 0.05
    propensity_clip: float = 0.1
    pseudo_outcome_clip: float | None = None
    fold_fractions: tuple[float, ...] | None = None
    mean_share: float | None = None
    variance_inflation: bool = False
    alpha_v: float = 0.05
    nuisance: Nuisance = "dp_ebm"
    cross_fit: bool = False
    nuisance_share: float | None = None
    regularization: float | None = None
    adaptive_clip: bool = False


def default_adaptive_clip(domain: PublicDomain, pseudo_outcome_clip: float | None) -> bool:
    """Public rule for an omitted clip choice: adaptive on randomised designs unless a public
    ``pseudo_outcome_clip`` was given (proof §13; bench/results/realistic-*.json)."""
    return pseudo_outcome_clip is None and domain.design == StudyDesign.RCT


def adaptive_clip_inflation(n2: int) -> float:
    """The public inflation kappa(n2) = 2 + 0.5 log10(n2) of the DP quantile (proof §13)."""
    return 2.0 + 0.5 * math.log10(float(n2))


def adaptive_clip_candidates(bound: float) -> NDArray[np.float64]:
    """The public quantile grid: ``ADAPTIVE_CLIP_CANDIDATES`` geometric points in
    ``[bound / ADAPTIVE_CLIP_RANGE, bound]`` (both ends included)."""
    grid = np.geomspace(bound / ADAPTIVE_CLIP_RANGE, bound, ADAPTIVE_CLIP_CANDIDATES)
    grid[-1] = bound
    return np.asarray(grid, dtype=np.float64)


def adaptive_clip_bound(quantile: float, bound: float, n2: int) -> float:
    """``K = min(B, kappa(n2) Q)``: post-processing of the DP quantile Q and public values."""
    return min(bound, adaptive_clip_inflation(n2) * quantile)


def default_nuisance_share(n: int, epsilon: float) -> float:
    """Cross-fitting's public default nuisance share: ``clip(K / (n epsilon), 0.05, 0.5)``.

    K = ``CROSS_FIT_SHARE_RECORD_EPSILONS`` (50,000). A function of the public n and the
    requested epsilon only (never of the data), so the budget split is public (proof §12). At
    n = 10^6, epsilon = 1 it is 0.05; for n epsilon <= 100,000 it is 0.5 (the former default).
    """
    share = CROSS_FIT_SHARE_RECORD_EPSILONS / (float(n) * float(epsilon))
    return min(DEFAULT_NUISANCE_SHARE, max(MIN_NUISANCE_SHARE, share))


def cross_fit_mean_share(
    n: int, bound: float, outcome_range: float, epsilon_stat: float, delta_stat: float
) -> float:
    """Cross-fitting's public default mean share f (constants above; proof §12).

    ``CROSS_FIT_MEAN_SHARE_HIGH`` if ``B^2 sigma_G((1 - f) eps, (1 - f) delta) / n <=
    SECOND_MOMENT_NOISE_LIMIT (R / 2)^2`` at that f, else ``DEFAULT_MEAN_SHARE``. Inputs are
    public (n, B, R and the estimation budget).
    """
    high = CROSS_FIT_MEAN_SHARE_HIGH
    _, epsilon_v = split_share(epsilon_stat, high)
    _, delta_v = split_share(delta_stat, high)
    s_2 = bound * bound * analytic_gaussian_multiplier(epsilon_v, delta_v) / n
    half_range = outcome_range / 2.0
    return (
        high if s_2 <= SECOND_MOMENT_NOISE_LIMIT * half_range * half_range else DEFAULT_MEAN_SHARE
    )


def resolved_shares(
    domain: PublicDomain, epsilon: float, delta: float, bound: float, params: AteStrictParams
) -> tuple[float | None, float]:
    """The (nuisance_share, mean_share) a request uses: explicit values, else the public rules.

    nuisance_share is None without cross-fitting. Pure function of public inputs.
    """
    if not params.cross_fit:
        mean_share = DEFAULT_MEAN_SHARE if params.mean_share is None else params.mean_share
        return None, mean_share
    nuisance_share = (
        default_nuisance_share(domain.n, epsilon)
        if params.nuisance_share is None
        else params.nuisance_share
    )
    if params.mean_share is not None:
        return nuisance_share, params.mean_share
    share = validate_alpha(nuisance_share, name="nuisance_share")
    _, epsilon_stat = split_share(epsilon, share)
    _, delta_stat = split_share(delta, share)
    mean_share = cross_fit_mean_share(
        domain.n, bound, domain.outcome_range, epsilon_stat, delta_stat
    )
    return nuisance_share, mean_share


# ---- DP-EBM accounting (README §1.2, dp_ebm_learners.md §4, §7) -----------------------------


# ---- pure D_2 helpers (tested directly for sensitivity) -------------------------------------


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


def _float_slack(nominal: float, n2: int) -> float:
    """Nominal sensitivity inflated for the float rounding of fsum and the division by n2."""
    return math.nextafter(nominal * (1.0 + (n2 + 8) * 2.0**-_FLOAT_SLACK_BITS), math.inf)


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
    half_width = float(ndtri(1.0 - alpha / 2.0)) * math.sqrt(variance_used / n2 + s_theta**2)
    return {
        "variance_estimate": variance,
        "variance_used": variance_used,
        "half_width": half_width,
        "ci_lower": theta_dp - half_width,
        "ci_upper": theta_dp + half_width,
    }


# ---- planning (no data) ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    params: AteStrictParams
    design: StudyDesign
    nuisance: Nuisance
    modules: tuple[str, ...]  # fold names, in partition order
    fold_sizes: tuple[int, ...]
    bound: float  # B (or K)
    bound_natural: float  # R / c, R / min(p, 1 - p) or R / (2 min(p, 1 - p))
    propensity: float | None  # RCT: p; observational: None
    dp_ebm: DpEbmAccounting | None
    dp_logistic: dp_linear.DpLogistic | None
    dp_ridge: dp_linear.DpRidge | None
    cross_fit: bool
    mean_share: float  # resolved f (explicit or the public default)
    nuisance_share: float | None  # resolved cross-fitting share (None without cross-fitting)
    mean: GaussianCalibration  # at B (adaptive clipping: the largest possible noise)
    second_moment: GaussianCalibration
    record: MechanismRecord
    quantile_epsilon: float | None = None  # adaptive clipping only

    @property
    def n2(self) -> int:
        """Records averaged by the estimation stage (all n with cross-fitting)."""
        return sum(self.fold_sizes) if self.cross_fit else self.fold_sizes[-1]


def default_fold_fractions(
    domain: PublicDomain,
    nuisance: Nuisance,
    cross_fit: bool = False,
    epsilon: float | None = None,
) -> tuple[float, ...]:
    """The design's default fold fractions (cross-fitting: two halves).

    ``dp_linear`` (observational) uses (0.2, 0.2, 0.6) when ``n epsilon <=
    DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON`` (public n and requested epsilon), else the spec's
    (0.25, 0.25, 0.5); without epsilon, the spec's.
    """
    if cross_fit:
        return CROSS_FIT_FOLDS
    if domain.design == StudyDesign.RCT:
        return DEFAULT_FOLDS_RCT_NO_NUISANCE if nuisance == "none" else DEFAULT_FOLDS_RCT
    if (
        nuisance == "dp_linear"
        and epsilon is not None
        and domain.n * epsilon <= DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON
        and _small_folds_fit(domain.n)
    ):
        return DEFAULT_FOLDS_OBSERVATIONAL_DP_LINEAR
    return DEFAULT_FOLDS_OBSERVATIONAL


def default_cross_fit(
    domain: PublicDomain,
    nuisance: Nuisance,
    fold_fractions: tuple[float, ...] | None,
    epsilon: float,
) -> bool:
    """Public rule for an omitted ``cross_fit``: ``dp_linear`` on an observational design
    cross-fits above ``n epsilon = DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON``, unless fold fractions
    were given. Below it the split estimator (small folds) covers and is narrower; above it the
    split estimator under-covers (0.918-0.926 at n epsilon >= 25000) while cross-fitting stays in
    [0.93, 0.97] (bench/results/ate_coverage-grid-rules.json, 500 reps per cell).
    """
    return (
        nuisance == "dp_linear"
        and fold_fractions is None
        and domain.design != StudyDesign.RCT
        and domain.n * epsilon > DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON
    )


def _small_folds_fit(n: int) -> bool:
    """Whether dp_linear's small default folds all reach the minimum fold size."""
    sizes = fold_sizes(n, DEFAULT_FOLDS_OBSERVATIONAL_DP_LINEAR)
    return min(sizes) >= MIN_FOLD_SIZE


def module_names(
    domain: PublicDomain, nuisance: Nuisance, cross_fit: bool = False
) -> tuple[str, ...]:
    if cross_fit:
        return ("half_1", "half_2")
    if domain.design == StudyDesign.RCT:
        return ("estimation",) if nuisance == "none" else ("outcome", "estimation")
    return ("propensity", "outcome", "estimation")


def default_delta_for(
    domain: PublicDomain,
    fold_fractions: tuple[float, ...] | None = None,
    nuisance: Nuisance = "dp_ebm",
    cross_fit: bool = False,
    epsilon: float | None = None,
) -> float:
    """README §1.7 default delta, ``min(1e-5, 1 / (10 n_min))`` over this release's folds."""
    validate_domain(domain, nuisance)
    _validate_cross_fit(nuisance, cross_fit, fold_fractions)
    fractions = validate_fractions(domain, nuisance, fold_fractions, cross_fit, epsilon)
    return default_delta(min(fold_sizes(domain.n, fractions)))


def validate_domain(domain: PublicDomain, nuisance: Nuisance) -> None:
    """Reject an unusable public schema or nuisance choice (shared with ``cate_function``)."""
    if isinstance(domain.n, bool) or not isinstance(domain.n, int) or domain.n < 1:
        raise InvalidParameters("the dataset size n must be a positive integer")
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    if lower.ndim != 1 or lower.shape != upper.shape or lower.size == 0:
        raise InvalidParameters("covariate bounds must be two vectors of the same length q >= 1")
    if not (np.all(np.isfinite(lower)) and np.all(np.isfinite(upper)) and np.all(lower < upper)):
        raise InvalidParameters("covariate bounds must be finite with lower < upper")
    if not (math.isfinite(domain.y_lower) and math.isfinite(domain.y_upper)):
        raise InvalidParameters("outcome bounds must be finite")
    if not domain.y_lower < domain.y_upper:
        raise InvalidParameters("outcome bounds must satisfy y_lower < y_upper")
    validate_finite_positive(domain.outcome_range, "outcome range")
    if nuisance not in NUISANCES:
        raise InvalidParameters("nuisance must be 'dp_ebm', 'dp_linear' or 'none'")
    if domain.design == StudyDesign.RCT:
        p = domain.treatment_probability
        if p is None or isinstance(p, bool) or not isinstance(p, int | float):
            raise InvalidParameters("an RCT needs a declared treatment_probability")
        if not (math.isfinite(p) and 0.0 < p < 1.0):
            raise InvalidParameters("treatment_probability must be in (0, 1)")
    elif domain.design == StudyDesign.OBSERVATIONAL:
        if nuisance == "none":
            raise InvalidParameters("nuisance='none' is only valid for an RCT design")
    else:
        raise InvalidParameters("unknown study design")


def _validate_cross_fit(
    nuisance: Nuisance, cross_fit: object, fold_fractions: tuple[float, ...] | None
) -> None:
    if not isinstance(cross_fit, bool):
        raise InvalidParameters("cross_fit must be a boolean")
    if cross_fit and nuisance != "dp_linear":
        raise InvalidParameters("cross_fit=true needs nuisance='dp_linear'")
    if cross_fit and fold_fractions is not None:
        raise InvalidParameters("fold_fractions must be omitted with cross_fit=true (two halves)")


def validate_fractions(
    domain: PublicDomain,
    nuisance: Nuisance,
    fold_fractions: tuple[float, ...] | None,
    cross_fit: bool = False,
    epsilon: float | None = None,
) -> tuple[float, ...]:
    """The fold fractions (given or default), checked: one per module, sum 1, every fold at
    least ``MIN_FOLD_SIZE`` records (shared with ``cate_function``)."""
    modules = module_names(domain, nuisance, cross_fit)
    fractions = (
        default_fold_fractions(domain, nuisance, cross_fit, epsilon)
        if fold_fractions is None
        else fold_fractions
    )
    return checked_fractions(domain.n, modules, fractions)


def split_share(total: float, share: float) -> tuple[float, float]:
    """Split ``total`` into (share * total, rest) with ``first + second == total`` exactly.

    The larger part is the rounded product; the smaller is ``total - larger``, which is exact by
    Sterbenz's lemma (larger >= total / 2), so the float sum is exactly ``total``.
    """
    if share >= 0.5:
        first = total * share
        second = total - first
    else:
        second = total * (1.0 - share)
        first = total - second
    if first + second != total or first <= 0.0 or second <= 0.0:
        raise InvalidParameters("the budget split does not add up exactly")
    return first, second


def _make_plan(domain: PublicDomain, params: AteStrictParams) -> _Plan:
    """Validate everything and compute the calibration and the record. Touches no data."""
    nuisance = params.nuisance
    validate_domain(domain, nuisance)
    cross_fit = params.cross_fit
    _validate_cross_fit(nuisance, cross_fit, params.fold_fractions)
    epsilon = validate_epsilon(params.epsilon, minimum=MIN_EPSILON, maximum=MAX_EPSILON)
    fractions = validate_fractions(domain, nuisance, params.fold_fractions, cross_fit, epsilon)
    modules = module_names(domain, nuisance, cross_fit)
    sizes = fold_sizes(domain.n, fractions)
    delta = validate_delta(params.delta, n_min=min(sizes))
    if params.regularization is not None:
        validate_finite_positive(params.regularization, "regularization")
        if nuisance != "dp_linear":
            raise InvalidParameters("regularization is only used with nuisance='dp_linear'")
    validate_alpha(params.alpha)
    validate_alpha(params.alpha_v, name="alpha_v")
    if not isinstance(params.variance_inflation, bool):
        raise InvalidParameters("variance_inflation must be a boolean")
    if not isinstance(params.adaptive_clip, bool):
        raise InvalidParameters("adaptive_clip must be a boolean")
    if params.adaptive_clip and params.pseudo_outcome_clip is not None:
        raise InvalidParameters(
            "pseudo_outcome_clip and adaptive clipping exclude each other: give a public clip "
            "or let a DP quantile choose it"
        )
    n2 = domain.n if cross_fit else sizes[-1]
    big_r = domain.outcome_range

    # proof step 1: the public bound B on |Gamma| (ate_ci.md §3.3).
    propensity: float | None
    if domain.design == StudyDesign.RCT:
        p = float(domain.treatment_probability)  # type: ignore[arg-type]
        propensity = p
        smaller_arm = min(p, 1.0 - p)
        bound_natural = big_r / (2.0 * smaller_arm) if nuisance == "none" else big_r / smaller_arm
    else:
        propensity = None
        clip = validate_finite_positive(params.propensity_clip, "propensity_clip")
        if clip < domain.min_propensity_clip:
            raise InvalidParameters(
                f"propensity_clip must be at least the dataset's minimum "
                f"{domain.min_propensity_clip}"
            )
        if clip > 0.5:
            raise InvalidParameters("propensity_clip must be at most 0.5")
        bound_natural = big_r / clip
    bound = bound_natural
    if params.pseudo_outcome_clip is not None:
        clip_k = validate_finite_positive(params.pseudo_outcome_clip, "pseudo_outcome_clip")
        if not clip_k < bound_natural:
            raise InvalidParameters(
                f"pseudo_outcome_clip must be below the natural bound {bound_natural:.6g}"
            )
        bound = clip_k
    validate_finite_positive(bound, "pseudo-outcome bound")
    nuisance_share_value, mean_share_value = resolved_shares(domain, epsilon, delta, bound, params)
    mean_share = validate_alpha(mean_share_value, name="mean_share")  # in (0, 1)

    # proof step 2: nuisance modules (DP-EBM) at (epsilon, delta) each under replace-one.
    dp_ebm = solve_dp_ebm_epsilon_p(epsilon, delta) if nuisance == "dp_ebm" else None
    # proof step 8 (dp_linear, §10-§12): budgets of the linear nuisance fits.
    observational = domain.design == StudyDesign.OBSERVATIONAL
    epsilon_stat, delta_stat = epsilon, delta
    epsilon_pi = epsilon_mu = epsilon
    delta_pi = delta_mu = delta
    share: float | None = None
    if cross_fit:
        share = validate_alpha(nuisance_share_value, name="nuisance_share")  # in (0, 1)
        epsilon_nuis, epsilon_stat = split_share(epsilon, share)
        delta_nuis, delta_stat = split_share(delta, share)
        epsilon_pi = epsilon_mu = epsilon_nuis
        delta_pi = delta_mu = delta_nuis
        if observational:
            epsilon_pi, epsilon_mu = split_share(epsilon_nuis, 0.5)
            delta_pi, delta_mu = split_share(delta_nuis, 0.5)
    dp_logistic: dp_linear.DpLogistic | None = None
    dp_ridge: dp_linear.DpRidge | None = None
    if nuisance == "dp_linear":
        # calibrate for the smallest fold a fit runs on: calibrating for the smallest m is
        # conservative for a larger fold (sensitivity decreases in m, proof §10).
        if cross_fit:
            m_pi = m_mu = min(sizes)
        else:
            m_pi = sizes[modules.index("propensity")] if observational else 0
            m_mu = sizes[modules.index("outcome")]
        d = domain.q + 1
        if observational:
            lam_pi = params.regularization or dp_linear.default_regularization(m_pi)
            dp_logistic = dp_linear.DpLogistic.plan(m_pi, d, epsilon_pi, delta_pi, lam_pi)
        # the ridge floor defaults to the public noise sd of Gram / m (dp_linear).
        dp_ridge = dp_linear.DpRidge.plan(m_mu, d, epsilon_mu, delta_mu, params.regularization)

    # proof §13: adaptive clipping takes a public share of the estimation epsilon (delta 0).
    quantile_epsilon: float | None = None
    if params.adaptive_clip:
        quantile_epsilon, epsilon_stat = split_share(epsilon_stat, ADAPTIVE_CLIP_SHARE)
    # proof step 3: estimation budget split, sensitivities and lattice Gaussian calibration.
    epsilon_theta, epsilon_v = split_share(epsilon_stat, mean_share)
    delta_theta, delta_v = split_share(delta_stat, mean_share)
    sensitivity_theta = _float_slack(2.0 * bound / n2, n2)
    sensitivity_m2 = _float_slack(bound * bound / n2, n2)
    mean = calibrate_gaussian(epsilon_theta, delta_theta, sensitivity_theta)
    second_moment = calibrate_gaussian(epsilon_v, delta_v, sensitivity_m2)

    events: list[NoiseEvent] = []
    q = domain.q
    if dp_ebm is not None:
        if "propensity" in modules:
            events.append(nuisance_event("propensity", epsilon, delta, dp_ebm, q, 1.0))
        events.append(nuisance_event("outcome", epsilon, delta, dp_ebm, q + 1, big_r))
    nuisance_module = "nuisance" if cross_fit else None
    if dp_logistic is not None:
        events.append(
            _dp_linear_event(
                nuisance_module or "propensity",
                "dp_logistic_regression_weights",
                dp_logistic,
                cross_fit,
            )
        )
    if dp_ridge is not None:
        events.append(
            _dp_linear_event(
                nuisance_module or "outcome",
                "per_arm_ridge_sufficient_statistics",
                dp_ridge,
                cross_fit,
            )
        )
    if quantile_epsilon is not None:
        events.append(quantile_event(quantile_epsilon, bound, n2))
        events.append(adaptive_gaussian_event("mean_pseudo_outcome", "2 K / n2", mean, bound))
        events.append(
            adaptive_gaussian_event(
                "second_moment_pseudo_outcome", "K^2 / n2", second_moment, bound
            )
        )
    else:
        events.append(gaussian_event("mean_pseudo_outcome", 2.0 * bound / n2, mean, bound))
        events.append(
            gaussian_event("second_moment_pseudo_outcome", bound * bound / n2, second_moment, bound)
        )
    # proof step 6: within a module, sequential composition; across modules, the max.
    # Cross-fitting (proof §12): every event composes sequentially; each nuisance event is one
    # mechanism run in parallel on the two disjoint halves, so it is counted once.
    # Sums are exact-then-rounded (fsum): every split above adds up exactly, so the exact sum
    # of the shares is the requested total.
    per_module: dict[str, list[NoiseEvent]] = {}
    for event in events:
        per_module.setdefault("all" if cross_fit else event.module, []).append(event)
    cost_epsilon = max(math.fsum(e.epsilon for e in group) for group in per_module.values())
    cost_delta = max(math.fsum(e.delta for e in group) for group in per_module.values())
    if cost_epsilon != epsilon or cost_delta != delta:  # pragma: no cover - guarded by the split
        raise InvalidParameters("internal budget accounting mismatch")
    record = MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=Guarantee.STRICT,
        n=domain.n,
        fold_sizes=dict(zip(modules, sizes, strict=True)),
        composition=(
            Composition.THEOREM6_MAX
            if len(modules) > 1 and not cross_fit
            else Composition.SEQUENTIAL
        ),
        events=tuple(events),
        epsilon=cost_epsilon,
        delta=cost_delta,
    )
    return _Plan(
        params=params,
        design=domain.design,
        nuisance=nuisance,
        modules=modules,
        fold_sizes=sizes,
        bound=bound,
        bound_natural=bound_natural,
        propensity=propensity,
        dp_ebm=dp_ebm,
        dp_logistic=dp_logistic,
        dp_ridge=dp_ridge,
        cross_fit=cross_fit,
        mean_share=mean_share,
        nuisance_share=share,
        mean=mean,
        second_moment=second_moment,
        record=record,
        quantile_epsilon=quantile_epsilon,
    )


def _dp_linear_event(
    module: str,
    statistic: str,
    model: dp_linear.DpLogistic | dp_linear.DpRidge,
    cross_fit: bool,
) -> NoiseEvent:
    """The Gaussian event of a DP logistic (weights) or ridge (sufficient statistics) fit."""
    calibration = model.calibration
    return NoiseEvent(
        type="gaussian",
        module=module,
        epsilon=calibration.epsilon,
        delta=calibration.delta,
        params={
            "statistic": statistic,
            "sampler": "opendp discrete gaussian on 2^k lattice",
            "parallel_folds": 2 if cross_fit else 1,
            "fit_size": model.m,
            "regularization": model.regularization,
            "intercept": dp_linear.INTERCEPT,
            "dim": calibration.dim,
            "sensitivity_l2": calibration.sensitivity_l2,
            "sensitivity_l2_effective": calibration.sensitivity_l2_effective,
            "lattice_exponent": calibration.lattice_exponent,
            "noise_multiplier": calibration.noise_multiplier,
            "sigma": calibration.sigma,
            "mu": calibration.mu,
        },
    )


def gaussian_event(
    statistic: str, nominal_sensitivity: float, calibration: GaussianCalibration, bound: float
) -> NoiseEvent:
    return NoiseEvent(
        type="gaussian",
        module="estimation",
        epsilon=calibration.epsilon,
        delta=calibration.delta,
        params={
            "statistic": statistic,
            "sampler": "opendp discrete gaussian on 2^k lattice",
            "bound": bound,
            "sensitivity_l2_nominal": nominal_sensitivity,
            "sensitivity_l2": calibration.sensitivity_l2,
            "sensitivity_l2_effective": calibration.sensitivity_l2_effective,
            "lattice_exponent": calibration.lattice_exponent,
            "noise_multiplier": calibration.noise_multiplier,
            "sigma": calibration.sigma,
            "mu": calibration.mu,
        },
    )


def quantile_event(epsilon: float, bound: float, n2: int) -> NoiseEvent:
    """The pure-DP quantile of |Gamma| that sets the adaptive clip (proof §13)."""
    grid = adaptive_clip_candidates(bound)
    return NoiseEvent(
        type="exponential_quantile",
        module="estimation",
        epsilon=epsilon,
        delta=0.0,
        params={
            "statistic": "quantile_abs_pseudo_outcome",
            "sampler": "opendp make_private_quantile (replace-one, sized)",
            "level": ADAPTIVE_CLIP_LEVEL,
            "candidates": int(grid.size),
            "candidate_min": float(grid[0]),
            "candidate_max": float(grid[-1]),
            "inflation": adaptive_clip_inflation(n2),
            "share_of_estimation_epsilon": ADAPTIVE_CLIP_SHARE,
        },
    )


def adaptive_gaussian_event(
    statistic: str, sensitivity_rule: str, calibration: GaussianCalibration, bound: float
) -> NoiseEvent:
    """A Gaussian whose sensitivity follows the released clip K <= B (proof §13): its
    (epsilon, delta) and noise multiplier are fixed here; sigma is at most ``sigma_max``."""
    return NoiseEvent(
        type="gaussian",
        module="estimation",
        epsilon=calibration.epsilon,
        delta=calibration.delta,
        params={
            "statistic": statistic,
            "sampler": "opendp discrete gaussian on 2^k lattice",
            "bound": "adaptive",
            "bound_max": bound,
            "sensitivity_l2_rule": sensitivity_rule,
            "noise_multiplier": calibration.noise_multiplier,
            "sigma_max": calibration.sigma,
        },
    )


def plan(domain: PublicDomain, params: AteStrictParams) -> MechanismRecord:
    """Validate the request and compute its mechanism record (the cost) without data.

    Raises:
        InvalidParameters: any invalid parameter (before any charge).
    """
    return _make_plan(domain, params).record


def _public_parameters(state: _Plan) -> dict[str, Any]:
    params = state.params
    return {
        "mode": "strict",
        "guarantee": str(Guarantee.STRICT),
        "estimator": "aipw",
        "design": str(state.design),
        "nuisance": state.nuisance,
        "cross_fit": state.cross_fit,
        "nuisance_share": state.nuisance_share,
        "epsilon": state.record.epsilon,
        "delta": state.record.delta,
        "alpha": params.alpha,
        "propensity_clip": params.propensity_clip if state.propensity is None else None,
        "treatment_probability": state.propensity,
        "pseudo_outcome_clip": params.pseudo_outcome_clip,
        "bound": state.bound,
        "fold_sizes": dict(state.record.fold_sizes),
        "mean_share": state.mean_share,
        "variance_inflation": params.variance_inflation,
        "alpha_v": params.alpha_v,
        "clip": "adaptive" if state.quantile_epsilon is not None else "declared",
        "bound_max": state.bound,
    }


def adaptive_calibrations(
    state: _Plan, clip: float
) -> tuple[GaussianCalibration, GaussianCalibration]:
    """proof §13: the mean and second-moment Gaussians at the clip K, with the (epsilon, delta)
    fixed by the plan: sensitivities ``2K / n2`` and ``K^2 / n2`` plus the float slack."""
    n2 = state.n2
    mean = calibrate_gaussian(
        state.mean.epsilon, state.mean.delta, _float_slack(2.0 * clip / n2, n2)
    )
    second = calibrate_gaussian(
        state.second_moment.epsilon, state.second_moment.delta, _float_slack(clip * clip / n2, n2)
    )
    return mean, second


def assumed_pseudo_outcome_sd(domain: PublicDomain) -> float:
    """Quote only: the public scale assumption R / ``ADAPTIVE_QUOTE_RANGE_RATIO``."""
    return domain.outcome_range / ADAPTIVE_QUOTE_RANGE_RATIO


def _assumed_clip(domain: PublicDomain, state: _Plan) -> float:
    """The clip K the quote expects: kappa(n2) times the 0.9-quantile of |N(0, sd^2)|."""
    quantile = float(ndtri(0.5 + ADAPTIVE_CLIP_LEVEL / 2.0)) * assumed_pseudo_outcome_sd(domain)
    return adaptive_clip_bound(quantile, state.bound, state.n2)


def quote(
    domain: PublicDomain, params: AteStrictParams, *, target_half_width: float | None = None
) -> dict[str, Any]:
    """Public accuracy preview (ate_ci.md §3.6): no data, no charge.

    The CI half-width is at least ``z_{1 - alpha/2} s_theta``. With ``target_half_width``, also
    returns the smallest epsilon (other parameters fixed) whose minimum half-width is at most the
    target, or None if no epsilon up to ``MAX_EPSILON`` reaches it.

    Raises:
        InvalidParameters: invalid parameters.
    """
    state = _make_plan(domain, params)
    z = float(ndtri(1.0 - state.params.alpha / 2.0))
    out: dict[str, Any] = {
        **_public_parameters(state),
        "ci_level": 1.0 - state.params.alpha,
        "min_half_width": z * state.mean.sigma,
        "expected_half_width": z * state.mean.sigma,
        "half_width_basis": "noise_only",
        "s_theta": state.mean.sigma,
        "s_2": state.second_moment.sigma,
        "n2": state.n2,
    }
    if state.quantile_epsilon is not None:
        # proof §13: the noise follows the released clip K; the quote assumes a public scale.
        smallest = adaptive_clip_bound(
            float(adaptive_clip_candidates(state.bound)[0]), state.bound, state.n2
        )
        assumed_sd = assumed_pseudo_outcome_sd(domain)
        clip = _assumed_clip(domain, state)
        expected_mean, expected_second = adaptive_calibrations(state, clip)
        out.update(
            {
                "min_half_width": z * adaptive_calibrations(state, smallest)[0].sigma,
                "max_noise_half_width": z * state.mean.sigma,
                "expected_half_width": z
                * math.sqrt(assumed_sd**2 / state.n2 + expected_mean.sigma**2),
                "half_width_basis": "assumed_scale",
                "assumed_pseudo_outcome_sd": assumed_sd,
                "expected_clip": clip,
                "s_theta": expected_mean.sigma,
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
    """Smallest epsilon (rounded up) with ``z_{1-alpha/2} s_theta(epsilon) <= half_width``.

    Bisection on the public formula, all other parameters (delta, folds, shares) fixed.

    Returns:
        epsilon in [MIN_EPSILON, MAX_EPSILON], or None if unreachable at MAX_EPSILON.

    Raises:
        InvalidParameters: invalid parameters or half-width.
    """
    target = validate_finite_positive(half_width, "target_half_width")
    _make_plan(domain, params)  # validate the request as given
    if (
        params.nuisance == "dp_linear"
        and not params.cross_fit
        and params.fold_fractions is None
        and domain.design == StudyDesign.OBSERVATIONAL
        and _small_folds_fit(domain.n)
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
    base = _make_plan(domain, params)
    z = float(ndtri(1.0 - base.params.alpha / 2.0))
    sensitivity = base.mean.sensitivity_l2
    delta = base.record.delta
    sampling_variance = 0.0
    if base.quantile_epsilon is not None:
        sensitivity = _float_slack(2.0 * _assumed_clip(domain, base) / base.n2, base.n2)
        sampling_variance = assumed_pseudo_outcome_sd(domain) ** 2 / base.n2

    def reaches(epsilon: float) -> bool:
        # the shares may depend on epsilon (public cross-fitting rule): re-resolve them and
        # split epsilon and delta exactly as _make_plan does.
        nuisance_share, share = resolved_shares(domain, epsilon, delta, base.bound, base.params)
        delta_stat = delta
        if nuisance_share is not None:
            _, epsilon = split_share(epsilon, nuisance_share)
            _, delta_stat = split_share(delta, nuisance_share)
        if base.quantile_epsilon is not None:
            _, epsilon = split_share(epsilon, ADAPTIVE_CLIP_SHARE)
        epsilon_theta, _ = split_share(epsilon, share)
        delta_theta, _ = split_share(delta_stat, share)
        sigma = calibrate_gaussian(epsilon_theta, delta_theta, sensitivity).sigma
        return z * math.sqrt(sampling_variance + sigma * sigma) <= target

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


# ---- running (after the charge) -------------------------------------------------------------


def _dp_ebm(state: _Plan) -> DpEbmAccounting:
    if state.dp_ebm is None:
        raise ValueError("no DP-EBM accounting in this plan")
    return state.dp_ebm


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
    state = _make_plan(domain, params)
    try:
        return _run(arrays, domain, state, rng=rng, noise=noise, progress=progress)
    except Exception:
        # threats.md §3: one generic error, no cause chain (it could quote data).
        raise ReleaseFailed() from None


def _run(
    arrays: Arrays,
    domain: PublicDomain,
    state: _Plan,
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
        pi_hat = propensity_scores(
            x[pi_fold], a[pi_fold], x2, lower, upper, _dp_ebm(state), clip=params.propensity_clip
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
        mu0_hat, mu1_hat = outcome_predictions(
            x[mu_fold], a[mu_fold], y[mu_fold], x2, lower, upper, low, high, _dp_ebm(state)
        )
        progress(0.75, "outcome")

    # proof step 1 (applied): |Gamma| <= B by construction, then clip to [-B, B] (or K).
    gamma = pseudo_outcomes(a2, y2, pi_hat, mu0_hat, mu1_hat, bound=state.bound)
    del x2, a2, y2, pi_hat, mu0_hat, mu1_hat
    return _estimate(gamma, state, noise, progress)


def _linear_propensity(
    x_fit: NDArray[np.float64],
    a_fit: NDArray[np.float64],
    x_predict: NDArray[np.float64],
    domain: PublicDomain,
    state: _Plan,
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
    state: _Plan,
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
    state: _Plan,
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


def _estimate(
    gamma: NDArray[np.float64], state: _Plan, noise: NoiseSampler, progress: Progress
) -> dict[str, Any]:
    """proof steps 3, 5, 7: DP mean and second moment of Gamma, then the CI."""
    params = state.params
    # proof step 3 (applied): exact-then-rounded sums; the sensitivities include the slack.
    if gamma.size != state.n2:
        raise ValueError("estimation size differs from the plan")
    bound, mean, second = state.bound, state.mean, state.second_moment
    if state.quantile_epsilon is not None:
        # proof §13: an epsilon_q-DP quantile of |Gamma| on the public grid sets the clip K.
        quantile = noise.quantile(
            np.abs(gamma),
            candidates=adaptive_clip_candidates(state.bound),
            level=ADAPTIVE_CLIP_LEVEL,
            epsilon=state.quantile_epsilon,
        )
        bound = adaptive_clip_bound(quantile, state.bound, state.n2)
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
        **_public_parameters(state),
        "bound": bound,  # the clip used: B, a public K, or the DP-derived adaptive K
    }
    progress(1.0, "done")
    return result
