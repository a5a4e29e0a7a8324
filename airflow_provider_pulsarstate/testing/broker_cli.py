"""``python -m airflow_provider_pulsarstate.testing.broker``: run, start, stop and check a local
broker from the command line (:func:`main`); the state of a started one is kept in its data directory."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests

from airflow_provider_pulsarstate.testing.broker import (
    PULSAR_VERSION,
    PulsarBrokerError,
    PulsarStandalone,
    default_cache_dir,
)
from airflow_provider_pulsarstate.testing.broker_process import is_pulsar_pid, pid_alive, terminate

_STATE_FILE = "pulsar-standalone.json"


def _state_path(data_dir: Path) -> Path:
    return data_dir / _STATE_FILE


def _read_state(data_dir: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(_state_path(data_dir).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and "pid" in state else None


def _print_urls(service_url: str, admin_url: str) -> None:
    print(f"service URL: {service_url}")
    print(f"admin URL:   {admin_url}")
    print(f"export PULSARSTATE_SERVICE_URL={service_url}")
    print(f"export PULSARSTATE_ADMIN_URL={admin_url}")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _cmd_run(args: argparse.Namespace) -> int:
    # Ctrl-C / kill stop the broker too (the JVM has its own process group, so it never sees
    # the terminal's SIGINT); set explicitly because a background shell job starts with SIGINT ignored.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    broker = PulsarStandalone(
        data_dir=args.data_dir,
        broker_port=args.broker_port,
        web_port=args.web_port,
        version=args.version,
        heap=args.heap,
    )
    state = _read_state(broker.data_dir)
    if state and is_pulsar_pid(int(state["pid"])):
        print(f"a broker is already running from {broker.data_dir} (pid {state['pid']})", file=sys.stderr)
        return 1
    broker.start(timeout=args.timeout)
    _print_urls(broker.service_url, broker.admin_url)
    print(f"log: {broker.log_file}  (Ctrl-C stops the broker)", flush=True)
    try:
        while broker.is_running():
            time.sleep(1)
        print("broker exited on its own; see the log", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping...", file=sys.stderr)
        return 0
    finally:
        broker.stop()


def _cmd_start(args: argparse.Namespace) -> int:
    data_dir = args.data_dir.expanduser().resolve()
    state = _read_state(data_dir)
    if state and is_pulsar_pid(int(state["pid"])):
        print(f"already running (pid {state['pid']})")
        _print_urls(state["service_url"], state["admin_url"])
        return 0
    broker = PulsarStandalone(
        data_dir=data_dir, broker_port=args.broker_port, web_port=args.web_port, version=args.version, heap=args.heap
    )
    broker.start(timeout=args.timeout)
    assert broker.pid is not None
    state = {
        "pid": broker.pid,
        "broker_port": broker.broker_port,
        "web_port": broker.web_port,
        "bookie_port": broker.bookie_port,
        "data_dir": str(broker.data_dir),
        "log_file": str(broker.log_file),
        "version": broker.version,
        "service_url": broker.service_url,
        "admin_url": broker.admin_url,
        "started": time.time(),
    }
    tmp = _state_path(data_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, _state_path(data_dir))
    broker._detach()
    print(f"started pid {state['pid']}, data {data_dir}, log {broker.log_file}")
    _print_urls(broker.service_url, broker.admin_url)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    data_dir = args.data_dir.expanduser().resolve()
    state = _read_state(data_dir)
    if state is None:
        print(f"no state file in {data_dir}; nothing to stop")
        return 0
    pid = int(state["pid"])
    if is_pulsar_pid(pid):
        terminate(pid, grace=args.grace)
        if pid_alive(pid):
            print(f"pid {pid} is still alive", file=sys.stderr)
            return 1
        print(f"stopped pid {pid}")
    else:
        print(f"pid {pid} is not running")
    _state_path(data_dir).unlink(missing_ok=True)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    data_dir = args.data_dir.expanduser().resolve()
    state = _read_state(data_dir)
    if state is None or not is_pulsar_pid(int(state["pid"])):
        print(f"not running (data dir {data_dir})")
        return 3
    try:
        health = requests.get(f"{state['admin_url']}/admin/v2/brokers/health", timeout=30)
        healthy = health.status_code == 200 and health.text.strip().lower() == "ok"
        detail = f"health: {health.status_code} {health.text.strip()[:100]}"
    except requests.RequestException as exc:
        healthy, detail = False, f"health: {type(exc).__name__}"
    print(f"running pid {state['pid']}, data {data_dir}, {detail}")
    _print_urls(state["service_url"], state["admin_url"])
    return 0 if healthy else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m airflow_provider_pulsarstate.testing.broker``."""
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_pulsarstate.testing.broker",
        description="Run a local Apache Pulsar standalone broker (jars from Maven Central, no Docker).",
    )
    parser.add_argument("command", choices=["run", "start", "stop", "status"])
    parser.add_argument("--data-dir", type=Path, default=default_cache_dir() / "standalone-data")
    parser.add_argument("--broker-port", type=int, default=6650, help="pulsar:// port (0 = any free port)")
    parser.add_argument("--web-port", type=int, default=8080, help="HTTP admin port (0 = any free port)")
    parser.add_argument("--version", default=PULSAR_VERSION, help=argparse.SUPPRESS)
    parser.add_argument("--heap", default="1g", help="JVM heap and direct memory size (default 1g)")
    parser.add_argument("--timeout", type=float, default=240.0, help="start-up timeout in seconds")
    parser.add_argument("--grace", type=float, default=20.0, help="stop: seconds between SIGTERM and SIGKILL")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
    handlers = {"run": _cmd_run, "start": _cmd_start, "stop": _cmd_stop, "status": _cmd_status}
    try:
        return handlers[args.command](args)
    except PulsarBrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
