"""Issue 13 over HTTP: strictly typed privacy parameters, ledger amounts the ledger cannot hold,
chunked uploads over the limit, schema bounds that overflow, quotes that answer for the caller's
cap, and the message for a categorical value outside its codes."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from fastapi.testclient import TestClient

from tests.api.test_datasets import problem
from tests.api.test_releases import post_release, wait
from tests.conftest import ADMIN_KEY, RCT_SCHEMA, SCHEMA, Api, synthetic_csv

KIND_PARAMS: dict[str, dict[str, Any]] = {
    "ate": {"nuisance": "none"},
    "cate_vector": {"points": [[50.0, 0.5, 1.0]]},
    "cate_function": {},
    "ebm_cate": {},
    "uplift_table": {},
}


def _spent_and_charges(client: TestClient, owner: dict[str, Any], ds: dict[str, Any]) -> Any:
    key = Api.auth(owner["api_key"])
    budget = client.get(f"/v1/datasets/{ds['id']}/budget", headers=key).json()
    entries = client.get(f"/v1/datasets/{ds['id']}/ledger", headers=key).json()["entries"]
    charges = [e for e in entries if e["entry_type"] == "charge"]
    return budget["epsilon_spent"], budget["delta_spent"], charges


@pytest.mark.parametrize("bad", [True, "0.5", "1e0"], ids=["true", "str-0.5", "str-1e0"])
@pytest.mark.parametrize("kind", sorted(KIND_PARAMS))
def test_wrongly_typed_epsilon_is_422_and_charges_nothing(
    client: TestClient, api: Api, kind: str, bad: Any
) -> None:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"])
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    params = {**KIND_PARAMS[kind], "epsilon": bad}
    quote = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": kind, "params": params},
        headers=Api.auth(analyst["api_key"]),
    )
    body = problem(quote, 422, "validation-failed")
    assert [e["pointer"] for e in body["errors"]] == ["#/params/epsilon"]
    release = post_release(client, analyst["api_key"], ds["id"], params, kind=kind)
    body = problem(release, 422, "validation-failed")
    assert [e["pointer"] for e in body["errors"]] == ["#/params/epsilon"]
    assert _spent_and_charges(client, owner, ds) == (0.0, 0.0, [])


def test_wrongly_typed_fold_fractions_and_counts_are_422(client: TestClient, api: Api) -> None:
    owner = api.principal("owner")
    ds = api.dataset(owner["api_key"])
    for kind, params, pointer in [
        ("ate", {"epsilon": 1.0, "fold_fractions": ["0.5", 0.5]}, "#/params/fold_fractions/0"),
        ("uplift_table", {"epsilon": 1.0, "bins": [2, True, 2]}, "#/params/bins/1"),
        ("cate_function", {"epsilon": 1.0, "t_max": "100"}, "#/params/t_max"),
        ("ate", {"epsilon": 1.0, "cross_fit": "true"}, "#/params/cross_fit"),
    ]:
        r = post_release(client, owner["api_key"], ds["id"], params, kind=kind)
        body = problem(r, 422, "validation-failed")
        assert [e["pointer"] for e in body["errors"]] == [pointer], kind
    assert _spent_and_charges(client, owner, ds) == (0.0, 0.0, [])


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"epsilon_total": 5e-324, "delta_total": 1e-5}, "#/epsilon_total"),
        ({"epsilon_total": 1e-320, "delta_total": 1e-5}, "#/epsilon_total"),
        ({"epsilon_total": 1.0, "delta_total": 5e-324}, "#/delta_total"),
        ({"epsilon_total": 1.0, "delta_total": 1e-320}, "#/delta_total"),
        ({"epsilon_total": True, "delta_total": 1e-5}, "#/epsilon_total"),
        ({"epsilon_total": "5", "delta_total": 1e-5}, "#/epsilon_total"),
        ({"epsilon_total": 1.0, "delta_total": "0.001"}, "#/delta_total"),
    ],
)
def test_budget_the_ledger_cannot_hold_is_422(
    client: TestClient, api: Api, body: dict[str, Any], pointer: str
) -> None:
    owner = api.principal("owner")
    ds = api.dataset(owner["api_key"], epsilon_total=3.0, delta_total=1e-4)
    key = Api.auth(owner["api_key"])
    r = client.put(f"/v1/datasets/{ds['id']}/budget", json=body, headers=key)
    refused = problem(r, 422, "validation-failed")
    assert [e["pointer"] for e in refused["errors"]] == [pointer]
    budget = client.get(f"/v1/datasets/{ds['id']}/budget", headers=key).json()
    assert (budget["epsilon_total"], budget["delta_total"]) == (3.0, 1e-4)


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"epsilon_cap": 5e-324}, "#/epsilon_cap"),
        ({"epsilon_cap": 1e-320}, "#/epsilon_cap"),
        ({"delta_cap": 5e-324}, "#/delta_cap"),
        ({"epsilon_cap": True}, "#/epsilon_cap"),
        ({"epsilon_cap": "1"}, "#/epsilon_cap"),
    ],
)
def test_grant_cap_the_ledger_cannot_hold_is_422(
    client: TestClient, api: Api, body: dict[str, Any], pointer: str
) -> None:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"])
    key = Api.auth(owner["api_key"])
    r = client.put(f"/v1/datasets/{ds['id']}/grants/{analyst['id']}", json=body, headers=key)
    refused = problem(r, 422, "validation-failed")
    assert [e["pointer"] for e in refused["errors"]] == [pointer]
    assert client.get(f"/v1/datasets/{ds['id']}/grants", headers=key).json() == []


def _multipart(csv_text: str, schema: dict[str, Any]) -> tuple[bytes, str]:
    request = httpx.Request(
        "POST",
        "http://testserver/v1/datasets",
        data={"name": "chunked", "schema": json.dumps(schema)},
        files={"file": ("rows.csv", io.BytesIO(csv_text.encode()), "text/csv")},
    )
    return request.read(), request.headers["content-type"]


def _chunks(body: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def test_chunked_upload_over_the_limit_is_413(
    api: Api, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.config import get_settings
    from service.main import create_app

    owner = api.principal("owner")
    monkeypatch.setenv("CURATOR_MAX_UPLOAD_BYTES", str(100 * 1024))
    get_settings.cache_clear()
    big, content_type = _multipart(synthetic_csv(140_000), SCHEMA)
    assert len(big) > 4 * 1024 * 1024
    small, small_type = _multipart(synthetic_csv(200), SCHEMA)
    headers = Api.auth(owner["api_key"])
    with TestClient(create_app(), raise_server_exceptions=False) as limited:
        r = limited.post(
            "/v1/datasets",
            content=_chunks(big),
            headers=headers | {"content-type": content_type},
        )
        assert r.request.headers.get("content-length") is None  # really sent chunked
        body = problem(r, 413, "payload-too-large")
        assert body["detail"] == f"the limit is {100 * 1024} bytes"
        assert r.headers["cache-control"] == "no-store"
        assert limited.get("/v1/datasets", headers=headers).json() == []
        # A chunked upload under the limit goes through.
        ok = limited.post(
            "/v1/datasets", content=_chunks(small), headers=headers | {"content-type": small_type}
        )
        assert ok.status_code == 201, ok.text
        assert ok.json()["n"] == 200


def _schema_with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    schema = copy.deepcopy(SCHEMA)
    target: Any = schema
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return schema


@pytest.mark.parametrize(
    ("path", "value", "pointer"),
    [
        (("outcome", "upper"), 1e308, "outcome/lower"),  # lower is set to -1e308 too
        (("outcome", "lower"), -1e308, "outcome/lower"),
        (("outcome", "upper"), 1.5e15, "outcome/upper"),
        (("covariates", 0, "lower"), -1e300, "covariates/0/lower"),
        (("covariates", 2, "codes"), [0, 10**400], "covariates/2/codes"),
    ],
)
def test_schema_bounds_beyond_the_limit_are_422(
    api: Api, path: tuple[Any, ...], value: Any, pointer: str
) -> None:
    owner = api.principal("owner")
    schema = _schema_with(path, value)
    if path == ("outcome", "upper") and value == 1e308:
        schema["outcome"]["lower"] = -1e308  # the range overflows to inf
    r = api.upload(owner["api_key"], synthetic_csv(50), schema)
    body = problem(r, 422, "invalid-schema")
    (error,) = body["errors"]
    assert pointer in error["detail"]
    assert "1e+15" in error["detail"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"outcome": {"name": "outcome", "lower": 0.0, "upper": 1e-300}}, "outcome: the declared"),
        ({"outcome": {"name": "outcome", "lower": 1e6, "upper": 1e6 + 1e-7}}, "narrower than"),
        ({"treatment_probability": 1e-300}, "treatment_probability must lie in [0.001, 0.999]"),
    ],
)
def test_a_schema_whose_noise_cannot_be_calibrated_is_refused_at_upload(
    api: Api, change: dict[str, Any], words: str
) -> None:
    """A security auditor's outcome bounds [0, 1e-300] or treatment probability 1e-300 were
    accepted, and then every quote and release on the dataset was a 500."""
    owner = api.principal("owner")
    schema = {**copy.deepcopy(RCT_SCHEMA), **change}
    body = problem(api.upload(owner["api_key"], synthetic_csv(50), schema), 422, "invalid-schema")
    assert words in body["detail"]


def test_schema_bounds_at_the_limit_are_accepted_and_quote(client: TestClient, api: Api) -> None:
    owner = api.principal("owner")
    schema = copy.deepcopy(RCT_SCHEMA)
    schema["outcome"] = {"name": "outcome", "lower": -1e15, "upper": 1e15}
    r = api.upload(owner["api_key"], synthetic_csv(400), schema)
    assert r.status_code == 201, r.text
    ds = r.json()
    client.put(
        f"/v1/datasets/{ds['id']}/budget",
        json={"epsilon_total": 10.0, "delta_total": 1e-4},
        headers=Api.auth(owner["api_key"]),
    )
    q = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "ate", "params": {"epsilon": 1.0, "nuisance": "none"}},
        headers=Api.auth(owner["api_key"]),
    )
    assert q.status_code == 200, q.text


def _quote(client: TestClient, key: str, dataset_id: str, **params: Any) -> dict[str, Any]:
    r = client.post(
        f"/v1/datasets/{dataset_id}/quotes",
        json={"kind": "ate", "params": {"nuisance": "none", **params}},
        headers=Api.auth(key),
    )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_quote_answers_for_the_callers_cap(client: TestClient, api: Api) -> None:
    owner, analyst, uncapped = (
        api.principal("owner"),
        api.principal("analyst"),
        api.principal("analyst"),
    )
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA, epsilon_total=3.0, delta_total=1e-4)
    api.grant(owner["api_key"], ds["id"], analyst["id"], epsilon_cap=1.0, delta_cap=2e-5)
    api.grant(owner["api_key"], ds["id"], uncapped["id"])

    over = _quote(client, analyst["api_key"], ds["id"], epsilon=2.0)
    assert over["fits_budget"] is False
    assert (over["epsilon_remaining"], over["cap_epsilon_remaining"]) == (3.0, 1.0)
    assert over["cap_delta_remaining"] == 2e-5
    # ... and says why, in words: the cap, not the dataset's remainder
    assert over["budget_note"] == (
        "Not charged now: it needs epsilon 2; your cap on this dataset leaves 1."
    )
    # The quote's answer is the release's: refused by the cap, nothing charged.
    r = post_release(client, analyst["api_key"], ds["id"], {"epsilon": 2.0, "nuisance": "none"})
    refused = problem(r, 409, "principal-cap-exceeded")
    assert refused["epsilon_requested"] == 2.0
    assert "(epsilon 2, delta " in refused["detail"]
    assert "cap_epsilon_remaining" in refused["detail"]  # where to read what is left
    assert _spent_and_charges(client, owner, ds) == (0.0, 0.0, [])

    within = _quote(client, analyst["api_key"], ds["id"], epsilon=1.0)
    assert within["fits_budget"] is True
    assert within["budget_note"] is None
    # The delta cap counts too: 5e-5 fits the dataset's 1e-4 but not the cap's 2e-5.
    over_delta = _quote(client, analyst["api_key"], ds["id"], epsilon=0.5, delta=5e-5)
    assert over_delta["fits_budget"] is False
    assert over_delta["delta"] > over_delta["cap_delta_remaining"]
    assert over_delta["delta"] < over_delta["delta_remaining"]
    assert over_delta["budget_note"] == (
        "Not charged now: it needs delta 5e-05; your cap on this dataset leaves 2e-05."
    )

    # Without a cap (uncapped analyst, owner) only the dataset's remainder counts.
    for key in (uncapped["api_key"], owner["api_key"]):
        free = _quote(client, key, ds["id"], epsilon=2.0)
        assert free["fits_budget"] is True
        assert (free["cap_epsilon_remaining"], free["cap_delta_remaining"]) == (None, None)

    # A charge lowers the cap's remainder.
    done = post_release(client, analyst["api_key"], ds["id"], {"epsilon": 0.75, "nuisance": "none"})
    assert done.status_code == 202, done.text
    after = _quote(client, analyst["api_key"], ds["id"], epsilon=0.5)
    assert after["cap_epsilon_remaining"] == pytest.approx(0.25)
    assert after["epsilon_remaining"] == pytest.approx(2.25)
    assert after["fits_budget"] is False
    # more than the dataset holds: the remainder and the cap both named
    both = _quote(client, analyst["api_key"], ds["id"], epsilon=2.5)
    assert both["budget_note"] == (
        "Not charged now: it needs epsilon 2.5; the dataset has 2.25 left; and your cap on this "
        "dataset leaves 0.25."
    )


def test_a_delta_total_below_the_default_names_the_delta_that_fits(
    api: Api, client: TestClient
) -> None:
    """An owner who keeps the delta total well below 1/n, as the guide says, leaves no room for
    the default per-release delta (1e-5): the quote says what delta would fit, and a release
    naming it is charged."""
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA, epsilon_total=3.0, delta_total=1e-6)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    short = _quote(client, analyst["api_key"], ds["id"], epsilon=0.5)
    assert short["fits_budget"] is False
    assert (
        "the dataset has 1e-06 left (name a smaller delta in the request's params, at most 1e-06"
        in short["budget_note"]
    )
    named = _quote(client, analyst["api_key"], ds["id"], epsilon=0.5, delta=1e-7)
    assert named["fits_budget"] is True


def test_quote_without_a_budget_says_the_owner_sets_it(api: Api, client: TestClient) -> None:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA, epsilon_total=None)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    q = _quote(client, analyst["api_key"], ds["id"], epsilon=1.0)
    assert q["fits_budget"] is False
    assert q["budget_note"] == (
        "Not charged now: the dataset's budget is not set yet: its owner sets it "
        f"(PUT /v1/datasets/{ds['id']}/budget) before any release."
    )


def test_categorical_value_outside_its_codes_names_the_column(api: Api) -> None:
    owner = api.principal("owner")
    rows = synthetic_csv(20).splitlines()
    fields = rows[3].split(",")
    fields[3] = "7"  # sex, declared codes [0, 1]
    rows[3] = ",".join(fields)
    r = api.upload(owner["api_key"], "\n".join(rows) + "\n", SCHEMA)
    body = problem(r, 422, "invalid-csv")
    assert "categorical column 'sex'" in body["detail"]
    assert "not one of the column's declared codes" in body["detail"]
    assert "missing or non-finite" not in body["detail"]
    assert "7" not in body["detail"]  # the value itself is never echoed
    assert body["errors"] == [{"pointer": "#/rows/3/sex", "detail": body["detail"]}]
    # A truly missing value keeps its own message.
    fields[3] = ""
    rows[3] = ",".join(fields)
    r = api.upload(owner["api_key"], "\n".join(rows) + "\n", SCHEMA)
    body = problem(r, 422, "invalid-csv")
    assert "missing or non-finite value in column 'sex'" in body["detail"]


def test_json_bodies_are_capped_below_the_upload_limit_before_any_key_is_read(
    client: TestClient,
) -> None:
    """FastAPI parses a JSON body before the route reads the caller's key, so every body but a
    dataset upload is capped at JSON_BODY_LIMIT: an anonymous 65 MiB evaluation is refused
    from its Content-Length, before a byte is read; an upload keeps the larger limit."""
    from service.config import get_settings
    from service.main import JSON_BODY_LIMIT, POINTS_BODY_LIMIT, body_limit

    upload_limit = get_settings().max_upload_bytes
    assert POINTS_BODY_LIMIT < JSON_BODY_LIMIT < upload_limit
    assert body_limit("POST", "/v1/datasets", upload_limit) == upload_limit
    assert body_limit("POST", "/v1/datasets/", upload_limit) == upload_limit
    for method, path in (("POST", "/v1/datasets/d/releases"), ("PUT", "/v1/datasets/d/budget")):
        assert body_limit(method, path, upload_limit) == JSON_BODY_LIMIT
    for path in ("/v1/functions/f/evaluate", "/v1/releases/r/predict"):
        assert body_limit("POST", path, upload_limit) == POINTS_BODY_LIMIT

    def never_read() -> Iterator[bytes]:
        raise AssertionError("the body was read")
        yield b""  # pragma: no cover

    # with a valid key; without one it is a 401, also unread
    reader = Api(client).principal("client")
    r = client.post(
        "/v1/functions/f/evaluate",
        content=never_read(),
        headers={
            "content-type": "application/json",
            "content-length": str(65 * 1024 * 1024),
            **Api.auth(reader["api_key"]),
        },
    )
    body = problem(r, 413, "payload-too-large")
    assert body["detail"] == f"the limit is {POINTS_BODY_LIMIT} bytes"
    assert body["title"] == "The request body exceeds its size limit"


def test_an_evaluation_of_more_points_than_any_batch_allows_is_422(client: TestClient) -> None:
    """A batch too long is refused by its length before any point is validated: a CDS
    walkthrough's million points held the event loop for 5 s while pydantic validated every
    coordinate only to count them. A batch of invalid points too many says only that; a point
    of more coordinates than any schema has is refused by its length too."""
    from service.mechanisms.cate_function import MAX_BATCH
    from service.points import MAX_COVARIATES
    from service.releases.predict import MAX_POINTS

    body = {"points": [[0.0]] * (MAX_BATCH + 1)}
    # without a valid key: 401 first, unread; with one, the body is refused
    assert client.post("/v1/functions/f/evaluate", json=body).status_code == 401
    reader = Api(client).principal("client")
    auth = Api.auth(reader["api_key"])
    r = client.post("/v1/functions/f/evaluate", json=body, headers=auth)
    assert r.status_code == 422, r.text
    for path, limit in (
        ("/v1/functions/f/evaluate", MAX_BATCH),
        ("/v1/releases/r/predict", MAX_POINTS),
    ):
        junk = {"points": [["x", None]] * (limit + 1)}
        errors = problem(client.post(path, json=junk, headers=auth), 422, "validation-failed")[
            "errors"
        ]
        assert [e["pointer"] for e in errors] == ["#/points"]
        assert f"at most {limit} items, not {limit + 1}" in errors[0]["detail"]
        wide = {"points": [[0.0] * (MAX_COVARIATES + 1)]}
        errors = problem(client.post(path, json=wide, headers=auth), 422, "validation-failed")[
            "errors"
        ]
        assert [e["pointer"] for e in errors] == ["#/points/0"]


@pytest.mark.parametrize("bad", ["=1+2", "+SUM(A1)", "-2", "@cmd", "\t=cmd"])
def test_an_idempotency_key_a_spreadsheet_would_run_is_refused(
    client: TestClient, api: Api, bad: str
) -> None:
    """The key reaches the owner's ledger CSV verbatim: a formula-like key is refused (422)
    before any charge; UUIDs and keys with =, +, - and @ inside are fine."""
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    params = {"epsilon": 0.5, "nuisance": "none"}
    r = post_release(client, analyst["api_key"], ds["id"], params, idem=bad)
    assert "Idempotency-Key" in problem(r, 422, "validation-failed")["detail"]
    assert _spent_and_charges(client, owner, ds) == (0.0, 0.0, [])
    r = post_release(client, analyst["api_key"], ds["id"], params, idem="run-1 a=b+c-d@e")
    assert r.status_code == 202, r.text
    assert wait(client, analyst["api_key"], r.json()["id"])["status"] == "done"


def test_a_body_that_is_not_json_says_where_and_why(client: TestClient, api: Api) -> None:
    """A trailing comma: the problem names the character and the parser's reason, at the body
    (a character offset is not a JSON Pointer), and the top-level detail says it too."""
    owner = api.principal("owner")
    ds = api.upload(owner["api_key"], synthetic_csv(50), SCHEMA).json()
    r = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        content=b'{"kind": "ate", "params": {"epsilon": 1.0,}}',
        headers={**api.auth(owner["api_key"]), "Content-Type": "application/json"},
    )
    body = problem(r, 422, "validation-failed")
    (error,) = body["errors"]
    assert error["pointer"] == "#"
    assert error["detail"].startswith("the body is not valid JSON at character 42: ")
    assert body["detail"] == error["detail"]
    # the same body without its Content-Type: how to send it
    r = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        content=b'{"kind": "ate", "params": {"epsilon": 1.0}}',
        headers=api.auth(owner["api_key"]),
    )
    body = problem(r, 422, "validation-failed")
    assert "Content-Type: application/json" in body["detail"]
    assert [e["pointer"] for e in body["errors"]] == ["#"]  # the whole body


def test_schema_problems_have_a_detail_in_plain_words(client: TestClient, api: Api) -> None:
    owner = api.principal("owner")
    schema = copy.deepcopy(SCHEMA)
    schema["covariates"][0]["lower"] = schema["covariates"][0]["upper"] + 1
    body = problem(api.upload(owner["api_key"], synthetic_csv(50), schema), 422, "invalid-schema")
    assert body["detail"].startswith("#/schema")
    assert "lower must be below upper" in body["detail"]
    assert "Value error" not in json.dumps(body)
    # a schema sent as a file part (curl -F schema=@schema.json): how to send it as text
    r = client.post(
        "/v1/datasets",
        data={"name": "ds"},
        files={
            "schema": ("schema.json", io.BytesIO(json.dumps(SCHEMA).encode()), "application/json"),
            "file": ("rows.csv", io.BytesIO(synthetic_csv(50).encode()), "text/csv"),
        },
        headers=api.auth(owner["api_key"]),
    )
    body = problem(r, 422, "validation-failed")
    assert "schema=<schema.json" in body["detail"]
    # not JSON at all
    r = client.post(
        "/v1/datasets",
        data={"name": "ds", "schema": "{'covariates': []}"},
        files={"file": ("rows.csv", io.BytesIO(synthetic_csv(50).encode()), "text/csv")},
        headers=api.auth(owner["api_key"]),
    )
    body = problem(r, 422, "invalid-schema")
    assert body["errors"][0]["pointer"] == "#/schema"
    assert body["detail"].startswith("#/schema: the schema is not valid JSON")
    # a categorical covariate declared with its labels: say to recode them as integers
    labelled = copy.deepcopy(SCHEMA)
    labelled["covariates"][2]["codes"] = ["male", "female"]
    body = problem(api.upload(owner["api_key"], synthetic_csv(50), labelled), 422, "invalid-schema")
    assert body["errors"][0]["pointer"] == "#/schema/covariates/2/codes/0"
    assert "recode its values as 0, 1, ..." in body["errors"][0]["detail"]


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_numbers_are_named_as_such(
    client: TestClient, api: Api, token: str
) -> None:
    # Python's JSON parser reads these tokens as floats; a bound check alone would answer a NaN
    # with "should be less than or equal to 1000000", which sends the caller the wrong way.
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA)
    key = Api.auth(owner["api_key"])
    json_key = {**key, "content-type": "application/json"}
    for path, body, pointer in (
        ("budget", f'{{"epsilon_total": {token}, "delta_total": 1e-5}}', "#/epsilon_total"),
        (f"grants/{analyst['id']}", f'{{"delta_cap": {token}}}', "#/delta_cap"),
    ):
        r = client.put(f"/v1/datasets/{ds['id']}/{path}", content=body, headers=json_key)
        refused = problem(r, 422, "validation-failed")
        assert refused["errors"] == [
            {"pointer": pointer, "detail": "Input should be a finite number"}
        ]
    r = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        content=f'{{"kind": "ate", "params": {{"epsilon": 1, "alpha": {token}}}}}',
        headers=json_key,
    )
    refused = problem(r, 422, "validation-failed")
    assert refused["errors"] == [
        {"pointer": "#/params/alpha", "detail": "Input should be a finite number"}
    ]


def test_a_client_grant_takes_no_cap(client: TestClient, api: Api) -> None:
    owner, reader = api.principal("owner"), api.principal("client")
    ds = api.dataset(owner["api_key"])
    key = Api.auth(owner["api_key"])
    path = f"/v1/datasets/{ds['id']}/grants/{reader['id']}"
    r = client.put(path, json={"epsilon_cap": 2.0, "delta_cap": 1e-6}, headers=key)
    refused = problem(r, 422, "validation-failed")
    assert "a client never spends budget" in refused["detail"]
    assert [e["pointer"] for e in refused["errors"]] == ["#/epsilon_cap", "#/delta_cap"]
    assert client.get(f"/v1/datasets/{ds['id']}/grants", headers=key).json() == []
    granted = client.put(path, json={}, headers=key)
    assert granted.status_code == 200, granted.text
    assert (granted.json()["epsilon_cap"], granted.json()["delta_cap"]) == (None, None)


def test_a_mechanisms_refusal_points_at_the_params(client: TestClient, api: Api) -> None:
    # Refusals raised by the mechanisms (not by the request model) carry the errors list that
    # docs/problems.md promises for every validation problem.
    owner = api.principal("owner")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA)
    r = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "ate", "params": {"epsilon": 1.0, "delta": 0.5}},
        headers=Api.auth(owner["api_key"]),
    )
    refused = problem(r, 422, "validation-failed")
    assert refused["detail"].startswith("delta must be below 1/")
    assert refused["errors"] == [{"pointer": "#/params", "detail": refused["detail"]}]


def test_a_refusal_for_delta_says_delta_is_short(client: TestClient, api: Api) -> None:
    # epsilon left but no delta: the refusal names what is short (the walkthrough's owner had
    # set delta_total to one release's default delta)
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA, epsilon_total=3.0, delta_total=1e-5)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    params = {"epsilon": 0.5, "nuisance": "none"}
    first = post_release(client, analyst["api_key"], ds["id"], params)
    assert first.status_code == 202, first.text
    refused = problem(
        post_release(client, analyst["api_key"], ds["id"], {**params, "epsilon": 0.3}),
        409,
        "budget-exhausted",
    )
    assert refused["detail"].endswith("(it needs delta 1e-05; the dataset has 0 left)"), refused[
        "detail"
    ]
    assert "epsilon 0.3" in refused["detail"]


def test_revoking_a_revoked_grant_records_nothing(client: TestClient, api: Api) -> None:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"])
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    key = Api.auth(owner["api_key"])
    path = f"/v1/datasets/{ds['id']}/grants/{analyst['id']}"
    for _ in range(2):
        assert client.delete(path, headers=key).status_code == 204
    entries = client.get(f"/v1/datasets/{ds['id']}/ledger", headers=key).json()["entries"]
    assert [e["entry_type"] for e in entries] == ["create", "budget", "grant", "grant"]
    missing = client.delete(f"/v1/datasets/{ds['id']}/grants/nobody", headers=key)
    problem(missing, 404, "not-found")


def test_a_clients_quote_is_refused_in_its_own_words(client: TestClient, api: Api) -> None:
    owner, reader = api.principal("owner"), api.principal("client")
    ds = api.dataset(owner["api_key"])
    api.grant(owner["api_key"], ds["id"], reader["id"])
    r = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "ate", "params": {"epsilon": 1.0}},
        headers=Api.auth(reader["api_key"]),
    )
    body = problem(r, 403, "forbidden")
    assert "may ask for quotes and releases" in body["detail"]


def test_a_total_below_the_ledgers_unit_is_refused_not_stored_as_zero(
    client: TestClient, api: Api
) -> None:
    # the console walkthrough set delta 1e-20: it was stored as 0 and announced as 1e-20
    owner = api.principal("owner")
    ds = api.dataset(owner["api_key"], epsilon_total=3.0, delta_total=1e-4)
    key = Api.auth(owner["api_key"])
    path = f"/v1/datasets/{ds['id']}/budget"
    refused = problem(
        client.put(path, json={"epsilon_total": 3.0, "delta_total": 1e-20}, headers=key),
        422,
        "validation-failed",
    )
    assert refused["errors"][0]["pointer"] == "#/delta_total"
    assert "below the ledger's unit (1e-18)" in refused["detail"]
    budget = client.get(path, headers=key).json()
    assert (budget["epsilon_total"], budget["delta_total"]) == (3.0, 1e-4)
    ok = client.put(path, json={"epsilon_total": 3.0, "delta_total": 0.0}, headers=key)
    assert ok.status_code == 200, ok.text


def test_a_total_or_cap_below_spent_names_the_amount_and_what_is_spent(
    client: TestClient, api: Api
) -> None:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA, epsilon_total=3.0, delta_total=1e-4)
    api.grant(owner["api_key"], ds["id"], analyst["id"], epsilon_cap=2.0)
    r = post_release(client, analyst["api_key"], ds["id"], {"epsilon": 1.5, "nuisance": "none"})
    assert r.status_code == 202, r.text
    key = Api.auth(owner["api_key"])
    below = client.put(
        f"/v1/datasets/{ds['id']}/budget",
        json={"epsilon_total": 1.0, "delta_total": 1e-4},
        headers=key,
    )
    refused = problem(below, 409, "budget-below-spent")
    assert refused["detail"].endswith("epsilon 1 < 1.5 spent"), refused["detail"]
    cap = client.put(
        f"/v1/datasets/{ds['id']}/grants/{analyst['id']}", json={"epsilon_cap": 1.0}, headers=key
    )
    assert problem(cap, 409, "budget-below-spent")["detail"].endswith("epsilon 1 < 1.5 spent")


@pytest.mark.parametrize("name", ["   ", "\t", ""])
def test_a_name_without_a_visible_character_is_refused(
    client: TestClient, api: Api, name: str
) -> None:
    # the walkthrough's "   " dataset showed as an empty button in the console's table
    owner = api.principal("owner")
    upload = api.upload(owner["api_key"], synthetic_csv(50, seed=1), SCHEMA, name=name)
    assert problem(upload, 422, "validation-failed")["errors"][0]["pointer"] == "#/name"
    r = client.post(
        "/v1/principals", json={"name": name, "role": "analyst"}, headers=Api.auth(ADMIN_KEY)
    )
    assert problem(r, 422, "validation-failed")["errors"][0]["pointer"] == "#/name"


def test_an_uplift_floor_above_n_is_refused_before_any_charge(client: TestClient, api: Api) -> None:
    """min_count 1e300 made the free quote a 500 (an overflow) and the charged release a table
    of zeros with noise sd 0 (an HTTP consumer's walkthrough); the floor lies in [1, n]."""
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    for floor in (1e300, float(ds["n"]) + 1):
        params = {"epsilon": 0.2, "bins": [2, 1, 1], "min_count": floor}
        quote = client.post(
            f"/v1/datasets/{ds['id']}/quotes",
            json={"kind": "uplift_table", "params": params},
            headers=Api.auth(analyst["api_key"]),
        )
        assert (
            "min_count must be a number in [1, n]"
            in problem(quote, 422, "validation-failed")["detail"]
        )
        r = post_release(client, analyst["api_key"], ds["id"], params, kind="uplift_table")
        problem(r, 422, "validation-failed")
    assert _spent_and_charges(client, owner, ds) == (0.0, 0.0, [])


def test_extreme_numeric_parameters_are_422_never_500(client: TestClient, api: Api) -> None:
    """Every numeric parameter of every kind at the ends of the float range: a quote answers
    200 or 422, never 500 (an HTTP consumer's walkthrough found 1e300 and 1e-300 crashing the
    calibration: noise scales outside the samplers' range, an overflow in uplift_table)."""
    from service.releases.kinds import ate, cate_function, cate_vector, ebm_cate, uplift_table

    models = {
        "ate": ate.AteParams,
        "cate_function": cate_function.CateFunctionParams,
        "cate_vector": cate_vector.CateVectorRequest,
        "ebm_cate": ebm_cate.EbmCateRequest,
        "uplift_table": uplift_table.UpliftTableRequest,
    }
    base: dict[str, dict[str, Any]] = {
        "cate_vector": {"points": [[30.0, 0.5, 1.0]]},
        "uplift_table": {"bins": [2, 1, 1]},
    }
    owner, analyst = api.principal("owner"), api.principal("analyst")
    crashed = []
    for schema in (SCHEMA, RCT_SCHEMA):
        ds = api.dataset(owner["api_key"], schema=schema, epsilon_total=None)
        api.grant(owner["api_key"], ds["id"], analyst["id"])
        for kind, model in models.items():
            numeric = [
                name
                for name, field in model.model_fields.items()
                if "float" in str(field.annotation).lower() and "list" not in str(field.annotation)
            ]
            for name in numeric:
                for value in (1e300, 1e-300, 1e15, 1e-15):
                    params = {"epsilon": 1.0, **base.get(kind, {}), name: value}
                    r = client.post(
                        f"/v1/datasets/{ds['id']}/quotes",
                        json={"kind": kind, "params": params},
                        headers=Api.auth(analyst["api_key"]),
                    )
                    if r.status_code not in (200, 422):
                        crashed.append((kind, name, value, r.status_code))
    assert crashed == []


def test_a_body_without_a_bearer_key_is_refused_before_it_is_read(client: TestClient) -> None:
    """A security auditor's 50 MB JSON bodies without a key were parsed before the 401 (7-20 s
    and 500 MB each); a /v1 request with a body and no bearer key is refused unread, with the
    401's WWW-Authenticate challenge, even past the body limit."""
    for headers in (
        {},
        {"authorization": "Basic abc"},
        {"authorization": "Bearer junk"},  # a made-up key: checked before the body is read
        {"authorization": "Bearer "},
    ):

        def never_read() -> Iterator[bytes]:
            raise AssertionError("the body was read")
            yield b""  # pragma: no cover

        r = client.post(
            "/v1/datasets/x/quotes",
            content=never_read(),
            headers={**headers, "content-type": "application/json"},
        )
        assert problem(r, 401, "unauthenticated")
        assert r.headers["www-authenticate"] == "Bearer"
    big = client.post(
        "/v1/datasets/x/quotes",
        content=b"{}",
        headers={"content-type": "application/json", "content-length": str(10**12)},
    )
    assert big.status_code == 401


def test_http_answers_carry_their_rfc_9110_headers(client: TestClient, api: Api) -> None:
    """An HTTP consumer's walkthrough: a 405 without Allow, a 401 without WWW-Authenticate, and
    a body the JSON parser gave up on answered 400 http-error where docs/problems.md says 422."""
    not_allowed = client.delete("/v1/datasets")
    assert not_allowed.status_code == 405
    assert not_allowed.headers["allow"]  # Starlette names the first matching route's methods
    assert client.get("/v1/datasets").headers["www-authenticate"] == "Bearer"
    owner = api.principal("owner")
    deep = b"[" * 5000 + b"]" * 5000
    huge = b'{"epsilon_total": ' + b"9" * 5000 + b', "delta_total": 1e-6}'
    for body in (deep, huge, b'{"epsilon_total": "\xff"}'):
        r = client.put(
            "/v1/datasets/x/budget",
            content=body,
            headers={**Api.auth(owner["api_key"]), "content-type": "application/json"},
        )
        assert problem(r, 422, "validation-failed")["errors"], body[:20]


def test_one_answer_per_mistake_whichever_route(client: TestClient, api: Api) -> None:
    """A CDS walkthrough: a client posting a release without an Idempotency-Key was told to send
    one (400), with it that its role may not (403); the 401s said different things on /evaluate
    and on /principals/me. Now the role comes first, and every 401 says the same per cause."""
    owner, reader = api.principal("owner"), api.principal("client")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA)
    api.grant(owner["api_key"], ds["id"], reader["id"])
    no_key = client.post(
        f"/v1/datasets/{ds['id']}/releases",
        json={"kind": "ate", "params": {"epsilon": 0.5}},
        headers=Api.auth(reader["api_key"]),
    )
    assert "only analysts" in problem(no_key, 403, "forbidden")["detail"]
    invalid = {"Authorization": "Bearer junk"}
    details = {
        problem(r, 401, "unauthenticated")["detail"]
        for r in (
            client.get("/v1/principals/me", headers=invalid),
            client.post("/v1/functions/f/evaluate", json={"points": [[0.0]]}, headers=invalid),
            client.put("/v1/datasets/d/budget", json={"epsilon_total": 1}, headers=invalid),
        )
    }
    assert details == {"the API key is not valid"}
    missing = {
        problem(r, 401, "unauthenticated")["detail"]
        for r in (
            client.get("/v1/principals/me"),
            client.post("/v1/functions/f/evaluate", json={"points": [[0.0]]}),
        )
    }
    assert missing == {"send 'Authorization: Bearer <api key>'"}


def test_a_batch_of_too_many_points_is_counted_before_it_is_parsed(
    client: TestClient, api: Api
) -> None:
    """JSON parsing holds the event loop and the GIL: a re-test's 16 MiB body of 4.2 million
    one-number points parsed for 12 s, every other caller waiting, to be told it had too many.
    The body middleware counts a batch's points (a '[' each, outside strings) before anything
    parses it; a batch within the count is handed on unchanged, strings with brackets too."""
    from service.main import points_prescan
    from service.mechanisms.cate_function import MAX_BATCH
    from service.releases.predict import MAX_POINTS

    reader = api.principal("client")
    auth = Api.auth(reader["api_key"])
    for path, limit in (
        ("/v1/functions/f/evaluate", MAX_BATCH),
        ("/v1/releases/r/predict", MAX_POINTS),
    ):
        body = b'{"points": [' + b",".join([b"[1]"] * (limit + 5)) + b"]}"
        r = client.post(path, content=body, headers={**auth, "content-type": "application/json"})
        (error,) = problem(r, 422, "validation-failed")["errors"]
        assert error["pointer"] == "#/points"
        assert f"at most {limit} items, not about {limit + 5}" in error["detail"]
    legit = json.dumps({"columns": ["a[b", 'c"[', "x"], "points": [[1.0, 2.0, 3.0]] * MAX_BATCH})
    assert points_prescan(legit.encode(), MAX_BATCH) is None
    # within the count: parsed and answered by the route as before (an unknown function)
    r = client.post("/v1/functions/f/evaluate", json={"points": [[1.0]]}, headers=auth)
    problem(r, 404, "not-found")


def test_a_role_that_may_not_quote_is_refused_before_its_body_is_read(
    client: TestClient, api: Api
) -> None:
    """A client's 40 MB cate_vector quote was parsed for 11 s, every other caller waiting, to
    be told 403: quotes and releases check the role before the body is read."""

    def never_read() -> Iterator[bytes]:
        raise AssertionError("the body was read")
        yield b""  # pragma: no cover

    reader = api.principal("client")
    for path in ("/v1/datasets/d/quotes", "/v1/datasets/d/releases"):
        r = client.post(
            path,
            content=never_read(),
            headers={
                "content-type": "application/json",
                "content-length": str(40 * 1024 * 1024),
                **Api.auth(reader["api_key"]),
            },
        )
        assert "only analysts" in problem(r, 403, "forbidden")["detail"]
    admin = client.post(
        "/v1/datasets/d/quotes", json={"kind": "ate", "params": {}}, headers=Api.auth(ADMIN_KEY)
    )
    problem(admin, 403, "forbidden")


def test_a_trailing_slash_is_a_404_naming_the_path_not_a_redirect(
    client: TestClient, api: Api
) -> None:
    """An HTTP consumer's walkthrough: "/v1/datasets/" answered 307 to a URL built from the
    request's scheme, which behind a TLS proxy is http://, where a client following it would
    resend its key in clear. It is a 404 problem naming the path without the slash."""
    owner = api.principal("owner")
    for method in ("GET", "POST"):
        r = client.request(
            method, "/v1/datasets/", headers=Api.auth(owner["api_key"]), follow_redirects=False
        )
        body = problem(r, 404, "not-found")
        assert "location" not in r.headers
        assert "(/v1/datasets)" in body["detail"]
    assert client.get("/v1/datasets", headers=Api.auth(owner["api_key"])).status_code == 200
    for nothing in ("/v1/nothing", "/v1/nothing/"):  # no hint at a path that is not a route
        unknown = problem(client.get(nothing, headers=Api.auth(owner["api_key"])), 404, "not-found")
        assert "slash" not in unknown.get("detail", "")
    # the console keeps its own explicit redirect (a browser page, no key in a header)
    assert client.get("/console/", follow_redirects=False).headers["location"] == "/console"


def test_an_alpha_the_interval_cannot_use_is_refused_before_any_charge(
    client: TestClient, api: Api
) -> None:
    """alpha 1e-16 quoted 200, was charged, and the job failed (1 - alpha / 2 is 1.0 in
    floating point): a follow-up audit lost epsilon 0.5 a time. It is a 422 now."""
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    for name in ("alpha", "alpha_v"):
        params = {"epsilon": 0.5, "nuisance": "none", name: 1e-16}
        problem(
            post_release(client, analyst["api_key"], ds["id"], params), 422, "validation-failed"
        )
    assert _spent_and_charges(client, owner, ds) == (0.0, 0.0, [])
    fine = post_release(client, analyst["api_key"], ds["id"], {"epsilon": 0.5, "alpha": 1e-12})
    assert fine.status_code == 202, fine.text
    assert wait(client, analyst["api_key"], fine.json()["id"])["status"] == "done"
