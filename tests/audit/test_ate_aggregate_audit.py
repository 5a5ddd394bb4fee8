"""Empirical audit of subsample and aggregate (``chunks``; docs/proofs/ate_strict.md §17).

The claim: each record lies in exactly one chunk, each chunk's release is the strict release of
its own rows calibrated at the chunk's public size, so the M releases together cost one chunk's
(epsilon, delta). Three checks, each of which a wrong implementation fails:

1. **Disjoint chunks**: every row reaches at most one chunk's release (a row read by two chunks
   would compose sequentially: 2 epsilon for it).
2. **Calibration at the chunk's size, end to end**: a recording sampler (production OpenDP
   underneath) sees, for each chunk, exactly the draws of one strict release on a dataset of
   the chunk's size (same sigmas, same order), and the mean's sigma is the one for
   sensitivity ``2K / n2`` with n2 the chunk's estimation fold: a chunk calibrated at the whole
   dataset's n (sensitivity M times too small) turns this red.
3. **The mean channel at the recorded sigma** with worst-case neighbours inside a chunk (Gamma
   from -K to +K): the Gaussian audit of ``test_ate_strict_audit`` passes at the chunk's epsilon
   share, and a sigma calibrated for the whole dataset's estimation fold is rejected.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from service.mechanisms.ate_strict import aggregate, calibration, estimation
from service.mechanisms.domain import Arrays
from service.mechanisms.noise import OpenDPSampler, SeededSampler, calibrate_gaussian
from service.releases.kinds.ate import AteKind, AteParams, chunked_params
from tests.audit.test_ate_strict_audit import Channel, _audit
from tests.audit.test_end_to_end_noise import RecordingSampler
from tests.unit.test_ate_strict import make_domain, no_progress, synthetic

N, CHUNKS, EPSILON = 3000, 3, 1.0
N_SEEDED = 2_000_000


def _gaussians(recorder: RecordingSampler) -> list[tuple[float, float]]:
    """The (sigma, sensitivity) of each Gaussian draw, in order."""
    return [(d["scale"], d["sensitivity"]) for d in recorder.draws if d["type"] == "gaussian"]


def _params() -> AteParams:
    return AteParams(epsilon=EPSILON, chunks=CHUNKS, nuisance="dp_linear")


def test_every_row_reaches_at_most_one_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    domain = make_domain(n=N + 2, q=2)
    arrays = synthetic(N + 2, 2, np.random.default_rng(0))
    arrays = Arrays(x=arrays.x, a=arrays.a, y=np.arange(N + 2, dtype=np.float64))
    real_run = estimation.run
    reads: list[NDArray[np.float64]] = []

    def spy(part: Arrays, sub: Any, params: Any, **options: Any) -> dict[str, Any]:
        reads.append(part.y.copy())
        return real_run(part, sub, params, **options)

    monkeypatch.setattr(aggregate.estimation, "run", spy)
    AteKind().run(
        arrays,
        domain,
        _params(),
        rng=np.random.default_rng(1),
        noise=OpenDPSampler(),
        progress=no_progress,
    )
    rows = np.concatenate(reads).astype(int)
    assert len(reads) == CHUNKS
    assert rows.size == len(set(rows.tolist())) == CHUNKS * (N // CHUNKS)


def test_each_chunk_is_calibrated_at_its_own_size() -> None:
    domain = make_domain(n=N, q=2)
    arrays = synthetic(N, 2, np.random.default_rng(2))
    recorder = RecordingSampler()
    AteKind().run(
        arrays,
        domain,
        _params(),
        rng=np.random.default_rng(3),
        noise=recorder,
        progress=no_progress,
    )
    mechanism = chunked_params(_params(), domain)
    sub = replace(domain, n=N // CHUNKS)
    single = RecordingSampler()
    estimation.run(
        synthetic(N // CHUNKS, 2, np.random.default_rng(4)),
        sub,
        mechanism.chunk,
        rng=np.random.default_rng(5),
        noise=single,
        progress=no_progress,
    )
    drawn = _gaussians(recorder)
    assert drawn == _gaussians(single) * CHUNKS
    state = calibration.make_plan(sub, mechanism.chunk)
    n2 = state.n2
    mean_sigma = state.mean.sigma
    assert (mean_sigma, state.mean.sensitivity_l2) in drawn
    assert state.mean.sensitivity_l2 >= 2 * state.bound / n2
    whole = calibration.make_plan(domain, mechanism.chunk)  # the whole dataset's calibration
    assert whole.mean.sigma < mean_sigma / 2
    assert (whole.mean.sigma, whole.mean.sensitivity_l2) not in drawn


def _mean_channel() -> tuple[Channel, float]:
    domain = make_domain(n=N, q=2)
    record = aggregate.plan(domain, chunked_params(_params(), domain))
    event = next(
        e
        for e in record.events
        if e.module == "chunk1/estimation" and e.params["statistic"] == "mean_pseudo_outcome"
    )
    whole = calibration.make_plan(domain, chunked_params(_params(), domain).chunk)
    # worst-case neighbours in one chunk: one Gamma moves from -K to +K, the mean by 2K / n2
    return Channel(0.0, float(event.params["sensitivity_l2_nominal"]), event), whole.mean.sigma


def test_the_chunk_mean_channel_audits_at_its_recorded_sigma() -> None:
    channel, _ = _mean_channel()
    bound = _audit(channel, channel.sigma, SeededSampler(np.random.default_rng(6)), N_SEEDED)
    assert bound <= channel.event.epsilon, bound


def test_the_audit_rejects_a_chunk_calibrated_at_the_whole_size() -> None:
    channel, whole_sigma = _mean_channel()
    sampler = SeededSampler(np.random.default_rng(7))
    assert _audit(channel, whole_sigma, sampler, N_SEEDED) > EPSILON
    # and the chunk's own sigma is what its (epsilon, delta) and sensitivity call for
    expected = calibrate_gaussian(
        channel.event.epsilon, channel.event.delta, channel.sensitivity_l2
    ).sigma
    assert channel.sigma == pytest.approx(expected, rel=1e-9)
