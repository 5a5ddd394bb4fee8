"""Subsample and aggregate (``chunks``; docs/proofs/ate_strict.md §17): the record's cost, the
chunk preset, the partition, the t interval, the quote and the failure path."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pydantic
import pytest
from scipy.stats import t as student_t

from bench.studies import STUDIES
from bench.subsample import chunk_params
from service.mechanisms import ate_strict
from service.mechanisms.ate_ipw import AteIpwParams
from service.mechanisms.ate_rct import AteRctParams
from service.mechanisms.ate_strict import AteStrictParams, aggregate, calibration
from service.mechanisms.domain import Arrays, StudyDesign
from service.mechanisms.errors import InvalidParameters, ReleaseFailed
from service.mechanisms.noise import SeededSampler
from service.mechanisms.records import Composition
from service.releases.kinds.ate import (
    AteKind,
    AteParams,
    chunked_params,
    resolved_chunks,
    to_mechanism_params,
)
from tests.unit.test_ate_strict import make_domain, no_progress, synthetic


def test_the_cost_is_one_chunks_and_every_chunk_is_in_the_record() -> None:
    domain = make_domain(n=8003, q=3)
    params = chunked_params(AteParams(epsilon=1.5, chunks=4), domain)
    record = aggregate.plan(domain, params)
    single = ate_strict.plan(replace(domain, n=2000), params.chunk)
    assert record.composition == Composition.CHUNKS
    assert (record.epsilon, record.delta) == (single.epsilon, single.delta) == (1.5, 1e-5)
    assert record.n == 8003
    assert len(record.events) == 4 * len(single.events)
    for c in range(1, 5):
        mine = [e for e in record.events if e.module.startswith(f"chunk{c}/")]
        assert [e.module for e in mine] == [f"chunk{c}/{e.module}" for e in single.events]
        assert [e.epsilon for e in mine] == [e.epsilon for e in single.events]
        assert {e.params["chunk_composition"] for e in mine} == {str(single.composition)}
    # every row is in one chunk's folds, or among the n mod M rows no chunk reads
    assert sum(record.fold_sizes.values()) == 8003
    assert record.fold_sizes["unused"] == 3
    assert record.to_dict()["composition"] == "chunks"


def test_the_chunk_preset_and_what_a_request_overrides() -> None:
    domain = make_domain(n=6000, q=3, y_lower=-5.0, y_upper=5.0)
    preset = chunked_params(AteParams(epsilon=1.0, chunks=4), domain).chunk
    assert preset.nuisance == "dp_ebm"
    assert preset.outcome_range is True
    assert preset.fold_fractions == aggregate.CHUNK_FOLDS
    assert preset.pseudo_outcome_clip == pytest.approx(0.3 * 10.0)
    assert preset.adaptive_clip is False
    # resolved at the chunk's size: the default delta of a 1500-row release
    single = to_mechanism_params(
        AteParams(
            epsilon=1.0,
            nuisance="dp_ebm",
            outcome_range=True,
            fold_fractions=aggregate.CHUNK_FOLDS,
            pseudo_outcome_clip=3.0,
        ),
        replace(domain, n=1500),
    )
    assert preset == single
    adaptive = chunked_params(AteParams(epsilon=1.0, chunks=4, clip="adaptive"), domain).chunk
    assert adaptive.pseudo_outcome_clip is None
    assert adaptive.adaptive_clip is True
    linear = chunked_params(AteParams(epsilon=1.0, chunks=2, nuisance="dp_linear"), domain).chunk
    assert linear.nuisance == "dp_linear"
    assert linear.outcome_range is None
    assert linear.fold_fractions is None


def test_the_bench_probe_ran_the_chunk_preset() -> None:
    """bench.subsample's 200-release coverage runs built each chunk's request themselves: it is
    the request the mechanism resolves."""
    for het in ("none", "strong"):
        study = STUDIES[het]
        n = 5000
        domain = study.domain(n)
        ours = chunked_params(AteParams(epsilon=1.0, chunks=4), domain)
        theirs = to_mechanism_params(chunk_params(1.0, study), study.domain(n // 4))
        assert ours.chunk == theirs


@pytest.mark.parametrize("chunks", [0, 1, 17, True, 2.0])
def test_the_number_of_chunks_is_validated(chunks: Any) -> None:
    if chunks == 1 and chunks is not True:
        AteParams(epsilon=1.0, chunks=chunks)  # one release on all rows
    else:
        with pytest.raises(pydantic.ValidationError):
            AteParams(epsilon=1.0, chunks=chunks)
    with pytest.raises(InvalidParameters, match="chunks"):
        aggregate.validate_chunks(chunks)


def test_chunks_too_small_for_their_folds_are_refused_before_any_charge() -> None:
    domain = make_domain(n=3000, q=3)
    with pytest.raises(InvalidParameters, match=r"chunks=4 each chunk holds 750 of the 3000"):
        AteKind().record(AteParams(epsilon=1.0, chunks=4), domain)
    AteKind().record(AteParams(epsilon=1.0, chunks=3), domain)  # 1000 rows: 100 propensity rows


def test_a_trial_is_refused_with_the_reason() -> None:
    domain = make_domain(n=8000, design=StudyDesign.RCT, p=0.5)
    with pytest.raises(InvalidParameters, match="observational datasets"):
        AteKind().record(AteParams(epsilon=1.0, chunks=4), domain)


def test_the_partition_is_disjoint_and_the_interval_is_the_t_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n, chunks = 4003, 4
    domain = make_domain(n=n, q=2)
    arrays = Arrays(x=np.zeros((n, 2)), a=np.tile([0.0, 1.0], n)[:n], y=np.arange(n, dtype=float))
    seen: list[np.ndarray] = []
    values = iter([1.0, 2.0, 4.0, 7.0])

    def fake_run(part: Arrays, sub: Any, params: Any, **_: Any) -> dict[str, Any]:
        assert sub.n == part.y.size == n // chunks
        seen.append(part.y.astype(int))
        return {"estimate": next(values)}

    monkeypatch.setattr(aggregate.estimation, "run", fake_run)
    params = chunked_params(AteParams(epsilon=1.0, chunks=chunks), domain)
    stages: list[tuple[float, str]] = []
    out = aggregate.run(
        arrays,
        domain,
        params,
        rng=np.random.default_rng(3),
        noise=SeededSampler(np.random.default_rng(4)),
        progress=lambda f, s: stages.append((f, s)),
    )
    rows = np.concatenate(seen)
    assert rows.size == len(set(rows.tolist())) == 4000  # disjoint; 3 rows left unread
    assert not np.array_equal(rows, np.arange(4000))  # a random permutation, not the file order
    estimates = [1.0, 2.0, 4.0, 7.0]
    half = student_t.ppf(0.975, 3) * np.std(estimates, ddof=1) / 2.0
    assert out["chunk_estimates"] == estimates
    assert out["estimate"] == pytest.approx(3.5)
    assert out["half_width"] == pytest.approx(half)
    assert (out["ci_lower"], out["ci_upper"]) == pytest.approx((3.5 - half, 3.5 + half))
    assert out["degrees_of_freedom"] == 3
    assert out["chunk_size"] == 1000
    assert out["epsilon"] == 1.0
    assert out["fold_sizes"]["unused"] == 3
    assert stages[-1] == (1.0, "done")


def test_a_failing_chunk_fails_the_release_generically(monkeypatch: pytest.MonkeyPatch) -> None:
    domain = make_domain(n=2000, q=2)

    def failing(*_: Any, **__: Any) -> dict[str, Any]:
        raise RuntimeError("row 17 has y = 3.1416")  # a message that would quote data

    monkeypatch.setattr(aggregate.estimation, "run", failing)
    arrays = synthetic(2000, 2, np.random.default_rng(0))
    with pytest.raises(ReleaseFailed) as caught:
        aggregate.run(
            arrays,
            domain,
            chunked_params(AteParams(epsilon=1.0, chunks=2), domain),
            rng=np.random.default_rng(1),
            noise=SeededSampler(np.random.default_rng(2)),
            progress=no_progress,
        )
    assert str(caught.value) == "release failed"
    assert caught.value.__cause__ is None


def test_an_end_to_end_release_aggregates_real_chunk_releases() -> None:
    domain = make_domain(n=2000, q=2)
    arrays = synthetic(2000, 2, np.random.default_rng(5))
    params = AteParams(epsilon=8.0, chunks=2, nuisance="dp_linear")
    out = AteKind().run(
        arrays,
        domain,
        params,
        rng=np.random.default_rng(6),
        noise=SeededSampler(np.random.default_rng(7)),
        progress=no_progress,
    )
    assert len(out["chunk_estimates"]) == 2
    assert out["estimate"] == pytest.approx(float(np.mean(out["chunk_estimates"])))
    assert abs(out["estimate"] - 1.0) < 0.5  # the true effect is 1
    assert out["coverage"]["basis"] == "chunk_spread"
    assert out["interval"] == "t_over_chunks"
    assert not {"theta_hat", "m2_hat", "gamma"} & set(out)


def test_c4_and_the_quoted_width() -> None:
    assert aggregate.c4(4) == pytest.approx(0.9213177, rel=1e-6)
    assert aggregate.c4(2) == pytest.approx(math.sqrt(2 / math.pi), rel=1e-12)
    domain = make_domain(n=8000, q=3)
    params = chunked_params(AteParams(epsilon=1.0, chunks=4), domain)
    single = ate_strict.quote(replace(domain, n=2000), params.chunk)
    quoted = aggregate.quote(domain, params)
    sampling = single["assumed_pseudo_outcome_sd"] / math.sqrt(single["n2"])
    fit_noise = aggregate.CHUNK_FIT_NOISE_FACTOR * sampling  # at epsilon 1
    spread = math.hypot(single["expected_half_width"] / 1.959963984540054, fit_noise)
    assert quoted["assumed_fit_noise_sd"] == pytest.approx(fit_noise)
    assert quoted["assumed_chunk_spread"] == pytest.approx(spread)
    assert quoted["expected_half_width"] == pytest.approx(
        student_t.ppf(0.975, 3) * aggregate.c4(4) * spread / 2.0
    )
    assert quoted["half_width_basis"] == "assumed_chunk_spread"
    assert "min_half_width" not in quoted  # a t interval has no floor
    # the quote costs what the release will: one chunk's (epsilon, delta)
    assert (quoted["epsilon"], quoted["delta"]) == (1.0, 1e-5)


def test_the_chunk_plan_is_the_single_release_plan_at_the_chunk_size() -> None:
    domain = make_domain(n=9000, q=3)
    params = chunked_params(AteParams(epsilon=2.0, chunks=3), domain)
    state = calibration.make_plan(replace(domain, n=3000), params.chunk)
    out = aggregate.quote(domain, params)
    assert out["chunk_s_theta"] == pytest.approx(state.mean.sigma)
    assert out["chunk_fold_sizes"] == dict(state.record.fold_sizes)


def test_an_observational_quote_offers_chunks_where_they_are_narrower_and_measured() -> None:
    study = STUDIES["none"]
    # a single release (chunks = 1, or a request naming a single-release option)
    quoted = AteKind().quote(AteParams(epsilon=1.0, chunks=1), study.domain(5000))
    alternative = quoted["chunks_alternative"]
    assert alternative["chunks"] == 4
    assert alternative["expected_half_width"] < quoted["expected_half_width"]
    chunked = AteKind().quote(AteParams(epsilon=1.0, chunks=4), study.domain(5000))
    assert alternative["expected_half_width"] == pytest.approx(chunked["expected_half_width"])
    assert "chunks = 4" in alternative["message"]
    band = chunked["coverage"]["measured"]
    assert (alternative["coverage_low"], alternative["coverage_high"]) == (
        band["coverage_low"],
        band["coverage_high"],
    )
    # not offered where 4 chunks are too small for their folds, with chunks asked for already,
    # on a trial, or far from where its coverage was measured
    assert "chunks_alternative" not in AteKind().quote(AteParams(epsilon=4.0), study.domain(3000))
    assert "chunks_alternative" not in chunked
    named = AteKind().quote(AteParams(epsilon=1.0, nuisance="dp_linear"), study.domain(5000))
    assert named["chunks_alternative"]["chunks"] == 4
    # the rule's own number at larger n: 8 chunks from 16,000 rows
    large = AteKind().quote(AteParams(epsilon=1.0, chunks=1), study.domain(20_000))
    assert large["chunks_alternative"]["chunks"] == 8
    assert "chunks = 8" in large["chunks_alternative"]["message"]
    # the default in the rule's range is chunked already: nothing to offer
    assert "chunks_alternative" not in AteKind().quote(AteParams(epsilon=1.0), study.domain(5000))
    trial = make_domain(n=8000, design=StudyDesign.RCT, p=0.5)
    assert "chunks_alternative" not in AteKind().quote(AteParams(epsilon=1.0), trial)
    assert "chunks_alternative" not in AteKind().quote(AteParams(epsilon=4.0), study.domain(10**5))


def test_the_chunks_rule_is_public_and_stays_in_its_measured_range() -> None:
    """``default_chunks``: 4 chunks on observational data where n * epsilon is 2,500-20,000 and
    n >= 4,000, 8 from 16,000 rows; none on trials, outside the range or below 4,000 rows."""
    study = STUDIES["none"]
    rule = aggregate.default_chunks
    assert rule(study.domain(5000), 1.0) == 4
    assert rule(study.domain(5000), 0.5) == 4  # n eps 2500, the low end
    assert rule(study.domain(5000), 0.49) is None
    assert rule(study.domain(5000), 4.0) == 4  # n eps 20000, the high end
    assert rule(study.domain(5000), 4.01) is None
    assert rule(study.domain(3999), 1.0) is None
    assert rule(study.domain(4000), 1.0) == 4
    assert rule(study.domain(15_999), 1.0) == 4
    assert rule(study.domain(16_000), 1.0) == 8
    assert rule(study.domain(20_000), 1.0) == 8
    assert rule(study.domain(100_000), 0.1) == 8  # n eps 10^4: chunks of 12,500 rows at eps 0.1
    trial = make_domain(n=8000, design=StudyDesign.RCT, p=0.5)
    assert rule(trial, 1.0) is None


def test_an_epsilon_only_observational_request_in_the_range_is_released_in_chunks() -> None:
    """The kind applies the rule where the request names no single-release option: delta and
    the adjustment set pass through to every chunk; a named option, chunks = 1, paper mode,
    ipw and a trial keep one release."""
    study = STUDIES["none"]
    domain = study.domain(5000)
    default = to_mechanism_params(AteParams(epsilon=1.0), domain)
    assert default == chunked_params(AteParams(epsilon=1.0, chunks=4), domain)
    assert resolved_chunks(AteParams(epsilon=1.0, delta=1e-7), domain) == 4
    columns = AteParams(epsilon=1.0, adjustment_columns=[0, 1, 2])
    assert resolved_chunks(columns, domain) == 4
    assert to_mechanism_params(columns, domain).chunk.adjustment_columns == (0, 1, 2)  # type: ignore[union-attr]
    assert resolved_chunks(AteParams(epsilon=1.0, alpha=0.1), domain) == 4
    for single in (
        AteParams(epsilon=1.0, chunks=1),
        AteParams(epsilon=1.0, nuisance="dp_ebm"),
        AteParams(epsilon=1.0, clip="adaptive"),
        AteParams(epsilon=1.0, cross_fit=True),
        AteParams(epsilon=1.0, propensity_clip=0.2),
        AteParams(epsilon=1.0, fold_fractions=[0.25, 0.25, 0.5]),
        AteParams(epsilon=1.0, outcome_range=True),
    ):
        assert resolved_chunks(single, domain) is None
        assert isinstance(to_mechanism_params(single, domain), AteStrictParams)
    assert isinstance(
        to_mechanism_params(AteParams(epsilon=1.0, estimator="ipw"), domain), AteIpwParams
    )
    trial = make_domain(n=8000, design=StudyDesign.RCT, p=0.5)
    assert isinstance(to_mechanism_params(AteParams(epsilon=1.0), trial), AteRctParams)
    # chunks = 1 changes nothing on a trial: the estimator rule still picks the difference in
    # means, and the quote says the field was unused
    assert isinstance(to_mechanism_params(AteParams(epsilon=1.0, chunks=1), trial), AteRctParams)
    warned = AteKind().quote(AteParams(epsilon=1.0, chunks=1), trial)
    assert "unused on a randomised design: chunks" in warned["warnings"][0]
    # outside the range, one release
    assert resolved_chunks(AteParams(epsilon=0.4), domain) is None
    assert resolved_chunks(AteParams(epsilon=8.0), domain) is None


def test_the_rule_keeps_one_release_where_its_chunks_would_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    domain = STUDIES["none"].domain(3000)
    monkeypatch.setattr(aggregate, "DEFAULT_CHUNKS_MIN_N", 2000)
    assert aggregate.default_chunks(domain, 1.0) == 4  # chunks of 750 rows: too few for 0.1
    assert resolved_chunks(AteParams(epsilon=1.0), domain) is None
    assert isinstance(to_mechanism_params(AteParams(epsilon=1.0), domain), AteStrictParams)


def test_the_chunked_default_quotes_records_and_states_its_coverage() -> None:
    domain = STUDIES["none"].domain(5000)
    kind = AteKind()
    quoted = kind.quote(AteParams(epsilon=1.0), domain)
    assert quoted["half_width_basis"] == "assumed_chunk_spread"
    assert quoted["chunks"] == 4
    coverage = quoted["coverage"]
    assert coverage["basis"] == "chunk_spread"
    assert coverage["measured"]["nuisance"] == "chunks"
    assert (coverage["measured"]["coverage_low"], coverage["measured"]["coverage_high"]) == (
        0.94,
        0.965,
    )
    record = kind.record(AteParams(epsilon=1.0), domain)
    assert record.composition == Composition.CHUNKS
    assert (record.epsilon, record.delta) == (1.0, quoted["delta"])
    # a smaller delta than the chunks' default keeps the measured band; a larger one loses it
    smaller = kind.quote(AteParams(epsilon=1.0, delta=quoted["delta"] / 10), domain)
    assert smaller["coverage"]["measured"] is not None
    larger = kind.quote(AteParams(epsilon=1.0, delta=min(0.5, quoted["delta"] * 10)), domain)
    assert larger["coverage"]["measured"] is None
    # the epsilon search follows the rule at each epsilon
    target = kind.quote(
        AteParams(epsilon=1.0, target_half_width=quoted["expected_half_width"]), domain
    )
    assert target["epsilon_for_target_half_width"] == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("n", [4000, 5000, 16_000, 20_000])
@pytest.mark.parametrize("epsilon", [0.4, 0.5, 1.0, 4.0])
@pytest.mark.parametrize("declared", [False, True])
def test_the_mechanisms_default_release_is_the_kinds_default(
    n: int, epsilon: float, declared: bool
) -> None:
    """``aggregate.default_release`` (what other kinds run as the ate default, uplift_table's
    one-cell table) is exactly what an ``ate`` request of epsilon (and delta) resolves to: the
    chunk preset at the rule's number of chunks where the rule applies, else None."""
    domain = STUDIES["none"].domain(n)
    if declared:
        domain = replace(domain, adjustment_set=(0, 1, 2))
    for delta in (None, 1e-7):
        request = (
            AteParams(epsilon=epsilon) if delta is None else AteParams(epsilon=epsilon, delta=delta)
        )
        kind = to_mechanism_params(request, domain)
        mine = aggregate.default_release(domain, epsilon, delta)
        if isinstance(kind, aggregate.AggregateParams):
            assert mine == kind
        else:
            assert mine is None
