"""Request and response models of releases and quotes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class ReleaseCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: str = Field(description="Release kind, e.g. 'ate'", examples=["ate"])
    params: dict[str, Any] = Field(default_factory=dict)
    fresh: StrictBool = Field(
        default=False,
        description="Force a new, charged release even if an identical one is stored. Without "
        "it, a request identical to one of yours (same dataset version, kind and parameters) "
        "is answered with the newest such release that has not failed, free of charge (200, "
        "cached); concurrent identical requests are charged once.",
    )


class QuoteCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: str
    params: dict[str, Any] = Field(default_factory=dict)


class QuoteRead(BaseModel):
    kind: str
    guarantee: str
    epsilon: float = Field(description="The exact epsilon a release would charge")
    delta: float = Field(description="The exact delta a release would charge")
    fits_budget: bool = Field(
        description="A release would be charged now: the dataset's rows are there, its budget "
        "is set, its remainder covers (epsilon, delta), and so does the caller's own "
        "per-principal cap, if any"
    )
    budget_note: str | None = Field(
        default=None,
        description="Why a release would not be charged now (fits_budget false): the rows were "
        "deleted, the budget is not set, the dataset's remainder or the caller's cap is short "
        "(by how much), or the caller may not spend; null when it fits",
    )
    epsilon_remaining: float = Field(description="Epsilon left in the dataset's budget")
    delta_remaining: float = Field(description="Delta left in the dataset's budget")
    cap_epsilon_remaining: float | None = Field(
        description="Epsilon left under the caller's per-principal cap on this dataset; null "
        "when no epsilon cap applies to the caller (no cap in the grant, or the owner)"
    )
    cap_delta_remaining: float | None = Field(
        description="Delta left under the caller's per-principal cap on this dataset; null "
        "when no delta cap applies to the caller"
    )
    accuracy: dict[str, Any]
    mechanism: dict[str, Any]


class ReleaseError(BaseModel):
    type: str
    title: str
    detail: str


class ReleaseRead(BaseModel):
    id: str
    dataset_id: str
    principal_id: str
    kind: str
    status: str = Field(description="queued, running, done or failed")
    progress: float = Field(
        description="0 while queued; while running a public function of the time since the job "
        "started, 0.99 t / (t + 10 s), never the job's own progress (a timing side channel); 1 "
        "once finished and visible"
    )
    stage: str = Field(description="queued, running, done or failed (as status)")
    guarantee: str
    epsilon: float
    delta: float
    params: dict[str, Any] = Field(
        description="The request's parameters that differ from the kind's defaults (what the "
        "caller set; a parameter left at its default or null is omitted). The values the public "
        "rules chose for omitted ones (estimator, nuisance models, clip, delta, ...) are in "
        "`result` and `mechanism`"
    )
    mechanism: dict[str, Any] = Field(description="The public mechanism record of the charge")
    result: dict[str, Any] | None = None
    error: ReleaseError | None = None
    waiting: str | None = Field(
        default=None,
        description="On a queued release when no job worker has beaten within "
        "CURATOR_JOB_STALE_SECONDS (PostgreSQL, where separate worker processes run the jobs): "
        "why it has not started. Null otherwise, and always on SQLite (the service cannot tell).",
    )
    cached: bool = False
    created_at: str
    started_at: str | None = None
    finished_at: str | None = Field(
        default=None,
        description="The padded completion time (the next public latency bucket after the "
        "start), not the job's real finish",
    )
