"""The average treatment effect of a randomised trial (examples/data/trial.csv), end to end.

    python examples/ate_rct.py [--url http://127.0.0.1:8000] [--admin-key KEY] [--quick]

The owner uploads the trial with its public schema (design "rct", assignment probability 0.5),
sets a budget and grants the analyst a capped share. The analyst compares quotes, then releases
the ATE at the trial defaults: at this n * epsilon the service picks the DP difference in
means (``rct_difference``: all of n, pure epsilon, valid by the randomisation alone); the
full run adds the ``aipw`` estimator with a DP-EBM outcome model for comparison. Then the
analyst releases an uplift table (epsilon-ADUM) on a public grid over severity, to see how the
effect varies, and scores new patients against it by free lookups. The owner audits the
ledger. The trial is synthetic with a true ATE of 1.0 and a true effect of 0.5 + severity
(examples/data/README.md).
"""

# ruff: noqa: T201  (examples report to the terminal)
from __future__ import annotations

from _common import DATA, arguments, plots_available, progress, roles

from dpcurator import AteResult, UpliftTable
from dpcurator.plots import plot_ate, plot_budget_spend


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    people = roles(args.url, args.admin_key, "RCT")
    owner, analyst = people.owner, people.analyst

    # Owner: upload with the public schema, budget, grant.
    dataset = owner.upload_dataset(
        "Trial 2026", DATA / "trial.csv", DATA / "schema.json", description="synthetic RCT"
    )
    print(f"uploaded {dataset.id}: n = {dataset.n} (ingest report shown to the owner only)")
    owner.set_budget(dataset.id, epsilon_total=3.0, delta_total=1e-4)
    owner.grant(dataset.id, people.analyst_id, epsilon_cap=2.5)

    # Analyst: quotes are free and read no data.
    designs = [("the trial default", {"epsilon": 0.5})]
    if not args.quick:
        designs.append(("aipw, DP-EBM outcome model", {"epsilon": 1.0, "nuisance": "dp_ebm"}))
    for label, params in designs:
        quote = analyst.quote(dataset.id, "ate", params)
        print(
            f"quote [{label}]: epsilon {quote.epsilon:g}, delta {quote.delta:g}, "
            f"expected CI half-width {quote.accuracy['expected_half_width']:.3f}, "
            f"fits: {quote.fits_budget}"
        )

    results: list[AteResult] = []
    for label, params in designs:
        print(f"release [{label}]:")
        release = analyst.release(dataset.id, "ate", params, on_progress=progress)
        ate = analyst.result(release)
        assert isinstance(ate, AteResult)
        results.append(ate)
        print(
            f"  ATE = {ate.estimate:.3f}, {ate.ci_level:.0%} CI [{ate.ci_lower:.3f}, "
            f"{ate.ci_upper:.3f}] ({ate.estimator}, {ate.guarantee}, epsilon {ate.epsilon:g})"
        )

    # Analyst: an uplift table on a public 4-cell grid over severity (age and sex: one cell).
    release = analyst.release(
        dataset.id, "uplift_table", {"epsilon": 0.5, "bins": [1, 4, 1]}, on_progress=progress
    )
    table = analyst.result(release)
    assert isinstance(table, UpliftTable)
    print(f"uplift table ({table.guarantee}, epsilon {table.epsilon:g}), true 0.5 + severity:")
    for row in table.rows:
        print(
            f"  severity cell {row['cell']}: uplift {row['uplift']:+.3f} "
            f"(noise sd {row.get('released_noise_sd', float('nan')):.3f})"
        )
    # Scoring new patients is a lookup in the released table: free, identical on repeat.
    patients = [[40.0, 0.1, 0.0], [65.0, 0.9, 1.0], [40.0, 0.1, 0.0]]
    scores = analyst.predict(release.id, patients)
    assert scores.predictions[0] == scores.predictions[2]
    print("new patients' predicted uplift:", [round(v, 3) for v in scores.predictions])

    # Owner: audit.
    budget = owner.get_budget(dataset.id)
    print(f"budget: epsilon spent {budget.epsilon_spent:g} of {budget.epsilon_total:g}")
    check = owner.verify_ledger(dataset.id)
    print(f"ledger: {check.entries} entries, chain valid: {check.valid}")
    if plots_available():
        args.out.mkdir(parents=True, exist_ok=True)
        plot_ate(
            results,
            args.out / "rct_ate.png",
            labels=[label for label, _ in designs],
            reference=1.0,
            title="Trial 2026: DP ATE (synthetic truth 1.0)",
        )
        plot_budget_spend(owner.ledger(dataset.id), args.out / "rct_budget.png")
        print(f"plots in {args.out}/")
    people.close()


if __name__ == "__main__":
    main()
