"""The ingest report's warnings: bounds that clip a column in more than 1 % of its rows."""

from __future__ import annotations

from service.datasets.ingest import bound_warnings


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
