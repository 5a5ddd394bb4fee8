"""The README's curl walkthrough, run as written against a live server (SQLite and PostgreSQL)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ADMIN_KEY
from tests.live import live_server

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def walkthrough() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Walkthrough with curl", 1)[1].split("\n## ", 1)[0]
    return "\n".join(re.findall(r"```bash\n(.*?)```", section, flags=re.S))


def test_readme_starts_with_the_two_commands() -> None:
    first = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert first is not None
    lines = [ln.split("#")[0].strip() for ln in first.group(1).strip().splitlines()]
    assert lines == ["bash scripts/serve", "bash scripts/test"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_walkthrough(db_url: str) -> None:
    with live_server(
        db_url, admin_key=ADMIN_KEY, extra_env={"CURATOR_LATENCY_BUCKETS": "[0.1]"}
    ) as base:
        proc = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + walkthrough()],
            cwd=ROOT,
            env={**os.environ, "CURATOR": base, "ADMIN_KEY": ADMIN_KEY},
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "'estimate'" in out
    assert "'ci_lower'" in out
    assert '"valid":true' in out
    assert "problems/budget-exhausted" in out
    assert "seq,entry_type" in out
