"""ebm_cate's public rules and constants: the request parameters, the folds, the DR learner's
service defaults and the anchor's budget shares. Public n, epsilon and schema only; no data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from service.mechanisms import effect_screen as screening
from service.mechanisms.anchor import (
    ANCHOR_ALL_IN_N_EPSILON,
    ANCHOR_SHARE,
    ANCHOR_SHARE_NOISY,
    ate_anchor_share,
)
from service.mechanisms.ate_strict.rules import OUTCOME_RANGE_MIN_N_EPSILON
from service.mechanisms.calibration import default_delta
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.dp_ebm import (
    DP_EBM_MAX_BINS,
    DP_EBM_MAX_ROUNDS,
)
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.partition import (
    at_least_min_fold,
    checked_fractions,
    fold_sizes,
)

MECHANISM = "ebm_cate"
# 2: shrinkage "ate" (the anchored DR default, proof step 6); 3: RCT anchor (6.1); 4: effect
# columns (step 7) and 400 default effect rounds from n eps per effect-model covariate 10^4;
# 5: adjustment columns, the nuisance models on the declared adjustment set (step 8); 6: the
# effect-modifier screen (step 9): without declared effect columns the anchored DR learner
# spends a public share of the effect model's budget on a DP choice of the covariates it fits;
# 7: the DR learner's outcome model on its measured range (step 10, ate_strict proof §16);
# 8: a trial's anchor keeps the large share below anchor.ANCHOR_ALL_IN_N_EPSILON whatever the
# effect model's width (rct_anchor_share); 9: a trial's anchor is the ate default at its
# epsilon, the DP difference in means below n epsilon = 5 * 10^4 (step 6.1); 10: on observational
# designs the DR outcome model's measured range from n epsilon = 5000 (step 10)
VERSION = "10"

Learner = Literal["dr", "r", "s"]
Shrinkage = Literal["ate", "none"]
Progress = Callable[[float, str], None]

MIN_EPSILON = 0.05
MAX_EPSILON = 100.0
MAX_PREDICT_POINTS = 10_000
MIN_MAX_BINS, MAX_MAX_BINS = 4, 256
MIN_MAX_ROUNDS, MAX_MAX_ROUNDS = 10, 1000
# The quote warns below n * min(eps, 4) = 8000: there the DR learner (service defaults) was less
# accurate than the S-learner's constant ATE on at least 3 of Niu et al.'s 5 setups, at and
# above it on at most 2 (bench/results/ebm_cate_crossover.json: n 1000-16000, eps 1 and 4,
# 10 fits per cell; the spec's Voting guidance, dp_ebm_learners.md §6 item 11, was n ~ 20000
# at eps = 1 for Niu et al.'s configuration). eps above 4 was not measured, hence the cap.
SMALL_N_EPSILON_WARNING = 8000.0
WARNING_EPSILON_CAP = 4.0
# proof step 6 (shrinkage "ate"): the calibration rows are the last CALIBRATION_FRACTION of the
# effect fold (at least MIN_FOLD_SIZE records); the effect model is fitted on the others.
CALIBRATION_FRACTION = 0.2
MIN_CALIBRATION_ROWS = 20
# The factor keeps the deviations only where the DP calibration slope is significant at this
# one-sided level (pure noise: lambda = 0 with probability about 0.99).
CALIBRATION_LEVEL = 0.99
CALIBRATION_STATISTICS = 3  # sum g^2, sum r g, (G / K) sum r^2 over the calibration rows
# The released deviations are clipped to [-G, G], G = DEVIATION_BOUND_OF_K * K (public): the
# calibration sums' sensitivity is then G sqrt(G^2 + 5 K^2) instead of sqrt(6) K^2.
DEVIATION_BOUND_OF_K = 0.25
# The anchor's share of the effect fold's budget (public rule ``ebm_anchor_share``):
# anchor.ANCHOR_SHARE where n * epsilon / q >= EBM_USEFUL_N_EPSILON_PER_COVARIATE, else
# ANCHOR_SHARE_NOISY. On the
# realistic studies (bench/README.md, "ebm_cate and uplift_table anchored") the DR effect model
# beat the constant ATE only at n * epsilon = 80000 (n 20000, eps 4; PEHE 2.1-2.3 against 3.15);
# at 20000 and below its deviations were noise (factor 0), so the release is the anchor and the
# anchor should get the budget. A switch on the public per-prediction noise scale (an earlier
# rule, since removed) was too rough for this kind (prediction_noise_sd: about 2x the deviations'
# sd at the data at n 20000, eps 4, so it would have chosen the noisy share there too).
# The switch reads n * epsilon per covariate: DP-EBM spends its budget over every feature's
# shape, so a model on 6 covariates learns at an n * epsilon that leaves one on 36 noise. A
# switch at n * epsilon = 50 000 regardless of q gave Niu et al.'s Setups (q = 6, n 16 000,
# eps 1) the noisy share and a factor of 0: CATE MSE 1.27 / 1.80 / 9.1 on B / D / E, the constant's,
# against 0.38 / 0.87 / 4.4 unanchored (bench/results/ebm_cate_target.json); at 0.2 they were
# 0.41-0.51 / 1.42-1.52 / 5.7-6.5 (2 fits each). On the realistic studies (q = 36) the switch is
# unchanged: n * epsilon >= 54 000, as before only n 20 000, eps 4 of the grid.
EBM_USEFUL_N_EPSILON_PER_COVARIATE = 1_500.0
# With the effect-modifier screen (proof step 9) the effect model learns from fewer records per
# covariate: the anchor gets the useful share from this n epsilon per schema covariate (q, not
# the screen's 8). Realistic studies, eps 1, q 36, strong heterogeneity (probes on the same
# samples, bench/README.md, "The effect-modifier screen"): at n 35 000 (972 per covariate) the
# screened default's PEHE was 3.05 with the noisy share (the constant DP ATE: 3.13) and 2.26
# with the useful one; at n 50 000 (1389) 3.01 against 2.03; at n 20 000 (556) the useful share
# gained nothing (3.05). Without heterogeneity at n 50 000 the useful share was no worse (PEHE
# 0.137 against 0.262; the constant DP ATE 0.222).
SCREENED_USEFUL_N_EPSILON_PER_COVARIATE = 900.0
# Randomised designs where the effect model can learn: the whole-data anchor's share. Niu et
# al.'s Setup B declared as an RCT (q = 6, n 16 000, eps 1): CATE MSE 1.27 at 0.8 (factor 0),
# 1.04 at 0.5, 0.61-0.74 at 0.35, 0.44-0.60 at 0.2 (2 fits each; unanchored v1: 0.34); the
# realistic rct_none trial at n 20 000, eps 4 (q = 36): the anchor's RMSE 1.46x the whole-budget
# ate release's at 0.2, 1.08x at 0.35, 0.97x at 0.5 (40 samples,
# bench/results/rct-anchor-20000-4.json). 0.35 keeps the anchor within 1.1x and most of the gain.
# A larger share trades the no-heterogeneity trial (1.12-1.81x the constant DP ATE at 0.35) for
# the DRLearner target, and a charged heterogeneity test before the split, which could choose the
# share per release, had no power where it was needed (bench/README.md, "Design probe: a charged
# heterogeneity test before the trial split"; bench/results/het_test.json).
RCT_USEFUL_ANCHOR_SHARE = 0.35
# proof step 6.1 (randomised designs): the anchor is the strict ``ate`` kind's default release
# (dp_linear outcome models, cross-fitted above n * epsilon = 10^4, adaptive clip; mean share
# anchor.ANCHOR_MEAN_SHARE) on all n records at the public share anchor.ate_anchor_share,
# composed sequentially with the DR pipeline at the rest. On the realistic trials the effect-fold
# anchor (AIPW with the DR learner's DP-EBM outcome model on 30 % of the rows, the effect fold's
# 70 %) was 1.2-2.7x less accurate than that constant DP ATE (bench/README.md, "ebm_cate and
# uplift_table anchored").


@dataclass(frozen=True)
class EbmCateParams:
    """Public request parameters.

    The defaults below are the mechanism's (Niu et al.'s configuration). The release kind
    fills an omitted K, folds, ``max_bins`` and ``max_rounds`` from ``service_defaults``
    instead, which for the DR learner is the public rule ``dr_defaults``.

    Attributes:
        epsilon, delta: the charged (epsilon, delta); each module gets (epsilon, delta).
        learner: ``"dr"`` (default, strict), ``"s"`` (strict, an ATE learner) or ``"r"``
            (paper label: data-dependent sample weights).
        propensity_clip: c; e_hat is clipped to [c, 1 - c] (observational designs).
        pseudo_outcome_clip: public K; pseudo-outcomes are clipped to [-K, K]. None: R_Y.
        fold_fractions: fractions per module (see ``modules``); None: Niu et al.'s defaults.
        max_bins: interpret's ``max_bins`` for every module (public; privacy-neutral: the
            binning and boosting noise scales do not depend on it). Default 32 (interpret's
            and Niu et al.'s). Fewer bins give every bin more records, so the noisy per-bin
            updates of the shape functions are smaller (bench/README.md, DP-EBM section).
        max_rounds: interpret's ``max_rounds`` for the final model (the effect model of DR/R,
            the outcome model of S); public and privacy-neutral (interpret spreads the same mu
            over the rounds, sigma_boost ~ sqrt(rounds)). The noise accumulated in a shape
            function grows like rounds x learning rate while the fitted signal saturates, so
            fewer rounds trade a little shrinkage for less noise. First-stage nuisance models
            always use interpret's 300: their shrinkage would bias the pseudo-outcomes (it did
            on Setup C: bench/README.md). Default 300 (interpret's and Niu et al.'s).
        shrinkage: ``"ate"`` (the DR learner's default; proof step 6): a public share of the
            effect fold's budget buys a DP ATE anchor of the effect fold (in an RCT: a public
            share of the whole budget buys the strict ATE release on all n, step 6.1, and the
            rest of the pipeline runs at the remainder), the effect model is
            fitted to pseudo-outcomes centred at it on the effect fold's fitting rows, and a
            DP calibration slope of the model's deviations on the fold's held-out calibration
            rows sets the factor lambda in [0, 1] of ``anchor + lambda * deviation`` (0 unless
            the deviations predict the held-out pseudo-outcomes significantly). ``"none"``:
            the unshrunk effect model (the S-learner's only value: its CATE is constant in x;
            the paper-label R-learner's too). None: ``"ate"`` for DR, ``"none"`` otherwise.
        effect_columns: the covariates (0-based positions in the schema's covariate order,
            increasing) the effect model of the DR / R learner may vary with: the analyst's
            pre-specified effect modifiers. The nuisance models still use every covariate, so
            confounding adjustment is unchanged; the effect model is additive in these only
            and constant in the others. Public, from the request. None: every covariate.
            interpret's boosting noise composes over the model's features and rounds, so with
            q' of q covariates each shape function's noise is sqrt(q' / q) as large and only
            q' noisy shapes are summed (proof step 7).
        adjustment_columns: the covariates (0-based positions, increasing) the first-stage
            nuisance models (the propensity and outcome DP-EBMs of the DR / R learner) adjust
            for: the analysis plan's adjustment set. Public, from the request or the schema's
            declared set (``default_adjustment_columns``). The nuisances are fitted on the
            records projected onto these columns, a public row-wise map (proof step 8).
            None: every covariate.
        effect_screen: the effect-modifier screen (proof step 9,
            ``service.mechanisms.effect_screen``): the anchored DR learner spends
            ``effect_screen.SHARE`` of the effect model's epsilon on a DP top-``COLUMNS`` choice
            of covariates by the covariance of the centred pseudo-outcomes with each, and fits
            the effect model on those. None: the public rule ``screen_rule`` (on where no
            effect columns are named and the schema has more than ``COLUMNS`` covariates).
        outcome_range: the DR learner's outcome model on its measured range (proof step 10,
            ``service.mechanisms.outcome_range``, as the strict ATE's, ate_strict proof §16): the
            outcome module spends ``outcome_range.SHARE`` of its epsilon on two DP quantiles of
            its fold's outcomes and fits the DP-EBM on that range, its noise calibrated to it.
            None: the public rule ``outcome_range_rule``.
        anchor: shrinkage ``"ate"`` only (proof step 6.5): a public ATE to anchor at, e.g. the
            estimate of a DP ATE release the analyst already has, in [-R_Y, R_Y]; no anchor is
            bought, so the whole budget goes to the DR pipeline. None: the DP anchor of step
            6.1.
    """

    epsilon: float
    delta: float
    learner: Learner = "dr"
    propensity_clip: float = 0.05
    pseudo_outcome_clip: float | None = None
    fold_fractions: tuple[float, ...] | None = None
    max_bins: int = DP_EBM_MAX_BINS
    max_rounds: int = DP_EBM_MAX_ROUNDS
    shrinkage: Shrinkage | None = None
    effect_columns: tuple[int, ...] | None = None
    adjustment_columns: tuple[int, ...] | None = None
    effect_screen: bool | None = None
    outcome_range: bool | None = None
    anchor: float | None = None


# On observational designs the DR learner's outcome model is fitted on its measured range from
# this n * epsilon (below the ATE's OUTCOME_RANGE_MIN_N_EPSILON): the effect fold's anchor
# (proof step 6.1) averages DR pseudo-outcomes clipped at K = 0.3 R_Y, and with the outcome
# model's noise calibrated to the declared range its residuals' skewed tail passed K in 11 % of
# rows, so the clip moved the anchor by +0.31 / +0.50 at eps 2 / 1 (an observational
# walkthrough's length of stay, n 6000, 40 releases each); on the measured range the anchor's
# bias fell to +0.02 / +0.30 and its RMSE from 0.61 / 0.88 to 0.29 / 0.58 (bench/README.md, "The
# DR learner's outcome model on its measured range below n*eps = 2*10^4").
OBSERVATIONAL_OUTCOME_RANGE_MIN_N_EPSILON = 5_000.0


def outcome_range_rule(
    learner: Learner, n_epsilon: float, requested: bool | None, *, observational: bool = False
) -> bool:
    """Whether the DR learner's outcome model is fitted on its measured range (proof step 10):
    the request's ``outcome_range``, else on for the DR learner from the strict ATE's public
    ``n * epsilon`` threshold (``OUTCOME_RANGE_MIN_N_EPSILON``, with n epsilon the requested
    budget's), on ``observational`` designs from ``OBSERVATIONAL_OUTCOME_RANGE_MIN_N_EPSILON``.
    ``true`` for another learner is a 422. Public request, design and n only.

    On the realistic studies at n = 10^5, eps = 1 it cut the default's PEHE on observational
    data with strong heterogeneity from 1.43 to 1.36 (18 releases on the same samples; 1.455 to
    1.38 in 12 more) and left the trial's unchanged (1.24 and 1.24); at n 2 * 10^4 both stayed at
    the constant's (bench/README.md, "The DR learner's outcome model on its measured range")."""
    if requested is not None and not isinstance(requested, bool):
        raise InvalidParameters("outcome_range must be a boolean or null")
    if requested is True and learner != "dr":
        raise InvalidParameters("outcome_range is for the DR learner's outcome model")
    if requested is not None:
        return requested
    threshold = (
        OBSERVATIONAL_OUTCOME_RANGE_MIN_N_EPSILON if observational else OUTCOME_RANGE_MIN_N_EPSILON
    )
    return learner == "dr" and n_epsilon >= threshold


def screen_rule(
    q: int,
    learner: Learner,
    shrinkage: Shrinkage | None,
    effect_columns: tuple[int, ...] | list[int] | None,
    requested: bool | None,
) -> bool:
    """Whether the effect model's covariates are screened (proof step 9): the request's
    ``effect_screen``, else on for the anchored DR learner where no effect columns are named and
    the schema has more than ``effect_screen.COLUMNS`` covariates. ``true`` where the screen
    cannot run is a 422. Public request and schema only.

    On the realistic studies (q = 36, 7 modifiers) the screen cut the default's PEHE at
    n = 10^5, eps = 1 (bench/README.md, "The effect-modifier screen")."""
    if requested is not None and not isinstance(requested, bool):
        raise InvalidParameters("effect_screen must be a boolean or null")
    anchored_dr = learner == "dr" and shrinkage in (None, "ate")
    possible = anchored_dr and effect_columns is None and screening.screened(q)
    if requested is True and not possible:
        raise InvalidParameters(
            "effect_screen needs the anchored DR learner (shrinkage 'ate'), no effect_columns "
            f"and more than {screening.COLUMNS} covariates"
        )
    if requested is False:
        return False
    return possible


def default_adjustment_columns(domain: PublicDomain, learner: Learner) -> tuple[int, ...] | None:
    """Public rule for omitted ``adjustment_columns``: the schema's declared adjustment set
    for the DR and R learners (as the strict ``ate``'s nuisances, ate_strict proof §15); the
    S-learner has no nuisance model (None)."""
    return None if learner == "s" else domain.adjustment_set


def adjustment_width(q: int, params: EbmCateParams) -> int:
    """The number of covariates of the nuisance models: ``len(adjustment_columns)``, else q."""
    return q if params.adjustment_columns is None else len(params.adjustment_columns)


def effect_width(q: int, params: EbmCateParams) -> int:
    """The number of covariates of the effect model: ``len(effect_columns)``, the screen's
    ``COLUMNS`` where it runs (``effect_screen`` true: ``make_plan`` resolves it), else q."""
    if params.effect_columns is not None:
        return len(params.effect_columns)
    return screening.COLUMNS if params.effect_screen is True else q


def resolved_shrinkage(params: EbmCateParams) -> Shrinkage:
    """The request's shrinkage, or the learner's default (``"ate"`` for DR; ``make_plan``
    falls back to ``"none"`` where the effect fold is too small for calibration rows)."""
    if params.shrinkage is None:
        return "ate" if params.learner == "dr" else "none"
    return params.shrinkage


def modules(domain: PublicDomain, learner: Learner) -> tuple[str, ...]:
    """The fold names in partition order."""
    if learner == "s":
        return ("outcome",)
    if domain.design == StudyDesign.RCT:
        return ("outcome", "effect")
    return ("propensity", "outcome", "effect")


def default_fractions(domain: PublicDomain, learner: Learner) -> tuple[float, ...]:
    """Niu et al.: (0.25, 0.25, 0.5); RCT (known propensity): (0.5, 0.5); S: all rows."""
    count = len(modules(domain, learner))
    return {1: (1.0,), 2: (0.5, 0.5), 3: (0.25, 0.25, 0.5)}[count]


# The service's DR-learner defaults (a public rule; the mechanism's own defaults stay Niu et
# al.'s configuration). Chosen on simulated data of benchmarks.md §3 (screening seeds,
# bench/results/ebm_cate_screening.json), then measured on fresh seeds
# (bench/results/ebm_cate_target.json, 10 fits per setup, n = 16000, charged eps = 1).
# The outcome fold is the large one: the DR pseudo-outcome's error is driven by the DP outcome
# model (target range R_Y, or its measured range from version 7; d + 1 features), while the DP
# classifier's residuals are bounded by 1,
# so its fold can be small. On Setup C (strong confounding) the 40 % fold lowers the outcome
# model's RMSE from 1.78 to 1.34 (bench/results/ebm_cate_diagnosis.json); its error still biases
# the ATE there by about -0.45 through the clip at K.
DR_DEFAULT_K_OF_RANGE = 0.3
DR_DEFAULT_FOLDS = (0.1, 0.4, 0.5)  # propensity, outcome, effect
DR_DEFAULT_FOLDS_RCT = (0.3, 0.7)  # outcome, effect (the propensity is declared)
DR_DEFAULT_MAX_BINS = 16
DR_DEFAULT_MAX_ROUNDS = 200  # the effect model; the nuisances keep interpret's 300
# Where the effect model has n epsilon per covariate of at least DR_RICH_N_EPSILON_PER_COVARIATE
# (over its own covariates: effect_columns), its noise per boosting step is small enough that
# the shrinkage of 200 rounds at learning rate 0.01 dominates, and DR_RICH_MAX_ROUNDS rounds
# fit closer. Realistic studies, strong heterogeneity, n 10^5 (bench/README.md, "Pre-specified
# effect modifiers"): 36 covariates at eps 4 (11 111 per covariate), PEHE 1.41 -> 1.28 over 3
# releases; 7 covariates at eps 1 (14 286), 1.45 -> 1.28; 36 at eps 1 (2 778) 400 rounds were
# worse (1.9-2.1 against 1.6). interpret spreads the same mu over the rounds: privacy-neutral.
DR_RICH_N_EPSILON_PER_COVARIATE = 10_000.0
DR_RICH_MAX_ROUNDS = 400


def dr_default_folds(domain: PublicDomain) -> tuple[float, ...]:
    """``DR_DEFAULT_FOLDS`` with the propensity fold raised to ``MIN_FOLD_SIZE`` records where
    10 % of n is fewer (taken from the effect fold); RCT: ``DR_DEFAULT_FOLDS_RCT``. Public n only.
    """
    if len(modules(domain, "dr")) == 2:
        return DR_DEFAULT_FOLDS_RCT
    propensity, outcome, _ = DR_DEFAULT_FOLDS
    propensity = at_least_min_fold(propensity, domain.n)
    return (propensity, outcome, 1.0 - propensity - outcome)


def dr_default_rounds(n: int, epsilon: float, width: int) -> int:
    """The effect model's default ``max_rounds``: ``DR_RICH_MAX_ROUNDS`` where n epsilon per
    effect-model covariate (``width``) reaches ``DR_RICH_N_EPSILON_PER_COVARIATE``, else
    ``DR_DEFAULT_MAX_ROUNDS``. Public n, epsilon and request only."""
    if n * epsilon / max(width, 1) >= DR_RICH_N_EPSILON_PER_COVARIATE:
        return DR_RICH_MAX_ROUNDS
    return DR_DEFAULT_MAX_ROUNDS


def dr_defaults(domain: PublicDomain, epsilon: float, width: int | None = None) -> dict[str, Any]:
    """The DR learner's public default configuration for ``domain`` at ``epsilon`` with an
    effect model on ``width`` covariates (None: all q) (no data)."""
    return {
        "pseudo_outcome_clip": DR_DEFAULT_K_OF_RANGE * domain.outcome_range,
        "fold_fractions": dr_default_folds(domain),
        "max_bins": DR_DEFAULT_MAX_BINS,
        "max_rounds": dr_default_rounds(domain.n, epsilon, domain.q if width is None else width),
    }


def service_defaults(
    domain: PublicDomain, learner: Learner, epsilon: float, width: int | None = None
) -> dict[str, Any]:
    """What the service uses for an omitted K, folds, ``max_bins`` and ``max_rounds``: the DR
    rule above, and Niu et al.'s configuration (the ``EbmCateParams`` defaults) otherwise."""
    if learner == "dr":
        return dr_defaults(domain, epsilon, width)
    return {
        "pseudo_outcome_clip": None,
        "fold_fractions": None,
        "max_bins": DP_EBM_MAX_BINS,
        "max_rounds": DP_EBM_MAX_ROUNDS,
    }


def default_delta_for(
    domain: PublicDomain, learner: Learner, fold_fractions: tuple[float, ...] | None
) -> float:
    """README §1.7 default: ``min(1e-5, 1 / (10 n_min))`` over this release's folds."""
    fractions = resolved_fractions(domain, learner, fold_fractions)
    return default_delta(min(fold_sizes(domain.n, fractions)))


def resolved_fractions(
    domain: PublicDomain, learner: Learner, fold_fractions: tuple[float, ...] | None
) -> tuple[float, ...]:
    names = modules(domain, learner)
    fractions = default_fractions(domain, learner) if fold_fractions is None else fold_fractions
    return checked_fractions(domain.n, names, fractions)


def useful_threshold(screened: bool) -> float:
    """n epsilon per covariate from which the effect model counts as learning (the anchor's
    useful share): ``SCREENED_USEFUL_N_EPSILON_PER_COVARIATE`` with the screen (per schema
    covariate), else ``EBM_USEFUL_N_EPSILON_PER_COVARIATE`` (per effect-model covariate)."""
    if screened:
        return SCREENED_USEFUL_N_EPSILON_PER_COVARIATE
    return EBM_USEFUL_N_EPSILON_PER_COVARIATE


def ebm_anchor_share(n: int, epsilon: float, q: int, screened: bool = False) -> float:
    """The observational anchor's public share of the effect fold's budget (see
    ``EBM_USEFUL_N_EPSILON_PER_COVARIATE``): public n, epsilon and the number q of the effect
    model's covariates (``effect_width``; with the screen, the schema's q and
    ``SCREENED_USEFUL_N_EPSILON_PER_COVARIATE``) only."""
    useful = n * epsilon / q >= useful_threshold(screened)
    return ANCHOR_SHARE if useful else ANCHOR_SHARE_NOISY


def rct_anchor_share(
    domain: PublicDomain,
    epsilon: float,
    delta: float,
    width: int | None = None,
    screened: bool = False,
) -> float | None:
    """Randomised designs (proof step 6.1): the whole-data anchor's public share of (epsilon,
    delta): ``RCT_USEFUL_ANCHOR_SHARE`` where the effect model can learn (n epsilon per
    effect-model covariate, ``width`` of them (None: q), at least
    ``EBM_USEFUL_N_EPSILON_PER_COVARIATE``, as the observational switch),
    else the shared rule ``anchor.ate_anchor_share`` (the release is then mostly the anchor).
    None where the anchor cannot run. Public n, epsilon, delta and the schema only."""
    shared = ate_anchor_share(domain, epsilon, delta)
    if shared is None:
        return None
    covariates = domain.q if width is None else width
    # Below n epsilon = ANCHOR_ALL_IN_N_EPSILON the release is its anchor whatever the width: a
    # trial walkthrough (n 3000, eps 1, two declared modifiers: 1500 per covariate) got the
    # useful share, its calibration detected nothing in 19 of 20 releases, and every patient got
    # an anchor bought with 35 % of epsilon: 1.23x (a response) and 2.09x (a length of stay)
    # the error of the ate release.
    large = domain.n * epsilon >= ANCHOR_ALL_IN_N_EPSILON
    useful = large and domain.n * epsilon / covariates >= useful_threshold(screened)
    return min(shared, RCT_USEFUL_ANCHOR_SHARE) if useful else shared
