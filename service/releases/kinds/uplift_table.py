"""The ``uplift_table`` release kind: epsilon-ADUM on a public grid or DP k-means cells (pure DP).

Exception: the default (shrinkage "ate") on a one-cell grid of an observational dataset is the
``ate`` kind's default release at the request's (epsilon, delta) (the strict DP AIPW ATE, in
chunks where its chunks rule applies; docs/proofs/uplift_table.md step 6): one cell adjusts for
no covariate.

Where the public estimator rule picks ``"ebm"`` (effect modifiers named by the request or
declared by the owner, the DP-EBM effect model learns at this (n, epsilon), every table field at
its default), the release is the strict ``ebm_cate`` release read at the public centres of a
grid over the effect columns (post-processing; proof step 7), with that release's record.

Predictions at public points are free lookups via ``POST /v1/releases/{id}/predict``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, StrictBool, StrictFloat, StrictInt

from service.mechanisms import ebm_cate, uplift
from service.mechanisms.domain import Arrays, PublicDomain
from service.mechanisms.errors import InvalidParameters
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.records import MechanismRecord
from service.problems import ValidationFailed
from service.releases.kinds import ebm_cate as ebm_kind
from service.releases.kinds.base import KindParams, Progress, versus_ate_block

Estimator = Literal["table", "ebm"]
CutPoints = Annotated[list[Annotated[StrictFloat, Field(allow_inf_nan=False)]], Field(min_length=1)]


class UpliftTableRequest(KindParams):
    """Request parameters of an ``uplift_table`` release."""

    epsilon: StrictFloat = Field(gt=0, allow_inf_nan=False)
    delta: StrictFloat | None = Field(
        default=None,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        description="only where the release is (epsilon, delta)-DP (the ebm estimator, or the "
        "one-cell observational default, the adjusted DP ATE); omitted: that release's public "
        "default delta. The epsilon-ADUM table is pure epsilon-DP and refuses it",
    )
    bins: list[StrictInt] | None = Field(
        default=None,
        min_length=1,
        description="cells per covariate of the regular grid; omitted (grid): the public "
        "partition-size rule's suggestion at this epsilon (uplift.default_bins)",
    )
    cut_points: dict[str, CutPoints] | None = Field(
        default=None,
        min_length=1,
        description="instead of bins: the grid's public cut points, keyed by the schema's "
        'covariate name (e.g. {"crp": [5, 10, 50]}); each list strictly increasing and strictly '
        "inside the covariate's declared bounds; a cell runs from one cut to the next, [c_k, "
        "c_{k+1}), the outermost to the bounds; a covariate not named is not cut",
    )
    quantile_cuts: (
        dict[str, Annotated[StrictInt, Field(ge=2, le=uplift.MAX_QUANTILE_CELLS)]] | None
    ) = Field(
        default=None,
        min_length=1,
        description='cells at DP quantiles, keyed by numeric covariate name (e.g. {"crp": 4}: '
        "CRP cut at its DP quartiles); the cut points are measured by OpenDP's quantile "
        "mechanism with 10 % of epsilon and released with the table; with cut_points on other "
        "covariates, not with bins",
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
    # DP AIPW ATE of the ate kind's default (the whole epsilon, its default delta, in chunks
    # where its chunks rule applies; no adjustment_partition needed), since one cell adjusts for
    # nothing. "none": the raw table.
    shrinkage: Literal["ate", "none"] | None = None
    # "table": the epsilon-ADUM table above. "ebm": the strict ebm_cate default release (DP-EBM
    # DR learner, anchored) read at the centres of the grid's cells (default grid: every effect
    # column cut, uplift.ebm_grid). None: the public rule ``estimator_for`` ("ebm" where effect
    # modifiers are named or declared, the DP-EBM effect model learns at this n epsilon and every
    # table field above except bins is at its default; else "table").
    estimator: Estimator | None = None
    # The ebm estimator's effect modifiers (ebm_cate's effect_columns: 0-based positions in the
    # schema's covariate list); given, the estimator is "ebm". None: the owner's declared ones.
    effect_columns: list[StrictInt] | None = Field(default=None, min_length=1)
    # Quote only: the heterogeneity sd(tau) you expect, for the quote's verdict against the
    # constant ATE (versus_ate); None: the public default R_Y / 24. Ignored by a release.
    expected_heterogeneity_sd: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)


# The table estimator's own fields and their defaults: a request changing any keeps the table.
TABLE_DEFAULTS: dict[str, Any] = {
    "quantile_cuts": None,
    "min_count": 1.0,
    "low_count_threshold": 10.0,
    "adjustment_partition": False,
    "partition": "grid",
    "clusters": None,
    "kmeans_share": 0.5,
    "kmeans_iterations": 5,
    "shrinkage": None,
}


def estimator_for(params: UpliftTableRequest, domain: PublicDomain) -> Estimator:
    """The public estimator rule (values only, so a stored request resolves alike): the one
    asked for; else ``"ebm"`` where effect modifiers are named (``effect_columns``) or declared
    by the owner, ``ebm_kind.preferred`` holds (observational: the anchored ebm_cate default can
    run; RCT: the DP-EBM effect model learns on the modifiers, ``ebm_kind.learns``), the
    request leaves every table field at its default and its ``bins`` (if any) cut every effect
    column; else ``"table"``.

    Raises:
        ValidationFailed: ``"ebm"`` asked for together with a table field, or
            ``effect_columns`` with ``"table"``.
    """
    changed = ebm_kind.changed_fields(params, TABLE_DEFAULTS)
    asked = ebm_kind.asks_for_ebm(
        "estimator", params.estimator, params.effect_columns, changed, "epsilon-ADUM table"
    )
    if asked is not None:
        return "ebm" if asked else "table"
    columns = ebm_kind.effect_columns_of(None, domain)
    if columns is None or not ebm_kind.preferred(domain, params.epsilon, params.delta):
        return "table"
    shape = requested_shape(params, domain)
    if shape is not None:
        cut = len(shape) == domain.q and not uplift.uncut_columns(shape, columns)
        return "ebm" if cut else "table"
    try:
        uplift.ebm_grid(domain, columns, ebm_cate.DR_DEFAULT_MAX_BINS)
    except InvalidParameters:
        return "table"
    return "ebm"


def _partial_grid_note(params: UpliftTableRequest, domain: PublicDomain) -> str | None:
    """Why an omitted estimator resolved to the epsilon-ADUM table where the schema declares
    effect modifiers: the request's grid leaves some of them uncut (a trial walkthrough's
    ``cut_points`` on age alone switched the estimator, and the verdict, without a word).
    None where that is not why."""
    if params.estimator is not None:
        return None
    columns = ebm_kind.effect_columns_of(None, domain)
    if columns is None or not ebm_kind.preferred(domain, params.epsilon, params.delta):
        return None
    changed = ebm_kind.changed_fields(params, TABLE_DEFAULTS)
    if changed:
        return (
            f"estimator 'table' (epsilon-ADUM): {', '.join(changed)} shape(s) the table only, "
            "so the ebm table (the DP-EBM effect model over the declared effect modifiers, the "
            "default where modifiers are declared) does not run; leave them out for it (it "
            "cuts at the model's own DP bins, or at your bins / cut_points over every declared "
            "modifier)"
        )
    shape = requested_shape(params, domain)
    if shape is None:
        return None
    uncut = uplift.uncut_columns(shape, columns) if len(shape) == domain.q else []
    if not uncut:
        return None
    names = ", ".join(domain.names[j] for j in uncut)
    return (
        f"estimator 'table' (epsilon-ADUM): your grid leaves the declared effect modifier(s) "
        f"{names} uncut, and the ebm table (the DP-EBM effect model tabulated, the default "
        "where modifiers are declared) cuts every one of them; cut them all for it, or name "
        "estimator 'table' to keep this one"
    )


@contextmanager
def _noted(params: UpliftTableRequest, domain: PublicDomain) -> Iterator[None]:
    """A refusal of the epsilon-ADUM table also says why the table, not the declared
    modifiers' ebm table, was chosen (a health economist's cut on one of two declared modifiers
    was refused with advice to name modifiers the owner had declared)."""
    try:
        yield
    except InvalidParameters as exc:
        note = _partial_grid_note(params, domain)
        if note is None:
            raise
        raise InvalidParameters(f"{exc}. Why the table: {note}") from None


def cut_point_columns(
    params: UpliftTableRequest, domain: PublicDomain
) -> tuple[tuple[float, ...], ...] | None:
    """The request's ``cut_points`` per covariate position (empty: not cut); None without them.

    Raises:
        ValidationFailed: a key that names no covariate of the dataset.
    """
    if params.cut_points is None:
        return None
    _refuse_unknown("cut_points", params.cut_points, domain)
    names = domain.names
    return tuple(tuple(params.cut_points.get(name, ())) for name in names)


def quantile_cut_columns(
    params: UpliftTableRequest, domain: PublicDomain
) -> tuple[int, ...] | None:
    """The request's ``quantile_cuts`` per covariate position (0: none); None without them.

    Raises:
        ValidationFailed: a key that names no covariate of the dataset.
    """
    if params.quantile_cuts is None:
        return None
    _refuse_unknown("quantile_cuts", params.quantile_cuts, domain)
    return tuple(params.quantile_cuts.get(name, 0) for name in domain.names)


def _refuse_unknown(field: str, mapping: dict[str, Any], domain: PublicDomain) -> None:
    unknown = [key for key in mapping if key not in domain.names]
    if unknown:
        raise ValidationFailed(
            f"{field} names '{unknown[0]}', which is not a covariate of this dataset (the "
            "keys are the schema's covariate names)",
            errors=[
                {
                    "pointer": f"#/params/{field}/{_pointer_token(key)}",
                    "detail": "not a covariate of this dataset",
                }
                for key in unknown
            ],
        )


def requested_shape(params: UpliftTableRequest, domain: PublicDomain) -> tuple[int, ...] | None:
    """Cells per covariate of the grid the request gives (``bins`` or ``cut_points``); None
    when it gives neither.

    Raises:
        ValidationFailed / InvalidParameters: invalid cut points, or both given.
    """
    if params.cut_points is None and params.quantile_cuts is None:
        return None if params.bins is None else tuple(params.bins)
    return uplift.grid_shape(domain, to_mechanism_params(params, domain))


def ebm_bins(params: UpliftTableRequest, domain: PublicDomain) -> tuple[int, ...]:
    """The ebm estimator's grid: the request's ``bins`` or ``cut_points``, which must cut every
    effect column (proof step 7: the table reads the model at the cell centres), else
    ``uplift.ebm_grid``.

    Raises:
        ValidationFailed: a grid that leaves an effect column uncut.
        InvalidParameters: an invalid grid, or no default grid within the cell cap.
    """
    checked = ebm_kind.to_mechanism_params(_ebm_request(params), domain)
    named = ebm_cate.checked_effect_columns(domain, checked)
    columns = list(range(domain.q)) if named is None else list(named)
    bins = requested_shape(params, domain)
    if bins is None:
        return uplift.ebm_grid(domain, columns, checked.max_bins)
    uplift.grid_cells(domain, bins)
    uncut = uplift.uncut_columns(bins, columns)
    if uncut:
        if params.cut_points is not None:
            raise ValidationFailed(
                "with the ebm estimator the grid must cut every effect column: the table reads "
                "the CATE model at the cells' centres",
                errors=[
                    {
                        "pointer": f"#/params/cut_points/{_pointer_token(domain.names[j])}",
                        "detail": "an effect column: give it at least one cut point",
                    }
                    for j in uncut
                ],
            )
        raise ValidationFailed(
            "with the ebm estimator the grid must cut every effect column (bins >= 2): the "
            "table reads the CATE model at the cells' centres",
            errors=[
                {"pointer": f"#/params/bins/{j}", "detail": "an effect column: at least 2"}
                for j in uncut
            ],
        )
    return bins


def _pointer_token(key: str) -> str:
    """A JSON Pointer reference token (RFC 6901: ``~`` and ``/`` escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def _ebm_request(params: UpliftTableRequest) -> ebm_kind.EbmCateRequest:
    return ebm_kind.default_request(
        params.epsilon,
        params.delta,
        params.expected_heterogeneity_sd,
        effect_columns=params.effect_columns,
    )


def to_mechanism_params(params: UpliftTableRequest, domain: PublicDomain) -> uplift.UpliftParams:
    cut_points = cut_point_columns(params, domain)
    quantile_cuts = quantile_cut_columns(params, domain)
    bins = tuple(params.bins or ())
    if not bins and cut_points is None and quantile_cuts is None and params.partition == "grid":
        bins = uplift.default_bins(domain, params.epsilon)
    return uplift.UpliftParams(
        epsilon=params.epsilon,
        delta=params.delta,
        bins=bins,
        cut_points=cut_points,
        quantile_cuts=quantile_cuts,
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
        """The mechanism record and cost (epsilon, 0), from public inputs only (the ebm
        estimator: the ebm_cate release's)."""
        request = _as_params(params)
        if estimator_for(request, domain) == "ebm":
            ebm_bins(request, domain)
            return ebm_kind.EbmCateKind().record(_ebm_request(request), domain)
        with _noted(request, domain):
            return uplift.plan(domain, to_mechanism_params(request, domain))

    def quote(self, params: Any, domain: PublicDomain) -> dict[str, Any]:
        """Noise scales, expected per-cell uplift sd, and the partition-size heuristic (the
        ebm estimator: ebm_cate's quote and the grid)."""
        request = _as_params(params)
        if estimator_for(request, domain) == "ebm":
            bins = ebm_bins(request, domain)
            inner = ebm_kind.EbmCateKind().quote(_ebm_request(request), domain)
            grid: dict[str, Any] = (
                {
                    "bins": list(bins),
                    "cells": uplift.grid_cells(domain, bins),
                    "grid_rule": f"the requested {_grid_name(request)}: each cell holds the "
                    "model at its centre, so the model's variation inside a cell is lost; "
                    "versus_ate's expected PEHE is the model's and leaves that loss out (the "
                    "default grid, the model's own bins, loses nothing)",
                    **_requested_edges(request, domain, bins),
                }
                if request.bins is not None or request.cut_points is not None
                else {
                    "bins": None,
                    "cells_at_most": uplift.grid_cells(domain, bins),
                    "grid_rule": "the released model's own DP bins over the effect columns "
                    "(uplift.ebm_edges), every other covariate uncut",
                }
            )
            return {
                "estimator": "ebm",
                **inner,
                "partition": "grid",
                **grid,
                "cell_value": "the ebm_cate model at the cell's centre",
            }
        with _noted(request, domain):
            quoted = uplift.quote(domain, to_mechanism_params(request, domain))
        out = {"estimator": "table", **quoted}
        note = _partial_grid_note(request, domain)
        if note is not None:
            out["estimator_note"] = note
        out = _with_coverage(out, request, domain)
        out["versus_ate"] = versus_ate_block(
            request,
            domain,
            lambda r: _noise_sd(r, domain),
            noise_label="the error of a cell's uplift (its privacy noise and its sampling error "
            "at the assumed outcome sd)",
            # with 2 cells the factor is a fixed prior ratio, not a detection (anchor
            # .james_stein_factor): such a table behaves as unshrunk, and is quoted so
            anchored=out["shrinkage"] == "ate" and int(out["cells"]) >= 3,
            constant=_one_cell(out),
            # its anchor is its own cells' count-weighted DP mean over all rows, not a fold's
            anchor_source="table",
        )
        # the compared sd adds the sampling error: the privacy part by itself beside it
        out["versus_ate"]["privacy_noise_sd"] = out["approx_privacy_noise_sd_per_cell"]
        if request.estimator is None and not ebm_kind.changed_fields(request, TABLE_DEFAULTS):
            # naming effect_columns would make this request's estimator the ebm table
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
        """Release the table after the charge; ``ReleaseFailed`` on any data-time failure."""
        request = _as_params(params)
        if estimator_for(request, domain) == "ebm":
            bins = ebm_bins(request, domain)
            fitted = ebm_kind.EbmCateKind().run(
                arrays, domain, _ebm_request(request), rng=rng, noise=noise, progress=progress
            )
            table = uplift.ebm_table(
                lambda x: ebm_cate.predict(fitted, x),
                domain,
                _table_edges(request, domain, fitted, bins),
            )
            return {"estimator": "ebm", **ebm_kind.public_facts(fitted), **table}
        out = uplift.run(
            arrays,
            domain,
            to_mechanism_params(request, domain),
            noise=noise,
            progress=progress,
            rng=rng,
        )
        return _with_coverage({"estimator": "table", **out}, request, domain)


def _with_coverage(
    out: dict[str, Any], request: UpliftTableRequest, domain: PublicDomain
) -> dict[str, Any]:
    """A one-cell observational table is the ``ate`` kind's default release at its (epsilon,
    delta) (in chunks where its chunks rule applies): its ``adjusted_ate`` gets that release's
    ``coverage`` block (what its interval covers and the coverage measured), as an ``ate``
    result has. A re-test's one-cell table showed its interval without the warning that it
    leaves out the DP nuisance models' bias. Public: the design and the request only."""
    adjusted = out.get("adjusted_ate")
    if not isinstance(adjusted, dict):
        return out
    from service.releases.kinds.ate import AteKind, AteParams

    ate_request = AteParams(epsilon=request.epsilon, delta=request.delta)
    coverage = AteKind().quote(ate_request, domain)["coverage"]
    return {**out, "adjusted_ate": {**adjusted, "coverage": coverage}}


def _table_edges(
    request: UpliftTableRequest,
    domain: PublicDomain,
    fitted: dict[str, Any],
    bins: tuple[int, ...],
) -> list[list[float]]:
    """The ebm table's cells: the request's grid (regular, or at its cut points), else the
    released model's own bins over its effect columns (``uplift.ebm_edges``,
    post-processing)."""
    requested = _requested_edges(request, domain, bins)
    if requested:
        return list(requested["edges"])
    model = fitted["model"]
    columns = [int(j) for j in model.get("columns", range(domain.q))]
    return uplift.ebm_edges(domain, columns, model["effect"]["cuts"])


def _requested_edges(
    request: UpliftTableRequest, domain: PublicDomain, bins: tuple[int, ...]
) -> dict[str, Any]:
    """``{"edges": ...}`` of the grid the request gives (regular ``bins`` or ``cut_points``);
    empty when it gives neither."""
    cut_points = cut_point_columns(request, domain)
    if cut_points is not None:
        return {"edges": uplift.declared_edges(domain, cut_points)}
    if request.bins is not None:
        return {"edges": uplift.regular_edges(domain, bins)}
    return {}


def _grid_name(request: UpliftTableRequest) -> str:
    return "cut points' grid" if request.cut_points is not None else "regular grid"


def _as_params(params: Any) -> UpliftTableRequest:
    if isinstance(params, UpliftTableRequest):
        return params
    return UpliftTableRequest.model_validate(params)


def _one_cell(quoted: dict[str, Any]) -> tuple[str, str] | None:
    """(why, what instead) for a one-cell table, which is one number for every patient."""
    if quoted["cells"] != 1:
        return None
    instead = (
        "name the effect modifiers (effect_columns): the table is then the ebm_cate model over "
        "them, adjusted for every covariate; or request ebm_cate or cate_function"
    )
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
    """Public per-cell error sd of a request (expected_cell_error_sd: the table's Laplace noise
    and the cell's sampling error at the assumed outcome sd, as versus_ate's message says; the
    quote's approx_uplift_sd_per_cell puts the sampling error at the worst-case outcome sd)."""
    quoted = uplift.quote(domain, to_mechanism_params(request, domain))
    return float(quoted["expected_cell_error_sd"])
