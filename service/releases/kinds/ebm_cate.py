"""The ``ebm_cate`` release kind: DP-EBM S-, DR- (strict) and R-learners (paper label).

The result holds the fitted DP effect model's safe fields, the ATE read off it and its shape
functions; ``POST /v1/releases/{id}/predict`` evaluates it at public points for free.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, StrictBool, StrictFloat, StrictInt

from service.mechanisms import ebm_cate, versus_ate
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.records import MechanismRecord
from service.problems import ValidationFailed
from service.releases.kinds.base import KindParams, Progress, versus_ate_block


class EbmCateRequest(KindParams):
    """Request parameters of an ``ebm_cate`` release."""

    epsilon: StrictFloat = Field(gt=0, allow_inf_nan=False)
    delta: StrictFloat | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    learner: Literal["dr", "s", "r"] = "dr"
    propensity_clip: StrictFloat = Field(default=0.05, gt=0, le=0.5, allow_inf_nan=False)
    pseudo_outcome_clip: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)
    fold_fractions: tuple[StrictFloat, ...] | None = Field(default=None, min_length=1, max_length=3)
    # Omitted K, folds, max_bins, max_rounds: ebm_cate.service_defaults (DR: K = 0.3 R_Y, folds
    # 0.1/0.4/0.5 with at least 100 propensity records, or 0.3/0.7 in an RCT, 16 bins, 200
    # effect rounds, 400 from n epsilon per effect-model covariate 10^4; S and R: Niu et al.'s).
    max_bins: StrictInt | None = Field(
        default=None, ge=ebm_cate.MIN_MAX_BINS, le=ebm_cate.MAX_MAX_BINS
    )
    max_rounds: StrictInt | None = Field(
        default=None, ge=ebm_cate.MIN_MAX_ROUNDS, le=ebm_cate.MAX_MAX_ROUNDS
    )
    # "ate" (the DR learner's default): a DP ATE anchor on a public share of the effect fold's
    # budget (in an RCT: the strict ATE release on all n at a public share of the whole
    # budget), the effect model fitted to pseudo-outcomes centred at it, and its deviations
    # shrunk toward it by a factor set from DP calibration sums on held-out rows of the effect
    # fold, so undetectable heterogeneity falls back to the ATE. "none": the unshrunk model
    # (the S- and R-learners' only value).
    shrinkage: Literal["ate", "none"] | None = None
    # The pre-specified effect modifiers: 0-based positions in the schema's covariate list. The
    # effect model varies with these only (the nuisance models still adjust for every
    # covariate); fewer covariates, less noise per shape function. None: every covariate.
    effect_columns: list[StrictInt] | None = Field(
        default=None,
        min_length=1,
        description="effect modifiers: 0-based positions in the schema's covariate list, or "
        "covariate names, read as their positions (DR and R learners); omitted: every covariate",
    )
    # The analysis plan's adjustment set: 0-based positions in the schema's covariate list
    # that the nuisance models (propensity and outcome DP-EBMs of the DR and R learners) adjust
    # for. None: the schema's declared adjustment set ("adjust_for": true), else every
    # covariate (proof ebm_cate.md step 8).
    adjustment_columns: list[StrictInt] | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="the nuisance models' adjustment set: 0-based positions in the schema's "
        "covariate list, or covariate names, read as their positions (DR and R learners); "
        "omitted: the schema's declared adjustment set, else every covariate",
    )
    # The effect-modifier screen (proof ebm_cate.md step 9): without named effect columns the
    # anchored DR learner spends a public share of the effect model's budget on a DP choice of
    # the covariates the effect model is fitted on. None: on where it can run (more than
    # ebm_cate's screen COLUMNS covariates); false: the effect model sees every covariate.
    effect_screen: StrictBool | None = Field(
        default=None,
        description="DP screen of the effect modifiers (anchored DR learner without "
        "effect_columns); omitted: on where the schema has more covariates than it keeps",
    )
    # The DR learner's outcome model on its measured range (proof ebm_cate.md step 10): the
    # outcome module spends a public share of its budget on two DP quantiles of its fold's
    # outcomes and fits on that range. None: on for the DR learner from n * epsilon = 2 * 10^4.
    outcome_range: StrictBool | None = Field(
        default=None,
        description="fit the DR learner's outcome model on a DP-measured range of its fold's "
        "outcomes; omitted: on for the DR learner from n * epsilon = 20000",
    )
    # The anchored DR learner's anchor at this public value instead of a DP anchor bought from
    # the budget (proof ebm_cate.md step 6.5): e.g. the estimate of an ATE release you already
    # have, so the CATE falls back to that ATE and the whole budget goes to the model.
    anchor: StrictFloat | None = Field(
        default=None,
        allow_inf_nan=False,
        description="anchor the anchored DR learner at this public ATE (e.g. your ate "
        "release's estimate) instead of buying a DP anchor; in [-R_Y, R_Y]",
    )
    # Quote only: the heterogeneity sd(tau) you expect, for the quote's verdict against the
    # constant ATE (versus_ate); None: the public default R_Y / 24. Ignored by a release.
    expected_heterogeneity_sd: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)


def effect_columns_of(
    effect_columns: list[int] | None, domain: PublicDomain, learner: str = "dr"
) -> list[int] | None:
    """The effect model's columns: the request's, else the owner's declared effect modifiers
    (the S-learner has no effect model: the request's only), else None (every covariate)."""
    if effect_columns is not None or learner == "s" or domain.effect_modifiers is None:
        return effect_columns
    return list(domain.effect_modifiers)


def to_mechanism_params(params: EbmCateRequest, domain: PublicDomain) -> ebm_cate.EbmCateParams:
    columns = effect_columns_of(params.effect_columns, domain, params.learner)
    width = None if columns is None else len(set(columns))
    if params.effect_screen is not False and ebm_cate.screen_rule(
        domain.q, params.learner, params.shrinkage, columns, None
    ):
        width = ebm_cate.SCREEN_COLUMNS  # the effect model's covariates (proof step 9)
    defaults = ebm_cate.service_defaults(domain, params.learner, params.epsilon, width)
    given = params.model_dump(exclude_none=True)
    resolved = {key: given.get(key, value) for key, value in defaults.items()}
    delta = params.delta
    if delta is None:
        delta = ebm_cate.default_delta_for(domain, params.learner, resolved["fold_fractions"])
    adjustment = (
        tuple(params.adjustment_columns)
        if params.adjustment_columns is not None
        else ebm_cate.default_adjustment_columns(domain, params.learner)
    )
    return ebm_cate.EbmCateParams(
        epsilon=params.epsilon,
        delta=delta,
        learner=params.learner,
        propensity_clip=params.propensity_clip,
        shrinkage=params.shrinkage,
        effect_columns=None if columns is None else tuple(columns),
        adjustment_columns=adjustment,
        effect_screen=params.effect_screen,
        outcome_range=params.outcome_range,
        anchor=params.anchor,
        **resolved,
    )


class EbmCateKind:
    """Adapter between the HTTP layer and ``service.mechanisms.ebm_cate``."""

    name: ClassVar[str] = "ebm_cate"
    Params: ClassVar[type[KindParams]] = EbmCateRequest

    def record(self, params: Any, domain: PublicDomain) -> MechanismRecord:
        """The mechanism record and cost, from public inputs only."""
        return ebm_cate.plan(domain, to_mechanism_params(_as_params(params), domain))

    def quote(self, params: Any, domain: PublicDomain) -> dict[str, Any]:
        """Public accuracy preview."""
        request = _as_params(params)
        checked = to_mechanism_params(request, domain)
        out = ebm_cate.quote(domain, checked)
        out["versus_ate"] = with_modifiers_hint(_versus_ate(request, domain), request, domain)
        if out.get("anchor_source") in ("effect_fold", "ate_release"):
            # the caution cites the observational benchmark; a trial's anchor is the ate
            # default itself (a re-test found the observational caution on a trial's quote)
            caution = (
                "so do it only if it is at least as accurate as this anchor would be (on the "
                "realistic observational benchmark studies the single-release ate default's "
                "estimate (chunks 1) was the less accurate one at n epsilon 5000-20000, and the "
                "ate default in chunks about as accurate as this anchor: bench/README.md, 'A "
                "given anchor' and 'The CATE kinds against the chunked ATE default')"
                if out["anchor_source"] == "effect_fold"
                else "which is as accurate as this anchor (the single-release ate default on all "
                "rows, at a share of the budget) if that release had at least this anchor's "
                "epsilon"
            )
            out["anchor_hint"] = (
                f"this release buys its own DP ATE anchor with {out['anchor_share']:.0%} of its "
                "budget; if you hold an ate release of this dataset, its estimate can be the "
                "anchor instead: nothing is spent on a second anchor and the whole budget goes "
                f"to the model, but the release then falls back to that estimate, {caution}"
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
        """Fit after the charge (interpret draws the DP-EBMs' noise; ``noise`` the anchor's and
        the calibration statistics' with shrinkage ``"ate"``)."""
        return ebm_cate.run(
            arrays,
            domain,
            to_mechanism_params(_as_params(params), domain),
            rng=rng,
            progress=progress,
            noise=noise,
        )


# ---- the ebm_cate default as another kind's estimator (cate_vector "ebm", cate_function "ebm")

# The result's public fields such a kind repeats (never the model).
PUBLIC_FIELDS = (
    "mode",
    "guarantee",
    "learner",
    "epsilon",
    "delta",
    "fold_sizes",
    "propensity_clip",
    "treatment_probability",
    "pseudo_outcome_clip",
    "design",
    "shrinkage",
    "anchor_share",
    "anchor_source",
    "ate_anchor",
    "ate_anchor_interval",
    "shrinkage_factor",
    "effect_columns",
    "adjustment_columns",
    "effect_screen",
    "screened_columns",
    "outcome_range",
)


def default_request(
    epsilon: float,
    delta: float | None,
    expected_heterogeneity_sd: float | None = None,
    effect_columns: list[int] | None = None,
    anchor: float | None = None,
) -> EbmCateRequest:
    """The strict ebm_cate default release at (epsilon, delta), with the request's effect
    modifiers (None: every covariate) and public anchor (None: a DP anchor)."""
    return EbmCateRequest(
        epsilon=epsilon,
        delta=delta,
        expected_heterogeneity_sd=expected_heterogeneity_sd,
        effect_columns=effect_columns,
        anchor=anchor,
    )


def learns(domain: PublicDomain, epsilon: float, effect_columns: list[int] | None = None) -> bool:
    """The public threshold where the DP-EBM effect model learns (n epsilon per effect-model
    covariate at least ``ebm_cate.EBM_USEFUL_N_EPSILON_PER_COVARIATE``, as ebm_cate's own
    anchor rules; the covariates are ``effect_columns``, else the owner's declared effect
    modifiers, else all q)."""
    columns = effect_columns_of(effect_columns, domain)
    width = domain.q if columns is None else max(len(set(columns)), 1)
    return domain.n * epsilon / width >= ebm_cate.EBM_USEFUL_N_EPSILON_PER_COVARIATE


def preferred(
    domain: PublicDomain,
    epsilon: float,
    delta: float | None = None,
    effect_columns: list[int] | None = None,
) -> bool:
    """The CATE kinds' public rule for running the ebm_cate default release instead of their
    own estimator (cate_vector's ridge, cate_function's kernel bases): on an observational
    design wherever that release is anchored (its whole-fold anchor and its calibrated
    shrinkage; bench/README.md, "The ebm release on observational studies at every n·ε"), in
    an RCT where the DP-EBM effect model learns (``learns``). Public schema and request only."""
    if domain.design != StudyDesign.OBSERVATIONAL:
        return learns(domain, epsilon, effect_columns)
    return anchored(default_request(epsilon, delta, effect_columns=effect_columns), domain)


def plan_anchored(request: EbmCateRequest, domain: PublicDomain) -> bool:
    """Whether the request's ebm_cate release is anchored (its public plan; the plan's errors
    propagate)."""
    return bool(ebm_cate.make_plan(domain, to_mechanism_params(request, domain)).anchored)


def anchored(request: EbmCateRequest, domain: PublicDomain) -> bool:
    """``plan_anchored``, False where the release cannot run at all (the kind's own estimator
    answers there)."""
    try:
        return plan_anchored(request, domain)
    except Exception:
        return False


def _versus_ate(request: EbmCateRequest, domain: PublicDomain) -> dict[str, Any]:
    quoted = ebm_cate.quote(domain, to_mechanism_params(request, domain))
    anchored = quoted["shrinkage"] == "ate"
    clip = quoted.get("pseudo_outcome_clip")
    return versus_ate_block(
        request,
        domain,
        lambda r: noise_sd(r, domain),
        anchored=anchored,
        detectable=lambda r: detectable_sd(r, domain),
        cap=None if clip is None else ebm_cate.deviation_bound(float(clip)),
        anchor_source=quoted.get("anchor_source"),
    )


def modifiers_worth_it(request: EbmCateRequest, domain: PublicDomain) -> int | None:
    """The most effect modifiers an analyst could name (``effect_columns``, or the owner
    declares them) for the default DR release at this (n, epsilon) to be quoted worth its
    budget (``versus_ate`` verdict ``possible``), where the request's effect model sees every
    covariate; None where it names columns already, the learner is S, or no count will do.
    Public: the quote's noise of the first k covariates (about any k, the noise depends on the
    count), the largest such k by bisection (the noise grows with k)."""
    if request.learner == "s" or domain.q < 2:
        return None
    if effect_columns_of(request.effect_columns, domain, request.learner) is not None:
        return None

    h = request.expected_heterogeneity_sd or versus_ate.default_heterogeneity_sd(domain)

    def possible(k: int) -> bool:  # versus_ate's "possible": noise < WORTH_IT_RATIO * h and
        # the calibration step detects h (anchored releases)
        trial = request.model_copy(update={"effect_columns": list(range(k))})
        if noise_sd(trial, domain) >= versus_ate.WORTH_IT_RATIO * h:
            return False
        found = detectable_sd(trial, domain)
        return found is None or found < h

    if not possible(1):
        return None
    low, high = 1, domain.q - 1
    while low < high:
        middle = (low + high + 1) // 2
        if possible(middle):
            low = middle
        else:
            high = middle - 1
    return low


def with_modifiers_hint(
    block: dict[str, Any], request: EbmCateRequest, domain: PublicDomain
) -> dict[str, Any]:
    """A ``versus_ate`` block with ``effect_modifiers_worth_it`` (``modifiers_worth_it``) where
    its verdict is not ``possible``, and a sentence saying so."""
    if block.get("verdict") == "possible":
        return block
    count = modifiers_worth_it(request, domain)
    block["effect_modifiers_worth_it"] = count
    if count is not None:
        block["message"] += (
            f" Or name at most {count} effect modifiers from your protocol (effect_columns, or "
            "the owner declares them in the schema): the DP-EBM effect model's noise falls "
            f"about in proportion to the covariates it sees, and with {count} or fewer this "
            "CATE is expected to be worth its budget."
        )
    return block


def asks_for_ebm(
    selector: str,
    chosen: str | None,
    effect_columns: list[int] | None,
    changed: list[str],
    what: str,
) -> bool | None:
    """The part of the CATE kinds' ebm rules that reads the request alone: True where it asks
    for the ebm_cate release (``selector`` is ``"ebm"`` or ``effect_columns`` is given), False
    where it asks for the kind's own estimator (named, or one of its fields ``changed``), None
    where the kind's public rule decides.

    Raises:
        ValidationFailed: the ebm release together with a ``changed`` field of ``what``, or
            ``effect_columns`` with another estimator named.
    """
    if effect_columns is not None and chosen not in (None, "ebm"):
        raise refuse_columns_without_ebm(selector, chosen)
    if chosen == "ebm" or effect_columns is not None:
        if changed:
            raise refuse_with_ebm(selector, changed, what)
        return True
    if chosen is not None or changed:
        return False
    return None


def refuse_columns_without_ebm(selector: str, chosen: str) -> ValidationFailed:
    """422: ``effect_columns`` (the ebm release's field) with another estimator named."""
    return ValidationFailed(
        f'effect_columns shapes the ebm_cate release only; it needs "{selector}": "ebm" '
        f'(or none), not "{chosen}"',
        errors=[{"pointer": "#/params/effect_columns", "detail": f"not with {selector} {chosen}"}],
    )


def public_facts(result: dict[str, Any]) -> dict[str, Any]:
    return {key: result[key] for key in PUBLIC_FIELDS if key in result}


def changed_fields(params: KindParams, defaults: dict[str, Any]) -> list[str]:
    """The fields of ``defaults`` whose request value differs from the default (values only,
    so a stored request, every field dumped, reads alike)."""
    return [name for name, value in defaults.items() if getattr(params, name) != value]


def refuse_with_ebm(selector: str, changed: list[str], what: str) -> ValidationFailed:
    """422: ``selector: "ebm"`` asked for together with fields of the other estimator."""
    return ValidationFailed(
        f'these parameters shape the {what} only; leave them out with "{selector}": "ebm"',
        errors=[{"pointer": f"#/params/{name}", "detail": f"{what} only"} for name in changed],
    )


def _as_params(params: Any) -> EbmCateRequest:
    if isinstance(params, EbmCateRequest):
        return params
    return EbmCateRequest.model_validate(params)


def _quoted_as_unscreened(request: EbmCateRequest, domain: PublicDomain) -> dict[str, Any]:
    """The mechanism's quote of a request, a screened default quoted as the model on every
    covariate (``noise_sd``)."""
    if request.effect_screen is None and request.effect_columns is None:
        request = request.model_copy(update={"effect_screen": False})
    return ebm_cate.quote(domain, to_mechanism_params(request, domain))


def detectable_sd(request: EbmCateRequest, domain: PublicDomain) -> float | None:
    """The smallest sd(tau) the request's calibration step detects (anchored releases; public:
    ``ebm_cate.detectable_heterogeneity_sd``), the screened default quoted as ``noise_sd``."""
    return ebm_cate.detectable_heterogeneity_sd(domain, _quoted_as_unscreened(request, domain))


def noise_sd(request: EbmCateRequest, domain: PublicDomain) -> float:
    """Public per-prediction privacy-noise sd of a request (``prediction_noise_sd``). A
    screened default (proof step 9) is quoted as the model on every covariate: which 8 columns
    the DP screen keeps is not known before the release, and at small n epsilon it misses the
    modifiers (bench/README.md, "The effect-modifier screen"), so the quote does not promise
    the 8-column model's smaller noise."""
    return ebm_cate.prediction_noise_sd(domain, _quoted_as_unscreened(request, domain))
