"""Clopper–Pearson lower bounds on a mechanism's epsilon from released events (the audits'
shared arithmetic)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from scipy import stats


def events_epsilon_lower_bound(
    events_first: Sequence[NDArray[np.bool_]],
    events_second: Sequence[NDArray[np.bool_]],
    family_level: float,
) -> float:
    """Largest one-sided CP lower bound on ``log P(S) / P'(S)`` over paired events (each the
    indicator of one event over the runs on one dataset and its neighbour), in both directions;
    ``family_level`` is split over the events, the directions and the two bounds per ratio."""
    level = family_level / (2 * 2 * len(events_first))
    best = 0.0
    for one, other in ((events_first, events_second), (events_second, events_first)):
        for event_p, event_q in zip(one, other, strict=True):
            runs_p, runs_q = int(event_p.size), int(event_q.size)
            p, q = int(event_p.sum()), int(event_q.sum())
            p_low = float(stats.beta.ppf(level, p, runs_p - p + 1)) if p > 0 else 0.0
            q_high = float(stats.beta.ppf(1 - level, q + 1, runs_q - q)) if q < runs_q else 1.0
            if p_low > 0.0:
                best = max(best, math.log(p_low / q_high))
    return best
