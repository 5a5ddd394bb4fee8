"""Categorical covariates in released models are read per declared code: a DP-EBM shape
function lists each code's value (not only bins between codes that no row can take), and an
uplift grid's cells are labelled by the codes in them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpcurator.cli import render
from dpcurator.results import EbmShapeResult
from service.mechanisms import ebm_cate as ec
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.dp_ebm import SafeEbm
from service.mechanisms.noise import SeededSampler


def test_a_coded_feature_has_one_value_per_code() -> None:
    # scores: missing, one per bin (len(cuts) + 1), unknown; a binary flag's DP cuts can fall
    # anywhere in (0, 1) and leave an empty middle bin
    safe = SafeEbm(
        intercept=0.0,
        offset=0.0,
        cuts=((0.033, 0.767), (1.5, 3.5), (40.0,)),
        scores=((9.0, -0.2, 7.0, 0.4, 9.0), (9.0, 1.0, 2.0, 3.0, 9.0), (9.0, 0.1, 0.2, 9.0)),
        lower=(0.0, 1.0, 18.0),
        upper=(1.0, 5.0, 90.0),
        names=("diabetes", "stage", "age"),
    )
    shapes = safe.shape_functions([(1, 0), (1, 2, 4, 5), None])
    assert shapes[0]["codes"] == [0, 1]
    assert shapes[0]["code_values"] == [-0.2, 0.4]  # the empty middle bin's 7.0 is no code's
    assert shapes[1]["codes"] == [1, 2, 4, 5]
    assert shapes[1]["code_values"] == [1.0, 2.0, 3.0, 3.0]
    assert "codes" not in shapes[2]
    assert "code_values" not in shapes[2]
    assert shapes[0]["edges"] == [0.0, 0.033, 0.767, 1.0]  # the bins stay as they were
    assert shapes == [{**s, **safe.shape_functions()[i]} for i, s in enumerate(shapes)]
    # each code's value is what the model predicts there, beside the other features' terms
    for j, shape in enumerate(shapes[:2]):
        for code, value in zip(shape["codes"], shape["code_values"], strict=True):
            point = np.array([[0.0, 1.0, 18.0]])
            point[0, j] = code
            others = safe.predict(point) - value
            point[0, j] = shape["codes"][0]
            assert safe.predict(point) - shape["code_values"][0] == pytest.approx(others)


def _study(n: int, rng: np.random.Generator) -> Arrays:
    x = np.column_stack([rng.uniform(0, 10, n), rng.integers(0, 2, n), rng.integers(1, 4, n)])
    a = (rng.uniform(size=n) < 0.5).astype(np.float64)
    y = 0.3 * x[:, 0] + a * (1.0 + 2.0 * x[:, 1]) + rng.normal(0, 1, n)
    return Arrays(x=x.astype(np.float64), a=a, y=np.clip(y, -5.0, 10.0))


@pytest.mark.parametrize("shrinkage", ["ate", "none"])
def test_an_ebm_cate_release_lists_its_categorical_shapes_by_code(shrinkage: str) -> None:
    n = 6000
    dom = PublicDomain(
        x_lower=np.array([0.0, 0.0, 1.0]),
        x_upper=np.array([10.0, 1.0, 3.0]),
        y_lower=-5.0,
        y_upper=10.0,
        n=n,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
        x_codes=(None, (0, 1), (1, 2, 3)),
        x_names=("age", "diabetes", "stage"),
    )
    out = ec.run(
        _study(n, np.random.default_rng(1)),
        dom,
        ec.EbmCateParams(epsilon=8.0, delta=1e-5, shrinkage=shrinkage),  # type: ignore[arg-type]
        rng=np.random.default_rng(2),
        progress=lambda _f, _s: None,
        noise=SeededSampler(np.random.default_rng(3)),
    )
    shapes = {s["feature"]: s for s in out["shape_functions"]}
    assert "codes" not in shapes["age"]
    assert shapes["diabetes"]["codes"] == [0, 1]
    assert shapes["stage"]["codes"] == [1, 2, 3]
    for name in ("diabetes", "stage"):
        shape = shapes[name]
        # each code's value is the (released, factor-scaled) value of the bin it falls in
        edges, values = np.asarray(shape["edges"]), shape["values"]
        for code, value in zip(shape["codes"], shape["code_values"], strict=True):
            k = min(int(np.searchsorted(edges[1:-1], code, side="right")), len(values) - 1)
            assert value == pytest.approx(values[k])
    # the release's own predictions differ between the codes by the code values' difference
    base = np.array([[5.0, 0.0, 1.0], [5.0, 1.0, 1.0]])
    diff = np.diff(ec.predict(out, base))[0]
    code_diff = shapes["diabetes"]["code_values"][1] - shapes["diabetes"]["code_values"][0]
    if shrinkage == "none":
        assert diff == pytest.approx(code_diff)
    else:  # anchor + factor * clip(model - centre, +-G): equal unless the clip bites
        assert abs(diff) <= abs(code_diff) + 1e-9
    # the client reads them
    parsed = EbmShapeResult.from_result(out)
    by_name = {s.feature: s for s in parsed.shape_functions}
    assert by_name["stage"].categorical
    assert not by_name["age"].categorical
    assert by_name["stage"].codes == [1, 2, 3]
    assert by_name["stage"].code_values == shapes["stage"]["code_values"]


def test_the_client_refuses_a_code_list_without_its_values() -> None:
    item: dict[str, Any] = {"feature": "sex", "edges": [0, 1], "values": [0.1], "codes": [0, 1]}
    with pytest.raises(ValueError, match="'code_values' is not a list"):
        EbmShapeResult.from_result({"shape_functions": [item]})
    with pytest.raises(ValueError, match="one code value per code"):
        EbmShapeResult.from_result({"shape_functions": [{**item, "code_values": [0.1]}]})


def test_an_uplift_cell_is_labelled_by_its_codes() -> None:
    grid = {
        "type": "grid",
        "bins": [2, 2, 2],
        "lower": [0, 0, 1],
        "upper": [10, 1, 5],
        "edges": [[0, 5, 10], [0, 0.5, 1], [1, 2.5, 5]],
        "codes": [None, [0, 1], [1, 2, 4, 5]],
    }
    cells = render.cell_ranges(grid, 8, ["age", "diabetes", "stage"])
    assert cells is not None
    assert cells[0] == "age [0, 5), diabetes = 0, stage in {1, 2}"
    assert cells[7] == "age [5, 10], diabetes = 1, stage in {4, 5}"
    # a cell between codes holds none of them
    gap = {**grid, "edges": [[0, 5, 10], [0, 0.2, 1], [1, 2.5, 5]]}
    labels = render.cell_ranges(gap, 8, ["age", "diabetes", "stage"])
    assert labels is not None
    assert "diabetes = 0" in labels[0]
    # a grid stored without codes (before 2026-11-29) reads as ranges
    old = {k: v for k, v in grid.items() if k != "codes"}
    assert render.cell_ranges(old, 8, ["age", "diabetes", "stage"])[0] == (  # type: ignore[index]
        "age [0, 5), diabetes [0, 0.5), stage [1, 2.5)"
    )


def test_a_categorical_shape_is_drawn_as_bars_over_its_codes(tmp_path: Any) -> None:
    from dpcurator.plots import plot_shape_functions

    parsed = EbmShapeResult.from_result(
        {
            "ate": 1.0,
            "shape_functions": [
                {"feature": "age", "edges": [18, 50, 90], "values": [-0.1, 0.1]},
                {
                    "feature": "diabetes",
                    "edges": [0, 0.03, 0.77, 1],
                    "values": [-0.2, 5.0, 0.4],
                    "codes": [0, 1],
                    "code_values": [-0.2, 0.4],
                },
            ],
        }
    )
    path = plot_shape_functions(parsed, tmp_path / "shapes.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
