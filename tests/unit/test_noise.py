"""Noise samplers: OpenDP's privacy map vs our calibration, lattice output, empirical scale.

Distributional checks state their false-failure rate (FALSE_FAILURE = 1e-6 per check, as in
OpenDP's sampler tests) and prove power: the same sample is rejected for a scale 30 % off.
"""

from __future__ import annotations

import math

import numpy as np
import opendp.prelude as dp
import pytest
from numpy.typing import NDArray
from scipy import stats
from scipy.special import logsumexp

from service.mechanisms.calibration import analytic_gaussian_multiplier, gdp_delta
from service.mechanisms.noise import (
    DISCRETE_DELTA_MARGIN,
    LATTICE_BITS,
    OpenDPSampler,
    SeededSampler,
    calibrate_gaussian,
    calibrate_laplace,
    lattice_exponent,
    lattice_sensitivity,
    secure_rng,
)

FALSE_FAILURE = 1e-6
N_DRAWS = 100_000

dp.enable_features("contrib")


def gaussian_sd_consistent(sample: NDArray[np.float64], sigma: float) -> bool:
    """Two-sided chi-square test of E[x^2] = sigma^2 for a centred Gaussian sample.

    Under H0, sum(x^2) / sigma^2 ~ chi2(N) exactly (continuous case; the discrete Gaussian's
    variance differs by a relative < 1e-100 at our lattice resolution).
    """
    statistic = float(np.sum(sample**2)) / sigma**2
    low = stats.chi2.ppf(FALSE_FAILURE / 2, sample.size)
    high = stats.chi2.isf(FALSE_FAILURE / 2, sample.size)
    return bool(low <= statistic <= high)


def laplace_scale_consistent(sample: NDArray[np.float64], scale: float) -> bool:
    """Two-sided z-test of E[x^2] = 2 b^2 for a centred Laplace sample (Var x^2 = 20 b^4).

    Normal approximation of a mean of 1e5 i.i.d. terms with finite 4th moment; threshold at
    the two-sided 1e-6 quantile.
    """
    mean_square = float(np.mean(sample**2))
    z = (mean_square - 2 * scale**2) / math.sqrt(20 * scale**4 / sample.size)
    return bool(abs(z) <= stats.norm.isf(FALSE_FAILURE / 2))


def test_lattice_exponent_is_public_function_of_scale() -> None:
    for sigma in (1e-9, 0.003, 0.5841, 1.0, 2.0, 57.82, 3e7):
        k = lattice_exponent(sigma)
        assert 2.0**k <= sigma * 2.0**-LATTICE_BITS < 2.0 ** (k + 1)
    assert lattice_exponent(1.0) == -LATTICE_BITS
    with pytest.raises(ValueError, match="noise scale"):
        lattice_exponent(math.inf)


@pytest.mark.parametrize("dim", [1, 2, 5])
def test_lattice_sensitivity_is_what_opendp_charges(dim: int) -> None:
    sigma, sensitivity = 0.37, 0.05
    k = lattice_exponent(sigma)
    atom = dp.atom_domain(T=float, nan=False)
    domain = atom if dim == 1 else dp.vector_domain(atom, size=dim)
    l2 = dp.absolute_distance(T=float) if dim == 1 else dp.l2_distance(T=float)
    l1 = dp.absolute_distance(T=float) if dim == 1 else dp.l1_distance(T=float)
    gaussian = dp.m.make_gaussian(domain, l2, scale=sigma, k=k)
    rho = gaussian.map(sensitivity)  # type: ignore[no-untyped-call]
    expected = lattice_sensitivity(sensitivity, k, dim) / sigma
    assert math.sqrt(2 * rho) == pytest.approx(expected, rel=1e-12)
    laplace = dp.m.make_laplace(domain, l1, scale=sigma, k=k)
    epsilon = laplace.map(sensitivity)  # type: ignore[no-untyped-call]
    expected_l1 = lattice_sensitivity(sensitivity, k, dim, norm="l1") / sigma
    assert epsilon == pytest.approx(expected_l1, rel=1e-12)


@pytest.mark.parametrize("epsilon", [0.02, 0.2, 0.8, 1.0, 3.2, 16.0, 80.0])
@pytest.mark.parametrize("delta", [1e-5, 8e-8])
@pytest.mark.parametrize("sensitivity", [2 * 50 / 1500, 2500 / 1500, 3.0e-5])
def test_opendp_map_of_calibrated_gaussian_is_within_charge(
    epsilon: float, delta: float, sensitivity: float
) -> None:
    calibration = calibrate_gaussian(epsilon, delta, sensitivity)
    measurement = dp.m.make_gaussian(
        dp.atom_domain(T=float, nan=False),
        dp.absolute_distance(T=float),
        scale=calibration.sigma,
        k=calibration.lattice_exponent,
    )
    rho = measurement.map(sensitivity)  # type: ignore[no-untyped-call]
    charged_mu = math.sqrt(2 * rho)  # zCDP rho -> GDP mu
    assert gdp_delta(epsilon, charged_mu) <= delta
    assert charged_mu == pytest.approx(calibration.mu, rel=1e-9)
    # The lattice costs at most a relative 2^-LATTICE_BITS * multiplier of extra noise.
    plain = analytic_gaussian_multiplier(epsilon, delta) * sensitivity
    assert (
        plain
        <= calibration.sigma
        <= plain * (1 + 2.0**-LATTICE_BITS * calibration.noise_multiplier + 1e-6)
    )


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 8.0])
def test_opendp_map_of_calibrated_laplace_is_within_charge(epsilon: float) -> None:
    calibration = calibrate_laplace(epsilon, 0.25, dim=3)
    measurement = dp.m.make_laplace(
        dp.vector_domain(dp.atom_domain(T=float, nan=False), size=3),
        dp.l1_distance(T=float),
        scale=calibration.scale,
        k=calibration.lattice_exponent,
    )
    assert measurement.map(0.25) <= epsilon  # type: ignore[no-untyped-call]


def _discrete_gaussian_delta(epsilon: float, sigma: float, shift: int) -> float:
    """Exact delta of N_Z(0, sigma^2) vs N_Z(shift, sigma^2) (CKS20 Theorem 7), by summation."""
    half_width = math.ceil(40 * sigma) + shift
    y = np.arange(-half_width, half_width + 1, dtype=np.float64)
    log_p = -(y**2) / (2 * sigma**2)
    log_q = -((y - shift) ** 2) / (2 * sigma**2)
    normaliser = logsumexp(log_p)
    log_p, log_q = log_p - normaliser, log_q - normaliser
    exponent = epsilon + log_q - log_p
    mask = exponent < 0
    return float(np.sum(np.exp(log_p[mask]) * -np.expm1(exponent[mask])))


def test_discrete_gaussian_profile_excess_is_covered_by_the_margin() -> None:
    """The discrete Gaussian's delta exceeds the continuous one by a relative <= C / sigma_L^2.

    Measured C <= 3 on this grid; with sigma_L >= 2^30 lattice steps the excess is < 1e-17,
    far inside DISCRETE_DELTA_MARGIN = 1e-6 (docs/proofs/ate_strict.md).
    """
    worst = 0.0
    for sigma_lattice in (256.0, 1024.0):
        for epsilon in (0.05, 1.0, 10.0):
            for delta in (1e-3, 1e-6, 1e-10):
                multiplier = analytic_gaussian_multiplier(epsilon, delta)
                shift = max(1, round(sigma_lattice / multiplier))
                continuous = gdp_delta(epsilon, shift / sigma_lattice)
                discrete = _discrete_gaussian_delta(epsilon, sigma_lattice, shift)
                worst = max(worst, (discrete / continuous - 1.0) * sigma_lattice**2)
    assert worst <= 10.0
    assert 10.0 / 2.0 ** (2 * LATTICE_BITS) < DISCRETE_DELTA_MARGIN / 1e4


def test_opendp_gaussian_sd_matches_calibration_and_lies_on_lattice() -> None:
    calibration = calibrate_gaussian(0.4, 8e-6, 2 * 50 / 1500)  # README §3.7 row 1: 0.5841
    assert round(calibration.sigma, 4) == 0.5841
    sampler = OpenDPSampler()
    sample = sampler.gaussian(
        np.zeros(N_DRAWS), sigma=calibration.sigma, sensitivity_l2=calibration.sensitivity_l2
    )
    assert gaussian_sd_consistent(sample, calibration.sigma)
    # power: a scale 30 % off either way is rejected on the same sample
    assert not gaussian_sd_consistent(sample, 0.7 * calibration.sigma)
    assert not gaussian_sd_consistent(sample, 1.3 * calibration.sigma)
    steps = sample * 2.0**-calibration.lattice_exponent
    assert np.array_equal(steps, np.round(steps))
    assert abs(float(np.mean(sample))) < 6 * calibration.sigma / math.sqrt(N_DRAWS)


def test_opendp_unit_normals_are_exact_discrete_gaussian_draws() -> None:
    """``standard_normal`` (the GP and Nystrom noise's raw material): sd 1 (a 30 % error is
    rejected on the same sample), centred, on the lattice 2^-30, fresh on every call."""
    sampler = OpenDPSampler()
    sample = sampler.standard_normal(N_DRAWS)
    assert sample.shape == (N_DRAWS,)
    assert gaussian_sd_consistent(sample, 1.0)
    assert not gaussian_sd_consistent(sample, 0.7)
    assert not gaussian_sd_consistent(sample, 1.3)
    assert abs(float(np.mean(sample))) < 6 / math.sqrt(N_DRAWS)
    steps = sample * 2.0**30
    assert np.array_equal(steps, np.round(steps))
    assert not np.array_equal(sampler.standard_normal(8), sampler.standard_normal(8))
    assert sampler.standard_normal(0).shape == (0,)
    with pytest.raises(ValueError, match="non-negative"):
        sampler.standard_normal(-1)


def test_opendp_scalar_draw_lies_on_lattice() -> None:
    sampler = OpenDPSampler()
    sigma = 0.3091
    k = lattice_exponent(sigma)
    for value in (0.1234567891, -3.3, 1e3):
        out = sampler.gaussian(np.array([value]), sigma=sigma, sensitivity_l2=0.02)
        assert out.shape == (1,)
        assert float(out[0] * 2.0**-k) == float(round(out[0] * 2.0**-k))
        lap = sampler.laplace(np.array([value]), scale=sigma, sensitivity_l1=0.02)
        assert float(lap[0] * 2.0**-k) == float(round(lap[0] * 2.0**-k))


def test_opendp_laplace_scale_matches_calibration() -> None:
    calibration = calibrate_laplace(1.0, 0.5)
    sample = OpenDPSampler().laplace(
        np.zeros(N_DRAWS), scale=calibration.scale, sensitivity_l1=calibration.sensitivity_l1
    )
    assert laplace_scale_consistent(sample, calibration.scale)
    assert not laplace_scale_consistent(sample, 0.7 * calibration.scale)
    assert not laplace_scale_consistent(sample, 1.3 * calibration.scale)
    steps = sample * 2.0**-calibration.lattice_exponent
    assert np.array_equal(steps, np.round(steps))


def test_seeded_sampler_scales() -> None:
    sampler = SeededSampler(np.random.default_rng(20240601))
    gaussian = sampler.gaussian(np.zeros(N_DRAWS), sigma=2.5, sensitivity_l2=1.0)
    assert gaussian_sd_consistent(gaussian, 2.5)
    assert not gaussian_sd_consistent(gaussian, 0.7 * 2.5)
    assert not gaussian_sd_consistent(gaussian, 1.3 * 2.5)
    laplace = sampler.laplace(np.zeros(N_DRAWS), scale=0.8, sensitivity_l1=1.0)
    assert laplace_scale_consistent(laplace, 0.8)
    assert not laplace_scale_consistent(laplace, 0.7 * 0.8)
    assert not laplace_scale_consistent(laplace, 1.3 * 0.8)


@pytest.mark.parametrize("sampler", [OpenDPSampler(), SeededSampler(np.random.default_rng(1))])
def test_samplers_refuse_bad_input(sampler: OpenDPSampler | SeededSampler) -> None:
    with pytest.raises(ValueError, match="finite"):
        sampler.gaussian(np.array([math.nan]), sigma=1.0, sensitivity_l2=1.0)
    with pytest.raises(ValueError, match="finite"):
        sampler.gaussian(np.array([math.inf]), sigma=1.0, sensitivity_l2=1.0)
    with pytest.raises(ValueError, match="sigma"):
        sampler.gaussian(np.array([0.0]), sigma=0.0, sensitivity_l2=1.0)
    with pytest.raises(ValueError, match="sensitivity"):
        sampler.laplace(np.array([0.0]), scale=1.0, sensitivity_l1=-1.0)
    with pytest.raises(ValueError, match="1-D"):
        sampler.laplace(np.zeros((2, 2)), scale=1.0, sensitivity_l1=1.0)


def test_secure_rng_is_unseeded() -> None:
    first, second = secure_rng(), secure_rng()
    assert not np.array_equal(first.integers(0, 2**62, 4), second.integers(0, 2**62, 4))
