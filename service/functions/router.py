"""HTTP routes of released functions. Evaluations never charge budget."""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Header
from starlette.concurrency import run_in_threadpool

from service.functions import service
from service.functions.schemas import EvaluateRead, EvaluateRequest, FunctionRead
from service.problems import (
    FunctionBatchRejected,
    FunctionCapacityReached,
    FunctionClosed,
    NotFound,
    Unauthenticated,
    ValidationFailed,
    responses,
)

router = APIRouter(tags=["functions"])


@router.get(
    "/v1/functions/{function_id}",
    response_model=FunctionRead,
    responses=responses(Unauthenticated, NotFound),
    summary="Public metadata of a released function (its id is the release id)",
)
async def read_function(
    function_id: str, authorization: Annotated[str | None, Header()] = None
) -> FunctionRead:
    view = await run_in_threadpool(
        partial(service.view_with_key, authorization=authorization, function_id=function_id)
    )
    return FunctionRead(**view)


@router.post(
    "/v1/functions/{function_id}/evaluate",
    response_model=EvaluateRead,
    responses=responses(
        Unauthenticated,
        NotFound,
        ValidationFailed,
        FunctionClosed,
        FunctionCapacityReached,
        FunctionBatchRejected,
    ),
    summary="Evaluate a released CATE function at points (free: no budget is charged)",
)
async def evaluate(
    function_id: str,
    body: EvaluateRequest,
    authorization: Annotated[str | None, Header()] = None,
) -> EvaluateRead:
    # A request without a valid key never gets here: the body middleware (service.main)
    # answers 401 before the body is read.
    # The hot path of decision support: authentication, access, the header and the answer in
    # one worker-thread hop (not one hop per dependency) and, for finite bases, one read.
    values, public = await run_in_threadpool(
        partial(
            service.evaluate_with_key,
            authorization=authorization,
            function_id=function_id,
            points=body.points,
            columns=body.columns,
        )
    )
    return EvaluateRead(
        function_id=function_id,
        values=values,
        guarantee=str(public.get("guarantee", "")),
        pointwise_noise_sd=public.get("pointwise_noise_sd"),
        shrinkage_factor=public.get("shrinkage_factor"),
        ate_anchor=public.get("ate_anchor"),
        ate_anchor_interval=public.get("ate_anchor_interval"),
    )
