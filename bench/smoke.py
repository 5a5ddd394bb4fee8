"""CI smoke: every benchmark in its --quick form (small sizes, both databases)."""

from __future__ import annotations

import subprocess
import sys
import time

BENCHES: tuple[str | tuple[str, ...], ...] = (
    "bench.upload",
    "bench.load",
    # PostgreSQL only in CI: scale-out is its workers' (issue 14); SQLite's accept, overspend
    # and kill paths are the test suite's (tests/db), and the CI run must stay within 30 min.
    ("bench.scale", "--only", "postgres"),
    "bench.accept_profile",
    "bench.functions",
    ("bench.functions", "--batch", "--functions", "1"),
    "bench.function_defaults",
    "bench.cate_vector",
    "bench.ebm_cate",
    "bench.uplift",
    "bench.ate_coverage",
    "bench.ate_service",
    "bench.lee",
    "bench.realistic",
    "bench.nuisance_bias",
    "bench.ate_folds",
    "bench.nuisance_oracle",
    "bench.ate_quote",
    "bench.drlearner",
    # uplift_table's ebm estimator (declared modifiers; n eps / 7 >= 1500 at n 2000, eps 8)
    (
        "bench.drlearner",
        "--kinds",
        "uplift_table_declared",
        "--eps",
        "8",
        "--name",
        "uplift-declared",
    ),
    # a configured ebm_cate kind (bench.realistic.CONFIGURED_EBM: request settings by name)
    ("bench.drlearner", "--kinds", "ebm_cate@eps100+bins24+k0.5", "--name", "ebm-configured"),
    "bench.cate_basis",
    "bench.ebm_noise",
)


def main() -> None:
    seconds: list[tuple[float, str]] = []
    for bench in BENCHES:
        name, *extra = (bench,) if isinstance(bench, str) else bench
        label = " ".join([name, *extra])
        print(f"== {label} --quick", flush=True)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", name, *extra, "--quick"], check=True)
        seconds.append((time.perf_counter() - started, label))
    total = sum(s for s, _ in seconds)
    print(f"== smoke: {total:.0f} s; slowest:", flush=True)
    for spent, label in sorted(seconds, reverse=True)[:8]:
        print(f"   {spent:6.1f} s  {label}", flush=True)


if __name__ == "__main__":
    main()
