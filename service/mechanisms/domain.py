"""The public domain of a dataset, as the mechanisms see it.

Everything here is public metadata declared by the data owner (spec README §1.3) or public by
the neighbouring relation (n, replace-one). Nothing in it is ever derived from the data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.mechanisms.errors import InvalidParameters


class StudyDesign(StrEnum):
    OBSERVATIONAL = "observational"
    RCT = "rct"


@dataclass(frozen=True)
class PublicDomain:
    """Public box for covariates and outcome, the study design and the public size n."""

    x_lower: NDArray[np.float64]
    x_upper: NDArray[np.float64]
    y_lower: float
    y_upper: float
    n: int
    design: StudyDesign = StudyDesign.OBSERVATIONAL
    # RCT only: the declared, public probability of assignment to treatment.
    treatment_probability: float | None = None
    # The owner's minimum propensity clip c_pi (requests may only ask for a larger one).
    min_propensity_clip: float = 0.01
    allow_paper_mode: bool = False
    # Per covariate: the declared integer codes of a categorical covariate, None for a numeric
    # one (its box is [min code, max code]); None: all numeric. Public schema only.
    x_codes: tuple[tuple[int, ...] | None, ...] | None = None
    # The owner's declared effect modifiers (covariate positions, increasing); None: none
    # declared. The default effect_columns of the CATE kinds' DP-EBM effect model.
    effect_modifiers: tuple[int, ...] | None = None
    # The owner's declared adjustment set (covariate positions, increasing; the analysis plan's
    # confounders, or a trial's pre-specified baseline covariates); None: none declared. The
    # default adjustment_columns of the strict ate's nuisance models.
    adjustment_set: tuple[int, ...] | None = None
    # The covariates' names in schema order (public); None: unnamed, read as x0, x1, ...
    x_names: tuple[str, ...] | None = None
    # A declared yes/no outcome coded 0 and 1 (the schema's outcome type "binary"): its
    # variance is at most 1/4, the scale the quotes assume for it. Public schema only.
    y_binary: bool = False

    @property
    def q(self) -> int:
        return int(self.x_lower.shape[0])

    @property
    def outcome_range(self) -> float:
        return float(self.y_upper - self.y_lower)

    @property
    def names(self) -> tuple[str, ...]:
        """The covariates' public names in schema order (``x0, x1, ...`` when unnamed)."""
        return self.x_names if self.x_names is not None else tuple(f"x{j}" for j in range(self.q))


@dataclass(frozen=True)
class Arrays:
    """The private data, already clipped to the public box at ingest. Never leaves the server."""

    x: NDArray[np.float64]  # (n, q)
    a: NDArray[np.float64]  # (n,), values in {0, 1}
    y: NDArray[np.float64]  # (n,)


def checked_columns(
    domain: PublicDomain, given: Sequence[int] | None, field: str
) -> tuple[int, ...] | None:
    """A request's covariate positions as an increasing tuple, or None for every covariate (a
    list of all q is None: the same release). Raises ``InvalidParameters`` (a 422 before any
    charge) for an empty list, a non-integer, a repeated or an out-of-range position. Public
    request and schema only."""
    if given is None:
        return None
    columns = tuple(given)
    if not columns:
        raise InvalidParameters(f"{field} must name at least one covariate")
    if any(isinstance(j, bool) or not isinstance(j, int) for j in columns):
        raise InvalidParameters(f"{field} must be covariate positions (integers)")
    if any(not 0 <= j < domain.q for j in columns):
        raise InvalidParameters(f"{field} must be positions of covariates, in [0, {domain.q - 1}]")
    if len(set(columns)) != len(columns):
        raise InvalidParameters(f"{field} must not repeat a covariate")
    ordered = tuple(sorted(columns))
    return None if len(ordered) == domain.q else ordered


def project_domain(domain: PublicDomain, columns: tuple[int, ...] | None) -> PublicDomain:
    """The public domain of the covariates at ``columns`` only (None: unchanged). The declared
    effect modifiers and adjustment set refer to the full schema's positions, so they are
    dropped."""
    if columns is None:
        return domain
    keep = list(columns)
    return replace(
        domain,
        x_lower=np.asarray(domain.x_lower, dtype=np.float64)[keep],
        x_upper=np.asarray(domain.x_upper, dtype=np.float64)[keep],
        x_codes=None if domain.x_codes is None else tuple(domain.x_codes[j] for j in keep),
        effect_modifiers=None,
        adjustment_set=None,
    )


def project_covariates(
    x: NDArray[np.float64], columns: tuple[int, ...] | None
) -> NDArray[np.float64]:
    """The covariate rows ``x`` at ``columns`` only (None: unchanged): a public, row-wise map,
    so neighbouring datasets stay neighbours."""
    if columns is None:
        return x
    return np.ascontiguousarray(x[:, list(columns)])


def project(
    arrays: Arrays, domain: PublicDomain, columns: tuple[int, ...] | None
) -> tuple[Arrays, PublicDomain]:
    """The records with the covariates at ``columns`` only, and their public domain (None:
    unchanged): ``project_covariates`` and ``project_domain``."""
    if columns is None:
        return arrays, domain
    x = project_covariates(arrays.x, columns)
    return replace(arrays, x=x), project_domain(domain, columns)


def codes_text(codes: Any) -> str:
    """A categorical covariate's codes for a message, in order (at most 10 shown)."""
    shown = [str(int(c)) for c in sorted(codes)[:10]]
    return "{" + ", ".join(shown) + (", …}" if len(codes) > 10 else "}")


def coordinate_error(value: float, lower: float, upper: float, codes: Any) -> str | None:
    """Why a query point's coordinate is refused (outside the public bounds, a non-finite
    value included, or not one of a categorical covariate's ``codes``); None if it is valid."""
    if codes is not None and not (math.isfinite(value) and value in codes):
        # a categorical covariate's values are its codes, whatever lies between them
        return f"a categorical covariate: one of its codes {codes_text(codes)}"
    if not (math.isfinite(value) and lower <= value <= upper):
        return f"outside the public bounds [{lower:g}, {upper:g}]"
    return None


def points_summary(messages: list[str], total: int | None = None) -> str:
    """The problem's detail for invalid points: the first error and how many more; ``total``:
    the number of invalid values where ``messages`` lists only the first of them."""
    count = len(messages) if total is None else total
    more = count - 1
    text = f"invalid query point: {messages[0]}" + (f" (and {more} more)" if more else "")
    if count > len(messages):
        text += f"; errors lists the first {len(messages)}"
    return text
