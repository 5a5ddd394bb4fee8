"""The privacy map of the strict ATE: from public inputs to the calibrated noise and the
mechanism record (the cost the ledger charges). Touches no data.

Proof: ``docs/proofs/ate_strict.md`` (steps are labelled ``# proof step N`` / ``proof §N``);
charged adaptive clipping is §13.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.mechanisms import dp_linear, outcome_range
from service.mechanisms.ate_strict.rules import (
    MAX_EPSILON,
    MECHANISM,
    MIN_EPSILON,
    OUTCOME_RANGE_MIN_N_EPSILON,
    VERSION,
    AteStrictParams,
    Nuisance,
    dp_ebm_learning_rates,
    module_names,
    resolved_shares,
    split_share,
    validate_cross_fit,
    validate_domain,
    validate_fractions,
)
from service.mechanisms.calibration import (
    validate_alpha,
    validate_delta,
    validate_epsilon,
    validate_finite_positive,
)
from service.mechanisms.domain import (
    PublicDomain,
    StudyDesign,
    checked_columns,
    project_domain,
)
from service.mechanisms.dp_ebm import (
    DP_EBM_LEARNING_RATE,
    DpEbmAccounting,
    nuisance_event,
    solve_dp_ebm_epsilon_p,
)
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import (
    GaussianCalibration,
    calibrate_gaussian,
)
from service.mechanisms.partition import (
    fold_sizes,
)
from service.mechanisms.quantile_bins import (
    CELLS,
    SHARE,
    QuantileBins,
    continuous_columns,
)
from service.mechanisms.records import (
    Composition,
    Guarantee,
    MechanismRecord,
    NoiseEvent,
)

# Float summation slack (module helper ``float_slack``): fsum and one division add at most
# about 2.01 * 2^-53 * B of error on each side of a mean of values in [-B, B].
FLOAT_SLACK_BITS = 50


# Charged adaptive clipping (proof §13): a public share of the estimation budget buys an
# epsilon-DP quantile Q of |Gamma| on a public geometric grid in [B / RANGE, B]; the clip is then
# K = min(B, kappa(n2) Q) with the public inflation kappa(n2) = 2 + 0.5 log10(n2).
ADAPTIVE_CLIP_SHARE = 0.1


ADAPTIVE_CLIP_LEVEL = 0.9


ADAPTIVE_CLIP_CANDIDATES = 200


ADAPTIVE_CLIP_RANGE = 1000.0


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


def float_slack(nominal: float, n2: int) -> float:
    """Nominal sensitivity inflated for the float rounding of fsum and the division by n2."""
    return math.nextafter(nominal * (1.0 + (n2 + 8) * 2.0**-FLOAT_SLACK_BITS), math.inf)


@dataclass(frozen=True)
class Plan:
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
    # DP-EBM nuisances' (classifier, regressor) learning rates (``dp_ebm_learning_rates``)
    learning_rates: tuple[float, float] = (DP_EBM_LEARNING_RATE, DP_EBM_LEARNING_RATE)
    # DP quantile bins of each DP-EBM module's continuous covariates (proof §14)
    quantile_bins: QuantileBins | None = None
    # the DP-EBM outcome model's measured range (proof §16) and that model's accounting, which
    # differs from the propensity model's ``dp_ebm`` by the range's share
    outcome_range: outcome_range.OutcomeRange | None = None
    dp_ebm_outcome: DpEbmAccounting | None = None

    @property
    def n2(self) -> int:
        """Records averaged by the estimation stage (all n with cross-fitting)."""
        return sum(self.fold_sizes) if self.cross_fit else self.fold_sizes[-1]


def adjusted_domain(domain: PublicDomain, params: AteStrictParams) -> PublicDomain:
    """proof §15: the public domain the mechanism runs on, the schema's covariates at
    ``adjustment_columns`` only (None: every covariate). Raises ``InvalidParameters`` for an
    invalid list, or one given with ``nuisance="none"`` (there is no model to adjust)."""
    columns = checked_columns(domain, params.adjustment_columns, "adjustment_columns")
    if params.adjustment_columns is not None and params.nuisance == "none":
        raise InvalidParameters("adjustment_columns needs nuisance models (nuisance is 'none')")
    return project_domain(domain, columns)


def make_plan(domain: PublicDomain, params: AteStrictParams) -> Plan:
    """Validate everything and compute the calibration and the record. Touches no data.

    With ``adjustment_columns`` the plan is that of the projected domain (proof §15)."""
    domain = adjusted_domain(domain, params)
    nuisance = params.nuisance
    validate_domain(domain, nuisance)
    cross_fit = params.cross_fit
    validate_cross_fit(nuisance, cross_fit, params.fold_fractions)
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

    # proof step 2: nuisance modules (DP-EBM) at (epsilon, delta) each under replace-one; with
    # quantile bins (proof §14) each module first spends a public share on its histograms.
    bins = plan_quantile_bins(
        domain, nuisance, params.quantile_bins, modules, sizes, epsilon, delta
    )
    epsilon_ebm, delta_ebm = epsilon, delta
    if bins is not None:
        _, epsilon_ebm = split_share(epsilon, SHARE)
        _, delta_ebm = split_share(delta, SHARE)
    dp_ebm = solve_dp_ebm_epsilon_p(epsilon_ebm, delta_ebm) if nuisance == "dp_ebm" else None
    # proof §16: the outcome model's module first spends a public share on its range.
    measured_range = plan_outcome_range(
        nuisance, params.outcome_range, epsilon_ebm, domain.n * epsilon
    )
    epsilon_ebm_outcome, dp_ebm_outcome = epsilon_ebm, dp_ebm
    if measured_range is not None:
        _, epsilon_ebm_outcome = split_share(epsilon_ebm, outcome_range.SHARE)
        dp_ebm_outcome = solve_dp_ebm_epsilon_p(epsilon_ebm_outcome, delta_ebm)
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
    sensitivity_theta = float_slack(2.0 * bound / n2, n2)
    sensitivity_m2 = float_slack(bound * bound / n2, n2)
    mean = calibrate_gaussian(epsilon_theta, delta_theta, sensitivity_theta)
    second_moment = calibrate_gaussian(epsilon_v, delta_v, sensitivity_m2)

    events: list[NoiseEvent] = []
    q = domain.q
    rate_pi, rate_mu = dp_ebm_learning_rates(domain.n, epsilon, measured_range is not None)
    if dp_ebm is not None and dp_ebm_outcome is not None:  # both or neither (dp_ebm only)
        if "propensity" in modules:
            if bins is not None:
                events.append(quantile_bins_event("propensity", bins))
            events.append(
                nuisance_event(
                    "propensity", epsilon_ebm, delta_ebm, dp_ebm, q, 1.0, learning_rate=rate_pi
                )
            )
        if bins is not None:
            events.append(quantile_bins_event("outcome", bins))
        outcome_event = nuisance_event(
            "outcome",
            epsilon_ebm_outcome,
            delta_ebm,
            dp_ebm_outcome,
            q + 1,
            big_r,
            learning_rate=rate_mu,
        )
        if measured_range is not None:
            events.extend(outcome_range_events(measured_range, domain))
            outcome_event = measured_range_nuisance_event(outcome_event)
        events.append(outcome_event)
    nuisance_module = "nuisance" if cross_fit else None
    if dp_logistic is not None:
        events.append(
            dp_linear_event(
                nuisance_module or "propensity",
                "dp_logistic_regression_weights",
                dp_logistic,
                cross_fit,
            )
        )
    if dp_ridge is not None:
        events.append(
            dp_linear_event(
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
    return Plan(
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
        learning_rates=(rate_pi, rate_mu),
        quantile_bins=bins,
        outcome_range=measured_range,
        dp_ebm_outcome=dp_ebm_outcome,
    )


def plan_outcome_range(
    nuisance: Nuisance, requested: bool | None, epsilon_model: float, n_epsilon: float
) -> outcome_range.OutcomeRange | None:
    """The DP-EBM outcome model's range measurement (proof §16), or None.

    ``requested`` True asks for it (``dp_ebm`` needed), False refuses it, None applies the
    public rule: on where a DP-EBM outcome model is fitted and the public ``n_epsilon`` (n times
    the requested epsilon) is at least ``OUTCOME_RANGE_MIN_N_EPSILON``. ``epsilon_model`` is the
    outcome module's epsilon left for the model after the quantile bins; the two quantiles take
    ``outcome_range.SHARE`` of it, split equally (exact splits). Public inputs only.
    """
    if requested is not None and not isinstance(requested, bool):
        raise InvalidParameters("outcome_range must be a boolean or null")
    if requested is False:
        return None
    if nuisance != "dp_ebm":
        if requested:
            raise InvalidParameters("outcome_range needs nuisance='dp_ebm'")
        return None
    if requested is None and n_epsilon < OUTCOME_RANGE_MIN_N_EPSILON:
        return None
    epsilon_range, _ = split_share(epsilon_model, outcome_range.SHARE)
    epsilon_low, epsilon_high = split_share(epsilon_range, 0.5)
    return outcome_range.OutcomeRange(epsilon_low, epsilon_high)


def outcome_range_events(
    measured: outcome_range.OutcomeRange, domain: PublicDomain
) -> tuple[NoiseEvent, NoiseEvent]:
    """The two pure-DP quantiles of the outcome fold's outcomes (proof §16)."""
    grid = outcome_range.candidates(domain.y_lower, domain.y_upper)
    extra = {"share_of_model_epsilon": outcome_range.SHARE}
    low, high = outcome_range.LEVEL, 1.0 - outcome_range.LEVEL
    return (
        quantile_noise_event("outcome", "quantile_outcome", measured.epsilon_low, low, grid, extra),
        quantile_noise_event(
            "outcome", "quantile_outcome", measured.epsilon_high, high, grid, extra
        ),
    )


def measured_range_nuisance_event(event: NoiseEvent) -> NoiseEvent:
    """The outcome model's event with its target range marked as the measured one: interpret
    calibrates the noise to that range, so mu (the privacy) is the event's either way."""
    params = {
        **event.params,
        "target_range": "measured",
        "target_range_max": event.params["target_range"],
    }
    return dataclasses.replace(event, params=params)


def plan_quantile_bins(
    domain: PublicDomain,
    nuisance: Nuisance,
    requested: bool | None,
    modules: tuple[str, ...],
    sizes: tuple[int, ...],
    epsilon: float,
    delta: float,
) -> QuantileBins | None:
    """The DP quantile bins of the DP-EBM modules (proof §14), or None.

    ``requested`` True asks for them (``dp_ebm`` and a numeric covariate needed), False
    refuses them, None applies the public rule: on where they are possible and the released
    CDF's public noise on the smallest DP-EBM fold is at most ``MAX_CDF_ERROR``
    (``QuantileBins.accurate_enough``). Public inputs only.
    """
    if requested is not None and not isinstance(requested, bool):
        raise InvalidParameters("quantile_bins must be a boolean or null")
    if requested is False:
        return None
    columns = continuous_columns(domain)
    if nuisance != "dp_ebm" or not columns:
        if requested:
            raise InvalidParameters(
                "quantile_bins needs nuisance='dp_ebm' and a numeric covariate in the schema"
            )
        return None
    epsilon_bins, _ = split_share(epsilon, SHARE)
    delta_bins, _ = split_share(delta, SHARE)
    bins = QuantileBins.plan(columns, epsilon_bins, delta_bins)
    smallest = min(
        size for module, size in zip(modules, sizes, strict=True) if module != "estimation"
    )
    return bins if requested or bins.accurate_enough(smallest) else None


def lattice_params(calibration: GaussianCalibration) -> dict[str, float | int | str]:
    """The public fields of a lattice Gaussian event: sampler, sensitivities and scales."""
    return {
        "sampler": "opendp discrete gaussian on 2^k lattice",
        "sensitivity_l2": calibration.sensitivity_l2,
        "sensitivity_l2_effective": calibration.sensitivity_l2_effective,
        "lattice_exponent": calibration.lattice_exponent,
        "noise_multiplier": calibration.noise_multiplier,
        "sigma": calibration.sigma,
        "mu": calibration.mu,
    }


def lattice_event(
    module: str, calibration: GaussianCalibration, params: dict[str, float | int | str]
) -> NoiseEvent:
    """A lattice Gaussian event: its (epsilon, delta), ``params`` and ``lattice_params``."""
    return NoiseEvent(
        type="gaussian",
        module=module,
        epsilon=calibration.epsilon,
        delta=calibration.delta,
        params={**params, **lattice_params(calibration)},
    )


def quantile_bins_event(module: str, bins: QuantileBins) -> NoiseEvent:
    """The Gaussian histograms of a DP-EBM module's continuous covariates (proof §14)."""
    return lattice_event(
        module,
        bins.calibration,
        {
            "statistic": "continuous_covariate_histograms",
            "columns": len(bins.columns),
            "cells": CELLS,
            "share_of_module": SHARE,
            "dim": bins.calibration.dim,
        },
    )


def dp_linear_event(
    module: str,
    statistic: str,
    model: dp_linear.DpLogistic | dp_linear.DpRidge,
    cross_fit: bool,
) -> NoiseEvent:
    """The Gaussian event of a DP logistic (weights) or ridge (sufficient statistics) fit."""
    return lattice_event(
        module,
        model.calibration,
        {
            "statistic": statistic,
            "parallel_folds": 2 if cross_fit else 1,
            "fit_size": model.m,
            "regularization": model.regularization,
            "intercept": dp_linear.INTERCEPT,
            "dim": model.calibration.dim,
        },
    )


def gaussian_event(
    statistic: str, nominal_sensitivity: float, calibration: GaussianCalibration, bound: float
) -> NoiseEvent:
    return lattice_event(
        "estimation",
        calibration,
        {"statistic": statistic, "bound": bound, "sensitivity_l2_nominal": nominal_sensitivity},
    )


def quantile_event(
    epsilon: float, bound: float, n2: int, share: tuple[str, float] | None = None
) -> NoiseEvent:
    """The pure-DP quantile of |Gamma| that sets the adaptive clip (proof §13). ``share``: the
    event's (label, share) of its caller's budget; None: the estimation module's
    ``ADAPTIVE_CLIP_SHARE``."""
    label, value = share or ("share_of_estimation_epsilon", ADAPTIVE_CLIP_SHARE)
    return quantile_noise_event(
        "estimation",
        "quantile_abs_pseudo_outcome",
        epsilon,
        ADAPTIVE_CLIP_LEVEL,
        adaptive_clip_candidates(bound),
        {"inflation": adaptive_clip_inflation(n2), label: value},
    )


def quantile_noise_event(
    module: str,
    statistic: str,
    epsilon: float,
    level: float,
    grid: NDArray[np.float64],
    extra: Mapping[str, float | int | str],
) -> NoiseEvent:
    """An OpenDP quantile event (exponential mechanism, delta 0) on a public grid."""
    return NoiseEvent(
        type="exponential_quantile",
        module=module,
        epsilon=epsilon,
        delta=0.0,
        params={
            "statistic": statistic,
            "sampler": "opendp make_private_quantile (replace-one, sized)",
            "level": level,
            "candidates": int(grid.size),
            "candidate_min": float(grid[0]),
            "candidate_max": float(grid[-1]),
            **extra,
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
    return make_plan(domain, params).record


def public_parameters(state: Plan) -> dict[str, Any]:
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
        "quantile_bins": state.quantile_bins is not None,
        "outcome_range": state.outcome_range is not None,
        "adjustment_columns": None
        if params.adjustment_columns is None
        else sorted(params.adjustment_columns),
    }


def mean_calibration(epsilon: float, delta: float, clip: float, n2: int) -> GaussianCalibration:
    """The lattice Gaussian for a mean of n2 values in [-clip, clip]: sensitivity ``2 clip / n2``
    plus the float slack (proof §3)."""
    return calibrate_gaussian(epsilon, delta, float_slack(2.0 * clip / n2, n2))


def adaptive_calibrations(
    state: Plan, clip: float
) -> tuple[GaussianCalibration, GaussianCalibration]:
    """proof §13: the mean and second-moment Gaussians at the clip K, with the (epsilon, delta)
    fixed by the plan: sensitivities ``2K / n2`` and ``K^2 / n2`` plus the float slack."""
    n2 = state.n2
    mean = mean_calibration(state.mean.epsilon, state.mean.delta, clip, n2)
    second = calibrate_gaussian(
        state.second_moment.epsilon, state.second_moment.delta, float_slack(clip * clip / n2, n2)
    )
    return mean, second
