"""Gaussian-process noise for released functions: consistent conditional draws (pure numerics).

What it provides (spec ``cate_function_gp.md`` §6.2, §9, §10):

* ``gaussian_kernel(a, b, bandwidth)``: the unnormalised kernel ``k0(x, x') = exp(-|x - x'|^2 /
  (2 h^2))`` on points already scaled to ``[0, 1]^q``. The service stores and samples in ``k0``
  terms (unit diagonal); the normalised kernel of the paper is ``K = c_q k0``.
* ``GpPath``: the secret state of one unit GP sample path ``u = G(x)`` observed at the distinct
  canonical points ``X_S``: the values ``u_S``, the per-point jitters ``D_S`` actually used, the
  lower Cholesky factor ``L_S`` of ``k0(X_S, X_S) + diag(D_S)`` and ``w_S = L_S^{-1} u_S``.
  ``draw(X_*)`` samples ``u_* | u_S`` (the state unchanged; a later draw supersedes it) and
  ``append`` commits it.

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


# Rows of the output filled per step of ``squared_distances`` (a small temporary of this many
# rows; the output itself is written in place).
_DISTANCE_ROWS = 64


def squared_distances(a: FloatArray, b: FloatArray, *, out: FloatArray | None = None) -> FloatArray:
    """Pairwise squared Euclidean distances, clamped at 0 (rows of ``a`` by rows of ``b``).

    Computed as ``(|a|^2 + |b|^2) - 2 a b^T`` into ``out`` (a C-contiguous ``(len(a), len(b))``
    array, allocated if None) with a temporary of a few rows only: a 10^3 x 10^4 kernel is on the
    hot path of exact-mode batches, and on a virtual machine a fresh 80 MB array can cost more
    in page faults than its arithmetic. The doubling is exact and the sum is formed first, so
    every entry is bitwise that of the plain expression.
    """
    aa = np.einsum("ij,ij->i", a, a)
    bb = np.einsum("ij,ij->i", b, b)
    if out is None:
        out = np.empty((a.shape[0], b.shape[0]), dtype=np.float64)
    np.matmul(a, b.T, out=out)
    out *= 2.0
    rows = np.empty((min(_DISTANCE_ROWS, a.shape[0]), b.shape[0]), dtype=np.float64)
    for start in range(0, a.shape[0], _DISTANCE_ROWS):
        stop = min(start + _DISTANCE_ROWS, a.shape[0])
        block = rows[: stop - start]
        np.add(aa[start:stop, None], bb[None, :], out=block)
        np.subtract(block, out[start:stop], out=out[start:stop])
    np.maximum(out, 0.0, out=out)
    return out


def gaussian_kernel(
    a: FloatArray, b: FloatArray, bandwidth: float, *, out: FloatArray | None = None
) -> FloatArray:
    """``k0(a_i, b_j) = exp(-|a_i - b_j|^2 / (2 h^2))`` (unit diagonal), in place (``out``)."""
    d2 = squared_distances(np.asarray(a, np.float64), np.asarray(b, np.float64), out=out)
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
    cross: FloatArray  # (t, m) V = L_S^{-1} k0(X_S, X_*); may be the path's workspace
    block: FloatArray  # (m, m) L_** (lower)
    whitened: FloatArray  # (m,) xi, the extension of w = L^{-1} u
    stamp: int  # the path's draw counter when made: ``append`` takes only the latest draw


class GpPath:
    """One unit GP sample path observed at distinct points; secret server-side state.

    The factor is kept transposed: ``R = L^T`` (upper) in a Fortran-ordered ``capacity x
    capacity`` buffer, so the first ``t`` columns are contiguous and LAPACK's triangular solve
    (``R^T V = K``) runs on them without a copy, and a batch's new factor rows ``V^T`` are new
    contiguous columns ``V`` of ``R``: the append is a plain copy, not a transpose (O(t^2 m)
    per batch of m, O(t^2) memory). ``V`` itself is solved in place in a workspace the path
    reuses, so a wide batch allocates no new 80 MB arrays (whose page faults cost up to a
    quarter of a second on a virtual machine); a draw therefore stays valid only until the
    path's next draw, and ``append`` refuses an older one.
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
        self._r = np.zeros((self._cap, self._cap), dtype=np.float64, order="F")
        self._work = np.zeros(0, dtype=np.float64)
        self._draws = 0
        self._ahead_columns = 0  # ``ahead``: columns already handed out
        self._work_ahead = False

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
        return self._r[: self.t, : self.t].T

    # -- drawing -------------------------------------------------------------------------------
    def draw(self, points: FloatArray, *, normals: Normals, jitter: float = DEFAULT_JITTER) -> Draw:
        """Sample ``u_* | u_S`` at new distinct points (not in the path).

        The path's state (points, values, factor) is unchanged; the draw supersedes any earlier
        draw not yet appended (it reuses the workspace), so only this one can be appended.

        Raises:
            GpNumericalError: the conditional covariance fails the jitter schedule.
        """
        x_new = np.ascontiguousarray(points, dtype=np.float64).reshape(-1, self.q)
        m = x_new.shape[0]
        k_new = gaussian_kernel(x_new, x_new, self.bandwidth)
        self._draws += 1
        if self.t == 0:
            cross = np.zeros((0, m), dtype=np.float64)
            cov = k_new
            mean = np.zeros(m, dtype=np.float64)
        else:
            cross = self._solve_cross(x_new)
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
            stamp=self._draws,
        )

    def ahead(self, m: int) -> list[FloatArray]:
        """Memory a next batch of up to ``m`` points will write first and no earlier call
        returned (views): the factor's next columns (rows up to ``t + m``, which covers their
        upper triangle) and a new workspace. For a caller that faults pages in ahead of time;
        the path itself never needs it."""
        stop = min(self.t + m, self._cap)
        regions = []
        if stop > self._ahead_columns:
            start = max(self.t, self._ahead_columns)
            regions.append(self._r[:stop, start:stop])
            self._ahead_columns = stop
        if self._work.size and not self._work_ahead:
            regions.append(self._work)
            self._work_ahead = True
        return regions

    def solve_lower(self, rhs: FloatArray) -> FloatArray:
        """``L_S^{-1} rhs`` for ``rhs`` of shape (t, m), without copying ``L_S``."""
        if self.t == 0:
            return np.zeros((0, rhs.shape[1]), dtype=np.float64)
        return self._solve_in_place(np.array(rhs, dtype=np.float64, order="F"))

    def _solve_cross(self, x_new: FloatArray) -> FloatArray:
        """``V = L_S^{-1} k0(X_S, X_*)``, the O(t^2 m) step of every batch, in the workspace.

        The kernel is built as ``k0(X_*, X_S)`` (C order, m x t), whose transpose is the
        Fortran-ordered (t, m) right-hand side LAPACK wants, and the solve overwrites it.
        """
        t, m = self.t, x_new.shape[0]
        if self._work.size < t * m:
            # Room for this batch size up to the capacity, so growing t reuses it.
            self._work = np.empty(max(t, self._cap) * m, dtype=np.float64)
            self._work_ahead = False
        kernel = self._work[: t * m].reshape(m, t)
        gaussian_kernel(x_new, self.points, self.bandwidth, out=kernel)
        return self._solve_in_place(kernel.T)

    def _solve_in_place(self, rhs: FloatArray) -> FloatArray:
        view = self._r[:, : self.t]  # F-contiguous (capacity, t); LAPACK uses lda = capacity
        solution, info = lapack.dtrtrs(view, rhs, lower=0, trans=1, lda=self._cap, overwrite_b=1)
        if info != 0:
            raise GpNumericalError("triangular solve failed")
        return np.asarray(solution, dtype=np.float64)

    def append(self, draw: Draw) -> None:
        """Extend the path with a draw made from its current state (block Cholesky update)."""
        m = draw.values.shape[0]
        if draw.cross.shape != (self.t, m) or draw.stamp != self._draws:
            raise ValueError("the draw was not made from the current state")
        self._reserve(self.t + m)
        t = self.t
        self._x[t : t + m] = draw.points
        self._u[t : t + m] = draw.values
        self._d[t : t + m] = draw.jitters
        self._w[t : t + m] = draw.whitened
        if t:
            self._r[:t, t : t + m] = draw.cross  # L's new rows V^T are R's new columns V
        self._r[t : t + m, t : t + m] = draw.block.T
        self._draws += 1  # the workspace (and so ``draw.cross``) is no longer a valid draw
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
        self._draws += 1
        k_new = gaussian_kernel(x_new, x_new, self.bandwidth) + np.diag(d_new)
        if self.t:
            cross = self._solve_cross(x_new)
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
                stamp=self._draws,
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
        factor[:t, :t] = self._r[:t, :t]
        self._x, self._u, self._d, self._w, self._r = x, u, d, w, factor
        self._ahead_columns = 0
        self._cap = cap

    def nbytes(self) -> int:
        """Memory held by the in-process cache (the factor dominates: O(capacity^2))."""
        return int(
            self._x.nbytes
            + self._u.nbytes
            + self._d.nbytes
            + self._w.nbytes
            + self._r.nbytes
            + self._work.nbytes
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
