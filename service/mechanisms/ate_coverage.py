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
  bench/README.md ("Coverage of observational intervals", "Which DP nuisance carries the
  observational bias") measures how often: on the realistic studies (36 covariates) the strict
  default covered 0.56-0.97 at n 5000-20000 and n * epsilon >= 2 * 10^4 (12-30 releases per
  cell; bench/results/ate_folds.json, nuisance_oracle.json) and 0.71-0.88 at n 5 * 10^4 - 10^5,
  eps 0.5-4, with the faster DP-EBM learning rates from n * epsilon = 10^5 and the DP quantile
  bins (24 releases per cell; nuisance_quantile_bins.json; 0.42-0.92 without the bins, 0.08-0.83
  before the rates), where the interval is narrow.

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
    "then the interval is too narrow and off-centre; on simulated clinical studies with 36 "
    "covariates the default 95 % interval covered the true effect in 56-97 % of releases "
    "at n = 5,000-20,000 with n * epsilon >= 20,000, and in 71-88 % at n = 50,000-100,000, "
    "where it is narrowest. Read it as a lower bound on the uncertainty "
    "(docs/guide-analyst.md, 'What the interval covers')."
)


def ate_coverage(domain: PublicDomain, *, mode: str, estimator: str) -> dict[str, Any]:
    """The ``coverage`` block of an ATE quote or release.

    ``basis`` is ``"design"`` where the nominal level rests on the randomisation alone (strict
    ``aipw`` or ``rct_difference`` on an RCT), else ``"nuisance_models"``;
    ``nuisance_error_covered`` says whether the interval accounts for the nuisance models'
    error; ``message`` says it in words.
    """
    randomised = domain.design == StudyDesign.RCT
    by_design = randomised and mode == "strict" and estimator in ("aipw", "rct_difference")
    return {
        "basis": DESIGN if by_design else NUISANCE_MODELS,
        "nuisance_error_covered": by_design,
        "message": _DESIGN_MESSAGE if by_design else _NUISANCE_MESSAGE,
    }
