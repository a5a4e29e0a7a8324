"""The process-wide pool of borrowed maps (hooks/shared_objects.py): never closed while borrowed,
bounded in number (least recently used closed first), closed when idle, discarded by topic."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_pulsarstate import ConnectionConfig
from airflow_provider_pulsarstate.hooks import shared_objects


class Closable:
    def __init__(self, name: str) -> None:
        self.name, self.closed = name, False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def config(tmp_path: Path) -> Iterator[ConnectionConfig]:
    shared_objects.close_all()
    yield ConnectionConfig(url=str(tmp_path / "state.db"))
    shared_objects.set_limits(
        max_open=shared_objects.DEFAULT_MAX_OPEN, idle_seconds=shared_objects.DEFAULT_IDLE_SECONDS
    )
    shared_objects.close_all()


def test_a_borrowed_object_is_shared_and_never_closed_while_in_use(config: ConnectionConfig) -> None:
    shared_objects.set_limits(max_open=1)
    with shared_objects.borrow(config, ("m", "t1"), lambda b: Closable("a")) as a:
        with shared_objects.borrow(config, ("m", "t1"), lambda b: Closable("again")) as same:
            assert same is a  # opened once per process
        with shared_objects.borrow(config, ("m", "t2"), lambda b: Closable("b")) as b:
            assert not a.closed and not b.closed  # over the bound, but both in use
        assert not a.closed and b.closed  # b was the idle one over the bound
    assert not a.closed and shared_objects.open_count() == 1


def test_the_least_recently_used_idle_objects_are_closed_over_the_bound(config: ConnectionConfig) -> None:
    shared_objects.set_limits(max_open=3)
    made = {}
    for name in ("a", "b", "c"):
        with shared_objects.borrow(config, ("m", name), lambda b, n=name: made.setdefault(n, Closable(n))):
            pass
    with shared_objects.borrow(config, ("m", "a"), lambda b: Closable("a2")):  # a is now the most recent
        pass
    with shared_objects.borrow(config, ("m", "d"), lambda b: made.setdefault("d", Closable("d"))):
        pass
    assert {n for n, c in made.items() if c.closed} == {"b"} and shared_objects.open_count() == 3


def test_idle_objects_are_closed_after_the_idle_time(config: ConnectionConfig) -> None:
    shared_objects.set_limits(idle_seconds=0.2)
    with shared_objects.borrow(config, ("m", "x"), lambda b: Closable("x")) as x:
        pass
    deadline = time.monotonic() + 10
    while not x.closed:  # the process's reaper thread closes it
        assert time.monotonic() < deadline, "an idle object was never closed"
        time.sleep(0.05)
    assert shared_objects.open_count() == 0


def test_discard_topic_closes_the_idle_objects_of_one_topic(config: ConnectionConfig) -> None:
    with (
        shared_objects.borrow(config, ("xcom-run", "persistent://p/n/t1"), lambda b: Closable("1")) as one,
        shared_objects.borrow(config, ("state-map", "persistent://p/n/t2"), lambda b: Closable("2")) as two,
    ):
        assert shared_objects.discard_topic("persistent://p/n/t1") == 0  # in use: kept
    assert shared_objects.discard_topic("persistent://p/n/t1") == 1
    assert one.closed and not two.closed
