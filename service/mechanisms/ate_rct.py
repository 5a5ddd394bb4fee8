"""Strict DP difference in means for RCTs: ADUM with one cell (adum.md §7).

What it releases:
    ``estimate = ybar_1 - ybar_0`` from Laplace-noised per-arm COUNT, centred SUM and (option
    ``"dp_second_moment"``) centred SUM OF SQUARES, a delta-method confidence interval, and the
    public Laplace scales. Never the exact arm counts, sums or variances (threats.md §9).

Neighbouring relation:
    replace-one on records (X, A, Y), n public (spec README §1.2). X is not used.

Claim:
    ``run`` is epsilon-DP (delta = 0), epsilon the cost in ``plan``'s record. With
    ``D_y = R / 2`` and the centred outcome ``y - m_y`` in [-D_y, D_y]:

    * counts (C_0, C_1): replace-one L1 sensitivity 2, Laplace scale ``2 / epsilon_c``;
    * centred sums (S_0, S_1): L1 sensitivity ``2 D_y = R``, scale ``R / epsilon_s``;
    * centred sums of squares (Q_0, Q_1): L1 sensitivity ``2 D_y^2``, scale
      ``2 D_y^2 / epsilon_q``;

    with the equal split ``epsilon / 3`` this gives ADUM's replace-one scales ``Lap(6 / eps)``,
    ``Lap(6 D_y / eps)`` and ``Lap(6 D_y^2 / eps)`` (option ``"public_bound"``: ``epsilon / 2``
    each for counts and sums, ``Lap(4 / eps)`` and ``Lap(4 D_y / eps)``, and the public bound
    ``sigma_t^2 <= D_y^2``). Sequential composition gives epsilon; the estimate and CI are
    post-processing. Proof: ``docs/proofs/ate_rct.md`` (steps labelled ``# proof step N``).

CI:
    delta method (adum.md §5): ``V_t = sigma_t^2 / C_t + (2 b_S^2 + ybar_t^2 2 b_C^2) / C_t^2``
    at DP plug-ins; ``estimate +- z_{1 - alpha/2} sqrt(V_0 + V_1)``. It is approximate: the
    Laplace noise is treated as normal, which under-covers when it dominates (a single
    dominant Laplace term covers ``1 - exp(-sqrt(2) z)``, 93.75 % at nominal 95 %). Valid only
    under randomisation (design == RCT).

References:
    Betlei, Gregoir, Rahier, Bissuel, Diemert, Amini (2021). Differentially private individual
    treatment effect estimation from aggregated data. HAL hal-03339723.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri

from service.mechanisms.ate_strict import MAX_EPSILON, MIN_EPSILON, assumed_outcome_sd
from service.mechanisms.calibration import (
    round_up_significant,
    validate_alpha,
    validate_epsilon,
    validate_finite_positive,
)
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters, ReleaseFailed
from service.mechanisms.noise import (
    LaplaceCalibration,
    NoiseSampler,
    calibrate_laplace,
    release_laplace,
)
from service.mechanisms.partition import prepare_arrays
from service.mechanisms.records import Composition, Guarantee, MechanismRecord, NoiseEvent

MECHANISM = "ate_rct_difference"
VERSION = "1"
Progress = Callable[[float, str], None]
VarianceSource = Literal["dp_second_moment", "public_bound"]
MIN_N = 20
# Post-processing floor on noisy counts (adum.md §5, c_min >= 1).
MIN_COUNT = 1.0
_FLOAT_SLACK_BITS = 50
# The trial estimator rule (``is_trial_default``): the ``ate`` kind's default on a randomised
# design below this n * epsilon, where the outcome models' adjustment gains less than their
# budget share and fold cost (realistic trials, 200 releases a cell: bench/README.md "The trial
# estimator rule"); also the CATE kinds' whole-data anchor there (``anchor.ate_anchor_params``).
DEFAULT_BELOW_N_EPSILON = 50_000.0


@dataclass(frozen=True)
class AteRctParams:
    """Public request parameters of the RCT difference in means.

    Attributes:
        epsilon: total epsilon (pure DP; delta = 0).
        alpha: miscoverage of the CI.
        variance: ``"dp_second_moment"`` (eps / 3 per statistic) or ``"public_bound"``
            (eps / 2 for counts and sums; sigma_t^2 <= (R / 2)^2).
    """

    epsilon: float
    alpha: float = 0.05
    variance: VarianceSource = "dp_second_moment"


@dataclass(frozen=True)
class _Plan:
    params: AteRctParams
    half_range: float  # D_y
    midpoint: float
    counts: LaplaceCalibration
    sums: LaplaceCalibration
    squares: LaplaceCalibration | None
    record: MechanismRecord


def check_rct(domain: PublicDomain) -> float:
    """Refuse non-RCT designs; return the declared assignment probability."""
    if domain.design != StudyDesign.RCT:
        raise InvalidParameters(
            "estimator 'rct_difference' is only valid for datasets with design 'rct' (a "
            "difference in means is not causal under confounding); use estimator 'aipw' or "
            "'ipw'"
        )
    p = domain.treatment_probability
    if p is None or not (isinstance(p, int | float) and 0.0 < float(p) < 1.0):
        raise InvalidParameters("an RCT needs a declared treatment_probability in (0, 1)")
    return float(p)


def is_trial_default(domain: PublicDomain, epsilon: float) -> bool:
    """Whether the difference in means is the public default ATE estimator at ``epsilon``: a
    randomised design below n epsilon = ``DEFAULT_BELOW_N_EPSILON`` (public inputs only)."""
    return domain.design == StudyDesign.RCT and domain.n * epsilon < DEFAULT_BELOW_N_EPSILON


def _slack(nominal: float, n: int) -> float:
    """Float summation slack (fsum, values bounded): as in ate_strict's proof §3."""
    return math.nextafter(nominal * (1.0 + (n + 8) * 2.0**-_FLOAT_SLACK_BITS), math.inf)


def _make_plan(domain: PublicDomain, params: AteRctParams) -> _Plan:
    check_rct(domain)
    if isinstance(domain.n, bool) or not isinstance(domain.n, int) or domain.n < MIN_N:
        raise InvalidParameters(f"the RCT difference in means needs n >= {MIN_N}")
    if not (math.isfinite(domain.y_lower) and math.isfinite(domain.y_upper)):
        raise InvalidParameters("outcome bounds must be finite")
    validate_finite_positive(domain.outcome_range, "outcome range")
    epsilon = validate_epsilon(params.epsilon, minimum=MIN_EPSILON, maximum=MAX_EPSILON)
    validate_alpha(params.alpha)
    if params.variance not in ("dp_second_moment", "public_bound"):
        raise InvalidParameters("variance must be 'dp_second_moment' or 'public_bound'")
    n = domain.n
    half_range = domain.outcome_range / 2.0
    midpoint = (domain.y_lower + domain.y_upper) / 2.0
    # proof step 1: the budget split adds up exactly (thirds: two computed, the rest exact).
    if params.variance == "dp_second_moment":
        epsilon_c = epsilon / 3.0
        epsilon_s = epsilon / 3.0
        epsilon_q: float | None = epsilon - epsilon_c - epsilon_s
        while math.fsum([epsilon_c, epsilon_s, epsilon_q]) > epsilon:  # type: ignore[list-item]
            epsilon_q = math.nextafter(epsilon_q, 0.0)  # type: ignore[arg-type]
    else:
        epsilon_c = epsilon / 2.0
        epsilon_s = epsilon - epsilon_c
        epsilon_q = None
    # proof step 2: replace-one L1 sensitivities (counts exact; sums with float slack).
    counts = calibrate_laplace(epsilon_c, 2.0, dim=2)
    sums = calibrate_laplace(epsilon_s, _slack(2.0 * half_range, n), dim=2)
    squares = (
        calibrate_laplace(epsilon_q, _slack(2.0 * half_range**2, n), dim=2)
        if epsilon_q is not None
        else None
    )
    events = [
        _event("arm_counts", 2.0, counts),
        _event("arm_centred_sums", 2.0 * half_range, sums),
    ]
    if squares is not None:
        events.append(_event("arm_centred_sums_of_squares", 2.0 * half_range**2, squares))
    total = math.fsum(event.epsilon for event in events)
    if total > epsilon:  # pragma: no cover - the split is exact or below by construction
        raise InvalidParameters("internal budget accounting mismatch")
    record = MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=Guarantee.STRICT,
        n=n,
        fold_sizes={"estimation": n},
        composition=Composition.SEQUENTIAL,
        events=tuple(events),
        epsilon=epsilon,
        delta=0.0,
    )
    return _Plan(params, half_range, midpoint, counts, sums, squares, record)


def _event(statistic: str, nominal: float, calibration: LaplaceCalibration) -> NoiseEvent:
    return NoiseEvent(
        type="laplace",
        module="estimation",
        epsilon=calibration.epsilon,
        delta=0.0,
        params={
            "statistic": statistic,
            "sampler": "opendp discrete laplace on 2^k lattice",
            "dim": calibration.dim,
            "sensitivity_l1_nominal": nominal,
            "sensitivity_l1": calibration.sensitivity_l1,
            "sensitivity_l1_effective": calibration.sensitivity_l1_effective,
            "lattice_exponent": calibration.lattice_exponent,
            "scale": calibration.scale,
        },
    )


def plan(domain: PublicDomain, params: AteRctParams) -> MechanismRecord:
    """Validate and compute the mechanism record (no data).

    Raises:
        InvalidParameters: invalid parameters or a non-RCT design.
    """
    return _make_plan(domain, params).record


def arm_statistics(
    a: NDArray[np.float64], y: NDArray[np.float64], *, midpoint: float, half_range: float
) -> NDArray[np.float64]:
    """Exact (C_0, C_1, S_0, S_1, Q_0, Q_1) with centred outcomes. NEVER release these."""
    centred = np.clip(y - midpoint, -half_range, half_range)
    out: list[float] = []
    treated = a >= 0.5
    masks = (~treated, treated)
    out += [float(np.count_nonzero(mask)) for mask in masks]
    out += [math.fsum(centred[mask].tolist()) for mask in masks]
    squares = np.minimum(centred * centred, half_range * half_range)
    out += [math.fsum(squares[mask].tolist()) for mask in masks]
    return np.asarray(out, dtype=np.float64)


def delta_method_ci(
    counts: NDArray[np.float64],
    sums: NDArray[np.float64],
    squares: NDArray[np.float64] | None,
    *,
    count_scale: float,
    sum_scale: float,
    half_range: float,
    alpha: float,
) -> dict[str, float]:
    """Estimate and delta-method CI from DP statistics and public constants (post-processing).

    Counts are floored at ``MIN_COUNT``; centred arm means are clipped to [-D_y, D_y]; the
    arm variance is ``clip(Q/C - ybar^2, 0, D_y^2)`` or the public bound ``D_y^2``.
    """
    variance_total = 0.0
    means: list[float] = []
    for arm in (0, 1):
        count = max(float(counts[arm]), MIN_COUNT)
        mean = min(max(float(sums[arm]) / count, -half_range), half_range)
        if squares is None:
            arm_variance = half_range**2
        else:
            arm_variance = min(max(float(squares[arm]) / count - mean * mean, 0.0), half_range**2)
        noise_variance = (2.0 * sum_scale**2 + mean * mean * 2.0 * count_scale**2) / count**2
        variance_total += arm_variance / count + noise_variance
        means.append(mean)
    estimate = means[1] - means[0]
    half_width = float(ndtri(1.0 - alpha / 2.0)) * math.sqrt(variance_total)
    return {
        "estimate": estimate,
        "half_width": half_width,
        "ci_lower": estimate - half_width,
        "ci_upper": estimate + half_width,
    }


def _public_parameters(state: _Plan) -> dict[str, Any]:
    return {
        "mode": "strict",
        "guarantee": str(Guarantee.STRICT),
        "estimator": "rct_difference",
        "design": str(StudyDesign.RCT),
        "epsilon": state.record.epsilon,
        "delta": 0.0,
        "alpha": state.params.alpha,
        "variance": state.params.variance,
        "count_scale": state.counts.scale,
        "sum_scale": state.sums.scale,
        "square_scale": state.squares.scale if state.squares is not None else None,
        "ci_method": "delta method, normal approximation of the Laplace noise",
    }


SamplingBasis = Literal["none", "assumed", "worst_case"]


def _expected_half_width(domain: PublicDomain, state: _Plan, *, sampling: SamplingBasis) -> float:
    """Expected half-width at the declared arm sizes ``p n``: the privacy noise (worst-case
    centred mean) plus, per arm, the sampling variance at the assumed outcome sd
    (``assumed_outcome_sd``: R / 12, a binary outcome R / 2) or at the worst case ``D_y``."""
    p = check_rct(domain)
    sd = {"none": 0.0, "assumed": assumed_outcome_sd(domain), "worst_case": state.half_range}[
        sampling
    ]
    total = 0.0
    for share in (1.0 - p, p):
        count = max(share * domain.n, MIN_COUNT)
        noise = (
            2.0 * state.sums.scale**2 + state.half_range**2 * 2.0 * state.counts.scale**2
        ) / count**2
        total += noise + sd**2 / count
    return float(ndtri(1.0 - state.params.alpha / 2.0)) * math.sqrt(total)


def expected_error_sd(domain: PublicDomain, params: AteRctParams) -> float:
    """The release's expected error sd (privacy noise and the sampling error at the assumed
    outcome sd, as the quote's ``expected_half_width`` without its normal quantile). Public
    inputs only."""
    state = _make_plan(domain, params)
    return _expected_half_width(domain, state, sampling="assumed") / float(
        ndtri(1.0 - params.alpha / 2.0)
    )


def quote(
    domain: PublicDomain, params: AteRctParams, *, target_half_width: float | None = None
) -> dict[str, Any]:
    """Public preview: the expected half-width; optionally the epsilon needed.

    ``expected_half_width`` is the privacy part at arm sizes ``p n`` (worst-case centred mean
    ``D_y``) plus the sampling error at the assumed outcome sd (``assumed_outcome_sd``), as the
    ``aipw`` quote adds it at its assumed scale; ``min_half_width`` is the privacy noise alone
    and ``expected_half_width_full`` the worst case (sampling sd ``D_y`` per arm, an upper
    bound). ``epsilon_for_target_half_width`` solves the expected half-width (None where the
    assumed sampling error alone exceeds the target).
    """
    state = _make_plan(domain, params)
    out: dict[str, Any] = {
        **_public_parameters(state),
        "ci_level": 1.0 - params.alpha,
        "expected_half_width": _expected_half_width(domain, state, sampling="assumed"),
        "half_width_basis": "assumed_scale",
        "assumed_outcome_sd": assumed_outcome_sd(domain),
        "min_half_width": _expected_half_width(domain, state, sampling="none"),
        "expected_half_width_full": _expected_half_width(domain, state, sampling="worst_case"),
    }
    if target_half_width is not None:
        target = validate_finite_positive(target_half_width, "target_half_width")
        out["target_half_width"] = target
        out["epsilon_for_target_half_width"] = solve_epsilon(
            lambda eps: _expected_half_width(
                domain, _make_plan(domain, _replace(params, eps)), sampling="assumed"
            ),
            target,
        )
    return out


def _replace(params: AteRctParams, epsilon: float) -> AteRctParams:
    return AteRctParams(epsilon=epsilon, alpha=params.alpha, variance=params.variance)


def solve_epsilon(
    half_width: Callable[[float], float],
    target: float,
    *,
    minimum: float = MIN_EPSILON,
    maximum: float = MAX_EPSILON,
    tolerance: float = 1e-10,
) -> float | None:
    """Smallest epsilon in [minimum, maximum] (rounded up to 10 significant digits, at most
    MAX_EPSILON) with half_width <= target, bisected to the relative ``tolerance``.

    ``half_width`` must be non-increasing in epsilon on [minimum, maximum]. Returns None if
    unreachable.
    """
    if half_width(maximum) > target:
        return None
    if half_width(minimum) <= target:
        return minimum
    lower, upper = minimum, maximum
    for _ in range(100):
        if upper - lower <= tolerance * upper:
            break
        middle = math.sqrt(lower * upper)
        if half_width(middle) <= target:
            upper = middle
        else:
            lower = middle
    rounded = min(round_up_significant(upper, 10), MAX_EPSILON)
    return rounded if half_width(rounded) <= target else upper


def run(
    arrays: Arrays,
    domain: PublicDomain,
    params: AteRctParams,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    """Run the release (after the charge). ``rng`` is unused (no partition).

    Returns:
        ``estimate``, ``ci_lower``, ``ci_upper``, ``ci_level``, ``half_width``, the public
        scales and parameters. Nothing else.

    Raises:
        InvalidParameters: before data access.
        ReleaseFailed: any failure after data access (generic).
    """
    del rng
    state = _make_plan(domain, params)
    try:
        return _run(arrays, domain, state, noise=noise, progress=progress)
    except Exception:
        raise ReleaseFailed() from None


def _run(
    arrays: Arrays,
    domain: PublicDomain,
    state: _Plan,
    *,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    _, a, y = prepare_arrays(arrays, domain)
    # proof step 3: exact statistics (never released), then three Laplace releases.
    stats = arm_statistics(a, y, midpoint=state.midpoint, half_range=state.half_range)
    del a, y
    counts = release_laplace(stats[0:2], state.counts, noise)
    sums = release_laplace(stats[2:4], state.sums, noise)
    squares = (
        release_laplace(stats[4:6], state.squares, noise) if state.squares is not None else None
    )
    del stats
    progress(0.9, "estimation")
    # proof step 4: post-processing only.
    interval = delta_method_ci(
        counts,
        sums,
        squares,
        count_scale=state.counts.scale,
        sum_scale=state.sums.scale,
        half_range=state.half_range,
        alpha=state.params.alpha,
    )
    progress(1.0, "done")
    return {
        **interval,
        "ci_level": 1.0 - state.params.alpha,
        **_public_parameters(state),
    }
