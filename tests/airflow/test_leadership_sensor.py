"""LeadershipSensor and LeadershipTrigger on both back ends.

The sensor runs inside real ``dag.test()`` runs (SQLite metadata DB) in poke, deferred and
acquire modes. Each sensor first finds its mode unmet; an :class:`Actor` thread of this process
(``dag.test()`` runs tasks and triggers here) then changes who leads: it takes or releases the
topic's exclusive writer, or releases a lease, as the task in question needs.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate import AcquireMode
from airflow_provider_pulsarstate.engine.recipes.lease import Lease
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.sensors.leadership import LeadershipSensor
from airflow_provider_pulsarstate.triggers.leadership import LeadershipTrigger
from airflow_provider_pulsarstate.triggers.leadership_conditions import LeadershipConditionError, check_result, evaluate
from tests.airflow.dagruns import TEST_DAGS, load_dag, run_dag
from tests.airflow.trigger_driver import BLOCKING_CONTROL_SECONDS, LOOP_LAG_LIMIT, cancel_midway, drive

SENSOR_DAGS = TEST_DAGS / "leadership_sensor_dags.py"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Actor:
    """Runs ``actions[task_id]`` (after ``delay``) the first time that sensor finds its mode unmet,
    and records every event the trigger yields. Holds the writers it takes until :meth:`stop`."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, actions: dict[str, Callable[[Actor], None]], *, delay: float = 0.5
    ) -> None:
        self.actions, self.delay = actions, delay
        self.signals: queue.Queue[str | None] = queue.Queue()
        self.done: list[str] = []
        self.events: list[Any] = []
        self.hook = PulsarStateHook()
        self.writers: dict[str, Any] = {}
        self.on_event: Callable[[Actor, Any], None] | None = None  # runs before the event reaches the sensor
        self._waiting: set[tuple[str, str]] = set()
        actor = self
        original_observe, original_acquire = LeadershipSensor._observe, LeadershipSensor._try_acquire
        original_run = LeadershipTrigger.run

        def signal_once(sensor: LeadershipSensor, context: Any) -> None:
            key = (context["ti"].run_id, sensor.task_id) if context else ("?", sensor.task_id)
            if key not in actor._waiting:
                actor._waiting.add(key)
                actor.signals.put(sensor.task_id)

        def observe(sensor: LeadershipSensor) -> Any:
            result = original_observe(sensor)
            if not result["met"]:
                signal_once(sensor, None)
            return result

        def try_acquire(sensor: LeadershipSensor, context: Any, **kw: Any) -> Any:
            lease = original_acquire(sensor, context, **kw)
            if lease is None:
                signal_once(sensor, context)
            return lease

        async def run(trigger: LeadershipTrigger) -> Any:
            async for event in original_run(trigger):
                actor.events.append(event.payload)
                if actor.on_event is not None:
                    await asyncio.to_thread(actor.on_event, actor, event.payload)
                yield event

        monkeypatch.setattr(LeadershipSensor, "_observe", observe)
        monkeypatch.setattr(LeadershipSensor, "_try_acquire", try_acquire)
        monkeypatch.setattr(LeadershipTrigger, "run", run)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (task_id := self.signals.get()) is not None:
            time.sleep(self.delay)
            action = self.actions.get(task_id)
            if action is not None:
                action(self)
            self.done.append(task_id)

    def take(self, topic: str, name: str) -> None:
        full = self.hook.topic_name(topic)
        self.writers[name] = self.hook.get_conn().acquire_writer(
            full, mode=AcquireMode.FAIL_FAST, timeout=10, name=name
        )

    def drop(self, name: str) -> None:
        self.writers.pop(name).close()

    def release_lease(self, lease_topic: str, name: str) -> None:
        leases = self.hook.get_leases(lease_topic)
        info = leases.describe(name)
        assert info is not None and info.holder is not None
        lease = Lease(name=name, holder=info.holder, token=info.token, ttl=info.ttl, topic=leases.topic)
        assert leases.release(lease)

    def stop(self) -> None:
        self.signals.put(None)
        self._thread.join(timeout=60)
        for w in self.writers.values():
            w.close()
        self.hook.close()


# ---------------------------------------------------------------------------------- dag.test()
def test_sensor_modes_in_poke_deferred_and_from_trigger(
    dag_bundles: None, state_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag = load_dag(SENSOR_DAGS, "leadership_sensor_modes")
    topic = _name("lead")
    actor = Actor(
        monkeypatch,
        {
            "leader_poke": lambda a: a.take(topic, "cand-a"),  # nobody led: cand-a takes the topic
            "no_leader_deferred": lambda a: a.drop("cand-a"),  # cand-a led: it lets go
            "changed_from_trigger": lambda a: a.take(topic, "cand-b"),  # same epoch: cand-b takes over
        },
    )
    try:
        outcome = run_dag(dag, {"topic": topic})
    finally:
        actor.stop()

    assert outcome.state == "success", outcome.states
    assert actor.done == ["leader_poke", "no_leader_deferred", "changed_from_trigger"]
    full = outcome.xcoms["create"]
    led = outcome.xcoms["leader_poke"]
    assert (led["topic"], led["mode"], led["leader_name"], led["met"]) == (full, "leader", "cand-a", True)
    [p] = led["partitions"]
    assert (p["partition"], p["leader"], p["access_mode"]) == (None, "cand-a", "Exclusive") and isinstance(
        p["epoch"], int
    )
    free = outcome.xcoms["no_leader_deferred"]
    assert free["met"] and free["partitions"][0]["leader"] is None and free["partitions"][0]["epoch"] == p["epoch"]
    changed = outcome.xcoms["changed_from_trigger"]
    assert changed["since_epoch"] == p["epoch"] and changed["partitions"][0]["leader"] == "cand-b"
    assert changed["partitions"][0]["epoch"] > p["epoch"]
    # the deferred sensors completed through their trigger; the poke sensor never deferred
    assert [e["status"] for e in actor.events] == ["success", "success"]
    assert [e["leadership"] for e in actor.events] == [free, changed]


def test_timeout_fails_and_soft_fail_skips_in_both_modes(
    dag_bundles: None, state_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag = load_dag(SENSOR_DAGS, "leadership_sensor_timeouts")
    actor = Actor(monkeypatch, {})
    try:
        outcome = run_dag(dag, {"topic": _name("nobody")})
    finally:
        actor.stop()
    assert outcome.state == "failed"
    assert outcome.states == {
        "create": "success",
        "timeout_poke": "failed",
        "timeout_deferred": "failed",
        "soft_poke": "skipped",
        "soft_deferred": "skipped",
    }
    # the deferred ones timed out through their trigger's own deadline (dag.test() does not enforce
    # the deferral timeout), with the last observation
    assert [e["status"] for e in actor.events] == ["timeout", "timeout"]
    assert all(
        e["leadership"]["met"] is False and e["leadership"]["partitions"][0]["leader"] is None for e in actor.events
    )
    for task_id in ("timeout_poke", "timeout_deferred", "soft_poke", "soft_deferred"):
        assert 2.0 <= outcome.durations[task_id] < 30, outcome.durations


def test_acquire_mode_wins_a_lease_in_poke_deferred_and_after_expiry(
    dag_bundles: None, state_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag = load_dag(SENSOR_DAGS, "leadership_sensor_acquire")
    name, lease_topic = _name("lease"), _name("leases")
    release = lambda a: a.release_lease(lease_topic, name)  # noqa: E731
    actor = Actor(monkeypatch, {"acquire_poke": release, "acquire_deferred": release})  # the dead holder is left alone
    try:
        outcome = run_dag(dag, {"lease_name": name, "lease_topic": lease_topic})
    finally:
        actor.stop()

    assert outcome.state == "success", outcome.states
    assert actor.done[:3] == ["acquire_poke", "acquire_deferred", "acquire_expired"]
    assert sorted(actor.done[3:]) == ["acquire_soft_deferred", "acquire_soft_poke"]  # parallel: either order
    x = outcome.xcoms
    full = x["occupy_1"]["topic"]
    assert full.endswith(lease_topic)
    # one more token per acquisition, whoever acquired
    assert [
        x[t]["token"]
        for t in ("occupy_1", "acquire_poke", "occupy_2", "acquire_deferred", "occupy_dead", "acquire_expired")
    ] == [1, 2, 3, 4, 5, 6]
    run_id = x["acquire_poke"]["holder"].split("/")[1]
    for task_id in ("acquire_poke", "acquire_deferred", "acquire_expired"):
        lease = Lease.from_json(x[task_id])
        assert (lease.name, lease.ttl, lease.topic) == (name, 30.0, full)
        assert lease.holder == f"leadership_sensor_acquire/{run_id}/{task_id}/-1"
    assert x["release_poke"] is True and x["release_deferred"] is True
    # deferred: the trigger reported the lease free (released), then expired (held, silent > ttl),
    # then gave up (acquire_soft_deferred)
    assert [e["status"] for e in actor.events] == ["free", "free", "timeout"]
    released, expired = (e["lease"] for e in actor.events[:2])
    assert released["held"] is False and released["token"] == 3
    assert expired["held"] is True and expired["expired"] is True and expired["holder"] == "deployment-dead"
    # the dead holder's 2 s lease passed on after the trigger's and the worker's own observations
    assert 2.0 <= outcome.durations["acquire_expired"] < 30, outcome.durations
    # held by a live holder: both modes give up at their timeout and, with soft_fail, are skipped
    assert outcome.states["acquire_soft_poke"] == outcome.states["acquire_soft_deferred"] == "skipped"
    assert 2.0 <= outcome.durations["acquire_soft_poke"] < 30 and 2.0 <= outcome.durations["acquire_soft_deferred"] < 30
    with PulsarStateHook() as hook:
        info = hook.get_leases(lease_topic).describe(name)
    assert info is not None and info.holder == x["acquire_expired"]["holder"] and info.token == 6


def test_acquire_mode_that_loses_the_race_defers_again_until_it_wins(
    dag_bundles: None, state_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag = load_dag(SENSOR_DAGS, "leadership_sensor_acquire_race")
    name, lease_topic = _name("lease"), _name("leases")
    actor = Actor(monkeypatch, {"acquire_race": lambda a: a.release_lease(lease_topic, name)})
    retaken: list[int] = []

    def retake_once(a: Actor, payload: Any) -> None:
        if payload.get("status") == "free" and not retaken:
            leases = a.hook.get_leases(lease_topic)
            retaken.append(leases.acquire(name, "deployment-c", ttl=1.5, timeout=10).token)

    actor.on_event = retake_once
    try:
        outcome = run_dag(dag, {"lease_name": name, "lease_topic": lease_topic})
    finally:
        actor.stop()
    assert outcome.state == "success", outcome.states
    assert retaken == [2]
    # free (released) -> lost to deployment-c -> deferred again -> free (deployment-c expired) -> won
    assert [e["status"] for e in actor.events] == ["free", "free"]
    assert actor.events[0]["deadline"] == actor.events[1]["deadline"]  # the same deadline across deferrals
    assert actor.events[1]["lease"]["holder"] == "deployment-c" and actor.events[1]["lease"]["expired"] is True
    won = outcome.xcoms["acquire_race"]
    assert won["token"] == 3 and won["holder"].endswith("/acquire_race/-1")


# ---------------------------------------------------------------------------------- conditions and arguments
def test_conditions_hold_on_every_partition() -> None:
    held = {
        "partition": 0,
        "leader": "a",
        "access_mode": "Exclusive",
        "epoch": 4,
        "waiting_publishers": 0,
        "other_producers": [],
    }
    free = {
        "partition": 1,
        "leader": None,
        "access_mode": None,
        "epoch": None,
        "waiting_publishers": 0,
        "other_producers": [],
    }
    assert evaluate("t", "leader", [held])["met"] and not evaluate("t", "leader", [held, free])["met"]
    assert (
        evaluate("t", "leader", [held], leader_name="a")["met"]
        and not evaluate("t", "leader", [held], leader_name="b")["met"]
    )
    assert evaluate("t", "no_leader", [free])["met"] and not evaluate("t", "no_leader", [held, free])["met"]
    assert (
        evaluate("t", "changed", [held], since_epoch="3")["met"]
        and not evaluate("t", "changed", [held], since_epoch=4)["met"]
    )
    assert evaluate("t", "changed", [free], since_epoch=-1)["met"] is False  # never held: epoch counts as -1
    assert evaluate("t", "changed", [held], since_epoch="None")["since_epoch"] == -1  # a rendered epoch of None
    result = evaluate("t", "leader", [held])
    assert check_result(json.loads(json.dumps(result))) == result
    with pytest.raises(LeadershipConditionError, match="since_epoch must be an integer"):
        evaluate("t", "changed", [held], since_epoch="soon")
    with pytest.raises(LeadershipConditionError, match="'epoch' must be int"):
        check_result({**result, "partitions": [{**held, "epoch": "4"}]})
    forged = {**result, "met": True, "partitions": [free]}
    assert check_result(forged)["met"] is False  # a verdict is recomputed, never trusted


def test_sensor_arguments_are_checked_at_parse_time() -> None:
    for kwargs, match in (
        ({"topic": "t", "mode": "elected"}, "mode must be one of"),
        ({"topic": "t", "mode": "reschedule"}, "sensor_mode='reschedule'"),
        ({"topic": "t", "mode": "changed"}, "needs since_epoch"),
        ({"topic": "t", "mode": "changed", "since_epoch": "x"}, "since_epoch must be an integer"),
        ({"topic": "t", "mode": "no_leader", "leader_name": "a"}, "leader_name applies to mode 'leader' only"),
        ({"mode": "leader"}, "needs a topic"),
        ({"mode": "acquire"}, "needs lease_name"),
        ({"mode": "acquire", "lease_name": "l", "topic": "t"}, "not a topic"),
        ({"mode": "acquire", "lease_name": "l", "ttl": 0}, "ttl must be a positive"),
        ({"topic": "t", "holder": "me"}, "apply to mode 'acquire' only"),
        ({"topic": "t", "start_from_trigger": True, "deferrable": False}, "needs deferrable"),
    ):
        with pytest.raises(LeadershipConditionError, match=match):
            LeadershipSensor(task_id="s", **kwargs)
    sensor = LeadershipSensor(
        task_id="s",
        topic="{{ params.t }}",
        mode="changed",
        since_epoch="{{ params.e }}",
        deferrable=True,
        start_from_trigger=True,
        timeout=90,
    )
    args = sensor.start_trigger_args
    assert args is not LeadershipSensor.start_trigger_args and LeadershipSensor.start_trigger_args.trigger_kwargs == {}
    assert args.timeout.total_seconds() == 90 and args.trigger_kwargs["end_from_trigger"] is True
    assert sensor.mode == "poke" and sensor.leadership_mode == "changed"
    acquire = LeadershipSensor(task_id="a", mode="acquire", lease_name="l", deferrable=True, start_from_trigger=True)
    assert acquire.start_trigger_args.trigger_kwargs["end_from_trigger"] is False  # it acquires on a worker
    trigger = LeadershipTrigger(**args.trigger_kwargs)
    assert all(hasattr(trigger, f) for f in ("topic", "since_epoch", "leader_name", "lease_name", "lease_topic"))


def test_provider_info_lists_sensor_and_trigger() -> None:
    from airflow_provider_pulsarstate.provider_info import provider_info

    info = provider_info()
    assert "airflow_provider_pulsarstate.sensors.leadership" in info["sensors"][0]["python-modules"]
    assert "airflow_provider_pulsarstate.triggers.leadership" in info["triggers"][0]["python-modules"]


# ---------------------------------------------------------------------------------- the trigger, driven directly
def test_trigger_serialize_round_trips_exactly() -> None:
    kwargs = {
        "topic": "orders",
        "mode": "changed",
        "leader_name": None,
        "since_epoch": "{{ x }}",
        "lease_name": None,
        "lease_topic": None,
        "poll_interval": 0.5,
        "deadline": 1.8e9,
        "pulsarstate_conn_id": "ps",
        "end_from_trigger": True,
    }
    classpath, out = LeadershipTrigger(**kwargs).serialize()
    assert classpath == "airflow_provider_pulsarstate.triggers.leadership.LeadershipTrigger"
    assert out == kwargs and json.loads(json.dumps(out)) == out
    assert LeadershipTrigger(**out).serialize() == (classpath, out)
    acquire = {
        **kwargs,
        "topic": None,
        "mode": "acquire",
        "since_epoch": None,
        "lease_name": "l",
        "lease_topic": "x",
        "end_from_trigger": False,
    }
    assert LeadershipTrigger(**LeadershipTrigger(**acquire).serialize()[1]).serialize()[1] == acquire
    with pytest.raises(LeadershipConditionError, match="cannot end from the trigger"):
        LeadershipTrigger(**{**acquire, "end_from_trigger": True})


def _create(topic: str, partitions: int = 0) -> str:
    with PulsarStateHook() as hook:
        return hook.create_topic(topic, partitions=partitions)


def test_trigger_waits_for_every_partition_without_blocking_the_loop(airflow_home: Path, state_backend: str) -> None:
    topic = _create(_name("parts"), partitions=2)
    hook = PulsarStateHook()
    backend = hook.get_conn()
    writers: list[Any] = []
    fired_early: list[bool] = []

    async def lead(trigger_task: Any = None) -> None:
        await asyncio.sleep(0.5)
        writers.append(
            await asyncio.to_thread(
                backend.acquire_writer, f"{topic}-partition-0", mode=AcquireMode.FAIL_FAST, timeout=10, name="p0"
            )
        )
        await asyncio.sleep(1.0)  # one partition led: not yet
        fired_early.append(False)
        writers.append(
            await asyncio.to_thread(
                backend.acquire_writer, f"{topic}-partition-1", mode=AcquireMode.FAIL_FAST, timeout=10, name="p1"
            )
        )

    try:
        trigger = LeadershipTrigger(topic=topic, mode="leader", poll_interval=0.05)
        event, worst, ticks = asyncio.run(drive(trigger, during=lead))
    finally:
        for w in writers:
            w.close()
        hook.close()
    assert fired_early == [False] and len(writers) == 2
    assert event.payload["status"] == "success", event.payload
    assert [(p["partition"], p["leader"]) for p in event.payload["leadership"]["partitions"]] == [(0, "p0"), (1, "p1")]
    # the loop kept ticking every 10 ms through ~30 polls: no poll blocked it
    # the ticker ran throughout (its count follows the CPU share it got); blocking is judged by worst
    assert ticks > 10 and worst < LOOP_LAG_LIMIT, (ticks, worst)


def test_the_ticker_detects_a_blocking_leadership_probe(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control for the test above: a probe that blocks the loop is caught by the same measurement."""
    monkeypatch.delenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", raising=False)
    topic = _create(_name("blocking"))

    class Blocking:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def leadership(self, topic: str) -> Any:
            time.sleep(BLOCKING_CONTROL_SECONDS)  # what a blocking client call on the loop does
            return await self.inner.leadership(topic)

        async def aclose(self) -> None:
            await self.inner.aclose()

    original = PulsarStateHook.get_async_leadership_probe
    monkeypatch.setattr(
        PulsarStateHook, "get_async_leadership_probe", lambda self, **kw: Blocking(original(self, **kw))
    )
    event, worst, _ = asyncio.run(drive(LeadershipTrigger(topic=topic, mode="no_leader", poll_interval=0.05)))
    assert event.payload["status"] == "success"
    assert worst >= BLOCKING_CONTROL_SECONDS * 0.9


def test_trigger_reports_a_lease_free_when_released_or_expired(airflow_home: Path, state_backend: str) -> None:
    name, lease_topic = _name("lease"), _name("leases")
    with PulsarStateHook() as hook:
        leases = hook.get_leases(lease_topic)
        held = leases.acquire(name, "holder-a", ttl=30, timeout=10)

        async def release_soon() -> None:
            await asyncio.sleep(0.8)
            await asyncio.to_thread(leases.release, held)

        trigger = LeadershipTrigger(mode="acquire", lease_name=name, lease_topic=lease_topic, poll_interval=0.1)
        event, worst, _ = asyncio.run(drive(trigger, during=release_soon))
        assert event.payload == {
            "status": "free",
            "lease": {**event.payload["lease"], "holder": None, "held": False},
            "deadline": None,
        }
        assert event.payload["lease"]["token"] == 1 and worst < LOOP_LAG_LIMIT

        leases.acquire(name, "holder-dead", ttl=1.5, timeout=10)  # never renewed
        started = time.monotonic()
        event, _, _ = asyncio.run(drive(trigger))
        assert time.monotonic() - started >= 1.5  # a full ttl of silence observed by the trigger itself
        seen = event.payload["lease"]
        assert (event.payload["status"], seen["holder"], seen["held"], seen["expired"], seen["token"]) == (
            "free",
            "holder-dead",
            True,
            True,
            2,
        )

    never = LeadershipTrigger(mode="acquire", lease_name="never-taken", lease_topic=lease_topic)
    event, _, _ = asyncio.run(drive(never))
    assert event.payload == {"status": "free", "lease": None, "deadline": None}


def test_trigger_times_out_reports_errors_and_always_closes_its_probe(
    airflow_home: Path, state_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _create(_name("errs"))
    closed: list[str] = []

    def tracked(factory: str) -> Any:
        original = getattr(PulsarStateHook, factory)

        def make(self: PulsarStateHook, *args: Any, **kw: Any) -> Any:
            probe = original(self, *args, **kw)
            inner_close = probe.aclose

            async def aclose() -> None:
                closed.append(factory)
                await inner_close()

            probe.aclose = aclose  # type: ignore[method-assign]
            return probe

        monkeypatch.setattr(PulsarStateHook, factory, make)

    tracked("get_async_leadership_probe")
    tracked("get_async_lease_observer")

    started = time.monotonic()
    trigger = LeadershipTrigger(topic=topic, mode="leader", poll_interval=0.1, deadline=time.time() + 1.0)
    event, _, _ = asyncio.run(drive(trigger))
    assert 0.9 <= time.monotonic() - started < 10
    assert event.payload["status"] == "timeout" and event.payload["leadership"]["met"] is False
    assert closed == ["get_async_leadership_probe"]

    missing = _name("missing")
    event, _, _ = asyncio.run(drive(LeadershipTrigger(topic=missing, mode="leader")))
    assert event.payload["status"] == "error" and event.payload["error_type"] == "LeadershipError"
    assert missing in event.payload["message"] and "does not exist" in event.payload["message"]

    event, _, _ = asyncio.run(drive(LeadershipTrigger(topic=topic, mode="changed", since_epoch="{{ oops }}")))
    assert event.payload["status"] == "error" and "since_epoch must be an integer" in event.payload["message"]
    assert len(closed) == 2  # the bad since_epoch failed before a probe was opened

    # cancelled while polling (a triggerer shutting down): the probe is still closed
    asyncio.run(cancel_midway(LeadershipTrigger(topic=topic, mode="leader", poll_interval=0.05)))
    lease_topic = _name("leases")
    with PulsarStateHook() as hook:
        hook.get_leases(lease_topic).acquire("busy", "someone", ttl=60, timeout=10)
    asyncio.run(
        cancel_midway(LeadershipTrigger(mode="acquire", lease_name="busy", lease_topic=lease_topic, poll_interval=0.05))
    )
    assert closed == ["get_async_leadership_probe"] * 3 + ["get_async_lease_observer"]


def test_trigger_end_from_trigger_finishes_the_task_with_its_xcom(airflow_home: Path, state_backend: str) -> None:
    from airflow.triggers.base import TaskSuccessEvent

    topic = _create(_name("end"))
    event, _, _ = asyncio.run(drive(LeadershipTrigger(topic=topic, mode="no_leader", end_from_trigger=True)))
    assert isinstance(event, TaskSuccessEvent)
    assert event.xcoms["return_value"]["topic"] == topic and event.xcoms["return_value"]["met"] is True
