"""uplift_table's ebm estimator (proof step 7): the public estimator rule, the grid over the
effect columns (the released model's own bins) and the table that reproduces the model."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from service.mechanisms import ebm_cate, uplift
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import SeededSampler
from service.problems import ValidationFailed
from service.releases.kinds.ebm_cate import EbmCateKind, EbmCateRequest
from service.releases.kinds.uplift_table import (
    UpliftTableKind,
    UpliftTableRequest,
    estimator_for,
)


def domain(n: int = 20_000, modifiers: tuple[int, ...] | None = (0, 2)) -> PublicDomain:
    """Two numeric covariates and a binary one (codes 0, 1); covariates 0 and 2 declared
    effect modifiers."""
    return PublicDomain(
        x_lower=np.array([0.0, 0.0, 0.0]),
        x_upper=np.array([10.0, 1.0, 1.0]),
        y_lower=-5.0,
        y_upper=10.0,
        n=n,
        design=StudyDesign.OBSERVATIONAL,
        x_codes=(None, None, (0, 1)),
        effect_modifiers=modifiers,
    )


def request(**fields: object) -> UpliftTableRequest:
    return UpliftTableRequest.model_validate({"epsilon": 2.0, **fields})


def test_the_rule_picks_ebm_where_modifiers_are_declared_and_the_model_learns() -> None:
    assert estimator_for(request(), domain()) == "ebm"
    assert estimator_for(request(), domain(modifiers=None)) == "table"
    # observational: wherever the anchored ebm_cate default can run (not below its minimum
    # epsilon, nor on too few rows for its calibration rows) ...
    assert estimator_for(request(epsilon=0.05), domain()) == "ebm"
    assert estimator_for(request(epsilon=0.01), domain()) == "table"
    assert estimator_for(request(), domain(n=300)) == "table"
    # ... in a trial where the DP-EBM learns on the modifiers (n eps / q' >= 1500)
    trial = dataclasses.replace(domain(), design=StudyDesign.RCT, treatment_probability=0.5)
    assert estimator_for(request(epsilon=0.05), trial) == "table"  # 20000 * 0.05 / 2 = 500
    assert estimator_for(request(epsilon=0.2), trial) == "ebm"  # 2000
    assert estimator_for(request(min_count=2.0), domain()) == "table"  # a table field
    assert estimator_for(request(bins=[4, 1, 2]), domain()) == "ebm"
    assert estimator_for(request(bins=[4, 3, 1]), domain()) == "table"  # leaves 2 uncut
    assert estimator_for(request(bins=[4, 2]), domain()) == "table"  # wrong length
    assert estimator_for(request(effect_columns=[1]), domain(modifiers=None)) == "ebm"
    assert estimator_for(request(estimator="table"), domain()) == "table"


@pytest.mark.parametrize(
    ("fields", "pointer"),
    [
        ({"estimator": "ebm", "shrinkage": "none"}, "#/params/shrinkage"),
        ({"effect_columns": [0], "partition": "kmeans", "clusters": 3}, "#/params/partition"),
        ({"effect_columns": [0], "estimator": "table"}, "#/params/effect_columns"),
        ({"estimator": "ebm", "bins": [4, 3, 1]}, "#/params/bins/2"),
    ],
)
def test_contradictory_requests_are_refused_before_a_charge(
    fields: dict[str, object], pointer: str
) -> None:
    with pytest.raises(ValidationFailed) as raised:
        UpliftTableKind().record(request(**fields), domain())
    assert pointer in [e["pointer"] for e in raised.value.extensions["errors"]]


def test_the_record_is_the_ebm_cate_release_it_runs() -> None:
    """Post-processing costs nothing: the charge is ebm_cate's default with the same columns."""
    record = UpliftTableKind().record(request(), domain())
    same = EbmCateKind().record(EbmCateRequest(epsilon=2.0), domain())
    assert record == same
    named = UpliftTableKind().record(request(effect_columns=[1]), domain(modifiers=None))
    assert named == EbmCateKind().record(
        EbmCateRequest(epsilon=2.0, effect_columns=[1]), domain(modifiers=None)
    )
    with pytest.raises(InvalidParameters):
        UpliftTableKind().record(request(effect_columns=[3]), domain())


def test_edges_index_like_the_regular_grid() -> None:
    """``edge_index`` on the regular edges is ``cell_index``, and ``cell_centres`` lie in
    their own cells (categorical axes at their declared codes)."""
    dom = domain()
    bins = (5, 3, 2)
    edges = uplift.regular_edges(dom, bins)
    rng = np.random.default_rng(0)
    points = rng.uniform([0, 0, 0], [10, 1, 1], size=(500, 3))
    lower, upper = np.asarray(dom.x_lower), np.asarray(dom.x_upper)
    assert np.array_equal(
        uplift.edge_index(points, edges), uplift.cell_index(points, lower, upper, bins)
    )
    centres = uplift.cell_centres(dom, edges)
    assert centres.shape == (30, 3)
    assert np.array_equal(uplift.edge_index(centres, edges), np.arange(30))
    assert set(centres[:, 2]) == {0.0, 1.0}


def test_the_default_table_is_the_model_at_every_point() -> None:
    """On the model's own cuts the table reproduces an additive piecewise-constant model
    exactly; a model with more cuts than MAX_CELLS allows is thinned to fit."""
    dom = domain()
    cuts = [[1.0, 2.5, 7.0, 9.9], [0.25, 0.5, 0.75]]  # columns 0 and 2 (binary: its codes)

    def model(x: np.ndarray) -> np.ndarray:
        return np.asarray(
            np.searchsorted(cuts[0], x[:, 0], side="right") * 0.7
            - 1.3 * (x[:, 2] > 0.5)
            + 0.1 * np.searchsorted(cuts[0], x[:, 0], side="right") * (x[:, 2] > 0.5),
            dtype=np.float64,
        )

    edges = uplift.ebm_edges(dom, [0, 2], cuts)
    assert [len(e) - 1 for e in edges] == [5, 1, 2]
    table = uplift.ebm_table(model, dom, edges)
    rng = np.random.default_rng(1)
    points = np.column_stack(
        [rng.uniform(0, 10, 400), rng.uniform(0, 1, 400), rng.integers(0, 2, 400)]
    ).astype(np.float64)
    assert np.allclose(uplift.predict(table, points), model(points))
    many = [list(np.linspace(0.1, 9.9, 200)), list(np.linspace(0.02, 0.98, 150))]
    wide = dataclasses.replace(dom, x_codes=None)
    thinned = uplift.ebm_edges(wide, [0, 2], many)
    cells = math.prod(len(e) - 1 for e in thinned)
    assert 0.5 * uplift.MAX_CELLS < cells <= uplift.MAX_CELLS
    assert all(set(e[1:-1]) <= set(m) for e, m in zip([thinned[0], thinned[2]], many, strict=True))


def test_a_release_tabulates_the_ebm_cate_fit() -> None:
    """End to end on a small study: the ebm estimator's table, its lookups, and nothing of the
    model or the rows in the result."""
    dom = domain(n=4000)
    rng = np.random.default_rng(2)
    x = np.column_stack(
        [rng.uniform(0, 10, 4000), rng.uniform(0, 1, 4000), rng.integers(0, 2, 4000)]
    ).astype(np.float64)
    a = (rng.uniform(size=4000) < 0.5).astype(np.float64)
    y = x[:, 0] * 0.3 + a * (1.0 + 2.0 * x[:, 2]) + rng.normal(0, 1, 4000)
    out = UpliftTableKind().run(
        Arrays(x=x, a=a, y=np.clip(y, -5, 10)),
        dom,
        request(epsilon=8.0),
        rng=np.random.default_rng(3),
        noise=SeededSampler(np.random.default_rng(4)),
        progress=lambda _f, _s: None,
    )
    assert out["estimator"] == "ebm"
    assert out["guarantee"] == "strict"
    assert out["grid"]["bins"][1] == 1
    assert out["grid"]["bins"][2] == 2
    assert out["cells"] == len(out["uplift"]) == math.prod(out["grid"]["bins"])
    assert "model" not in out
    assert "shape_functions" not in out
    # the declared codes, so a cell reads "x2 = 1", not the range between the codes
    assert out["grid"]["codes"] == [None, None, [0, 1]]
    looked_up = uplift.predict(out, np.array([[5.0, 0.5, 0.0], [5.0, 0.5, 1.0]]))
    assert np.all(np.isfinite(looked_up))
    assert np.all(np.abs(looked_up) <= dom.outcome_range)
    assert ebm_cate.VERSION
    assert uplift.VERSION == "6"


def test_cate_vector_quotes_the_effect_columns_it_releases() -> None:
    """cate_vector's ebm quote is the quote of the release it runs: with effect_columns, the
    effect model's noise is that of the named columns (it ignored them before)."""
    from service.releases.kinds.cate_vector import CateVectorKind, CateVectorRequest

    dom = domain(modifiers=None)
    point = [[1.0, 0.5, 0.0]]
    every = CateVectorKind().quote(
        CateVectorRequest(points=point, epsilon=2.0, estimator="ebm"), dom
    )
    named = CateVectorKind().quote(
        CateVectorRequest(points=point, epsilon=2.0, effect_columns=[0]), dom
    )
    direct = EbmCateKind().quote(EbmCateRequest(epsilon=2.0, effect_columns=[0]), dom)
    assert named["effect_columns"] == [0]
    assert every["effect_columns"] is None
    assert named["approx_shape_noise_sd"] == direct["approx_shape_noise_sd"]
    assert named["approx_shape_noise_sd"] < every["approx_shape_noise_sd"]


def wide_domain(n: int = 20_000, q: int = 36) -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(q),
        x_upper=np.ones(q),
        y_lower=0.0,
        y_upper=65.0,
        n=n,
        design=StudyDesign.OBSERVATIONAL,
    )


def test_quotes_say_how_many_effect_modifiers_would_make_the_cate_worth_it() -> None:
    """Where every covariate enters the effect model and the verdict is not "possible", each
    CATE kind's quote gives the largest count of named modifiers whose quote is "possible"
    (checked by quoting it, and one more); none once modifiers are declared or named."""
    from service.releases.kinds.cate_function import CateFunctionKind, CateFunctionParams
    from service.releases.kinds.cate_vector import CateVectorKind, CateVectorRequest

    dom = wide_domain()
    block = EbmCateKind().quote(EbmCateRequest(epsilon=1.0), dom)["versus_ate"]
    assert block["verdict"] != "possible"
    count = block["effect_modifiers_worth_it"]
    assert 1 <= count < dom.q
    assert f"at most {count} effect modifiers" in block["message"]

    def verdict(k: int) -> str:
        named = EbmCateRequest(epsilon=1.0, effect_columns=list(range(k)))
        return str(EbmCateKind().quote(named, dom)["versus_ate"]["verdict"])

    assert verdict(count) == "possible"
    assert verdict(count + 1) != "possible"
    point = [[0.5] * dom.q]
    others = [
        CateVectorKind().quote(CateVectorRequest(points=point, epsilon=1.0), dom),
        CateFunctionKind().quote(CateFunctionParams(epsilon=1.0), dom),
        UpliftTableKind().quote(request(epsilon=1.0), dom),
    ]
    assert [o["versus_ate"]["effect_modifiers_worth_it"] for o in others] == [count] * 3
    declared = dataclasses.replace(dom, effect_modifiers=tuple(range(count)))
    quoted = EbmCateKind().quote(EbmCateRequest(epsilon=1.0), declared)["versus_ate"]
    assert quoted["verdict"] == "possible"
    assert "effect_modifiers_worth_it" not in quoted
    too_many = dataclasses.replace(dom, effect_modifiers=tuple(range(count + 2)))
    quoted = EbmCateKind().quote(EbmCateRequest(epsilon=1.0), too_many)["versus_ate"]
    assert quoted["effect_modifiers_worth_it"] is None  # declared: the hint does not apply


def test_the_quote_says_which_grid_the_table_reads_the_model_on() -> None:
    default = UpliftTableKind().quote(request(), domain())
    assert default["estimator"] == "ebm"
    assert default["bins"] is None
    assert default["cells_at_most"] >= 2
    assert "own DP bins" in default["grid_rule"]
    given = UpliftTableKind().quote(request(bins=[4, 1, 2]), domain())
    assert given["bins"] == [4, 1, 2]
    assert given["cells"] == 8
    assert "lost" in given["grid_rule"]  # coarser cells than the model's lose its variation


def test_a_grid_that_leaves_a_declared_modifier_uncut_says_why_it_is_the_table() -> None:
    """A trial walkthrough's cut_points on age alone (diabetes declared too) turned the
    estimator into the epsilon-ADUM table silently; the quote now says why."""
    dom = dataclasses.replace(domain(), design=StudyDesign.RCT, treatment_probability=0.5)
    partial = UpliftTableKind().quote(request(cut_points={"x0": [5.0]}), dom)
    assert partial["estimator"] == "table"
    assert "leaves the declared effect modifier(s) x2 uncut" in partial["estimator_note"]
    full = UpliftTableKind().quote(request(cut_points={"x0": [5.0], "x2": [0.5]}), dom)
    assert full["estimator"] == "ebm"
    assert "estimator_note" not in full
    named = UpliftTableKind().quote(request(cut_points={"x0": [5.0]}, estimator="table"), dom)
    assert "estimator_note" not in named


def test_an_observational_table_refusal_says_why_it_is_the_table_and_names_the_modifiers() -> None:
    """A health economist cut one of two declared modifiers on observational data: the 422
    asked for effect_columns the owner had already declared and said 'adjusted for every
    covariate' with an adjustment set declared. It now names the declared modifiers, the
    adjustment set and why the table was chosen (also for a table-only field)."""
    dom = dataclasses.replace(domain(), adjustment_set=(0, 1))
    for fields, why in (
        ({"cut_points": {"x0": [5.0]}}, "leaves the declared effect modifier(s) x2 uncut"),
        ({"quantile_cuts": {"x0": 4}}, "quantile_cuts shape(s) the table only"),
    ):
        with pytest.raises(InvalidParameters) as refused:
            UpliftTableKind().quote(request(**fields), dom)
        text = str(refused.value)
        assert "cut every declared effect modifier (x0, x2)" in text
        assert "adjusted for the declared adjustment set" in text
        assert "name effect_columns" not in text
        assert "Why the table: estimator 'table' (epsilon-ADUM)" in text
        assert why in text
    plain = domain(modifiers=None)
    with pytest.raises(InvalidParameters) as refused:
        UpliftTableKind().quote(request(cut_points={"x0": [5.0]}), plain)
    assert "name effect_columns" in str(refused.value)
    assert "adjusted for every covariate" in str(refused.value)
    assert "Why the table" not in str(refused.value)
