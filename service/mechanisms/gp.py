"""Gaussian-process noise for released functions: consistent conditional draws (pure numerics).

What it provides (spec ``cate_function_gp.md`` §6.2, §9, §10):

* ``gaussian_kernel(a, b, bandwidth)``: the unnormalised kernel ``k0(x, x') = exp(-|x - x'|^2 /
  (2 h^2))`` on points already scaled to ``[0, 1]^q``. The service stores and samples in ``k0``
  terms (unit diagonal); the normalised kernel of the paper is ``K = c_q k0``.
* ``GpPath``: the secret state of one unit GP sample path ``u = G(x)`` observed at the distinct
  canonical points ``X_S``: the values ``u_S``, the per-point jitters ``D_S`` actually used, the
  lower Cholesky factor ``L_S`` of ``k0(X_S, X_S) + diag(D_S)`` and ``w_S = L_S^{-1} u_S``.
  ``draw(X_*)`` samples ``u_* | u_S`` (never mutating the state) and ``append`` commits it.

Claim (§7, chain rule): sequential conditional draws with ``u_* = V^T w_S + L_** xi`` where
``V = L_S^{-1} k0(X_S, X_*)``, ``L_** = chol(k0(X_*, X_*) + D_* - V^T V)`` and
``xi ~ N(0, I)`` have exactly the joint law ``N(0, k0(X, X) + diag(D))`` over every point ever
drawn, whatever the order and batching: the joint law of one GP path at those points plus
independent, data-independent ``N(0, D_x)`` per distinct point. The incremental factor is the
full factor of the jittered matrix (block Cholesky), and ``w`` extends by ``xi`` because
``L_** w_* = u_* - V^T w_S``.

Jitter: public ``tau^2`` (default 1e-8 on the unit diagonal), escalated x10 at most three times
when a Cholesky fails; the stored ``D_S`` is what was used (never recomputed with a uniform
``tau^2``). The kernel matrices depend only on query points and the public bandwidth, never on
private data, so failures and timings here reveal nothing about the dataset.

Random numbers: ``xi`` comes from the caller's ``normals`` (``OpenDPSampler().standard_normal``
in production: OpenDP's exact discrete Gaussian with sd 1 on ``2^-30 Z`` from its OS-seeded
CSPRNG, the one noise path of every mechanism); tests pass ``rng.standard_normal`` of a seeded
generator.

References:
    Hall, R., Rinaldo, A. and Wasserman, L. (2013). Differential privacy for functions and
    functional data. JMLR 14.
    Rasmussen, C. E. and Williams, C. K. I. (2006). Gaussian processes for machine learning,
    §2.2 and App. A.4 (block Cholesky).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.linalg
from numpy.typing import NDArray
from scipy.linalg import lapack

FloatArray = NDArray[np.float64]
# A source of independent unit normals: ``normals(m)`` returns m of them.
Normals = Callable[[int], FloatArray]

DEFAULT_JITTER = 1e-8
JITTER_ESCALATIONS = 3
JITTER_FACTOR = 10.0


class GpNumericalError(ValueError):
    """A Cholesky factor could not be computed even after the public jitter escalation."""


def squared_distances(a: FloatArray, b: FloatArray) -> FloatArray:
    """Pairwise squared Euclidean distances, clamped at 0 (rows of ``a`` by rows of ``b``).

    Computed as ``(|a|^2 + |b|^2) - 2 a b^T`` with one temporary (a 10^4 x 10^3 kernel is on
    the hot path of exact-mode batches); the doubling is exact, so the result is bitwise that of
    the plain expression.
    """
    aa = np.einsum("ij,ij->i", a, a)
    bb = np.einsum("ij,ij->i", b, b)
    cross = a @ b.T
    cross *= 2.0
    out = np.add.outer(aa, bb)
    out -= cross
    np.maximum(out, 0.0, out=out)
    return np.asarray(out, dtype=np.float64)


def gaussian_kernel(a: FloatArray, b: FloatArray, bandwidth: float) -> FloatArray:
    """``k0(a_i, b_j) = exp(-|a_i - b_j|^2 / (2 h^2))`` (unit diagonal), in place."""
    d2 = squared_distances(np.asarray(a, np.float64), np.asarray(b, np.float64))
    np.divide(d2, -(2.0 * bandwidth * bandwidth), out=d2)
    np.exp(d2, out=d2)
    return d2


def jittered_cholesky(
    matrix: FloatArray, jitter: float, *, escalations: int = JITTER_ESCALATIONS
) -> tuple[FloatArray, float]:
    """Lower Cholesky factor of ``matrix + j I`` with the public escalation schedule.

    Tries ``j = jitter, 10 jitter, ..., 10^escalations jitter`` and returns the factor with the
    jitter actually used.

    Raises:
        GpNumericalError: no jitter of the schedule gives a positive-definite matrix.
    """
    size = matrix.shape[0]
    used = jitter
    for _ in range(escalations + 1):
        try:
            factor = scipy.linalg.cholesky(
                matrix + used * np.eye(size), lower=True, check_finite=True
            )
            return np.asarray(factor, dtype=np.float64), used
        except (np.linalg.LinAlgError, ValueError):
            used *= JITTER_FACTOR
    raise GpNumericalError("the conditional covariance is not positive definite")


@dataclass(frozen=True)
class Draw:
    """A conditional draw for new distinct points, not yet appended to the path."""

    points: FloatArray  # (m, q) canonical, scaled points
    values: FloatArray  # (m,) unit-GP values u_*
    jitters: FloatArray  # (m,) per-point jitter D_* actually used
    cross: FloatArray  # (t, m) V = L_S^{-1} k0(X_S, X_*)
    block: FloatArray  # (m, m) L_** (lower)
    whitened: FloatArray  # (m,) xi, the extension of w = L^{-1} u


class GpPath:
    """One unit GP sample path observed at distinct points; secret server-side state.

    ``L`` lives in a Fortran-ordered ``capacity x capacity`` buffer, so the first ``t`` columns
    are contiguous and LAPACK's triangular solve runs on them without a copy (O(t^2 m) per
    batch of m, O(t^2) memory).
    """

    def __init__(
        self, q: int, bandwidth: float, *, capacity: int = 64, max_capacity: int | None = None
    ) -> None:
        self.q = q
        self.bandwidth = bandwidth
        self.t = 0
        self._max_cap = max_capacity
        self._cap = max(1, capacity if max_capacity is None else min(capacity, max_capacity))
        self._x = np.zeros((self._cap, q), dtype=np.float64)
        self._u = np.zeros(self._cap, dtype=np.float64)
        self._d = np.zeros(self._cap, dtype=np.float64)
        self._w = np.zeros(self._cap, dtype=np.float64)
        self._l = np.zeros((self._cap, self._cap), dtype=np.float64, order="F")

    # -- views ---------------------------------------------------------------------------------
    @property
    def points(self) -> FloatArray:
        return self._x[: self.t]

    @property
    def values(self) -> FloatArray:
        return self._u[: self.t]

    @property
    def jitters(self) -> FloatArray:
        return self._d[: self.t]

    @property
    def factor(self) -> FloatArray:
        """The lower Cholesky factor of ``k0(X_S, X_S) + diag(D_S)`` (a view)."""
        return self._l[: self.t, : self.t]

    # -- drawing -------------------------------------------------------------------------------
    def draw(self, points: FloatArray, *, normals: Normals, jitter: float = DEFAULT_JITTER) -> Draw:
        """Sample ``u_* | u_S`` at new distinct points (not in the path); the path is unchanged.

        Raises:
            GpNumericalError: the conditional covariance fails the jitter schedule.
        """
        x_new = np.ascontiguousarray(points, dtype=np.float64).reshape(-1, self.q)
        m = x_new.shape[0]
        k_new = gaussian_kernel(x_new, x_new, self.bandwidth)
        if self.t == 0:
            cross = np.zeros((0, m), dtype=np.float64)
            cov = k_new
            mean = np.zeros(m, dtype=np.float64)
        else:
            k_cross = gaussian_kernel(self.points, x_new, self.bandwidth)  # (t, m)
            cross = self.solve_lower(k_cross)
            cov = k_new - cross.T @ cross
            cov = 0.5 * (cov + cov.T)
            mean = cross.T @ self._w[: self.t]
        block, used = jittered_cholesky(cov, jitter)
        xi = np.asarray(normals(m), dtype=np.float64).reshape(m)
        values = mean + block @ xi
        return Draw(
            points=x_new,
            values=np.asarray(values, dtype=np.float64),
            jitters=np.full(m, used, dtype=np.float64),
            cross=cross,
            block=block,
            whitened=np.asarray(xi, dtype=np.float64),
        )

    def solve_lower(self, rhs: FloatArray) -> FloatArray:
        """``L_S^{-1} rhs`` for ``rhs`` of shape (t, m), without copying ``L_S``."""
        if self.t == 0:
            return np.zeros((0, rhs.shape[1]), dtype=np.float64)
        view = self._l[:, : self.t]  # F-contiguous (capacity, t); LAPACK uses lda = capacity
        solution, info = lapack.dtrtrs(
            view, np.asfortranarray(rhs, dtype=np.float64), lower=1, lda=self._cap
        )
        if info != 0:
            raise GpNumericalError("triangular solve failed")
        return np.asarray(solution, dtype=np.float64)

    def append(self, draw: Draw) -> None:
        """Extend the path with a draw made from its current state (block Cholesky update)."""
        m = draw.values.shape[0]
        if draw.cross.shape != (self.t, m):
            raise ValueError("the draw was not made from the current state")
        self._reserve(self.t + m)
        t = self.t
        self._x[t : t + m] = draw.points
        self._u[t : t + m] = draw.values
        self._d[t : t + m] = draw.jitters
        self._w[t : t + m] = draw.whitened
        if t:
            self._l[t : t + m, :t] = draw.cross.T
        self._l[t : t + m, t : t + m] = draw.block
        self.t = t + m

    def extend_known(self, points: FloatArray, values: FloatArray, jitters: FloatArray) -> None:
        """Append stored points (values and jitters known) in order, rebuilding the factor rows.

        Used to load persisted state or to catch up with rows appended by another process. The
        factor rows are recomputed from the stored per-point jitters, so the result factors
        exactly ``k0(X_S, X_S) + diag(D_S)``.

        Raises:
            GpNumericalError: the stored state is not positive definite (corrupt state).
        """
        x_new = np.ascontiguousarray(points, dtype=np.float64).reshape(-1, self.q)
        u_new = np.asarray(values, dtype=np.float64).reshape(-1)
        d_new = np.asarray(jitters, dtype=np.float64).reshape(-1)
        m = x_new.shape[0]
        if m == 0:
            return
        k_new = gaussian_kernel(x_new, x_new, self.bandwidth) + np.diag(d_new)
        if self.t:
            cross = self.solve_lower(gaussian_kernel(self.points, x_new, self.bandwidth))
            cov = k_new - cross.T @ cross
            mean = cross.T @ self._w[: self.t]
        else:
            cross = np.zeros((0, m), dtype=np.float64)
            cov = k_new
            mean = np.zeros(m, dtype=np.float64)
        try:
            block = np.asarray(
                scipy.linalg.cholesky(0.5 * (cov + cov.T), lower=True), dtype=np.float64
            )
        except (np.linalg.LinAlgError, ValueError):
            raise GpNumericalError("stored state is not positive definite") from None
        whitened = scipy.linalg.solve_triangular(block, u_new - mean, lower=True)
        self.append(
            Draw(
                points=x_new,
                values=u_new,
                jitters=d_new,
                cross=cross,
                block=block,
                whitened=np.asarray(whitened, dtype=np.float64),
            )
        )

    def _reserve(self, size: int) -> None:
        if size <= self._cap:
            return
        cap = self._cap
        while cap < size:
            cap *= 2
        if self._max_cap is not None:
            # Growth stops at the public capacity t_max: O(t_max^2) memory, never more.
            cap = max(size, min(cap, self._max_cap))
        x = np.zeros((cap, self.q), dtype=np.float64)
        u = np.zeros(cap, dtype=np.float64)
        d = np.zeros(cap, dtype=np.float64)
        w = np.zeros(cap, dtype=np.float64)
        factor = np.zeros((cap, cap), dtype=np.float64, order="F")
        t = self.t
        x[:t], u[:t], d[:t], w[:t] = self._x[:t], self._u[:t], self._d[:t], self._w[:t]
        factor[:t, :t] = self._l[:t, :t]
        self._x, self._u, self._d, self._w, self._l = x, u, d, w, factor
        self._cap = cap

    def nbytes(self) -> int:
        """Memory held by the in-process cache (the factor dominates: O(capacity^2))."""
        return int(
            self._x.nbytes + self._u.nbytes + self._d.nbytes + self._w.nbytes + self._l.nbytes
        )


def full_refactor_draw(
    points_s: FloatArray,
    values_s: FloatArray,
    jitters_s: FloatArray,
    points_new: FloatArray,
    *,
    bandwidth: float,
    normals: Normals,
    jitter: float = DEFAULT_JITTER,
) -> FloatArray:
    """The naive reference: refactor ``k0(X_S, X_S) + D_S`` from scratch for every batch.

    Same law as ``GpPath.draw``; O(t^3) per batch. Used by tests and the benchmark's baseline.
    """
    k_ss = gaussian_kernel(points_s, points_s, bandwidth) + np.diag(jitters_s)
    k_sn = gaussian_kernel(points_s, points_new, bandwidth)
    k_nn = gaussian_kernel(points_new, points_new, bandwidth)
    factor = scipy.linalg.cho_factor(k_ss, lower=True)
    mean = k_sn.T @ scipy.linalg.cho_solve(factor, values_s)
    cov = k_nn - k_sn.T @ scipy.linalg.cho_solve(factor, k_sn)
    block, _ = jittered_cholesky(0.5 * (cov + cov.T), jitter)
    xi = np.asarray(normals(points_new.shape[0]), dtype=np.float64)
    return np.asarray(mean + block @ xi, dtype=np.float64)


# ---- finite bases (§9): public centres or random features ----------------------------------


def sobol_centres(m: int, q: int) -> FloatArray:
    """The first ``m`` points of the unscrambled Sobol sequence in ``[0, 1]^q`` (public)."""
    from scipy.stats import qmc

    power = max(0, int(np.ceil(np.log2(max(m, 1)))))
    sampler = qmc.Sobol(d=q, scramble=False)
    points = sampler.random_base2(power)
    # Unscrambled Sobol starts at the origin; shift by half a cell so centres sit inside the box.
    shifted = (points[:m] + 0.5 / (1 << power)) % 1.0
    return np.asarray(shifted, dtype=np.float64)


def nystrom_noise(centre_gram: FloatArray, *, normals: Normals) -> FloatArray:
    """``eta ~ N(0, M^{-1})`` for a public, positive-definite ``M`` (the jittered centre Gram).

    With ``M = L_c L_c^T``, ``eta = L_c^{-T} xi``; the noise function ``k_c(x)^T eta`` is a GP
    with the Nystrom kernel ``k_c(x)^T M^{-1} k_c(x')``.
    """
    factor = scipy.linalg.cholesky(centre_gram, lower=True)
    xi = np.asarray(normals(centre_gram.shape[0]), dtype=np.float64)
    return np.asarray(
        scipy.linalg.solve_triangular(factor, xi, lower=True, trans="T"), dtype=np.float64
    )


def random_features(points: FloatArray, frequencies: FloatArray) -> FloatArray:
    """Paired cos/sin random Fourier features with ``|phi(x)| = 1`` (kappa = 1).

    ``phi(x) = D^{-1/2} [cos(omega_j^T x), sin(omega_j^T x)]_{j <= D}``.
    """
    projection = np.asarray(points, np.float64) @ np.asarray(frequencies, np.float64).T
    scale = 1.0 / np.sqrt(frequencies.shape[0])
    return np.asarray(np.hstack([np.cos(projection), np.sin(projection)]) * scale, dtype=np.float64)
