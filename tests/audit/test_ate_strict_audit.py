"""Empirical privacy audit of the strict ATE's estimation (D_2) release stage.

Setting: the D_2 stage of ``ate_strict`` with the production calibration (the sigmas of
``plan``'s record), on two neighbouring datasets: the same D_2 and nuisances, except that one
record is replaced by an extreme one (a box vertex that moves Gamma from -B to +B for the mean
channel, from 0 to B for the second-moment channel). Each run is the deterministic statistic of
the real code path (``pseudo_outcomes`` -> ``d2_statistics``) plus a fresh noise draw; N runs
per dataset are drawn in one vectorised sampler call.

Test: for a fixed grid of threshold events S (and their mirror images), an (epsilon, delta)-DP
release must satisfy ``P_D'(S) <= e^eps P_D(S) + delta``. Clopper–Pearson bounds give
``eps_lb = log((p_lo - delta) / q_hi)``; we assert ``eps_lb <= eps`` for each channel's share.

False-failure rate: each audit (one channel, one sampler) uses a family-wise level of 1e-6,
Bonferroni-split over its events and the two one-sided bounds per event, so a correct
implementation fails an audit with probability at most 1e-6.

Power: the same audit, on the same seeded draws, must REJECT two classic miscalibrations —
sigma computed for half the sensitivity, and sigma used as a variance — by finding
``eps_lb > eps`` (the *total* epsilon of the release, a stronger statement than the share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from service.mechanisms.ate_strict import AteStrictParams, d2_statistics, plan, pseudo_outcomes
from service.mechanisms.domain import PublicDomain
from service.mechanisms.noise import OpenDPSampler, SeededSampler, calibrate_gaussian
from service.mechanisms.records import NoiseEvent

FAMILY_LEVEL = 1e-6
N_SEEDED = 4_000_000
N_OPENDP = 200_000
EPSILON = 4.0
DELTA = 1e-5
Y_LOWER, Y_UPPER, CLIP = 0.0, 1.0, 0.1
N_TOTAL = 800  # folds 200 / 200 / 400


@dataclass(frozen=True)
class Channel:
    """One released statistic: its values on D and D', and its production noise event."""

    value: float
    value_neighbour: float
    event: NoiseEvent

    @property
    def sigma(self) -> float:
        return float(self.event.params["sigma"])

    @property
    def sensitivity_l2(self) -> float:
        return float(self.event.params["sensitivity_l2"])


def _setting() -> tuple[Channel, Channel, float]:
    domain = PublicDomain(
        x_lower=np.zeros(1), x_upper=np.ones(1), y_lower=Y_LOWER, y_upper=Y_UPPER, n=N_TOTAL
    )
    record = plan(domain, AteStrictParams(epsilon=EPSILON, delta=DELTA, propensity_clip=CLIP))
    mean_event, second_event = record.events[-2], record.events[-1]
    bound = float(mean_event.params["bound"])
    n2 = record.fold_sizes["estimation"]
    rng = np.random.default_rng(20240611)
    a = (rng.uniform(size=n2) < 0.5).astype(np.float64)
    y = rng.uniform(Y_LOWER, Y_UPPER, n2)
    pi = rng.uniform(0.3, 0.7, n2)
    mu0 = rng.uniform(Y_LOWER, Y_UPPER, n2)
    mu1 = rng.uniform(Y_LOWER, Y_UPPER, n2)

    def statistics(row: tuple[float, float, float, float, float]) -> tuple[float, float]:
        arrays = [arr.copy() for arr in (a, y, pi, mu0, mu1)]
        for array, value in zip(arrays, row, strict=True):
            array[0] = value
        gamma = pseudo_outcomes(*arrays, bound=bound)
        return d2_statistics(gamma, bound=bound)

    # Box vertices (a, y, pi_hat, mu0_hat, mu1_hat) with Gamma = -B, +B and 0.
    low_row = (1.0, Y_LOWER, CLIP, Y_UPPER, Y_UPPER)  # Gamma = -R / c
    high_row = (1.0, Y_UPPER, CLIP, Y_LOWER, Y_LOWER)  # Gamma = +R / c
    zero_row = (1.0, Y_UPPER, CLIP, Y_UPPER, Y_UPPER)  # Gamma = 0
    theta_low, _ = statistics(low_row)
    theta_high, m2_high = statistics(high_row)
    _, m2_zero = statistics(zero_row)
    mean = Channel(theta_low, theta_high, mean_event)
    second = Channel(m2_zero, m2_high, second_event)
    return mean, second, bound


def epsilon_lower_bound(
    sample: NDArray[np.float64],
    sample_neighbour: NDArray[np.float64],
    thresholds: list[float],
    delta: float,
) -> float:
    """Largest Clopper–Pearson lower bound on epsilon over threshold events and directions."""
    n = sample.size
    tests = 2 * len(thresholds)
    level = FAMILY_LEVEL / (2 * tests)  # two one-sided bounds per event
    best = -math.inf
    for threshold in thresholds:
        for in_event, in_event_neighbour in (
            (sample > threshold, sample_neighbour > threshold),
            (sample_neighbour < threshold, sample < threshold),
        ):
            count = int(np.count_nonzero(in_event))  # the rarer side (q)
            count_neighbour = int(np.count_nonzero(in_event_neighbour))  # the likelier (p)
            if count_neighbour == 0:
                continue
            p_low = float(stats.beta.ppf(level, count_neighbour, n - count_neighbour + 1))
            q_high = float(stats.beta.ppf(1 - level, count + 1, n - count)) if count < n else 1.0
            if p_low > delta:
                best = max(best, math.log((p_low - delta) / q_high))
    return best


def _thresholds(channel: Channel) -> list[float]:
    """A fixed grid: the midpoint and 1 to 4 production sigmas above the smaller mean."""
    low, high = sorted((channel.value, channel.value_neighbour))
    return [(low + high) / 2] + [low + k * channel.sigma for k in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0)]


def _audit(channel: Channel, sigma: float, sampler: SeededSampler | OpenDPSampler, n: int) -> float:
    sample = sampler.gaussian(
        np.full(n, channel.value), sigma=sigma, sensitivity_l2=channel.sensitivity_l2
    )
    sample_neighbour = sampler.gaussian(
        np.full(n, channel.value_neighbour), sigma=sigma, sensitivity_l2=channel.sensitivity_l2
    )
    # orient so that the neighbour is the larger mean (events "above the threshold")
    if channel.value_neighbour < channel.value:
        sample, sample_neighbour = -sample, -sample_neighbour
        channel = Channel(-channel.value, -channel.value_neighbour, channel.event)
    return epsilon_lower_bound(sample, sample_neighbour, _thresholds(channel), channel.event.delta)


def test_neighbours_are_extreme() -> None:
    mean, second, bound = _setting()
    n2 = N_TOTAL // 2
    assert abs(mean.value_neighbour - mean.value) == pytest.approx(2 * bound / n2, rel=1e-12)
    assert abs(second.value_neighbour - second.value) == pytest.approx(bound**2 / n2, rel=1e-12)


def test_seeded_audit_of_production_calibration() -> None:
    mean, second, _ = _setting()
    sampler = SeededSampler(np.random.default_rng(1))
    for channel in (mean, second):
        bound = _audit(channel, channel.sigma, sampler, N_SEEDED)
        assert bound <= channel.event.epsilon, (channel.event.params["statistic"], bound)


def test_opendp_sampler_audit() -> None:
    """The production sampler (unseeded CSPRNG) on fewer runs; false-failure rate 1e-6."""
    mean, _, _ = _setting()
    bound = _audit(mean, mean.sigma, OpenDPSampler(), N_OPENDP)
    assert bound <= mean.event.epsilon


def test_audit_rejects_miscalibrated_implementations() -> None:
    mean, _, _ = _setting()
    sampler = SeededSampler(np.random.default_rng(2))
    half_sensitivity = calibrate_gaussian(
        mean.event.epsilon, mean.event.delta, mean.sensitivity_l2 / 2
    ).sigma
    assert _audit(mean, half_sensitivity, sampler, N_SEEDED) > EPSILON
    sigma_as_variance = mean.sigma**2  # sd = sigma^2 (sigma < 1 here, so less noise)
    assert mean.sigma < 1
    assert _audit(mean, sigma_as_variance, sampler, N_SEEDED) > EPSILON
