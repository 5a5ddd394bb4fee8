"""cate_vector's calibration: parameters, public rules, the plan and its privacy map.

The plan (``make_plan``) fixes every noise scale from public inputs before any data is read:
the DP-EBM nuisances' epsilon_p, the ridge coefficients' sensitivity and lattice Gaussian
(proof steps 1-5 of docs/proofs/cate_vector.md), the anchor ATE's share (step 7), and the
record (the cost the ledger charges). Pure: no data, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from service.mechanisms.anchor import (
    AteAnchorPlan,
    ate_anchor_share,
    no_room_for_anchor,
    split_for_anchor,
)
from service.mechanisms.calibration import (
    default_delta,
    public_propensity,
    validate_delta,
    validate_epsilon,
    validate_finite_positive,
)
from service.mechanisms.domain import (
    PublicDomain,
    StudyDesign,
    coordinate_error,
    points_summary,
)
from service.mechanisms.dp_ebm import (
    DpEbmAccounting,
    dp_ebm_event,
    solve_dp_ebm_epsilon_p,
)
from service.mechanisms.errors import InvalidParameters, PaperModeDisabled
from service.mechanisms.noise import GaussianCalibration, calibrate_gaussian
from service.mechanisms.partition import checked_fractions, fold_sizes
from service.mechanisms.records import Composition, Guarantee, MechanismRecord, NoiseEvent

MECHANISM = "cate_vector"
# 2: the anchor is the strict single-release ate default on all rows (proof step 7); 3: its nuisance
# class is the ate default's at the whole epsilon, and its interval is released
# (ate_anchor_interval); 4: on a trial below n epsilon = 5 * 10^4 the anchor is the DP difference in
# means (the ate default there), pure epsilon
VERSION = "4"

Learner = Literal["r", "dr"]
Mode = Literal["strict", "paper"]
Progress = Callable[[float, str], None]

MIN_EPSILON = 0.01
MAX_EPSILON = 100.0
MAX_POINTS = 5_000
MAX_FEATURES = 1_000
FEATURE_NORM = 2.0  # C: ||phi(x)||^2 <= 1 + 1 + 2 (module docstring)
# Float margin on Delta_theta: a backward-stable solve of the (D+1+q)-square SPD system with
# condition number <= (C^2 + lambda) / lambda perturbs theta by far less than 2^-20 ||theta||
# for the public ranges of lambda and D allowed here (docs/proofs/cate_vector.md, step 5).
_SOLVE_SLACK = 2.0**-20
MIN_RIDGE = 1e-3
# Public default of the strict ridge (``suggested_ridge``): the smallest value of the grid whose
# quoted noise-sd bound is at most RIDGE_RULE_FRACTION * R_Y; public inputs only.
STRICT_RIDGE_GRID = (0.1, 0.3, 1.0, 3.0)
RIDGE_RULE_FRACTION = 0.2
PAPER_RIDGE = 1e-3
# proof step 7: the anchor is the strict single-release ate default on all rows at the public share
# ``anchor.ate_anchor_share`` of (epsilon, delta) (the smallest share whose anchor is expected
# within 1.1x the error of an ate release at the whole budget); the vector gets the rest.


@dataclass(frozen=True)
class CateVectorParams:
    """Public request parameters.

    Attributes:
        points: the d public query points (d x q), inside the public box.
        epsilon, delta: the charged (epsilon, delta) for the whole vector.
        learner: ``"r"`` (default) or ``"dr"``.
        mode: ``"strict"`` (default) or ``"paper"`` (needs allow_paper_mode).
        propensity_clip: c; pi_hat in [c, 1 - c] (observational designs).
        pseudo_outcome_clip: DR's public K (default R_Y).
        ridge: lambda of the second stage (public). The kind's default is
            ``suggested_ridge`` (strict: a public rule, it sets the sensitivity; paper: 0.001).
        n_features: D, the number of random Fourier features.
        lengthscale: l of the Gaussian kernel on unit-scaled covariates.
        fold_fractions: per module; default (0.25, 0.25, 0.5) strict observational,
            (0.5, 0.5) strict RCT, (0.5, 0.5) paper (nuisances, estimation).
        anchor: strict only (proof step 7): spend the public share ``anchor.ate_anchor_share``
            of (epsilon, delta) on the strict ``ate`` default release over all rows (the
            anchor), fit the vector at the rest on targets centred at it (so the ridge shrinks
            toward the ATE, not toward 0) and shrink the released deviations toward it
            (James–Stein, public noise variances).
    """

    points: tuple[tuple[float, ...], ...]
    epsilon: float
    delta: float
    learner: Learner = "r"
    mode: Mode = "strict"
    propensity_clip: float = 0.05
    pseudo_outcome_clip: float | None = None
    ridge: float = 0.1
    n_features: int = 50
    lengthscale: float = 0.3
    fold_fractions: tuple[float, ...] | None = None
    anchor: bool = False


def modules(domain: PublicDomain, mode: Mode) -> tuple[str, ...]:
    if mode == "paper":
        return ("nuisance", "estimation")
    if domain.design == StudyDesign.RCT:
        return ("outcome", "estimation")
    return ("propensity", "outcome", "estimation")


def _fractions(
    domain: PublicDomain, mode: Mode, fold_fractions: tuple[float, ...] | None
) -> tuple[float, ...]:
    names = modules(domain, mode)
    default = (0.25, 0.25, 0.5) if len(names) == 3 else (0.5, 0.5)
    fractions = default if fold_fractions is None else fold_fractions
    return checked_fractions(domain.n, names, fractions)


def default_delta_for(
    domain: PublicDomain, mode: Mode, fold_fractions: tuple[float, ...] | None
) -> float:
    """README §1.7 default delta over this release's folds."""
    return default_delta(min(fold_sizes(domain.n, _fractions(domain, mode, fold_fractions))))


def point_errors(points: Any, domain: PublicDomain) -> list[tuple[tuple[int, ...], str]]:
    """Validation errors of the query points against the public box and a categorical
    covariate's declared codes: (path, message) pairs."""
    errors: list[tuple[tuple[int, ...], str]] = []
    lower, upper = domain.x_lower, domain.x_upper
    codes = domain.x_codes or (None,) * domain.q
    for i, point in enumerate(points):
        if len(point) != domain.q:
            errors.append(((i,), f"each point needs {domain.q} coordinates"))
            continue
        for j, value in enumerate(point):
            error = coordinate_error(float(value), float(lower[j]), float(upper[j]), codes[j])
            if error is not None:
                errors.append(((i, j), error))
    return errors


def c_constant(epsilon: float, delta: float, n: int) -> float:
    """The paper's finite-query constant ``5 sqrt(2 ln n ln(2 / delta)) / (epsilon n)``."""
    return 5.0 * math.sqrt(2.0 * math.log(n) * math.log(2.0 / delta)) / (epsilon * n)


def theta_sensitivity(bound_r: float, ridge: float, n2: int, feature_norm: float) -> float:
    """Replace-one L2 sensitivity of the ridge solution (proof steps 2-4).

    ``feature_norm`` is C_v, a bound on the norm of the second-stage inputs v.
    ``||theta|| <= B_r / sqrt(lambda)``; each loss gradient on that ball is at most
    ``2 C_v (B_r + C_v B_r / sqrt(lambda))``; strong convexity 2 lambda gives
    ``Delta = 2 C_v B_r (1 + C_v / sqrt(lambda)) / (lambda n_2)``.
    """
    return 2.0 * feature_norm * bound_r * (1.0 + feature_norm / math.sqrt(ridge)) / (ridge * n2)


@dataclass(frozen=True)
class Plan:
    params: CateVectorParams
    guarantee: Guarantee
    modules: tuple[str, ...]
    fold_sizes: tuple[int, ...]
    clip: float
    propensity: float | None
    bound_r: float
    accounting: DpEbmAccounting | None
    theta: GaussianCalibration | None  # strict only
    record: MechanismRecord
    cate_bound: float  # R_Y: tau = mu_1 - mu_0 lies in [-R_Y, R_Y]
    anchor: AteAnchorPlan | None = None

    @property
    def n2(self) -> int:
        return self.fold_sizes[-1]


def make_plan(domain: PublicDomain, params: CateVectorParams) -> Plan:
    """Validate and compute the record (cost) from public inputs only."""
    if params.mode not in ("strict", "paper"):
        raise InvalidParameters("mode must be 'strict' or 'paper'")
    if params.learner not in ("r", "dr"):
        raise InvalidParameters("learner must be 'r' or 'dr'")
    if params.mode == "paper" and not domain.allow_paper_mode:
        raise PaperModeDisabled("paper mode is not enabled for this dataset by its owner")
    if not 1 <= len(params.points) <= MAX_POINTS:
        raise InvalidParameters(f"send between 1 and {MAX_POINTS} points")
    errors = point_errors(params.points, domain)
    if errors:
        raise InvalidParameters(points_summary([message for _, message in errors]))
    epsilon = validate_epsilon(params.epsilon, minimum=MIN_EPSILON, maximum=MAX_EPSILON)
    names = modules(domain, params.mode)
    sizes = fold_sizes(domain.n, _fractions(domain, params.mode, params.fold_fractions))
    delta = validate_delta(params.delta, n_min=min(sizes))
    ridge = validate_finite_positive(params.ridge, "ridge")
    if ridge < MIN_RIDGE:
        raise InvalidParameters(f"ridge must be at least {MIN_RIDGE}")
    if not 1 <= params.n_features <= MAX_FEATURES:
        raise InvalidParameters(f"n_features must be in [1, {MAX_FEATURES}]")
    validate_finite_positive(params.lengthscale, "lengthscale")
    big_r = validate_finite_positive(domain.outcome_range, "outcome range")
    propensity, clip = public_propensity(domain, params.propensity_clip)
    # proof, strict mechanism item 3: the public bound B on the second-stage targets.
    if params.learner == "r":
        bound_r = big_r
    else:
        # |psi_DR| <= R / c; the public K (default R_Y) may only tighten it.
        natural = big_r / clip
        requested = params.pseudo_outcome_clip
        if requested is None:
            bound_r = min(big_r, natural)
        else:
            bound_r = min(validate_finite_positive(requested, "pseudo_outcome_clip"), natural)
    d = len(params.points)
    events: list[NoiseEvent] = []
    accounting: DpEbmAccounting | None = None
    theta: GaussianCalibration | None = None
    anchor: AteAnchorPlan | None = None
    if params.anchor and params.mode != "strict":
        raise InvalidParameters("the ATE anchor (shrinkage='ate') is available in strict mode only")
    # proof step 7: with the anchor, the vector's own modules run at the rest of the budget
    epsilon_rest, delta_rest = epsilon, delta
    if params.anchor and params.mode == "strict":
        share = ate_anchor_share(domain, epsilon, delta)
        if share is None:
            raise no_room_for_anchor()
        anchor, epsilon_rest, delta_rest = split_for_anchor(domain, epsilon, delta, share)
    if params.mode == "strict":
        guarantee = Guarantee.STRICT
        accounting = solve_dp_ebm_epsilon_p(epsilon_rest, delta_rest)
        if "propensity" in names:
            events.append(
                dp_ebm_event(
                    "propensity",
                    epsilon_rest,
                    delta_rest,
                    accounting,
                    n_features=domain.q,
                    target_range=1.0,
                    learner="Classifier",
                )
            )
        width = domain.q if params.learner == "r" else domain.q + 1
        events.append(
            dp_ebm_event(
                "outcome",
                epsilon_rest,
                delta_rest,
                accounting,
                n_features=width,
                target_range=big_r,
                learner="Regressor",
            )
        )
        # proof steps 2-5: sensitivity of theta, plus the float margin.
        # proof step 3: ||v|| <= C_v; R: v = (a - pi_hat) phi with |a - pi_hat| <= 1 - c
        # (pi_hat clipped to [c, 1 - c]; RCT: pi_hat = p, 1 - c = max(p, 1 - p)); DR: v = phi.
        input_norm = FEATURE_NORM * (1.0 - clip) if params.learner == "r" else FEATURE_NORM
        nominal = theta_sensitivity(bound_r, ridge, sizes[-1], input_norm)
        radius = bound_r / math.sqrt(ridge)
        sensitivity = math.nextafter(nominal + 2.0 * _SOLVE_SLACK * radius, math.inf)
        epsilon_theta, delta_theta = epsilon_rest, delta_rest
        theta = calibrate_gaussian(
            epsilon_theta, delta_theta, sensitivity, dim=params.n_features + 1 + domain.q
        )
        events.append(
            NoiseEvent(
                type="gaussian",
                module="estimation",
                epsilon=epsilon_theta,
                delta=delta_theta,
                params={
                    "statistic": "ridge coefficients on random Fourier features",
                    "sampler": "opendp discrete gaussian on 2^k lattice",
                    "sensitivity_l2_nominal": nominal,
                    "sensitivity_l2": sensitivity,
                    "sensitivity_l2_effective": theta.sensitivity_l2_effective,
                    "dim": theta.dim,
                    "lattice_exponent": theta.lattice_exponent,
                    "noise_multiplier": theta.noise_multiplier,
                    "sigma": theta.sigma,
                    "ridge": ridge,
                    "target_bound": bound_r,
                    "feature_norm": FEATURE_NORM,
                    "input_norm": input_norm,
                    "queries": d,
                },
            )
        )
        composition = Composition.THEOREM6_MAX
    else:
        guarantee = Guarantee.PAPER
        events.append(
            NoiseEvent(
                type="smooth_sensitivity_gaussian",
                module="estimation",
                epsilon=epsilon,
                delta=delta,
                params={
                    "claim": "Schroeder et al. Theorem 1 (heuristic)",
                    "c": c_constant(epsilon, delta, sizes[-1]),
                    "queries": d,
                },
            )
        )
        composition = Composition.SEQUENTIAL
    sizes_by_module = dict(zip(names, sizes, strict=True))
    total_epsilon, total_delta = _module_max(events, "epsilon"), _module_max(events, "delta")
    if anchor is not None:
        # proof step 7: the anchor (all rows) then the vector's modules: sequential composition
        events, sizes_by_module = anchor.compose(
            events, sizes_by_module, (total_epsilon, total_delta), (epsilon, delta)
        )
        composition = Composition.ANCHOR_THEN_THEOREM6_MAX
        total_epsilon, total_delta = epsilon, delta
    record = MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=guarantee,
        n=domain.n,
        fold_sizes=sizes_by_module,
        composition=composition,
        events=tuple(events),
        epsilon=total_epsilon,
        delta=total_delta,
    )
    return Plan(
        params,
        guarantee,
        names,
        sizes,
        clip,
        propensity,
        bound_r,
        accounting,
        theta,
        record,
        cate_bound=big_r,
        anchor=anchor,
    )


def _mean_linear_norm(domain: PublicDomain, points: tuple[tuple[float, ...], ...]) -> float:
    """``mean_j ||2 u_j - 1||^2 / q`` of the points scaled to the unit box (public)."""
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    clipped = np.clip(np.asarray(points, dtype=np.float64), lower, upper)
    u = (clipped - lower) / (upper - lower)
    return float(np.mean(np.sum((2.0 * u - 1.0) ** 2, axis=1))) / domain.q


def _module_max(events: list[NoiseEvent], field: str) -> float:
    """Theorem 6: the max over modules of each module's sequential (exact) sum."""
    totals: dict[str, list[float]] = {}
    for event in events:
        totals.setdefault(event.module, []).append(float(getattr(event, field)))
    return max(math.fsum(values) for values in totals.values())


def plan(domain: PublicDomain, params: CateVectorParams) -> MechanismRecord:
    """The record (cost); ``InvalidParameters`` / ``PaperModeDisabled`` before any charge."""
    return make_plan(domain, params).record


def _public(state: Plan) -> dict[str, Any]:
    params = state.params
    return {
        "mode": params.mode,
        "guarantee": str(state.guarantee),
        "learner": params.learner,
        "epsilon": state.record.epsilon,
        "delta": state.record.delta,
        "queries": len(params.points),
        "fold_sizes": dict(state.record.fold_sizes),
        "propensity_clip": state.clip,
        "target_bound": state.bound_r,
        "ridge": params.ridge,
        "n_features": params.n_features,
        "lengthscale": params.lengthscale,
        "anchor_release": None if state.anchor is None else state.anchor.public(),
    }


def suggested_ridge(domain: PublicDomain, params: CateVectorParams) -> float:
    """The strict mode's default ridge, from public quantities only (no data access).

    The smallest lambda in ``STRICT_RIDGE_GRID`` whose quoted bound on every coordinate's
    noise sd (``2 sigma(lambda)``: epsilon, delta, n_2, R_Y, c, the learner) is at most
    ``RIDGE_RULE_FRACTION * R_Y``; the largest if none is. The noise falls like
    lambda^(-3/2) while the ridge bias grows with lambda, so small budgets get more
    regularisation; it never goes below the former fixed default 0.1. Paper mode: 1e-3.
    Chosen on DS1 and checked on DS2 (bench/README.md, ``--strict-ridges``).
    """
    if params.mode != "strict":
        return PAPER_RIDGE
    limit = RIDGE_RULE_FRACTION * validate_finite_positive(domain.outcome_range, "outcome range")
    for ridge in STRICT_RIDGE_GRID:
        theta = make_plan(domain, replace(params, ridge=ridge)).theta
        assert theta is not None
        if FEATURE_NORM * theta.sigma <= limit:
            return ridge
    return STRICT_RIDGE_GRID[-1]


def paper_gamma_bounds(learner: Learner, outcome_range: float, clip: float) -> tuple[float, float]:
    """Public bounds ``(lower, upper)`` on paper mode's ``gamma_hat`` (proof, "Paper-mode quote").

    Holds for every dataset, every fitted nuisance and second stage, given the public clip
    ``c`` (pi_hat in [c, 1 - c]; RCT: c = min(p, 1 - p)), mu_hat, m_hat, y in the outcome box
    (range R_Y) and the second stage clipped to the public CATE range [-R_Y, R_Y]:

    * lower (R and DR): ``R_Y``. At any x, one arm has |a - pi| >= 1/2 (DR: weight
      1/pi or 1/(1 - pi) >= 2), y runs over an interval of length R_Y, so the IF takes two
      values R_Y |a - pi| apart and ``sup |IF| >= R_Y |a - pi| / (2 Lambda_hat) >= R_Y``
      (Lambda_hat <= 1/4); DR: ``>= R_Y / (2 pi) >= R_Y``.
    * upper, R: ``|a - pi| <= 1 - c``, ``|y - m| <= R_Y``, ``|(a - pi) g| <= (1 - c) R_Y``,
      ``Lambda_hat >= c (1 - c)``, so ``sup |IF^R| <= (2 - c) R_Y / c``.
    * upper, DR: ``|psi_AIPW| <= R_Y / c`` (tight, ate_ci.md §3.3) and ``|g| <= R_Y``, so
      ``sup |IF^DR| <= R_Y (1 / c + 1)``.
    """
    if learner == "r":
        return outcome_range, (2.0 - clip) * outcome_range / clip
    return outcome_range, outcome_range * (1.0 / clip + 1.0)
