"""End to end: every noise draw of a strict release matches a planned noise event (issue 13.11).

Each strict kind whose noise goes through the service's ``NoiseSampler`` is run through its
real adapter (``REGISTRY[kind].run``) with a recording sampler that wraps the production
``OpenDPSampler``. Every draw must match one event of the release's mechanism record, which is
what the ledger charged: a Gaussian at exactly the event's sigma and L2 sensitivity with the
event's dimension, a Laplace at exactly its scale and L1 sensitivity, a quantile at its epsilon,
a noisy top-k (ebm_cate's effect-modifier screen) at its k, scale, L-infinity sensitivity and
epsilon; and every such event must be drawn. So a code path that halves a noise scale after planning
(in ``noise.release_gaussian``, a mechanism's own call, or a sensitivity passed at run time)
draws at a scale no event has, and this test turns red.

``cate_function``'s finite bases draw unit normals through ``NoiseSampler.standard_normal``;
their coefficient noise must be exactly ``r0`` times the public transform of those normals, with
``r0`` recomputed from the proof's formula (``test_cate_function_finite_basis_noise``). Its GP
noise, drawn at evaluation, is checked the same way through HTTP in
``tests/api/test_functions.py``. Not covered here: DP-EBM's noise (drawn inside interpret; its
accounting is audited in ``test_ebm_cate_audit``); ``ebm_cate``'s anchor and calibration sums
(shrinkage "ate") go through the sampler and are covered, and so does ``cate_function``'s
whole-data anchor (the strict ``ate`` default, its events prefixed ``anchor/``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.noise import OpenDPSampler, calibrate_gaussian
from service.mechanisms.records import MechanismRecord, NoiseEvent
from service.releases.kinds import REGISTRY

N = 2000


class RecordingSampler:
    """The production sampler, recording each draw's public arguments."""

    def __init__(self) -> None:
        self.inner = OpenDPSampler()
        self.draws: list[dict[str, Any]] = []

    def gaussian(
        self, values: NDArray[np.float64], *, sigma: float, sensitivity_l2: float
    ) -> NDArray[np.float64]:
        self.draws.append(
            {"type": "gaussian", "scale": sigma, "sensitivity": sensitivity_l2, "dim": values.size}
        )
        return self.inner.gaussian(values, sigma=sigma, sensitivity_l2=sensitivity_l2)

    def laplace(
        self, values: NDArray[np.float64], *, scale: float, sensitivity_l1: float
    ) -> NDArray[np.float64]:
        self.draws.append(
            {"type": "laplace", "scale": scale, "sensitivity": sensitivity_l1, "dim": values.size}
        )
        return self.inner.laplace(values, scale=scale, sensitivity_l1=sensitivity_l1)

    def quantile(
        self,
        values: NDArray[np.float64],
        *,
        candidates: NDArray[np.float64],
        level: float,
        epsilon: float,
    ) -> float:
        value = self.inner.quantile(values, candidates=candidates, level=level, epsilon=epsilon)
        self.draws.append({"type": "exponential_quantile", "epsilon": epsilon, "value": value})
        return value

    def standard_normal(self, size: int) -> NDArray[np.float64]:
        self.draws.append({"type": "standard_normal", "dim": size})
        return self.inner.standard_normal(size)

    def top_k(
        self,
        scores: NDArray[np.float64],
        *,
        k: int,
        scale: float,
        sensitivity_linf: float,
        epsilon: float,
    ) -> tuple[int, ...]:
        chosen = self.inner.top_k(
            scores, k=k, scale=scale, sensitivity_linf=sensitivity_linf, epsilon=epsilon
        )
        self.draws.append(
            {
                "type": "noisy_top_k",
                "scale": scale,
                "sensitivity": sensitivity_linf,
                "epsilon": epsilon,
                "dim": k,
                "candidates": int(np.size(scores)),
                "chosen": chosen,
            }
        )
        return chosen


def _domain(design: StudyDesign) -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(3),
        x_upper=np.ones(3),
        y_lower=0.0,
        y_upper=10.0,
        n=N,
        design=design,
        treatment_probability=0.5 if design == StudyDesign.RCT else None,
    )


def _arrays(design: StudyDesign) -> Arrays:
    rng = np.random.default_rng(17)
    x = rng.uniform(0.0, 1.0, size=(N, 3))
    p = 0.5 if design == StudyDesign.RCT else 1.0 / (1.0 + np.exp(-(x[:, 0] - 0.5) * 2.0))
    a = (rng.uniform(size=N) < p).astype(np.float64)
    y = np.clip(2.0 + 2.0 * x[:, 1] + a * (1.0 + x[:, 2]) + rng.gamma(1.5, 0.8, size=N), 0, 10)
    return Arrays(x=x, a=a, y=y)


def _matches(draw: dict[str, Any], event: NoiseEvent) -> bool:
    params = event.params
    if draw["type"] != event.type:
        return False
    if draw["type"] == "exponential_quantile":
        return bool(draw["epsilon"] == event.epsilon)
    if draw["type"] == "noisy_top_k":
        return bool(
            draw["epsilon"] == event.epsilon
            and draw["scale"] == params["scale"]
            and draw["sensitivity"] == params["sensitivity_linf"]
            and draw["dim"] == params["k"]
        )
    if draw["type"] == "gaussian" and params.get("bound") == "adaptive":
        # the scale follows the released clip K (ate_strict proof §13): the draw must be the
        # event's own calibration at the draw's sensitivity, and at most the planned maximum
        expected = calibrate_gaussian(event.epsilon, event.delta, draw["sensitivity"])
        return bool(
            draw["scale"] == expected.sigma
            and draw["scale"] <= float(params["sigma_max"])
            and draw["dim"] == 1
        )
    if draw["type"] == "gaussian":
        scale, sensitivity = params.get("sigma"), params.get("sensitivity_l2")
    else:
        scale, sensitivity = params.get("scale"), params.get("sensitivity_l1")
    dim = int(params.get("dim", 1))
    return bool(
        draw["scale"] == scale and draw["sensitivity"] == sensitivity and draw["dim"] == dim
    )


SAMPLER_EVENT_TYPES = ("gaussian", "laplace", "exponential_quantile", "noisy_top_k")

CASES = [
    ("ate", {"epsilon": 1.0, "nuisance": "dp_linear"}, StudyDesign.OBSERVATIONAL),
    ("ate", {"epsilon": 4.0, "nuisance": "dp_linear"}, StudyDesign.OBSERVATIONAL),  # cross-fit
    ("ate", {"epsilon": 1.0, "estimator": "ipw"}, StudyDesign.OBSERVATIONAL),
    ("ate", {"epsilon": 1.0, "estimator": "rct_difference"}, StudyDesign.RCT),
    ("ate", {"epsilon": 1.0, "nuisance": "none", "clip": "declared"}, StudyDesign.RCT),
    ("ate", {"epsilon": 1.0}, StudyDesign.RCT),  # adaptive clipping (the RCT default)
    ("uplift_table", {"epsilon": 1.0}, StudyDesign.RCT),
    # shrinkage "ate" with >= 2 cells: the arms' second moments (proof step 5)
    ("uplift_table", {"epsilon": 1.0, "bins": [2, 2, 1]}, StudyDesign.RCT),
    # one cell, observational: the strict ATE default's draws (uplift_table.md step 6)
    ("uplift_table", {"epsilon": 1.0, "bins": [1, 1, 1]}, StudyDesign.OBSERVATIONAL),
    # the ebm estimator: the ebm_cate default's draws, then the table (uplift_table.md step 7)
    ("uplift_table", {"epsilon": 4.0, "effect_columns": [0, 2]}, StudyDesign.OBSERVATIONAL),
    ("uplift_table", {"epsilon": 4.0, "effect_columns": [1]}, StudyDesign.RCT),
    # the DR default's anchor (quantile, mean) and calibration sums (proof step 6); in an RCT
    # the anchor is the strict ATE release (ridge, quantile, mean, second moment; step 6.1),
    # split (n eps <= 10^4) and cross-fitted
    ("ebm_cate", {"epsilon": 1.0}, StudyDesign.OBSERVATIONAL),
    ("ebm_cate", {"epsilon": 2.0}, StudyDesign.RCT),
    ("ebm_cate", {"epsilon": 8.0}, StudyDesign.RCT),
    # a given anchor (proof step 6.5): no anchor is drawn, in either design; the calibration
    # sums at the effect fold's whole budget
    ("ebm_cate", {"epsilon": 1.0, "anchor": 0.5}, StudyDesign.OBSERVATIONAL),
    ("ebm_cate", {"epsilon": 2.0, "anchor": 0.5}, StudyDesign.RCT),
    (
        "cate_vector",
        {"epsilon": 1.0, "points": [[0.2, 0.5, 0.8], [0.9, 0.1, 0.4]]},
        StudyDesign.RCT,
    ),
    (
        "cate_vector",
        {"epsilon": 1.0, "points": [[0.2, 0.5, 0.8]], "shrinkage": "none", "learner": "dr"},
        StudyDesign.OBSERVATIONAL,
    ),
    # n eps / q >= 1500: the estimator rule runs the ebm_cate default (cate_vector.md §9): the
    # draws are ebm_cate's (its anchor and calibration sums; interpret draws the DP-EBMs')
    ("cate_vector", {"epsilon": 4.0, "points": [[0.2, 0.5, 0.8]]}, StudyDesign.OBSERVATIONAL),
    ("cate_vector", {"epsilon": 4.0, "points": [[0.2, 0.5, 0.8]]}, StudyDesign.RCT),
    # the anchored default: the whole-data anchor is the strict ate default (proof §7); the
    # function's own unit normals are audited by test_cate_function_finite_basis_noise
    ("cate_function", {"epsilon": 2.0, "basis": "nystrom", "n_centres": 32}, StudyDesign.RCT),
    (
        "cate_function",
        {"epsilon": 2.0, "basis": "nystrom", "n_centres": 32},
        StudyDesign.OBSERVATIONAL,
    ),
    # n eps / q >= 1500: the basis rule's "ebm" runs the ebm_cate default (cate_function.md §9)
    ("cate_function", {"epsilon": 4.0}, StudyDesign.OBSERVATIONAL),
    ("cate_function", {"epsilon": 4.0}, StudyDesign.RCT),
    ("cate_function", {"epsilon": 4.0, "basis": "ebm", "anchor": 0.5}, StudyDesign.OBSERVATIONAL),
]


@pytest.mark.parametrize(("kind", "params", "design"), CASES)
def test_every_draw_is_a_planned_event_and_every_event_is_drawn(
    kind: str, params: dict[str, Any], design: StudyDesign
) -> None:
    _check_draws(kind, params, _domain(design), _arrays(design))


def _check_draws(kind: str, params: dict[str, Any], domain: PublicDomain, arrays: Arrays) -> None:
    release_kind = REGISTRY[kind]
    request = release_kind.Params.model_validate(params)
    record: MechanismRecord = release_kind.record(request, domain)
    sampler = RecordingSampler()
    release_kind.run(
        arrays,
        domain,
        request,
        rng=np.random.default_rng(3),
        noise=sampler,
        progress=lambda fraction, stage: None,
    )
    planned = [e for e in record.events if e.type in SAMPLER_EVENT_TYPES]
    assert planned, "this case has no sampler-drawn events to check"
    assert sampler.draws, "the release drew no noise through the sampler"
    for draw in sampler.draws:
        if kind == "cate_function" and draw["type"] == "standard_normal":
            continue  # the basis coefficients' normals (test_cate_function_finite_basis_noise)
        assert any(_matches(draw, event) for event in planned), (kind, params, draw)
    for event in planned:
        drawn = [d for d in sampler.draws if _matches(d, event)]
        # events at the same public scale share their draws: the two DP-EBM modules' covariate
        # histograms (ate_strict proof §14) are planned alike, so each matches both draws
        twins = [e for e in planned if all(_matches(d, e) for d in drawn)] if drawn else [event]
        expected = sum(int(e.params.get("parallel_folds", 1)) for e in twins)
        assert len(drawn) == expected, (kind, params, event.params.get("statistic"))


WIDE = 12  # more covariates than ebm_cate's effect-modifier screen keeps (proof step 9)


@pytest.mark.parametrize(
    ("kind", "params", "design"),
    [
        ("ebm_cate", {"epsilon": 2.0}, StudyDesign.OBSERVATIONAL),
        ("ebm_cate", {"epsilon": 4.0}, StudyDesign.RCT),
        # n eps / q >= 1500: the estimator rule runs the screened ebm_cate default
        # (a point takes a categorical covariate's codes: 1 for the ten 0/1 columns)
        (
            "cate_vector",
            {"epsilon": 8.0, "points": [[1.0] * (WIDE - 2) + [0.5, 0.5]]},
            StudyDesign.OBSERVATIONAL,
        ),
    ],
)
def test_the_effect_screens_draws_are_planned(
    kind: str, params: dict[str, Any], design: StudyDesign
) -> None:
    """The screen's histograms (two continuous covariates) and its top-k on a schema wide
    enough to run it: every draw planned, every planned event drawn."""
    domain = PublicDomain(
        x_lower=np.zeros(WIDE),
        x_upper=np.ones(WIDE),
        y_lower=0.0,
        y_upper=10.0,
        n=N,
        design=design,
        treatment_probability=0.5 if design == StudyDesign.RCT else None,
        x_codes=tuple([(0, 1)] * (WIDE - 2) + [None, None]),
    )
    rng = np.random.default_rng(19)
    x = np.column_stack(
        [rng.binomial(1, 0.5, (N, WIDE - 2)), rng.uniform(0.0, 1.0, (N, 2))]
    ).astype(np.float64)
    a = rng.binomial(1, 0.5, N).astype(np.float64)
    y = np.clip(2.0 + 2.0 * x[:, 1] + a * (1.0 + x[:, -1]) + rng.gamma(1.5, 0.8, N), 0, 10)
    record = REGISTRY[kind].record(REGISTRY[kind].Params.model_validate(params), domain)
    assert "noisy_top_k" in [e.type for e in record.events]
    _check_draws(kind, params, domain, Arrays(x=x, a=a, y=y))


def test_a_halved_scale_is_caught() -> None:
    """The matcher itself: a draw at half an event's sigma matches no event."""
    domain = _domain(StudyDesign.OBSERVATIONAL)
    release_kind = REGISTRY["ate"]
    record = release_kind.record(
        release_kind.Params.model_validate({"epsilon": 1.0, "nuisance": "dp_linear"}), domain
    )
    event = next(e for e in record.events if e.type == "gaussian")
    good = {
        "type": "gaussian",
        "scale": event.params["sigma"],
        "sensitivity": event.params["sensitivity_l2"],
        "dim": int(event.params.get("dim", 1)),
    }
    assert _matches(good, event)
    assert not _matches({**good, "scale": float(good["scale"]) / 2}, event)


class _KnownNormals(RecordingSampler):
    """Unit normals chosen by the test (``scale`` times a fixed vector), recorded."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def standard_normal(self, size: int) -> NDArray[np.float64]:
        self.draws.append({"type": "standard_normal", "dim": size})
        return self.scale * np.cos(np.arange(size, dtype=np.float64))


@pytest.mark.parametrize("basis", ["nystrom", "rff"])
def test_cate_function_finite_basis_noise(basis: str) -> None:
    """The released coefficients are the noiseless fit plus ``r0 xi`` (RFF) or ``r0 L_c^{-T} xi``
    (Nystrom) for the sampler's normals ``xi``, with ``r0 = Delta sigma_G`` recomputed here from
    docs/proofs/cate_function.md; so halving r0 or drawing the normals elsewhere turns it red."""
    from service.functions.payload import SECRET_KEY
    from service.mechanisms import gp
    from service.mechanisms.calibration import analytic_gaussian_multiplier
    from service.mechanisms.cate_function import NYSTROM_JITTER

    domain = _domain(StudyDesign.RCT)
    kind = REGISTRY["cate_function"]
    request = kind.Params.model_validate(
        {
            "epsilon": 1.0,
            "nuisance": "none",
            "basis": basis,
            "learner": "r",
            "n_centres": 32,
            "n_features": 32,
            "shrinkage": "none",
        }
    )
    fitted = []
    samplers = [_KnownNormals(0.0), _KnownNormals(1.0)]
    for sampler in samplers:
        out = kind.run(
            _arrays(StudyDesign.RCT),
            domain,
            request,
            rng=np.random.default_rng(3),  # the same partition and frequencies in both runs
            noise=sampler,
            progress=lambda fraction, stage: None,
        )
        fitted.append(out[SECRET_KEY].fitted)
    assert [d["type"] for d in samplers[1].draws] == ["standard_normal"]
    size = samplers[1].draws[0]["dim"]
    xi = np.cos(np.arange(size, dtype=np.float64))
    lam, n2 = float(out["lambda0"]), int(out["n2"])
    outcome_range = domain.y_upper - domain.y_lower
    sensitivity = 2.0 * (outcome_range + outcome_range / np.sqrt(lam)) / (lam * n2)
    r0 = sensitivity * analytic_gaussian_multiplier(1.0, float(out["delta"]))
    assert fitted[1].r0 == pytest.approx(r0, rel=1e-12)
    noise = fitted[1].coef - fitted[0].coef
    if basis == "rff":
        assert size == 2 * 32
        expected = r0 * xi
    else:
        # eta ~ N(0, M^{-1}) with M the public centre Gram (plus its public jitter): L_c^{-T} xi
        centres = fitted[1].support
        metric = gp.gaussian_kernel(centres, centres, fitted[1].bandwidth)
        metric += NYSTROM_JITTER * np.eye(centres.shape[0])
        factor = np.linalg.cholesky(metric)
        expected = r0 * np.linalg.solve(factor.T, xi)
    assert np.allclose(noise, expected, rtol=1e-9, atol=1e-12)


ADAPTIVE_CASES = [
    # aipw named: a trial's omitted estimator is the difference in means at this n eps
    ("ate", {"epsilon": 1.0, "estimator": "aipw"}, "mean_pseudo_outcome", StudyDesign.RCT),
    # (the whole-data anchors of cate_vector and cate_function are the ate default: on trials
    # below n eps = 5 * 10^4 the difference in means, whose Laplace draws the planned-event
    # tests here match, and on observational designs the declared clip; the adaptive mean
    # they run above that size is ate_strict's, the case above)
    # ebm_cate's observational anchor: the effect fold's adaptive mean (ebm_cate.md step 6.1)
    ("ebm_cate", {"epsilon": 1.0}, "anchor_ate_mean", StudyDesign.OBSERVATIONAL),
]


@pytest.mark.parametrize(("kind", "params", "statistic", "design"), ADAPTIVE_CASES)
def test_adaptive_draws_are_calibrated_at_the_released_clip(
    kind: str, params: dict[str, Any], statistic: str, design: StudyDesign
) -> None:
    """Adaptive clipping (ate_strict proof §13): the clip is K = min(B, (2 + 0.5 log10 n2) Q) for
    the DP quantile Q, and the mean's Gaussian is calibrated at sensitivity 2K / n2 (the second
    moment's at K^2 / n2), recomputed here from the recorded quantile, so a halved sensitivity
    after the quantile turns this red even though the sigma follows it."""
    domain = _domain(design)
    release_kind = REGISTRY[kind]
    request = release_kind.Params.model_validate(params)
    record = release_kind.record(request, domain)
    quote = release_kind.quote(request, domain)
    sampler = RecordingSampler()
    result = release_kind.run(
        _arrays(design),
        domain,
        request,
        rng=np.random.default_rng(5),
        noise=sampler,
        progress=lambda fraction, stage: None,
    )
    if quote.get("anchor_release"):  # a whole-data anchor: the ate default's own quote
        ate = REGISTRY["ate"]
        anchor = quote["anchor_release"]
        quote = ate.quote(
            ate.Params.model_validate({"epsilon": anchor["epsilon"], "delta": anchor["delta"]}),
            domain,
        )
    if "n2" in quote:
        n2 = int(quote["n2"])
    elif "anchor_rows" in quote:  # ebm_cate: the rows of the anchor's mean
        n2 = int(quote["anchor_rows"])
    else:
        n2 = int(quote["fold_sizes"]["estimation"])
    event = next(e for e in record.events if e.params.get("statistic") == statistic)
    quantile_at = next(
        i for i, d in enumerate(sampler.draws) if d["type"] == "exponential_quantile"
    )
    q = float(sampler.draws[quantile_at]["value"])
    bound_max = float(quote.get("bound_max") or 0.0) or float(event.params["bound_max"])
    clip = min(bound_max, (2.0 + 0.5 * math.log10(n2)) * q)
    if kind == "ate":
        assert result["bound"] == pytest.approx(clip, rel=1e-12)  # the released K
    mean_draw, *rest = sampler.draws[quantile_at + 1 :]
    assert mean_draw["sensitivity"] == pytest.approx(2.0 * clip / n2, rel=1e-6)
    assert mean_draw["sensitivity"] >= 2.0 * clip / n2
    assert (
        mean_draw["scale"]
        == calibrate_gaussian(event.epsilon, event.delta, mean_draw["sensitivity"]).sigma
    )
    if kind == "ate":
        second = rest[0]
        assert second["sensitivity"] == pytest.approx(clip * clip / n2, rel=1e-6)
        assert second["sensitivity"] >= clip * clip / n2
