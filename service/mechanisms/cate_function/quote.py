"""cate_function's quote: the public constants and the pointwise noise sd (no data)."""

from __future__ import annotations

from typing import Any

from service.mechanisms.cate_function.calibration import (
    CateFunctionParams,
    plan,
    public_parameters,
)
from service.mechanisms.domain import PublicDomain


def quote(domain: PublicDomain, params: CateFunctionParams) -> dict[str, Any]:
    """Public preview: the constants and the pointwise noise sd; no data, no charge."""
    state = plan(domain, params)
    out = public_parameters(state)
    out["pointwise_noise_sd"] = state.scale.r0
    out["n2"] = state.n2
    return out
