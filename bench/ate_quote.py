"""The observational `ate` quote against the half-widths releases had (issue 12, item 5).

No releases are run: the realised mean half-widths are those committed by the benchmarks that
measured the strict `ate` default on the realistic observational studies
(``results/ate_folds.json``: n 1000-20000, eps 1 and 4, 30 releases per cell, at the folds the
default uses there; ``results/nuisance_lr-large.json``: n 5 * 10^4 and 10^5, eps 1-4, 12
releases per cell, at the learning rates the default uses there). For each cell the current
quote of the same request (public inputs only) gives ``expected_half_width`` (sampling error
at the assumed pseudo-outcome sd R / 6 plus the privacy noise and the DP variance estimate's
noise) and ``min_half_width`` (the noise only); the figures are their ratios to the realised
mean half-width (target: within 25 %).

    python -m bench.ate_quote
    python -m bench.ate_quote --quick     # CI smoke: the same (it only quotes)
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bench.common import RESULTS, write_result
from bench.studies import STUDIES
from service.mechanisms import ate_strict
from service.releases.kinds.ate import AteParams, to_mechanism_params

# the committed measurements of the strict default's half-widths on these studies
SOURCES = ("ate_folds.json", "nuisance_lr-large.json")


def _default_variant(file: str, n: int, epsilon: float) -> str:
    """The variant of ``file`` whose releases are the default's in that cell."""
    if file == "ate_folds.json":
        return (
            "outcome_heavy"
            if n * epsilon >= ate_strict.DP_EBM_OUTCOME_FOLDS_MIN_N_EPSILON
            else "spec"
        )
    return "lr:0.04:0.02"


def cells() -> list[dict[str, Any]]:
    out = []
    for file in SOURCES:
        measured = json.loads((RESULTS / file).read_text())
        for cell in measured["cells"]:
            n, epsilon, het = cell["n"], cell["epsilon"], cell["heterogeneity"]
            realised = cell["rows"][_default_variant(file, n, epsilon)]["mean_half_width"]
            domain = STUDIES[het].domain(n)
            quoted = ate_strict.quote(
                # the DP-EBM default's quote, against that default's committed half-widths
                domain,
                to_mechanism_params(AteParams(epsilon=epsilon, nuisance="dp_ebm"), domain),
            )
            out.append(
                {
                    "n": n,
                    "epsilon": epsilon,
                    "heterogeneity": het,
                    "source": file,
                    "realised_mean_half_width": realised,
                    "expected_half_width": quoted["expected_half_width"],
                    "min_half_width": quoted["min_half_width"],
                    "expected_over_realised": quoted["expected_half_width"] / realised,
                    "noise_only_over_realised": quoted["min_half_width"] / realised,
                }
            )
    return sorted(out, key=lambda c: (c["n"], c["epsilon"], c["heterogeneity"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke (the same run)")
    args = parser.parse_args(argv)
    rows = cells()
    for row in rows:
        print(
            f"n {row['n']:6d} eps {row['epsilon']:g} {row['heterogeneity']:6s} "
            f"realised {row['realised_mean_half_width']:.3f} "
            f"expected/realised {row['expected_over_realised']:.2f} "
            f"noise-only/realised {row['noise_only_over_realised']:.2f}"
        )
    ratios = [row["expected_over_realised"] for row in rows]
    noise = [row["noise_only_over_realised"] for row in rows]
    summary = {
        "expected_over_realised": [min(ratios), max(ratios)],
        "noise_only_over_realised": [min(noise), max(noise)],
        "within_25_percent": sum(0.75 <= r <= 1.25 for r in ratios),
        "cells": len(rows),
    }
    print(summary)
    write_result(
        "ate_quote", {"cells": rows, "summary": summary}, quick=args.quick, module="bench.ate_quote"
    )


if __name__ == "__main__":
    main()
