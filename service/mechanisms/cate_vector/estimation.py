"""cate_vector's run after the charge: partition, DP nuisances, the second stage, the anchor
ATE, the noise and the released vector (proof steps 1, 5-7), and paper mode's sensitivity.

Every noise draw goes through the ``NoiseSampler`` at a scale fixed by the plan
(``calibration``); any failure after the data is touched is one generic ``ReleaseFailed``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.mechanisms import versus_ate
from service.mechanisms.anchor import draw_ate_anchor, james_stein_factor
from service.mechanisms.ate_strict import pseudo_outcomes
from service.mechanisms.cate_vector.calibration import (
    CateVectorParams,
    Learner,
    Plan,
    Progress,
    _public,
    c_constant,
    make_plan,
)
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.dp_ebm import fit_classifier, fit_regressor, interpret_guard
from service.mechanisms.errors import ReleaseFailed
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.partition import prepare_arrays, random_folds

_FD_STEP = 1e-8  # finite-difference step of the sup search (scipy's L-BFGS-B default)

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
    anchor_interval: dict[str, float] | None = None  # its interval (anchor.anchor_interval)


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
    anchor: float | None = None
    interval: dict[str, float] | None = None
    if state.anchor is not None:
        # proof step 7: the whole-data anchor (the strict single-release ate default on all n rows)
        # first.
        if noise is None:
            raise ValueError("the anchor ATE needs the noise sampler")
        anchor, interval = draw_ate_anchor(
            arrays,
            domain,
            state.anchor,
            rng=rng,
            noise=noise,
            progress=lambda fraction, stage: progress(0.3 * fraction, f"anchor: {stage}"),
        )
    x, a, y = prepare_arrays(arrays, domain)
    # proof step 6: uniformly random permutation cut at public sizes (never stored).
    folds = random_folds(rng, domain.n, state.modules, state.fold_sizes)
    feature_map = FeatureMap.draw(domain, params.n_features, params.lengthscale, rng)
    progress(0.32, "partition")

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
    return VectorFit(estimates, theta, phi_points, gamma_hat, anchor, interval)


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
                **(
                    {}
                    if fitted.anchor_interval is None
                    else {"ate_anchor_interval": fitted.anchor_interval}
                ),
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
