"""Empirical audit of the strict ATE's charged adaptive clipping (docs/proofs/ate_strict.md §13).

Three checks, each of which a wrong implementation fails:

1. **The quantile channel** (OpenDP's ``make_private_quantile`` under replace-one with public n,
   through ``OpenDPSampler.quantile``): on two neighbouring vectors whose replaced value moves
   from the bottom to the top of the public grid, Clopper–Pearson bounds on threshold events
   give ``eps_lb <= epsilon`` (family-wise false-failure rate 1e-6); the same audit rejects a
   quantile whose scale is half the calibrated one (the add/remove scale used for replace-one).
2. **End to end through ``ate_strict.run``**: a recording sampler (production OpenDP underneath)
   sees exactly one quantile draw at the planned epsilon and level, then two Gaussian draws whose
   sigma is the calibration at the released clip K (``2K / n2`` and ``K^2 / n2`` plus slack), with
   the planned (epsilon, delta); so halving any of these scales in the code turns this red.
3. **The mean channel at the released K** with worst-case neighbours (Gamma from -K to +K, the
   full sensitivity): the Gaussian audit of ``test_ate_strict_audit`` at the recorded sigma
   passes, and at half that sigma it is rejected.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from service.mechanisms import ate_strict
from service.mechanisms.ate_strict import AteStrictParams
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.noise import OpenDPSampler, SeededSampler, calibrate_gaussian
from tests.audit.test_ate_strict_audit import epsilon_lower_bound

FAMILY_LEVEL = 1e-6
QUANTILE_EPSILON = 2.0
QUANTILE_RUNS = 10_000
GRID = np.geomspace(0.1, 100.0, 40)
QUANTILE_N = 40


def _quantile_draws(
    sampler: Any, values: NDArray[np.float64], epsilon: float
) -> NDArray[np.float64]:
    return np.array(
        [
            sampler.quantile(values, candidates=GRID, level=0.9, epsilon=epsilon)
            for _ in range(QUANTILE_RUNS)
        ]
    )


def _clopper_pearson(count: int, n: int, level: float) -> tuple[float, float]:
    low = float(stats.beta.ppf(level, count, n - count + 1)) if count > 0 else 0.0
    high = float(stats.beta.ppf(1 - level, count + 1, n - count)) if count < n else 1.0
    return low, high


def _quantile_epsilon_lower_bound(
    sample: NDArray[np.float64], neighbour: NDArray[np.float64]
) -> float:
    """Largest CP lower bound on log P(S) / P'(S) over events {<= c}, {> c}, both directions."""
    n = sample.size
    events = 2 * 2 * (GRID.size - 1)
    level = FAMILY_LEVEL / (2 * events)
    best = 0.0
    for threshold in GRID[:-1]:
        for first, second in ((sample, neighbour), (neighbour, sample)):
            for below in (True, False):
                p = int(np.count_nonzero(first <= threshold if below else first > threshold))
                q = int(np.count_nonzero(second <= threshold if below else second > threshold))
                p_low, _ = _clopper_pearson(p, n, level)
                _, q_high = _clopper_pearson(q, n, level)
                if p_low > 0.0:
                    best = max(best, math.log(p_low / q_high))
    return best


def _neighbouring_vectors() -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    values = np.full(QUANTILE_N, 1.0)
    neighbour = values.copy()
    neighbour[0] = GRID[-1]  # one record moved from the bulk to the top of the grid
    return values, neighbour


class _HalfScaleQuantile:
    """A miscalibrated quantile: OpenDP at twice the epsilon it claims (half the scale)."""

    def quantile(self, values: NDArray[np.float64], **kwargs: Any) -> float:
        kwargs["epsilon"] = 2.0 * kwargs["epsilon"]
        return OpenDPSampler().quantile(values, **kwargs)


def test_quantile_channel_audit_and_power() -> None:
    values, neighbour = _neighbouring_vectors()
    sampler = OpenDPSampler()
    bound = _quantile_epsilon_lower_bound(
        _quantile_draws(sampler, values, QUANTILE_EPSILON),
        _quantile_draws(sampler, neighbour, QUANTILE_EPSILON),
    )
    assert 0.0 < bound <= QUANTILE_EPSILON, bound
    wrong = _HalfScaleQuantile()
    bound_wrong = _quantile_epsilon_lower_bound(
        _quantile_draws(wrong, values, QUANTILE_EPSILON),
        _quantile_draws(wrong, neighbour, QUANTILE_EPSILON),
    )
    assert bound_wrong > QUANTILE_EPSILON, bound_wrong


class RecordingSampler:
    """Production sampler that records every draw's public arguments."""

    def __init__(self) -> None:
        self.inner = OpenDPSampler()
        self.calls: list[tuple[str, dict[str, float]]] = []

    def gaussian(
        self, values: NDArray[np.float64], *, sigma: float, sensitivity_l2: float
    ) -> NDArray[np.float64]:
        self.calls.append(("gaussian", {"sigma": sigma, "sensitivity": sensitivity_l2}))
        return self.inner.gaussian(values, sigma=sigma, sensitivity_l2=sensitivity_l2)

    def laplace(
        self, values: NDArray[np.float64], *, scale: float, sensitivity_l1: float
    ) -> NDArray[np.float64]:
        self.calls.append(("laplace", {"scale": scale, "sensitivity": sensitivity_l1}))
        return self.inner.laplace(values, scale=scale, sensitivity_l1=sensitivity_l1)

    def quantile(
        self,
        values: NDArray[np.float64],
        *,
        candidates: NDArray[np.float64],
        level: float,
        epsilon: float,
    ) -> float:
        out = self.inner.quantile(values, candidates=candidates, level=level, epsilon=epsilon)
        self.calls.append(
            (
                "quantile",
                {
                    "epsilon": epsilon,
                    "level": level,
                    "size": float(values.size),
                    "grid_min": float(candidates[0]),
                    "grid_max": float(candidates[-1]),
                    "grid_size": float(candidates.size),
                    "output": out,
                },
            )
        )
        return out


def _rct(n: int) -> tuple[PublicDomain, Arrays]:
    rng = np.random.default_rng(5)
    x = rng.uniform(0.0, 1.0, size=(n, 2))
    a = (rng.uniform(size=n) < 0.5).astype(np.float64)
    # declared bounds about 40 sd wide, centred near the data (the Horvitz-Thompson centre)
    y = np.clip(x[:, 0] + 1.5 * a + rng.gamma(1.5, 1.0, size=n) - 2.0, -60.0, 60.0)
    domain = PublicDomain(
        x_lower=np.zeros(2),
        x_upper=np.ones(2),
        y_lower=-60.0,
        y_upper=60.0,
        n=n,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )
    return domain, Arrays(x=x, a=a, y=y)


def _adaptive_run() -> tuple[dict[str, Any], RecordingSampler, Any, PublicDomain]:
    domain, arrays = _rct(4000)
    params = AteStrictParams(epsilon=1.0, delta=1e-6, nuisance="none", adaptive_clip=True)
    record = ate_strict.plan(domain, params)
    sampler = RecordingSampler()
    result = ate_strict.run(
        arrays,
        domain,
        params,
        rng=np.random.default_rng(9),
        noise=sampler,
        progress=lambda fraction, stage: None,
    )
    return result, sampler, record, domain


def test_adaptive_release_draws_exactly_the_planned_noise() -> None:
    result, sampler, record, domain = _adaptive_run()
    kinds = [kind for kind, _ in sampler.calls]
    assert kinds == ["quantile", "gaussian", "gaussian"]
    quantile_event, mean_event, second_event = record.events
    assert quantile_event.type == "exponential_quantile"
    assert quantile_event.delta == 0.0
    # composition: the three estimation events add up to the release's cost exactly
    assert math.fsum(e.epsilon for e in record.events) == record.epsilon == 1.0
    assert math.fsum(e.delta for e in record.events) == record.delta

    quantile = sampler.calls[0][1]
    n2 = domain.n
    bound_max = domain.outcome_range / (2 * 0.5)  # nuisance none, p = 0.5: B = R / (2 min(p))
    assert quantile["epsilon"] == quantile_event.epsilon
    assert math.isclose(quantile_event.epsilon, ate_strict.ADAPTIVE_CLIP_SHARE * record.epsilon)
    assert quantile["level"] == ate_strict.ADAPTIVE_CLIP_LEVEL
    assert quantile["size"] == n2
    assert quantile["grid_max"] == bound_max
    assert quantile["grid_min"] == bound_max / ate_strict.ADAPTIVE_CLIP_RANGE
    clip = min(bound_max, (2.0 + 0.5 * math.log10(n2)) * quantile["output"])
    assert result["bound"] == clip < bound_max / 2  # the data's scale, well inside B
    assert result["clip"] == "adaptive"
    assert result["bound_max"] == bound_max

    for (_, call), event, nominal in (
        (sampler.calls[1], mean_event, 2.0 * clip / n2),
        (sampler.calls[2], second_event, clip * clip / n2),
    ):
        expected = calibrate_gaussian(event.epsilon, event.delta, call["sensitivity"])
        assert nominal <= call["sensitivity"] <= nominal * (1 + 1e-9)
        assert call["sigma"] == expected.sigma
        assert call["sigma"] >= float(event.params["noise_multiplier"]) * nominal
        assert call["sigma"] <= float(event.params["sigma_max"])
    assert result["s_theta"] == sampler.calls[1][1]["sigma"]
    assert result["s_2"] == sampler.calls[2][1]["sigma"]


def test_mean_channel_at_the_released_clip_audit_and_power() -> None:
    result, sampler, record, domain = _adaptive_run()
    clip, n2 = result["bound"], domain.n
    sigma = sampler.calls[1][1]["sigma"]
    mean_event = record.events[1]
    # worst-case neighbours: one pseudo-outcome moves from -K to +K (after the clip to K)
    gamma = np.random.default_rng(3).uniform(-clip, clip, n2)
    gamma[0] = -clip
    value, _ = ate_strict.d2_statistics(gamma, bound=clip)
    gamma[0] = clip
    value_neighbour, _ = ate_strict.d2_statistics(gamma, bound=clip)
    assert math.isclose(value_neighbour - value, 2 * clip / n2, rel_tol=1e-9)
    sensitivity = sampler.calls[1][1]["sensitivity"]
    thresholds = [(value + value_neighbour) / 2] + [value + k * sigma for k in (1.0, 1.5, 2.0, 3.0)]

    def audit(scale: float, seed: int) -> float:
        draws = SeededSampler(np.random.default_rng(seed))
        sample = draws.gaussian(np.full(2_000_000, value), sigma=scale, sensitivity_l2=sensitivity)
        sample_neighbour = draws.gaussian(
            np.full(2_000_000, value_neighbour), sigma=scale, sensitivity_l2=sensitivity
        )
        return epsilon_lower_bound(sample, sample_neighbour, thresholds, mean_event.delta)

    assert audit(sigma, 1) <= mean_event.epsilon
    assert audit(sigma / 2, 2) > mean_event.epsilon
