"""The ``cate_vector`` release kind: DP-CATE at d public query points (one charge per vector).

``strict`` (default): DP-EBM nuisances and an output-perturbed ridge second stage with a proven
global sensitivity (docs/proofs/cate_vector.md). ``paper``: Schroeder et al.'s Theorem 1 with a
data-dependent influence-function scale, only where the owner set ``allow_paper_mode``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, StrictFloat, StrictInt

from service.mechanisms import cate_vector
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.records import MechanismRecord
from service.problems import ValidationFailed
from service.releases.kinds.base import KindParams, Progress, versus_ate_block


class CateVectorRequest(KindParams):
    """Request parameters of a ``cate_vector`` release."""

    points: list[list[StrictFloat]] = Field(min_length=1, max_length=cate_vector.MAX_POINTS)
    epsilon: StrictFloat = Field(gt=0, allow_inf_nan=False)
    # None: README §1.7 default, min(1e-5, 1 / (10 * smallest fold size)).
    delta: StrictFloat | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    learner: Literal["r", "dr"] = "r"
    mode: Literal["strict", "paper"] = "strict"
    propensity_clip: StrictFloat = Field(default=0.05, gt=0, le=0.5, allow_inf_nan=False)
    pseudo_outcome_clip: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)
    # None: strict, the public rule cate_vector.suggested_ridge (smallest of 0.1, 0.3, 1, 3 whose
    # quoted noise-sd bound is <= 0.2 R_Y); paper, 0.001.
    ridge: StrictFloat | None = Field(default=None, ge=cate_vector.MIN_RIDGE, allow_inf_nan=False)
    n_features: StrictInt = Field(default=50, ge=1, le=cate_vector.MAX_FEATURES)
    lengthscale: StrictFloat = Field(default=0.3, gt=0, allow_inf_nan=False)
    fold_fractions: tuple[StrictFloat, ...] | None = Field(default=None, min_length=2, max_length=3)
    # "ate" (strict default): spend 20 % of the estimation budget on a DP ATE, fit the CATE as
    # deviations from it and shrink them toward it (James–Stein with the public noise
    # variances), so a noisy CATE falls back to the ATE. "none": the raw ridge release.
    shrinkage: Literal["ate", "none"] | None = None
    # Quote only: the heterogeneity sd(tau) you expect, for the quote's verdict against the
    # constant ATE (versus_ate); None: the public default R_Y / 24. Ignored by a release.
    expected_heterogeneity_sd: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)


def check_points(points: list[list[float]], domain: PublicDomain, prefix: str) -> None:
    """422 with a JSON pointer per offending coordinate (e.g. ``#/params/points/3/0``)."""
    errors = [
        {"pointer": prefix + "/".join(str(p) for p in path), "detail": message}
        for path, message in cate_vector.point_errors(points, domain)
    ]
    if errors:
        raise ValidationFailed(
            "query points must lie inside the public covariate box", errors=errors
        )


def to_mechanism_params(
    params: CateVectorRequest, domain: PublicDomain
) -> cate_vector.CateVectorParams:
    check_points(params.points, domain, "#/params/points/")
    delta = params.delta
    if delta is None:
        delta = cate_vector.default_delta_for(domain, params.mode, params.fold_fractions)
    mech = cate_vector.CateVectorParams(
        points=tuple(tuple(p) for p in params.points),
        epsilon=params.epsilon,
        delta=delta,
        learner=params.learner,
        mode=params.mode,
        propensity_clip=params.propensity_clip,
        pseudo_outcome_clip=params.pseudo_outcome_clip,
        n_features=params.n_features,
        lengthscale=params.lengthscale,
        fold_fractions=params.fold_fractions,
        anchor=(params.shrinkage or ("ate" if params.mode == "strict" else "none")) == "ate",
    )
    if params.ridge is not None:
        return replace(mech, ridge=params.ridge)
    return replace(mech, ridge=cate_vector.suggested_ridge(domain, mech))


class CateVectorKind:
    """Adapter between the HTTP layer and ``service.mechanisms.cate_vector``."""

    name: ClassVar[str] = "cate_vector"
    Params: ClassVar[type[KindParams]] = CateVectorRequest

    def record(self, params: Any, domain: PublicDomain) -> MechanismRecord:
        """The mechanism record and cost, from public inputs only."""
        return cate_vector.plan(domain, to_mechanism_params(_as_params(params), domain))

    def quote(self, params: Any, domain: PublicDomain) -> dict[str, Any]:
        """Public accuracy preview (no data access): strict, an upper bound on every
        coordinate's noise sd; paper, public lower and upper bounds on its data-dependent sd."""
        request = _as_params(params)
        checked = to_mechanism_params(request, domain)
        out = cate_vector.quote(domain, checked)
        out["versus_ate"] = versus_ate_block(
            request, domain, lambda r: _noise_sd(r, domain), anchored=checked.anchor
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
        """Run after the charge; ``ReleaseFailed`` on any data-time failure."""
        return cate_vector.run(
            arrays,
            domain,
            to_mechanism_params(_as_params(params), domain),
            rng=rng,
            noise=noise,
            progress=progress,
        )


def _as_params(params: Any) -> CateVectorRequest:
    if isinstance(params, CateVectorRequest):
        return params
    return CateVectorRequest.model_validate(params)


def _noise_sd(request: CateVectorRequest, domain: PublicDomain) -> float:
    """Public per-prediction privacy-noise sd of a request (RMS over the query points)."""
    return cate_vector.rms_noise_sd(domain, to_mechanism_params(request, domain))
