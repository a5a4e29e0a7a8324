"""Session fixtures: one real Pulsar broker for the whole run, and per-test back ends.

The broker is started by the test session itself (no Docker). Set PULSARSTATE_TEST_SERVICE_URL
and PULSARSTATE_TEST_ADMIN_URL to use a broker you started yourself instead (and
PULSARSTATE_TEST_BROKER_PID for the tests that freeze it with SIGSTOP). A broker that does
not come up is an error, never a skip: deselect Pulsar tests explicitly with ``-m "not pulsar"``.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.backends.base import Backend

ARTIFACTS = Path(os.environ.get("PULSARSTATE_ARTIFACTS", Path(__file__).resolve().parent.parent / ".artifacts"))


def _standalone(tmp_path_factory: pytest.TempPathFactory, name: str, **conf_overrides: str) -> Iterator[object]:
    """Start a PulsarStandalone (data under a session temp dir, log in ARTIFACTS), yield it, stop it."""
    from airflow_provider_pulsarstate.testing.broker import PulsarStandalone

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    broker = PulsarStandalone(
        data_dir=tmp_path_factory.mktemp(f"{name}-data"),
        log_file=ARTIFACTS / f"{name}-broker.log",
        conf_overrides=conf_overrides or None,
    )
    broker.start()
    logging.getLogger(__name__).info("test broker %s up at %s / %s", name, broker.service_url, broker.admin_url)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def pulsar_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The session's real Pulsar broker (``service_url``, ``admin_url``)."""
    url = os.environ.get("PULSARSTATE_TEST_SERVICE_URL")
    if url:
        pid = os.environ.get("PULSARSTATE_TEST_BROKER_PID")  # for the tests that freeze the broker
        yield SimpleNamespace(
            service_url=url, admin_url=os.environ.get("PULSARSTATE_TEST_ADMIN_URL", ""), pid=int(pid) if pid else None
        )
        return
    yield from _standalone(tmp_path_factory, "pulsar")


@pytest.fixture(scope="session")
def pulsar_defaults_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A second broker with Pulsar's own retention and inactive-topic defaults (retention 0,
    inactive topics deleted), checked every 5 s: started only by the tests that ask for it."""
    from airflow_provider_pulsarstate.testing.broker import PULSAR_DEFAULT_POLICIES

    yield from _standalone(tmp_path_factory, "pulsar-defaults", **PULSAR_DEFAULT_POLICIES)


@pytest.fixture(scope="session")
def pulsar_noindex_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A broker WITHOUT the entry-index interceptor (Pulsar's default): no offsets to give.
    Started only by the tests that ask for it."""
    yield from _standalone(
        tmp_path_factory,
        "pulsar-noindex",
        brokerEntryMetadataInterceptors="",
        exposingBrokerEntryMetadataToClientEnabled="false",
    )


def pulsar_config(broker: object, **options: object) -> ConnectionConfig:
    """A ConnectionConfig for the test broker."""
    opts: dict = {"operation_timeout": 15.0, **options}
    return ConnectionConfig(url=broker.service_url, admin_url=broker.admin_url, **opts)  # type: ignore[attr-defined]


def count_entries(backend: Backend, topic: str) -> int:
    """How many raw entries ``topic`` holds now, read with a fresh reader."""
    reader, n = backend.create_reader(topic), 0
    try:
        while reader.has_next() and reader.read_next(timeout=10) is not None:
            n += 1
    finally:
        reader.close()
    return n


@pytest.fixture(params=["embedded", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def backend_config(request: pytest.FixtureRequest, tmp_path: Path) -> ConnectionConfig:
    """Each test using this runs once per back end."""
    if request.param == "embedded":
        return ConnectionConfig(url=str(tmp_path / "state.db"), operation_timeout=15.0)
    return pulsar_config(request.getfixturevalue("pulsar_broker"))


@pytest.fixture
def backend(backend_config: ConnectionConfig) -> Iterator[Backend]:
    b = open_backend(backend_config)
    yield b
    b.close()


@pytest.fixture
def topic() -> str:
    """A fresh topic per test (the per-test namespace)."""
    return f"persistent://public/default/test-{uuid.uuid4().hex[:12]}"
