"""The examples in examples/ run end to end in quick mode against a live server (both databases)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_client import module_server
from tests.conftest import ADMIN_KEY

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def live_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from module_server(request)


def run_example(name: str, base: str, out: Path) -> str:
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / name),
            "--quick",
            "--url",
            base,
            "--admin-key",
            ADMIN_KEY,
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env={**os.environ, "MPLBACKEND": "Agg"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc.stdout


def test_rct_example(live_url: str, tmp_path: Path) -> None:
    out = run_example("ate_rct.py", live_url, tmp_path)
    assert "ATE = " in out
    assert "(rct_difference, strict" in out  # the trial default at this n * epsilon
    assert "chain valid: True" in out
    for png in ("rct_ate.png", "rct_budget.png"):
        assert (tmp_path / png).read_bytes()[:8] == PNG_MAGIC


def test_observational_example(live_url: str, tmp_path: Path) -> None:
    out = run_example("ate_observational.py", live_url, tmp_path)
    assert "ATE = " in out
    assert "observational" in out
    assert "chain valid: True" in out
    for png in ("observational_ate.png", "observational_budget.png"):
        assert (tmp_path / png).read_bytes()[:8] == PNG_MAGIC


def test_cate_function_loop_example(live_url: str, tmp_path: Path) -> None:
    started = time.monotonic()
    out = run_example("cate_function_loop.py", live_url, tmp_path)
    elapsed = time.monotonic() - started
    assert "release a strict cate_function" in out
    repeats = re.search(r"repeated patients: (\d+), identical answers: (\d+)/(\d+)", out)
    assert repeats is not None, out
    assert int(repeats[1]) > 0
    assert repeats[1] == repeats[2] == repeats[3]
    assert "re-asking the first batch returns identical values: True" in out
    assert "(unchanged: True)" in out
    assert "chain valid: True" in out
    for png in ("cate_function_slice.png", "cate_function_budget.png"):
        assert (tmp_path / png).read_bytes()[:8] == PNG_MAGIC
    assert elapsed < 30, f"--quick took {elapsed:.1f} s"


def test_observational_data_is_reproducible(tmp_path: Path) -> None:
    sys.path.insert(0, str(EXAMPLES / "data"))
    try:
        import make_observational
    finally:
        sys.path.remove(str(EXAMPLES / "data"))
    committed = (EXAMPLES / "data" / "observational.csv").read_text()
    assert make_observational.generate() == committed
    schema = json.loads((EXAMPLES / "data" / "observational_schema.json").read_text())
    assert schema == make_observational.SCHEMA


def test_readme_installs_the_client_before_running_the_examples() -> None:
    """The examples need the client distribution; the server's install does not bring it."""
    block = (EXAMPLES / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [ln.split("#")[0].strip() for ln in block.splitlines()]
    install = lines.index('pip install "./clients/python[plots]"')
    assert install < min(i for i, ln in enumerate(lines) if ln.startswith("python examples/"))
