"""A real server process on loopback, for tests and benchmarks that need one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2 as httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def live_server(
    database_url: str,
    *,
    admin_key: str,
    extra_env: dict[str, str] | None = None,
    command: list[str] | None = None,
) -> Iterator[str]:
    """Start ``python -m service`` (or ``command``) and yield its base URL; stop it after."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "CURATOR_ADMIN_KEY": admin_key,
        "CURATOR_PORT": str(port),
        "CURATOR_ENVIRONMENT": "test",
        **(extra_env or {}),
    }
    proc = subprocess.Popen(
        command or [sys.executable, "-m", "service"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"server exited early: {err[-2000:]}")
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError("server did not become ready")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
