"""Audit of the DR learner's measured outcome range in ``ebm_cate`` (docs/proofs/ebm_cate.md
step 10; ``service/mechanisms/outcome_range.py``, whose range channel is audited on neighbouring
datasets in ``test_ate_outcome_range_audit``).

End to end through ``ebm_cate.run_plan``: a recording sampler sees exactly two quantiles at the
planned epsilons, levels and public grid on the outcome fold's outcomes, before any other draw
of the DR pipeline; the outcome regressor is fitted on the released range with the noise scale
interpret derives from the outcome module's own accounting at that range (fitting on the
released range while calibrating the noise to a narrower one, or at the whole module's epsilon,
turns this red); the outcome module's events add up to the DR pipeline's budget exactly; and
below the rule's n epsilon, or with ``outcome_range: false``, nothing is measured.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from service.mechanisms import dp_ebm, outcome_range
from service.mechanisms import ebm_cate as ec
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from tests.audit.test_ate_adaptive_clip_audit import RecordingSampler
from tests.audit.test_ate_outcome_range_audit import released_range, spy_regressor
from tests.audit.test_quantile_bins_audit import _observational


def _recorded_release(
    arrays: Arrays, domain: PublicDomain, state: ec.Plan, *, seed: int
) -> RecordingSampler:
    """One release of ``state`` with every draw of the service's sampler recorded."""
    sampler = RecordingSampler()
    ec.run_plan(
        arrays,
        domain,
        state,
        rng=np.random.default_rng(seed),
        progress=lambda fraction, stage: None,
        names=None,
        noise=sampler,
    )
    return sampler


def test_release_measures_the_range_on_the_outcome_fold_and_fits_on_it(monkeypatch: Any) -> None:
    domain, arrays = _observational(10_000)  # n eps = 4 * 10^4: the rule's range
    state = ec.make_plan(domain, ec.EbmCateParams(epsilon=4.0, delta=1e-5))
    assert state.params.outcome_range is True
    assert state.outcome_range is not None
    record = state.record
    fits = spy_regressor(monkeypatch)
    sampler = _recorded_release(arrays, domain, state, seed=4)
    # the two quantiles come first (the anchor's and calibration's draws follow the first stage)
    assert [kind for kind, _ in sampler.calls[:2]] == ["quantile", "quantile"]
    quantile_events = [
        e for e in record.events if e.type == "exponential_quantile" and e.module == "outcome"
    ]
    assert len(quantile_events) == 2
    low, high = released_range(
        sampler.calls[:2], quantile_events, domain, record.fold_sizes["outcome"]
    )
    assert (low, high) != (domain.y_lower, domain.y_upper)

    (outcome_fit,) = fits  # the outcome model (the effect model is fitted by the estimation)
    assert (outcome_fit["target_lower"], outcome_fit["target_upper"]) == (low, high)
    accounting = state.outcome_accounting
    assert accounting is not None
    assert outcome_fit["accounting"] == accounting
    assert accounting.epsilon_p < state.accounting.epsilon_p
    queries = outcome_fit["max_rounds"] * outcome_fit["n_features"] * dp_ebm.DP_EBM_OUTER_BAGS
    expected = (
        math.sqrt(queries) * outcome_fit["learning_rate"] * (high - low) / accounting.mu_boosting
    )
    assert math.isclose(outcome_fit["noise_scale"], expected, rel_tol=1e-9)

    outcome_events = [e for e in record.events if e.module == "outcome"]
    propensity_events = [e for e in record.events if e.module == "propensity"]
    assert math.fsum(e.epsilon for e in outcome_events) == math.fsum(
        e.epsilon for e in propensity_events
    )
    assert math.fsum(e.epsilon for e in outcome_events) <= record.epsilon == 4.0
    assert math.fsum(e.delta for e in outcome_events) == propensity_events[0].delta
    model_event = next(e for e in outcome_events if e.type == "gdp_module")
    assert model_event.params["epsilon_p"] == accounting.epsilon_p
    assert model_event.params["target_range"] == "measured"


def test_no_measurement_below_the_rule_or_when_refused(monkeypatch: Any) -> None:
    domain, arrays = _observational(10_000)
    for params in (
        # n eps = 4000: below the observational rule (from 5000, ebm_cate version 10)
        ec.EbmCateParams(epsilon=0.4, delta=1e-5),
        ec.EbmCateParams(epsilon=4.0, delta=1e-5, outcome_range=False),
    ):
        state = ec.make_plan(domain, params)
        assert state.outcome_range is None
        assert not any(
            e.module == "outcome" and e.type != "gdp_module" for e in state.record.events
        )
        fits = spy_regressor(monkeypatch)
        sampler = _recorded_release(arrays, domain, state, seed=5)
        grid_size = float(outcome_range.CANDIDATES)
        levels = {
            call["level"]
            for kind, call in sampler.calls
            if kind == "quantile" and call["grid_size"] == grid_size
        }
        assert not levels & {outcome_range.LEVEL, 1.0 - outcome_range.LEVEL}
        assert (fits[0]["target_lower"], fits[0]["target_upper"]) == (
            domain.y_lower,
            domain.y_upper,
        )
        assert fits[0]["accounting"] == state.accounting
        monkeypatch.undo()


def test_rct_measures_the_range_at_the_pipelines_rest(monkeypatch: Any) -> None:
    """In a randomised design the anchor release comes first (its own draws); the outcome
    module's two quantiles then draw at the DP pipeline's rest, as recorded, on the outcome
    fold, and the regressor is fitted on their range at the module's own accounting."""
    observational, arrays = _observational(10_000)
    domain = dataclasses.replace(observational, design=StudyDesign.RCT, treatment_probability=0.5)
    state = ec.make_plan(domain, ec.EbmCateParams(epsilon=4.0, delta=1e-5))
    assert state.rct_anchor is not None
    assert state.outcome_range is not None
    record = state.record
    fits = spy_regressor(monkeypatch)
    sampler = _recorded_release(arrays, domain, state, seed=6)
    levels = (outcome_range.LEVEL, 1.0 - outcome_range.LEVEL)
    calls = [c for kind, c in sampler.calls if kind == "quantile" and c["level"] in levels]
    events = [
        e for e in record.events if e.module == "outcome" and e.type == "exponential_quantile"
    ]
    assert [c["epsilon"] for c in calls] == [e.epsilon for e in events]
    assert all(c["size"] == record.fold_sizes["outcome"] for c in calls)
    rest = math.fsum(e.epsilon for e in record.events if e.module == "outcome")
    assert math.fsum(e.epsilon for e in events) == pytest.approx(0.1 * rest, rel=1e-12)
    assert rest < record.epsilon  # the anchor took its share first
    low, high = outcome_range.range_from_quantiles(
        calls[0]["output"], calls[1]["output"], domain.y_lower, domain.y_upper
    )
    outcome_fit = fits[0]
    assert (outcome_fit["target_lower"], outcome_fit["target_upper"]) == (low, high)
    assert outcome_fit["accounting"] == state.outcome_accounting
