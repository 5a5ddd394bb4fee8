"""A real server process on loopback, for tests and benchmarks that need one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx

ROOT = Path(__file__).resolve().parents[1]
# A start takes 2-4 s; the shared CI machine has been seen to need far longer.
READY_SECONDS = 120


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
    workers: int = 1,
    unset_env: tuple[str, ...] = (),
) -> Iterator[str]:
    """Start ``python -m service`` (or ``command``) and yield its base URL; stop it after.

    On PostgreSQL the API process runs no jobs: ``workers`` processes of ``python -m
    service.worker`` are started beside it (none if the environment turns jobs off).
    """
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "CURATOR_ADMIN_KEY": admin_key,
        "CURATOR_PORT": str(port),
        "CURATOR_ENVIRONMENT": "test",
        **(extra_env or {}),
    }
    for name in unset_env:
        env.pop(name, None)
    proc = subprocess.Popen(
        # -X faulthandler: a server that never becomes ready is sent SIGABRT and its threads'
        # stacks land in the error message.
        command or [sys.executable, "-X", "faulthandler", "-m", "service"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # The server's stderr is drained all along (a full pipe would block the server's threads
    # mid-request); the tail is kept for the "exited early" message.
    tail: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in iter(proc.stderr.readline, b""):
            tail.append(line.decode(errors="replace"))
            del tail[:-200]

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    base = f"http://127.0.0.1:{port}"
    worker_procs: list[subprocess.Popen[bytes]] = []
    try:
        started = time.time()
        last = "no answer yet"
        while True:
            if proc.poll() is not None:
                time.sleep(0.2)
                raise RuntimeError(f"server exited early: {''.join(tail)[-2000:]}")
            try:
                answer = httpx.get(base + "/readyz", timeout=2)
                if answer.status_code == 200:
                    break
                last = f"{answer.status_code} {answer.text[:200]}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.time() > started + READY_SECONDS:
                proc.send_signal(signal.SIGABRT)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                time.sleep(0.5)
                raise RuntimeError(
                    f"server did not become ready in {READY_SECONDS} s on port {port} (last "
                    f"/readyz: {last}); its stderr, with its stacks: {''.join(tail)[-8000:]}"
                )
            time.sleep(0.1)
        jobs_off = env.get("CURATOR_START_JOB_RUNNER", "").lower() == "false"
        if database_url.startswith("postgresql") and not jobs_off:
            for _ in range(workers):
                worker_procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "service.worker"],
                        cwd=ROOT,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        yield base
    finally:
        for worker in worker_procs:
            worker.terminate()
        for worker in worker_procs:
            try:
                worker.wait(10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drainer.join(5)  # EOF once the server is gone
        if proc.stderr is not None and not drainer.is_alive():
            proc.stderr.close()


def post_burst(
    bases: list[str],
    path: str,
    body: dict[str, Any],
    headers: list[dict[str, str]],
    start_at: float,
    threads: int,
) -> list[tuple[int, dict[str, Any]]]:
    """POST ``body`` once per header set, ``threads`` at a time, round-robin over ``bases``.

    Waits until wall time ``start_at`` first, so that bursts fired from several processes (this
    function is picklable by name for a process pool) overlap. Returns (status, JSON body) per
    request, in order.
    """

    def one(i: int) -> tuple[int, dict[str, Any]]:
        r = client.post(
            f"{bases[i % len(bases)]}{path}", json=body, headers=headers[i], timeout=120
        )
        return r.status_code, r.json()

    limits = httpx.Limits(max_connections=threads, max_keepalive_connections=threads)
    with httpx.Client(limits=limits) as client:
        client.get(f"{bases[0]}/readyz")  # warm up before the start line
        time.sleep(max(0.0, start_at - time.time()))
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(one, range(len(headers))))
