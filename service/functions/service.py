"""Evaluate released functions: lock, dedupe, condition, persist, then answer. Never charges.

State layout (all secret, never returned, logged or put in an error):

* ``cate_function``: the public header and the lock row (``version`` = batches appended,
  ``t`` = distinct points stored, ``status`` open/closed).
* ``cate_function_secret``: the fitted ``g*`` (or the noised finite-basis coefficients).
* ``cate_function_batch``: one row per answered batch of *new* distinct points: canonical
  lattice codes, unit-GP values ``u``, released values ``y`` and per-point jitters ``D``.

Exact mode: a batch is one transaction. The header row is locked (``SELECT ... FOR UPDATE`` on
PostgreSQL; SQLite transactions are ``BEGIN IMMEDIATE``), the per-process cache is brought up
to the header's ``version`` by replaying newer batch rows (block Cholesky with the stored
jitters), points already stored are answered from the cache, new points are drawn from the
posterior given *all* stored points, the batch row is appended and committed, and only then is
the cache extended and the answer returned. A failed commit discards the draw. State that cannot
be decoded closes the function (never silently re-initialised).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Connection, and_, bindparam, delete, func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from service.auth.service import INVALID_KEY, Role, bearer_key, hash_key, is_admin_key
from service.config import get_settings
from service.datasets.schemas import PublicSchema, variable_info
from service.db.engine import get_sessionmaker, read
from service.db.models import (
    CateFunction,
    CateFunctionBatch,
    CateFunctionSecret,
    Dataset,
    Grant,
    Principal,
    Release,
)
from service.functions import keys, prefault
from service.functions.payload import FunctionSecret
from service.functions.sealing import UnknownKey, seal, unseal
from service.mechanisms import cate_function as mech
from service.mechanisms import gp
from service.mechanisms.domain import coordinate_error, points_summary
from service.mechanisms.noise import OpenDPSampler
from service.points import in_request_order, in_schema_order
from service.problems import (
    FunctionBatchRejected,
    FunctionBusy,
    FunctionCapacityReached,
    FunctionClosed,
    NotFound,
    Unauthenticated,
    ValidationFailed,
)

# Per-process caches of exact-mode paths: each holds O(t^2) memory and costs O(t^3) to replay
# from the database, so the cache keeps as many as fit in ``function_cache_mb`` (the sizes
# estimated by ``entry_bytes``), at most MAX_CACHED_FUNCTIONS, and always the newest one.
MAX_CACHED_FUNCTIONS = 256

# How long an exact-basis batch of new points waits for the function's lock (this process's and
# the PostgreSQL row lock) before it answers 503 with Retry-After. A batch of 1000 new points at
# t ~ 10^4 holds it about 1-4 s here, so this queues a few such batches.
FUNCTION_LOCK_TIMEOUT_SECONDS = 15.0


_blas_guard = threading.Lock()
_blas_controller: Any = None


@contextmanager
def _blas_threads(limit: int) -> Iterator[None]:
    """Run BLAS/LAPACK on ``limit`` threads inside the block.

    Evaluations use one thread: request threads already use the cores, and OpenBLAS's own
    threads under that oversubscription made a 1000-point Cholesky ~15x slower (measured). The
    one exception is a wide solve (many new points against a large stored factor, O(t^2 m)),
    which holds the function's lock anyway and gets every core: on an idle 2-core machine a
    10^4 x 10^3 triangular solve takes 0.71-0.79 s on two threads against 1.27-1.36 s on one.
    """
    global _blas_controller
    with _blas_guard:
        if _blas_controller is None:
            from threadpoolctl import ThreadpoolController

            _blas_controller = ThreadpoolController()
    with _blas_controller.limit(limits=limit, user_api="blas"):
        yield


# A solve of m new points against t stored ones is "wide" from t * m >= 2^20 entries (e.g. 256
# points at t = 4096): below that, thread start-up costs more than it saves.
WIDE_SOLVE_ENTRIES = 1 << 20
WIDE_BLAS_THREADS = max(1, os.cpu_count() or 1)


def _threads_for(stored: int, new: int) -> int:
    return WIDE_BLAS_THREADS if stored * new >= WIDE_SOLVE_ENTRIES else 1


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- persisting a finished release (called by the job runner) ------------------------------


# The bases whose secret state is built from the dataset's rows: the exact basis's fitted g*
# keeps the estimation fold's rows (scaled) as its kernel support, and its batches the GP noise
# that, with the answers, gives g* at the asked points. The finite bases' state is their DP
# (noised) coefficients on public centres or frequencies, the ebm basis its DP release's model.
ROW_STATE_BASES = frozenset({"exact"})
ROWS_DELETED = (
    "the dataset's rows were deleted, and with them this exact-basis function's state (it was "
    "built from the rows); any answers it gave stay valid where you kept them"
)


def store(session: Session, *, release_id: str, dataset_id: str, secret: FunctionSecret) -> None:
    """Create the function's header and secret rows (same transaction as the job's result).

    The dataset's row is locked first, as ``delete_rows`` locks it: a fit that read the rows
    before they were deleted stores an exact-basis function closed, without its state (the
    release's DP result stays, like every release's)."""
    deleted = (
        session.execute(
            select(Dataset.status).where(Dataset.id == dataset_id).with_for_update()
        ).scalar_one()
        == "deleted"
    )
    closed = deleted and secret.basis in ROW_STATE_BASES
    first_batch = None if closed else secret.initial  # the reference points' draws
    now = _now_iso()
    session.add(
        CateFunction(
            id=release_id,
            dataset_id=dataset_id,
            status="closed" if closed else "open",
            basis=secret.basis,
            q=secret.q,
            t_max=secret.t_max,
            points_per_principal=secret.points_per_principal,
            batch_max=secret.batch_max,
            jitter=secret.jitter,
            t=0 if first_batch is None else int(first_batch.values.size),
            version=0 if first_batch is None else 1,
            public_json=json.dumps(secret.public, allow_nan=False),
            created_at=now,
            closed_at=now if closed else None,
        )
    )
    if closed:
        session.flush()
        return
    payload = seal(secret.fitted.to_bytes(), context=f"{release_id}:fitted")
    session.flush()
    session.add(
        CateFunctionSecret(function_id=release_id, payload=payload, digest=_digest(payload))
    )
    if secret.initial is not None:
        # The path drawn at the public reference points at release time (proof §7): the
        # function's first batch, answered like any other point from now on.
        first = seal(
            _encode_batch(
                secret.initial.codes,
                secret.initial.values,
                secret.initial.answers,
                secret.initial.jitters,
            ),
            context=f"{release_id}:batch:1",
        )
        session.add(
            CateFunctionBatch(
                function_id=release_id,
                seq=1,
                size=int(secret.initial.values.size),
                payload=first,
                digest=_digest(first),
            )
        )
    session.flush()


def purge_row_state(session: Session, *, dataset_id: str) -> list[str]:
    """Delete the state built from a dataset's rows (``ROW_STATE_BASES``) and close those
    functions, in the caller's transaction (``delete_rows``, after it has locked the dataset's
    row). Each function's row is locked as an evaluation locks it, so none is mid-answer.
    A function whose shrinkage factor is 0 answers its public anchor without that state and
    stays open. Returns the purged functions' ids (the caller forgets their cached copies after
    commit)."""
    ids = list(
        session.execute(
            select(CateFunction.id)
            .where(
                CateFunction.dataset_id == dataset_id,
                CateFunction.basis.in_(sorted(ROW_STATE_BASES)),
            )
            .order_by(CateFunction.id)
            .with_for_update()
        ).scalars()
    )
    if not ids:
        return []
    session.execute(delete(CateFunctionSecret).where(CateFunctionSecret.function_id.in_(ids)))
    session.execute(delete(CateFunctionBatch).where(CateFunctionBatch.function_id.in_(ids)))
    now = _now_iso()
    for header in session.execute(select(CateFunction).where(CateFunction.id.in_(ids))).scalars():
        header.t = 0
        header.version = 0
        if constant_answer(json.loads(header.public_json)) is not None:
            # shrinkage factor 0: every answer is its public anchor, served from its public
            # facts without the deleted state, so it stays open (a CDS walkthrough's constant
            # function had closed with the rows, though its answer needed none of them)
            continue
        header.status = "closed"
        header.closed_at = header.closed_at or now
    session.flush()
    return ids


# ---- access ---------------------------------------------------------------------------------


def view_with_key(*, authorization: str | None, function_id: str) -> dict[str, Any]:
    """Public metadata of a function (no state, no counts of points: a caller's own count
    would show which of its points others had asked first)."""
    key = bearer_key(authorization)

    def header_and_schema(conn: Connection) -> tuple[Any, str | None]:
        row = _access(conn, key, function_id)
        schema = conn.execute(
            select(Dataset.schema_json).where(Dataset.id == row.dataset_id)
        ).scalar_one_or_none()
        return row, schema

    row, schema_json = read(header_and_schema)
    public: dict[str, Any] = json.loads(row.public_json)
    exact = row.basis == "exact"
    info = (
        {} if schema_json is None else variable_info(PublicSchema.model_validate_json(schema_json))
    )
    return {
        **info,
        "id": row.function_id,
        "dataset_id": row.dataset_id,
        "status": row.status,
        "basis": row.basis,
        "q": row.q,
        "t_max": row.t_max if exact else None,
        "points_per_principal": row.points_per_principal if exact else None,
        "batch_max": row.batch_max,
        "covariates": public.get("x_names"),
        "public": public,
    }


# ---- points ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Public:
    """A function's immutable public facts, parsed once per process (never secret)."""

    q: int
    basis: str
    batch_max: int
    lower: NDArray[np.float64]
    upper: NDArray[np.float64]
    public: dict[str, Any]
    # per coordinate, a categorical covariate's codes (None: numeric); functions released
    # before the codes were stored have none and are checked against the box only
    codes: tuple[frozenset[float] | None, ...] | None = None


_publics: OrderedDict[str, _Public] = OrderedDict()
MAX_CACHED_PUBLICS = 1024


def _public_facts(
    function_id: str, q: int, basis: str, batch_max: int, public_json: str
) -> _Public:
    with _cache_guard:
        facts = _publics.get(function_id)
        if facts is not None:
            _publics.move_to_end(function_id)
            return facts
    public: dict[str, Any] = json.loads(public_json)
    facts = _Public(
        q=q,
        basis=basis,
        batch_max=batch_max,
        lower=np.asarray(public["x_lower"], dtype=np.float64),
        upper=np.asarray(public["x_upper"], dtype=np.float64),
        public=public,
        codes=None
        if public.get("x_codes") is None
        else tuple(None if c is None else frozenset(map(float, c)) for c in public["x_codes"]),
    )
    _keep_newest(_publics, function_id, facts, MAX_CACHED_PUBLICS)
    return facts


def _keep_newest(cache: OrderedDict[str, Any], key: str, value: Any, limit: int) -> None:
    """Store ``value`` in a per-process LRU ``cache`` of at most ``limit`` entries."""
    with _cache_guard:
        cache[key] = value
        while len(cache) > limit:
            cache.popitem(last=False)


# The invalid coordinates a refused batch lists (all are counted in its detail).
MAX_POINT_ERRORS = 20


def validate_points(
    facts: _Public, points: list[list[float]]
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Check shape, finiteness and the public box; return canonical codes and points."""
    if not points:
        raise ValidationFailed(
            "#/points: give at least one point",
            errors=[{"pointer": "#/points", "detail": "at least one point"}],
        )
    if len(points) > facts.batch_max:
        raise ValidationFailed(
            f"at most {facts.batch_max} points per request",
            errors=[{"pointer": "#/points", "detail": f"at most {facts.batch_max} points"}],
        )
    codes = facts.codes or (None,) * facts.q
    if all(len(point) == facts.q for point in points):
        array = np.asarray(points, dtype=np.float64).reshape(-1, facts.q)
        if (
            np.all(np.isfinite(array))
            and np.all((array >= facts.lower) & (array <= facts.upper))
            and all(c is None or set(array[:, j].tolist()) <= c for j, c in enumerate(codes))
        ):
            return mech.canonicalise(mech.scale_to_unit(array, facts.lower, facts.upper))
    # every invalid value is counted; the first MAX_POINT_ERRORS are listed (a walkthrough's
    # 1000 invalid points had read "(and 19 more)")
    errors: list[dict[str, str]] = []
    total = 0
    for i, point in enumerate(points):
        if len(point) != facts.q:
            total += 1
            if len(errors) < MAX_POINT_ERRORS:
                errors.append(
                    {
                        "pointer": f"#/points/{i}",
                        "detail": f"each point needs {facts.q} coordinates",
                    }
                )
            continue
        for j, value in enumerate(point):
            detail = (
                coordinate_error(value, float(facts.lower[j]), float(facts.upper[j]), codes[j])
                if np.isfinite(value)
                else "must be finite"
            )
            if detail is not None:
                total += 1
                if len(errors) < MAX_POINT_ERRORS:
                    errors.append({"pointer": f"#/points/{i}/{j}", "detail": detail})
    raise ValidationFailed(points_summary([e["detail"] for e in errors], total), errors=errors)


# ---- per-process caches ---------------------------------------------------------------------


@dataclass
class _Entry:
    version: int
    fitted: mech.FittedFunction
    path: gp.GpPath | None
    answers: dict[bytes, float] = field(default_factory=dict)


_cache: OrderedDict[str, _Entry] = OrderedDict()
_cache_guard = threading.Lock()
_locks: dict[str, threading.Lock] = {}


def _thread_lock(function_id: str) -> threading.Lock:
    with _cache_guard:
        lock = _locks.get(function_id)
        if lock is None:
            lock = _locks[function_id] = threading.Lock()
        return lock


def _cached(function_id: str) -> _Entry | None:
    with _cache_guard:
        entry = _cache.get(function_id)
        if entry is not None:
            _cache.move_to_end(function_id)
        return entry


PAGE_BYTES = 4096


def entry_bytes(t: int, q: int) -> int:
    """A cached path's resident memory at ``t`` answered points, estimated from public sizes.
    The factor lives in a column-major buffer sized for the capacity whose untouched zeroed
    pages cost nothing: column j touches its first j + 1 entries, at least one page, so about
    4 t^2 + 4096 t bytes in all; then the per-point arrays."""
    return 4 * t * t + PAGE_BYTES * t + 8 * t * (q + 4)


def _size(entry: _Entry) -> int:
    return 0 if entry.path is None else entry_bytes(entry.path.t, entry.path.q)


def evictions(sizes: list[int], budget: int, max_count: int) -> int:
    """How many of the least recently used entries (``sizes`` oldest first) to drop so that the
    rest fit in ``budget`` bytes and ``max_count`` entries; never the newest."""
    total, count, drop = sum(sizes), len(sizes), 0
    while drop < len(sizes) - 1 and (total > budget or count > max_count):
        total -= sizes[drop]
        count -= 1
        drop += 1
    return drop


def _remember(function_id: str, entry: _Entry) -> None:
    budget = get_settings().function_cache_mb * 1024 * 1024
    with _cache_guard:
        _cache[function_id] = entry
        _cache.move_to_end(function_id)
        drop = evictions([_size(e) for e in _cache.values()], budget, MAX_CACHED_FUNCTIONS)
        for _ in range(drop):
            _cache.popitem(last=False)


def forget(function_id: str | None = None) -> None:
    """Drop the per-process cache (one function or all); the next request reloads from the DB."""
    with _cache_guard:
        if function_id is None:
            _cache.clear()
            _read_answers.clear()
        else:
            _cache.pop(function_id, None)
            _read_answers.pop(function_id, None)


class _CorruptState(Exception):
    pass


def _load_fitted(session: Session, function_id: str) -> mech.FittedFunction:
    row = session.get(CateFunctionSecret, function_id)
    if row is None:
        raise _CorruptState()
    return _unseal_fitted(function_id, row.payload, row.digest)


def _unseal_fitted(function_id: str, payload: bytes, digest: str) -> mech.FittedFunction:
    if _digest(payload) != digest:
        raise _CorruptState()
    try:
        return mech.FittedFunction.from_bytes(unseal(payload, context=f"{function_id}:fitted"))
    except UnknownKey:  # this process's keys are wrong, not the state: never close for it
        raise keys.StateKeyMismatch(keys.MISMATCH) from None
    except Exception:  # SealError, or a malformed payload
        raise _CorruptState() from None


def _encode_batch(
    codes: NDArray[np.int64], u: NDArray[np.float64], y: NDArray[np.float64], d: NDArray[np.float64]
) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, codes=codes, u=u, y=y, d=d)
    return buffer.getvalue()


# a stored batch decoded: the points' canonical codes, the unit GP values, the answers, jitters
_Batch = tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]


def _decode_batch(row: CateFunctionBatch, q: int) -> _Batch:
    if _digest(row.payload) != row.digest:
        raise _CorruptState()
    try:
        plain = unseal(row.payload, context=f"{row.function_id}:batch:{row.seq}")
        with np.load(io.BytesIO(plain), allow_pickle=False) as z:
            codes = np.asarray(z["codes"], dtype=np.int64).reshape(-1, q)
            u = np.asarray(z["u"], dtype=np.float64)
            y = np.asarray(z["y"], dtype=np.float64)
            d = np.asarray(z["d"], dtype=np.float64)
    except UnknownKey:
        raise keys.StateKeyMismatch(keys.MISMATCH) from None
    except Exception:
        raise _CorruptState() from None
    if not (codes.shape[0] == u.size == y.size == d.size == row.size):
        raise _CorruptState()
    return codes, u, y, d


def _batches_after(session: Session, header: CateFunction, version: int) -> Iterator[_Batch]:
    """The stored batches after ``version``, decoded, in order; ``_CorruptState`` where one is
    missing or does not decode, or they do not end at the header's version."""
    rows = session.execute(
        select(CateFunctionBatch)
        .where(CateFunctionBatch.function_id == header.id, CateFunctionBatch.seq > version)
        .order_by(CateFunctionBatch.seq)
    ).scalars()
    expected = version
    for row in rows:
        expected += 1
        if row.seq != expected:
            raise _CorruptState()
        yield _decode_batch(row, header.q)
    if expected != header.version:
        raise _CorruptState()


def _answers_of(batches: Iterable[_Batch]) -> dict[bytes, float]:
    """Each answered point's value (keyed by its codes' bytes) from decoded batches."""
    answers: dict[bytes, float] = {}
    for codes, _, y, _ in batches:
        for key_codes, value in zip(codes, y, strict=True):
            answers[key_codes.tobytes()] = float(value)
    return answers


def _stored_answers(session: Session, header: CateFunction) -> dict[bytes, float]:
    """Every answered point's value from the stored batches (decrypted and checked as ``_sync``
    checks them), without conditioning the path (caller holds the lock)."""
    answers = _answers_of(_batches_after(session, header, 0))
    if len(answers) != header.t:
        raise _CorruptState()
    return answers


def _sync(session: Session, header: CateFunction) -> _Entry:
    """Bring this process's cache to the header's version (caller holds the lock)."""
    entry = _cached(header.id)
    if entry is None or entry.version > header.version:
        fitted = _load_fitted(session, header.id)
        path = (
            # The factor's buffer is sized for the public capacity at once: zeroed pages cost
            # no memory until the factor reaches them, and the doubling copies (0.5 s of a
            # batch at t ~ 8000, measured) never happen.
            gp.GpPath(header.q, fitted.bandwidth, capacity=header.t_max, max_capacity=header.t_max)
            if fitted.kind == "gp"
            else None
        )
        entry = _Entry(version=0, fitted=fitted, path=path)
    if entry.version < header.version:
        if entry.path is None:
            raise _CorruptState()
        steps = 1.0 / float(1 << mech.CANONICAL_BITS)
        for codes, u, y, d in _batches_after(session, header, entry.version):
            try:
                entry.path.extend_known(np.asarray(codes * steps, np.float64), u, d)
            except gp.GpNumericalError:
                raise _CorruptState() from None
            for key_codes, value in zip(codes, y, strict=True):
                entry.answers[key_codes.tobytes()] = float(value)
        if entry.path.t != header.t:
            raise _CorruptState()
        entry.version = header.version
    _remember(header.id, entry)
    return entry


def _close(session: Session, header: CateFunction) -> None:
    """Close a function whose state is unreadable, unless the configured state keys are what
    is wrong (``keys.opens``): then raise ``StateKeyMismatch`` (a 500) and keep it open."""
    session.rollback()
    if not keys.opens(session):
        session.rollback()
        raise keys.StateKeyMismatch(keys.MISMATCH)
    locked = session.get(CateFunction, header.id, with_for_update=True, populate_existing=True)
    if locked is not None:
        locked.status = "closed"
        locked.closed_at = _now_iso()
    session.commit()
    forget(header.id)


# ---- evaluation -----------------------------------------------------------------------------


def _finite_basis_values(function_id: str, points: NDArray[np.float64]) -> list[float]:
    """Post-processing of the released coefficients: no lock, no write, no state."""
    entry = _cached(function_id)
    if entry is None:
        try:
            row = read(
                lambda conn: conn.execute(
                    select(CateFunctionSecret.payload, CateFunctionSecret.digest).where(
                        CateFunctionSecret.function_id == function_id
                    )
                ).first()
            )
            if row is None:
                raise _CorruptState()
            fitted = _unseal_fitted(function_id, row.payload, row.digest)
        except _CorruptState:
            with get_sessionmaker()() as session:
                header = session.get(CateFunction, function_id)
                if header is not None:
                    _close(session, header)
            raise FunctionClosed("the function's state is unavailable") from None
        entry = _Entry(version=0, fitted=fitted, path=None)
        _remember(function_id, entry)
    with _blas_threads(1):
        values = entry.fitted.released(entry.fitted.mean(points))
    return [float(v) for v in values]


_HEADER_COLUMNS = (
    CateFunction.id.label("function_id"),
    CateFunction.dataset_id,
    CateFunction.t_max,
    CateFunction.points_per_principal,
    CateFunction.status,
    CateFunction.basis,
    CateFunction.q,
    CateFunction.batch_max,
    CateFunction.public_json,
    Release.status.label("release_status"),
    Release.visible_at,
    Dataset.owner_id,
    Dataset.status.label("dataset_status"),
)
# Built once (statement construction costs more than the query on this path).
_ADMIN_ACCESS = (
    select(*_HEADER_COLUMNS)
    .join(Release, Release.id == CateFunction.id)
    .join(Dataset, Dataset.id == CateFunction.dataset_id)
    .where(CateFunction.id == bindparam("function_id"))
)
_PRINCIPAL_ACCESS = (
    select(
        Principal.id.label("principal_id"),
        Principal.role,
        Principal.name,
        Principal.disabled,
        *_HEADER_COLUMNS,
        Grant.id.label("grant_id"),
    )
    .select_from(Principal)
    .outerjoin(CateFunction, CateFunction.id == bindparam("function_id"))
    .outerjoin(Release, Release.id == CateFunction.id)
    .outerjoin(Dataset, Dataset.id == CateFunction.dataset_id)
    .outerjoin(
        Grant,
        and_(
            Grant.dataset_id == CateFunction.dataset_id,
            Grant.principal_id == Principal.id,
            Grant.revoked.is_(False),
        ),
    )
    .where(Principal.key_hash == bindparam("key_hash"))
)


def _access(conn: Connection, key: str, function_id: str) -> Any:
    """Authenticate the key and read the function's header, release and grant: one query.

    Raises ``Unauthenticated`` for an unknown or disabled key (before anything about the
    function is looked at) and ``NotFound`` for a function the caller may not evaluate.
    """
    row: Any
    if is_admin_key(key):
        row = conn.execute(_ADMIN_ACCESS, {"function_id": function_id}).first()
        granted = True
    else:
        found = conn.execute(
            _PRINCIPAL_ACCESS, {"function_id": function_id, "key_hash": hash_key(key)}
        ).first()
        if found is None or found.disabled:
            raise Unauthenticated(INVALID_KEY)
        row = found if found.function_id is not None else None
        granted = found.owner_id == found.principal_id or (
            Role(found.role) in (Role.ANALYST, Role.CLIENT) and found.grant_id is not None
        )
    if row is None or not granted or row.release_status != "done":
        raise NotFound(FUNCTION_NOT_FOUND)
    if row.visible_at is not None and time.time() < row.visible_at:
        raise NotFound(FUNCTION_NOT_FOUND)  # not visible before its padded completion time
    return row


# One fixed message whether the id is unknown, not granted or not yet visible (nothing about the
# function shows); it says where the other evaluable releases are answered.
FUNCTION_NOT_FOUND = (
    "function not found: a function's id is the id of its cate_function release; an "
    "ebm_cate or uplift_table release is evaluated with POST /v1/releases/{id}/predict"
)


def evaluate_with_key(
    *,
    authorization: str | None,
    function_id: str,
    points: list[list[float]],
    columns: list[str] | None = None,
) -> tuple[list[float], dict[str, Any]]:
    """Answer a batch (in request order) and return the public metadata with it.

    Authentication, access and the header are one autocommit read. Finite-basis functions are
    then evaluated from the per-process copy of their released coefficients (no lock, no
    write); exact mode commits its own transaction before returning (no answer before it is
    durable).
    """
    key = bearer_key(authorization)
    row = read(lambda conn: _access(conn, key, function_id))
    if row.status != "open":
        deleted = row.dataset_status == "deleted" and row.basis in ROW_STATE_BASES
        raise FunctionClosed(ROWS_DELETED if deleted else "the function's state is closed")
    facts = _public_facts(row.function_id, row.q, row.basis, row.batch_max, row.public_json)
    names = facts.public.get("x_names")
    points = in_schema_order(points, columns, names)
    try:
        codes, canonical = validate_points(facts, points)
    except ValidationFailed as error:
        raise in_request_order(error, columns, names) from None
    constant = constant_answer(facts.public)
    if constant is not None:
        return [constant] * len(points), facts.public
    if facts.basis != "exact":
        return _finite_basis_values(function_id, canonical), facts.public
    caller = getattr(row, "principal_id", None) or "admin"
    with get_sessionmaker()() as session:
        try:
            return _evaluate_exact(session, function_id, codes, canonical, caller), facts.public
        except BaseException:
            session.rollback()
            raise


def constant_answer(public: dict[str, Any]) -> float | None:
    """The answer of an anchored function whose DP shrinkage factor is 0 (None otherwise).

    Such a function answers ``anchor + 0 * (...)``, rounded to its public output lattice and
    clipped to its public range, at every point: its DP ATE anchor, whatever the GP path would
    draw. It is served from its public facts, so it neither draws nor stores points and has no
    capacity to reach (a walkthrough's constant function refused its 9th batch of 1000 new
    patients at the exact basis's t_max, every answer the same). Post-processing of public
    release values only."""
    if public.get("shrinkage_factor") != 0.0:
        return None
    anchor, step = public.get("ate_anchor"), public.get("output_lattice")
    if anchor is None:
        return None
    bound = float(public.get("value_bound", math.inf))
    if step is None:  # the ebm basis: no output lattice; its model's sum had missed it by 1e-10
        return float(np.clip(float(anchor), -bound, bound))
    return float(mech.on_output_lattice(np.array([float(anchor)]), float(step), bound)[0])


def _evaluate_exact(
    session: Session,
    function_id: str,
    codes: NDArray[np.int64],
    canonical: NDArray[np.float64],
    caller: str,
) -> list[float]:
    """``caller`` ('admin' or a principal's id) is recorded on the batch of new points it asks
    for, and held to the function's ``points_per_principal``.

    A batch of points this process has answered (or read back) is served from its cache
    without any lock: an answer enters the cache only once its batch is committed, and never
    changes. Otherwise the batch waits for the function's lock at most
    ``FUNCTION_LOCK_TIMEOUT_SECONDS`` (in this process and, on PostgreSQL, for the row lock),
    then answers 503 with ``Retry-After``: a CDS walkthrough's evaluation of answered points
    had waited 13.7 s, and one of new points 43.7 s, behind a held row lock."""
    point_keys = [row.tobytes() for row in codes]
    seen = _cached(function_id)
    known = seen.answers if seen is not None else _answers_read(session, function_id, codes)
    served = [known.get(key) for key in point_keys]
    if all(value is not None for value in served):
        session.rollback()
        return [float(value) for value in served if value is not None]
    session.commit()  # end the read transaction; the locked one starts below

    deadline = time.monotonic() + FUNCTION_LOCK_TIMEOUT_SECONDS
    thread_lock = _thread_lock(function_id)
    if not thread_lock.acquire(timeout=FUNCTION_LOCK_TIMEOUT_SECONDS):
        raise FunctionBusy(FUNCTION_BUSY)
    try:
        # The row lock serialises every process; the thread lock this process's cache. Both
        # waits together stay within the deadline.
        if session.get_bind().dialect.name == "postgresql":
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms < 1:
                raise FunctionBusy(FUNCTION_BUSY)
            session.execute(text(f"SET LOCAL lock_timeout = {left_ms}"))
        try:
            locked = session.execute(
                select(CateFunction)
                .where(CateFunction.id == function_id)
                .with_for_update()
                .execution_options(populate_existing=True)
            ).scalar_one()
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                session.rollback()
                raise FunctionBusy(FUNCTION_BUSY) from None
            raise
        return _evaluate_locked(session, function_id, locked, codes, canonical, point_keys, caller)
    finally:
        thread_lock.release()


# PostgreSQL's SQLSTATE for a lock wait past lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"
FUNCTION_BUSY = (
    "the function is drawing other callers' new points; this batch's new points waited "
    f"{FUNCTION_LOCK_TIMEOUT_SECONDS:g} s: retry after Retry-After seconds (points it has "
    "already answered are served without waiting)"
)

# Answers read back without any lock, for a process whose cache does not hold the function (a
# restart, an eviction, another replica): a batch of answered points is served from them, so a
# bedside lookup never waits behind another caller's new batch. Answers never change, so a
# copy that lacks later batches is only incomplete, never wrong.
_read_answers: OrderedDict[str, dict[bytes, float]] = OrderedDict()
MAX_READ_ANSWERS = 64


def _answers_read(
    session: Session, function_id: str, codes: NDArray[np.int64]
) -> dict[bytes, float]:
    """This process's lock-free copy of a function's stored answers, read once (and again when a
    batch asks for a point it lacks; the locked path then serves it). A batch that does not
    decode leaves it to the locked path, which closes a corrupt function."""
    with _cache_guard:
        copy = _read_answers.get(function_id)
        if copy is not None:
            _read_answers.move_to_end(function_id)
    if copy is not None and all(row.tobytes() in copy for row in codes):
        return copy
    header = session.get(CateFunction, function_id)
    if header is None:
        return {}
    try:
        rows = session.execute(
            select(CateFunctionBatch)
            .where(CateFunctionBatch.function_id == function_id)
            .order_by(CateFunctionBatch.seq)
        ).scalars()
        fresh = _answers_of(_decode_batch(row, header.q) for row in rows)
    except Exception:  # noqa: BLE001 - the locked path checks the state and closes it if corrupt
        return copy or {}
    _keep_newest(_read_answers, function_id, fresh, MAX_READ_ANSWERS)
    return fresh


def _evaluate_locked(
    session: Session,
    function_id: str,
    locked: CateFunction,
    codes: NDArray[np.int64],
    canonical: NDArray[np.float64],
    point_keys: list[bytes],
    caller: str,
) -> list[float]:
    """``_evaluate_exact`` with the function's locks held."""
    if locked.status != "open":
        session.rollback()
        raise FunctionClosed("the function's state is closed")
    try:
        cached = _cached(function_id)
        if cached is None and locked.version > 0:
            # A process that has not built this function's path yet (a restart, the cache
            # evicted it): a batch of points it has answered is read from the stored
            # answers, without the O(t^3) rebuild (9 s at t ~ 9000 on a walkthrough).
            known = _stored_answers(session, locked)
            if all(key in known for key in point_keys):
                session.rollback()
                return [known[key] for key in point_keys]
        behind = locked.t - (cached.path.t if cached and cached.path else 0)
        with _blas_threads(_threads_for(locked.t, behind)):
            entry = _sync(session, locked)
    except _CorruptState:
        _close(session, locked)
        raise FunctionClosed("the function's state is unavailable") from None
    assert entry.path is not None

    new_index: dict[bytes, int] = {}
    for i, key in enumerate(point_keys):
        if key not in entry.answers and key not in new_index:
            new_index[key] = i
    if not new_index:
        session.rollback()
        return [entry.answers[key] for key in point_keys]
    if locked.t + len(new_index) > locked.t_max:
        session.rollback()
        raise FunctionCapacityReached(
            f"this function answers at most {locked.t_max} distinct points and this batch's "
            "new points would pass that; nothing was stored (a batch of points it has "
            "already answered is still served)"
        )
    share = locked.points_per_principal
    if share is not None:
        added = _points_added(session, function_id, caller)
        if added + len(new_index) > share:
            session.rollback()
            raise FunctionCapacityReached(
                f"each caller adds at most {share} new points to this function and this "
                "batch's would take you past that; nothing was stored (points it has "
                "already answered are still served)"
            )
    rows = list(new_index.values())
    new_codes = codes[rows]
    new_points = canonical[rows]
    fitted = entry.fitted
    try:
        with _blas_threads(_threads_for(locked.t, len(rows))):
            draw = entry.path.draw(
                new_points, normals=OpenDPSampler().standard_normal, jitter=locked.jitter
            )
            values = fitted.released(fitted.mean(new_points), draw.values)
    except gp.GpNumericalError:
        session.rollback()
        raise FunctionBatchRejected() from None
    payload = seal(
        _encode_batch(new_codes, draw.values, values, draw.jitters),
        context=f"{function_id}:batch:{locked.version + 1}",
    )
    session.add(
        CateFunctionBatch(
            function_id=function_id,
            seq=locked.version + 1,
            size=len(rows),
            principal_id=caller,
            payload=payload,
            digest=_digest(payload),
        )
    )
    locked.version += 1
    locked.t += len(rows)
    try:
        session.commit()  # durable before any new value leaves the server
    except Exception:
        session.rollback()
        forget(function_id)
        raise
    entry.path.append(draw)
    # Read-ahead doubling with t (never past t_max): the next batches find their factor
    # columns faulted in; past t = batch_max the memory committed stays within twice the used.
    prefault.populate_later(entry.path.ahead(max(locked.batch_max, locked.t)))
    for key, value in zip(new_index, values, strict=True):
        entry.answers[key] = float(value)
    entry.version = locked.version
    return [entry.answers[key] for key in point_keys]


def _points_added(session: Session, function_id: str, caller: str) -> int:
    """New points ``caller`` has added to the function (its batches' sizes)."""
    total = session.execute(
        select(func.coalesce(func.sum(CateFunctionBatch.size), 0)).where(
            CateFunctionBatch.function_id == function_id,
            CateFunctionBatch.principal_id == caller,
        )
    ).scalar_one()
    return int(total)


def state_bytes(session: Session, function_id: str) -> int:
    """Persisted state size in bytes (secret fit plus batch rows); for benchmarks."""
    secret = session.get(CateFunctionSecret, function_id)
    total = len(secret.payload) if secret is not None else 0
    for payload in session.execute(
        select(CateFunctionBatch.payload).where(CateFunctionBatch.function_id == function_id)
    ).scalars():
        total += len(payload)
    return total
