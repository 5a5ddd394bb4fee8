"""cate_function's calibration: public parameters, the noise scale r0 (its privacy map,
docs/proofs/cate_function.md §2–§3 and §7) and the plan that fixes every noise constant before
any data is read."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from service.mechanisms import ate_strict, gp, versus_ate
from service.mechanisms import dp_ebm as dp_ebm_lib
from service.mechanisms.anchor import (
    AteAnchorPlan,
    ate_anchor_share,
    no_room_for_anchor,
    split_for_anchor,
)
from service.mechanisms.calibration import (
    analytic_gaussian_multiplier,
    hall_constant,
    validate_delta,
    validate_epsilon,
    validate_finite_positive,
)
from service.mechanisms.domain import PublicDomain, StudyDesign, project_domain
from service.mechanisms.errors import InvalidParameters, PaperModeDisabled
from service.mechanisms.noise import lattice_exponent
from service.mechanisms.partition import fold_sizes
from service.mechanisms.records import (
    Composition,
    Guarantee,
    MechanismRecord,
    NoiseEvent,
)

FloatArray = NDArray[np.float64]
Progress = Callable[[float, str], None]
Mode = Literal["strict", "paper"]
Learner = Literal["r", "dr"]
Basis = Literal["exact", "nystrom", "rff"]
LambdaConvention = Literal["normalised", "unnormalised"]
Nuisance = Literal["dp_ebm", "none"]
Shrinkage = Literal["ate", "none"]

MECHANISM = "cate_function_gp"
# 3: the anchor is the strict single-release ate default on all rows (proof §7); 4: the strict
# DP-EBM nuisances adjust for the schema's declared adjustment set (proof §8); 5: the anchor's
# nuisance class is the ate default's at the whole epsilon, its interval released (§7 step 1); 6: on
# a trial below n epsilon = 5 * 10^4 the anchor is the DP difference in means (the ate default
# there), pure epsilon
VERSION = "6"
# proof §7: public reference points (the first Sobol points of the scaled box) at which the
# released function's deviation from the anchor is read to set the shrinkage factor; an exact
# function's GP path is drawn there at release time and answers them like any other point.
REFERENCE_POINTS = 256

MIN_EPSILON = 0.01
MAX_EPSILON = 100.0
# Exact KRR solves an n2 x n2 system; above this the second stage uses the public centres.
EXACT_FIT_MAX = 4000
MAX_CENTRES = 4096
MAX_FEATURES = 4096
MAX_T = 20000
MAX_BATCH = 1000
# Query points are canonicalised to the lattice 2^-CANONICAL_BITS of the scaled box.
CANONICAL_BITS = 20
# Released values are rounded to 2^k with k = lattice_exponent(pointwise sd) (threats.md §1).
# Jitter of the public Nystrom centre Gram M = K_cc + NYSTROM_JITTER I (used in fit and noise).
NYSTROM_JITTER = 1e-6
_CHUNK = 8192


@dataclass(frozen=True)
class CateFunctionParams:
    """Public request parameters (validated again in ``plan``).

    Attributes:
        epsilon: epsilon of the release (Theorem 6: each module at (epsilon, delta)).
        delta: delta of the release.
        mode: ``strict`` (DP nuisances) or ``paper`` (non-private nuisances; needs the owner's
            ``allow_paper_mode``).
        learner: ``r`` (R-learner) or ``dr`` (DR-learner) pseudo-outcome loss.
        bandwidth: h on the scaled box; None means ``sqrt(q / 6)``.
        regularization: lambda, in ``lambda_convention``; None: the public default rule
            (``DEFAULT_LAMBDA0_GRID``, see ``plan``).
        lambda_convention: ``normalised`` (the paper's K, lambda0 = lambda / c_q) or
            ``unnormalised`` (lambda0 = lambda).
        propensity_clip: kappa_pi (observational designs).
        fold_fractions: as for the ATE; None means the design's default.
        basis: ``exact`` (exact GP conditioning, capacity ``t_max``), ``nystrom`` (public Sobol
            centres) or ``rff`` (random Fourier features); the last two answer any number of
            points with O(m) state.
        n_centres: m, Nystrom centres (also used by ``exact`` when n2 > EXACT_FIT_MAX).
        n_features: D_f, random-feature frequencies (2 D_f features).
        t_max: distinct points an ``exact`` function can answer.
        batch_max: points per evaluation request.
        jitter: tau^2 of the GP conditioning (unit-diagonal scale).
        nuisance: ``dp_ebm`` or ``none`` (RCT only: mu_hat = midpoint).
        shrinkage: ``ate`` (strict default): a DP anchor ATE on a public share of the budget,
            targets centred at it, and the release shrunk towards it by a James–Stein factor
            computed from the released function at public reference points (§7 of the proof);
            ``none`` (the paper's function; the paper-mode default).
        anchor: shrinkage ``ate`` only: a public value to anchor at instead of buying one
            (e.g. the estimate of a DP ATE release the analyst already has: post-processing,
            no extra cost); the whole budget then goes to the function.
    """

    epsilon: float
    delta: float
    mode: Mode = "strict"
    learner: Learner = "r"
    bandwidth: float | None = None
    regularization: float | None = None
    lambda_convention: LambdaConvention = "normalised"
    propensity_clip: float = 0.1
    fold_fractions: tuple[float, ...] | None = None
    basis: Basis = "exact"
    n_centres: int = 256
    n_features: int = 256
    t_max: int = 10000
    batch_max: int = 1000
    jitter: float = gp.DEFAULT_JITTER
    nuisance: Nuisance = "dp_ebm"
    shrinkage: Shrinkage | None = None
    anchor: float | None = None


@dataclass(frozen=True)
class NoiseScale:
    """The public constants of the second stage (§3.4–3.6), in k0 terms unless named ``_k``."""

    q: int
    bandwidth: float
    n2: int
    log_cq: float  # log c_q = -q log(sqrt(2 pi) h)
    lambda0: float
    target_bound: float  # R_max (R) or Phi_max (DR)
    function_bound: float  # B_g
    lipschitz: float  # L
    sensitivity_k0: float  # Delta = L / (lambda0 n2)
    multiplier: float  # sigma_G (strict) or max(c(delta)/epsilon, sigma_G) (paper)
    r_hall: float  # k0 terms
    r_paper: float | None  # k0 terms (paper mode only)
    r0: float  # the scale used; pointwise sd of the noise is r0 sqrt(k0(x, x)) = r0


def log_cq(q: int, bandwidth: float) -> float:
    """``log c_q = -q log(sqrt(2 pi) h)``, the normalisation of the paper's kernel K = c_q k0."""
    return -q * math.log(math.sqrt(2.0 * math.pi) * bandwidth)


def lambda0_of(
    regularization: float, q: int, bandwidth: float, convention: LambdaConvention
) -> float:
    """lambda0 in k0 terms: ``lambda / c_q`` (normalised convention) or lambda itself."""
    if convention == "unnormalised":
        return regularization
    value = math.log(regularization) - log_cq(q, bandwidth)
    if value > 700.0:
        raise InvalidParameters("regularization / c_q overflows; use lambda_convention")
    return math.exp(value)


def noise_scale(
    *,
    mode: Mode,
    learner: Learner,
    q: int,
    bandwidth: float,
    lambda0: float,
    n2: int,
    epsilon: float,
    delta: float,
    outcome_range: float,
    propensity_bound: float,
) -> NoiseScale:
    """The data-independent L, Delta and noise scale r0 (§3.4–3.6, k0 terms, kappa0 = 1).

    Args:
        propensity_bound: kappa_pi, the smallest value of min(pi_hat, 1 - pi_hat).
    """
    # proof step 3: data-independent range of the targets and of the minimisers (§3.4).
    if learner == "r":
        target_bound = outcome_range  # |r_i| <= R_max, |w_i| <= 1
    else:
        target_bound = outcome_range / propensity_bound  # tight Phi_max (ate_ci.md §3.3)
    function_bound = target_bound / math.sqrt(lambda0)
    lipschitz = 2.0 * (target_bound + function_bound)
    # proof step 4: RKHS sensitivity for replace-one with a squared-norm regulariser (§2).
    sensitivity = lipschitz / (lambda0 * n2)
    sigma_g = analytic_gaussian_multiplier(epsilon, delta)
    r_paper: float | None = None
    if mode == "strict":
        multiplier = sigma_g
        r_hall = sensitivity * hall_constant(delta) / epsilon
        r0 = sensitivity * multiplier
    else:
        multiplier = max(hall_constant(delta) / epsilon, sigma_g)
        r_hall = sensitivity * multiplier
        # r_paper in K terms is 4 L c(delta) c_q / (lambda n eps); k0 terms multiply by
        # sqrt(c_q), and lambda = lambda0 c_q, so r_paper0 = 4 L c(delta) sqrt(c_q) / (lambda0 n
        # eps) (§3.5: ratio to r_Hall is 4 (sqrt(2 pi) h)^(-q/2)).
        half_log_cq = 0.5 * log_cq(q, bandwidth)
        r_paper = (
            4.0
            * lipschitz
            * hall_constant(delta)
            * math.exp(half_log_cq)
            / (lambda0 * n2 * epsilon)
        )
        r0 = max(r_paper, r_hall)
    return NoiseScale(
        q=q,
        bandwidth=bandwidth,
        n2=n2,
        log_cq=log_cq(q, bandwidth),
        lambda0=lambda0,
        target_bound=target_bound,
        function_bound=function_bound,
        lipschitz=lipschitz,
        sensitivity_k0=sensitivity,
        multiplier=multiplier,
        r_hall=r_hall,
        r_paper=r_paper,
        r0=r0,
    )


# ---- planning (no data) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    params: CateFunctionParams
    q: int
    modules: tuple[str, ...]
    fold_sizes: tuple[int, ...]
    propensity: float | None  # RCT: p
    propensity_bound: float
    dp_ebm: dp_ebm_lib.DpEbmAccounting | None
    scale: NoiseScale
    fit: Literal["exact", "nystrom", "rff"]
    output_lattice_exponent: int
    record: MechanismRecord
    # Released values are clipped to [-value_bound, value_bound] = [-R_Y, R_Y], the public range
    # of any CATE with outcomes in [y_lo, y_hi] (post-processing: it cannot add error).
    value_bound: float = math.inf
    anchor: AteAnchorPlan | None = None  # proof §7 (shrinkage "ate"): the whole-data anchor
    anchor_share: float = 0.0  # its share of (epsilon, delta); the GP has the rest
    fixed_anchor: float | None = None  # a public anchor given by the request (no charge)
    reference_points: int = 0

    @property
    def n2(self) -> int:
        return self.fold_sizes[-1]

    @property
    def shrinks(self) -> bool:
        """shrinkage "ate": an anchor (bought or given) and the James–Stein factor."""
        return self.anchor is not None or self.fixed_anchor is not None


def default_bandwidth(q: int) -> float:
    """``h = sqrt(q / 6)``: the RMS pairwise distance of uniform points in [0, 1]^q (§11)."""
    return math.sqrt(q / 6.0)


def _check_int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidParameters(f"{name} must be an integer in [{low}, {high}]")
    return value


# Default regularisation (public rule, used when the request omits ``regularization``): the
# smallest lambda0 (unnormalised k0 convention) on this grid whose public pointwise noise sd is at
# most DEFAULT_NOISE_SD_FRACTION * R_Y without shrinkage (with shrinkage "ate", the strict
# default: versus_ate.WORTH_IT_RATIO times the default heterogeneity R_Y / 24), else the largest.
# The paper's normalised lambda = 1 gives
# lambda0 = 1 / c_q, which grows like (sqrt(2 pi) h)^q: 2.1 at q = 2, 1.3e5 at q = 10, 2.9e22 at
# q = 30, i.e. a release that is the zero function (PEHE 1.00-1.08 against 0.59-0.65 for this
# rule's 0.1 at n = 4000, eps = 1, R_Y = 5 on the bench.functions DGP, 6 releases each).
DEFAULT_LAMBDA0_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
DEFAULT_NOISE_SD_FRACTION = 0.2


def plan(domain: PublicDomain, params: CateFunctionParams) -> Plan:
    """Validate the public parameters and fix every noise constant (no data is read).

    Omitted regularisation: the smallest lambda0 of DEFAULT_LAMBDA0_GRID whose public pointwise
    noise sd is at most the rule's target, else the largest. The target is
    DEFAULT_NOISE_SD_FRACTION * R_Y without shrinkage; with shrinkage "ate" it is
    WORTH_IT_RATIO * R_Y / 24 (half the default heterogeneity): a noisier function would be
    shrunk to its anchor anyway, so regularisation buys a function whose variation can survive.
    """
    shares: dict[str, float | None] = {}  # the anchor's share does not depend on lambda0
    if params.regularization is not None:
        return _plan(domain, params, shares)
    state: Plan | None = None
    for lambda0 in DEFAULT_LAMBDA0_GRID:
        state = _plan(
            domain,
            replace(params, regularization=lambda0, lambda_convention="unnormalised"),
            shares,
        )
        if state.shrinks:
            target = versus_ate.WORTH_IT_RATIO * versus_ate.default_heterogeneity_sd(domain)
        else:
            target = DEFAULT_NOISE_SD_FRACTION * domain.outcome_range
        if state.scale.r0 <= target:
            break
    assert state is not None
    return state


def _plan(
    domain: PublicDomain, params: CateFunctionParams, shares: dict[str, float | None]
) -> Plan:
    """Validate the request and compute the record (the cost) and all public constants.

    Raises:
        InvalidParameters: any invalid parameter (before any charge).
        PaperModeDisabled: paper mode on a dataset that does not allow it.
    """
    if params.mode not in ("strict", "paper"):
        raise InvalidParameters("mode must be 'strict' or 'paper'")
    if params.mode == "paper" and not domain.allow_paper_mode:
        raise PaperModeDisabled("paper mode is not enabled for this dataset")
    if params.learner not in ("r", "dr"):
        raise InvalidParameters("learner must be 'r' or 'dr'")
    if params.basis not in ("exact", "nystrom", "rff"):
        raise InvalidParameters("basis must be 'exact', 'nystrom' or 'rff'")
    nuisance = params.nuisance
    ate_strict.validate_domain(domain, nuisance)
    epsilon = validate_epsilon(params.epsilon, minimum=MIN_EPSILON, maximum=MAX_EPSILON)
    fractions = ate_strict.validate_fractions(domain, nuisance, params.fold_fractions)
    modules = ate_strict.module_names(domain, nuisance)
    sizes = fold_sizes(domain.n, fractions)
    delta = validate_delta(params.delta, n_min=min(sizes))
    q = domain.q
    bandwidth = (
        default_bandwidth(q)
        if params.bandwidth is None
        else validate_finite_positive(params.bandwidth, "bandwidth")
    )
    regularization = validate_finite_positive(
        params.regularization if params.regularization is not None else math.nan,
        "regularization",
    )
    if params.lambda_convention not in ("normalised", "unnormalised"):
        raise InvalidParameters("lambda_convention must be 'normalised' or 'unnormalised'")
    lambda0 = lambda0_of(regularization, q, bandwidth, params.lambda_convention)
    n_centres = _check_int(params.n_centres, "n_centres", 1, MAX_CENTRES)
    n_features = _check_int(params.n_features, "n_features", 1, MAX_FEATURES)
    _check_int(params.t_max, "t_max", 1, MAX_T)
    _check_int(params.batch_max, "batch_max", 1, MAX_BATCH)
    jitter = validate_finite_positive(params.jitter, "jitter")
    if jitter > 1e-2:
        raise InvalidParameters("jitter must be at most 1e-2")

    propensity: float | None
    if domain.design == StudyDesign.RCT:
        p = float(domain.treatment_probability)  # type: ignore[arg-type]
        propensity = p
        propensity_bound = min(p, 1.0 - p)
    else:
        propensity = None
        clip = validate_finite_positive(params.propensity_clip, "propensity_clip")
        if clip < domain.min_propensity_clip or clip > 0.5:
            raise InvalidParameters(
                f"propensity_clip must be in [{domain.min_propensity_clip}, 0.5]"
            )
        propensity_bound = clip

    n2 = sizes[-1]
    shrinkage = params.shrinkage or ("ate" if params.mode == "strict" else "none")
    if shrinkage not in ("ate", "none"):
        raise InvalidParameters("shrinkage must be 'ate' or 'none'")
    if shrinkage == "ate" and params.mode != "strict":
        raise InvalidParameters("shrinkage 'ate' is strict-only; paper mode releases the paper's")
    # proof §7: the whole-data anchor takes a public share of (epsilon, delta), the function's
    # folds the rest (exact split; the two compose sequentially).
    epsilon_gp, delta_gp = epsilon, delta
    share = 0.0
    anchor: AteAnchorPlan | None = None
    fixed_anchor: float | None = None
    if params.anchor is not None:
        if shrinkage != "ate":
            raise InvalidParameters("anchor is only used with shrinkage 'ate'")
        fixed_anchor = params.anchor
        if (
            isinstance(fixed_anchor, bool)
            or not isinstance(fixed_anchor, (int, float))
            or not math.isfinite(fixed_anchor)
            or abs(fixed_anchor) > domain.outcome_range
        ):
            raise InvalidParameters("anchor must be a number in [-R_Y, R_Y] (the outcome range)")
        fixed_anchor = float(fixed_anchor)

    def scale_at(eps: float, dlt: float) -> NoiseScale:
        return noise_scale(
            mode=params.mode,
            learner=params.learner,
            q=q,
            bandwidth=bandwidth,
            lambda0=lambda0,
            n2=n2,
            epsilon=eps,
            delta=dlt,
            outcome_range=domain.outcome_range,
            propensity_bound=propensity_bound,
        )

    if shrinkage == "ate" and fixed_anchor is None:
        # proof §7: the public share rule (anchor.ate_anchor_share) reads n, epsilon, delta and
        # the schema only; computed once per plan (it does not depend on lambda0)
        if "anchor" not in shares:
            shares["anchor"] = ate_anchor_share(domain, epsilon, delta)
        chosen = shares["anchor"]
        try:
            if chosen is None:
                raise no_room_for_anchor()
            anchor, epsilon_gp, delta_gp = split_for_anchor(domain, epsilon, delta, chosen)
            share = chosen
        except InvalidParameters:
            if params.shrinkage is not None:
                raise
            # the default where the anchor cannot run (public inputs only): no shrinkage
            shrinkage, share, epsilon_gp, delta_gp = "none", 0.0, epsilon, delta
    scale = scale_at(epsilon_gp, delta_gp)
    if not (math.isfinite(scale.r0) and scale.r0 > 0.0 and scale.r0 > 2.0**-1000):
        raise InvalidParameters("the noise scale underflows; use a smaller regularization")
    fit: Literal["exact", "nystrom", "rff"]
    if params.basis == "rff":
        fit = "rff"
    elif params.basis == "nystrom" or n2 > EXACT_FIT_MAX:
        fit = "nystrom"
    else:
        fit = "exact"

    dp_ebm = None
    events: list[NoiseEvent] = []
    if params.mode == "strict" and nuisance == "dp_ebm":
        # proof §7: with the whole-data anchor the nuisance folds have (epsilon_g, delta_g) left
        dp_ebm = dp_ebm_lib.solve_dp_ebm_epsilon_p(epsilon_gp, delta_gp)
        # proof §8: the nuisances see the schema's declared adjustment set (else every column)
        width = project_domain(domain, domain.adjustment_set).q
        if "propensity" in modules:
            events.append(
                dp_ebm_lib.nuisance_event("propensity", epsilon_gp, delta_gp, dp_ebm, width, 1.0)
            )
        events.append(
            dp_ebm_lib.nuisance_event(
                "outcome", epsilon_gp, delta_gp, dp_ebm, width + 1, domain.outcome_range
            )
        )
    elif params.mode == "paper":
        for module in modules[:-1]:
            events.append(
                NoiseEvent(
                    type="non_private_nuisance",
                    module=module,
                    epsilon=0.0,
                    delta=0.0,
                    params={"learner": "scikit-learn (paper mode, Lemma 1 argument)"},
                )
            )
    gp_params: dict[str, float | int | str] = {
        "kernel": "gaussian k0 = exp(-|x-x'|^2 / (2 h^2)) on the scaled box",
        "learner": params.learner,
        "basis": params.basis,
        "fit": fit,
        "bandwidth": bandwidth,
        "lambda0": lambda0,
        "lipschitz": scale.lipschitz,
        "function_bound": scale.function_bound,
        "target_bound": scale.target_bound,
        "sensitivity_rkhs": scale.sensitivity_k0,
        "noise_multiplier": scale.multiplier,
        "calibration": "analytic gaussian" if params.mode == "strict" else "max(paper, hall)",
        "n_centres": n_centres if fit == "nystrom" else 0,
        "n_features": n_features if fit == "rff" else 0,
        "jitter": jitter,
    }
    if params.mode == "strict":
        gp_params["r0"] = scale.r0
    events.append(
        NoiseEvent(
            type="gaussian_process",
            module="estimation",
            epsilon=epsilon_gp,
            delta=delta_gp,
            params=gp_params,
        )
    )
    reference_points = 0
    if shrinkage == "ate":
        # an exact function's reference draws use its capacity: at most half of t_max
        reference_points = (
            min(REFERENCE_POINTS, params.t_max // 2)
            if params.basis == "exact"
            else REFERENCE_POINTS
        )
        if reference_points < 3:
            raise InvalidParameters("shrinkage 'ate' needs t_max >= 6 (reference points)")
    composition = Composition.THEOREM6_MAX if len(modules) > 1 else Composition.SEQUENTIAL
    sizes_by_module = dict(zip(modules, sizes, strict=True))
    if anchor is not None:  # proof §7: the anchor on all rows first, then the function's folds
        events, sizes_by_module = anchor.compose(
            events, sizes_by_module, (epsilon_gp, delta_gp), (epsilon, delta)
        )
        composition = Composition.ANCHOR_THEN_THEOREM6_MAX
    record = MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=Guarantee.STRICT if params.mode == "strict" else Guarantee.PAPER,
        n=domain.n,
        fold_sizes=sizes_by_module,
        composition=composition,
        events=tuple(events),
        epsilon=epsilon,
        delta=delta,
    )
    return Plan(
        params=params,
        q=q,
        modules=modules,
        fold_sizes=sizes,
        propensity=propensity,
        propensity_bound=propensity_bound,
        dp_ebm=dp_ebm,
        scale=scale,
        fit=fit,
        output_lattice_exponent=lattice_exponent(scale.r0),
        record=record,
        value_bound=domain.outcome_range,
        anchor=anchor,
        anchor_share=share,
        fixed_anchor=fixed_anchor,
        reference_points=reference_points,
    )


def public_parameters(state: Plan) -> dict[str, Any]:
    """Public constants of the release (may be shown to every reader)."""
    params = state.params
    out: dict[str, Any] = {
        "mode": params.mode,
        "guarantee": str(state.record.guarantee),
        "learner": params.learner,
        "basis": params.basis,
        "second_stage": state.fit,
        "epsilon": state.record.epsilon,
        "delta": state.record.delta,
        "bandwidth": state.scale.bandwidth,
        "regularization": params.regularization,
        "lambda_convention": params.lambda_convention,
        "lambda0": state.scale.lambda0,
        "lipschitz": state.scale.lipschitz,
        "sensitivity_rkhs": state.scale.sensitivity_k0,
        "fold_sizes": dict(state.record.fold_sizes),
        "t_max": params.t_max if params.basis == "exact" else None,
        "batch_max": params.batch_max,
        "jitter": params.jitter,
        "canonical_lattice": 2.0**-CANONICAL_BITS,
        "output_lattice": 2.0**state.output_lattice_exponent,
        "value_bound": state.value_bound,
        "shrinkage": "ate" if state.shrinks else "none",
        "anchor_share": state.anchor_share,
        "anchor_given": state.fixed_anchor is not None,
        "anchor_release": None if state.anchor is None else state.anchor.public(),
        "reference_points": state.reference_points,
        "noise_note": (
            "the privacy noise is one Gaussian-process path: it is correlated across points, "
            "so answers can look shifted up or down together (App. C.1)"
        ),
    }
    if params.mode == "strict":
        # Data-independent in strict mode, so it may be released as an error bar (§3.6).
        out["pointwise_noise_sd"] = state.scale.r0
    return out
