"""Empirical audit of the DP-EBM outcome model's measured range in the strict ATE
(docs/proofs/ate_strict.md §16; ``service/mechanisms/outcome_range.py``).

Two checks, each of which a wrong implementation fails:

1. **The range channel** (``OutcomeRange.measure``: two OpenDP quantiles on the fold's outcomes,
   replace-one with the fold size public): on neighbours that move one outcome from the bulk to
   the top of the declared bounds, so that both quantiles shift, Clopper–Pearson bounds on
   events of the released pair give ``eps_lb <= epsilon_low + epsilon_high`` (family-wise
   false-failure rate 1e-6). A range drawn at four times the planned epsilons is rejected.
   (Twice is not always visible: for replace-one on a sized input OpenDP's quantile charges
   its symmetric-distance map at 2, and one replaced record moves each rank utility by at most
   1, so a correct release's true loss here is about half its charge.)
2. **End to end through ``ate_strict.run``**: a recording sampler sees, after the outcome
   module's bins, exactly two quantiles at the planned epsilons, levels and public grid on the
   outcome fold's outcomes; the regressor is fitted on the released range with the noise scale
   interpret derives from the outcome module's own accounting at that range (so fitting on the
   released range while calibrating the noise to a narrower one, or at the propensity model's
   larger epsilon, turns this red); and the module's events add up to the cost exactly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.mechanisms import ate_strict, dp_ebm, outcome_range
from service.mechanisms.ate_strict import AteStrictParams
from service.mechanisms.noise import OpenDPSampler
from tests.audit.clopper_pearson import events_epsilon_lower_bound
from tests.audit.test_ate_adaptive_clip_audit import RecordingSampler
from tests.audit.test_quantile_bins_audit import _observational

FAMILY_LEVEL = 1e-6
RUNS = 3000
EPSILON_EACH = 1.0
LOWER, UPPER = 0.0, 40.0


def _neighbours() -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """100 outcomes: 2 at 10, 96 at 20, 2 at 30; the neighbour moves one 10 to the top (40).
    Each quantile's candidate blocks then hold comparable mass, and both shift."""
    values = np.concatenate([np.full(2, 10.0), np.full(96, 20.0), np.full(2, 30.0)])
    neighbour = values.copy()
    neighbour[0] = UPPER
    return values, neighbour


def _draws(values: NDArray[np.float64], epsilon_each: float) -> NDArray[np.float64]:
    measured = outcome_range.OutcomeRange(epsilon_each, epsilon_each)
    sampler = OpenDPSampler()
    return np.array([measured.measure(values, LOWER, UPPER, sampler) for _ in range(RUNS)])


def _events(pairs: NDArray[np.float64]) -> list[NDArray[np.bool_]]:
    low, high = pairs[:, 0] <= 10.0, pairs[:, 1] > 30.0
    return [
        low,
        ~low,
        high,
        ~high,
        low & high,
        low & ~high,
        ~low & high,
        ~low & ~high,
    ]


def _epsilon_lower_bound(first: NDArray[np.float64], second: NDArray[np.float64]) -> float:
    """Largest CP lower bound on log P(S) / P'(S) over the events, both directions."""
    return events_epsilon_lower_bound(_events(first), _events(second), FAMILY_LEVEL)


def spy_regressor(monkeypatch: Any) -> list[dict[str, Any]]:
    """Record every ``dp_ebm.fit_regressor`` call's target range, accounting, learning rate,
    rounds, feature count and the boosting noise scale interpret derived (shared with the
    ebm_cate audit of the same mechanism)."""
    fits: list[dict[str, Any]] = []
    original = dp_ebm.fit_regressor

    def spy(*args: Any, **kwargs: Any) -> Any:
        model, midpoint = original(*args, **kwargs)
        fits.append(
            {
                "target_lower": args[4],
                "target_upper": args[5],
                "accounting": args[6],
                "learning_rate": kwargs.get("learning_rate", dp_ebm.DP_EBM_LEARNING_RATE),
                "max_rounds": kwargs.get("max_rounds", dp_ebm.DP_EBM_MAX_ROUNDS),
                "n_features": int(args[2].shape[0]),
                "noise_scale": float(model.noise_scale_boosting_),
            }
        )
        return model, midpoint

    monkeypatch.setattr(dp_ebm, "fit_regressor", spy)
    return fits


def released_range(
    calls: list[tuple[str, dict[str, float]]],
    events: list[Any],
    domain: Any,
    fold_size: int,
) -> tuple[float, float]:
    """Check the two recorded quantile draws against the record's two quantile events (ε,
    level, the outcome fold's size, the public grid; levels 0.02 then 0.98) and return the
    range they release (shared with the ebm_cate audit of the same mechanism)."""
    grid = outcome_range.candidates(domain.y_lower, domain.y_upper)
    outputs = []
    for (_, call), event in zip(calls, events, strict=True):
        assert call["epsilon"] == event.epsilon
        assert call["level"] == event.params["level"]
        assert call["size"] == fold_size
        assert (call["grid_min"], call["grid_max"], call["grid_size"]) == (
            grid[0],
            grid[-1],
            grid.size,
        )
        outputs.append(call["output"])
    assert [call["level"] for _, call in calls] == [0.02, 0.98]
    return outcome_range.range_from_quantiles(*outputs, domain.y_lower, domain.y_upper)


def test_range_channel_audit_and_power() -> None:
    values, neighbour = _neighbours()
    charged = 2 * EPSILON_EACH
    bound = _epsilon_lower_bound(_draws(values, EPSILON_EACH), _draws(neighbour, EPSILON_EACH))
    assert 0.0 < bound <= charged, bound
    wrong = 4 * EPSILON_EACH
    bound_wrong = _epsilon_lower_bound(_draws(values, wrong), _draws(neighbour, wrong))
    assert bound_wrong > charged, bound_wrong


def test_release_measures_the_range_on_the_outcome_fold_and_fits_on_it(
    monkeypatch: Any,
) -> None:
    # n eps = 4 * 10^4, inside the rule's range, where the quantiles usually find the tails
    domain, arrays = _observational(10_000)
    params = AteStrictParams(
        epsilon=4.0, delta=1e-5, nuisance="dp_ebm", quantile_bins=True, outcome_range=True
    )
    state = ate_strict.make_plan(domain, params)
    record = state.record
    fits = spy_regressor(monkeypatch)
    sampler = RecordingSampler()
    ate_strict.run(
        arrays,
        domain,
        params,
        rng=np.random.default_rng(4),
        noise=sampler,
        progress=lambda fraction, stage: None,
    )
    # bins (propensity), bins (outcome), the two quantiles, then the estimation Gaussians
    assert [kind for kind, _ in sampler.calls] == [
        "gaussian",
        "gaussian",
        "quantile",
        "quantile",
    ] + ["gaussian"] * 2
    quantile_events = [e for e in record.events if e.type == "exponential_quantile"]
    assert [e.module for e in quantile_events] == ["outcome", "outcome"]
    low, high = released_range(
        sampler.calls[2:4], quantile_events, domain, record.fold_sizes["outcome"]
    )
    # a released range, not the declared one (the exponential mechanism on a grid that is mostly
    # empty tail can still put one end near a declared bound now and then: not asserted)
    assert (low, high) != (domain.y_lower, domain.y_upper)

    (fit,) = fits
    assert (fit["target_lower"], fit["target_upper"]) == (low, high)
    accounting = state.dp_ebm_outcome
    assert accounting is not None
    assert fit["accounting"] == accounting
    assert state.dp_ebm is not None
    assert accounting.epsilon_p < state.dp_ebm.epsilon_p
    queries = dp_ebm.DP_EBM_MAX_ROUNDS * fit["n_features"] * dp_ebm.DP_EBM_OUTER_BAGS
    expected = math.sqrt(queries) * fit["learning_rate"] * (high - low) / accounting.mu_boosting
    assert math.isclose(fit["noise_scale"], expected, rel_tol=1e-9)

    outcome_events = [e for e in record.events if e.module == "outcome"]
    assert math.fsum(e.epsilon for e in outcome_events) == record.epsilon == 4.0
    assert math.fsum(e.delta for e in outcome_events) == record.delta
    model_event = next(e for e in outcome_events if e.type == "gdp_module")
    assert model_event.params["epsilon_p"] == accounting.epsilon_p
    assert model_event.params["target_range"] == "measured"
