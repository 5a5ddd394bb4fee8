"""Empirical audit of ebm_cate's effect-modifier screen (docs/proofs/ebm_cate.md step 9;
``service/mechanisms/effect_screen.py``).

Two checks, each of which a wrong implementation fails:

1. **The selection channel** (``EffectScreen.select`` through OpenDP's noisy top-k, replace-one
   with the row count public): on neighbours whose replaced row raises one covariate's score
   by the full 2 K and lowers the two others' by 2 K (the worst case of non-monotone scores),
   Clopper–Pearson bounds on the events of the chosen column give ``eps_lb <= epsilon``
   (family-wise false-failure rate 1e-6). A screen drawn at four times its epsilon is rejected.
2. **End to end through ``ebm_cate.run_plan``**: a recording sampler sees the continuous
   covariates' histograms at the plan's calibration and one top-k at the plan's k, scale and
   epsilon, both on the effect fold's fitting rows; the effect model is fitted on exactly the
   chosen columns with the accounting of the effect budget's rest; and the effect module's
   events add up to the charge exactly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.mechanisms import dp_ebm, ebm_cate, effect_screen
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.effect_screen import EffectScreen
from service.mechanisms.noise import OpenDPSampler
from service.releases.kinds.ebm_cate import EbmCateRequest, to_mechanism_params
from tests.audit.clopper_pearson import events_epsilon_lower_bound
from tests.audit.test_end_to_end_noise import RecordingSampler

FAMILY_LEVEL = 1e-6
RUNS = 3000
EPSILON = 1.0
BOUND = 1.0


def _neighbours() -> tuple[tuple[NDArray[np.float64], NDArray[np.float64]], ...]:
    """Three binary covariates, targets of 1. Without the replaced row the sums are
    (21, 21, 21); the row (x = (0, 1, 1)) makes them (20, 22, 22), its replacement
    (x = (1, 0, 0)) (22, 20, 20): every score moves by 2 K = 2, the first against the others."""
    rows = [(1.0, 1.0, 1.0)] * 21
    x = np.array([(0.0, 1.0, 1.0), *rows])
    neighbour = x.copy()
    neighbour[0] = (1.0, 0.0, 0.0)
    targets = np.ones(x.shape[0])
    return (x, targets), (neighbour, targets)


def _draws(
    data: tuple[NDArray[np.float64], NDArray[np.float64]], epsilon: float
) -> NDArray[np.int64]:
    x, targets = data
    screen = EffectScreen(epsilon, 1, BOUND, x.shape[0])
    sampler = OpenDPSampler()
    lower, upper = np.zeros(3), np.ones(3)
    return np.array([screen.select(targets, x, lower, upper, sampler)[0] for _ in range(RUNS)])


def _epsilon_lower_bound(first: NDArray[np.int64], second: NDArray[np.int64]) -> float:
    """Largest CP lower bound on log P(S) / P'(S) over the events {chosen = j} and their
    complements, both directions."""
    events_first = [first == j for j in range(3)] + [first != j for j in range(3)]
    events_second = [second == j for j in range(3)] + [second != j for j in range(3)]
    return events_epsilon_lower_bound(events_first, events_second, FAMILY_LEVEL)


def test_selection_channel_audit_and_power() -> None:
    first, second = _neighbours()
    bound = _epsilon_lower_bound(_draws(first, EPSILON), _draws(second, EPSILON))
    assert 0.0 < bound <= EPSILON, bound
    wrong = 4 * EPSILON
    bound_wrong = _epsilon_lower_bound(_draws(first, wrong), _draws(second, wrong))
    assert bound_wrong > EPSILON, bound_wrong


def test_release_screens_on_the_fitting_rows_and_fits_the_chosen_columns(monkeypatch: Any) -> None:
    q, n = 12, 8000
    rng = np.random.default_rng(11)
    x = np.column_stack([rng.binomial(1, 0.5, (n, q - 2)), rng.uniform(0, 10, (n, 2))])
    a = rng.binomial(1, 0.5, n).astype(float)
    y = np.clip(2 + x[:, 1] + a * (1 + 2 * x[:, 0]) + rng.normal(0, 1, n), -5, 15)
    domain = PublicDomain(
        x_lower=np.zeros(q),
        x_upper=np.concatenate([np.ones(q - 2), [10.0, 10.0]]),
        y_lower=-5.0,
        y_upper=15.0,
        n=n,
        design=StudyDesign.OBSERVATIONAL,
        x_codes=tuple([(0, 1)] * (q - 2) + [None, None]),
    )
    params = to_mechanism_params(EbmCateRequest(epsilon=2.0), domain)
    state = ebm_cate.make_plan(domain, params)
    screen = state.screen
    assert screen is not None
    assert screen.bins is not None
    assert state.effect_accounting is not None
    fits: list[dict[str, Any]] = []
    original = dp_ebm.fit_regressor

    def spy(*args: Any, **kwargs: Any) -> Any:
        fits.append(
            {
                "n_features": int(args[2].shape[0]),
                "rows": int(args[0].shape[0]),
                "accounting": args[6],
            }
        )
        return original(*args, **kwargs)

    monkeypatch.setattr("service.mechanisms.ebm_cate.estimation.fit_regressor", spy)
    sampler = RecordingSampler()
    out = ebm_cate.run_plan(
        Arrays(x=x, a=a, y=y),
        domain,
        state,
        rng=np.random.default_rng(13),
        progress=lambda fraction, stage: None,
        names=None,
        noise=sampler,
    )
    # one top-k at the plan's k, scale and epsilon over all q covariates
    top_ks = [d for d in sampler.draws if d["type"] == "noisy_top_k"]
    assert len(top_ks) == 1
    call = top_ks[0]
    assert (call["candidates"], call["dim"]) == (q, effect_screen.COLUMNS)
    assert (call["scale"], call["sensitivity"], call["epsilon"]) == (
        screen.scale,
        screen.sensitivity,
        screen.epsilon,
    )
    # the histograms of the two continuous covariates at the plan's calibration
    gaussians = [d for d in sampler.draws if d["type"] == "gaussian"]
    histograms = [g for g in gaussians if g["dim"] == 2 * 32]
    assert len(histograms) == 1
    assert histograms[0]["scale"] == screen.bins.calibration.sigma
    assert screen.rows == state.effect_fit_size
    # the effect model: the chosen columns, the fitting rows, the rest's accounting
    effect_fit = fits[-1]
    assert effect_fit["n_features"] == effect_screen.COLUMNS
    assert effect_fit["rows"] == state.effect_fit_size
    assert effect_fit["accounting"] == state.effect_accounting
    assert out["screened_columns"] == sorted(call["chosen"])
    # the effect module's events add up to the charge; the model's epsilon is the rest
    record = state.record
    effect = [e for e in record.events if e.module == "effect"]
    assert math.fsum(e.epsilon for e in effect) == record.epsilon
    assert math.fsum(e.delta for e in effect) == record.delta
    model = effect[-1]
    assert state.effect_accounting == dp_ebm.solve_dp_ebm_epsilon_p(model.epsilon, model.delta)
