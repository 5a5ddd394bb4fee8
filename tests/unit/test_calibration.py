"""Gaussian calibration: spec README §1.6 reference values, closed forms and properties."""

from __future__ import annotations

import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.mechanisms.calibration import (
    analytic_gaussian_multiplier,
    classic_gaussian_multiplier,
    default_delta,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    hall_constant,
    log_normal_cdf,
    validate_alpha,
    validate_delta,
    validate_epsilon,
)
from service.mechanisms.errors import InvalidParameters

# README §1.6 table: eps -> (classic 1e-5, analytic 1e-5, true delta of classic sigma at 1e-5,
# classic 1e-6, analytic 1e-6).
TABLE = {
    0.1: (48.4481, 30.7496, 2.64e-9, 52.988, 36.3047),
    0.25: (19.3792, 13.2855, 7.1e-9, 21.1952, 15.4098),
    0.5: (9.6896, 7.0318, 1.61e-8, 10.5976, 8.0576),
    1: (4.8448, 3.7306, 4.11e-8, 5.2988, 4.2247),
    2: (2.4224, 1.9938, 1.34e-7, 2.6494, 2.2305),
    4: (1.2112, 1.0812, 6.84e-7, 1.3247, 1.1935),
    8: (0.6056, 0.6002, 7.97e-6, 0.6624, 0.6529),
    10: (0.4845, 0.4999, 2.27e-5, 0.5299, 0.5411),
    16: (0.3028, 0.3442, 3.36e-4, 0.3312, 0.3686),
}

# README §1.6, "More analytic multipliers": (delta, eps, multiplier).
EXTRA_ANALYTIC = [
    (5e-6, 0.05, 61.3721),
    (5e-6, 0.1, 32.486),
    (5e-6, 0.2, 17.1418),
    (5e-6, 0.25, 13.948),
    (5e-6, 0.4, 9.0335),
    (5e-6, 0.5, 7.3511),
    (5e-6, 1, 3.8841),
    (8e-6, 0.4, 8.761),
    (8e-6, 1, 3.7805),
    (2e-6, 0.1, 34.6945),
]


def _decimals(printed: float) -> int:
    text = repr(float(printed))
    return len(text.split(".")[1]) if "." in text else 0


def _matches_printed(value: float, printed: float) -> bool:
    """``value`` rounds to ``printed`` at the printed number of decimals."""
    half_unit = 0.5 * 10.0 ** -_decimals(printed)
    return abs(value - printed) <= half_unit * (1 + 1e-9)


def _matches_significant(value: float, printed: float, digits: int) -> bool:
    return float(f"{value:.{digits}g}") == printed


@pytest.mark.parametrize("epsilon", sorted(TABLE))
def test_readme_table_multipliers(epsilon: float) -> None:
    classic5, analytic5, _, classic6, analytic6 = TABLE[epsilon]
    assert _matches_printed(classic_gaussian_multiplier(epsilon, 1e-5), classic5)
    assert _matches_printed(analytic_gaussian_multiplier(epsilon, 1e-5), analytic5)
    assert _matches_printed(classic_gaussian_multiplier(epsilon, 1e-6), classic6)
    assert _matches_printed(analytic_gaussian_multiplier(epsilon, 1e-6), analytic6)


@pytest.mark.parametrize("epsilon", sorted(TABLE))
def test_readme_table_true_delta_of_classic_sigma(epsilon: float) -> None:
    printed = TABLE[epsilon][2]
    true_delta = gdp_delta(epsilon, 1.0 / classic_gaussian_multiplier(epsilon, 1e-5))
    digits = len(repr(printed).split("e")[0].replace(".", "").lstrip("0"))
    assert _matches_significant(true_delta, printed, digits)
    # The classic sigma "fails" exactly where the table says so.
    assert (true_delta > 1e-5) == (epsilon >= 10)


@pytest.mark.parametrize(("delta", "epsilon", "printed"), EXTRA_ANALYTIC)
def test_readme_extra_analytic_multipliers(delta: float, epsilon: float, printed: float) -> None:
    assert _matches_printed(analytic_gaussian_multiplier(epsilon, delta), printed)


def test_hall_constant_and_its_validity_range() -> None:
    assert round(hall_constant(1e-5), 4) == 4.9409
    assert round(hall_constant(1e-6), 4) == 5.3868
    # README §1.6: sigma = Delta c(delta) / eps holds up to eps = 9 and fails at 10.
    for delta in (1e-5, 1e-6):
        assert gdp_delta(9.0, 9.0 / hall_constant(delta)) <= delta
    assert float(f"{gdp_delta(10.0, 10.0 / hall_constant(1e-5)):.3g}") == 1.36e-5
    assert float(f"{gdp_delta(10.0, 10.0 / hall_constant(1e-6)):.3g}") == 1.15e-6


def test_analytic_crossover_with_classic() -> None:
    # README §1.6: analytic <= classic below eps = 8.42 at 1e-5 (8.78 at 1e-6), above it the
    # classic sigma is smaller and invalid.
    for delta, crossover in ((1e-5, 8.42), (1e-6, 8.78)):
        below, above = crossover - 0.01, crossover + 0.01
        assert analytic_gaussian_multiplier(below, delta) <= classic_gaussian_multiplier(
            below, delta
        )
        assert analytic_gaussian_multiplier(above, delta) > classic_gaussian_multiplier(
            above, delta
        )
        assert gdp_delta(above, 1.0 / classic_gaussian_multiplier(above, delta)) > delta


def test_gdp_delta_closed_forms_and_tails() -> None:
    # eps = 0: delta = Phi(mu/2) - Phi(-mu/2) = 2 Phi(mu/2) - 1 (total variation).
    for mu in (0.1, 1.0, 3.0):
        assert gdp_delta(0.0, mu) == pytest.approx(math.erf(mu / (2 * math.sqrt(2))), rel=1e-12)
    assert gdp_delta(1.0, 0.0) == 0.0
    assert gdp_delta(1.0, math.inf) == 1.0
    # Far tail, where (1 + erf) / 2 returns 0 or garbage: stays positive and monotone.
    tail = [gdp_delta(eps, 1.0) for eps in (10.0, 15.0, 20.0)]
    assert all(value > 0.0 for value in tail)
    assert tail[0] > tail[1] > tail[2]
    naive = 0.5 * (1 + math.erf(-19.5 / math.sqrt(2)))  # interpret-style Phi(-19.5)
    assert naive == 0.0 < tail[2]
    assert log_normal_cdf(-40.0) == pytest.approx(-804.6084420137538, rel=1e-12)


def test_multiplier_is_rounded_up_never_below_the_root() -> None:
    for epsilon in (0.05, 0.3, 1.0, 7.0, 50.0):
        for delta in (1e-5, 1e-8):
            multiplier = analytic_gaussian_multiplier(epsilon, delta)
            assert gdp_delta(epsilon, 1.0 / multiplier) <= delta
            # ... and tight: 1e-9 less noise already violates delta.
            assert gdp_delta(epsilon, 1.0 / (multiplier * (1 - 1e-9))) > delta


def test_gdp_mu_and_gdp_epsilon_round_in_the_safe_direction() -> None:
    mu = gdp_mu(1.0, 1e-5)
    assert gdp_delta(1.0, mu) <= 1e-5
    assert gdp_delta(1.0, mu * (1 + 1e-9)) > 1e-5
    epsilon = gdp_epsilon(0.5, 1e-6)
    assert gdp_delta(epsilon, 0.5) <= 1e-6
    assert gdp_delta(epsilon * (1 - 1e-9), 0.5) > 1e-6
    assert gdp_epsilon(1e-9, 0.5) == 0.0


@settings(max_examples=60, deadline=None)
@given(
    epsilon=st.floats(min_value=0.01, max_value=60.0),
    log10_delta=st.floats(min_value=-12.0, max_value=-2.0),
)
def test_epsilon_sigma_epsilon_round_trip(epsilon: float, log10_delta: float) -> None:
    delta = 10.0**log10_delta
    multiplier = analytic_gaussian_multiplier(epsilon, delta)
    recovered = gdp_epsilon(1.0 / multiplier, delta)
    assert recovered <= epsilon * (1 + 1e-11)
    assert recovered == pytest.approx(epsilon, rel=1e-8)
    assert gdp_mu(epsilon, delta) == pytest.approx(1.0 / multiplier, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    epsilon=st.floats(min_value=0.01, max_value=30.0),
    factor=st.floats(min_value=1.001, max_value=3.0),
    log10_delta=st.floats(min_value=-10.0, max_value=-3.0),
)
def test_sigma_decreases_in_epsilon_and_delta(
    epsilon: float, factor: float, log10_delta: float
) -> None:
    delta = 10.0**log10_delta
    assert analytic_gaussian_multiplier(epsilon * factor, delta) < analytic_gaussian_multiplier(
        epsilon, delta
    )
    assert analytic_gaussian_multiplier(epsilon, min(delta * factor, 0.5)) <= (
        analytic_gaussian_multiplier(epsilon, delta)
    )


@settings(max_examples=40, deadline=None)
@given(
    epsilon=st.floats(min_value=0.001, max_value=0.999),
    log10_delta=st.floats(min_value=-12.0, max_value=-3.0),
)
def test_analytic_never_above_classic_where_classic_is_valid(
    epsilon: float, log10_delta: float
) -> None:
    delta = 10.0**log10_delta
    classic = classic_gaussian_multiplier(epsilon, delta)
    assert gdp_delta(epsilon, 1.0 / classic) <= delta  # the classic proof's range
    assert analytic_gaussian_multiplier(epsilon, delta) <= classic


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, 0.0, -1.0, 5e-324, sys.float_info.min / 2, "1", True]
)
def test_validation_rejects_bad_costs(value: object) -> None:
    with pytest.raises(InvalidParameters):
        validate_epsilon(value)
    with pytest.raises(InvalidParameters):
        validate_delta(value, n_min=10)
    with pytest.raises(InvalidParameters):
        validate_alpha(value)


def test_validation_limits() -> None:
    assert validate_epsilon(0.5) == 0.5
    assert validate_epsilon(sys.float_info.min) == sys.float_info.min
    with pytest.raises(InvalidParameters):
        validate_epsilon(200.0, maximum=100.0)
    with pytest.raises(InvalidParameters):
        validate_epsilon(0.001, minimum=0.01)
    assert validate_delta(9.9e-4, n_min=1000) == 9.9e-4
    with pytest.raises(InvalidParameters, match=r"below 1/1000 = 0\.001: one over the smallest"):
        validate_delta(1e-3, n_min=1000)  # delta < 1/n is strict
    with pytest.raises(InvalidParameters):
        validate_delta(1e-6, n_min=0)
    with pytest.raises(InvalidParameters):
        validate_alpha(1.0)
    assert validate_alpha(0.05) == 0.05
    assert default_delta(100) == 1e-5
    assert default_delta(1_000_000) == pytest.approx(1e-7)
