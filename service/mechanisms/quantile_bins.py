"""DP quantile bins for a DP-EBM's continuous covariates: a charged marginal-CDF transform.

interpret's private binning cuts each continuous covariate on 64 equal-width cells of its
public bounds and merges them into at most 32 bins of equal noisy mass. On a skewed covariate
declared with its honest range (a CRP of 0-300 mg/l whose median is 8) one cell holds a third
of the rows, so the model cannot tell a CRP of 1 from one of 4, and an AIPW on such nuisances
keeps part of the confounding (bench/README.md, ``nuisance_structure``).

What it releases (to the calling mechanism, never to a client):
    for each continuous covariate j, noisy counts of the fit rows in ``CELLS`` equal-width cells
    of its public bounds (one Gaussian mechanism on the concatenated histograms). Everything
    after is post-processing: the noisy counts are accumulated (unbiased), divided by the public
    fold size, made monotone by isotonic regression and clipped to [0, 1], giving a
    piecewise-linear CDF ``F_j`` with knots at the public cell edges; the covariate is replaced
    by ``F_j(x_j)`` in the public box [0, 1]. A cell holding a third of the rows then spans a
    third of [0, 1], where interpret's 64 equal-width cells split it (linearly in x_j), so the
    bins follow the quantiles even with few cells.

Neighbouring relation:
    replace-one inside the fold the histograms are measured on, with its size public. A
    replaced row leaves one cell and enters one cell in each of the J histograms, so the L2
    sensitivity of the concatenated counts is ``sqrt(2 J)`` (proof: docs/proofs/ate_strict.md
    §14).

Pure: no I/O; the noise comes from the caller's sampler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.domain import PublicDomain
from service.mechanisms.noise import (
    GaussianCalibration,
    NoiseSampler,
    calibrate_gaussian,
    release_gaussian,
)

# Equal-width cells per covariate (public). Few cells suffice (the transform stretches a dense
# cell, see above) and keep the accumulated noise of a CDF value (sqrt(k) sigma) small.
CELLS = 32
# Share of a DP-EBM module's (epsilon, delta) spent on its histograms (public).
SHARE = 0.1
# A module uses the bins only where the public noise of its CDF at the median cell,
# sqrt(CELLS / 2) sigma / m for a fold of m rows, is at most this (``accurate_enough``).
MAX_CDF_ERROR = 0.1

FloatArray = NDArray[np.float64]


def continuous_columns(domain: PublicDomain) -> tuple[int, ...]:
    """The numeric covariates (no declared codes) with a non-degenerate public range."""
    codes = domain.x_codes or (None,) * domain.q
    lower = np.asarray(domain.x_lower, np.float64)
    upper = np.asarray(domain.x_upper, np.float64)
    return tuple(j for j in range(domain.q) if codes[j] is None and upper[j] > lower[j])


def sensitivity(columns: int) -> float:
    """Replace-one L2 sensitivity of ``columns`` concatenated count histograms: sqrt(2 J)."""
    return math.sqrt(2.0 * columns)


@dataclass(frozen=True)
class QuantileBins:
    """The public plan of one module's histograms: columns, cells and the calibration."""

    columns: tuple[int, ...]
    calibration: GaussianCalibration

    @classmethod
    def plan(cls, columns: tuple[int, ...], epsilon: float, delta: float) -> QuantileBins:
        calibration = calibrate_gaussian(
            epsilon, delta, sensitivity(len(columns)), dim=len(columns) * CELLS
        )
        return cls(columns, calibration)

    def cdf_error(self, fold_size: int) -> float:
        """Public sd of a released CDF value at the median cell: sqrt(CELLS / 2) sigma / m."""
        return math.sqrt(CELLS / 2.0) * self.calibration.sigma / float(fold_size)

    def accurate_enough(self, fold_size: int) -> bool:
        """The public rule for a module of ``fold_size`` rows: ``cdf_error <= MAX_CDF_ERROR``."""
        return self.cdf_error(fold_size) <= MAX_CDF_ERROR

    def measure(
        self, x: FloatArray, lower: FloatArray, upper: FloatArray, noise: NoiseSampler
    ) -> FloatArray:
        """The released CDF values at the public cell edges, shape ``(J, CELLS + 1)``.

        ``x`` holds the fold's rows, already inside the public box. Each row counts once in
        each covariate's histogram (values at an upper bound fall in the last cell).
        """
        histograms = counts(x, lower, upper, self.columns)
        noisy = release_gaussian(histograms.reshape(-1), self.calibration, noise)
        return cdf_knots(noisy.reshape(len(self.columns), CELLS), x.shape[0])


def counts(
    x: FloatArray, lower: FloatArray, upper: FloatArray, columns: tuple[int, ...]
) -> FloatArray:
    """The exact histograms ``(J, CELLS)``: each row in one equal-width cell of each listed
    covariate's public bounds (clipped into them; the upper bound in the last cell)."""
    out = np.empty((len(columns), CELLS), dtype=np.float64)
    for row, j in enumerate(columns):
        width = (upper[j] - lower[j]) / CELLS
        cell = np.floor((np.clip(x[:, j], lower[j], upper[j]) - lower[j]) / width)
        index = np.clip(cell, 0, CELLS - 1).astype(np.int64)
        out[row] = np.bincount(index, minlength=CELLS)[:CELLS]
    return out


def cdf_knots(noisy_counts: FloatArray, fold_size: int) -> FloatArray:
    """Post-processing: the CDF at the ``CELLS + 1`` public edges from noisy counts.

    The running sums of the noisy counts (unbiased for the true running counts) are divided by
    the public fold size, fitted by isotonic regression (monotone; no positive bias from
    clipping single cells) and clipped to [0, 1], with 0 at the lower bound and 1 at the upper.
    """
    from sklearn.isotonic import isotonic_regression

    running = np.cumsum(noisy_counts, axis=1)[:, :-1] / float(fold_size)
    knots = np.empty((noisy_counts.shape[0], noisy_counts.shape[1] + 1), dtype=np.float64)
    knots[:, 0], knots[:, -1] = 0.0, 1.0
    for row in range(noisy_counts.shape[0]):
        knots[row, 1:-1] = np.clip(isotonic_regression(running[row]), 0.0, 1.0)
    return knots


def transform(
    x: FloatArray,
    lower: FloatArray,
    upper: FloatArray,
    columns: tuple[int, ...],
    knots: FloatArray,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(x', lower', upper')``: each listed covariate replaced by its released CDF (linear
    between the public edges) with public bounds [0, 1]; the others unchanged. Monotone in
    each covariate, so rows keep their order; post-processing of the release."""
    out = np.array(x, dtype=np.float64, copy=True)
    new_lower = np.array(lower, dtype=np.float64, copy=True)
    new_upper = np.array(upper, dtype=np.float64, copy=True)
    for row, j in enumerate(columns):
        edges = np.linspace(lower[j], upper[j], CELLS + 1)
        out[:, j] = np.interp(np.clip(x[:, j], lower[j], upper[j]), edges, knots[row])
        new_lower[j], new_upper[j] = 0.0, 1.0
    return out, new_lower, new_upper
