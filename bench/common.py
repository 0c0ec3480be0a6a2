"""Shared pieces of the benchmarks: a throwaway database, percentiles, the
database's version, and writing the figures as JSON."""
import json
import math
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class ThrowawayDatabase:
    """Points the settings at a fresh database before django.setup(): a temp
    SQLite file, or a new PostgreSQL database `name` on the DATABASE_URL server.
    Dropped on exit, so a benchmark never writes to the configured database."""

    def __init__(self, name: str):
        self.name = name
        self.url = os.environ.get("DATABASE_URL", "")
        self.tempdir = None
        self.admin_params = None

    def __enter__(self):
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
        # Benchmarks run with DEBUG off (as deployed); the settings then refuse the built-in key.
        os.environ.setdefault("SECRET_KEY", "kinsite-bench-only-secret-key-not-for-deployments")
        if not self.url:
            self.tempdir = tempfile.TemporaryDirectory(prefix="kinsite-bench-")
            os.environ["KINSITE_DATA_DIR"] = self.tempdir.name
            return self
        parsed = urlparse(self.url)
        if parsed.scheme not in ("postgres", "postgresql", "pgsql"):
            raise SystemExit(f"DATABASE_URL must be PostgreSQL (or unset for SQLite), not {parsed.scheme}")
        # dj-database-url reads a socket directory given as a percent-encoded host
        # (postgres://postgres@%2Ftmp%2Fpgv%2Fpgdata/kinsite, as scripts/pgvector_server.py
        # prints), which urlparse would leave encoded and lowercased.
        import dj_database_url

        database = dj_database_url.parse(self.url)
        self.admin_params = {
            "host": database["HOST"] or "localhost",
            "port": database["PORT"] or 5432,
            "user": database["USER"] or None,
            "password": database["PASSWORD"] or None,
            "dbname": "postgres",
        }
        self._admin(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        self._admin(f"CREATE DATABASE {self.name}")
        os.environ["DATABASE_URL"] = urlunparse(parsed._replace(path=f"/{self.name}"))
        return self

    def __exit__(self, *exc):
        if self.tempdir is not None:
            self.tempdir.cleanup()
        if self.admin_params is not None:
            from django.db import connections

            connections.close_all()
            self._admin(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
            os.environ["DATABASE_URL"] = self.url

    def _admin(self, sql):
        import psycopg

        with psycopg.connect(**self.admin_params, autocommit=True) as connection:
            connection.execute(sql)


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(share * len(ordered))) - 1]


def latency_summary(milliseconds: list[float]) -> dict:
    return {
        "count": len(milliseconds),
        "p50_ms": round(percentile(milliseconds, 0.50), 2),
        "p95_ms": round(percentile(milliseconds, 0.95), 2),
        "p99_ms": round(percentile(milliseconds, 0.99), 2),
        "max_ms": round(max(milliseconds), 2),
    }


def database_version(connection) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
            return "PostgreSQL " + cursor.fetchone()[0]
        cursor.execute("SELECT sqlite_version()")
        return "SQLite " + cursor.fetchone()[0]


def python_speed_ms(repeats: int = 7) -> float:
    """The best of `repeats` runs of a fixed pure-Python workload (dict updates, string
    formatting, integer arithmetic, a sort), in ms. The same machine has run the same
    benchmark up to three times slower at some hours than at others (docs/benchmarks.md,
    Current figures), so every run records this next to its figures: compare runs whose
    speed is alike, or scale by it. Lower is faster."""
    def workload():
        table: dict[str, int] = {}
        for i in range(60_000):
            key = f"k{i % 997}"
            table[key] = table.get(key, 0) + i * i % 7
        return sorted(table.items())

    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        workload()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 2)


def cpu_times() -> list[int] | None:
    """The machine's cumulative CPU times (/proc/stat's first line: user, nice, system,
    idle, iowait, irq, softirq, steal, ...), or None off Linux."""
    try:
        with open("/proc/stat") as stat:
            return [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def machine_state(before: list[int] | None, after: list[int] | None) -> dict:
    """CPU shares between two cpu_times() readings: busy (all but idle and iowait) and
    stolen by the hypervisor; percentages of all cores' time."""
    if not before or not after:
        return {}
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta[:8]) or 1
    idle = delta[3] + delta[4]
    steal = delta[7] if len(delta) > 7 else 0
    return {"busy_percent": round(100 * (total - idle) / total, 1), "steal_percent": round(100 * steal / total, 1)}


class MachineWatch:
    """Around a benchmark's timed part: the machine's speed (python_speed_ms) before and
    after, and its CPU shares during it. `figures` holds them once the block is left."""

    def __enter__(self):
        self.speed_before, self.times_before = python_speed_ms(), cpu_times()
        self.figures: dict = {}
        return self

    def __exit__(self, *exc):
        times_after = cpu_times()
        self.figures = {"python_speed_ms": {"before": self.speed_before, "after": python_speed_ms()},
                        **machine_state(self.times_before, times_after)}


def machine_state_line(state: dict) -> str:
    speed = state["python_speed_ms"]
    return (f"machine speed: python workload {speed['before']} ms before timing, {speed['after']} ms after "
            f"(lower is faster); CPU busy {state.get('busy_percent', '?')} %, "
            f"stolen {state.get('steal_percent', '?')} %")


def machine() -> dict:
    return {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def write_results(name: str, vendor: str, figures: dict, out_dir: Path = RESULTS_DIR) -> Path:
    figures = {"benchmark": name, "vendor": vendor, "date": datetime.now(UTC).isoformat(timespec="seconds"),
               "machine": machine(), **figures}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{vendor}.json"
    path.write_text(json.dumps(figures, indent=2) + "\n")
    return path
