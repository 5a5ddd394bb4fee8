"""DP quantile bins (service/mechanisms/quantile_bins.py; docs/proofs/ate_strict.md §14): the
post-processing, the public rule and the plan's validation. The privacy audit is in
tests/audit/test_quantile_bins_audit.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray

from service.mechanisms import ate_strict, quantile_bins
from service.mechanisms.ate_strict import AteStrictParams
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters
from service.releases.kinds.ate import AteParams, to_mechanism_params


class _Exact:
    """A sampler without noise: the released histograms are the exact counts (tests only)."""

    def gaussian(
        self, values: NDArray[np.float64], *, sigma: float, sensitivity_l2: float
    ) -> NDArray[np.float64]:
        return np.asarray(values, dtype=np.float64)


def _domain(codes: tuple[tuple[int, ...] | None, ...], n: int = 4000) -> PublicDomain:
    q = len(codes)
    upper = np.array([1.0 if c is not None else 300.0 for c in codes])
    return PublicDomain(
        x_lower=np.zeros(q),
        x_upper=upper,
        y_lower=0.0,
        y_upper=50.0,
        n=n,
        design=StudyDesign.OBSERVATIONAL,
        x_codes=codes,
    )


def test_transform_is_the_empirical_cdf_without_noise_and_monotone() -> None:
    rng = np.random.default_rng(3)
    n = 20000
    x = np.column_stack([np.clip(rng.lognormal(2.0, 1.1, n), 0, 300), rng.integers(0, 2, n)])
    lower, upper = np.array([0.0, 0.0]), np.array([300.0, 1.0])
    plan = quantile_bins.QuantileBins.plan((0,), 1.0, 1e-6)
    knots = plan.measure(x, lower, upper, _Exact())  # type: ignore[arg-type]
    out, new_lower, new_upper = quantile_bins.transform(x, lower, upper, (0,), knots)
    # at the public cell edges the map is the empirical CDF; between them it is linear
    edges = np.linspace(0.0, 300.0, quantile_bins.CELLS + 1)
    empirical = np.searchsorted(np.sort(x[:, 0]), edges[1:-1], side="left") / n
    assert np.allclose(knots[0, 1:-1], empirical)
    assert knots[0, 0] == 0.0
    assert knots[0, -1] == 1.0
    order = np.argsort(x[:, 0], kind="stable")
    assert np.all(np.diff(out[order, 0]) >= 0.0)  # rows keep their order
    assert np.array_equal(out[:, 1], x[:, 1])  # the coded covariate is untouched
    assert new_lower.tolist() == [0.0, 0.0]
    assert new_upper.tolist() == [1.0, 1.0]
    # a third of the rows sat in interpret's first equal-width cell (width 300 / 64); after
    # the transform they span over a fifth of [0, 1], more than 12 of its 64 cells
    first = x[:, 0] < 300.0 / 64
    assert 0.25 < first.mean() < 0.45
    assert out[first, 0].max() - out[first, 0].min() > 0.2


def test_cdf_knots_are_monotone_unbiased_and_in_the_unit_interval() -> None:
    cells = quantile_bins.CELLS
    rng = np.random.default_rng(1)
    # 1000 rows in the first two cells only, then noise: no phantom mass from the empty cells
    counts = np.zeros(cells)
    counts[:2] = [600.0, 400.0]
    noisy = counts + rng.normal(0.0, 20.0, size=(200, cells))
    knots = quantile_bins.cdf_knots(noisy, 1000)
    assert np.all(np.diff(knots, axis=1) >= 0.0)
    assert np.all((knots >= 0.0) & (knots <= 1.0))
    assert np.allclose(knots[:, 0], 0.0)
    assert np.allclose(knots[:, -1], 1.0)
    # the data's two cells keep about their share of [0, 1] on average (clipping each noisy
    # count at 0 instead would hand the empty cells about 0.4 sigma each, 25 % of the mass)
    assert abs(float(np.mean(knots[:, 1])) - 0.6) < 0.05
    assert abs(float(np.mean(knots[:, 2])) - 1.0) < 0.05


def test_accuracy_rule_is_public_and_monotone_in_the_fold() -> None:
    plan = quantile_bins.QuantileBins.plan((0, 1), 0.4, 1e-6)
    expected = math.sqrt(quantile_bins.CELLS / 2.0) * plan.calibration.sigma / 2000
    assert plan.cdf_error(2000) == expected
    large = int(math.ceil(plan.cdf_error(1) / quantile_bins.MAX_CDF_ERROR))
    assert plan.accurate_enough(large)
    assert not plan.accurate_enough(large // 2)


def _binned(domain: PublicDomain, epsilon: float, **params: object) -> bool:
    record = ate_strict.plan(
        domain,
        to_mechanism_params(AteParams(epsilon=epsilon, **params), domain),  # type: ignore[arg-type]
    )
    return any(
        e.params.get("statistic") == "continuous_covariate_histograms" for e in record.events
    )


def test_public_rule_and_validation() -> None:
    mixed = _domain(((0, 1), None, (0, 1)), n=100000)
    coded = _domain(((0, 1), (0, 1)), n=100000)
    assert quantile_bins.continuous_columns(mixed) == (1,)
    # the rule: on with DP-EBM nuisances, a numeric covariate and large enough folds
    assert _binned(mixed, 1.0)
    assert not _binned(mixed, 1.0, nuisance="dp_linear")
    assert not _binned(coded, 1.0)
    assert not _binned(_domain(((0, 1), None), n=2000), 1.0)  # 500-row folds: CDF too noisy
    assert _binned(_domain(((0, 1), None), n=2000), 1.0, quantile_bins=True)  # asked for
    assert not _binned(mixed, 1.0, quantile_bins=False)
    with pytest.raises(InvalidParameters, match="quantile_bins"):
        ate_strict.plan(coded, AteStrictParams(epsilon=1.0, delta=1e-6, quantile_bins=True))
    with pytest.raises(InvalidParameters, match="quantile_bins"):
        ate_strict.plan(
            mixed,
            AteStrictParams(epsilon=1.0, delta=1e-6, nuisance="dp_linear", quantile_bins=True),
        )


def test_plan_charges_the_same_and_shrinks_only_the_nuisance_budget() -> None:
    domain = _domain(((0, 1), None, None), n=20000)
    on = ate_strict.plan(domain, AteStrictParams(epsilon=2.0, delta=1e-6, quantile_bins=True))
    off = ate_strict.plan(domain, AteStrictParams(epsilon=2.0, delta=1e-6, quantile_bins=False))
    assert (on.epsilon, on.delta) == (off.epsilon, off.delta) == (2.0, 1e-6)
    estimation = [e for e in on.events if e.module == "estimation"]
    assert estimation == [e for e in off.events if e.module == "estimation"]
    for module in ("propensity", "outcome"):
        events = [e for e in on.events if e.module == module]
        histogram, fit = events[0], events[-1]
        assert (histogram.type, fit.type) == ("gaussian", "gdp_module")
        assert histogram.params["columns"] == 2
        assert histogram.params["cells"] == quantile_bins.CELLS
        assert math.fsum(e.epsilon for e in events) == 2.0
        assert math.isclose(histogram.epsilon, 2.0 * quantile_bins.SHARE)
    # the outcome module's measured range (proof §16) sits between its histograms and its fit
    middle = [e.type for e in on.events if e.module == "outcome"][1:-1]
    assert middle == ["exponential_quantile"] * 2
    assert math.isclose(
        [e for e in on.events if e.module == "propensity"][-1].epsilon,
        2.0 * (1.0 - quantile_bins.SHARE),
    )
