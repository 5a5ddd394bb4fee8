"""DP-EBM CATE learners (Niu et al. 2022): S-, DR- and R-learner on interpret's DP-EBMs.

What it releases:
    the fitted DP effect model as its safe fields only (``SafeEbm``: DP cut points, term
    scores, intercept, public bounds; dp_ebm_learners.md §7.3), the ATE read off the model
    (DR/R: the effect model's intercept plus its public offset; S: ``mu(1, x) - mu(0, x)``,
    constant in x for an additive model), the per-feature shape functions, and the CATE at
    caller-supplied public points. Never per-row pseudo-outcomes, fold memberships, nuisance
    predictions at stored rows, data-derived bounds or interpret's ``to_json``.

Neighbouring relation:
    replace-one on records (X, A, Y), n public; fold sizes are public functions of n.

Claim (strict learners S and DR):
    ``run`` is (epsilon, delta)-DP. Each DP-EBM module is fitted at the epsilon_p of the
    replace-one rule (``solve_dp_ebm_epsilon_p``) so that it is (epsilon, delta)-DP on its own
    fold; the folds are disjoint, of public sizes, drawn by a uniformly random permutation;
    the DR pseudo-outcome is a row-wise function of the record given the first-stage models and
    is clipped to the public [-K, K] that calibrates the effect model; Niu et al. Theorem 6
    (parallel composition over folds) gives the max over modules, (epsilon, delta). Everything
    returned is post-processing of the DP models. The R-learner passes data-dependent sample
    weights (T - e_hat)^2 to interpret, whose noise then depends on max(weight) and whose
    binning threshold on the weight total (§6 item 6): paper label only.

    Shrinkage ``"ate"`` (the DR default, proof step 6): observationally the effect fold spends a
    public share of its (epsilon, delta) on a DP ATE anchor of the whole fold (exact split), the
    effect model (centred targets) runs on the fold's fitting rows and DP calibration sums on its
    disjoint calibration rows, each at the rest: per record of the fold, anchor + one of the
    two, so the total is still (epsilon, delta). In an RCT (step 6.1, version 3) the anchor is
    the strict ``ate`` kind's RCT default release on all n at a public share of (epsilon, delta),
    and the whole DR pipeline runs at the rest: sequential composition, (epsilon, delta) in
    total. The factor and ``anchor + lambda * deviation`` are post-processing. A given anchor
    (``anchor``, step 6.5: a public number, e.g. an ate release's estimate) buys none: the DR
    pipeline and its calibration sums run at the whole (epsilon, delta).

    Pre-specified effect modifiers (``effect_columns``, proof step 7): the effect model is a
    DP-EBM on those public columns only; interpret composes its noise over the features it
    sees, so the claim and the charge are unchanged. The declared adjustment set
    (``adjustment_columns``, step 8; by default the schema's ``adjust_for`` covariates): the
    nuisance DP-EBMs are fitted on, and predict from, the records projected onto those public
    columns, a row-wise public map, so neighbouring folds stay neighbours and the claim holds.
    The effect-modifier screen (``effect_screen``, step 9, version 6; on by default for the
    anchored DR learner without effect columns): a public share of the effect model's epsilon
    buys a DP top-k choice (OpenDP's noisy top-k, pure DP) of the covariates, scored by the
    centred targets' covariance with each on the fitting rows; the effect model then runs on
    the chosen columns at the rest: sequential composition on those rows, same charge.
    The DR outcome model's measured range (``outcome_range``, step 10, version 7; on by
    default from n epsilon = 2 * 10^4): a public share of the outcome module's epsilon buys two
    DP quantiles of its fold's outcomes and the model is fitted on that range at the rest:
    sequential composition on the outcome fold, same charge.

    Proof: docs/proofs/ebm_cate.md (steps labelled ``# proof step N``).

References:
    Niu, Nori, Quistorff, Caruana, Ngwe, Kannan (2022). Differentially private estimation of
    heterogeneous causal effects. CLeaR (Algorithm 1-2, Theorem 6).
    Nori, Caruana, Zhong, Hsu, Sharma (2021). Accuracy, interpretability, and differential
    privacy via explainable boosting. ICML.
    Kennedy (2020). Optimal doubly robust estimation of heterogeneous causal effects.

Modules:
    ``rules``: the request parameters, the folds, the DR learner's service defaults and the
    anchor's budget shares (public rules); ``calibration``: the plan and the record it charges
    (the privacy map the proof covers); ``estimation``: the run after the charge and predictions
    at public points; ``quote``: the public accuracy preview.
"""

from __future__ import annotations

from service.mechanisms.ebm_cate.calibration import (
    Plan,
    anchor_bound,
    calibration_rows,
    calibration_sensitivity,
    checked_adjustment_columns,
    checked_effect_columns,
    deviation_bound,
    make_plan,
    plan,
    public_parameters,
)
from service.mechanisms.ebm_cate.estimation import (
    calibration_factor,
    predict,
    run,
    run_plan,
)
from service.mechanisms.ebm_cate.quote import (
    DETECTION_POWER,
    boosting_accumulation,
    detectable_heterogeneity_sd,
    prediction_noise_sd,
    quote,
)
from service.mechanisms.ebm_cate.rules import (
    CALIBRATION_FRACTION,
    CALIBRATION_LEVEL,
    CALIBRATION_STATISTICS,
    DEVIATION_BOUND_OF_K,
    DR_DEFAULT_FOLDS,
    DR_DEFAULT_FOLDS_RCT,
    DR_DEFAULT_K_OF_RANGE,
    DR_DEFAULT_MAX_BINS,
    DR_DEFAULT_MAX_ROUNDS,
    DR_RICH_MAX_ROUNDS,
    DR_RICH_N_EPSILON_PER_COVARIATE,
    EBM_USEFUL_N_EPSILON_PER_COVARIATE,
    MAX_EPSILON,
    MAX_MAX_BINS,
    MAX_MAX_ROUNDS,
    MAX_PREDICT_POINTS,
    MECHANISM,
    MIN_CALIBRATION_ROWS,
    MIN_EPSILON,
    MIN_MAX_BINS,
    MIN_MAX_ROUNDS,
    RCT_USEFUL_ANCHOR_SHARE,
    SCREENED_USEFUL_N_EPSILON_PER_COVARIATE,
    SMALL_N_EPSILON_WARNING,
    VERSION,
    WARNING_EPSILON_CAP,
    EbmCateParams,
    Learner,
    Progress,
    Shrinkage,
    default_adjustment_columns,
    default_delta_for,
    default_fractions,
    dr_default_folds,
    dr_default_rounds,
    dr_defaults,
    ebm_anchor_share,
    modules,
    outcome_range_rule,
    rct_anchor_share,
    resolved_fractions,
    resolved_shrinkage,
    screen_rule,
    service_defaults,
)
from service.mechanisms.effect_screen import COLUMNS as SCREEN_COLUMNS
from service.mechanisms.effect_screen import SHARE as SCREEN_SHARE

__all__ = [
    "CALIBRATION_FRACTION",
    "CALIBRATION_LEVEL",
    "CALIBRATION_STATISTICS",
    "DEVIATION_BOUND_OF_K",
    "DR_DEFAULT_FOLDS",
    "DR_DEFAULT_FOLDS_RCT",
    "DR_DEFAULT_K_OF_RANGE",
    "DR_DEFAULT_MAX_BINS",
    "DR_DEFAULT_MAX_ROUNDS",
    "DR_RICH_MAX_ROUNDS",
    "DR_RICH_N_EPSILON_PER_COVARIATE",
    "EBM_USEFUL_N_EPSILON_PER_COVARIATE",
    "EbmCateParams",
    "Learner",
    "MAX_EPSILON",
    "MAX_MAX_BINS",
    "MAX_MAX_ROUNDS",
    "MAX_PREDICT_POINTS",
    "MECHANISM",
    "MIN_CALIBRATION_ROWS",
    "MIN_EPSILON",
    "MIN_MAX_BINS",
    "MIN_MAX_ROUNDS",
    "boosting_accumulation",
    "Plan",
    "Progress",
    "RCT_USEFUL_ANCHOR_SHARE",
    "SCREEN_COLUMNS",
    "SCREEN_SHARE",
    "SCREENED_USEFUL_N_EPSILON_PER_COVARIATE",
    "SMALL_N_EPSILON_WARNING",
    "Shrinkage",
    "VERSION",
    "WARNING_EPSILON_CAP",
    "anchor_bound",
    "calibration_factor",
    "calibration_rows",
    "calibration_sensitivity",
    "checked_adjustment_columns",
    "checked_effect_columns",
    "default_adjustment_columns",
    "default_delta_for",
    "default_fractions",
    "deviation_bound",
    "dr_default_folds",
    "dr_default_rounds",
    "dr_defaults",
    "ebm_anchor_share",
    "make_plan",
    "modules",
    "outcome_range_rule",
    "plan",
    "predict",
    "prediction_noise_sd",
    "detectable_heterogeneity_sd",
    "DETECTION_POWER",
    "public_parameters",
    "quote",
    "rct_anchor_share",
    "resolved_fractions",
    "resolved_shrinkage",
    "run",
    "run_plan",
    "screen_rule",
    "service_defaults",
]
