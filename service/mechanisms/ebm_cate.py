"""DP-EBM CATE learners (Niu et al. 2022): S-, DR- and R-learner on interpret's DP-EBMs.

What it releases:
    the fitted DP effect model as its safe fields only (``SafeEbm``: DP cut points, term
    scores, intercept, public bounds; dp_ebm_learners.md §7.3), the ATE read off the model
    (DR/R: the effect model's intercept plus its public offset; S: ``mu(1, x) - mu(0, x)``,
    constant in x for an additive model), the per-feature shape functions, and the CATE at
    caller-supplied public points. Never per-row pseudo-outcomes, fold memberships, nuisance
    predictions at stored rows, data-derived bounds or interpret's ``to_json``.

Neighbouring relation:
    replace-one on records (X, A, Y), n public; fold sizes are public functions of n.

Claim (strict learners S and DR):
    ``run`` is (epsilon, delta)-DP. Each DP-EBM module is fitted at the epsilon_p of the
    replace-one rule (``solve_dp_ebm_epsilon_p``) so that it is (epsilon, delta)-DP on its own
    fold; the folds are disjoint, of public sizes, drawn by a uniformly random permutation;
    the DR pseudo-outcome is a row-wise function of the record given the first-stage models and
    is clipped to the public [-K, K] that calibrates the effect model; Niu et al. Theorem 6
    (parallel composition over folds) gives the max over modules, (epsilon, delta). Everything
    returned is post-processing of the DP models. The R-learner passes data-dependent sample
    weights (T - e_hat)^2 to interpret, whose noise then depends on max(weight) and whose
    binning threshold on the weight total (§6 item 6): paper label only.

    Shrinkage ``"ate"`` (the DR default, proof step 6): observationally the effect fold spends a
    public share of its (epsilon, delta) on a DP ATE anchor of the whole fold (exact split), the
    effect model (centred targets) runs on the fold's fitting rows and DP calibration sums on its
    disjoint calibration rows, each at the rest: per record of the fold, anchor + one of the
    two, so the total is still (epsilon, delta). In an RCT (step 6.1, version 3) the anchor is
    the strict ``ate`` kind's RCT default release on all n at a public share of (epsilon, delta),
    and the whole DR pipeline runs at the rest: sequential composition, (epsilon, delta) in
    total. The factor and ``anchor + lambda * deviation`` are post-processing.

    Proof: docs/proofs/ebm_cate.md (steps labelled ``# proof step N``).

References:
    Niu, Nori, Quistorff, Caruana, Ngwe, Kannan (2022). Differentially private estimation of
    heterogeneous causal effects. CLeaR (Algorithm 1-2, Theorem 6).
    Nori, Caruana, Zhong, Hsu, Sharma (2021). Accuracy, interpretability, and differential
    privacy via explainable boosting. ICML.
    Kennedy (2020). Optimal doubly robust estimation of heterogeneous causal effects.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from service.mechanisms import ate_strict
from service.mechanisms.anchor import (
    ANCHOR_SHARE,
    ANCHOR_SHARE_NOISY,
    AnchorPlan,
    AteAnchorPlan,
    anchor_pseudo_outcomes,
    ate_anchor_share,
    draw_anchor,
    draw_ate_anchor,
    no_room_for_anchor,
    plan_anchor,
    plan_ate_anchor,
)
from service.mechanisms.ate_strict import pseudo_outcomes
from service.mechanisms.calibration import (
    default_delta,
    public_propensity,
    validate_delta,
    validate_epsilon,
    validate_finite_positive,
)
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.dp_ebm import (
    DP_EBM_LEARNING_RATE,
    DP_EBM_MAX_BINS,
    DP_EBM_MAX_ROUNDS,
    DpEbmAccounting,
    SafeEbm,
    dp_ebm_event,
    fit_regressor,
    interpret_guard,
    outcome_predictions,
    propensity_scores,
    solve_dp_ebm_epsilon_p,
)
from service.mechanisms.errors import InvalidParameters, PaperModeDisabled, ReleaseFailed
from service.mechanisms.noise import GaussianCalibration, NoiseSampler, calibrate_gaussian
from service.mechanisms.partition import (
    MIN_FOLD_SIZE,
    at_least_min_fold,
    checked_fractions,
    fold_sizes,
    prepare_arrays,
    random_folds,
)
from service.mechanisms.records import Composition, Guarantee, MechanismRecord, NoiseEvent

MECHANISM = "ebm_cate"
VERSION = "3"  # 2: shrinkage "ate" (the anchored DR default, proof step 6); 3: RCT anchor (6.1)

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
_WARNING_EPSILON_CAP = 4.0
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
# anchor should get the budget. anchor.anchor_share's switch reads the public per-prediction
# noise scale, which for this kind is too rough (prediction_noise_sd: about 2x the deviations'
# sd at the data at n 20000, eps 4, so it would have chosen the noisy share there too).
# The switch reads n * epsilon per covariate: DP-EBM spends its budget over every feature's
# shape, so a model on 6 covariates learns at an n * epsilon that leaves one on 36 noise. A
# switch at n * epsilon = 50 000 regardless of q gave Niu et al.'s Setups (q = 6, n 16 000,
# eps 1) the noisy share and a factor of 0: CATE MSE 1.27 / 1.80 / 9.1 on B / D / E, the constant's,
# against 0.38 / 0.87 / 4.4 unanchored (bench/results/ebm_cate_target.json); at 0.2 they were
# 0.41-0.51 / 1.42-1.52 / 5.7-6.5 (2 fits each). On the realistic studies (q = 36) the switch is
# unchanged: n * epsilon >= 54 000, as before only n 20 000, eps 4 of the grid.
EBM_USEFUL_N_EPSILON_PER_COVARIATE = 1_500.0
# Randomised designs where the effect model can learn: the whole-data anchor's share. Niu et
# al.'s Setup B declared as an RCT (q = 6, n 16 000, eps 1): CATE MSE 1.27 at 0.8 (factor 0),
# 1.04 at 0.5, 0.61-0.74 at 0.35, 0.44-0.60 at 0.2 (2 fits each; unanchored v1: 0.34); the
# realistic rct_none trial at n 20 000, eps 4 (q = 36): the anchor's RMSE 1.46x the whole-budget
# ate release's at 0.2, 1.08x at 0.35, 0.97x at 0.5 (40 samples,
# bench/results/rct-anchor-20000-4.json). 0.35 keeps the anchor within 1.1x and most of the gain.
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
# model (target range R_Y, d + 1 features), while the DP classifier's residuals are bounded by 1,
# so its fold can be small. On Setup C (strong confounding) the 40 % fold lowers the outcome
# model's RMSE from 1.78 to 1.34 (bench/results/ebm_cate_diagnosis.json); its error still biases
# the ATE there by about -0.45 through the clip at K.
DR_DEFAULT_K_OF_RANGE = 0.3
DR_DEFAULT_FOLDS = (0.1, 0.4, 0.5)  # propensity, outcome, effect
DR_DEFAULT_FOLDS_RCT = (0.3, 0.7)  # outcome, effect (the propensity is declared)
DR_DEFAULT_MAX_BINS = 16
DR_DEFAULT_MAX_ROUNDS = 200  # the effect model; the nuisances keep interpret's 300


def dr_default_folds(domain: PublicDomain) -> tuple[float, ...]:
    """``DR_DEFAULT_FOLDS`` with the propensity fold raised to ``MIN_FOLD_SIZE`` records where
    10 % of n is fewer (taken from the effect fold); RCT: ``DR_DEFAULT_FOLDS_RCT``. Public n only.
    """
    if len(modules(domain, "dr")) == 2:
        return DR_DEFAULT_FOLDS_RCT
    propensity, outcome, _ = DR_DEFAULT_FOLDS
    propensity = at_least_min_fold(propensity, domain.n)
    return (propensity, outcome, 1.0 - propensity - outcome)


def dr_defaults(domain: PublicDomain) -> dict[str, Any]:
    """The DR learner's public default configuration for ``domain`` (no data)."""
    return {
        "pseudo_outcome_clip": DR_DEFAULT_K_OF_RANGE * domain.outcome_range,
        "fold_fractions": dr_default_folds(domain),
        "max_bins": DR_DEFAULT_MAX_BINS,
        "max_rounds": DR_DEFAULT_MAX_ROUNDS,
    }


def service_defaults(domain: PublicDomain, learner: Learner) -> dict[str, Any]:
    """What the service uses for an omitted K, folds, ``max_bins`` and ``max_rounds``: the DR
    rule above, and Niu et al.'s configuration (the ``EbmCateParams`` defaults) otherwise."""
    if learner == "dr":
        return dr_defaults(domain)
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
    fractions = _fractions(domain, learner, fold_fractions)
    return default_delta(min(fold_sizes(domain.n, fractions)))


@dataclass(frozen=True)
class Plan:
    params: EbmCateParams
    guarantee: Guarantee
    modules: tuple[str, ...]
    fold_sizes: tuple[int, ...]
    clip_k: float
    propensity: float | None  # RCT: the declared p
    accounting: DpEbmAccounting
    record: MechanismRecord
    # shrinkage "ate" (proof step 6): the effect model's own accounting at the effect fold's
    # remaining budget, the anchor, the calibration Gaussian, the public fit/calibration split
    effect_accounting: DpEbmAccounting | None = None
    anchor: AnchorPlan | None = None
    anchor_share: float = 0.0
    calibration: GaussianCalibration | None = None
    calibration_size: int = 0
    # randomised designs (proof step 6.1): the strict ATE release that is the anchor, on all n
    rct_anchor: AteAnchorPlan | None = None

    @property
    def effect_fit_size(self) -> int:
        return self.fold_sizes[-1] - self.calibration_size

    @property
    def anchored(self) -> bool:
        return self.anchor is not None or self.rct_anchor is not None

    @property
    def anchor_rows(self) -> int:
        """The records the anchor's DP mean averages (public)."""
        if self.rct_anchor is not None:
            return self.rct_anchor.n2
        return self.fold_sizes[-1]


def _fractions(
    domain: PublicDomain, learner: Learner, fold_fractions: tuple[float, ...] | None
) -> tuple[float, ...]:
    names = modules(domain, learner)
    fractions = default_fractions(domain, learner) if fold_fractions is None else fold_fractions
    return checked_fractions(domain.n, names, fractions)


def make_plan(domain: PublicDomain, params: EbmCateParams) -> Plan:
    """Validate the request and compute the record (the cost) from public inputs only."""
    learner = params.learner
    if learner not in ("dr", "r", "s"):
        raise InvalidParameters("learner must be 'dr', 'r' or 's'")
    guarantee = Guarantee.PAPER if learner == "r" else Guarantee.STRICT
    if guarantee == Guarantee.PAPER and not domain.allow_paper_mode:
        raise PaperModeDisabled(
            "the DP-EBM R-learner is paper-label only (data-dependent sample weights); the "
            "dataset's owner has not enabled paper mode"
        )
    if not domain.y_lower < domain.y_upper:
        raise InvalidParameters("outcome bounds must satisfy y_lower < y_upper")
    epsilon = validate_epsilon(params.epsilon, minimum=MIN_EPSILON, maximum=MAX_EPSILON)
    max_bins = params.max_bins
    if (
        isinstance(max_bins, bool)
        or not isinstance(max_bins, int)
        or not MIN_MAX_BINS <= max_bins <= MAX_MAX_BINS
    ):
        raise InvalidParameters(f"max_bins must be an integer in [{MIN_MAX_BINS}, {MAX_MAX_BINS}]")
    max_rounds = params.max_rounds
    if (
        isinstance(max_rounds, bool)
        or not isinstance(max_rounds, int)
        or not MIN_MAX_ROUNDS <= max_rounds <= MAX_MAX_ROUNDS
    ):
        raise InvalidParameters(
            f"max_rounds must be an integer in [{MIN_MAX_ROUNDS}, {MAX_MAX_ROUNDS}]"
        )
    fractions = _fractions(domain, learner, params.fold_fractions)
    names = modules(domain, learner)
    sizes = fold_sizes(domain.n, fractions)
    shrinkage = resolved_shrinkage(params)
    if shrinkage not in ("ate", "none"):
        raise InvalidParameters("shrinkage must be 'ate' or 'none'")
    if shrinkage == "ate" and learner != "dr":
        raise InvalidParameters(
            "shrinkage 'ate' is for the DR learner (the S-learner's CATE is constant in x; the "
            "R-learner is paper-label)"
        )
    calibration_size = calibration_rows(sizes[-1]) if shrinkage == "ate" else 0
    if shrinkage == "ate" and calibration_size == 0:
        if params.shrinkage is not None:
            raise InvalidParameters(
                f"shrinkage 'ate' needs an effect fold of at least "
                f"{MIN_FOLD_SIZE + MIN_CALIBRATION_ROWS} records (fitting and calibration "
                "rows); use shrinkage 'none' or a larger fold"
            )
        shrinkage = "none"  # the default on a too small effect fold (public n only)
    delta = validate_delta(params.delta, n_min=min((*sizes, calibration_size or sizes[0])))
    big_r = domain.outcome_range
    propensity, clip = public_propensity(domain, params.propensity_clip)
    # proof step 1: the public pseudo-outcome bound K (|psi_DR| <= R / c; |psi_R| <= R / c).
    natural = big_r / clip
    clip_k = natural if learner != "s" else big_r
    if params.pseudo_outcome_clip is not None and learner != "s":
        clip_k = min(validate_finite_positive(params.pseudo_outcome_clip, "K"), natural)
    elif learner != "s":
        clip_k = min(big_r, natural)
    # proof step 2: every module at epsilon_p with (epsilon, delta) under replace-one.
    accounting = solve_dp_ebm_epsilon_p(epsilon, delta)
    requested = (epsilon, delta)
    q = domain.q
    events: list[NoiseEvent] = []
    # proof step 6 (shrinkage "ate"): the effect fold spends the public ebm_anchor_share on the
    # anchor; the effect model (fitting rows) and the calibration statistics (calibration rows,
    # disjoint) each get the rest.
    effect_epsilon, effect_delta, effect_accounting = epsilon, delta, accounting
    anchor: AnchorPlan | None = None
    anchor_events: list[NoiseEvent] = []
    share = 0.0
    calibration: GaussianCalibration | None = None
    rct_anchor: AteAnchorPlan | None = None
    if shrinkage == "ate" and domain.design == StudyDesign.RCT:
        # proof step 6.1 (RCT): the strict ATE release on all n at the anchor's share, then the
        # whole DR pipeline (outcome model, effect model, calibration sums) at the rest.
        chosen = rct_anchor_share(domain, epsilon, delta)
        if chosen is None:
            raise no_room_for_anchor()
        share = chosen
        epsilon_anchor, effect_epsilon = ate_strict.split_share(epsilon, share)
        delta_anchor, effect_delta = ate_strict.split_share(delta, share)
        rct_anchor = plan_ate_anchor(domain, epsilon_anchor, delta_anchor)
        effect_accounting = solve_dp_ebm_epsilon_p(effect_epsilon, effect_delta)
        # every DR module runs at the rest (sequential composition with the anchor)
        epsilon, delta, accounting = effect_epsilon, effect_delta, effect_accounting
        calibration = calibrate_gaussian(
            effect_epsilon,
            effect_delta,
            ate_strict.float_slack(calibration_sensitivity(clip_k), calibration_size),
            dim=CALIBRATION_STATISTICS,
        )
    elif shrinkage == "ate":
        share = ebm_anchor_share(domain.n, epsilon, domain.q)
        epsilon_anchor, effect_epsilon = ate_strict.split_share(epsilon, share)
        delta_anchor, effect_delta = ate_strict.split_share(delta, share)
        anchor, planned = plan_anchor(
            "dr",
            epsilon_anchor,
            delta_anchor,
            outcome_range=big_r,
            propensity_clip=clip,
            dr_bound=anchor_bound(domain, clip, clip_k),
            n2=sizes[-1],
        )
        anchor_events = [
            replace(event, module="effect", params={**event.params, "rows": "effect fold"})
            for event in planned
        ]
        effect_accounting = solve_dp_ebm_epsilon_p(effect_epsilon, effect_delta)
        calibration = calibrate_gaussian(
            effect_epsilon,
            effect_delta,
            ate_strict.float_slack(calibration_sensitivity(clip_k), calibration_size),
            dim=CALIBRATION_STATISTICS,
        )
    for name in names:
        if name == "propensity":
            events.append(
                dp_ebm_event(
                    name,
                    epsilon,
                    delta,
                    accounting,
                    n_features=q,
                    target_range=1.0,
                    learner="Classifier",
                    max_bins=max_bins,
                    max_rounds=DP_EBM_MAX_ROUNDS,  # first stage: interpret default
                )
            )
        elif name == "outcome":
            width = q if learner == "r" else q + 1
            events.append(
                dp_ebm_event(
                    name,
                    epsilon,
                    delta,
                    accounting,
                    n_features=width,
                    target_range=big_r,
                    learner="Regressor",
                    max_bins=max_bins,
                    max_rounds=max_rounds if learner == "s" else DP_EBM_MAX_ROUNDS,
                )
            )
        else:
            events.extend(anchor_events)
            events.append(
                dp_ebm_event(
                    name,
                    effect_epsilon,
                    effect_delta,
                    effect_accounting,
                    n_features=q,
                    target_range=2.0 * clip_k,
                    learner="Regressor",
                    max_bins=max_bins,
                    max_rounds=max_rounds,
                )
            )
    recorded_sizes = dict(zip(names, sizes, strict=True))
    if calibration is not None:
        recorded_sizes["effect"] = sizes[-1] - calibration_size
        recorded_sizes["calibration"] = calibration_size
        events.append(_calibration_event(calibration, clip_k, calibration_size))
    # proof step 3: Theorem 6 - the max over modules; with the anchor (step 6) the effect
    # fold's own total is the anchor's plus the effect model's (the calibration statistics are
    # on disjoint rows of the same fold at the same budget as the effect model): exact sums.
    epsilon_total = max(
        math.fsum(e.epsilon for e in events if e.module == "effect"),
        *(e.epsilon for e in events if e.module not in ("effect", "calibration")),
    )
    delta_total = max(
        math.fsum(e.delta for e in events if e.module == "effect"),
        *(e.delta for e in events if e.module not in ("effect", "calibration")),
    )
    if rct_anchor is not None:
        # proof step 6.1 (RCT): the anchor release (its own record's cost, ate_strict proof)
        # composes sequentially with the DR pipeline: exact sums of the exact splits.
        events, recorded_sizes = rct_anchor.compose(
            events, recorded_sizes, (epsilon_total, delta_total), requested
        )
        epsilon_total, delta_total = requested
    record = MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=guarantee,
        n=domain.n,
        fold_sizes=recorded_sizes,
        composition=(
            Composition.ANCHOR_THEN_THEOREM6_MAX
            if rct_anchor is not None
            else Composition.THEOREM6_MAX
            if len(names) > 1
            else Composition.SEQUENTIAL
        ),
        events=tuple(events),
        epsilon=epsilon_total,
        delta=delta_total,
    )
    return Plan(
        params,
        guarantee,
        names,
        sizes,
        clip_k,
        propensity,
        accounting,
        record,
        effect_accounting=effect_accounting if shrinkage == "ate" else None,
        anchor=anchor,
        anchor_share=share,
        calibration=calibration,
        calibration_size=calibration_size,
        rct_anchor=rct_anchor,
    )


def anchor_bound(domain: PublicDomain, clip: float, clip_k: float) -> float:
    """The anchor pseudo-outcome's public bound B_a (the adaptive clip K_a <= B_a): in an RCT
    the natural bound R_Y / c (c = min(p, 1 - p): a few R_Y; clipping the skewed AIPW term at
    the learner's K biased the anchor there), observationally the learner's K (R_Y / c with
    c = 0.05 is 20 R_Y, and the anchor's noise grows with the bound: PEHE 44 against 2.2 at
    K, n 1000, eps 1, bench/README.md)."""
    if domain.design == StudyDesign.RCT:
        return domain.outcome_range / clip
    return clip_k


def ebm_anchor_share(n: int, epsilon: float, q: int) -> float:
    """The observational anchor's public share of the effect fold's budget (see
    ``EBM_USEFUL_N_EPSILON_PER_COVARIATE``): public n, epsilon and number of covariates only."""
    useful = n * epsilon / q >= EBM_USEFUL_N_EPSILON_PER_COVARIATE
    return ANCHOR_SHARE if useful else ANCHOR_SHARE_NOISY


def rct_anchor_share(domain: PublicDomain, epsilon: float, delta: float) -> float | None:
    """Randomised designs (proof step 6.1): the whole-data anchor's public share of (epsilon,
    delta): ``RCT_USEFUL_ANCHOR_SHARE`` where the effect model can learn (n epsilon per
    covariate at least ``EBM_USEFUL_N_EPSILON_PER_COVARIATE``, as the observational switch),
    else the shared rule ``anchor.ate_anchor_share`` (the release is then mostly the anchor).
    None where the anchor cannot run. Public n, epsilon, delta and the schema only."""
    shared = ate_anchor_share(domain, epsilon, delta)
    if shared is None:
        return None
    useful = domain.n * epsilon / domain.q >= EBM_USEFUL_N_EPSILON_PER_COVARIATE
    return min(shared, RCT_USEFUL_ANCHOR_SHARE) if useful else shared


def calibration_rows(effect_size: int) -> int:
    """proof step 6: the public number of calibration rows of an effect fold of ``effect_size``
    records: ``CALIBRATION_FRACTION`` of it, raised towards ``MIN_FOLD_SIZE`` as far as the
    fitting rows keep ``MIN_FOLD_SIZE`` (a DP-EBM fit's minimum); 0 where that leaves fewer than
    ``MIN_CALIBRATION_ROWS`` (no anchored release is possible; public n only)."""
    size = max(
        math.floor(CALIBRATION_FRACTION * effect_size),
        min(MIN_FOLD_SIZE, effect_size - MIN_FOLD_SIZE),
    )
    if size < MIN_CALIBRATION_ROWS or effect_size - size < MIN_FOLD_SIZE:
        return 0
    return size


def deviation_bound(clip_k: float) -> float:
    """G: the public bound of the released deviations (``DEVIATION_BOUND_OF_K * K``)."""
    return DEVIATION_BOUND_OF_K * clip_k


def calibration_sensitivity(clip_k: float) -> float:
    """proof step 6: replace-one L2 sensitivity of ``(sum g^2, sum r g, (G / K) sum r^2)`` with
    g in [-G, G] and r in [-K, K]: one row's triple moves by at most ``(G^2, 2 K G, G K)``, so
    ``G sqrt(G^2 + 5 K^2)``."""
    bound = deviation_bound(clip_k)
    return bound * math.sqrt(bound * bound + 5.0 * clip_k * clip_k)


def _calibration_event(calibration: GaussianCalibration, clip_k: float, rows: int) -> NoiseEvent:
    return NoiseEvent(
        type="gaussian",
        module="calibration",
        epsilon=calibration.epsilon,
        delta=calibration.delta,
        params={
            "statistic": "calibration sums (g^2, r g, r^2) of the effect model's deviations",
            "sampler": "opendp discrete gaussian on 2^k lattice",
            "rows": "calibration rows of the effect fold (disjoint from the effect model's)",
            "sensitivity_l2_nominal": calibration_sensitivity(clip_k),
            "sensitivity_l2": calibration.sensitivity_l2,
            "sensitivity_l2_effective": calibration.sensitivity_l2_effective,
            "dim": calibration.dim,
            "lattice_exponent": calibration.lattice_exponent,
            "noise_multiplier": calibration.noise_multiplier,
            "sigma": calibration.sigma,
            "bound": clip_k,
            "deviation_bound": deviation_bound(clip_k),
            "calibration_rows": rows,
        },
    )


def plan(domain: PublicDomain, params: EbmCateParams) -> MechanismRecord:
    """The mechanism record (cost) of a request; raises ``InvalidParameters`` before a charge."""
    return make_plan(domain, params).record


def _public(state: Plan, domain: PublicDomain) -> dict[str, Any]:
    return {
        "mode": str(state.guarantee),
        "guarantee": str(state.guarantee),
        "learner": state.params.learner,
        "epsilon": state.record.epsilon,
        "delta": state.record.delta,
        "epsilon_p": state.accounting.epsilon_p,
        "propensity_clip": state.params.propensity_clip if state.propensity is None else None,
        "treatment_probability": state.propensity,
        "pseudo_outcome_clip": state.clip_k if state.params.learner != "s" else None,
        "fold_sizes": dict(state.record.fold_sizes),
        "max_bins": state.params.max_bins,
        "max_rounds": state.params.max_rounds,
        "design": str(domain.design),
        "shrinkage": "ate" if state.anchored else "none",
        "anchor_share": state.anchor_share,
    }


def quote(domain: PublicDomain, params: EbmCateParams) -> dict[str, Any]:
    """Public accuracy preview: the effect model's public noise scales and a small-n warning.

    ``boosting_noise_sd_per_step`` is interpret's sigma_boost for the effect (DR/R) or outcome
    (S) model: the sd of the noise on each leaf's learning-rate-scaled residual sum; divided by
    a leaf's size it is the per-step noise on the shape function. All public.
    """
    state = make_plan(domain, params)
    # the final model's own accounting (with the anchor: the effect fold's remaining budget)
    mu_boost = (state.effect_accounting or state.accounting).mu_boosting
    q = domain.q
    width = q + 1 if params.learner == "s" else q
    target_range = domain.outcome_range if params.learner == "s" else 2.0 * state.clip_k
    rounds = params.max_rounds
    sigma_boost = math.sqrt(rounds * width) * DP_EBM_LEARNING_RATE * target_range
    sigma_boost /= mu_boost
    last = state.effect_fit_size
    # A rough public scale for the per-bin noise of one shape function (32 bins, 3 leaves per
    # step, 300 rounds): sigma_boost * sqrt(rounds) / (leaf size ~ n_last / 3).
    shape_noise = sigma_boost * math.sqrt(rounds) / max(last / 3.0, 1.0)
    warnings: list[str] = []
    scale = domain.n * min(state.record.epsilon, _WARNING_EPSILON_CAP)
    if params.learner != "s" and scale < SMALL_N_EPSILON_WARNING:
        warnings.append(
            f"n x epsilon is small ({scale:g} < {SMALL_N_EPSILON_WARNING:g}): on simulated data "
            "the DR learner was then usually less accurate than the constant ATE of learner 's' "
            "(bench/README.md, DP-EBM section)"
        )
    out = {
        **_public(state, domain),
        "boosting_noise_sd_per_step": sigma_boost,
        "approx_shape_noise_sd": shape_noise,
        "warnings": warnings,
    }
    if state.calibration is not None:
        # the anchor's mean reads the whole effect fold (RCT: the ate_strict release's n2)
        out["anchor_rows"] = state.anchor_rows
        out["calibration_rows"] = state.calibration_size
        out["calibration_noise_sd"] = state.calibration.sigma
    return out


# The public formula below (per-bin noise sd times sqrt(q)) overstates the noise a release
# carries: on the realistic studies the release-to-release sd of the DR learner's predictions on
# one sample (privacy noise plus fold variation, an upper bound on the noise) was 0.42-0.59 of
# it in four cells from n eps = 2e4 to 1e5 (bench/README.md, "ebm_cate's quoted prediction
# noise"; bench.ebm_noise). Quote only: it shapes no noise.
PREDICTION_NOISE_CALIBRATION = 0.5


def prediction_noise_sd(domain: PublicDomain, quoted: dict[str, Any]) -> float:
    """A public scale of one prediction's privacy noise: the approximate per-bin noise sd of a
    shape function times sqrt(number of covariates) (a prediction sums one bin of each shape
    function, with independent noise), times ``PREDICTION_NOISE_CALIBRATION``. Rough, like
    ``approx_shape_noise_sd`` itself."""
    return (
        float(quoted["approx_shape_noise_sd"]) * math.sqrt(domain.q) * PREDICTION_NOISE_CALIBRATION
    )


# ---- running ---------------------------------------------------------------------------------


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
        return _run(
            arrays, domain, state, rng=rng, progress=progress, names=feature_names, noise=noise
        )
    except Exception:
        raise ReleaseFailed() from None


def _run(
    arrays: Arrays,
    domain: PublicDomain,
    state: Plan,
    *,
    rng: np.random.Generator,
    progress: Progress,
    names: list[str] | None,
    noise: NoiseSampler | None = None,
) -> dict[str, Any]:
    params = state.params
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    q = domain.q
    feature_names = list(names) if names is not None else [f"x{j}" for j in range(q)]
    x, a, y = prepare_arrays(arrays, domain)
    low, high = domain.y_lower, domain.y_upper

    rct_anchor: float | None = None
    if state.rct_anchor is not None:
        # proof step 6.1 (RCT): the anchor release on all n records (its own partition), at the
        # anchor's share; only its DP estimate is kept, clipped to [-R_Y, R_Y].
        if noise is None:
            raise ValueError("the anchor needs the noise sampler")
        rct_anchor = draw_ate_anchor(
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
            **_public(state, domain),
            "ate": effect,
            "model": {"kind": "s_learner", "outcome": safe.to_dict()},
            "shape_functions": safe.shape_functions(),
        }

    effect_rows = folds["effect"]
    x2, a2, y2 = x[effect_rows], a[effect_rows], y[effect_rows]
    # proof step 2: first-stage DP models, each on its own fold; predictions on the effect fold
    # are row-wise post-processing.
    if state.propensity is not None:
        e_hat = np.full(x2.shape[0], state.propensity)
    else:
        rows = folds["propensity"]
        e_hat = propensity_scores(
            x[rows],
            a[rows],
            x2,
            lower,
            upper,
            state.accounting,
            clip=params.propensity_clip,
            max_bins=params.max_bins,
            max_rounds=DP_EBM_MAX_ROUNDS,  # first stage: interpret default
        )
    progress(0.35, "propensity")
    rows = folds["outcome"]
    k = state.clip_k
    if params.learner == "dr":
        mu0, mu1 = outcome_predictions(
            x[rows],
            a[rows],
            y[rows],
            x2,
            lower,
            upper,
            low,
            high,
            state.accounting,
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
                x2, a2, y2, e_hat, mu0, mu1, domain, state, noise, feature_names, rct_anchor
            )
    else:
        eta_model, mid = fit_regressor(
            x[rows],
            y[rows],
            lower,
            upper,
            low,
            high,
            state.accounting,
            max_bins=params.max_bins,
            max_rounds=DP_EBM_MAX_ROUNDS,  # first stage: interpret default
        )
        with interpret_guard():
            eta = np.asarray(eta_model.predict(x2)) + mid
        eta = np.clip(np.nan_to_num(eta, nan=mid), low, high)
        del eta_model
        progress(0.65, "outcome")
        residual_a = a2 - e_hat  # |.| >= c since a in {0, 1} and e_hat in [c, 1 - c]
        psi = np.clip((y2 - eta) / residual_a, -k, k)
        weight = residual_a**2  # data-dependent: the R-learner is paper-label only
    effect_model, offset = fit_regressor(
        x2,
        psi,
        lower,
        upper,
        -k,
        k,
        state.accounting,
        sample_weight=weight,
        max_bins=params.max_bins,
        max_rounds=params.max_rounds,
    )
    safe = SafeEbm.from_model(effect_model, offset=offset, names=feature_names)
    del effect_model, psi, x2, a2, y2
    progress(1.0, "done")
    return {
        **_public(state, domain),
        # The effect model's terms are centred (noisy bin weights of the effect fold), so the
        # intercept plus offset is the model's average effect (dp_ebm_learners.md §5).
        "ate": safe.offset + safe.intercept,
        "model": {"kind": "effect", "effect": safe.to_dict()},
        "shape_functions": safe.shape_functions(),
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
    if rct_anchor is not None:
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
    effect_model, offset = fit_regressor(
        x2[fit],
        targets[fit],
        lower,
        upper,
        -k,
        k,
        accounting,
        max_bins=params.max_bins,
        max_rounds=params.max_rounds,
    )
    safe = SafeEbm.from_model(effect_model, offset=offset, names=feature_names)
    del effect_model
    centre = safe.offset + safe.intercept
    # step 6.3: calibration sums on the held-out rows: g = the released deviation (a DP
    # output of the fitting rows) at each row, in [-G, G], r = its centred target, in [-K, K].
    bound = deviation_bound(k)
    g = np.clip(np.nan_to_num(safe.predict(x2[held]) - centre), -bound, bound)
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
    shapes = safe.shape_functions()
    for shape in shapes:
        shape["values"] = [factor * float(v) for v in shape["values"]]
    return {
        **_public(state, domain),
        "ate": anchor,
        "ate_anchor": anchor,
        "shrinkage_factor": factor,
        "anchor_centre": centre,
        "model": {
            "kind": "effect",
            "effect": safe.to_dict(),
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
    values = SafeEbm.from_dict(model["effect"]).predict(x)
    shrink = model.get("shrinkage")
    if shrink is None:
        return values
    bound = float(shrink["deviation_bound"])
    deviation = np.clip(np.nan_to_num(values - float(shrink["centre"])), -bound, bound)
    out = float(shrink["anchor"]) + float(shrink["factor"]) * deviation
    value_bound = float(shrink["value_bound"])
    return np.asarray(np.clip(out, -value_bound, value_bound), dtype=np.float64)
