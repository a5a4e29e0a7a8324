"""Session fixtures: one real Pulsar broker for the whole run, and per-test back ends.

The broker is started by the test session itself (no Docker). Set PULSARSTATE_TEST_SERVICE_URL
and PULSARSTATE_TEST_ADMIN_URL to use a broker you started yourself instead (and
PULSARSTATE_TEST_BROKER_PID for the tests that freeze it with SIGSTOP). A broker that does
not come up is an error, never a skip: deselect Pulsar tests explicitly with ``-m "not pulsar"``.

Under pytest-xdist (``-n N``, as ``dev/test`` runs) the controller starts that broker once, before
the workers, and hands its URLs to them through the same variables; tests that freeze or restart a
broker share one of their own (``freezable_broker``, ``restartable_broker``), pinned by
``xdist_group("own-broker")`` to one worker so that it is started once. When a test fails, the last lines of
the log of every broker it used are added to its report.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.backends.base import Backend

ARTIFACTS = Path(os.environ.get("PULSARSTATE_ARTIFACTS", Path(__file__).resolve().parent.parent / ".artifacts"))

SERVICE_URL_ENV, ADMIN_URL_ENV, PID_ENV = (
    "PULSARSTATE_TEST_SERVICE_URL",
    "PULSARSTATE_TEST_ADMIN_URL",
    "PULSARSTATE_TEST_BROKER_PID",
)
LOG_ENV = "PULSARSTATE_TEST_BROKER_LOG"  # the shared broker's log, for the failure reports
BROKER_LOG_TAIL_LINES = 50
_SHARED_BROKER_KEY = pytest.StashKey[Any]()
_CPU_AT_SETUP = pytest.StashKey[float]()
_STARTED_AT = pytest.StashKey[float]()
_SPARK_ARCHIVE_JOB = pytest.StashKey[Any]()
_GROUPS_LOST = pytest.StashKey[set[str]]()


def _is_xdist_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", 0))


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, the controller starts the session broker once and gives its URLs to the workers
    (they inherit the environment); without its pid, so no worker freezes what the others use.
    Every spark-submit of the run (in this process or in the Airflow processes it starts) gets the
    short-lived JVM settings of ``tests/spark_jvm.py``, unless the caller chose a SPARK_CONF_DIR."""
    if not hasattr(config, "workerinput") and "SPARK_CONF_DIR" not in os.environ and not config.option.collectonly:
        from tests.spark_jvm import spark_environment, start_class_archive

        spark = spark_environment(ARTIFACTS)
        os.environ.update(spark)
        config.stash[_SPARK_ARCHIVE_JOB] = start_class_archive(ARTIFACTS, spark)
    if not _is_xdist_controller(config) or os.environ.get(SERVICE_URL_ENV) or config.option.collectonly:
        return
    import tempfile

    from airflow_provider_pulsarstate.testing.broker import PulsarStandalone
    from tests.jvm_options import SHORT_LIVED_JVM

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    broker = PulsarStandalone(
        data_dir=Path(tempfile.mkdtemp(prefix="pulsarstate-test-broker-")),
        log_file=ARTIFACTS / "pulsar-broker.log",
        jvm_options=SHORT_LIVED_JVM,
    )
    broker.start()
    config.stash[_SHARED_BROKER_KEY] = broker
    os.environ.update(
        {SERVICE_URL_ENV: broker.service_url, ADMIN_URL_ENV: broker.admin_url, LOG_ENV: str(broker.log_file)}
    )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _SPARK_ARCHIVE_JOB in config.stash:
        from tests.spark_jvm import finish_class_archive

        terminalreporter.write_line(finish_class_archive(config.stash[_SPARK_ARCHIVE_JOB], ARTIFACTS))


def pytest_unconfigure(config: pytest.Config) -> None:
    broker = config.stash.get(_SHARED_BROKER_KEY, None)
    if broker is not None:
        import shutil

        broker.stop()
        shutil.rmtree(broker.data_dir, ignore_errors=True)
        for name in (SERVICE_URL_ENV, ADMIN_URL_ENV, LOG_ENV):
            os.environ.pop(name, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slowest modules first, each module's tests kept together and in their order (module fixtures
    are set up once): under xdist the long live tests then start at once instead of ending the run
    alone. The times come from ``tests/durations.json`` (``dev/test_durations.py`` refreshes it);
    a test it does not know counts as fast."""
    known = _known_durations()
    if not known:
        return
    slowest: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        slowest[module] = max(slowest.get(module, 0.0), known.get(without_group(item.nodeid), 0.0))
    items.sort(key=lambda item: -slowest[item.nodeid.split("::", 1)[0]])  # stable: order within a module kept


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker under ``--dist loadgroup``: note the tests of an ``xdist_group`` that
    pytest-xdist could not mark (it adds ``@group`` to their node ids; a pytest it does not support
    ignores that silently). Every group would then run on every worker: each shared broker,
    deployment and venv set up once per worker, the run slower by minutes and never told. Each such
    test fails at setup saying so (an error raised here would only crash the worker, unexplained)."""
    if hasattr(session.config, "workerinput") and getattr(session.config.option, "loadgroup", False):
        session.config.stash[_GROUPS_LOST] = set(groups_lost(session.items))


def groups_lost(items: Iterable[Any]) -> list[str]:
    """The node ids of ``items`` marked ``xdist_group`` that lack the suffix pytest-xdist's
    ``--dist loadgroup`` writes: ``@`` and their groups' names, sorted and joined by ``_``."""
    lost = []
    for item in items:
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        )
        if names and not item.nodeid.endswith("@" + "_".join(names)):
            lost.append(item.nodeid)
    return lost


def without_group(nodeid: str) -> str:
    """``nodeid`` without the ``@group`` suffix pytest-xdist adds under ``--dist loadgroup`` (an
    ``@`` inside the parameters' brackets is a parameter's)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def _known_durations() -> dict[str, float]:
    import json

    path = Path(__file__).resolve().parent / "durations.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _log_tail(path: Path, lines: int = BROKER_LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * 1024))
            return b"".join(collections.deque(f, maxlen=lines)).decode("utf-8", "replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


def _broker_logs_used(item: pytest.Item) -> dict[str, Path]:
    """The logs of the brokers ``item`` used: its broker fixtures, and the session broker for a
    Pulsar test (marked ``pulsar`` or asking for it)."""
    logs: dict[str, Path] = {}
    funcargs = getattr(item, "funcargs", {}) or {}
    for name, value in funcargs.items():
        log_file = getattr(value, "log_file", None)
        if "broker" in name and log_file:
            logs[name] = Path(log_file)
    if "pulsar" in item.keywords or "pulsar_broker" in getattr(item, "fixturenames", ()):
        shared = os.environ.get(LOG_ENV)
        if shared and "pulsar_broker" not in logs:
            logs["pulsar_broker"] = Path(shared)
    return logs


def _cpu_seconds() -> float:
    """CPU time of this process and of the children it has waited for (spark-submit, Airflow
    processes, pipeline workers), and of the scripts a warm parent forked for it: what a test
    costs on a machine where every CPU is busy."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    forked = sys.modules.get("tests.airflow.warm_python")  # processes forked by a warm parent
    extra = forked.cpu_seconds() if forked is not None else 0.0
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + extra


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    import time

    if item.nodeid in item.config.stash.get(_GROUPS_LOST, ()):
        pytest.fail(
            f"pytest-xdist did not put {item.nodeid} in its xdist_group: this pytest and pytest-xdist do "
            "not work together (use the versions of requirements/test.lock)",
            pytrace=False,
        )
    item.stash[_CPU_AT_SETUP] = _cpu_seconds()
    item.stash[_STARTED_AT] = time.time()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed Pulsar test's report ends with the tail of the broker log(s) it used. Each test's
    CPU seconds (setup to teardown) go into the JUnit report as its ``cpu_seconds`` property, with
    when it started (``started``, Unix time) and on which xdist worker (``worker``): the run's
    timeline (``dev/test_durations.py --timeline``)."""
    report = yield
    if call.when == "teardown" and _CPU_AT_SETUP in item.stash:
        report.user_properties.append(("cpu_seconds", round(_cpu_seconds() - item.stash[_CPU_AT_SETUP], 1)))
        report.user_properties.append(("started", round(item.stash[_STARTED_AT], 1)))
        report.user_properties.append(("worker", os.environ.get("PYTEST_XDIST_WORKER", "main")))
    if report.failed:
        for name, path in _broker_logs_used(item).items():
            report.sections.append((f"last {BROKER_LOG_TAIL_LINES} lines of {path} ({name})", _log_tail(path)))
    return report


def _standalone(tmp_path_factory: pytest.TempPathFactory, name: str, **conf_overrides: str) -> Iterator[object]:
    """Start a PulsarStandalone (data under a session temp dir, log in ARTIFACTS, the suite's
    short-lived JVM settings), yield it, stop it."""
    from airflow_provider_pulsarstate.testing.broker import PulsarStandalone
    from tests.jvm_options import SHORT_LIVED_JVM

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    broker = PulsarStandalone(
        data_dir=tmp_path_factory.mktemp(f"{name}-data"),
        log_file=ARTIFACTS / f"{name}-broker.log",
        conf_overrides=conf_overrides or None,
        jvm_options=SHORT_LIVED_JVM,
    )
    broker.start()
    logging.getLogger(__name__).info("test broker %s up at %s / %s", name, broker.service_url, broker.admin_url)
    try:
        yield broker
    finally:
        broker.stop()


def _owns_session_broker(config: pytest.Config) -> bool:
    """True when the session broker is this process's alone: started by this pytest process, or
    given with its pid (the user then vouches that nothing else uses it)."""
    if os.environ.get(PID_ENV):
        return True
    return not os.environ.get(SERVICE_URL_ENV) and not hasattr(config, "workerinput")


@pytest.fixture(scope="session")
def pulsar_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The session's real Pulsar broker (``service_url``, ``admin_url``)."""
    url = os.environ.get(SERVICE_URL_ENV)
    if url:
        pid = os.environ.get(PID_ENV)  # for the tests that freeze the broker
        log_file = os.environ.get(LOG_ENV)
        yield SimpleNamespace(
            service_url=url,
            admin_url=os.environ.get(ADMIN_URL_ENV, ""),
            pid=int(pid) if pid else None,
            log_file=Path(log_file) if log_file else None,
        )
        return
    for broker in _standalone(tmp_path_factory, "pulsar"):
        os.environ[LOG_ENV] = str(broker.log_file)  # type: ignore[attr-defined]
        try:
            yield broker
        finally:
            os.environ.pop(LOG_ENV, None)


@pytest.fixture(scope="session")
def freezable_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A broker a test may freeze with SIGSTOP (it has a ``pid``): the session broker when this
    process alone uses it, else one of its own (under xdist: freezing the shared one would stall the
    other workers' tests). Tests sharing it are pinned to one worker by ``xdist_group("own-broker")``."""
    if _owns_session_broker(request.config):
        yield request.getfixturevalue("pulsar_broker")
        return
    yield from _standalone(tmp_path_factory, "pulsar-freezable")


@pytest.fixture(scope="session")
def _restartable(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if _owns_session_broker(request.config):  # the freezable broker is then the session broker: never restart it
        yield from _standalone(tmp_path_factory, "pulsar-restartable")
        return
    yield request.getfixturevalue("freezable_broker")  # under xdist: one broker of this worker's for both


@pytest.fixture
def restartable_broker(_restartable: Any) -> Any:
    """A broker a test may stop and restart (a ``PulsarStandalone``), running when the test starts;
    never the session broker. Under xdist it is the freezable broker, started once for the tests of
    both kinds, which ``xdist_group("own-broker")`` pins to one worker."""
    if not _restartable.is_running():
        _restartable.start()
    return _restartable


@pytest.fixture(scope="session")
def pulsar_stock_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A second broker left at Pulsar's own defaults where they matter here: no retention,
    inactive topics deleted (checked every 5 s instead of 60), and no entry-index interceptor
    (no offsets to give). Started only by the tests that ask for it, which ``xdist_group("stock-broker")``
    pins to one worker."""
    from airflow_provider_pulsarstate.testing.broker import PULSAR_DEFAULT_POLICIES

    yield from _standalone(
        tmp_path_factory,
        "pulsar-stock",
        **PULSAR_DEFAULT_POLICIES,
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
