"""OffsetProgressSensor and OffsetProgressTrigger on both back ends.

The sensor runs inside real ``dag.test()`` runs (SQLite metadata DB) in poke and deferred modes;
the trigger is also driven directly with asyncio against the embedded log and the session's
Pulsar broker. Messages the sensors wait for are fed by a thread of this process, when a sensor
first reports its condition unmet (``dag.test()`` runs tasks and triggers in this process).
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.sensors.offsets import (
    DEFAULT_WATERMARK_MAP,
    OffsetProgressSensor,
    advance_watermark,
    read_watermark,
)
from airflow_provider_pulsarstate.triggers.offset_conditions import ProgressError, evaluate, parse_target
from airflow_provider_pulsarstate.triggers.offsets import OffsetProgressTrigger
from tests.airflow.dagruns import TEST_DAGS, load_dag, run_dag
from tests.airflow.trigger_driver import BLOCKING_CONTROL_SECONDS, LOOP_LAG_LIMIT, cancel_midway
from tests.airflow.trigger_driver import drive as _drive

SENSOR_DAGS = TEST_DAGS / "offset_sensor_dags.py"


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _publish(topic: str, count: int, *, start: int = 0) -> None:
    with PulsarStateHook() as hook:
        publisher = hook.get_publisher(topic)
        for i in range(count):
            publisher.send(f"fed-{start + i}".encode())
        publisher.flush(timeout=30)


class Feeder:
    """Publishes ``extra`` messages each time a sensor first reports its condition unmet.

    Patches ``OffsetProgressSensor._check`` (runs in this process under ``dag.test()``) and
    records every event the trigger yields.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, topic: str, extra: int, *, delay: float = 0.5) -> None:
        self.topic, self.extra, self.delay = topic, extra, delay
        self.signals: queue.Queue[str | None] = queue.Queue()
        self.fed: list[str] = []
        self.trigger_events: list[tuple[str, Any]] = []
        self._waiting: set[tuple[str, str]] = set()
        original_check = OffsetProgressSensor._check
        original_run = OffsetProgressTrigger.run
        feeder = self

        def check(sensor: OffsetProgressSensor, context: Any) -> Any:
            progress = original_check(sensor, context)
            key = (context["ti"].run_id, sensor.task_id)
            if not progress.met and key not in feeder._waiting:
                feeder._waiting.add(key)
                feeder.signals.put(sensor.task_id)
            return progress

        async def run(trigger: OffsetProgressTrigger) -> Any:
            async for event in original_run(trigger):
                feeder.trigger_events.append((trigger.topic, event.payload))
                yield event

        monkeypatch.setattr(OffsetProgressSensor, "_check", check)
        monkeypatch.setattr(OffsetProgressTrigger, "run", run)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (task_id := self.signals.get()) is not None:
            time.sleep(self.delay)
            _publish(self.topic, self.extra, start=len(self.fed) * self.extra)
            self.fed.append(task_id)

    def stop(self) -> None:
        self.signals.put(None)
        self._thread.join(timeout=60)


# ---------------------------------------------------------------------------------- dag.test()
def test_sensor_waits_for_an_xcom_target_in_poke_and_deferred_modes(
    dag_bundles: None, state_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag = load_dag(SENSOR_DAGS, "offset_sensor_xcom_target")
    topic, count, extra = _topic("xcom"), 5, 3
    feeder = Feeder(monkeypatch, topic, extra)
    try:
        outcome = run_dag(dag, {"topic": topic, "partitions": 2, "count": count, "extra": extra})
    finally:
        feeder.stop()

    assert outcome.state == "success", outcome.states
    start = outcome.xcoms["publish"]["end_offset"]
    assert start >= count
    # every sensor found its target unmet, got exactly one batch fed, and returned what it saw
    assert feeder.fed == ["wait_poke", "wait_deferred", "wait_from_trigger"]
    for i, task_id in enumerate(["wait_poke", "wait_deferred", "wait_from_trigger"], start=1):
        seen = outcome.xcoms[task_id]
        assert seen["met"] is True and seen["condition"] == "end_offset"
        assert seen["topic"] == outcome.xcoms["publish"]["topic"]
        assert seen["target"] == start + i * extra
        assert seen["value"] == sum(seen["end_offsets"].values()) >= start + i * extra
        assert set(seen["end_offsets"]) == {"0", "1"}  # both partitions of the topic
    # the deferred sensors completed through their trigger; the poke sensor never deferred
    fired = [payload for t, payload in feeder.trigger_events if t == outcome.xcoms["publish"]["topic"]]
    assert [p["status"] for p in fired] == ["success", "success"]
    assert [p["progress"] for p in fired] == [outcome.xcoms["wait_deferred"], outcome.xcoms["wait_from_trigger"]]


def test_timeout_fails_and_soft_fail_skips_in_both_modes(
    dag_bundles: None, state_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag = load_dag(SENSOR_DAGS, "offset_sensor_timeouts")
    events: list[Any] = []
    original_run = OffsetProgressTrigger.run

    async def run(trigger: OffsetProgressTrigger) -> Any:
        async for event in original_run(trigger):
            events.append(event.payload)
            yield event

    monkeypatch.setattr(OffsetProgressTrigger, "run", run)
    outcome = run_dag(dag, {"topic": _topic("timeouts"), "count": 1})

    assert outcome.state == "failed"
    assert outcome.states == {
        "publish": "success",
        "timeout_poke": "failed",
        "timeout_deferred": "failed",
        "soft_poke": "skipped",
        "soft_deferred": "skipped",
    }
    # the deferred sensors timed out through their trigger's own deadline (dag.test() does not
    # enforce the deferral timeout), not by waiting forever
    assert [e["status"] for e in events] == ["timeout", "timeout"]
    for e in events:
        assert e["progress"]["met"] is False and e["progress"]["value"] == 1
    for task_id in ("timeout_poke", "timeout_deferred", "soft_poke", "soft_deferred"):
        assert 2.0 <= outcome.durations[task_id] < 30, outcome.durations


@pytest.mark.parametrize("mode", ["poke", "deferred"])
def test_watermark_counts_new_messages_and_advances(
    dag_bundles: None, state_backend: str, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    dag = load_dag(SENSOR_DAGS, f"offset_sensor_watermark_{mode}")
    topic = _topic(f"wm-{mode}")
    feeder = Feeder(monkeypatch, topic, 2)
    try:
        first = run_dag(dag, {"topic": topic, "count": 5, "n": 5})
        second = run_dag(dag, {"topic": topic, "count": 3, "n": 5})
    finally:
        feeder.stop()

    full = first.xcoms["publish"]["topic"]
    assert first.state == "success", first.states
    seen = first.xcoms["wait_new"]
    assert (seen["watermark"], seen["value"], seen["watermark_advanced_to"]) == ({}, 5, {"0": 5})

    # the second run saw 3 new messages, waited, and met 5 once the feeder added 2
    assert second.state == "success", second.states
    assert feeder.fed == ["wait_new"]
    seen = second.xcoms["wait_new"]
    assert (seen["watermark"], seen["value"], seen["end_offsets"], seen["watermark_advanced_to"]) == (
        {"0": 5},
        5,
        {"0": 10},
        {"0": 10},
    )
    assert [p["status"] for _, p in feeder.trigger_events] == (["success"] if mode == "deferred" else [])

    with PulsarStateHook() as hook:
        stored = hook.get_map(DEFAULT_WATERMARK_MAP).get(f"{topic}/{mode}", latest=True)
    assert stored["topic"] == full and stored["offsets"] == {"0": 10} and stored["previous"] == {"0": 5}
    assert stored["advanced_by"].startswith(f"offset_sensor_watermark_{mode}/") and stored["advanced_by"].endswith(
        "/wait_new/-1"
    )


# ---------------------------------------------------------------------------------- watermarks
def test_watermark_retry_keeps_its_baseline_and_never_moves_back(env_connection: Any, tmp_path: Path) -> None:
    conn_id = env_connection("ps_wm", extra={"service_url": str(tmp_path / "state.db")})
    topic = "persistent://public/default/events"
    with PulsarStateHook(conn_id) as hook:
        marks = hook.get_map("watermarks")
        assert read_watermark(marks.get("k"), key="k", topic=topic) == {}
        assert advance_watermark(marks, "k", topic=topic, offsets={0: 5}, advanced_by="d/run1/t/-1") == {0: 5}
        # run 2, first try advances; its retry still measures from run 1's watermark
        advance_watermark(marks, "k", topic=topic, offsets={0: 9, 1: 2}, advanced_by="d/run2/t/-1")
        value = marks.get("k", latest=True)
        assert read_watermark(value, key="k", topic=topic, identity="d/run2/t/-1") == {0: 5}
        assert read_watermark(value, key="k", topic=topic, identity="d/run3/t/-1") == {0: 9, 1: 2}
        advance_watermark(marks, "k", topic=topic, offsets={0: 7, 1: 4}, advanced_by="d/run2/t/-1")
        value = marks.get("k", latest=True)
        assert value["offsets"] == {"0": 9, "1": 4} and value["previous"] == {"0": 5}  # never backwards
        with pytest.raises(ProgressError, match="tracks topic .*events.*not persistent://public/default/other"):
            read_watermark(value, key="k", topic="persistent://public/default/other")
        with pytest.raises(ProgressError, match="'bad' is not a watermark value"):
            read_watermark({"offsets": 3}, key="bad", topic=topic)
        with pytest.raises(ProgressError, match="partition 'x' is not a partition number"):
            read_watermark({"topic": topic, "offsets": {"x": 1}}, key="k", topic=topic)


# ---------------------------------------------------------------------------------- conditions
def test_conditions_on_observed_offsets() -> None:
    end, committed = {0: 10, 1: 4}, {0: 7, 1: None}

    def ev(condition: str, target: Any, **kw: Any) -> Any:
        return evaluate(topic="t", condition=condition, target=parse_target(target), end_offsets=end, **kw)

    assert ev("end_offset", 14).met and not ev("end_offset", 15).met
    assert ev("end_offset", 4, per_partition=True).met and not ev("end_offset", 5, per_partition=True).met
    assert ev("end_offset", '{"1": 4}').met and not ev("end_offset", "{'0': 11}").met  # rendered XCom dicts
    assert ev("committed", 7, committed=committed).met and not ev("committed", 8, committed=committed).met
    lag = ev("lag", 7, committed=committed)  # 3 + 4 (never committed: all of it)
    assert lag.met and lag.values == {0: 3, 1: 4} and not ev("lag", 6, committed=committed).met
    assert ev("new_messages", 6, watermark={0: 8}).met and not ev("new_messages", 7, watermark={0: 8}).met
    with pytest.raises(ProgressError, match="past its end offset"):
        ev("new_messages", 1, watermark={1: 5})
    with pytest.raises(ProgressError, match=r"partition\(s\) \[2\]"):
        ev("end_offset", {2: 1})
    for bad in ("", "-1", "ten", "{'0': -1}", True, 1.5, [1]):
        with pytest.raises(ProgressError):
            parse_target(bad)
    table = ev("lag", 7, committed=committed).table()
    assert table.splitlines()[0] == "t: lag <= 7 (total): met"
    assert "total" in table.splitlines()[-1]


def test_sensor_arguments_are_checked_at_parse_time() -> None:
    with pytest.raises(ProgressError, match="needs a subscription"):
        OffsetProgressSensor(task_id="s", topic="t", condition="lag", target=0)
    with pytest.raises(ProgressError, match="condition must be one of"):
        OffsetProgressSensor(task_id="s", topic="t", condition="size", target=0)
    with pytest.raises(ProgressError, match="neither an integer"):
        OffsetProgressSensor(task_id="s", topic="t", target="lots")
    with pytest.raises(ProgressError, match="start_from_trigger needs deferrable"):
        OffsetProgressSensor(task_id="s", topic="t", target=1, start_from_trigger=True, deferrable=False)
    with pytest.raises(ProgressError, match="cannot start_from_trigger"):
        OffsetProgressSensor(
            task_id="s", topic="t", condition="new_messages", target=1, deferrable=True, start_from_trigger=True
        )
    sensor = OffsetProgressSensor(
        task_id="s",
        topic="{{ params.t }}",
        target="{{ params.n }}",
        deferrable=True,
        start_from_trigger=True,
        timeout=90,
    )
    args = sensor.start_trigger_args
    assert (
        args is not OffsetProgressSensor.start_trigger_args
        and OffsetProgressSensor.start_trigger_args.trigger_kwargs == {}
    )
    assert args.timeout.total_seconds() == 90 and args.next_method == "execute_complete"
    assert args.trigger_kwargs["end_from_trigger"] is True and args.trigger_kwargs["target"] == "{{ params.n }}"
    # the triggerer renders these trigger attributes from the sensor's template fields
    trigger = OffsetProgressTrigger(**args.trigger_kwargs)
    assert {"topic", "target", "subscription"} <= set(OffsetProgressSensor.template_fields)
    assert all(hasattr(trigger, f) for f in ("topic", "target", "subscription"))


def test_provider_info_lists_sensor_and_trigger() -> None:
    from airflow_provider_pulsarstate.provider_info import provider_info

    info = provider_info()
    assert "airflow_provider_pulsarstate.sensors.offsets" in info["sensors"][0]["python-modules"]
    assert "airflow_provider_pulsarstate.triggers.offsets" in info["triggers"][0]["python-modules"]


# ---------------------------------------------------------------------------------- the trigger, driven directly
def test_trigger_serialize_round_trips_exactly() -> None:
    kwargs = {
        "topic": "events",
        "condition": "lag",
        "target": {"0": 3, "2": 0},
        "subscription": "sub",
        "per_partition": True,
        "watermark": None,
        "poll_interval": 0.5,
        "deadline": 1.8e9,
        "pulsarstate_conn_id": "ps",
        "end_from_trigger": False,
    }
    classpath, out = OffsetProgressTrigger(**kwargs).serialize()
    assert classpath == "airflow_provider_pulsarstate.triggers.offsets.OffsetProgressTrigger"
    assert out == kwargs and json.loads(json.dumps(out)) == out
    assert OffsetProgressTrigger(**out).serialize() == (classpath, out)
    # int partition keys are stored canonically (JSON has only string keys)
    _, canon = OffsetProgressTrigger(**{**kwargs, "target": {2: 0, 0: 3}, "watermark": {1: 4}}).serialize()
    assert canon["target"] == {"0": 3, "2": 0} and canon["watermark"] == {"1": 4}
    assert OffsetProgressTrigger(**canon).serialize()[1] == canon


def _create(topic: str, partitions: int = 0) -> str:
    with PulsarStateHook() as hook:
        return hook.create_topic(topic, partitions=partitions)


def test_trigger_fires_when_a_publisher_reaches_the_target_without_blocking_the_loop(
    airflow_home: Path, state_backend: str
) -> None:
    topic = _create(_topic("trig"), partitions=2)
    _publish(topic, 4)

    async def feed() -> None:
        await asyncio.sleep(1.0)
        await asyncio.to_thread(_publish, topic, 6, start=4)

    trigger = OffsetProgressTrigger(topic=topic, condition="end_offset", target=10, poll_interval=0.05)
    event, worst, ticks = asyncio.run(_drive(trigger, during=feed))
    assert event.payload["status"] == "success", event.payload
    progress = event.payload["progress"]
    assert progress["met"] and progress["value"] == 10 and set(progress["end_offsets"]) == {"0", "1"}
    # the loop kept ticking every 10 ms through ~20 polls: no poll blocked it
    # (0.6 s: above what a loaded 2-vCPU CI machine adds; the control below blocks for 1 s)
    # the ticker ran throughout (its count follows the CPU share it got); blocking is judged by worst
    assert ticks > 10 and worst < LOOP_LAG_LIMIT, (ticks, worst)


def test_the_ticker_detects_a_blocking_probe(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control for the test above: a probe that blocks the loop is caught by the same measurement."""
    monkeypatch.delenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", raising=False)
    topic = _create(_topic("blocking"))
    _publish(topic, 1)

    class Blocking:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def end_offsets(self, topic: str) -> dict[int, int]:
            time.sleep(BLOCKING_CONTROL_SECONDS)  # what a slow sync client call on the loop does
            return await self.inner.end_offsets(topic)

        async def aclose(self) -> None:
            await self.inner.aclose()

    original = PulsarStateHook.get_async_offset_probe
    monkeypatch.setattr(PulsarStateHook, "get_async_offset_probe", lambda self, **kw: Blocking(original(self, **kw)))
    trigger = OffsetProgressTrigger(topic=topic, condition="end_offset", target=1, poll_interval=0.05)
    event, worst, _ = asyncio.run(_drive(trigger))
    assert event.payload["status"] == "success"
    assert worst >= BLOCKING_CONTROL_SECONDS * 0.9


def test_trigger_committed_and_lag_conditions(airflow_home: Path, state_backend: str) -> None:
    topic = _create(_topic("lag"))
    _publish(topic, 8)

    def commit(offset: int) -> None:
        with PulsarStateHook() as hook:
            hook.get_pull_consumer(topic, "readers").commit(offset)

    async def consume() -> None:
        await asyncio.sleep(0.5)
        await asyncio.to_thread(commit, 6)

    lag = OffsetProgressTrigger(topic=topic, condition="lag", target=2, subscription="readers", poll_interval=0.05)
    event, _, _ = asyncio.run(_drive(lag, during=consume))
    assert event.payload["status"] == "success", event.payload
    assert event.payload["progress"]["committed"] == {"0": 6} and event.payload["progress"]["value"] == 2

    committed = OffsetProgressTrigger(topic=topic, condition="committed", target={"0": 6}, subscription="readers")
    event, _, _ = asyncio.run(_drive(committed))
    assert event.payload["status"] == "success" and event.payload["progress"]["value"] == 6


def test_trigger_times_out_and_reports_errors_and_always_closes_its_probe(
    airflow_home: Path, state_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _create(_topic("errs"))
    _publish(topic, 2)
    closed: list[bool] = []
    original = PulsarStateHook.get_async_offset_probe

    def tracked(self: PulsarStateHook, **kw: Any) -> Any:
        probe = original(self, **kw)
        inner_close = probe.aclose

        async def aclose() -> None:
            closed.append(True)
            await inner_close()

        probe.aclose = aclose  # type: ignore[method-assign]
        return probe

    monkeypatch.setattr(PulsarStateHook, "get_async_offset_probe", tracked)

    started = time.monotonic()
    trigger = OffsetProgressTrigger(
        topic=topic, condition="end_offset", target=99, poll_interval=0.1, deadline=time.time() + 1.0
    )
    event, _, _ = asyncio.run(_drive(trigger))
    assert 0.9 <= time.monotonic() - started < 10
    assert event.payload["status"] == "timeout" and event.payload["progress"]["value"] == 2
    assert closed == [True]

    missing = _topic("missing")
    event, _, _ = asyncio.run(_drive(OffsetProgressTrigger(topic=missing, condition="end_offset", target=1)))
    assert event.payload["status"] == "error" and event.payload["error_type"] == "UnknownTopicError"
    assert missing in event.payload["message"]

    event, _, _ = asyncio.run(_drive(OffsetProgressTrigger(topic=topic, condition="end_offset", target="{{ oops }}")))
    assert event.payload["status"] == "error" and "neither an integer" in event.payload["message"]

    event, _, _ = asyncio.run(_drive(OffsetProgressTrigger(topic=topic, condition="end_offset", target={"3": 1})))
    assert event.payload["status"] == "error" and "partition(s) [3]" in event.payload["message"]
    assert len(closed) == 3  # every probe opened was closed (the bad target failed before opening one)

    # cancelled while polling (a triggerer shutting down): the probe is still closed
    asyncio.run(
        cancel_midway(OffsetProgressTrigger(topic=topic, condition="end_offset", target=99, poll_interval=0.05))
    )
    assert len(closed) == 4


def test_trigger_end_from_trigger_finishes_the_task_with_its_xcom(airflow_home: Path, state_backend: str) -> None:
    from airflow.triggers.base import TaskSuccessEvent

    topic = _create(_topic("end"))
    _publish(topic, 3)
    trigger = OffsetProgressTrigger(topic=topic, condition="end_offset", target="3", end_from_trigger=True)
    event, _, _ = asyncio.run(_drive(trigger))
    assert isinstance(event, TaskSuccessEvent)
    assert event.xcoms["return_value"]["value"] == 3 and event.xcoms["return_value"]["topic"] == topic
