"""A charged DP measurement of the outcome's range for a DP-EBM outcome model.

interpret's DP-EBM regressor calibrates each boosting step's noise to the target's public range
(``learning_rate * (y_hi - y_lo)``). With the outcome bounds declared as the honest range of a
skewed outcome (R_Y about 12 sd(Y) on the realistic studies, most of it an empty right tail), the
outcome model's noise is sized for values that almost never occur, and in an AIPW that noise
reaches the estimate through the propensity model's error (bench/README.md, "The outcome
model's measured range").

What it releases (to the calling mechanism, never to a client):
    two quantiles of the fit fold's outcomes, at the public levels ``LEVEL`` and ``1 - LEVEL``,
    each by OpenDP's ``make_private_quantile`` (the exponential mechanism on the rank utility)
    over the public grid of ``CANDIDATES`` equally spaced points of the declared bounds. The
    range ``[low, high]`` (the smaller and the larger of the two; the declared bounds when they
    coincide) is post-processing. The model is then fitted on outcomes clipped to that range,
    with its noise calibrated to it, and predicts inside it.

Why a clipped target is harmless to a doubly robust estimate:
    the outcome model is a nuisance; the AIPW pseudo-outcome corrects its error with the raw
    outcome, so a model fitted to clipped outcomes is one more approximate model, and the
    pseudo-outcome's public bound B (predictions inside the declared bounds) is unchanged.

Neighbouring relation:
    replace-one inside the fold the quantiles are measured on, its size public: each quantile is
    DP at its own epsilon (docs/proofs/ate_strict.md §16); the two compose sequentially.

Pure: no I/O; the noise comes from the caller's sampler.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.noise import NoiseSampler

# Tail level of each quantile (public): the model's range is [Q(LEVEL), Q(1 - LEVEL)]. On the
# realistic studies 0.02 gave the least release-to-release noise of 0.005, 0.02 and 0.05 at
# n = 10^5, eps = 1, and 0.05 the most bias at n = 2 * 10^4 (bench/README.md).
LEVEL = 0.02
# Share of the outcome module's epsilon spent on the two quantiles (public; delta 0).
SHARE = 0.1
# Equally spaced candidates over the declared bounds (both included; public).
CANDIDATES = 1001

FloatArray = NDArray[np.float64]


def candidates(y_lower: float, y_upper: float) -> FloatArray:
    """The public grid: ``CANDIDATES`` equally spaced points of ``[y_lower, y_upper]``."""
    grid = np.linspace(y_lower, y_upper, CANDIDATES)
    grid[0], grid[-1] = y_lower, y_upper
    return np.asarray(grid, dtype=np.float64)


def range_from_quantiles(
    low: float, high: float, y_lower: float, y_upper: float
) -> tuple[float, float]:
    """Post-processing: the two released quantiles as a range inside the declared bounds,
    ordered; the declared bounds where the quantiles coincide (no range to fit on)."""
    low, high = min(low, high), max(low, high)
    low, high = max(low, y_lower), min(high, y_upper)
    if not high > low:
        return y_lower, y_upper
    return low, high


@dataclass(frozen=True)
class OutcomeRange:
    """The public plan of one module's range measurement: each quantile's epsilon (their
    float sum is exactly the measurement's share of the module, ``split_share``)."""

    epsilon_low: float
    epsilon_high: float

    def measure(
        self, y: FloatArray, y_lower: float, y_upper: float, noise: NoiseSampler
    ) -> tuple[float, float]:
        """The released range ``[low, high]`` of ``y`` (the fold's outcomes, inside the
        declared bounds): two DP quantiles on the public grid, then ``range_from_quantiles``."""
        values = np.clip(np.asarray(y, dtype=np.float64), y_lower, y_upper)
        grid = candidates(y_lower, y_upper)
        low = noise.quantile(values, candidates=grid, level=LEVEL, epsilon=self.epsilon_low)
        high = noise.quantile(values, candidates=grid, level=1.0 - LEVEL, epsilon=self.epsilon_high)
        return range_from_quantiles(low, high, y_lower, y_upper)
