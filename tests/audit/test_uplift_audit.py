"""Empirical privacy audit of uplift_table (epsilon-ADUM, pure epsilon-DP, replace-one).

Setting: the production calibration (``plan``'s scales) on two neighbouring datasets that
differ in one record moved across cells and arms with an extreme outcome: in D it sits in
cell 0, control, y = y_lo; in D' in cell 1, treated, y = y_hi. This is a worst case: the count
vector moves by 2 in L1 and the centred-sum vector by W. Each run is the exact aggregates of
the real code path (``aggregates``) plus one fresh draw of both Laplace vectors.

Test statistic: the exact privacy-loss variable ``L(z) = log p_D(z) - log p_D'(z) =
sum_i (|z_i - mu'_i| - |z_i - mu_i|) / b_i``, thresholded on a fixed grid. For an epsilon-DP
release ``P_D(L > t) <= e^eps P_D'(L > t)``; Clopper-Pearson bounds give ``eps_lb``, and we
assert ``eps_lb <= eps``.

False-failure rate: family-wise 1e-6 per audit (Bonferroni over events and directions).
Power: the paper's add/remove scales (2 / eps, 2 D_y / eps), which are 2 eps-DP under
replace-one, must be rejected (``eps_lb > eps``) on the same number of seeded runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from service.mechanisms import uplift as up
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.noise import SeededSampler
from tests.audit.test_ate_strict_audit import epsilon_lower_bound

EPSILON = 1.0
N_RUNS = 1_000_000
BINS = (2,)


def _setting() -> tuple[NDArray[np.float64], NDArray[np.float64], up.Plan, PublicDomain]:
    n = 200
    dom = PublicDomain(
        x_lower=np.array([-1.0]),
        x_upper=np.array([1.0]),
        y_lower=-5.0,
        y_upper=5.0,
        n=n,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (n, 1))
    a = (rng.uniform(size=n) < 0.5).astype(float)
    y = rng.uniform(-5, 5, n)
    state = up.make_plan(dom, up.UpliftParams(epsilon=EPSILON, bins=BINS))
    x[0], a[0], y[0] = -0.5, 0.0, -5.0
    c, s = up.aggregates(x, a, y, dom, BINS)
    x[0], a[0], y[0] = 0.5, 1.0, 5.0
    c2, s2 = up.aggregates(x, a, y, dom, BINS)
    return np.concatenate([c, s]), np.concatenate([c2, s2]), state, dom


def _loss(
    z: NDArray[np.float64],
    mu: NDArray[np.float64],
    mu2: NDArray[np.float64],
    scales: NDArray[np.float64],
) -> NDArray[np.float64]:
    return np.asarray(np.sum((np.abs(z - mu2) - np.abs(z - mu)) / scales, axis=1))


def _audit(count_scale: float, sum_scale: float, seed: int) -> float:
    mu, mu2, _, _ = _setting()
    sampler = SeededSampler(np.random.default_rng(seed))
    half = mu.size // 2
    scales = np.concatenate([np.full(half, count_scale), np.full(half, sum_scale)])

    def draw(mean: NDArray[np.float64]) -> NDArray[np.float64]:
        counts = sampler.laplace(
            np.tile(mean[:half], N_RUNS), scale=count_scale, sensitivity_l1=2.0
        )
        sums = sampler.laplace(np.tile(mean[half:], N_RUNS), scale=sum_scale, sensitivity_l1=10.0)
        return np.hstack([counts.reshape(N_RUNS, half), sums.reshape(N_RUNS, half)])

    loss_d = _loss(draw(mu), mu, mu2, scales)  # likelier to be large under D
    loss_d2 = _loss(draw(mu2), mu, mu2, scales)
    thresholds = [0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.25, 1.5, 1.75, 1.9]
    return epsilon_lower_bound(loss_d2, loss_d, thresholds, 0.0)


def test_neighbours_are_worst_case() -> None:
    mu, mu2, _, _ = _setting()
    half = mu.size // 2
    assert np.abs(mu[:half] - mu2[:half]).sum() == 2.0
    assert np.abs(mu[half:] - mu2[half:]).sum() == pytest.approx(10.0, rel=1e-12)
    assert np.abs(mu[half:] - mu2[half:]).sum() <= up.sum_sensitivity(10.0, 200)


def test_seeded_audit_of_production_calibration() -> None:
    _, _, state, _ = _setting()
    bound = _audit(state.counts.scale, state.sums.scale, seed=1)
    assert bound <= EPSILON
    assert bound > 0.8 * EPSILON  # the worst case is attained: the audit is tight here


def test_audit_rejects_the_add_remove_scales() -> None:
    bound = _audit(2.0 / EPSILON, 2.0 * 5.0 / EPSILON, seed=2)
    assert bound > EPSILON
