"""Mechanism records: the frozen, serialisable description of one release's privacy cost.

Like ``dp_accounting``'s ``DpEvent``, a record lists every noise component with its public
parameters so that totals can be recomputed by tighter accountants later. Fields of a kind are
never removed or redefined; new fields are added with defaults.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Guarantee(StrEnum):
    STRICT = "strict"
    PAPER = "paper"


class Composition(StrEnum):
    SEQUENTIAL = "sequential"
    THEOREM6_MAX = "theorem6_max"
    CELLS = "cells"
    # A whole-data anchor, then the rest: the events whose module starts with ANCHOR_PREFIX are
    # a strict ``ate`` release on all n rows (composed by their own rule, named in each event's
    # ``anchor_composition``); the other events compose by the Theorem 6 max over their modules
    # (sequential within a module); the two parts compose sequentially, so the record's cost is
    # the anchor's plus the rest's (docs/proofs/cate_function.md §7).
    ANCHOR_THEN_THEOREM6_MAX = "anchor_then_theorem6_max"
    # Subsample and aggregate: the events whose module starts with ``chunk<c>/`` are one strict
    # ``ate`` release on chunk c's rows (composed by its own rule, named in each event's
    # ``chunk_composition``); the chunks are disjoint sets of rows, each release costs the same
    # (epsilon, delta), and the record's cost is that one chunk's (parallel composition under
    # replace-one; docs/proofs/ate_strict.md §17).
    CHUNKS = "chunks"


ANCHOR_PREFIX = "anchor/"
CHUNK_PREFIX = "chunk"


NEIGHBOURING = "replace-one"


@dataclass(frozen=True)
class NoiseEvent:
    """One noise component. ``params`` holds public values only (never a data-dependent scale)."""

    type: str  # gaussian | laplace | gdp_module | ...
    module: str  # which fold/module of the pipeline it belongs to
    epsilon: float
    delta: float
    params: dict[str, float | int | str] = field(default_factory=dict)


@dataclass(frozen=True)
class MechanismRecord:
    """Everything the ledger stores about a release's privacy cost. Computed without data."""

    mechanism: str
    version: str
    guarantee: Guarantee
    n: int
    fold_sizes: dict[str, int]
    composition: Composition
    events: tuple[NoiseEvent, ...]
    epsilon: float
    delta: float
    neighbouring: str = NEIGHBOURING

    def __post_init__(self) -> None:
        for value in (self.epsilon, self.delta):
            if not math.isfinite(value) or value < 0:
                raise ValueError("a privacy cost must be finite and non-negative")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["guarantee"] = str(self.guarantee)
        out["composition"] = str(self.composition)
        return out
