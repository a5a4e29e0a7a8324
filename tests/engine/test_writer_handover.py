"""Writers that others wait for hand over at once, on both back ends.

An instance holding the writer with nothing queued lets go as soon as another instance (of this
process or another) waits for it, instead of after ``writer_idle_timeout``; one with writes queued
commits them first, in groups. The idle time-outs here (30 s) are longer than the acquire time-outs
(20 s): without the handover every test below fails with a time-out instead of merely running slow.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.backends.base import AcquireMode, Backend, RawWriter
from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend
from airflow_provider_pulsarstate.engine.errors import OperationTimeoutError, PulsarStateError, WriterBusyError
from airflow_provider_pulsarstate.engine.leadership import read_leadership
from airflow_provider_pulsarstate.engine.manager import SharedStateManager
from airflow_provider_pulsarstate.testing.harness import FaultInjectingBackend, wait_until

WORKER = Path(__file__).with_name("handover_worker.py")
IDLE = 30.0  # longer than ACQUIRE: without a handover, a waiter times out before the holder lets go
ACQUIRE = 20.0
WORKER_OPTIONS = {"writer_idle_timeout": IDLE, "acquire_timeout": ACQUIRE}


def _log_of_keys(backend: Backend, topic: str, **options: Any) -> SharedStateManager[list[str], str]:
    """A manager whose state is the list of every key written, in log order (a duplicate shows)."""
    return SharedStateManager(
        backend,
        topic,
        initializer=list,
        applier=lambda state, key: state.append(key),
        **{"writer_idle_timeout": IDLE, "acquire_timeout": ACQUIRE, **options},
    )


def _put(manager: SharedStateManager[list[str], str], key: str) -> None:
    manager.write(lambda state: [key])


def _replayed(config: ConnectionConfig, topic: str) -> list[str]:
    backend = open_backend(config)
    try:
        with _log_of_keys(backend, topic) as replica:
            return replica.read(list, latest=True)
    finally:
        backend.close()


def _someone_waits(backend: Backend, topic: str) -> bool:
    """Whether an acquirer waits for ``topic``'s writer, as an observer sees it."""
    store = backend.underlying()
    if isinstance(store, EmbeddedBackend):
        fd = os.open(store.waiting_path(topic), os.O_RDONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False
    return read_leadership(backend, topic)[0].waiting_publishers > 0


@pytest.fixture
def second(backend_config: ConnectionConfig) -> Iterator[Backend]:
    """Another connection to the same store: another instance, as another process would have."""
    b = open_backend(backend_config)
    yield b
    b.close()


@pytest.fixture
def workers(backend_config: ConnectionConfig, topic: str) -> Iterator[Callable[..., list[subprocess.Popen[str]]]]:
    """``workers(keys)``: one handover_worker.py process per key, each ready (bootstrapped) on return;
    every one is ended at teardown."""
    started: list[subprocess.Popen[str]] = []
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def start(keys: list[str]) -> list[subprocess.Popen[str]]:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    json.dumps(dataclasses.asdict(backend_config)),
                    topic,
                    key,
                    json.dumps(WORKER_OPTIONS),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for key in keys
        ]
        started.extend(procs)
        for p in procs:
            while not p.stdout.readline().startswith("@ready"):  # type: ignore[union-attr]
                assert p.poll() is None, f"worker {p.pid} died (exit {p.returncode})"
        return procs

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(30)


def _go_and_collect(procs: list[subprocess.Popen[str]], *, within: float) -> tuple[dict[str, float], list[str]]:
    """Start every worker at once; their acknowledged keys (with the write's seconds) and failures."""
    for p in procs:
        p.stdin.write("go\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
    acked: dict[str, float] = {}
    failed: list[str] = []
    deadline = time.monotonic() + within
    for p in procs:
        line = ""
        while not line.startswith(("@ack ", "@failed ")):
            assert time.monotonic() < deadline, f"no answer from every worker within {within:.0f}s: {acked}, {failed}"
            line = p.stdout.readline()  # type: ignore[union-attr]
            assert line or p.poll() is None, f"worker {p.pid} died (exit {p.returncode})"
        if line.startswith("@ack "):
            _, key, seconds = line.split()
            acked[key] = float(seconds)
        else:
            failed.append(line.strip())
    for p in procs:
        p.stdin.close()  # type: ignore[union-attr]
    return acked, failed


def test_an_idle_writer_hands_over_to_another_instance(backend: Backend, second: Backend, topic: str) -> None:
    holder = _log_of_keys(backend, topic)
    other = _log_of_keys(second, topic)
    try:
        _put(holder, "first")
        assert holder.holds_writer
        other.start()
        started = time.monotonic()
        _put(other, "second")  # would time out after ACQUIRE seconds: the holder idles for IDLE
        took = time.monotonic() - started
        assert holder.stats["handovers"] == 1
        # held turns False only after the writer is closed, so the other may already have written
        # in between: wait for it rather than race it.
        wait_until(lambda: not holder.holds_writer, timeout=5.0, what="the holder to say it let go")
        assert took < ACQUIRE / 2, f"the waiting instance needed {took:.1f}s"
        _put(holder, "third")  # and back again
        assert other.stats["handovers"] == 1
        assert holder.read(list, latest=True) == ["first", "second", "third"]
    finally:
        holder.close()
        other.close()


def test_an_idle_writer_hands_over_to_another_process(
    backend: Backend, topic: str, workers: Callable[..., list[subprocess.Popen[str]]]
) -> None:
    holder = _log_of_keys(backend, topic)
    try:
        _put(holder, "holder")
        procs = workers(["worker"])
        acked, failed = _go_and_collect(procs, within=ACQUIRE * 3)
        assert not failed, failed
        assert acked["worker"] < ACQUIRE / 2, f"the other process needed {acked['worker']:.1f}s"
        assert holder.stats["handovers"] == 1
        assert holder.read(list, latest=True) == ["holder", "worker"]
    finally:
        holder.close()


def test_a_busy_writer_commits_its_queue_in_groups_before_handing_over(
    backend: Backend, second: Backend, topic: str
) -> None:
    faulty = FaultInjectingBackend(backend)
    holder = _log_of_keys(faulty, topic)
    other = _log_of_keys(second, topic)
    try:
        _put(holder, "warm")
        other.start()
        appended = holder.stats["records_appended"]
        faulty.delay_next_append(5.0)  # the holder stays busy with this one while the other queues up
        first = holder.write_async(lambda state: ["h0"])
        waiting: Future[None] = Future()
        threading.Thread(target=lambda: waiting.set_result(_put(other, "other"))).start()
        wait_until(lambda: _someone_waits(backend, topic), timeout=4.0, what="the other instance waiting")
        assert not first.done(), "the delayed append ended before the other instance queued: inconclusive"
        queued = [holder.write_async(lambda state, i=i: [f"h{i}"]) for i in range(1, 51)]
        for f in [first, *queued]:
            f.result(timeout=60)
        waiting.result(timeout=60)
        assert holder.stats["records_appended"] - appended <= 3, "the queued writes were not grouped"
        assert holder.stats["handovers"] == 1
        keys = holder.read(list, latest=True)
        assert keys == ["warm", *[f"h{i}" for i in range(51)], "other"], keys
    finally:
        holder.close()
        other.close()


def test_many_processes_writing_once_each_all_land_exactly_once(
    backend_config: ConnectionConfig, topic: str, workers: Callable[..., list[subprocess.Popen[str]]]
) -> None:
    """Twenty task-like processes put one key each at the same moment and keep running after it."""
    keys = [f"w{i:02d}" for i in range(20)]
    procs = workers(keys)
    acked, failed = _go_and_collect(procs, within=ACQUIRE * 3)
    assert not failed, failed[:3]
    assert sorted(acked) == keys
    assert sorted(_replayed(backend_config, topic)) == keys  # every write once: no loss, no duplicate


def test_a_waiter_gets_the_writer_as_the_holder_lets_go(backend: Backend, second: Backend, topic: str) -> None:
    holder = backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=10)
    assert not holder.has_waiters()
    granted: Future[tuple[RawWriter, float]] = Future()

    def wait_for_it() -> None:
        writer = second.acquire_writer(topic, mode=AcquireMode.WAIT, timeout=ACQUIRE)
        granted.set_result((writer, time.monotonic()))

    threading.Thread(target=wait_for_it).start()
    wait_until(holder.has_waiters, timeout=10.0, what="the holder seeing the waiter")
    released = time.monotonic()
    holder.close()
    writer, at = granted.result(timeout=ACQUIRE)
    try:
        assert at - released < 2.0, f"the waiter got the writer {at - released:.2f}s after it was released"
        assert writer.epoch > holder.epoch
        assert not writer.has_waiters()
    finally:
        writer.close()


def test_a_waiter_that_times_out_leaves_nothing_in_the_way(backend: Backend, second: Backend, topic: str) -> None:
    holder = backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=10, name="holder")
    cpu = time.process_time()
    with pytest.raises(OperationTimeoutError):
        second.acquire_writer(topic, mode=AcquireMode.WAIT, timeout=2.0, name="gave-up")
    cpu = time.process_time() - cpu
    assert cpu < 0.5, f"waiting 2 s cost {cpu:.2f}s of CPU"
    holder.close()

    def next_writer() -> RawWriter | None:
        try:
            return second.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=5, name="next")
        except WriterBusyError:
            return None

    writer = wait_until(next_writer, timeout=5.0, what="a FAIL_FAST acquisition after the holder let go")
    try:
        assert not writer.has_waiters()
        seen = read_leadership(second, topic)[0]
        assert seen.leader == "next" and not seen.other_producers and seen.waiting_publishers == 0
    finally:
        writer.close()


def test_without_handover_the_idle_writer_is_kept(backend: Backend, second: Backend, topic: str) -> None:
    """``handover_check_interval=None`` keeps the former behaviour: held until its idle time-out."""
    holder = _log_of_keys(backend, topic, handover_check_interval=None)
    other = _log_of_keys(second, topic, acquire_timeout=1.0)
    try:
        _put(holder, "first")
        with pytest.raises(PulsarStateError):
            _put(other, "second")
        assert holder.holds_writer and holder.stats["handovers"] == 0
    finally:
        holder.close()
        other.close()


@pytest.mark.pulsar
def test_a_writer_granted_after_waiting_survives_an_unload(pulsar_broker: Any, topic: str) -> None:
    """A writer that queued for the topic lives on a client of its own: an unload (as the orphan
    sweeper does) disconnects it, and it reconnects with its epoch and leadership, losing no write."""
    from tests.conftest import pulsar_config

    first = open_backend(pulsar_config(pulsar_broker))
    second = open_backend(pulsar_config(pulsar_broker))
    try:
        holder = first.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=10, name="holder")
        threading.Timer(1.0, holder.close).start()
        writer = second.acquire_writer(topic, mode=AcquireMode.WAIT, timeout=ACQUIRE, name="waited")
        writer.append([b"before"], timeout=10)
        second.admin.unload(topic)  # type: ignore[attr-defined]
        writer.append([b"after"], timeout=10)
        seen = read_leadership(second, topic)[0]
        assert seen.leader == "waited" and second.current_epoch(topic) == writer.epoch
        writer.close()
        reader = second.create_reader(topic)
        assert [reader.read_next(timeout=10).payload for _ in range(2)] == [b"before", b"after"]  # type: ignore[union-attr]
        reader.close()
    finally:
        first.close()
        second.close()
