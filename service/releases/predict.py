"""``POST /v1/releases/{id}/predict``: evaluate a stored DP model at public points, for free.

Pure post-processing of a finished ``ebm_cate`` or ``uplift_table`` release's stored DP
artefact (its result): no charge, no ledger entry, never reads the dataset's rows. Points are
validated against the dataset's public box (422 with a JSON pointer per bad coordinate).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from service.auth.service import CurrentCaller
from service.datasets import service as datasets
from service.db.engine import SessionDep
from service.db.models import Dataset
from service.mechanisms import ebm_cate, uplift
from service.points import (
    COLUMNS_DESCRIPTION,
    Columns,
    Point,
    at_most,
    in_request_order,
    in_schema_order,
)
from service.problems import Forbidden, NotFound, Unauthenticated, ValidationFailed, responses
from service.releases import service
from service.releases.kinds.cate_vector import check_points

router = APIRouter(tags=["releases"])

MAX_POINTS = 10_000
PREDICTORS = {"ebm_cate": ebm_cate.predict, "uplift_table": uplift.predict}


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    points: Annotated[list[Point], at_most(MAX_POINTS)] = Field(min_length=1, max_length=MAX_POINTS)
    columns: Columns | None = Field(default=None, description=COLUMNS_DESCRIPTION)


class PredictRead(BaseModel):
    release_id: str
    kind: str
    guarantee: str
    predictions: list[float]
    shrinkage_factor: float | None = Field(
        default=None,
        description="An anchored model's DP shrinkage factor in [0, 1] (null: unanchored). At "
        "0 every prediction is ate_anchor, the same for every patient.",
    )
    ate_anchor: float | None = Field(
        default=None, description="The DP ATE an anchored model falls back to (null: none)."
    )


@router.post(
    "/v1/releases/{release_id}/predict",
    response_model=PredictRead,
    responses=responses(Unauthenticated, Forbidden, NotFound, ValidationFailed),
    summary="CATE of a stored ebm_cate / uplift_table release at public points (free)",
)
def predict(
    session: SessionDep, caller: CurrentCaller, release_id: str, body: PredictRequest
) -> PredictRead:
    release = service.readable(session, caller=caller, release_id=release_id)
    view = service.view(release)  # applies the latency padding
    if view.status != "done" or view.result is None:
        raise NotFound("no finished release with a stored model")
    predictor = PREDICTORS.get(release.kind)
    if predictor is None:
        hint = (
            f"; a cate_function is evaluated with POST /v1/functions/{release.id}/evaluate"
            if release.kind == "cate_function"
            else ""
        )
        raise ValidationFailed(
            f"releases of kind '{release.kind}' cannot be evaluated here; this endpoint "
            f"evaluates {' and '.join(sorted(PREDICTORS))} releases{hint}"
        )
    dataset = session.get(Dataset, release.dataset_id)
    if dataset is None:
        raise NotFound("release not found")
    domain = datasets.domain_of(dataset)
    points = in_schema_order(body.points, body.columns, domain.names)
    try:
        check_points(points, domain, "#/points/")
    except ValidationFailed as error:
        raise in_request_order(error, body.columns, domain.names) from None
    result: dict[str, Any] = json.loads(release.result_json or "{}")
    values = predictor(result, np.asarray(points, dtype=np.float64))
    return PredictRead(
        release_id=release.id,
        kind=release.kind,
        guarantee=release.guarantee,
        predictions=[float(v) for v in values],
        shrinkage_factor=_optional_float(result.get("shrinkage_factor")),
        ate_anchor=_optional_float(result.get("ate_anchor")),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
