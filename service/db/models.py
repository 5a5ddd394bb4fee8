"""ORM models. Tables are singular snake_case with explicit constraint names.

Privacy amounts are integers in fixed units (see ``service.ledger.amounts``): exact on both
SQLite and PostgreSQL, never floats.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.elements import TextClause

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


# The rows of ``uq_release_reuse_key``: releases that may answer an identical request.
REUSABLE: TextClause = text("reuse_key IS NOT NULL AND status != 'failed'")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Principal(Base):
    __tablename__ = "principal"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key_prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[str] = mapped_column(String(40))
    created_by: Mapped[str | None] = mapped_column(String(32), nullable=True)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    # The head of the principal's event chain (``PrincipalEvent``): how many events, and the
    # last one's hash (None before the first). Verification compares the chain with these, so a
    # removed last event shows.
    event_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_event_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)

    __table_args__ = (CheckConstraint("role IN ('owner', 'analyst', 'client')", name="role_valid"),)


class PrincipalEvent(Base):
    """Append-only, hash-chained record of a principal's account events: its creation, each
    disable and enable, each key replacement, with who did it (``service.auth.events``)."""

    __tablename__ = "principal_event"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    principal_id: Mapped[str] = mapped_column(ForeignKey("principal.id"))
    seq: Mapped[int] = mapped_column(Integer)
    event: Mapped[str] = mapped_column(String(16))
    actor_id: Mapped[str] = mapped_column(String(32))
    key_prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[str] = mapped_column(String(40))
    prev_hash: Mapped[str] = mapped_column(String(64))
    row_hash: Mapped[str] = mapped_column(String(64))

    __table_args__ = (
        UniqueConstraint("principal_id", "seq", name="uq_principal_event_principal_seq"),
        CheckConstraint(
            "event IN ('created', 'disabled', 'enabled', 'key_replaced')", name="event_valid"
        ),
    )


class Dataset(Base):
    __tablename__ = "dataset"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[str] = mapped_column(ForeignKey("principal.id"))
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    schema_json: Mapped[str] = mapped_column(Text)
    schema_hash: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer, default=1)
    n: Mapped[int] = mapped_column(Integer)
    q: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="ready")
    allow_paper_mode: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[str] = mapped_column(String(40))
    rows_deleted_at: Mapped[str | None] = mapped_column(String(40), nullable=True)

    __table_args__ = (CheckConstraint("status IN ('ready', 'deleted')", name="status_valid"),)


class DatasetChunk(Base):
    """The stored rows: a float64 matrix [X | A | Y] in .npy chunks. Never returned."""

    __tablename__ = "dataset_chunk"

    dataset_id: Mapped[str] = mapped_column(
        ForeignKey("dataset.id", ondelete="CASCADE"), primary_key=True
    )
    chunk_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Budget(Base):
    """The per-dataset global cap and what has been spent. Only ``service.ledger`` writes it."""

    __tablename__ = "budget"

    dataset_id: Mapped[str] = mapped_column(ForeignKey("dataset.id"), primary_key=True)
    is_set: Mapped[bool] = mapped_column(Boolean, default=False)
    epsilon_total: Mapped[int] = mapped_column(BigInteger, default=0)
    delta_total: Mapped[int] = mapped_column(BigInteger, default=0)
    epsilon_spent: Mapped[int] = mapped_column(BigInteger, default=0)
    delta_spent: Mapped[int] = mapped_column(BigInteger, default=0)
    # Number of ledger entries so far: the next entry's sequence number.
    entries: Mapped[int] = mapped_column(Integer, default=0)
    last_hash: Mapped[str] = mapped_column(String(64))

    __table_args__ = (
        CheckConstraint(
            "epsilon_spent >= 0 AND delta_spent >= 0 AND epsilon_spent <= epsilon_total "
            "AND delta_spent <= delta_total",
            name="spent_within_total",
        ),
    )


class Grant(Base):
    """Access of a principal to a dataset, with an optional per-principal cap."""

    __tablename__ = "dataset_grant"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("dataset.id"))
    principal_id: Mapped[str] = mapped_column(ForeignKey("principal.id"))
    epsilon_cap: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    delta_cap: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    epsilon_spent: Mapped[int] = mapped_column(BigInteger, default=0)
    delta_spent: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[str] = mapped_column(String(40))
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)

    __table_args__ = (
        UniqueConstraint("dataset_id", "principal_id", name="uq_dataset_grant_dataset_principal"),
        CheckConstraint(
            "(epsilon_cap IS NULL OR epsilon_spent <= epsilon_cap) AND "
            "(delta_cap IS NULL OR delta_spent <= delta_cap)",
            name="spent_within_cap",
        ),
    )


class LedgerEntry(Base):
    """Append-only, hash-chained record of every budget event of a dataset."""

    __tablename__ = "ledger_entry"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("dataset.id"))
    seq: Mapped[int] = mapped_column(Integer)
    entry_type: Mapped[str] = mapped_column(String(16))
    principal_id: Mapped[str] = mapped_column(String(32))
    release_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    epsilon: Mapped[int] = mapped_column(BigInteger)
    delta: Mapped[int] = mapped_column(BigInteger)
    epsilon_spent: Mapped[int] = mapped_column(BigInteger)
    delta_spent: Mapped[int] = mapped_column(BigInteger)
    epsilon_total: Mapped[int] = mapped_column(BigInteger)
    delta_total: Mapped[int] = mapped_column(BigInteger)
    guarantee: Mapped[str | None] = mapped_column(String(16), nullable=True)
    details_json: Mapped[str] = mapped_column(Text)
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at: Mapped[str] = mapped_column(String(40))
    prev_hash: Mapped[str] = mapped_column(String(64))
    row_hash: Mapped[str] = mapped_column(String(64))

    __table_args__ = (
        UniqueConstraint("dataset_id", "seq", name="uq_ledger_entry_dataset_seq"),
        CheckConstraint(
            "entry_type IN ('create', 'budget', 'grant', 'charge', 'rows_deleted', 'settings')",
            name="entry_type_valid",
        ),
    )


class Release(Base):
    """A requested release: its charge, its job state and, once done, its DP result."""

    __tablename__ = "release"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("dataset.id"))
    principal_id: Mapped[str] = mapped_column(ForeignKey("principal.id"))
    kind: Mapped[str] = mapped_column(String(32))
    params_json: Mapped[str] = mapped_column(Text)
    request_hash: Mapped[str] = mapped_column(String(64))
    # The request's hash when it may be reused (no ``fresh``), else NULL. A partial unique index
    # admits one live (not failed) release per (dataset, principal, reuse_key): concurrent
    # identical requests cannot each be charged, the losers' inserts fail and they are reused.
    reuse_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    idempotency_key: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    stage: Mapped[str] = mapped_column(String(64), default="queued")
    guarantee: Mapped[str] = mapped_column(String(16))
    epsilon: Mapped[int] = mapped_column(BigInteger)
    delta: Mapped[int] = mapped_column(BigInteger)
    record_json: Mapped[str] = mapped_column(Text)
    result_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[str] = mapped_column(String(40))
    started_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    finished_at: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # Monotonic-clock-free padding: the result becomes visible at this wall time.
    visible_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Set (durably, by the claiming worker) just before the job reads the rows: from then on
    # noise may have been drawn, so a job cut off by a crash is failed with its charge kept.
    # A job cut off before it is re-queued and runs again (the charge answers one release).
    data_read_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Why a release failed: a public reason code (service.jobs.execute.FAILURES), never data.
    failure: Mapped[str | None] = mapped_column(String(32), nullable=True)
    ledger_seq: Mapped[int] = mapped_column(Integer)

    __table_args__ = (
        UniqueConstraint(
            "dataset_id", "principal_id", "idempotency_key", name="uq_release_idempotency"
        ),
        CheckConstraint("status IN ('queued', 'running', 'done', 'failed')", name="status_valid"),
        Index("ix_release_status", "status"),
        Index("ix_release_dataset_hash", "dataset_id", "request_hash"),
        Index(
            "uq_release_reuse_key",
            "dataset_id",
            "principal_id",
            "reuse_key",
            unique=True,
            sqlite_where=REUSABLE,
            postgresql_where=REUSABLE,
        ),
    )


class CateFunction(Base):
    """A released CATE function's public header; its row lock serialises evaluations.

    ``version`` counts appended batches (``cate_function_batch.seq`` runs 1..version), ``t`` the
    distinct stored points. Per-process caches compare ``version`` under the lock.
    """

    __tablename__ = "cate_function"

    id: Mapped[str] = mapped_column(ForeignKey("release.id"), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("dataset.id"))
    status: Mapped[str] = mapped_column(String(16), default="open")
    basis: Mapped[str] = mapped_column(String(16))
    q: Mapped[int] = mapped_column(Integer)
    t_max: Mapped[int] = mapped_column(Integer)
    # the most new distinct points one caller may add (exact basis; None: only t_max)
    points_per_principal: Mapped[int | None] = mapped_column(Integer, nullable=True)
    batch_max: Mapped[int] = mapped_column(Integer)
    jitter: Mapped[float] = mapped_column(Float)
    t: Mapped[int] = mapped_column(Integer, default=0)
    version: Mapped[int] = mapped_column(Integer, default=0)
    public_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(String(40))
    closed_at: Mapped[str | None] = mapped_column(String(40), nullable=True)

    __table_args__ = (
        CheckConstraint("status IN ('open', 'closed')", name="status_valid"),
        CheckConstraint("t >= 0 AND t <= t_max AND version >= 0", name="counts_valid"),
    )


class StateKeyCheck(Base):
    """One value sealed under the state key in force (``service.functions.keys``): a process
    whose configured keys cannot open it refuses to start, instead of closing every released
    function as corrupt at its first evaluation."""

    __tablename__ = "state_key_check"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    sealed_at: Mapped[str] = mapped_column(String(40))


class CateFunctionSecret(Base):
    """The fitted function g* (or the noised finite-basis coefficients). Never returned."""

    __tablename__ = "cate_function_secret"

    function_id: Mapped[str] = mapped_column(
        ForeignKey("cate_function.id", ondelete="CASCADE"), primary_key=True
    )
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    digest: Mapped[str] = mapped_column(String(64))


class CateFunctionBatch(Base):
    """One answered batch of new distinct points: canonical codes, unit noise, values, jitters.

    Secret (the noise values plus the answers reveal g*). Appended under the header's lock.
    """

    __tablename__ = "cate_function_batch"

    function_id: Mapped[str] = mapped_column(
        ForeignKey("cate_function.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    # who asked for the batch's new points ('admin' or a principal's id); None: the reference
    # points drawn at release time, and batches stored before this was recorded
    principal_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    digest: Mapped[str] = mapped_column(String(64))
