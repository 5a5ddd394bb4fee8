"""PrivATE, paper mode: the published DP AIPW ATE with CI (ate_ci.md §2). Label ``paper``.

What it releases:
    ``tau_DP = tau_hat + gamma_tau c(n, eps_1, delta_1) U_1`` and the paper's CI
    ``tau_DP +- z_{1-alpha/2} sqrt(sigma2_DP / n + r^2)`` with ``r = gamma_tau c(n, eps_1,
    delta_1)``, where ``sigma2_DP = max(0, sigma2_hat + gamma_sigma c(n, eps_2, delta_2) U_2)``
    and ``c(n, eps, delta) = 5 sqrt(2 ln n ln(2 / delta)) / (eps n)`` (Nissim, Raskhodnikova &
    Smith's smooth-sensitivity constant with Avella-Medina's bound). Only ``tau_DP`` and the
    CI are returned: not ``sigma2_DP`` (with it the CI width would give ``gamma_tau`` exactly),
    never ``gamma_tau``, ``gamma_sigma``, ``r``, ``tau_hat``, ``sigma2_hat`` or the non-private
    nuisances (threats.md §9). The record holds only public values.

Why the guarantee is heuristic (ate_ci.md §2.15 P1–P3; ``docs/mechanisms/ate_privATE.md``):
    the noise scales ``gamma_tau``, ``gamma_sigma`` are data-dependent suprema computed by a
    local optimiser at non-private nuisances fitted on the same data; the privacy argument is
    an asymptotic smooth-sensitivity bound whose regularity conditions are not verified; and
    the CI width contains ``gamma_tau^2`` without noise (a leak the paper calls
    post-processing). ``gamma_mode="analytic"`` replaces both by the public bounds
    ``gamma_tau = 2R / c_pi`` and ``gamma_sigma = gamma_tau^2`` (data-independent scales) but
    keeps the NRS constant and the non-private nuisances, so it is still ``paper``.

Nuisance presets (ate_ci.md §2.13): ``"kernel"``: scikit-learn ``LogisticRegression()`` and
per-arm ``KernelRidge(kernel="rbf", alpha=0.1)``; covariates are scaled to [0, 1] by the
public box; pi_hat is clipped to [c_pi, 1 - c_pi] and mu_hat to the outcome bounds (P4).
``"linear"``: ``LogisticRegression()`` and per-arm ``Ridge(alpha=0.1)`` (for large n).

Refused with ``PaperModeDisabled`` unless the dataset owner set ``allow_paper_mode``.

References:
    Schroeder, Hartenstein, Feuerriegel (2025). PrivATE: Differentially private confidence
    intervals for average treatment effects. NeurIPS (arXiv 2505.21641v1).
    Nissim, Raskhodnikova, Smith (2007). Smooth sensitivity and sampling in private data
    analysis. STOC.
    Avella-Medina (2021). Privacy-preserving parametric inference: a case for robust
    statistics. JASA.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize
from scipy.special import expit, ndtri

from service.mechanisms.ate_rct import solve_epsilon
from service.mechanisms.ate_strict import MAX_EPSILON, MIN_EPSILON, split_share
from service.mechanisms.calibration import (
    validate_alpha,
    validate_delta,
    validate_epsilon,
    validate_finite_positive,
)
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters, PaperModeDisabled, ReleaseFailed
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.partition import prepare_arrays
from service.mechanisms.records import Composition, Guarantee, MechanismRecord, NoiseEvent

MECHANISM = "ate_privATE"
VERSION = "1"
Progress = Callable[[float, str], None]
NuisancePreset = Literal["kernel", "linear"]
GammaMode = Literal["optimizer", "analytic"]
MIN_N = 100
# Kernel ridge is O(n^3) in time and O(n^2) in memory per arm: a public size guard.
MAX_N_KERNEL = 20_000
KERNEL_RIDGE_ALPHA = 0.1
OPTIMIZER_STARTS = 10
GRID_POINTS = 256  # grid (or, for q > 8, a fixed random design) evaluated before the starts


@dataclass(frozen=True)
class PrivateParams:
    """Public request parameters of PrivATE (paper mode).

    Attributes:
        epsilon: total epsilon, split into eps_1 (ATE) and eps_2 (variance).
        delta: total delta, split likewise.
        alpha: miscoverage of the CI.
        propensity_clip: c_pi (>= the dataset's minimum).
        ate_share: the share of (epsilon, delta) for the ATE (paper default 0.5; Table 1 0.9).
        nuisance: ``"kernel"`` (paper preset) or ``"linear"``.
        gamma_mode: ``"optimizer"`` (paper: multi-start L-BFGS-B) or ``"analytic"``.
    """

    epsilon: float
    delta: float
    alpha: float = 0.05
    propensity_clip: float = 0.1
    ate_share: float = 0.5
    nuisance: NuisancePreset = "kernel"
    gamma_mode: GammaMode = "optimizer"


def nrs_constant(n: int, epsilon: float, delta: float) -> float:
    """``c(n, eps, delta) = 5 sqrt(2 ln n ln(2 / delta)) / (eps n)`` (ate_ci.md eq. 13)."""
    return 5.0 * math.sqrt(2.0 * math.log(n) * math.log(2.0 / delta)) / (epsilon * n)


def variance_term_coefficient(n: int, epsilon: float, delta: float) -> float:
    """``50 ln n ln(2 / delta) / (n eps^2)`` = ``n c^2`` (the CI's privacy term per gamma^2)."""
    return 50.0 * math.log(n) * math.log(2.0 / delta) / (n * epsilon**2)


@dataclass(frozen=True)
class _Plan:
    params: PrivateParams
    epsilon_1: float
    delta_1: float
    epsilon_2: float
    delta_2: float
    c_1: float
    c_2: float
    gamma_bound: float  # 2 R / c_pi, public
    record: MechanismRecord


def _make_plan(domain: PublicDomain, params: PrivateParams) -> _Plan:
    if not domain.allow_paper_mode:
        raise PaperModeDisabled(
            "paper mode (PrivATE) is disabled for this dataset; its owner can enable it with "
            "allow_paper_mode"
        )
    if isinstance(domain.n, bool) or not isinstance(domain.n, int) or domain.n < MIN_N:
        raise InvalidParameters(f"PrivATE needs n >= {MIN_N}")
    if domain.design not in (StudyDesign.OBSERVATIONAL, StudyDesign.RCT):
        raise InvalidParameters("unknown study design")
    if not (math.isfinite(domain.y_lower) and math.isfinite(domain.y_upper)):
        raise InvalidParameters("outcome bounds must be finite")
    big_r = validate_finite_positive(domain.outcome_range, "outcome range")
    epsilon = validate_epsilon(params.epsilon, minimum=MIN_EPSILON, maximum=MAX_EPSILON)
    n = domain.n
    delta = validate_delta(params.delta, n_min=n)
    validate_alpha(params.alpha)
    share = validate_alpha(params.ate_share, name="ate_share")
    clip = validate_finite_positive(params.propensity_clip, "propensity_clip")
    if clip < domain.min_propensity_clip or clip > 0.5:
        raise InvalidParameters(
            f"propensity_clip must be in [{domain.min_propensity_clip}, 0.5] for this dataset"
        )
    if params.nuisance not in ("kernel", "linear"):
        raise InvalidParameters("nuisance must be 'kernel' or 'linear' in paper mode")
    if params.nuisance == "kernel" and n > MAX_N_KERNEL:
        raise InvalidParameters(
            f"nuisance 'kernel' (kernel ridge, O(n^3)) is limited to n <= {MAX_N_KERNEL}; "
            "use nuisance 'linear'"
        )
    if params.gamma_mode not in ("optimizer", "analytic"):
        raise InvalidParameters("gamma_mode must be 'optimizer' or 'analytic'")
    # Budget split, exact: eps_1 + eps_2 == eps and delta_1 + delta_2 == delta in floats.
    epsilon_1, epsilon_2 = split_share(epsilon, share)
    delta_1, delta_2 = split_share(delta, share)
    c_1 = nrs_constant(n, epsilon_1, delta_1)
    c_2 = nrs_constant(n, epsilon_2, delta_2)
    events = (
        _event("ate", epsilon_1, delta_1, c_1, params.gamma_mode),
        _event("variance", epsilon_2, delta_2, c_2, params.gamma_mode),
    )
    record = MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=Guarantee.PAPER,
        n=n,
        fold_sizes={"all": n},
        composition=Composition.SEQUENTIAL,
        events=events,
        epsilon=epsilon,
        delta=delta,
    )
    return _Plan(
        params, epsilon_1, delta_1, epsilon_2, delta_2, c_1, c_2, 2.0 * big_r / clip, record
    )


def _event(statistic: str, epsilon: float, delta: float, constant: float, mode: str) -> NoiseEvent:
    # Public values only: the data-dependent gamma (optimizer mode) is never recorded.
    return NoiseEvent(
        type="smooth_sensitivity_gaussian",
        module="all",
        epsilon=epsilon,
        delta=delta,
        params={
            "statistic": statistic,
            "noise_constant": constant,
            "noise_scale": f"gamma_{'tau' if statistic == 'ate' else 'sigma'} * noise_constant",
            "gamma_mode": mode,
            "sampler": "opendp discrete gaussian on 2^k lattice",
        },
    )


def plan(domain: PublicDomain, params: PrivateParams) -> MechanismRecord:
    """Validate and compute the record (no data).

    Raises:
        PaperModeDisabled: the dataset does not allow paper mode.
        InvalidParameters: invalid parameters.
    """
    return _make_plan(domain, params).record


def _public_parameters(state: _Plan) -> dict[str, Any]:
    params = state.params
    return {
        "mode": "paper",
        "guarantee": str(Guarantee.PAPER),
        "estimator": "aipw",
        "epsilon": state.record.epsilon,
        "delta": state.record.delta,
        "epsilon_ate": state.epsilon_1,
        "delta_ate": state.delta_1,
        "epsilon_variance": state.epsilon_2,
        "delta_variance": state.delta_2,
        "alpha": params.alpha,
        "propensity_clip": params.propensity_clip,
        "nuisance": params.nuisance,
        "gamma_mode": params.gamma_mode,
    }


def quote(
    domain: PublicDomain, params: PrivateParams, *, target_half_width: float | None = None
) -> dict[str, Any]:
    """Public preview from the analytic gamma bound only (never data): the noise-only
    half-width ``z * (2R / c_pi) * c(n, eps_1, delta_1)``; optionally the epsilon needed.
    """
    state = _make_plan(domain, params)
    z = float(ndtri(1.0 - params.alpha / 2.0))
    out: dict[str, Any] = {
        **_public_parameters(state),
        "ci_level": 1.0 - params.alpha,
        "expected_half_width": z * state.gamma_bound * state.c_1,
        "half_width_basis": "noise_only, at the analytic gamma bound 2R/c_pi (an upper bound "
        "in optimizer mode)",
        "noise_constant_ate": state.c_1,
        "noise_constant_variance": state.c_2,
    }
    if target_half_width is not None:
        target = validate_finite_positive(target_half_width, "target_half_width")
        out["target_half_width"] = target

        def width(epsilon: float) -> float:
            other = _make_plan(domain, replace(params, epsilon=epsilon))
            return z * other.gamma_bound * other.c_1

        out["epsilon_for_target_half_width"] = solve_epsilon(width, target)
    return out


# ---- nuisances and suprema (paper mode; run time) -------------------------------------------


@dataclass(frozen=True)
class Nuisances:
    """Fitted non-private nuisances (paper mode). NEVER released."""

    propensity: Callable[[NDArray[np.float64]], NDArray[np.float64]]
    outcome: Callable[[NDArray[np.float64], int], NDArray[np.float64]]


def fit_nuisances(
    u: NDArray[np.float64],
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    *,
    preset: NuisancePreset,
    clip: float,
    y_lower: float,
    y_upper: float,
) -> Nuisances:
    """Fit pi_hat (logistic regression) and per-arm mu_hat on unit-box covariates ``u``.

    Both are clipped (pi_hat to [c, 1 - c], mu_hat to the outcome bounds). Arms with fewer
    than 2 records fall back to the midpoint (a paper-mode convenience; not DP).
    """
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.linear_model import LogisticRegression, Ridge

    treated = a >= 0.5
    if treated.all() or (~treated).all():
        propensity_const = 1.0 if treated.all() else 0.0

        def propensity(points: NDArray[np.float64]) -> NDArray[np.float64]:
            return np.full(points.shape[0], min(max(propensity_const, clip), 1 - clip))
    else:
        classifier = LogisticRegression().fit(u, treated.astype(np.int64))
        coef = np.asarray(classifier.coef_[0], dtype=np.float64)
        intercept = float(classifier.intercept_[0])

        def propensity(points: NDArray[np.float64]) -> NDArray[np.float64]:
            # == classifier.predict_proba(points)[:, 1], without scikit-learn's per-call cost
            probabilities = expit(points @ coef + intercept)
            return np.asarray(np.clip(probabilities, clip, 1 - clip), dtype=np.float64)

    midpoint = (y_lower + y_upper) / 2.0
    predictors: list[Callable[[NDArray[np.float64]], NDArray[np.float64]] | None] = []
    for arm in (~treated, treated):
        if np.count_nonzero(arm) < 2:
            predictors.append(None)
            continue
        if preset == "kernel":
            kernel_model = KernelRidge(kernel="rbf", alpha=KERNEL_RIDGE_ALPHA).fit(
                u[arm], y[arm] - midpoint
            )
            predictors.append(_kernel_predictor(kernel_model, u.shape[1]))
        else:
            ridge = Ridge(alpha=KERNEL_RIDGE_ALPHA).fit(u[arm], y[arm] - midpoint)
            predictors.append(_linear_predictor(ridge.coef_, float(ridge.intercept_)))

    def outcome(points: NDArray[np.float64], arm: int) -> NDArray[np.float64]:
        predictor = predictors[arm]
        if predictor is None:
            return np.full(points.shape[0], midpoint)
        raw = predictor(points) + midpoint
        return np.asarray(np.clip(raw, y_lower, y_upper), dtype=np.float64)

    return Nuisances(propensity, outcome)


def _kernel_predictor(model: Any, q: int) -> Callable[[NDArray[np.float64]], NDArray[np.float64]]:
    """``KernelRidge.predict`` for the RBF kernel (gamma = 1 / q, scikit-learn's default)."""
    support = np.asarray(model.X_fit_, dtype=np.float64)
    dual = np.asarray(model.dual_coef_, dtype=np.float64).reshape(-1)
    gamma = 1.0 / q if model.gamma is None else float(model.gamma)
    support_sq = np.einsum("ij,ij->i", support, support)

    def predict(points: NDArray[np.float64]) -> NDArray[np.float64]:
        points_sq = np.einsum("ij,ij->i", points, points)
        distance = np.maximum(points_sq[:, None] + support_sq[None, :] - 2 * points @ support.T, 0)
        return np.asarray(np.exp(-gamma * distance) @ dual, dtype=np.float64)

    return predict


def _linear_predictor(
    coef: Any, intercept: float
) -> Callable[[NDArray[np.float64]], NDArray[np.float64]]:
    weights = np.asarray(coef, dtype=np.float64).reshape(-1)

    def predict(points: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray(points @ weights + intercept, dtype=np.float64)

    return predict


def pseudo_outcome(
    nuisances: Nuisances, u: NDArray[np.float64], a: NDArray[np.float64], y: NDArray[np.float64]
) -> NDArray[np.float64]:
    """AIPW pseudo-outcomes Gamma at points ``(u, a, y)`` (ate_ci.md eq. 3/18)."""
    pi = nuisances.propensity(u)
    mu0 = nuisances.outcome(u, 0)
    mu1 = nuisances.outcome(u, 1)
    return np.asarray(
        mu1 - mu0 + a * (y - mu1) / pi - (1.0 - a) * (y - mu0) / (1.0 - pi), dtype=np.float64
    )


def _grid(q: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """Evaluation design on [0, 1]^q: a full grid when small, else a fixed-size random design."""
    per_axis = int(math.floor(GRID_POINTS ** (1.0 / q)))
    if per_axis >= 3:
        axes = [np.linspace(0.0, 1.0, per_axis)] * q
        return np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, q)
    design = rng.uniform(size=(GRID_POINTS, q))
    corners = np.array([np.zeros(q), np.ones(q), np.full(q, 0.5)])
    return np.vstack([design, corners])


def _objective(
    nuisances: Nuisances, tau_hat: float, arm: float, y_value: float, sign: float
) -> Callable[[NDArray[np.float64]], float]:
    """``-sign (Gamma(x, arm, y_value) - tau_hat)`` at one point (for minimisation)."""

    def objective(point: NDArray[np.float64]) -> float:
        gamma = pseudo_outcome(
            nuisances, point.reshape(1, -1), np.array([arm]), np.array([y_value])
        )[0]
        return -sign * (float(gamma) - tau_hat)

    return objective


def gamma_tau_optimizer(
    nuisances: Nuisances,
    tau_hat: float,
    q: int,
    *,
    y_lower: float,
    y_upper: float,
    rng: np.random.Generator,
    observed: NDArray[np.float64] | None = None,
) -> float:
    """``sup_z |Gamma(z) - tau_hat|`` over the public box by multi-start L-BFGS-B (§2.9).

    ``a`` in {0, 1} and ``y`` in {y_lo, y_hi} are enumerated (Gamma is affine in y); both
    signs are maximised; each of the 8 problems evaluates the grid and runs L-BFGS-B from
    ``OPTIMIZER_STARTS`` starts (the best half of them grid points, the rest uniform random).
    ``observed`` (the |Gamma_i - tau_hat| at the data) is a lower bound included in the max.
    A local optimiser can underestimate the supremum (P3): the result is paper mode only.
    """
    grid = _grid(q, rng)
    best = 0.0 if observed is None or observed.size == 0 else float(np.max(observed))
    bounds = [(0.0, 1.0)] * q
    for arm in (0.0, 1.0):
        for y_value in (y_lower, y_upper):
            for sign in (1.0, -1.0):
                objective = _objective(nuisances, tau_hat, arm, y_value, sign)

                values = sign * (
                    pseudo_outcome(
                        nuisances,
                        grid,
                        np.full(grid.shape[0], arm),
                        np.full(grid.shape[0], y_value),
                    )
                    - tau_hat
                )
                best = max(best, float(np.max(values)))
                from_grid = OPTIMIZER_STARTS // 2
                order = np.argsort(-values)[:from_grid]
                random_starts = rng.uniform(size=(OPTIMIZER_STARTS - from_grid, q))
                starts = np.vstack([grid[order], random_starts])
                for start in starts:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        result = minimize(objective, start, method="L-BFGS-B", bounds=bounds)
                    point = np.clip(np.asarray(result.x, dtype=np.float64), 0.0, 1.0)
                    best = max(best, -objective(point))
    return best


def run(
    arrays: Arrays,
    domain: PublicDomain,
    params: PrivateParams,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    """Run PrivATE (paper mode) after the charge.

    Returns:
        ``estimate`` (tau_DP), ``ci_lower``, ``ci_upper``, ``ci_level``, ``half_width`` and
        public parameters. Nothing data-dependent besides these released values.

    Raises:
        PaperModeDisabled, InvalidParameters: before data access.
        ReleaseFailed: any failure after data access (generic).
    """
    state = _make_plan(domain, params)
    try:
        return _run(arrays, domain, state, rng=rng, noise=noise, progress=progress)
    except Exception:
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
    n = domain.n
    x, a, y = prepare_arrays(arrays, domain)
    lower = np.asarray(domain.x_lower, dtype=np.float64)
    upper = np.asarray(domain.x_upper, dtype=np.float64)
    u = (x - lower) / (upper - lower)  # public map to [0, 1]^q
    del x
    # Step 1 (§2.2-2.3): non-private nuisances on the full data; AIPW.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # library convergence warnings never reach a client
        nuisances = fit_nuisances(
            u,
            a,
            y,
            preset=params.nuisance,
            clip=params.propensity_clip,
            y_lower=domain.y_lower,
            y_upper=domain.y_upper,
        )
    gamma = pseudo_outcome(nuisances, u, a, y)
    tau_hat = float(np.mean(gamma))
    sigma2_hat = float(np.mean((gamma - tau_hat) ** 2))  # 1/n sandwich (P12)
    progress(0.4, "nuisances")
    # Step 2 (§2.4, §2.9): gross-error sensitivities.
    if params.gamma_mode == "analytic":
        gamma_tau = state.gamma_bound
        gamma_sigma = gamma_tau**2
    else:
        gamma_tau = gamma_tau_optimizer(
            nuisances,
            tau_hat,
            domain.q,
            y_lower=domain.y_lower,
            y_upper=domain.y_upper,
            rng=rng,
            observed=np.abs(gamma - tau_hat),
        )
        # |Gamma| <= R / c_pi and |tau_hat| <= R / c_pi, so gamma_tau <= 2R / c_pi (§3.3).
        if not gamma_tau <= state.gamma_bound * (1.0 + 1e-9):
            raise ValueError("gamma_tau above the analytic bound")
        # gamma_sigma = max(gamma_tau^2 - sigma2, sigma2 - inf (Gamma - tau)^2) <=
        # max(gamma_tau^2 - sigma2, sigma2) (§2.4, taking the infimum as 0: conservative).
        gamma_sigma = max(gamma_tau**2 - sigma2_hat, sigma2_hat)
    del gamma, u, a, y, nuisances
    progress(0.8, "sensitivities")
    # Step 3 (§2.5-2.7): Gaussian output perturbation with the NRS constant; clamp; CI.
    tiny = 1e-12 * state.gamma_bound  # keeps the sampler's scale positive if gamma == 0
    r = max(gamma_tau * state.c_1, tiny)
    s_sigma = max(gamma_sigma * state.c_2, tiny * state.gamma_bound)
    log_n = math.log(n)
    tau_dp = float(
        noise.gaussian(
            np.array([tau_hat]), sigma=r, sensitivity_l2=gamma_tau * math.sqrt(log_n) / n
        )[0]
    )
    sigma2_dp = max(
        0.0,
        float(
            noise.gaussian(
                np.array([sigma2_hat]),
                sigma=s_sigma,
                sensitivity_l2=gamma_sigma * math.sqrt(log_n) / n,
            )[0]
        ),
    )
    if not (math.isfinite(tau_dp) and math.isfinite(sigma2_dp)):
        raise ValueError("non-finite release")
    # V_DP = sigma2_DP + n r^2 (eq. 16); CI tau_DP +- z sqrt(V_DP / n) (eq. 15).
    half_width = float(ndtri(1.0 - params.alpha / 2.0)) * math.sqrt(sigma2_dp / n + r * r)
    del tau_hat, sigma2_hat, gamma_tau, gamma_sigma, r, s_sigma, sigma2_dp
    progress(1.0, "done")
    return {
        "estimate": tau_dp,
        "ci_lower": tau_dp - half_width,
        "ci_upper": tau_dp + half_width,
        "ci_level": 1.0 - params.alpha,
        "half_width": half_width,
        **_public_parameters(state),
    }
