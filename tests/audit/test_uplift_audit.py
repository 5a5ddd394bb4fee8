"""Empirical privacy audit of uplift_table (epsilon-ADUM, pure epsilon-DP, replace-one).

Setting: the production calibration (``plan``'s scales) on two neighbouring datasets that
differ in one record moved across cells and arms with an extreme outcome: in D it sits in
cell 0, control, y = y_lo; in D' in cell 1, treated, y = y_hi. This is a worst case: the count
vector moves by 2 in L1, the centred-sum vector by W and (shrinkage "ate", the default with
two cells) the arms' centred second moments by W^2 / 2. Each run is the exact aggregates of
the real code path (``aggregates``, ``second_moment_sums``) plus one fresh draw of the three
Laplace vectors at the production scales (the anchor and the factor are post-processing).

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


# The regular grid of two cells, and a grid at a public cut point off the box's centre (the
# record moves across the cut): the same sensitivities, so the same calibration (proof step 1).
GRIDS = {
    "bins": up.UpliftParams(epsilon=EPSILON, bins=BINS),
    "cut_points": up.UpliftParams(epsilon=EPSILON, cut_points=((-0.7,),)),
}


def _setting(
    grid: str = "bins",
) -> tuple[NDArray[np.float64], NDArray[np.float64], up.Plan, PublicDomain]:
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
    params = GRIDS[grid]
    state = up.make_plan(dom, params)
    x[0], a[0], y[0] = -0.8, 0.0, -5.0
    c, s = up.grid_aggregates(x, a, y, dom, params)
    q = up.second_moment_sums(a, y, dom)
    x[0], a[0], y[0] = 0.5, 1.0, 5.0
    c2, s2 = up.grid_aggregates(x, a, y, dom, params)
    q2 = up.second_moment_sums(a, y, dom)
    return np.concatenate([c, s, q]), np.concatenate([c2, s2, q2]), state, dom


def _loss(
    z: NDArray[np.float64],
    mu: NDArray[np.float64],
    mu2: NDArray[np.float64],
    scales: NDArray[np.float64],
) -> NDArray[np.float64]:
    return np.asarray(np.sum((np.abs(z - mu2) - np.abs(z - mu)) / scales, axis=1))


def _audit(
    count_scale: float,
    sum_scale: float,
    seed: int,
    second_scale: float | None = None,
    grid: str = "bins",
) -> float:
    """``second_scale`` None: the table alone (the paper's release, without second moments)."""
    mu, mu2, _, _ = _setting(grid)
    cells = 2 * int(np.prod(BINS))
    if second_scale is None:
        mu, mu2 = mu[: 2 * cells], mu2[: 2 * cells]
    sampler = SeededSampler(np.random.default_rng(seed))
    half = cells
    scales = np.concatenate([np.full(half, count_scale), np.full(half, sum_scale)])
    if second_scale is not None:
        scales = np.concatenate([scales, np.full(2, second_scale)])

    def draw(mean: NDArray[np.float64]) -> NDArray[np.float64]:
        counts = sampler.laplace(
            np.tile(mean[:half], N_RUNS), scale=count_scale, sensitivity_l1=2.0
        )
        sums = sampler.laplace(
            np.tile(mean[half : 2 * half], N_RUNS), scale=sum_scale, sensitivity_l1=10.0
        )
        parts = [counts.reshape(N_RUNS, half), sums.reshape(N_RUNS, half)]
        if second_scale is not None:
            second = sampler.laplace(
                np.tile(mean[2 * half :], N_RUNS), scale=second_scale, sensitivity_l1=50.0
            )
            parts.append(second.reshape(N_RUNS, 2))
        return np.hstack(parts)

    loss_d = _loss(draw(mu), mu, mu2, scales)  # likelier to be large under D
    loss_d2 = _loss(draw(mu2), mu, mu2, scales)
    thresholds = [0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.25, 1.5, 1.75, 1.9]
    return epsilon_lower_bound(loss_d2, loss_d, thresholds, 0.0)


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_neighbours_are_worst_case(grid: str) -> None:
    mu, mu2, _, _ = _setting(grid)
    half = 2 * int(np.prod(BINS))
    assert np.abs(mu[:half] - mu2[:half]).sum() == 2.0
    sums = np.abs(mu[half : 2 * half] - mu2[half : 2 * half]).sum()
    assert sums == pytest.approx(10.0, rel=1e-12)
    assert sums <= up.sum_sensitivity(10.0, 200)
    second = np.abs(mu[2 * half :] - mu2[2 * half :]).sum()
    assert second == pytest.approx(50.0, rel=1e-12)  # W^2 / 2: the worst case
    assert second <= up.second_moment_sensitivity(10.0, 200)


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_seeded_audit_of_production_calibration(grid: str) -> None:
    """The default release (shrinkage "ate": counts, sums and second moments) at epsilon, on
    the regular grid and on a grid at a public cut point."""
    _, _, state, _ = _setting(grid)
    assert state.second_moments is not None
    assert state.counts is not None
    assert state.sums is not None
    bound = _audit(
        state.counts.scale,
        state.sums.scale,
        seed=1,
        second_scale=state.second_moments.scale,
        grid=grid,
    )
    assert bound <= EPSILON
    assert bound > 0.8 * EPSILON  # the worst case is attained: the audit is tight here


def test_audit_rejects_the_add_remove_scales() -> None:
    bound = _audit(2.0 / EPSILON, 2.0 * 5.0 / EPSILON, seed=2)
    assert bound > EPSILON
