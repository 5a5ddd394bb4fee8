"""Noise samplers: exact discrete Gaussian/Laplace on a public power-of-two lattice.

What this module provides (spec README §1.8, threats.md §1–2):

* ``NoiseSampler``: the protocol every mechanism draws noise through.
* ``OpenDPSampler``: the production sampler. Each call builds an OpenDP measurement
  (``make_gaussian`` / ``make_laplace`` with granularity ``2^k``): the input is rounded to the
  lattice ``2^k Z`` and exact discrete Gaussian (Canonne, Kamath & Steinke 2020) or discrete
  Laplace noise is added on that lattice from OpenDP's OS-seeded CSPRNG. The output lies on
  ``2^k Z``, so the low-order bits of a release cannot reveal the input (Mironov 2012).
* ``calibrate_gaussian`` / ``calibrate_laplace``: the production calibration, which accounts
  for the lattice. Rounding the input to ``2^k Z`` can move each coordinate by up to
  ``2^(k-1)``, so a sensitivity ``Delta`` becomes ``Delta + 2^k sqrt(dim)`` (L2) or
  ``Delta + 2^k dim`` (L1): ``lattice_sensitivity``. This is exactly what OpenDP's privacy map
  charges (checked on every draw and in tests).
* ``NoiseSampler.standard_normal``: unit normals for structured Gaussian mechanisms whose
  noise is a public linear map of them (cate_function's GP, Nystrom and RFF noise).
* ``SeededSampler``: continuous numpy noise from a caller-supplied generator. **Test-only.**
* ``secure_rng``: the single production constructor of a numpy ``Generator`` (used for
  partitions), seeded from the OS CSPRNG via ``secrets``.

The lattice exponent is a function of the public noise scale only: ``k = floor(log2(sigma)) -
LATTICE_BITS`` with ``LATTICE_BITS = 30``, so the lattice is at least 2^30 times finer than the
noise and the inflation is a relative ``2^-30 * multiplier`` at most (about 1e-9 * sigma / Delta).
Sampling cost does not depend on the lattice resolution (measured: 2^20 to 2^50 alike).

Discrete versus continuous Gaussian. The discrete Gaussian with an integer sensitivity has the
privacy profile of CKS20 Theorem 7, which is not exactly the continuous one: numerically its
delta can exceed the continuous ``delta(eps; mu)`` by a relative O(sigma_L^-2) (sigma_L = noise
sd in lattice steps; about 1e-5 at sigma_L = 256, 1e-6 at 1000). With sigma_L >= 2^30 that is
below 1e-17, so ``calibrate_gaussian`` targets ``delta * (1 - DISCRETE_DELTA_MARGIN)`` with a
margin of 1e-6 (docs/proofs/ate_strict.md, "Lattice and discrete Gaussian").

References:
    Canonne, C., Kamath, G. and Steinke, T. (2020). The discrete Gaussian for differential
    privacy. NeurIPS.
    Mironov, I. (2012). On significance of the least significant bits for differential
    privacy. CCS.
    OpenDP 0.16 ``make_gaussian`` / ``make_laplace`` proof documents.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import opendp.prelude as dp
from numpy.typing import NDArray

from service.mechanisms.calibration import analytic_gaussian_multiplier
from service.mechanisms.errors import InvalidParameters

dp.enable_features("contrib")

# The lattice step is 2^-LATTICE_BITS of the noise scale (rounded down to a power of two).
LATTICE_BITS = 30
# Relative delta margin for the discrete-vs-continuous Gaussian profile (module docstring).
DISCRETE_DELTA_MARGIN = 1e-6
# Relative tolerance when comparing OpenDP's privacy map with our own accounting (OpenDP rounds
# its map up by a few ulps).
_MAP_RTOL = 1e-9
# Lattice exponent of unit normals drawn for structured Gaussian mechanisms (sd 1 = 2^30 steps).
UNIT_NORMAL_LATTICE_EXPONENT = -LATTICE_BITS
# Public limits on noise scales so that the lattice 2^k is a normal double.
_MIN_SCALE = 2.0**-900
_MAX_SCALE = 2.0**900


class NoiseSampler(Protocol):
    """Adds calibrated noise to a vector of values.

    ``sigma`` / ``scale`` are computed by the caller from public quantities only (with
    ``calibrate_gaussian`` / ``calibrate_laplace``); the sensitivity is passed so that the
    sampler can check the charge of its own measurement against it.
    """

    def gaussian(
        self, values: NDArray[np.float64], *, sigma: float, sensitivity_l2: float
    ) -> NDArray[np.float64]:
        """Return ``values`` plus Gaussian noise of standard deviation ``sigma``."""
        ...

    def laplace(
        self, values: NDArray[np.float64], *, scale: float, sensitivity_l1: float
    ) -> NDArray[np.float64]:
        """Return ``values`` plus Laplace noise of scale ``scale`` (sd = sqrt(2) * scale)."""
        ...

    def quantile(
        self,
        values: NDArray[np.float64],
        *,
        candidates: NDArray[np.float64],
        level: float,
        epsilon: float,
    ) -> float:
        """Return one of ``candidates``: an epsilon-DP ``level``-quantile of ``values`` under
        replace-one with ``len(values)`` public (exponential mechanism on rank utility)."""
        ...

    def standard_normal(self, size: int) -> NDArray[np.float64]:
        """Return ``size`` independent unit normals, the raw material of a structured Gaussian
        mechanism whose noise is a public linear map of them (GP and Nystrom noise)."""
        ...

    def top_k(
        self,
        scores: NDArray[np.float64],
        *,
        k: int,
        scale: float,
        sensitivity_linf: float,
        epsilon: float,
    ) -> tuple[int, ...]:
        """Return the positions of ``k`` of ``scores``, an epsilon-DP noisy top k (report noisy
        max k times without replacement) of scores whose replace-one L-infinity sensitivity is
        ``sensitivity_linf``, at the public noise ``scale`` (``2 k sensitivity / epsilon``)."""
        ...


def lattice_exponent(noise_scale: float) -> int:
    """The public lattice exponent k for a noise scale: ``floor(log2(noise_scale)) - 30``.

    Args:
        noise_scale: a public Gaussian sigma or Laplace scale.

    Returns:
        k such that ``2^k <= noise_scale * 2^-LATTICE_BITS < 2^(k+1)``.
    """
    _check_scale(noise_scale, "noise scale")
    mantissa, exponent = math.frexp(noise_scale)  # noise_scale = mantissa * 2^exponent
    del mantissa  # in [0.5, 1): floor(log2(noise_scale)) = exponent - 1
    return exponent - 1 - LATTICE_BITS


def lattice_sensitivity(
    sensitivity: float, k: int, dim: int, *, norm: Literal["l1", "l2"] = "l2"
) -> float:
    """Sensitivity after rounding each of ``dim`` coordinates to the lattice ``2^k Z``.

    Rounding to the nearest lattice point moves each coordinate by at most ``2^(k-1)``, so two
    neighbouring inputs' rounded values differ by at most ``Delta + 2^k`` per coordinate in the
    worst case; OpenDP charges ``Delta + 2^k sqrt(dim)`` (L2) and ``Delta + 2^k dim`` (L1).

    Args:
        sensitivity: the sensitivity of the unrounded query, >= 0.
        k: the lattice exponent.
        dim: the number of coordinates, >= 1.
        norm: ``"l2"`` (Gaussian) or ``"l1"`` (Laplace).

    Returns:
        The inflated sensitivity (rounded up to the next float).
    """
    if not (sensitivity >= 0.0 and math.isfinite(sensitivity)):
        raise ValueError("sensitivity must be finite and non-negative")
    if dim < 1:
        raise ValueError("dim must be positive")
    step = math.ldexp(1.0, k)
    inflation = step * (math.sqrt(dim) if norm == "l2" else float(dim))
    return math.nextafter(sensitivity + inflation, math.inf)


@dataclass(frozen=True)
class GaussianCalibration:
    """A calibrated lattice Gaussian mechanism (all fields public)."""

    epsilon: float
    delta: float
    sensitivity_l2: float  # of the unrounded query
    dim: int
    noise_multiplier: float  # analytic-Gaussian sigma / Delta at delta * (1 - margin)
    lattice_exponent: int
    sensitivity_l2_effective: float  # after lattice rounding
    sigma: float

    @property
    def mu(self) -> float:
        """The GDP mu of the mechanism: effective sensitivity / sigma."""
        return self.sensitivity_l2_effective / self.sigma


@dataclass(frozen=True)
class LaplaceCalibration:
    """A calibrated lattice Laplace mechanism (all fields public)."""

    epsilon: float
    sensitivity_l1: float
    dim: int
    lattice_exponent: int
    sensitivity_l1_effective: float
    scale: float


def calibrate_gaussian(
    epsilon: float, delta: float, sensitivity_l2: float, *, dim: int = 1
) -> GaussianCalibration:
    """Calibrate an (epsilon, delta)-DP lattice Gaussian for an L2 sensitivity.

    sigma is the analytic-Gaussian multiplier at ``delta * (1 - DISCRETE_DELTA_MARGIN)`` times
    the lattice-inflated sensitivity, where the lattice exponent is itself a function of sigma:
    the smallest fixed point ``sigma >= multiplier * lattice_sensitivity(Delta, k(sigma), dim)``
    reached from ``multiplier * Delta`` (k grows with sigma, so the iteration is monotone).

    Args:
        epsilon: epsilon > 0.
        delta: 0 < delta < 1.
        sensitivity_l2: L2 sensitivity of the unrounded query, > 0.
        dim: number of coordinates released together.

    Returns:
        The calibration; ``gdp_delta(epsilon, result.mu) <= delta * (1 - margin)``.
    """
    if not (sensitivity_l2 > 0.0 and math.isfinite(sensitivity_l2)):
        raise ValueError("sensitivity_l2 must be positive and finite")
    if dim < 1 or math.sqrt(dim) >= 2.0 ** (LATTICE_BITS - 2):
        raise ValueError("dim out of range")
    multiplier = analytic_gaussian_multiplier(epsilon, delta * (1.0 - DISCRETE_DELTA_MARGIN))
    sigma = math.nextafter(multiplier * sensitivity_l2, math.inf)
    for _ in range(64):
        k = lattice_exponent(sigma)
        effective = lattice_sensitivity(sensitivity_l2, k, dim, norm="l2")
        needed = math.nextafter(multiplier * effective, math.inf)
        if sigma >= needed:
            return GaussianCalibration(
                epsilon=epsilon,
                delta=delta,
                sensitivity_l2=sensitivity_l2,
                dim=dim,
                noise_multiplier=multiplier,
                lattice_exponent=k,
                sensitivity_l2_effective=effective,
                sigma=sigma,
            )
        sigma = needed
    raise ValueError("lattice calibration did not converge")  # pragma: no cover


def calibrate_laplace(epsilon: float, sensitivity_l1: float, *, dim: int = 1) -> LaplaceCalibration:
    """Calibrate an epsilon-DP lattice Laplace: ``scale = lattice_sensitivity / epsilon``.

    Args:
        epsilon: epsilon > 0.
        sensitivity_l1: L1 sensitivity of the unrounded query, > 0.
        dim: number of coordinates released together.

    Returns:
        The calibration (same fixed-point construction as ``calibrate_gaussian``).
    """
    if not (epsilon > 0.0 and math.isfinite(epsilon)):
        raise ValueError("epsilon must be positive and finite")
    if not (sensitivity_l1 > 0.0 and math.isfinite(sensitivity_l1)):
        raise ValueError("sensitivity_l1 must be positive and finite")
    if dim < 1 or dim >= 2 ** (LATTICE_BITS - 2):
        raise ValueError("dim out of range")
    scale = math.nextafter(sensitivity_l1 / epsilon, math.inf)
    for _ in range(64):
        k = lattice_exponent(scale)
        effective = lattice_sensitivity(sensitivity_l1, k, dim, norm="l1")
        needed = math.nextafter(effective / epsilon, math.inf)
        if scale >= needed:
            return LaplaceCalibration(
                epsilon=epsilon,
                sensitivity_l1=sensitivity_l1,
                dim=dim,
                lattice_exponent=k,
                sensitivity_l1_effective=effective,
                scale=scale,
            )
        scale = needed
    raise ValueError("lattice calibration did not converge")  # pragma: no cover


def release_gaussian(
    values: NDArray[np.float64], calibration: GaussianCalibration, noise: NoiseSampler
) -> NDArray[np.float64]:
    """``values`` plus the calibrated Gaussian noise; ``ValueError`` if a released value is not
    finite (a generic release failure: the charge is kept)."""
    out = noise.gaussian(values, sigma=calibration.sigma, sensitivity_l2=calibration.sensitivity_l2)
    if not np.all(np.isfinite(out)):
        raise ValueError("non-finite release")
    return np.asarray(out, dtype=np.float64)


def release_laplace(
    values: NDArray[np.float64], calibration: LaplaceCalibration, noise: NoiseSampler
) -> NDArray[np.float64]:
    """``values`` plus the calibrated Laplace noise; ``ValueError`` if a released value is not
    finite (a generic release failure: the charge is kept)."""
    out = noise.laplace(values, scale=calibration.scale, sensitivity_l1=calibration.sensitivity_l1)
    if not np.all(np.isfinite(out)):
        raise ValueError("non-finite release")
    return np.asarray(out, dtype=np.float64)


def _check_scale(value: float, name: str) -> None:
    """Scales come from public parameters (clips, shares, regularization, bandwidths) and the
    schema: one outside the samplers' range is the request's (422 before any charge; an HTTP
    walkthrough's pseudo_outcome_clip 1e-300 and regularization 1e300 were 500s)."""
    if not (_MIN_SCALE <= value <= _MAX_SCALE):
        raise InvalidParameters(
            f"the parameters imply a {name} outside [2^-900, 2^900], the range the noise "
            "samplers support: choose values nearer the defaults (a clip, share, bandwidth or "
            "regularization)"
        )


def _as_finite_vector(values: NDArray[np.float64]) -> NDArray[np.float64]:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError("values must be a non-empty 1-D array")
    if not np.all(np.isfinite(array)):
        raise ValueError("values must be finite")
    return array


def _check_sensitivity(value: float, name: str) -> None:
    if not (value >= 0.0 and math.isfinite(value)):
        raise ValueError(f"{name} must be finite and non-negative")


def _input_space(dim: int, norm: str) -> tuple[Any, Any]:
    """OpenDP input domain and metric: a scalar, or a length-``dim`` vector under ``norm``."""
    if dim == 1:
        return dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float)
    metric = dp.l2_distance(T=float) if norm == "l2" else dp.l1_distance(T=float)
    return dp.vector_domain(dp.atom_domain(T=float, nan=False), size=dim), metric


def _apply(measurement: Any, array: NDArray[np.float64]) -> NDArray[np.float64]:
    if array.size == 1:
        return np.array([measurement(float(array[0]))], dtype=np.float64)
    return np.asarray(measurement(array.tolist()), dtype=np.float64)


class OpenDPSampler:
    """Production sampler: exact discrete noise on the public lattice ``2^k Z`` via OpenDP.

    Randomness comes from OpenDP's own CSPRNG (seeded from the OS); there is no seed. Each
    draw checks that OpenDP's privacy map at ``sensitivity`` is no larger than what
    ``lattice_sensitivity`` (hence ``calibrate_*``) accounted for, and refuses otherwise.
    """

    def gaussian(
        self, values: NDArray[np.float64], *, sigma: float, sensitivity_l2: float
    ) -> NDArray[np.float64]:
        """Add exact discrete Gaussian noise of sd ``sigma`` on the lattice ``2^k(sigma) Z``.

        Raises:
            ValueError: invalid arguments, or OpenDP charges more than the calibration assumed.
        """
        array = _as_finite_vector(values)
        _check_scale(sigma, "sigma")
        _check_sensitivity(sensitivity_l2, "sensitivity_l2")
        k = lattice_exponent(sigma)
        dim = int(array.size)
        measurement = dp.m.make_gaussian(*_input_space(dim, "l2"), scale=sigma, k=k)
        rho = float(measurement.map(sensitivity_l2))  # type: ignore[no-untyped-call]  # zCDP: rho = (Delta_eff / sigma)^2 / 2
        charged_mu = math.sqrt(2.0 * rho)
        accounted_mu = lattice_sensitivity(sensitivity_l2, k, dim, norm="l2") / sigma
        if charged_mu > accounted_mu * (1.0 + _MAP_RTOL):
            raise ValueError("OpenDP charges more than the lattice calibration accounted for")
        return _apply(measurement, array)

    def laplace(
        self, values: NDArray[np.float64], *, scale: float, sensitivity_l1: float
    ) -> NDArray[np.float64]:
        """Add exact discrete Laplace noise of scale ``scale`` on the lattice ``2^k(scale) Z``.

        Raises:
            ValueError: invalid arguments, or OpenDP charges more than the calibration assumed.
        """
        array = _as_finite_vector(values)
        _check_scale(scale, "scale")
        _check_sensitivity(sensitivity_l1, "sensitivity_l1")
        k = lattice_exponent(scale)
        dim = int(array.size)
        measurement = dp.m.make_laplace(*_input_space(dim, "l1"), scale=scale, k=k)
        charged_epsilon = float(measurement.map(sensitivity_l1))  # type: ignore[no-untyped-call]
        accounted_epsilon = lattice_sensitivity(sensitivity_l1, k, dim, norm="l1") / scale
        if charged_epsilon > accounted_epsilon * (1.0 + _MAP_RTOL):
            raise ValueError("OpenDP charges more than the lattice calibration accounted for")
        return _apply(measurement, array)

    def quantile(
        self,
        values: NDArray[np.float64],
        *,
        candidates: NDArray[np.float64],
        level: float,
        epsilon: float,
    ) -> float:
        """OpenDP's ``make_private_quantile`` (exponential mechanism on rank utility, Smith
        2011) on a size-n vector under the symmetric distance, where a replace-one neighbour is
        at distance 2: OpenDP's map at 2 must not exceed ``epsilon``.

        Raises:
            ValueError: invalid arguments, or OpenDP charges more than ``epsilon``.
        """
        array, grid = _check_quantile_args(values, candidates, level, epsilon)
        measurement = _quantile_measurement(int(array.size), grid, level, epsilon)
        charged = float(measurement.map(2))
        if charged > epsilon * (1.0 + _MAP_RTOL):
            raise ValueError("OpenDP charges more than the quantile calibration accounted for")
        return float(measurement(array.tolist()))

    def top_k(
        self,
        scores: NDArray[np.float64],
        *,
        k: int,
        scale: float,
        sensitivity_linf: float,
        epsilon: float,
    ) -> tuple[int, ...]:
        """OpenDP's ``make_noisy_top_k`` (exponential noise, pure DP; McKenna and Sheldon 2020)
        on non-monotone scores under the L-infinity distance: OpenDP's map at
        ``sensitivity_linf`` (``k * 2 * sensitivity / scale``) must not exceed ``epsilon``.

        Raises:
            ValueError: invalid arguments, or OpenDP charges more than ``epsilon``.
        """
        array = _check_top_k_args(scores, k, scale, sensitivity_linf, epsilon)
        measurement = dp.m.make_noisy_top_k(
            dp.vector_domain(dp.atom_domain(T=float, nan=False), size=int(array.size)),
            dp.linf_distance(T=float, monotonic=False),
            dp.max_divergence(),
            k=k,
            scale=scale,
        )
        charged = float(measurement.map(sensitivity_linf))  # type: ignore[no-untyped-call]
        if charged > epsilon * (1.0 + _MAP_RTOL):
            raise ValueError("OpenDP charges more than the top-k calibration accounted for")
        return tuple(int(j) for j in measurement(array.tolist()))

    def standard_normal(self, size: int) -> NDArray[np.float64]:
        """Unit normals from OpenDP's exact discrete Gaussian (sd 1 on ``2^-30 Z``).

        The discrete Gaussian with ``sigma_L = 2^30`` lattice steps is within total variation
        distance ``exp(-2 pi^2 sigma_L^2)``-small of the rounded continuous normal, so the law
        the proofs assume holds to far below double precision; the draws come from OpenDP's
        OS-seeded CSPRNG and its exact sampler (CKS20) instead of numpy's floating-point one.
        """
        if size < 0:
            raise ValueError("size must be non-negative")
        if size == 0:
            return np.zeros(0, dtype=np.float64)
        measurement = dp.m.make_gaussian(
            *_input_space(size, "l2"), scale=1.0, k=UNIT_NORMAL_LATTICE_EXPONENT
        )
        return _apply(measurement, np.zeros(size, dtype=np.float64))


def _check_quantile_args(
    values: NDArray[np.float64], candidates: NDArray[np.float64], level: float, epsilon: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    array = _as_finite_vector(values)
    grid = _as_finite_vector(candidates)
    if array.size == 0 or grid.size < 2 or not np.all(np.diff(grid) > 0.0):
        raise ValueError("need values and at least two strictly increasing candidates")
    if not (0.0 < level < 1.0):
        raise ValueError("level must be in (0, 1)")
    _check_scale(epsilon, "epsilon")
    return array, grid


def _check_top_k_args(
    scores: NDArray[np.float64], k: int, scale: float, sensitivity_linf: float, epsilon: float
) -> NDArray[np.float64]:
    array = _as_finite_vector(scores)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= array.size:
        raise ValueError("k must be an integer in [1, len(scores)]")
    _check_scale(scale, "scale")
    _check_sensitivity(sensitivity_linf, "sensitivity_linf")
    _check_scale(epsilon, "epsilon")
    return array


def quantile_scale(epsilon: float) -> float:
    """OpenDP's quantile ``scale`` for epsilon under replace-one (sized input: d_in = 2)."""
    return 2.0 / epsilon


def _quantile_measurement(n: int, grid: NDArray[np.float64], level: float, epsilon: float) -> Any:
    return dp.m.make_private_quantile(
        dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n),
        dp.symmetric_distance(),
        dp.max_divergence(),
        candidates=grid.tolist(),
        alpha=level,
        scale=quantile_scale(epsilon),
    )


class SeededSampler:
    """Continuous numpy noise from a caller-supplied generator. TEST-ONLY.

    Not used by the service: floating-point noise from a seeded, non-cryptographic generator
    is neither secure (Mironov 2012) nor private when the seed is known. Tests use it for
    reproducible end-to-end runs and fast distributional audits of the calibration.
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def gaussian(
        self, values: NDArray[np.float64], *, sigma: float, sensitivity_l2: float
    ) -> NDArray[np.float64]:
        """Add N(0, sigma^2) noise to each value."""
        array = _as_finite_vector(values)
        _check_scale(sigma, "sigma")
        _check_sensitivity(sensitivity_l2, "sensitivity_l2")
        noise = self._rng.normal(0.0, sigma, size=array.shape)
        return np.asarray(array + noise, dtype=np.float64)

    def laplace(
        self, values: NDArray[np.float64], *, scale: float, sensitivity_l1: float
    ) -> NDArray[np.float64]:
        """Add Laplace(0, scale) noise to each value."""
        array = _as_finite_vector(values)
        _check_scale(scale, "scale")
        _check_sensitivity(sensitivity_l1, "sensitivity_l1")
        noise = self._rng.laplace(0.0, scale, size=array.shape)
        return np.asarray(array + noise, dtype=np.float64)

    def quantile(
        self,
        values: NDArray[np.float64],
        *,
        candidates: NDArray[np.float64],
        level: float,
        epsilon: float,
    ) -> float:
        """Exponential mechanism with utility ``-|#{v < c} - level n|`` (sensitivity 1 under
        replace-one), selected by the Gumbel-max trick from the seeded generator."""
        array, grid = _check_quantile_args(values, candidates, level, epsilon)
        below = np.searchsorted(np.sort(array), grid, side="left").astype(np.float64)
        utility = -np.abs(below - level * array.size)
        score = epsilon * utility / 2.0 + self._rng.gumbel(size=grid.size)
        return float(grid[int(np.argmax(score))])

    def top_k(
        self,
        scores: NDArray[np.float64],
        *,
        k: int,
        scale: float,
        sensitivity_linf: float,
        epsilon: float,
    ) -> tuple[int, ...]:
        """Report noisy max k times without replacement with Gumbel noise of ``scale`` (the
        Gumbel top-k trick: the exponential mechanism at epsilon / k per pick, utility
        sensitivity ``scale * epsilon / (2 k)``), from the seeded generator."""
        array = _check_top_k_args(scores, k, scale, sensitivity_linf, epsilon)
        noisy = array + self._rng.gumbel(0.0, scale, size=array.size)
        return tuple(int(j) for j in np.argsort(-noisy, kind="stable")[:k])

    def standard_normal(self, size: int) -> NDArray[np.float64]:
        """``size`` unit normals from the seeded generator."""
        if size < 0:
            raise ValueError("size must be non-negative")
        return np.asarray(self._rng.standard_normal(size), dtype=np.float64)


def secure_rng() -> np.random.Generator:
    """The production random generator: PCG64DXSM seeded with 256 bits from ``secrets``.

    Used for data-independent choices such as the fold partition. Noise is drawn by
    ``OpenDPSampler`` from OpenDP's own CSPRNG. This is the only production constructor of a
    generator; nothing in ``service/`` takes a seed.
    """
    return np.random.Generator(np.random.PCG64DXSM(secrets.randbits(256)))
