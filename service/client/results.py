"""Typed wrappers over a release's ``result`` dict, one per release kind.

Only ``ate`` exists on the server today. The wrappers for the later kinds (``cate_vector``,
``cate_function``, ``ebm_cate``, ``uplift_table``) are deliberately thin: they parse the fields
their specs describe (``spec/cate_vector.md``, ``cate_function_gp.md``, ``dp_ebm_learners.md``,
``adum.md``), keep the whole dict in ``raw`` and are tested on synthetic dicts only.
TODO(issue 6): check them against the server's kinds when those land.

Every field here is a DP output, its post-processing or public metadata: nothing else is released.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Protocol

from service.client.models import Release


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


def _first(result: dict[str, Any], *names: str) -> Any:
    """The first of ``names`` present in ``result`` (kinds spell some fields differently)."""
    for name in names:
        if result.get(name) is not None:
            return result[name]
    return None


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

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> AteResult:
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
        )


@dataclass(frozen=True)
class CateVectorResult:
    """DP CATE values at public points or cells (``kind: "cate_vector"``; provisional)."""

    values: list[float]
    points: list[list[float]] | None
    noise_sd: list[float] | None
    guarantee: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> CateVectorResult:
        raw_values = _first(result, "values", "estimates", "cate")
        values = _floats(raw_values, "values")
        points = _points(result.get("points"))
        if points is not None and len(points) != len(values):
            raise ValueError("points and values have different lengths")
        return cls(
            values=values,
            points=points,
            noise_sd=_sd(_first(result, "noise_sd", "noise_sd_upper_bound"), len(values)),
            guarantee=str(result.get("guarantee", "")),
            raw=dict(result),
        )

    def bands(self, level: float = 0.95) -> list[tuple[float, float]] | None:
        """Pointwise noise bands ``value ± z·sd`` (privacy noise only), if sd is public."""
        return _bands(self.values, self.noise_sd, level)


def _bands(
    values: Sequence[float], sd: Sequence[float] | None, level: float
) -> list[tuple[float, float]] | None:
    if sd is None:
        return None
    z = z_value(level)
    return [(v - z * s, v + z * s) for v, s in zip(values, sd, strict=True)]


@dataclass(frozen=True)
class FunctionEvaluation:
    """Values of a released CATE function at query points (free: answered from the GP state)."""

    points: list[list[float]]
    values: list[float]
    noise_sd: list[float] | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_response(
        cls, body: dict[str, Any], points: Sequence[Sequence[float]]
    ) -> FunctionEvaluation:
        values = _floats(body.get("values"), "values")
        returned = _points(body.get("points"))
        pts = returned if returned is not None else [[float(c) for c in p] for p in points]
        if len(pts) != len(values):
            raise ValueError("points and values have different lengths")
        return cls(
            points=pts,
            values=values,
            noise_sd=_sd(_first(body, "noise_sd", "pointwise_noise_sd"), len(values)),
            raw=body,
        )

    def bands(self, level: float = 0.95) -> list[tuple[float, float]] | None:
        """Pointwise noise bands ``value ± z·sd`` (the GP noise is correlated across points)."""
        return _bands(self.values, self.noise_sd, level)


class _Evaluator(Protocol):
    def evaluate_function(
        self, function_id: str, points: Sequence[Sequence[float]]
    ) -> FunctionEvaluation: ...


@dataclass(frozen=True)
class FunctionHandle:
    """A released CATE function (``kind: "cate_function"``); evaluating it costs no budget."""

    function_id: str
    release_id: str
    guarantee: str
    raw: dict[str, Any] = field(repr=False)
    _client: _Evaluator | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_release(cls, release: Release, client: _Evaluator | None = None) -> FunctionHandle:
        result = release.result or {}
        return cls(
            function_id=str(result.get("function_id", release.id)),
            release_id=release.id,
            guarantee=str(result.get("guarantee", release.guarantee)),
            raw=dict(result),
            _client=client,
        )

    def evaluate(self, points: Sequence[Sequence[float]]) -> FunctionEvaluation:
        """POST /v1/functions/{id}/evaluate: the function's DP values at ``points``."""
        if self._client is None:
            raise RuntimeError("this handle is not bound to a client")
        return self._client.evaluate_function(self.function_id, points)


@dataclass(frozen=True)
class ShapeFunction:
    """One term of an EBM: piecewise-constant scores over bins of a feature."""

    feature: str
    edges: list[float]
    scores: list[float]
    categorical: bool


@dataclass(frozen=True)
class EbmShapeResult:
    """DP-EBM CATE shape functions and intercept (``kind: "ebm_cate"``; provisional)."""

    intercept: float
    shape_functions: list[ShapeFunction]
    guarantee: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> EbmShapeResult:
        shapes = []
        for item in result.get("shape_functions", []):
            edges = _floats(item.get("edges", item.get("bins", [])), "edges")
            scores = _floats(_first(item, "scores", "values"), "scores")
            categorical = bool(item.get("categorical", False))
            if not categorical and len(edges) != len(scores) + 1:
                raise ValueError("a numeric shape function needs len(edges) == len(scores) + 1")
            if categorical and len(edges) != len(scores):
                raise ValueError("a categorical shape function needs one score per code")
            shapes.append(
                ShapeFunction(
                    feature=str(item.get("feature", item.get("name", ""))),
                    edges=edges,
                    scores=scores,
                    categorical=categorical,
                )
            )
        return cls(
            intercept=float(result.get("intercept", 0.0)),
            shape_functions=shapes,
            guarantee=str(result.get("guarantee", "")),
            raw=dict(result),
        )


@dataclass(frozen=True)
class UpliftTable:
    """A DP uplift table, one row per public cell (``kind: "uplift_table"``; provisional)."""

    columns: list[str]
    rows: list[dict[str, Any]]
    guarantee: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> UpliftTable:
        rows = result.get("rows")
        if rows is None and isinstance(result.get("uplift"), list):
            rows = _columnar_rows(result, len(result["uplift"]))
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError("result has neither 'rows' nor an 'uplift' column")
        columns: list[str] = list(result.get("columns") or [])
        for row in rows:
            columns += [k for k in row if k not in columns]
        return cls(
            columns=columns, rows=rows, guarantee=str(result.get("guarantee", "")), raw=result
        )


def _columnar_rows(result: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Rows from parallel per-cell lists (``uplift``, ``uplift_noise_sd``, ``mean_treated``...)."""
    names = [k for k, v in result.items() if isinstance(v, list) and len(v) == n and k != "bins"]
    return [{"cell": i, **{k: result[k][i] for k in names}} for i in range(n)]


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
