"""Exact privacy amounts: integers in fixed units, costs rounded up, totals rounded down.

ε is stored in units of 1e-12 and δ in units of 1e-18 (BIGINT on both databases). A cost is
rounded **up** to the next unit (the ledger never records less loss than the mechanism
incurs); a total set by an owner is rounded **down** (the cap is never looser than asked).
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

EPSILON_SCALE = 10**12
DELTA_SCALE = 10**18
MAX_EPSILON = 10**6
MAX_UNITS = 2**62


class InvalidAmount(ValueError):
    """A privacy amount is NaN, infinite, negative, subnormal or too large."""


def _check(value: float, what: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidAmount(f"{what} must be a number")
    if not math.isfinite(value):
        raise InvalidAmount(f"{what} must be finite")
    if value < 0:
        raise InvalidAmount(f"{what} must be non-negative")
    if value != 0 and abs(value) < 2.2250738585072014e-308:
        raise InvalidAmount(f"{what} must not be subnormal")
    # The shortest decimal that round-trips to this float: what the caller wrote (1e-05 is
    # 0.00001, not its binary expansion 0.0000100000000000000008180305...). The difference is
    # below 1e-21, far below one unit, and is covered by the calibrations' upward rounding
    # of noise multipliers (to 12 significant digits).
    return Decimal(repr(float(value)))


def _to_units(value: float, scale: int, rounding: str, what: str) -> int:
    units = int((_check(value, what) * scale).to_integral_value(rounding=rounding))
    if units > MAX_UNITS:
        raise InvalidAmount(f"{what} is too large")
    return units


def epsilon_cost_units(epsilon: float) -> int:
    return _to_units(epsilon, EPSILON_SCALE, ROUND_CEILING, "epsilon")


def delta_cost_units(delta: float) -> int:
    return _to_units(delta, DELTA_SCALE, ROUND_CEILING, "delta")


def _total_units(value: float, scale: int, what: str) -> int:
    """A total rounded down; a positive one below the unit would be stored as 0 (a budget that
    silently refuses everything), so it is refused instead."""
    units = _to_units(value, scale, ROUND_FLOOR, what)
    if units == 0 and value > 0:
        raise InvalidAmount(
            f"{what} {value!r} is below the ledger's unit ({1 / scale:g}): give 0 or at least that"
        )
    return units


def epsilon_total_units(epsilon: float) -> int:
    return _total_units(epsilon, EPSILON_SCALE, "epsilon")


def delta_total_units(delta: float) -> int:
    return _total_units(delta, DELTA_SCALE, "delta")


def epsilon_value(units: int) -> float:
    return units / EPSILON_SCALE


def delta_value(units: int) -> float:
    return units / DELTA_SCALE


def epsilon_str(units: int) -> str:
    """Exact decimal text of an ε amount (for exports)."""
    return str(Decimal(units) / EPSILON_SCALE)


def delta_str(units: int) -> str:
    return str(Decimal(units) / DELTA_SCALE)
