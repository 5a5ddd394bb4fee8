"""A charged DP screen of the effect modifiers for a DP-EBM effect model.

interpret composes a DP-EBM's noise over the features it boosts: with q' covariates each shape
function carries noise growing like sqrt(q') and a prediction sums q' of them. On the realistic
studies (36 covariates, 7 of which modify the effect) naming the 7 as ``effect_columns`` cut the
DR learner's PEHE at n = 10^5, eps = 1 from 1.82 to 1.20 (bench/README.md, "Pre-specified effect
modifiers"). Without an analysis plan that names them, this screen picks ``COLUMNS`` covariates
by a DP selection and the effect model is fitted on those.

What it releases (to the calling mechanism; the chosen positions are public in the result):
    the positions of ``COLUMNS`` covariates, chosen by OpenDP's ``make_noisy_top_k`` (report
    noisy max with exponential noise, applied k times without replacement; McKenna and Sheldon
    2020, pure DP) on the scores ``|S_j|``, ``S_j = sum_i r_i z_ij``:

    * ``r_i`` the row's centred target, ``clip(psi_i - anchor, -K, K)`` (the DR pseudo-outcome
      given the DP first-stage models, minus the DP anchor): a row-wise function of the record;
    * ``z_ij`` the covariate scaled to [-1, 1]: a coded covariate by its declared codes' box, a
      continuous one by its DP CDF on the same rows, ``2 F_j(x_ij) - 1``, where ``F_j`` comes
      from ``quantile_bins`` (noisy histograms of 32 equal-width cells of the public bounds,
      Gaussian mechanism, the first part of the screen's budget). Scaled by the declared
      bounds alone, a skewed covariate with an honest range (creatinine declared 0.3-15,
      median 1) has a spread of 0.08 and scores low however strongly it modifies the effect;
      by its CDF every continuous covariate spreads over [-1, 1].

    ``S_j`` is the covariance of the centred targets with the covariate (up to the public row
    count and the targets' mean, about 0 after centring at the anchor).

Sensitivity (replace-one, public row count): one row moves every ``S_j`` by at most
``|r z - r' z'| <= 2 K``, so every score ``|S_j|`` by at most 2 K: the score vector's
L-infinity sensitivity is 2 K (times the float slack of an n-term sum, ``float_slack``).
OpenDP's map for k selections at scale ``s`` is ``k * 2 * Delta / s`` (non-monotone scores), so
``scale = 2 k Delta / epsilon`` (docs/proofs/ebm_cate.md, step 9).

Pure: no I/O; the noise comes from the caller's sampler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.ate_strict import float_slack
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.quantile_bins import QuantileBins, transform

# The number of covariates the screen keeps (public). The realistic studies' effect modifiers
# are 7 of 36; keeping 8 leaves one place for a modifier that scores low (bench/README.md).
COLUMNS = 8
# Share of the effect model's (epsilon, delta) spent on the screen (public): the histograms
# get HISTOGRAM_SHARE of it (and that share of delta), the top-k selection the rest (delta 0).
# Realistic studies, strong heterogeneity, eps 1, 5 releases each (bench/README.md): PEHE at
# n = 10^5 1.61 / 1.40 / 1.37 at shares 0.1 / 0.2 / 0.3 (8 columns; 6 or 10 columns at 0.2:
# 1.48 / 1.45); at n = 2 * 10^4 3.09 / 3.02 / 2.99 at 0.2 / 0.35 / 0.5 (the constant: about 3.1).
SHARE = 0.3
HISTOGRAM_SHARE = 0.25

FloatArray = NDArray[np.float64]


def scaled_covariates(x: FloatArray, lower: FloatArray, upper: FloatArray) -> FloatArray:
    """Covariates mapped to [-1, 1] by their public bounds (a constant covariate: 0)."""
    low = np.asarray(lower, dtype=np.float64)
    high = np.asarray(upper, dtype=np.float64)
    width = np.where(high > low, high - low, 1.0)
    z = (2.0 * np.clip(x, low, high) - low - high) / width
    return np.asarray(np.where(high > low, z, 0.0), dtype=np.float64)


def scores(targets: FloatArray, x: FloatArray, lower: FloatArray, upper: FloatArray) -> FloatArray:
    """``|S_j| = |sum_i r_i z_ij|`` per covariate (``targets`` already in [-K, K]).

    Each sum is ``math.fsum`` of the rounded products (correctly rounded), so a replaced row
    moves a computed score by at most ``2 K (1 + u) + 2 u n K`` (u = 2^-53), inside
    ``sensitivity``'s float slack; a BLAS dot product's error bound grows like n^2 u K."""
    z = scaled_covariates(x, lower, upper)
    products = np.asarray(targets, dtype=np.float64)[:, None] * z
    sums = np.array([math.fsum(products[:, j].tolist()) for j in range(z.shape[1])])
    return np.asarray(np.abs(sums), dtype=np.float64)


def sensitivity(bound: float, rows: int) -> float:
    """The scores' replace-one L-infinity sensitivity: 2 K, widened by the float slack of a
    ``rows``-term sum (as every other sum the service releases)."""
    return float_slack(2.0 * bound, rows)


@dataclass(frozen=True)
class EffectScreen:
    """The public plan of one screen: ``columns`` kept of the covariates by a top-k at
    ``epsilon``, on targets in [-``bound``, ``bound``] over ``rows`` rows, the continuous
    covariates scaled by the CDF of the histograms ``bins`` (None: no continuous covariate)."""

    epsilon: float
    columns: int
    bound: float
    rows: int
    bins: QuantileBins | None = None

    @property
    def sensitivity(self) -> float:
        return sensitivity(self.bound, self.rows)

    @property
    def total_epsilon(self) -> float:
        """The whole screen's epsilon: the top-k's plus the histograms' (an exact split)."""
        return self.epsilon + (0.0 if self.bins is None else self.bins.calibration.epsilon)

    @property
    def total_delta(self) -> float:
        """The whole screen's delta: the histograms' (the top-k is pure DP)."""
        return 0.0 if self.bins is None else self.bins.calibration.delta

    @property
    def scale(self) -> float:
        """OpenDP's noise scale: ``2 k Delta / epsilon`` (the map ``k 2 Delta / scale``)."""
        return 2.0 * self.columns * self.sensitivity / self.epsilon

    def select(
        self,
        targets: FloatArray,
        x: FloatArray,
        lower: FloatArray,
        upper: FloatArray,
        noise: NoiseSampler,
    ) -> tuple[int, ...]:
        """The kept covariate positions, increasing: the DP top ``columns`` of the scores."""
        if self.bins is not None:
            knots = self.bins.measure(x, lower, upper, noise)
            x, lower, upper = transform(x, lower, upper, self.bins.columns, knots)
        values = scores(np.clip(targets, -self.bound, self.bound), x, lower, upper)
        if not np.all(np.isfinite(values)):
            values = np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
        chosen = noise.top_k(
            values,
            k=self.columns,
            scale=self.scale,
            sensitivity_linf=self.sensitivity,
            epsilon=self.epsilon,
        )
        return tuple(sorted(int(j) for j in chosen))


def screened(q: int) -> bool:
    """Whether a screen can keep fewer covariates than the model would see (public q)."""
    return q > COLUMNS
