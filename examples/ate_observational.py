"""The average treatment effect in an observational clinical study, end to end.

    python examples/ate_observational.py [--url http://127.0.0.1:8000] [--admin-key KEY] [--quick]

examples/data/observational.csv (made by examples/data/make_observational.py, fixed seed) is
confounded: sicker, older patients are treated more often. The strict DP ATE adjusts with DP
propensity and outcome models (AIPW; by the public rule DP linear models below n * epsilon =
20,000, as at epsilon 1 and 3 here, DP-EBMs from there) and releases the estimate with a
confidence interval covering sampling and privacy noise. The analyst first asks the quote which
epsilon a target precision needs. The true ATE of the synthetic study is 1.0.
"""

# ruff: noqa: T201  (examples report to the terminal)
from __future__ import annotations

from _common import DATA, arguments, plots_available, progress, roles

from dpcurator import AteResult
from dpcurator.plots import plot_ate, plot_budget_spend

TARGET_HALF_WIDTH = 0.5


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    people = roles(args.url, args.admin_key, "Observational")
    owner, analyst = people.owner, people.analyst

    dataset = owner.upload_dataset(
        "Cardiology registry 2019-2024",
        DATA / "observational.csv",
        DATA / "observational_schema.json",
        description="synthetic observational study",
    )
    print(f"uploaded {dataset.id}: n = {dataset.n}")
    owner.set_budget(dataset.id, epsilon_total=8.0, delta_total=1e-4)
    owner.grant(dataset.id, people.analyst_id)

    # What epsilon buys a CI half-width of 0.5 (a public computation: no data, no charge)?
    quote = analyst.quote(
        dataset.id, "ate", {"epsilon": 1.0, "target_half_width": TARGET_HALF_WIDTH}
    )
    needed = quote.accuracy.get("epsilon_for_target_half_width")
    print(
        f"quote: at epsilon 1 the CI half-width is expected near "
        f"{quote.accuracy['expected_half_width']:.3f}; "
        f"half-width {TARGET_HALF_WIDTH} needs epsilon {needed}"
    )

    epsilons = [1.0] if args.quick else [1.0, 3.0]
    results: list[AteResult] = []
    for epsilon in epsilons:
        print(f"release at epsilon {epsilon:g}:")
        release = analyst.release(dataset.id, "ate", {"epsilon": epsilon}, on_progress=progress)
        ate = analyst.result(release)
        assert isinstance(ate, AteResult)
        results.append(ate)
        print(
            f"  ATE = {ate.estimate:.3f}, {ate.ci_level:.0%} CI [{ate.ci_lower:.3f}, "
            f"{ate.ci_upper:.3f}] ({ate.guarantee}, {ate.design})"
        )

    check = owner.verify_ledger(dataset.id)
    budget = owner.get_budget(dataset.id)
    print(f"budget: epsilon spent {budget.epsilon_spent:g} of {budget.epsilon_total:g}")
    print(f"ledger: {check.entries} entries, chain valid: {check.valid}")
    if plots_available():
        args.out.mkdir(parents=True, exist_ok=True)
        plot_ate(results, args.out / "observational_ate.png", reference=1.0)
        plot_budget_spend(owner.ledger(dataset.id), args.out / "observational_budget.png")
        print(f"plots in {args.out}/")
    people.close()


if __name__ == "__main__":
    main()
