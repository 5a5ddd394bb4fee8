"""Fast DP nuisance models: DP logistic regression and DP per-arm ridge regression.

What it releases (to the calling mechanism, never to a client):
    * ``DpLogistic``: L2-regularised logistic-regression weights perturbed by Gaussian output
      noise (private_propensity.md §2, §5; Chaudhuri, Monteleoni & Sarwate 2011), ``w_tilde``.
    * ``DpRidge``: per-arm linear outcome models fitted from noisy sufficient statistics
      (sufficient-statistics perturbation): noisy ``sum z z^T`` and ``sum z t`` per arm, solved
      with a public ridge; post-processing only.

Neighbouring relation:
    replace-one inside the fold the model is fitted on, with the fold size m public.

Features:
    a public map of the covariate box into the unit ball: each covariate is scaled to [-1, 1]
    by its public bounds, divided by sqrt(q), and prefixed by a public intercept constant ``c``
    (``z = [c, sqrt(1 - c^2) u]``, so ``||z|| <= 1``). Nothing is derived from the data.

Claims (proof: ``docs/proofs/ate_strict.md`` §10–§11):
    * ``logistic_sensitivity(m, lam, g_tol) = 2 / (m lam) + 2 g_tol / lam`` bounds the
      replace-one L2 change of the released iterate (``fit_logistic``), whichever solver branch
      runs; Gaussian output noise calibrated to it is (epsilon, delta)-DP.
    * ``RIDGE_STAT_SENSITIVITY = sqrt(6)`` bounds the replace-one L2 change of the stacked
      per-arm statistics ``(upper(sum z z^T), sum z t)`` for arm 0 and arm 1 with
      ``t = (y - midpoint) / (R / 2)`` in [-1, 1]; Gaussian noise calibrated to it is
      (epsilon, delta)-DP and the solve is post-processing.

References:
    Chaudhuri, K., Monteleoni, C. and Sarwate, A. D. (2011). Differentially private empirical
    risk minimization. JMLR 12.
    Lee, K., Gresele, L., Park, M. and Muandet, K. (2019). Private causal inference using
    propensity scores. arXiv:1905.12592.
    Wang, Y.-X. (2018). Revisiting differentially private linear regression: optimal and
    adaptive prediction & estimation in unbounded domain. UAI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit

from service.mechanisms.noise import (
    GaussianCalibration,
    NoiseSampler,
    calibrate_gaussian,
    release_gaussian,
)

# Public intercept constant c of the unit-ball feature map.
INTERCEPT = 0.5
# Newton iterations before the gradient-descent fallback (both are certified, see fit_logistic).
_NEWTON_STEPS = 50
# The solver certifies ||grad J|| <= g_tol / 2 (a factor 2 covers the float error of the
# computed gradient norm, far below g_tol at the sizes used; docs/proofs/ate_strict.md §10).
_CERTIFY_FACTOR = 0.5
# Sensitivity of the stacked per-arm ridge statistics (module docstring; proof §11).
RIDGE_STAT_SENSITIVITY = math.sqrt(6.0)


def unit_ball_features(
    x: NDArray[np.float64], x_lower: NDArray[np.float64], x_upper: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Map covariates into the unit ball with public constants only (private_propensity.md §5).

    ``u_j = (2 (x_j - l_j) / (u_j - l_j) - 1) / sqrt(q)`` clipped to [-1/sqrt(q), 1/sqrt(q)],
    ``z = [c, sqrt(1 - c^2) u]``; hence ``||z|| <= 1``.

    Args:
        x: (rows, q) covariates.
        x_lower: public lower bounds (q,).
        x_upper: public upper bounds (q,).

    Returns:
        (rows, q + 1) features with L2 norm at most 1 (up to one ulp; rows are renormalised
        when the float norm exceeds 1).
    """
    lower = np.asarray(x_lower, dtype=np.float64)
    upper = np.asarray(x_upper, dtype=np.float64)
    q = lower.size
    scaled = (2.0 * (np.asarray(x, dtype=np.float64) - lower) / (upper - lower) - 1.0) / math.sqrt(
        q
    )
    bound = 1.0 / math.sqrt(q)
    scaled = np.clip(np.nan_to_num(scaled, nan=0.0), -bound, bound)
    z = np.column_stack(
        [np.full(scaled.shape[0], INTERCEPT), math.sqrt(1.0 - INTERCEPT**2) * scaled]
    )
    norms = np.sqrt(np.einsum("ij,ij->i", z, z))
    over = norms > 1.0
    if np.any(over):  # float rounding only; a public row-wise rule
        z[over] = z[over] / np.nextafter(norms[over], np.inf)[:, None]
    return np.asarray(z, dtype=np.float64)


# ---- DP logistic regression (output perturbation) -------------------------------------------


def default_regularization(m: int) -> float:
    """Public default logistic ridge ``lambda = m^(-1/3)`` (a function of the public fold size).

    Balances the output-perturbation noise ``~ 1 / (m lambda)`` against shrinkage; AIPW is
    doubly robust, so a shrunk propensity costs little when the outcome model is good.
    """
    return float(math.pow(m, -1.0 / 3.0))


def default_ridge_regularization(m: int, d: int, noise_sigma: float) -> float:
    """Public default eigenvalue floor of the ridge solve: ``min(m^(-1/2), sqrt(d) sigma / m)``.

    ``sigma`` is the public sd of the Gaussian noise on each entry of the sufficient statistics
    (a function of epsilon, delta and the public sensitivity only), so ``sigma / m`` is the
    noise sd of one entry of the noisy ``Gram / m`` and ``sqrt(d) sigma / m`` the order of the
    noise matrix's spectral norm. Where that is below ``m^(-1/2)`` (the former default) the
    floor follows the noise and vanishes as ``m epsilon`` grows, so the outcome model is
    asymptotically unshrunk (``m^(-1/2)`` shrank it by 10-30 % at m = 5000 and biased the AIPW
    product term at large ``n epsilon``); where the noise dominates it stays ``m^(-1/2)``
    (a larger floor biased Dataset 2 at n = 3000, epsilon = 0.5: bench/README.md, issue 3).
    All inputs are public: the rule reads no data.
    """
    if m < 1 or d < 1 or not (noise_sigma > 0.0 and math.isfinite(noise_sigma)):
        raise ValueError("m and d must be positive and noise_sigma positive and finite")
    return min(1.0 / math.sqrt(m), math.sqrt(d) * noise_sigma / m)


def gradient_tolerance(m: int) -> float:
    """The public gradient tolerance ``g_tol = 1e-3 / m`` (private_propensity.md §5 step 3)."""
    return 1e-3 / m


def logistic_sensitivity(m: int, regularization: float) -> float:
    """Replace-one L2 sensitivity of ``fit_logistic``: ``2 / (m lam) + 2 g_tol / lam``."""
    return (2.0 / m + 2.0 * gradient_tolerance(m)) / regularization


def _logistic_objective(
    w: NDArray[np.float64], z: NDArray[np.float64], t: NDArray[np.float64], lam: float, m: int
) -> tuple[float, NDArray[np.float64], NDArray[np.float64]]:
    margin = z @ w
    # log(1 + exp(-s m)) with s = 2t - 1, stable
    signed = (2.0 * t - 1.0) * margin
    loss = float(np.sum(np.logaddexp(0.0, -signed))) / m + 0.5 * lam * float(w @ w)
    p = expit(margin)
    gradient = z.T @ (p - t) / m + lam * w
    return loss, np.asarray(gradient, dtype=np.float64), np.asarray(p, dtype=np.float64)


def fit_logistic(
    z: NDArray[np.float64], t: NDArray[np.float64], *, regularization: float
) -> NDArray[np.float64]:
    """Minimise ``J(w) = (1/m) sum logloss(w; z_i, t_i) + lam/2 ||w||^2`` to a certified point.

    Damped Newton from 0 until ``||grad J|| <= g_tol / 2``; if that is not reached in
    ``_NEWTON_STEPS`` steps, full-batch gradient descent from 0 with step ``1 / (lam + 1/4)``
    for a public number of steps ``T`` with ``(1 - eta lam)^T <= g_tol`` (so
    ``||w_T - w_hat|| <= g_tol / lam`` since ``||w_hat|| <= 1 / lam``). Either way the output
    is within ``g_tol / lam`` of the exact minimiser; there is no failure path.

    Args:
        z: (m, d) features with ``||z_i|| <= 1``.
        t: (m,) labels in {0, 1}.
        regularization: lam > 0.

    Returns:
        The weights (never released without noise).
    """
    m, d = z.shape
    lam = regularization
    tolerance = gradient_tolerance(m) * _CERTIFY_FACTOR
    w = np.zeros(d, dtype=np.float64)
    for _ in range(_NEWTON_STEPS):
        loss, gradient, p = _logistic_objective(w, z, t, lam, m)
        if float(np.linalg.norm(gradient)) <= tolerance:
            return w
        weights = p * (1.0 - p)
        hessian = (z.T * weights) @ z / m + lam * np.eye(d)
        step = np.linalg.solve(hessian, gradient)
        scale = 1.0
        for _ in range(40):  # Armijo backtracking
            candidate = w - scale * step
            candidate_loss, _, _ = _logistic_objective(candidate, z, t, lam, m)
            if candidate_loss <= loss - 1e-4 * scale * float(gradient @ step):
                break
            scale *= 0.5
        w = candidate
    _, gradient, _ = _logistic_objective(w, z, t, lam, m)
    if float(np.linalg.norm(gradient)) <= tolerance:
        return w
    # Certified fallback (proof §10): contraction of gradient descent.
    eta = 1.0 / (lam + 0.25)
    steps = math.ceil(math.log(gradient_tolerance(m)) / math.log1p(-eta * lam))
    w = np.zeros(d, dtype=np.float64)
    for _ in range(steps):
        _, gradient, _ = _logistic_objective(w, z, t, lam, m)
        w = w - eta * gradient
    return w


@dataclass(frozen=True)
class DpLogistic:
    """Public calibration of one DP logistic-regression release (output perturbation)."""

    m: int
    regularization: float
    sensitivity_l2: float
    calibration: GaussianCalibration

    @classmethod
    def plan(
        cls, m: int, dim: int, epsilon: float, delta: float, regularization: float
    ) -> DpLogistic:
        sensitivity = logistic_sensitivity(m, regularization)
        return cls(
            m, regularization, sensitivity, calibrate_gaussian(epsilon, delta, sensitivity, dim=dim)
        )

    def release(
        self, z: NDArray[np.float64], t: NDArray[np.float64], noise: NoiseSampler
    ) -> NDArray[np.float64]:
        """Fit and perturb: ``w_tilde = w + N(0, sigma^2 I)`` (lattice Gaussian)."""
        if z.shape[0] < self.m:  # a larger fold only lowers the sensitivity (proof §10-§11)
            raise ValueError("fold smaller than planned")
        w = fit_logistic(z, t, regularization=self.regularization)
        return release_gaussian(w, self.calibration, noise)


def predict_propensity(w_tilde: NDArray[np.float64], z: NDArray[np.float64]) -> NDArray[np.float64]:
    """``sigmoid(w_tilde . z)`` (post-processing of the released weights)."""
    return np.asarray(expit(z @ w_tilde), dtype=np.float64)


# ---- DP per-arm ridge regression (sufficient-statistics perturbation) -----------------------


def ridge_statistics(
    z: NDArray[np.float64], a: NDArray[np.float64], t: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Stacked per-arm statistics ``(upper(sum z z^T), sum z t)`` for arm 0 then arm 1.

    Each record contributes to its own arm only, with ``||upper(z z^T)||_2 <= ||z||^2 <= 1``
    and ``||z t|| <= 1``. NEVER release without noise.
    """
    d = z.shape[1]
    rows, cols = np.triu_indices(d)
    parts: list[NDArray[np.float64]] = []
    for arm in (0.0, 1.0):
        mask = a == arm
        za, ta = z[mask], t[mask]
        gram = za.T @ za
        parts.append(gram[rows, cols])
        parts.append(za.T @ ta)
    return np.asarray(np.concatenate(parts), dtype=np.float64)


def ridge_dim(d: int) -> int:
    """Length of ``ridge_statistics`` for d features."""
    return 2 * (d * (d + 1) // 2 + d)


def solve_ridge(
    statistics: NDArray[np.float64], d: int, m: int, regularization: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per-arm weights from noisy statistics (post-processing).

    ``w_a = (sym(G_a) / m + lam I)^+ b_a / m`` where the symmetric matrix's eigenvalues are
    floored at ``lam`` so the solve is always defined.
    """
    rows, cols = np.triu_indices(d)
    size = d * (d + 1) // 2
    weights: list[NDArray[np.float64]] = []
    offset = 0
    for _ in range(2):
        upper = statistics[offset : offset + size]
        vector = statistics[offset + size : offset + size + d]
        offset += size + d
        gram = np.zeros((d, d), dtype=np.float64)
        gram[rows, cols] = upper
        gram = gram + np.triu(gram, 1).T
        values, vectors = np.linalg.eigh(gram / m)
        values = np.maximum(values + regularization, regularization)
        weights.append(vectors @ ((vectors.T @ (vector / m)) / values))
    return weights[0], weights[1]


@dataclass(frozen=True)
class DpRidge:
    """Public calibration of the DP per-arm ridge release (sufficient statistics)."""

    m: int
    d: int
    regularization: float
    calibration: GaussianCalibration

    @classmethod
    def plan(
        cls, m: int, d: int, epsilon: float, delta: float, regularization: float | None = None
    ) -> DpRidge:
        """Calibrate the statistics' noise; ``regularization=None`` uses the public default
        ``default_ridge_regularization(m, d, sigma)`` (public m, d, epsilon, delta only)."""
        calibration = calibrate_gaussian(epsilon, delta, RIDGE_STAT_SENSITIVITY, dim=ridge_dim(d))
        lam = (
            default_ridge_regularization(m, d, calibration.sigma)
            if regularization is None
            else regularization
        )
        return cls(m, d, lam, calibration)

    def release(
        self,
        z: NDArray[np.float64],
        a: NDArray[np.float64],
        y: NDArray[np.float64],
        *,
        y_lower: float,
        y_upper: float,
        noise: NoiseSampler,
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Noisy statistics, then per-arm weights on the scaled target ``t`` in [-1, 1]."""
        if z.shape[0] < self.m:  # a larger fold only lowers the sensitivity (proof §10-§11)
            raise ValueError("fold smaller than planned")
        midpoint = (y_lower + y_upper) / 2.0
        half_range = (y_upper - y_lower) / 2.0
        t = np.clip((y - midpoint) / half_range, -1.0, 1.0)
        noisy = release_gaussian(ridge_statistics(z, a, t), self.calibration, noise)
        return solve_ridge(noisy, self.d, self.m, self.regularization)


def predict_outcome(
    weights: NDArray[np.float64], z: NDArray[np.float64], *, y_lower: float, y_upper: float
) -> NDArray[np.float64]:
    """Clipped prediction ``midpoint + (R/2) w . z`` in [y_lower, y_upper] (post-processing)."""
    midpoint = (y_lower + y_upper) / 2.0
    half_range = (y_upper - y_lower) / 2.0
    raw = midpoint + half_range * (z @ weights)
    return np.asarray(np.clip(np.nan_to_num(raw, nan=midpoint), y_lower, y_upper), np.float64)
