"""Empirical privacy audit of the one-shot CATE function release (second stage + GP noise).

Setting: the DR second stage of ``cate_function`` (``fit_exact``) with the production noise
scale (``noise_scale``, strict: r0 = Delta sigma_G) on two neighbouring estimation folds: the
same rows and nuisances except one record replaced by an extreme one (a box vertex with the
opposite extreme pseudo-outcome). The release is observed at a fixed set of public points;
at those points it is ``f_D(X_e) + r0 chol(K_ee + tau^2 I) xi`` (the law of the first GP draw;
``tests/unit/test_gp.py`` shows later draws keep the joint law). N releases per dataset are
drawn in one vectorised call.

Test: events ``S_c = {s > c}`` for the likelihood-ratio statistic ``s`` (projection on the
Mahalanobis direction of ``f_D' - f_D``, the most powerful tests) and their mirrors. An
(epsilon, delta)-DP release satisfies ``P_D'(S) <= e^eps P_D(S) + delta``; Clopper–Pearson
bounds give ``eps_lb = log((p_lo - delta) / q_hi)`` and we assert ``eps_lb <= eps``.

False-failure rate: family-wise 1e-6, Bonferroni-split over events and the two one-sided
bounds. Power: the same audit must reject ``r0`` used as a variance (r0^2, a classic
miscalibration) and a scale computed for a tenth of the sensitivity.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg
from numpy.typing import NDArray
from scipy import stats

from service.mechanisms import cate_function as mech
from service.mechanisms import gp

FAMILY_LEVEL = 1e-6
N = 400_000
EPSILON = 1.0
DELTA = 1e-3
H = 0.15
LAMBDA0 = 2.0
N2 = 40
EVAL = np.linspace(0.0, 1.0, 6)[:, None]


def _neighbours() -> tuple[NDArray[np.float64], NDArray[np.float64], float]:
    """f_D and f_D' at the evaluation points, and the production r0 (Phi_max = 1)."""
    rng = np.random.default_rng(11)
    x = rng.uniform(size=(N2, 1))
    phi = rng.uniform(-1, 1, size=N2)
    x[0, 0], phi[0] = 1.0, -1.0
    x2, phi2 = x.copy(), phi.copy()
    x2[0, 0], phi2[0] = 0.0, 1.0  # the replaced record: the other vertex, the other extreme
    ones = np.ones(N2)
    f = [
        gp.gaussian_kernel(EVAL, xs, H) @ mech.fit_exact(xs, ps, ones, bandwidth=H, lambda0=LAMBDA0)
        for xs, ps in ((x, phi), (x2, phi2))
    ]
    scale = mech.noise_scale(
        mode="strict",
        learner="dr",
        q=1,
        bandwidth=H,
        lambda0=LAMBDA0,
        n2=N2,
        epsilon=EPSILON,
        delta=DELTA,
        outcome_range=0.5,
        propensity_bound=0.5,
    )
    assert scale.target_bound == 1.0
    return f[0], f[1], scale.r0


def _epsilon_lower_bound(r: float, seed: int) -> float:
    f0, f1, _ = _neighbours()
    cov = gp.gaussian_kernel(EVAL, EVAL, H) + gp.DEFAULT_JITTER * np.eye(EVAL.shape[0])
    factor = scipy.linalg.cholesky(cov, lower=True)
    rng = np.random.default_rng(seed)
    direction = scipy.linalg.cho_solve((factor, True), f1 - f0)  # Sigma^{-1} (f1 - f0), unscaled
    norm = math.sqrt(float((f1 - f0) @ direction))
    samples = []
    for mean in (f0, f1):
        y = mean + r * (rng.standard_normal((N, EVAL.shape[0])) @ factor.T)
        samples.append((y - f0) @ direction / (norm * r))  # s ~ N(0,1) on D, N(mu,1) on D'
    mu = norm / r
    thresholds = mu / 2 + np.linspace(-3.0, 3.0, 13)
    events = [(c, 1) for c in thresholds] + [(c, -1) for c in thresholds]
    level = FAMILY_LEVEL / (2 * len(events))
    best = -math.inf
    for c, sign in events:
        hits = [int(np.count_nonzero(sign * (s - c) > 0)) for s in samples]
        # Both directions of the DP inequality (D vs D' and D' vs D).
        for num, den in ((hits[1], hits[0]), (hits[0], hits[1])):
            p_lo = stats.beta.ppf(level, num, N - num + 1) if num > 0 else 0.0
            q_hi = stats.beta.ppf(1 - level, den + 1, N - den) if den < N else 1.0
            if p_lo - DELTA > 0 and q_hi > 0:
                best = max(best, math.log((p_lo - DELTA) / q_hi))
    return best


def test_realised_sensitivity_within_the_bound() -> None:
    f0, f1, r0 = _neighbours()
    cov = gp.gaussian_kernel(EVAL, EVAL, H) + gp.DEFAULT_JITTER * np.eye(EVAL.shape[0])
    mahalanobis = math.sqrt(float((f1 - f0) @ np.linalg.solve(cov, f1 - f0)))
    bound = 2 * (1 + 1 / math.sqrt(LAMBDA0)) / (LAMBDA0 * N2)
    assert mahalanobis <= bound
    assert r0 > 0


def test_production_scale_passes_the_audit() -> None:
    _, _, r0 = _neighbours()
    assert _epsilon_lower_bound(r0, seed=1) <= EPSILON


def test_power_miscalibrated_scales_are_caught() -> None:
    _, _, r0 = _neighbours()
    assert r0 < 1  # so r0^2 < r0: "sd used as a variance" is too little noise
    assert _epsilon_lower_bound(r0 * r0, seed=2) > EPSILON
    assert _epsilon_lower_bound(r0 / 10, seed=3) > EPSILON
