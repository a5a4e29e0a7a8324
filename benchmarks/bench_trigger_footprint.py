#!/usr/bin/env python
"""What N triggers of one kind cost one triggerer process.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_trigger_footprint.py --triggers 50          # own broker, every kind
    .venv/bin/python benchmarks/bench_trigger_footprint.py --service-url pulsar://127.0.0.1:6650 \\
        --admin-url http://127.0.0.1:8080 --kinds state_change,messages --backends pulsar

Each (kind, back end) runs in a fresh child process with ONE asyncio loop, as a triggerer runs
them (a failure of one kind never hides the others). The child

1. records the idle figures (imports done, loop running, no trigger): OS threads
   (``/proc/self/task``), open fds (``/proc/self/fd``), and TCP connections of this process to the
   broker's binary port and to its admin port (``/proc/self/net/tcp*`` rows whose socket inode is
   one of this process's fds);
2. starts ``--triggers`` triggers at once, each as the triggerer runs it (created one after the
   other with a turn of the loop between two, as ``TriggerRunner.create_triggers`` does):

   * ``state_change``: ``StateChangeTrigger`` through Airflow's real ``SharedStreamManager`` (ack
     mode: each event bound and confirmed persisted, the supervisor's part), one table and N
     distinct key prefixes (so N shared streams, not one), or N tables (``--state-tables distinct``);
   * ``messages``: ``PulsarMessageTrigger`` through the ``SharedStreamManager``, one topic and N
     distinct subscriptions (N shared streams; Pulsar only: the embedded back end refuses it);
   * ``offsets``: ``OffsetProgressTrigger.run()`` (``end_offset >= 1`` on one empty topic);
   * ``lease``: ``LeadershipTrigger(mode="acquire").run()``, what a deferred acquire-mode
     ``LeadershipSensor`` runs, on one lease log with ``--leases`` held leases (trigger i waits
     for lease i mod L);
   * ``leadership``: ``LeadershipTrigger(mode="leader").run()`` on one topic nobody leads
     (a deferred leader-mode ``LeadershipSensor``);
   * ``datetime``: the baseline, Airflow's own ``DateTimeTrigger`` 30 days ahead (``run()``; no
     back end, run once, no change to detect): what any N triggers cost the same process;

   and measures the time until all N are running (each has done its first read: the table feed
   started, the consumer subscribed, the first observation made), printing progress meanwhile;
3. idles ``--idle-seconds`` (every trigger polling at its default ``poll_interval``) and measures
   the process's CPU seconds over that window (scaled to per minute) and the figures of 1.
   again, minus the idle ones;
4. makes one change (a row put under trigger 0's prefix, a message on the topic, a message on the
   offset topic, lease 0 released, an exclusive producer on the topic) and measures the time from
   the change being durable until the first trigger fires;
5. stops every trigger as the triggerer does (cancel, unsubscribe) and measures what is left.

A ticker task on the loop (10 ms, as ``tests/airflow/trigger_driver.py``'s ``LoopLag``) gives the
loop's worst stall over 2.-4.

The stall is the ticker's lateness minus the time the loop's thread waited for a CPU (the
machine's load); shown beside it: the raw lateness and the loop thread's own CPU over the worst
tick (its work, not waits for the GIL or a CPU), and the longest garbage collection per generation
while the triggers start. Run with bytecode cached (``PYTHONPYCACHEPREFIX`` set,
``PYTHONDONTWRITEBYTECODE`` unset), as a deployment has it. Diagnostics: ``BENCH_SLOW_TURNS=0.05``
prints each loop turn whose callbacks took longer (and the stack of a callback running over it);
``BENCH_PROFILE_START=<file>`` writes a cProfile of the start on the loop thread's CPU;
``BENCH_OBJECT_TYPES=1`` prints the types the running triggers keep alive (per trigger);
``BENCH_GC_STACKS=<depth>`` prints where garbage collections fell due while they started (the
allocating stack sampled at each collection's start).

Garbage collection: a full (generation 2) collection walks every object of the process (~0.15-0.25 s
of CPU for a triggerer's ~220,000 objects); it falls due once the objects kept since the last one
exceed a quarter of those that survived it. So each run prints, beside the baseline's figures and
the ratio: the stall at start, the full collections during the start and the longest, and the
objects each running trigger keeps alive (tracked objects while running minus after the stop).

Targets: within 2 broker connections per connection id (binary + admin counted
together; both are shown), <= 50 OS threads and <= 200 fds beyond the idle process, all running
within 10 s, the loop never stalled over 0.1 s. Where the issue measured a figure before (200
triggers), it is printed beside ours as ``(was ...)``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import broker_urls, print_run_header  # noqa: E402

KINDS = ("state_change", "messages", "offsets", "lease", "leadership", "datetime")
BASELINE = "datetime"  # Airflow's own DateTimeTrigger: what any 1,000 triggers cost the same process
BACKENDS = ("pulsar", "embedded")
CONN_ID = "pulsarstate_bench"

TARGET_THREADS, TARGET_FDS, TARGET_CONNS, TARGET_START, TARGET_STALL = 50, 200, 2, 10.0, 0.1

# What was measured before (200 triggers on Pulsar): kind -> figure -> text
BEFORE: dict[str, dict[str, str]] = {
    "state_change": {"threads": "804@200", "fds": "1617@200", "start": "12s@200"},
    "messages": {"fds": "+2000@200"},
}


# ================================================================================ measuring
def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _socket_inodes() -> set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _conns(ports: dict[str, int]) -> dict[str, int]:
    """Connected TCP sockets of this process by remote port (``ports``: name -> port)."""
    inodes = _socket_inodes()
    counts = {name: 0 for name in ports}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            state, inode = cols[3], cols[9]
            if state == "0A" or inode not in inodes:  # listening, or not ours
                continue
            port = int(cols[2].rsplit(":", 1)[1], 16)
            for name, wanted in ports.items():
                if port == wanted:
                    counts[name] += 1
    return counts


def _snapshot(ports: dict[str, int]) -> dict[str, int]:
    return {"threads": _threads(), "fds": _fds(), **_conns(ports)}


def _minus(now: dict[str, int], idle: dict[str, int]) -> dict[str, int]:
    return {k: now[k] - idle.get(k, 0) for k in now}


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _runnable_wait() -> float:
    """Seconds this thread spent runnable but waiting for a CPU (Linux ``schedstat``; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _other_threads() -> tuple[float, float]:
    """CPU seconds run and seconds waited for a CPU, summed over this process's threads other than
    the calling one (Linux ``schedstat``; zeros elsewhere). Over a stall of the loop with little
    loop CPU: a thread running Python (CPU) or holding the GIL while off a CPU (wait)."""
    me, cpu, wait = str(threading.get_native_id()), 0.0, 0.0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0.0, 0.0
    for tid in tids:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, waited = f.read().split()[:2]
        except (OSError, ValueError):
            continue
        cpu, wait = cpu + int(run) / 1e9, wait + int(waited) / 1e9
    return cpu, wait


class Ticker:
    """The loop's worst lateness of a 10 ms sleep, as ``tests/airflow/trigger_driver.py``'s LoopLag:
    ``worst`` leaves out the time the loop's thread waited for a CPU while runnable (the machine's
    load, not the loop being blocked: a blocking call, sleeping, computing or waiting for the GIL,
    still counts); ``worst_raw`` is the wall-clock lateness."""

    def __init__(self, tick: float = 0.01) -> None:
        self.tick, self.worst, self.worst_raw, self.worst_cpu = tick, 0.0, 0.0, 0.0
        self.worst_at = 0.0  # wall-clock time at the end of the worst tick (to find it in a py-spy profile)
        self.worst_others = (0.0, 0.0)  # the other threads' CPU and wait for a CPU over the worst tick
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before, queued, cpu, others = loop.time(), _runnable_wait(), time.thread_time(), _other_threads()
            await asyncio.sleep(self.tick)
            late = loop.time() - before - self.tick
            self.worst_raw = max(self.worst_raw, late)
            stall = late - (_runnable_wait() - queued)
            if stall > self.worst:
                self.worst, self.worst_at = stall, time.time()
                after = _other_threads()
                self.worst_others = (after[0] - others[0], after[1] - others[1])
            # the loop's own CPU over the tick: its work, not other threads holding the GIL or CPU
            self.worst_cpu = max(self.worst_cpu, min(late, time.thread_time() - cpu))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def reset(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst

    def reset_raw(self) -> float:
        worst, self.worst_raw = self.worst_raw, 0.0
        return worst

    def reset_cpu(self) -> float:
        worst, self.worst_cpu = self.worst_cpu, 0.0
        return worst

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


# ================================================================================ instrumentation
# Which triggers did their first read: the benchmark wraps the product's methods (no product change).
RUNNING: set[Any] = set()


def _instrument(kind: str) -> None:
    if kind == "state_change":
        from airflow_provider_pulsarstate.engine.recipes.shared_table_feed import AsyncTableFeed

        original = AsyncTableFeed.start

        async def start(self: Any) -> int:
            out = await original(self)
            RUNNING.add(id(self))
            return out

        AsyncTableFeed.start = start  # type: ignore[method-assign]
    elif kind == "messages":
        from airflow_provider_pulsarstate.engine.topic_stream import TopicStream

        original_open = TopicStream.open

        async def open_(self: Any) -> Any:
            out = await original_open(self)
            RUNNING.add(id(self))
            return out

        TopicStream.open = open_  # type: ignore[method-assign]
    elif kind == BASELINE:
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger

        moment = DateTimeTrigger.moment

        def first_read(self: Any) -> Any:  # run() reads its moment before its first sleep
            RUNNING.add(id(self))
            return moment.fget(self)  # type: ignore[attr-defined]

        DateTimeTrigger.moment = property(first_read)  # type: ignore[method-assign,assignment]
    else:
        from airflow_provider_pulsarstate.triggers.leadership import LeadershipTrigger
        from airflow_provider_pulsarstate.triggers.offsets import OffsetProgressTrigger

        cls: Any = OffsetProgressTrigger if kind == "offsets" else LeadershipTrigger
        original_observe = cls._observe

        async def observe(self: Any, probe: Any, bound: float) -> Any:
            out = await original_observe(self, probe, bound)
            RUNNING.add(id(self))
            return out

        cls._observe = observe


# ================================================================================ the child
def _watch_gc() -> tuple[dict[int, float], dict[int, int]]:
    """The longest garbage collection pause per generation, in the loop thread's CPU seconds, and the
    number of collections per generation (the benchmark removes the callback when the start is over)."""
    import gc

    worst: dict[int, float] = {}
    count: dict[int, int] = {}
    started = [0.0]

    stacks = os.environ.get("BENCH_GC_STACKS")
    import threading
    import traceback
    from collections import Counter

    sampled: Counter[str] = Counter()
    _GC_STACKS.append(sampled)

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            if stacks:  # diagnosis: who allocated when a collection fell due (a sample per collection)
                frames = traceback.extract_stack(sys._getframe(1), limit=int(stacks))
                where = " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
                sampled[f"[{threading.current_thread().name}] {where}"] += 1
            started[0] = time.thread_time()
        else:
            gen = info["generation"]
            worst[gen] = max(worst.get(gen, 0.0), time.thread_time() - started[0])
            count[gen] = count.get(gen, 0) + 1

    gc.callbacks.append(callback)
    return worst, count


def _object_types() -> dict[str, int]:
    """Tracked objects by type (and, for functions and frames, by code name): diagnosis."""
    import gc
    import types
    from collections import Counter

    def name(o: Any) -> str:
        kind = type(o).__qualname__
        if isinstance(o, types.FunctionType):
            return f"{kind} {o.__code__.co_qualname}"
        if isinstance(o, (types.CoroutineType, types.AsyncGeneratorType, types.GeneratorType)):
            return f"{kind} {o.__qualname__}"
        if isinstance(o, types.FrameType):
            return f"{kind} {o.f_code.co_qualname}"
        if isinstance(o, types.MethodType):
            return f"{kind} {getattr(o.__func__, '__qualname__', '')}"
        return kind

    return dict(Counter(name(o) for o in gc.get_objects()))


_GC_STACKS: list[Any] = []


def _tracked_objects() -> int:
    """Objects the garbage collector tracks (what a full collection walks), frozen ones included."""
    import gc

    return len(gc.get_objects()) + gc.get_freeze_count()


def _watch_turns(limit: float) -> None:
    """Print every loop turn longer than ``limit`` seconds with its slowest callbacks (diagnosis)."""
    import asyncio.base_events
    import asyncio.events
    from collections import Counter

    turn: list[tuple[float, str]] = []
    t_start = time.monotonic()
    original_run, original_once = asyncio.events.Handle._run, asyncio.base_events.BaseEventLoop._run_once

    import threading
    import traceback

    current: list[Any] = [None, 0.0]  # the callback running now on the loop's thread, since when
    loop_thread = threading.get_ident()

    def watchdog() -> None:  # the stack of a callback running over the limit, once per callback
        seen = None
        while True:
            time.sleep(limit / 4)
            handle, since = current
            if handle is None or handle is seen or time.perf_counter() - since < limit:
                continue
            seen = handle
            frame = sys._current_frames().get(loop_thread)
            stack = [f"{Path(fs.filename).name}:{fs.lineno} {fs.name}" for fs in traceback.extract_stack(frame)][-9:]
            print(
                f"    {time.monotonic() - t_start:6.2f}s callback over {limit * 1000:.0f} ms: {' < '.join(reversed(stack))}",
                file=sys.stderr,
                flush=True,
            )

    threading.Thread(target=watchdog, daemon=True).start()

    def run(self: Any) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        current[0], current[1] = self, t0
        original_run(self)
        current[0] = None
        if os.environ.get("BENCH_SLOW_TURNS_CPU"):
            t0 = time.perf_counter() - (time.thread_time() - c0)  # count the callback's CPU only
        cb = getattr(self._callback, "__self__", None)
        coro = getattr(cb, "get_coro", lambda: None)()
        name = getattr(coro, "__qualname__", None) or repr(self._callback)[:80]
        turn.append((time.perf_counter() - t0, name))

    def once(self: Any) -> None:
        turn.clear()
        original_once(self)
        took = sum(d for d, _ in turn)
        if took > limit:
            by = Counter()
            for d, n in turn:
                by[n] += d
            top = ", ".join(f"{n}: {d * 1000:.0f}ms" for n, d in by.most_common(4))
            print(
                f"    {time.monotonic() - t_start:6.2f}s slow turn {took * 1000:.0f} ms, {len(turn)} callbacks: {top}",
                file=sys.stderr,
                flush=True,
            )

    asyncio.events.Handle._run = run  # type: ignore[method-assign]
    asyncio.base_events.BaseEventLoop._run_once = once  # type: ignore[method-assign]


def _make_triggers(kind: str, n: int, setup: dict[str, Any]) -> list[Any]:
    if kind == "state_change":
        from airflow_provider_pulsarstate.triggers.state_change import StateChangeTrigger

        tables = setup["tables"]
        return [
            StateChangeTrigger(
                table=tables[i % len(tables)], on=["keys"], key_prefix=f"p{i}-", pulsarstate_conn_id=CONN_ID
            )
            for i in range(n)
        ]
    if kind == "messages":
        from airflow_provider_pulsarstate.triggers.messages import PulsarMessageTrigger

        return [
            PulsarMessageTrigger(topics=setup["topic"], subscription=f"s{i}", pulsarstate_conn_id=CONN_ID)
            for i in range(n)
        ]
    if kind == "offsets":
        from airflow_provider_pulsarstate.triggers.offsets import OffsetProgressTrigger

        return [
            OffsetProgressTrigger(topic=setup["topic"], condition="end_offset", target=1, pulsarstate_conn_id=CONN_ID)
            for _ in range(n)
        ]
    from airflow_provider_pulsarstate.triggers.leadership import LeadershipTrigger

    if kind == "lease":
        names = setup["lease_names"]
        return [
            LeadershipTrigger(
                mode="acquire",
                lease_name=names[i % len(names)],
                lease_topic=setup["lease_topic"],
                pulsarstate_conn_id=CONN_ID,
            )
            for i in range(n)
        ]
    if kind == "leadership":
        return [LeadershipTrigger(mode="leader", topic=setup["topic"], pulsarstate_conn_id=CONN_ID) for _ in range(n)]
    import datetime

    from airflow.providers.standard.triggers.temporal import DateTimeTrigger

    far = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=30)
    return [DateTimeTrigger(moment=far) for _ in range(n)]


def _change(kind: str, setup: dict[str, Any]) -> float:
    """Make the one change (blocking, on a thread); return when it is durable (time.monotonic())."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    hook = PulsarStateHook(CONN_ID)
    try:
        if kind == "state_change":
            with hook.get_table(setup["tables"][0], writer_idle_timeout=0.1) as table:
                table.put("p0-changed", {"v": 1})
                return time.monotonic()
        if kind in ("messages", "offsets"):
            from airflow_provider_pulsarstate.engine.offsets import open_publisher

            publisher = open_publisher(hook.get_conn(), hook.get_config().topic_name(setup["topic"]), batching=False)
            try:
                publisher.send(b"change")
                publisher.flush(timeout=30)
                return time.monotonic()
            finally:
                publisher.close()
        if kind == "lease":
            from airflow_provider_pulsarstate.engine.recipes.lease import Lease

            leases = hook.get_leases(setup["lease_topic"])
            leases.release(Lease.from_json(setup["lease0"]))
            return time.monotonic()
        from airflow_provider_pulsarstate.engine.backends.base import AcquireMode

        writer = hook.get_conn().acquire_writer(
            hook.get_config().topic_name(setup["topic"]), mode=AcquireMode.FENCE, timeout=30, name="bench-leader"
        )
        _KEEP.extend([writer, hook])  # the leader stays until the child exits
        return time.monotonic()
    finally:
        if hook not in _KEEP:
            hook.close()


_KEEP: list[Any] = []


class _NoChange(Exception):
    """The baseline kind has no change to detect."""


async def _child(
    kind: str, n: int, idle_seconds: float, detect_timeout: float, setup: dict[str, Any], ports: dict[str, int]
) -> dict[str, Any]:
    # what a triggerer process has before it runs a trigger: its runner's modules imported (the
    # connection lookup's among them) and the secrets backends loaded
    import airflow.jobs.triggerer_job_runner  # noqa: F401
    from airflow.sdk.execution_time.supervisor import ensure_secrets_backend_loaded
    from airflow.triggers.shared_stream import SharedStreamManager

    ensure_secrets_backend_loaded()
    import airflow_provider_pulsarstate.triggers.leadership  # noqa: F401  (imports before the idle figures)
    import airflow_provider_pulsarstate.triggers.messages  # noqa: F401
    import airflow_provider_pulsarstate.triggers.offsets  # noqa: F401
    import airflow_provider_pulsarstate.triggers.state_change  # noqa: F401

    _instrument(kind)
    if os.environ.get("BENCH_GC_FREEZE"):  # what-if: the triggerer froze its start-up objects (gc.freeze)
        import gc

        gc.freeze()
    triggers = _make_triggers(kind, n, setup)
    import gc

    # no collection here: the start meets the collector's counts as the imports left them
    out: dict[str, Any] = {"gc_threshold": gc.get_threshold()}
    await asyncio.sleep(0.2)
    idle = _snapshot(ports)
    out["idle"] = idle
    ticker = Ticker()
    ticker.start()
    # the control: the same ticker with no trigger at all (what the machine's load alone costs)
    await asyncio.sleep(3.0)
    out["stall_control_s"] = ticker.reset()
    out["stall_control_s_raw"] = ticker.reset_raw()
    out["stall_control_s_cpu"] = ticker.reset_cpu()
    fired: list[float] = []
    errors: list[str] = []
    shared = kind in ("state_change", "messages")
    manager = SharedStreamManager(ack_timeout=300) if shared else None
    loop = asyncio.get_running_loop()

    async def drive_shared(i: int, trigger: Any) -> None:
        assert manager is not None
        key = trigger.shared_stream_key()
        events = trigger.filter_shared_stream(manager.subscribe(trigger_id=i, trigger=trigger, key=key))
        try:
            async for event in events:
                fired.append(time.monotonic())
                if isinstance(event.payload, dict) and event.payload.get("status") == "error":
                    errors.append(str(event.payload)[:300])
                seq = manager.bind_pending_event(trigger_id=i, key=key)
                manager.confirm_persisted([seq])
        finally:
            await events.aclose()
            await manager.unsubscribe(i, key)

    async def drive_run(trigger: Any) -> None:
        runner = trigger.run()
        try:
            async for event in runner:
                fired.append(time.monotonic())
                if event.payload.get("status") not in ("success", "free"):
                    errors.append(str(event.payload)[:300])
                return
        finally:
            await runner.aclose()

    if os.environ.get("BENCH_SLOW_TURNS"):
        _watch_turns(float(os.environ["BENCH_SLOW_TURNS"]))
    gc_pauses, gc_counts = _watch_gc()
    profile = None
    if os.environ.get("BENCH_PROFILE_START"):  # where the loop's time goes while the triggers start
        import cProfile

        profile = cProfile.Profile(time.thread_time)  # the loop thread's own CPU, not waits
        profile.enable()
    started = time.monotonic()
    cpu0 = _cpu()
    tasks = []
    for i, t in enumerate(triggers):
        # as Airflow's TriggerRunner.create_triggers does: the loop gets a turn before each new trigger
        await asyncio.sleep(0)
        tasks.append(loop.create_task(drive_shared(i + 1, t) if shared else drive_run(t), name=f"trigger-{i}"))
    next_print = started + 1.0
    start_s: float | None = None
    while True:
        await asyncio.sleep(0.02)
        now = time.monotonic()
        if len(RUNNING) >= n:
            start_s = now - started
            break
        if errors:
            break
        if now >= next_print:
            print(f"    {now - started:5.1f}s running {len(RUNNING)}/{n}", file=sys.stderr, flush=True)
            next_print = now + 1.0
        if now - started > max(120.0, n * 0.5):
            break
        if all(t.done() for t in tasks):
            break
    if profile is not None:
        profile.disable()
        profile.dump_stats(os.environ["BENCH_PROFILE_START"])
    out["start_s"] = start_s
    out["worst_gc_pause_start_s"] = dict(gc_pauses)
    out["gc_collections_start"] = dict(gc_counts)
    for sampled in _GC_STACKS:
        for where, count in sampled.most_common(25):
            print(f"    collections due at: {count:4d} {where}", file=sys.stderr, flush=True)
    out["running"] = len(RUNNING)
    out["start_cpu_s"] = _cpu() - cpu0
    out["after_start"] = _minus(_snapshot(ports), idle)
    print(
        f"    worst stall at start: {ticker.worst:.3f}s, ended at "
        f"{time.strftime('%H:%M:%S', time.gmtime(ticker.worst_at))}.{int(ticker.worst_at % 1 * 1000):03d} UTC; "
        f"meanwhile the other threads ran {ticker.worst_others[0]:.3f}s and waited {ticker.worst_others[1]:.3f}s for a CPU",
        file=sys.stderr,
        flush=True,
    )
    out["stall_start_others_cpu_wait_s"] = ticker.worst_others
    out["stall_start_s"] = ticker.reset()
    out["stall_start_s_raw"] = ticker.reset_raw()
    out["stall_start_s_cpu"] = ticker.reset_cpu()
    # what the running triggers keep alive: tracked objects now and after they stopped (both after a
    # full collection, outside every measured window)
    gc.callbacks.clear()
    gc.collect()
    objects_running = _tracked_objects()
    types_running = _object_types() if os.environ.get("BENCH_OBJECT_TYPES") else None
    out["objects_tracked"] = objects_running
    await asyncio.sleep(0.05)  # the ticker's tick over the collection ends before its figures restart
    ticker.reset(), ticker.reset_raw(), ticker.reset_cpu()
    print(
        f"    all running: {start_s if start_s is None else round(start_s, 2)}s ({len(RUNNING)}/{n}); "
        f"idling {idle_seconds:.0f}s",
        file=sys.stderr,
        flush=True,
    )

    if start_s is not None and not errors:
        cpu1, t1 = _cpu(), time.monotonic()
        peak: dict[str, int] = {}
        end = t1 + idle_seconds
        while time.monotonic() < end:
            await asyncio.sleep(min(1.0, max(0.0, end - time.monotonic())))
            for k, v in _minus(_snapshot(ports), idle).items():
                peak[k] = max(peak.get(k, v), v)
        out["cpu_s_per_min"] = (_cpu() - cpu1) / (time.monotonic() - t1) * 60
        out["steady"] = _minus(_snapshot(ports), idle)
        out["peak"] = peak
        out["stall_idle_s"] = ticker.reset()
        out["stall_idle_s_raw"] = ticker.reset_raw()
        out["stall_idle_s_cpu"] = ticker.reset_cpu()
        out["fired_before_change"] = len(fired)
        # detection: one change, then the first trigger firing after it (the baseline has none)
        before = len(fired)
        try:
            if kind == BASELINE:
                raise _NoChange
            durable = await asyncio.to_thread(_change, kind, setup)
            deadline = time.monotonic() + detect_timeout
            while len(fired) == before and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            # a publish can reach a consumer before the producer's flush returns: 0, not negative
            out["detect_s"] = max(0.0, fired[before] - durable) if len(fired) > before else None
        except _NoChange:
            pass
        except Exception as exc:  # a broken change is reported, not hidden
            out["detect_error"] = f"{type(exc).__name__}: {exc}"
        out["stall_detect_s"] = ticker.reset()
        out["stall_detect_s_raw"] = ticker.reset_raw()
        out["stall_detect_s_cpu"] = ticker.reset_cpu()
    out["errors"] = errors[:3]
    out["errors_total"] = len(errors)
    # stop every trigger as the triggerer does, then what is left
    stop0 = time.monotonic()
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    out["task_failures"] = sorted(
        {
            f"{type(r).__name__}: {r}"[:200]
            for r in results
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)
        }
    )[:3]
    del results
    tasks.clear()
    await ticker.stop()
    await asyncio.sleep(2.0)  # closes handed to the pool finish
    out["stop_s"] = time.monotonic() - stop0 - 2.0
    out["after_close"] = _minus(_snapshot(ports), idle)
    gc.collect()
    out["objects_per_trigger"] = (objects_running - _tracked_objects()) / n
    if types_running is not None:  # diagnosis: which types the running triggers keep
        types_now = _object_types()
        diff = sorted(((c - types_now.get(t, 0), t) for t, c in types_running.items()), reverse=True)[:30]
        for count, name in diff:
            print(f"    kept per trigger: {count / n:7.2f} {name}", file=sys.stderr, flush=True)
    return out


def child_main(args: argparse.Namespace) -> None:
    setup = json.loads(Path(args.child_setup).read_text())
    ports = setup["ports"]
    result = asyncio.run(_child(args.kind, args.triggers, args.idle_seconds, args.detect_timeout, setup, ports))
    for obj in _KEEP:
        try:
            obj.close()
        except Exception:
            pass
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # the pulsar client's threads must not hold the exit up


# ================================================================================ the parent
def _conn_extra(backend: str, service_url: str, admin_url: str, tmp: Path) -> dict[str, Any]:
    if backend == "pulsar":
        return {"service_url": service_url, "admin_url": admin_url, "operation_timeout": 30}
    return {"service_url": str(tmp / "state.db"), "operation_timeout": 30}


def _setup(kind: str, backend: str, n: int, args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    """Create what the triggers watch (in the parent: none of it counts against the child)."""
    import logging

    from airflow_provider_pulsarstate.engine.offsets import create_topic
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    logging.getLogger("airflow_provider_pulsarstate").setLevel(logging.WARNING)
    setup: dict[str, Any] = {}
    if kind == BASELINE:
        return setup
    with PulsarStateHook(CONN_ID) as hook:
        config = hook.get_config()
        if kind == "state_change":
            count = n if args.state_tables == "distinct" else 1
            setup["tables"] = [f"{prefix}-t{i}" for i in range(count)]
            for i, name in enumerate(setup["tables"]):
                with hook.get_table(name, writer_idle_timeout=0.1) as table:
                    table.put("setup", {"v": 0})  # the table exists: no trigger waits for it
                if count > 1 and i % 50 == 49:
                    print(f"    setup: {i + 1}/{count} tables", file=sys.stderr, flush=True)
        elif kind in ("messages", "offsets", "leadership"):
            setup["topic"] = f"{prefix}-topic"
            create_topic(hook.get_conn(), config.topic_name(setup["topic"]))
        elif kind == "lease":
            setup["lease_topic"] = f"{prefix}-leases"
            count = min(n, args.leases)
            setup["lease_names"] = [f"l{i}" for i in range(count)]
            leases = hook.get_leases(setup["lease_topic"])
            for i, name in enumerate(setup["lease_names"]):
                lease = leases.acquire(name, holder="bench-holder", ttl=3600.0, timeout=60)
                if i == 0:
                    setup["lease0"] = lease.to_json()
            print(f"    setup: {count} leases held", file=sys.stderr, flush=True)
    return setup


def _cleanup_pulsar(admin_url: str, prefix: str) -> int:
    import requests

    deleted = 0
    for ns_topic in requests.get(f"{admin_url}/admin/v2/namespaces/public/default/topics", timeout=30).json():
        name = ns_topic.rsplit("/", 1)[1]
        if not name.startswith(prefix):
            continue
        path = ns_topic.replace("persistent://", "persistent/")
        resp = requests.delete(f"{admin_url}/admin/v2/{path}", params={"force": "true"}, timeout=60)
        deleted += resp.status_code in (200, 204)
    return deleted


def run_one(kind: str, backend: str, args: argparse.Namespace, service_url: str, admin_url: str) -> dict[str, Any]:
    prefix = f"bench-fp-{uuid.uuid4().hex[:6]}-{kind.replace('_', '')}"
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
            {"conn_type": "pulsarstate", "extra": _conn_extra(backend, service_url, admin_url, tmp)}
        )
        broker_port = int(service_url.rsplit(":", 1)[1].split("/")[0]) if backend == "pulsar" else -1
        admin_port = int(admin_url.rsplit(":", 1)[1].split("/")[0]) if backend == "pulsar" and admin_url else -1
        started = time.monotonic()
        try:
            setup = _setup(kind, backend, args.triggers, args, prefix)
            setup["ports"] = {"broker": broker_port, "admin": admin_port}
            setup_file = tmp / "setup.json"
            setup_file.write_text(json.dumps(setup))
            print(
                f"  setup {time.monotonic() - started:.1f}s; starting {args.triggers} triggers",
                file=sys.stderr,
                flush=True,
            )
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child-setup",
                    str(setup_file),
                    "--kind",
                    kind,
                    "--triggers",
                    str(args.triggers),
                    "--idle-seconds",
                    str(args.idle_seconds),
                    "--detect-timeout",
                    str(args.detect_timeout),
                ],
                stdout=subprocess.PIPE,
                text=True,
                timeout=args.child_timeout,
            )
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                return {"failed": f"child exited {proc.returncode} without a result:\n{proc.stdout[-2000:]}"}
            return json.loads(line[len("RESULT ") :])
        except subprocess.TimeoutExpired:
            return {"failed": f"child ran over {args.child_timeout}s"}
        except Exception as exc:
            return {"failed": f"{type(exc).__name__}: {exc}"}
        finally:
            if backend == "pulsar" and admin_url:
                try:
                    print(
                        f"  cleanup: {_cleanup_pulsar(admin_url, prefix)} topics deleted", file=sys.stderr, flush=True
                    )
                except Exception as exc:
                    print(f"  cleanup failed: {exc}", file=sys.stderr, flush=True)


def _was(kind: str, figure: str) -> str:
    was = BEFORE.get(kind, {}).get(figure)
    return f" (was {was})" if was else ""


def _row(kind: str, backend: str, n: int, r: dict[str, Any]) -> list[str]:
    if "failed" in r:
        return [kind, backend, str(n)] + ["-"] * 9 + ["FAIL (run failed)"]
    steady = r.get("steady") or r["after_start"]
    peak = r.get("peak") or steady
    conns = peak.get("broker", 0) + max(0, peak.get("admin", 0))
    stall = max(r.get("stall_start_s", 0.0), r.get("stall_idle_s", 0.0), r.get("stall_detect_s", 0.0))
    start = r.get("start_s")
    misses = []
    if peak["threads"] > TARGET_THREADS:
        misses.append("threads")
    if peak["fds"] > TARGET_FDS:
        misses.append("fds")
    if backend == "pulsar" and conns > TARGET_CONNS:
        misses.append("conns")
    if start is None or start > TARGET_START:
        misses.append("start")
    if stall > TARGET_STALL:
        misses.append("stall")
    if r.get("detect_s") is None and kind != BASELINE:
        misses.append("no detection")
    if r.get("errors_total"):
        misses.append("errors")
    verdict = "PASS" if not misses else "FAIL (" + ", ".join(misses) + ")"
    cpu = r.get("cpu_s_per_min")
    det = r.get("detect_s")
    return [
        kind,
        backend,
        str(n),
        f"{peak['threads']}{_was(kind, 'threads')}",
        f"{peak['fds']}{_was(kind, 'fds')}",
        "-" if backend != "pulsar" else str(peak.get("broker", 0)),
        "-" if backend != "pulsar" else str(peak.get("admin", 0)),
        ("-" if start is None else f"{start:.2f}") + _was(kind, "start"),
        f"{stall:.3f}",
        "-" if cpu is None else f"{cpu:.1f}",
        "-" if det is None else f"{det:.2f}",
        verdict,
    ]


HEADERS = [
    "kind",
    "back end",
    "N",
    "threads",
    "fds",
    "broker conns",
    "admin conns",
    "start s",
    "worst stall s",
    "CPU s/min idle",
    "detect s",
    "verdict",
]


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    print(" | ".join(h.ljust(w) for h, w in zip(HEADERS, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--triggers", type=int, default=1000, help="triggers of one kind in the process")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="pulsar, embedded")
    parser.add_argument("--idle-seconds", type=float, default=30.0, help="the CPU and steady-state window")
    parser.add_argument("--detect-timeout", type=float, default=60.0)
    parser.add_argument(
        "--leases", type=int, default=100, help="lease kind: leases held (trigger i waits for lease i mod L)"
    )
    parser.add_argument(
        "--state-tables",
        choices=("one", "distinct"),
        default="one",
        help="state_change: one table with N key prefixes, or N tables",
    )
    parser.add_argument("--child-timeout", type=float, default=1800.0)
    parser.add_argument("--service-url")
    parser.add_argument("--admin-url")
    parser.add_argument("--child-setup", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_setup:
        child_main(args)
        return
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for value, allowed in ((kinds, KINDS), (backends, BACKENDS)):
        bad = [v for v in value if v not in allowed]
        if bad:
            parser.error(f"unknown {bad}; choose from {allowed}")
    print_run_header()
    if sys.dont_write_bytecode:
        print(
            "note: PYTHONDONTWRITEBYTECODE is set: each child compiles every module it imports late, on its loop "
            "(a deployment has them compiled); set PYTHONPYCACHEPREFIX and unset it for deployment-like figures"
        )
    print(
        f"triggers per run: {args.triggers}; idle window {args.idle_seconds:.0f}s; default poll_interval (5 s); "
        f"targets: threads <= {TARGET_THREADS}, fds <= {TARGET_FDS}, broker+admin conns <= {TARGET_CONNS}, "
        f"start <= {TARGET_START:.0f}s, stall <= {TARGET_STALL}s",
        flush=True,
    )
    rows, results = [], {}
    need_broker = "pulsar" in backends
    with broker_urls(args.service_url, args.admin_url) if need_broker else _no_broker() as (service_url, admin_url):
        for kind in kinds:
            for backend in backends:
                if kind == "messages" and backend == "embedded":
                    continue  # refused by design: no subscriptions on the embedded log
                if kind == BASELINE and backend != backends[0]:
                    continue  # no back end: one run
                print(f"\n{kind} on {backend}, N={args.triggers}", file=sys.stderr, flush=True)
                result = run_one(kind, backend, args, service_url, admin_url)
                results[f"{kind}/{backend}"] = result
                rows.append(_row(kind, backend, args.triggers, result))
                print(f"  {json.dumps(result)}", file=sys.stderr, flush=True)
    print()
    _print_table(rows)
    _print_baseline(results)
    print(
        "\nfigures are minus the idle process; threads/fds/conns: the largest over the idle window; "
        "(was X@200): the figure for 200 triggers before the sharing"
    )
    print(
        "verdict: the targets are judged on these figures; 'worst stall' is the ticker's worst lateness minus the "
        "time the loop's thread waited for a CPU (as the tests' LoopLag); below also raw (wall clock) and loop CPU "
        "(the loop thread's own CPU over the worst tick: its work, not waits for the GIL or a CPU), and the same "
        "loop with no trigger (control_stall): on a loaded machine the control alone may exceed 0.1 s"
    )
    print("\ndetails (per run): after_start / steady / after_close (minus idle), stalls start/idle/detect, errors")
    for name, r in results.items():
        if "failed" in r:
            print(f"  {name}: FAILED: {r['failed']}")
            continue
        print(
            f"  {name}: after_start={r.get('after_start')} steady={r.get('steady')} after_close={r.get('after_close')} "
            f"stalls={r.get('stall_start_s', 0):.3f}/{r.get('stall_idle_s', 0):.3f}/{r.get('stall_detect_s', 0):.3f} "
            f"(raw {r.get('stall_start_s_raw', 0):.3f}/{r.get('stall_idle_s_raw', 0):.3f}/{r.get('stall_detect_s_raw', 0):.3f}, "
            f"loop CPU {r.get('stall_start_s_cpu', 0):.3f}/{r.get('stall_idle_s_cpu', 0):.3f}/{r.get('stall_detect_s_cpu', 0):.3f}) "
            f"gc_pauses_at_start={ {g: round(v, 3) for g, v in (r.get('worst_gc_pause_start_s') or {}).items()} } "
            f"gc_collections_at_start={r.get('gc_collections_start')} objects_per_trigger={r.get('objects_per_trigger', 0):.0f} "
            f"objects_tracked={r.get('objects_tracked')} "
            f"control_stall={r.get('stall_control_s', 0):.3f} start_cpu={r.get('start_cpu_s', 0):.1f}s stop={r.get('stop_s', 0):.2f}s "
            f"running={r.get('running')} errors={r.get('errors_total')} {r.get('errors') or ''} "
            f"{r.get('task_failures') or ''} {r.get('detect_error') or ''}"
        )


def _start_figures(r: dict[str, Any]) -> tuple[float, float, int, float]:
    """Start stall, longest full (generation 2) collection at start, full collections at start,
    objects kept alive per running trigger."""
    counts = r.get("gc_collections_start") or {}
    pauses = r.get("worst_gc_pause_start_s") or {}
    return (
        r.get("stall_start_s", 0.0),
        pauses.get("2", pauses.get(2, 0.0)),  # JSON keys are strings
        counts.get("2", counts.get(2, 0)),
        r.get("objects_per_trigger", 0.0),
    )


def _print_baseline(results: dict[str, dict[str, Any]]) -> None:
    """Each kind's start beside the baseline's (Airflow's DateTimeTrigger, same N, same process)."""
    base = next((r for name, r in results.items() if name.startswith(BASELINE + "/") and "failed" not in r), None)
    if base is None:
        print(f"\n(no baseline: add {BASELINE!r} to --kinds for Airflow's DateTimeTrigger beside each kind)")
        return
    b_stall, b_gc, b_full, b_objects = _start_figures(base)
    print(
        f"\nstart beside the baseline ({BASELINE}: Airflow's DateTimeTrigger, same N, same harness): "
        f"stall {b_stall:.3f}s, full collections {b_full} (longest {b_gc:.3f}s), {b_objects:.0f} objects kept per trigger"
    )
    print(f"  (stall ratios: to the baseline's stall or the ticker's {Ticker().tick * 1000:.0f} ms period, the larger)")
    print(
        "  kind/back end: start stall s (x baseline) | full collections at start, longest s | objects kept per trigger (x baseline)"
    )
    for name, r in results.items():
        if name.startswith(BASELINE + "/") or "failed" in r:
            continue
        stall, gc2, full, objects = _start_figures(r)
        ratio = f"{stall / max(b_stall, Ticker().tick):.1f}x"
        o_ratio = f"{objects / b_objects:.1f}x" if b_objects > 0 else "-"
        print(f"  {name}: {stall:.3f} ({ratio}) | {full}, {gc2:.3f} | {objects:.0f} ({o_ratio})")


class _no_broker:
    def __enter__(self) -> tuple[str, str]:
        return "", ""

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()
