"""The ate kind's estimators and modes over HTTP, on SQLite and PostgreSQL.

Paper mode is refused (403 ``paper-mode-disabled``) until the owner enables it; each
estimator runs end to end; quotes answer both ways; results hold no unnoised quantity.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.test_datasets import problem
from tests.api.test_releases import post_release, wait
from tests.conftest import RCT_SCHEMA, SCHEMA, Api, synthetic_csv

FORBIDDEN_KEYS = {"theta_hat", "m2_hat", "tau_hat", "gamma_tau", "gamma_sigma", "sigma2_hat"}


@pytest.fixture
def observational(api: Api) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], n=1200, epsilon_total=20.0, delta_total=1e-3)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    return owner, analyst, ds


def _quote(client: TestClient, key: str, dataset_id: str, params: dict[str, Any]) -> Any:
    return client.post(
        f"/v1/datasets/{dataset_id}/quotes",
        json={"kind": "ate", "params": params},
        headers=Api.auth(key),
    )


def _check_done(done: dict[str, Any], guarantee: str, estimator: str) -> dict[str, Any]:
    assert done["status"] == "done", done
    assert done["guarantee"] == guarantee
    result: dict[str, Any] = done["result"]
    assert result["estimator"] == estimator
    assert result["guarantee"] == guarantee
    # the interval is estimate +- the released half-width (a positive, finite width)
    assert result["ci_upper"] - result["estimate"] == pytest.approx(result["half_width"])
    assert result["estimate"] - result["ci_lower"] == pytest.approx(result["half_width"])
    assert 0.0 < result["half_width"] < float("inf")
    assert not FORBIDDEN_KEYS & set(result)
    return result


def test_paper_mode_is_refused_until_the_owner_enables_it(
    client: TestClient, observational: Any
) -> None:
    owner, analyst, ds = observational
    params = {"epsilon": 1.0, "mode": "paper", "nuisance": "linear"}
    refused = post_release(client, analyst["api_key"], ds["id"], params)
    problem(refused, 403, "paper-mode-disabled")
    problem(_quote(client, analyst["api_key"], ds["id"], params), 403, "paper-mode-disabled")
    budget = client.get(
        f"/v1/datasets/{ds['id']}/budget", headers=Api.auth(owner["api_key"])
    ).json()
    assert budget["epsilon_spent"] == 0.0
    patched = client.patch(
        f"/v1/datasets/{ds['id']}",
        json={"allow_paper_mode": True},
        headers=Api.auth(owner["api_key"]),
    )
    assert patched.status_code == 200, patched.text
    quote = _quote(client, analyst["api_key"], ds["id"], {**params, "target_half_width": 1.0})
    assert quote.status_code == 200, quote.text
    assert quote.json()["guarantee"] == "paper"
    assert quote.json()["accuracy"]["epsilon_for_target_half_width"] is not None
    accepted = post_release(client, analyst["api_key"], ds["id"], params)
    assert accepted.status_code == 202, accepted.text
    result = _check_done(wait(client, analyst["api_key"], accepted.json()["id"]), "paper", "aipw")
    assert result["mode"] == "paper"


@pytest.mark.parametrize(
    "params",
    [
        {"epsilon": 2.0, "nuisance": "dp_linear", "cross_fit": True},
        {"epsilon": 2.0, "nuisance": "dp_linear"},
        {"epsilon": 2.0, "estimator": "ipw", "trim": 0.05},
    ],
)
def test_strict_estimators_run_end_to_end(
    client: TestClient, observational: Any, params: dict[str, Any]
) -> None:
    owner, analyst, ds = observational
    quote = _quote(client, analyst["api_key"], ds["id"], {**params, "target_half_width": 2.0})
    assert quote.status_code == 200, quote.text
    accuracy = quote.json()["accuracy"]
    # strict aipw (declared or adaptive clip) and ipw add the sampling error at an assumed scale
    assert accuracy["half_width_basis"] == "assumed_scale"
    assert accuracy["epsilon_for_target_half_width"] > 0
    # observational: the quote says before any charge that nuisance error is not covered
    assert accuracy["coverage"]["basis"] == "nuisance_models"
    assert accuracy["coverage"]["nuisance_error_covered"] is False
    r = post_release(client, analyst["api_key"], ds["id"], params)
    assert r.status_code == 202, r.text
    done = wait(client, analyst["api_key"], r.json()["id"])
    estimator = params.get("estimator", "aipw")
    result = _check_done(done, "strict", estimator)
    assert done["epsilon"] == pytest.approx(2.0)
    ledger = client.get(
        f"/v1/datasets/{ds['id']}/ledger", headers=Api.auth(owner["api_key"])
    ).json()["entries"]
    assert ledger[-1]["guarantee"] == "strict"
    assert result["epsilon"] == pytest.approx(2.0)
    assert result["coverage"] == accuracy["coverage"]
    assert result["design"] == "observational"  # every estimator states the schema's design


def test_rct_difference_end_to_end_and_refused_on_observational(
    client: TestClient, api: Api, observational: Any
) -> None:
    owner, analyst, obs = observational
    refused = post_release(
        client, analyst["api_key"], obs["id"], {"epsilon": 1.0, "estimator": "rct_difference"}
    )
    body = problem(refused, 422, "validation-failed")
    assert "rct" in body["detail"]
    rct = api.dataset(owner["api_key"], n=1000, schema=RCT_SCHEMA, epsilon_total=5.0)
    api.grant(owner["api_key"], rct["id"], analyst["id"])
    params = {"epsilon": 1.0, "estimator": "rct_difference"}
    quote = _quote(client, analyst["api_key"], rct["id"], params)
    assert quote.status_code == 200, quote.text
    assert quote.json()["delta"] == 0.0
    assert quote.json()["accuracy"]["coverage"]["basis"] == "design"
    r = post_release(client, analyst["api_key"], rct["id"], params)
    assert r.status_code == 202, r.text
    done = wait(client, analyst["api_key"], r.json()["id"])
    result = _check_done(done, "strict", "rct_difference")
    assert result["delta"] == 0.0
    assert done["delta"] == 0.0
    assert result["coverage"]["nuisance_error_covered"] is True


def test_unsupported_combination_names_the_field(client: TestClient, observational: Any) -> None:
    _, analyst, ds = observational
    r = post_release(
        client,
        analyst["api_key"],
        ds["id"],
        {"epsilon": 1.0, "estimator": "ipw", "cross_fit": True},
    )
    assert r.status_code == 422
    assert "cross_fit" in r.text
    r = post_release(
        client, analyst["api_key"], ds["id"], {"epsilon": 1.0, "mode": "paper", "estimator": "ipw"}
    )
    assert r.status_code == 422
    assert "ipw" in r.text


def test_declared_adjustment_set_is_the_default_and_bad_lists_are_refused(
    client: TestClient, api: Api
) -> None:
    """A schema that declares age and severity the adjustment set: the default ate release's
    nuisance models adjust for them only (the result says which); a request's own list wins;
    a bad list is a 422 before any charge; a non-boolean flag is a 422 at upload."""
    schema = json.loads(json.dumps(SCHEMA))
    schema["covariates"][0]["adjust_for"] = True
    schema["covariates"][1]["adjust_for"] = True
    owner, analyst = api.principal("owner"), api.principal("analyst")
    r = api.upload(owner["api_key"], synthetic_csv(1200, seed=5), schema)
    assert r.status_code == 201, r.text
    ds = r.json()
    assert ds["schema"]["covariates"][1]["adjust_for"] is True
    assert ds["schema"]["covariates"][2]["adjust_for"] is False
    budget = {"epsilon_total": 20.0, "delta_total": 1e-3}
    headers = Api.auth(owner["api_key"])
    assert client.put(f"/v1/datasets/{ds['id']}/budget", json=budget, headers=headers).is_success
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    key = analyst["api_key"]
    quote = _quote(client, key, ds["id"], {"epsilon": 1.0}).json()
    assert quote["accuracy"]["adjustment_columns"] == [0, 1]
    done = wait(client, key, post_release(client, key, ds["id"], {"epsilon": 1.0}).json()["id"])
    assert _check_done(done, "strict", "aipw")["adjustment_columns"] == [0, 1]
    own = {"epsilon": 1.0, "estimator": "ipw", "adjustment_columns": [1]}
    done = wait(client, key, post_release(client, key, ds["id"], own).json()["id"])
    assert _check_done(done, "strict", "ipw")["adjustment_columns"] == [1]
    spent = client.get(f"/v1/datasets/{ds['id']}/budget", headers=headers).json()["epsilon_spent"]
    for bad in ([], [0, 0], [3], [True]):
        r = post_release(client, key, ds["id"], {"epsilon": 1.0, "adjustment_columns": bad})
        assert r.status_code == 422, (bad, r.text)
        assert "adjustment_columns" in r.text
    after = client.get(f"/v1/datasets/{ds['id']}/budget", headers=headers).json()["epsilon_spent"]
    assert after == spent
    flag = json.loads(json.dumps(SCHEMA))
    flag["covariates"][0]["adjust_for"] = "yes"
    problem(api.upload(owner["api_key"], synthetic_csv(200, seed=6), flag), 422, "invalid-schema")


def test_subsample_and_aggregate_over_http(client: TestClient, api: Api) -> None:
    """``chunks``: quoted with its own basis and coverage before any charge, released as one
    charge of (epsilon, delta) with the chunks' DP estimates, refused where a chunk is too small
    or the design is a trial."""
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], n=2000, epsilon_total=20.0, delta_total=1e-3)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    params = {"epsilon": 2.0, "chunks": 2}
    quote = _quote(client, analyst["api_key"], ds["id"], params)
    assert quote.status_code == 200, quote.text
    accuracy = quote.json()["accuracy"]
    assert accuracy["half_width_basis"] == "assumed_chunk_spread"
    assert (accuracy["chunks"], accuracy["chunk_size"]) == (2, 1000)
    assert accuracy["coverage"]["basis"] == "chunk_spread"
    too_many = _quote(client, analyst["api_key"], ds["id"], {"epsilon": 2.0, "chunks": 4})
    body = problem(too_many, 422, "validation-failed")
    assert "each chunk holds 500 of the 2000 rows" in body["detail"]
    problem(
        post_release(client, analyst["api_key"], ds["id"], {**params, "chunks": 4}),
        422,
        "validation-failed",
    )
    r = post_release(client, analyst["api_key"], ds["id"], params)
    assert r.status_code == 202, r.text
    done = wait(client, analyst["api_key"], r.json()["id"])
    result = _check_done(done, "strict", "aipw")
    assert len(result["chunk_estimates"]) == 2
    assert result["estimate"] == pytest.approx(sum(result["chunk_estimates"]) / 2)
    assert result["coverage"] == accuracy["coverage"]
    budget = client.get(f"/v1/datasets/{ds['id']}/budget", headers=Api.auth(owner["api_key"]))
    assert budget.json()["epsilon_spent"] == pytest.approx(2.0)  # one charge for both chunks
    ledger = client.get(
        f"/v1/datasets/{ds['id']}/ledger", headers=Api.auth(owner["api_key"])
    ).json()["entries"]
    charges = [e for e in ledger if e["entry_type"] == "charge"]
    assert len(charges) == 1
    assert float(charges[0]["epsilon"]) == pytest.approx(2.0)
    trial = api.dataset(owner["api_key"], n=2000, schema=RCT_SCHEMA, seed=3)
    api.grant(owner["api_key"], trial["id"], analyst["id"])
    refused = _quote(client, analyst["api_key"], trial["id"], params)
    assert "observational datasets" in problem(refused, 422, "validation-failed")["detail"]
