"""Releases: validate -> record -> charge -> enqueue; read back with the padding applied."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

from pydantic import ValidationError
from pydantic_core import to_jsonable_python
from sqlalchemy import func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.auth.service import Caller, Role
from service.datasets import service as datasets
from service.datasets.schemas import BudgetRead
from service.db.models import Dataset, Release
from service.jobs import failures
from service.ledger import amounts
from service.ledger import service as ledger
from service.ledger.chain import canonical_json
from service.mechanisms.domain import PublicDomain
from service.mechanisms.records import MechanismRecord
from service.problems import (
    BudgetExhausted,
    DatasetUnavailable,
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    NotFound,
    PrincipalCapExceeded,
    ReleaseFailedProblem,
    UnknownKind,
    ValidationFailed,
    validation_summary,
)
from service.releases.kinds import REGISTRY
from service.releases.kinds.base import KindParams, ReleaseKind, release_params
from service.releases.schemas import (
    QuoteCreate,
    QuoteRead,
    ReleaseCreate,
    ReleaseError,
    ReleaseRead,
)


def resolve_kind(name: str, raw: dict[str, Any]) -> tuple[ReleaseKind, KindParams]:
    kind = REGISTRY.get(name)
    if kind is None:
        raise UnknownKind(f"unknown release kind '{name}'; known: {', '.join(sorted(REGISTRY))}")
    try:
        params = kind.Params.model_validate(raw)
    except ValidationError as exc:
        errors = [
            {
                "pointer": "#/params/" + "/".join(str(p) for p in e["loc"]),
                "detail": str(e["msg"]).removeprefix("Value error, "),
            }
            for e in exc.errors()
        ]
        raise ValidationFailed(validation_summary(errors), errors=errors) from None
    return kind, params


def requested_params(name: str, stored: dict[str, Any]) -> dict[str, Any]:
    """A stored request's parameters as the caller set them: those that differ from the kind's
    defaults (a default, or a null that the public rules resolve, is left out; what the rules
    chose is in the release's ``result`` and ``mechanism``). The stored form (every field) is
    what the request hash and retries compare. A plain comparison with each field's default in
    JSON form: no validation, so a listing of many releases stays cheap."""
    kind = REGISTRY.get(name)
    if kind is None:
        return stored
    fields = kind.Params.model_fields
    shown: dict[str, Any] = {}
    for key, value in stored.items():
        field = fields.get(key)
        if field is not None and not field.is_required():
            default = to_jsonable_python(field.get_default(call_default_factory=True))
            if value == default:
                continue
        shown[key] = value
    return shown


# Request fields that list covariates by 0-based position; a covariate's schema name is read as
# its position (``column_positions``), as ``cut_points`` and ``quantile_cuts`` take names (an
# observational walkthrough's names were refused there).
COLUMN_LIST_FIELDS = ("effect_columns", "adjustment_columns")


def column_positions(raw: dict[str, Any], domain: PublicDomain) -> dict[str, Any]:
    """``raw`` with the covariate names in its ``COLUMN_LIST_FIELDS`` replaced by their schema
    positions, in increasing order (the stored request, and so its hash, holds the sorted
    positions: a name and its position, in any order, are the same release). An unknown name is
    a 422 naming the schema's covariates; anything else (a repeat, a position out of range) is
    left to the kind's validation. A list of every covariate stays a list: on a trial it asks
    for the aipw estimator, and with a declared set it overrides it, so it is not the same
    request as none."""
    if not isinstance(raw, dict):
        return raw
    names = domain.names
    out = dict(raw)
    errors = []
    for field in COLUMN_LIST_FIELDS:
        given = raw.get(field)
        if not isinstance(given, list):
            continue
        resolved: list[Any] = []
        for i, item in enumerate(given):
            if isinstance(item, str):
                if item in names:
                    resolved.append(names.index(item))
                    continue
                errors.append(
                    {
                        "pointer": f"#/params/{field}/{i}",
                        "detail": f"{item!r} is not a covariate of this dataset; give a name "
                        f"among {', '.join(names[:20])}{', ...' if len(names) > 20 else ''} "
                        "or a 0-based position",
                    }
                )
            resolved.append(item)
        if all(isinstance(j, int) and not isinstance(j, bool) for j in resolved):
            # a set of covariates: in increasing order, as the mechanisms read it, so that
            # [4, 0] and [0, 4] are one release (a re-test was charged again for the order)
            resolved.sort()
        out[field] = resolved
    if errors:
        raise ValidationFailed(validation_summary(errors), errors=errors)
    return out


def _plan(
    dataset: Dataset, name: str, raw: dict[str, Any]
) -> tuple[ReleaseKind, KindParams, PublicDomain, MechanismRecord]:
    domain = datasets.domain_of(dataset)
    kind, params = resolve_kind(name, column_positions(raw, domain))
    record = kind.record(params, domain)
    return kind, params, domain, record


def request_hash(dataset: Dataset, kind: str, params: KindParams) -> str:
    canonical = {
        "dataset_id": dataset.id,
        "dataset_version": dataset.version,
        "schema_hash": dataset.schema_hash,
        "kind": kind,
        "params": params.model_dump(mode="json"),
    }
    return hashlib.sha256(canonical_json(canonical).encode()).hexdigest()


def create(
    session: Session, *, caller: Caller, dataset_id: str, body: ReleaseCreate, idempotency_key: str
) -> tuple[Release, bool]:
    """Return (release, created). ``created`` is False for an idempotent replay or a reuse.

    Without ``fresh`` an identical request (same dataset version, kind and parameters, same
    principal) is answered with the newest release of it that has not failed. Reuse is atomic:
    a new reusable release carries ``reuse_key`` under a partial unique index, inserted in the
    transaction of its charge, so of concurrent identical requests exactly one is charged; the
    others' inserts (or, once the budget is spent, their charges) fail, their transactions roll
    back with nothing charged, and they are answered with the winner's release.
    """
    dataset, via_grant = datasets.usable_for_release(session, caller=caller, dataset_id=dataset_id)
    if dataset.status != "ready":
        raise DatasetUnavailable("the dataset's rows were deleted")
    kind, params, _domain, record = _plan(dataset, body.kind, body.params)
    params = release_params(params)  # a quote's target does not make another release
    digest = request_hash(dataset, body.kind, params)
    stored_params = {"params": params.model_dump(mode="json"), "fresh": body.fresh}

    for _attempt in range(3):
        existing = _by_key(session, dataset_id, caller.id, idempotency_key)
        if existing is not None:
            return _replay(existing, digest, stored_params), False
        if not body.fresh:
            reusable = _reusable(session, dataset_id, caller.id, digest)
            if reusable is not None:
                return reusable, False
        try:
            return _charge_and_record(
                session,
                caller=caller,
                dataset_id=dataset_id,
                body=body,
                idempotency_key=idempotency_key,
                record=record,
                digest=digest,
                stored_params=stored_params,
                via_grant=via_grant,
            ), True
        except IntegrityError:
            # A concurrent request with the same key, or an identical reusable request, won
            # the race; it has committed (its insert held ours). Look again, from a new snapshot.
            session.rollback()
        except (BudgetExhausted, PrincipalCapExceeded) as refusal:
            # The winner of a race of identical requests (or of retries with this key) may have
            # spent the last of the budget; then this request is still answered by its release.
            # Otherwise the refusal stands.
            session.rollback()
            existing = _by_key(session, dataset_id, caller.id, idempotency_key)
            if existing is not None:
                return _replay(existing, digest, stored_params), False
            if not body.fresh:
                reusable = _reusable(session, dataset_id, caller.id, digest)
                if reusable is not None:
                    return reusable, False
            raise _naming_the_shortfall(
                refusal, session, caller, dataset_id, via_grant, record
            ) from None
    raise IdempotencyKeyInFlight()


def _naming_the_shortfall(
    refusal: BudgetExhausted | PrincipalCapExceeded,
    session: Session,
    caller: Caller,
    dataset_id: str,
    via_grant: bool,
    record: MechanismRecord,
) -> BudgetExhausted | PrincipalCapExceeded:
    """The refusal being raised, its detail extended by what is short (epsilon or delta, the
    dataset's remainder or the caller's cap), read after the refusal: public to the caller."""
    eps = amounts.epsilon_cost_units(record.epsilon)
    dlt = amounts.delta_cost_units(record.delta)
    short, _, _ = _shortfall(
        session,
        caller=caller,
        dataset_id=dataset_id,
        via_grant=via_grant,
        eps=eps,
        dlt=dlt,
        budget=datasets.budget_view(session, dataset_id),
    )
    session.rollback()
    if short and refusal.detail:
        refusal.detail = refusal.detail + " (" + "; ".join(short) + ")"
    return refusal


def _charge_and_record(
    session: Session,
    *,
    caller: Caller,
    dataset_id: str,
    body: ReleaseCreate,
    idempotency_key: str,
    record: MechanismRecord,
    digest: str,
    stored_params: dict[str, Any],
    via_grant: bool,
) -> Release:
    """Charge, insert the release, defer its job and commit: all or nothing.

    Everything that needs no lock (the row's fields, the JSON) is prepared first; on
    PostgreSQL the charge, its ledger entry, the release row and its job are then one
    statement that commits as it ends (``ledger.charge_release``), so the budget row's lock is
    held for that statement and its commit only.
    """
    release_id = uuid.uuid4().hex
    release = Release(
        id=release_id,
        dataset_id=dataset_id,
        principal_id=caller.id,
        kind=body.kind,
        params_json=canonical_json(stored_params),
        request_hash=digest,
        reuse_key=None if body.fresh else digest,
        idempotency_key=idempotency_key,
        status="queued",
        progress=0.0,
        stage="queued",
        guarantee=str(record.guarantee),
        record_json=canonical_json(record.to_dict()),
    )
    ledger.charge_release(
        session,
        dataset_id=dataset_id,
        principal_id=caller.id,
        record=record,
        via_grant=via_grant,
        release=release,
    )
    return release


def _reusable(session: Session, dataset_id: str, principal_id: str, digest: str) -> Release | None:
    """The newest release of this request (fresh or not) that has not failed as its readers see
    it: one that failed before its padded completion time still answers (as ``running``), so an
    identical request cannot learn of the failure, or when it happened, before the bucket."""
    return session.execute(
        select(Release)
        .where(
            Release.dataset_id == dataset_id,
            Release.principal_id == principal_id,
            Release.request_hash == digest,
            or_(
                Release.status != "failed",
                Release.visible_at > time.time(),
            ),
        )
        .order_by(Release.created_at.desc())
        .limit(1)
    ).scalar_one_or_none()


def _by_key(session: Session, dataset_id: str, principal_id: str, key: str) -> Release | None:
    return session.execute(
        select(Release).where(
            Release.dataset_id == dataset_id,
            Release.principal_id == principal_id,
            Release.idempotency_key == key,
        )
    ).scalar_one_or_none()


def _replay(existing: Release, digest: str, stored_params: dict[str, Any]) -> Release:
    if existing.request_hash != digest or json.loads(existing.params_json) != stored_params:
        raise IdempotencyKeyReused("this Idempotency-Key was used with a different request")
    return existing


def _shortfall(
    session: Session,
    *,
    caller: Caller,
    dataset_id: str,
    via_grant: bool,
    eps: int,
    dlt: int,
    budget: BudgetRead,
) -> tuple[list[str], int | None, int | None]:
    """What keeps a release costing ``(eps, dlt)`` ledger units from being charged now, in words
    (empty: it fits), and the caller's cap remainders (units; None: no cap). ``budget`` is the
    dataset's budget as read; the remainders are public to the caller (a quote shows them)."""
    short: list[str] = []
    if not budget.is_set:
        short.append(
            "the dataset's budget is not set yet: its owner sets it "
            f"(PUT /v1/datasets/{dataset_id}/budget) before any release"
        )
    else:
        if eps > amounts.epsilon_total_units(budget.epsilon_remaining) + 1:
            short.append(
                f"it needs epsilon {amounts.epsilon_value(eps):g}; the dataset has "
                f"{budget.epsilon_remaining:g} left"
            )
        if dlt > amounts.delta_total_units(budget.delta_remaining) + 1:
            hint = (
                f" (name a smaller delta in the request's params, at most "
                f"{budget.delta_remaining:g}, better that divided by the releases still planned: "
                "a smaller delta adds some privacy noise, about 25 % at 1e-7 instead of 1e-5)"
                if budget.delta_remaining > 0
                else ""
            )
            short.append(
                f"it needs delta {amounts.delta_value(dlt):g}; the dataset has "
                f"{budget.delta_remaining:g} left{hint}"
            )
    cap_eps = cap_dlt = None
    if via_grant:
        cap_eps, cap_dlt = ledger.cap_remaining(
            session, dataset_id=dataset_id, principal_id=caller.id
        )
        # the cost is named once: after the dataset's line, the cap's says only what it leaves
        said = " ".join(short)
        if cap_eps is not None and eps > cap_eps:
            need = f"it needs epsilon {amounts.epsilon_value(eps):g}"
            lead = "and" if need in said else f"{need};"
            short.append(
                f"{lead} your cap on this dataset leaves {amounts.epsilon_value(cap_eps):g}"
            )
        if cap_dlt is not None and dlt > cap_dlt:
            need = f"it needs delta {amounts.delta_value(dlt):g}"
            lead = "and" if need in said else f"{need};"
            short.append(f"{lead} your cap on this dataset leaves {amounts.delta_value(cap_dlt):g}")
    return short, cap_eps, cap_dlt


def quote(session: Session, *, caller: Caller, dataset_id: str, body: QuoteCreate) -> QuoteRead:
    """Cost and accuracy for this caller: ``fits_budget`` only if both the dataset's remainder
    and the caller's own per-principal cap (an analyst's grant) cover the cost."""
    dataset, via_grant = datasets.usable_for_release(session, caller=caller, dataset_id=dataset_id)
    kind, params, domain, record = _plan(dataset, body.kind, body.params)
    budget = datasets.budget_view(session, dataset_id)
    eps = amounts.epsilon_cost_units(record.epsilon)
    dlt = amounts.delta_cost_units(record.delta)
    short, cap_eps, cap_dlt = _shortfall(
        session,
        caller=caller,
        dataset_id=dataset_id,
        via_grant=via_grant,
        eps=eps,
        dlt=dlt,
        budget=budget,
    )
    if dataset.status != "ready":
        # a release would be refused (409 dataset-unavailable) whatever the budget says
        short.insert(0, "the dataset's rows were deleted, so no release can run on it")
    return QuoteRead(
        kind=body.kind,
        guarantee=str(record.guarantee),
        epsilon=amounts.epsilon_value(eps),
        delta=amounts.delta_value(dlt),
        fits_budget=not short,
        budget_note=("Not charged now: " + "; ".join(short) + ".") if short else None,
        epsilon_remaining=budget.epsilon_remaining,
        delta_remaining=budget.delta_remaining,
        cap_epsilon_remaining=None if cap_eps is None else amounts.epsilon_value(cap_eps),
        cap_delta_remaining=None if cap_dlt is None else amounts.delta_value(cap_dlt),
        accuracy=kind.quote(params, domain),
        mechanism=record.to_dict(),
    )


def readable(session: Session, *, caller: Caller, release_id: str) -> Release:
    release = session.get(Release, release_id)
    if release is None:
        raise NotFound("release not found")
    try:
        datasets.readable(session, caller=caller, dataset_id=release.dataset_id)
    except NotFound:
        # the same words as an unknown id: another owner's release was "dataset not found",
        # which told an auditor it exists
        raise NotFound("release not found") from None
    if caller.role == Role.CLIENT and shown_status(release) != "done":
        raise NotFound("release not found")
    return release


def listing(
    session: Session,
    *,
    caller: Caller,
    dataset_id: str,
    limit: int | None = None,
    offset: int = 0,
    newest_first: bool = False,
) -> tuple[list[Release], int]:
    """The dataset's releases the caller may list, by creation time (oldest first unless
    ``newest_first``), the page ``[offset, offset + limit)`` (all from ``offset`` without a
    limit), and how many there are in all."""
    datasets.readable(session, caller=caller, dataset_id=dataset_id)
    where = [Release.dataset_id == dataset_id]
    if caller.role == Role.CLIENT:
        # a client lists finished releases only, each from its padded completion time on (as
        # every reader sees it: ``shown_status``)
        now = time.time()
        where += [
            Release.status == "done",
            or_(Release.visible_at.is_(None), Release.visible_at <= now),
        ]
    total = int(
        session.execute(select(func.count()).select_from(Release).where(*where)).scalar_one()
    )
    order = (
        (Release.created_at.desc(), Release.id.desc())
        if newest_first
        else (
            Release.created_at,
            Release.id,
        )
    )
    query = select(Release).where(*where).order_by(*order).offset(offset)
    if limit is not None:
        query = query.limit(limit)
    return list(session.execute(query).scalars()), total


def shown_status(release: Release, *, now: float | None = None) -> str:
    """The status every reader sees: a finished job stays 'running' until its padded
    completion time (``visible_at``), so no reader learns how long the job really took."""
    now = time.time() if now is None else now
    finished = release.status in ("done", "failed")
    if finished and release.visible_at is not None and now < release.visible_at:
        return "running"
    return release.status


# While a job runs, readers see a progress that is a public function of the time since it
# started, never the job's own: the pace of its progress and the moments its stage changes
# would reveal how long each step takes on these data (docs/privacy.md, "Side channels").
PROGRESS_HALF_SECONDS = 10.0


def public_progress(elapsed: float) -> float:
    """The shown progress ``elapsed`` seconds after the start: 0.99 e / (e + 10 s), so 0.5
    after 10 s and below 0.99 until the result is visible."""
    elapsed = max(0.0, elapsed)
    return 0.99 * elapsed / (elapsed + PROGRESS_HALF_SECONDS)


def _shown_result(release: Release) -> dict[str, Any]:
    """The stored result as shown: a released function's ``evaluate`` hint names its own path
    and ``function_id`` its id, the release id (the job that wrote it did not know it)."""
    result: dict[str, Any] = json.loads(release.result_json or "{}")
    hint = result.get("evaluate")
    if isinstance(hint, str) and "{release_id}" in hint:
        result["evaluate"] = hint.replace("{release_id}", release.id)
        result["function_id"] = release.id
    return result


def view(release: Release, *, cached: bool = False, now: float | None = None) -> ReleaseRead:
    """The reader's view. A finished job stays 'running' until its padded completion time, its
    progress and stage are public functions of the time since it started (``public_progress``),
    and its ``finished_at`` is the padded completion time, so nothing shown reveals how long the
    job really took."""
    now = time.time() if now is None else now
    status = shown_status(release, now=now)
    finished = status in ("done", "failed")
    if finished:
        progress, stage = 1.0, status
    elif status == "running" and release.started_at is not None:
        progress = public_progress(now - ledger.iso_seconds(release.started_at))
        stage = "running"
    else:
        progress, stage = 0.0, "queued"
    finished_at = None
    if finished:
        padded = release.visible_at
        finished_at = release.finished_at if padded is None else ledger.seconds_iso(padded)
    error = None
    if finished and status == "failed":
        error = ReleaseError(
            type=ReleaseFailedProblem.type_uri(),
            title=ReleaseFailedProblem.title,
            detail=failures.detail(release.failure),
        )
    stored = json.loads(release.params_json)
    return ReleaseRead(
        id=release.id,
        dataset_id=release.dataset_id,
        principal_id=release.principal_id,
        kind=release.kind,
        status=status,
        progress=progress,
        stage=stage,
        guarantee=release.guarantee,
        epsilon=amounts.epsilon_value(release.epsilon),
        delta=amounts.delta_value(release.delta),
        params=requested_params(release.kind, stored["params"]),
        mechanism=json.loads(release.record_json),
        result=_shown_result(release) if finished and release.result_json else None,
        error=error,
        cached=cached,
        created_at=release.created_at,
        started_at=release.started_at,
        finished_at=finished_at,
    )
