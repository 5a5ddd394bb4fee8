"""The type of a batch of query points in a request body (``/evaluate``, ``/predict``).

A list longer than its limit is refused by its length alone, before any item is validated:
pydantic's ``max_length`` counts after validating every item, so a client's 27 MB body of a
million points held the event loop for 5 s (every other caller waited) only to be told the
batch was too long. Each point is likewise refused by its length before its coordinates are.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, StrictFloat
from pydantic_core import PydanticCustomError

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
