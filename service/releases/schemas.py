"""Request and response models of releases and quotes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class ReleaseCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="Release kind, e.g. 'ate'", examples=["ate"])
    params: dict[str, Any] = Field(default_factory=dict)
    fresh: StrictBool = Field(
        default=False,
        description="Force a new, charged release even if an identical one is stored.",
    )


class QuoteCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str
    params: dict[str, Any] = Field(default_factory=dict)


class QuoteRead(BaseModel):
    kind: str
    guarantee: str
    epsilon: float
    delta: float
    fits_budget: bool
    epsilon_remaining: float
    delta_remaining: float
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
    progress: float
    stage: str
    guarantee: str
    epsilon: float
    delta: float
    params: dict[str, Any]
    mechanism: dict[str, Any] = Field(description="The public mechanism record of the charge")
    result: dict[str, Any] | None = None
    error: ReleaseError | None = None
    cached: bool = False
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
