"""What machine a benchmark ran on (printed and stored beside every result)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def machine_info() -> dict[str, Any]:
    """Python, CPU count and model, memory, platform, and the pulsar-client / Airflow versions installed."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(Exception):
        info["cpu"] = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    with contextlib.suppress(Exception):
        info["mem_gb"] = round(int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024, 1)
    for key, dist in (("pulsar_client", "pulsar-client"), ("airflow", "apache-airflow")):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info[key] = importlib.metadata.version(dist)
    return info


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


@contextlib.contextmanager
def broker_urls(service_url: str | None, admin_url: str | None) -> Iterator[tuple[str, str]]:
    """The given broker's URLs, or those of a throw-away Pulsar standalone started (and stopped) here."""
    if service_url:
        yield service_url, admin_url or ""
        return
    from airflow_provider_pulsarstate.testing.broker import PulsarStandalone

    with PulsarStandalone() as broker:
        yield broker.service_url, broker.admin_url


def print_run_header() -> None:
    """The date, the machine and the load average at the start, as every result table's preamble."""
    import datetime
    import json

    print(f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}")
    print(f"machine: {json.dumps(machine_info())}")
    print(f"loadavg at start: {os.getloadavg()}", flush=True)
