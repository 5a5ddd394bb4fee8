"""Shared benchmark plumbing: machine facts, result files, a live server with memory sampling."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem_gib = round(kb / 1024 / 1024, 1)
    except (OSError, ValueError):
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit,
    }


def write_result(
    name: str, payload: dict[str, Any], *, quick: bool, module: str | None = None
) -> Path:
    """Write bench/results/<name>[-quick].json with the command, date and machine facts.

    ``module``: the benchmark's module when the result name differs (``bench.<name>`` if None).
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}{'-quick' if quick else ''}.json"
    doc = {
        "benchmark": module or name,
        "command": "python -m " + " ".join([module or f"bench.{name}", *sys.argv[1:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        **payload,
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return out


class PeakRss:
    """Samples a process's peak resident memory (VmHWM) while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> int:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return 0

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_kib = max(self.peak_kib, self._read())

    def __enter__(self) -> PeakRss:
        self.baseline_kib = self._read()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak_kib = max(self.peak_kib, self._read())
        self._stop.set()
        self._t.join()


def fresh_postgres_database(base: str = PG_DEFAULT) -> tuple[str, Any]:
    """Create a throwaway database; return its URL and a function that drops it."""
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"curator_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return make_url(base).set(database=name).render_as_string(hide_password=False), drop


def elapsed_since(start: float) -> float:
    return round(time.perf_counter() - start, 3)


def interval_summary(errors: list[float], halves: list[float]) -> dict[str, Any]:
    """Bias, sd and RMSE of estimate errors, the mean CI half-width and the share of intervals
    that cover (``|error| <= half-width``) with its binomial standard error."""
    import numpy as np

    e, h = np.asarray(errors, dtype=float), np.asarray(halves, dtype=float)
    covered = float(np.mean(np.abs(e) <= h))
    return {
        "reps": int(e.size),
        "bias": float(e.mean()),
        "sd": float(e.std(ddof=1)) if e.size > 1 else None,
        "rmse": float(np.sqrt(np.mean(e * e))),
        "mean_half_width": float(h.mean()),
        "coverage": covered,
        "coverage_se": math.sqrt(covered * (1.0 - covered) / e.size),
    }


def interval_line(row: dict[str, Any]) -> str:
    """One ``interval_summary`` row as printed by the benchmarks."""
    return (
        f"rmse {row['rmse']:.3f} bias {row['bias']:+.3f} "
        f"half {row['mean_half_width']:.3f} cov {row['coverage']:.2f}"
    )
