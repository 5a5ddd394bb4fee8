"""DP quantile bins for a DP-EBM's continuous covariates: a charged marginal-CDF transform.

interpret's private binning cuts each continuous covariate on 64 equal-width cells of its
public bounds and merges them into at most 32 bins of equal noisy mass. On a skewed covariate
declared with its honest range (a CRP of 0-300 mg/l whose median is 8) one cell holds a third
of the rows, so the model cannot tell a CRP of 1 from one of 4, and an AIPW on such nuisances
keeps part of the confounding (bench/README.md, ``nuisance_structure``).

What it releases (to the calling mechanism, never to a client):
    for each continuous covariate j, noisy counts of the fit rows in ``CELLS`` equal-width cells
    of its public bounds (one Gaussian mechanism on the concatenated histograms). Everything
    after is post-processing: the counts are clipped at 0 and accumulated into a monotone
    piecewise-linear CDF ``F_j`` with knots at the public cell edges, and the covariate is
    replaced by ``F_j(x_j)`` in the public box [0, 1]. interpret's equal-width binning of
    ``F_j(x_j)`` then cuts near the quantiles.

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

# Equal-width cells per covariate (public). Twice interpret's 64: finer where the mass is,
# while the accumulated noise of a CDF value (at most sqrt(CELLS) cells) stays small.
CELLS = 128
# Share of a DP-EBM module's (epsilon, delta) spent on its histograms (public).
SHARE = 0.1

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

    def measure(
        self, x: FloatArray, lower: FloatArray, upper: FloatArray, noise: NoiseSampler
    ) -> FloatArray:
        """The released CDF values at the public cell edges, shape ``(J, CELLS + 1)``.

        ``x`` holds the fold's rows, already inside the public box. Each row counts once in
        each covariate's histogram (values at an upper bound fall in the last cell).
        """
        histograms = counts(x, lower, upper, self.columns)
        noisy = release_gaussian(histograms.reshape(-1), self.calibration, noise)
        return cdf_knots(noisy.reshape(len(self.columns), CELLS))


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


def cdf_knots(noisy_counts: FloatArray) -> FloatArray:
    """Post-processing: counts clipped at 0, accumulated and normalised to a CDF at the
    ``CELLS + 1`` edges (0 at the lower bound, 1 at the upper). A histogram with no positive
    count gives the identity (uniform) CDF."""
    clipped = np.clip(noisy_counts, 0.0, None)
    cumulative = np.concatenate(
        [np.zeros((clipped.shape[0], 1)), np.cumsum(clipped, axis=1)], axis=1
    )
    totals = cumulative[:, -1:]
    uniform = np.linspace(0.0, 1.0, clipped.shape[1] + 1)[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        knots = np.where(totals > 0.0, cumulative / totals, uniform)
    return np.asarray(knots, dtype=np.float64)


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
