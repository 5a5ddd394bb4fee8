"""epsilon-ADUM (Betlei et al. 2021): a DP uplift table on a public grid or DP k-means cells.

What it releases:
    for every cell k of a public grid over the public covariate box (regular, or cut at the
    request's public cut points) and every arm t, a noisy count ``C[k, t]`` and a noisy
    centred outcome sum ``S[k, t]`` (Laplace, on the public lattice via OpenDP), and their
    post-processing: the guarded cell means ``y[k, t] = clip(m_y + S / max(C, c_min), y_lo,
    y_hi)``, the uplift ``u[k] = y[k, 1] - y[k, 0]``, a low-count flag per cell (noisy count
    below a public threshold) and the delta-method noise sd of each uplift. Predictions are
    lookups ``u[cell(x)]`` (free).

Neighbouring relation:
    replace-one on (X, A, Y), n public (adum.md §3.2).

Claim:
    ``run`` is (epsilon, 0)-DP. The 2p counts (one per cell and arm) have replace-one L1
    sensitivity 2 (a replaced record leaves one group and enters one, or stays); the 2p centred
    sums of ``y - m_y`` with ``|y - m_y| <= W / 2`` have L1 sensitivity ``W`` (``W = y_hi -
    y_lo``). Each vector gets the Laplace mechanism at epsilon / 2 with those sensitivities
    (scales 4 / epsilon and 2 W / epsilon = 4 D_y / epsilon, D_y = W / 2), plus the lattice
    inflation; sequential composition gives epsilon. The grid is public (declared box and
    analyst-chosen bins or cut points), so the partition costs nothing. Quantile cells (proof
    step 8): ``QUANTILE_CUTS_SHARE`` of epsilon first buys DP quantiles (OpenDP's exponential
    mechanism on the declared range) that cut the covariates asked for, and the table runs at
    the rest of epsilon on that DP grid (sequential composition). Shrinkage ``"ate"`` (the
    default, >= 2 cells) first spends 10 % of the table's epsilon on the arms' centred second
    moments (Laplace, L1 sensitivity W^2 / 2); the anchor (the count-weighted mean of the cell
    uplifts) and the James–Stein factor are post-processing. Exception (proof step 6): with
    shrinkage ``"ate"``, a one-cell grid on an observational design adjusts for no covariate (its
    uplift is a confounded difference in means), so the release is the strict DP AIPW ATE at its
    public defaults instead (the ``ate`` kind's default: ``aggregate.default_release`` in chunks
    where its chunks rule applies, else ``ate_strict.default_params``), (epsilon, delta)-DP at
    the request's epsilon and that ATE's public default delta; the record is that ATE's. Proof:
    docs/proofs/uplift_table.md.

The ebm estimator (proof step 7): where the DP-EBM effect model learns and effect modifiers are
named (the request's ``effect_columns`` or the owner's declared ones), the default release is the
strict ``ebm_cate`` release read at the public centres of a grid over those columns
(post-processing); its record is that release's.

Causal reading: uplift = CATE only under an RCT, or when the cells form a valid adjustment set
(declared by the analyst with ``adjustment_partition=True``; adum.md §1). The one-cell
observational default (step 6) is the ATE under unconfoundedness given all covariates (the
``ate`` kind's reading) and needs no assertion.

References:
    Betlei, Gregoir, Rahier, Bissuel, Diemert, Amini (2021). Differentially private individual
    treatment effect estimation from aggregated data. HAL hal-03339723.
    McSherry (2009). Privacy integrated queries. SIGMOD (parallel composition).

Modules:
    ``rules``: the request parameters, the grid's cells, the partition-size heuristic and the
    one-cell observational switch (public rules); ``calibration``: the plan and the record it
    charges (the privacy map the proof covers); ``estimation``: the run after the charge and
    predictions at public points; ``quote``: the public accuracy preview.
"""

from __future__ import annotations

from service.mechanisms.uplift.calibration import (
    Plan,
    make_plan,
    plan,
    second_moment_sensitivity,
    shrinkage_fields,
    sum_sensitivity,
)
from service.mechanisms.uplift.estimation import (
    aggregates,
    aggregates_by_cell,
    cluster_statistics,
    dp_kmeans,
    ebm_table,
    grid_aggregates,
    measure_cut_points,
    nearest,
    predict,
    released_noise_sds,
    run,
    second_moment_sums,
    shrink_to_anchor,
    table,
    unit_scale,
)
from service.mechanisms.uplift.quote import (
    quote,
)
from service.mechanisms.uplift.rules import (
    COUNT_SHARE,
    MAX_BINS_PER_FEATURE,
    MAX_CELLS,
    MAX_CLUSTERS,
    MAX_EPSILON,
    MAX_KMEANS_ITERATIONS,
    MAX_QUANTILE_CELLS,
    MECHANISM,
    MIN_EPSILON,
    QUANTILE_CANDIDATES,
    QUANTILE_CUTS_SHARE,
    SECOND_MOMENT_SHARE,
    VERSION,
    Progress,
    UpliftParams,
    adjusted_one_cell,
    cell_centres,
    cell_index,
    checked_quantile_cuts,
    declared_edges,
    default_bins,
    ebm_edges,
    ebm_grid,
    edge_index,
    grid_cells,
    grid_edges,
    grid_shape,
    measured_edges,
    quantile_candidates,
    quantile_levels,
    regular_edges,
    suggested_bins,
    uncut_columns,
)

__all__ = [
    "COUNT_SHARE",
    "MAX_BINS_PER_FEATURE",
    "MAX_CELLS",
    "MAX_CLUSTERS",
    "MAX_EPSILON",
    "MAX_KMEANS_ITERATIONS",
    "MAX_QUANTILE_CELLS",
    "MECHANISM",
    "MIN_EPSILON",
    "QUANTILE_CANDIDATES",
    "QUANTILE_CUTS_SHARE",
    "Plan",
    "Progress",
    "SECOND_MOMENT_SHARE",
    "UpliftParams",
    "VERSION",
    "adjusted_one_cell",
    "aggregates",
    "aggregates_by_cell",
    "cell_centres",
    "cell_index",
    "cluster_statistics",
    "declared_edges",
    "default_bins",
    "dp_kmeans",
    "ebm_edges",
    "ebm_grid",
    "checked_quantile_cuts",
    "edge_index",
    "measured_edges",
    "quantile_candidates",
    "quantile_levels",
    "ebm_table",
    "grid_aggregates",
    "measure_cut_points",
    "grid_cells",
    "grid_edges",
    "grid_shape",
    "make_plan",
    "nearest",
    "plan",
    "predict",
    "regular_edges",
    "quote",
    "run",
    "second_moment_sensitivity",
    "second_moment_sums",
    "released_noise_sds",
    "shrink_to_anchor",
    "shrinkage_fields",
    "suggested_bins",
    "sum_sensitivity",
    "table",
    "uncut_columns",
    "unit_scale",
]
