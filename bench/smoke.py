"""CI smoke: every benchmark in its --quick form (small sizes, both databases).

The runs are independent (each benchmark makes its own PostgreSQL database and picks free
ports), so ``--jobs`` of them run at once, the slowest first; the order below is roughly by
the time each took in CI (the summary at the end lists the slowest)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

BENCHES: tuple[str | tuple[str, ...], ...] = (
    # PostgreSQL only in CI: scale-out is its workers' (issue 14); SQLite's accept, overspend
    # and kill paths are the test suite's (tests/db), and the CI run must stay within 30 min.
    ("bench.scale", "--only", "postgres"),
    "bench.realistic",
    "bench.nuisance_oracle",
    ("bench.functions", "--batch", "--functions", "1"),
    "bench.functions",
    "bench.ate_service",
    "bench.upload",
    "bench.load",
    "bench.accept_profile",
    "bench.function_defaults",
    "bench.cate_vector",
    "bench.ebm_cate",
    "bench.uplift",
    "bench.ate_coverage",
    "bench.lee",
    "bench.nuisance_bias",
    "bench.ate_folds",
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
    "bench.het_test",
    "bench.confounding_left",
    "bench.ebm_noise",
    "bench.uplift_cuts",
    "bench.ebm_detect",
    "bench.subsample",
)
# With several runs at once each keeps to one BLAS thread, so they share the cores, not fight.
ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _run(bench: str | tuple[str, ...], env: dict[str, str]) -> tuple[float, str, int, str]:
    """One benchmark's quick run: (seconds, label, exit code, its output)."""
    name, *extra = (bench,) if isinstance(bench, str) else bench
    label = " ".join([name, *extra])
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", name, *extra, "--quick"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        env=env,
    )
    return time.perf_counter() - started, label, done.returncode, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="benchmarks run at once (default: the CPU count); each one's output is printed "
        "whole when it ends",
    )
    jobs = max(1, parser.parse_args().jobs)
    env = dict(os.environ)
    if jobs > 1:
        env.update({name: env.get(name, "1") for name in ONE_THREAD})
    started = time.perf_counter()
    seconds: list[tuple[float, str]] = []
    failed: list[str] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for spent, label, code, output in pool.map(lambda bench: _run(bench, env), BENCHES):
            print(f"== {label} --quick ({spent:.0f} s)", flush=True)
            print(output, end="", flush=True)
            seconds.append((spent, label))
            if code != 0:
                print(f"== {label} --quick FAILED (exit {code})", flush=True)
                failed.append(label)
    wall = time.perf_counter() - started
    total = sum(s for s, _ in seconds)
    print(
        f"== smoke: {wall:.0f} s wall, {total:.0f} s of runs, {jobs} at once; slowest:", flush=True
    )
    for spent, label in sorted(seconds, reverse=True)[:8]:
        print(f"   {spent:6.1f} s  {label}", flush=True)
    if failed:
        raise SystemExit(f"smoke failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
