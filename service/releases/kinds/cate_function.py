"""The ``cate_function`` release kind: a DP CATE function, evaluated later for free.

The job fits ``g*`` and fixes the noise (``service.mechanisms.cate_function``); its result is
public metadata only. The fitted function travels to the runner under ``SECRET_KEY`` and is
persisted by ``service.functions.service.store``; clients evaluate it at
``POST /v1/functions/{release_id}/evaluate``.

Where the public basis rule picks ``ebm`` the release is the strict ``ebm_cate`` default and the
function its CATE model (``FittedFunction`` kind ``"ebm"``; docs/proofs/cate_function.md §9).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, StrictFloat, StrictInt, model_validator

from service.functions.payload import SECRET_KEY, FunctionSecret
from service.mechanisms import cate_function as mech
from service.mechanisms import gp
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.noise import NoiseSampler, lattice_exponent
from service.mechanisms.records import MechanismRecord
from service.problems import ValidationFailed
from service.releases.kinds import ebm_cate as ebm_kind
from service.releases.kinds.base import KindParams, Progress, versus_ate_block

Basis = Literal["exact", "nystrom", "rff", "ebm"]


class CateFunctionParams(KindParams):
    """Request parameters of a ``cate_function`` release (validated again by the mechanism)."""

    mode: Literal["strict", "paper"] = "strict"
    epsilon: StrictFloat = Field(gt=0, allow_inf_nan=False)
    # None: min(1e-5, 1 / (10 * smallest fold size)) (README §1.7).
    delta: StrictFloat | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    learner: Literal["r", "dr"] = "r"
    # h on the box scaled to [0, 1]^q: below 1e-4 the kernel is 0 between any two distinct
    # points (1e-300 divided by zero in the kernel and was quoted as if it were a function)
    bandwidth: StrictFloat | None = Field(default=None, ge=1e-4, le=1e4, allow_inf_nan=False)
    # None: the public rule (mech.DEFAULT_LAMBDA0_GRID): the smallest lambda0 whose pointwise
    # noise sd is at most 0.2 R_Y without shrinkage, 0.5 R_Y / 24 with shrinkage "ate" (the
    # strict default); else the largest. lambda_convention applies to an explicit value only.
    regularization: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)
    lambda_convention: Literal["normalised", "unnormalised"] = "normalised"
    propensity_clip: StrictFloat = Field(default=0.1, gt=0, le=0.5, allow_inf_nan=False)
    fold_fractions: tuple[StrictFloat, ...] | None = Field(default=None, min_length=1, max_length=3)
    # None: the public rule ``basis_for`` ("ebm", the strict ebm_cate default release as the
    # function, where every field of the kernel learner below is at its default, the release is
    # anchored and, in a trial, n epsilon per declared modifier (else per covariate) reaches
    # ebm_cate.EBM_USEFUL_N_EPSILON_PER_COVARIATE; else "exact").
    basis: Basis | None = None
    # The ebm basis's pre-specified effect modifiers (ebm_cate's effect_columns: 0-based
    # positions in the schema's covariate list); given, the basis is "ebm".
    effect_columns: list[StrictInt] | None = Field(default=None, min_length=1)
    n_centres: StrictInt = Field(default=256, ge=1, le=mech.MAX_CENTRES)
    n_features: StrictInt = Field(default=256, ge=1, le=mech.MAX_FEATURES)
    t_max: StrictInt = Field(default=10000, ge=1, le=mech.MAX_T)
    # An exact function's capacity shared fairly: the most new distinct points any one caller
    # (a client, the analyst, the owner, the admin) may add, at most t_max; None: only t_max.
    # Ignored by the unlimited bases, like t_max. Public, privacy-neutral.
    points_per_principal: StrictInt | None = Field(default=None, ge=1, le=mech.MAX_T)
    batch_max: StrictInt = Field(default=1000, ge=1, le=mech.MAX_BATCH)
    jitter: StrictFloat = Field(default=gp.DEFAULT_JITTER, gt=0, le=1e-2, allow_inf_nan=False)
    nuisance: Literal["dp_ebm", "none"] = "dp_ebm"
    # None: "ate" in strict mode (a DP anchor ATE, the strict single-release ate default on all rows
    # at the public share anchor.ate_anchor_share of the budget, 0.2-0.95; the release is shrunk
    # towards it unless heterogeneity is detectable; proof §7), "none" in paper mode.
    shrinkage: Literal["ate", "none"] | None = None
    # shrinkage "ate": anchor at this public value instead of buying a DP anchor (e.g. the
    # estimate of an ATE release you already have; no extra cost, the function gets the budget)
    anchor: StrictFloat | None = Field(default=None, allow_inf_nan=False)
    # Quote only: the heterogeneity sd(tau) you expect, for the quote's verdict against the
    # constant ATE (versus_ate); None: the public default R_Y / 24. Ignored by a release.
    expected_heterogeneity_sd: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _share_within_capacity(self) -> CateFunctionParams:
        if self.points_per_principal is not None and self.points_per_principal > self.t_max:
            raise ValueError("points_per_principal must be at most t_max")
        return self


# The kernel learner's own fields and their defaults: a request changing any keeps a kernel
# basis ("exact" unless named).
KERNEL_DEFAULTS: dict[str, Any] = {
    "mode": "strict",
    "learner": "r",
    "bandwidth": None,
    "regularization": None,
    "lambda_convention": "normalised",
    "propensity_clip": 0.1,
    "fold_fractions": None,
    "n_centres": 256,
    "n_features": 256,
    "jitter": gp.DEFAULT_JITTER,
    "nuisance": "dp_ebm",
    "shrinkage": None,
    "anchor": None,
}


def basis_for(params: CateFunctionParams, domain: PublicDomain) -> Basis:
    """The public basis rule (values only, so a stored request resolves alike): the one asked
    for, else ``"ebm"`` where the request leaves every kernel field at its default, the
    ebm_cate default release is anchored and ``ebm_cate.preferred`` holds (observational:
    always; RCT: the DP-EBM effect model learns, ``n epsilon / q'`` at least
    ``ebm_cate.EBM_USEFUL_N_EPSILON_PER_COVARIATE``, q' the schema's declared effect modifiers,
    else q); else ``"exact"``.

    Raises:
        ValidationFailed: ``"ebm"`` asked for together with a kernel field.
    """
    changed = ebm_kind.changed_fields(params, KERNEL_DEFAULTS)
    if params.basis == "ebm":
        # the ebm basis takes a public anchor too (ebm_cate's, proof step 6.5); elsewhere an
        # anchor keeps a kernel basis, as it always did
        changed = [name for name in changed if name != "anchor"]
    asked = ebm_kind.asks_for_ebm(
        "basis", params.basis, params.effect_columns, changed, "kernel bases"
    )
    if asked:
        # the function is an anchored DR model: refuse before any charge where the ebm_cate
        # default cannot anchor (public n only); invalid ebm fields raise their own 422
        if not ebm_kind.plan_anchored(_ebm_request(params), domain):
            raise ValidationFailed(
                "the ebm basis is an anchored ebm_cate release, and this dataset's effect fold "
                "is too small for its calibration rows; use a kernel basis",
                errors=[{"pointer": "#/params/basis", "detail": "no anchored ebm release"}],
            )
        return "ebm"
    if params.basis is not None:
        return params.basis
    if changed:
        return "exact"
    if ebm_kind.preferred(domain, params.epsilon, params.delta) and ebm_kind.anchored(
        _ebm_request(params), domain
    ):
        return "ebm"
    return "exact"


def _ebm_request(params: CateFunctionParams) -> ebm_kind.EbmCateRequest:
    return ebm_kind.default_request(
        params.epsilon,
        params.delta,
        params.expected_heterogeneity_sd,
        effect_columns=params.effect_columns,
        anchor=params.anchor if params.basis == "ebm" else None,
    )


def to_mechanism_params(
    params: CateFunctionParams, domain: PublicDomain
) -> mech.CateFunctionParams:
    """Map request parameters to the mechanism's, filling the public default delta."""
    delta = params.delta
    if delta is None:
        from service.mechanisms import ate_strict

        delta = ate_strict.default_delta_for(domain, params.fold_fractions, params.nuisance)
    return mech.CateFunctionParams(
        epsilon=params.epsilon,
        delta=delta,
        mode=params.mode,
        learner=params.learner,
        bandwidth=params.bandwidth,
        regularization=params.regularization,
        lambda_convention=params.lambda_convention,
        propensity_clip=params.propensity_clip,
        fold_fractions=params.fold_fractions,
        basis=_kernel_basis(params),
        n_centres=params.n_centres,
        n_features=params.n_features,
        t_max=params.t_max,
        batch_max=params.batch_max,
        jitter=params.jitter,
        nuisance=params.nuisance,
        shrinkage=params.shrinkage,
        anchor=params.anchor,
    )


class CateFunctionKind:
    """Adapter between the HTTP layer and ``service.mechanisms.cate_function``."""

    name: ClassVar[str] = "cate_function"
    Params: ClassVar[type[KindParams]] = CateFunctionParams

    def record(self, params: Any, domain: PublicDomain) -> MechanismRecord:
        """The mechanism record and cost, from public inputs only."""
        request = _as_params(params)
        if basis_for(request, domain) == "ebm":
            return ebm_kind.EbmCateKind().record(_ebm_request(request), domain)
        return mech.plan(domain, to_mechanism_params(request, domain)).record

    def quote(self, params: Any, domain: PublicDomain) -> dict[str, Any]:
        """Public preview: constants and the pointwise noise sd (the ebm basis: ebm_cate's)."""
        request = _as_params(params)
        if basis_for(request, domain) == "ebm":
            ebm = ebm_kind.EbmCateKind().quote(_ebm_request(request), domain)
            return {"basis": "ebm", "t_max": None, "batch_max": request.batch_max, **ebm}
        out = mech.quote(domain, to_mechanism_params(request, domain))
        out["versus_ate"] = versus_ate_block(
            request,
            domain,
            lambda r: _noise_sd_by_rule(r, domain),
            anchored=out["shrinkage"] == "ate",
            retention=lambda r: _retention_by_rule(r, domain),
            # the ate kind's single-release default on all rows (proof §7)
            anchor_source="ate_release",
        )
        if request.basis is None and not ebm_kind.changed_fields(request, KERNEL_DEFAULTS):
            # naming effect_columns would make this request's basis the ebm model
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
        """Fit after the charge; the secret rides under ``SECRET_KEY`` for the runner to store."""
        request = _as_params(params)
        if basis_for(request, domain) == "ebm":
            return _run_ebm(arrays, domain, request, rng=rng, noise=noise, progress=progress)
        checked = to_mechanism_params(request, domain)
        result, fitted = mech.run(arrays, domain, checked, rng=rng, noise=noise, progress=progress)
        return _with_secret(result, fitted, request, domain, basis=checked.basis)


def _with_secret(
    result: dict[str, Any],
    fitted: mech.FittedFunction,
    request: CateFunctionParams,
    domain: PublicDomain,
    *,
    basis: str,
) -> dict[str, Any]:
    """The job's result with the function's secret under ``SECRET_KEY`` for the runner."""
    public = {
        **result,
        "x_lower": [float(v) for v in domain.x_lower],
        "x_upper": [float(v) for v in domain.x_upper],
        # the covariates' public names in schema order (a point's coordinates; ``columns``)
        "x_names": list(domain.names),
        # a categorical covariate's declared codes (None: numeric); points must take one
        "x_codes": None
        if domain.x_codes is None
        else [None if c is None else [int(v) for v in c] for c in domain.x_codes],
    }
    secret = FunctionSecret(
        fitted=fitted,
        basis=basis,
        q=domain.q,
        t_max=request.t_max,
        batch_max=request.batch_max,
        jitter=request.jitter,
        public=public,
        initial=fitted.reference,
        points_per_principal=request.points_per_principal if basis == "exact" else None,
    )
    return {
        **result,
        "evaluate": "POST /v1/functions/{release_id}/evaluate",
        SECRET_KEY: secret,
    }


def _kernel_basis(params: CateFunctionParams) -> Literal["exact", "nystrom", "rff"]:
    if params.basis == "nystrom" or params.basis == "rff":
        return params.basis
    return "exact"


def _run_ebm(
    arrays: Arrays,
    domain: PublicDomain,
    request: CateFunctionParams,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    """The strict ebm_cate release; its CATE model becomes the function (post-processing).
    The result shows ebm_cate's public facts only; the model stays in the function's secret."""
    fitted_release = ebm_kind.EbmCateKind().run(
        arrays, domain, _ebm_request(request), rng=rng, noise=noise, progress=progress
    )
    value_bound = domain.outcome_range
    fitted = mech.FittedFunction.from_ebm_release(
        fitted_release,
        x_lower=np.asarray(domain.x_lower, dtype=np.float64),
        x_upper=np.asarray(domain.x_upper, dtype=np.float64),
        value_bound=value_bound,
        output_lattice_exponent=lattice_exponent(value_bound),
    )
    result = {
        "basis": "ebm",
        **ebm_kind.public_facts(fitted_release),
        "value_bound": value_bound,
    }
    return _with_secret(result, fitted, request, domain, basis="ebm")


def _as_params(params: Any) -> CateFunctionParams:
    if isinstance(params, CateFunctionParams):
        return params
    return CateFunctionParams.model_validate(params)


def _kernel_quote(request: CateFunctionParams, domain: PublicDomain, field: str) -> float:
    """One public field of the kernel-basis quote of a request: ``pointwise_noise_sd`` (the
    per-prediction privacy-noise sd) or ``learner_signal_retention``."""
    return float(mech.quote(domain, to_mechanism_params(request, domain))[field])


def _noise_sd_by_rule(request: CateFunctionParams, domain: PublicDomain) -> float:
    """The per-prediction noise sd of the release the basis rule picks for this request (the
    epsilon search of ``versus_ate`` passes through the rule's switch to the ebm basis)."""
    if basis_for(request, domain) == "ebm":
        return ebm_kind.noise_sd(_ebm_request(request), domain)
    return _kernel_quote(request, domain, "pointwise_noise_sd")


def _retention_by_rule(request: CateFunctionParams, domain: PublicDomain) -> float:
    """The kernel learner's retention, or 1 where the rule picks the ebm basis (its quote
    models the DP-EBM's own noise and assumes no shrinkage of the effect)."""
    if basis_for(request, domain) == "ebm":
        return 1.0
    return _kernel_quote(request, domain, "learner_signal_retention")
