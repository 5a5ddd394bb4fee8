"""Gaussian calibration and privacy-parameter validation (spec README §1.6, §1.7).

Pure functions, no randomness. Everything here is a function of public parameters only.

* ``gdp_delta(epsilon, mu)``: the (epsilon, delta) curve of mu-GDP (Dong, Roth & Su 2019),
  ``delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps * Phi(-eps/mu - mu/2)``, evaluated in log
  space with a tail-accurate standard normal CDF (``scipy.special.log_ndtr``). interpret's
  ``(1 + erf) / 2`` loses all precision in the far tail (README §1.2); this one does not.
* ``analytic_gaussian_multiplier(epsilon, delta)``: the smallest sigma / Delta for which the
  Gaussian mechanism is (epsilon, delta)-DP (Balle & Wang 2018, Theorem 8). It is the same
  condition as ``gdp_delta(epsilon, Delta / sigma) <= delta``. Solved by bisection and rounded
  up, so the returned multiplier is never below the true root.
* ``classic_gaussian_multiplier``: Dwork & Roth's ``sqrt(2 ln(1.25/delta)) / epsilon``, proven
  only for epsilon < 1 (kept for comparison and tests; strict mode uses the analytic one).
* ``gdp_mu`` / ``gdp_epsilon``: conversions between mu-GDP and (epsilon, delta), each rounded
  in the direction that keeps the stated guarantee valid.
* ``validate_*``: server-side validation of costs and levels before any charge (README §1.7).

Rounding conventions (all "towards the stronger guarantee"):

* a noise multiplier is rounded **up** (more noise);
* a GDP mu allowed by an (epsilon, delta) budget is rounded **down**;
* an epsilon spent by a mu-GDP mechanism at a given delta is rounded **up**.

References:
    Balle, B. and Wang, Y.-X. (2018). Improving the Gaussian mechanism for differential
    privacy: analytical calibration and optimal denoising. ICML.
    Dong, J., Roth, A. and Su, W. (2019). Gaussian differential privacy. arXiv:1905.02383.
    Dwork, C. and Roth, A. (2014). The algorithmic foundations of differential privacy.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from scipy.special import log_ndtr

from service.mechanisms.domain import PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters

# Relative width at which a bisection stops. Well below the printed precision of any reported
# multiplier; the final value is then rounded in the safe direction by ``round_up_significant``.
_BISECTION_RTOL = 1e-14
_MAX_BISECTION_STEPS = 400
# Significant digits kept when a calibrated value is rounded in the safe direction.
_SIGNIFICANT_DIGITS = 12


def log_normal_cdf(x: float) -> float:
    """Natural log of the standard normal CDF, accurate in both tails.

    Args:
        x: Any float, including +-inf.

    Returns:
        ``log(Phi(x))`` (``-inf`` at ``x = -inf``, ``0`` at ``x = +inf``).
    """
    return float(log_ndtr(x))


def normal_cdf(x: float) -> float:
    """Standard normal CDF, accurate (relative error) in the lower tail."""
    return math.exp(log_normal_cdf(x))


def gdp_delta(epsilon: float, mu: float) -> float:
    """The delta at which a mu-GDP mechanism is (epsilon, delta)-DP.

    ``delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps * Phi(-eps/mu - mu/2)`` (Dong, Roth & Su
    2019, Corollary 2.13; Balle & Wang 2018, Theorem 8 with mu = Delta / sigma).

    Computed as ``Phi(a) * (1 - exp(eps + log Phi(b) - log Phi(a)))`` with ``log_ndtr``, so the
    difference of two tiny tail probabilities keeps its relative accuracy.

    Args:
        epsilon: epsilon >= 0 (finite).
        mu: mu >= 0; ``inf`` gives delta = 1.

    Returns:
        delta in [0, 1].
    """
    if not (epsilon >= 0.0 and math.isfinite(epsilon)):
        raise ValueError("epsilon must be finite and non-negative")
    if not mu >= 0.0:
        raise ValueError("mu must be non-negative")
    if mu == 0.0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    a = -epsilon / mu + mu / 2.0
    b = -epsilon / mu - mu / 2.0
    log_a = log_normal_cdf(a)
    if log_a == -math.inf:
        return 0.0
    log_b = log_normal_cdf(b)
    # exponent <= 0 mathematically (e^eps Phi(b) <= Phi(a)); clamp tiny rounding excursions.
    exponent = min(epsilon + log_b - log_a, 0.0)
    return math.exp(log_a) * -math.expm1(exponent)


def round_up_significant(value: float, digits: int = _SIGNIFICANT_DIGITS) -> float:
    """Round a positive value up to ``digits`` significant digits (never below ``value``)."""
    return _round_significant(value, digits, ROUND_CEILING)


def round_down_significant(value: float, digits: int = _SIGNIFICANT_DIGITS) -> float:
    """Round a positive value down to ``digits`` significant digits (never above ``value``)."""
    return _round_significant(value, digits, ROUND_FLOOR)


def _round_significant(value: float, digits: int, rounding: str) -> float:
    if value <= 0.0 or not math.isfinite(value):
        raise ValueError("can only round positive finite values")
    exact = Decimal(value)  # exact binary value of the float
    quantum = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    rounded = float(exact.quantize(quantum, rounding=rounding))
    # float() rounds to nearest; step once more if that crossed ``value``.
    if rounding == ROUND_CEILING and rounded < value:
        rounded = math.nextafter(rounded, math.inf)
    if rounding == ROUND_FLOOR and rounded > value:
        rounded = math.nextafter(rounded, -math.inf)
    return rounded


def _bisect_geometric(
    is_valid: Callable[[float], bool], lower: float, upper: float
) -> tuple[float, float]:
    """Bisection in log space on a monotone predicate.

    ``is_valid`` must be False at ``lower`` and True at ``upper`` (the bracket is widened
    geometrically until it is). Returns the final ``(invalid, valid)`` bracket.
    """
    while is_valid(lower):
        lower /= 2.0
        if lower < sys.float_info.min:
            raise ValueError("bisection bracket underflow")
    while not is_valid(upper):
        upper *= 2.0
        if upper > 1e300:
            raise ValueError("bisection bracket overflow")
    for _ in range(_MAX_BISECTION_STEPS):
        if upper - lower <= _BISECTION_RTOL * upper:
            break
        middle = math.sqrt(lower * upper)
        if not lower < middle < upper:
            middle = 0.5 * (lower + upper)
            if not lower < middle < upper:
                break
        if is_valid(middle):
            upper = middle
        else:
            lower = middle
    return lower, upper


def analytic_gaussian_multiplier(epsilon: float, delta: float) -> float:
    """Smallest noise multiplier sigma / Delta of an (epsilon, delta)-DP Gaussian mechanism.

    The analytic Gaussian mechanism (Balle & Wang 2018): sigma is the smallest value with
    ``Phi(Delta/(2 sigma) - eps sigma/Delta) - e^eps Phi(-Delta/(2 sigma) - eps sigma/Delta)
    <= delta``, i.e. ``gdp_delta(epsilon, 1 / multiplier) <= delta``. Valid for every
    epsilon > 0 (not only epsilon < 1).

    Args:
        epsilon: epsilon > 0, finite.
        delta: 0 < delta < 1.

    Returns:
        The multiplier, rounded **up** to 12 significant digits; ``gdp_delta(epsilon,
        1 / result) <= delta`` holds as evaluated.
    """
    _check_open_unit(delta, "delta")
    if not (epsilon > 0.0 and math.isfinite(epsilon)):
        raise ValueError("epsilon must be positive and finite")

    def is_valid(multiplier: float) -> bool:
        return gdp_delta(epsilon, 1.0 / multiplier) <= delta

    _, valid = _bisect_geometric(is_valid, 1.0 / epsilon, 2.0 / epsilon + 1.0)
    result = round_up_significant(valid)
    # The rounded-up value is larger than a valid one, so still valid (delta falls as sigma
    # grows); re-check so that a non-monotone float artefact can never slip through.
    while not is_valid(result):
        result = round_up_significant(math.nextafter(result, math.inf) * (1.0 + 1e-12))
    return result


def classic_gaussian_multiplier(epsilon: float, delta: float) -> float:
    """Dwork & Roth's multiplier ``sqrt(2 ln(1.25/delta)) / epsilon``.

    Proven only for epsilon < 1; above about 8.4 (delta = 1e-5) it is smaller than the
    analytic multiplier and **not** valid (README §1.6). Strict mode never uses it.

    Args:
        epsilon: epsilon > 0, finite.
        delta: 0 < delta < 1.

    Returns:
        The formula's value (not rounded).
    """
    _check_open_unit(delta, "delta")
    if not (epsilon > 0.0 and math.isfinite(epsilon)):
        raise ValueError("epsilon must be positive and finite")
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def hall_constant(delta: float) -> float:
    """Hall, Rinaldo & Wasserman's GP constant ``c(delta) = sqrt(2 ln(2/delta))``."""
    _check_open_unit(delta, "delta")
    return math.sqrt(2.0 * math.log(2.0 / delta))


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest mu (rounded down) such that mu-GDP implies (epsilon, delta)-DP.

    Solves ``gdp_delta(epsilon, mu) = delta`` for mu.

    Args:
        epsilon: epsilon > 0, finite.
        delta: 0 < delta < 1.

    Returns:
        mu, rounded **down** to 12 significant digits, with ``gdp_delta(epsilon, mu) <=
        delta`` as evaluated.
    """
    _check_open_unit(delta, "delta")
    if not (epsilon > 0.0 and math.isfinite(epsilon)):
        raise ValueError("epsilon must be positive and finite")

    # Bisect on 1/mu so that the predicate is "valid above", as _bisect_geometric expects.
    def is_valid(inverse_mu: float) -> bool:
        return gdp_delta(epsilon, 1.0 / inverse_mu) <= delta

    _, valid_inverse = _bisect_geometric(is_valid, 1.0 / epsilon, 2.0 / epsilon + 1.0)
    result = round_down_significant(1.0 / valid_inverse)
    while gdp_delta(epsilon, result) > delta:
        result = round_down_significant(math.nextafter(result, 0.0) * (1.0 - 1e-12))
    return result


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest epsilon (rounded up) at which a mu-GDP mechanism is (epsilon, delta)-DP.

    Solves ``gdp_delta(epsilon, mu) = delta`` for epsilon (delta falls as epsilon grows).

    Args:
        mu: mu > 0, finite.
        delta: 0 < delta < 1.

    Returns:
        epsilon >= 0, rounded **up** to 12 significant digits; 0 if ``gdp_delta(0, mu) <=
        delta``.
    """
    _check_open_unit(delta, "delta")
    if not (mu > 0.0 and math.isfinite(mu)):
        raise ValueError("mu must be positive and finite")
    if gdp_delta(0.0, mu) <= delta:
        return 0.0

    def is_valid(epsilon: float) -> bool:
        return gdp_delta(epsilon, mu) <= delta

    _, valid = _bisect_geometric(is_valid, min(mu, 1.0) * 1e-3, mu * mu + 2.0 * mu + 1.0)
    result = round_up_significant(valid)
    while not is_valid(result):
        result = round_up_significant(math.nextafter(result, math.inf) * (1.0 + 1e-12))
    return result


# --------------------------------------------------------------------------------------------
# Validation (README §1.7). Messages quote the request only, never data.


def _is_real_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_open_unit(value: float, name: str) -> None:
    if not (_is_real_number(value) and 0.0 < value < 1.0):
        raise ValueError(f"{name} must be in (0, 1)")


def validate_finite_positive(value: object, name: str) -> float:
    """Check that ``value`` is a positive, finite, normal (non-subnormal) real number.

    Raises:
        InvalidParameters: NaN, +-inf, zero, negative, subnormal or non-numeric values.
    """
    if not _is_real_number(value):
        raise InvalidParameters(f"{name} must be a number")
    number = float(value)  # type: ignore[arg-type]
    if math.isnan(number) or math.isinf(number):
        raise InvalidParameters(f"{name} must be finite")
    if number <= 0.0:
        raise InvalidParameters(f"{name} must be positive")
    if number < sys.float_info.min:
        raise InvalidParameters(f"{name} must not be subnormal")
    return number


def validate_epsilon(
    epsilon: object, *, name: str = "epsilon", minimum: float = 0.0, maximum: float = math.inf
) -> float:
    """Validate an epsilon: > 0, finite, normal, and within optional public limits.

    Raises:
        InvalidParameters: if invalid.
    """
    value = validate_finite_positive(epsilon, name)
    if value < minimum:
        raise InvalidParameters(f"{name} must be at least {minimum}")
    if value > maximum:
        raise InvalidParameters(f"{name} must be at most {maximum}")
    return value


def validate_delta(delta: object, *, n_min: int, name: str = "delta") -> float:
    """Validate a delta: ``0 < delta < 1 / n_min`` (n_min = the smallest fold a module sees).

    Raises:
        InvalidParameters: if invalid.
    """
    if isinstance(n_min, bool) or not isinstance(n_min, int) or n_min < 1:
        raise InvalidParameters("the smallest fold size must be a positive integer")
    value = validate_finite_positive(delta, name)
    if not value < 1.0 / n_min:
        raise InvalidParameters(
            f"{name} must be below 1/{n_min} = {1.0 / n_min:.6g}: one over the smallest fold "
            f"of rows this release reads ({n_min}, a public share of the dataset's n)"
        )
    return value


def validate_alpha(alpha: object, *, name: str = "alpha") -> float:
    """Validate a miscoverage level alpha in (0, 1).

    Raises:
        InvalidParameters: if invalid.
    """
    value = validate_finite_positive(alpha, name)
    if not value < 1.0:
        raise InvalidParameters(f"{name} must be in (0, 1)")
    return value


# The largest delta a release takes by default.
DEFAULT_DELTA_CAP = 1e-5


def default_delta(n_min: int) -> float:
    """The default delta ``min(1e-5, 1 / (10 n_min))`` (README §1.7)."""
    if n_min < 1:
        raise InvalidParameters("the smallest fold size must be a positive integer")
    return min(DEFAULT_DELTA_CAP, 1.0 / (10.0 * n_min))


def public_propensity(domain: PublicDomain, propensity_clip: object) -> tuple[float | None, float]:
    """The CATE kinds' public propensity and clip c, from the schema and the request only.

    RCT: the declared assignment probability p (in (0, 1)) and ``c = min(p, 1 - p)``; otherwise
    ``(None, c)`` with the request's ``propensity_clip`` checked to lie in
    ``[domain.min_propensity_clip, 0.5]``.

    Raises:
        InvalidParameters: an RCT without a usable p, or a clip outside its range.
    """
    clip = validate_finite_positive(propensity_clip, "propensity_clip")
    if domain.design == StudyDesign.RCT:
        p = domain.treatment_probability
        if p is None or not 0.0 < p < 1.0:
            raise InvalidParameters("an RCT needs a declared treatment_probability in (0, 1)")
        return float(p), min(float(p), 1.0 - float(p))
    if not domain.min_propensity_clip <= clip <= 0.5:
        raise InvalidParameters(f"propensity_clip must be in [{domain.min_propensity_clip}, 0.5]")
    return None, clip
