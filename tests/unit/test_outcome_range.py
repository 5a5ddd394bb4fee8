"""The DP-EBM outcome model's measured range (docs/proofs/ate_strict.md §16): the public grid,
the post-processing of the two quantiles, the plan's rule and validation, and the request
field of the ``ate`` kind."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from service.mechanisms import ate_strict, outcome_range
from service.mechanisms.ate_strict import AteStrictParams
from service.mechanisms.ate_strict.calibration import plan_outcome_range
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters
from service.releases.kinds.ate import AteParams, to_mechanism_params


def _domain(n: int = 4000) -> PublicDomain:
    return PublicDomain(
        x_lower=-np.ones(2),
        x_upper=np.ones(2),
        y_lower=-5.0,
        y_upper=60.0,
        n=n,
        design=StudyDesign.OBSERVATIONAL,
    )


def test_candidates_are_the_declared_bounds_equally_spaced() -> None:
    grid = outcome_range.candidates(-5.0, 60.0)
    assert grid.size == outcome_range.CANDIDATES == 1001
    assert (grid[0], grid[-1]) == (-5.0, 60.0)
    assert np.allclose(np.diff(grid), 65.0 / 1000)


def test_range_from_quantiles_orders_bounds_and_falls_back_when_empty() -> None:
    assert outcome_range.range_from_quantiles(3.0, 25.0, -5.0, 60.0) == (3.0, 25.0)
    # the two draws are independent: a low draw above the high one is still a range
    assert outcome_range.range_from_quantiles(25.0, 3.0, -5.0, 60.0) == (3.0, 25.0)
    # coinciding quantiles leave no range to fit on: the declared bounds
    assert outcome_range.range_from_quantiles(7.0, 7.0, -5.0, 60.0) == (-5.0, 60.0)


class _Recorder:
    """Returns fixed quantiles and records each call's public arguments and its input."""

    def __init__(self, outputs: list[float]) -> None:
        self.outputs = outputs
        self.calls: list[dict[str, Any]] = []

    def quantile(
        self,
        values: NDArray[np.float64],
        *,
        candidates: NDArray[np.float64],
        level: float,
        epsilon: float,
    ) -> float:
        self.calls.append(
            {"values": values.copy(), "grid": candidates, "level": level, "epsilon": epsilon}
        )
        return self.outputs[len(self.calls) - 1]


def test_measure_draws_two_quantiles_on_the_clipped_outcomes() -> None:
    measured = outcome_range.OutcomeRange(0.03, 0.02)
    recorder = _Recorder([4.0, 30.0])
    y = np.array([-9.0, 1.0, 2.0, 70.0])
    assert measured.measure(y, -5.0, 60.0, recorder) == (4.0, 30.0)  # type: ignore[arg-type]
    low, high = recorder.calls
    assert (low["level"], high["level"]) == (0.02, 0.98)
    assert (low["epsilon"], high["epsilon"]) == (0.03, 0.02)
    for call in (low, high):
        assert call["values"].tolist() == [-5.0, 1.0, 2.0, 60.0]
        assert np.array_equal(call["grid"], outcome_range.candidates(-5.0, 60.0))


def test_plan_rule_validation_and_exact_split() -> None:
    large = ate_strict.OUTCOME_RANGE_MIN_N_EPSILON
    assert plan_outcome_range("dp_linear", None, 1.0, large) is None
    assert plan_outcome_range("none", None, 1.0, large) is None
    assert plan_outcome_range("dp_ebm", False, 1.0, large) is None
    # the rule: off below the public n * epsilon threshold, unless asked for
    assert plan_outcome_range("dp_ebm", None, 1.0, 0.999 * large) is None
    assert plan_outcome_range("dp_ebm", True, 1.0, 100.0) is not None
    with pytest.raises(InvalidParameters, match="outcome_range needs"):
        plan_outcome_range("dp_linear", True, 1.0, large)
    with pytest.raises(InvalidParameters, match="boolean"):
        plan_outcome_range("dp_ebm", "yes", 1.0, large)  # type: ignore[arg-type]
    for epsilon in (0.1, 0.9, 1.0, 3.7):
        measured = plan_outcome_range("dp_ebm", None, epsilon, large)
        assert measured is not None
        share = measured.epsilon_low + measured.epsilon_high
        assert share == pytest.approx(outcome_range.SHARE * epsilon)
        _, rest = ate_strict.split_share(epsilon, outcome_range.SHARE)
        assert math.fsum([measured.epsilon_low, measured.epsilon_high, rest]) == epsilon


def test_off_keeps_the_declared_plan_and_on_charges_the_same() -> None:
    domain = _domain(n=40_000)
    on = ate_strict.make_plan(domain, AteStrictParams(epsilon=1.0, delta=1e-5))
    off = ate_strict.make_plan(
        domain, AteStrictParams(epsilon=1.0, delta=1e-5, outcome_range=False)
    )
    assert (on.record.epsilon, on.record.delta) == (off.record.epsilon, off.record.delta)
    assert off.outcome_range is None
    assert off.dp_ebm_outcome is off.dp_ebm
    assert on.outcome_range is not None
    assert on.dp_ebm_outcome is not None
    # the outcome model keeps 90 % of the module: a smaller epsilon_p, the same delta
    assert on.dp_ebm is not None
    assert on.dp_ebm_outcome.epsilon_p < on.dp_ebm.epsilon_p
    assert on.dp_ebm_outcome.delta_p == on.dp_ebm.delta_p
    assert not any(e.type == "exponential_quantile" for e in off.record.events)
    quantiles = [e for e in on.record.events if e.type == "exponential_quantile"]
    assert [e.module for e in quantiles] == ["outcome", "outcome"]
    assert [e.params["statistic"] for e in quantiles] == ["quantile_outcome"] * 2
    assert [e.params["candidate_min"] for e in quantiles] == [-5.0, -5.0]
    assert [e.params["candidate_max"] for e in quantiles] == [60.0, 60.0]
    with pytest.raises(InvalidParameters, match="outcome_range needs"):
        ate_strict.make_plan(
            domain,
            AteStrictParams(epsilon=1.0, delta=1e-5, nuisance="dp_linear", outcome_range=True),
        )


def test_the_kind_passes_the_field_and_it_implies_dp_ebm() -> None:
    domain = _domain(n=2000)  # n eps = 2000: the observational default would be dp_linear
    default = to_mechanism_params(AteParams(epsilon=1.0), domain)
    assert isinstance(default, AteStrictParams)
    assert default.nuisance == "dp_linear"
    assert default.outcome_range is None
    asked = to_mechanism_params(AteParams(epsilon=1.0, outcome_range=True), domain)
    assert isinstance(asked, AteStrictParams)
    assert asked.nuisance == "dp_ebm"
    assert asked.outcome_range is True
    refused = to_mechanism_params(AteParams(epsilon=1.0, outcome_range=False), domain)
    assert isinstance(refused, AteStrictParams)
    assert refused.outcome_range is False
    for other in ({"estimator": "ipw"}, {"mode": "paper"}):
        with pytest.raises(ValueError, match="outcome_range"):
            AteParams(epsilon=1.0, outcome_range=True, **other)
