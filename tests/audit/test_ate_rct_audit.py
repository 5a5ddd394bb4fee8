"""Empirical privacy audit of the RCT difference in means (``ate_rct``, Laplace channels).

Setting: two neighbouring RCT datasets that differ in one treated record, whose outcome is
y_lo in D and y_hi in D' (same arm): the centred arm sum S_1 moves by R = 2 D_y, the full
replace-one L1 sensitivity of the (S_0, S_1) release; likewise the sum of squares Q_1 moves
by D_y^2 (y at the midpoint vs at a bound). The statistics are computed by the real code path
(``arm_statistics``); each run adds a fresh Laplace draw with the production scale of
``plan``'s record. S_0 and Q_0 do not move, so the coordinate's loss is the vector's.

Test: Clopper–Pearson lower bounds on epsilon over a fixed grid of threshold events (the
helper of ``test_ate_strict_audit``), asserted <= the channel's charged epsilon (delta = 0).

False-failure rate: family-wise 1e-6 per audit (Bonferroni over events and directions).

Power: the same audit must reject a Laplace scale computed for half the sensitivity (the
add/remove scale, i.e. the paper's Lap(2 D_y / eps) per share), finding eps_lb > the share.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.ate_rct import AteRctParams, arm_statistics, plan
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.noise import OpenDPSampler, SeededSampler
from tests.audit.test_ate_strict_audit import epsilon_lower_bound

N_SEEDED = 2_000_000
N_OPENDP = 100_000
EPSILON = 1.0
N = 400
Y_LOWER, Y_UPPER = -1.0, 3.0


def _setting() -> tuple[PublicDomain, NDArray[np.float64], NDArray[np.float64]]:
    domain = PublicDomain(
        x_lower=np.zeros(1),
        x_upper=np.ones(1),
        y_lower=Y_LOWER,
        y_upper=Y_UPPER,
        n=N,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )
    rng = np.random.default_rng(7)
    a = (rng.uniform(size=N) < 0.5).astype(np.float64)
    a[0] = 1.0
    y = rng.uniform(Y_LOWER, Y_UPPER, N)
    return domain, a, y


def _statistics(a: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.float64]:
    midpoint, half_range = (Y_LOWER + Y_UPPER) / 2, (Y_UPPER - Y_LOWER) / 2
    return arm_statistics(a, y, midpoint=midpoint, half_range=half_range)


def _audit(
    value: float,
    value_neighbour: float,
    scale: float,
    sensitivity: float,
    sampler: SeededSampler | OpenDPSampler,
    n: int,
) -> float:
    if value_neighbour < value:
        value, value_neighbour = -value, -value_neighbour
        sign = -1.0
    else:
        sign = 1.0
    sample = sign * sampler.laplace(
        np.full(n, sign * value), scale=scale, sensitivity_l1=sensitivity
    )
    sample_neighbour = sign * sampler.laplace(
        np.full(n, sign * value_neighbour), scale=scale, sensitivity_l1=sensitivity
    )
    thresholds = [(value + value_neighbour) / 2] + [
        value + k * scale for k in (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
    ]
    return epsilon_lower_bound(sample, sample_neighbour, thresholds, 0.0)


def _channels() -> list[tuple[float, float, float, float, float]]:
    """(value, neighbour value, scale, sensitivity, charged epsilon) for S_1 and Q_1."""
    domain, a, y = _setting()
    record = plan(domain, AteRctParams(epsilon=EPSILON))
    _, sums, squares = record.events
    y_low, y_high, y_mid = y.copy(), y.copy(), y.copy()
    y_low[0], y_high[0], y_mid[0] = Y_LOWER, Y_UPPER, (Y_LOWER + Y_UPPER) / 2
    low, high, mid = _statistics(a, y_low), _statistics(a, y_high), _statistics(a, y_mid)
    out = []
    for event, first, second, index in ((sums, low, high, 3), (squares, mid, high, 5)):
        out.append(
            (
                float(first[index]),
                float(second[index]),
                float(event.params["scale"]),
                float(event.params["sensitivity_l1"]),
                event.epsilon,
            )
        )
    return out


def test_neighbours_are_extreme() -> None:
    (s_low, s_high, _, s_sens, _), (q_mid, q_high, _, q_sens, _) = _channels()
    assert abs(s_high - s_low) == (Y_UPPER - Y_LOWER)
    assert abs(s_high - s_low) <= s_sens
    assert abs(q_high - q_mid) == ((Y_UPPER - Y_LOWER) / 2) ** 2
    assert abs(q_high - q_mid) <= q_sens


def test_seeded_audit_of_production_calibration() -> None:
    sampler = SeededSampler(np.random.default_rng(11))
    for value, neighbour, scale, sensitivity, charged in _channels():
        bound = _audit(value, neighbour, scale, sensitivity, sampler, N_SEEDED)
        assert bound <= charged, (bound, charged)


def test_opendp_sampler_audit() -> None:
    value, neighbour, scale, sensitivity, charged = _channels()[0]
    bound = _audit(value, neighbour, scale, sensitivity, OpenDPSampler(), N_OPENDP)
    assert bound <= charged


def test_audit_rejects_the_add_remove_scale() -> None:
    value, neighbour, scale, sensitivity, charged = _channels()[0]
    sampler = SeededSampler(np.random.default_rng(12))
    bound = _audit(value, neighbour, scale / 2, sensitivity, sampler, N_SEEDED)
    assert bound > charged
    assert math.isfinite(bound)
