"""DP-CATE at d public query points: R- or DR-learner, ``strict`` or ``paper`` mode.

What it releases:
    a vector ``g_DP(x_1..x_d)`` of CATE estimates at analyst-supplied public points inside the
    public box, from a two-stage orthogonal learner (cate_vector.md §2): nuisances on disjoint
    folds, a second stage fitted on the last fold, noise added, one (epsilon, delta) charge for
    the whole vector. Never the noise scale of paper mode (data-dependent), the nuisances, the
    second-stage fit, per-row values or fold memberships.

Second stage (both modes): ridge regression on a public random-Fourier-feature map
    ``phi(x) = [1, (2u - 1) / sqrt(q), sqrt(2 / D) cos(W u + b)]``, ``u`` the point scaled to
    [0, 1]^q by the public box, ``W ~ N(0, I / l^2)``, ``b ~ U(0, 2 pi)`` drawn from the CSPRNG
    (data-independent), so ``||phi(x)||^2 <= 1 + 1 + 2`` and ``C = 2``. R-learner in Robinson
    form (targets ``r = y - m(x)``, features ``v = (a - pi(x)) phi(x)``); DR-learner on the
    AIPW pseudo-outcome clipped to [-K, K] (targets ``r = psi``, features ``v = phi(x)``).
    ``theta = argmin (1/n) sum (r - v'theta)^2 + lambda ||theta||^2``.

Neighbouring relation: replace-one on (X, A, Y), n public; fold sizes public.

Claim, strict mode (docs/proofs/cate_vector.md):
    (epsilon, delta)-DP. Nuisances are DP-EBMs at the replace-one epsilon_p rule, each
    (epsilon, delta)-DP on its own fold. Given them, the second stage on the last fold has
    |r| <= B_r (R: the outcome range R_Y; DR: K) and ||v|| <= C_v (R: (1 - c) C, since
    |a - pi_hat| <= 1 - c; DR: C), so ``||theta|| <= B_r / sqrt(lambda)`` and the replace-one
    L2 sensitivity of theta is ``Delta_theta = 2 C_v B_r (1 + C_v / sqrt(lambda)) /
    (lambda n_2)`` (strong convexity).
    theta is released through the lattice Gaussian at (epsilon, delta) with that sensitivity
    (plus a float margin), and the vector ``Phi(x) theta_DP`` is post-processing. Folds are a
    uniformly random partition of public sizes and the second-stage inputs are row-wise in the
    record given the nuisances: Niu et al. Theorem 6 gives max over modules = (epsilon, delta).

Claim, paper mode (Schroeder et al., Theorem 1; heuristic, label ``paper``):
    non-private MLP nuisances on D_1; noise sd ``r = gamma_hat c(eps, delta, n_2)`` per
    coordinate, ``gamma_hat = sup_z |IF(z)|`` by exact enumeration over a and y and a
    multi-start box-bounded L-BFGS-B over x; ``c = 5 sqrt(2 ln n ln(2/delta)) / (eps n)``.

References:
    Schroeder, Melnychuk, Feuerriegel (2025). Differentially private learners for heterogeneous
    treatment effects. ICLR.
    Chaudhuri, Monteleoni, Sarwate (2011). Differentially private empirical risk minimization.
    JMLR (output perturbation of strongly convex ERM).
    Rahimi and Recht (2007). Random features for large-scale kernel machines. NeurIPS.
    Nie and Wager (2021). Quasi-oracle estimation of heterogeneous treatment effects.
    Kennedy (2023). Towards optimal doubly robust estimation of heterogeneous causal effects.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from service.mechanisms import ate_strict, versus_ate
from service.mechanisms.anchor import (
    ANCHOR_SHARE,
    AnchorPlan,
    anchor_pseudo_outcomes,
    draw_anchor,
    james_stein_factor,
    plan_anchor,
)
from service.mechanisms.anchor import anchor_share as anchor_rule  # cate_vector's own rule wraps it
from service.mechanisms.ate_strict import pseudo_outcomes
from service.mechanisms.calibration import (
    default_delta,
    validate_delta,
    validate_epsilon,
    validate_finite_positive,
)
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.dp_ebm import (
    DpEbmAccounting,
    dp_ebm_event,
    fit_classifier,
    fit_regressor,
    interpret_guard,
    solve_dp_ebm_epsilon_p,
)
from service.mechanisms.errors import InvalidParameters, PaperModeDisabled, ReleaseFailed
from service.mechanisms.noise import (
    GaussianCalibration,
    NoiseSampler,
    calibrate_gaussian,
)
from service.mechanisms.partition import checked_fractions, fold_sizes, prepare_arrays, random_folds
from service.mechanisms.records import Composition, Guarantee, MechanismRecord, NoiseEvent

MECHANISM = "cate_vector"
VERSION = "1"

Learner = Literal["r", "dr"]
Mode = Literal["strict", "paper"]
Progress = Callable[[float, str], None]

MIN_EPSILON = 0.01
MAX_EPSILON = 100.0
MAX_POINTS = 5_000
MAX_FEATURES = 1_000
FEATURE_NORM = 2.0  # C: ||phi(x)||^2 <= 1 + 1 + 2 (module docstring)
# Float margin on Delta_theta: a backward-stable solve of the (D+1)-square SPD system with
# condition number <= (C^2 + lambda) / lambda perturbs theta by far less than 2^-20 ||theta||
# for the public ranges of lambda and D allowed here (docs/proofs/cate_vector.md, step 5).
_SOLVE_SLACK = 2.0**-20
MIN_RIDGE = 1e-3
# Public default of the strict ridge (``suggested_ridge``): the smallest value of the grid whose
# quoted noise-sd bound is at most RIDGE_RULE_FRACTION * R_Y; public inputs only.
STRICT_RIDGE_GRID = (0.1, 0.3, 1.0, 3.0)
RIDGE_RULE_FRACTION = 0.2
PAPER_RIDGE = 1e-3
# proof step 7: the anchor ATE's share of the estimation budget is the public rule
# ``anchor.anchor_share`` (ANCHOR_SHARE, or ANCHOR_SHARE_NOISY where the CATE's RMS noise at
# ANCHOR_SHARE is at least half the default heterogeneity R_Y / 24: the release will then mostly
# be the anchor, so the anchor gets most of the budget).
_FD_STEP = 1e-8  # finite-difference step of the sup search (scipy's L-BFGS-B default)


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
        anchor: strict only (proof step 7): spend ``ANCHOR_SHARE`` of the estimation budget on
            a DP ATE of the estimation fold (adaptive clip, as ``ate_strict``), fit the second
            stage on targets centred at it (so the ridge shrinks toward the ATE, not toward 0)
            and shrink the released deviations toward it (James–Stein, public noise variances).
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
    """Validation errors of the query points against the public box: (path, message) pairs."""
    errors: list[tuple[tuple[int, ...], str]] = []
    lower, upper = domain.x_lower, domain.x_upper
    for i, point in enumerate(points):
        if len(point) != domain.q:
            errors.append(((i,), f"each point needs {domain.q} coordinates"))
            continue
        for j, value in enumerate(point):
            v = float(value)
            if not (math.isfinite(v) and float(lower[j]) <= v <= float(upper[j])):
                errors.append(((i, j), f"outside the public bounds [{lower[j]:g}, {upper[j]:g}]"))
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
    anchor: AnchorPlan | None = None

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
    if point_errors(params.points, domain):
        raise InvalidParameters("query points must lie inside the public covariate box")
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
    propensity: float | None = None
    clip = validate_finite_positive(params.propensity_clip, "propensity_clip")
    if domain.design == StudyDesign.RCT:
        p = domain.treatment_probability
        if p is None or not 0.0 < p < 1.0:
            raise InvalidParameters("an RCT needs a declared treatment_probability in (0, 1)")
        propensity = float(p)
        clip = min(propensity, 1.0 - propensity)
    elif not domain.min_propensity_clip <= clip <= 0.5:
        raise InvalidParameters(f"propensity_clip must be in [{domain.min_propensity_clip}, 0.5]")
    # proof step 1: the public bound on the second-stage targets.
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
    anchor: AnchorPlan | None = None
    if params.anchor and params.mode != "strict":
        raise InvalidParameters("the ATE anchor (shrinkage='ate') is available in strict mode only")
    if params.mode == "strict":
        guarantee = Guarantee.STRICT
        accounting = solve_dp_ebm_epsilon_p(epsilon, delta)
        if "propensity" in names:
            events.append(
                dp_ebm_event(
                    "propensity",
                    epsilon,
                    delta,
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
                epsilon,
                delta,
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
        epsilon_theta, delta_theta = epsilon, delta
        if params.anchor:
            # proof step 7: the anchor ATE takes a public share of the estimation budget: its
            # quantile (delta 0) and its mean; the ridge stage keeps the rest (exact splits).
            share = anchor_share(domain, params, epsilon, delta, sensitivity)
            epsilon_anchor, epsilon_theta = ate_strict.split_share(epsilon, share)
            delta_anchor, delta_theta = ate_strict.split_share(delta, share)
            # R: |Gamma_R| <= R / c_a with c_a = max(c, ANCHOR_PROPENSITY_CLIP); DR: bound_r.
            anchor, anchor_events = plan_anchor(
                params.learner,
                epsilon_anchor,
                delta_anchor,
                outcome_range=big_r,
                propensity_clip=clip,
                dr_bound=bound_r,
                n2=sizes[-1],
            )
            events.extend(anchor_events)
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
    record = MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=guarantee,
        n=domain.n,
        fold_sizes=dict(zip(names, sizes, strict=True)),
        composition=composition,
        events=tuple(events),
        epsilon=_module_max(events, "epsilon"),
        delta=_module_max(events, "delta"),
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


def anchor_share(
    domain: PublicDomain,
    params: CateVectorParams,
    epsilon: float,
    delta: float,
    sensitivity: float,
) -> float:
    """The public anchor share (``anchor.anchor_share``): from n, epsilon, delta, the points
    and the public sensitivity of theta only."""
    _, epsilon_theta = ate_strict.split_share(epsilon, ANCHOR_SHARE)
    _, delta_theta = ate_strict.split_share(delta, ANCHOR_SHARE)
    dim = params.n_features + 1 + domain.q
    sigma = calibrate_gaussian(epsilon_theta, delta_theta, sensitivity, dim=dim).sigma
    noise = sigma * math.sqrt(2.0 + _mean_linear_norm(domain, params.points))
    return anchor_rule(noise, domain.outcome_range)


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


def quote(domain: PublicDomain, params: CateVectorParams) -> dict[str, Any]:
    """Public accuracy preview, from public quantities only (no data access).

    Strict: coordinate j's noise is ``phi(x_j)' N(0, sigma^2 I)`` with ``||phi|| <= C = 2``,
    so its sd is at most ``2 sigma``. Paper: the realised noise sd ``r = gamma_hat c`` is
    data-dependent and never released; ``paper_gamma_bounds`` brackets it for every dataset:
    ``c R_Y <= r <= c Gamma_max``.
    """
    state = make_plan(domain, params)
    out = _public(state)
    if state.theta is not None:
        out["noise_sd_upper_bound"] = FEATURE_NORM * state.theta.sigma
        out["theta_sigma"] = state.theta.sigma
    else:
        c = c_constant(state.record.epsilon, state.record.delta, state.n2)
        lower, upper = paper_gamma_bounds(params.learner, state.cate_bound, state.clip)
        out["c"] = c
        out["noise_sd_lower_bound"] = c * lower
        out["noise_sd_upper_bound"] = c * upper
        out["noise_sd_note"] = (
            "paper mode: the noise sd per coordinate is gamma_hat * c with a data-dependent "
            "gamma_hat (never released); for every dataset it lies between the two public "
            "bounds (worst case over the public bounds and propensity clip)"
        )
    return out


def rms_noise_sd(domain: PublicDomain, params: CateVectorParams) -> float:
    """Root-mean-square privacy-noise sd over the query points, from public inputs only.

    Strict: coordinate j's noise is ``phi(x_j)' N(0, sigma^2 I)``; over the public random
    feature draw ``E ||phi(x)||^2 = 2 + ||2u - 1||^2 / q`` (intercept 1, linear part, and D cosines
    of uniform phase with weight 2 / D each), so the RMS sd is
    ``sigma sqrt(2 + mean_j ||2 u_j - 1||^2 / q)``. Paper: the public lower bound ``c R_Y``-type
    bound of ``quote`` (the realised sd is data-dependent and never released).
    """
    state = make_plan(domain, params)
    if state.theta is None:
        return float(quote(domain, params)["noise_sd_lower_bound"])
    return state.theta.sigma * math.sqrt(2.0 + _mean_linear_norm(domain, params.points))


# ---- second stage and the paper-mode sensitivity (pure helpers, tested directly) ----------


@dataclass(frozen=True)
class FeatureMap:
    """Public random Fourier features on unit-scaled covariates (drawn without data)."""

    lower: NDArray[np.float64]
    upper: NDArray[np.float64]
    frequencies: NDArray[np.float64]  # (D, q)
    phases: NDArray[np.float64]  # (D,)

    @classmethod
    def draw(
        cls, domain: PublicDomain, n_features: int, lengthscale: float, rng: np.random.Generator
    ) -> FeatureMap:
        q = domain.q
        return cls(
            lower=np.asarray(domain.x_lower, dtype=np.float64),
            upper=np.asarray(domain.x_upper, dtype=np.float64),
            frequencies=rng.normal(0.0, 1.0 / lengthscale, size=(n_features, q)),
            phases=rng.uniform(0.0, 2.0 * math.pi, size=n_features),
        )

    def __call__(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        u = (np.clip(np.atleast_2d(x), self.lower, self.upper) - self.lower) / (
            self.upper - self.lower
        )
        d = self.phases.size
        q = self.lower.size
        linear = (2.0 * u - 1.0) / math.sqrt(q)
        waves = math.sqrt(2.0 / d) * np.cos(u @ self.frequencies.T + self.phases)
        return np.column_stack([np.ones(u.shape[0]), linear, waves])


def ridge_fit(
    features: NDArray[np.float64], targets: NDArray[np.float64], ridge: float, bound_r: float
) -> NDArray[np.float64]:
    """``argmin (1/n) sum (r - v'theta)^2 + lambda ||theta||^2``, projected on the ball.

    The exact minimiser has ``||theta|| <= B_r / sqrt(lambda)`` (proof step 2); the projection
    only removes float error.
    """
    n = features.shape[0]
    gram = features.T @ features / n + ridge * np.eye(features.shape[1])
    theta = np.linalg.solve(gram, features.T @ targets / n)
    radius = bound_r / math.sqrt(ridge)
    norm = float(np.linalg.norm(theta))
    if not math.isfinite(norm):
        raise ValueError("non-finite second stage")
    if norm > radius:
        theta = theta * (radius / norm)
    return np.asarray(theta, dtype=np.float64)


def second_stage_data(
    learner: Learner,
    phi: NDArray[np.float64],
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    pi_hat: NDArray[np.float64],
    mu0: NDArray[np.float64],
    mu1: NDArray[np.float64],
    bound_r: float,
    offset: float = 0.0,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Row-wise features and targets of the second stage, with |r| <= B_r and ||v|| <= C.

    R (Robinson form): ``r = y - m``, ``m = pi mu1 + (1 - pi) mu0``, ``v = (a - pi) phi``.
    DR: ``r = clip(psi_AIPW, -K, K)``, ``v = phi``. With an ``offset`` (the DP anchor ATE, proof
    step 7) the targets are centred at it, ``r - (a - pi) offset`` (R) or ``psi - offset`` (DR),
    and clipped again to [-B_r, B_r]: a row-wise map with public (or DP) constants.
    """
    if learner == "r":
        m = pi_hat * mu1 + (1.0 - pi_hat) * mu0
        targets = np.clip(y - m - (a - pi_hat) * offset, -bound_r, bound_r)
        return (a - pi_hat)[:, None] * phi, targets
    psi = pseudo_outcomes(a, y, pi_hat, mu0, mu1, bound=bound_r)
    return phi, np.asarray(np.clip(psi - offset, -bound_r, bound_r), dtype=np.float64)


def release_anchor(gamma: NDArray[np.float64], state: Plan, noise: NoiseSampler) -> float:
    """proof step 7: the DP anchor ATE (``anchor.draw_anchor``), clipped to [-R_Y, R_Y]."""
    if state.anchor is None:
        raise ValueError("no anchor in this plan")
    return draw_anchor(gamma, state.anchor, state.cate_bound, noise)


Nuisance = Callable[[NDArray[np.float64]], tuple[NDArray[np.float64], ...]]


def influence_sup(
    learner: Learner,
    nuisance: Nuisance,
    g: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    domain: PublicDomain,
    *,
    overlap: float,
    rng: np.random.Generator,
    candidates: int = 2000,
    starts: int = 8,
) -> float:
    """Paper mode: ``gamma_hat = sup_z |IF(z)|`` (cate_vector.md §6 step 4).

    The IF is affine in y for fixed (x, a): enumerate a in {0, 1} and y in {y_lo, y_hi}
    exactly; over x, evaluate a random candidate set plus the box corners (q <= 10), then run
    box-bounded L-BFGS-B from the best ``starts`` candidates per (a, y, sign). ``nuisance(x)``
    returns ``(pi, mu0, mu1)`` (clipped); ``overlap`` is Lambda_hat for R (1 for DR).
    """
    from scipy.optimize import minimize

    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    q = domain.q

    def influence(x: NDArray[np.float64], a: float, y: float) -> NDArray[np.float64]:
        pi, mu0, mu1 = nuisance(x)
        gx = g(x)
        mu_a = mu1 if a == 1.0 else mu0
        if learner == "r":
            m = pi * mu1 + (1.0 - pi) * mu0
            return np.asarray((a - pi) * (y - m - (a - pi) * gx) / overlap)
        return np.asarray((a - pi) / (pi * (1.0 - pi)) * (y - mu_a) + mu1 - mu0 - gx)

    points = rng.uniform(lower, upper, size=(candidates, q))
    if q <= 10:
        corners = np.array(np.meshgrid(*[[lo, hi] for lo, hi in zip(lower, upper, strict=True)]))
        points = np.vstack([points, corners.reshape(q, -1).T])
    best = 0.0
    bounds = list(zip(lower.tolist(), upper.tolist(), strict=True))
    for a in (0.0, 1.0):
        for y in (domain.y_lower, domain.y_upper):
            values = influence(points, a, y)
            for sign in (1.0, -1.0):
                signed = sign * values
                best = max(best, float(np.max(signed)))
                for start in points[np.argsort(-signed)[:starts]]:

                    def objective(
                        x: NDArray[np.float64], a: float = a, y: float = y, sign: float = sign
                    ) -> tuple[float, NDArray[np.float64]]:
                        # forward differences (scipy's default step) in one batched call
                        steps = np.where(x + _FD_STEP <= upper, _FD_STEP, -_FD_STEP)
                        batch = np.repeat(x[None, :], q + 1, axis=0)
                        batch[np.arange(1, q + 1), np.arange(q)] += steps
                        values = -sign * influence(batch, a, y)
                        return float(values[0]), np.asarray((values[1:] - values[0]) / steps)

                    found = minimize(objective, start, jac=True, method="L-BFGS-B", bounds=bounds)
                    best = max(best, -float(found.fun))
    return best


# ---- running ---------------------------------------------------------------------------------


def run(
    arrays: Arrays,
    domain: PublicDomain,
    params: CateVectorParams,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    """Release the vector after the charge; ``ReleaseFailed`` on any data-time failure."""
    state = make_plan(domain, params)
    try:
        fitted = fit(arrays, domain, state, rng=rng, progress=progress, noise=noise)
        out = release(fitted, state, noise=noise)
        progress(1.0, "done")
        return out
    except Exception:
        raise ReleaseFailed() from None


@dataclass(frozen=True)
class VectorFit:
    """The non-private intermediate of one release: never returned, logged or stored.

    ``estimates`` is the second stage at the query points, clipped to [-R_Y, R_Y] (paper
    mode's g*); ``theta`` and ``phi_points`` are the ridge coefficients and the query features
    (strict mode adds the noise to theta); ``gamma_hat`` is paper mode's sup |IF|.
    """

    estimates: NDArray[np.float64]
    theta: NDArray[np.float64]
    phi_points: NDArray[np.float64]
    gamma_hat: float | None
    anchor: float | None = None  # the DP anchor ATE (strict with anchor; public once drawn)


def fit(
    arrays: Arrays,
    domain: PublicDomain,
    state: Plan,
    *,
    rng: np.random.Generator,
    progress: Progress,
    noise: NoiseSampler | None = None,
) -> VectorFit:
    """Partition, nuisances, second stage and (paper) gamma_hat; no noise yet, except the
    anchor ATE's (strict with ``anchor``: it must precede the centred second stage).

    Nothing here depends on epsilon in paper mode, so the benchmark harness reuses one fit for
    several epsilons (``release`` with each plan); the service always calls ``run``.
    """
    params = state.params
    x, a, y = prepare_arrays(arrays, domain)
    # proof step 6: uniformly random permutation cut at public sizes (never stored).
    folds = random_folds(rng, domain.n, state.modules, state.fold_sizes)
    feature_map = FeatureMap.draw(domain, params.n_features, params.lengthscale, rng)
    progress(0.05, "partition")

    nuisance = (
        _strict_nuisance(x, a, y, folds, domain, state)
        if params.mode == "strict"
        else _paper_nuisance(x, a, y, folds["nuisance"], domain, state)
    )
    progress(0.6, "nuisance")
    rows = folds["estimation"]
    x2, a2, y2 = x[rows], a[rows], y[rows]
    pi2, mu02, mu12 = nuisance(x2)
    phi2 = feature_map(x2)
    anchor: float | None = None
    if state.anchor is not None:
        if noise is None:
            raise ValueError("the anchor ATE needs the noise sampler")
        pi_anchor = np.clip(pi2, state.anchor.propensity_clip, 1.0 - state.anchor.propensity_clip)
        gamma = anchor_pseudo_outcomes(
            params.learner, a2, y2, pi_anchor, mu02, mu12, state.anchor.bound
        )
        anchor = release_anchor(gamma, state, noise)
        del gamma
    features, targets = second_stage_data(
        params.learner, phi2, a2, y2, pi2, mu02, mu12, state.bound_r, offset=anchor or 0.0
    )
    theta = ridge_fit(features, targets, params.ridge, state.bound_r)
    del x2, a2, y2, features, targets
    points = np.asarray(params.points, dtype=np.float64)
    phi_points = feature_map(points)
    bound = state.cate_bound
    estimates = np.clip(phi_points @ theta, -bound, bound)
    gamma_hat: float | None = None
    if params.mode == "paper":
        # the second stage is projected on the public CATE range [-R_Y, R_Y] (the truth lies
        # there); the IF is taken at that g, which keeps gamma_hat within paper_gamma_bounds.
        def g(z: NDArray[np.float64]) -> NDArray[np.float64]:
            return np.clip(feature_map(z) @ theta, -bound, bound)

        overlap = float(np.mean(pi2 * (1.0 - pi2))) if params.learner == "r" else 1.0
        gamma_hat = influence_sup(params.learner, nuisance, g, domain, overlap=overlap, rng=rng)
    progress(0.9, "second stage")
    return VectorFit(estimates, theta, phi_points, gamma_hat, anchor)


def paper_noise_sd(fitted: VectorFit, state: Plan) -> float:
    """Paper mode's data-dependent ``r = gamma_hat c(epsilon, delta, n_2)``: never released."""
    if fitted.gamma_hat is None:
        raise ValueError("not a paper-mode fit")
    return fitted.gamma_hat * c_constant(state.record.epsilon, state.record.delta, state.n2)


def release(fitted: VectorFit, state: Plan, *, noise: NoiseSampler) -> dict[str, Any]:
    """Add the noise and return the public result (values clipped to [-R_Y, R_Y])."""
    bound = state.cate_bound
    if state.theta is not None:
        # proof step 5: theta through the lattice Gaussian; the vector is post-processing.
        theta_dp = noise.gaussian(
            fitted.theta, sigma=state.theta.sigma, sensitivity_l2=state.theta.sensitivity_l2
        )
        values = fitted.phi_points @ theta_dp
        if fitted.anchor is not None:
            # proof step 7 (post-processing): the centred fit's deviations, shrunk toward the
            # anchor given their exact public noise covariance.
            # Sigma = sigma^2 Phi Phi': tr = sigma^2 |Phi|_F^2, tr(Sigma^2) = sigma^4 |Phi'Phi|_F^2
            phi = fitted.phi_points
            variance = state.theta.sigma**2
            gram = phi.T @ phi
            prior = state.cate_bound / versus_ate.DEFAULT_HETEROGENEITY_RANGE_RATIO
            factor = james_stein_factor(
                values,
                variance * float(np.sum(phi * phi)),
                variance * variance * float(np.sum(gram * gram)),
                prior,
            )
            shrunk = np.clip(fitted.anchor + factor * values, -bound, bound)
            if not np.all(np.isfinite(shrunk)):
                raise ValueError("non-finite release")
            return {
                **_public(state),
                "estimates": [float(v) for v in shrunk],
                "ate_anchor": fitted.anchor,
                "shrinkage_factor": factor,
            }
    else:
        r = paper_noise_sd(fitted, state)
        # r is data-dependent and never released; the sampler's check uses r as its own scale.
        values = noise.gaussian(fitted.estimates, sigma=max(r, 1e-300), sensitivity_l2=r)
    if not np.all(np.isfinite(values)):
        raise ValueError("non-finite release")
    # post-processing: the CATE lies in [-R_Y, R_Y], so the projection never adds error.
    values = np.clip(values, -bound, bound)
    return {**_public(state), "estimates": [float(v) for v in values]}


def _strict_nuisance(
    x: NDArray[np.float64],
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    folds: dict[str, NDArray[np.intp]],
    domain: PublicDomain,
    state: Plan,
) -> Nuisance:
    """DP-EBM nuisances, each on its own fold (proof step 1)."""
    accounting = state.accounting
    assert accounting is not None
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    low, high = domain.y_lower, domain.y_upper
    c = state.clip
    classifier = None
    if state.propensity is None:
        rows = folds["propensity"]
        classifier = fit_classifier(x[rows], a[rows], lower, upper, accounting)
    rows = folds["outcome"]
    if state.params.learner == "r":
        model, mid = fit_regressor(x[rows], y[rows], lower, upper, low, high, accounting)
    else:
        model, mid = fit_regressor(
            np.column_stack([a[rows], x[rows]]),
            y[rows],
            np.concatenate([[0.0], lower]),
            np.concatenate([[1.0], upper]),
            low,
            high,
            accounting,
        )
    learner = state.params.learner
    propensity = state.propensity

    def predict(z: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        with interpret_guard():
            if classifier is not None:
                proba = np.asarray(classifier.predict_proba(z), dtype=np.float64)[:, 1]
                pi = np.clip(np.nan_to_num(proba, nan=0.5), c, 1.0 - c)
            else:
                pi = np.full(z.shape[0], propensity, dtype=np.float64)
            if learner == "r":
                # only m = E[Y | X] is needed: pass it as mu0 = mu1 = m.
                m = np.clip(np.nan_to_num(np.asarray(model.predict(z)) + mid, nan=mid), low, high)
                return pi, m, m
            ones = np.ones(z.shape[0])
            mu1 = np.asarray(model.predict(np.column_stack([ones, z]))) + mid
            mu0 = np.asarray(model.predict(np.column_stack([0.0 * ones, z]))) + mid
        return (
            pi,
            np.clip(np.nan_to_num(mu0, nan=mid), low, high),
            np.clip(np.nan_to_num(mu1, nan=mid), low, high),
        )

    return predict


def _paper_nuisance(
    x: NDArray[np.float64],
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    rows: NDArray[np.intp],
    domain: PublicDomain,
    state: Plan,
) -> Nuisance:
    """Non-private MLP nuisances on D_1 (paper: 1 hidden layer of 32, Adam lr 0.01, batch 128)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    low, high = domain.y_lower, domain.y_upper
    scale = high - low
    c = state.clip

    def unit(z: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray((z - lower) / (upper - lower))

    common: dict[str, Any] = {
        "hidden_layer_sizes": (32,),
        "learning_rate_init": 0.01,
        "batch_size": 128,
        "max_iter": 200,
    }
    xa = np.column_stack([unit(x[rows]), a[rows]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        outcome = MLPRegressor(**common).fit(xa, (y[rows] - low) / scale)
        classifier = None
        if state.propensity is None and 0.0 < float(np.mean(a[rows])) < 1.0:
            classifier = MLPClassifier(**common).fit(unit(x[rows]), a[rows].astype(int))
    propensity = state.propensity if state.propensity is not None else 0.5

    def predict(z: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        u = unit(z)
        if classifier is not None:
            pi = np.clip(classifier.predict_proba(u)[:, 1], c, 1.0 - c)
        else:
            pi = np.full(z.shape[0], propensity)
        ones = np.ones(z.shape[0])
        mu1 = np.clip(outcome.predict(np.column_stack([u, ones])) * scale + low, low, high)
        mu0 = np.clip(outcome.predict(np.column_stack([u, 0 * ones])) * scale + low, low, high)
        return np.asarray(pi), np.asarray(mu0), np.asarray(mu1)

    return predict
