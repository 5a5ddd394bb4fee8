"""Success or failure of a charged DP-EBM release must not depend on the data (issue 13.5).

interpret's warnings used to be promoted to errors, so any warning the data could trigger
would have failed a release after its charge: a one-bit side channel. Now only interpret's
privacy warnings (set by configuration: data-derived bounds, feature types, a fixed seed) and a
fitted noise scale below the plan are fatal; other warnings are ignored, and a first-stage
nuisance whose fit fails falls back to the public constant. The adversarial datasets below
(constant columns, one row at a bound, a single arm) must all give a successful release.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from service.mechanisms import dp_ebm
from service.mechanisms.domain import Arrays, PublicDomain, StudyDesign
from service.mechanisms.noise import OpenDPSampler
from service.releases.kinds import REGISTRY

N = 400


def test_guard_ignores_ordinary_warnings_and_raises_on_privacy_warnings() -> None:
    with dp_ebm.interpret_guard():
        warnings.warn("Missing values detected.", UserWarning, stacklevel=1)
        warnings.warn("overflow encountered in exp", RuntimeWarning, stacklevel=1)
    for message in (
        "Possible privacy violation: assuming min/max values per feature are public info.",
        "Privacy violation: using a fixed random_state of 1 will cause deterministic noise.",
    ):
        with pytest.raises(dp_ebm.PrivacyConfigurationError), dp_ebm.interpret_guard():
            warnings.warn(message, UserWarning, stacklevel=1)
    # the filter is scoped: outside the guard, warnings behave as configured by the caller
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("outside", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["outside"]


def _accounting() -> dp_ebm.DpEbmAccounting:
    return dp_ebm.solve_dp_ebm_epsilon_p(1.0, 1e-6)


def test_a_data_triggered_warning_inside_a_fit_does_not_fail_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from interpret.privacy import DPExplainableBoostingRegressor

    original = DPExplainableBoostingRegressor.fit

    def noisy_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        warnings.warn("Missing values detected.", UserWarning, stacklevel=1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DPExplainableBoostingRegressor, "fit", noisy_fit)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(N, 2))
    model, midpoint = dp_ebm.fit_regressor(
        x, x[:, 0] * 4.0, np.zeros(2), np.ones(2), 0.0, 4.0, _accounting()
    )
    assert midpoint == 2.0
    assert np.all(np.isfinite(model.predict(x)))


def test_a_privacy_warning_inside_a_fit_is_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    from interpret.privacy import DPExplainableBoostingRegressor

    original = DPExplainableBoostingRegressor.fit

    def leaky_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        warnings.warn("Possible privacy violation: assuming min/max ...", UserWarning, stacklevel=1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DPExplainableBoostingRegressor, "fit", leaky_fit)
    x = np.random.default_rng(1).uniform(size=(N, 2))
    with pytest.raises(dp_ebm.PrivacyConfigurationError):
        dp_ebm.fit_regressor(x, x[:, 0], np.zeros(2), np.ones(2), 0.0, 1.0, _accounting())
    # ... and the nuisance helpers do not swallow it into their fallback
    with pytest.raises(dp_ebm.PrivacyConfigurationError):
        dp_ebm.outcome_predictions(
            x, np.ones(N), x[:, 0], x, np.zeros(2), np.ones(2), 0.0, 1.0, _accounting()
        )


def test_failed_nuisance_fits_fall_back_to_the_public_constants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise FloatingPointError("a data-dependent numerical failure")

    monkeypatch.setattr(dp_ebm, "fit_classifier", broken)
    monkeypatch.setattr(dp_ebm, "fit_regressor", broken)
    x = np.random.default_rng(2).uniform(size=(50, 2))
    pi = dp_ebm.propensity_scores(
        x, np.ones(50), x[:10], np.zeros(2), np.ones(2), _accounting(), clip=0.05
    )
    assert np.array_equal(pi, np.full(10, 0.5))
    mu0, mu1 = dp_ebm.outcome_predictions(
        x, np.ones(50), x[:, 0], x[:10], np.zeros(2), np.ones(2), -1.0, 3.0, _accounting()
    )
    assert np.array_equal(mu0, np.full(10, 1.0))
    assert np.array_equal(mu1, np.full(10, 1.0))


def _domain() -> PublicDomain:
    return PublicDomain(
        x_lower=np.zeros(3),
        x_upper=np.ones(3),
        y_lower=0.0,
        y_upper=10.0,
        n=N,
        design=StudyDesign.OBSERVATIONAL,
        treatment_probability=None,
    )


def _adversarial() -> dict[str, Arrays]:
    rng = np.random.default_rng(3)
    x = rng.uniform(size=(N, 3))
    a = (rng.uniform(size=N) < 0.4).astype(np.float64)
    y = np.clip(3.0 + a + rng.gamma(1.5, 1.0, N), 0.0, 10.0)
    single = np.zeros((N, 3))
    single[0] = 1.0
    return {
        "constant columns": Arrays(x=np.full((N, 3), 0.5), a=a, y=y),
        "constant outcome": Arrays(x=x, a=a, y=np.full(N, 4.0)),
        "one row at the bounds": Arrays(
            x=single, a=np.r_[1.0, np.zeros(N - 1)], y=np.r_[10.0, np.zeros(N - 1)]
        ),
        "all treated": Arrays(x=x, a=np.ones(N), y=y),
        "none treated": Arrays(x=x, a=np.zeros(N), y=y),
    }


KINDS = [
    ("ate", {"epsilon": 1.0, "nuisance": "dp_ebm"}),  # DP-EBM nuisances
    ("ate", {"epsilon": 1.0}),  # the observational default at this n epsilon: dp_linear
    ("ebm_cate", {"epsilon": 1.0}),
    ("ebm_cate", {"epsilon": 1.0, "learner": "dr"}),
    ("cate_function", {"epsilon": 1.0, "basis": "nystrom", "n_centres": 16}),
    ("cate_vector", {"epsilon": 1.0, "points": [[0.5, 0.5, 0.5]], "shrinkage": "none"}),
]


@pytest.mark.parametrize(
    ("kind", "params"), KINDS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(KINDS)]
)
def test_adversarial_datasets_give_a_successful_release(kind: str, params: dict[str, Any]) -> None:
    release_kind = REGISTRY[kind]
    request = release_kind.Params.model_validate(params)
    for name, arrays in _adversarial().items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning escaping the guard would fail here too
            result = release_kind.run(
                arrays,
                _domain(),
                request,
                rng=np.random.default_rng(4),
                noise=OpenDPSampler(),
                progress=lambda fraction, stage: None,
            )
        assert result["guarantee"] == "strict", name
