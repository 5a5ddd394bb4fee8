"""Sequential profile of the accept path (issue 14.4): the ledger's two ways of charging.

One in-process app (FastAPI's TestClient) on a fresh PostgreSQL database, one dataset, one
client: ``--requests`` accepts per round, rounds alternating between the statement-by-statement
charge and the one-statement charge (``curator_charge_v1``) by switching
``service.ledger.service.in_one_statement`` (the machine is shared: alternating rounds see the
same load). Per round: wall time per accept, statements per accept, time in ``execute``, and how
long the budget row is locked per charge (from the start of the charge's first statement to the
end of its commit; on the one-statement path the server commits as the statement ends).

    python -m bench.accept_profile               # 200 accepts x 3 rounds per path
    python -m bench.accept_profile --quick       # 50 x 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from bench.common import fresh_postgres_database, write_result
from tests.conftest import RCT_SCHEMA, synthetic_csv

ADMIN = "bench-admin-key"
BODY = {"kind": "ate", "params": {"epsilon": 0.01, "nuisance": "none"}, "fresh": True}
CHARGE_STARTS = ("UPDATE budget SET epsilon_spent", "SELECT entry_seq")


class Probe:
    """Counts statements and times the budget row's lock, from SQLAlchemy's events."""

    def __init__(self) -> None:
        self.reset()
        event.listen(Engine, "before_cursor_execute", self.before)
        event.listen(Engine, "after_cursor_execute", self.after)
        event.listen(Session, "after_commit", self.committed)

    def reset(self) -> None:
        self.statements, self.execute_s, self.locks_ms = 0, 0.0, []
        self.lock_start: float | None = None
        self.t0 = 0.0

    def before(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        self.t0 = time.perf_counter()
        if self.lock_start is None and statement.startswith(CHARGE_STARTS):
            self.lock_start = self.t0

    def after(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        now = time.perf_counter()
        self.statements += 1
        self.execute_s += now - self.t0
        one_statement = statement.startswith(CHARGE_STARTS[1]) and cursor.connection.autocommit
        if one_statement and self.lock_start is not None:  # committed as the statement ended
            self.locks_ms.append(1000 * (now - self.lock_start))
            self.lock_start = None

    def committed(self, session: Session) -> None:
        if self.lock_start is not None:
            self.locks_ms.append(1000 * (time.perf_counter() - self.lock_start))
            self.lock_start = None


def run(requests: int, rounds: int) -> dict[str, Any]:
    url, drop = fresh_postgres_database()
    try:
        from service.db import migrate

        migrate.upgrade(url)
        os.environ.update(
            DATABASE_URL=url,
            CURATOR_ADMIN_KEY=ADMIN,
            CURATOR_ENVIRONMENT="test",
            CURATOR_RUN_MIGRATIONS_ON_START="false",
            CURATOR_START_JOB_RUNNER="false",
            CURATOR_LATENCY_BUCKETS="[0.05]",
        )
        from fastapi.testclient import TestClient

        from service.ledger import service as ledger
        from service.main import create_app

        path = ["one_statement"]
        ledger.in_one_statement = lambda session: path[0] == "one_statement"  # type: ignore[assignment]
        probe = Probe()
        rows: list[dict[str, Any]] = []
        with TestClient(create_app()) as c:
            admin = {"Authorization": f"Bearer {ADMIN}"}
            owner = c.post("/v1/principals", json={"name": "o", "role": "owner"}, headers=admin)
            oh = {"Authorization": f"Bearer {owner.json()['api_key']}"}
            ds = c.post(
                "/v1/datasets",
                data={"name": "d", "schema": json.dumps(RCT_SCHEMA)},
                files={"file": ("r.csv", synthetic_csv(200).encode(), "text/csv")},
                headers=oh,
            ).json()
            c.put(
                f"/v1/datasets/{ds['id']}/budget",
                json={"epsilon_total": 1000, "delta_total": 0.5},
                headers=oh,
            )

            def accept() -> None:
                r = c.post(
                    f"/v1/datasets/{ds['id']}/releases",
                    json=BODY,
                    headers=oh | {"Idempotency-Key": uuid.uuid4().hex},
                )
                assert r.status_code == 202, r.text

            for name in ("statements", "one_statement"):  # warm up both (prepared statements)
                path[0] = name
                for _ in range(20):
                    accept()
            for i in range(rounds):
                for name in ("statements", "one_statement"):
                    path[0] = name
                    probe.reset()
                    load = os.getloadavg()[0]
                    t0 = time.perf_counter()
                    for _ in range(requests):
                        accept()
                    wall = time.perf_counter() - t0
                    locks = sorted(probe.locks_ms)
                    rows.append(
                        {
                            "round": i + 1,
                            "path": name,
                            "ms_per_accept": round(1000 * wall / requests, 2),
                            "statements_per_accept": round(probe.statements / requests, 1),
                            "ms_in_execute_per_accept": round(1000 * probe.execute_s / requests, 2),
                            "lock_ms_mean": round(statistics.mean(locks), 2),
                            "lock_ms_p50": round(locks[len(locks) // 2], 2),
                            "lock_ms_p99": round(locks[int(0.99 * len(locks))], 2),
                            "load_1min": round(load, 2),
                        }
                    )
                    print(" ", rows[-1], flush=True)
            verify = c.get(f"/v1/datasets/{ds['id']}/ledger/verify", headers=oh).json()
        return {"requests_per_round": requests, "rounds": rounds, "rows": rows, "ledger": verify}
    finally:
        drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    requests, rounds = (50, 1) if args.quick else (args.requests, args.rounds)
    result = run(requests, rounds)
    assert result["ledger"]["valid"], result["ledger"]
    print(f"wrote {write_result('accept_profile', result, quick=args.quick)}")


if __name__ == "__main__":
    main()
