"""The Python client against a real server process on loopback (SQLite and PostgreSQL).

One server per backend for the whole module (``live_url``); each test makes its own principals
and datasets, so tests do not depend on each other.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from dpcurator import (
    PROBLEM_CLASSES,
    AteResult,
    BudgetExhausted,
    Checkpoint,
    CuratorClient,
    EbmShapeResult,
    Forbidden,
    FunctionEvaluation,
    FunctionHandle,
    FunctionInfo,
    IdempotencyKeyReused,
    InvalidCsv,
    InvalidSchema,
    NotFound,
    Prediction,
    PrincipalCapExceeded,
    ProblemError,
    Release,
    TransportError,
    Unauthenticated,
    UnknownReleaseKind,
    UpliftTable,
    ValidationFailed,
)
from dpcurator.errors import problem_from_body
from service.problems import ALL_PROBLEMS
from tests.conftest import ADMIN_KEY, _truncate
from tests.live import live_server

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data"
FAST_ENV = {"CURATOR_LATENCY_BUCKETS": "[0.1]", "CURATOR_JOB_POLL_SECONDS": "0.05"}
FAST = {"epsilon": 1.0, "nuisance": "none"}


def module_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """A live server on a fresh database of backend ``request.param`` (as ``db_url`` makes)."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
        path = factory.mktemp("live") / "curator.sqlite3"
        shutil.copy(template, path)
        url = f"sqlite:///{path}"
    else:
        url = request.getfixturevalue("postgres_database")
        _truncate(url)
    with live_server(url, admin_key=ADMIN_KEY, extra_env=FAST_ENV) as base:
        yield base


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def live_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from module_server(request)


class Setup:
    """An owner, an analyst and the RCT example dataset with a budget and a grant."""

    def __init__(self, base: str, *, epsilon_total: float = 3.0, cap: float | None = None):
        self.base = base
        self.clients: list[CuratorClient] = []
        self.admin = self.client(ADMIN_KEY)
        tag = uuid.uuid4().hex[:6]
        self.owner_p = self.admin.create_principal(f"owner-{tag}", "owner")
        self.analyst_p = self.admin.create_principal(f"analyst-{tag}", "analyst")
        self.owner = self.client(self.owner_p.api_key)
        self.analyst = self.client(self.analyst_p.api_key)
        self.dataset = self.owner.upload_dataset(
            "Trial", DATA / "trial.csv", DATA / "schema.json", description="example trial"
        )
        self.owner.set_budget(self.dataset.id, epsilon_total=epsilon_total, delta_total=1e-4)
        self.owner.grant(self.dataset.id, self.analyst_p.id, epsilon_cap=cap)

    def client(self, key: str) -> CuratorClient:
        c = CuratorClient(self.base, key)
        self.clients.append(c)
        return c

    def close(self) -> None:
        for c in self.clients:
            c.close()


@pytest.fixture
def setup(live_url: str) -> Iterator[Callable[..., Setup]]:
    made: list[Setup] = []

    def make(**kw: Any) -> Setup:
        made.append(Setup(live_url, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_every_server_problem_has_a_client_exception() -> None:
    documented = set(
        re.findall(r"^\| `([a-z-]+)` \|", (ROOT / "docs" / "problems.md").read_text(), re.M)
    )
    assert documented <= set(PROBLEM_CLASSES)
    for problem in ALL_PROBLEMS:
        body = problem("about this", errors=[{"pointer": "#/x", "detail": "bad"}]).body("/v1/x")
        exc = problem_from_body(body, status=problem.status)
        assert type(exc) is PROBLEM_CLASSES[problem.slug]
        assert (exc.type, exc.status, exc.detail) == (
            problem.type_uri(),
            problem.status,
            "about this",
        )
        assert exc.errors == [{"pointer": "#/x", "detail": "bad"}]
        assert "\n" not in str(exc)
    plain = problem_from_body("<html>bad gateway</html>", status=502, reason="Bad Gateway")
    assert type(plain) is ProblemError
    assert plain.status == 502


def test_owner_and_analyst_end_to_end(setup: Callable[..., Setup]) -> None:
    s = setup(cap=2.0)
    assert s.dataset.n == 4000
    assert s.dataset.ingest_report.rows_received == 4000
    assert s.owner.me().role == "owner"
    assert [d.id for d in s.analyst.list_datasets()] == [s.dataset.id]
    assert s.analyst.get_dataset(s.dataset.id).public_schema["design"] == "rct"

    quote = s.analyst.quote(s.dataset.id, "ate", FAST)
    assert quote.fits_budget
    assert quote.epsilon == pytest.approx(1.0)
    assert quote.accuracy["min_half_width"] > 0

    seen: list[Release] = []
    release = s.analyst.release(s.dataset.id, "ate", FAST, on_progress=seen.append)
    assert release.status == "done"
    assert seen
    assert seen[-1].status == "done"
    assert all(0.0 <= r.progress <= 1.0 for r in seen)
    ate = s.analyst.result(release)
    assert isinstance(ate, AteResult)
    assert ate.ci_lower < ate.estimate < ate.ci_upper
    assert ate.guarantee == "strict"
    assert ate.design == "rct"
    assert [r.id for r in s.analyst.list_releases(s.dataset.id)] == [release.id]

    budget = s.owner.get_budget(s.dataset.id)
    assert budget.epsilon_spent == pytest.approx(1.0)
    grants = s.owner.list_grants(s.dataset.id)
    assert [g.epsilon_cap for g in grants] == [2.0]
    entries = s.owner.ledger(s.dataset.id)
    assert [e.entry_type for e in entries][-1] == "charge"
    assert entries[-1].epsilon == Decimal("1")
    assert entries[-1].release_id == release.id
    assert s.owner.ledger_csv(s.dataset.id).startswith("seq,entry_type")
    verification = s.owner.verify_ledger(s.dataset.id)
    assert verification.valid
    assert verification.entries == len(entries)


def test_same_idempotency_key_replays_and_charges_once(
    live_url: str, setup: Callable[..., Setup]
) -> None:
    s = setup()
    first = s.analyst.request_release(s.dataset.id, "ate", FAST, idempotency_key="k-1")
    again = s.analyst.request_release(s.dataset.id, "ate", FAST, idempotency_key="k-1")
    assert again.id == first.id
    assert again.cached
    with pytest.raises(IdempotencyKeyReused) as info:
        s.analyst.request_release(
            s.dataset.id, "ate", {**FAST, "epsilon": 0.5}, idempotency_key="k-1"
        )
    assert info.value.status == 422
    assert s.owner.get_budget(s.dataset.id).epsilon_spent == pytest.approx(1.0)


class LoseFirstReleaseResponse(httpx.BaseTransport):
    """Forwards to the real server, then drops the first release response (a lost reply)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.keys: list[str] = []
        self.uploads = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        path = request.url.path
        if request.method == "POST" and path.endswith("/releases"):
            self.keys.append(request.headers["Idempotency-Key"])
            if len(self.keys) == 1:
                response.read()
                response.close()
                raise httpx.ReadTimeout("response lost", request=request)
        if request.method == "POST" and path == "/v1/datasets":
            self.uploads += 1
            response.read()
            response.close()
            raise httpx.ReadTimeout("response lost", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


def test_retry_after_a_lost_response_reuses_the_key(
    live_url: str, setup: Callable[..., Setup]
) -> None:
    s = setup()
    transport = LoseFirstReleaseResponse()
    with CuratorClient(live_url, s.analyst_p.api_key, transport=transport, backoff=0.01) as flaky:
        release = flaky.request_release(s.dataset.id, "ate", FAST)
    assert len(transport.keys) == 2
    assert transport.keys[0] == transport.keys[1]
    assert release.cached  # the server's replay of the first (charged) request
    assert s.owner.get_budget(s.dataset.id).epsilon_spent == pytest.approx(1.0)
    charges = [e for e in s.owner.ledger(s.dataset.id) if e.entry_type == "charge"]
    assert len(charges) == 1


def test_uploads_are_not_retried_once_sent(live_url: str, setup: Callable[..., Setup]) -> None:
    s = setup()
    transport = LoseFirstReleaseResponse()
    with CuratorClient(live_url, s.owner_p.api_key, transport=transport, backoff=0.01) as flaky:
        with pytest.raises(TransportError, match="ReadTimeout"):
            flaky.upload_dataset("again", DATA / "trial.csv", DATA / "schema.json")
    assert transport.uploads == 1


def test_problems_become_typed_exceptions(setup: Callable[..., Setup]) -> None:
    s = setup(epsilon_total=1.5, cap=1.2)
    ds = s.dataset.id
    with pytest.raises(Unauthenticated) as unauth:
        s.client("not-a-key").list_datasets()
    assert unauth.value.status == 401
    assert unauth.value.type == "https://dp-curator.dev/problems/unauthenticated"
    with pytest.raises(Forbidden):
        s.analyst.set_budget(ds, epsilon_total=10, delta_total=1e-5)
    with pytest.raises(NotFound):
        s.analyst.get_release("no-such-release")
    with pytest.raises(ValidationFailed) as invalid:
        s.analyst.quote(ds, "ate", {"epsilon": -1})
    assert any(e["pointer"] == "#/params/epsilon" for e in invalid.value.errors)
    with pytest.raises(UnknownReleaseKind):
        s.analyst.quote(ds, "no_such_kind")
    with pytest.raises(BudgetExhausted) as exhausted:
        s.analyst.request_release(ds, "ate", {"epsilon": 1.6, "nuisance": "none"})
    assert exhausted.value.status == 409
    with pytest.raises(PrincipalCapExceeded):
        s.analyst.request_release(ds, "ate", {"epsilon": 1.3, "nuisance": "none"})
    with pytest.raises(InvalidSchema):
        s.owner.upload_dataset("bad", DATA / "trial.csv", {"covariates": []})
    with pytest.raises(InvalidCsv):
        s.owner.upload_dataset("bad", DATA / "observational.csv", DATA / "schema.json")
    client_p = s.admin.create_principal("decision support", "client")
    s.owner.grant(ds, client_p.id)
    with pytest.raises(Forbidden):
        s.client(client_p.api_key).request_release(ds, "ate", FAST)
    assert s.owner.get_budget(ds).epsilon_spent == 0.0


FUNCTION = {"epsilon": 1.0, "nuisance": "none", "basis": "nystrom", "n_centres": 32}
PATIENTS = [[50.0, 0.3, 1.0], [70.0, 0.9, 0.0], [35.5, 0.1, 1.0]]


def test_function_handle_evaluates_for_free(setup: Callable[..., Setup]) -> None:
    s = setup()
    ds = s.dataset.id
    client_p = s.admin.create_principal("ward", "client")
    s.owner.grant(ds, client_p.id)
    clinic = s.client(client_p.api_key)
    release = s.analyst.release(ds, "cate_function", FUNCTION)
    analyst_handle = s.analyst.result(release)
    assert isinstance(analyst_handle, FunctionHandle)
    assert analyst_handle.function_id == release.id
    sd = analyst_handle.pointwise_noise_sd
    assert sd is not None
    assert sd > 0
    spent = s.owner.get_budget(ds)
    assert spent.epsilon_spent == pytest.approx(1.0)

    handle = clinic.function(release.id)
    info = handle.info()
    assert isinstance(info, FunctionInfo)
    assert (info.id, info.dataset_id, info.status, info.basis, info.q) == (
        release.id,
        ds,
        "open",
        "nystrom",
        3,
    )
    assert info.t_max is None  # finite basis: no capacity limit
    assert info.pointwise_noise_sd == pytest.approx(sd)
    assert info.box == ([18.0, 0.0, 0.0], [90.0, 1.0, 1.0])

    first = handle.evaluate(PATIENTS)
    assert isinstance(first, FunctionEvaluation)
    assert first.function_id == release.id
    assert first.guarantee == "strict"
    assert first.points == PATIENTS
    assert first.pointwise_noise_sd == pytest.approx(sd)
    again = handle.evaluate(list(reversed(PATIENTS)))
    assert again.values == list(reversed(first.values))  # identical, not re-noised
    by_analyst = analyst_handle.evaluate(PATIENTS[:1])
    assert by_analyst.values == first.values[:1]  # one shared state for every caller
    assert info.covariates == ["age", "severity", "sex"]
    named = handle.evaluate([p[::-1] for p in PATIENTS], columns=info.covariates[::-1])
    assert named.values == first.values  # read by name
    with pytest.raises(ValidationFailed) as drifted:
        handle.evaluate(PATIENTS, columns=["age", "sex", "bmi"])
    assert drifted.value.errors[0]["pointer"] == "#/columns"
    after = s.owner.get_budget(ds)
    assert (after.epsilon_spent, after.delta_spent) == (spent.epsilon_spent, spent.delta_spent)
    assert [e.entry_type for e in s.owner.ledger(ds)].count("charge") == 1

    with pytest.raises(ValidationFailed) as outside:
        handle.evaluate([[50.0, 0.3, 1.0], [500.0, 0.3, 1.0]])
    assert any(e["pointer"] == "#/points/1/0" for e in outside.value.errors)
    with pytest.raises(NotFound):
        clinic.evaluate_function("no-such-function", PATIENTS)
    with pytest.raises(NotFound):
        clinic.function_info("no-such-function")
    with pytest.raises(ValidationFailed) as not_here:  # a function is not a predict-able release
        clinic.predict(release.id, PATIENTS)
    assert f"POST /v1/functions/{release.id}/evaluate" in str(not_here.value.detail)


@pytest.mark.parametrize(
    ("kind", "params"),
    [("ebm_cate", {"epsilon": 1.0}), ("uplift_table", {"epsilon": 1.0, "bins": [2, 2, 2]})],
)
def test_predict_is_free_and_deterministic(
    setup: Callable[..., Setup], kind: str, params: dict[str, Any]
) -> None:
    s = setup()
    ds = s.dataset.id
    release = s.analyst.release(ds, kind, params)
    parsed = s.analyst.result(release)
    assert isinstance(parsed, EbmShapeResult if kind == "ebm_cate" else UpliftTable)
    spent = s.owner.get_budget(ds).epsilon_spent
    first = s.analyst.predict(release.id, PATIENTS)
    assert isinstance(first, Prediction)
    assert (first.release_id, first.kind, first.guarantee) == (release.id, kind, "strict")
    assert len(first.predictions) == len(PATIENTS)
    assert s.analyst.predict(release.id, PATIENTS).predictions == first.predictions
    assert s.owner.get_budget(ds).epsilon_spent == spent
    if isinstance(parsed, UpliftTable):
        assert parsed.cells == 8 == len(parsed.rows)
        assert parsed.partition["bins"] == [2, 2, 2]
        assert set(first.predictions) <= {row["uplift"] for row in parsed.rows}
    else:
        assert isinstance(parsed, EbmShapeResult)
        assert [f.feature for f in parsed.shape_functions] == ["age", "severity", "sex"]
        assert parsed.ate == pytest.approx(parsed.intercept)
    with pytest.raises(ValidationFailed) as outside:
        s.analyst.predict(release.id, [[50.0, 1.5, 0.0]])
    assert any(e["pointer"] == "#/points/0/1" for e in outside.value.errors)


def test_unreachable_server_is_a_transport_error() -> None:
    with CuratorClient("http://127.0.0.1:9", "k", retries=1, backoff=0.01) as c:
        with pytest.raises(TransportError, match="cannot reach"):
            c.health()


def test_local_verification_keeps_a_checkpoint_file(
    setup: Callable[..., Setup], tmp_path: Path
) -> None:
    # as the CLI's --checkpoint: the first check saves the head, later ones check and move it
    s = setup()
    path = tmp_path / "ledger.json"
    first = s.owner.verify_ledger_locally(s.dataset.id, str(path))
    assert first.valid
    saved = Checkpoint.load(path)
    assert saved is not None
    assert (saved.seq, saved.row_hash) == (first.entries, first.head_hash)
    s.owner.grant(s.dataset.id, s.analyst_p.id, epsilon_cap=1.0)
    second = s.owner.verify_ledger_locally(s.dataset.id, path)
    assert second.valid
    assert second.entries == first.entries + 1
    moved = Checkpoint.load(path)
    assert moved is not None
    assert moved.seq == second.entries
    with pytest.raises(ValueError, match="checkpoint, not"):
        s.owner.verify_ledger_locally("another-dataset", path)
