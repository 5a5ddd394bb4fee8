"""Empirical privacy audit of the strict private-propensity IPW (``ate_ipw``).

Channels (production calibration from ``plan``'s record, statistics from the real code):

* estimation mean: neighbours differ in one estimation-fold record whose trimmed HT term is
  -B in D and +B in D' (a = 1, pi = xi, centred y = -C_y vs +C_y), so the mean moves by the
  full 2B / n2 (``ipw_terms`` -> ``d2_statistics``);
* propensity weights: neighbours differ in one fit-fold record (a box corner with flipped
  treatment); the released ``w_tilde`` is projected on the unit direction of the change of
  the fitted weights (a post-processing), where the isotropic Gaussian is one-dimensional.

Test: Clopper–Pearson lower bounds on epsilon over fixed threshold events (helper of
``test_ate_strict_audit``), <= the channel's charged epsilon. False-failure rate 1e-6 per
audit. Power: the mean channel must reject sigma computed for half the sensitivity (the
add/remove calibration C_y / (n xi)), finding eps_lb above the total epsilon.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.mechanisms import dp_linear
from service.mechanisms.ate_ipw import AteIpwParams, hajek_statistics, ipw_terms, plan
from service.mechanisms.ate_strict import d2_statistics
from service.mechanisms.domain import PublicDomain
from service.mechanisms.noise import SeededSampler, calibrate_gaussian
from tests.audit.test_ate_strict_audit import epsilon_lower_bound

N_SEEDED = 2_000_000
EPSILON, DELTA = 2.0, 1e-5
N = 800  # folds 400 / 400
TRIM = 0.1
Y_LOWER, Y_UPPER = 0.0, 1.0


def _domain() -> PublicDomain:
    return PublicDomain(
        x_lower=-np.ones(2), x_upper=np.ones(2), y_lower=Y_LOWER, y_upper=Y_UPPER, n=N
    )


def _gaussian_audit(value: float, neighbour: float, sigma: float, delta: float, seed: int) -> float:
    low, high = sorted((value, neighbour))
    sampler = SeededSampler(np.random.default_rng(seed))
    sample = sampler.gaussian(np.full(N_SEEDED, low), sigma=sigma, sensitivity_l2=high - low)
    sample_neighbour = sampler.gaussian(
        np.full(N_SEEDED, high), sigma=sigma, sensitivity_l2=high - low
    )
    thresholds = [(low + high) / 2] + [low + k * sigma for k in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0)]
    return epsilon_lower_bound(sample, sample_neighbour, thresholds, delta)


def _mean_channel() -> tuple[float, float, float, float, float]:
    record = plan(_domain(), AteIpwParams(epsilon=EPSILON, delta=DELTA, trim=TRIM))
    _, mean, _ = record.events
    bound = float(mean.params["bound"])
    n2 = record.fold_sizes["estimation"]
    rng = np.random.default_rng(3)
    a = (rng.uniform(size=n2) < 0.5).astype(np.float64)
    y = rng.uniform(Y_LOWER, Y_UPPER, n2) - 0.5
    pi = rng.uniform(0.2, 0.8, n2)
    values = []
    for centred in (-0.5, 0.5):
        a[0], y[0], pi[0] = 1.0, centred, TRIM
        values.append(d2_statistics(ipw_terms(a, y, pi, bound=bound), bound=bound)[0])
    assert abs(values[1] - values[0]) == pytest.approx(2 * bound / n2, rel=1e-12)
    return (
        values[0],
        values[1],
        float(mean.params["sigma"]),
        float(mean.params["sensitivity_l2"]),
        mean.epsilon,
    )


def test_mean_channel_audit_and_power() -> None:
    value, neighbour, sigma, sensitivity, charged = _mean_channel()
    record = plan(_domain(), AteIpwParams(epsilon=EPSILON, delta=DELTA, trim=TRIM))
    delta = record.events[1].delta
    assert _gaussian_audit(value, neighbour, sigma, delta, seed=1) <= charged
    half = calibrate_gaussian(charged, delta, sensitivity / 2).sigma
    assert _gaussian_audit(value, neighbour, half, delta, seed=2) > EPSILON


def test_propensity_weights_channel_audit() -> None:
    record = plan(_domain(), AteIpwParams(epsilon=EPSILON, delta=DELTA, trim=TRIM))
    event = record.events[0]
    m, lam = int(event.params["fit_size"]), float(event.params["regularization"])
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, size=(m, 2))
    z = dp_linear.unit_ball_features(x, -np.ones(2), np.ones(2))
    t = (rng.uniform(size=m) < 1 / (1 + np.exp(-2 * x[:, 0]))).astype(np.float64)
    w = dp_linear.fit_logistic(z, t, regularization=lam)
    z2, t2 = z.copy(), t.copy()
    z2[0] = dp_linear.unit_ball_features(np.array([[1.0, 1.0]]), -np.ones(2), np.ones(2))[0]
    t2[0] = 1.0 - t[0]
    w2 = dp_linear.fit_logistic(z2, t2, regularization=lam)
    change = w2 - w
    assert np.linalg.norm(change) <= float(event.params["sensitivity_l2"])
    direction = change / np.linalg.norm(change)
    bound = _gaussian_audit(
        float(direction @ w), float(direction @ w2), float(event.params["sigma"]), DELTA, seed=5
    )
    assert bound <= event.epsilon


def test_hajek_sums_channel_audit_and_power() -> None:
    """Hajek arm sums (proof §7): one estimation row moves the 4-vector; project on the change.

    Neighbours: the row is treated at pi = xi with scaled outcome -1 in D and +1 in D' (the
    largest same-arm move, 2 / (xi n2) of the sqrt(5) / (xi n2) bound). The projection of the
    released vector on the unit change direction is a 1-D Gaussian (post-processing).
    """
    params = AteIpwParams(epsilon=EPSILON, delta=DELTA, trim=TRIM, normalization="hajek")
    record = plan(_domain(), params)
    _, sums_event, _ = record.events
    assert sums_event.params["statistic"] == "hajek_arm_sums"
    n2 = record.fold_sizes["estimation"]
    rng = np.random.default_rng(6)
    a = (rng.uniform(size=n2) < 0.5).astype(np.float64)
    y = rng.uniform(-1.0, 1.0, n2)
    pi = rng.uniform(0.2, 0.8, n2)
    vectors = []
    for scaled in (-1.0, 1.0):
        a[0], y[0], pi[0] = 1.0, scaled, TRIM
        vectors.append(hajek_statistics(a, y, pi, trim=TRIM)[0])
    change = vectors[1] - vectors[0]
    assert np.linalg.norm(change) == pytest.approx(2 / (TRIM * n2), rel=1e-12)
    assert np.linalg.norm(change) <= float(sums_event.params["sensitivity_l2"])
    direction = change / np.linalg.norm(change)
    value, neighbour = float(direction @ vectors[0]), float(direction @ vectors[1])
    sigma = float(sums_event.params["sigma"])
    assert _gaussian_audit(value, neighbour, sigma, sums_event.delta, seed=7) <= sums_event.epsilon
    # power: noise calibrated for half the actual change is caught above the total epsilon
    half = calibrate_gaussian(sums_event.epsilon, sums_event.delta, (neighbour - value) / 2).sigma
    assert _gaussian_audit(value, neighbour, half, sums_event.delta, seed=8) > EPSILON
