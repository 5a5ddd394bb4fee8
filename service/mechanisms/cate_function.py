"""DP CATE *function* release: kernel ridge second stage plus Gaussian-process noise.

What it releases (spec ``cate_function_gp.md``):
    One draw ``g_DP = g*_D + r0 G`` of a function of the covariates, where ``g*_D`` is a
    Gaussian-kernel ridge regression (R- or DR-learner, ``cate_vector.md`` §2) fitted on the
    estimation fold and ``G ~ GP(0, k0)`` is a unit GP sample path with the *same* kernel. The
    release job returns only public metadata; ``g*_D``, ``r0`` (paper mode) and the noise stay
    on the server (``service.functions``), and clients evaluate ``g_DP`` at points of their
    choice. Each evaluation is post-processing of the one release (§7), so it is free.

Neighbouring relation:
    replace-one on records (X, A, Y), n public; fold sizes are public functions of n.

Claim (strict mode, ``docs/proofs/cate_function.md``):
    * nuisances: DP-EBM propensity on D_pi and outcome on D_mu, each (epsilon, delta)-DP
      (``dp_ebm.solve_dp_ebm_epsilon_p``), predictions clipped to public ranges;
    * second stage on D_2 (n2 rows): the minimiser of ``(1/n2) sum l_i(g(x_i)) + lambda0
      |g|^2_{k0}`` over the RKHS of ``k0`` (or the span of public Nystrom centres, or public
      random features) with ``l_i`` convex and L-Lipschitz on the reachable range (§3.4) has
      RKHS sensitivity ``Delta = L / (lambda0 n2)`` (kappa = 1 for ``k0``; §2 erratum 3);
    * ``g*_D + r0 G`` with ``r0 = Delta sigma_G(epsilon, delta)`` (analytic Gaussian) is
      (epsilon, delta)-DP: each finite-dimensional marginal is a Gaussian mechanism with
      Mahalanobis sensitivity at most Delta (Hall et al. 2013, Cor. 9 with the exact condition);
    * folds are disjoint and uniformly random: Niu et al.'s Theorem 6 gives the max,
      (epsilon, delta).
    Paper mode uses non-private nuisances (label ``paper``) and
    ``r0 = max(r_paper, r_Hall)`` with the Hall multiplier ``max(c(delta)/epsilon, sigma_G)``.

Conventions (§4): X is scaled to ``[0, 1]^q`` by the public box; the kernel is the unnormalised
``k0 = exp(-|x - x'|^2 / (2 h^2))`` and ``lambda0 = lambda / c_q`` with ``c_q = (sqrt(2 pi)
h)^(-q)`` when the request uses the paper's normalised convention. Everything that shapes the
noise (h, lambda, L, centres, jitter, lattices) is public and fixed before fitting.

References:
    Schroeder, Melnychuk, Feuerriegel. Differentially private learning of heterogeneous
    treatment effects (DP-CATE), §4, App. C, D, G, H.
    Hall, Rinaldo and Wasserman (2013). Differential privacy for functions and functional
    data. JMLR 14.
    Niu et al. (2022). Differentially private estimation of heterogeneous causal effects. CLeaR.
    Balle and Wang (2018). Improving the Gaussian mechanism for differential privacy. ICML.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

import numpy as np
import scipy.linalg
from numpy.typing import NDArray

from service.mechanisms import ate_strict, gp, versus_ate
from service.mechanisms import dp_ebm as dp_ebm_lib
from service.mechanisms.anchor import (
    ANCHOR_SHARE,
    AnchorPlan,
    anchor_pseudo_outcomes,
    anchor_share,
    draw_anchor,
    james_stein_factor,
    plan_anchor,
)
from service.mechanisms.calibration import (
    analytic_gaussian_multiplier,
    hall_constant,
    validate_delta,
    validate_epsilon,
    validate_finite_positive,
)
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters, PaperModeDisabled, ReleaseFailed
from service.mechanisms.noise import NoiseSampler, lattice_exponent
from service.mechanisms.partition import fold_sizes, prepare_arrays, random_folds
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
VERSION = "2"
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
    anchor: AnchorPlan | None = None  # proof §7 (shrinkage "ate")
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
# most DEFAULT_NOISE_SD_FRACTION * R_Y, else the largest. The paper's normalised lambda = 1 gives
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
    if params.regularization is not None:
        return _plan(domain, params)
    state: Plan | None = None
    for lambda0 in DEFAULT_LAMBDA0_GRID:
        state = _plan(
            domain,
            replace(params, regularization=lambda0, lambda_convention="unnormalised"),
        )
        if state.shrinks:
            target = versus_ate.WORTH_IT_RATIO * versus_ate.default_heterogeneity_sd(domain)
        else:
            target = DEFAULT_NOISE_SD_FRACTION * domain.outcome_range
        if state.scale.r0 <= target:
            break
    assert state is not None
    return state


def _plan(domain: PublicDomain, params: CateFunctionParams) -> Plan:
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
    # proof §7: the anchor takes ANCHOR_SHARE of the estimation budget, the GP the rest (exact).
    epsilon_gp, delta_gp = epsilon, delta
    share = 0.0
    anchor: AnchorPlan | None = None
    anchor_events: list[NoiseEvent] = []
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
    if shrinkage == "ate" and fixed_anchor is None:
        # the share rule reads the GP's public noise at the default share (anchor.anchor_share)
        share = anchor_share(
            noise_scale(
                mode=params.mode,
                learner=params.learner,
                q=q,
                bandwidth=bandwidth,
                lambda0=lambda0,
                n2=n2,
                epsilon=ate_strict.split_share(epsilon, ANCHOR_SHARE)[1],
                delta=ate_strict.split_share(delta, ANCHOR_SHARE)[1],
                outcome_range=domain.outcome_range,
                propensity_bound=propensity_bound,
            ).r0,
            domain.outcome_range,
        )
        epsilon_anchor, epsilon_gp = ate_strict.split_share(epsilon, share)
        delta_anchor, delta_gp = ate_strict.split_share(delta, share)
        anchor, anchor_events = plan_anchor(
            params.learner,
            epsilon_anchor,
            delta_anchor,
            outcome_range=domain.outcome_range,
            propensity_clip=propensity_bound,
            dr_bound=domain.outcome_range / propensity_bound,
            n2=n2,
        )
    scale = noise_scale(
        mode=params.mode,
        learner=params.learner,
        q=q,
        bandwidth=bandwidth,
        lambda0=lambda0,
        n2=n2,
        epsilon=epsilon_gp,
        delta=delta_gp,
        outcome_range=domain.outcome_range,
        propensity_bound=propensity_bound,
    )
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
        dp_ebm = dp_ebm_lib.solve_dp_ebm_epsilon_p(epsilon, delta)
        if "propensity" in modules:
            events.append(dp_ebm_lib.nuisance_event("propensity", epsilon, delta, dp_ebm, q, 1.0))
        events.append(
            dp_ebm_lib.nuisance_event(
                "outcome", epsilon, delta, dp_ebm, q + 1, domain.outcome_range
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
    events.extend(anchor_events)
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
    record = MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=Guarantee.STRICT if params.mode == "strict" else Guarantee.PAPER,
        n=domain.n,
        fold_sizes=dict(zip(modules, sizes, strict=True)),
        composition=Composition.THEOREM6_MAX if len(modules) > 1 else Composition.SEQUENTIAL,
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


def quote(domain: PublicDomain, params: CateFunctionParams) -> dict[str, Any]:
    """Public preview: the constants and the pointwise noise sd; no data, no charge."""
    state = plan(domain, params)
    out = public_parameters(state)
    out["pointwise_noise_sd"] = state.scale.r0
    out["n2"] = state.n2
    return out


# ---- second stage (pure, closed form) -------------------------------------------------------


def scale_to_unit(x: FloatArray, lower: FloatArray, upper: FloatArray) -> FloatArray:
    """Map the public box to [0, 1]^q (clipping first)."""
    clipped = np.clip(x, lower, upper)
    return np.asarray((clipped - lower) / (upper - lower), dtype=np.float64)


def canonicalise(scaled: FloatArray) -> tuple[NDArray[np.int64], FloatArray]:
    """Round scaled points to the public lattice 2^-CANONICAL_BITS; returns (codes, points)."""
    steps = float(1 << CANONICAL_BITS)
    codes = np.rint(np.clip(scaled, 0.0, 1.0) * steps).astype(np.int64)
    return codes, np.asarray(codes / steps, dtype=np.float64)


def fit_exact(
    x: FloatArray, targets: FloatArray, weights: FloatArray, *, bandwidth: float, lambda0: float
) -> FloatArray:
    """alpha of the exact KRR ``(W^2 K0 + n lambda0 I)^{-1} W r`` (§4), via the symmetric form.

    With W invertible (|w_i| >= kappa_pi), alpha = W beta and ``(W K0 W + n lambda0 I) beta =
    r``; the DR learner is W = I with r = phi.
    """
    n = x.shape[0]
    gram = gp.gaussian_kernel(x, x, bandwidth)
    system = weights[:, None] * gram * weights[None, :]
    system[np.diag_indices(n)] += n * lambda0
    beta = scipy.linalg.solve(system, targets, assume_a="pos")
    return np.asarray(weights * beta, dtype=np.float64)


def _centre_metric(centres: FloatArray, bandwidth: float) -> FloatArray:
    gram = gp.gaussian_kernel(centres, centres, bandwidth)
    gram[np.diag_indices(centres.shape[0])] += NYSTROM_JITTER
    return gram


def fit_basis(
    features: Callable[[FloatArray], FloatArray],
    x: FloatArray,
    targets: FloatArray,
    weights: FloatArray,
    *,
    metric: FloatArray,
    lambda0: float,
) -> FloatArray:
    """Coefficients minimising ``(1/n) |W(r/w) - W F beta|^2 ...``: the R/DR loss in a basis.

    Solves ``(F^T W^2 F + n lambda0 M) beta = F^T W r`` with F the (chunked) basis matrix and M
    the public metric (jittered centre Gram for Nystrom, I for random features).
    """
    n = x.shape[0]
    m = metric.shape[0]
    lhs = np.zeros((m, m), dtype=np.float64)
    rhs = np.zeros(m, dtype=np.float64)
    for start in range(0, n, _CHUNK):
        f = features(x[start : start + _CHUNK])
        w = weights[start : start + _CHUNK]
        fw = f * w[:, None]
        lhs += fw.T @ fw
        rhs += fw.T @ targets[start : start + _CHUNK]
    lhs += n * lambda0 * metric
    lhs = 0.5 * (lhs + lhs.T)
    return np.asarray(scipy.linalg.solve(lhs, rhs, assume_a="pos"), dtype=np.float64)


FunctionKind = Literal["gp", "centres", "rff"]


@dataclass(frozen=True)
class ReferenceDraw:
    """The exact GP path drawn at the public reference points at release time (secret state)."""

    codes: NDArray[np.int64]  # canonical codes of the points
    values: FloatArray  # unit GP values u
    answers: FloatArray  # the released answers there
    jitters: FloatArray


@dataclass
class FittedFunction:
    """The secret state of one released function (never returned).

    ``kind = "gp"``: ``g*(x) = k0(x, support) @ coef`` plus the GP noise ``r0 u(x)`` drawn on
    demand; ``kind = "centres"`` / ``"rff"``: ``g_DP(x) = basis(x) @ coef`` with the noise
    already in ``coef``.
    """

    kind: FunctionKind
    bandwidth: float
    r0: float
    support: FloatArray  # (s, q): D_2 rows, Nystrom centres or RFF frequencies
    coef: FloatArray
    output_lattice_exponent: int
    meta: dict[str, float] = field(default_factory=dict)
    value_bound: float = math.inf  # public |CATE| bound R_Y; inf for functions stored before it
    # proof §7 (public once released): answers are anchor + shrink * (g(x) + noise)
    anchor: float = 0.0
    shrink: float = 1.0
    # exact basis with shrinkage: the GP path's draws at the reference points, persisted as the
    # function's first batch (never serialised with the fit)
    reference: ReferenceDraw | None = None

    def basis(self, points: FloatArray) -> FloatArray:
        if self.kind == "rff":
            return gp.random_features(points, self.support)
        return gp.gaussian_kernel(points, self.support, self.bandwidth)

    def mean(self, points: FloatArray) -> FloatArray:
        """``g*(x)`` (``kind="gp"``) or ``g_DP(x)`` (finite bases), chunked over the support."""
        out = np.zeros(points.shape[0], dtype=np.float64)
        support_chunk = max(1, (1 << 22) // max(points.shape[0], 1))
        if self.kind == "rff":
            return np.asarray(self.basis(points) @ self.coef, dtype=np.float64)
        for start in range(0, self.support.shape[0], support_chunk):
            block = self.support[start : start + support_chunk]
            out += (
                gp.gaussian_kernel(points, block, self.bandwidth)
                @ self.coef[start : start + support_chunk]
            )
        return out

    def released(self, mean: FloatArray, unit_noise: FloatArray | None = None) -> FloatArray:
        """The answers at points where ``mean = self.mean(points)`` (and, ``kind="gp"``, the unit
        GP path's values there): ``anchor + shrink (g(x) + r0 u(x))``, rounded and clipped."""
        values = np.asarray(mean, dtype=np.float64)
        if self.kind == "gp":
            if unit_noise is None:
                raise ValueError("a GP function's answers need the path's values")
            values = values + self.r0 * np.asarray(unit_noise, dtype=np.float64)
        return self.round_output(self.anchor + self.shrink * values)

    def round_output(self, values: FloatArray) -> FloatArray:
        """Round to the public output lattice 2^k and clip to the public CATE range
        ``[-R_Y, R_Y]`` (post-processing of the DP values)."""
        step = math.ldexp(1.0, self.output_lattice_exponent)
        rounded = np.rint(values / step) * step
        return np.asarray(np.clip(rounded, -self.value_bound, self.value_bound), dtype=np.float64)

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez(
            buffer,
            kind=np.array(self.kind),
            bandwidth=np.array(self.bandwidth),
            r0=np.array(self.r0),
            support=self.support,
            coef=self.coef,
            output_lattice_exponent=np.array(self.output_lattice_exponent),
            value_bound=np.array(self.value_bound),
            anchor=np.array(self.anchor),
            shrink=np.array(self.shrink),
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> FittedFunction:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            kind = str(z["kind"])
            if kind not in ("gp", "centres", "rff"):
                raise ValueError("unknown function kind")
            return cls(
                kind=cast(FunctionKind, kind),
                bandwidth=float(z["bandwidth"]),
                r0=float(z["r0"]),
                support=np.asarray(z["support"], dtype=np.float64),
                coef=np.asarray(z["coef"], dtype=np.float64),
                output_lattice_exponent=int(z["output_lattice_exponent"]),
                value_bound=float(z["value_bound"]) if "value_bound" in z.files else math.inf,
                anchor=float(z["anchor"]) if "anchor" in z.files else 0.0,
                shrink=float(z["shrink"]) if "shrink" in z.files else 1.0,
            )

    def nbytes(self) -> int:
        return int(self.support.nbytes + self.coef.nbytes)


def second_stage(
    state: Plan,
    x2: FloatArray,
    targets: FloatArray,
    weights: FloatArray,
    *,
    rng: np.random.Generator,
    normals: gp.Normals,
) -> FittedFunction:
    """Fit the second stage on scaled D_2 and attach the noise (finite bases) or its scale (GP).

    ``x2`` is already scaled to [0, 1]^q. ``rng`` supplies the random frequencies (RFF, data
    independent, public); ``normals`` the unit normals of the finite bases' coefficient noise
    (the vetted sampler's ``standard_normal`` in production).
    """
    scale = state.scale
    h = scale.bandwidth

    def released(kind: FunctionKind, support: FloatArray, coef: FloatArray) -> FittedFunction:
        return FittedFunction(
            kind,
            h,
            scale.r0,
            support,
            coef,
            state.output_lattice_exponent,
            value_bound=state.value_bound,
        )

    q = state.q
    params = state.params
    if state.fit == "rff":
        # proof step 5 (RFF): frequencies drawn independently of the data, kappa = 1.
        frequencies = rng.normal(0.0, 1.0 / h, size=(params.n_features, q))
        metric = np.eye(2 * params.n_features)
        coef = fit_basis(
            lambda pts: gp.random_features(pts, frequencies),
            x2,
            targets,
            weights,
            metric=metric,
            lambda0=scale.lambda0,
        )
        # proof step 6 (RFF): beta_DP = beta + r0 xi, Hall's mechanism for k_RFF.
        coef = coef + scale.r0 * np.asarray(normals(coef.shape[0]), dtype=np.float64)
        return released("rff", frequencies, coef)
    if state.fit == "nystrom":
        centres = gp.sobol_centres(params.n_centres, q)
        metric = _centre_metric(centres, h)
        coef = fit_basis(
            lambda pts: gp.gaussian_kernel(pts, centres, h),
            x2,
            targets,
            weights,
            metric=metric,
            lambda0=scale.lambda0,
        )
        if params.basis == "nystrom":
            # proof step 6 (Nystrom): beta_DP = beta + r0 eta, eta ~ N(0, M^{-1}).
            coef = coef + scale.r0 * gp.nystrom_noise(metric, normals=normals)
            return released("centres", centres, coef)
        return released("gp", centres, coef)
    alpha = fit_exact(x2, targets, weights, bandwidth=h, lambda0=scale.lambda0)
    return released("gp", x2.copy(), alpha)


# ---- running (after the charge) -------------------------------------------------------------


def _paper_nuisances(
    x: FloatArray,
    a: FloatArray,
    y: FloatArray,
    folds: dict[str, NDArray[np.intp]],
    x2: FloatArray,
    state: Plan,
    domain: PublicDomain,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Non-private nuisances on D_1 (paper mode only)."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if state.propensity is not None:
            pi_hat = np.full(x2.shape[0], state.propensity)
        else:
            idx = folds["propensity"]
            classes = np.unique(a[idx])
            if classes.size < 2:
                pi_hat = np.full(x2.shape[0], 0.5)
            else:
                model = LogisticRegression(max_iter=500).fit(x[idx], a[idx])
                pi_hat = model.predict_proba(x2)[:, 1]
        if "outcome" in folds:
            idx = folds["outcome"]
            reg = HistGradientBoostingRegressor(max_iter=100).fit(
                np.column_stack([a[idx], x[idx]]), y[idx]
            )
            ones = np.ones(x2.shape[0])
            mu1 = reg.predict(np.column_stack([ones, x2]))
            mu0 = reg.predict(np.column_stack([0.0 * ones, x2]))
        else:
            mu0 = mu1 = np.full(x2.shape[0], (domain.y_lower + domain.y_upper) / 2.0)
    return (
        np.asarray(pi_hat, np.float64),
        np.asarray(mu0, np.float64),
        np.asarray(mu1, np.float64),
    )


def _dp_nuisances(
    x: FloatArray,
    a: FloatArray,
    y: FloatArray,
    folds: dict[str, NDArray[np.intp]],
    x2: FloatArray,
    state: Plan,
    domain: PublicDomain,
    progress: Progress,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """DP-EBM nuisances on their own folds (strict mode), the ATE's shared first stage."""
    low, high = domain.y_lower, domain.y_upper
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)

    def accounting() -> dp_ebm_lib.DpEbmAccounting:
        if state.dp_ebm is None:
            raise ValueError("no DP-EBM accounting in this plan")
        return state.dp_ebm

    if state.propensity is not None:
        pi_hat = np.full(x2.shape[0], state.propensity, dtype=np.float64)
    else:
        idx = folds["propensity"]
        # pseudo_targets clips to [kappa, 1 - kappa] again; here only NaN and [0, 1] matter.
        pi_hat = dp_ebm_lib.propensity_scores(
            x[idx], a[idx], x2, lower, upper, accounting(), clip=0.0
        )
        progress(0.35, "propensity")
    if state.params.nuisance == "none":
        mid = (low + high) / 2.0
        mu0 = np.full(x2.shape[0], mid, dtype=np.float64)
        mu1 = mu0
    else:
        idx = folds["outcome"]
        mu0, mu1 = dp_ebm_lib.outcome_predictions(
            x[idx], a[idx], y[idx], x2, lower, upper, low, high, accounting()
        )
        progress(0.7, "outcome")
    return pi_hat, mu0, mu1


def pseudo_targets(
    learner: Learner,
    a: FloatArray,
    y: FloatArray,
    pi_hat: FloatArray,
    mu0: FloatArray,
    mu1: FloatArray,
    *,
    domain: PublicDomain,
    propensity_bound: float,
) -> tuple[FloatArray, FloatArray]:
    """(targets, weights) of the second-stage loss ``(targets_i - weights_i g(x_i))^2`` (§3.2).

    Nuisances are clipped to public ranges first (proof step 2): pi in [kappa, 1 - kappa],
    mu in the outcome bounds, so |r| <= R_max, |w| <= 1 (R) and |phi| <= R_max / kappa (DR).
    """
    low, high = domain.y_lower, domain.y_upper
    pi = np.clip(np.nan_to_num(pi_hat, nan=0.5), propensity_bound, 1.0 - propensity_bound)
    mu0 = np.clip(np.nan_to_num(mu0, nan=low), low, high)
    mu1 = np.clip(np.nan_to_num(mu1, nan=low), low, high)
    if learner == "r":
        m_hat = np.clip(pi * mu1 + (1.0 - pi) * mu0, low, high)
        targets = np.clip(y - m_hat, -(high - low), high - low)
        weights = a - pi
        return np.asarray(targets, np.float64), np.asarray(weights, np.float64)
    phi = ate_strict.pseudo_outcomes(a, y, pi, mu0, mu1, bound=(high - low) / propensity_bound)
    return phi, np.ones_like(phi)


def run(
    arrays: Arrays,
    domain: PublicDomain,
    params: CateFunctionParams,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> tuple[dict[str, Any], FittedFunction]:
    """Fit the function (after the charge): returns (public result, secret fitted function).

    ``rng`` draws the data-independent partition and random frequencies; ``noise`` the unit
    normals of the finite bases' coefficient noise.

    Raises:
        InvalidParameters: invalid parameters (before the data is touched).
        ReleaseFailed: any failure after the data is touched (generic by construction).
    """
    state = plan(domain, params)
    try:
        return _run(arrays, domain, state, rng=rng, noise=noise, progress=progress)
    except Exception:
        raise ReleaseFailed() from None


def _run(
    arrays: Arrays,
    domain: PublicDomain,
    state: Plan,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> tuple[dict[str, Any], FittedFunction]:
    x, a, y = prepare_arrays(arrays, domain)
    # proof step 1: uniformly random partition at public sizes.
    folds = random_folds(rng, domain.n, state.modules, state.fold_sizes)
    progress(0.05, "partition")
    est = folds["estimation"]
    x2, a2, y2 = x[est], a[est], y[est]
    # proof step 2: nuisances on their own folds only.
    if state.params.mode == "strict":
        pi_hat, mu0, mu1 = _dp_nuisances(x, a, y, folds, x2, state, domain, progress)
    else:
        pi_hat, mu0, mu1 = _paper_nuisances(x, a, y, folds, x2, state, domain)
    targets, weights = pseudo_targets(
        state.params.learner,
        a2,
        y2,
        pi_hat,
        mu0,
        mu1,
        domain=domain,
        propensity_bound=state.propensity_bound,
    )
    anchor: float | None = state.fixed_anchor
    if state.anchor is not None:
        # proof §7 step 1: the DP anchor ATE of the estimation fold; step 2: targets centred at
        # it and clipped again to the public target bound (a row-wise map with a DP constant).
        low, high = domain.y_lower, domain.y_upper
        c_a = (
            state.anchor.propensity_clip if state.params.learner == "r" else state.propensity_bound
        )
        pi_a = np.clip(np.nan_to_num(pi_hat, nan=0.5), c_a, 1.0 - c_a)
        gamma = anchor_pseudo_outcomes(
            state.params.learner,
            a2,
            y2,
            pi_a,
            np.clip(np.nan_to_num(mu0, nan=low), low, high),
            np.clip(np.nan_to_num(mu1, nan=low), low, high),
            state.anchor.bound,
        )
        anchor = draw_anchor(gamma, state.anchor, domain.outcome_range, noise)
        del gamma
        progress(0.8, "anchor")
    if anchor is not None:
        bound = state.scale.target_bound
        targets = np.clip(targets - weights * anchor, -bound, bound)
    lower = np.asarray(domain.x_lower, np.float64)
    upper = np.asarray(domain.x_upper, np.float64)
    fitted = second_stage(
        state,
        scale_to_unit(x2, lower, upper),
        targets,
        weights,
        rng=rng,
        normals=noise.standard_normal,
    )
    if not (np.all(np.isfinite(fitted.coef)) and math.isfinite(fitted.r0)):
        raise ValueError("non-finite fit")
    progress(0.9, "second stage")
    result = {**public_parameters(state), "n2": state.n2}
    if anchor is not None:
        shrink(fitted, state, anchor, noise)
        result["ate_anchor"] = fitted.anchor
        result["shrinkage_factor"] = fitted.shrink
    return result, fitted


def start_path(fitted: FittedFunction, q: int, capacity: int) -> gp.GpPath:
    """An exact function's GP path as the service starts it: with the reference draw, if any
    (in-process evaluation for benchmarks and tests; the service replays stored batches)."""
    path = gp.GpPath(q, fitted.bandwidth, capacity=capacity, max_capacity=capacity)
    if fitted.reference is not None:
        steps = 1.0 / float(1 << CANONICAL_BITS)
        path.extend_known(
            np.asarray(fitted.reference.codes * steps, dtype=np.float64),
            fitted.reference.values,
            fitted.reference.jitters,
        )
    return path


def reference_points(state: Plan) -> tuple[NDArray[np.int64], FloatArray]:
    """The public reference points: the first Sobol points of [0, 1]^q, canonicalised."""
    return canonicalise(gp.sobol_centres(state.reference_points, state.q))


def shrink(fitted: FittedFunction, state: Plan, anchor: float, noise: NoiseSampler) -> None:
    """proof §7 step 3: read the released deviation ``g(x) + noise`` at the public reference
    points, and set ``fitted.shrink`` to the James–Stein factor against its public noise
    covariance ``Sigma`` (post-processing of the DP function). For the exact basis the GP path is
    drawn there now and kept as the function's first answers (``fitted.reference``)."""
    codes, points = reference_points(state)
    r0 = fitted.r0
    mean = fitted.mean(points)
    unit: FloatArray | None = None
    if fitted.kind == "gp":
        path = gp.GpPath(state.q, fitted.bandwidth, capacity=points.shape[0])
        draw = path.draw(points, normals=noise.standard_normal, jitter=state.params.jitter)
        unit = draw.values
        deviations = mean + r0 * unit
        covariance = gp.gaussian_kernel(points, points, fitted.bandwidth) + np.diag(draw.jitters)
    elif fitted.kind == "centres":
        cross = gp.gaussian_kernel(points, fitted.support, fitted.bandwidth)
        factor = scipy.linalg.cholesky(_centre_metric(fitted.support, fitted.bandwidth), lower=True)
        half = scipy.linalg.solve_triangular(factor, cross.T, lower=True)  # L^-1 B^T
        deviations = mean
        covariance = half.T @ half  # B M^-1 B^T
    else:
        features = gp.random_features(points, fitted.support)
        deviations = mean
        covariance = features @ features.T
    covariance = (r0 * r0) * covariance
    prior = state.value_bound / versus_ate.DEFAULT_HETEROGENEITY_RANGE_RATIO
    fitted.anchor = anchor
    fitted.shrink = james_stein_factor(
        deviations,
        float(np.trace(covariance)),
        float(np.sum(covariance * covariance)),
        prior,
    )
    if unit is not None:
        fitted.reference = ReferenceDraw(
            codes=codes,
            values=unit,
            answers=fitted.released(mean, unit),
            jitters=draw.jitters,
        )
