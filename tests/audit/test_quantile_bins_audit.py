"""Empirical audit of the DP quantile bins of the strict ATE's DP-EBM nuisances
(docs/proofs/ate_strict.md §14; ``service/mechanisms/quantile_bins.py``).

Three checks, each of which a wrong implementation fails:

1. **Sensitivity of the real counting code**: on neighbours that move one record from the lower
   to the upper bound of every continuous covariate, the histograms change by exactly
   ``sqrt(2 J)`` in L2, the sensitivity the plan calibrates to (a counting bug that puts a row in
   two cells, or a plan for fewer columns, turns this red).
2. **The histogram channel**: the Gaussian noise is isotropic, so the best test between the two
   neighbours is the projection on the direction of their difference. Clopper–Pearson bounds on
   threshold events of that projection, from the plan's sigma on the changed cells, give
   ``eps_lb <= epsilon`` of the histogram event; at half that sigma the audit rejects.
3. **End to end through ``ate_strict.run``**: a recording sampler sees one histogram draw per
   DP-EBM module (propensity, then outcome) of dimension ``CELLS * J`` at the planned sigma and
   sensitivity, before the estimation fold's two Gaussians; the module events add up to the
   release's cost exactly.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from service.mechanisms import ate_strict, quantile_bins
from service.mechanisms.ate_strict import AteStrictParams
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.noise import SeededSampler
from tests.audit.test_ate_adaptive_clip_audit import RecordingSampler
from tests.audit.test_ate_strict_audit import epsilon_lower_bound

DRAWS = 1_000_000


def _observational(n: int) -> tuple[PublicDomain, Arrays]:
    """Two skewed continuous covariates (declared 0-300 and 0-15) and one binary one."""
    rng = np.random.default_rng(11)
    crp = np.clip(rng.lognormal(math.log(8.0), 1.1, n), 0.0, 300.0)
    creatinine = np.clip(rng.lognormal(0.0, 0.5, n), 0.0, 15.0)
    flag = (rng.uniform(size=n) < 0.3).astype(np.float64)
    x = np.column_stack([crp, flag, creatinine])
    logit = -0.5 + 0.4 * np.log(crp + 0.1) - 0.8 + flag
    a = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float64)
    y = np.clip(2.0 + 0.3 * np.log(crp + 0.1) + a + rng.gamma(1.5, 1.0, n), 0.0, 40.0)
    domain = PublicDomain(
        x_lower=np.array([0.0, 0.0, 0.0]),
        x_upper=np.array([300.0, 1.0, 15.0]),
        y_lower=0.0,
        y_upper=40.0,
        n=n,
        design=StudyDesign.OBSERVATIONAL,
        x_codes=(None, (0, 1), None),
    )
    return domain, Arrays(x=x, a=a, y=y)


def _worst_neighbours(
    domain: PublicDomain, arrays: Arrays
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    x = arrays.x.copy()
    lower = np.asarray(domain.x_lower)
    upper = np.asarray(domain.x_upper)
    x[0] = lower
    neighbour = x.copy()
    neighbour[0] = upper
    return x, neighbour


def test_counting_has_the_planned_sensitivity() -> None:
    domain, arrays = _observational(500)
    columns = quantile_bins.continuous_columns(domain)
    assert columns == (0, 2)
    x, neighbour = _worst_neighbours(domain, arrays)
    lower, upper = np.asarray(domain.x_lower), np.asarray(domain.x_upper)
    change = quantile_bins.counts(neighbour, lower, upper, columns) - quantile_bins.counts(
        x, lower, upper, columns
    )
    assert np.count_nonzero(change) == 2 * len(columns)
    assert float(np.linalg.norm(change)) == quantile_bins.sensitivity(len(columns)) == 2.0
    plan = quantile_bins.QuantileBins.plan(columns, 0.1, 1e-6)
    assert plan.calibration.sensitivity_l2 == quantile_bins.sensitivity(len(columns))
    assert plan.calibration.dim == quantile_bins.CELLS * len(columns)
    # every row counts once per covariate, whatever its value (bounds included)
    totals = quantile_bins.counts(x, lower, upper, columns).sum(axis=1)
    assert np.all(totals == x.shape[0])


def test_histogram_channel_audit_and_power() -> None:
    domain, arrays = _observational(500)
    columns = quantile_bins.continuous_columns(domain)
    x, neighbour = _worst_neighbours(domain, arrays)
    lower, upper = np.asarray(domain.x_lower), np.asarray(domain.x_upper)
    counts = quantile_bins.counts(x, lower, upper, columns).reshape(-1)
    counts_neighbour = quantile_bins.counts(neighbour, lower, upper, columns).reshape(-1)
    changed = np.flatnonzero(counts != counts_neighbour)
    direction = (counts_neighbour - counts)[changed]
    direction /= np.linalg.norm(direction)
    event = ate_strict.plan(domain, _params()).events[0]
    assert event.params["statistic"] == "continuous_covariate_histograms"
    plan = quantile_bins.QuantileBins.plan(columns, event.epsilon, event.delta)
    sigma = plan.calibration.sigma
    assert sigma == event.params["sigma"]

    def projections(values: NDArray[np.float64], scale: float, seed: int) -> NDArray[np.float64]:
        draws = SeededSampler(np.random.default_rng(seed)).gaussian(
            np.tile(values, DRAWS), sigma=scale, sensitivity_l2=plan.calibration.sensitivity_l2
        )
        return np.asarray(draws.reshape(DRAWS, changed.size) @ direction, np.float64)

    low = float(counts[changed] @ direction)
    high = float(counts_neighbour[changed] @ direction)
    assert math.isclose(high - low, quantile_bins.sensitivity(len(columns)))

    def audit(scale: float, seed: int) -> float:
        thresholds = [(low + high) / 2] + [low + k * sigma for k in (1.0, 1.5, 2.0, 3.0)]
        return epsilon_lower_bound(
            projections(counts[changed], scale, seed),
            projections(counts_neighbour[changed], scale, seed + 1),
            thresholds,
            event.delta,
        )

    assert audit(sigma, 1) <= event.epsilon
    assert audit(sigma / 2, 3) > event.epsilon


def _params() -> AteStrictParams:
    # the histograms alone: the outcome range (proof §16) has its own audit
    return AteStrictParams(
        epsilon=4.0, delta=1e-5, nuisance="dp_ebm", quantile_bins=True, outcome_range=False
    )


def test_release_draws_one_histogram_per_module_at_the_plan() -> None:
    domain, arrays = _observational(2000)
    params = _params()
    record = ate_strict.plan(domain, params)
    sampler = RecordingSampler()
    ate_strict.run(
        arrays,
        domain,
        params,
        rng=np.random.default_rng(4),
        noise=sampler,
        progress=lambda fraction, stage: None,
    )
    histogram_events = [
        e for e in record.events if e.params.get("statistic") == "continuous_covariate_histograms"
    ]
    assert [e.module for e in histogram_events] == ["propensity", "outcome"]
    for module in ("propensity", "outcome", "estimation"):
        events = [e for e in record.events if e.module == module]
        assert math.fsum(e.epsilon for e in events) == record.epsilon == 4.0
        assert math.fsum(e.delta for e in events) == record.delta
    fits = [e for e in record.events if e.type == "gdp_module"]
    for event in histogram_events:
        assert math.isclose(event.epsilon, quantile_bins.SHARE * record.epsilon)
    for event in fits:
        assert math.isclose(event.epsilon, (1 - quantile_bins.SHARE) * record.epsilon)
    kinds = [kind for kind, _ in sampler.calls]
    assert kinds == ["gaussian"] * 4
    for (_, call), event in zip(sampler.calls[:2], histogram_events, strict=True):
        assert call["sigma"] == event.params["sigma"]
        assert call["sensitivity"] == quantile_bins.sensitivity(2)
        assert event.params["dim"] == quantile_bins.CELLS * 2
