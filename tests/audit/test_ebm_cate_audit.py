"""Empirical privacy audit of ebm_cate (the production DP-EBM path, S-learner, tiny data).

Setting: ``ebm_cate`` with the strict S-learner on n = 100 records with one covariate, run
end to end through interpret 0.7.8 at the production epsilon_p (``plan``), on two neighbouring
datasets: D has every outcome at y_lo; D' replaces one record by (x = 1, a = 1, y = y_hi). The
released ATE is the test statistic (any function of the release is post-processing).

Each fit takes ~0.15-0.3 s, so only 20-30 runs per dataset fit the test budget: the audit can
detect gross failures only (e.g. noise switched off), not small miscalibrations; the
distributional checks of interpret's noise scale are in tests/unit/test_ebm_cate.py
(noise_scale_boosting_ equals the formula at epsilon_p) and the epsilon_p rule in ate_strict's
tests.

False-failure rate: family-wise 1e-6 (Clopper-Pearson, Bonferroni over events and directions).
Power: the same pipeline with epsilon_p = 400 passed to interpret (a units bug: "noise off")
must give ``eps_lb > eps``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from numpy.typing import NDArray

from service.mechanisms import ebm_cate as ec
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.dp_ebm import dp_ebm_accounting
from tests.audit.test_ate_strict_audit import epsilon_lower_bound

EPSILON, DELTA = 0.25, 1e-3
RUNS, RUNS_POWER = 20, 30

pytestmark = pytest.mark.slow


def _domain() -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(1),
        x_upper=np.ones(1),
        y_lower=0.0,
        y_upper=10.0,
        n=100,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )


def _datasets() -> tuple[Arrays, Arrays]:
    rng = np.random.default_rng(5)
    x = rng.uniform(0, 1, (100, 1))
    a = np.tile([0.0, 1.0], 50)
    y = np.zeros(100)
    x2, a2, y2 = x.copy(), a.copy(), y.copy()
    x2[0], a2[0], y2[0] = 1.0, 1.0, 10.0
    return Arrays(x, a, y), Arrays(x2, a2, y2)


def _ates(state: ec.Plan, data: Arrays, runs: int, seed: int) -> NDArray[np.float64]:
    rng = np.random.default_rng(seed)
    out = [
        ec._run(data, _domain(), state, rng=rng, progress=lambda f, s: None, names=None)["ate"]
        for _ in range(runs)
    ]
    return np.asarray(out, dtype=np.float64)


def _bound(state: ec.Plan, runs: int) -> float:
    d, d2 = _datasets()
    sample, sample_neighbour = _ates(state, d, runs, 1), _ates(state, d2, runs, 2)
    both = np.concatenate([sample, sample_neighbour])
    thresholds = [float(np.median(both))]  # one event: the least Bonferroni penalty
    return epsilon_lower_bound(sample, sample_neighbour, thresholds, DELTA)


def _state() -> ec.Plan:
    return ec.make_plan(_domain(), ec.EbmCateParams(epsilon=EPSILON, delta=DELTA, learner="s"))


def test_production_pipeline_passes() -> None:
    assert _bound(_state(), RUNS) <= EPSILON


def test_audit_rejects_noise_switched_off() -> None:
    state = _state()
    broken = dataclasses.replace(state, accounting=dp_ebm_accounting(400.0, DELTA))
    assert _bound(broken, RUNS_POWER) > EPSILON
