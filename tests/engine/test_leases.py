"""Durable leases with fencing tokens (engine/recipes/lease.py), on both back ends.

Candidates that must not share memory run as separate processes (tests/engine/lease_worker.py);
the rest runs in-process with one Leases per simulated process (each has its own replica and its
own observation clock).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConnectionConfig, PulsarMap, open_backend
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import (
    ConfigurationError,
    CorruptEntryError,
    LeaseLostError,
    LeaseTimeoutError,
)
from airflow_provider_pulsarstate.engine.recipes.lease import Lease, LeaseInfo, LeaseKeeper, Leases, boot_clock
from airflow_provider_pulsarstate.testing import FaultInjectingBackend, wait_until
from tests.engine.test_epochs import append_foreign_frame

WORKER = Path(__file__).with_name("lease_worker.py")
TTL = 1.5


@pytest.fixture
def leases(backend: Backend, topic: str) -> Iterator[Any]:
    """A factory of Leases on the test's lease log, closed at teardown."""
    made: list[Leases] = []

    def make(**options: Any) -> Leases:
        made.append(Leases(backend, topic, poll_interval=0.05, **options))
        return made[-1]

    yield make
    for x in made:
        x.close()


class Worker:
    def __init__(self, config: ConnectionConfig, topic: str, map_topic: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(dataclasses.asdict(config)), topic, map_topic],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def ready(self) -> None:
        assert self.reply() == {"ready": True}

    def send(self, **cmd: Any) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def reply(self) -> dict[str, Any]:
        while True:
            line = self.proc.stdout.readline()  # type: ignore[union-attr]
            assert line, f"worker {self.proc.pid} died (exit {self.proc.poll()})"
            if line.startswith("@reply "):
                return json.loads(line[len("@reply ") :])

    def call(self, **cmd: Any) -> dict[str, Any]:
        self.send(**cmd)
        return self.reply()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def workers(backend_config: ConnectionConfig, topic: str) -> Iterator[Any]:
    started: list[Worker] = []
    map_topic = topic + "-guarded"

    def start(n: int) -> list[Worker]:
        new = [Worker(backend_config, topic, map_topic) for _ in range(n)]
        started.extend(new)
        for w in new:
            w.ready()
        return new

    yield start
    for w in started:
        with_cont = w.proc.poll() is None
        if with_cont:
            os.kill(w.proc.pid, signal.SIGCONT)
        w.stop()


def test_processes_race_one_wins_then_the_others_after_release_and_after_expiry(workers: Any, topic: str) -> None:
    a, b, c = workers(3)
    for w in (a, b, c):
        w.send(cmd="acquire", name="job", holder=f"h{w.proc.pid}", ttl=30, timeout=0)  # freed only by release
    replies = [w.reply() for w in (a, b, c)]
    winners = [r for r in replies if "error" not in r]
    assert len(winners) == 1, replies
    winner = (a, b, c)[replies.index(winners[0])]
    losers = [w for w in (a, b, c) if w is not winner]
    for r in replies:
        if r is not winners[0]:
            assert r["error"] == "LeaseTimeoutError" and r["current_holder"] == f"h{winner.proc.pid}"
    assert winners[0]["lease"]["token"] == 1

    # the loser waits; it wins right after the release
    losers[0].send(cmd="acquire", name="job", holder="second", ttl=TTL, timeout=20)
    time.sleep(0.3)
    released = winner.call(cmd="release")
    assert released["released"] is True
    second = losers[0].reply()
    assert second["lease"]["token"] == 2 and second["t1"] - released["t1"] < 3  # not 30 s

    # the handle travels (JSON) to another process, which re-validates it by renewing
    moved = losers[1].call(cmd="renew", lease=second["lease"])
    assert moved["lease"] == second["lease"] and moved["remaining"] > 0
    forged = losers[1].call(cmd="renew", lease={**second["lease"], "token": 7})
    assert forged["error"] == "LeaseLostError" and "token 7" in forged["message"]

    # nobody renews any more: another candidate takes it after expiry, not before
    third = winner.call(cmd="acquire", name="job", holder="third", ttl=TTL, timeout=20)
    assert third["lease"]["token"] == 3
    assert third["t1"] >= moved["t0"] + TTL  # not before the last renewal SENT + ttl
    lost = losers[0].call(cmd="renew")
    assert lost["error"] == "LeaseLostError" and lost["current_holder"] == "third"


def test_a_paused_holder_is_lost_and_fenced(workers: Any, backend: Backend, topic: str) -> None:
    old, new = workers(2)
    held = old.call(cmd="acquire", name="job", holder="old", ttl=TTL, timeout=10)
    assert old.call(cmd="put", key="k", value="old-1").get("error") is None
    time.sleep(0.3)  # let its writers go idle (not needed for safety: the others fence them)
    os.kill(old.proc.pid, signal.SIGSTOP)
    try:
        took = new.call(cmd="acquire", name="job", holder="new", ttl=TTL, timeout=20)
        assert took["lease"]["token"] == held["lease"]["token"] + 1
        assert new.call(cmd="put", key="k", value="new-1").get("error") is None
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)
    renew = old.call(cmd="renew")
    assert renew["error"] == "LeaseLostError" and renew["current_holder"] == "new"
    assert "token 1" in renew["message"] and "token 2" in renew["message"]
    put = old.call(cmd="put", key="k", value="old-2")
    assert put["error"] == "LeaseFencedError", put
    with PulsarMap(backend, topic + "-guarded") as table:
        assert table.to_dict(latest=True) == {"k": "new-1"}


def test_tokens_increase_across_holders_reacquisition_steal_expiry_and_reopening(
    backend_config: ConnectionConfig, topic: str
) -> None:
    tokens = []
    backend = open_backend(backend_config)
    a, b = Leases(backend, topic, poll_interval=0.05), Leases(backend, topic, poll_interval=0.05)
    try:
        first = a.acquire("n", "a", ttl=TTL)
        tokens.append(first.token)
        tokens.append(a.acquire("n", "a", ttl=TTL).token)  # re-acquisition by the holder
        with pytest.raises(LeaseLostError):
            a.renew(first)  # the earlier token is superseded
        stolen = b.acquire("n", "b", ttl=TTL, steal=True)  # explicit takeover of a valid lease
        tokens.append(stolen.token)
        started = time.monotonic()
        tokens.append(a.acquire("n", "a", ttl=TTL, timeout=10).token)  # after b's expiry
        assert time.monotonic() - started >= TTL * 0.9
        assert b.describe("n").transitions == 2
    finally:
        a.close()
        b.close()
        backend.close()
    backend = open_backend(backend_config)  # a new process: replays (or loads) the log
    try:
        with Leases(backend, topic) as c:
            info = c.describe("n")
            assert info.holder == "a" and info.token == tokens[-1] and info.observed_age < 1
            tokens.append(c.acquire("n", "c", ttl=TTL, steal=True).token)
    finally:
        backend.close()
    assert tokens == [1, 2, 3, 4, 5]


def test_renew_release_steal_and_timeouts(leases: Any) -> None:
    a, b = leases(), leases()
    lease = a.acquire("n", "a", ttl=0.5)
    assert 0.3 < a.remaining(lease) <= 0.5
    assert b.remaining(lease) == 0.0  # never sent here
    assert not b.describe("n").expired  # b observes the acquire now ...
    time.sleep(0.7)  # ... and sees it expire ttl later
    assert a.remaining(lease) == 0.0 and b.describe("n").expired
    renewed = a.renew(lease, ttl=TTL)  # after expiry, nobody took it: allowed
    assert renewed.token == lease.token and renewed.ttl == TTL and a.remaining(renewed) > 1
    with pytest.raises(LeaseTimeoutError) as err:
        b.acquire("n", "b", ttl=TTL, timeout=0.3)
    assert err.value.current.holder == "a" and "'a'" in str(err.value) and err.value.lease == "n"
    foreign = Lease(name="n", holder="b", token=lease.token, ttl=TTL, topic=lease.topic)
    assert b.release(foreign) is False and b.describe("n").holder == "a"  # refused: another holder
    assert b.release(Lease("n", "a", lease.token + 1, TTL, lease.topic)) is False  # another token
    assert a.release(renewed) is True
    assert a.release(renewed) is False and a.release(renewed) is False  # idempotent
    assert a.remaining(renewed) == 0.0
    info = b.describe("n")
    assert info.holder is None and info.token == lease.token
    with pytest.raises(LeaseLostError) as lost:
        a.renew(renewed)
    assert "released" in str(lost.value) and lost.value.token == lease.token


def test_describe_and_watch_without_acquiring(leases: Any) -> None:
    holder, watcher = leases(), leases()
    assert watcher.describe("n") is None
    seen: list[LeaseInfo] = []
    stop = watcher.watch("n", seen.append)
    watcher.watch("other", lambda info: seen.append(None))  # changes of other names are not reported here
    lease = holder.acquire("n", "a", ttl=TTL)
    holder.renew(lease)
    holder.release(lease)
    wait_until(lambda: len(seen) >= 3, timeout=10, what="three changes watched")
    assert [(i.holder, i.token) for i in seen[:3]] == [("a", 1), ("a", 1), (None, 1)]
    assert seen[1].renewed_at >= seen[1].acquired_at
    stop()
    holder.acquire("n", "b", ttl=TTL)
    time.sleep(0.5)
    assert len(seen) == 3
    assert watcher.describe("n").holder == "b"
    assert watcher.manager.stats["writes_committed"] == 0  # watching wrote nothing


def test_checkpoints_keep_tokens_and_not_observation_times(leases: Any) -> None:
    a = leases()
    lease = a.acquire("n", "a", ttl=TTL)
    for _ in range(5):
        lease = a.renew(lease)
    assert a.manager.checkpoint() is not None
    fresh = leases()
    info = fresh.describe("n")
    assert fresh.manager.stats["checkpoint_loaded_offset"] >= 0
    assert (info.holder, info.token, info.transitions) == ("a", 1, 0) and info.observed_age < 0.5
    assert fresh.acquire("n", "b", ttl=TTL, steal=True).token == 2


def test_bad_input_names_the_field(leases: Any, backend: Backend, topic: str) -> None:
    a = leases()
    for kwargs, field in (
        ({"name": "", "holder": "h", "ttl": 1}, "lease name"),
        ({"name": "n", "holder": "", "ttl": 1}, "holder"),
        ({"name": "n", "holder": "h", "ttl": 0}, "ttl"),
        ({"name": "n", "holder": "h", "ttl": float("nan")}, "ttl"),
        ({"name": "n", "holder": "h", "ttl": 1, "timeout": -1}, "timeout"),
    ):
        with pytest.raises(ConfigurationError, match=field):
            a.acquire(**kwargs)
    with pytest.raises(ConfigurationError, match="token"):
        Lease.from_json({"name": "n", "holder": "h", "token": 0, "ttl": 1, "topic": topic})
    with pytest.raises(ConfigurationError, match="lease log"):
        a.renew(Lease("n", "h", 1, 1.0, topic + "-elsewhere"))
    a.acquire("n", "h", ttl=TTL)
    offset = a.manager.applied_offset
    a.close()  # releases the lease log's writer: Pulsar takes no shared append beside it
    bad = json.dumps({"op": "acquire", "name": "n", "holder": "x", "token": -3, "ttl": 1, "at": 0}).encode()
    append_foreign_frame(backend, topic, bad, epoch=backend.current_epoch(topic), offset=offset + 1)
    with pytest.raises(CorruptEntryError) as err:
        leases().describe("n")
    assert "'token'" in str(err.value) and f"offset {offset + 1}" in str(err.value) and err.value.topic == topic


# -- keeping a lease: on time when cut off, on a clock that runs through suspend ---------------------
def test_a_keeper_cut_off_from_the_lease_log_reports_the_loss_by_the_expiry(backend: Backend, topic: str) -> None:
    """A renew that blocks (the lease log does not answer) does not hold back ``on_lost``: it fires
    at the expiry of the last renew that got through, long before the blocked call returns."""
    ttl, blocked_for = 2.0, 8.0
    faulty = FaultInjectingBackend(backend)
    leases = Leases(faulty, topic, poll_interval=0.05, operation_timeout=20.0)
    try:
        lease = leases.acquire("spark-job", holder="a", ttl=ttl, timeout=20)
        lost_at: list[float] = []
        keeper = LeaseKeeper(leases, lease, interval=0.3, on_lost=lambda err: lost_at.append(boot_clock())).start()
        wait_until(lambda: keeper.renewals >= 2, timeout=20, what="two renewals")
        faulty.delay_next_append(blocked_for)  # the next renew's append hangs far past the ttl
        cut_at = boot_clock()  # every renew that got through was sent before this
        renewals = keeper.renewals
        wait_until(lambda: lost_at, timeout=blocked_for - 1, what="on_lost")
        assert lost_at[0] <= cut_at + ttl + 1.5, f"on_lost {lost_at[0] - cut_at:.2f}s after the cut (ttl {ttl}s)"
        assert "delay" in faulty.injected and keeper.renewals <= renewals + 1
        assert isinstance(keeper.lost, LeaseLostError) and "expired" in str(keeper.lost)
        keeper.stop()
        assert len(lost_at) == 1
    finally:
        leases.close()


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="CLOCK_BOOTTIME is Linux only")
def test_leases_count_validity_on_a_clock_that_runs_through_suspend(
    backend: Backend, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    boot = [1000.0]
    real = time.clock_gettime
    monkeypatch.setattr(time, "clock_gettime", lambda clock: boot[0] if clock == time.CLOCK_BOOTTIME else real(clock))
    leases = Leases(backend, topic, poll_interval=0.05)  # the default clock
    try:
        lease = leases.acquire("suspended", holder="a", ttl=30.0, timeout=10)
        assert leases.remaining(lease) == 30.0
        boot[0] += 31.0  # a suspend: boot time moves on, monotonic time does not
        assert leases.remaining(lease) == 0.0
        keeper = LeaseKeeper(leases, lease, interval=60.0).start()
        wait_until(lambda: keeper.lost is not None, timeout=5, what="the loss")
        keeper.stop()
        with pytest.raises(LeaseLostError, match="expired"):
            keeper.check()
    finally:
        leases.close()


def test_transitions_name_who_held_which_token_and_how_it_ended(
    leases: Any, backend_config: ConnectionConfig, topic: str
) -> None:
    a, b = leases(), leases()
    first = a.acquire("n", "a", ttl=0.3)
    time.sleep(0.5)
    second = b.acquire("n", "b", ttl=TTL)  # after a's expiry
    third = a.acquire("n", "a", ttl=TTL, steal=True)  # b's token was still valid
    a.release(third)
    a.renew(a.acquire("other", "c", ttl=TTL))  # a renewal is not a transition
    seen = [(t.name, t.event, t.holder, t.token) for t in b.transitions()]
    assert seen == [
        ("other", "acquired", "c", 1),
        ("n", "released", "a", third.token),
        ("n", "acquired", "a", third.token),
        ("n", "superseded", "b", second.token),
        ("n", "acquired", "b", second.token),
        ("n", "expired", "a", first.token),
        ("n", "acquired", "a", first.token),
    ]
    assert [t.event for t in b.transitions("n", limit=2)] == ["released", "acquired"]
    expiry = b.transitions("n")[-2]
    assert expiry.at == pytest.approx(b.transitions("n")[-1].at + 0.3)
    with open_backend(backend_config) as other, Leases(other, topic) as fresh:  # a new reader replays the log
        assert [(t.name, t.event, t.holder, t.token) for t in fresh.transitions()] == seen
    with pytest.raises(ConfigurationError, match="limit"):
        b.transitions(limit=0)
