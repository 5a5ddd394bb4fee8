"""The ``uplift_table`` release kind: epsilon-ADUM on a public grid or DP k-means cells (pure DP).

Exception: the default (shrinkage "ate") on a one-cell grid of an observational dataset is the
strict DP AIPW ATE at its public defaults, (epsilon, delta)-DP with the ``ate`` kind's default
delta (docs/proofs/uplift_table.md step 6): one cell adjusts for no covariate.

Predictions at public points are free lookups via ``POST /v1/releases/{id}/predict``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, StrictBool, StrictFloat, StrictInt

from service.mechanisms import uplift
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.records import MechanismRecord
from service.releases.kinds.base import KindParams, Progress, versus_ate_block


class UpliftTableRequest(KindParams):
    """Request parameters of an ``uplift_table`` release."""

    epsilon: StrictFloat = Field(gt=0, allow_inf_nan=False)
    bins: list[StrictInt] | None = Field(
        default=None,
        min_length=1,
        description="cells per covariate of the regular grid; omitted (grid): the public "
        "partition-size rule's suggestion at this epsilon (uplift.default_bins)",
    )
    min_count: StrictFloat = Field(default=1.0, ge=1.0, allow_inf_nan=False)
    low_count_threshold: StrictFloat = Field(default=10.0, gt=0, allow_inf_nan=False)
    adjustment_partition: StrictBool = False
    partition: Literal["grid", "kmeans"] = "grid"
    clusters: StrictInt | None = Field(
        default=None, ge=1, description="k-means cells (kmeans only)"
    )
    kmeans_share: StrictFloat = Field(default=0.5, gt=0, lt=1, allow_inf_nan=False)
    kmeans_iterations: StrictInt = Field(default=5, ge=1, le=20)
    # "ate" (default): the cell uplifts are shrunk toward the table's own DP ATE (their
    # count-weighted mean) by a James–Stein factor against their privacy and sampling variance
    # (10 % of the table's epsilon buys the arms' DP second moments when there are >= 2 cells),
    # so cell differences the noise can explain fall back to that ATE. One grid cell (the
    # default grid on many covariates) on an observational dataset: the release is the strict
    # DP AIPW ATE at its defaults (the whole epsilon, the ate kind's default delta; no
    # adjustment_partition needed), since one cell adjusts for nothing. "none": the raw table.
    shrinkage: Literal["ate", "none"] | None = None
    # Quote only: the heterogeneity sd(tau) you expect, for the quote's verdict against the
    # constant ATE (versus_ate); None: the public default R_Y / 24. Ignored by a release.
    expected_heterogeneity_sd: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)


def to_mechanism_params(params: UpliftTableRequest, domain: PublicDomain) -> uplift.UpliftParams:
    bins = tuple(params.bins or ())
    if not bins and params.partition == "grid":
        bins = uplift.default_bins(domain, params.epsilon)
    return uplift.UpliftParams(
        epsilon=params.epsilon,
        bins=bins,
        min_count=params.min_count,
        low_count_threshold=params.low_count_threshold,
        adjustment_partition=params.adjustment_partition,
        partition=params.partition,
        clusters=params.clusters or 0,
        kmeans_share=params.kmeans_share,
        kmeans_iterations=params.kmeans_iterations,
        shrinkage=params.shrinkage,
    )


class UpliftTableKind:
    """Adapter between the HTTP layer and ``service.mechanisms.uplift``."""

    name: ClassVar[str] = "uplift_table"
    Params: ClassVar[type[KindParams]] = UpliftTableRequest

    def record(self, params: Any, domain: PublicDomain) -> MechanismRecord:
        """The mechanism record and cost (epsilon, 0), from public inputs only."""
        return uplift.plan(domain, to_mechanism_params(_as_params(params), domain))

    def quote(self, params: Any, domain: PublicDomain) -> dict[str, Any]:
        """Noise scales, expected per-cell uplift sd, and the partition-size heuristic."""
        request = _as_params(params)
        out = uplift.quote(domain, to_mechanism_params(request, domain))
        out["versus_ate"] = versus_ate_block(
            request,
            domain,
            lambda r: _noise_sd(r, domain),
            anchored=out["shrinkage"] == "ate",
            constant=_one_cell(out),
        )
        return out

    def run(
        self,
        arrays: Arrays,
        domain: PublicDomain,
        params: Any,
        *,
        rng: np.random.Generator,
        noise: NoiseSampler,
        progress: Progress,
    ) -> dict[str, Any]:
        """Release the table after the charge; ``ReleaseFailed`` on any data-time failure."""
        return uplift.run(
            arrays,
            domain,
            to_mechanism_params(_as_params(params), domain),
            noise=noise,
            progress=progress,
            rng=rng,
        )


def _as_params(params: Any) -> UpliftTableRequest:
    if isinstance(params, UpliftTableRequest):
        return params
    return UpliftTableRequest.model_validate(params)


def _one_cell(quoted: dict[str, Any]) -> tuple[str, str] | None:
    """(why, what instead) for a one-cell table, which is one number for every patient."""
    if quoted["cells"] != 1:
        return None
    instead = "request ebm_cate or cate_function, which adjust for every covariate"
    if quoted.get("anchor") == "adjusted_ate":
        return (
            "a one-cell table on an observational dataset is the strict DP ATE itself "
            "(proof step 6)",
            instead,
        )
    return (
        "a table of one cell is one uplift for all",
        "give bins over the covariates you expect to modify the effect (at least 2 cells), "
        f"or {instead}",
    )


def _noise_sd(request: UpliftTableRequest, domain: PublicDomain) -> float:
    """Public per-prediction privacy-noise sd of a request (approx_uplift_sd_per_cell)."""
    quoted = uplift.quote(domain, to_mechanism_params(request, domain))
    return float(quoted["approx_uplift_sd_per_cell"])
