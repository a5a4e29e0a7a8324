"""Operating-system helpers of the local broker: free loopback ports, the ``java`` to run, and
finding, checking and stopping a broker process by pid (SIGTERM, then SIGKILL after a grace period)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_provider_pulsarstate.testing.broker_classpath import PulsarBrokerError

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
MAIN_CLASS = "org.apache.pulsar.PulsarStandaloneStarter"


def free_ports(count: int, *, exclude: Sequence[int] = ()) -> list[int]:
    """Return *count* distinct loopback ports that are free right now (and not in *exclude*)."""
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)  # held open until all are picked, so they are distinct
            port = sock.getsockname()[1]
            if port not in exclude:
                ports.append(port)
        return ports
    finally:
        for sock in sockets:
            sock.close()


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
    java = shutil.which("java")
    if java is None:
        raise PulsarBrokerError(
            "'java' (Java 17+) is not on PATH and JAVA_HOME is not set; the Pulsar broker needs it."
        )
    return java


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_pulsar_pid(pid: int) -> bool:
    """True when *pid* is alive and (where /proc exists) runs the Pulsar standalone main class."""
    if not pid_alive(pid):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():
        try:
            return MAIN_CLASS.encode() in cmdline.read_bytes()
        except OSError:
            return False
    return True


def terminate(pid: int, *, grace: float, poll: Any = None) -> None:
    """SIGTERM the process group of *pid*, then SIGKILL it after *grace* seconds."""

    def alive() -> bool:
        if poll is not None:
            return poll() is None
        return pid_alive(pid)

    def signal_group(sig: signal.Signals) -> None:
        try:
            os.killpg(pid, sig)  # the JVM leads its own process group (start_new_session)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)

    if not alive():
        return
    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive():
            return
        time.sleep(0.1)
    log.warning("Pulsar broker pid %d did not stop within %.0f s; sending SIGKILL", pid, grace)
    signal_group(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive():
        time.sleep(0.05)
