"""ebm_cate's calibration and privacy map: the plan (folds, DP-EBM accounting, anchor,
calibration Gaussian) and the mechanism record it charges, from public inputs only
(docs/proofs/ebm_cate.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from service.mechanisms import ate_strict, outcome_range, quantile_bins
from service.mechanisms import effect_screen as screening
from service.mechanisms.anchor import (
    AnchorPlan,
    AteAnchorPlan,
    no_room_for_anchor,
    plan_anchor,
    split_for_anchor,
)
from service.mechanisms.ate_strict.calibration import (
    measured_range_nuisance_event,
    outcome_range_events,
    plan_outcome_range,
    quantile_bins_event,
)
from service.mechanisms.calibration import (
    public_propensity,
    validate_delta,
    validate_epsilon,
    validate_finite_positive,
)
from service.mechanisms.domain import PublicDomain, StudyDesign, checked_columns
from service.mechanisms.dp_ebm import (
    DP_EBM_MAX_ROUNDS,
    DpEbmAccounting,
    dp_ebm_event,
    solve_dp_ebm_epsilon_p,
)
from service.mechanisms.ebm_cate.rules import (
    CALIBRATION_FRACTION,
    CALIBRATION_STATISTICS,
    DEVIATION_BOUND_OF_K,
    MAX_EPSILON,
    MAX_MAX_BINS,
    MAX_MAX_ROUNDS,
    MECHANISM,
    MIN_CALIBRATION_ROWS,
    MIN_EPSILON,
    MIN_MAX_BINS,
    MIN_MAX_ROUNDS,
    VERSION,
    EbmCateParams,
    adjustment_width,
    ebm_anchor_share,
    effect_width,
    modules,
    outcome_range_rule,
    rct_anchor_share,
    resolved_fractions,
    resolved_shrinkage,
    screen_rule,
)
from service.mechanisms.effect_screen import EffectScreen
from service.mechanisms.errors import InvalidParameters, PaperModeDisabled
from service.mechanisms.noise import GaussianCalibration, calibrate_gaussian
from service.mechanisms.partition import (
    MIN_FOLD_SIZE,
    fold_sizes,
)
from service.mechanisms.quantile_bins import QuantileBins
from service.mechanisms.records import Composition, Guarantee, MechanismRecord, NoiseEvent


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
    # proof step 9: the effect-modifier screen on the effect fold's fitting rows
    screen: EffectScreen | None = None
    # proof step 10: the DR outcome model's measured range and the model's own accounting at
    # the rest of the outcome module's budget (None: the declared range, ``accounting``)
    outcome_range: outcome_range.OutcomeRange | None = None
    outcome_accounting: DpEbmAccounting | None = None
    # proof step 6.5: the request's public anchor (no anchor is bought)
    given_anchor: float | None = None

    @property
    def effect_fit_size(self) -> int:
        return self.fold_sizes[-1] - self.calibration_size

    @property
    def anchored(self) -> bool:
        return (
            self.anchor is not None or self.rct_anchor is not None or self.given_anchor is not None
        )

    @property
    def anchor_rows(self) -> int:
        """The records the anchor's DP mean averages (public; 0 for a given anchor)."""
        if self.given_anchor is not None:
            return 0
        if self.rct_anchor is not None:
            return self.rct_anchor.n2
        return self.fold_sizes[-1]


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
    columns = checked_effect_columns(domain, params)
    if columns != params.effect_columns:
        params = replace(params, effect_columns=columns)
    adjustment = checked_adjustment_columns(domain, params)
    if adjustment != params.adjustment_columns:
        params = replace(params, adjustment_columns=adjustment)
    width_nuisance = adjustment_width(domain.q, params)
    fractions = resolved_fractions(domain, learner, params.fold_fractions)
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
    # proof step 9: the effect-modifier screen (public rule; resolved into the params so that
    # effect_width and the record read it)
    screen_on = screen_rule(
        domain.q, learner, shrinkage, params.effect_columns, params.effect_screen
    )
    if screen_on != params.effect_screen:
        params = replace(params, effect_screen=screen_on)
    width_effect = effect_width(domain.q, params)
    # proof step 10: the DR outcome model's measured range (public rule on the requested budget)
    range_on = outcome_range_rule(
        learner,
        domain.n * epsilon,
        params.outcome_range,
        observational=domain.design != StudyDesign.RCT,
    )
    if range_on != params.outcome_range:
        params = replace(params, outcome_range=range_on)
    # The anchor shares (steps 6.1, 6.2) read the covariates the analyst or owner named; with
    # the screen, all q at its own threshold (rules.SCREENED_USEFUL_N_EPSILON_PER_COVARIATE):
    # a screened model's 8 columns are a DP guess that at small n epsilon misses the modifiers.
    width_anchor = domain.q if screen_on else width_effect
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
    given_anchor = checked_anchor(domain, params.anchor, shrinkage)
    # proof step 6.5: a given (public) anchor buys nothing: the DR pipeline keeps the budget
    buys_anchor = shrinkage == "ate" and given_anchor is None
    if buys_anchor and domain.design == StudyDesign.RCT:
        # proof step 6.1 (RCT): the strict ATE release on all n at the anchor's share, then the
        # whole DR pipeline (outcome model, effect model, calibration sums) at the rest.
        chosen = rct_anchor_share(domain, epsilon, delta, width_anchor, screen_on)
        if chosen is None:
            raise no_room_for_anchor()
        share = chosen
        rct_anchor, effect_epsilon, effect_delta = split_for_anchor(domain, epsilon, delta, share)
        # every DR module runs at the rest (sequential composition with the anchor)
        epsilon, delta = effect_epsilon, effect_delta
        accounting = solve_dp_ebm_epsilon_p(effect_epsilon, effect_delta)
    elif buys_anchor:
        share = ebm_anchor_share(domain.n, epsilon, width_anchor, screen_on)
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
    if shrinkage == "ate":
        # proof step 6.3: the calibration sums at the effect fold's budget after the anchor
        calibration = calibrate_gaussian(
            effect_epsilon,
            effect_delta,
            ate_strict.float_slack(calibration_sensitivity(clip_k), calibration_size),
            dim=CALIBRATION_STATISTICS,
        )
    # proof step 10: the outcome module first spends outcome_range.SHARE of its epsilon (delta
    # 0) on two DP quantiles of its fold's outcomes; the model gets the rest (exact split).
    measured_range: outcome_range.OutcomeRange | None = None
    outcome_epsilon, outcome_accounting = epsilon, accounting
    if range_on:
        measured_range = plan_outcome_range("dp_ebm", True, epsilon, domain.n * epsilon)
        _, outcome_epsilon = ate_strict.split_share(epsilon, outcome_range.SHARE)
        outcome_accounting = solve_dp_ebm_epsilon_p(outcome_epsilon, delta)
    # proof step 9: the screen and the effect model share the fitting rows' budget
    # (sequential; exact split); the calibration rows keep the whole of it (disjoint rows).
    screen: EffectScreen | None = None
    model_epsilon, model_delta = effect_epsilon, effect_delta
    if screen_on:
        screen = plan_screen(
            domain, effect_epsilon, effect_delta, clip_k, sizes[-1] - calibration_size
        )
        model_epsilon = effect_epsilon - screen.total_epsilon
        model_delta = effect_delta - screen.total_delta
    if shrinkage == "ate":
        effect_accounting = solve_dp_ebm_epsilon_p(model_epsilon, model_delta)
    for name in names:
        if name == "propensity":
            events.append(
                dp_ebm_event(
                    name,
                    epsilon,
                    delta,
                    accounting,
                    n_features=width_nuisance,
                    target_range=1.0,
                    learner="Classifier",
                    max_bins=max_bins,
                    max_rounds=DP_EBM_MAX_ROUNDS,  # first stage: interpret default
                )
            )
        elif name == "outcome":
            # proof step 8: the nuisance models see the adjustment columns (S: every column,
            # the treatment first; its outcome model is the learner).
            width = width_nuisance if learner == "r" else width_nuisance + 1
            outcome_event = dp_ebm_event(
                name,
                outcome_epsilon,
                delta,
                outcome_accounting,
                n_features=width,
                target_range=big_r,
                learner="Regressor",
                max_bins=max_bins,
                max_rounds=max_rounds if learner == "s" else DP_EBM_MAX_ROUNDS,
            )
            if measured_range is not None:
                events.extend(outcome_range_events(measured_range, domain))
                outcome_event = measured_range_nuisance_event(outcome_event)
            events.append(outcome_event)
        else:
            events.extend(anchor_events)
            if screen is not None:
                events.extend(screen_events(screen, domain.q))
            events.append(
                dp_ebm_event(
                    name,
                    model_epsilon,
                    model_delta,
                    effect_accounting,
                    n_features=width_effect,
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
    # proof step 3: Theorem 6 - the max over modules of each module's exact sum of its events
    # (sequential within a fold): the effect fold's is the anchor's plus the screen's plus the
    # effect model's (the calibration statistics are on disjoint rows of the same fold at the
    # same budget as the effect model), the outcome fold's its range plus its model (step 10).
    folds = {e.module for e in events if e.module != "calibration"}
    epsilon_total = max(math.fsum(e.epsilon for e in events if e.module == m) for m in folds)
    delta_total = max(math.fsum(e.delta for e in events if e.module == m) for m in folds)
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
        screen=screen,
        outcome_range=measured_range,
        outcome_accounting=outcome_accounting if measured_range is not None else None,
        given_anchor=given_anchor,
    )


def checked_anchor(domain: PublicDomain, anchor: float | None, shrinkage: str) -> float | None:
    """proof step 6.5: the request's public anchor, finite and in [-R_Y, R_Y] (an ATE cannot
    leave that range), for the anchored DR learner only. Public request and schema only.

    Raises:
        InvalidParameters: an anchor without shrinkage "ate", or outside [-R_Y, R_Y].
    """
    if anchor is None:
        return None
    if shrinkage != "ate":
        raise InvalidParameters(
            "anchor is for the anchored DR learner (shrinkage 'ate'); this request's release "
            "is not anchored"
        )
    bound = domain.outcome_range
    if isinstance(anchor, bool) or not math.isfinite(anchor) or abs(anchor) > bound:
        raise InvalidParameters(f"anchor must be a finite ATE in [-{bound:g}, {bound:g}] (R_Y)")
    return float(anchor)


def checked_effect_columns(domain: PublicDomain, params: EbmCateParams) -> tuple[int, ...] | None:
    """proof step 7: the request's effect modifiers as increasing covariate positions, or
    None for every covariate (a list of all q is None: the same release). 422 for the
    S-learner (its CATE is constant in x), an empty list, a repeated or out-of-range
    position. Public request and schema only."""
    if params.effect_columns is not None and params.learner == "s":
        raise InvalidParameters(
            "effect_columns is for the DR and R learners (the S-learner's CATE is constant)"
        )
    return checked_columns(domain, params.effect_columns, "effect_columns")


def checked_adjustment_columns(
    domain: PublicDomain, params: EbmCateParams
) -> tuple[int, ...] | None:
    """proof step 8: the nuisance models' adjustment set as increasing covariate positions, or
    None for every covariate. 422 for the S-learner (it has no nuisance model: its outcome
    model is the learner), an empty list, a repeated or out-of-range position. Public request
    and schema only."""
    if params.adjustment_columns is not None and params.learner == "s":
        raise InvalidParameters(
            "adjustment_columns is for the DR and R learners' nuisance models (the S-learner "
            "has none)"
        )
    return checked_columns(domain, params.adjustment_columns, "adjustment_columns")


def anchor_bound(domain: PublicDomain, clip: float, clip_k: float) -> float:
    """The anchor pseudo-outcome's public bound B_a (the adaptive clip K_a <= B_a): in an RCT
    the natural bound R_Y / c (c = min(p, 1 - p): a few R_Y; clipping the skewed AIPW term at
    the learner's K biased the anchor there), observationally the learner's K (R_Y / c with
    c = 0.05 is 20 R_Y, and the anchor's noise grows with the bound: PEHE 44 against 2.2 at
    K, n 1000, eps 1, bench/README.md)."""
    if domain.design == StudyDesign.RCT:
        return domain.outcome_range / clip
    return clip_k


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


def plan_screen(
    domain: PublicDomain, epsilon: float, delta: float, clip_k: float, rows: int
) -> EffectScreen:
    """proof step 9: the screen's public plan at ``effect_screen.SHARE`` of the effect model's
    (epsilon, delta) (exact splits): ``HISTOGRAM_SHARE`` of it (and that share of delta) for
    the continuous covariates' histograms, the rest of its epsilon for the top-k (delta 0); the
    whole share to the top-k where no covariate is continuous."""
    screen_epsilon, _ = ate_strict.split_share(epsilon, screening.SHARE)
    continuous = quantile_bins.continuous_columns(domain)
    if not continuous:
        return EffectScreen(screen_epsilon, screening.COLUMNS, clip_k, rows)
    bins_epsilon, topk_epsilon = ate_strict.split_share(screen_epsilon, screening.HISTOGRAM_SHARE)
    bins_delta, _ = ate_strict.split_share(delta, screening.SHARE * screening.HISTOGRAM_SHARE)
    bins = QuantileBins.plan(continuous, bins_epsilon, bins_delta)
    return EffectScreen(topk_epsilon, screening.COLUMNS, clip_k, rows, bins)


def screen_events(screen: EffectScreen, q: int) -> list[NoiseEvent]:
    """The screen's events on the effect fold's fitting rows: the histograms (if any), then the
    top-k."""
    events: list[NoiseEvent] = []
    if screen.bins is not None:
        histograms = quantile_bins_event("effect", screen.bins)
        rows = "fitting rows of the effect fold (the screen's CDF scaling)"
        share = screening.SHARE * screening.HISTOGRAM_SHARE
        params = {**histograms.params, "rows": rows, "share_of_module": share}
        events.append(replace(histograms, params=params))
    events.append(_screen_event(screen, q))
    return events


def _screen_event(screen: EffectScreen, q: int) -> NoiseEvent:
    return NoiseEvent(
        type="noisy_top_k",
        module="effect",
        epsilon=screen.epsilon,
        delta=0.0,
        params={
            "statistic": "|sum r z_j| per covariate: the centred pseudo-outcomes' covariance "
            "with each covariate scaled to [-1, 1] (coded: public box; continuous: DP CDF)",
            "sampler": "opendp make_noisy_top_k (exponential noise, max divergence)",
            "rows": "fitting rows of the effect fold (the effect model's)",
            "candidates": q,
            "k": screen.columns,
            "bound": screen.bound,
            "sensitivity_linf_nominal": 2.0 * screen.bound,
            "sensitivity_linf": screen.sensitivity,
            "scale": screen.scale,
            "share_of_effect_epsilon": screening.SHARE,
        },
    )


def plan(domain: PublicDomain, params: EbmCateParams) -> MechanismRecord:
    """The mechanism record (cost) of a request; raises ``InvalidParameters`` before a charge."""
    return make_plan(domain, params).record


def module_epsilon_p(state: Plan, domain: PublicDomain) -> dict[str, float]:
    """Each DP-EBM module's interpret ``epsilon`` (proof step 2): the outcome model's at the
    rest of its budget after the measured range (step 10), the anchored effect model's at the
    effect fold's rest (steps 6, 9), every other module's the plan's."""
    own = {"outcome": state.outcome_accounting, "effect": state.effect_accounting}
    return {
        name: (own.get(name) or state.accounting).epsilon_p
        for name in modules(domain, state.params.learner)
    }


def public_parameters(state: Plan, domain: PublicDomain) -> dict[str, Any]:
    return {
        "mode": str(state.guarantee),
        "guarantee": str(state.guarantee),
        "learner": state.params.learner,
        "epsilon": state.record.epsilon,
        "delta": state.record.delta,
        # the first-stage modules' epsilon_p (without the measured range, every module's but
        # an anchored effect model's); each module's own below
        "epsilon_p": state.accounting.epsilon_p,
        "epsilon_p_by_module": module_epsilon_p(state, domain),
        "propensity_clip": state.params.propensity_clip if state.propensity is None else None,
        "treatment_probability": state.propensity,
        "pseudo_outcome_clip": state.clip_k if state.params.learner != "s" else None,
        "fold_sizes": dict(state.record.fold_sizes),
        "max_bins": state.params.max_bins,
        "max_rounds": state.params.max_rounds,
        "design": str(domain.design),
        "shrinkage": "ate" if state.anchored else "none",
        "anchor_share": state.anchor_share,
        "anchor_source": (
            None
            if not state.anchored
            else "given"
            if state.given_anchor is not None
            else "ate_release"
            if state.rct_anchor is not None
            else "effect_fold"
        ),
        "effect_columns": (
            None if state.params.effect_columns is None else list(state.params.effect_columns)
        ),
        "adjustment_columns": (
            None
            if state.params.adjustment_columns is None
            else list(state.params.adjustment_columns)
        ),
        "effect_screen": state.screen is not None,
        "outcome_range": state.outcome_range is not None,
    }
