"""The declared adjustment set in the CATE kinds' own nuisance models: ``ebm_cate``'s
``adjustment_columns`` (proof ebm_cate.md step 8) and ``cate_function``'s strict DP-EBM
nuisances (proof cate_function.md §8). The nuisance DP-EBMs are fitted on, and predict from,
the records projected onto the adjustment columns; the effect model keeps its own columns."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from service.mechanisms import ebm_cate as ec
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import SeededSampler

Q = 4
CONFOUNDERS = (1, 3)


def domain(n: int = 6000, **change: Any) -> PublicDomain:
    base = PublicDomain(
        x_lower=np.zeros(Q),
        x_upper=np.ones(Q),
        y_lower=-2.0,
        y_upper=5.0,
        n=n,
        design=StudyDesign.OBSERVATIONAL,
    )
    return dataclasses.replace(base, **change)


def params(**change: Any) -> ec.EbmCateParams:
    return dataclasses.replace(ec.EbmCateParams(epsilon=4.0, delta=1e-6), **change)


def data(n: int, seed: int) -> Arrays:
    """tau = 1 + 2 x0; x1 and x3 confound; x2 is noise."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, Q))
    a = (rng.uniform(size=n) < 0.2 + 0.3 * x[:, 1] + 0.3 * x[:, 3]).astype(float)
    y = np.clip(x[:, 1] + x[:, 3] + a * (1 + 2 * x[:, 0]) + rng.normal(0, 0.3, n), -2, 5)
    return Arrays(x, a, y)


class Spy:
    """Records the covariate widths and public bounds each nuisance fit sees, then delegates."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
        self.calls: list[tuple[str, int, int, int]] = []
        for name, x_fit, x_predict, lower in (
            ("propensity_scores", 0, 2, 3),
            ("outcome_predictions", 0, 3, 4),
        ):
            original = getattr(module, name)

            def spy(
                *args: Any,
                _original: Any = original,
                _name: str = name,
                _fit: int = x_fit,
                _predict: int = x_predict,
                _lower: int = lower,
                **kwargs: Any,
            ) -> Any:
                self.calls.append(
                    (
                        _name,
                        args[_fit].shape[1],
                        args[_predict].shape[1],
                        len(args[_lower]),
                    )
                )
                return _original(*args, **kwargs)

            monkeypatch.setattr(module, name, spy)


def _run(arrays: Arrays, public: PublicDomain, p: ec.EbmCateParams) -> dict[str, Any]:
    return ec.run(
        arrays,
        public,
        p,
        rng=np.random.default_rng(2),
        progress=lambda f, s: None,
        noise=SeededSampler(np.random.default_rng(3)),
    )


@pytest.mark.parametrize("shrinkage", ["ate", "none"])
def test_the_nuisances_see_the_adjustment_columns_and_the_effect_model_every_column(
    monkeypatch: pytest.MonkeyPatch, shrinkage: str
) -> None:
    from service.mechanisms.ebm_cate import estimation

    spy = Spy(monkeypatch, estimation)
    n = 6000
    result = _run(
        data(n, 1), domain(n), params(shrinkage=shrinkage, adjustment_columns=CONFOUNDERS)
    )
    assert spy.calls == [("propensity_scores", 2, 2, 2), ("outcome_predictions", 2, 2, 2)]
    assert result["adjustment_columns"] == list(CONFOUNDERS)
    assert [shape["feature"] for shape in result["shape_functions"]] == ["x0", "x1", "x2", "x3"]
    grid = np.column_stack([np.linspace(0, 1, 11), np.full((11, Q - 1), 0.5)])
    cate = ec.predict(result, grid)
    assert np.all(np.isfinite(cate))
    spy.calls.clear()
    full = _run(data(n, 1), domain(n), params(shrinkage=shrinkage))
    assert spy.calls == [("propensity_scores", 4, 4, 4), ("outcome_predictions", 4, 4, 4)]
    assert full["adjustment_columns"] is None


def test_an_rct_outcome_model_sees_the_adjustment_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.mechanisms.ebm_cate import estimation

    spy = Spy(monkeypatch, estimation)
    n = 6000
    rct = domain(n, design=StudyDesign.RCT, treatment_probability=0.5)
    arrays = data(n, 4)
    arrays = Arrays(arrays.x, (np.random.default_rng(5).uniform(size=n) < 0.5) * 1.0, arrays.y)
    _run(arrays, rct, params(shrinkage="none", adjustment_columns=(3,)))
    assert spy.calls == [("outcome_predictions", 1, 1, 1)]


def test_the_events_count_the_adjustment_columns_at_an_unchanged_charge() -> None:
    default = ec.plan(domain(), params(shrinkage="none"))
    adjusted = ec.plan(domain(), params(shrinkage="none", adjustment_columns=(3, 1)))
    features = {
        e.module: e.params["n_features"] for e in adjusted.events if "n_features" in e.params
    }
    assert features == {"propensity": 2, "outcome": 3, "effect": 4}
    assert (adjusted.epsilon, adjusted.delta) == (default.epsilon, default.delta)
    # every covariate, in any order, is the default release
    listed = ec.make_plan(domain(), params(adjustment_columns=(3, 2, 1, 0)))
    assert listed.record == ec.make_plan(domain(), params()).record
    assert listed.params.adjustment_columns is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"adjustment_columns": ()}, "at least one"),
        ({"adjustment_columns": (4,)}, r"\[0, 3\]"),
        ({"adjustment_columns": (1, 1)}, "repeat"),
        ({"adjustment_columns": (True,)}, "integers"),
        ({"adjustment_columns": (0,), "learner": "s"}, "S-learner"),
    ],
)
def test_invalid_adjustment_columns_are_refused_before_a_charge(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidParameters, match=message):
        ec.plan(domain(), params(**change))


def test_the_declared_set_is_the_kind_default_and_a_request_overrides_it() -> None:
    """The schema's ``adjust_for`` covariates are the DR learner's default adjustment set
    (also through cate_vector's and cate_function's ebm releases, which use the ebm_cate
    default request); a request's own list wins; the S-learner ignores the declared set."""
    from service.releases.kinds.ebm_cate import EbmCateKind, EbmCateRequest, default_request

    declared = domain(adjustment_set=CONFOUNDERS)
    kind = EbmCateKind()

    def widths(request: EbmCateRequest, public: PublicDomain) -> dict[str, int]:
        events = kind.record(request, public).events
        return {e.module: e.params["n_features"] for e in events if "n_features" in e.params}

    assert widths(EbmCateRequest(epsilon=1.0), declared)["propensity"] == 2
    assert widths(EbmCateRequest(epsilon=1.0), domain())["propensity"] == Q
    assert widths(default_request(1.0, None), declared)["outcome"] == 3
    given = EbmCateRequest(epsilon=1.0, adjustment_columns=[0, 1, 3])
    assert widths(given, declared)["propensity"] == 3
    assert widths(EbmCateRequest(epsilon=1.0, learner="s"), declared) == {"outcome": Q + 1}
    assert kind.quote(EbmCateRequest(epsilon=1.0), declared)["adjustment_columns"] == [1, 3]


def test_cate_function_nuisances_see_the_declared_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """cate_function's strict DP-EBM nuisances (its kernel bases) adjust for the schema's
    declared set; the record counts it; the charge is unchanged."""
    from service.mechanisms import cate_function as cf
    from service.mechanisms.cate_function import estimation

    spy = Spy(monkeypatch, estimation.dp_ebm_lib)
    n = 3000
    declared = domain(n, adjustment_set=CONFOUNDERS)
    p = cf.CateFunctionParams(epsilon=4.0, delta=1e-6, basis="rff", n_features=16)
    record = cf.plan(declared, p).record
    features = {e.module: e.params.get("n_features") for e in record.events}
    assert features["propensity"] == 2
    assert features["outcome"] == 3
    full = cf.plan(domain(n), p).record
    assert {e.module: e.params.get("n_features") for e in full.events}["propensity"] == Q
    assert (record.epsilon, record.delta) == (full.epsilon, full.delta)
    cf.run(
        data(n, 6),
        declared,
        p,
        rng=np.random.default_rng(2),
        noise=SeededSampler(np.random.default_rng(3)),
        progress=lambda f, s: None,
    )
    assert spy.calls == [("propensity_scores", 2, 2, 2), ("outcome_predictions", 2, 2, 2)]


def test_the_paper_r_learner_outcome_model_sees_the_adjustment_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The R-learner's outcome model eta(x) (paper label) is fitted and read on the projected
    records too; its propensity model as the DR learner's."""
    from service.mechanisms.ebm_cate import estimation

    widths: list[tuple[int, int]] = []
    original = estimation.fit_regressor

    def spy(x: Any, target: Any, lower: Any, *args: Any, **kwargs: Any) -> Any:
        widths.append((x.shape[1], len(lower)))
        return original(x, target, lower, *args, **kwargs)

    monkeypatch.setattr(estimation, "fit_regressor", spy)
    n = 6000
    paper = domain(n, allow_paper_mode=True)
    result = _run(data(n, 7), paper, params(learner="r", adjustment_columns=CONFOUNDERS))
    assert widths == [(2, 2), (Q, Q)]  # eta on the adjustment columns, the effect model on all
    assert result["adjustment_columns"] == list(CONFOUNDERS)
    assert result["guarantee"] == "paper"
