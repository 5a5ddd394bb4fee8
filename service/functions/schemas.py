"""Request and response models of function evaluation."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from service.datasets.schemas import CovariateInfo, OutcomeInfo, TreatmentInfo
from service.mechanisms.cate_function import MAX_BATCH
from service.points import COLUMNS_DESCRIPTION, Columns, Point, at_most


class EvaluateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    points: Annotated[list[Point], at_most(MAX_BATCH)] = Field(
        description="Points in the dataset's covariate units, each inside the public box, a "
        "categorical covariate at one of its codes (the function's public x_codes); at most the "
        "function's batch_max (itself at most 1000).",
        examples=[[[50.0, 0.5, 1.0]]],
        min_length=1,
        max_length=MAX_BATCH,
    )
    columns: Columns | None = Field(default=None, description=COLUMNS_DESCRIPTION)


class EvaluateRead(BaseModel):
    function_id: str
    values: list[float] = Field(description="DP values of the released function, in order.")
    guarantee: str
    pointwise_noise_sd: float | None = Field(
        default=None,
        description="Kernel bases, strict mode: the public sd of the fitted function's privacy "
        "noise at any point, before shrinkage (an answer carries shrinkage_factor times it, plus "
        "the anchor's error); null on the ebm basis.",
    )
    shrinkage_factor: float | None = Field(
        default=None,
        description="An anchored function's DP shrinkage factor in [0, 1]: an answer is the "
        "anchor plus this factor times the fitted function and its noise, so its privacy noise "
        "sd is this factor times pointwise_noise_sd; at 0 every answer is the DP ATE anchor "
        "(its ate_anchor_interval is then the error bar, where the anchor has one) and "
        "pointwise_noise_sd is not in the answer. Null: not anchored.",
    )
    ate_anchor: float | None = Field(
        default=None, description="The DP ATE an anchored function falls back to (null: none)."
    )
    ate_anchor_interval: dict[str, float] | None = Field(
        default=None,
        description="The anchor's own confidence interval for the ATE (lower, upper, level), "
        "where the anchor is an ate release on all rows (null otherwise): at shrinkage factor 0 "
        "the error bar of every answer as an ATE, not a range for one patient's effect.",
    )


class FunctionRead(BaseModel):
    id: str
    dataset_id: str
    status: str
    basis: str
    q: int
    t_max: int | None
    points_per_principal: int | None = Field(
        default=None,
        description="Exact basis: the most new distinct points any one caller may add "
        "(null: only t_max bounds them).",
    )
    batch_max: int
    covariates: list[str] | None = Field(
        default=None,
        description="The covariates' names in schema order, the order of a point's "
        "coordinates (null for a function released before they were recorded).",
    )
    covariate_info: list[CovariateInfo] | None = Field(
        default=None,
        description="Per covariate, in the order of a point's coordinates: its type, unit, "
        "bounds and (categorical) codes with their labels, from the dataset's public schema.",
    )
    outcome: OutcomeInfo | None = Field(
        default=None,
        description="The outcome the effects are measured on (name, unit, bounds): an answer "
        "is an expected change in this outcome, in its unit.",
    )
    treatment: TreatmentInfo | None = Field(
        default=None,
        description="The treatment column: an answer is the outcome under code 1 minus the "
        "outcome under code 0 (code_labels say what each means, where the owner declared it).",
    )
    public: dict[str, Any]
