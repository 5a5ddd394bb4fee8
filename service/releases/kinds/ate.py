"""The ``ate`` release kind: a DP average treatment effect with a confidence interval.

Combinations of ``mode`` and ``estimator`` (each validated; fields that a combination does not
use are refused by name):

| mode | estimator | mechanism | guarantee |
|---|---|---|---|
| strict | aipw (default; trials below ``RCT_DIFFERENCE_BELOW_N_EPSILON``: rct_difference) | ``ate_strict`` (ate_ci.md §3; DP-EBM or dp_linear nuisances, optional cross-fitting) | strict |
| strict | ipw | ``ate_ipw`` (private_propensity.md §6) | strict |
| strict | rct_difference | ``ate_rct`` (adum.md §7; RCT datasets only) | strict |
| paper | aipw | ``ate_privATE`` (ate_ci.md §2; needs ``allow_paper_mode``) | paper |

``paper`` + ``ipw`` (Lee et al.'s release is not DP for the estimation fold) and ``paper`` +
``rct_difference`` (no paper version exists) are refused.
"""  # noqa: E501

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, StrictBool, StrictFloat, StrictInt, model_validator

from service.mechanisms import ate_ipw, ate_privATE, ate_rct, ate_strict
from service.mechanisms.ate_coverage import ate_coverage, measured_band
from service.mechanisms.ate_strict import aggregate
from service.mechanisms.calibration import default_delta
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.records import MechanismRecord
from service.releases.kinds.base import KindParams, Progress

Mode = Literal["strict", "paper"]
Estimator = Literal["aipw", "ipw", "rct_difference"]

# Fields each combination uses (besides mode, estimator, epsilon, alpha, target_half_width).
_FIELDS: dict[tuple[str, str], frozenset[str]] = {
    ("strict", "aipw"): frozenset(
        {
            "delta",
            "propensity_clip",
            "pseudo_outcome_clip",
            "fold_fractions",
            "mean_share",
            "variance_inflation",
            "alpha_v",
            "nuisance",
            "cross_fit",
            "nuisance_share",
            "regularization",
            "clip",
            "quantile_bins",
            "adjustment_columns",
            "outcome_range",
            "chunks",
        }
    ),
    ("strict", "ipw"): frozenset(
        {
            "delta",
            "trim",
            "fold_fractions",
            "mean_share",
            "regularization",
            "normalization",
            "adjustment_columns",
        }
    ),
    ("strict", "rct_difference"): frozenset({"variance"}),
    ("paper", "aipw"): frozenset(
        {"delta", "propensity_clip", "ate_share", "nuisance", "gamma_mode"}
    ),
}
_COMMON = frozenset({"mode", "estimator", "epsilon", "alpha", "target_half_width"})
# Former defaults of fields whose default is now None: a stored request dumped with them still
# re-validates for combinations that do not use the field.
_LEGACY_DEFAULTS: dict[str, float] = {"mean_share": 0.8, "nuisance_share": 0.5}
_NUISANCES: dict[str, tuple[str, ...]] = {
    "strict": ("dp_ebm", "dp_linear", "none"),
    "paper": ("kernel", "linear"),
}


MIN_ALPHA = 1e-12


# The estimator rule (``resolved_estimator``): an omitted estimator on a randomised trial is the
# DP difference in means (``ate_rct``: all rows, pure epsilon) below this n * epsilon
# (``ate_rct.is_trial_default``), else ``aipw``.
RCT_DIFFERENCE_BELOW_N_EPSILON = ate_rct.DEFAULT_BELOW_N_EPSILON
# The aipw-only fields (its combination's): naming one asks for the outcome-model estimator.
_AIPW_ONLY = _FIELDS[("strict", "aipw")]
# The strict aipw fields that ask for a single release: naming one turns the chunks rule off
# (the chunk preset sets them itself; delta and the adjustment set pass through to each chunk).
_SINGLE_RELEASE_OPTIONS = _AIPW_ONLY - {"delta", "adjustment_columns", "chunks"}


class AteParams(KindParams):
    """Request parameters of an ``ate`` release (validated again by the mechanism)."""

    mode: Mode = "strict"
    # None: the public rule (``resolved_estimator``): rct_difference on a trial below
    # RCT_DIFFERENCE_BELOW_N_EPSILON where no aipw field is named, else aipw.
    estimator: Estimator | None = None
    epsilon: StrictFloat = Field(gt=0, allow_inf_nan=False)
    # None: README §1.7 default, min(1e-5, 1 / (10 * smallest fold size)); rct_difference: 0.
    delta: StrictFloat | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    # At least MIN_ALPHA: 1 - alpha / 2 must differ from 1 in floating point, or the interval's
    # quantile is infinite and the charged release fails (a follow-up audit's alpha 1e-16).
    alpha: StrictFloat = Field(default=0.05, ge=MIN_ALPHA, lt=1, allow_inf_nan=False)
    propensity_clip: StrictFloat = Field(default=0.1, gt=0, le=0.5, allow_inf_nan=False)
    pseudo_outcome_clip: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)
    # None: the design's default ((0.25, 0.25, 0.5) observational, (0.1, 0.4, 0.5) with DP-EBM
    # nuisances from n epsilon = 2 * 10^4, (0.2, 0.2, 0.6) with dp_linear up to n epsilon =
    # 5000; (0.5, 0.5) RCT; (1.0,) RCT with nuisance "none"; (0.5, 0.5) for ipw).
    fold_fractions: tuple[StrictFloat, ...] | None = Field(default=None, min_length=1, max_length=3)
    # None: the mechanism's public default (strict: 0.8, 0.9 with cross_fit; ipw: 0.8).
    mean_share: StrictFloat | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    variance_inflation: StrictBool = False
    alpha_v: StrictFloat = Field(default=0.05, ge=MIN_ALPHA, lt=1, allow_inf_nan=False)
    # None: strict, the public rule ate_strict.default_nuisance ("dp_linear" on RCT designs and
    # on observational ones below n epsilon = 2 * 10^4,
    # "dp_ebm" otherwise); paper, "kernel".
    nuisance: Literal["dp_ebm", "dp_linear", "none", "kernel", "linear"] | None = None
    # None: the public rule ate_strict.default_cross_fit (dp_linear, no fold_fractions:
    # cross-fit when n epsilon > 5000 on observational designs, > 10000 on randomised ones).
    cross_fit: StrictBool | None = None
    # None: the public rule clip(50000 / (n epsilon), 0.05, 0.5) (cross_fit only).
    nuisance_share: StrictFloat | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    regularization: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)
    # strict aipw: "declared" clips the pseudo-outcome at the bound from the declared schema (or
    # pseudo_outcome_clip); "adaptive" spends a public share of the estimation budget on a DP
    # quantile that sets the clip. None: the public rule ate_strict.default_adaptive_clip.
    clip: Literal["declared", "adaptive"] | None = None
    # strict aipw with DP-EBM nuisances: DP quantile bins for the continuous covariates (a public
    # share of each nuisance module's budget buys noisy histograms; proof ate_strict.md §14).
    # None: the public rule (on where DP-EBM nuisances are fitted, the schema declares a numeric
    # covariate and the smallest DP-EBM fold is large enough for an accurate CDF).
    quantile_bins: StrictBool | None = None
    # strict aipw with DP-EBM nuisances: a public share of the outcome model's budget buys two DP
    # quantiles of its fold's outcomes, and the model is fitted (its noise calibrated) on that
    # range instead of the declared one (proof ate_strict.md §16). None: the public rule (on
    # where a DP-EBM outcome model is fitted and n epsilon >= 2 * 10^4).
    outcome_range: StrictBool | None = None
    # strict aipw / ipw: 0-based covariate positions the nuisance models adjust for (the
    # analysis plan's adjustment set; proof ate_strict.md §15). None: the schema's declared
    # adjustment set (``"adjust_for": true``) where there is one, else every covariate.
    adjustment_columns: list[StrictInt] | None = Field(default=None, max_length=500)
    # strict aipw, observational designs: subsample and aggregate (proof ate_strict.md §17). The
    # rows are cut at random into this many disjoint chunks of n // chunks rows; each chunk gets
    # one whole strict release at the full (epsilon, delta) (parallel composition), and the
    # interval is the t interval over the chunks' DP estimates, so it also covers the DP nuisance
    # models' fit noise. Fields left out take the chunk preset (``chunked_params``). 1: one
    # release on all rows. None: the public rule (``resolved_chunks``: 4 or 8 chunks on an
    # observational dataset where n * epsilon is 2,500-20,000, n >= 4,000 and the request names
    # no single-release option; else one release).
    chunks: StrictInt | None = Field(default=None, ge=1, le=aggregate.MAX_CHUNKS)
    trim: StrictFloat = Field(default=ate_ipw.DEFAULT_TRIM, gt=0, lt=0.5, allow_inf_nan=False)
    # ipw only: Horvitz-Thompson, Hajek (DP arm weights) or "auto" (public rule on the noise).
    normalization: Literal["auto", "horvitz_thompson", "hajek"] = "auto"
    variance: Literal["dp_second_moment", "public_bound"] = "dp_second_moment"
    ate_share: StrictFloat = Field(default=0.5, gt=0, lt=1, allow_inf_nan=False)
    gamma_mode: Literal["optimizer", "analytic"] = "optimizer"
    # Quote only: also return the epsilon needed for this CI half-width. Ignored by a release.
    target_half_width: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _check_combination(self) -> AteParams:
        # an omitted estimator takes aipw's fields (naming one keeps aipw: the rule), or
        # rct_difference's where its own field (variance) is named
        combination = (self.mode, self.estimator or _implied_estimator(self))
        if combination == ("paper", "ipw"):
            raise ValueError(
                "estimator='ipw' is not available with mode='paper': Lee et al.'s release is "
                "not DP for the estimation fold; use mode='strict'"
            )
        if combination == ("paper", "rct_difference"):
            raise ValueError(
                "estimator='rct_difference' is strict only; use mode='strict' (there is no "
                "paper version)"
            )
        allowed = _FIELDS[combination] | _COMMON
        # A field a combination does not use must keep its default (stored requests are
        # re-validated from a full dump, so "was it sent" is not enough).
        fields = type(self).model_fields
        for name in sorted(set(fields) - allowed):
            value = getattr(self, name)
            if value == fields[name].default:
                continue
            if name in _LEGACY_DEFAULTS and value == _LEGACY_DEFAULTS[name]:
                continue  # stored before the default became None (public rule)
            if self.estimator is None:
                raise ValueError(
                    f"field '{name}' is not used together with the other fields given (with the "
                    "estimator omitted, an aipw field asks for aipw and variance for "
                    "rct_difference); name the estimator that takes it"
                )
            raise ValueError(
                f"field '{name}' is not used by mode='{self.mode}', estimator='{self.estimator}'"
            )
        if self.nuisance is not None and self.nuisance not in _NUISANCES[self.mode]:
            raise ValueError(
                f"field 'nuisance' must be one of {list(_NUISANCES[self.mode])} with "
                f"mode='{self.mode}'"
            )
        if self.estimator == "ipw" and self.fold_fractions is not None:
            if len(self.fold_fractions) != 2:
                raise ValueError("field 'fold_fractions' needs 2 entries (fit, estimation)")
        return self


def _strict_nuisance(params: AteParams, domain: PublicDomain) -> ate_strict.Nuisance:
    value = params.nuisance or ate_strict.default_nuisance(
        domain,
        params.epsilon,
        quantile_bins=params.quantile_bins,
        outcome_range=params.outcome_range,
        cross_fit=params.cross_fit,
        adjustment_columns=params.adjustment_columns,
    )
    if value == "dp_ebm" or value == "dp_linear" or value == "none":
        return value
    raise InvalidParameters("field 'nuisance' is invalid for mode='strict'")  # pragma: no cover


def adjustment_columns(
    params: AteParams, domain: PublicDomain, nuisance: ate_strict.Nuisance | None
) -> tuple[int, ...] | None:
    """The columns the nuisance models adjust for: the request's list, else the public rule
    ``ate_strict.default_adjustment_columns`` (the schema's declared set)."""
    if params.adjustment_columns is not None:
        return tuple(params.adjustment_columns)
    return ate_strict.default_adjustment_columns(domain, nuisance)


def _implied_estimator(params: AteParams) -> Estimator:
    """The estimator an omitted one's fields ask for: rct_difference where its own field
    (``variance``) is named, else aipw (whose fields the rest are)."""
    return "rct_difference" if params.variance != "dp_second_moment" else "aipw"


def resolved_estimator(params: AteParams, domain: PublicDomain) -> Estimator:
    """The request's estimator, or the public rule's where it is omitted: ``rct_difference`` on
    a randomised trial (strict mode) below ``RCT_DIFFERENCE_BELOW_N_EPSILON`` where the request
    names none of aipw's own fields, else ``aipw``. Public inputs only (design, n, epsilon,
    the request)."""
    if params.estimator is not None:
        return params.estimator
    if params.mode == "strict" and _implied_estimator(params) == "rct_difference":
        return "rct_difference"  # on an observational design the mechanism refuses it, saying why
    named = any(
        getattr(params, name) != AteParams.model_fields[name].default
        for name in _AIPW_ONLY - unused_on_trials(params)
    )
    if params.mode == "strict" and not named and ate_rct.is_trial_default(domain, params.epsilon):
        return "rct_difference"
    return "aipw"


def unused_on_trials(params: AteParams) -> frozenset[str]:
    """The aipw fields of a request that change nothing on a randomised design, so they do not
    ask for aipw there (a trial re-test's propensity_clip 0.3 turned the estimator into aipw,
    which then ignored it and charged a delta): the propensity clip (the declared probability
    is the propensity), and quantile_bins / outcome_range set false (options of the DP-EBM
    preset, off unless asked for), and chunks = 1 (one release)."""
    unused = {"propensity_clip"}
    if params.chunks == 1:
        unused.add("chunks")  # one release is what a trial runs
    if params.quantile_bins is False:
        unused.add("quantile_bins")
    if params.outcome_range is False:
        unused.add("outcome_range")
    return frozenset(unused)


def to_mechanism_params(
    params: AteParams, domain: PublicDomain
) -> (
    ate_strict.AteStrictParams
    | ate_ipw.AteIpwParams
    | ate_rct.AteRctParams
    | ate_privATE.PrivateParams
    | aggregate.AggregateParams
):
    """Map request parameters to the mechanism's, filling the public default delta."""
    if params.mode == "paper":
        nuisance: ate_privATE.NuisancePreset = "linear" if params.nuisance == "linear" else "kernel"
        return ate_privATE.PrivateParams(
            epsilon=params.epsilon,
            delta=params.delta if params.delta is not None else default_delta(domain.n),
            alpha=params.alpha,
            propensity_clip=params.propensity_clip,
            ate_share=params.ate_share,
            nuisance=nuisance,
            gamma_mode=params.gamma_mode,
        )
    estimator = resolved_estimator(params, domain)
    if estimator == "rct_difference":
        return ate_rct.AteRctParams(
            epsilon=params.epsilon, alpha=params.alpha, variance=params.variance
        )
    if estimator == "ipw":
        fractions = params.fold_fractions
        pair = None if fractions is None else (fractions[0], fractions[1])
        delta = params.delta
        if delta is None:
            delta = ate_ipw.default_delta_for(domain, pair)
        return ate_ipw.AteIpwParams(
            epsilon=params.epsilon,
            delta=delta,
            alpha=params.alpha,
            trim=params.trim,
            fold_fractions=pair,
            mean_share=ate_ipw.DEFAULT_MEAN_SHARE
            if params.mean_share is None
            else params.mean_share,
            regularization=params.regularization,
            normalization=params.normalization,
            adjustment_columns=adjustment_columns(params, domain, None),
        )
    chunked = _chunked_release(params, domain)
    if chunked is not None:
        return chunked
    nuisance_strict = _strict_nuisance(params, domain)
    cross_fit = params.cross_fit
    if cross_fit is None:
        cross_fit = ate_strict.default_cross_fit(
            domain, nuisance_strict, params.fold_fractions, params.epsilon
        )
    delta = params.delta
    if delta is None:
        delta = ate_strict.default_delta_for(
            domain, params.fold_fractions, nuisance_strict, cross_fit, params.epsilon
        )
    adaptive_clip = (
        ate_strict.default_adaptive_clip(domain, params.pseudo_outcome_clip)
        if params.clip is None
        else params.clip == "adaptive"
    )
    return ate_strict.AteStrictParams(
        adaptive_clip=adaptive_clip,
        quantile_bins=params.quantile_bins,
        outcome_range=params.outcome_range,
        epsilon=params.epsilon,
        delta=delta,
        alpha=params.alpha,
        propensity_clip=params.propensity_clip,
        pseudo_outcome_clip=params.pseudo_outcome_clip,
        fold_fractions=params.fold_fractions,
        mean_share=params.mean_share,
        variance_inflation=params.variance_inflation,
        alpha_v=params.alpha_v,
        nuisance=nuisance_strict,
        cross_fit=cross_fit,
        nuisance_share=params.nuisance_share,
        regularization=params.regularization,
        adjustment_columns=adjustment_columns(params, domain, nuisance_strict),
    )


def resolved_chunks(params: AteParams, domain: PublicDomain) -> int | None:
    """The number of chunks a strict aipw request runs, None for one release: the request's
    ``chunks`` (1: one release), else the public rule ``aggregate.default_chunks`` where the
    request names no single-release option (``_SINGLE_RELEASE_OPTIONS``; the chunk preset sets
    those itself) and the chunks fit their folds. Public inputs only (design, n, epsilon, the
    request)."""
    chunked = _chunked_release(params, domain)
    return None if chunked is None else chunked.chunks


def _chunked_release(params: AteParams, domain: PublicDomain) -> aggregate.AggregateParams | None:
    """The chunked release ``resolved_chunks`` describes, resolved once (None: one release); a
    request's own ``chunks`` that cannot run raises ``InvalidParameters``."""
    if params.chunks is not None:
        return None if params.chunks == 1 else chunked_params(params, domain)
    if params.mode != "strict" or any(
        getattr(params, name) != AteParams.model_fields[name].default
        for name in _SINGLE_RELEASE_OPTIONS
    ):
        return None
    chunks = aggregate.default_chunks(domain, params.epsilon)
    if chunks is None:
        return None
    try:
        return chunked_params(params.model_copy(update={"chunks": chunks}), domain)
    except InvalidParameters:  # a chunk too small for its folds: one release
        return None


def chunked_params(params: AteParams, domain: PublicDomain) -> aggregate.AggregateParams:
    """A ``chunks`` request's mechanism parameters: each chunk's strict release, resolved by the
    public rules at the chunk's size ``n // chunks``, with the chunk preset for the fields the
    request leaves out (DP-EBM nuisances on their measured outcome range, folds
    ``aggregate.CHUNK_FOLDS``, the pseudo-outcome clipped at ``aggregate.CHUNK_K_OF_RANGE`` x
    the declared outcome range unless the clip is asked to be adaptive). Observational designs
    only: a trial's interval already covers its outcome model's error. Public inputs only."""
    chunks = aggregate.validate_chunks(params.chunks)
    if domain.design == StudyDesign.RCT:
        raise InvalidParameters(
            "chunks (subsample and aggregate) is for observational datasets: on a randomised "
            "trial the declared assignment probability makes one release's interval cover its "
            "outcome model's error, and chunks would only widen it; leave chunks out"
        )
    updates: dict[str, Any] = {"chunks": 1}
    nuisance = params.nuisance or "dp_ebm"
    updates["nuisance"] = nuisance
    if nuisance == "dp_ebm":
        if params.outcome_range is None:
            updates["outcome_range"] = True
        if params.fold_fractions is None:
            updates["fold_fractions"] = aggregate.CHUNK_FOLDS
    if params.pseudo_outcome_clip is None and params.clip is None:
        updates["pseudo_outcome_clip"] = aggregate.CHUNK_K_OF_RANGE * domain.outcome_range
    try:
        chunk = to_mechanism_params(
            params.model_copy(update=updates), aggregate.chunk_domain(domain, chunks)
        )
    except InvalidParameters as exc:
        raise aggregate.chunk_error(domain, chunks, exc) from None
    if not isinstance(chunk, ate_strict.AteStrictParams):  # pragma: no cover - aipw above
        raise InvalidParameters("chunks needs estimator 'aipw'")
    return aggregate.AggregateParams(chunks=chunks, chunk=chunk)


class AteKind:
    """Adapter between the HTTP layer and the ATE mechanisms."""

    name: ClassVar[str] = "ate"
    Params: ClassVar[type[KindParams]] = AteParams

    def record(self, params: Any, domain: PublicDomain) -> MechanismRecord:
        """The release's mechanism record and cost, from public inputs only."""
        mechanism = to_mechanism_params(_as_params(params), domain)
        if isinstance(mechanism, ate_privATE.PrivateParams):
            return ate_privATE.plan(domain, mechanism)
        if isinstance(mechanism, ate_rct.AteRctParams):
            return ate_rct.plan(domain, mechanism)
        if isinstance(mechanism, ate_ipw.AteIpwParams):
            return ate_ipw.plan(domain, mechanism)
        if isinstance(mechanism, aggregate.AggregateParams):
            return aggregate.plan(domain, mechanism)
        return ate_strict.plan(domain, mechanism)

    def quote(self, params: Any, domain: PublicDomain) -> dict[str, Any]:
        """Public accuracy preview: expected half-width (basis stated) and optionally the
        epsilon for ``target_half_width``."""
        checked = _as_params(params)
        mechanism = to_mechanism_params(checked, domain)
        target = checked.target_half_width
        out: dict[str, Any]
        if isinstance(mechanism, ate_privATE.PrivateParams):
            out = ate_privATE.quote(domain, mechanism, target_half_width=target)
        elif isinstance(mechanism, ate_rct.AteRctParams):
            out = ate_rct.quote(domain, mechanism, target_half_width=target)
            if target is not None and checked.estimator is None:
                # the rule switches to aipw at its threshold: search what a release would run
                out["epsilon_for_target_half_width"] = _epsilon_for_target(checked, domain, target)
        elif isinstance(mechanism, ate_ipw.AteIpwParams):
            out = ate_ipw.quote(domain, mechanism, target_half_width=target)
        elif isinstance(mechanism, aggregate.AggregateParams):
            out = aggregate.quote(domain, mechanism)
            if target is not None:
                out["target_half_width"] = target
                out["epsilon_for_target_half_width"] = _epsilon_for_target(checked, domain, target)
        else:
            out = ate_strict.quote(domain, mechanism, target_half_width=target)
            if target is not None:  # the rules (the estimator's too) re-resolve at each epsilon
                # the request's omitted parameters follow their public rules at each epsilon
                out["epsilon_for_target_half_width"] = _epsilon_for_target(checked, domain, target)
        out["coverage"] = _coverage(domain, checked, mechanism)
        alternative = chunks_alternative(checked, domain, mechanism, out)
        if alternative is not None:
            out["chunks_alternative"] = alternative
        ignored = sorted(
            name
            for name in unused_on_trials(checked)
            if getattr(checked, name) != AteParams.model_fields[name].default
        )
        if domain.design == StudyDesign.RCT and ignored:
            out.setdefault("warnings", []).append(
                f"unused on a randomised design: {', '.join(ignored)} (the declared assignment "
                "probability is the propensity; the DP-EBM options are off unless set true)"
            )
        if (domain.y_lower, domain.y_upper) == (0.0, 1.0) and not domain.y_binary:
            # the general scale assumption (sd(Y) = R_Y / 12) is a sixth of a yes/no outcome's:
            # a re-test's undeclared 0/1 outcome was quoted at 0.39 of the realised width
            out.setdefault("warnings", []).append(
                "the outcome is declared on [0, 1] as numeric: if it is a yes/no outcome, have "
                "the owner declare it type 'binary'; the quote then assumes its own scale "
                "(sd up to 1/2, not 1/12) and predicts a wider, truer interval"
            )
        if target is not None:
            out.update(_target_verdict(out, checked.epsilon, target))
            if _narrowed_clip(mechanism) and domain.design != StudyDesign.RCT:
                out["target_message"] += NARROWED_TARGET_NOTE
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
        """Run the release after the charge; raises ``ReleaseFailed`` on any data-time failure."""
        checked = _as_params(params)
        mechanism = to_mechanism_params(checked, domain)
        options: dict[str, Any] = {"rng": rng, "noise": noise, "progress": progress}
        if isinstance(mechanism, ate_privATE.PrivateParams):
            out = ate_privATE.run(arrays, domain, mechanism, **options)
        elif isinstance(mechanism, ate_rct.AteRctParams):
            out = ate_rct.run(arrays, domain, mechanism, **options)
        elif isinstance(mechanism, ate_ipw.AteIpwParams):
            out = ate_ipw.run(arrays, domain, mechanism, **options)
        elif isinstance(mechanism, aggregate.AggregateParams):
            out = aggregate.run(arrays, domain, mechanism, **options)
        else:
            out = ate_strict.run(arrays, domain, mechanism, **options)
        # public: from the design and the request only (service.mechanisms.ate_coverage)
        out["coverage"] = _coverage(domain, checked, mechanism)
        out.setdefault("design", str(domain.design))  # the schema's, for every estimator
        return out


# The quote's subsample-and-aggregate suggestion (``chunks_alternative``): the chunk preset at
# the rule's number of chunks for n (``aggregate.chunks_for_n``), offered on an observational
# single-release strict aipw quote (a request naming a single-release option, or chunks = 1)
# where its expected interval is narrower and n * epsilon is within a factor
# CHUNKS_ALTERNATIVE_REACH of the band where its coverage was measured
# (``ate_coverage.MEASURED_BANDS["chunks"]``).
CHUNKS_ALTERNATIVE_REACH = 2.0


def chunks_alternative(
    checked: AteParams, domain: PublicDomain, mechanism: object, quoted: dict[str, Any]
) -> dict[str, Any] | None:
    """What ``chunks`` would give instead of this single-release request, where it is expected
    to be narrower: its expected half-width and measured coverage, in a sentence. None where it
    does not apply (a trial, another estimator, a chunk too small for its folds), is not
    expected to be narrower or was not measured near this n * epsilon. Public inputs only."""
    if domain.design == StudyDesign.RCT or not isinstance(mechanism, ate_strict.AteStrictParams):
        return None
    n_epsilon = float(domain.n) * checked.epsilon
    band = measured_band("chunks", n_epsilon)
    if band is None or not (
        band.n_epsilon_low / CHUNKS_ALTERNATIVE_REACH
        <= n_epsilon
        <= band.n_epsilon_high * CHUNKS_ALTERNATIVE_REACH
    ):
        return None
    columns = mechanism.adjustment_columns
    suggested = aggregate.chunks_for_n(domain.n)
    request = AteParams(
        epsilon=checked.epsilon,
        alpha=checked.alpha,
        chunks=suggested,
        adjustment_columns=None if columns is None else list(columns),
    )
    try:
        params = chunked_params(request, domain)
    except InvalidParameters:
        return None
    expected = aggregate.expected_half_width(domain, params)["expected_half_width"]
    if expected >= float(quoted["expected_half_width"]):
        return None
    message = (
        f"With chunks = {suggested} (subsample and aggregate: {suggested} whole "
        f"releases on disjoint parts of the rows, the same charge) the expected half-width "
        f"is {expected:.3g} against {float(quoted['expected_half_width']):.3g} for this "
        "request, and the interval also covers the DP models' fit noise: on the simulated "
        f"clinical studies it covered {100 * band.coverage_low:.1f}-"
        f"{100 * band.coverage_high:.1f} % of releases at n * epsilon = "
        f"{band.n_epsilon_low:,.0f}-{band.n_epsilon_high:,.0f} ({band.cells} cells, "
        f"{band.releases_per_cell} releases each). Set chunks = {suggested} in the "
        "request to use it (docs/guide-analyst.md, 'Subsample and aggregate')."
    )
    return {
        "chunks": suggested,
        "expected_half_width": expected,
        "coverage_low": band.coverage_low,
        "coverage_high": band.coverage_high,
        "message": message,
    }


def _narrowed_clip(mechanism: object) -> bool:
    """A strict aipw request whose pseudo-outcome clip is narrower than the declared one (the
    adaptive clip, or a given K): not a measured preset on observational data."""
    return isinstance(mechanism, ate_strict.AteStrictParams) and (
        mechanism.adaptive_clip or mechanism.pseudo_outcome_clip is not None
    )


def _coverage(domain: PublicDomain, checked: AteParams, mechanism: object) -> dict[str, Any]:
    if isinstance(mechanism, aggregate.AggregateParams):
        columns = mechanism.chunk.adjustment_columns
        preset = AteParams(
            epsilon=checked.epsilon,
            chunks=mechanism.chunks,
            adjustment_columns=None if columns is None else list(columns),
        )
        measured = True
        if checked.delta is not None:
            # as for one release: a smaller delta than the preset's only adds noise, a larger
            # one was not measured
            resolved = to_mechanism_params(preset, domain)
            measured = isinstance(resolved, aggregate.AggregateParams) and (
                checked.delta <= resolved.chunk.delta
            )
            preset = preset.model_copy(update={"delta": checked.delta})
        measured = measured and to_mechanism_params(preset, domain) == mechanism
        return ate_coverage(
            domain,
            mode=checked.mode,
            estimator="aipw",
            nuisance="chunks" if measured else None,
            epsilon=checked.epsilon,
            adjustment_set=columns is not None,
            chunks=mechanism.chunks,
        )
    nuisance: str | None = None
    adjusted = False
    narrowed = _narrowed_clip(mechanism)
    if isinstance(mechanism, ate_rct.AteRctParams) and mechanism.variance == "dp_second_moment":
        nuisance = "rct_difference"  # measured at its default variance (ate_coverage)
    if isinstance(mechanism, ate_strict.AteStrictParams | ate_ipw.AteIpwParams):
        adjusted = mechanism.adjustment_columns is not None
        if _preset_defaults(checked, domain, mechanism):
            # the measured preset: ipw has its own bands (ate_coverage)
            nuisance = (
                mechanism.nuisance if isinstance(mechanism, ate_strict.AteStrictParams) else "ipw"
            )
    return ate_coverage(
        domain,
        mode=checked.mode,
        estimator=resolved_estimator(checked, domain),
        nuisance=nuisance,
        epsilon=checked.epsilon,
        adjustment_set=adjusted,
        narrowed_clip=narrowed,
    )


def _preset_defaults(
    checked: AteParams,
    domain: PublicDomain,
    mechanism: ate_strict.AteStrictParams | ate_ipw.AteIpwParams,
) -> bool:
    """Whether a strict aipw request is its nuisance preset's default request, or a strict ipw
    request ipw's default request (whatever its adjustment columns): the requests the realistic
    studies' coverage was measured for."""
    columns = mechanism.adjustment_columns
    listed = None if columns is None else list(columns)
    if isinstance(mechanism, ate_ipw.AteIpwParams):
        default = AteParams(epsilon=checked.epsilon, estimator="ipw", adjustment_columns=listed)
    else:
        default = AteParams(
            epsilon=checked.epsilon, nuisance=mechanism.nuisance, adjustment_columns=listed
        )
    if checked.delta is not None:
        # a smaller delta than the default (an owner's small delta total asks for one) only adds
        # privacy noise, so the coverage measured at the default holds for it, conservatively
        resolved = to_mechanism_params(default, domain)
        if not isinstance(resolved, ate_strict.AteStrictParams | ate_ipw.AteIpwParams):
            return False
        if checked.delta > resolved.delta:
            return False
        default = default.model_copy(update={"delta": checked.delta})
    return to_mechanism_params(default, domain) == mechanism


# The epsilon search of a strict aipw quote: a log grid over the kind's epsilon range (each
# step about 35 %), then bisection inside the first step that reaches the target.
_SEARCH_STEPS = 40


def _epsilon_for_target(checked: AteParams, domain: PublicDomain, target: float) -> float | None:
    """Smallest epsilon (10 significant digits, rounded up, as the mechanism's) whose strict
    quote of this request, with every omitted parameter re-resolved by its public rule at that
    epsilon (the nuisance class, cross-fitting, the folds and delta, as a release at that
    epsilon would run), expects a half-width of at most ``target``; None if none up to
    ``MAX_EPSILON`` does. The rules switch at public n epsilon thresholds, where the half-width
    can jump up, so the search scans a grid first instead of assuming monotonicity (the
    mechanism's own search holds the resolved request fixed: a trial's cross-fitting rule made
    it answer "no epsilon" below the switch and an epsilon that did not reach the target above
    it). Public inputs only."""

    def width(epsilon: float) -> float:
        request = checked.model_copy(update={"epsilon": epsilon, "target_half_width": None})
        try:
            mechanism = to_mechanism_params(request, domain)
            if isinstance(mechanism, ate_rct.AteRctParams):
                return float(ate_rct.quote(domain, mechanism)["expected_half_width"])
            if isinstance(mechanism, aggregate.AggregateParams):
                return aggregate.expected_half_width(domain, mechanism)["expected_half_width"]
            if not isinstance(mechanism, ate_strict.AteStrictParams):
                return math.inf
            return float(ate_strict.quote(domain, mechanism)["expected_half_width"])
        except (InvalidParameters, ValueError):  # an epsilon the request cannot run at
            return math.inf

    low, high = ate_strict.MIN_EPSILON, ate_strict.MAX_EPSILON
    grid = np.geomspace(low, high, _SEARCH_STEPS + 1)
    first = next((i for i, e in enumerate(grid) if width(float(e)) <= target), None)
    if first is None:
        return None
    if first == 0:
        return low
    # bisect inside the first grid step that reaches the target
    return ate_rct.solve_epsilon(
        width, target, minimum=float(grid[first - 1]), maximum=float(grid[first]), tolerance=1e-12
    )


# The target verdict of an observational request with a narrowed clip: a width at the quote's
# assumed scale that no benchmark checked there (an observational walkthrough's adaptive clip:
# quoted 0.49, "meets target 0.5"; its 10 releases 0.56-0.80, and they covered 7).
NARROWED_TARGET_NOTE = (
    " That width is at the quote's assumed pseudo-outcome sd (R_Y / 6); with this narrower clip "
    "on observational data it was not benchmarked (a skewed, confounded outcome's releases "
    "were up to 1.6x wider), and the interval leaves the DP models' bias out (see coverage)."
)


def _target_verdict(quoted: dict[str, Any], epsilon: float, target: float) -> dict[str, Any]:
    """Whether the quoted release meets ``target_half_width``, and what would (in words)."""
    expected = float(quoted["expected_half_width"])
    needed = quoted.get("epsilon_for_target_half_width")
    meets = expected <= target
    if meets:
        message = (
            f"At epsilon = {epsilon:g} the expected half-width {expected:.3g} meets the "
            f"target {target:g}."
        )
    elif needed is None:
        message = (
            f"No epsilon up to the maximum reaches a half-width of {target:g} on this dataset "
            f"(expected {expected:.3g} at epsilon = {epsilon:g}): the sampling error or the "
            "declared bounds set a floor. Accept a wider interval, or use a larger dataset."
        )
    else:
        message = (
            f"At epsilon = {epsilon:g} the expected half-width is {expected:.3g}, above the "
            f"target {target:g}; epsilon = {float(needed):.3g} would reach it."
        )
    return {"meets_target": meets, "target_message": message}


def _as_params(params: Any) -> AteParams:
    if isinstance(params, AteParams):
        return params
    return AteParams.model_validate(params)
