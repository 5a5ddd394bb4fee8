"""The ``ate`` release kind: a DP average treatment effect with a confidence interval.

Strict mode only for now (``service.mechanisms.ate_strict``, ate_ci.md §3); paper mode
(PrivATE, ate_ci.md §2) is a later issue and is refused at validation.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from service.mechanisms import ate_strict
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.records import MechanismRecord
from service.releases.kinds.base import KindParams, Progress


class AteParams(KindParams):
    """Request parameters of an ``ate`` release (validated again by the mechanism)."""

    mode: Literal["strict"] = "strict"
    epsilon: float = Field(gt=0, allow_inf_nan=False)
    # None: README §1.7 default, min(1e-5, 1 / (10 * smallest fold size)).
    delta: float | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    alpha: float = Field(default=0.05, gt=0, lt=1, allow_inf_nan=False)
    propensity_clip: float = Field(default=0.1, gt=0, le=0.5, allow_inf_nan=False)
    pseudo_outcome_clip: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # None: the design's default ((0.25, 0.25, 0.5) observational; (0.5, 0.5) RCT; (1.0,) RCT
    # with nuisance "none").
    fold_fractions: tuple[float, ...] | None = Field(default=None, min_length=1, max_length=3)
    mean_share: float = Field(default=0.8, gt=0, lt=1, allow_inf_nan=False)
    variance_inflation: bool = False
    alpha_v: float = Field(default=0.05, gt=0, lt=1, allow_inf_nan=False)
    nuisance: Literal["dp_ebm", "none"] = "dp_ebm"
    # Quote only: also return the epsilon needed for this CI half-width. Ignored by a release.
    target_half_width: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @field_validator("mode", mode="before")
    @classmethod
    def _strict_only(cls, value: object) -> object:
        if value != "strict":
            raise ValueError(
                "only mode='strict' is available for the ate kind; paper mode (PrivATE) is "
                "not implemented yet"
            )
        return value


def to_mechanism_params(params: AteParams, domain: PublicDomain) -> ate_strict.AteStrictParams:
    """Map request parameters to the mechanism's, filling the public default delta."""
    delta = params.delta
    if delta is None:
        delta = ate_strict.default_delta_for(domain, params.fold_fractions, params.nuisance)
    return ate_strict.AteStrictParams(
        epsilon=params.epsilon,
        delta=delta,
        alpha=params.alpha,
        propensity_clip=params.propensity_clip,
        pseudo_outcome_clip=params.pseudo_outcome_clip,
        fold_fractions=params.fold_fractions,
        mean_share=params.mean_share,
        variance_inflation=params.variance_inflation,
        alpha_v=params.alpha_v,
        nuisance=params.nuisance,
    )


class AteKind:
    """Adapter between the HTTP layer and ``service.mechanisms.ate_strict``."""

    name: ClassVar[str] = "ate"
    Params: ClassVar[type[KindParams]] = AteParams

    def record(self, params: Any, domain: PublicDomain) -> MechanismRecord:
        """The release's mechanism record and cost, from public inputs only."""
        return ate_strict.plan(domain, to_mechanism_params(_as_params(params), domain))

    def quote(self, params: Any, domain: PublicDomain) -> dict[str, Any]:
        """Public accuracy preview (minimum CI half-width; optionally the epsilon for a target)."""
        checked = _as_params(params)
        return ate_strict.quote(
            domain,
            to_mechanism_params(checked, domain),
            target_half_width=checked.target_half_width,
        )

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
        """Run the release after the charge; raises ``ReleaseFailed`` on any data-time failure."""
        return ate_strict.run(
            arrays,
            domain,
            to_mechanism_params(_as_params(params), domain),
            rng=rng,
            noise=noise,
            progress=progress,
        )


def _as_params(params: Any) -> AteParams:
    if isinstance(params, AteParams):
        return params
    return AteParams.model_validate(params)
