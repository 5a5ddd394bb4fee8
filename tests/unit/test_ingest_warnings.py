"""The ingest report's warnings: bounds that clip a column in more than 1 % of its rows, an
arm too small to estimate from, an outcome with one value."""

from __future__ import annotations

import numpy as np

from service.datasets.ingest import MIN_ARM_ROWS, bound_warnings, design_warnings


def test_a_column_clipped_in_more_than_one_percent_of_rows_is_named() -> None:
    bounds = {"los": (0.0, 1.0), "age": (18.0, 90.0)}
    warnings = bound_warnings({"los": 4988, "age": 50}, 0, 5000, bounds)
    assert len(warnings) == 1  # age: 50 of 5000 is exactly 1 %, not above it
    assert warnings[0].startswith("4988 of 5000 values of 'los' (100%) were outside its declared")
    assert "[0, 1]" in warnings[0]


def test_rejected_rows_above_one_percent_are_reported() -> None:
    assert bound_warnings({}, 0, 100, {}) == []
    assert bound_warnings({}, 1, 100, {}) == []
    (warning,) = bound_warnings({}, 2, 100, {})
    assert warning.startswith("2 of 100 rows (2%) were rejected")


def test_a_single_arm_dataset_is_named_in_the_owners_report() -> None:
    y = np.linspace(0.0, 1.0, 100)
    (warning,) = design_warnings(np.zeros(100), y)
    assert warning.startswith("only 0 of 100 rows are treated (1)")
    (warning,) = design_warnings(np.ones(100), y)
    assert warning.startswith("only 0 of 100 rows are untreated (0)")


def test_an_arm_below_the_minimum_is_named_and_one_at_it_is_not() -> None:
    y = np.linspace(0.0, 1.0, 100)
    small = np.zeros(100)
    small[: MIN_ARM_ROWS - 1] = 1.0
    (warning,) = design_warnings(small, y)
    assert warning.startswith(f"only {MIN_ARM_ROWS - 1} of 100 rows are treated")
    small[MIN_ARM_ROWS - 1] = 1.0
    assert design_warnings(small, y) == []


def test_an_outcome_with_one_value_is_named() -> None:
    a = np.tile([0.0, 1.0], 50)
    (warning,) = design_warnings(a, np.full(100, 10.0))
    assert warning.startswith("the outcome takes one value (10) in every row")
    assert design_warnings(a, np.r_[np.full(99, 10.0), 11.0]) == []
