"""The public domain of a dataset, as the mechanisms see it.

Everything here is public metadata declared by the data owner (spec README §1.3) or public by
the neighbouring relation (n, replace-one). Nothing in it is ever derived from the data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray


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

    @property
    def q(self) -> int:
        return int(self.x_lower.shape[0])

    @property
    def outcome_range(self) -> float:
        return float(self.y_upper - self.y_lower)


@dataclass(frozen=True)
class Arrays:
    """The private data, already clipped to the public box at ingest. Never leaves the server."""

    x: NDArray[np.float64]  # (n, q)
    a: NDArray[np.float64]  # (n,), values in {0, 1}
    y: NDArray[np.float64]  # (n,)
