"""Subsample and aggregate: the strict ATE on M disjoint chunks, a t interval over their DP
estimates (Nissim, Raskhodnikova and Smith 2007; docs/proofs/ate_strict.md §17).

The rows are cut at random into ``chunks`` disjoint chunks of the public size ``n // chunks``
(the ``n mod chunks`` rows left over are not read). Each chunk gets one whole strict release
(``estimation.run`` with the chunk's resolved ``AteStrictParams``) at the request's full
(epsilon, delta): each record lies in exactly one chunk, so under replace-one the M releases
together are (epsilon, delta)-DP (parallel composition). The released estimate is the mean of
the M DP estimates and the interval the t interval ``mean +- t_{M-1, 1 - alpha/2} s / sqrt(M)``
over them: post-processing.

Why: an observational interval from one release treats the DP nuisance models as fixed, and
their fit noise was about 2.5-3x the interval's standard error on the realistic studies
(coverage 0.6-0.7 with a clip at the data's scale). The chunks' estimates vary by exactly that
noise, their sampling error and their output noise, independently across chunks, so the t
interval covers all three. It does not cover a bias the chunks share (a clip narrower than the
pseudo-outcomes, confounding every DP model leaves): the benchmark measures that.

Pure computation, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.special import gammaln, ndtri
from scipy.stats import t as student_t

from service.mechanisms.ate_strict import calibration, estimation
from service.mechanisms.ate_strict.quote import quote as single_quote
from service.mechanisms.ate_strict.rules import (
    MECHANISM,
    VERSION,
    AteStrictParams,
    Progress,
    default_adaptive_clip,
    default_adjustment_columns,
    default_cross_fit,
    default_delta_for,
)
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.errors import InvalidParameters, ReleaseFailed
from service.mechanisms.noise import NoiseSampler
from service.mechanisms.records import (
    CHUNK_PREFIX,
    Composition,
    Guarantee,
    MechanismRecord,
    NoiseEvent,
)

MIN_CHUNKS = 2
MAX_CHUNKS = 16

# The chunk preset (public): where a request with ``chunks`` leaves these fields out, each chunk
# is released with DP-EBM nuisances on their measured outcome range, the folds (propensity,
# outcome, estimation) below and the pseudo-outcome clipped at K = CHUNK_K_OF_RANGE x the
# declared outcome range (the ``ebm_cate`` anchor's K). The probe that chose it:
# bench/README.md, "Design probe: subsample and aggregate"; what it gives: "Subsample and
# aggregate".
CHUNK_K_OF_RANGE = 0.3
CHUNK_FOLDS = (0.1, 0.4, 0.5)

# The public default (``default_chunks``): an observational strict aipw request that names no
# single-release option is released in chunks where n * epsilon lies in the range the chunks'
# coverage and width were measured on (bench/README.md, "Subsample and aggregate": n * epsilon
# 2,500-20,000, where they were narrower than the single release in every cell, 1.8-4.2x more
# accurate, with coverage as near 95 % or nearer) and n is at least DEFAULT_CHUNKS_MIN_N (4
# chunks of 1,000 rows; the smallest measured were 1,250). From LARGE_CHUNKS_MIN_N rows 8 chunks
# (of at least 2,000 rows): at n 20000, eps 1 they were narrower than 4 (4.7-5.0x the
# non-private width against 5.5-6.4x) with the same error.
DEFAULT_CHUNKS_N_EPSILON = (2_500.0, 20_000.0)
DEFAULT_CHUNKS_MIN_N = 4_000
DEFAULT_CHUNKS = 4
LARGE_CHUNKS_MIN_N = 16_000
LARGE_CHUNKS = 8


def default_chunks(domain: PublicDomain, epsilon: float) -> int | None:
    """The public rule's number of chunks for an observational strict aipw request that names no
    single-release option: DEFAULT_CHUNKS (LARGE_CHUNKS from LARGE_CHUNKS_MIN_N rows) where
    n * epsilon is in DEFAULT_CHUNKS_N_EPSILON and n >= DEFAULT_CHUNKS_MIN_N, else None (one
    release on all rows). Public inputs only (design, n, epsilon); the kind also checks that the
    chunks fit their folds."""
    if domain.design == StudyDesign.RCT or domain.n < DEFAULT_CHUNKS_MIN_N:
        return None
    low, high = DEFAULT_CHUNKS_N_EPSILON
    if not low <= float(domain.n) * float(epsilon) <= high:
        return None
    return chunks_for_n(domain.n)


def preset_params(
    domain: PublicDomain, chunks: int, epsilon: float, delta: float | None = None
) -> AggregateParams:
    """The chunk preset at ``(epsilon, delta)`` over ``chunks`` chunks (public): what the ``ate``
    kind's ``chunked_params`` resolves for a request naming only epsilon (and delta): DP-EBM
    nuisances on their measured outcome range, folds CHUNK_FOLDS, K = CHUNK_K_OF_RANGE x the
    declared outcome range, the cross-fitting, delta and adjustment rules at the chunk's size.
    Other kinds reuse it where they release the ``ate`` default (``default_release``)."""
    sub = chunk_domain(domain, chunks)
    clip = CHUNK_K_OF_RANGE * domain.outcome_range
    cross_fit = default_cross_fit(sub, "dp_ebm", CHUNK_FOLDS, epsilon)
    if delta is None:
        delta = default_delta_for(sub, CHUNK_FOLDS, "dp_ebm", cross_fit, epsilon)
    chunk = AteStrictParams(
        epsilon=epsilon,
        delta=delta,
        pseudo_outcome_clip=clip,
        fold_fractions=CHUNK_FOLDS,
        nuisance="dp_ebm",
        cross_fit=cross_fit,
        adaptive_clip=default_adaptive_clip(sub, clip),
        outcome_range=True,
        adjustment_columns=default_adjustment_columns(sub, "dp_ebm"),
    )
    return AggregateParams(chunks=chunks, chunk=chunk)


def default_release(
    domain: PublicDomain, epsilon: float, delta: float | None = None
) -> AggregateParams | None:
    """The ``ate`` kind's default at ``(epsilon, delta)`` where its chunks rule applies (the
    rule's number of chunks, the chunk preset, the chunks fitting their folds), else None (the
    single-release default, ``default_params``). Public inputs only."""
    chunks = default_chunks(domain, epsilon)
    if chunks is None:
        return None
    params = preset_params(domain, chunks, epsilon, delta)
    try:
        _chunk_plan(domain, params)
    except InvalidParameters:
        return None
    return params


def chunks_for_n(n: int) -> int:
    """The rule's number of chunks at n rows: LARGE_CHUNKS from LARGE_CHUNKS_MIN_N, else
    DEFAULT_CHUNKS (public)."""
    return LARGE_CHUNKS if n >= LARGE_CHUNKS_MIN_N else DEFAULT_CHUNKS


# Quote only: the chunks' estimates spread more than one chunk release's quoted standard error
# (its sampling error at the assumed pseudo-outcome scale and its output noise) by the DP
# nuisance models' fit noise, which the single-release quote leaves out. Its sd is modelled as
# CHUNK_FIT_NOISE_FACTOR x the chunk's sampling error at the assumed scale
# (``assumed_pseudo_outcome_sd / sqrt(n2)``) x epsilon ** -CHUNK_FIT_NOISE_EPSILON_POWER: fitted
# to the chunks' measured spread on the realistic observational studies with the chunk preset
# (bench/README.md, "Subsample and aggregate": n 5000 at eps 0.5, 1 and 4, n 20000 at eps 1).
CHUNK_FIT_NOISE_FACTOR = 2.9
CHUNK_FIT_NOISE_EPSILON_POWER = 0.45


@dataclass(frozen=True)
class AggregateParams:
    """A subsample-and-aggregate request: ``chunks`` disjoint chunks, each released with
    ``chunk`` (resolved at the chunk's public size ``n // chunks``)."""

    chunks: int
    chunk: AteStrictParams

    @property
    def alpha(self) -> float:
        return self.chunk.alpha


def chunk_size(n: int, chunks: int) -> int:
    """Rows per chunk (public): ``n // chunks``."""
    return n // chunks


def validate_chunks(chunks: object) -> int:
    """``chunks`` as an int in [MIN_CHUNKS, MAX_CHUNKS]; else ``InvalidParameters``."""
    if isinstance(chunks, bool) or not isinstance(chunks, int):
        raise InvalidParameters("chunks must be an integer")
    if not MIN_CHUNKS <= chunks <= MAX_CHUNKS:
        raise InvalidParameters(f"chunks must be between {MIN_CHUNKS} and {MAX_CHUNKS}")
    return chunks


def chunk_domain(domain: PublicDomain, chunks: int) -> PublicDomain:
    """The public domain of one chunk: the dataset's, with n the chunk size."""
    return replace(domain, n=chunk_size(domain.n, validate_chunks(chunks)))


def chunk_error(domain: PublicDomain, chunks: int, error: InvalidParameters) -> InvalidParameters:
    """A chunk release's refusal, saying that it is a chunk's (public values only)."""
    return InvalidParameters(
        f"with chunks={chunks} each chunk holds {chunk_size(domain.n, chunks)} of the "
        f"{domain.n} rows: {error} (ask for fewer chunks)"
    )


def _chunk_plan(domain: PublicDomain, params: AggregateParams) -> calibration.Plan:
    sub = chunk_domain(domain, params.chunks)
    try:
        return calibration.make_plan(sub, params.chunk)
    except InvalidParameters as exc:
        raise chunk_error(domain, params.chunks, exc) from None


def plan(domain: PublicDomain, params: AggregateParams) -> MechanismRecord:
    """The record (cost) without data: M copies of the chunk release's events, their modules
    prefixed ``chunk<c>/`` and each naming the chunk release's own composition rule; the cost is
    one chunk's (``Composition.CHUNKS``: the chunks are disjoint, proof §17).

    Raises:
        InvalidParameters: invalid parameters (before any charge).
    """
    return _combined_record(domain, params.chunks, _chunk_plan(domain, params).record)


def _combined_record(domain: PublicDomain, chunks: int, single: MechanismRecord) -> MechanismRecord:
    """The release's record from one chunk release's (``single``)."""
    events: list[NoiseEvent] = []
    fold_sizes: dict[str, int] = {}
    for c in range(1, chunks + 1):
        prefix = f"{CHUNK_PREFIX}{c}/"
        events.extend(
            replace(
                event,
                module=prefix + event.module,
                params={**event.params, "chunk_composition": str(single.composition)},
            )
            for event in single.events
        )
        fold_sizes.update({prefix + name: size for name, size in single.fold_sizes.items()})
    unused = domain.n - chunks * single.n
    if unused:
        fold_sizes["unused"] = unused
    return MechanismRecord(
        mechanism=MECHANISM,
        version=VERSION,
        guarantee=Guarantee.STRICT,
        n=domain.n,
        fold_sizes=fold_sizes,
        composition=Composition.CHUNKS,
        events=tuple(events),
        epsilon=single.epsilon,
        delta=single.delta,
    )


def t_quantile(chunks: int, alpha: float) -> float:
    """``t_{M - 1, 1 - alpha / 2}``."""
    return float(student_t.ppf(1.0 - alpha / 2.0, chunks - 1))


def t_interval(estimates: list[float], alpha: float) -> dict[str, float]:
    """The t interval over the chunks' DP estimates (post-processing)."""
    values = np.asarray(estimates, dtype=np.float64)
    m = int(values.size)
    mean = float(math.fsum(values.tolist()) / m)
    spread = float(np.std(values, ddof=1))
    half = t_quantile(m, alpha) * spread / math.sqrt(m)
    return {
        "estimate": mean,
        "chunk_spread": spread,
        "half_width": half,
        "ci_lower": mean - half,
        "ci_upper": mean + half,
    }


def run(
    arrays: Arrays,
    domain: PublicDomain,
    params: AggregateParams,
    *,
    rng: np.random.Generator,
    noise: NoiseSampler,
    progress: Progress,
) -> dict[str, Any]:
    """Run the chunks' releases (after the charge) and aggregate them.

    Returns DP and public values only: the mean ``estimate``, the t interval, the chunks' DP
    estimates and the chunk release's public parameters.

    Raises:
        InvalidParameters: invalid parameters (before the data is touched).
        ReleaseFailed: any failure after the data is touched (generic by construction).
    """
    state = _chunk_plan(domain, params)
    sub = chunk_domain(domain, params.chunks)
    size = sub.n
    try:
        # proof §17 step 1: a uniformly random permutation (CSPRNG-seeded) cut at public sizes.
        order = rng.permutation(domain.n)
        estimates: list[float] = []
        for c in range(params.chunks):
            rows = order[c * size : (c + 1) * size]
            part = Arrays(x=arrays.x[rows], a=arrays.a[rows], y=arrays.y[rows])
            out = estimation.run(
                part,
                sub,
                params.chunk,
                rng=rng,
                noise=noise,
                progress=_chunk_progress(progress, c, params.chunks),
            )
            estimates.append(float(out["estimate"]))
            del part, out
        interval = t_interval(estimates, params.alpha)
    except Exception:
        # threats.md §3: one generic error, no cause chain (it could quote data).
        raise ReleaseFailed() from None
    public = calibration.public_parameters(state)
    progress(1.0, "done")
    return {
        **public,
        **interval,
        "ci_level": 1.0 - params.alpha,
        "interval": "t_over_chunks",
        "degrees_of_freedom": params.chunks - 1,
        "chunks": params.chunks,
        "chunk_size": size,
        "chunk_estimates": estimates,
        "chunk_s_theta": state.mean.sigma,
        "epsilon": state.record.epsilon,
        "delta": state.record.delta,
        "fold_sizes": dict(_combined_record(domain, params.chunks, state.record).fold_sizes),
        "chunk_fold_sizes": dict(state.record.fold_sizes),
    }


def _chunk_progress(progress: Progress, c: int, chunks: int) -> Progress:
    """Chunk c's stages as its share of the whole release's progress."""

    def report(fraction: float, stage: str) -> None:
        progress((c + fraction) / chunks, f"chunk {c + 1}/{chunks}: {stage}")

    return report


def mean_noise_sd(params: AggregateParams, chunk_s_theta: float) -> float:
    """The privacy noise sd of the chunks' mean (public): one chunk's output noise sd
    ``chunk_s_theta`` over sqrt(chunks), the chunks' noise being independent."""
    return float(chunk_s_theta) / math.sqrt(params.chunks)


def c4(m: int) -> float:
    """E[s] / sigma for m normal draws (the sample sd's bias factor)."""
    return math.exp(0.5 * math.log(2.0 / (m - 1)) + gammaln(m / 2.0) - gammaln((m - 1) / 2.0))


def fit_noise_sd(epsilon: float, sampling_sd: float) -> float:
    """The modelled sd of the DP nuisance models' fit noise in one chunk's estimate (public)."""
    return float(CHUNK_FIT_NOISE_FACTOR * sampling_sd * epsilon**-CHUNK_FIT_NOISE_EPSILON_POWER)


def expected_half_width(domain: PublicDomain, params: AggregateParams) -> dict[str, float]:
    """The expected t half-width from public quantities: the chunks' assumed spread sigma_c
    adds the modelled fit noise (``fit_noise_sd``) to one chunk release's quoted standard error
    (its expected half-width over z), and ``E[half-width] = t_{M-1} c4(M) sigma_c / sqrt(M)``."""
    sub = chunk_domain(domain, params.chunks)
    single = single_quote(sub, params.chunk)
    z = float(ndtri(1.0 - params.alpha / 2.0))
    quoted_sd = float(single["expected_half_width"]) / z
    sampling_sd = float(single["assumed_pseudo_outcome_sd"]) / math.sqrt(float(single["n2"]))
    fit_noise = fit_noise_sd(params.chunk.epsilon, sampling_sd)
    spread = math.hypot(quoted_sd, fit_noise)
    m = params.chunks
    return {
        "expected_half_width": t_quantile(m, params.alpha) * c4(m) * spread / math.sqrt(m),
        "assumed_chunk_spread": spread,
        "assumed_fit_noise_sd": fit_noise,
        "chunk_expected_half_width": float(single["expected_half_width"]),
        "chunk_s_theta": float(single["s_theta"]),
    }


def quote(domain: PublicDomain, params: AggregateParams) -> dict[str, Any]:
    """Public accuracy preview: no data, no charge.

    Raises:
        InvalidParameters: invalid parameters.
    """
    state = _chunk_plan(domain, params)
    expected = expected_half_width(domain, params)
    record = _combined_record(domain, params.chunks, state.record)
    return {
        **calibration.public_parameters(state),
        "epsilon": record.epsilon,
        "delta": record.delta,
        "fold_sizes": dict(record.fold_sizes),
        "chunk_fold_sizes": dict(state.record.fold_sizes),
        "ci_level": 1.0 - params.alpha,
        "interval": "t_over_chunks",
        "degrees_of_freedom": params.chunks - 1,
        "chunks": params.chunks,
        "chunk_size": chunk_size(domain.n, params.chunks),
        **expected,
        "half_width_basis": "assumed_chunk_spread",
    }
