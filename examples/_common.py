"""Shared set-up of the examples: arguments, the three roles' clients, progress printing."""

# ruff: noqa: T201  (examples report to the terminal)
from __future__ import annotations

import argparse
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from dpcurator import CuratorClient, Release
from dpcurator.client import DEFAULT_URL

DATA = Path(__file__).resolve().parent / "data"


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", default=os.environ.get("CURATOR_URL", DEFAULT_URL))
    parser.add_argument(
        "--admin-key",
        default=os.environ.get("CURATOR_ADMIN_KEY", "change-me"),
        help="the admin key, to create this example's owner and analyst",
    )
    parser.add_argument("--quick", action="store_true", help="fewer, cheaper releases")
    parser.add_argument("--out", type=Path, default=Path("example-output"), help="plots go here")
    return parser.parse_args()


@dataclass
class Roles:
    owner: CuratorClient
    analyst: CuratorClient
    analyst_id: str

    def close(self) -> None:
        self.owner.close()
        self.analyst.close()


def roles(url: str, admin_key: str, label: str) -> Roles:
    """The admin creates an owner and an analyst for this run (their keys are shown once)."""
    tag = uuid.uuid4().hex[:6]
    with CuratorClient(url, admin_key) as admin:
        owner = admin.create_principal(f"{label} data office {tag}", "owner")
        analyst = admin.create_principal(f"{label} statistician {tag}", "analyst")
    return Roles(
        owner=CuratorClient(url, owner.api_key),
        analyst=CuratorClient(url, analyst.api_key),
        analyst_id=analyst.id,
    )


def client_key(url: str, admin_key: str, label: str) -> tuple[str, str]:
    """The admin creates a client principal (decision support: evaluates, never releases)."""
    with CuratorClient(url, admin_key) as admin:
        made = admin.create_principal(f"{label} decision support {uuid.uuid4().hex[:6]}", "client")
    return made.id, made.api_key


def plots_available() -> bool:
    """Whether matplotlib (the client's ``plots`` extra) is installed; says so where it is not,
    so an example ends with its figures printed rather than a traceback at the plot."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print('plots skipped: matplotlib is not installed (pip install "dpcurator[plots]")')
        return False
    return True


def progress(release: Release) -> None:
    """A one-line progress report per change (a notebook or GUI would draw a bar)."""
    print(f"  {release.id[:8]}  {release.status:<8} {release.progress:5.0%}  {release.stage}")
