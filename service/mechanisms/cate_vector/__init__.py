"""DP-CATE at d public query points: R- or DR-learner, ``strict`` or ``paper`` mode.

What it releases:
    a vector ``g_DP(x_1..x_d)`` of CATE estimates at analyst-supplied public points inside the
    public box, from a two-stage orthogonal learner (cate_vector.md §2): nuisances on disjoint
    folds, a second stage fitted on the last fold, noise added, one (epsilon, delta) charge for
    the whole vector. Never the noise scale of paper mode (data-dependent), the nuisances, the
    second-stage fit, per-row values or fold memberships.

Second stage (both modes): ridge regression on a public random-Fourier-feature map
    ``phi(x) = [1, (2u - 1) / sqrt(q), sqrt(2 / D) cos(W u + b)]``, ``u`` the point scaled to
    [0, 1]^q by the public box, ``W ~ N(0, I / l^2)``, ``b ~ U(0, 2 pi)`` drawn from the CSPRNG
    (data-independent), so ``||phi(x)||^2 <= 1 + 1 + 2`` and ``C = 2``. R-learner in Robinson
    form (targets ``r = y - m(x)``, features ``v = (a - pi(x)) phi(x)``); DR-learner on the
    AIPW pseudo-outcome clipped to [-K, K] (targets ``r = psi``, features ``v = phi(x)``).
    ``theta = argmin (1/n) sum (r - v'theta)^2 + lambda ||theta||^2``.

Neighbouring relation: replace-one on (X, A, Y), n public; fold sizes public.

Claim, strict mode (docs/proofs/cate_vector.md):
    (epsilon, delta)-DP. Nuisances are DP-EBMs at the replace-one epsilon_p rule, each
    (epsilon, delta)-DP on its own fold. Given them, the second stage on the last fold has
    |r| <= B_r (R: the outcome range R_Y; DR: K) and ||v|| <= C_v (R: (1 - c) C, since
    |a - pi_hat| <= 1 - c; DR: C), so ``||theta|| <= B_r / sqrt(lambda)`` and the replace-one
    L2 sensitivity of theta is ``Delta_theta = 2 C_v B_r (1 + C_v / sqrt(lambda)) /
    (lambda n_2)`` (strong convexity).
    theta is released through the lattice Gaussian at (epsilon, delta) with that sensitivity
    (plus a float margin), and the vector ``Phi(x) theta_DP`` is post-processing. Folds are a
    uniformly random partition of public sizes and the second-stage inputs are row-wise in the
    record given the nuisances: Niu et al. Theorem 6 gives max over modules = (epsilon, delta).

Claim, paper mode (Schroeder et al., Theorem 1; heuristic, label ``paper``):
    non-private MLP nuisances on D_1; noise sd ``r = gamma_hat c(eps, delta, n_2)`` per
    coordinate, ``gamma_hat = sup_z |IF(z)|`` by exact enumeration over a and y and a
    multi-start box-bounded L-BFGS-B over x; ``c = 5 sqrt(2 ln n ln(2/delta)) / (eps n)``.

References:
    Schroeder, Melnychuk, Feuerriegel (2025). Differentially private learners for heterogeneous
    treatment effects. ICLR.
    Chaudhuri, Monteleoni, Sarwate (2011). Differentially private empirical risk minimization.
    JMLR (output perturbation of strongly convex ERM).
    Rahimi and Recht (2007). Random features for large-scale kernel machines. NeurIPS.
    Nie and Wager (2021). Quasi-oracle estimation of heterogeneous treatment effects.
    Kennedy (2023). Towards optimal doubly robust estimation of heterogeneous causal effects.
"""

from service.mechanisms.anchor import james_stein_factor
from service.mechanisms.cate_vector import calibration, estimation
from service.mechanisms.cate_vector.calibration import (
    FEATURE_NORM,
    MAX_EPSILON,
    MAX_FEATURES,
    MAX_POINTS,
    MECHANISM,
    MIN_EPSILON,
    MIN_RIDGE,
    PAPER_RIDGE,
    RIDGE_RULE_FRACTION,
    STRICT_RIDGE_GRID,
    VERSION,
    CateVectorParams,
    Learner,
    Mode,
    Plan,
    Progress,
    c_constant,
    default_delta_for,
    make_plan,
    modules,
    paper_gamma_bounds,
    plan,
    point_errors,
    suggested_ridge,
    theta_sensitivity,
)
from service.mechanisms.cate_vector.estimation import (
    FeatureMap,
    Nuisance,
    VectorFit,
    fit,
    influence_sup,
    paper_noise_sd,
    release,
    ridge_fit,
    run,
    second_stage_data,
)
from service.mechanisms.cate_vector.quote import quote, rms_noise_sd

__all__ = [
    "FEATURE_NORM",
    "MAX_EPSILON",
    "MAX_FEATURES",
    "MAX_POINTS",
    "MECHANISM",
    "MIN_EPSILON",
    "MIN_RIDGE",
    "PAPER_RIDGE",
    "RIDGE_RULE_FRACTION",
    "STRICT_RIDGE_GRID",
    "VERSION",
    "CateVectorParams",
    "FeatureMap",
    "Learner",
    "Mode",
    "Nuisance",
    "Plan",
    "Progress",
    "VectorFit",
    "c_constant",
    "calibration",
    "default_delta_for",
    "estimation",
    "fit",
    "influence_sup",
    "james_stein_factor",
    "make_plan",
    "modules",
    "paper_gamma_bounds",
    "paper_noise_sd",
    "plan",
    "point_errors",
    "quote",
    "release",
    "ridge_fit",
    "rms_noise_sd",
    "run",
    "second_stage_data",
    "suggested_ridge",
    "theta_sensitivity",
]
