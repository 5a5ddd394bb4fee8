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

from service.client.models import LedgerEntry, Release
from service.client.plots import plot_ate, plot_budget_spend, plot_cate_slice, plot_shape_functions
from service.client.results import (
    AteResult,
    CateVectorResult,
    EbmShapeResult,
    FunctionEvaluation,
    FunctionHandle,
    GenericResult,
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


def test_cate_vector_bands() -> None:
    parsed = parse_result(
        release(
            "cate_vector",
            {"values": [0.5, 1.5], "points": [[0.1], [0.9]], "noise_sd": 0.1, "guarantee": "x"},
        )
    )
    assert isinstance(parsed, CateVectorResult)
    bands = parsed.bands(0.95)
    assert bands is not None
    assert bands[0] == pytest.approx((0.5 - 0.195996, 0.5 + 0.195996), abs=1e-5)
    assert z_value(0.95) == pytest.approx(1.959964, abs=1e-6)
    spelled = release("cate_vector", {"estimates": [0.2, 0.4], "noise_sd_upper_bound": 0.3})
    spelled = spelled.model_copy(update={"params": {"points": [[1.0, 2.0], [3.0, 4.0]]}})
    alias = parse_result(spelled)
    assert isinstance(alias, CateVectorResult)
    assert alias.points == [[1.0, 2.0], [3.0, 4.0]]
    assert alias.noise_sd == [0.3, 0.3]
    no_sd = CateVectorResult.from_result({"values": [1.0]})
    assert no_sd.bands() is None
    with pytest.raises(ValueError, match="different lengths"):
        CateVectorResult.from_result({"values": [1.0], "points": [[0.0], [1.0]]})
    with pytest.raises(ValueError, match="noise_sd"):
        CateVectorResult.from_result({"values": [1.0, 2.0], "noise_sd": [0.1]})


def test_function_handle_and_slice_plot(tmp_path: Path) -> None:
    handle = parse_result(release("cate_function", {"function_id": "f-9", "guarantee": "paper"}))
    assert isinstance(handle, FunctionHandle)
    assert handle.function_id == "f-9"
    with pytest.raises(RuntimeError, match="not bound"):
        handle.evaluate([[0.0]])
    default = FunctionHandle.from_release(release("cate_function", {}, rid="r7"))
    assert default.function_id == "r7"

    points = [[x / 10, 0.5] for x in range(10, -1, -1)]  # unsorted on purpose
    body = {"values": [p[0] * 2 - 0.5 for p in points], "noise_sd": [0.2] * len(points)}
    evaluation = FunctionEvaluation.from_response(body, points)
    bands = evaluation.bands(0.9)
    assert bands is not None
    assert bands[0][1] - bands[0][0] == pytest.approx(2 * 1.644854 * 0.2, abs=1e-5)
    served = FunctionEvaluation.from_response({"values": [1.0], "pointwise_noise_sd": 0.5}, [[0]])
    assert served.noise_sd == [0.5]
    assert is_png(plot_cate_slice(evaluation, tmp_path / "slice.png", axis=0, feature="severity"))


def test_ebm_shape_functions(tmp_path: Path) -> None:
    result = {
        "intercept": 0.9,
        "guarantee": "strict",
        "shape_functions": [
            {"feature": "age", "edges": [18, 40, 65, 90], "scores": [-0.1, 0.0, 0.2]},
            {"feature": "severity", "edges": [0, 0.5, 1], "scores": [-0.3, 0.3]},
            {"feature": "sex", "edges": [0, 1], "scores": [0.05, -0.05], "categorical": True},
            {"feature": "bmi", "edges": [16, 30, 45], "values": [0.0, 0.1]},
        ],
    }
    parsed = parse_result(release("ebm_cate", result))
    assert isinstance(parsed, EbmShapeResult)
    assert [s.feature for s in parsed.shape_functions] == ["age", "severity", "sex", "bmi"]
    assert parsed.intercept == 0.9
    assert is_png(plot_shape_functions(parsed, tmp_path / "shapes.png"))
    with pytest.raises(ValueError, match="len\\(edges\\)"):
        EbmShapeResult.from_result({"shape_functions": [{"edges": [0, 1], "scores": [1, 2]}]})


def test_uplift_table_and_unknown_kinds() -> None:
    parsed = parse_result(
        release(
            "uplift_table",
            {"rows": [{"cell": "a", "uplift": 0.2}, {"cell": "b", "uplift": 0.4, "n": 10}]},
        )
    )
    assert isinstance(parsed, UpliftTable)
    assert parsed.columns == ["cell", "uplift", "n"]
    columnar = UpliftTable.from_result(
        {"cells": 2, "uplift": [0.1, 0.3], "uplift_noise_sd": [0.05, 0.06], "bins": [2]}
    )
    assert columnar.columns == ["cell", "uplift", "uplift_noise_sd"]
    assert columnar.rows[1] == {"cell": 1, "uplift": 0.3, "uplift_noise_sd": 0.06}
    other = parse_result(release("future_kind", {"x": 1}))
    assert isinstance(other, GenericResult)
    assert other.raw == {"x": 1}
    with pytest.raises(ValueError, match="no result"):
        parse_result(release("ate", None))
