"""A typed Python client for every endpoint of the curator's API.

Retries are safe by construction: reads and ``PUT``/``DELETE`` are idempotent; a release request
generates one ``Idempotency-Key`` and sends the same key on every retry, so the server charges it
at most once; uploads and principal creation are retried only when the connection was never made.
Errors come back as the exception classes of ``dpcurator.errors``, one per problem type.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import IO, Any, Self, TypeVar
from urllib.parse import urlencode

import httpx2 as httpx
from pydantic import BaseModel, TypeAdapter

from dpcurator.chain import Checkpoint, new_checkpoint, verify_entries
from dpcurator.errors import (
    IdempotencyKeyInFlight,
    ProblemError,
    ReleaseFailed,
    TransportError,
    WaitTimeout,
    problem_from_body,
)
from dpcurator.models import (
    Budget,
    Dataset,
    DatasetCreated,
    Grant,
    LedgerEntry,
    Principal,
    PrincipalCreated,
    PrincipalEvent,
    Quote,
    Release,
    UploadCheck,
    Verification,
)
from dpcurator.results import (
    FunctionEvaluation,
    FunctionHandle,
    FunctionInfo,
    Prediction,
    TypedResult,
    parse_result,
)

DEFAULT_URL = "http://127.0.0.1:8000"
RETRY_STATUSES = frozenset({502, 503, 504})
M = TypeVar("M", bound=BaseModel)
ProgressCallback = Callable[[Release], None]


# The most points one evaluate request takes (the API's limit; a function's batch_max may be
# smaller). The client sends a longer list as consecutive batches.
EVALUATE_BATCH_LIMIT = 1000
# The most points one predict request takes (the API's limit); longer lists go in batches.
PREDICT_BATCH_LIMIT = 10_000
# The most coordinates (points x covariates) the client puts in one request: the server caps a
# batch's body at 16 MiB, which this keeps well inside.
MAX_COORDINATES_PER_REQUEST = 500_000
# The longest wait a server's Retry-After may ask of one retry (seconds).
MAX_RETRY_AFTER = 30.0


class Retry(Enum):
    """When a request may be sent again."""

    ALWAYS = "always"  # idempotent: transport errors and 502/503/504
    CONNECT = "connect"  # not idempotent: only if the connection was never made
    RELEASE = "release"  # idempotent by its key: as ALWAYS, plus 409 idempotency-key-in-flight


def _schema_text(schema: Mapping[str, Any] | str | Path) -> str:
    """A schema given as a dict, or as the path of a JSON file, as the form field's text."""
    if isinstance(schema, Mapping):
        return json.dumps(schema)
    return Path(schema).read_text(encoding="utf-8-sig")  # Windows editors write a BOM


class CuratorClient:
    """Client of one curator server, authenticated by one API key.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` (the embedded default).
        api_key: the caller's bearer key (admin, owner, analyst or client).
        timeout: seconds per HTTP request.
        retries: extra attempts after a retryable failure.
        backoff: first pause between attempts in seconds; doubles each time, at most 8 s.
        transport: an httpx transport (tests, proxies); the default opens real connections.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.25,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = max(0, retries)
        self.backoff = backoff
        headers = {"User-Agent": "dpcurator-client", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )
        # a function's batch_max, read once (it is fixed at its release)
        self._batch_max: dict[str, int] = {}

    @classmethod
    def from_env(cls, **kwargs: Any) -> CuratorClient:
        """``CURATOR_URL`` (default the embedded server) and ``CURATOR_KEY``."""
        return cls(
            os.environ.get("CURATOR_URL", DEFAULT_URL), os.environ.get("CURATOR_KEY"), **kwargs
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transport ---------------------------------------------------------------------------

    def _pause(self, attempt: int, response: httpx.Response | None = None) -> None:
        """Wait before retry ``attempt``: exponential backoff, or the server's ``Retry-After``
        (seconds, at most ``MAX_RETRY_AFTER``) where it asks for longer."""
        wait = min(8.0, self.backoff * (2**attempt))
        asked = _retry_after(response)
        if asked is not None:
            wait = max(wait, min(asked, MAX_RETRY_AFTER))
        time.sleep(wait)

    def request(
        self,
        method: str,
        path: str,
        *,
        retry: Retry = Retry.ALWAYS,
        json_body: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        data: Mapping[str, str] | None = None,
        files: Callable[[], Mapping[str, tuple[str, IO[bytes], str]]] | None = None,
    ) -> httpx.Response:
        """Send one request with the retry policy; raise the problem's exception on an error."""
        attempt = 0
        while True:
            try:
                with _files(files) as opened:
                    response = self._http.request(
                        method,
                        path,
                        json=json_body,
                        params=params,
                        headers=headers,
                        data=data,
                        files=opened,
                    )
            except httpx.TransportError as exc:
                never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if attempt < self.retries and (retry != Retry.CONNECT or never_sent):
                    self._pause(attempt)
                    attempt += 1
                    continue
                raise TransportError(
                    f"cannot reach {self.base_url}: {type(exc).__name__}: {exc}"
                ) from None
            if response.is_success:
                return response
            problem = _problem(response)
            retryable = retry != Retry.CONNECT and response.status_code in RETRY_STATUSES
            in_flight = retry == Retry.RELEASE and isinstance(problem, IdempotencyKeyInFlight)
            if attempt < self.retries and (retryable or in_flight):
                self._pause(attempt, response)
                attempt += 1
                continue
            raise problem

    def _get(self, path: str, model: type[M], **kw: Any) -> M:
        return model.model_validate(self.request("GET", path, **kw).json())

    def _list(self, path: str, model: type[M]) -> list[M]:
        return TypeAdapter(list[model]).validate_python(  # type: ignore[valid-type]
            self.request("GET", path).json()
        )

    # ---- operations --------------------------------------------------------------------------

    def health(self) -> bool:
        """True if ``/healthz`` answers ok."""
        return bool(self.request("GET", "/healthz").json().get("status") == "ok")

    def ready(self) -> bool:
        """True if ``/readyz`` answers ready (database reachable, migrations at head)."""
        try:
            self.request("GET", "/readyz", retry=Retry.CONNECT)
        except ProblemError:
            return False
        return True

    # ---- principals (admin creates; anyone reads themselves) -----------------------------------

    def create_principal(self, name: str, role: str) -> PrincipalCreated:
        """Admin: create an owner, analyst or client; its ``api_key`` is shown only now."""
        body = {"name": name, "role": role}
        r = self.request("POST", "/v1/principals", json_body=body, retry=Retry.CONNECT)
        return PrincipalCreated.model_validate(r.json())

    def list_principals(self, *, limit: int | None = None, offset: int = 0) -> list[Principal]:
        """Admin, owners: principals, oldest first (a page of ``limit`` from ``offset``)."""
        return self._list("/v1/principals" + _page(limit, offset), Principal)

    def me(self) -> Principal:
        return self._get("/v1/principals/me", Principal)

    def set_disabled(self, principal_id: str, disabled: bool) -> Principal:
        """Admin: disable a principal (its key is refused at once) or enable it again."""
        r = self.request(
            "PATCH", f"/v1/principals/{principal_id}", json_body={"disabled": disabled}
        )
        return Principal.model_validate(r.json())

    def replace_key(self, principal_id: str = "me") -> PrincipalCreated:
        """Replace a key: your own (``"me"``), or anyone's as the admin. The old key stops working
        at once and the new ``api_key`` is shown only now. Not retried: a lost response would
        leave a key nobody saw (the admin can replace it again)."""
        r = self.request("POST", f"/v1/principals/{principal_id}/key", retry=Retry.CONNECT)
        return PrincipalCreated.model_validate(r.json())

    def principal_events(self, principal_id: str = "me") -> list[PrincipalEvent]:
        """A principal's account record, oldest first: creation, each disable and enable, each
        key replacement, with who made it. Yours (``"me"``), or anyone's as the admin."""
        body = self.request("GET", f"/v1/principals/{principal_id}/events").json()
        return [PrincipalEvent.model_validate(e) for e in body["events"]]

    def verify_principal_events(self, principal_id: str = "me") -> Verification:
        """Recompute a principal's event chain on the server."""
        return self._get(f"/v1/principals/{principal_id}/events/verify", Verification)

    # ---- datasets (owners) -----------------------------------------------------------------

    def upload_dataset(
        self,
        name: str,
        csv: str | Path,
        schema: Mapping[str, Any] | str | Path,
        *,
        description: str = "",
        allow_paper_mode: bool = False,
        csv_format: Mapping[str, Any] | None = None,
    ) -> DatasetCreated:
        """Upload a CSV file with its public schema (a dict, or a path to a JSON file).

        ``csv_format`` says how the file is written when it is not comma-separated UTF-8
        with '.' decimals, e.g. ``{"decimal": ",", "encoding": "cp1252", "missing_values":
        ["."]}`` for Excel's 'CSV' on a European Windows (the delimiter is found from the
        header unless given: ``"delimiter": ";"``). The returned ``ingest_report`` is shown
        once, to you only; it is not public.
        """
        csv_path = Path(csv)
        form = {
            "name": name,
            "schema": _schema_text(schema),
            "description": description,
            "allow_paper_mode": "true" if allow_paper_mode else "false",
        }
        if csv_format is not None:
            form["csv_format"] = json.dumps(dict(csv_format))

        def files() -> Mapping[str, tuple[str, IO[bytes], str]]:
            return {"file": (csv_path.name, csv_path.open("rb"), "text/csv")}

        r = self.request("POST", "/v1/datasets", data=form, files=files, retry=Retry.CONNECT)
        return DatasetCreated.model_validate(r.json())

    def check_upload(
        self,
        csv: str | Path,
        schema: Mapping[str, Any] | str | Path,
        *,
        csv_format: Mapping[str, Any] | None = None,
    ) -> UploadCheck:
        """Check a CSV file against its schema as ``upload_dataset`` would, storing nothing:
        the rows an upload would keep and the ingest report (yours only), or the same
        ``invalid-csv`` / ``invalid-schema`` errors. A dataset cannot be deleted once
        uploaded (only its rows can), so check a new export first."""
        csv_path = Path(csv)
        form = {"schema": _schema_text(schema)}
        if csv_format is not None:
            form["csv_format"] = json.dumps(dict(csv_format))

        def files() -> Mapping[str, tuple[str, IO[bytes], str]]:
            return {"file": (csv_path.name, csv_path.open("rb"), "text/csv")}

        r = self.request("POST", "/v1/datasets/check", data=form, files=files, retry=Retry.CONNECT)
        return UploadCheck.model_validate(r.json())

    def list_datasets(self) -> list[Dataset]:
        """The datasets you own or are granted."""
        return self._list("/v1/datasets", Dataset)

    def get_dataset(self, dataset_id: str) -> Dataset:
        return self._get(f"/v1/datasets/{dataset_id}", Dataset)

    def update_dataset(
        self,
        dataset_id: str,
        *,
        description: str | None = None,
        allow_paper_mode: bool | None = None,
    ) -> Dataset:
        body = {
            k: v
            for k, v in {"description": description, "allow_paper_mode": allow_paper_mode}.items()
            if v is not None
        }
        r = self.request("PATCH", f"/v1/datasets/{dataset_id}", json_body=body)
        return Dataset.model_validate(r.json())

    def delete_rows(self, dataset_id: str) -> None:
        """Delete the stored rows; the ledger and the releases stay."""
        self.request("DELETE", f"/v1/datasets/{dataset_id}/rows")

    def get_budget(self, dataset_id: str) -> Budget:
        return self._get(f"/v1/datasets/{dataset_id}/budget", Budget)

    def set_budget(self, dataset_id: str, *, epsilon_total: float, delta_total: float) -> Budget:
        """Owner: set the dataset's (ε, δ) total; it can never drop below what is spent."""
        body = {"epsilon_total": epsilon_total, "delta_total": delta_total}
        r = self.request("PUT", f"/v1/datasets/{dataset_id}/budget", json_body=body)
        return Budget.model_validate(r.json())

    def list_grants(self, dataset_id: str) -> list[Grant]:
        return self._list(f"/v1/datasets/{dataset_id}/grants", Grant)

    def grant(
        self,
        dataset_id: str,
        principal_id: str,
        *,
        epsilon_cap: float | None = None,
        delta_cap: float | None = None,
    ) -> Grant:
        """Owner: grant an analyst or client access, optionally with per-principal caps."""
        body = {
            k: v
            for k, v in {"epsilon_cap": epsilon_cap, "delta_cap": delta_cap}.items()
            if v is not None
        }
        r = self.request("PUT", f"/v1/datasets/{dataset_id}/grants/{principal_id}", json_body=body)
        return Grant.model_validate(r.json())

    def revoke(self, dataset_id: str, principal_id: str) -> None:
        self.request("DELETE", f"/v1/datasets/{dataset_id}/grants/{principal_id}")

    # ---- ledger (owners' audit views) ----------------------------------------------------------

    def ledger(self, dataset_id: str) -> list[LedgerEntry]:
        """Every ledger entry of the dataset, oldest first, with exact decimal amounts."""
        body = self.request("GET", f"/v1/datasets/{dataset_id}/ledger").json()
        return [LedgerEntry.model_validate(e) for e in body["entries"]]

    def ledger_csv(self, dataset_id: str) -> str:
        """The ledger as the server's CSV export (the hashed fields included)."""
        r = self.request("GET", f"/v1/datasets/{dataset_id}/ledger", params={"format": "csv"})
        return r.text

    def verify_ledger(self, dataset_id: str) -> Verification:
        """Recompute the hash chain on the server."""
        return self._get(f"/v1/datasets/{dataset_id}/ledger/verify", Verification)

    def verify_ledger_locally(
        self, dataset_id: str, checkpoint: Checkpoint | str | os.PathLike[str] | None = None
    ) -> Verification:
        """Recompute the hash chain here from the exported entries (``dpcurator.chain``), check
        the budget's spend against them and, given a ``checkpoint`` saved by an earlier check,
        that its entry is still there unchanged.

        ``checkpoint`` may be a ``Checkpoint`` or the path of a checkpoint file (as the CLI's
        ``ledger verify --checkpoint``): a missing file is a first check; after a valid check
        the file holds the new head entry.
        """
        if checkpoint is None or isinstance(checkpoint, Checkpoint):
            return self._verify_locally(dataset_id, checkpoint)
        path = Path(checkpoint)
        saved = Checkpoint.load(path)
        if saved is not None and saved.dataset_id != dataset_id:
            raise ValueError(
                f"{path} is dataset {saved.dataset_id}'s checkpoint, not {dataset_id}'s"
            )
        verification = self._verify_locally(dataset_id, saved)
        if verification.valid and verification.entries:
            new_checkpoint(dataset_id, verification).save(path)
        return verification

    def _verify_locally(self, dataset_id: str, checkpoint: Checkpoint | None) -> Verification:
        for _ in range(5):
            before = self.get_budget(dataset_id)
            entries = self.ledger(dataset_id)
            grants = self.list_grants(dataset_id)
            after = self.get_budget(dataset_id)
            spent = (after.epsilon_spent, after.delta_spent)
            if (before.epsilon_spent, before.delta_spent) == spent:
                break  # no charge between the reads
        try:
            roles: dict[str, str] | None = {p.id: p.role for p in self.list_principals()}
        except ProblemError:
            roles = None  # who may list principals may differ by deployment
        verification = verify_entries(
            dataset_id,
            entries,
            epsilon_spent=after.epsilon_spent,
            delta_spent=after.delta_spent,
            checkpoint=checkpoint,
            epsilon_total=after.epsilon_total,
            delta_total=after.delta_total,
            spent_before=(before.epsilon_spent, before.delta_spent),
            grants=grants,
            roles=roles,
        )
        if not verification.valid:
            return verification
        # the server's own check sees what an export cannot (e.g. its rows' state): both must
        # pass, so that the checkpoint never moves past what either would refuse
        server = self.verify_ledger(dataset_id)
        if not server.valid:
            reason = f"the server's check: {server.reason}"
            return server.model_copy(update={"reason": reason})
        return verification

    # ---- quotes and releases (analysts) ----------------------------------------------------------

    def quote(self, dataset_id: str, kind: str, params: Mapping[str, Any] | None = None) -> Quote:
        """Cost and expected accuracy of a release; free, reads no data."""
        body = {"kind": kind, "params": dict(params or {})}
        r = self.request("POST", f"/v1/datasets/{dataset_id}/quotes", json_body=body)
        return Quote.model_validate(r.json())

    def request_release(
        self,
        dataset_id: str,
        kind: str,
        params: Mapping[str, Any] | None = None,
        *,
        fresh: bool = False,
        idempotency_key: str | None = None,
    ) -> Release:
        """Request a release; it is charged at once and runs as a job.

        One ``Idempotency-Key`` (``idempotency_key`` or a new random one) is sent on every retry,
        so a retried request is charged at most once. A stored identical release is returned
        (``cached``) unless ``fresh``.
        """
        key = idempotency_key or uuid.uuid4().hex
        body = {"kind": kind, "params": dict(params or {}), "fresh": fresh}
        r = self.request(
            "POST",
            f"/v1/datasets/{dataset_id}/releases",
            json_body=body,
            headers={"Idempotency-Key": key},
            retry=Retry.RELEASE,
        )
        return Release.model_validate(r.json())

    def get_release(self, release_id: str) -> Release:
        return self._get(f"/v1/releases/{release_id}", Release)

    def list_releases(
        self,
        dataset_id: str,
        *,
        limit: int | None = None,
        offset: int = 0,
        newest_first: bool = False,
    ) -> list[Release]:
        """The dataset's releases you may see, oldest first (or newest first); a page of
        ``limit`` from ``offset``, every one without a limit."""
        query = _page(limit, offset, order="desc" if newest_first else None)
        return self._list(f"/v1/datasets/{dataset_id}/releases{query}", Release)

    def wait(
        self,
        release_id: str,
        *,
        timeout: float = 900.0,
        poll: float = 0.5,
        on_progress: ProgressCallback | None = None,
        raise_on_failure: bool = True,
    ) -> Release:
        """Poll a release until it is done or failed.

        Args:
            on_progress: called with the release whenever its status, stage or progress changes,
                and once more when it finishes.
            raise_on_failure: raise ``ReleaseFailed`` for a failed release (its charge is kept).

        Raises:
            WaitTimeout: not finished within ``timeout`` seconds (the job goes on).
        """
        deadline = time.monotonic() + timeout
        seen: tuple[str, float, str] | None = None
        pause = min(0.05, poll)
        while True:
            release = self.get_release(release_id)
            state = (release.status, release.progress, release.stage)
            if on_progress is not None and state != seen:
                on_progress(release)
            seen = state
            if release.finished:
                break
            if time.monotonic() >= deadline:
                raise WaitTimeout(release_id, timeout)
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(poll, pause * 2)
        if release.status == "failed" and raise_on_failure:
            err = release.error
            raise ReleaseFailed(
                release_id=release.id,
                type=err.type if err else "https://dp-curator.dev/problems/release-failed",
                title=err.title if err else "The release failed; its charge is kept",
                status=500,
                detail=err.detail if err else None,
                instance=f"/v1/releases/{release.id}",
            )
        return release

    def release(
        self,
        dataset_id: str,
        kind: str,
        params: Mapping[str, Any] | None = None,
        *,
        fresh: bool = False,
        idempotency_key: str | None = None,
        timeout: float = 900.0,
        on_progress: ProgressCallback | None = None,
    ) -> Release:
        """Request a release and wait for it (see ``request_release`` and ``wait``)."""
        created = self.request_release(
            dataset_id, kind, params, fresh=fresh, idempotency_key=idempotency_key
        )
        if created.finished:
            if on_progress is not None:
                on_progress(created)
            if created.status == "done":
                return created
        return self.wait(created.id, timeout=timeout, on_progress=on_progress)

    def result(self, release: Release | str) -> TypedResult:
        """The typed result of a finished release (``AteResult``, ``FunctionHandle``, ...)."""
        if isinstance(release, str):
            release = self.get_release(release)
        return parse_result(release, self)

    # ---- functions (decision support; free after the release) ------------------------------------

    def function(self, release: Release | str) -> FunctionHandle:
        """A handle on a released CATE function, to ``evaluate(points)``."""
        if isinstance(release, str):
            release = self.get_release(release)
        return FunctionHandle.from_release(release, self)

    def function_info(self, function_id: str) -> FunctionInfo:
        """GET /v1/functions/{id}: public metadata (status, basis, capacity, constants, box)."""
        return FunctionInfo.from_response(
            self.request("GET", f"/v1/functions/{function_id}").json()
        )

    def evaluate_function(
        self,
        function_id: str,
        points: Sequence[Sequence[float]],
        columns: Sequence[str] | None = None,
    ) -> FunctionEvaluation:
        """POST /v1/functions/{id}/evaluate. Free; a repeated point returns the same value.

        ``columns``: the covariates' names in the order the points give them (any order, each
        covariate once): the server reads the points by name and refuses a list that does not
        match the schema (``ValidationFailed`` at ``#/columns``), so a drifted column order is
        not answered for the wrong patient. Without it, points are in schema order
        (``function_info(id).covariates``).

        Retrying is safe: an answer is returned only after its noise is committed, and a point
        already answered is served from the stored state. More points than one request takes
        (``EVALUATE_BATCH_LIMIT``, or the function's own ``batch_max`` where smaller) are sent
        as consecutive batches in order, as if the caller had sent them one after another; a
        batch refused (e.g. at the function's capacity) raises, and the batches before it
        stay answered: their answers are on the exception as ``partial`` (a
        ``FunctionEvaluation`` of the first points; None if the first batch was refused).
        """
        points, columns = _frame(points, columns)
        pts = _as_points(points)
        named = None if columns is None else [str(c) for c in columns]
        if len(pts) <= 1:
            return self._evaluate_batch(function_id, pts, named)
        size = min(EVALUATE_BATCH_LIMIT, self._function_batch_max(function_id))
        if len(pts) <= size:
            return self._evaluate_batch(function_id, pts, named)
        parts: list[FunctionEvaluation] = []
        for i in range(0, len(pts), size):
            try:
                parts.append(self._evaluate_batch(function_id, pts[i : i + size], named))
            except ProblemError as exc:
                _shift_point_pointers(exc, i)  # the caller's point numbers, not the batch's
                if parts:
                    done = [v for part in parts for v in part.values]
                    exc.partial = FunctionEvaluation.from_response(
                        {**parts[0].raw, "values": done}, pts[: len(done)]
                    )
                raise
        first = parts[0]
        values = [v for part in parts for v in part.values]
        raw = {**first.raw, "values": values}
        return FunctionEvaluation.from_response(raw, pts)

    def _function_batch_max(self, function_id: str) -> int:
        if function_id not in self._batch_max:
            self._batch_max[function_id] = self.function_info(function_id).batch_max
        return self._batch_max[function_id]

    def _evaluate_batch(
        self, function_id: str, pts: list[list[float]], columns: list[str] | None = None
    ) -> FunctionEvaluation:
        body: dict[str, Any] = {"points": pts}
        if columns is not None:
            body["columns"] = columns
        r = self.request("POST", f"/v1/functions/{function_id}/evaluate", json_body=body)
        return FunctionEvaluation.from_response(r.json(), pts)

    def predict(
        self,
        release_id: str,
        points: Sequence[Sequence[float]],
        columns: Sequence[str] | None = None,
    ) -> Prediction:
        """POST /v1/releases/{id}/predict: a finished ``ebm_cate`` or ``uplift_table`` release's
        CATE at public points. Free (post-processing of the stored DP model), deterministic.
        More points than one request takes (``PREDICT_BATCH_LIMIT``, fewer where the points have
        many covariates: ``MAX_COORDINATES_PER_REQUEST``) are sent in batches. ``columns``: as
        for ``evaluate_function``."""
        points, columns = _frame(points, columns)
        pts = _as_points(points)
        extra: dict[str, Any] = {} if columns is None else {"columns": [str(c) for c in columns]}
        width = max(len(pts[0]), 1) if pts else 1
        size = max(1, min(PREDICT_BATCH_LIMIT, MAX_COORDINATES_PER_REQUEST // width))
        parts = [
            self.request(
                "POST",
                f"/v1/releases/{release_id}/predict",
                json_body={"points": pts[i : i + size], **extra},
            ).json()
            for i in range(0, max(len(pts), 1), size)
        ]
        raw = {**parts[0], "predictions": [v for part in parts for v in part["predictions"]]}
        return Prediction.from_response(raw, pts)


def _retry_after(response: httpx.Response | None) -> float | None:
    """A response's ``Retry-After`` in seconds (the delay form; an HTTP date is not used)."""
    if response is None:
        return None
    value = response.headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0.0 else None


def _page(limit: int | None, offset: int, order: str | None = None) -> str:
    """The query string of a listing page ('' for the whole list, oldest first)."""
    query: dict[str, str | int] = {}
    if limit is not None:
        query["limit"] = limit
    if offset:
        query["offset"] = offset
    if order is not None:
        query["order"] = order
    return "?" + urlencode(query) if query else ""


def _frame(points: Any, columns: Sequence[str] | None) -> tuple[Any, Sequence[str] | None]:
    """A pandas DataFrame's rows as the points and, unless ``columns`` is given, its column
    names as ``columns`` (the server then reads them by name and refuses names it does not
    know); iterating a DataFrame would give its column names. Anything else is unchanged."""
    if hasattr(points, "columns") and hasattr(points, "to_numpy"):
        named = columns if columns is not None else [str(c) for c in points.columns]
        return points.to_numpy().tolist(), named
    return points, columns


def _as_points(points: Sequence[Sequence[float]]) -> list[list[float]]:
    """The points as finite JSON numbers. Numbers of any real type (numpy's too) pass; a string
    or a boolean is refused, as the server refuses them (it never reads "64" as 64), and so are
    NaN and infinities (JSON has none) and a flat list of numbers (one point is ``[[...]]``)."""
    out: list[list[float]] = []
    for i, point in enumerate(points):
        if isinstance(point, (str, bytes)) or not isinstance(point, Sequence | Iterable):
            raise TypeError(
                f"point {i}: a point is a list of numbers, not {type(point).__name__} "
                f"({point!r:.20}); one point is [[x1, x2, ...]]"
            )
        row: list[float] = []
        for j, value in enumerate(point):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(
                    f"point {i}, coordinate {j}: a number is needed, not "
                    f"{type(value).__name__} ({value!r:.20})"
                )
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(f"point {i}, coordinate {j}: {number} is not a finite number")
            row.append(number)
        out.append(row)
    return out


_POINT_POINTER = re.compile(r"#/points/(\d+)")


def _shift_point_pointers(exc: ProblemError, offset: int) -> None:
    """Renumber a batch's ``#/points/K`` pointers (errors and detail) by the batch's offset in
    the caller's points, so that a refusal names the caller's point, not the batch's (a CDS
    walkthrough's bad point 1200 was reported at 200)."""
    if offset == 0:
        return

    def shift(text: str) -> str:
        return _POINT_POINTER.sub(lambda m: f"#/points/{int(m.group(1)) + offset}", text)

    for error in exc.errors:
        if isinstance(error.get("pointer"), str):
            error["pointer"] = shift(error["pointer"])
    if exc.detail:
        exc.detail = shift(exc.detail)
    exc.args = (exc.one_line(),)


@contextmanager
def _files(
    factory: Callable[[], Mapping[str, tuple[str, IO[bytes], str]]] | None,
) -> Iterator[Mapping[str, tuple[str, IO[bytes], str]] | None]:
    """Open the upload's files for one attempt and close them after it."""
    if factory is None:
        yield None
        return
    opened = factory()
    try:
        yield opened
    finally:
        for _name, handle, _type in opened.values():
            handle.close()


def _problem(response: httpx.Response) -> ProblemError:
    body: Any
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return problem_from_body(body, status=response.status_code, reason=response.reason_phrase)
