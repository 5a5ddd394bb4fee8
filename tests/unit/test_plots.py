"""Client result wrappers and plots on synthetic result dicts (the later kinds are not served yet).

The dicts for ``cate_vector``, ``cate_function``, ``ebm_cate`` and ``uplift_table`` follow the
shapes the client documents (service/client/results.py); they are checked against the server's
kinds when those land (issue 6).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from dpcurator.models import LedgerEntry, Release
from dpcurator.plots import (
    default_ate_labels,
    plot_ate,
    plot_budget_spend,
    plot_cate_slice,
    plot_shape_functions,
)
from dpcurator.results import (
    AteResult,
    CateVectorResult,
    EbmShapeResult,
    FunctionEvaluation,
    FunctionHandle,
    FunctionInfo,
    GenericResult,
    Prediction,
    UpliftTable,
    parse_result,
    z_value,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

ATE = {
    "estimate": 1.02,
    "ci_lower": 0.81,
    "ci_upper": 1.23,
    "ci_level": 0.95,
    "half_width": 0.21,
    "guarantee": "strict",
    "design": "rct",
    "epsilon": 1.0,
    "delta": 1e-5,
}


def release(kind: str, result: dict[str, Any] | None, rid: str = "r1") -> Release:
    return Release(
        id=rid,
        dataset_id="d1",
        principal_id="p1",
        kind=kind,
        status="done" if result is not None else "running",
        progress=1.0,
        stage="done",
        guarantee="strict",
        epsilon=1.0,
        delta=1e-5,
        params={},
        mechanism={},
        result=result,
        created_at="2026-11-21T10:00:00+00:00",
    )


def entry(seq: int, minute: int, entry_type: str, spent: str, total: str) -> LedgerEntry:
    return LedgerEntry(
        seq=seq,
        entry_type=entry_type,
        created_at=f"2026-11-21T10:{minute:02d}:00.000000+00:00",
        principal_id="p",
        epsilon=Decimal("0.5") if entry_type == "charge" else Decimal(0),
        delta=Decimal(0),
        epsilon_spent=Decimal(spent),
        delta_spent=Decimal(0),
        epsilon_total=Decimal(total),
        delta_total=Decimal("0.00001"),
        prev_hash="0" * 64,
        row_hash="1" * 64,
    )


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 2000


def test_ate_result_parses_and_plots(tmp_path: Path) -> None:
    parsed = parse_result(release("ate", ATE))
    assert isinstance(parsed, AteResult)
    assert (parsed.estimate, parsed.ci_lower, parsed.ci_upper) == (1.02, 0.81, 1.23)
    assert parsed.design == "rct"
    out = plot_ate([parsed, parsed], tmp_path / "ate.png", labels=["a", "b"], reference=1.0)
    assert is_png(out)
    with pytest.raises(ValueError, match="one label per result"):
        plot_ate([parsed], tmp_path / "x.png", labels=["a", "b"])
    # the default labels tell two releases at one epsilon apart (an analyst's plot of a
    # declared-clip and an adaptive-clip ATE read "ε=0.5" twice)
    adaptive = parse_result(release("ate", {**ATE, "clip": "adaptive"}))
    declared = parse_result(release("ate", {**ATE, "clip": "declared"}))
    assert isinstance(adaptive, AteResult)
    assert isinstance(declared, AteResult)
    labels = default_ate_labels([adaptive, declared, declared])
    epsilon = f"ε={adaptive.epsilon:g}"
    assert labels == [
        f"{epsilon}, clip adaptive",
        f"{epsilon}, clip declared #1",
        f"{epsilon}, clip declared #2",
    ]


def test_budget_spend_plot(tmp_path: Path) -> None:
    entries = [
        entry(1, 0, "create", "0", "0"),
        entry(2, 1, "budget", "0", "3"),
        entry(3, 5, "charge", "0.5", "3"),
        entry(4, 9, "charge", "1.5", "3"),
    ]
    assert is_png(plot_budget_spend(entries, tmp_path / "sub" / "spend.png"))
    with pytest.raises(ValueError, match="no entries"):
        plot_budget_spend([], tmp_path / "empty.png")


def test_cate_vector_result_matches_the_kind() -> None:
    # The shape of service/mechanisms/cate_vector.run(): estimates; points are the request's.
    result = {
        "mode": "strict",
        "guarantee": "strict",
        "learner": "r",
        "epsilon": 1.0,
        "delta": 1e-5,
        "queries": 2,
        "estimates": [0.5, 1.5],
    }
    r = release("cate_vector", result).model_copy(
        update={"params": {"points": [[1.0, 2.0], [3.0, 4.0]]}}
    )
    parsed = parse_result(r)
    assert isinstance(parsed, CateVectorResult)
    assert parsed.estimates == [0.5, 1.5]
    assert parsed.points == [[1.0, 2.0], [3.0, 4.0]]
    assert (parsed.learner, parsed.guarantee, parsed.epsilon) == ("r", "strict", 1.0)
    assert parsed.estimator == "ridge"  # results stored before the estimator rule
    ebm = CateVectorResult.from_result({"estimates": [0.1], "estimator": "ebm", "learner": "dr"})
    assert (ebm.estimator, ebm.learner) == ("ebm", "dr")
    bands = parsed.bands(0.1, 0.95)  # the quote's noise_sd_upper_bound
    assert bands[0] == pytest.approx((0.5 - 0.195996, 0.5 + 0.195996), abs=1e-5)
    assert z_value(0.95) == pytest.approx(1.959964, abs=1e-6)
    with pytest.raises(ValueError, match="different lengths"):
        CateVectorResult.from_result({"estimates": [1.0], "points": [[0.0], [1.0]]})
    with pytest.raises(ValueError, match="estimates"):
        CateVectorResult.from_result({"values": [1.0]})


class FakeEvaluator:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def evaluate_function(
        self, function_id: str, points: Any, columns: Any = None
    ) -> FunctionEvaluation:
        self.calls.append(function_id)
        body = {
            "function_id": function_id,
            "values": [0.25] * len(points),
            "guarantee": "strict",
            "pointwise_noise_sd": 0.5,
        }
        return FunctionEvaluation.from_response(body, points)

    def function_info(self, function_id: str) -> FunctionInfo:
        return FunctionInfo.from_response(
            {
                "id": function_id,
                "dataset_id": "d1",
                "status": "open",
                "basis": "nystrom",
                "q": 2,
                "t_max": None,
                "batch_max": 1000,
                "public": {"pointwise_noise_sd": 0.5, "x_lower": [0, 0], "x_upper": [1, 1]},
            }
        )


def test_function_handle_and_slice_plot(tmp_path: Path) -> None:
    # The release result of cate_function holds public constants only; its id is the release's.
    handle = parse_result(
        release("cate_function", {"guarantee": "strict", "pointwise_noise_sd": 0.5}, rid="r7")
    )
    assert isinstance(handle, FunctionHandle)
    assert handle.function_id == handle.release_id == "r7"
    assert handle.pointwise_noise_sd == 0.5
    with pytest.raises(RuntimeError, match="not bound"):
        handle.evaluate([[0.0]])
    fake = FakeEvaluator()
    bound = FunctionHandle.from_release(release("cate_function", {}, rid="r8"), fake)
    assert bound.evaluate([[0.1, 0.2]]).values == [0.25]
    info = bound.info()
    assert (info.id, info.basis, info.t_max, info.pointwise_noise_sd) == (
        "r8",
        "nystrom",
        None,
        0.5,
    )
    assert info.box == ([0.0, 0.0], [1.0, 1.0])
    assert fake.calls == ["r8"]

    points = [[x / 10, 0.5] for x in range(10, -1, -1)]  # unsorted on purpose
    body = {  # EvaluateRead: function_id, values, guarantee, pointwise_noise_sd (a scalar)
        "function_id": "r7",
        "values": [p[0] * 2 - 0.5 for p in points],
        "guarantee": "strict",
        "pointwise_noise_sd": 0.2,
    }
    evaluation = FunctionEvaluation.from_response(body, points)
    assert (evaluation.function_id, evaluation.guarantee) == ("r7", "strict")
    assert evaluation.points == points
    bands = evaluation.bands(0.9)
    assert bands is not None
    assert bands[0][1] - bands[0][0] == pytest.approx(2 * 1.644854 * 0.2, abs=1e-5)
    paper = FunctionEvaluation.from_response({"values": [1.0], "pointwise_noise_sd": None}, [[0]])
    assert paper.pointwise_noise_sd is None
    assert paper.bands() is None
    with pytest.raises(ValueError, match="different lengths"):
        FunctionEvaluation.from_response({"values": [1.0, 2.0]}, [[0]])
    assert is_png(plot_cate_slice(evaluation, tmp_path / "slice.png", axis=0, feature="severity"))


def test_prediction_response() -> None:
    # PredictRead of POST /v1/releases/{id}/predict (a synthetic body in the server's shape).
    body = {"release_id": "r1", "kind": "ebm_cate", "guarantee": "strict", "predictions": [1.5, 2]}
    pr = Prediction.from_response(body, [[50, 0.3, 1], [60, 0.5, 0]])
    assert pr.predictions == [1.5, 2.0]
    assert pr.points == [[50.0, 0.3, 1.0], [60.0, 0.5, 0.0]]
    assert (pr.release_id, pr.kind, pr.guarantee) == ("r1", "ebm_cate", "strict")
    with pytest.raises(ValueError, match="different lengths"):
        Prediction.from_response(body, [[50, 0.3, 1]])


def test_ebm_shape_functions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The shape of service/mechanisms/ebm_cate.run() (DR learner): ate, model, shape_functions.
    result = {
        "mode": "strict",
        "guarantee": "strict",
        "learner": "dr",
        "epsilon": 1.0,
        "delta": 1e-5,
        "ate": 0.9,
        "model": {"kind": "effect", "effect": {"intercept": 0.8, "offset": 0.1}},
        "shape_functions": [
            {"feature": "x0", "edges": [18, 40, 65, 90], "values": [-0.1, 0.0, 0.2]},
            {"feature": "x1", "edges": [0, 0.5, 1], "values": [-0.3, 0.3]},
            {"feature": "x2", "edges": [0, 1], "values": [0.05]},
        ],
    }
    parsed = parse_result(release("ebm_cate", result))
    assert isinstance(parsed, EbmShapeResult)
    assert [s.feature for s in parsed.shape_functions] == ["x0", "x1", "x2"]
    assert parsed.shape_functions[0].scores == [-0.1, 0.0, 0.2]
    assert parsed.ate == 0.9
    assert parsed.intercept == pytest.approx(0.9)
    assert parsed.learner == "dr"
    assert is_png(plot_shape_functions(parsed, tmp_path / "shapes.png"))
    # with the schema's names the panels read "x1 (diabetes)", not "x1" (a walkthrough)
    import dpcurator.plots as plots

    titles: list[str] = []
    real_save = plots._save

    def keep_titles(fig: Any, path: Any) -> Any:
        titles.extend(ax.get_title() for ax in fig.axes if ax.get_visible())
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", keep_titles)
    named = plot_shape_functions(parsed, tmp_path / "named.png", names=["age", "diabetes", "crp"])
    assert is_png(named)
    assert titles == ["x0 (age)", "x1 (diabetes)", "x2 (crp)"]
    with pytest.raises(ValueError, match="len\\(edges\\)"):
        EbmShapeResult.from_result({"shape_functions": [{"edges": [0, 1], "values": [1, 2]}]})


def test_uplift_table_and_unknown_kinds() -> None:
    # The shape of service/mechanisms/uplift.run(): parallel per-cell lists and the grid.
    result = {
        "guarantee": "strict",
        "epsilon": 1.0,
        "delta": 0.0,
        "grid": {"type": "grid", "bins": [2], "lower": [0], "upper": [1]},
        "cells": 2,
        "count_noise_scale": 2.0,
        "counts_control": [10.0, 12.0],
        "counts_treated": [11.0, 9.0],
        "mean_control": [0.1, 0.2],
        "mean_treated": [0.2, 0.5],
        "uplift": [0.1, 0.3],
        "uplift_noise_sd": [0.05, 0.06],
        "low_count": [False, True],
    }
    parsed = parse_result(release("uplift_table", result))
    assert isinstance(parsed, UpliftTable)
    assert parsed.columns[:2] == ["cell", "counts_control"]
    assert parsed.columns[-3:] == ["uplift", "uplift_noise_sd", "low_count"]
    assert parsed.rows[1]["uplift"] == 0.3
    assert parsed.rows[1]["low_count"] is True
    assert (parsed.cells, parsed.partition["bins"], parsed.epsilon) == (2, [2], 1.0)
    with pytest.raises(ValueError, match="uplift"):
        UpliftTable.from_result({"rows": [{"uplift": 0.2}]})
    with pytest.raises(ValueError, match="different length"):
        UpliftTable.from_result({"uplift": [0.1, 0.2], "mean_control": [0.1]})
    other = parse_result(release("future_kind", {"x": 1}))
    assert isinstance(other, GenericResult)
    assert other.raw == {"x": 1}
    with pytest.raises(ValueError, match="no result"):
        parse_result(release("ate", None))
