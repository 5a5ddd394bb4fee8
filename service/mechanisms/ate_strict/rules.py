"""Public rules of the strict ATE: parameters, validation, fold layouts, budget shares and
defaults. Every rule reads public inputs only (n, epsilon, delta, the public schema), never data.

Proof of the mechanism: ``docs/proofs/ate_strict.md``; the rules are §1, §6 and §10–§13 there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from service.mechanisms.calibration import (
    analytic_gaussian_multiplier,
    default_delta,
    validate_alpha,
    validate_finite_positive,
)
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.dp_ebm import DP_EBM_LEARNING_RATE
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.partition import (
    MIN_FOLD_SIZE,
    at_least_min_fold,
    checked_fractions,
    fold_sizes,
)

MECHANISM = "ate_strict"


# 2: public default rules (issue 3); 3: charged adaptive clipping (issue 12); 4: DP-EBM
# observational default folds (0.1, 0.4, 0.5) from n epsilon = 2 * 10^4 (issue 12); 5: DP-EBM
# nuisance learning rates by n epsilon (issue 12); 6: DP quantile bins for the DP-EBM nuisances'
# continuous covariates (issue 12); 7: adjustment_columns, the declared adjustment set (issue 12);
# 8: dp_linear nuisances by default on observational designs below n epsilon = 2 * 10^4 (issue 12);
# 9: that switch at n epsilon = 10^4 where the nuisance models see at most 12 covariates, linear
# up to 2 * 10^4 at 36 (issue 12); 10: the DP-EBM outcome model's range measured by two charged
# DP quantiles (issue 12); 11: subsample and aggregate, ``chunks`` (issue 12)
VERSION = "11"


Nuisance = Literal["dp_ebm", "dp_linear", "none"]


NUISANCES: tuple[str, ...] = ("dp_ebm", "dp_linear", "none")


Progress = Callable[[float, str], None]


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


# DP-EBM nuisances (observational), public rule: from n * epsilon =
# DP_EBM_OUTCOME_FOLDS_MIN_N_EPSILON the propensity fold shrinks to 0.1 n (at least
# MIN_FOLD_SIZE records) and the outcome fold grows to the rest of the first half: the DP
# classifier's residuals are bounded by 1, the outcome regressor's by R_Y, so the outcome model
# is the noisier nuisance (as for ebm_cate's DR folds). On the realistic observational studies
# (36 covariates, 30 releases per cell; bench/README.md, "DP-EBM folds of the observational
# default") the RMSE was 0.68-1.04x the spec folds' from n * epsilon = 2 * 10^4 (n 5000, eps 4:
# 1.23 / 1.40 to 0.93 / 1.08) and 1.19-2.70x below it, where the small propensity fold's noise
# dominates: there the spec's folds stay.
DEFAULT_FOLDS_OBSERVATIONAL_DP_EBM = (0.1, 0.4, 0.5)
DP_EBM_OUTCOME_FOLDS_MIN_N_EPSILON = 20_000.0


# DP-EBM nuisance learning rates (classifier, regressor), public rule: interpret's 0.01 below
# DP_EBM_FAST_LEARNING_MIN_N_EPSILON, DP_EBM_FAST_LEARNING_RATES from it. interpret's DP
# boosting takes plain gradient steps: the classifier's step in logit units is the learning
# rate times (A - p), a Newton step would divide it by p (1 - p) (about 0.24 here), so at 0.01
# the 300 rounds reach about 40 % of the true logit even without noise (the regressor about
# 85 %), and both nuisances under-adjust for confounding. A larger rate converges further but
# its noise grows with it, so it pays only where n epsilon is large (bench/README.md, "DP-EBM
# learning rates of the observational default"). interpret scales each step's noise with the
# rate, so mu, the privacy, does not depend on it. On the realistic observational studies
# (12 releases per cell, same samples) the RMSE was 0.39-0.72x interpret's rate's in all 10
# cells with n epsilon >= 10^5 (n 5 * 10^4 and 10^5, eps 1-4), and 1.07 / 0.87x at 8 * 10^4,
# 2.2-2.9x at 2 * 10^4, where the noise dominates.
DP_EBM_FAST_LEARNING_RATES = (0.04, 0.02)
DP_EBM_FAST_LEARNING_MIN_N_EPSILON = 100_000.0
# ... and with the outcome model's range measured (version 10, proof §16) the regressor's step
# noise, which interpret scales with learning rate x target range, is about 2.6x smaller on the
# realistic studies (range about 21 of the declared 65), so the regressor's faster rate pays from
# n epsilon = 2 * 10^4: with the measured range, 0.02 against 0.01 gave RMSE (output noise
# included) 0.72 against 0.79 at n 20000, eps 1 and 0.29 against 0.36 at n 50000, eps 1, bias
# +0.29 / +0.13 against +0.44 / +0.25 (20 and 15 releases; bench/README.md, "The outcome
# model's measured range"). The classifier's faster rate did not pay there (RMSE 1.13-1.17x).
MEASURED_RANGE_REGRESSOR_RATE = 0.02
MEASURED_RANGE_FAST_REGRESSOR_MIN_N_EPSILON = 20_000.0


# The outcome model's measured range (proof §16) is on by default from this n * epsilon, where
# the DP-EBM default's outcome fold (0.4 n) gives each quantile (epsilon / 20) at least 400
# record-epsilons: on the realistic outcomes the released tail levels then fell in
# [0.0006, 0.038] for the planned 0.02 (20 draws at 8000 rows, eps 0.05); over 200 draws the
# range was 19-24 wide in most (median 23.4 of the declared 65) but wider than 40 in 11 %, where
# the upper quantile strays into the empty tail (a safe miss: towards the declared range). At 2500
# rows they drifted to the grid's ends (the declared range again, with a tenth of the budget
# spent). Below it the DP-EBM outcome model keeps the declared range; a request may still ask.
OUTCOME_RANGE_MIN_N_EPSILON = 20_000.0


DEFAULT_FOLDS_RCT = (0.5, 0.5)  # outcome, estimation


# Randomised designs with dp_linear cross-fit above this n * epsilon (``default_cross_fit``).
RCT_CROSS_FIT_MIN_N_EPSILON = 10_000.0


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
            ``dp_linear`` when n epsilon <= 5000, (0.1, 0.4, 0.5) observational with
            ``dp_ebm`` when n epsilon >= 20000, (0.5, 0.5) RCT, (1.0,) RCT without nuisance).
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
        quantile_bins: DP quantile bins (proof §14, ``service.mechanisms.quantile_bins``): each
            DP-EBM nuisance spends ``quantile_bins.SHARE`` of its module's (epsilon, delta) on
            noisy histograms of its fold's continuous covariates and is fitted on their
            released CDF values (``dp_ebm`` only; needs a continuous covariate). None means the
            public rule (``calibration.plan_quantile_bins``): on where DP-EBM nuisances are
            fitted, the schema declares a continuous covariate and the released CDF is accurate
            enough on the smallest DP-EBM fold.
        adjustment_columns: the covariate positions the nuisance models adjust for (proof
            §15: the mechanism runs on the records' projection onto them, a public row-wise
            map); None means every covariate. Increasing, validated by ``checked_columns``.
        outcome_range: the measured outcome range (proof §16,
            ``service.mechanisms.outcome_range``): the DP-EBM outcome model spends
            ``outcome_range.SHARE`` of its epsilon on two DP quantiles of its fold's outcomes
            and is fitted, with its noise calibrated, on that range instead of the declared
            one (``dp_ebm`` only). None means the public rule: on where a DP-EBM outcome model
            is fitted and n epsilon >= ``OUTCOME_RANGE_MIN_N_EPSILON``.
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
    quantile_bins: bool | None = None
    adjustment_columns: tuple[int, ...] | None = None
    outcome_range: bool | None = None


# Below this n epsilon the observational default's nuisances on 36 or more covariates are
# dp_linear, from it DP-EBM (the DP-EBM fold rule's switch too): on the realistic studies
# (bench/README.md, "The observational default's nuisances by n epsilon") the DP-EBM nuisances
# fitted on a few hundred rows under heavy noise moved the estimate by more than its interval
# (coverage 0.72 / 0.84 at n 1000, eps 1 / 4, 200 releases, RMSE 2-3x dp_linear's); dp_linear
# had the smaller RMSE and the higher coverage in every cell measured up to n eps = 10^4
# (0.855-0.99), DP-EBM from 2 * 10^4, where dp_linear's shrinkage bias shows (coverage
# 0.00-0.75).
LINEAR_NUISANCE_BELOW_N_EPSILON = 20_000.0
# ... measured with the 36 covariates; with the studies' 12 declared confounders as the
# adjustment set (bench/README.md, "The switch with a declared adjustment set"; 40 releases per
# cell) DP-EBM's RMSE was 1.20-1.26x dp_linear's at n eps = 5000, 0.69-1.38x (geometric mean
# 0.96) at 10^4 and 0.66-0.80x at 2 * 10^4, with coverage 0.80-0.95 against 0.575-0.95: the
# models spread their budget over fewer features. So the switch is at n eps = 10^4 for an
# adjustment set of at most LINEAR_NUISANCE_FEW_COLUMNS covariates, 2 * 10^4 from
# LINEAR_NUISANCE_MANY_COLUMNS, linear in between (``linear_nuisance_threshold``), and held
# constant outside the measured sizes: below 12 covariates at 10^4 (on the mechanism benchmark's
# small-q Dataset 1, 2026-11-21, DP-EBM covered 0.983 in both cells at n eps = 10^4, 60 releases
# each), above 36 at 2 * 10^4.
LINEAR_NUISANCE_BELOW_N_EPSILON_FEW = 10_000.0
LINEAR_NUISANCE_FEW_COLUMNS = 12
LINEAR_NUISANCE_MANY_COLUMNS = 36


def linear_nuisance_threshold(columns: int) -> float:
    """The n epsilon from which the observational default's nuisances are DP-EBM, for nuisance
    models that see ``columns`` covariates (public: the schema's q or the adjustment set)."""
    few, many = LINEAR_NUISANCE_FEW_COLUMNS, LINEAR_NUISANCE_MANY_COLUMNS
    if columns <= few:
        return LINEAR_NUISANCE_BELOW_N_EPSILON_FEW
    if columns >= many:
        return LINEAR_NUISANCE_BELOW_N_EPSILON
    span = LINEAR_NUISANCE_BELOW_N_EPSILON - LINEAR_NUISANCE_BELOW_N_EPSILON_FEW
    return LINEAR_NUISANCE_BELOW_N_EPSILON_FEW + span * (columns - few) / (many - few)


def default_nuisance(
    domain: PublicDomain,
    epsilon: float,
    *,
    quantile_bins: bool | None = None,
    cross_fit: bool | None = None,
    adjustment_columns: tuple[int, ...] | list[int] | None = None,
    outcome_range: bool | None = None,
) -> Nuisance:
    """Public rule for an omitted strict nuisance: the preset a request's preset-only option
    needs (``quantile_bins: true`` or ``outcome_range: true``: ``dp_ebm``; ``cross_fit: true``:
    ``dp_linear``), else
    ``dp_linear`` on randomised designs (the outcome model only reduces variance there, and on
    the realistic trials of bench.realistic the DP linear outcome model gave CIs 1.0-1.8x
    narrower than DP-EBM's at every n and epsilon measured:
    bench/results/realistic-after-rct.json); on observational ones ``dp_linear`` below n epsilon
    = ``linear_nuisance_threshold`` of the number of covariates the models see (the request's
    ``adjustment_columns``, else the schema's declared adjustment set, else all q), ``dp_ebm``
    from there. Public n, the schema and the request only."""
    if quantile_bins is True or outcome_range is True:
        return "dp_ebm"
    if cross_fit is True:
        return "dp_linear"
    if domain.design == StudyDesign.RCT:
        return "dp_linear"
    columns = (
        adjustment_columns
        if adjustment_columns is not None
        else default_adjustment_columns(domain, None)
    )
    seen = domain.q if columns is None else len(columns)
    small = float(domain.n) * float(epsilon) < linear_nuisance_threshold(seen)
    return "dp_linear" if small else "dp_ebm"


def default_adaptive_clip(domain: PublicDomain, pseudo_outcome_clip: float | None) -> bool:
    """Public rule for an omitted clip choice: adaptive on randomised designs unless a public
    ``pseudo_outcome_clip`` was given (proof §13; bench/results/realistic-*.json)."""
    return pseudo_outcome_clip is None and domain.design == StudyDesign.RCT


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
        and small_folds_fit(domain.n)
    ):
        return DEFAULT_FOLDS_OBSERVATIONAL_DP_LINEAR
    if (
        nuisance == "dp_ebm"
        and epsilon is not None
        and domain.n * epsilon >= DP_EBM_OUTCOME_FOLDS_MIN_N_EPSILON
    ):
        folds = dp_ebm_outcome_folds(domain.n)
        if folds is not None:
            return folds
    return DEFAULT_FOLDS_OBSERVATIONAL


def dp_ebm_outcome_folds(n: int) -> tuple[float, float, float] | None:
    """``DEFAULT_FOLDS_OBSERVATIONAL_DP_EBM`` with the propensity fold raised to
    ``MIN_FOLD_SIZE`` records where 0.1 n is fewer (taken from the outcome fold; the estimation
    half is unchanged); None where the outcome fold would then fall below it. Public n only."""
    propensity, outcome, estimation = DEFAULT_FOLDS_OBSERVATIONAL_DP_EBM
    raised = at_least_min_fold(propensity, n)
    folds = (raised, propensity + outcome - raised, estimation)
    return folds if min(fold_sizes(n, folds)) >= MIN_FOLD_SIZE else None


def dp_ebm_learning_rates(
    n: int, epsilon: float, measured_range: bool = False
) -> tuple[float, float]:
    """The DP-EBM nuisances' (classifier, regressor) learning rates: a public function of n,
    the requested epsilon and whether the outcome model's range is measured
    (``DP_EBM_FAST_LEARNING_RATES`` from ``DP_EBM_FAST_LEARNING_MIN_N_EPSILON``; below it
    interpret's default, but the regressor's ``MEASURED_RANGE_REGRESSOR_RATE`` from
    ``MEASURED_RANGE_FAST_REGRESSOR_MIN_N_EPSILON`` when its range is measured)."""
    if n * epsilon >= DP_EBM_FAST_LEARNING_MIN_N_EPSILON:
        return DP_EBM_FAST_LEARNING_RATES
    if measured_range and n * epsilon >= MEASURED_RANGE_FAST_REGRESSOR_MIN_N_EPSILON:
        return (DP_EBM_LEARNING_RATE, MEASURED_RANGE_REGRESSOR_RATE)
    return (DP_EBM_LEARNING_RATE, DP_EBM_LEARNING_RATE)


def default_cross_fit(
    domain: PublicDomain,
    nuisance: Nuisance,
    fold_fractions: tuple[float, ...] | None,
    epsilon: float,
) -> bool:
    """Public rule for an omitted ``cross_fit`` (``dp_linear``, no fold fractions given).

    Observational: cross-fit above ``n epsilon = DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON``. Below it
    the split estimator (small folds) covers and is narrower; above it the split estimator
    under-covers (0.918-0.926 at n epsilon >= 25000) while cross-fitting stays in [0.93, 0.97]
    (bench/results/ate_coverage-grid-rules.json, 500 reps per cell).

    Randomised: cross-fit above ``n epsilon = RCT_CROSS_FIT_MIN_N_EPSILON``. The split design
    averages over half the rows; cross-fitting averages over all of them with outcome models at
    half the budget. On the realistic trials (rct_strong, 20-30 releases per cell) the interval
    was 14-26 % narrower cross-fitted at n epsilon = 2 * 10^4 and 8 * 10^4, and 15 % wider at
    n epsilon = 7,500 and 5,000 (where the outcome models' noise dominates).
    """
    if nuisance != "dp_linear" or fold_fractions is not None:
        return False
    if domain.design == StudyDesign.RCT:
        return domain.n * epsilon > RCT_CROSS_FIT_MIN_N_EPSILON
    return domain.n * epsilon > DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON


def small_folds_fit(n: int) -> bool:
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
    validate_cross_fit(nuisance, cross_fit, fold_fractions)
    fractions = validate_fractions(domain, nuisance, fold_fractions, cross_fit, epsilon)
    return default_delta(min(fold_sizes(domain.n, fractions)))


def default_params(
    domain: PublicDomain,
    epsilon: float,
    delta: float | None = None,
    *,
    nuisance_epsilon: float | None = None,
) -> AteStrictParams:
    """The strict ``ate`` kind's single-release defaults at ``(epsilon, delta)``: the public
    rules for the nuisance, cross-fitting, the clip and (``delta=None``) delta, every other
    parameter at its default. What an ``ate`` request with only ``epsilon`` (and ``delta``) and
    ``chunks: 1`` runs (without ``chunks``, the chunks rule ``aggregate.default_chunks`` cuts an
    observational request in its range into chunks instead); other kinds reuse it as an adjusted
    DP ATE: the CATE kinds' whole-data anchor (``anchor.plan_ate_anchor``) and
    ``uplift_table``'s one-cell observational default (docs/proofs/uplift_table.md step 6).
    ``nuisance_epsilon`` (default ``epsilon``) is the budget whose rule picks the nuisance class:
    the anchor, at a share of a CATE's budget, takes the class of the ``ate`` release at the
    whole budget it stands in for. Public inputs only."""
    nuisance = default_nuisance(domain, epsilon if nuisance_epsilon is None else nuisance_epsilon)
    cross_fit = default_cross_fit(domain, nuisance, None, epsilon)
    if delta is None:
        delta = default_delta_for(domain, None, nuisance, cross_fit, epsilon)
    return AteStrictParams(
        epsilon=epsilon,
        delta=delta,
        nuisance=nuisance,
        cross_fit=cross_fit,
        adaptive_clip=default_adaptive_clip(domain, None),
        adjustment_columns=default_adjustment_columns(domain, nuisance),
    )


def default_adjustment_columns(
    domain: PublicDomain, nuisance: Nuisance | None
) -> tuple[int, ...] | None:
    """Public rule for omitted ``adjustment_columns``: the schema's declared adjustment set
    (proof §15), except where there are no nuisance models to adjust (``nuisance="none"``)."""
    return None if nuisance == "none" else domain.adjustment_set


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


def validate_cross_fit(
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
