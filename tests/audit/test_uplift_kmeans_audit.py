"""Empirical privacy audit of the DP k-means partition of uplift_table (DPLloyd, replace-one).

Mechanism (adum.md §4 (c), service/mechanisms/uplift/estimation.py ``dp_kmeans``): data-independent
initial centroids, then T iterations that each release noisy cluster counts (L1 sensitivity 2)
and noisy coordinate sums on [-1, 1]^q (L1 sensitivity 2q), each at eps_km / (2T); the
centroids are post-processing. Claim: the k-means step is (eps_km, 0)-DP under replace-one.

Neighbours: 20 fixed points in [-1, 1]^2 plus one record at the corner (-1, -1) in D and at the
opposite corner (1, 1) in D'. When the corners fall in different clusters this attains both
sensitivities (the counts move by 2, the sums by 2q = 4).

Test statistic: the exact privacy-loss variable of the released transcript,
``L = log p_D(transcript) - log p_D'(transcript) = sum over every noisy coordinate of
(|z - m'| - |z - m|) / b``, where m and m' are the exact statistics of D and D' at the *same*
centroids (the ones the transcript itself determines). Both are recovered from the real code:
``dp_kmeans`` is run with a recording sampler (its exact statistics, the noise scale it asks
for and the noisy output), and re-run on the neighbour with a replaying sampler that returns the
recorded outputs, so it follows the same centroid path and reports the neighbour's exact
statistics there. ``P_D(L > t) <= e^eps P_D'(L > t)`` for an eps-DP release; Clopper-Pearson
bounds over a fixed threshold grid give ``eps_lb`` (family-wise false-failure rate 1e-6,
Bonferroni over thresholds and directions: tests/audit/test_ate_strict_audit.py).

Two audits:
  * one iteration (T = 1), 10^6 runs vectorised around the exact statistics the real code
    computes: tight (``eps_lb > 0.8 eps_km``); power: the add/remove sensitivities (1 and q,
    i.e. half the scales) are 2 eps_km-DP under replace-one and must be rejected;
  * the full T = 5 pipeline through ``dp_kmeans`` itself (adaptive centroids), 6,000 runs
    per dataset. Not tight: the loss is a sum of 2T terms of at most eps_km / (2T) each, and
    reaching eps_km needs all of them extreme (measured eps_lb ~ 0.05). Power: the bug "each
    iteration gets eps_km instead of eps_km / T" (scales / T) must be rejected (measured 1.08).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from numpy.typing import NDArray

from service.mechanisms import uplift as up
from service.mechanisms.domain import PublicDomain, StudyDesign
from tests.audit.test_ate_strict_audit import epsilon_lower_bound

EPSILON_KM = 1.0
N_POINTS = 21
RUNS_ONE_ITERATION = 1_000_000
RUNS_PIPELINE = 6_000
THRESHOLDS = [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
# the pipeline's loss is a sum of 2T small terms; the buggy variant's reaches beyond eps_km
THRESHOLDS_PIPELINE = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0]


@dataclass
class Recorder:
    """A NoiseSampler that adds continuous Laplace noise and records every call."""

    rng: np.random.Generator
    scale_factor: float = 1.0  # < 1: a deliberately miscalibrated variant (power checks)
    exact: list[NDArray[np.float64]] = field(default_factory=list)
    noisy: list[NDArray[np.float64]] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)

    def laplace(
        self, values: NDArray[np.float64], *, scale: float, sensitivity_l1: float
    ) -> NDArray[np.float64]:
        scale = scale * self.scale_factor
        out = values + self.rng.laplace(0.0, scale, size=values.shape)
        self.exact.append(np.array(values, dtype=np.float64))
        self.noisy.append(out)
        self.scales.append(scale)
        return out

    def gaussian(
        self, values: NDArray[np.float64], *, sigma: float, sensitivity_l2: float
    ) -> NDArray[np.float64]:
        raise AssertionError("DPLloyd draws Laplace noise only")


@dataclass
class Replayer:
    """Returns a recorded transcript and records the exact statistics it is asked about."""

    outputs: list[NDArray[np.float64]]
    exact: list[NDArray[np.float64]] = field(default_factory=list)

    def laplace(
        self, values: NDArray[np.float64], *, scale: float, sensitivity_l1: float
    ) -> NDArray[np.float64]:
        self.exact.append(np.array(values, dtype=np.float64))
        return self.outputs[len(self.exact) - 1]

    def gaussian(
        self, values: NDArray[np.float64], *, sigma: float, sensitivity_l2: float
    ) -> NDArray[np.float64]:
        raise AssertionError("DPLloyd draws Laplace noise only")


def _domain() -> PublicDomain:
    return PublicDomain(
        x_lower=np.array([-1.0, -1.0]),
        x_upper=np.array([1.0, 1.0]),
        y_lower=0.0,
        y_upper=1.0,
        n=N_POINTS,
        design=StudyDesign.RCT,
        treatment_probability=0.5,
    )


def _plan(iterations: int) -> up.Plan:
    # the table gets the other half; only the k-means step is audited here.
    params = up.UpliftParams(
        epsilon=2.0 * EPSILON_KM,
        partition="kmeans",
        clusters=2,
        kmeans_share=0.5,
        kmeans_iterations=iterations,
    )
    return up.make_plan(_domain(), params)


def _neighbours() -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    rng = np.random.default_rng(11)
    u = np.vstack([[-1.0, -1.0], rng.uniform(-1, 1, (N_POINTS - 1, 2))])
    u2 = u.copy()
    u2[0] = [1.0, 1.0]
    return u, u2


def _loss(
    z: NDArray[np.float64], m: NDArray[np.float64], m2: NDArray[np.float64], b: float
) -> NDArray[np.float64]:
    """log p_D - log p_D' of Laplace outputs z (last axis summed)."""
    return np.asarray(np.sum(np.abs(z - m2) - np.abs(z - m), axis=-1) / b)


# ---- one iteration, vectorised ---------------------------------------------------------------

INIT_SEED = 3  # initial centroids separating the two corners (checked below)


def _one_iteration_means() -> tuple[
    list[NDArray[np.float64]], list[NDArray[np.float64]], list[float]
]:
    state = _plan(1)
    u, u2 = _neighbours()
    record = Recorder(np.random.default_rng(0))
    up.dp_kmeans(u, state, rng=np.random.default_rng(INIT_SEED), noise=record)
    record2 = Recorder(np.random.default_rng(0))
    up.dp_kmeans(u2, state, rng=np.random.default_rng(INIT_SEED), noise=record2)
    assert record.scales == record2.scales
    return record.exact, record2.exact, record.scales


def test_one_iteration_neighbours_attain_the_sensitivities() -> None:
    (counts, sums), (counts2, sums2), scales = _one_iteration_means()
    assert np.abs(counts - counts2).sum() == 2.0
    assert np.abs(sums - sums2).sum() == pytest.approx(4.0, rel=1e-12)
    state = _plan(1)
    assert state.kmeans_counts is not None
    assert state.kmeans_sums is not None
    # the production scales: 2 / (eps_km / 2) and 2q / (eps_km / 2) (lattice slack aside)
    assert scales[0] == state.kmeans_counts.scale == pytest.approx(4.0 / EPSILON_KM, rel=1e-6)
    assert scales[1] == state.kmeans_sums.scale == pytest.approx(8.0 / EPSILON_KM, rel=1e-6)


def _audit_one_iteration(scale_factor: float, seed: int) -> float:
    (counts, sums), (counts2, sums2), scales = _one_iteration_means()
    rng = np.random.default_rng(seed)
    b_c, b_s = scales[0] * scale_factor, scales[1] * scale_factor

    def losses(c: NDArray[np.float64], s: NDArray[np.float64]) -> NDArray[np.float64]:
        zc = c + rng.laplace(0.0, b_c, size=(RUNS_ONE_ITERATION, c.size))
        zs = s + rng.laplace(0.0, b_s, size=(RUNS_ONE_ITERATION, s.size))
        return _loss(zc, counts, counts2, b_c) + _loss(zs, sums, sums2, b_s)

    loss_d, loss_d2 = losses(counts, sums), losses(counts2, sums2)
    return epsilon_lower_bound(loss_d2, loss_d, [t * EPSILON_KM for t in THRESHOLDS], 0.0)


def test_one_iteration_audit_of_production_calibration() -> None:
    bound = _audit_one_iteration(1.0, seed=1)
    assert bound <= EPSILON_KM
    assert bound > 0.8 * EPSILON_KM  # the worst case is attained: the audit is tight


def test_one_iteration_audit_rejects_add_remove_sensitivities() -> None:
    assert _audit_one_iteration(0.5, seed=2) > EPSILON_KM


# ---- the full T-iteration pipeline through dp_kmeans -----------------------------------------

ITERATIONS = 5


def _pipeline_losses(
    sampled: NDArray[np.float64],
    other: NDArray[np.float64],
    sampled_is_d: bool,
    scale_factor: float,
    seed: int,
) -> NDArray[np.float64]:
    """The transcript privacy loss log p_D - log p_D' of runs of dp_kmeans on ``sampled``."""
    state = _plan(ITERATIONS)
    noise_rng = np.random.default_rng(seed)
    out = np.empty(RUNS_PIPELINE)
    for run in range(RUNS_PIPELINE):
        init = 1_000_000 * seed + run  # data-independent initial centroids, shared by both
        record = Recorder(noise_rng, scale_factor)
        up.dp_kmeans(sampled, state, rng=np.random.default_rng(init), noise=record)
        replay = Replayer(record.noisy)
        up.dp_kmeans(other, state, rng=np.random.default_rng(init), noise=replay)
        loss = 0.0
        for z, m, m2, b in zip(
            record.noisy, record.exact, replay.exact, record.scales, strict=True
        ):
            if not sampled_is_d:
                m, m2 = m2, m
            loss += float(np.sum(np.abs(z - m2) - np.abs(z - m)) / b)
        out[run] = loss
    return out


def _audit_pipeline(scale_factor: float, seed: int) -> float:
    u, u2 = _neighbours()
    loss_d = _pipeline_losses(u, u2, True, scale_factor, seed)
    loss_d2 = _pipeline_losses(u2, u, False, scale_factor, seed + 1)
    thresholds = [t * EPSILON_KM for t in THRESHOLDS_PIPELINE]
    return epsilon_lower_bound(loss_d2, loss_d, thresholds, 0.0)


def test_pipeline_uses_eps_over_2t_per_statistic() -> None:
    state = _plan(ITERATIONS)
    u, _ = _neighbours()
    record = Recorder(np.random.default_rng(0))
    up.dp_kmeans(u, state, rng=np.random.default_rng(0), noise=record)
    assert len(record.scales) == 2 * ITERATIONS
    per_statistic = EPSILON_KM / (2 * ITERATIONS)
    assert record.scales[0::2] == pytest.approx([2.0 / per_statistic] * ITERATIONS, rel=1e-6)
    assert record.scales[1::2] == pytest.approx([4.0 / per_statistic] * ITERATIONS, rel=1e-6)


@pytest.mark.slow
def test_pipeline_audit_of_production_calibration() -> None:
    assert _audit_pipeline(1.0, seed=10) <= EPSILON_KM


@pytest.mark.slow
def test_pipeline_audit_rejects_a_missing_split_over_iterations() -> None:
    # every iteration at eps_km instead of eps_km / T: (T eps_km)-DP
    assert _audit_pipeline(1.0 / ITERATIONS, seed=20) > EPSILON_KM
