"""Client-side behaviour a new-user walkthrough asked for: points typed as the server types them,
an ebm vector's missing band said in words, the ledger's δ and grant columns, a function's
reading notes, a refused parameter's one-line error without repetition."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest

from dpcurator.cli import render
from dpcurator.cli.app import parse_params, read_points
from dpcurator.client import _as_points
from dpcurator.errors import ProblemError
from dpcurator.models import LedgerEntry, Quote
from dpcurator.results import CateVectorResult, FunctionInfo


def test_points_keep_numbers_of_any_real_type_and_refuse_strings_and_booleans() -> None:
    assert _as_points([[1, 2.5], [np.float32(3.0), np.int64(4)]]) == [[1.0, 2.5], [3.0, 4.0]]
    with pytest.raises(TypeError, match=r"point 0, coordinate 0: a number is needed, not str"):
        _as_points([["64", 0.0]])
    with pytest.raises(TypeError, match=r"point 1, coordinate 1: .* not bool"):
        _as_points([[1.0, 2.0], [3.0, True]])


def test_cli_points_refuse_json_strings_and_name_a_bad_csv_cell(tmp_path: Path) -> None:
    with pytest.raises(click.BadParameter, match=r"point 0, coordinate 1 is not"):
        read_points('[[64, "1"]]', None, list)
    assert read_points("[[64, 1]]", None, list) == [[64.0, 1.0]]
    csv_path = tmp_path / "patients.csv"
    csv_path.write_text("age,sex,patient_id\n64,1,A\n71,x,B\n")
    with pytest.raises(click.BadParameter, match=r"data row 2, column 'sex' is not one"):
        read_points(None, csv_path, lambda: ["age", "sex"])


def test_an_ebm_vector_has_no_band_and_says_why() -> None:
    vector = CateVectorResult.from_result(
        {"estimates": [1.0, 1.0], "estimator": "ebm", "guarantee": "strict"}
    )
    with pytest.raises(ValueError, match="no pointwise noise bound for the ebm estimator"):
        vector.bands(None)
    ridge = CateVectorResult.from_result({"estimates": [1.0], "guarantee": "strict"})
    assert ridge.bands(0.5, level=0.95)[0] == pytest.approx((1.0 - 0.98, 1.0 + 0.98), abs=1e-2)


def _entry(entry_type: str, details: str) -> LedgerEntry:
    return LedgerEntry(
        seq=1,
        entry_type=entry_type,
        created_at="2026-11-29T01:00:00+00:00",
        principal_id="owner0000000000",
        epsilon=0,
        delta=0,
        epsilon_spent=0,
        delta_spent=0,
        epsilon_total=3,
        delta_total="0.0001",
        details_json=details,
        prev_hash="0",
        row_hash="1",
    )


def test_the_ledger_table_shows_delta_and_what_a_grant_or_budget_entry_set() -> None:
    grant = _entry("grant", '{"delta_cap":null,"epsilon_cap":"2","grantee":"analyst12345678"}')
    revoke = _entry("grant", '{"grantee":"analyst12345678","revoked":true}')
    budget = _entry("budget", '{"delta_total":"0.0001","epsilon_total":"3"}')
    text = render.ledger([grant, revoke, budget])
    header = text.splitlines()[0]
    assert "delta spent" in header
    assert "delta total" in header
    assert "grant analyst12345 (eps cap 2)" in text
    assert "revoke analyst12345" in text
    assert "set eps 3, delta 0.0001" in text


def _function_body(public: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A ``GET /v1/functions/{id}`` body of a 2-covariate ebm function (``fields`` added)."""
    return {
        "id": "f1",
        "dataset_id": "d1",
        "status": "open",
        "basis": "ebm",
        "q": 2,
        "t_max": None,
        "batch_max": 1000,
        "public": {"x_lower": [0, 0], "x_upper": [1, 1], **public},
        **fields,
    }


def _function(public: dict[str, Any]) -> FunctionInfo:
    return FunctionInfo.from_response(_function_body(public))


def test_function_show_says_when_every_answer_is_the_ate_and_that_there_is_no_band() -> None:
    text = render.function_info(
        _function(
            {
                "shrinkage_factor": 0.0,
                "ate_anchor": 1.87,
                "ate_anchor_interval": {"lower": 0.5, "upper": 3.2, "level": 0.95},
            }
        )
    )
    assert "every answer is the DP ATE anchor" in text
    assert "no pointwise noise band" in text
    assert "[0.5, 3.2] (95%)" in text
    learning = render.function_info(_function({"shrinkage_factor": 0.7, "pointwise_noise_sd": 0.3}))
    assert "note:" not in learning
    # the same facts for programs: a dashboard can refuse to show a per-patient "effect"
    flat = _function({"shrinkage_factor": 0.0, "ate_anchor": 1.87})
    assert flat.answers_the_ate_everywhere
    assert (flat.shrinkage_factor, flat.ate_anchor) == (0.0, 1.87)
    unanchored = _function({})
    assert (unanchored.shrinkage_factor, unanchored.ate_anchor) == (None, None)
    assert not unanchored.answers_the_ate_everywhere


def test_a_refused_parameter_is_one_line_without_repeating_itself() -> None:
    error = ProblemError(
        type="https://dp-curator.dev/problems/validation-failed",
        title="The request is invalid",
        status=422,
        detail="#/params/epsilon: Input should be greater than 0 (and 1 more)",
        errors=[
            {"pointer": "#/params/epsilon", "detail": "Input should be greater than 0"},
            {"pointer": "#/params/alpha", "detail": "Input should be a finite number"},
        ],
    )
    line = error.one_line()
    assert line.count("Input should be greater than 0") == 1
    assert line.endswith("[#/params/alpha: Input should be a finite number]")
    # a mechanism's refusal: its detail is its one error's, at #/params (an analyst saw it twice)
    refusal = "uplift_table is causal only for an RCT design"
    mechanism = ProblemError(
        type="https://dp-curator.dev/problems/validation-failed",
        title="The request is invalid",
        status=422,
        detail=refusal,
        errors=[{"pointer": "#/params", "detail": refusal}],
    )
    assert mechanism.one_line().count(refusal) == 1
    # an upload's refusal names its cell once, as a pointer (a data manager saw the detail twice)
    csv_detail = "a value that is not a number (column 'sex', data row 1)"
    upload = ProblemError(
        type="https://dp-curator.dev/problems/invalid-csv",
        title="The CSV does not match the schema",
        status=422,
        detail=csv_detail,
        errors=[{"pointer": "#/rows/1/sex", "detail": csv_detail}],
    )
    assert upload.one_line().count(csv_detail) == 1
    assert upload.one_line().endswith("[at #/rows/1/sex]")


def test_an_uplift_grid_names_each_cells_ranges() -> None:
    grid = {"type": "grid", "bins": [2, 1, 3], "lower": [0, 0, 0], "upper": [10, 1, 300]}
    cells = render.cell_ranges(grid, 6, ["age", "sex", "crp"])
    assert cells is not None
    assert cells[0] == "age [0, 5), crp [0, 100)"
    assert cells[5] == "age [5, 10], crp [200, 300]"
    assert render.cell_ranges(grid, 5) is None  # shape and cell count disagree
    assert render.cell_ranges({"type": "kmeans"}, 3) is None
    one = render.cell_ranges({"type": "grid", "bins": [1], "lower": [0], "upper": [1]}, 1)
    assert one == ["all"]
    # a grid with edges (cut points, the ebm estimator's bins) is read at its edges
    cut = {**grid, "bins": [1, 1, 3], "edges": [[0, 10], [0, 1], [0, 5, 10, 300]]}
    assert render.cell_ranges(cut, 3, ["age", "sex", "crp"]) == [
        "crp [0, 5)",
        "crp [5, 10)",
        "crp [10, 300]",
    ]
    assert render.cell_ranges({**cut, "edges": [[0, 10], [0, 1], [0, 300]]}, 3) is None


def test_a_parameter_given_twice_is_refused() -> None:
    assert parse_params(("alpha=0.1",), '{"epsilon": 0.2}') == {"epsilon": 0.2, "alpha": 0.1}
    with pytest.raises(click.BadParameter, match="'epsilon' is given both"):
        parse_params(("epsilon=0.5",), '{"epsilon": 0.2}')


def test_a_quote_labels_its_clip_and_noise_figures() -> None:
    quote = Quote(
        kind="ate",
        guarantee="strict",
        epsilon=1.0,
        delta=1e-5,
        fits_budget=True,
        epsilon_remaining=3.0,
        delta_remaining=1e-4,
        accuracy={"pseudo_outcome_clip": None, "bound": 1200.0, "expected_half_width": 23.4},
        mechanism={},
    )
    text = render.quote(quote)
    assert "pseudo-outcome bound (R_Y / c or your pseudo_outcome_clip" in text
    assert "1200" in text
    assert "pseudo-outcome clip  " not in text  # a null request field is not shown as "-"


def test_function_bands_carry_the_shrinkage_factor() -> None:
    """An anchored function's answer carries factor x the pointwise noise; at factor 0 every
    answer is the anchor and there is no band (a walkthrough saw +-8.3 around a constant)."""
    from dpcurator.results import FunctionEvaluation

    def evaluation(factor: float | None) -> FunctionEvaluation:
        body = {
            "function_id": "f",
            "values": [1.0, 2.0],
            "guarantee": "strict",
            "pointwise_noise_sd": 4.0,
            "shrinkage_factor": factor,
        }
        return FunctionEvaluation.from_response(body, [[0.0], [1.0]])

    assert evaluation(None).noise_sd == [4.0, 4.0]
    assert evaluation(0.5).noise_sd == [2.0, 2.0]
    half = evaluation(0.5).bands(0.95)
    assert half is not None
    assert half[0] == pytest.approx((1.0 - 3.92, 1.0 + 3.92), abs=1e-2)
    constant = evaluation(0.0)
    assert constant.answers_the_ate_everywhere
    assert constant.noise_sd is None
    assert constant.bands() is None
    text = render.evaluation(constant)
    assert "every answer is the DP ATE anchor" in text
    assert "noise band" not in text


def test_long_point_lists_are_sent_as_consecutive_batches() -> None:
    """More points than one evaluate request takes go as consecutive batches of the function's
    batch_max (at most the API's 1000), in order; the values come back in order. A CDS
    walkthrough's 60 points to a function of batch_max 25 had gone as one request (a 422): the
    client split only lists over 1000. batch_max is read once per function; one point needs
    no read."""
    import httpx2 as httpx

    from dpcurator.client import EVALUATE_BATCH_LIMIT, CuratorClient

    sizes: list[int] = []
    reads: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            reads.append(request.url.path)
            info = {"id": "f", "dataset_id": "d", "status": "open", "basis": "exact", "q": 1}
            return httpx.Response(200, json={**info, "t_max": 10_000, "batch_max": 300})
        points = json.loads(request.content)["points"]
        sizes.append(len(points))
        body = {"function_id": "f", "values": [p[0] for p in points], "guarantee": "strict"}
        return httpx.Response(200, json=body)

    client = CuratorClient("http://curator.test", "k", transport=httpx.MockTransport(handler))
    points = [[float(i)] for i in range(1200)]
    out = client.evaluate_function("f", points)
    assert out.values == [float(i) for i in range(1200)]
    assert sizes == [300, 300, 300, 300]
    sizes.clear()
    client.evaluate_function("f", points[:EVALUATE_BATCH_LIMIT])
    assert sizes == [300, 300, 300, 100]
    sizes.clear()
    client.evaluate_function("f", points[:60])
    assert sizes == [60]
    assert reads == ["/v1/functions/f"]  # read once
    fresh = CuratorClient("http://curator.test", "k", transport=httpx.MockTransport(handler))
    sizes.clear()
    fresh.evaluate_function("f", points[:1])
    assert sizes == [1]
    assert reads == ["/v1/functions/f"]


def test_long_predict_lists_are_sent_in_batches() -> None:
    """predict takes at most 10000 points a request; the client sends more in order."""
    import httpx2 as httpx

    from dpcurator.client import PREDICT_BATCH_LIMIT, CuratorClient

    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        points = json.loads(request.content)["points"]
        sizes.append(len(points))
        body = {"release_id": "r", "kind": "ebm_cate", "guarantee": "strict"}
        return httpx.Response(200, json={**body, "predictions": [p[0] for p in points]})

    client = CuratorClient("http://curator.test", "k", transport=httpx.MockTransport(handler))
    points = [[float(i)] for i in range(PREDICT_BATCH_LIMIT + 2500)]
    out = client.predict("r", points)
    assert sizes == [PREDICT_BATCH_LIMIT, 2500]
    assert out.predictions == [float(i) for i in range(PREDICT_BATCH_LIMIT + 2500)]
    assert out.release_id == "r"
    sizes.clear()
    wide = [[0.0] * 200 for _ in range(5000)]  # 500,000 coordinates a request at most
    assert len(client.predict("r", wide).predictions) == 5000
    assert sizes == [2500, 2500]


def test_a_retry_waits_as_long_as_the_servers_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 503 with Retry-After 5 is retried after 5 s, not after the 0.25 s backoff (which had
    given up after 1.75 s in all); a larger value is capped; a missing one leaves the backoff."""
    import httpx2 as httpx

    from dpcurator import client as module

    slept: list[float] = []
    monkeypatch.setattr(module.time, "sleep", slept.append)
    answers = iter(
        [
            httpx.Response(503, headers={"Retry-After": "5"}, json={"status": 503}),
            httpx.Response(503, headers={"Retry-After": "3600"}, json={"status": 503}),
            httpx.Response(503, json={"status": 503}),
            httpx.Response(200, json={"status": "ok"}),
        ]
    )
    c = module.CuratorClient(
        "http://curator.test", "k", transport=httpx.MockTransport(lambda r: next(answers))
    )
    assert c.health()
    assert slept == [5.0, module.MAX_RETRY_AFTER, 1.0]


def test_a_refused_later_batch_keeps_the_earlier_answers() -> None:
    """A re-test's 31 points to a function with 6 places left: the second batch was refused and
    the first batch's 25 answers were lost with it. They ride on the exception as ``partial``."""
    import httpx2 as httpx

    from dpcurator.client import CuratorClient
    from dpcurator.errors import FunctionCapacityReached

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            info = {"id": "f", "dataset_id": "d", "status": "open", "basis": "exact", "q": 1}
            return httpx.Response(200, json={**info, "t_max": 30, "batch_max": 25})
        points = json.loads(request.content)["points"]
        if points[0][0] >= 25:
            problem = {
                "type": "https://dp-curator.dev/problems/function-capacity-reached",
                "title": "t",
                "status": 409,
            }
            return httpx.Response(409, json=problem)
        body = {"function_id": "f", "values": [p[0] for p in points], "guarantee": "strict"}
        return httpx.Response(200, json={**body, "shrinkage_factor": 0.5, "ate_anchor": 1.25})

    client = CuratorClient("http://curator.test", "k", transport=httpx.MockTransport(handler))
    with pytest.raises(FunctionCapacityReached) as refused:
        client.evaluate_function("f", [[float(i)] for i in range(31)])
    partial = refused.value.partial
    assert partial is not None
    assert partial.values == [float(i) for i in range(25)]
    assert partial.points == [[float(i)] for i in range(25)]
    assert partial.ate_anchor == 1.25


def test_cli_csv_points_refuse_what_would_answer_for_the_wrong_patient(tmp_path: Path) -> None:
    """A CDS walkthrough's CSV fixes: a covariate named twice in the header is refused (the
    first column had been read, silently); a short data row is named (it was an IndexError);
    a byte-order mark is not part of the first name; ``6_2`` is not 62; a headerless first row
    with an empty cell is not taken for a header lacking every covariate."""
    names = ["age", "sbp"]

    def points(text: str) -> list[list[float]]:
        path = tmp_path / "p.csv"
        path.write_bytes(text.encode("utf-8"))
        return read_points(None, path, lambda: names)

    with pytest.raises(click.BadParameter, match=r"names age more than once"):
        points("age,age,sbp\n99,62,121\n")
    with pytest.raises(click.BadParameter, match=r"data row 2 has 1 values, the header 2"):
        points("age,sbp\n60,120\n61\n")
    with pytest.raises(click.BadParameter, match=r"data row 1 has 3 values, the header 2"):
        points("age,sbp\n60,120,5\n")  # e.g. a decimal comma split a value
    # other columns are ignored, repeated or not
    assert points("note,age,note,sbp\na,60,b,120\n") == [[60.0, 120.0]]
    assert points("\ufeffage,sbp\n60,120\n") == [[60.0, 120.0]]
    with pytest.raises(click.BadParameter, match=r"data row 1, column 'age' is not one"):
        points("age,sbp\n6_2,120\n")
    with pytest.raises(click.BadParameter, match=r"neither a header .* nor a row of numbers"):
        points("60,,120\n")
    assert points("60,120\n61,121\n") == [[60.0, 120.0], [61.0, 121.0]]


def test_client_points_refuse_nan_and_flat_lists_and_read_data_frames() -> None:
    from dpcurator.client import _frame

    with pytest.raises(ValueError, match=r"point 0, coordinate 1: nan is not a finite number"):
        _as_points([[1.0, float("nan")]])
    with pytest.raises(TypeError, match=r"point 0: a point is a list of numbers, not int"):
        _as_points([64, 1])  # type: ignore[list-item]

    class Frame:  # the two members of a pandas DataFrame that _frame reads
        columns = ["sbp", "age"]

        def to_numpy(self) -> Any:
            return np.array([[120.0, 60.0]])

    rows, columns = _frame(Frame(), None)
    assert (rows, columns) == ([[120.0, 60.0]], ["sbp", "age"])
    assert _frame(Frame(), ["a", "b"])[1] == ["a", "b"]
    assert _frame([[1.0]], None) == ([[1.0]], None)


def test_a_later_batchs_refusal_names_the_callers_point() -> None:
    """Pointers of a refused batch are renumbered by its offset (point 1200 had been reported
    at #/points/200)."""
    from dpcurator.client import _shift_point_pointers

    exc = ProblemError(
        type="https://dp-curator.dev/problems/validation-failed",
        title="Validation failed",
        status=422,
        detail="#/points/200/11: not one of its codes",
        errors=[{"pointer": "#/points/200/11", "detail": "not one of its codes"}],
    )
    _shift_point_pointers(exc, 1000)
    assert exc.errors[0]["pointer"] == "#/points/1200/11"
    assert exc.detail == "#/points/1200/11: not one of its codes"
    assert "#/points/1200/11" in str(exc)


def test_the_cli_shows_the_answers_stored_before_a_refused_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``function evaluate`` with a later batch refused at capacity prints the stored answers and
    says which points were not answered (it had said only 'nothing was stored', though six
    batches were stored and counted against the function); --level outside (0, 1) is a usage
    error before any request."""
    import httpx2 as httpx
    from click.testing import CliRunner

    from dpcurator.cli import app
    from dpcurator.client import CuratorClient

    sent: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            info = {"id": "f", "dataset_id": "d", "status": "open", "basis": "exact", "q": 1}
            return httpx.Response(200, json={**info, "t_max": 30, "batch_max": 25})
        points = json.loads(request.content)["points"]
        sent.append(len(points))
        if points[0][0] >= 25:
            problem = {
                "type": "https://dp-curator.dev/problems/function-capacity-reached",
                "title": "Function capacity reached",
                "status": 409,
                "detail": "nothing was stored",
            }
            return httpx.Response(409, json=problem)
        body = {"function_id": "f", "values": [p[0] for p in points], "guarantee": "strict"}
        return httpx.Response(200, json=body)

    transport = httpx.MockTransport(handler)
    monkeypatch.setattr(
        app, "CuratorClient", lambda url, key, timeout: CuratorClient(url, key, transport=transport)
    )
    points = json.dumps([[float(i)] for i in range(31)])
    runner = CliRunner()
    out = runner.invoke(app.cli, ["--key", "k", "function", "evaluate", "f", "--points", points])
    assert out.exit_code == 1
    assert "the first 25 of 31 points were answered (above)" in out.output
    assert "points 26-31 were not (pointers count from 0: #/points/25 is point 26)" in out.output
    assert "24" in out.output.split("error:")[0]  # the stored answers are printed
    as_json = runner.invoke(
        app.cli, ["--key", "k", "--json", "function", "evaluate", "f", "--points", points]
    )
    body = json.loads(as_json.output.split("error:")[0])
    assert body["partial"] is True
    assert (len(body["values"]), body["points_requested"]) == (25, 31)
    sent.clear()
    bad = runner.invoke(
        app.cli, ["--key", "k", "function", "evaluate", "f", "--points", "[[1]]", "--level", "1.5"]
    )
    assert bad.exit_code == 2
    assert "--level" in bad.output
    assert sent == []


def test_a_constant_evaluation_carries_its_anchors_interval() -> None:
    """At shrinkage factor 0 the evaluate response carries the anchor's interval and the CLI
    says it is the answer's error bar as an ATE (a CDS client had to find it elsewhere)."""
    from dpcurator.results import FunctionEvaluation

    body = {
        "function_id": "f",
        "values": [1.25, 1.25],
        "guarantee": "strict",
        "pointwise_noise_sd": 0.38,
        "shrinkage_factor": 0.0,
        "ate_anchor": 1.25,
        "ate_anchor_interval": {"lower": -0.84, "upper": 2.06, "level": 0.95},
    }
    ev = FunctionEvaluation.from_response(body, [[1.0], [2.0]])
    assert ev.ate_anchor_interval == {"lower": -0.84, "upper": 2.06, "level": 0.95}
    text = render.evaluation(ev)
    assert "its 95% interval as an ATE is [-0.84, 2.06]" in text
    assert "noise band" not in text.splitlines()[0]
    bare = FunctionEvaluation.from_response({**body, "ate_anchor_interval": None}, [[1.0], [2.0]])
    assert "this anchor has no interval" in render.evaluation(bare)


def test_function_show_states_units_codes_and_the_contrast_from_the_schema() -> None:
    """A CDS integrator reads what an answer is measured in and what each coordinate means
    (a creatinine in mg/dL entered as umol/L would be a wrong answer inside the box)."""
    body = _function_body(
        {"x_lower": [0.2, 0], "x_upper": [15, 1]},
        covariates=["creatinine", "sex"],
        covariate_info=[
            {"name": "creatinine", "type": "numeric", "unit": "mg/dL", "lower": 0.2, "upper": 15},
            {
                "name": "sex",
                "type": "categorical",
                "unit": None,
                "lower": 0,
                "upper": 1,
                "codes": [0, 1],
                "code_labels": {"0": "female"},
            },
        ],
        outcome={"name": "los", "type": "numeric", "unit": "days", "lower": 0, "upper": 60},
        treatment={"name": "arm", "code_labels": {"0": "usual care", "1": "new pathway"}},
    )
    text = render.function_info(FunctionInfo.from_response(body))
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert lines["outcome"].endswith("los [0, 60] days")
    assert lines["effect"].endswith("new pathway minus usual care")
    assert lines["covariates"].endswith("creatinine [0.2, 15] mg/dL; sex {0 female, 1}")
    # an older server without them: the names only, no contrast line
    older = FunctionInfo.from_response(
        {k: v for k, v in body.items() if k not in ("covariate_info", "outcome", "treatment")}
    )
    plain = {line.split("  ")[0]: line for line in render.function_info(older).splitlines()}
    assert plain["covariates"].endswith("creatinine, sex")
    assert plain["effect"].endswith("-")
    assert plain["outcome"].endswith("-")
    unlabelled = render.function_info(
        FunctionInfo.from_response({**body, "treatment": {"name": "arm", "code_labels": None}})
    )
    assert "arm = 1 minus arm = 0" in unlabelled


def test_an_interval_measured_below_its_level_is_labelled_nominal() -> None:
    """A health economist's adaptive-clip interval on observational costs printed as an
    ordinary '95% CI' and excluded the true effect (the coverage note said 0-42 %): the label
    itself now says the level is nominal and what was measured."""
    from dpcurator.results import AteResult

    base = {
        "estimate": 3262.0,
        "ci_lower": 1628.0,
        "ci_upper": 4896.0,
        "ci_level": 0.95,
        "guarantee": "strict",
        "epsilon": 1.0,
        "delta": 1e-7,
        "design": "observational",
    }
    narrowed = {
        "message": "...",
        "measured": None,
        "narrowed_clip_coverage": {"coverage_low": 0.0, "coverage_high": 0.75},
    }
    banded = {"message": "...", "measured": {"coverage_low": 0.86, "coverage_high": 0.915}}
    holds = {"message": "...", "measured": {"coverage_low": 0.94, "coverage_high": 0.97}}
    labels = {}
    for name, coverage in (("narrowed", narrowed), ("banded", banded), ("holds", holds)):
        parsed = AteResult.from_result({**base, "coverage": coverage})
        line = next(x for x in render.result(parsed).splitlines() if "CI" in x.split("[")[0])
        labels[name] = line.split("[")[0].strip()
    assert labels["narrowed"] == "95% CI (nominal; measured 0-75%)"
    assert labels["banded"] == "95% CI (nominal; measured 86-92%)"
    assert labels["holds"] == "95% CI"
    older = AteResult.from_result(base)  # a server without the block
    assert older.measured_coverage is None
    assert not older.below_nominal
