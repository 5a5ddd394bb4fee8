"""Datasets over HTTP: upload, validation errors as problem+json, access, budget, grants, ledger."""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from service.db.models import Dataset, DatasetChunk
from tests.conftest import ADMIN_KEY, SCHEMA, Api, synthetic_csv

PROBLEM = "https://dp-curator.dev/problems/"


def problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["type"] == PROBLEM + slug
    assert body["status"] == status
    return body


def _count(db_url: str, model: Any) -> int:
    eng = create_engine(db_url)
    with Session(eng) as s:
        n = int(s.execute(select(func.count()).select_from(model)).scalar_one())
    eng.dispose()
    return n


def test_upload_round_trip_and_metadata(api: Api, client: TestClient) -> None:
    owner = api.principal("owner")
    r = api.upload(owner["api_key"], synthetic_csv(300), SCHEMA, name="trial")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["n"] == 300
    assert body["ingest_report"]["rows_received"] == 300
    assert body["schema"]["outcome"] == {
        "name": "outcome",
        "type": "numeric",
        "lower": -5,
        "upper": 5,
        "impute": None,
        "unit": None,
    }
    assert body["budget"]["is_set"] is False
    listed = client.get("/v1/datasets", headers=api.auth(owner["api_key"])).json()
    assert [d["id"] for d in listed] == [body["id"]]
    assert "ingest_report" not in listed[0]


def test_rows_are_never_returned(api: Api, client: TestClient) -> None:
    owner = api.principal("owner")
    csv_text = synthetic_csv(50)  # the rows api.dataset stores (same seed)
    ds = api.dataset(owner["api_key"], n=50)
    for path in (f"/v1/datasets/{ds['id']}", "/v1/datasets", f"/v1/datasets/{ds['id']}/budget"):
        text = client.get(path, headers=api.auth(owner["api_key"])).text
        assert "P000007" not in text
        for line in csv_text.splitlines()[1:4]:
            assert line.split(",")[1] not in text  # an age value of a stored row


@pytest.mark.parametrize(
    ("csv_text", "pointer_part"),
    [
        ("", None),
        ("age,severity,sex,treated,outcome,patient_id\n", None),  # no rows
        ("age,severity,sex,treated\n1,0.1,0,1\n", None),  # missing column
        ("age,severity,sex,treated,outcome,patient_id,extra\n30,0.1,0,1,1,P,9\n", None),
        ("age,age,severity,sex,treated,outcome\n30,30,0.1,0,1,1\n", None),  # duplicated
        ("age,severity,sex,treated,outcome,patient_id\n30,0.1,0,2,1,P\n", "treated"),  # non-binary
        ("age,severity,sex,treated,outcome,patient_id\n30,0.1,0,1,1,P\n31,0.2,1,0", None),  # cut
        ("age,severity,sex,treated,outcome,patient_id\n30,0.1,0,1,1,P\n31,0.2,1,0,0,P,7\n", None),
        ("age,severity,sex,treated,outcome,patient_id\nabc,0.1,0,1,1,P\n", None),  # not a number
        (
            "age,severity,sex,treated,outcome,patient_id\n30,nan,0,1,1,P\n40,0.1,1,0,1,Q\n",
            "severity",
        ),
        (
            "age,severity,sex,treated,outcome,patient_id\n30,inf,0,1,1,P\n40,0.1,1,0,1,Q\n",
            "severity",
        ),
    ],
)
def test_bad_csv_is_a_problem_and_leaves_nothing(
    api: Api, db_url: str, csv_text: str, pointer_part: str | None
) -> None:
    owner = api.principal("owner")
    r = api.upload(owner["api_key"], csv_text, SCHEMA)
    body = problem(r, 422, "invalid-csv")
    assert "Traceback" not in r.text
    if pointer_part:
        assert pointer_part in body["errors"][0]["pointer"]
    assert "abc" not in body.get("detail", "")  # values are never quoted
    assert _count(db_url, Dataset) == 0
    assert _count(db_url, DatasetChunk) == 0


def _schema(**changes: Any) -> dict[str, Any]:
    s = copy.deepcopy(SCHEMA)
    s.update(changes)
    return s


@pytest.mark.parametrize(
    "schema",
    [
        _schema(outcome={"name": "outcome", "lower": 5, "upper": -5}),
        _schema(covariates=[{"name": "age", "lower": 90, "upper": 18}]),
        _schema(
            covariates=[
                {"name": "age", "lower": 0, "upper": 1},
                {"name": "age", "lower": 0, "upper": 1},
            ]
        ),
        _schema(treatment={"name": "outcome"}),
        _schema(covariates=[{"name": "age"}]),
        _schema(design="rct"),
        _schema(unknown_field=1),
        _schema(outcome={"name": "outcome", "lower": "-inf", "upper": 5}),
    ],
)
def test_bad_schema_is_a_problem(api: Api, schema: dict[str, Any]) -> None:
    owner = api.principal("owner")
    r = api.upload(owner["api_key"], synthetic_csv(20), schema)
    body = problem(r, 422, "invalid-schema")
    assert body["errors"][0]["pointer"].startswith("#/schema")


def test_schema_not_json(api: Api, client: TestClient) -> None:
    owner = api.principal("owner")
    r = client.post(
        "/v1/datasets",
        data={"name": "x", "schema": "{not json"},
        files={"file": ("a.csv", b"a\n1\n", "text/csv")},
        headers=api.auth(owner["api_key"]),
    )
    problem(r, 422, "invalid-schema")


def test_a_column_named_in_another_case_is_pointed_out(api: Api) -> None:
    owner = api.principal("owner")
    rows = "Age,severity,sex,treated,outcome,patient_id\n30,0.5,0,1,1.0,P1\n31,0.5,1,0,2.0,P2\n"
    body = problem(api.upload(owner["api_key"], rows, SCHEMA), 422, "invalid-csv")
    assert body["detail"] == (
        "missing column(s): age; the CSV has 'Age' (names must match exactly)"
    )


def test_a_single_arm_upload_is_accepted_and_the_owners_report_says_so(api: Api) -> None:
    owner = api.principal("owner")
    rows = "age,severity,sex,treated,outcome,patient_id\n" + "\n".join(
        f"{20 + i},{0.1 * (i % 4)},{i % 2},0,{i % 3},P{i}" for i in range(12)
    )
    r = api.upload(owner["api_key"], rows + "\n", SCHEMA)
    assert r.status_code == 201, r.text
    (warning,) = r.json()["ingest_report"]["warnings"]
    assert warning.startswith("only 0 of 12 rows are treated (1)")


def test_policies_clip_reject_and_impute(api: Api) -> None:
    owner = api.principal("owner")
    rows = (
        "age,severity,sex,treated,outcome,patient_id\n"
        + "\n".join(
            [f"{20 + i},{0.1 * (i % 3)},{i % 2},{i % 2},1.0,P{i}" for i in range(10)]
            + ["200,0.5,0,1,9.0,X1", "30,,1,0,1.0,X2", "30,0.5,7,0,1.0,X3"]
        )
        + "\n"
    )
    clip = api.upload(owner["api_key"], rows, _schema(missing="reject_row"))
    assert clip.status_code == 201, clip.text
    rep = clip.json()["ingest_report"]
    assert (rep["rows_received"], rep["n"]) == (13, 11)  # the blank and the unknown code dropped
    assert rep["cells_clipped"] == {"age": 1, "outcome": 1}
    # 1 of 13 (8 %) is above the 1 % that suggests dishonest bounds: each column is named
    assert [w.split(" (")[0] for w in rep["warnings"]] == [
        "1 of 11 values of 'age'",  # of the 11 rows kept, as clipping applies to those
        "1 of 11 values of 'outcome'",
        "2 of 13 rows",
    ]
    assert "were outside its declared bounds" in rep["warnings"][0]
    # the rejected rows by the column that caused them (the unknown code counts as missing)
    assert rep["rows_rejected_by_column"] == {"severity": 1, "sex": 1}
    assert rep["csv_format"] == {
        "delimiter": ",",
        "decimal": ".",
        "encoding": "utf-8",
        "missing_values": [],
        "labels": {},
    }
    reject = api.upload(
        owner["api_key"], rows, _schema(missing="reject_row", out_of_bounds="reject_row")
    )
    assert reject.json()["n"] == 10
    assert reject.json()["ingest_report"]["rows_rejected_by_column"] == {
        "severity": 1,
        "sex": 1,
        "age": 1,
        "outcome": 1,
    }
    strict = api.upload(
        owner["api_key"], rows, _schema(missing="reject_row", out_of_bounds="reject_upload")
    )
    problem(strict, 422, "invalid-csv")
    imputed_schema = _schema(
        missing="impute",
        covariates=[
            {"name": "age", "lower": 18, "upper": 90, "impute": 50},
            {"name": "severity", "lower": 0, "upper": 1, "impute": 0.5},
            {"name": "sex", "type": "categorical", "codes": [0, 1], "impute": 0},
        ],
        outcome={"name": "outcome", "lower": -5, "upper": 5, "impute": 0},
    )
    imputed = api.upload(owner["api_key"], rows, imputed_schema)
    assert imputed.status_code == 201, imputed.text
    assert imputed.json()["n"] == 13
    assert imputed.json()["ingest_report"]["cells_imputed"] == {"severity": 1, "sex": 1}
    # impute values where the plan has one (a lab), the rows missing any other column dropped:
    # here sex has none, so its unknown code's row goes and severity's hole is filled
    partial = _schema(
        missing="impute",
        covariates=[
            {"name": "age", "lower": 18, "upper": 90},
            {"name": "severity", "lower": 0, "upper": 1, "impute": 0.5},
            {"name": "sex", "type": "categorical", "codes": [0, 1]},
        ],
    )
    some = api.upload(owner["api_key"], rows, partial)
    assert some.status_code == 201, some.text
    report = some.json()["ingest_report"]
    assert (report["rows_received"], report["n"]) == (13, 12)
    assert report["cells_imputed"] == {"severity": 1}
    none_declared = _schema(missing="impute")
    body = problem(api.upload(owner["api_key"], rows, none_declared), 422, "invalid-schema")
    assert "at least one column" in body["detail"]


def test_upload_too_large_is_413(
    api: Api, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.config import get_settings
    from service.main import create_app

    owner = api.principal("owner")
    monkeypatch.setenv("CURATOR_MAX_UPLOAD_BYTES", "1000")
    get_settings.cache_clear()
    with TestClient(create_app(), raise_server_exceptions=False) as small:
        r = Api(small).upload(owner["api_key"], synthetic_csv(100), SCHEMA)
    problem(r, 413, "payload-too-large")


def test_roles_and_existence_hiding(api: Api, client: TestClient) -> None:
    owner, other_owner = api.principal("owner"), api.principal("owner")
    analyst, stranger = api.principal("analyst"), api.principal("analyst")
    ds = api.dataset(owner["api_key"])
    path = f"/v1/datasets/{ds['id']}"
    # Analysts cannot upload; nobody without a key gets in.
    problem(api.upload(analyst["api_key"], synthetic_csv(10), SCHEMA), 403, "forbidden")
    problem(client.get(path), 401, "unauthenticated")
    problem(client.get(path, headers=api.auth("dpc_wrong")), 401, "unauthenticated")
    # Without a grant a dataset is indistinguishable from a missing one.
    missing = problem(
        client.get("/v1/datasets/nope", headers=api.auth(stranger["api_key"])), 404, "not-found"
    )
    hidden = problem(client.get(path, headers=api.auth(stranger["api_key"])), 404, "not-found")
    assert missing["detail"] == hidden["detail"]
    problem(client.get(path, headers=api.auth(other_owner["api_key"])), 404, "not-found")
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    assert client.get(path, headers=api.auth(analyst["api_key"])).status_code == 200
    # Analysts cannot set budgets, grant or read the ledger.
    for method, sub, body in [
        ("put", "/budget", {"epsilon_total": 100, "delta_total": 1e-3}),
        ("put", f"/grants/{stranger['id']}", {}),
        ("get", "/ledger", None),
        ("delete", "/rows", None),
    ]:
        r = client.request(method, path + sub, json=body, headers=api.auth(analyst["api_key"]))
        problem(r, 403, "forbidden")
    # Only the admin creates principals.
    r = client.post(
        "/v1/principals", json={"name": "x", "role": "owner"}, headers=api.auth(owner["api_key"])
    )
    problem(r, 403, "forbidden")
    r = client.post(
        "/v1/principals", json={"name": "x", "role": "root"}, headers=api.auth(ADMIN_KEY)
    )
    body = problem(r, 422, "validation-failed")
    assert body["errors"][0]["pointer"] == "#/role"


def test_budget_validation(api: Api, client: TestClient) -> None:
    owner = api.principal("owner")
    ds = api.dataset(owner["api_key"], epsilon_total=None)
    for bad in (
        {"epsilon_total": 0, "delta_total": 1e-6},
        {"epsilon_total": -1, "delta_total": 0},
        {"epsilon_total": 1, "delta_total": 1.5},
        {"epsilon_total": "NaN", "delta_total": 0},
    ):
        r = client.put(
            f"/v1/datasets/{ds['id']}/budget", json=bad, headers=api.auth(owner["api_key"])
        )
        problem(r, 422, "validation-failed")


def test_ledger_export_and_verify(api: Api, client: TestClient) -> None:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"])
    api.grant(owner["api_key"], ds["id"], analyst["id"], epsilon_cap=1.0)
    h = api.auth(owner["api_key"])
    entries = client.get(f"/v1/datasets/{ds['id']}/ledger", headers=h).json()["entries"]
    assert [e["entry_type"] for e in entries] == ["create", "budget", "grant"]
    csv_r = client.get(f"/v1/datasets/{ds['id']}/ledger?format=csv", headers=h)
    assert csv_r.headers["content-type"].startswith("text/csv")
    assert csv_r.text.splitlines()[0].startswith("seq,entry_type")
    assert len(csv_r.text.strip().splitlines()) == 4
    v = client.get(f"/v1/datasets/{ds['id']}/ledger/verify", headers=h).json()
    assert v["valid"] is True
    assert v["entries"] == 3


def test_delete_rows_keeps_ledger(api: Api, client: TestClient, db_url: str) -> None:
    owner = api.principal("owner")
    ds = api.dataset(owner["api_key"])
    h = api.auth(owner["api_key"])
    assert client.delete(f"/v1/datasets/{ds['id']}/rows", headers=h).status_code == 204
    assert _count(db_url, DatasetChunk) == 0
    meta = client.get(f"/v1/datasets/{ds['id']}", headers=h).json()
    assert meta["status"] == "deleted"
    entries = client.get(f"/v1/datasets/{ds['id']}/ledger", headers=h).json()["entries"]
    assert entries[-1]["entry_type"] == "rows_deleted"
    problem(client.delete(f"/v1/datasets/{ds['id']}/rows", headers=h), 409, "dataset-unavailable")
    # a quote no longer says a release would be charged (it said fits_budget true)
    quote = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "ate", "params": {"epsilon": 0.5}},
        headers=h,
    ).json()
    assert quote["fits_budget"] is False
    assert quote["budget_note"].startswith("Not charged now: the dataset's rows were deleted")


def test_every_response_is_no_store(api: Api, client: TestClient) -> None:
    owner = api.principal("owner")
    for r in (
        client.get("/healthz"),
        client.get("/v1/datasets", headers=api.auth(owner["api_key"])),
        client.get("/v1/nothing"),
    ):
        assert r.headers["cache-control"] == "no-store"
        assert "etag" not in r.headers


@pytest.mark.parametrize(
    ("bad_row", "expected"),
    [
        ("abc,0.1,0,1,1,P", "a value that is not a number (column 'age', data row 37)"),
        ("31,0.2,1,0,0,P,7", "a row with the wrong number of fields (data row 37)"),
    ],
)
def test_a_malformed_row_is_named(api: Api, bad_row: str, expected: str) -> None:
    # the owner fixes the file by the row number; the value itself is never quoted
    rows = ["age,severity,sex,treated,outcome,patient_id"]
    rows += [f"{30 + i % 40},0.{i % 9},{i % 2},{(i // 2) % 2},1,P{i}" for i in range(1, 61)]
    rows[37] = bad_row
    r = api.upload(api.principal("owner")["api_key"], "\n".join(rows) + "\n", SCHEMA)
    body = problem(r, 422, "invalid-csv")
    assert expected in body["detail"], body["detail"]
    assert "abc" not in body["detail"]


def test_an_upload_can_be_checked_without_storing_anything(
    api: Api, client: TestClient, db_url: str
) -> None:
    """A data manager's trial and error left a dozen permanent datasets: POST /v1/datasets/check
    runs the upload's checks and report and stores nothing; only an owner may call it."""
    owner, analyst = api.principal("owner"), api.principal("analyst")
    rows = synthetic_csv(300)

    def check(key: str, text: str, **form: Any) -> Any:
        return client.post(
            "/v1/datasets/check",
            data={"schema": json.dumps(SCHEMA), **form},
            files={"file": ("rows.csv", io.BytesIO(text.encode()), "text/csv")},
            headers=api.auth(key),
        )

    before = _count(db_url, Dataset)
    ok = check(owner["api_key"], rows)
    assert ok.status_code == 200, ok.text
    assert ok.json()["n"] == 300
    assert ok.json()["ingest_report"]["rows_received"] == 300
    semicolons = check(owner["api_key"], rows.replace(",", ";"))
    assert semicolons.json()["ingest_report"]["csv_format"]["delimiter"] == ";"
    lines = rows.splitlines()
    lines[5] = lines[5].replace(",", ",x", 1)  # data row 5's age is not a number
    bad = check(owner["api_key"], "\n".join(lines) + "\n")
    assert problem(bad, 422, "invalid-csv")["errors"][0]["pointer"] == "#/rows/5/age"
    problem(check(analyst["api_key"], rows), 403, "forbidden")
    # a labels map naming a key twice (JSON keeps the last): refused, not silently merged
    twice = '{"labels": {"treated": {"yes": 1, "yes": 0}}}'
    refused = problem(check(owner["api_key"], rows, csv_format=twice), 422, "validation-failed")
    assert "names a key twice: yes" in refused["detail"]
    assert _count(db_url, Dataset) == before
    assert client.get("/v1/datasets", headers=api.auth(owner["api_key"])).json() == []


def test_a_delta_total_not_below_one_over_n_is_accepted_with_a_warning(
    api: Api, client: TestClient
) -> None:
    """A data manager set delta_total 0.5 on n = 8000 through the API and the CLI, silently
    (only the console warned); the budget now says so wherever it is shown."""
    owner = api.principal("owner")
    ds = api.dataset(owner["api_key"], n=400, epsilon_total=None)
    h = api.auth(owner["api_key"])
    fine = client.put(
        f"/v1/datasets/{ds['id']}/budget",
        json={"epsilon_total": 1.0, "delta_total": 1e-4},
        headers=h,
    )
    assert fine.json()["warnings"] == []
    # below the releases' default delta (a health economist's 1e-6: every default quote then
    # said 'fits budget: no'), and 0: accepted, with what it means
    for total, start in (
        (1e-6, "delta_total 1e-06 is below the delta a release takes by default (up to 1e-05"),
        (0.0, "delta_total 0: only pure-epsilon releases can be charged"),
    ):
        small = client.put(
            f"/v1/datasets/{ds['id']}/budget",
            json={"epsilon_total": 1.0, "delta_total": total},
            headers=h,
        )
        assert small.status_code == 200
        (said,) = small.json()["warnings"]
        assert said.startswith(start), said
    loose = client.put(
        f"/v1/datasets/{ds['id']}/budget",
        json={"epsilon_total": 1.0, "delta_total": 0.5},
        headers=h,
    )
    assert loose.status_code == 200
    (warning,) = loose.json()["warnings"]
    assert warning.startswith("delta_total 0.5 is not below 1/n = 0.0025")
    shown = client.get(f"/v1/datasets/{ds['id']}", headers=h).json()["budget"]
    assert shown["warnings"] == [warning]
