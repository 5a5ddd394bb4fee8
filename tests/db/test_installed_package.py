"""A non-editable install of the service migrates a database and finds its console assets: the
migrations ship inside the package (an ops walkthrough's `pip install .` could neither migrate
nor start a worker: the migrations lived beside the package, in the repository only)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
from pathlib import Path
from sqlalchemy import create_engine
from service.db import migrate
import service.console
url = "sqlite:///" + sys.argv[1]
migrate.upgrade(url)
assert migrate.at_head(create_engine(url), url)
assert Path(migrate.__file__).is_relative_to(sys.argv[2]), migrate.__file__
assert (Path(service.console.__file__).parent / "static" / "console.js").is_file()
print("ok")
"""


def test_an_installed_service_migrates_without_the_repository(tmp_path: Path) -> None:
    # built from a copy of what the distribution is made of (setuptools builds in the source
    # tree, and stale files in its build/ could hide a missing one)
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "service", source / "service", ignore=shutil.ignore_patterns("__pycache__")
    )
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), "."],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=300,
    )
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path / "db.sqlite3"), str(site)],
        cwd=tmp_path,  # not the repository: only the installed copy is importable
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
    # the migration step of a deployment that migrates on its own, from the installed copy
    step = subprocess.run(
        [sys.executable, "-m", "service.db.migrate"],
        cwd=tmp_path,
        env={
            "PYTHONPATH": str(site),
            "PATH": "/usr/bin:/bin",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'step.sqlite3'}",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert step.returncode == 0, step.stderr[-2000:]
    assert "migrated" in step.stderr
