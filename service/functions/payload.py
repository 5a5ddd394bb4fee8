"""What a ``cate_function`` release job hands to the runner to persist (no DB imports)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.mechanisms.cate_function import FittedFunction, ReferenceDraw

# The kind's ``run`` result carries the secret under this key; the runner pops it before the
# result is serialised and stores it with ``service.functions.service.store``.
SECRET_KEY = "__function_secret__"


@dataclass(frozen=True)
class FunctionSecret:
    """The fitted function and its fixed public header (box, capacity, jitter)."""

    fitted: FittedFunction
    basis: str
    q: int
    t_max: int
    batch_max: int
    jitter: float
    public: dict[str, Any]
    # exact basis with shrinkage: the path drawn at the public reference points at release
    # time, stored as the function's first batch (cate_function proof §7)
    initial: ReferenceDraw | None = None
    # exact basis: the most new distinct points one caller may add (None: only t_max)
    points_per_principal: int | None = None
