"""OrphanSweeper's bookkeeping, with a stand-in admin (the broker-side behaviour is covered by
test_leadership's frozen-broker test): a watched name that appears is unloaded once; a name
claimed back by a new creation of ours is never unloaded; a watch ends after its time."""

from __future__ import annotations

import threading
import time
from typing import Any

from airflow_provider_pulsarstate.engine.backends.orphans import OrphanSweeper


class FakeAdmin:
    def __init__(self) -> None:
        self.publishers: dict[str, list[str]] = {}
        self.unloads: list[str] = []
        self.closed = threading.Event()
        self.fail = False

    def topic_stats(self, topic: str) -> dict[str, Any]:
        if self.fail:
            raise ConnectionError("broker frozen")
        return {"publishers": [{"producerName": n} for n in self.publishers.get(topic, [])]}

    def unload(self, topic: str) -> None:
        self.unloads.append(topic)
        self.publishers[topic] = []

    def close(self) -> None:
        self.closed.set()


def _until(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_an_orphan_that_appears_late_is_unloaded_once() -> None:
    admin = FakeAdmin()
    sweeper = OrphanSweeper(lambda: admin, watch=5.0, interval=0.01)
    admin.fail = True  # the broker is frozen when the creation times out
    sweeper.watch("t", "cand-a")
    time.sleep(0.1)
    admin.fail = False
    admin.publishers["t"] = ["holder", "cand-a"]
    _until(lambda: sweeper.dropped == 1)
    assert admin.unloads == ["t"] and sweeper.watching == []
    _until(admin.closed.is_set)  # nothing left to watch: the thread ends and closes its admin


def test_a_name_claimed_back_is_never_unloaded() -> None:
    admin = FakeAdmin()
    sweeper = OrphanSweeper(lambda: admin, watch=5.0, interval=0.01)
    sweeper.watch("t", "cand-a")
    assert sweeper.claim("t", "cand-a") is True
    assert sweeper.claim("t", "cand-a") is False
    admin.publishers["t"] = ["cand-a"]  # our own new producer, known to the client
    time.sleep(0.1)
    assert admin.unloads == [] and sweeper.dropped == 0


def test_a_watch_ends_after_its_time_and_close_stops_all() -> None:
    admin = FakeAdmin()
    sweeper = OrphanSweeper(lambda: admin, watch=0.05, interval=0.01)
    sweeper.watch("t", "cand-a")
    _until(lambda: sweeper.watching == [])
    admin.publishers["t"] = ["cand-a"]
    time.sleep(0.05)
    assert admin.unloads == []
    sweeper.close()
    sweeper.watch("t", "cand-b")  # after close: ignored
    assert sweeper.watching == []
