"""The strict ate's pre-specified adjustment set (``adjustment_columns``; ate_strict proof §15):
the release is the same mechanism run on the records' projection onto the declared columns."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from service.mechanisms import ate_ipw, ate_strict
from service.mechanisms.ate_strict import AteStrictParams
from service.mechanisms.ate_strict.aggregate import AggregateParams
from service.mechanisms.domain import (
    Arrays,
    PublicDomain,
    StudyDesign,
    project,
    project_domain,
)
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import SeededSampler
from service.releases.kinds.ate import AteKind, AteParams, to_mechanism_params

TRUE_ATE = 1.0
Q = 5
CONFOUNDERS = (0, 3)  # the propensity and the outcome read x0; the outcome reads x3 too


def domain(n: int = 8000, **change: Any) -> PublicDomain:
    base = PublicDomain(
        x_lower=-np.ones(Q),
        x_upper=np.ones(Q),
        y_lower=-3.0,
        y_upper=3.0,
        n=n,
        design=StudyDesign.OBSERVATIONAL,
    )
    return dataclasses.replace(base, **change)


def sample(n: int, rng: np.random.Generator) -> Arrays:
    x = rng.uniform(-1.0, 1.0, size=(n, Q))
    a = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-1.5 * x[:, 0]))).astype(np.float64)
    y = x[:, 0] + 0.5 * x[:, 3] + TRUE_ATE * a + rng.normal(0.0, 0.5, n)
    return Arrays(x=x, a=a, y=np.clip(y, -3.0, 3.0))


def _quiet(fraction: float, stage: str) -> None:
    del fraction, stage


def _run(module: Any, arrays: Arrays, public: PublicDomain, params: Any) -> dict[str, Any]:
    return dict(
        module.run(
            arrays,
            public,
            params,
            rng=np.random.default_rng(7),
            noise=SeededSampler(np.random.default_rng(8)),
            progress=_quiet,
        )
    )


@pytest.mark.parametrize(
    "params",
    [
        AteStrictParams(epsilon=2.0, delta=1e-6, nuisance="dp_linear"),
        AteStrictParams(epsilon=2.0, delta=1e-6, nuisance="dp_linear", cross_fit=True),
        ate_ipw.AteIpwParams(epsilon=2.0, delta=1e-6),
    ],
    ids=["dp_linear", "dp_linear-cross-fit", "ipw"],
)
def test_the_release_is_the_mechanism_on_the_projected_records(params: Any) -> None:
    """Same randomness, same numbers: with adjustment_columns the release equals the release
    on the records' projection (a public row-wise map, so the privacy proof carries over)."""
    module = ate_ipw if isinstance(params, ate_ipw.AteIpwParams) else ate_strict
    arrays = sample(8000, np.random.default_rng(1))
    adjusted = _run(
        module, arrays, domain(), dataclasses.replace(params, adjustment_columns=CONFOUNDERS)
    )
    projected = _run(module, *project(arrays, domain(), CONFOUNDERS), params)
    assert adjusted["adjustment_columns"] == list(CONFOUNDERS)
    assert projected["adjustment_columns"] is None
    for key in ("estimate", "ci_lower", "ci_upper", "s_theta", "bound"):
        assert adjusted[key] == projected[key], key
    full = _run(module, arrays, domain(), params)
    assert full["estimate"] != adjusted["estimate"]  # the models did see fewer covariates


def test_the_nuisance_events_count_the_adjustment_columns() -> None:
    """DP-EBM nuisances: interpret spreads the same mu over q' features; the charge is the same
    and each nuisance event records n_features = q'."""
    full = ate_strict.plan(domain(), AteStrictParams(epsilon=1.0, delta=1e-6))
    adjusted = ate_strict.plan(
        domain(), AteStrictParams(epsilon=1.0, delta=1e-6, adjustment_columns=CONFOUNDERS)
    )
    assert (adjusted.epsilon, adjusted.delta) == (full.epsilon, full.delta)
    features = {
        e.module: e.params.get("n_features")
        for e in adjusted.events
        if e.module in ("propensity", "outcome")
    }
    assert features == {"propensity": len(CONFOUNDERS), "outcome": len(CONFOUNDERS) + 1}  # + A
    assert adjusted == ate_strict.plan(
        project_domain(domain(), CONFOUNDERS), AteStrictParams(epsilon=1.0, delta=1e-6)
    )
    listed = ate_strict.plan(
        domain(), AteStrictParams(epsilon=1.0, delta=1e-6, adjustment_columns=(4, 2, 0, 1, 3))
    )
    assert listed == full  # every covariate is the default release


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ((), "at least one"),
        ((5,), r"\[0, 4\]"),
        ((-1,), r"\[0, 4\]"),
        ((0, 0), "repeat"),
        ((True,), "integers"),
    ],
)
def test_invalid_adjustment_columns_are_refused_before_a_charge(
    columns: tuple[int, ...], message: str
) -> None:
    with pytest.raises(InvalidParameters, match=message):
        ate_strict.plan(
            domain(), AteStrictParams(epsilon=1.0, delta=1e-6, adjustment_columns=columns)
        )
    with pytest.raises(InvalidParameters, match=message):
        ate_ipw.plan(domain(), ate_ipw.AteIpwParams(1.0, 1e-6, adjustment_columns=columns))


def test_the_schema_declared_set_is_the_default_and_a_request_overrides_it() -> None:
    declared = domain(adjustment_set=CONFOUNDERS)
    single = AteParams(epsilon=1.0, chunks=1)  # one release (the chunks rule cuts this n eps)
    strict = to_mechanism_params(single, declared)
    assert isinstance(strict, AteStrictParams)
    assert strict.adjustment_columns == CONFOUNDERS
    own = AteParams(epsilon=1.0, adjustment_columns=[1, 2], chunks=1)
    assert to_mechanism_params(own, declared).adjustment_columns == (1, 2)  # type: ignore[union-attr]
    ipw = to_mechanism_params(AteParams(epsilon=1.0, estimator="ipw"), declared)
    assert ipw.adjustment_columns == CONFOUNDERS  # type: ignore[union-attr]
    assert to_mechanism_params(single, domain()).adjustment_columns is None  # type: ignore[union-attr]
    # in chunks, every chunk adjusts for the declared set, or the request's
    chunked = to_mechanism_params(AteParams(epsilon=1.0), declared)
    assert isinstance(chunked, AggregateParams)
    assert chunked.chunk.adjustment_columns == CONFOUNDERS
    listed = to_mechanism_params(AteParams(epsilon=1.0, adjustment_columns=[1, 2]), declared)
    assert listed.chunk.adjustment_columns == (1, 2)  # type: ignore[union-attr]
    quote = AteKind().quote(AteParams(epsilon=1.0), declared)
    assert quote["adjustment_columns"] == list(CONFOUNDERS)


def test_a_design_without_nuisance_models_ignores_the_declared_set_and_refuses_a_list() -> None:
    trial = domain(design=StudyDesign.RCT, treatment_probability=0.5, adjustment_set=CONFOUNDERS)
    none = to_mechanism_params(AteParams(epsilon=1.0, nuisance="none"), trial)
    assert none.adjustment_columns is None  # type: ignore[union-attr]
    AteKind().record(AteParams(epsilon=1.0, nuisance="none"), trial)
    with pytest.raises(InvalidParameters, match="needs nuisance models"):
        AteKind().record(AteParams(epsilon=1.0, nuisance="none", adjustment_columns=[0]), trial)
    # the trial's outcome model adjusts for the declared baseline covariates
    linear = AteKind().record(AteParams(epsilon=1.0), trial)
    assert linear == AteKind().record(
        AteParams(epsilon=1.0),
        project_domain(dataclasses.replace(trial, adjustment_set=None), CONFOUNDERS),
    )


def test_other_estimators_refuse_the_field() -> None:
    with pytest.raises(ValueError, match="adjustment_columns"):
        AteParams(epsilon=1.0, estimator="rct_difference", adjustment_columns=[0])


def test_the_ate_default_reused_by_other_kinds_adjusts_for_the_declared_set() -> None:
    """The CATE kinds' whole-data anchor and uplift_table's one-cell default run
    ``ate_strict.default_params``: it carries the declared set (none where there are no models)."""
    declared = domain(adjustment_set=CONFOUNDERS)
    assert ate_strict.default_params(declared, 1.0).adjustment_columns == CONFOUNDERS
    assert ate_strict.default_params(domain(), 1.0).adjustment_columns is None
    assert ate_strict.default_adjustment_columns(declared, "none") is None
