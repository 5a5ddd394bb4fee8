"""The ``cate_vector`` release kind: DP-CATE at d public query points (one charge per vector).

``strict`` (default): DP-EBM nuisances and an output-perturbed ridge second stage with a proven
global sensitivity (docs/proofs/cate_vector.md), or, where the public estimator rule picks it,
the strict ``ebm_cate`` release (DP-EBM DR learner) evaluated at the points (post-processing;
docs/proofs/cate_vector.md §9). ``paper``: Schroeder et al.'s Theorem 1 with a data-dependent
influence-function scale, only where the owner set ``allow_paper_mode``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, StrictFloat, StrictInt

from service.mechanisms import cate_vector, ebm_cate
from service.mechanisms.domain import Arrays, PublicDomain, points_summary
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.records import MechanismRecord
from service.problems import ValidationFailed
from service.releases.kinds import ebm_cate as ebm_kind
from service.releases.kinds.base import KindParams, Progress, versus_ate_block

Estimator = Literal["ridge", "ebm"]


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
    # "ate" (strict default): the strict ``ate`` default on all rows at a public share of the
    # budget as the anchor, the CATE fitted as deviations from it and shrunk toward it
    # (James–Stein with the public noise variances), so a noisy CATE falls back to the ATE.
    # "none": the raw ridge release.
    shrinkage: Literal["ate", "none"] | None = None
    # "ridge": the fields above. "ebm": the strict ``ebm_cate`` default release (DP-EBM DR
    # learner, anchored) evaluated at the points. None: the public rule ``estimator_for``
    # ("ebm" where n epsilon per covariate reaches ebm_cate.EBM_USEFUL_N_EPSILON_PER_COVARIATE
    # and every ridge field above is at its default; else "ridge").
    estimator: Estimator | None = None
    # The ebm estimator's pre-specified effect modifiers (ebm_cate's effect_columns: 0-based
    # positions in the schema's covariate list); given, the estimator is "ebm".
    effect_columns: list[StrictInt] | None = Field(default=None, min_length=1)
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
        raise ValidationFailed(points_summary([e["detail"] for e in errors]), errors=errors)


# The ridge estimator's own fields and their defaults: a request changing any keeps the ridge.
RIDGE_DEFAULTS: dict[str, Any] = {
    "learner": "r",
    "mode": "strict",
    "propensity_clip": 0.05,
    "pseudo_outcome_clip": None,
    "ridge": None,
    "n_features": 50,
    "lengthscale": 0.3,
    "fold_fractions": None,
    "shrinkage": None,
}


def estimator_for(params: CateVectorRequest, domain: PublicDomain) -> Estimator:
    """The public estimator rule (values only, so a stored request resolves alike): the one
    asked for, else ``"ebm"`` where the request leaves every ridge field at its default and
    ``ebm_cate.preferred`` holds (observational: the anchored ebm_cate default can run; RCT:
    the DP-EBM effect model learns, ``n epsilon / q`` at least
    ``ebm_cate.EBM_USEFUL_N_EPSILON_PER_COVARIATE``), else ``"ridge"``.

    Raises:
        ValidationFailed: ``"ebm"`` asked for together with a ridge field.
    """
    changed = ebm_kind.changed_fields(params, RIDGE_DEFAULTS)
    asked = ebm_kind.asks_for_ebm(
        "estimator", params.estimator, params.effect_columns, changed, "ridge estimator"
    )
    if asked is not None:
        return "ebm" if asked else "ridge"
    return "ebm" if ebm_kind.preferred(domain, params.epsilon, params.delta) else "ridge"


def _ebm_request(params: CateVectorRequest) -> ebm_kind.EbmCateRequest:
    return ebm_kind.default_request(
        params.epsilon,
        params.delta,
        params.expected_heterogeneity_sd,
        effect_columns=params.effect_columns,
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
        request = _as_params(params)
        if estimator_for(request, domain) == "ebm":
            check_points(request.points, domain, "#/params/points/")
            return ebm_kind.EbmCateKind().record(_ebm_request(request), domain)
        return cate_vector.plan(domain, to_mechanism_params(request, domain))

    def quote(self, params: Any, domain: PublicDomain) -> dict[str, Any]:
        """Public accuracy preview (no data access): strict, an upper bound on every
        coordinate's noise sd; paper, public lower and upper bounds on its data-dependent sd;
        the ebm estimator, ebm_cate's quote."""
        request = _as_params(params)
        if estimator_for(request, domain) == "ebm":
            check_points(request.points, domain, "#/params/points/")
            quoted = ebm_kind.EbmCateKind().quote(_ebm_request(request), domain)
            return {"estimator": "ebm", **quoted}
        checked = to_mechanism_params(request, domain)
        out = {"estimator": "ridge", **cate_vector.quote(domain, checked)}
        out["versus_ate"] = versus_ate_block(
            request,
            domain,
            lambda r: _noise_sd_by_rule(r, domain),
            anchored=checked.anchor,
            anchor_source="ate_release",  # the ate kind's single-release default on all rows
        )
        if request.estimator is None and not ebm_kind.changed_fields(request, RIDGE_DEFAULTS):
            # naming effect_columns would make this request's estimator the ebm release
            out["versus_ate"] = ebm_kind.with_modifiers_hint(
                out["versus_ate"], _ebm_request(request), domain
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
        request = _as_params(params)
        if estimator_for(request, domain) == "ebm":
            return _run_ebm(arrays, domain, request, rng=rng, noise=noise, progress=progress)
        out = cate_vector.run(
            arrays,
            domain,
            to_mechanism_params(request, domain),
            rng=rng,
            noise=noise,
            progress=progress,
        )
        return {"estimator": "ridge", **out}


def _run_ebm(
    arrays: Arrays,
    domain: PublicDomain,
    request: CateVectorRequest,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    """The strict ebm_cate release, then its CATE at the public points (post-processing); only
    the estimates and public facts leave, not the model."""
    fitted = ebm_kind.EbmCateKind().run(
        arrays, domain, _ebm_request(request), rng=rng, noise=noise, progress=progress
    )
    estimates = ebm_cate.predict(fitted, np.asarray(request.points, dtype=np.float64))
    return {
        "estimator": "ebm",
        **ebm_kind.public_facts(fitted),
        "queries": len(request.points),
        "estimates": [float(v) for v in estimates],
    }


def _as_params(params: Any) -> CateVectorRequest:
    if isinstance(params, CateVectorRequest):
        return params
    return CateVectorRequest.model_validate(params)


def _noise_sd(request: CateVectorRequest, domain: PublicDomain) -> float:
    """Public per-prediction privacy-noise sd of a request (RMS over the query points)."""
    return cate_vector.rms_noise_sd(domain, to_mechanism_params(request, domain))


def _noise_sd_by_rule(request: CateVectorRequest, domain: PublicDomain) -> float:
    """The per-prediction noise sd of the release the estimator rule picks for this request
    (the epsilon search of ``versus_ate`` passes through the rule's switch to ebm)."""
    if estimator_for(request, domain) == "ebm":
        return ebm_kind.noise_sd(_ebm_request(request), domain)
    return _noise_sd(request, domain)
