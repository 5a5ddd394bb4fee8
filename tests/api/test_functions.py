"""Released CATE functions over HTTP: release once, evaluate many times for free, consistently."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from service.db.models import CateFunctionBatch, Principal
from service.functions import service as functions
from service.functions.sealing import MAGIC, unseal
from tests.api.test_releases import post_release, wait
from tests.conftest import ADMIN_KEY, RCT_SCHEMA, SCHEMA, Api, synthetic_csv

# shrinkage "none": these tests are about evaluation; the anchored default is tested below
FAST = {"epsilon": 1.0, "nuisance": "none", "t_max": 50, "batch_max": 20, "shrinkage": "none"}


def _plain(row: CateFunctionBatch) -> bytes:
    """A batch row's payload, decrypted (the state is sealed at rest)."""
    assert row.payload.startswith(MAGIC)  # never stored in the clear
    return unseal(row.payload, context=f"{row.function_id}:batch:{row.seq}")


@pytest.fixture
def setup(api: Api) -> dict[str, Any]:
    owner, analyst, client = (
        api.principal("owner"),
        api.principal("analyst"),
        api.principal("client"),
    )
    ds = api.dataset(owner["api_key"], n=1200, schema=RCT_SCHEMA, epsilon_total=3.0)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    api.grant(owner["api_key"], ds["id"], client["id"])
    return {"owner": owner, "analyst": analyst, "client": client, "ds": ds}


def release(c: TestClient, s: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    r = post_release(c, s["analyst"]["api_key"], s["ds"]["id"], params, kind="cate_function")
    assert r.status_code == 202, r.text
    done = wait(c, s["analyst"]["api_key"], r.json()["id"])
    assert done["status"] == "done", done
    return done


def evaluate(c: TestClient, key: str, fid: str, points: list[list[float]]) -> Any:
    return c.post(f"/v1/functions/{fid}/evaluate", json={"points": points}, headers=Api.auth(key))


def spent(c: TestClient, s: dict[str, Any]) -> float:
    budget = c.get(
        f"/v1/datasets/{s['ds']['id']}/budget", headers=Api.auth(s["owner"]["api_key"])
    ).json()
    return float(budget["epsilon_spent"])


SECRET_WORDS = ("coef", "support", "alpha", "noise_values", "cholesky", "u_s", "g_star", "whitened")


def make_constant(db_url: str, fid: str) -> tuple[dict[str, Any], int]:
    """Give a released function DP shrinkage factor 0 in its stored public facts (a factor > 0
    by chance made the case) and forget the cached copies; return the facts and its stored t."""
    from service.db.models import CateFunction

    engine = create_engine(db_url)
    try:
        with Session(engine) as session:
            row = session.get(CateFunction, fid)
            assert row is not None
            public: dict[str, Any] = json.loads(row.public_json)
            if public["shrinkage_factor"] != 0.0:
                public["shrinkage_factor"] = 0.0
                row.public_json = json.dumps(public)
                session.commit()
            stored_t = row.t
    finally:
        engine.dispose()
    functions.forget()
    return public, stored_t


def _no_secrets(body: Any) -> None:
    text = json.dumps(body).lower()
    for word in SECRET_WORDS:
        assert f'"{word}"' not in text


def _stored_noise(db_url: str, fid: str) -> list[float]:
    engine = create_engine(db_url)
    try:
        with Session(engine) as session:
            rows = session.execute(
                select(CateFunctionBatch).where(CateFunctionBatch.function_id == fid)
            ).scalars()
            out: list[float] = []
            for row in rows:
                with np.load(io.BytesIO(_plain(row))) as z:
                    out.extend(float(v) for v in z["u"])
            return out
    finally:
        engine.dispose()


def test_release_then_free_consistent_evaluations(
    client: TestClient, setup: Any, configured: str
) -> None:
    done = release(client, setup, FAST)
    assert done["guarantee"] == "strict"
    assert done["result"]["pointwise_noise_sd"] > 0
    # the stored hint names this function's own path (the job did not know its id)
    assert done["result"]["evaluate"] == f"POST /v1/functions/{done['id']}/evaluate"
    assert done["result"]["function_id"] == done["id"]  # for programs reading the result
    _no_secrets(done)
    fid = done["id"]
    before = spent(client, setup)
    points = [[30.0, 0.2, 0.0], [60.0, 0.8, 1.0], [30.0, 0.2, 0.0]]
    r = evaluate(client, setup["analyst"]["api_key"], fid, points)
    assert r.status_code == 200, r.text
    values = r.json()["values"]
    _no_secrets(r.json())
    assert len(values) == 3
    assert values[0] == values[2]  # duplicate inside a batch
    # Another principal (a client) gets the identical value at the same point, and a new point.
    r2 = evaluate(client, setup["client"]["api_key"], fid, [[60.0, 0.8, 1.0], [45.0, 0.5, 1.0]])
    assert r2.status_code == 200, r2.text
    assert r2.json()["values"][0] == values[1]
    # A process restart (cache dropped) keeps every answer.
    functions.forget()
    r3 = evaluate(client, setup["owner"]["api_key"], fid, points + [[45.0, 0.5, 1.0]])
    assert r3.json()["values"] == [*values, r2.json()["values"][1]]
    assert spent(client, setup) == before  # evaluation never charges
    meta = client.get(f"/v1/functions/{fid}", headers=Api.auth(setup["client"]["api_key"]))
    assert meta.status_code == 200
    assert meta.json()["basis"] == "exact"
    _no_secrets(meta.json())
    # The unit-noise values are stored (3 distinct points) and appear in no response.
    noise = _stored_noise(configured, fid)
    assert len(noise) == 3
    bodies = " ".join(x.text for x in (r, r2, r3, meta))
    for value in noise:
        assert repr(value) not in bodies
        assert f"{value:.6g}" not in bodies


def test_metadata_states_units_and_labels_from_the_schema(api: Api, client: TestClient) -> None:
    """A decision-support client reads what an answer is measured in and what a point's
    coordinates mean (units, codes and their labels) from the function, as the owner declared
    them; a schema without them gives nulls."""
    owner, analyst = api.principal("owner"), api.principal("analyst")
    labelled = {
        **RCT_SCHEMA,
        "covariates": [
            {"name": "age", "lower": 18, "upper": 90, "unit": "years"},
            {"name": "severity", "lower": 0, "upper": 1},
            {
                "name": "sex",
                "type": "categorical",
                "codes": [0, 1],
                "code_labels": {"0": "female", "1": "male"},
            },
        ],
        "treatment": {"name": "treated", "code_labels": {"0": "usual care", "1": "new pathway"}},
        "outcome": {"name": "outcome", "lower": -5, "upper": 5, "unit": "points"},
    }
    for schema, unit in ((labelled, "points"), (RCT_SCHEMA, None)):
        ds = api.dataset(owner["api_key"], n=600, schema=schema, epsilon_total=2.0)
        api.grant(owner["api_key"], ds["id"], analyst["id"])
        fid = release(client, {"analyst": analyst, "ds": ds}, FAST)["id"]
        meta = client.get(f"/v1/functions/{fid}", headers=Api.auth(analyst["api_key"])).json()
        assert meta["outcome"] == {
            "name": "outcome",
            "type": "numeric",
            "unit": unit,
            "lower": -5.0,
            "upper": 5.0,
        }
        info = meta["covariate_info"]
        assert [c["name"] for c in info] == meta["covariates"] == ["age", "severity", "sex"]
        assert [c["unit"] for c in info] == ["years" if unit else None, None, None]
        assert (info[0]["lower"], info[0]["upper"], info[0]["codes"]) == (18.0, 90.0, None)
        assert info[2]["codes"] == [0, 1]
        if unit:
            assert info[2]["code_labels"] == {"0": "female", "1": "male"}
            assert meta["treatment"] == {
                "name": "treated",
                "code_labels": {"0": "usual care", "1": "new pathway"},
            }
        else:
            assert info[2]["code_labels"] is None
            assert meta["treatment"] == {"name": "treated", "code_labels": None}


def test_schema_labels_are_checked_at_upload(api: Api) -> None:
    owner = api.principal("owner")
    sex = {"name": "sex", "type": "categorical", "codes": [0, 1]}
    cases = (
        ({**sex, "code_labels": {"2": "other"}}, "code_labels names 2, not among its codes"),
        ({"name": "sex", "lower": 0, "upper": 1, "code_labels": {"1": "m"}}, "cannot have code"),
        ({**sex, "unit": "x" * 81}, "unit"),
    )
    for covariate, message in cases:
        schema = {**SCHEMA, "covariates": [*SCHEMA["covariates"][:2], covariate]}
        r = api.upload(owner["api_key"], synthetic_csv(50), schema)
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert message in r.text


def test_points_validated_and_capacity(client: TestClient, setup: Any) -> None:
    refused = post_release(
        client,
        setup["analyst"]["api_key"],
        setup["ds"]["id"],
        {**FAST, "t_max": 3, "shrinkage": "ate"},
        kind="cate_function",
    )
    assert refused.status_code == 422  # the anchored function's reference draws need t_max >= 6
    assert "t_max" in refused.json()["detail"]
    fid = release(client, setup, {**FAST, "t_max": 3})["id"]
    key = setup["client"]["api_key"]
    r = evaluate(client, key, fid, [[10.0, 0.5, 1.0]])  # age below 18
    assert r.status_code == 422
    assert r.json()["errors"][0]["pointer"] == "#/points/0/0"
    assert evaluate(client, key, fid, [[20.0, 0.5]]).status_code == 422
    empty = evaluate(client, key, fid, [])
    assert empty.status_code == 422
    # the same words as /predict's (both bodies declare minItems 1)
    assert empty.json()["errors"][0]["pointer"] == "#/points"
    assert "at least 1 item" in empty.json()["detail"]
    # a categorical value between its codes and one beyond them get the same words
    for sex in (0.5, 2.0):
        odd = evaluate(client, key, fid, [[20.0, 0.5, sex]])
        assert odd.json()["errors"][0]["detail"].startswith("a categorical covariate: one of")
    assert evaluate(client, key, fid, [[20.0, 0.5, 1.0]] * 21).status_code == 422  # batch cap
    ok = evaluate(client, key, fid, [[20.0, 0.5, 1.0], [21.0, 0.5, 1.0], [22.0, 0.5, 1.0]])
    assert ok.status_code == 200
    full = evaluate(client, key, fid, [[23.0, 0.5, 1.0]])
    assert full.status_code == 409
    assert full.json()["type"].endswith("function-capacity-reached")
    again = evaluate(client, key, fid, [[21.0, 0.5, 1.0]])  # cached points still served
    assert again.json()["values"][0] == ok.json()["values"][1]


def test_each_caller_has_its_share_of_the_capacity(
    client: TestClient, setup: Any, db_url: str
) -> None:
    """``points_per_principal``: no one caller can use up an exact function's capacity for the
    others; already answered points stay free for everyone."""
    over = post_release(
        client,
        setup["analyst"]["api_key"],
        setup["ds"]["id"],
        {**FAST, "t_max": 5, "points_per_principal": 6},
        kind="cate_function",
    )
    assert over.status_code == 422
    assert "points_per_principal" in over.text
    fid = release(client, setup, {**FAST, "t_max": 10, "points_per_principal": 3})["id"]
    c_key, a_key = setup["client"]["api_key"], setup["analyst"]["api_key"]
    info = client.get(f"/v1/functions/{fid}", headers=Api.auth(c_key)).json()
    assert (info["t_max"], info["points_per_principal"]) == (10, 3)
    assert "points_you_added" not in info  # a count would tell which points others asked

    first = evaluate(client, c_key, fid, [[20.0, 0.5, 1.0], [21.0, 0.5, 1.0]])
    assert first.status_code == 200
    past = evaluate(client, c_key, fid, [[22.0, 0.5, 1.0], [23.0, 0.5, 1.0]])
    assert past.status_code == 409
    assert past.json()["type"].endswith("function-capacity-reached")
    assert "at most 3" in past.json()["detail"]
    # a repeat of the client's own points and of another's are free; one new point still fits
    assert evaluate(client, c_key, fid, [[21.0, 0.5, 1.0], [22.0, 0.5, 1.0]]).status_code == 200
    assert evaluate(client, c_key, fid, [[23.0, 0.5, 1.0]]).status_code == 409
    # the analyst has its own share, and answers the client's points as the client got them
    mine = evaluate(client, a_key, fid, [[20.0, 0.5, 1.0], [30.0, 0.5, 1.0], [31.0, 0.5, 1.0]])
    assert mine.status_code == 200
    assert mine.json()["values"][0] == first.json()["values"][0]
    engine = create_engine(db_url)
    with Session(engine) as session:
        who = session.execute(
            select(CateFunctionBatch.principal_id, CateFunctionBatch.size)
            .where(CateFunctionBatch.function_id == fid)
            .order_by(CateFunctionBatch.seq)
        ).all()
    engine.dispose()
    assert [tuple(r) for r in who] == [
        (setup["client"]["id"], 2),
        (setup["client"]["id"], 1),
        (setup["analyst"]["id"], 2),
    ]
    # without a share the info says so
    plain = release(client, setup, FAST)["id"]
    info = client.get(f"/v1/functions/{plain}", headers=Api.auth(c_key)).json()
    assert info["points_per_principal"] is None


def test_access_is_by_grant(client: TestClient, api: Api, setup: Any) -> None:
    fid = release(client, setup, FAST)["id"]
    stranger = api.principal("client")
    r = evaluate(client, stranger["api_key"], fid, [[30.0, 0.2, 0.0]])
    assert r.status_code == 404
    assert evaluate(client, "nope", fid, [[30.0, 0.2, 0.0]]).status_code == 401
    # without a key, a malformed body is refused as unauthenticated first, as on /predict
    for url in (f"/v1/functions/{fid}/evaluate", f"/v1/releases/{fid}/predict"):
        for body in ({"points": "x"}, {"wrong": 1}):
            refused = client.post(url, json=body)
            assert refused.status_code == 401, (url, body, refused.text)
            assert refused.json()["type"].endswith("unauthenticated")
    assert evaluate(client, setup["client"]["api_key"], "0" * 32, [[30, 0, 0]]).status_code == 404


def test_ebm_basis_where_the_dp_ebm_learns(client: TestClient, api: Api, configured: str) -> None:
    """n eps / q = 2400 * 2 / 3 = 1600 >= 1500: the default function is the strict ebm_cate
    release (proof §9); it answers for free, identically for every caller and after a restart,
    and shows no model."""
    owner, analyst, other = (
        api.principal("owner"),
        api.principal("analyst"),
        api.principal("client"),
    )
    ds = api.dataset(owner["api_key"], n=2400, schema=RCT_SCHEMA, epsilon_total=3.0)
    for who in (analyst, other):
        api.grant(owner["api_key"], ds["id"], who["id"])
    s = {"owner": owner, "analyst": analyst, "client": other, "ds": ds}
    quote = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "cate_function", "params": {"epsilon": 2.0}},
        headers=Api.auth(analyst["api_key"]),
    )
    assert quote.status_code == 200, quote.text
    assert quote.json()["accuracy"]["basis"] == "ebm"
    done = release(client, s, {"epsilon": 2.0})
    assert done["result"]["basis"] == "ebm"
    assert done["result"]["guarantee"] == "strict"
    assert not {"model", "shape_functions", "anchor_centre"} & set(done["result"])
    _no_secrets(done)
    before = spent(client, s)
    assert before == pytest.approx(2.0)
    fid = done["id"]
    pts = [[20.0 + 3 * i, (i % 10) / 10, float(i % 2)] for i in range(20)]
    a = evaluate(client, analyst["api_key"], fid, pts)
    assert a.status_code == 200, a.text
    functions.forget()
    b = evaluate(client, other["api_key"], fid, pts)
    assert a.json()["values"] == b.json()["values"]
    assert all(abs(v) <= 10.0 for v in a.json()["values"])  # the public CATE range R_Y
    assert spent(client, s) == before  # evaluation never charges
    meta = client.get(f"/v1/functions/{fid}", headers=Api.auth(other["api_key"])).json()
    assert (meta["basis"], meta["t_max"]) == ("ebm", None)
    _no_secrets(meta)
    # at factor 0 every answer is the anchor exactly (the model's sum had missed it by 1e-10)
    public, _ = make_constant(configured, fid)
    flat = evaluate(client, other["api_key"], fid, pts).json()
    assert flat["values"] == [public["ate_anchor"]] * len(pts)


@pytest.mark.parametrize("basis", ["nystrom", "rff"])
def test_finite_basis(client: TestClient, setup: Any, basis: str) -> None:
    params = {"epsilon": 1.0, "nuisance": "none", "basis": basis, "n_centres": 32, "n_features": 32}
    fid = release(client, setup, params)["id"]
    pts = [[30.0 + i, 0.5, 1.0] for i in range(20)]
    a = evaluate(client, setup["client"]["api_key"], fid, pts).json()["values"]
    functions.forget()
    b = evaluate(client, setup["analyst"]["api_key"], fid, pts).json()["values"]
    assert a == b
    meta = client.get(f"/v1/functions/{fid}", headers=Api.auth(setup["client"]["api_key"]))
    assert meta.json()["t_max"] is None


def test_corrupt_state_closes_the_function(client: TestClient, setup: Any, configured: str) -> None:
    fid = release(client, setup, FAST)["id"]
    key = setup["client"]["api_key"]
    assert evaluate(client, key, fid, [[30.0, 0.2, 0.0]]).status_code == 200
    engine = create_engine(configured)
    try:
        with Session(engine) as session:
            row = session.execute(
                select(CateFunctionBatch).where(CateFunctionBatch.function_id == fid)
            ).scalar_one()
            row.payload = row.payload[:-7] + b"garbage"
            session.commit()
    finally:
        engine.dispose()
    functions.forget()  # as after a restart: the state must be reloaded from the database
    r = evaluate(client, key, fid, [[31.0, 0.2, 0.0]])
    assert r.status_code == 409
    assert r.json()["type"].endswith("function-closed")
    assert "garbage" not in r.text
    meta = client.get(f"/v1/functions/{fid}", headers=Api.auth(key))
    assert meta.json()["status"] == "closed"
    assert evaluate(client, key, fid, [[30.0, 0.2, 0.0]]).status_code == 409


@pytest.mark.parametrize("basis", ["nystrom", "exact"])
def test_revocation_and_disabled_keys_take_effect_at_once(
    client: TestClient, setup: Any, configured: str, basis: str
) -> None:
    """The fast evaluation path caches public facts and the released function, never access:
    a revoked grant or a disabled key is refused on the very next request."""
    params = {**FAST, "basis": basis, "n_centres": 32}
    fid = release(client, setup, params)["id"]
    point = [[30.0, 0.2, 0.0]]
    client_key, analyst_key = setup["client"]["api_key"], setup["analyst"]["api_key"]
    first = evaluate(client, client_key, fid, point)
    assert first.status_code == 200
    assert evaluate(client, analyst_key, fid, point).json()["values"] == first.json()["values"]
    owner = Api.auth(setup["owner"]["api_key"])
    revoked = client.delete(
        f"/v1/datasets/{setup['ds']['id']}/grants/{setup['client']['id']}", headers=owner
    )
    assert revoked.status_code == 204
    assert evaluate(client, client_key, fid, point).status_code == 404
    engine = create_engine(configured)
    try:
        with Session(engine) as session:
            principal = session.get(Principal, setup["analyst"]["id"])
            assert principal is not None
            principal.disabled = True
            session.commit()
    finally:
        engine.dispose()
    assert evaluate(client, analyst_key, fid, point).status_code == 401
    # The owner and the admin still read the same value; nothing was charged.
    again = evaluate(client, setup["owner"]["api_key"], fid, point)
    assert again.json()["values"] == first.json()["values"]
    assert evaluate(client, ADMIN_KEY, fid, point).json()["values"] == first.json()["values"]
    assert spent(client, setup) == 1.0


def test_evaluation_responses_are_not_cacheable(client: TestClient, setup: Any) -> None:
    fid = release(client, setup, {**FAST, "basis": "nystrom", "n_centres": 32})["id"]
    r = evaluate(client, setup["client"]["api_key"], fid, [[30.0, 0.2, 0.0]])
    assert r.headers["cache-control"] == "no-store"
    bad = evaluate(client, setup["client"]["api_key"], fid, [[300.0, 0.2, 0.0]])
    assert bad.status_code == 422
    assert bad.headers["cache-control"] == "no-store"
    assert bad.headers["content-type"].startswith("application/problem+json")


class _FixedNormals:
    """Stands in for the production sampler at evaluation: known unit normals, recorded."""

    XI = np.array([1.5, -2.0, 0.75])
    sizes: list[int] = []

    def standard_normal(self, size: int) -> np.ndarray:
        type(self).sizes.append(size)
        return self.XI[:size].copy()


def _proof_r0(result: dict[str, Any], outcome_range: float) -> float:
    """r0 = Delta sigma_G from docs/proofs/cate_function.md (R-learner, k0 terms), recomputed
    from the release's public parameters, independently of the mechanism's own arithmetic; with
    shrinkage "ate" the GP has the rest after the anchor's public share (proof §7)."""
    from service.mechanisms.ate_strict import split_share
    from service.mechanisms.calibration import analytic_gaussian_multiplier

    epsilon, delta = result["epsilon"], result["delta"]
    if result["shrinkage"] == "ate":
        share = result["anchor_share"]
        from service.mechanisms.anchor import ATE_ANCHOR_SHARES

        assert share in ATE_ANCHOR_SHARES  # the public rule's grid (anchor.ate_anchor_share)
        # a trial's anchor below n eps = 5 * 10^4 is the difference in means, pure epsilon: the
        # GP keeps the whole delta (cate_function.md §7 step 1)
        pure = result["anchor_release"]["delta"] == 0.0
        epsilon = split_share(epsilon, share)[1]
        delta = delta if pure else split_share(delta, share)[1]
    lam, n2 = float(result["lambda0"]), int(result["n2"])
    target = outcome_range  # R-learner: |r| <= R_Y
    lipschitz = 2.0 * (target + target / np.sqrt(lam))
    sensitivity = lipschitz / (lam * n2)
    return sensitivity * analytic_gaussian_multiplier(epsilon, delta)


@pytest.mark.parametrize("shrinkage", ["none", "ate"])
def test_gp_noise_is_drawn_through_the_sampler_at_the_proof_scale(
    client: TestClient,
    setup: Any,
    configured: str,
    monkeypatch: pytest.MonkeyPatch,
    shrinkage: str,
) -> None:
    """End to end (issue 13.11/13.12): the unit normals of an evaluation come from the
    sampler's ``standard_normal``; the stored path values are the GP's conditional draw
    ``V^T w_S + L_** xi`` given the earlier points; and each released value is
    ``anchor + factor (g*(x) + r0 u(x))`` (no anchor, factor 1 without shrinkage) with r0 the
    proof's ``Delta sigma_G``. Halving r0 anywhere (plan, stored function, evaluation) or drawing
    the normals elsewhere turns it red (without shrinkage always; with it, where the factor is
    not 0, and r0 is still checked against the public pointwise noise sd)."""
    done = release(client, setup, {**FAST, "learner": "r", "shrinkage": shrinkage})
    fid, result = done["id"], done["result"]
    assert result["reference_points"] == (25 if shrinkage == "ate" else 0)
    monkeypatch.setattr(functions, "OpenDPSampler", _FixedNormals)
    _FixedNormals.sizes = []
    points = np.array([[30.0, 0.2, 0.0], [70.0, 0.9, 1.0]])
    r = evaluate(client, setup["analyst"]["api_key"], fid, points.tolist())
    assert r.status_code == 200, r.text
    if shrinkage == "ate" and result["shrinkage_factor"] == 0.0:
        # factor 0: the answers are the anchor, served from the public facts with nothing
        # drawn (test_a_constant_function_answers_its_anchor_without_state)
        assert _FixedNormals.sizes == []
        assert len(set(r.json()["values"])) == 1
        return
    assert _FixedNormals.sizes == [2]
    released = np.array(r.json()["values"])

    engine = create_engine(configured)
    try:
        with Session(engine) as session:
            fitted = functions._load_fitted(session, fid)
            rows = (
                session.execute(
                    select(CateFunctionBatch)
                    .where(CateFunctionBatch.function_id == fid)
                    .order_by(CateFunctionBatch.seq)
                )
                .scalars()
                .all()
            )
            # with shrinkage, batch 1 is the reference draw made at release time
            assert [row.seq for row in rows] == ([1, 2] if shrinkage == "ate" else [1])
            earlier = [functions._decode_batch(row, 3) for row in rows[:-1]]
            _, u, y, d = functions._decode_batch(rows[-1], 3)
    finally:
        engine.dispose()
    lower, upper = np.array([18.0, 0.0, 0.0]), np.array([90.0, 1.0, 1.0])  # SCHEMA's box
    _, canonical = functions.mech.canonicalise(functions.mech.scale_to_unit(points, lower, upper))
    from service.mechanisms import gp

    # u = the GP path at the new points given the reference draw: V^T w_S + L_** xi (gp.py)
    path = gp.GpPath(3, result["bandwidth"])
    for ref_codes, ref_u, _, ref_d in earlier:
        path.extend_known(ref_codes * 2.0**-20, ref_u, ref_d)
    expected_u = path.draw(canonical, normals=lambda m: _FixedNormals.XI[:m], jitter=1e-8).values
    assert np.allclose(u, expected_u, atol=1e-9)
    r0 = _proof_r0(result, outcome_range=SCHEMA["outcome"]["upper"] - SCHEMA["outcome"]["lower"])
    assert r0 == pytest.approx(result["pointwise_noise_sd"], rel=1e-12)
    step = 2.0**fitted.output_lattice_exponent
    if shrinkage == "ate":
        assert fitted.anchor == result["ate_anchor"]
        assert fitted.shrink == result["shrinkage_factor"]
    else:
        assert (fitted.anchor, fitted.shrink) == (0.0, 1.0)
    expected = fitted.anchor + fitted.shrink * (fitted.mean(canonical) + r0 * u)
    assert np.all(np.abs(expected) < fitted.value_bound)  # no clipping in this check
    assert np.allclose(released, expected, atol=step, rtol=0)
    assert np.array_equal(released, y)


def test_anchored_function_answers_its_reference_points_consistently(
    client: TestClient, setup: Any, configured: str
) -> None:
    """shrinkage "ate" (the strict default): the release states its DP anchor and factor, its
    path was drawn at the public reference points at release time (batch 1, t = 25), and a
    client asking a reference point gets the stored answer, free, identical on every ask."""
    params = {key: value for key, value in FAST.items() if key != "shrinkage"}
    done = release(client, setup, params)
    result = done["result"]
    assert result["shrinkage"] == "ate"
    assert -10.0 <= result["ate_anchor"] <= 10.0
    interval = result["ate_anchor_interval"]  # the anchor release's own 95 % interval
    assert interval["level"] == 0.95
    assert -10.0 <= interval["lower"] < result["ate_anchor"] < interval["upper"] <= 10.0
    assert 0.0 <= result["shrinkage_factor"] <= 1.0
    assert result["reference_points"] == 25
    fid = done["id"]
    assert len(_stored_noise(configured, fid)) == 25
    # the first Sobol reference point, mapped back to the SCHEMA box
    from service.db.engine import get_sessionmaker
    from service.mechanisms import cate_function as mech
    from service.mechanisms import gp

    codes, units = mech.canonicalise(gp.sobol_centres(25, 3))
    lower, upper = np.array([18.0, 0.0, 0.0]), np.array([90.0, 1.0, 1.0])
    point = (lower + units[0] * (upper - lower)).tolist()
    before = spent(client, setup)
    # A reference point is inside the box but its third coordinate, a categorical covariate
    # (codes 0 / 1), is not a code: a client cannot ask it...
    refused = evaluate(client, setup["client"]["api_key"], fid, [point])
    assert refused.status_code == 422, refused.text
    assert refused.json()["errors"] == [
        {"pointer": "#/points/0/2", "detail": "a categorical covariate: one of its codes {0, 1}"}
    ]
    # ...and the evaluation below the HTTP check answers it from the reference draw, the same
    # for every caller, storing nothing new.
    answers = []
    for caller in (setup["client"]["id"], setup["analyst"]["id"]):
        with get_sessionmaker()() as session:
            answers.append(
                functions._evaluate_exact(session, fid, codes[:1], units[:1], caller=caller)
            )
    assert answers[0] == answers[1]
    assert len(_stored_noise(configured, fid)) == 25  # answered from the reference draw
    assert spent(client, setup) == before
    _no_secrets(done)


def use_state_keys(monkeypatch: pytest.MonkeyPatch, state_key: str, previous: str = "") -> None:
    """Configure this process as one started with these state keys: settings re-read, the
    function cache dropped (state is read from the database again)."""
    from service.config import get_settings

    monkeypatch.setenv("CURATOR_STATE_KEY", state_key)
    monkeypatch.setenv("CURATOR_STATE_KEY_PREVIOUS", previous)
    get_settings.cache_clear()
    functions.forget()


def test_state_key_rotation_keeps_every_answer(
    client: TestClient, setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator moves the old state key to CURATOR_STATE_KEY_PREVIOUS, sets a new one and
    re-seals: exact and finite-basis functions answer exactly as before at every step, and
    after the re-seal the old key is no longer needed."""
    import base64

    from service.config import get_settings
    from service.db.engine import get_sessionmaker
    from service.functions.rotate import reseal_all

    exact = release(client, setup, FAST)["id"]
    finite = release(client, setup, {**FAST, "basis": "nystrom", "n_centres": 16})["id"]
    key = setup["client"]["api_key"]
    points = [[20.0, 0.5, 1.0], [40.0, 0.2, 0.0]]
    before = {f: evaluate(client, key, f, points).json()["values"] for f in (exact, finite)}

    old = get_settings().state_key
    new = base64.b64encode(b"n" * 32).decode()

    use_state_keys(monkeypatch, new, previous=old)
    for f in (exact, finite):
        assert evaluate(client, key, f, points).json()["values"] == before[f]
    more = evaluate(client, key, exact, [[30.0, 0.5, 1.0]])  # sealed under the new key
    assert more.status_code == 200

    report = reseal_all(get_sessionmaker())
    assert report.functions == 2
    assert report.unreadable == 0
    assert report.resealed >= 3  # two fitted states and the first batch of points
    assert report.current >= 1  # the batch sealed after the rotation
    assert report.check_resealed
    assert reseal_all(get_sessionmaker()).resealed == 0  # a second run has nothing to do

    use_state_keys(monkeypatch, new)
    for f in (exact, finite):
        assert evaluate(client, key, f, points).json()["values"] == before[f]
    assert evaluate(client, key, exact, [[30.0, 0.5, 1.0]]).json() == more.json()
    info = client.get(f"/v1/functions/{exact}", headers=Api.auth(key)).json()
    assert info["status"] == "open"
    get_settings.cache_clear()


def test_a_wrong_state_key_is_refused_not_taken_for_corrupt_state(
    client: TestClient, setup: Any, monkeypatch: pytest.MonkeyPatch, configured: str
) -> None:
    """A mistyped or lost CURATOR_STATE_KEY would read every function's state as corrupt and
    close it for good: processes refuse to start with it instead, and a running one answers
    500 without closing the function."""
    import base64

    from service.config import get_settings
    from service.functions.keys import state_key_problem
    from service.main import create_app

    fid = release(client, setup, FAST)["id"]
    key = setup["client"]["api_key"]
    answered = evaluate(client, key, fid, [[20.0, 0.5, 1.0]]).json()["values"]
    right = get_settings().state_key

    wrong = base64.b64encode(b"w" * 32).decode()
    use_state_keys(monkeypatch, wrong)
    message = state_key_problem(configured)
    assert message is not None
    assert "CURATOR_STATE_KEY_PREVIOUS" in message
    with pytest.raises(RuntimeError, match="does not open"), TestClient(create_app()):
        pass  # uvicorn started directly: the lifespan refuses too
    refused = evaluate(client, key, fid, [[20.0, 0.5, 1.0]])  # a process already running
    assert refused.status_code == 500
    assert refused.json()["type"].endswith("/internal-error")
    use_state_keys(monkeypatch, wrong, previous=right)  # a rotation in progress: allowed
    assert state_key_problem(configured) is None
    use_state_keys(monkeypatch, right)
    assert evaluate(client, key, fid, [[20.0, 0.5, 1.0]]).json()["values"] == answered
    info = client.get(f"/v1/functions/{fid}", headers=Api.auth(key)).json()
    assert info["status"] == "open"
    get_settings.cache_clear()


def test_a_new_state_key_takes_over_where_no_function_needs_the_old(
    client: TestClient, setup: Any, monkeypatch: pytest.MonkeyPatch, configured: str
) -> None:
    import base64

    from service.config import get_settings
    from service.functions.keys import state_key_problem

    assert state_key_problem(configured) is None  # sealed under the tests' key
    use_state_keys(monkeypatch, base64.b64encode(b"z" * 32).decode())
    assert state_key_problem(configured) is None  # no open function: re-sealed under this one
    fid = release(client, setup, FAST)["id"]
    assert evaluate(client, setup["client"]["api_key"], fid, [[20.0, 0.5, 1.0]]).status_code == 200
    get_settings.cache_clear()


def test_the_rotate_command(
    client: TestClient,
    setup: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``python -m service.functions.rotate``: the counts as JSON, exit 0; exit 1 with the
    message where the configured keys do not open the state."""
    import base64

    from service.config import get_settings
    from service.functions import rotate

    release(client, setup, FAST)
    old = get_settings().state_key
    use_state_keys(monkeypatch, base64.b64encode(b"r" * 32).decode(), previous=old)
    assert rotate.main([]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert (counts["functions"], counts["resealed"], counts["unreadable"]) == (1, 1, 0)
    assert counts["check_resealed"] is True
    # the key before the rotation as the previous one: the state is under neither
    use_state_keys(monkeypatch, base64.b64encode(b"x" * 32).decode(), previous=old)
    assert rotate.main([]) == 1
    assert "does not open" in capsys.readouterr().err
    get_settings.cache_clear()


def test_a_half_rolled_out_rotation_closes_no_function(
    client: TestClient, setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During a rolling restart a process with the new key seals a batch that one still on the
    old key cannot open. The state key check still opens for the old process, so only the
    value's own key name tells it that its configuration, not the state, is at fault: 500, and
    the function stays open for the processes that have the key."""
    import base64

    from service.config import get_settings

    fid = release(client, setup, FAST)["id"]
    key = setup["client"]["api_key"]
    old = get_settings().state_key
    new = base64.b64encode(b"q" * 32).decode()

    use_state_keys(monkeypatch, new, previous=old)  # a restarted process
    fresh = evaluate(client, key, fid, [[33.0, 0.5, 1.0]])  # its batch, sealed under the new key
    assert fresh.status_code == 200
    use_state_keys(monkeypatch, old)  # a process not restarted yet
    refused = evaluate(client, key, fid, [[33.0, 0.5, 1.0]])
    assert refused.status_code == 500
    use_state_keys(monkeypatch, new, previous=old)
    assert evaluate(client, key, fid, [[33.0, 0.5, 1.0]]).json() == fresh.json()
    info = client.get(f"/v1/functions/{fid}", headers=Api.auth(key)).json()
    assert info["status"] == "open"
    get_settings.cache_clear()


def test_a_constant_function_answers_its_anchor_without_state(
    client: TestClient, setup: Any, configured: str
) -> None:
    """At DP shrinkage factor 0 an anchored function answers ``anchor + 0 * (...)`` at every
    point: it is served from its public facts, draws and stores nothing and so never reaches
    its capacity (a walkthrough's constant function refused new patients at t_max), and the
    response says the factor so a client draws no noise band around the anchor."""
    from service.db.models import CateFunction
    from service.mechanisms import cate_function as mech

    params = {**{k: v for k, v in FAST.items() if k != "shrinkage"}, "t_max": 30}
    done = release(client, setup, params)
    fid, result = done["id"], done["result"]
    _, stored_t = make_constant(configured, fid)
    lattice = mech.FittedFunction(
        "gp",
        1.0,
        0.0,
        np.zeros((0, 3)),
        np.zeros(0),
        int(np.log2(result["output_lattice"])),
        value_bound=result["value_bound"],
        anchor=result["ate_anchor"],
        shrink=0.0,
    )
    expected = float(lattice.round_output(np.array([result["ate_anchor"]]))[0])
    rng = np.random.default_rng(5)
    key = setup["client"]["api_key"]
    for _ in range(3):  # 60 new points, twice t_max
        points = [[float(rng.uniform(18, 90)), float(rng.uniform(0, 1)), 1.0] for _ in range(20)]
        r = evaluate(client, key, fid, points)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["values"] == [expected] * 20
        assert body["shrinkage_factor"] == 0.0
        # the error bar of a constant answer travels with it (a CDS client had to find it)
        assert body["ate_anchor_interval"] == result.get("ate_anchor_interval")
    engine = create_engine(configured)
    try:
        with Session(engine) as session:
            row = session.get(CateFunction, fid)
            assert row is not None
            assert row.t == stored_t
    finally:
        engine.dispose()
    bad = evaluate(client, key, fid, [[200.0, 0.5, 1.0]])
    assert bad.status_code == 422  # the points are still checked


def test_evaluate_response_states_the_shrinkage_factor(client: TestClient, setup: Any) -> None:
    """An unanchored function's answers carry its whole pointwise noise: factor null."""
    fid = release(client, setup, FAST)["id"]
    body = evaluate(client, setup["client"]["api_key"], fid, [[40.0, 0.5, 1.0]]).json()
    assert body["shrinkage_factor"] is None
    assert body["pointwise_noise_sd"] > 0


def test_a_fresh_process_answers_known_points_without_rebuilding_the_path(
    client: TestClient, setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart (the per-process cache empty) a batch of points the function has already
    answered is read from the stored answers, identical, without the O(t^3) conditioning
    (a walkthrough's first request after a restart took 9.4 s at t ~ 9100); a new point still
    conditions on every earlier answer."""
    fid = release(client, setup, FAST)["id"]
    key = setup["client"]["api_key"]
    points = [[30.0 + i, 0.5, float(i % 2)] for i in range(10)]
    first = evaluate(client, key, fid, points).json()["values"]
    functions.forget()
    rebuilt: list[str] = []
    real_sync = functions._sync

    def counting_sync(session: Any, header: Any) -> Any:
        rebuilt.append(header.id)
        return real_sync(session, header)

    monkeypatch.setattr(functions, "_sync", counting_sync)
    again = evaluate(client, key, fid, points[3:] + points[:3]).json()["values"]
    assert again == first[3:] + first[:3]
    assert rebuilt == []
    new = evaluate(client, key, fid, [*points[:2], [80.0, 0.1, 1.0]])
    assert new.status_code == 200
    assert new.json()["values"][:2] == first[:2]
    assert rebuilt == [fid]


def test_answered_points_need_no_lock_and_new_ones_wait_a_bounded_time(
    client: TestClient, setup: Any, configured: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CDS walkthrough held an exact function's row lock from psql: an evaluation of points
    already answered waited 13.7 s and one of new points 43.7 s, with no 503. Answered points
    are served from this process's cache without any lock; new points wait at most
    FUNCTION_LOCK_TIMEOUT_SECONDS in all for this process's lock and PostgreSQL's row lock,
    then get 503 function-busy with Retry-After (the client retries after it)."""
    from sqlalchemy import text

    from service.db.models import CateFunction
    from tests.api.test_datasets import problem

    fid = release(client, setup, FAST)["id"]
    key = setup["client"]["api_key"]
    points = [[30.0 + i, 0.5, float(i % 2)] for i in range(5)]
    first = evaluate(client, key, fid, points).json()["values"]
    monkeypatch.setattr(functions, "FUNCTION_LOCK_TIMEOUT_SECONDS", 0.3)
    with functions._thread_lock(fid):  # another thread's batch of new points holds it
        again = evaluate(client, key, fid, points[::-1])
        assert again.status_code == 200, again.text
        assert again.json()["values"] == first[::-1]
        busy = evaluate(client, key, fid, [[81.0, 0.2, 0.0]])
        body = problem(busy, 503, "function-busy")
        assert busy.headers["retry-after"] == "5"
        assert "already answered are served without waiting" in body["detail"]
        # a process that has not built the function (a restart, another replica) serves
        # answered points from the stored answers, still without waiting (the re-test found
        # the first lookups after a restart waiting 5-15 s)
        functions.forget()
        cold = evaluate(client, key, fid, points)
        assert cold.status_code == 200, cold.text
        assert cold.json()["values"] == first
    if configured.startswith("postgresql"):
        engine = create_engine(configured)
        try:
            with engine.connect() as other:  # another process's batch holds the row lock
                other.execute(
                    select(CateFunction.id).where(CateFunction.id == fid).with_for_update()
                )
                held = evaluate(client, key, fid, [[82.0, 0.2, 0.0]])
                problem(held, 503, "function-busy")
                assert held.headers["retry-after"] == "5"
                assert evaluate(client, key, fid, points).status_code == 200  # answered: no lock
                other.execute(text("ROLLBACK"))
        finally:
            engine.dispose()
    fresh = evaluate(client, key, fid, [[83.0, 0.2, 0.0]])
    assert fresh.status_code == 200, fresh.text


def test_points_may_name_their_columns(client: TestClient, setup: Any) -> None:
    """A CDS walkthrough swapped two columns and was answered 200 for the wrong patient. A batch
    may name its columns (any order): it is read by name, and a list that does not name each
    covariate once is refused with the schema's order; the function lists its covariates."""
    from tests.api.test_datasets import problem

    fid = release(client, setup, FAST)["id"]
    key = setup["client"]["api_key"]
    info = client.get(f"/v1/functions/{fid}", headers=Api.auth(key)).json()
    assert info["covariates"] == ["age", "severity", "sex"]
    points = [[30.0, 0.2, 0.0], [60.0, 0.8, 1.0]]
    first = evaluate(client, key, fid, points).json()["values"]
    named = client.post(
        f"/v1/functions/{fid}/evaluate",
        json={
            "columns": ["sex", "age", "severity"],
            "points": [[0.0, 30.0, 0.2], [1.0, 60.0, 0.8]],
        },
        headers=Api.auth(key),
    )
    assert named.status_code == 200, named.text
    assert named.json()["values"] == first
    for columns, says in (
        (["sex", "age"], "missing: severity"),
        (["sex", "age", "bmi"], "not covariates: bmi"),
        (["sex", "age", "age"], "named twice: age"),
    ):
        r = client.post(
            f"/v1/functions/{fid}/evaluate",
            json={"columns": columns, "points": [[0.0, 30.0, 0.2]]},
            headers=Api.auth(key),
        )
        body = problem(r, 422, "validation-failed")
        assert [e["pointer"] for e in body["errors"]] == ["#/columns"]
        assert says in body["detail"]
        assert "the schema's order is age, severity, sex" in body["detail"]
    # a bad coordinate is named where the request gave it (age at index 1), with its column
    outside = client.post(
        f"/v1/functions/{fid}/evaluate",
        json={"columns": ["sex", "age", "severity"], "points": [[0.0, 95.0, 0.2]]},
        headers=Api.auth(key),
    )
    (error,) = problem(outside, 422, "validation-failed")["errors"]
    assert error["pointer"] == "#/points/0/1"
    assert "(column age)" in error["detail"]


def test_a_batch_of_many_invalid_points_counts_them_all(client: TestClient, setup: Any) -> None:
    """The detail counts every invalid coordinate and says the list holds the first 20 (a CDS
    walkthrough's 1000 invalid points had read "(and 19 more)")."""
    from tests.api.test_datasets import problem

    fid = release(client, setup, FAST)["id"]
    points = [[200.0, 0.5, 1.0]] * 15 + [[200.0, 2.0, 1.0]] * 5  # 25 invalid coordinates
    body = problem(
        evaluate(client, setup["client"]["api_key"], fid, points), 422, "validation-failed"
    )
    assert len(body["errors"]) == 20
    assert "(and 24 more); errors lists the first 20" in body["detail"]
    one = evaluate(client, setup["client"]["api_key"], fid, [[200.0, 0.5, 1.0]])
    assert "more" not in problem(one, 422, "validation-failed")["detail"]
