"""Strict DP AIPW average treatment effect with a confidence interval (ate_ci.md §3).

What it releases:
    ``theta_DP``, a DP estimate of the AIPW functional at DP nuisances (the ATE under
    unconfoundedness and positivity), a (1 - alpha) confidence interval built only from
    ``theta_DP``, a DP second moment ``m2_DP`` and public constants, the DP sandwich-variance
    estimate ``V_hat``, and the public noise scales ``s_theta`` and ``s_2``. Never the
    non-private ``theta_hat`` / ``m2_hat``, per-row pseudo-outcomes, fold membership or the
    nuisance models' non-DP internals (ate_ci.md §3.8, threats.md §9).

Neighbouring relation:
    replace-one on records (X, A, Y), with n public (spec README §1.2). Fold sizes are fixed
    public functions of n.

Claim:
    ``run`` is (epsilon, delta)-DP, where (epsilon, delta) is the cost in ``plan``'s record:

    * propensity DP-EBM on D_pi: mu_pi-GDP under replace-one with ``delta(epsilon; mu_pi) <=
      delta`` (epsilon_p rule of README §1.2, with the mu values interpret actually uses);
    * outcome DP-EBM on D_mu: likewise;
    * on D_2 two lattice Gaussians with sensitivities ``2B/n2`` and ``B^2/n2`` (plus float and
      lattice slack), calibrated by the analytic Gaussian to (f eps, f delta) and
      ((1 - f) eps, (1 - f) delta): sequential composition gives (eps, delta);
    * the folds are disjoint, of public sizes, drawn by a uniformly random permutation, and
      the pseudo-outcome is row-wise given the nuisances, so Niu et al.'s Theorem 6 gives the
      max over modules, (eps, delta);
    * the CI and V_hat are post-processing.

    Proof: ``docs/proofs/ate_strict.md``. Steps are labelled ``# proof step N`` in the modules.
    * charged adaptive clipping (``adaptive_clip``; proof §13): a public share of the estimation
      epsilon buys a DP quantile of |Gamma| that sets the clip K <= B; the Gaussians follow K.
    * DP quantile bins (``quantile_bins``; proof §14): in each DP-EBM module a public share of
      its (epsilon, delta) buys Gaussian histograms of the fold's continuous covariates; the
      fit and its predictions use the released CDF values (post-processing). Within the module
      the two compose sequentially, so the module still costs (epsilon, delta).
    * the measured outcome range (``outcome_range``; proof §16): the DP-EBM outcome module
      spends a public share of its epsilon on two DP quantiles of its fold's outcomes and fits
      the model, its noise calibrated, on that range; again sequential within the module.
    * subsample and aggregate (``chunks``, module ``aggregate``; proof §17): M whole releases on
      disjoint random chunks of public size n // M, each at (epsilon, delta); parallel
      composition gives (epsilon, delta), and the t interval over their estimates is
      post-processing.

Nuisance presets:
    * ``"dp_ebm"`` (default): interpret DP-EBM classifier / regressor (proof §2);
    * ``"dp_linear"``: DP logistic regression by output perturbation for pi and DP per-arm
      ridge regression by sufficient-statistics perturbation for mu
      (``service.mechanisms.dp_linear``; proof §10–§11). Fast enough for hundreds of
      benchmark repetitions at n = 10^6;
    * ``"none"`` (RCT only).

Cross-fitting (``cross_fit=True``, ``dp_linear`` only; proof §12):
    two halves of public sizes from a uniformly random permutation; each half's nuisances (DP,
    at (epsilon_nuis, delta_nuis) split between pi and mu) are fitted on the other half, and
    the DP mean and second moment are taken over all n records. The nuisance fits are parallel
    over the disjoint halves; the estimation composes sequentially with them: the release
    costs ``(epsilon_nuis + epsilon_stat, delta_nuis + delta_stat) = (epsilon, delta)``, with
    ``epsilon_nuis = nuisance_share * epsilon`` (public).

Designs:
    * observational: three folds (propensity, outcome, estimation), default (0.25, 0.25, 0.5);
      B = R / c_pi.
    * RCT with public assignment probability p: pi_hat = p, no propensity fold; default folds
      (0.5, 0.5) for (outcome, estimation); B = R / min(p, 1 - p).
    * RCT with ``nuisance="none"``: mu_hat = the midpoint of the public outcome bounds (a
      Horvitz-Thompson estimator), a single estimation fold (all n records);
      B = R / (2 min(p, 1 - p)), since |Y - midpoint| <= R / 2.

References:
    Schroeder, Hartenstein, Feuerriegel (2025). PrivATE. NeurIPS (arXiv 2505.21641v1).
    Niu, Nori, Quistorff, Caruana, Ngwe, Kannan (2022). Differentially private estimation of
    heterogeneous causal effects. CLeaR (Theorem 6).
    Balle and Wang (2018). Improving the Gaussian mechanism for differential privacy. ICML.
    Dong, Roth and Su (2019). Gaussian differential privacy. arXiv:1905.02383.
    Canonne, Kamath and Steinke (2020). The discrete Gaussian for differential privacy.
    Nori, Caruana, Zhong, Hsu, Sharma (2021). Accuracy, interpretability, and differential
    privacy via explainable boosting. ICML (DP-EBM; interpret-core 0.7.8).

Modules:
    * ``rules``: public parameters, validation and default rules (folds, shares, delta, clip);
    * ``calibration``: the privacy map, from public inputs to calibrated noise and the record;
    * ``estimation``: the release after the charge (nuisances, pseudo-outcomes, DP statistics, CI);
    * ``quote``: the public accuracy preview;
    * ``aggregate``: subsample and aggregate over disjoint chunks (its record, run and quote).
"""

from service.mechanisms.ate_strict.calibration import (
    ADAPTIVE_CLIP_CANDIDATES,
    ADAPTIVE_CLIP_LEVEL,
    ADAPTIVE_CLIP_RANGE,
    ADAPTIVE_CLIP_SHARE,
    FLOAT_SLACK_BITS,
    Plan,
    adaptive_calibrations,
    adaptive_clip_bound,
    adaptive_clip_candidates,
    adaptive_clip_inflation,
    adaptive_gaussian_event,
    dp_linear_event,
    float_slack,
    gaussian_event,
    make_plan,
    mean_calibration,
    plan,
    public_parameters,
    quantile_event,
)
from service.mechanisms.ate_strict.estimation import (
    adaptive_clip,
    confidence_interval,
    d2_statistics,
    interval_half_width,
    pseudo_outcomes,
    run,
)
from service.mechanisms.ate_strict.quote import (
    ADAPTIVE_QUOTE_RANGE_RATIO,
    assumed_clip,
    assumed_outcome_sd,
    assumed_pseudo_outcome_sd,
    epsilon_for_half_width,
    quote,
    standard_normal_quadrature,
)
from service.mechanisms.ate_strict.rules import (
    CROSS_FIT_FOLDS,
    CROSS_FIT_MEAN_SHARE_HIGH,
    CROSS_FIT_SHARE_RECORD_EPSILONS,
    DEFAULT_FOLDS_OBSERVATIONAL,
    DEFAULT_FOLDS_OBSERVATIONAL_DP_EBM,
    DEFAULT_FOLDS_OBSERVATIONAL_DP_LINEAR,
    DEFAULT_FOLDS_RCT,
    DEFAULT_FOLDS_RCT_NO_NUISANCE,
    DEFAULT_MEAN_SHARE,
    DEFAULT_NUISANCE_SHARE,
    DP_EBM_FAST_LEARNING_MIN_N_EPSILON,
    DP_EBM_FAST_LEARNING_RATES,
    DP_EBM_OUTCOME_FOLDS_MIN_N_EPSILON,
    DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON,
    LINEAR_NUISANCE_BELOW_N_EPSILON,
    LINEAR_NUISANCE_BELOW_N_EPSILON_FEW,
    LINEAR_NUISANCE_FEW_COLUMNS,
    LINEAR_NUISANCE_MANY_COLUMNS,
    MAX_EPSILON,
    MEASURED_RANGE_FAST_REGRESSOR_MIN_N_EPSILON,
    MEASURED_RANGE_REGRESSOR_RATE,
    MECHANISM,
    MIN_EPSILON,
    MIN_NUISANCE_SHARE,
    NUISANCES,
    OUTCOME_RANGE_MIN_N_EPSILON,
    SECOND_MOMENT_NOISE_LIMIT,
    VERSION,
    AteStrictParams,
    Nuisance,
    Progress,
    cross_fit_mean_share,
    default_adaptive_clip,
    default_adjustment_columns,
    default_cross_fit,
    default_delta_for,
    default_fold_fractions,
    default_nuisance,
    default_nuisance_share,
    default_params,
    dp_ebm_learning_rates,
    dp_ebm_outcome_folds,
    linear_nuisance_threshold,
    module_names,
    resolved_shares,
    small_folds_fit,
    split_share,
    validate_cross_fit,
    validate_domain,
    validate_fractions,
)

__all__ = [
    "ADAPTIVE_CLIP_CANDIDATES",
    "ADAPTIVE_CLIP_LEVEL",
    "ADAPTIVE_CLIP_RANGE",
    "ADAPTIVE_CLIP_SHARE",
    "ADAPTIVE_QUOTE_RANGE_RATIO",
    "AteStrictParams",
    "CROSS_FIT_FOLDS",
    "CROSS_FIT_MEAN_SHARE_HIGH",
    "CROSS_FIT_SHARE_RECORD_EPSILONS",
    "DEFAULT_FOLDS_OBSERVATIONAL",
    "DEFAULT_FOLDS_OBSERVATIONAL_DP_EBM",
    "DEFAULT_FOLDS_OBSERVATIONAL_DP_LINEAR",
    "DP_EBM_FAST_LEARNING_MIN_N_EPSILON",
    "DP_EBM_FAST_LEARNING_RATES",
    "MEASURED_RANGE_FAST_REGRESSOR_MIN_N_EPSILON",
    "MEASURED_RANGE_REGRESSOR_RATE",
    "OUTCOME_RANGE_MIN_N_EPSILON",
    "DP_EBM_OUTCOME_FOLDS_MIN_N_EPSILON",
    "DEFAULT_FOLDS_RCT",
    "DEFAULT_FOLDS_RCT_NO_NUISANCE",
    "DEFAULT_MEAN_SHARE",
    "DEFAULT_NUISANCE_SHARE",
    "DP_LINEAR_SMALL_FOLDS_MAX_N_EPSILON",
    "LINEAR_NUISANCE_BELOW_N_EPSILON",
    "LINEAR_NUISANCE_BELOW_N_EPSILON_FEW",
    "LINEAR_NUISANCE_FEW_COLUMNS",
    "LINEAR_NUISANCE_MANY_COLUMNS",
    "FLOAT_SLACK_BITS",
    "MAX_EPSILON",
    "MECHANISM",
    "MIN_EPSILON",
    "MIN_NUISANCE_SHARE",
    "NUISANCES",
    "Nuisance",
    "Plan",
    "Progress",
    "SECOND_MOMENT_NOISE_LIMIT",
    "VERSION",
    "adaptive_calibrations",
    "adaptive_clip",
    "adaptive_clip_bound",
    "adaptive_clip_candidates",
    "adaptive_clip_inflation",
    "adaptive_gaussian_event",
    "assumed_clip",
    "assumed_outcome_sd",
    "assumed_pseudo_outcome_sd",
    "standard_normal_quadrature",
    "confidence_interval",
    "interval_half_width",
    "cross_fit_mean_share",
    "d2_statistics",
    "default_adaptive_clip",
    "default_adjustment_columns",
    "default_cross_fit",
    "default_delta_for",
    "default_fold_fractions",
    "dp_ebm_learning_rates",
    "dp_ebm_outcome_folds",
    "default_nuisance",
    "linear_nuisance_threshold",
    "default_nuisance_share",
    "default_params",
    "dp_linear_event",
    "epsilon_for_half_width",
    "float_slack",
    "gaussian_event",
    "make_plan",
    "mean_calibration",
    "module_names",
    "plan",
    "pseudo_outcomes",
    "public_parameters",
    "quantile_event",
    "quote",
    "resolved_shares",
    "run",
    "small_folds_fit",
    "split_share",
    "validate_cross_fit",
    "validate_domain",
    "validate_fractions",
]
