"""The type of a batch of query points in a request body (``/evaluate``, ``/predict``).

A list longer than its limit is refused by its length alone, before any item is validated:
pydantic's ``max_length`` counts after validating every item, so a client's 27 MB body of a
million points held the event loop for 5 s (every other caller waited) only to be told the
batch was too long. Each point is likewise refused by its length before its coordinates are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictFloat
from pydantic_core import PydanticCustomError

from service.problems import ValidationFailed

# A point has one coordinate per covariate; a schema has at most this many (PublicSchema).
MAX_COVARIATES = 500


def at_most(limit: int) -> BeforeValidator:
    """A list validator refusing more than ``limit`` items by its length alone."""

    def check(value: Any) -> Any:
        if isinstance(value, list) and len(value) > limit:
            raise PydanticCustomError(
                "too_long",
                "List should have at most {max_length} items, not {actual_length}",
                {"max_length": limit, "actual_length": len(value)},
            )
        return value

    return BeforeValidator(check)


Point = Annotated[list[StrictFloat], at_most(MAX_COVARIATES)]

# The optional names of a batch's columns (``in_schema_order``).
Columns = Annotated[list[Annotated[str, Field(max_length=200)]], at_most(MAX_COVARIATES)]
COLUMNS_DESCRIPTION = (
    "Optional: the covariates' names in the order each point gives them (any order; each of the "
    "schema's covariates once). The points are then read by name, so a column order that "
    "drifted is refused instead of answered for the wrong patient. Without it, points are in "
    "schema order."
)


def in_schema_order(
    points: list[list[float]], columns: list[str] | None, names: Sequence[str] | None
) -> list[list[float]]:
    """The points in schema order: as sent without ``columns``; with them (the covariates'
    names in the order the points give them, any order), reordered to ``names``, the schema's.

    A decision-support system that sends its columns by name cannot be silently answered for
    the wrong patient when its column order drifts: a walkthrough's age and eGFR swapped were
    answered 200. Raises ``ValidationFailed`` (pointer ``#/columns``) unless ``columns`` names
    each of ``names`` exactly once. A point of another length is left as it is (the points'
    own check names it)."""
    if columns is None:
        return points
    if names is None:
        raise ValidationFailed(
            "this release does not record its covariates' names: send the points in schema "
            "order without 'columns'",
            pointer="#/columns",
        )
    expected = list(names)
    twice = sorted({c for c in columns if columns.count(c) > 1})
    unknown = [c for c in columns if c not in expected]
    missing = [n for n in expected if n not in columns]
    if twice or unknown or missing:
        parts = []
        if unknown:
            parts.append(f"not covariates: {', '.join(unknown[:10])}")
        if missing:
            parts.append(f"missing: {', '.join(missing[:10])}")
        if twice:
            parts.append(f"named twice: {', '.join(twice[:10])}")
        raise ValidationFailed(
            "columns must name each covariate once (" + "; ".join(parts) + "); the schema's "
            f"order is {', '.join(expected[:50])}{' ...' if len(expected) > 50 else ''}",
            pointer="#/columns",
        )
    order = [columns.index(n) for n in expected]
    width = len(columns)
    return [[p[j] for j in order] if len(p) == width else p for p in points]


_COORDINATE = re.compile(r"#/points/(\d+)/(\d+)")


def in_request_order(
    error: ValidationFailed, columns: list[str] | None, names: Sequence[str] | None
) -> ValidationFailed:
    """A points error of a batch read by ``columns``, its pointers in the request's order: the
    check runs on the points reordered to the schema (``in_schema_order``), so its
    ``#/points/i/j`` names schema position j; the request gave that covariate at
    ``columns.index(names[j])`` (a re-test's age=95 at request index 2 was reported at index 0,
    the eGFR). Each such detail also names the column."""
    if columns is None or names is None:
        return error
    errors = error.extensions.get("errors")
    if not isinstance(errors, list):
        return error
    moved = []
    for entry in errors:
        match = _COORDINATE.fullmatch(str(entry.get("pointer", "")))
        if match is None or int(match.group(2)) >= len(names):
            moved.append(entry)
            continue
        name = names[int(match.group(2))]
        moved.append(
            {
                "pointer": f"#/points/{match.group(1)}/{columns.index(name)}",
                "detail": f"{entry.get('detail', '')} (column {name})",
            }
        )
    return ValidationFailed(error.detail, errors=moved)
