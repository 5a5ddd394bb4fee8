"""uplift_table's quote: the noise scales, the expected noise sd of a cell uplift and the
partition-size heuristic (no data, no charge).
"""

from __future__ import annotations

import math
from typing import Any

from service.mechanisms import ate_strict
from service.mechanisms.ate_strict import aggregate
from service.mechanisms.domain import PublicDomain
from service.mechanisms.noise import quantile_scale
from service.mechanisms.uplift.calibration import (
    Plan,
    make_plan,
    shrinkage_fields,
)
from service.mechanisms.uplift.rules import (
    QUANTILE_CUTS_SHARE,
    UpliftParams,
    grid_edges,
    grid_shape,
    suggested_bins,
)


def quote(domain: PublicDomain, params: UpliftParams) -> dict[str, Any]:
    """Public preview: noise scales, the expected noise sd of a cell uplift, the p heuristic."""
    state = make_plan(domain, params)
    p_treat = domain.treatment_probability or 0.5
    if state.adjusted is not None:
        return _adjusted_quote(domain, state, p_treat)
    width = domain.outcome_range
    if state.counts is None or state.sums is None:  # pragma: no cover - only when adjusted
        raise ValueError("no table calibration")
    b_c, b_s = state.counts.scale, state.sums.scale
    per_cell = domain.n / state.cells
    arms = {"treated": per_cell * p_treat, "control": per_cell * (1.0 - p_treat)}
    # delta method (adum.md §5) with |centred mean| <= W / 2 and outcome sd <= W / 2.
    variance = privacy = assumed = 0.0
    sd = ate_strict.assumed_outcome_sd(domain)
    for size in arms.values():
        size = max(size, params.min_count)
        noise = (2 * b_s**2 + (width / 2) ** 2 * 2 * b_c**2) / size**2
        privacy += noise
        variance += (width / 2) ** 2 / size + noise
        assumed += sd**2 / size + noise
    return {
        "mode": "strict",
        "guarantee": "strict",
        "epsilon": state.record.epsilon,
        "delta": 0.0,
        "cells": state.cells,
        "partition": params.partition,
        **_grid_fields(domain, params),
        "count_noise_scale": b_c,
        "sum_noise_scale": b_s,
        "expected_records_per_cell": per_cell,
        "approx_uplift_sd_per_cell": math.sqrt(variance),
        # the privacy noise alone (the Laplace counts' and sums' part of the delta method): what
        # versus_ate compares with the heterogeneity; the sd above adds the sampling error at
        # the worst-case outcome sd W / 2
        "approx_privacy_noise_sd_per_cell": math.sqrt(privacy),
        # the privacy noise and the sampling error at the assumed outcome sd (R / 12, a binary
        # outcome's R / 2): what versus_ate compares with the heterogeneity (a trial
        # walkthrough's 2 x 2 table was quoted 'possible' on its privacy noise alone, 0.017,
        # beside a sampling error of about 0.033 per cell)
        "expected_cell_error_sd": math.sqrt(assumed),
        **shrinkage_fields(state),
        **suggested_bins(domain, state.record.epsilon, treated_share=p_treat),
        "warnings": equal_width_warnings(domain, params) + quantile_cut_warnings(domain, state),
    }


def equal_width_warnings(domain: PublicDomain, params: UpliftParams) -> list[str]:
    """A caution for each numeric covariate a regular grid cuts into equal widths: the
    per-cell figures assume n / cells records in every cell, which a skewed covariate with
    honest bounds breaks (a walkthrough's CRP, declared 0-300 with median 4.9, left 1 patient
    in each of two cells of four, noise sd 170 and 855 against about 4 quoted). Public
    request and schema only."""
    if params.partition != "grid" or params.cut_points is not None:
        return []
    if params.quantile_cuts is not None:
        return []
    codes = domain.x_codes or (None,) * domain.q
    cut = [j for j, b in enumerate(params.bins) if b > 1 and (j >= len(codes) or codes[j] is None)]
    return [
        f"'{domain.names[j]}' is cut into {params.bins[j]} equal widths of its declared range "
        f"[{float(domain.x_lower[j]):.6g}, {float(domain.x_upper[j]):.6g}]: the per-cell "
        "figures assume n / cells records in each cell, and a skewed covariate leaves some "
        "cells nearly empty (their uplifts much noisier); cut it at clinical cut_points or "
        "its DP quantile_cuts instead"
        for j in cut
    ]


# DP cut points whose selection noise scale exceeds this share of n are said to be unreliable.
QUANTILE_SCALE_NOTE_SHARE = 0.05


def quantile_cut_warnings(domain: PublicDomain, state: Plan) -> list[str]:
    """A caution where each DP cut point's selection noise (the exponential mechanism at
    OpenDP's scale ``2 / eps_each``, in records of rank: its rank utility moves by about one per
    record) exceeds ``QUANTILE_SCALE_NOTE_SHARE`` of n: a cut then typically lands a few times
    that scale from the quantile asked for, and the cells may be far from equal (an
    observational walkthrough's quantile_cuts at epsilon 0.02 cut a CRP of median 6 across its
    whole declared 0-300, without a word). Public inputs only."""
    if state.quantile_epsilon is None:
        return []
    scale = quantile_scale(state.quantile_epsilon)
    if scale <= QUANTILE_SCALE_NOTE_SHARE * domain.n:
        return []
    return [
        f"each DP cut point of quantile_cuts gets epsilon {state.quantile_epsilon:.3g} "
        f"({QUANTILE_CUTS_SHARE:.0%} of the table's, shared by every cut): its selection noise "
        f"has a scale of about {scale:,.0f} records of rank ({min(scale / domain.n, 9.99):.0%} "
        f"of n = {domain.n}), and a cut typically lands a few times that from the quantile "
        "asked for, so the cells may be far from equal; ask for fewer cuts, more epsilon, or "
        "clinical cut_points"
    ]


def _adjusted_quote(domain: PublicDomain, state: Plan, p_treat: float) -> dict[str, Any]:
    """proof step 6: the one-cell observational default quotes the ATE it releases (the ate
    kind's default, in chunks where its rule applies); the cell's noise sd is that ATE's
    (public) privacy noise sd (in chunks, one chunk's over sqrt(chunks))."""
    if state.adjusted is None:  # pragma: no cover - guarded by the caller
        raise ValueError("not an adjusted plan")
    params = state.params
    chunked = state.adjusted_chunks
    if chunked is not None:
        inner = aggregate.quote(domain, chunked)
        noise_sd = aggregate.mean_noise_sd(chunked, inner["chunk_s_theta"])
    else:
        inner = ate_strict.quote(domain, state.adjusted.params)
        noise_sd = float(inner["s_theta"])
    return {
        "mode": "strict",
        "guarantee": "strict",
        "epsilon": state.record.epsilon,
        "delta": state.record.delta,
        "cells": 1,
        "partition": params.partition,
        **_grid_fields(domain, params),
        "count_noise_scale": None,
        "sum_noise_scale": None,
        "expected_records_per_cell": float(domain.n),
        "approx_uplift_sd_per_cell": noise_sd,
        "approx_privacy_noise_sd_per_cell": noise_sd,
        # one cell: the ATE itself, whose expected half-width the ate quote gives
        "expected_cell_error_sd": float(inner["expected_half_width"]) / 1.959963984540054,
        "adjusted_ate": inner,
        **shrinkage_fields(state),
        **suggested_bins(domain, state.record.epsilon, treated_share=p_treat),
    }


def _grid_fields(domain: PublicDomain, params: UpliftParams) -> dict[str, Any]:
    """The grid's shape (cells per covariate) and, for cut points, its edges; quantile cells'
    edges are DP outputs of the release (proof step 8), so the quote has their count only."""
    if params.partition != "grid" or (params.cut_points is None and params.quantile_cuts is None):
        return {"bins": list(params.bins)}
    out: dict[str, Any] = {"bins": list(grid_shape(domain, params))}
    if params.quantile_cuts is None:
        out["edges"] = grid_edges(domain, params)
    else:
        out["quantile_cuts"] = list(params.quantile_cuts)
        out["quantile_cuts_share"] = QUANTILE_CUTS_SHARE
    return out
