"""The CATE kinds over HTTP (SQLite and PostgreSQL): cate_vector, ebm_cate, uplift_table,
the free predict endpoint, validation pointers, and canary rows that must never show."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.api.test_datasets import problem
from tests.api.test_releases import post_release, wait
from tests.conftest import RCT_SCHEMA, SCHEMA, Api, synthetic_csv

POINTS = [[30.0, 0.2, 0.0], [60.0, 0.8, 1.0]]


def _setup(
    api: Api, *, schema: dict[str, Any], n: int = 800, csv: str | None = None, **form: Any
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    r = api.upload(owner["api_key"], csv or synthetic_csv(n, seed=3), schema, **form)
    assert r.status_code == 201, r.text
    ds = r.json()
    b = api.c.put(
        f"/v1/datasets/{ds['id']}/budget",
        json={"epsilon_total": 20.0, "delta_total": 1e-3},
        headers=api.auth(owner["api_key"]),
    )
    assert b.status_code == 200, b.text
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    return owner, analyst, ds


def _spent(client: TestClient, owner: dict[str, Any], ds: dict[str, Any]) -> float:
    body = client.get(f"/v1/datasets/{ds['id']}/budget", headers=Api.auth(owner["api_key"]))
    return float(body.json()["epsilon_spent"])


def _predict(client: TestClient, key: str, release_id: str, points: list[list[float]]) -> Any:
    return client.post(
        f"/v1/releases/{release_id}/predict", json={"points": points}, headers=Api.auth(key)
    )


def test_cate_vector_points_outside_the_box_give_pointers(client: TestClient, api: Api) -> None:
    _, analyst, ds = _setup(api, schema=SCHEMA)
    params = {
        "points": [[30.0, 0.2, 0.0], [30.0, 0.5, 0.0], [30.0, 0.5, 0.0], [95.0, 0.5, 0.0]],
        "epsilon": 1.0,
    }
    r = post_release(client, analyst["api_key"], ds["id"], params, kind="cate_vector")
    body = problem(r, 422, "validation-failed")
    assert [e["pointer"] for e in body["errors"]] == ["#/params/points/3/0"]


def test_cate_vector_paper_mode_needs_the_owner(client: TestClient, api: Api) -> None:
    _, analyst, ds = _setup(api, schema=SCHEMA)
    params = {"points": POINTS, "epsilon": 1.0, "mode": "paper"}
    r = post_release(client, analyst["api_key"], ds["id"], params, kind="cate_vector")
    problem(r, 403, "paper-mode-disabled")


def test_cate_vector_default_is_the_ebm_release_where_it_learns(
    client: TestClient, api: Api
) -> None:
    """n eps / q = 800 * 6 / 3 = 1600 >= 1500: the public rule picks the ebm_cate default;
    only the estimates and public facts leave (no model), and the charge is the request's."""
    owner, analyst, ds = _setup(api, schema=SCHEMA)
    key = analyst["api_key"]
    params = {"points": POINTS, "epsilon": 6.0}
    quote = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "cate_vector", "params": params},
        headers=Api.auth(key),
    )
    assert quote.status_code == 200, quote.text
    assert quote.json()["accuracy"]["estimator"] == "ebm"
    r = post_release(client, key, ds["id"], params, kind="cate_vector")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    result = done["result"]
    assert result["estimator"] == "ebm"
    assert result["learner"] == "dr"
    assert result["guarantee"] == "strict"
    assert len(result["estimates"]) == 2
    assert all(abs(v) <= 100.0 for v in result["estimates"])  # within [-R_Y, R_Y]
    assert not {"model", "shape_functions", "anchor_centre"} & set(result)
    assert _spent(client, owner, ds) == pytest.approx(6.0)
    # the ridge stays one field away, and asking for both is refused before any charge
    ridge = {**params, "learner": "dr"}
    r = post_release(client, key, ds["id"], ridge, kind="cate_vector")
    done = wait(client, key, r.json()["id"])
    assert done["result"]["estimator"] == "ridge"
    both = {**params, "estimator": "ebm", "n_features": 10}
    body = problem(
        post_release(client, key, ds["id"], both, kind="cate_vector"), 422, "validation-failed"
    )
    assert [e["pointer"] for e in body["errors"]] == ["#/params/n_features"]
    assert _spent(client, owner, ds) == pytest.approx(12.0)


def test_ebm_cate_release_and_free_predictions(client: TestClient, api: Api) -> None:
    owner, analyst, ds = _setup(api, schema=SCHEMA)
    key = analyst["api_key"]
    r = post_release(client, key, ds["id"], {"epsilon": 2.0}, kind="ebm_cate")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    result = done["result"]
    assert result["learner"] == "dr"
    # the shape functions carry the schema's covariate names
    assert [s["feature"] for s in result["shape_functions"]] == ["age", "severity", "sex"]
    spent = _spent(client, owner, ds)
    assert spent == pytest.approx(2.0)
    p = _predict(client, key, done["id"], POINTS)
    assert p.status_code == 200, p.text
    assert len(p.json()["predictions"]) == 2
    again = _predict(client, key, done["id"], POINTS)
    assert again.json()["predictions"] == p.json()["predictions"]  # a pure function
    by_name = client.post(
        f"/v1/releases/{done['id']}/predict",
        json={"columns": ["sex", "severity", "age"], "points": [pt[::-1] for pt in POINTS]},
        headers=Api.auth(key),
    )
    assert by_name.json()["predictions"] == p.json()["predictions"]  # read by name
    wrong = client.post(
        f"/v1/releases/{done['id']}/predict",
        json={"columns": ["sex", "age", "severity"], "points": [[0.0, 95.0, 0.2]]},
        headers=Api.auth(key),
    )
    (error,) = problem(wrong, 422, "validation-failed")["errors"]
    assert error["pointer"] == "#/points/0/1"  # where the request gave age
    # the anchored model's factor and anchor come with every prediction (a CDS cannot
    # otherwise tell that one value for every patient is the DP ATE)
    assert p.json()["shrinkage_factor"] == result["shrinkage_factor"]
    assert p.json()["ate_anchor"] == result["ate_anchor"]
    assert _spent(client, owner, ds) == spent  # predictions never charge
    bad = _predict(client, key, done["id"], [[30.0, 1.5, 0.0]])
    body = problem(bad, 422, "validation-failed")
    assert [e["pointer"] for e in body["errors"]] == ["#/points/0/1"]


def test_ebm_cate_effect_columns_over_http(client: TestClient, api: Api) -> None:
    """Pre-specified effect modifiers: a position outside the schema is a 422 before any
    charge; a valid list gives shape functions for those covariates only, and predictions
    that ignore the others, for free."""
    owner, analyst, ds = _setup(api, schema=SCHEMA)
    key = analyst["api_key"]
    bad = post_release(
        client, key, ds["id"], {"epsilon": 2.0, "effect_columns": [3]}, kind="ebm_cate"
    )
    assert "effect_columns" in problem(bad, 422, "validation-failed")["detail"]
    empty = post_release(
        client, key, ds["id"], {"epsilon": 2.0, "effect_columns": []}, kind="ebm_cate"
    )
    problem(empty, 422, "validation-failed")
    assert _spent(client, owner, ds) == 0.0
    r = post_release(
        client, key, ds["id"], {"epsilon": 2.0, "effect_columns": [1]}, kind="ebm_cate"
    )
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    assert done["result"]["effect_columns"] == [1]
    assert [s["feature"] for s in done["result"]["shape_functions"]] == ["severity"]
    spent = _spent(client, owner, ds)
    assert spent == pytest.approx(2.0)
    points = [[30.0, 0.5, 0.0], [60.0, 0.5, 1.0]]  # differ outside column 1 only
    p = _predict(client, key, done["id"], points)
    assert p.status_code == 200, p.text
    first, second = p.json()["predictions"]
    assert first == second
    assert _spent(client, owner, ds) == spent


def test_declared_effect_modifiers_are_the_default_effect_columns(
    client: TestClient, api: Api
) -> None:
    """A schema that declares severity an effect modifier: the default ebm_cate release (and
    cate_vector's ebm estimator, and the default uplift_table) varies with it only; a request
    listing every covariate gets the full model; a non-boolean flag is a 422 at upload."""
    schema = json.loads(json.dumps(SCHEMA))
    schema["covariates"][1]["effect_modifier"] = True
    owner, analyst, ds = _setup(api, schema=schema)
    key = analyst["api_key"]
    assert ds["schema"]["covariates"][1]["effect_modifier"] is True
    r = post_release(client, key, ds["id"], {"epsilon": 2.0}, kind="ebm_cate")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    assert done["result"]["effect_columns"] == [1]
    assert len(done["result"]["shape_functions"]) == 1
    every = {"epsilon": 2.0, "effect_columns": [0, 1, 2]}
    r = post_release(client, key, ds["id"], every, kind="ebm_cate")
    done = wait(client, key, r.json()["id"])
    assert done["result"]["effect_columns"] is None
    assert len(done["result"]["shape_functions"]) == 3
    vector = {"epsilon": 2.0, "points": POINTS, "estimator": "ebm"}
    r = post_release(client, key, ds["id"], vector, kind="cate_vector")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    assert done["result"]["effect_columns"] == [1]
    # uplift_table's default: the ebm_cate release tabulated on its own bins of severity
    quote = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "uplift_table", "params": {"epsilon": 2.0}},
        headers=Api.auth(key),
    ).json()
    assert quote["accuracy"]["estimator"] == "ebm"
    r = post_release(client, key, ds["id"], {"epsilon": 2.0}, kind="uplift_table")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    table = done["result"]
    assert table["estimator"] == "ebm"
    assert table["effect_columns"] == [1]
    assert table["grid"]["bins"][0] == table["grid"]["bins"][2] == 1
    assert table["cells"] == table["grid"]["bins"][1] == len(table["uplift"])
    p = _predict(client, key, done["id"], [[20.0, 0.5, 0.0], [85.0, 0.5, 1.0]])
    assert p.status_code == 200, p.text
    first, second = p.json()["predictions"]
    assert first == second  # the table varies with severity only
    bad = json.loads(json.dumps(SCHEMA))
    bad["covariates"][0]["effect_modifier"] = "yes"
    upload = api.upload(owner["api_key"], synthetic_csv(200, seed=4), bad)
    problem(upload, 422, "invalid-schema")


def test_uplift_tables_and_lookup(client: TestClient, api: Api) -> None:
    owner, analyst, ds = _setup(api, schema=RCT_SCHEMA, n=1000)
    key = analyst["api_key"]
    params = {"epsilon": 1.0, "bins": [2, 2, 1]}
    quote = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "uplift_table", "params": params},
        headers=Api.auth(key),
    ).json()
    assert quote["delta"] == 0.0
    assert len(quote["accuracy"]["suggested_bins"]) == 3
    r = post_release(client, key, ds["id"], params, kind="uplift_table")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    assert len(done["result"]["uplift"]) == 4
    p = _predict(client, key, done["id"], [[20.0, 0.1, 0.0], [80.0, 0.9, 1.0]])
    assert p.status_code == 200, p.text
    assert p.json()["predictions"] == [done["result"]["uplift"][0], done["result"]["uplift"][3]]
    assert _spent(client, owner, ds) == pytest.approx(1.0)
    # bins omitted: the grid is the public rule's suggestion, the one the quote shows
    quote = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "uplift_table", "params": {"epsilon": 0.5}},
        headers=Api.auth(key),
    ).json()
    suggested = quote["accuracy"]["suggested_bins"]
    assert quote["accuracy"]["bins"] == suggested
    assert suggested[2] <= 2  # `sex` has two codes: more cells would stay empty
    r = post_release(client, key, ds["id"], {"epsilon": 0.5}, kind="uplift_table")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    assert done["result"]["grid"]["bins"] == suggested
    assert len(done["result"]["uplift"]) == math.prod(suggested)
    assert _spent(client, owner, ds) == pytest.approx(1.5)
    # DP k-means cells on the same dataset (charged inside its epsilon)
    params = {"epsilon": 2.0, "partition": "kmeans", "clusters": 4}
    r = post_release(client, key, ds["id"], params, kind="uplift_table")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    assert done["mechanism"]["composition"] == "sequential"
    assert len(done["result"]["partition"]["centroids_unit"]) == 4
    p = _predict(client, key, done["id"], [[20.0, 0.1, 0.0]])
    assert p.status_code == 200, p.text
    assert p.json()["predictions"][0] in done["result"]["uplift"]
    assert _spent(client, owner, ds) == pytest.approx(3.5)


def test_an_ebm_release_anchored_at_an_ate_the_analyst_has(client: TestClient, api: Api) -> None:
    """An analyst buys an ATE, then anchors ebm_cate (and the ebm basis of cate_function) at
    its estimate: nothing is spent on a second anchor, the release's ate is that estimate, and
    an anchor where no anchor applies is a 422 before any charge."""
    owner, analyst, ds = _setup(api, schema=SCHEMA, n=4000)
    key = analyst["api_key"]
    r = post_release(client, key, ds["id"], {"epsilon": 1.0}, kind="ate")
    ate = wait(client, key, r.json()["id"])
    assert ate["status"] == "done", ate
    estimate = float(ate["result"]["estimate"])
    spent = _spent(client, owner, ds)
    bought = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "ebm_cate", "params": {"epsilon": 4.0}},
        headers=Api.auth(key),
    ).json()
    assert "its estimate can be the anchor" in bought["accuracy"]["anchor_hint"]
    params = {"epsilon": 4.0, "anchor": estimate}
    quote = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "ebm_cate", "params": params},
        headers=Api.auth(key),
    ).json()
    assert quote["accuracy"]["anchor_source"] == "given"
    assert quote["accuracy"]["anchor_share"] == 0.0
    assert "anchor_hint" not in quote["accuracy"]
    r = post_release(client, key, ds["id"], params, kind="ebm_cate")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    assert done["result"]["ate"] == done["result"]["ate_anchor"] == pytest.approx(estimate)
    assert done["result"]["anchor_source"] == "given"
    assert _spent(client, owner, ds) == pytest.approx(spent + 4.0)
    function = {"epsilon": 4.0, "basis": "ebm", "anchor": estimate}
    r = post_release(client, key, ds["id"], function, kind="cate_function")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    assert done["result"]["ate_anchor"] == pytest.approx(estimate)
    unanchored = {"epsilon": 4.0, "anchor": estimate, "shrinkage": "none"}
    body = problem(
        post_release(client, key, ds["id"], unanchored, kind="ebm_cate"), 422, "validation-failed"
    )
    assert "not anchored" in body["detail"]
    assert _spent(client, owner, ds) == pytest.approx(spent + 8.0)


def test_uplift_table_at_declared_cut_points(client: TestClient, api: Api) -> None:
    """cut_points keyed by covariate name: the grid's cells run between them, lookups follow
    them, the quote shows the edges, and bad keys or values are 422s that name them, before
    any charge."""
    owner, analyst, ds = _setup(api, schema=RCT_SCHEMA, n=1000)
    key = analyst["api_key"]
    params = {"epsilon": 1.0, "cut_points": {"age": [40, 65]}}
    quote = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "uplift_table", "params": params},
        headers=Api.auth(key),
    )
    assert quote.status_code == 200, quote.text
    accuracy = quote.json()["accuracy"]
    assert accuracy["estimator"] == "table"
    assert accuracy["bins"] == [3, 1, 1]
    assert accuracy["cells"] == 3
    assert accuracy["edges"][0] == [18.0, 40.0, 65.0, 90.0]
    r = post_release(client, key, ds["id"], params, kind="uplift_table")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    grid = done["result"]["grid"]
    assert grid["edges"] == [[18.0, 40.0, 65.0, 90.0], [0.0, 1.0], [0.0, 1.0]]
    assert grid["bins"] == [3, 1, 1]
    assert len(done["result"]["uplift"]) == 3
    p = _predict(client, key, done["id"], [[39.9, 0.5, 0.0], [40.0, 0.5, 0.0], [90.0, 1.0, 1.0]])
    assert p.status_code == 200, p.text
    assert p.json()["predictions"] == [done["result"]["uplift"][k] for k in (0, 1, 2)]
    assert _spent(client, owner, ds) == pytest.approx(1.0)
    bad_key = {"epsilon": 1.0, "cut_points": {"agee": [40]}}
    body = problem(
        post_release(client, key, ds["id"], bad_key, kind="uplift_table"), 422, "validation-failed"
    )
    assert body["errors"] == [
        {"pointer": "#/params/cut_points/agee", "detail": "not a covariate of this dataset"}
    ]
    assert "'agee'" in body["detail"]
    outside = {"epsilon": 1.0, "cut_points": {"age": [10, 40]}}
    body = problem(
        post_release(client, key, ds["id"], outside, kind="uplift_table"), 422, "validation-failed"
    )
    assert "'age'" in body["detail"]
    assert "(18, 90)" in body["detail"]
    both = {"epsilon": 1.0, "bins": [2, 1, 1], "cut_points": {"age": [40]}}
    body = problem(
        post_release(client, key, ds["id"], both, kind="uplift_table"), 422, "validation-failed"
    )
    assert "bins or cut_points" in body["detail"]
    empty = {"epsilon": 1.0, "cut_points": {"age": []}}
    problem(
        post_release(client, key, ds["id"], empty, kind="uplift_table"), 422, "validation-failed"
    )
    assert _spent(client, owner, ds) == pytest.approx(1.0)


def test_uplift_table_at_dp_quantile_cut_points(client: TestClient, api: Api) -> None:
    """quantile_cuts: the cut points are DP quantiles paid from the table's epsilon; the result
    carries them as edges, the quote only the shape; a categorical or unknown covariate and the
    ebm estimator are 422s."""
    owner, analyst, ds = _setup(api, schema=RCT_SCHEMA, n=1000)
    key = analyst["api_key"]
    params = {"epsilon": 1.0, "quantile_cuts": {"age": 3}, "cut_points": {"severity": [0.5]}}
    quote = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "uplift_table", "params": params},
        headers=Api.auth(key),
    )
    assert quote.status_code == 200, quote.text
    accuracy = quote.json()["accuracy"]
    assert accuracy["bins"] == [3, 2, 1]
    assert accuracy["quantile_cuts"] == [3, 0, 0]
    assert "edges" not in accuracy
    assert quote.json()["epsilon"] == pytest.approx(1.0)
    r = post_release(client, key, ds["id"], params, kind="uplift_table")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    grid = done["result"]["grid"]
    age = grid["edges"][0]
    assert len(age) == 4
    assert 18.0 < age[1] <= age[2] < 90.0
    assert grid["edges"][1] == [0.0, 0.5, 1.0]
    assert len(done["result"]["uplift"]) == 6
    assert done["mechanism"]["composition"] == "sequential"
    assert _spent(client, owner, ds) == pytest.approx(1.0)
    for bad, pointer in (
        ({"epsilon": 1.0, "quantile_cuts": {"sex": 2}}, "#/params"),
        ({"epsilon": 1.0, "quantile_cuts": {"agee": 2}}, "#/params/quantile_cuts/agee"),
        ({"epsilon": 1.0, "quantile_cuts": {"age": 2}, "estimator": "ebm"}, None),
    ):
        body = problem(
            post_release(client, key, ds["id"], bad, kind="uplift_table"), 422, "validation-failed"
        )
        if pointer is not None:
            assert body["errors"][0]["pointer"] == pointer, body
    assert _spent(client, owner, ds) == pytest.approx(1.0)


def test_uplift_table_takes_delta_where_it_is_an_epsilon_delta_release(
    client: TestClient, api: Api
) -> None:
    """The one-cell observational default (the adjusted DP ATE) charges the delta asked for;
    the epsilon-ADUM table is pure and refuses one (the console walkthrough's analyst saw
    'Extra inputs are not permitted' for delta while the default charged 1e-5)."""
    _, analyst, ds = _setup(api, schema=SCHEMA, n=1000)
    key = analyst["api_key"]

    def quoted(params: dict[str, Any]) -> Any:
        return client.post(
            f"/v1/datasets/{ds['id']}/quotes",
            json={"kind": "uplift_table", "params": params},
            headers=Api.auth(key),
        )

    one_cell = {"epsilon": 1.0, "bins": [1, 1, 1], "delta": 2e-5}
    r = quoted(one_cell)
    assert r.status_code == 200, r.text
    assert r.json()["delta"] == pytest.approx(2e-5)
    assert r.json()["accuracy"]["anchor"] == "adjusted_ate"
    table = {"epsilon": 1.0, "bins": [2, 1, 1], "adjustment_partition": True, "delta": 2e-5}
    body = problem(quoted(table), 422, "validation-failed")
    assert "pure epsilon-DP" in body["detail"]


def test_cut_points_read_the_ebm_model_where_they_cut_every_effect_column(
    client: TestClient, api: Api
) -> None:
    """A declared effect modifier (severity): cut points on it give the ebm estimator's table
    at those cells; cut points on another covariate only leave it uncut, so the request is the
    epsilon-ADUM table; estimator "ebm" with such cut points is a 422 naming the column."""
    schema = json.loads(json.dumps(RCT_SCHEMA))
    schema["covariates"][1]["effect_modifier"] = True
    _, analyst, ds = _setup(api, schema=schema, n=2000)
    key = analyst["api_key"]

    def quoted(params: dict[str, Any]) -> Any:
        return client.post(
            f"/v1/datasets/{ds['id']}/quotes",
            json={"kind": "uplift_table", "params": params},
            headers=Api.auth(key),
        )

    on_modifier = {"epsilon": 8.0, "cut_points": {"severity": [0.25, 0.5, 0.75]}}
    accuracy = quoted(on_modifier).json()["accuracy"]
    assert accuracy["estimator"] == "ebm"
    assert accuracy["edges"][1] == [0.0, 0.25, 0.5, 0.75, 1.0]
    r = post_release(client, key, ds["id"], on_modifier, kind="uplift_table")
    done = wait(client, key, r.json()["id"])
    assert done["status"] == "done", done
    assert done["result"]["estimator"] == "ebm"
    assert done["result"]["grid"]["edges"][1] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert done["result"]["cells"] == 4
    elsewhere = {"epsilon": 8.0, "cut_points": {"age": [50]}}
    assert quoted(elsewhere).json()["accuracy"]["estimator"] == "table"
    body = problem(quoted({**elsewhere, "estimator": "ebm"}), 422, "validation-failed")
    assert body["errors"][0]["pointer"] == "#/params/cut_points/severity"


def test_predict_refuses_other_kinds(client: TestClient, api: Api) -> None:
    _, analyst, ds = _setup(api, schema=RCT_SCHEMA, n=1000)
    key = analyst["api_key"]
    r = post_release(client, key, ds["id"], {"epsilon": 1.0, "nuisance": "none"})
    done = wait(client, key, r.json()["id"])
    problem(_predict(client, key, done["id"], POINTS), 422, "validation-failed")
    problem(_predict(client, key, "nope", POINTS), 404, "not-found")


CANARY_AGE, CANARY_SEVERITY, CANARY_OUTCOME = "89.987654", "0.9876543", "-4.9876543"


def _canary_csv() -> tuple[str, dict[str, Any]]:
    """A dataset with one canary row: a rare category (sex = 2) and extreme, unique values."""
    lines = synthetic_csv(1200, seed=9).strip().split("\n")
    lines.append(f"CANARY,{CANARY_AGE},{CANARY_SEVERITY},2,1,{CANARY_OUTCOME}")
    schema = json.loads(json.dumps(RCT_SCHEMA))
    schema["covariates"][2]["codes"] = [0, 1, 2]
    return "\n".join(lines) + "\n", schema


def test_canary_row_cannot_be_read_off_any_response(client: TestClient, api: Api) -> None:
    """Also the end-to-end run of each kind (quote, charge, result shape)."""
    csv, schema = _canary_csv()
    owner, analyst, ds = _setup(api, schema=schema, csv=csv)
    key = analyst["api_key"]
    texts: list[str] = []
    released: list[dict[str, Any]] = []
    requests: list[tuple[str, dict[str, Any]]] = [
        ("cate_vector", {"points": POINTS, "epsilon": 1.0}),
        ("ebm_cate", {"epsilon": 1.0}),
        ("ebm_cate", {"epsilon": 1.0, "learner": "s"}),
        ("uplift_table", {"epsilon": 1.0, "bins": [3, 3, 3]}),
    ]
    for kind, params in requests:
        quote = client.post(
            f"/v1/datasets/{ds['id']}/quotes",
            json={"kind": kind, "params": params},
            headers=Api.auth(key),
        )
        texts.append(quote.text)
        r = post_release(client, key, ds["id"], params, kind=kind)
        done = wait(client, key, r.json()["id"])
        assert done["status"] == "done", done
        texts.append(json.dumps(done))
        released.append(done)
        if kind == "cate_vector":
            assert quote.json()["accuracy"]["noise_sd_upper_bound"] > 0
            assert done["guarantee"] == "strict"
            assert (
                done["mechanism"]["composition"] == "anchor_then_theorem6_max"
            )  # the whole-data ATE anchor
            assert len(done["result"]["estimates"]) == 2
        if kind in ("ebm_cate", "uplift_table"):
            p = _predict(client, key, done["id"], [[89.98, 0.98, 2.0]])
            texts.append(p.text)
        if kind == "ebm_cate":
            # the rare category is binned as a continuous feature on the public range [0, 2]:
            # no per-category structure exists that could reveal that code 2 occurs
            shape = done["result"]["shape_functions"][-1]
            assert shape["edges"][0] == 0.0
            assert shape["edges"][-1] == 2.0
            assert all(isinstance(e, float) for e in shape["edges"])
    assert _spent(client, owner, ds) == pytest.approx(4.0)  # one charge per release
    blob = "\n".join(texts)
    for text in (CANARY_AGE, CANARY_SEVERITY, CANARY_OUTCOME, "89.98765", "4.98765", "CANARY"):
        assert text not in blob
    values = np.asarray(_numbers(released), dtype=np.float64)
    for value in (float(CANARY_AGE), float(CANARY_SEVERITY), float(CANARY_OUTCOME)):
        assert np.all(np.abs(values - value) > 1e-6)


def _numbers(tree: Any) -> list[float]:
    if isinstance(tree, bool):
        return []
    if isinstance(tree, int | float):
        return [float(tree)]
    if isinstance(tree, dict):
        return [v for item in tree.values() for v in _numbers(item)]
    if isinstance(tree, list):
        return [v for item in tree for v in _numbers(item)]
    return []
