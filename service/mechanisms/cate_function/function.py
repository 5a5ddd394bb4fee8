"""The released function: the kernel ridge second stage (pure, closed form), the secret
FittedFunction with its answers, and the GP path as the service starts it."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import scipy.linalg
from numpy.typing import NDArray

from service.mechanisms import gp
from service.mechanisms.cate_function.calibration import (
    _CHUNK,
    CANONICAL_BITS,
    NYSTROM_JITTER,
    FloatArray,
    Plan,
)
from service.mechanisms.ebm_cate.estimation import effect_values

# ---- second stage (pure, closed form) -------------------------------------------------------


def scale_to_unit(x: FloatArray, lower: FloatArray, upper: FloatArray) -> FloatArray:
    """Map the public box to [0, 1]^q (clipping first)."""
    clipped = np.clip(x, lower, upper)
    return np.asarray((clipped - lower) / (upper - lower), dtype=np.float64)


def canonicalise(scaled: FloatArray) -> tuple[NDArray[np.int64], FloatArray]:
    """Round scaled points to the public lattice 2^-CANONICAL_BITS; returns (codes, points)."""
    steps = float(1 << CANONICAL_BITS)
    codes = np.rint(np.clip(scaled, 0.0, 1.0) * steps).astype(np.int64)
    return codes, np.asarray(codes / steps, dtype=np.float64)


def fit_exact(
    x: FloatArray, targets: FloatArray, weights: FloatArray, *, bandwidth: float, lambda0: float
) -> FloatArray:
    """alpha of the exact KRR ``(W^2 K0 + n lambda0 I)^{-1} W r`` (§4), via the symmetric form.

    With W invertible (|w_i| >= kappa_pi), alpha = W beta and ``(W K0 W + n lambda0 I) beta =
    r``; the DR learner is W = I with r = phi.
    """
    n = x.shape[0]
    gram = gp.gaussian_kernel(x, x, bandwidth)
    system = weights[:, None] * gram * weights[None, :]
    system[np.diag_indices(n)] += n * lambda0
    beta = scipy.linalg.solve(system, targets, assume_a="pos")
    return np.asarray(weights * beta, dtype=np.float64)


def _centre_metric(centres: FloatArray, bandwidth: float) -> FloatArray:
    gram = gp.gaussian_kernel(centres, centres, bandwidth)
    gram[np.diag_indices(centres.shape[0])] += NYSTROM_JITTER
    return gram


def fit_basis(
    features: Callable[[FloatArray], FloatArray],
    x: FloatArray,
    targets: FloatArray,
    weights: FloatArray,
    *,
    metric: FloatArray,
    lambda0: float,
) -> FloatArray:
    """Coefficients minimising ``(1/n) |W(r/w) - W F beta|^2 ...``: the R/DR loss in a basis.

    Solves ``(F^T W^2 F + n lambda0 M) beta = F^T W r`` with F the (chunked) basis matrix and M
    the public metric (jittered centre Gram for Nystrom, I for random features).
    """
    n = x.shape[0]
    m = metric.shape[0]
    lhs = np.zeros((m, m), dtype=np.float64)
    rhs = np.zeros(m, dtype=np.float64)
    for start in range(0, n, _CHUNK):
        f = features(x[start : start + _CHUNK])
        w = weights[start : start + _CHUNK]
        fw = f * w[:, None]
        lhs += fw.T @ fw
        rhs += fw.T @ targets[start : start + _CHUNK]
    lhs += n * lambda0 * metric
    lhs = 0.5 * (lhs + lhs.T)
    return np.asarray(scipy.linalg.solve(lhs, rhs, assume_a="pos"), dtype=np.float64)


FunctionKind = Literal["gp", "centres", "rff", "ebm"]


@dataclass(frozen=True)
class ReferenceDraw:
    """The exact GP path drawn at the public reference points at release time (secret state)."""

    codes: NDArray[np.int64]  # canonical codes of the points
    values: FloatArray  # unit GP values u
    answers: FloatArray  # the released answers there
    jitters: FloatArray


def on_output_lattice(values: FloatArray, step: float, value_bound: float) -> FloatArray:
    """``values`` rounded to the public output lattice of spacing ``step`` and clipped to
    ``[-value_bound, value_bound]``: every released function answer."""
    rounded = np.rint(np.asarray(values, dtype=np.float64) / step) * step
    return np.asarray(np.clip(rounded, -value_bound, value_bound), dtype=np.float64)


@dataclass
class FittedFunction:
    """The secret state of one released function (never returned).

    ``kind = "gp"``: ``g*(x) = k0(x, support) @ coef`` plus the GP noise ``r0 u(x)`` drawn on
    demand; ``kind = "centres"`` / ``"rff"``: ``g_DP(x) = basis(x) @ coef`` with the noise
    already in ``coef``; ``kind = "ebm"``: a strict ebm_cate release (``model``: its DP effect
    model's safe fields and shrinkage; ``support`` and ``coef`` empty), ``g(x)`` its deviation
    ``clip(model(x) - centre, -G, G)`` and ``anchor``, ``shrink`` its anchor and factor, so the
    answers are ebm_cate's predictions (proof §9).
    """

    kind: FunctionKind
    bandwidth: float
    r0: float
    support: FloatArray  # (s, q): D_2 rows, Nystrom centres or RFF frequencies
    coef: FloatArray
    output_lattice_exponent: int
    meta: dict[str, float] = field(default_factory=dict)
    value_bound: float = math.inf  # public |CATE| bound R_Y; inf for functions stored before it
    # proof §7 (public once released): answers are anchor + shrink * (g(x) + noise)
    anchor: float = 0.0
    shrink: float = 1.0
    # exact basis with shrinkage: the GP path's draws at the reference points, persisted as the
    # function's first batch (never serialised with the fit)
    reference: ReferenceDraw | None = None
    # kind "ebm": {"effect": SafeEbm dict, "centre", "deviation_bound", "x_lower", "x_upper"}
    model: dict[str, Any] | None = None

    def basis(self, points: FloatArray) -> FloatArray:
        if self.kind == "rff":
            return gp.random_features(points, self.support)
        return gp.gaussian_kernel(points, self.support, self.bandwidth)

    def mean(self, points: FloatArray) -> FloatArray:
        """``g*(x)`` (``kind="gp"``) or ``g_DP(x)`` (finite bases), chunked over the support."""
        if self.kind == "ebm":
            return self._ebm_deviation(points)
        out = np.zeros(points.shape[0], dtype=np.float64)
        support_chunk = max(1, (1 << 22) // max(points.shape[0], 1))
        if self.kind == "rff":
            return np.asarray(self.basis(points) @ self.coef, dtype=np.float64)
        for start in range(0, self.support.shape[0], support_chunk):
            block = self.support[start : start + support_chunk]
            out += (
                gp.gaussian_kernel(points, block, self.bandwidth)
                @ self.coef[start : start + support_chunk]
            )
        return out

    def _ebm_deviation(self, points: FloatArray) -> FloatArray:
        """kind "ebm": the model's deviation at canonical points in [0, 1]^q (post-processing
        of the DP model; the points are mapped back to the public box)."""
        if self.model is None:
            raise ValueError("an ebm function needs its model")
        lower = np.asarray(self.model["x_lower"], dtype=np.float64)
        upper = np.asarray(self.model["x_upper"], dtype=np.float64)
        x = lower + np.asarray(points, dtype=np.float64) * (upper - lower)
        values = effect_values(self.model, x)  # reads the release's effect columns, if any
        bound = float(self.model["deviation_bound"])
        return np.asarray(
            np.clip(np.nan_to_num(values - float(self.model["centre"])), -bound, bound),
            dtype=np.float64,
        )

    def released(self, mean: FloatArray, unit_noise: FloatArray | None = None) -> FloatArray:
        """The answers at points where ``mean = self.mean(points)`` (and, ``kind="gp"``, the unit
        GP path's values there): ``anchor + shrink (g(x) + r0 u(x))``, rounded and clipped."""
        values = np.asarray(mean, dtype=np.float64)
        if self.kind == "gp":
            if unit_noise is None:
                raise ValueError("a GP function's answers need the path's values")
            values = values + self.r0 * np.asarray(unit_noise, dtype=np.float64)
        return self.round_output(self.anchor + self.shrink * values)

    def round_output(self, values: FloatArray) -> FloatArray:
        """Round to the public output lattice 2^k and clip to the public CATE range
        ``[-R_Y, R_Y]`` (post-processing of the DP values)."""
        step = math.ldexp(1.0, self.output_lattice_exponent)
        return on_output_lattice(values, step, self.value_bound)

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez(
            buffer,
            kind=np.array(self.kind),
            bandwidth=np.array(self.bandwidth),
            r0=np.array(self.r0),
            support=self.support,
            coef=self.coef,
            output_lattice_exponent=np.array(self.output_lattice_exponent),
            value_bound=np.array(self.value_bound),
            anchor=np.array(self.anchor),
            shrink=np.array(self.shrink),
            model=np.array(json.dumps(self.model) if self.model is not None else ""),
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> FittedFunction:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            kind = str(z["kind"])
            if kind not in ("gp", "centres", "rff", "ebm"):
                raise ValueError("unknown function kind")
            stored = str(z["model"]) if "model" in z.files else ""
            model = json.loads(stored) if stored else None
            if kind == "ebm" and not isinstance(model, dict):
                raise ValueError("an ebm function needs its model")
            return cls(
                kind=cast(FunctionKind, kind),
                bandwidth=float(z["bandwidth"]),
                r0=float(z["r0"]),
                support=np.asarray(z["support"], dtype=np.float64),
                coef=np.asarray(z["coef"], dtype=np.float64),
                output_lattice_exponent=int(z["output_lattice_exponent"]),
                value_bound=float(z["value_bound"]) if "value_bound" in z.files else math.inf,
                anchor=float(z["anchor"]) if "anchor" in z.files else 0.0,
                shrink=float(z["shrink"]) if "shrink" in z.files else 1.0,
                model=model,
            )

    def nbytes(self) -> int:
        extra = len(json.dumps(self.model)) if self.model is not None else 0
        return int(self.support.nbytes + self.coef.nbytes + extra)

    @classmethod
    def from_ebm_release(
        cls,
        result: dict[str, Any],
        *,
        x_lower: FloatArray,
        x_upper: FloatArray,
        value_bound: float,
        output_lattice_exponent: int,
    ) -> FittedFunction:
        """kind "ebm" from a strict, anchored ebm_cate DR result (post-processing: the model's
        safe fields, its anchor, factor, centre and public deviation bound G)."""
        model = result["model"]
        shrink = model.get("shrinkage")
        if model.get("kind") != "effect" or not isinstance(shrink, dict):
            raise ValueError("an ebm function is an anchored DR effect model")
        return cls(
            kind="ebm",
            bandwidth=0.0,
            r0=0.0,
            support=np.zeros((0, len(x_lower)), dtype=np.float64),
            coef=np.zeros(0, dtype=np.float64),
            output_lattice_exponent=output_lattice_exponent,
            value_bound=value_bound,
            anchor=float(shrink["anchor"]),
            shrink=float(shrink["factor"]),
            model={
                "effect": model["effect"],
                **({} if model.get("columns") is None else {"columns": list(model["columns"])}),
                "centre": float(shrink["centre"]),
                "deviation_bound": float(shrink["deviation_bound"]),
                "x_lower": [float(v) for v in x_lower],
                "x_upper": [float(v) for v in x_upper],
            },
        )


def second_stage(
    state: Plan,
    x2: FloatArray,
    targets: FloatArray,
    weights: FloatArray,
    *,
    rng: np.random.Generator,
    normals: gp.Normals,
) -> FittedFunction:
    """Fit the second stage on scaled D_2 and attach the noise (finite bases) or its scale (GP).

    ``x2`` is already scaled to [0, 1]^q. ``rng`` supplies the random frequencies (RFF, data
    independent, public); ``normals`` the unit normals of the finite bases' coefficient noise
    (the vetted sampler's ``standard_normal`` in production).
    """
    scale = state.scale
    h = scale.bandwidth

    def released(kind: FunctionKind, support: FloatArray, coef: FloatArray) -> FittedFunction:
        return FittedFunction(
            kind,
            h,
            scale.r0,
            support,
            coef,
            state.output_lattice_exponent,
            value_bound=state.value_bound,
        )

    q = state.q
    params = state.params
    if state.fit == "rff":
        # proof step 5 (RFF): frequencies drawn independently of the data, kappa = 1.
        frequencies = rng.normal(0.0, 1.0 / h, size=(params.n_features, q))
        metric = np.eye(2 * params.n_features)
        coef = fit_basis(
            lambda pts: gp.random_features(pts, frequencies),
            x2,
            targets,
            weights,
            metric=metric,
            lambda0=scale.lambda0,
        )
        # proof step 6 (RFF): beta_DP = beta + r0 xi, Hall's mechanism for k_RFF.
        coef = coef + scale.r0 * np.asarray(normals(coef.shape[0]), dtype=np.float64)
        return released("rff", frequencies, coef)
    if state.fit == "nystrom":
        centres = gp.sobol_centres(params.n_centres, q)
        metric = _centre_metric(centres, h)
        coef = fit_basis(
            lambda pts: gp.gaussian_kernel(pts, centres, h),
            x2,
            targets,
            weights,
            metric=metric,
            lambda0=scale.lambda0,
        )
        if params.basis == "nystrom":
            # proof step 6 (Nystrom): beta_DP = beta + r0 eta, eta ~ N(0, M^{-1}).
            coef = coef + scale.r0 * gp.nystrom_noise(metric, normals=normals)
            return released("centres", centres, coef)
        return released("gp", centres, coef)
    alpha = fit_exact(x2, targets, weights, bandwidth=h, lambda0=scale.lambda0)
    return released("gp", x2.copy(), alpha)


def start_path(fitted: FittedFunction, q: int, capacity: int) -> gp.GpPath:
    """An exact function's GP path as the service starts it: with the reference draw, if any
    (in-process evaluation for benchmarks and tests; the service replays stored batches)."""
    path = gp.GpPath(q, fitted.bandwidth, capacity=capacity, max_capacity=capacity)
    if fitted.reference is not None:
        steps = 1.0 / float(1 << CANONICAL_BITS)
        path.extend_known(
            np.asarray(fitted.reference.codes * steps, dtype=np.float64),
            fitted.reference.values,
            fitted.reference.jitters,
        )
    return path
