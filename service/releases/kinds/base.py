"""The contract every release kind implements. A new kind is one module plus a REGISTRY line.

A kind is a thin adapter between the HTTP layer (pydantic ``Params``) and a pure mechanism in
``service.mechanisms``:

* ``record(params, domain)`` computes the mechanism record (and so the privacy cost) from the
  request and the public domain only; it raises ``InvalidParameters`` / ``PaperModeDisabled``
  before anything is charged.
* ``quote(params, domain)`` returns the public expected-accuracy preview (no data, no charge).
* ``run(arrays, domain, params, rng=..., noise=..., progress=...)`` runs after the charge and
  returns the JSON-able DP result. It must raise ``ReleaseFailed`` (generic) on any failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

from service.mechanisms import versus_ate
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.records import MechanismRecord

Progress = Callable[[float, str], None]


class KindParams(BaseModel):
    """Base of every kind's parameters: unknown fields are refused.

    Every number that shapes the privacy cost or the accuracy (epsilon, delta, alpha, clips,
    shares, fractions, counts, sizes) is declared ``StrictFloat`` / ``StrictInt`` and every
    switch ``StrictBool``: ``true`` is not 1.0 and ``"0.5"`` is not 0.5 (422). Per field, not
    ``ConfigDict(strict=True)``: stored requests are re-validated from their JSON dump, where
    tuples arrive as lists and must still validate. ``tests/unit/test_strict_params.py``
    enumerates every field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# Fields only a quote reads (the width or heterogeneity the analyst aims at): a release ignores
# them, so they are dropped from its stored parameters and request hash (``release_params``). An
# observational walkthrough quoted with a target and released with the same dict: each target
# made a new release identity and a new charge for the same release (0.3 epsilon for three).
QUOTE_ONLY_FIELDS = frozenset({"target_half_width", "expected_heterogeneity_sd"})


def release_params(params: KindParams) -> KindParams:
    """The parameters a release runs and is identified by: ``params`` without its quote-only
    fields (``QUOTE_ONLY_FIELDS`` set back to None)."""
    dropped = {
        name: None
        for name in QUOTE_ONLY_FIELDS
        if name in type(params).model_fields and getattr(params, name) is not None
    }
    return params.model_copy(update=dropped) if dropped else params


class ReleaseKind(Protocol):
    name: ClassVar[str]
    Params: ClassVar[type[KindParams]]

    def record(self, params: Any, domain: PublicDomain) -> MechanismRecord: ...

    def quote(self, params: Any, domain: PublicDomain) -> dict[str, Any]: ...

    def run(
        self,
        arrays: Arrays,
        domain: PublicDomain,
        params: Any,
        *,
        rng: np.random.Generator,
        noise: NoiseSampler,
        progress: Progress,
    ) -> dict[str, Any]: ...


def versus_ate_block(
    request: Any,
    domain: PublicDomain,
    noise_sd: Callable[[Any], float],
    *,
    anchored: bool = False,
    constant: tuple[str, str] | None = None,
    retention: Callable[[Any], float] | None = None,
    detectable: Callable[[Any], float | None] | None = None,
    cap: float | None = None,
    anchor_source: str | None = None,
    noise_label: str | None = None,
) -> dict[str, Any]:
    """A CATE quote's ``versus_ate``: ``noise_sd(request)`` is the kind's public per-prediction
    noise sd for a request, evaluated here at the request's epsilon and at others (the epsilon
    search); the request carries ``epsilon`` and ``expected_heterogeneity_sd``. ``anchored``:
    the release shrinks towards its own DP ATE (shrinkage ``ate``), which the block says.
    ``constant``: (why, what instead) for a release that is one number for every patient by
    construction, whose verdict is ``not_expected`` whatever its noise. ``retention(request)``:
    the share of the heterogeneity the kind's learner keeps (versus_ate), None: all of it.
    ``detectable(request)``: the smallest sd(tau) an anchored release's calibration step detects
    (``ebm_cate.detectable_heterogeneity_sd``), None: not computed."""
    stated = request.expected_heterogeneity_sd
    if stated is not None and stated > domain.outcome_range:
        # tau lies in [-R_Y, R_Y], so its sd is at most R_Y (a re-test's 1e308 was quoted)
        raise InvalidParameters(
            "expected_heterogeneity_sd must be at most the outcome range R_Y = "
            f"{domain.outcome_range:g}: the effect lies within it"
        )
    if constant is not None:
        block = versus_ate.constant_block(
            domain,
            request.epsilon,
            request.expected_heterogeneity_sd,
            reason=constant[0],
            fix=constant[1],
        )
        block["anchored"] = anchored
        return block

    def at(epsilon: float) -> float:
        return noise_sd(request.model_copy(update={"epsilon": epsilon}))

    keep = None
    if retention is not None:

        def keep(epsilon: float) -> float:
            return retention(request.model_copy(update={"epsilon": epsilon}))

    found = None
    if detectable is not None:

        def found(epsilon: float) -> float | None:
            return detectable(request.model_copy(update={"epsilon": epsilon}))

    block = versus_ate.quote_block(
        at,
        domain,
        request.epsilon,
        request.expected_heterogeneity_sd,
        retention_at=keep,
        anchored=anchored,
        detectable_at=found,
        cap=cap,
        anchor_source=anchor_source,
        noise_label=noise_label,
    )
    block["anchored"] = anchored
    return block
