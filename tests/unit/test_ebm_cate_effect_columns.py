"""ebm_cate's pre-specified effect modifiers (``effect_columns``, proof step 7) and the effect
model's rounds rule (``dr_default_rounds``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from service.mechanisms import ebm_cate as ec
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import SeededSampler


def domain(n: int = 4000, q: int = 3) -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(q),
        x_upper=np.ones(q),
        y_lower=-2.0,
        y_upper=5.0,
        n=n,
        design=StudyDesign.OBSERVATIONAL,
    )


def params(**change: object) -> ec.EbmCateParams:
    return dataclasses.replace(ec.EbmCateParams(epsilon=1.0, delta=1e-5), **change)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"effect_columns": ()}, "at least one"),
        ({"effect_columns": (3,)}, r"\[0, 2\]"),
        ({"effect_columns": (-1,)}, r"\[0, 2\]"),
        ({"effect_columns": (0, 0)}, "repeat"),
        ({"effect_columns": (True,)}, "integers"),
        ({"effect_columns": (0,), "learner": "s"}, "S-learner"),
    ],
)
def test_invalid_effect_columns_are_refused_before_a_charge(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidParameters, match=message):
        ec.plan(domain(), params(**change))


def test_every_covariate_is_the_default_release() -> None:
    """A list of all q covariates (in any order) is the default: the same record and plan."""
    default = ec.make_plan(domain(), params())
    listed = ec.make_plan(domain(), params(effect_columns=(2, 0, 1)))
    assert listed.record == default.record
    assert listed.params.effect_columns is None


def test_the_effect_event_counts_the_effect_columns_only() -> None:
    """The effect model's event has n_features = len(effect_columns); the nuisances keep every
    covariate; the charge is unchanged (interpret spreads the same mu over fewer features)."""
    default = ec.plan(domain(), params(shrinkage="none"))
    subset = ec.plan(domain(), params(shrinkage="none", effect_columns=(2, 0)))
    features = {e.module: e.params["n_features"] for e in subset.events}
    assert features == {"propensity": 3, "outcome": 4, "effect": 2}
    assert (subset.epsilon, subset.delta) == (default.epsilon, default.delta)
    quote = ec.quote(domain(), params(shrinkage="none", effect_columns=(2, 0)))
    assert quote["effect_columns"] == [0, 2]
    full = ec.quote(domain(), params(shrinkage="none"))
    assert quote["boosting_noise_sd_per_step"] == pytest.approx(
        full["boosting_noise_sd_per_step"] * np.sqrt(2 / 3)
    )
    assert ec.prediction_noise_sd(domain(), quote) < ec.prediction_noise_sd(domain(), full)


def test_rounds_rule() -> None:
    """200 effect rounds below n eps per effect-model covariate 10^4, 400 from there; through
    the kind the width is the request's effect columns, else the screen's 8 columns where it
    runs, else q; an explicit max_rounds wins."""
    from service.releases.kinds.ebm_cate import EbmCateKind, EbmCateRequest

    rich = ec.DR_RICH_N_EPSILON_PER_COVARIATE
    assert ec.dr_default_rounds(36_000, 10.0, 36) == ec.DR_RICH_MAX_ROUNDS == 400
    assert ec.dr_default_rounds(35_999, 10.0, 36) == ec.DR_DEFAULT_MAX_ROUNDS == 200
    assert ec.dr_default_rounds(int(7 * rich), 1.0, 7) == 400
    kind = EbmCateKind()

    def rounds(request: EbmCateRequest, n: int) -> int:
        record = kind.record(request, domain(n, q=36))
        return int({e.module: e.params for e in record.events}["effect"]["max_rounds"])

    unscreened = EbmCateRequest(epsilon=1.0, effect_screen=False)
    assert rounds(unscreened, 100_000) == 200  # 2778 per covariate
    # the default screens 8 of the 36 (proof step 9): 12 500 per effect-model covariate
    assert rounds(EbmCateRequest(epsilon=1.0), 100_000) == 400
    assert rounds(EbmCateRequest(epsilon=1.0), 20_000) == 200  # 2500
    assert rounds(EbmCateRequest(epsilon=4.0), 100_000) == 400  # 11 111
    modifiers = list(range(7))
    assert rounds(EbmCateRequest(epsilon=1.0, effect_columns=modifiers), 100_000) == 400
    assert rounds(EbmCateRequest(epsilon=1.0, effect_columns=modifiers), 20_000) == 200
    assert rounds(EbmCateRequest(epsilon=4.0, max_rounds=150), 100_000) == 150


def _data(n: int, seed: int) -> Arrays:
    """tau = 1 + 2 x0; x1 confounds; x2 is noise."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, 3))
    a = (rng.uniform(size=n) < 0.3 + 0.4 * x[:, 1]).astype(float)
    y = np.clip(x[:, 1] + a * (1 + 2 * x[:, 0]) + rng.normal(0, 0.3, n), -2, 5)
    return Arrays(x, a, y)


@pytest.mark.parametrize("shrinkage", ["ate", "none"])
def test_release_varies_with_the_effect_columns_only(shrinkage: str) -> None:
    """The stored model reads its columns: shape functions for x0 only, predictions that
    follow x0 and ignore x1 and x2 (the nuisances still adjusted for x1)."""
    n = 8000
    result = ec.run(
        _data(n, 1),
        domain(n),
        params(epsilon=16.0, shrinkage=shrinkage, effect_columns=(0,)),
        rng=np.random.default_rng(2),
        progress=lambda f, s: None,
        noise=SeededSampler(np.random.default_rng(3)),
    )
    assert result["effect_columns"] == [0]
    assert result["model"]["columns"] == [0]
    assert [shape["feature"] for shape in result["shape_functions"]] == ["x0"]
    grid = np.column_stack([np.linspace(0, 1, 21), np.full(21, 0.2), np.full(21, 0.9)])
    moved = grid.copy()
    moved[:, 1:] = np.random.default_rng(4).uniform(0, 1, (21, 2))
    cate = ec.predict(result, grid)
    np.testing.assert_array_equal(ec.predict(result, moved), cate)
    assert cate[-1] - cate[0] > 1.0  # the true slope is 2
    default = ec.run(
        _data(n, 1),
        domain(n),
        params(epsilon=16.0, shrinkage=shrinkage),
        rng=np.random.default_rng(2),
        progress=lambda f, s: None,
        noise=SeededSampler(np.random.default_rng(3)),
    )
    assert "columns" not in default["model"]
    assert default["effect_columns"] is None


# ---- the kinds that run the ebm_cate release (cate_vector "ebm", cate_function "ebm") -------


def test_effect_columns_select_the_ebm_estimator_and_basis() -> None:
    """Given effect_columns, cate_vector's estimator and cate_function's basis are "ebm" (its
    field); with another estimator named, or a field of the other estimator, a 422 before any
    charge; cate_function refuses "ebm" where the ebm_cate default cannot anchor."""
    from service.problems import ValidationFailed
    from service.releases.kinds.cate_function import CateFunctionParams, basis_for
    from service.releases.kinds.cate_vector import CateVectorRequest, estimator_for

    dom = dataclasses.replace(domain(4000), design=StudyDesign.RCT, treatment_probability=0.5)
    points = [[0.5, 0.5, 0.5]]
    # a trial, n eps / q = 4000 * 0.5 / 3 < 1500: the rule alone keeps the kernel / ridge ...
    assert basis_for(CateFunctionParams(epsilon=0.5), dom) == "exact"
    assert estimator_for(CateVectorRequest(points=points, epsilon=0.5), dom) == "ridge"
    # ... the effect modifiers ask for the ebm release
    assert basis_for(CateFunctionParams(epsilon=0.5, effect_columns=[0]), dom) == "ebm"
    vector = CateVectorRequest(points=points, epsilon=0.5, effect_columns=[0])
    assert estimator_for(vector, dom) == "ebm"
    refused = [
        lambda: basis_for(CateFunctionParams(epsilon=2.0, effect_columns=[0], basis="rff"), dom),
        lambda: basis_for(
            CateFunctionParams(epsilon=2.0, effect_columns=[0], regularization=0.3), dom
        ),
        lambda: estimator_for(
            CateVectorRequest(points=points, epsilon=2.0, effect_columns=[0], estimator="ridge"),
            dom,
        ),
        lambda: estimator_for(
            CateVectorRequest(points=points, epsilon=2.0, effect_columns=[0], ridge=1.0), dom
        ),
        lambda: basis_for(CateFunctionParams(epsilon=2.0, basis="ebm"), domain(350)),
    ]
    for call in refused:
        with pytest.raises(ValidationFailed):
            call()
    with pytest.raises(InvalidParameters, match=r"\[0, 2\]"):
        basis_for(CateFunctionParams(epsilon=2.0, effect_columns=[5]), dom)


def test_cate_function_and_vector_answer_the_effect_columns_model() -> None:
    """The function stored from an ebm release with effect_columns answers alike at points
    that differ outside those columns; cate_vector's estimates too."""
    from service.functions.payload import SECRET_KEY
    from service.releases.kinds.cate_function import CateFunctionKind, CateFunctionParams
    from service.releases.kinds.cate_vector import CateVectorKind, CateVectorRequest

    n = 8000
    dom = domain(n)
    options = {
        "rng": np.random.default_rng(2),
        "noise": SeededSampler(np.random.default_rng(3)),
        "progress": lambda f, s: None,
    }
    out = CateFunctionKind().run(
        _data(n, 1), dom, CateFunctionParams(epsilon=16.0, effect_columns=[0]), **options
    )
    assert out["basis"] == "ebm"
    fitted = out[SECRET_KEY].fitted
    assert fitted.model is not None
    assert fitted.model["columns"] == [0]
    grid = np.column_stack([np.linspace(0, 1, 11), np.full(11, 0.1), np.full(11, 0.9)])
    moved = np.column_stack([grid[:, 0], np.full(11, 0.8), np.full(11, 0.2)])
    answers = fitted.released(fitted.mean(grid))
    np.testing.assert_array_equal(fitted.released(fitted.mean(moved)), answers)
    assert answers[-1] - answers[0] > 0.5  # tau from 1 to 3, deviations clipped at G = K / 4
    points = np.vstack([grid, moved]).tolist()
    vector = CateVectorKind().run(
        _data(n, 1),
        dom,
        CateVectorRequest(points=points, epsilon=16.0, effect_columns=[0]),
        **options,
    )
    assert vector["estimator"] == "ebm"
    assert vector["effect_columns"] == [0]
    estimates = np.asarray(vector["estimates"])
    np.testing.assert_array_equal(estimates[:11], estimates[11:])


def test_declared_effect_modifiers_are_the_kinds_default() -> None:
    """The owner's declared modifiers (``PublicDomain.effect_modifiers``) are the default
    effect columns of ebm_cate and of the ebm estimator / basis rules; a request's own list
    wins (every covariate: the full model); the S-learner has no effect model and ignores
    them."""
    from service.releases.kinds.cate_function import CateFunctionParams, basis_for
    from service.releases.kinds.cate_vector import CateVectorRequest, estimator_for
    from service.releases.kinds.ebm_cate import EbmCateKind, EbmCateRequest

    declared = dataclasses.replace(domain(4000), effect_modifiers=(1,))
    kind = EbmCateKind()

    def width(request: EbmCateRequest, dom: PublicDomain) -> int:
        events = {e.module: e.params for e in kind.record(request, dom).events}
        return int(events["effect"]["n_features"])

    assert width(EbmCateRequest(epsilon=1.0), declared) == 1
    assert width(EbmCateRequest(epsilon=1.0), domain(4000)) == 3
    assert width(EbmCateRequest(epsilon=1.0, effect_columns=[0, 1, 2]), declared) == 3
    assert width(EbmCateRequest(epsilon=1.0, effect_columns=[2, 0]), declared) == 2
    s_record = kind.record(EbmCateRequest(epsilon=1.0, learner="s"), declared)
    assert [e.params["n_features"] for e in s_record.events] == [4]
    assert kind.quote(EbmCateRequest(epsilon=1.0), declared)["effect_columns"] == [1]
    # In a trial, n eps / q = 4000 * 0.5 / 3 < 1500 <= 4000 * 0.5 / 1: the rules switch to
    # the ebm release (an observational design runs it wherever it is anchored)
    trial = dataclasses.replace(domain(4000), design=StudyDesign.RCT, treatment_probability=0.5)
    assert basis_for(CateFunctionParams(epsilon=0.5), trial) == "exact"
    trial_declared = dataclasses.replace(trial, effect_modifiers=(1,))
    assert basis_for(CateFunctionParams(epsilon=0.5), trial_declared) == "ebm"
    points = [[0.5, 0.5, 0.5]]
    assert estimator_for(CateVectorRequest(points=points, epsilon=0.5), trial) == "ridge"
    assert estimator_for(CateVectorRequest(points=points, epsilon=0.5), trial_declared) == "ebm"
