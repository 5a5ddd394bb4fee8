"""Empirical audit of uplift_table's DP quantile cut points (docs/proofs/uplift_table.md step 8;
``quantile_cuts``), the one part of the grid that reads the data.

Two checks, each of which a wrong implementation fails:

1. **The cut-point channel** (``measure_cut_points``: OpenDP quantiles of one covariate,
   replace-one with n public): on neighbours where one moved record lifts a candidate block's
   rank utility by one, Clopper–Pearson bounds on events of the released cut point give
   ``eps_lb`` at most its planned epsilon (family-wise false-failure rate 1e-6). A cut point
   drawn at six times the planned epsilon is rejected on 3000 runs. (Twice is not
   visible: OpenDP charges a replace-one neighbour at symmetric distance 2, and one
   record moves a rank utility by at most 1, so a correct release's true loss is about half its
   charge.)
2. **End to end through ``uplift.run``**: a recording sampler sees exactly the planned
   quantiles (count, levels, epsilon each, the public grid of the declared bounds, all n
   values) before the table's Laplace draws, whose scales are the plan's at the rest of
   epsilon; the record's events add up to the request's epsilon.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray

from service.mechanisms import uplift as up
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.noise import OpenDPSampler
from tests.audit.clopper_pearson import events_epsilon_lower_bound
from tests.audit.test_ate_adaptive_clip_audit import RecordingSampler

FAMILY_LEVEL = 1e-6
RUNS = 10_000  # the correct release's true loss here is about 0.3: enough runs to see it
POWER_RUNS = 3000
LOWER, UPPER = 0.0, 40.0
CELLS = 2  # one quantile: the median


def _domain(n: int) -> PublicDomain:
    return PublicDomain(
        x_lower=np.array([LOWER]),
        x_upper=np.array([UPPER]),
        y_lower=-5.0,
        y_upper=5.0,
        n=n,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )


def _neighbours() -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """40 values: 19 at 5, one at 20, 20 at 36. The median's rank utility is -1 on the candidate
    block (5, 20] and 0 on (20, 36], blocks of about the same size, so its draws spread over
    both; the neighbour moves the 20 to 0, which lifts the first block to 0 (the most one record
    can move a rank utility)."""
    values = np.concatenate([np.full(19, 5.0), [20.0], np.full(20, 36.0)])
    neighbour = values.copy()
    neighbour[19] = 0.0
    return values, neighbour


def _draws(
    values: NDArray[np.float64], epsilon_each: float, runs: int = RUNS
) -> NDArray[np.float64]:
    domain = _domain(values.size)
    params = up.UpliftParams(epsilon=1.0, quantile_cuts=(CELLS,))
    sampler = OpenDPSampler()
    x = values[:, None]
    return np.array(
        [up.measure_cut_points(x, domain, params, epsilon_each, sampler)[0] for _ in range(runs)]
    )


def _events(cuts: NDArray[np.float64]) -> list[NDArray[np.bool_]]:
    upper_block = cuts[:, 0] > 20.0
    return [upper_block, ~upper_block]


def _epsilon_lower_bound(first: NDArray[np.float64], second: NDArray[np.float64]) -> float:
    return events_epsilon_lower_bound(_events(first), _events(second), FAMILY_LEVEL)


def test_cut_point_channel_audit_and_power() -> None:
    values, neighbour = _neighbours()
    charged = 1.0  # one quantile at epsilon 1
    bound = _epsilon_lower_bound(_draws(values, charged), _draws(neighbour, charged))
    assert 0.0 < bound <= charged, bound
    wrong = 6 * charged
    bound_wrong = _epsilon_lower_bound(
        _draws(values, wrong, POWER_RUNS), _draws(neighbour, wrong, POWER_RUNS)
    )
    assert bound_wrong > charged, bound_wrong


def test_run_measures_the_planned_quantiles_then_the_table() -> None:
    n = 4000
    rng = np.random.default_rng(3)
    x = np.clip(rng.exponential(4.0, (n, 2)), LOWER, UPPER)
    a = (rng.uniform(size=n) < 0.5).astype(float)
    y = np.clip(rng.normal(0.0, 1.0, n), -5.0, 5.0)
    domain = PublicDomain(
        x_lower=np.array([LOWER, LOWER]),
        x_upper=np.array([UPPER, UPPER]),
        y_lower=-5.0,
        y_upper=5.0,
        n=n,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )
    params = up.UpliftParams(epsilon=2.0, quantile_cuts=(4, 0), cut_points=((), (5.0,)))
    state = up.make_plan(domain, params)
    record = state.record
    assert math.fsum(e.epsilon for e in record.events) == record.epsilon == 2.0
    cuts_event = record.events[0]
    assert cuts_event.params["statistic"] == "cut_point_quantiles"
    assert cuts_event.epsilon == pytest.approx(up.QUANTILE_CUTS_SHARE * 2.0, rel=1e-12)
    assert state.quantile_epsilon is not None
    assert 3 * state.quantile_epsilon <= cuts_event.epsilon
    sampler = RecordingSampler()
    out = up.run(Arrays(x, a, y), domain, params, noise=sampler, progress=lambda f, s: None)
    kinds = [kind for kind, _ in sampler.calls]
    assert kinds == ["quantile"] * 3 + ["laplace"] * 3  # second moments, counts, sums
    for (_, call), level in zip(sampler.calls[:3], (0.25, 0.5, 0.75), strict=True):
        assert call["epsilon"] == state.quantile_epsilon
        assert call["level"] == level
        assert call["size"] == n
        assert (call["grid_min"], call["grid_max"]) == (LOWER, UPPER)
        assert call["grid_size"] == up.QUANTILE_CANDIDATES
    assert state.counts is not None
    assert sampler.calls[4][1]["scale"] == state.counts.scale
    edges = out["grid"]["edges"]
    assert edges[1] == [LOWER, 5.0, UPPER]
    assert edges[0][1:-1] == sorted(call["output"] for _, call in sampler.calls[:3])
    assert out["grid"]["bins"] == [4, 2]
    assert len(out["uplift"]) == 8
