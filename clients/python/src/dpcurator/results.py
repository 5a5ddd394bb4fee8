"""Typed wrappers over a release's ``result`` dict, one per release kind.

Each wrapper reads the fields its kind's ``run()`` returns (``service/releases/kinds/*.py``) and
keeps the whole dict in ``raw``; fields the server adds later are kept there, not refused.
``FunctionEvaluation`` and ``Prediction`` wrap the responses of ``POST /v1/functions/{id}/evaluate``
and ``POST /v1/releases/{id}/predict``.

Every field here is a DP output, its post-processing or public metadata: nothing else is released.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Protocol

from dpcurator.models import Release


def _floats(value: Any, what: str) -> list[float]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"result field '{what}' is not a list")
    return [float(v) for v in value]


def _points(value: Any) -> list[list[float]] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise ValueError("result field 'points' is not a list of points")
    return [[float(c) for c in (p if isinstance(p, list | tuple) else [p])] for p in value]


def _sd(value: Any, n: int) -> list[float] | None:
    """A public noise standard deviation, scalar or per point, as one value per point."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        out = [float(v) for v in value]
        if len(out) != n:
            raise ValueError("noise_sd has a different length than values")
        return out
    return [float(value)] * n


def z_value(level: float) -> float:
    """Two-sided standard-normal quantile for a central interval of probability ``level``."""
    if not 0.0 < level < 1.0:
        raise ValueError("level must lie in (0, 1)")
    return NormalDist().inv_cdf(0.5 + level / 2.0)


@dataclass(frozen=True)
class AteResult:
    """A DP average treatment effect with its confidence interval (``kind: "ate"``)."""

    estimate: float
    ci_lower: float
    ci_upper: float
    ci_level: float
    half_width: float
    guarantee: str
    epsilon: float
    delta: float
    design: str | None
    raw: dict[str, Any] = field(repr=False)
    # What the interval covers (the service's ``coverage.message``); None from older servers.
    coverage_note: str | None = None

    @property
    def estimator(self) -> str | None:
        """Which estimator ran (``aipw``, ``ipw``, ``rct_difference``; on a trial an omitted
        one is chosen by a public rule), None where the result does not say."""
        value = self.raw.get("estimator")
        return None if value is None else str(value)

    @property
    def nuisance(self) -> str | None:
        """The ``aipw`` release's nuisance models (``dp_linear``, ``dp_ebm``, ``none``)."""
        value = self.raw.get("nuisance")
        return None if value is None else str(value)

    @property
    def chunk_estimates(self) -> tuple[float, ...] | None:
        """A subsample-and-aggregate result's chunk estimates (the request's ``chunks``, or the
        observational default's by its public rule: one DP estimate per disjoint chunk; the
        interval is the t interval over them), else None."""
        values = self.raw.get("chunk_estimates")
        if not isinstance(values, list):
            return None
        return tuple(float(v) for v in values)

    @property
    def measured_coverage(self) -> tuple[float, float] | None:
        """The coverage (lowest, highest) the service's simulations measured for intervals like
        this one, where it states one (its ``coverage`` block: the measured band of the
        request's nuisance preset, or what a narrowed clip covered on observational studies);
        None where it states none (a randomised design's interval holds its nominal level)."""
        coverage = self.raw.get("coverage")
        if not isinstance(coverage, dict):
            return None
        for key in ("measured", "narrowed_clip_coverage"):
            block = coverage.get(key)
            if isinstance(block, dict) and "coverage_low" in block and "coverage_high" in block:
                return float(block["coverage_low"]), float(block["coverage_high"])
        return None

    @property
    def below_nominal(self) -> bool:
        """Whether the measured coverage falls short of the nominal level (by more than the
        simulations' noise, 2 points): read the interval as a lower bound on the uncertainty."""
        measured = self.measured_coverage
        return measured is not None and measured[0] < self.ci_level - 0.02

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> AteResult:
        coverage = result.get("coverage")
        note = coverage.get("message") if isinstance(coverage, dict) else None
        return cls(
            estimate=float(result["estimate"]),
            ci_lower=float(result["ci_lower"]),
            ci_upper=float(result["ci_upper"]),
            ci_level=float(result.get("ci_level", 0.95)),
            half_width=float(
                result.get("half_width", (result["ci_upper"] - result["ci_lower"]) / 2)
            ),
            guarantee=str(result.get("guarantee", "")),
            epsilon=float(result.get("epsilon", 0.0)),
            delta=float(result.get("delta", 0.0)),
            design=str(result["design"]) if result.get("design") is not None else None,
            raw=dict(result),
            coverage_note=str(note) if note is not None else None,
        )


@dataclass(frozen=True)
class CateVectorResult:
    """DP CATE estimates at the request's public query points (``kind: "cate_vector"``).

    The result holds ``estimates`` only; the query points are the request's ``params.points``.
    The noise sd is not in the result: strict mode's quote has a public upper bound
    (``accuracy.noise_sd_upper_bound``), which ``bands`` takes explicitly.
    """

    estimates: list[float]
    points: list[list[float]] | None
    learner: str
    guarantee: str
    epsilon: float
    delta: float
    raw: dict[str, Any] = field(repr=False)
    estimator: str = "ridge"  # "ebm": the ebm_cate release evaluated at the points

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> CateVectorResult:
        estimates = _floats(result.get("estimates"), "estimates")
        points = _points(result.get("points"))
        if points is not None and len(points) != len(estimates):
            raise ValueError("points and estimates have different lengths")
        return cls(
            estimates=estimates,
            points=points,
            learner=str(result.get("learner", "")),
            guarantee=str(result.get("guarantee", "")),
            epsilon=float(result.get("epsilon", 0.0)),
            delta=float(result.get("delta", 0.0)),
            raw=dict(result),
            estimator=str(result.get("estimator", "ridge")),
        )

    def bands(
        self, noise_sd_upper_bound: float | None, level: float = 0.95
    ) -> list[tuple[float, float]]:
        """Pointwise privacy-noise bands ``estimate ± z·sd`` from the quote's public sd bound.

        Raises:
            ValueError: no bound (``None``: the quote of the ``ebm`` estimator has none, its
                error is the ``ebm_cate`` release's; see ``versus_ate.prediction_noise_sd``).
        """
        if noise_sd_upper_bound is None:
            raise ValueError(
                f"no pointwise noise bound for the {self.estimator} estimator: its quote's "
                "noise_sd_upper_bound is null (the ebm estimator's error is the ebm_cate "
                "release's; the quote's versus_ate.prediction_noise_sd gives its scale)"
            )
        bands = _bands(self.estimates, [float(noise_sd_upper_bound)] * len(self.estimates), level)
        assert bands is not None
        return bands


def _bands(
    values: Sequence[float], sd: Sequence[float] | None, level: float
) -> list[tuple[float, float]] | None:
    if sd is None:
        return None
    z = z_value(level)
    return [(v - z * s, v + z * s) for v, s in zip(values, sd, strict=True)]


@dataclass(frozen=True)
class FunctionEvaluation:
    """``POST /v1/functions/{id}/evaluate``: a released CATE function's values at points (free).

    ``pointwise_noise_sd`` is the public sd of the fitted function's privacy noise at any point
    before shrinkage (strict kernel bases only; ``None`` on the ebm basis and in paper mode);
    ``shrinkage_factor`` the anchored function's factor (None: unanchored). An answer carries the
    factor times that noise, which ``noise_sd`` repeats per point for ``bands`` and the plots; at
    factor 0 every answer is the DP ATE anchor and there is no noise band (the anchor's interval,
    ``ate_anchor_interval``, is the error bar where the anchor has one).
    """

    function_id: str
    points: list[list[float]]
    values: list[float]
    guarantee: str
    pointwise_noise_sd: float | None
    raw: dict[str, Any] = field(repr=False)
    shrinkage_factor: float | None = None
    ate_anchor_interval: dict[str, float] | None = None

    @classmethod
    def from_response(
        cls, body: dict[str, Any], points: Sequence[Sequence[float]]
    ) -> FunctionEvaluation:
        """Pair the response (``EvaluateRead``) with the request's points, in order."""
        values = _floats(body.get("values"), "values")
        pts = [[float(c) for c in p] for p in points]
        if len(pts) != len(values):
            raise ValueError("points and values have different lengths")
        sd = body.get("pointwise_noise_sd")
        factor = body.get("shrinkage_factor")
        return cls(
            function_id=str(body.get("function_id", "")),
            points=pts,
            values=values,
            guarantee=str(body.get("guarantee", "")),
            pointwise_noise_sd=float(sd) if sd is not None else None,
            raw=body,
            shrinkage_factor=float(factor) if factor is not None else None,
            ate_anchor_interval=(
                {str(k): float(v) for k, v in interval.items()}
                if isinstance(interval := body.get("ate_anchor_interval"), dict)
                else None
            ),
        )

    @property
    def answers_the_ate_everywhere(self) -> bool:
        """True where every answer is the DP ATE anchor (shrinkage factor 0)."""
        return self.shrinkage_factor == 0.0

    @property
    def ate_anchor(self) -> float | None:
        """The DP ATE an anchored function falls back to (None: unanchored)."""
        return _optional_float(self.raw.get("ate_anchor"))

    @property
    def noise_sd(self) -> list[float] | None:
        """The privacy noise sd of each answer: the factor times ``pointwise_noise_sd`` (None
        without a public sd, and at factor 0, where the answers carry none of it)."""
        if self.pointwise_noise_sd is None or self.answers_the_ate_everywhere:
            return None
        factor = 1.0 if self.shrinkage_factor is None else self.shrinkage_factor
        return _sd(factor * self.pointwise_noise_sd, len(self.values))

    def bands(self, level: float = 0.95) -> list[tuple[float, float]] | None:
        """Pointwise noise bands ``value ± z·sd`` (the GP noise is correlated across points)."""
        return _bands(self.values, self.noise_sd, level)


def _optional_int(value: Any) -> int | None:
    return int(value) if value is not None else None


def _optional_float(value: Any) -> float | None:
    return float(value) if value is not None else None


def _optional_dict(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, dict) else None


def _optional_dicts(value: Any) -> list[dict[str, Any]] | None:
    if not isinstance(value, list):
        return None
    return [dict(v) for v in value if isinstance(v, dict)]


@dataclass(frozen=True)
class FunctionInfo:
    """``GET /v1/functions/{id}``: public metadata of a released function (``FunctionRead``).

    ``status`` is ``open`` while it answers; ``t_max`` (exact basis only) is its capacity of
    distinct points, ``points_per_principal`` the most new ones any one caller may add (None:
    no share); ``public`` holds the release's public constants and the box (``x_lower``,
    ``x_upper``).
    """

    id: str
    dataset_id: str
    status: str
    basis: str
    q: int
    t_max: int | None
    batch_max: int
    public: dict[str, Any]
    points_per_principal: int | None = None
    # the covariates' names in schema order, the order of a point's coordinates (None: a
    # function released before they were recorded)
    covariates: list[str] | None = None
    # from the dataset's public schema: per covariate its type, unit, bounds, codes and code
    # labels (``covariate_info``); the outcome's name, type, unit and bounds (an answer is in
    # its unit); the treatment's name and code labels (an answer is code 1 minus code 0).
    # None: a server that does not send them.
    covariate_info: list[dict[str, Any]] | None = None
    outcome: dict[str, Any] | None = None
    treatment: dict[str, Any] | None = None

    @classmethod
    def from_response(cls, body: dict[str, Any]) -> FunctionInfo:
        t_max = body.get("t_max")
        names = body.get("covariates")
        return cls(
            id=str(body["id"]),
            dataset_id=str(body["dataset_id"]),
            status=str(body["status"]),
            basis=str(body["basis"]),
            q=int(body["q"]),
            t_max=int(t_max) if t_max is not None else None,
            batch_max=int(body["batch_max"]),
            public=dict(body.get("public") or {}),
            points_per_principal=_optional_int(body.get("points_per_principal")),
            covariates=None if names is None else [str(v) for v in names],
            covariate_info=_optional_dicts(body.get("covariate_info")),
            outcome=_optional_dict(body.get("outcome")),
            treatment=_optional_dict(body.get("treatment")),
        )

    @property
    def pointwise_noise_sd(self) -> float | None:
        return _optional_float(self.public.get("pointwise_noise_sd"))

    @property
    def shrinkage_factor(self) -> float | None:
        """The anchored function's factor in [0, 1] (None: unanchored). At 0 every answer is
        ``ate_anchor``, the same for every patient: no heterogeneity was detectable."""
        return _optional_float(self.public.get("shrinkage_factor"))

    @property
    def ate_anchor(self) -> float | None:
        """The DP ATE the anchored function falls back to (None: unanchored)."""
        return _optional_float(self.public.get("ate_anchor"))

    @property
    def answers_the_ate_everywhere(self) -> bool:
        """True where the release is the constant DP ATE (shrinkage factor 0)."""
        return self.shrinkage_factor == 0.0

    @property
    def box(self) -> tuple[list[float], list[float]] | None:
        """The public covariate box ``(x_lower, x_upper)`` the points must lie in."""
        lower, upper = self.public.get("x_lower"), self.public.get("x_upper")
        if lower is None or upper is None:
            return None
        return _floats(lower, "x_lower"), _floats(upper, "x_upper")


class _Evaluator(Protocol):
    def evaluate_function(
        self,
        function_id: str,
        points: Sequence[Sequence[float]],
        columns: Sequence[str] | None = None,
    ) -> FunctionEvaluation: ...

    def function_info(self, function_id: str) -> FunctionInfo: ...


@dataclass(frozen=True)
class FunctionHandle:
    """A released CATE function (``kind: "cate_function"``); evaluating it costs no budget.

    The function's id is the release id. ``raw`` is the release result: public constants only
    (``bandwidth``, ``lambda0``, ``basis``, ``pointwise_noise_sd`` in strict mode, ...).
    """

    function_id: str
    release_id: str
    guarantee: str
    raw: dict[str, Any] = field(repr=False)
    _client: _Evaluator | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_release(cls, release: Release, client: _Evaluator | None = None) -> FunctionHandle:
        result = release.result or {}
        return cls(
            function_id=release.id,
            release_id=release.id,
            guarantee=str(result.get("guarantee", release.guarantee)),
            raw=dict(result),
            _client=client,
        )

    @property
    def pointwise_noise_sd(self) -> float | None:
        """Public sd of the privacy noise at any point (strict mode; ``None`` in paper mode)."""
        return _optional_float(self.raw.get("pointwise_noise_sd"))

    def _bound(self) -> _Evaluator:
        if self._client is None:
            raise RuntimeError("this handle is not bound to a client")
        return self._client

    def evaluate(
        self, points: Sequence[Sequence[float]], columns: Sequence[str] | None = None
    ) -> FunctionEvaluation:
        """POST /v1/functions/{id}/evaluate: the function's DP values at ``points`` (free);
        ``columns`` names the points' coordinates (see ``CuratorClient.evaluate_function``)."""
        return self._bound().evaluate_function(self.function_id, points, columns)

    def info(self) -> FunctionInfo:
        """GET /v1/functions/{id}: status, basis, capacity and the public constants."""
        return self._bound().function_info(self.function_id)


@dataclass(frozen=True)
class Prediction:
    """``POST /v1/releases/{id}/predict``: a stored ``ebm_cate`` / ``uplift_table`` model's CATE
    at public points (free post-processing; no noise sd is published with it)."""

    release_id: str
    kind: str
    guarantee: str
    points: list[list[float]]
    predictions: list[float]
    raw: dict[str, Any] = field(repr=False)

    @property
    def shrinkage_factor(self) -> float | None:
        """An anchored model's DP shrinkage factor (None: unanchored)."""
        return _optional_float(self.raw.get("shrinkage_factor"))

    @property
    def ate_anchor(self) -> float | None:
        """The DP ATE an anchored model falls back to (None: unanchored)."""
        return _optional_float(self.raw.get("ate_anchor"))

    @property
    def answers_the_ate_everywhere(self) -> bool:
        """True where the factor is 0: every prediction is the DP ATE anchor."""
        return self.shrinkage_factor == 0.0

    @classmethod
    def from_response(cls, body: dict[str, Any], points: Sequence[Sequence[float]]) -> Prediction:
        predictions = _floats(body.get("predictions"), "predictions")
        pts = [[float(c) for c in p] for p in points]
        if len(pts) != len(predictions):
            raise ValueError("points and predictions have different lengths")
        return cls(
            release_id=str(body.get("release_id", "")),
            kind=str(body.get("kind", "")),
            guarantee=str(body.get("guarantee", "")),
            points=pts,
            predictions=predictions,
            raw=body,
        )


@dataclass(frozen=True)
class ShapeFunction:
    """One term of an EBM: piecewise-constant values over bins of a feature.

    ``edges`` are the public bounds with the DP cuts between them (``len(edges) ==
    len(scores) + 1``); ``scores`` are the server's ``values``. The server names features by
    their schema columns (``treatment`` first for the S-learner); releases stored before it did
    say ``x0``, ``x1``, ... in schema order. A categorical covariate (and the S-learner's
    treatment) also has its declared ``codes`` and each code's value (``code_values``: the
    value of the bin the code falls in); releases stored before 2026-11-29 have neither.
    """

    feature: str
    edges: list[float]
    scores: list[float]
    codes: list[int] | None = None
    code_values: list[float] | None = None

    @property
    def categorical(self) -> bool:
        """True where the shape is given per declared code."""
        return self.codes is not None


@dataclass(frozen=True)
class EbmShapeResult:
    """A DP-EBM CATE model (``kind: "ebm_cate"``): the ATE read off it and its shape functions.

    ``intercept`` is the model's intercept plus its offset (for the DR/R effect model this is
    the ``ate``; for the S-learner, the outcome model's). An anchored release (``shrinkage``
    ``"ate"``, the DR default) predicts ``anchor + factor * deviation``: its ``intercept`` is the
    DP anchor ATE and its shape functions are already multiplied by the factor. Predict at
    points with ``CuratorClient.predict`` (free).
    """

    ate: float
    intercept: float
    learner: str
    shape_functions: list[ShapeFunction]
    guarantee: str
    epsilon: float
    delta: float
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> EbmShapeResult:
        shapes = []
        for item in result.get("shape_functions", []):
            edges = _floats(item.get("edges"), "edges")
            scores = _floats(item.get("values"), "values")
            if len(edges) != len(scores) + 1:
                raise ValueError("a shape function needs len(edges) == len(values) + 1")
            codes = item.get("codes")
            code_values = None
            if codes is not None:
                code_values = _floats(item.get("code_values"), "code_values")
                codes = [int(c) for c in codes]
                if len(codes) != len(code_values):
                    raise ValueError("a shape function needs one code value per code")
            shapes.append(
                ShapeFunction(
                    feature=str(item.get("feature", "")),
                    edges=edges,
                    scores=scores,
                    codes=codes,
                    code_values=code_values,
                )
            )
        model = result.get("model") or {}
        inner = model.get("effect") or model.get("outcome") or {}
        intercept = float(inner.get("intercept", 0.0)) + float(inner.get("offset", 0.0))
        shrinkage = model.get("shrinkage")
        if isinstance(shrinkage, dict) and "anchor" in shrinkage:
            intercept = float(shrinkage["anchor"])
        return cls(
            ate=float(result.get("ate", intercept)),
            intercept=intercept,
            learner=str(result.get("learner", "")),
            shape_functions=shapes,
            guarantee=str(result.get("guarantee", "")),
            epsilon=float(result.get("epsilon", 0.0)),
            delta=float(result.get("delta", 0.0)),
            raw=dict(result),
        )

    @property
    def shrinkage_factor(self) -> float | None:
        """An anchored model's DP factor (None: unanchored); at 0 it predicts ``ate`` for all."""
        return _optional_float(self.raw.get("shrinkage_factor"))

    @property
    def anchor_source(self) -> str | None:
        """Where the anchor came from: ``effect_fold`` (its own DP ATE of one fold, without an
        interval), ``ate_release`` (an ``ate`` release on all rows, with
        ``ate_anchor_interval``) or ``given`` (the request's value); None: unanchored."""
        value = self.raw.get("anchor_source")
        return str(value) if value is not None else None


UPLIFT_COLUMNS = (
    "counts_control",
    "counts_treated",
    "mean_control",
    "mean_treated",
    "uplift",
    "released_noise_sd",
    "uplift_unshrunk",
    "uplift_noise_sd",
    "low_count",
)


def feature_label(feature: str, names: Sequence[str] | None) -> str:
    """An EBM feature as the server names it: the schema column's name (the S-learner's
    ``treatment`` as it is); a release stored before the server named covariates says ``x3``
    for covariate 3 in schema order, shown with its column's name when known: ``x3 (bmi)``."""
    if not names or feature in names or not feature.startswith("x") or not feature[1:].isdigit():
        return feature
    j = int(feature[1:])
    return f"{feature} ({names[j]})" if j < len(names) else feature


@dataclass(frozen=True)
class UpliftTable:
    """A DP uplift table (``kind: "uplift_table"``), one row per public cell.

    The server returns parallel per-cell lists (``UPLIFT_COLUMNS``); ``rows`` zips them with
    the cell index. ``partition`` is the public ``grid`` (bins, box, row-major order) or the
    DP k-means ``partition``. Look up points with ``CuratorClient.predict`` (free).
    """

    columns: list[str]
    rows: list[dict[str, Any]]
    cells: int
    partition: dict[str, Any]
    guarantee: str
    epsilon: float
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> UpliftTable:
        uplift = result.get("uplift")
        if not isinstance(uplift, list):
            raise ValueError("result has no 'uplift' column")
        n = len(uplift)
        present = [c for c in UPLIFT_COLUMNS if isinstance(result.get(c), list)]
        for name in present:
            if len(result[name]) != n:
                raise ValueError(f"result column '{name}' has a different length than 'uplift'")
        rows = [{"cell": i, **{c: result[c][i] for c in present}} for i in range(n)]
        return cls(
            columns=["cell", *present],
            rows=rows,
            cells=int(result.get("cells", n)),
            partition=dict(result.get("grid") or result.get("partition") or {}),
            guarantee=str(result.get("guarantee", "")),
            epsilon=float(result.get("epsilon", 0.0)),
            raw=dict(result),
        )


@dataclass(frozen=True)
class GenericResult:
    """A kind this client has no wrapper for: the result dict as it came."""

    kind: str
    raw: dict[str, Any]


TypedResult = (
    AteResult | CateVectorResult | EbmShapeResult | UpliftTable | FunctionHandle | GenericResult
)

PARSERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "ate": AteResult.from_result,
    "cate_vector": CateVectorResult.from_result,
    "ebm_cate": EbmShapeResult.from_result,
    "uplift_table": UpliftTable.from_result,
}


def parse_result(release: Release, client: _Evaluator | None = None) -> TypedResult:
    """The typed result of a finished release (``ValueError`` if it has none)."""
    if release.result is None:
        raise ValueError(f"release {release.id} has no result (status {release.status})")
    if release.kind == "cate_function":
        return FunctionHandle.from_release(release, client)
    parser = PARSERS.get(release.kind)
    if parser is None:
        return GenericResult(kind=release.kind, raw=dict(release.result))
    result = dict(release.result)
    if release.kind == "cate_vector" and "points" not in result and "points" in release.params:
        result["points"] = release.params["points"]  # the public query points of the request
    parsed: TypedResult = parser(result)
    return parsed
