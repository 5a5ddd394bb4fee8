"""DP CATE *function* release: kernel ridge second stage plus Gaussian-process noise.

What it releases (spec ``cate_function_gp.md``):
    One draw ``g_DP = g*_D + r0 G`` of a function of the covariates, where ``g*_D`` is a
    Gaussian-kernel ridge regression (R- or DR-learner, ``cate_vector.md`` §2) fitted on the
    estimation fold and ``G ~ GP(0, k0)`` is a unit GP sample path with the *same* kernel. The
    release job returns only public metadata; ``g*_D``, ``r0`` (paper mode) and the noise stay
    on the server (``service.functions``), and clients evaluate ``g_DP`` at points of their
    choice. Each evaluation is post-processing of the one release (§7), so it is free.

Neighbouring relation:
    replace-one on records (X, A, Y), n public; fold sizes are public functions of n.

Claim (strict mode, ``docs/proofs/cate_function.md``):
    * nuisances: DP-EBM propensity on D_pi and outcome on D_mu, each (epsilon, delta)-DP
      (``dp_ebm.solve_dp_ebm_epsilon_p``), predictions clipped to public ranges;
    * second stage on D_2 (n2 rows): the minimiser of ``(1/n2) sum l_i(g(x_i)) + lambda0
      |g|^2_{k0}`` over the RKHS of ``k0`` (or the span of public Nystrom centres, or public
      random features) with ``l_i`` convex and L-Lipschitz on the reachable range (§3.4) has
      RKHS sensitivity ``Delta = L / (lambda0 n2)`` (kappa = 1 for ``k0``; §2 erratum 3);
    * ``g*_D + r0 G`` with ``r0 = Delta sigma_G(epsilon, delta)`` (analytic Gaussian) is
      (epsilon, delta)-DP: each finite-dimensional marginal is a Gaussian mechanism with
      Mahalanobis sensitivity at most Delta (Hall et al. 2013, Cor. 9 with the exact condition);
    * folds are disjoint and uniformly random: Niu et al.'s Theorem 6 gives the max,
      (epsilon, delta).
    Paper mode uses non-private nuisances (label ``paper``) and
    ``r0 = max(r_paper, r_Hall)`` with the Hall multiplier ``max(c(delta)/epsilon, sigma_G)``.

Conventions (§4): X is scaled to ``[0, 1]^q`` by the public box; the kernel is the unnormalised
``k0 = exp(-|x - x'|^2 / (2 h^2))`` and ``lambda0 = lambda / c_q`` with ``c_q = (sqrt(2 pi)
h)^(-q)`` when the request uses the paper's normalised convention. Everything that shapes the
noise (h, lambda, L, centres, jitter, lattices) is public and fixed before fitting.

References:
    Schroeder, Melnychuk, Feuerriegel. Differentially private learning of heterogeneous
    treatment effects (DP-CATE), §4, App. C, D, G, H.
    Hall, Rinaldo and Wasserman (2013). Differential privacy for functions and functional
    data. JMLR 14.
    Niu et al. (2022). Differentially private estimation of heterogeneous causal effects. CLeaR.
    Balle and Wang (2018). Improving the Gaussian mechanism for differential privacy. ICML.
"""

from service.mechanisms.cate_function.calibration import (
    CANONICAL_BITS,
    DEFAULT_LAMBDA0_GRID,
    DEFAULT_NOISE_SD_FRACTION,
    EXACT_FIT_MAX,
    MAX_BATCH,
    MAX_CENTRES,
    MAX_EPSILON,
    MAX_FEATURES,
    MAX_T,
    MECHANISM,
    MIN_EPSILON,
    NYSTROM_JITTER,
    REFERENCE_POINTS,
    VERSION,
    Basis,
    CateFunctionParams,
    LambdaConvention,
    Learner,
    Mode,
    NoiseScale,
    Nuisance,
    Plan,
    Shrinkage,
    default_bandwidth,
    lambda0_of,
    log_cq,
    noise_scale,
    plan,
    public_parameters,
)
from service.mechanisms.cate_function.estimation import (
    pseudo_targets,
    reference_points,
    run,
    shrink,
)
from service.mechanisms.cate_function.function import (
    FittedFunction,
    FunctionKind,
    ReferenceDraw,
    canonicalise,
    fit_basis,
    fit_exact,
    on_output_lattice,
    scale_to_unit,
    second_stage,
    start_path,
)
from service.mechanisms.cate_function.quote import quote

__all__ = [
    "CANONICAL_BITS",
    "DEFAULT_LAMBDA0_GRID",
    "DEFAULT_NOISE_SD_FRACTION",
    "EXACT_FIT_MAX",
    "MAX_BATCH",
    "MAX_CENTRES",
    "MAX_EPSILON",
    "MAX_FEATURES",
    "MAX_T",
    "MECHANISM",
    "MIN_EPSILON",
    "NYSTROM_JITTER",
    "REFERENCE_POINTS",
    "VERSION",
    "Basis",
    "CateFunctionParams",
    "FittedFunction",
    "FunctionKind",
    "LambdaConvention",
    "Learner",
    "Mode",
    "NoiseScale",
    "Nuisance",
    "Plan",
    "ReferenceDraw",
    "Shrinkage",
    "canonicalise",
    "default_bandwidth",
    "fit_basis",
    "fit_exact",
    "on_output_lattice",
    "lambda0_of",
    "log_cq",
    "noise_scale",
    "plan",
    "pseudo_targets",
    "public_parameters",
    "quote",
    "reference_points",
    "run",
    "scale_to_unit",
    "second_stage",
    "shrink",
    "start_path",
]
