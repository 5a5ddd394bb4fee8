"""What an ATE confidence interval covers: stated with every ATE quote and release (public).

Every ATE interval covers the sampling error of the rows it averages and the privacy noise
added to the estimate. What it does **not** always cover is the error left by nuisance models
fitted under privacy noise:

* In a **randomised design** the strict AIPW uses the declared assignment probability, so its
  pseudo-outcome has mean equal to the ATE whatever the (DP) outcome model: the outcome model
  only changes the variance, which the interval estimates. ``rct_difference`` has no model.
  There the nominal level is the design's.
* In an **observational design** (and for ``ipw`` in any design) the estimate is unbiased only
  when the DP propensity / outcome models remove the confounding. Fitted on part of the rows
  under privacy noise, with public regularisation, they leave part of it, and the interval,
  which treats the fitted models as fixed, is then too narrow and centred off the true effect.
  bench/README.md ("The observational default's nuisances by n*eps", "Which DP nuisance carries
  the observational bias") measures how often on the realistic studies (36 covariates), per
  default preset: ``dp_linear`` (below n * epsilon = 2 * 10^4) covered 0.855-0.99 (200 releases
  per cell, n * epsilon 500-10^4) and 0.70-0.80 at 1.5 * 10^4 (40 per cell): its shrinkage
  leaves most of the confounding, hidden inside a wide interval; DP-EBM (from there)
  0.725-0.845 at n 5000-20000 (200 releases per cell; bench/results/realistic-obs-200-*.json) and
  0.67-0.88 at n 5 * 10^4 - 10^5 (24 per cell; nuisance_quantile_bins.json), where the interval
  is narrow.

Pure: reads the public design and request fields only.
"""

from __future__ import annotations

from typing import Any

from service.mechanisms.domain import PublicDomain, StudyDesign

DESIGN = "design"
NUISANCE_MODELS = "nuisance_models"

_DESIGN_MESSAGE = (
    "Randomised design with the declared assignment probability: the interval covers the "
    "sampling error and the privacy noise, whatever the outcome model."
)
_NUISANCE_MESSAGE = (
    "The interval covers the sampling error and the privacy noise of the estimate, not the "
    "error left by the DP propensity and outcome models: it assumes they remove the "
    "confounding. Fitted under privacy noise on part of the rows, they often leave some, and "
    "then the interval is too narrow and off-centre. Read it as a lower bound on the "
    "uncertainty (docs/guide-analyst.md, 'What the interval covers')."
)
# What the realistic studies measured for each observational default preset (bench/README.md).
_MEASURED = {
    "dp_linear": (
        " On simulated clinical studies with 36 covariates the default 95 % interval with DP "
        "linear models (the default below n * epsilon = 20,000) covered the true effect in "
        "86-99 % of releases up to n * epsilon = 10,000 (200 per cell) and in 70-80 % at "
        "15,000 (40 per cell): the models' shrinkage leaves most of the confounding, which "
        "the interval hides only while it is wide."
    ),
    "dp_ebm": (
        " On simulated clinical studies with 36 covariates the default 95 % interval with "
        "DP-EBM models (the default from n * epsilon = 20,000) covered the true effect in "
        "73-85 % of releases at n = 5,000-20,000 (200 per cell) and in 67-88 % at "
        "n = 50,000-100,000 (24 per cell), where it is narrowest."
    ),
}


def ate_coverage(
    domain: PublicDomain, *, mode: str, estimator: str, nuisance: str | None = None
) -> dict[str, Any]:
    """The ``coverage`` block of an ATE quote or release.

    ``basis`` is ``"design"`` where the nominal level rests on the randomisation alone (strict
    ``aipw`` or ``rct_difference`` on an RCT), else ``"nuisance_models"``;
    ``nuisance_error_covered`` says whether the interval accounts for the nuisance models'
    error; ``message`` says it in words, with the coverage measured for the strict ``aipw``
    release's resolved ``nuisance`` preset where there is a figure for it.
    """
    randomised = domain.design == StudyDesign.RCT
    by_design = randomised and mode == "strict" and estimator in ("aipw", "rct_difference")
    message = _DESIGN_MESSAGE
    if not by_design:
        measured = (
            _MEASURED.get(nuisance or "") if (mode, estimator) == ("strict", "aipw") else None
        )
        message = _NUISANCE_MESSAGE + (measured or "")
    return {
        "basis": DESIGN if by_design else NUISANCE_MODELS,
        "nuisance_error_covered": by_design,
        "message": message,
    }
