"""The embedded back end of offset consumption: what only it has (the state file, trimming, its
async probe), and a seeded randomized check of every PullConsumer invariant against a model.

The back-end-neutral semantics are in test_pull_consumer.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_pulsarstate import ConnectionConfig, PulsarMap, open_backend
from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    OffsetOutOfRangeError,
    OperationTimeoutError,
    UnknownPartitionError,
    UnknownTopicError,
)
from airflow_provider_pulsarstate.engine.offsets import (
    PullConsumer,
    create_topic,
    open_async_probe,
    open_offset_log,
    open_publisher,
)
from airflow_provider_pulsarstate.engine.offsets import embedded as offsets_embedded
from airflow_provider_pulsarstate.engine.offsets.embedded import (
    EmbeddedAsyncOffsetProbe,
    EmbeddedOffsetLog,
    trim_embedded_topic,
)
from airflow_provider_pulsarstate.engine.worker_thread import RESOURCES

TOPIC = "persistent://public/default/events"
# The schema of state files written before offsets existed.
OLD_SCHEMA = """
CREATE TABLE topics (name TEXT PRIMARY KEY, epoch INTEGER NOT NULL DEFAULT 0);
CREATE TABLE entries (
    topic TEXT NOT NULL, pos INTEGER NOT NULL, payload BLOB NOT NULL, publish_time REAL NOT NULL,
    PRIMARY KEY (topic, pos)
) WITHOUT ROWID;
"""


@pytest.fixture
def config(tmp_path: Path) -> ConnectionConfig:
    return ConnectionConfig(url=str(tmp_path / "state.db"), operation_timeout=10.0)


@pytest.fixture
def backend(config: ConnectionConfig) -> Iterator[EmbeddedBackend]:
    b = open_backend(config)
    yield b  # type: ignore[misc]
    b.close()


def publish(backend: EmbeddedBackend, topic: str, values: list[bytes], **send: object) -> None:
    with open_publisher(backend, topic) as publisher:
        for value in values:
            publisher.send(value, **send)  # type: ignore[arg-type]
        publisher.flush(timeout=10)


def hold_exclusive_lock(path: Path) -> sqlite3.Connection:
    """Another connection holding the state file exclusively (readers and writers wait on it)."""
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    locker.execute("PRAGMA locking_mode=EXCLUSIVE")
    locker.execute("BEGIN EXCLUSIVE")
    locker.execute("INSERT INTO topics(name, epoch) VALUES ('lock-holder', 0)")
    return locker


def hold_write_lock(path: Path) -> sqlite3.Connection:
    """Another connection in the middle of a write transaction (other writers wait on it)."""
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    locker.execute("BEGIN IMMEDIATE")
    return locker


# -- the state file --------------------------------------------------------------------------
def test_a_state_file_from_before_offsets_keeps_working(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    old.executescript(OLD_SCHEMA)
    old.executemany(
        "INSERT INTO entries VALUES (?, ?, ?, ?)", [("old-log", i, b"e%d" % i, 1000.0 + i) for i in range(3)]
    )
    old.close()
    backend = open_backend(ConnectionConfig(url=str(path)))
    try:
        with PullConsumer(backend, "old-log", "sub") as consumer:  # any topic with entries can be consumed
            assert consumer.partitions() == [0]
            got = consumer.pull(0).messages
            assert [(m.offset, m.value, m.key, dict(m.properties), m.publish_time) for m in got] == [
                (i, b"e%d" % i, None, {}, 1000.0 + i) for i in range(3)
            ]
            assert consumer.offsets_for_times(1001.0) == {0: 1}
            consumer.commit(2)
            assert consumer.committed() == 2 and consumer.lag() == {0: 1}
        table = PulsarMap(backend, "persistent://public/default/table", acquire_timeout=10)  # state logs unaffected
        table.put("k", 1)
        assert table.get("k", latest=True) == 1
        table.close()
    finally:
        backend.close()
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"offset_topics", "entry_meta", "topic_trims", "subscriptions", "entries", "topics"} <= tables


def test_delete_topic_removes_its_offset_rows(backend: EmbeddedBackend) -> None:
    create_topic(backend, TOPIC, partitions=2)
    publish(backend, TOPIC, [b"a", b"b", b"c"], key="k", properties={"p": "v"})
    with PullConsumer(backend, TOPIC, "sub") as consumer:
        partition = next(p for p, end in consumer.end_offsets().items() if end)
        consumer.commit(1, partition=partition)
    trim_embedded_topic(backend, TOPIC, 1, partition=partition)
    backend.delete_topic(TOPIC)
    with PullConsumer(backend, TOPIC, "sub") as consumer, pytest.raises(UnknownTopicError):
        consumer.partitions()
    conn = backend.connect()
    for table in ("entries", "entry_meta", "topic_trims", "subscriptions", "offset_topics"):
        assert conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,), table
    conn.close()
    create_topic(backend, TOPIC)  # recreated afresh, non-partitioned this time
    publish(backend, TOPIC, [b"new"])
    with PullConsumer(backend, TOPIC, "sub") as consumer:
        assert consumer.committed() is None
        assert [(m.offset, m.key) for m in consumer.pull(0).messages] == [(0, None)]


def test_a_topic_with_entries_is_non_partitioned(backend: EmbeddedBackend) -> None:
    writer = backend.open_shared_writer(TOPIC)  # e.g. a state log: any topic with entries can be read by offset
    writer.append([b"a"], timeout=10)
    writer.close()
    create_topic(backend, TOPIC)
    with pytest.raises(ConfigurationError, match="exists with 0 partitions, not 2"):
        create_topic(backend, TOPIC, partitions=2)


def test_sqlite_errors_become_ours(tmp_path: Path) -> None:
    path = tmp_path / "not-a-db"
    path.write_bytes(b"this is not a SQLite database, just bytes" * 100)
    backend = open_backend(ConnectionConfig(url=str(path)))
    try:
        with pytest.raises(BackendUnavailableError, match="not-a-db"):
            PullConsumer(backend, TOPIC).end_offsets()
        with pytest.raises(BackendUnavailableError, match="not-a-db"):
            create_topic(backend, TOPIC)
        with pytest.raises(BackendUnavailableError, match="not-a-db"):
            open_publisher(backend, TOPIC)
    finally:
        backend.close()
    assert backend._closed  # type: ignore[attr-defined]


def test_a_failing_last_flush_is_logged_and_the_back_end_still_closes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"
    backend = open_backend(ConnectionConfig(url=str(path)))
    create_topic(backend, TOPIC)
    publisher = open_publisher(backend, TOPIC)
    publisher.send(b"x")
    publisher._conn.close()  # type: ignore[attr-defined,union-attr]  # the connection breaks under it
    with caplog.at_level(logging.WARNING):
        backend.close()
    assert backend._closed  # type: ignore[attr-defined]
    assert any(TOPIC in r.getMessage() for r in caplog.records), caplog.text
    with pytest.raises(ClosedError):
        publisher.send(b"y")


def test_unknown_options_are_refused(backend: EmbeddedBackend) -> None:
    assert isinstance(open_offset_log(backend, TOPIC, reader_pool_size=3, position_cache_size=9), EmbeddedOffsetLog)
    with pytest.raises(ConfigurationError, match="reader_poolsize"):
        open_offset_log(backend, TOPIC, reader_poolsize=3)


def test_closing_the_backend_closes_its_offset_logs(config: ConnectionConfig) -> None:
    backend = open_backend(config)
    create_topic(backend, TOPIC)
    consumer = PullConsumer(backend, TOPIC)
    assert consumer.end_offsets() == {0: 0}
    backend.close()
    with pytest.raises(ClosedError):
        consumer.end_offsets()


def store_files(under: Path) -> int:
    """This process's open files under ``under``: the store's own, whatever other threads of the
    process (left by earlier tests) open or close meanwhile."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # an fd closed meanwhile
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(f"{under}{os.sep}")
    return count


def test_closing_consumers_and_publishers_releases_their_connections(
    backend: EmbeddedBackend, config: ConnectionConfig
) -> None:
    create_topic(backend, TOPIC)
    publish(backend, TOPIC, [b"a"])
    store = Path(config.url).parent
    before = store_files(store)
    for _ in range(30):
        with PullConsumer(backend, TOPIC, "sub") as consumer, open_publisher(backend, TOPIC) as publisher:
            consumer.commit(consumer.pull(0).next_offset)
            publisher.send(b"b")
            publisher.flush(timeout=10)
    assert store_files(store) <= before + 2
    assert not backend._children  # type: ignore[attr-defined]  # nothing left for the back end to close
    kept = [PullConsumer(backend, TOPIC) for _ in range(10)]
    for consumer in kept:
        consumer.end_offsets()
    assert store_files(store) >= before + 10  # each consumer holds a connection until closed...
    for consumer in kept:
        consumer.close()
    assert store_files(store) <= before + 2  # ...and gives it back


KILLED_AFTER_COMMIT = """
import os, signal, sys
from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.offsets import PullConsumer, create_topic, open_publisher
backend = open_backend(ConnectionConfig(url=sys.argv[1]))
create_topic(backend, sys.argv[2])
publisher = open_publisher(backend, sys.argv[2])
for i in range(5):
    publisher.send(b"%d" % i)
publisher.flush(timeout=10)
PullConsumer(backend, sys.argv[2], "sub").commit(3)
os.kill(os.getpid(), signal.SIGKILL)  # no close, no cleanup: only what was durable on return survives
"""


def test_flushes_and_commits_survive_the_process_being_killed(config: ConnectionConfig, tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_COMMIT, str(config.embedded_path), TOPIC], timeout=60)
    assert done.returncode == -9
    backend = open_backend(config)
    try:
        with PullConsumer(backend, TOPIC, "sub") as consumer:
            assert consumer.committed() == 3
            assert [m.value for m in consumer.pull(0).messages] == [b"0", b"1", b"2", b"3", b"4"]
    finally:
        backend.close()


# -- publishing ------------------------------------------------------------------------------
def test_concurrent_publishers_keep_offsets_dense_and_each_one_ordered(config: ConnectionConfig) -> None:
    backends = [open_backend(config) for _ in range(3)]
    create_topic(backends[0], TOPIC)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with open_publisher(backends[i], TOPIC) as publisher:
                for n in range(400):
                    publisher.send(f"{i}:{n}".encode())
                    if n % (7 + i) == 0:
                        publisher.flush(timeout=10)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with PullConsumer(backends[0], TOPIC) as consumer:
        messages = consumer.pull(0, max_messages=5000).messages
        assert [m.offset for m in messages] == list(range(1200))
        for i in range(3):
            assert [m.value for m in messages if m.value.startswith(b"%d:" % i)] == [
                b"%d:%d" % (i, n) for n in range(400)
            ]
        times = [m.publish_time for m in messages]
        assert times == sorted(times)  # time search relies on it
    for b in backends:
        b.close()


def test_a_locked_file_times_out_a_flush_and_keeps_the_queue(
    backend: EmbeddedBackend, config: ConnectionConfig
) -> None:
    create_topic(backend, TOPIC)
    publisher = open_publisher(backend, TOPIC)
    publisher.send(b"first")
    publisher.flush(timeout=10)
    publisher.send(b"queued", key="k")
    locker = hold_write_lock(config.embedded_path)
    try:
        start = time.monotonic()
        with pytest.raises(OperationTimeoutError, match=r"events.*stayed locked for 0\.3s; nothing was written"):
            publisher.flush(timeout=0.3)
        assert time.monotonic() - start < 5
    finally:
        locker.close()
    publisher.flush(timeout=10)
    publisher.close()
    with PullConsumer(backend, TOPIC) as consumer:
        assert [(m.value, m.key) for m in consumer.pull(0).messages] == [(b"first", None), (b"queued", "k")]


def test_publish_times_never_decrease_when_the_clock_goes_back(
    backend: EmbeddedBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_topic(backend, TOPIC)
    publish(backend, TOPIC, [b"a", b"b"])
    monkeypatch.setattr(offsets_embedded.time, "time", lambda: 1.0)  # a clock stepped back
    publish(backend, TOPIC, [b"c"])
    monkeypatch.undo()
    with PullConsumer(backend, TOPIC) as consumer:
        messages = consumer.pull(0).messages
        assert messages[2].publish_time == messages[1].publish_time
        assert consumer.offsets_for_times(messages[1].publish_time) == {0: 0}  # one flush, one stamp
        assert consumer.offsets_for_times(2.0) == {0: 0}


def test_keys_route_to_one_partition_by_a_stable_hash(backend: EmbeddedBackend) -> None:
    create_topic(backend, TOPIC, partitions=4)
    publish(backend, TOPIC, [b"x"] * 3, key="customer-42")
    with PullConsumer(backend, TOPIC) as consumer:
        ends = consumer.end_offsets()
    import zlib

    assert ends[zlib.crc32(b"customer-42") % 4] == 3 and sum(ends.values()) == 3


# -- trimming --------------------------------------------------------------------------------
def test_trimming_a_partition_and_its_errors(backend: EmbeddedBackend) -> None:
    create_topic(backend, TOPIC, partitions=2)
    publish(backend, TOPIC, [b"%d" % i for i in range(10)])  # round robin: 5 and 5
    assert trim_embedded_topic(backend, TOPIC, 3, partition=1) == 3
    with PullConsumer(backend, TOPIC) as consumer:
        assert consumer.beginning_offsets() == {0: 0, 1: 3} and consumer.end_offsets() == {0: 5, 1: 5}
        assert [m.value for m in consumer.pull(3, partition=1).messages] == [b"7", b"9"]
    with pytest.raises(UnknownPartitionError, match="no partition 2"):
        trim_embedded_topic(backend, TOPIC, 1, partition=2)
    with pytest.raises(UnknownTopicError):
        trim_embedded_topic(backend, TOPIC + "-nope", 1)
    with pytest.raises(ConfigurationError, match="before_offset"):
        trim_embedded_topic(backend, TOPIC, -1)


# -- async probe -----------------------------------------------------------------------------
def test_async_probe_reads_end_and_committed_offsets(backend: EmbeddedBackend, config: ConnectionConfig) -> None:
    create_topic(backend, TOPIC, partitions=2)
    create_topic(backend, "plain")
    publish(backend, TOPIC, [b"a", b"b", b"c"])
    publish(backend, "plain", [b"a"])
    with PullConsumer(backend, TOPIC, "sub") as consumer:
        consumer.commit(1, partition=1)

    async def main() -> None:
        probe = open_async_probe(config)
        assert isinstance(probe, EmbeddedAsyncOffsetProbe)
        assert await probe.end_offsets(TOPIC) == {0: 2, 1: 1}
        assert await probe.committed(TOPIC, "sub") == {0: None, 1: 1}
        assert await probe.end_offsets("plain") == {0: 1}
        assert await probe.committed("plain", "sub") == {0: None}
        with pytest.raises(UnknownTopicError, match="missing"):
            await probe.end_offsets("missing")
        key = ("embedded-offset-probe", config)
        other = open_async_probe(config)  # probes of one file share its connection
        assert await other.end_offsets("plain") == {0: 1} and RESOURCES.users(key) == 2
        await probe.aclose()
        await probe.aclose()  # idempotent
        await other.aclose()
        for _ in range(100):  # the shared connection is closed after the last probe let go
            if RESOURCES.users(key) == 0:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the probes' connection outlived aclose()")
        with pytest.raises(ClosedError):
            await probe.end_offsets(TOPIC)

    asyncio.run(main())


def test_async_probe_never_blocks_the_event_loop(backend: EmbeddedBackend, config: ConnectionConfig) -> None:
    create_topic(backend, TOPIC)
    publish(backend, TOPIC, [b"a", b"b"])
    locker = hold_exclusive_lock(config.embedded_path)
    threading.Timer(1.0, locker.close).start()  # the lock goes away after 1 s

    async def main() -> tuple[dict[int, int], float, float, int]:
        ticks: list[float] = []
        stop = asyncio.Event()

        async def tick() -> None:
            while not stop.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        probe = EmbeddedAsyncOffsetProbe(config)
        start = time.monotonic()
        try:
            ends = await probe.end_offsets(TOPIC)  # waits on the lock, on the probe's own thread
        finally:
            elapsed = time.monotonic() - start
            stop.set()
            await ticker
            await probe.aclose()
        gaps = [b - a for a, b in zip(ticks, ticks[1:])]
        return ends, elapsed, max(gaps), len(ticks)

    ends, elapsed, longest_gap, count = asyncio.run(main())
    assert ends == {0: 2}
    assert elapsed >= 0.8  # it really waited for the lock...
    assert longest_gap < 0.3 and count >= 30  # ...while the loop kept ticking


def test_async_probe_can_be_cancelled_and_closed_while_a_read_waits(
    backend: EmbeddedBackend, config: ConnectionConfig
) -> None:
    create_topic(backend, TOPIC)
    locker = hold_exclusive_lock(config.embedded_path)
    threading.Timer(2.0, locker.close).start()

    async def main() -> float:
        probe = EmbeddedAsyncOffsetProbe(config)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(probe.end_offsets(TOPIC), 0.2)
        start = time.monotonic()
        await probe.aclose()
        return time.monotonic() - start

    assert asyncio.run(main()) < 0.5  # closing does not wait for the stuck read
    deadline = time.monotonic() + 15
    while RESOURCES.users(("embedded-offset-probe", config)):  # given back once the stuck read ended
        assert time.monotonic() < deadline, "the probe never gave its connection back"
        time.sleep(0.05)


# -- a seeded randomized check of every invariant -------------------------------------------
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_interleavings_keep_every_invariant(backend: EmbeddedBackend, seed: int) -> None:
    """Publishes, pulls of random sizes from random offsets, continuations, commits and trims,
    checked against a model (the list of values and the retained beginning)."""
    rng = random.Random(seed)
    create_topic(backend, TOPIC)
    model: list[bytes] = []
    beginning = 0
    committed: int | None = None
    publisher = open_publisher(backend, TOPIC)
    consumer = PullConsumer(backend, TOPIC, "sub")
    cursor: int | None = None
    try:
        for step in range(400):
            op = rng.random()
            end = len(model)
            if op < 0.25:
                batch = [rng.randbytes(rng.choice([0, 1, 5, 40, 300])) for _ in range(rng.randint(1, 30))]
                for value in batch:
                    publisher.send(value)
                publisher.flush(timeout=10)
                model.extend(batch)
            elif op < 0.65:
                start = (
                    cursor if cursor is not None and rng.random() < 0.5 else rng.randint(max(0, beginning - 5), end + 5)
                )
                max_messages, max_bytes = rng.randint(1, 60), rng.choice([1, 50, 400, 10_000])
                if not beginning <= start <= end:
                    with pytest.raises(OffsetOutOfRangeError) as caught:
                        consumer.pull(start, max_messages=max_messages, max_bytes=max_bytes)
                    assert (caught.value.offset, caught.value.beginning, caught.value.end) == (start, beginning, end)
                    cursor = None
                else:
                    result = consumer.pull(start, max_messages=max_messages, max_bytes=max_bytes)
                    expected = _expected_pull(model, start, max_messages, max_bytes)
                    assert [m.value for m in result.messages] == expected, f"step {step}"
                    assert [m.offset for m in result.messages] == list(range(start, start + len(expected)))
                    assert result.next_offset == start + len(expected) and result.end_offset == end
                    cursor = result.next_offset
            elif op < 0.85:
                target = rng.randint(max(0, beginning - 3), end + 3)
                if beginning <= target <= end:
                    consumer.commit(target)
                    committed = target
                else:
                    with pytest.raises(OffsetOutOfRangeError):
                        consumer.commit(target)
            elif op < 0.92:
                before = rng.randint(0, end + 3)
                trimmed = trim_embedded_topic(backend, TOPIC, before)  # type: ignore[arg-type]
                assert trimmed == max(beginning, min(before, end))  # capped at the end, never back
                beginning = trimmed
            # Invariants after every step.
            assert consumer.beginning_offsets() == {0: beginning}
            assert consumer.end_offsets() == {0: len(model)}
            assert consumer.committed() == committed
            assert consumer.lag() == {0: len(model) - (committed if committed is not None else beginning)}
    finally:
        publisher.close()
        consumer.close()


def _expected_pull(model: list[bytes], start: int, max_messages: int, max_bytes: int) -> list[bytes]:
    """The rule, stated independently: as many as fit in max_bytes, or the first one alone."""
    expected: list[bytes] = []
    for value in model[start : start + max_messages]:
        if expected and sum(map(len, expected)) + len(value) > max_bytes:
            break
        expected.append(value)
    return expected


def test_opening_retries_while_another_process_recovers_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite answers "locked" to the journal-mode statement during another process's WAL recovery
    # without calling the busy handler; opening waits that out instead of failing the caller
    real_connect = sqlite3.connect
    refusals = {"left": 3}

    class Recovering:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self._conn = conn

        def execute(self, sql: str, *args: object) -> object:
            if sql.startswith("PRAGMA journal_mode") and refusals["left"] > 0:
                refusals["left"] -= 1
                raise sqlite3.OperationalError("database is locked")
            return self._conn.execute(sql, *args)

        def __getattr__(self, name: str) -> object:
            return getattr(self._conn, name)

    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: Recovering(real_connect(*a, **k)))
    backend = EmbeddedBackend(tmp_path / "state.db", busy_timeout=5.0)
    try:
        conn = backend.connect()
        assert refusals["left"] == 0
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()
    finally:
        backend.close()

    refusals["left"] = 10**6  # a lock that never clears still fails, naming the file, once the timeout passed
    backend = EmbeddedBackend(tmp_path / "state.db", busy_timeout=0.3)
    try:
        with pytest.raises(BackendUnavailableError, match="state.db.*locked"):
            backend.connect()
    finally:
        backend.close()
