"""Released CATE functions: evaluation latency, throughput, state size and accuracy.

Everything goes through HTTP on loopback to a real server process and its database
(PostgreSQL by default). For each q in (2, 30):

* exact GP conditioning: fill the shared state to t answered points in batches of 1000 (each
  batch timed), then time single-point requests at new points (p50/p99, sequential throughput)
  and at a stored point (cache hit); persisted state bytes; the naive alternative (refactor
  ``k0(X_S, X_S) + D`` from scratch for one new point, in-process) beside it;
* finite basis (Nystrom, public Sobol centres): the same, up to t = 10^5 points;
* PEHE of the exact and the Nystrom function at the same epsilon (R-learner, RCT, no nuisance
  models, 1000 test points, ``reps`` releases each).

    python -m bench.functions            # t = 10^2, 10^3, 5 10^3, 10^4 exact; 10^5 finite basis
    python -m bench.functions --quick    # n = 2000, q = 2; t = 10^2, 10^3 exact, 5000 finite
    python -m bench.functions --batch    # one 1000-point batch at exactly t = 10^4, per BLAS kernel

``--batch`` times the exact mode's worst request: 1000 new points against exactly 10^4 stored
ones (``functions.batch_seconds``), on fresh functions, with the server on the BLAS kernel this
machine's environment forces (``OPENBLAS_CORETYPE``) and on the one OpenBLAS picks by itself
(both variables unset for that server alone), side by side.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import httpx2 as httpx
import numpy as np

from bench.common import fresh_postgres_database, write_result
from service.mechanisms import gp
from tests.live import live_server

ADMIN = "bench-admin-key"
EPSILON = 1.0
# The released function both runs time: the R-learner's raw GP function, no nuisance models,
# lambda0 = 0.1. Shrinkage "none": its capacity and timings are for the clients' points only
# (the anchored default would add 256 reference points at release time).
RAW_EXACT: dict[str, Any] = {
    "epsilon": EPSILON,
    "nuisance": "none",
    "regularization": 0.1,
    "lambda_convention": "unnormalised",
    "shrinkage": "none",
}


def dgp(n: int, q: int, seed: int) -> tuple[str, dict[str, Any]]:
    """An RCT with CATE tau(x) = 1 + sin(2 pi x0) / 2 on [0, 1]^q (benchmark DGP)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=(n, q))
    a = (rng.uniform(size=n) < 0.5).astype(int)
    y = np.clip(x[:, 1] + a * tau(x) + rng.normal(0, 0.5, n), -2, 3)
    cols = [f"x{j}" for j in range(q)]
    lines = [",".join([*cols, "t", "y"])]
    for i in range(n):
        lines.append(",".join([*(f"{v:.5f}" for v in x[i]), str(a[i]), f"{y[i]:.4f}"]))
    schema = {
        "covariates": [{"name": c, "lower": 0, "upper": 1} for c in cols],
        "treatment": {"name": "t"},
        "outcome": {"name": "y", "lower": -2, "upper": 3},
        "out_of_bounds": "clip",
        "missing": "reject_upload",
        "design": "rct",
        "treatment_probability": 0.5,
    }
    return "\n".join(lines) + "\n", schema


def tau(x: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 + 0.5 * np.sin(2 * np.pi * x[:, 0]))


class Session:
    def __init__(self, base: str, q: int, n: int) -> None:
        self.base = base
        self.http = httpx.Client(timeout=600)
        admin = {"Authorization": f"Bearer {ADMIN}"}
        owner = self.http.post(
            f"{base}/v1/principals", json={"name": "o", "role": "owner"}, headers=admin
        ).json()
        self.h = {"Authorization": f"Bearer {owner['api_key']}"}
        csv, schema = dgp(n, q, seed=q)
        ds = self.http.post(
            f"{base}/v1/datasets",
            data={"name": f"q{q}", "schema": json.dumps(schema)},
            files={"file": ("r.csv", io.BytesIO(csv.encode()), "text/csv")},
            headers=self.h,
        ).json()
        self.dataset = ds["id"]
        self.http.put(
            f"{base}/v1/datasets/{self.dataset}/budget",
            json={"epsilon_total": 1000.0, "delta_total": 0.5},
            headers=self.h,
        )

    def post(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        """POST with up to 3 attempts on a dropped keep-alive connection (both routes are
        idempotent: a release by its Idempotency-Key, an evaluation by the stored answers)."""
        return self._retry(lambda: self.http.post(url, json=body, headers=headers))

    def get(self, url: str) -> httpx.Response:
        return self._retry(lambda: self.http.get(url, headers=self.h))

    @staticmethod
    def _retry(call: Any) -> httpx.Response:
        for attempt in range(3):
            try:
                response: httpx.Response = call()
                return response
            except httpx.TransportError:
                if attempt == 2:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def release(self, params: dict[str, Any]) -> str:
        r = self.post(
            f"{self.base}/v1/datasets/{self.dataset}/releases",
            {"kind": "cate_function", "params": params, "fresh": True},
            self.h | {"Idempotency-Key": uuid.uuid4().hex},
        )
        assert r.status_code == 202, r.text
        rid = r.json()["id"]
        while True:
            body = self.get(f"{self.base}/v1/releases/{rid}").json()
            if body["status"] == "done":
                return str(rid)
            assert body["status"] != "failed", body
            time.sleep(0.1)

    def evaluate(self, fid: str, points: np.ndarray) -> tuple[list[float], float]:
        start = time.perf_counter()
        r = self.post(
            f"{self.base}/v1/functions/{fid}/evaluate", {"points": points.tolist()}, self.h
        )
        elapsed = time.perf_counter() - start
        assert r.status_code == 200, r.text
        return r.json()["values"], elapsed


def state_bytes(db_url: str, fid: str) -> int:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session as DbSession

    from service.functions.service import state_bytes as measure

    engine = create_engine(db_url)
    try:
        with DbSession(engine) as session:
            return measure(session, fid)
    finally:
        engine.dispose()


def naive_seconds(t: int, q: int, h: float) -> float:
    """In-process cost of refactoring everything for one new point at t stored points."""
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(t, q))
    u = rng.standard_normal(t)
    d = np.full(t, gp.DEFAULT_JITTER)
    start = time.perf_counter()
    gp.full_refactor_draw(
        x, u, d, rng.uniform(size=(1, q)), bandwidth=h, normals=rng.standard_normal
    )
    return time.perf_counter() - start


def profile(
    s: Session, db_url: str, fid: str, q: int, checkpoints: list[int], singles: int, rng: Any
) -> list[dict[str, Any]]:
    out = []
    t = 0
    batch_seconds: list[float] = []
    for target in checkpoints:
        while t < target:
            size = min(1000, target - t)
            _, elapsed = s.evaluate(fid, rng.uniform(size=(size, q)))
            batch_seconds.append(elapsed)
            t += size
        lat = []
        start = time.perf_counter()
        for _ in range(singles):
            lat.append(s.evaluate(fid, rng.uniform(size=(1, q)))[1])
        wall = time.perf_counter() - start
        t += singles
        stored = rng.uniform(size=(1, q))
        s.evaluate(fid, stored)
        t += 1
        hits = [s.evaluate(fid, stored)[1] for _ in range(20)]
        floor = []  # the service's own floor: an authenticated metadata GET (auth + one query)
        for _ in range(20):
            start = time.perf_counter()
            s.get(f"{s.base}/v1/functions/{fid}").raise_for_status()
            floor.append(time.perf_counter() - start)
        health = []  # the HTTP floor: an unauthenticated GET that touches nothing
        for _ in range(200):
            start = time.perf_counter()
            s.http.get(f"{s.base}/healthz").raise_for_status()
            health.append(time.perf_counter() - start)
        out.append(
            {
                "t": t,
                "single_new_p50_ms": round(1000 * float(np.percentile(lat, 50)), 2),
                "single_new_p99_ms": round(1000 * float(np.percentile(lat, 99)), 2),
                "single_new_throughput_rps": round(singles / wall, 1),
                "single_cached_p50_ms": round(1000 * float(np.percentile(hits, 50)), 2),
                "metadata_get_p50_ms": round(1000 * float(np.percentile(floor, 50)), 2),
                "healthz_p50_ms": round(1000 * float(np.percentile(health, 50)), 2),
                "healthz_p99_ms": round(1000 * float(np.percentile(health, 99)), 2),
                "singles": singles,
                "load_average_1min": round(os.getloadavg()[0], 2),
                "last_batch_1000_seconds": round(batch_seconds[-1], 3) if batch_seconds else None,
                "persisted_state_bytes": state_bytes(db_url, fid),
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def pehe(s: Session, params: dict[str, Any], q: int, reps: int) -> list[float]:
    rng = np.random.default_rng(123)
    test = rng.uniform(size=(1000, q))
    values = []
    for _ in range(reps):
        fid = s.release(params)
        got = np.asarray(s.evaluate(fid, test)[0])
        values.append(float(np.sqrt(np.mean((got - tau(test)) ** 2))))
    return values


def run(db_url: str, *, quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {}
    env = {"CURATOR_LATENCY_BUCKETS": "[0.1, 1, 5, 30]", "CURATOR_JOB_POLL_SECONDS": "0.05"}
    with live_server(db_url, admin_key=ADMIN, extra_env=env) as base:
        for q in (2,) if quick else (2, 30):
            h = float(np.sqrt(q / 6))
            n = 2000 if quick else 4000
            s = Session(base, q, n=n)
            common = dict(RAW_EXACT)
            rng = np.random.default_rng(q)
            exact_t = [100, 1000] if quick else [100, 1000, 5000, 10000]
            fid = s.release({**common, "t_max": max(exact_t) + 200})
            exact = profile(s, db_url, fid, q, exact_t, 20 if quick else 100, rng)
            naive = {str(t): round(naive_seconds(t, q, h), 4) for t in exact_t}
            finite_t = [100, 1000, 5000] if quick else [100, 1000, 10000, 100000]
            fid_n = s.release({**common, "basis": "nystrom", "n_centres": 256})
            # Finite basis: 1000 single requests per checkpoint, so p99 is not one sample's max.
            finite = profile(s, db_url, fid_n, q, finite_t, 50 if quick else 1000, rng)
            reps = 1 if quick else 10
            pehe_exact = pehe(s, {**common, "t_max": 1000}, q, reps)
            pehe_nys = pehe(s, {**common, "basis": "nystrom", "n_centres": 256}, q, reps)
            results[f"q={q}"] = {
                "n": n,
                "n2": n,
                "bandwidth": h,
                "exact": exact,
                "naive_refactor_seconds_per_new_point": naive,
                "nystrom_256": finite,
                "pehe_exact": pehe_exact,
                "pehe_nystrom": pehe_nys,
                "pehe_ratio_nystrom_over_exact": round(
                    float(np.mean(pehe_nys) / np.mean(pehe_exact)), 3
                ),
            }
            print(json.dumps({"q": q, "pehe": results[f"q={q}"]["pehe_ratio_nystrom_over_exact"]}))
    return results


# The machine's environment may pin OpenBLAS to an older kernel (a workaround for old builds);
# a current numpy picks its own when both variables are unset.
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def blas_kernel(unset: tuple[str, ...]) -> str:
    """The OpenBLAS kernel a fresh interpreter loads under this environment (threadpoolctl)."""
    env = {k: v for k, v in os.environ.items() if k not in unset}
    code = (
        "import numpy, threadpoolctl;"
        "print(next(i.get('architecture', '?') for i in threadpoolctl.threadpool_info()"
        " if i['user_api'] == 'blas'))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


ARMS: dict[str, tuple[str, ...]] = {"environment": (), "autodetected": BLAS_ENV}


def batch_seconds(
    db_url: str,
    *,
    stored: int,
    functions: int,
    qs: tuple[int, ...],
    arms: tuple[str, ...] = tuple(ARMS),
) -> dict[str, Any]:
    """One 1000-point batch at exactly ``stored`` points, on ``functions`` fresh functions per
    q, for each BLAS environment; the fill batches before it are timed too."""
    out: dict[str, Any] = {}
    env = {"CURATOR_LATENCY_BUCKETS": "[0.1, 1, 5, 30]", "CURATOR_JOB_POLL_SECONDS": "0.05"}
    for label in arms:
        unset = ARMS[label]
        arm: dict[str, Any] = {
            "blas_kernel": blas_kernel(unset),
            "unset": list(unset),
            "env": {k: os.environ.get(k) for k in BLAS_ENV if k not in unset},
        }
        with live_server(db_url, admin_key=ADMIN, extra_env=env, unset_env=unset) as base:
            for q in qs:
                s = Session(base, q, n=4000)
                rng = np.random.default_rng(1000 + q)
                common = {**RAW_EXACT, "t_max": stored + 1000}
                seconds, fills = [], []
                for _ in range(functions):
                    fid = s.release(common)
                    fill = [
                        s.evaluate(fid, rng.uniform(size=(1000, q)))[1]
                        for _ in range(stored // 1000)
                    ]
                    fills.append(round(fill[-1], 3))
                    seconds.append(round(s.evaluate(fid, rng.uniform(size=(1000, q)))[1], 3))
                arm[f"q={q}"] = {
                    "stored": stored,
                    "batch": 1000,
                    "seconds": seconds,
                    "median": round(float(np.median(seconds)), 3),
                    "max": max(seconds),
                    "previous_fill_batch_seconds": fills,
                    "load_average_1min": round(os.getloadavg()[0], 2),
                }
                print(label, q, json.dumps(arm[f"q={q}"]), flush=True)
        out[label] = arm
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--batch", action="store_true", help="only the 1000-point batch at t = 10^4"
    )
    parser.add_argument("--functions", type=int, default=5, help="--batch: fresh functions per q")
    parser.add_argument("--arm", choices=tuple(ARMS), help="--batch: one BLAS environment only")
    parser.add_argument("--q", type=int, help="--batch: one q only")
    args = parser.parse_args()
    url, drop = fresh_postgres_database()
    if args.batch:
        try:
            stored = 1000 if args.quick else 10_000
            qs = (args.q,) if args.q else (2,) if args.quick else (2, 30)
            arms = (args.arm,) if args.arm else tuple(ARMS)
            found = batch_seconds(url, stored=stored, functions=args.functions, qs=qs, arms=arms)
        finally:
            drop()
        write_result(
            "functions-batch",
            {"backend": "postgresql", "results": found},
            quick=args.quick,
            module="bench.functions",
        )
        return
    try:
        results = run(url, quick=args.quick)
    finally:
        drop()
    write_result(
        "functions",
        {
            "backend": "postgresql",
            "epsilon": EPSILON,
            "settings": "RCT p = 0.5, outcome bounds [-2, 3], nuisance 'none', R-learner, "
            "lambda0 = 0.1 (unnormalised), h = sqrt(q/6)",
            "results": results,
        },
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
