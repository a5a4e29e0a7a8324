"""Back-end selection, connection errors, and recovery from a broker restart."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate import (
    BackendUnavailableError,
    ConfigurationError,
    ConnectionConfig,
    PulsarMap,
    open_backend,
)
from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend
from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend
from airflow_provider_pulsarstate.testing.harness import wait_until


def test_url_selects_the_back_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(open_backend(ConnectionConfig(url="pulsar://h:6650")), PulsarBackend)
    assert isinstance(open_backend(ConnectionConfig(url="pulsar+ssl://h:6651")), PulsarBackend)
    assert open_backend(ConnectionConfig(url=f"file://{tmp_path}/a.db")).path == tmp_path / "a.db"  # type: ignore[attr-defined]
    assert open_backend(ConnectionConfig(url=str(tmp_path / "b.db"))).path == tmp_path / "b.db"  # type: ignore[attr-defined]
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    default = open_backend(ConnectionConfig())
    assert isinstance(default, EmbeddedBackend) and default.path == tmp_path / "home" / "pulsarstate" / "state.db"
    assert ConnectionConfig(url="pulsar://broker:6650").resolved_admin_url == "http://broker:8080"


def test_unknown_scheme_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match=r"unsupported URL scheme 'kafka' in 'kafka://h:9092'"):
        ConnectionConfig(url="kafka://h:9092")
    with pytest.raises(ConfigurationError, match="operation_timeout"):
        ConnectionConfig(url="pulsar://h:6650", operation_timeout=0)
    with pytest.raises(ConfigurationError, match="topic 'a/b'"):
        ConnectionConfig().topic_name("a/b")


def test_unreachable_broker_fails_clearly_within_the_timeout() -> None:
    backend = open_backend(
        ConnectionConfig(url="pulsar://127.0.0.1:1", admin_url="http://127.0.0.1:1", operation_timeout=2)
    )
    table = PulsarMap(backend, "persistent://public/default/nowhere")
    start = time.monotonic()
    with pytest.raises(BackendUnavailableError, match=r"pulsar://127\.0\.0\.1:1"):
        table.get("k", latest=True)
    assert time.monotonic() - start < 15
    table.close()
    backend.close()


def test_embedded_state_file_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    table = PulsarMap(
        open_backend(ConnectionConfig(url=str(blocker / "sub" / "state.db"))), "persistent://public/default/t"
    )
    with pytest.raises(BackendUnavailableError, match="cannot open embedded state file"):
        table.get("k")


@pytest.mark.pulsar
@pytest.mark.slow
@pytest.mark.xdist_group("own-broker")
def test_broker_restart_loses_nothing(restartable_broker: Any) -> None:
    broker = restartable_broker
    config = ConnectionConfig(url=broker.service_url, admin_url=broker.admin_url, operation_timeout=30)
    topic = f"persistent://public/default/restart-{uuid.uuid4().hex[:8]}"
    writer_backend, reader_backend = open_backend(config), open_backend(config)
    writer = PulsarMap(writer_backend, topic, writer_idle_timeout=None, acquire_timeout=120, max_retries=20)
    reader = PulsarMap(reader_backend, topic)
    acked: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def write_loop() -> None:
        i = 0
        while not stop.is_set():
            try:
                writer.update("n", lambda k, v: (v or 0) + 1)
                acked.append(i)
                i += 1
            except BaseException as exc:  # recorded: the writer must recover on its own
                errors.append(exc)
                time.sleep(0.5)

    thread = threading.Thread(target=write_loop)
    thread.start()
    wait_until(lambda: len(acked) >= 3, timeout=120, what="writes before the restart")
    before = len(acked)
    broker.restart()
    restarted = len(acked)  # restart() returns with the old broker gone and the new one up
    wait_until(lambda: len(acked) >= restarted + 3, timeout=180, what="writes resumed after the restart")
    stop.set()
    thread.join(timeout=120)
    assert before > 0 and len(acked) > restarted >= before, "writes did not resume after the restart"
    final = reader.get("n", latest=True)
    assert final == writer.get("n", latest=True)
    # exactly once: every acknowledged increment is there, and at most the in-flight ones extra
    assert len(acked) <= final <= len(acked) + len(errors) + 1
    fresh = PulsarMap(open_backend(config), topic)
    assert fresh.get("n", latest=True) == final
    for m in (writer, reader, fresh):
        m.close()


@pytest.mark.pulsar
def test_processes_using_the_broker_exit_cleanly(pulsar_broker: object, topic: str) -> None:
    """An Airflow task that succeeded must not die at exit (apache/pulsar-client-python#256:
    a client holding a Python logger aborted ~1 exit in 4 here)."""
    import subprocess
    import sys

    worker = Path(__file__).with_name("exit_worker.py")
    args = [sys.executable, str(worker), pulsar_broker.service_url, pulsar_broker.admin_url, topic]  # type: ignore[attr-defined]
    codes = [subprocess.run(args, capture_output=True, timeout=120).returncode for _ in range(12)]
    assert codes == [0] * 12


@pytest.mark.pulsar
def test_readers_of_processes_forked_after_pulsar_was_imported_do_not_collide(
    pulsar_broker: object, topic: str
) -> None:
    # A worker that imported pulsar and forks task processes: every child inherits the client's
    # random generator, so generated reader subscription names would collide (ConsumerBusy).
    import os

    from tests.conftest import pulsar_config

    config = pulsar_config(pulsar_broker)
    children = []
    for _ in range(6):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit code
            code = 1
            try:
                backend = open_backend(config)
                backend.create_reader(topic).close()
                backend.close()
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    assert [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children] == [0] * 6
