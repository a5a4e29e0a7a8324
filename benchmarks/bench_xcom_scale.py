#!/usr/bin/env python
"""XCom backend at scale: memory, fan-out and pull latency against the targets of BENCHMARKS.md.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_xcom_scale.py                    # own broker, both back ends, full size
    .venv/bin/python benchmarks/bench_xcom_scale.py --backend embedded --procs 20 --xcom-mib 20 \\
        --state-mib 10 --entries 10000                                 # a quick run (~2-3 min per back end)
    .venv/bin/python benchmarks/bench_xcom_scale.py --service-url pulsar://127.0.0.1:6650 \\
        --admin-url http://127.0.0.1:8080                              # use a running broker
    .venv/bin/python benchmarks/bench_xcom_scale.py --layouts messages --workloads fanout   # one layout

Every workload runs once per back end and per XCom layout (``--layouts``, default both):
``messages`` (each value one immutable message of its run's topic, read back by address: the
default of ``[pulsarstate] xcom_layout``) and ``map`` (one PulsarMap per DAG run). Below, "the
run's map" reads "the run's topic" for the messages layout: its fills append messages instead of
map entries, and a pull reads one message instead of replaying the run's map.

Three workloads, each against both back ends of the map (the embedded SQLite log in a throw-away
file, a Pulsar broker: the bundled standalone the script starts unless ``--service-url`` is
given), each in its own key namespace and topics, all deleted at the end:

1. **Memory.** A fresh Python process (spawned) imports ``PulsarXComBackend``, pushes a 20-byte
   value (``serialize_value``: opens its run's map) and pulls it back (``deserialize_value``),
   then prints its peak RSS: ``VmHWM`` of ``/proc/self/status``, not ``ru_maxrss``, which Linux
   carries across ``execve`` from the parent (a child of this script, grown by the filling,
   would report at least the script's own size). Once on an empty store, once
   after ``--xcom-mib`` of other runs' XComs (values of ``--value-kib``, 2 per run, written
   through ``XComStore``'s map with ``put_async``) and ``--state-mib`` of other DAGs' task state
   (``PulsarStateHook().update_state``, whatever the state layout) are stored. Target: the
   filled store's peak within +30 MB of the empty store's. ``--old-layout`` adds, for
   reference, the same figure for the earlier single-map layout (the same XComs written to the
   one deployment-wide map, which a process then replays whole).
2. **Fan-out.** ``--procs`` task processes push one small value each to the SAME DAG run at once
   (the first push opens the run map, as in a real task), then pull it back. The processes are
   forked from one process that imported the backend (as Airflow's supervisor forks each task
   process after its imports), each signals ready, and all start together when the script
   releases an exclusive ``flock`` on a go file. Reported: failures, p50/p99 push and pull
   latency. Baseline at the same concurrency: Airflow's DB backend on SQLite, i.e. as many
   processes doing what ``XComModel.set`` does on the API server (look up the run's id, delete
   the old row, insert the new one, commit) and a select back, on one SQLite file in WAL mode
   with foreign keys on and the 5 s busy timeout Airflow's engine gets (pysqlite's default).
   Targets: 0 failures; p99 push within 3x of the DB's. Before forking, the parent also imports
   Airflow's own serde and supervisor modules (any push and any connection lookup of a task
   process load them, whatever the XCom backend); never ``pulsar`` (see ``_refuse_pulsar_before_fork``).
3. **Pull latency vs store size.** A fresh (forked) process opens the map of a run holding one
   value and pulls it (``deserialize_value``: bootstrap, replay, one read at the tail), median of
   ``--pull-repeats``, with ``--entries-small`` (1,000) and then ``--entries`` (100,000) other
   entries stored in other runs' maps (100 small entries per run, ``put_async`` per map).
   Target: the two medians within 1.5x.

Prints machine, date and load average, progress lines, and a table: workload | this project |
baseline | ratio/delta | target | PASS/FAIL. Run the full size on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import broker_urls, machine_info, percentile, print_run_header  # noqa: E402  (benchmarks/machine.py)

BACKEND_MODULE = "airflow_provider_pulsarstate.xcom.backend"
TOPIC_ROOT = "bench-xscale"
SMALL_VALUE = "0123456789abcdefghij"  # the 20-byte value of the memory workload
SQLITE_BUSY_TIMEOUT = 5.0  # pysqlite's default; Airflow passes no other to its engine
XCOM_DDL = """
CREATE TABLE dag_run (id INTEGER PRIMARY KEY, dag_id VARCHAR(250) NOT NULL, run_id VARCHAR(250) NOT NULL,
                      UNIQUE (dag_id, run_id));
CREATE TABLE xcom (
    dag_run_id INTEGER NOT NULL REFERENCES dag_run (id) ON DELETE CASCADE,
    task_id VARCHAR(250) NOT NULL, map_index INTEGER DEFAULT -1 NOT NULL, key VARCHAR(512) NOT NULL,
    dag_id VARCHAR(250) NOT NULL, run_id VARCHAR(250) NOT NULL, value JSON, timestamp DATETIME NOT NULL,
    PRIMARY KEY (dag_run_id, task_id, map_index, key));
CREATE INDEX idx_xcom_task_instance ON xcom (dag_id, task_id, run_id, map_index);
"""  # the columns, keys and index of Airflow 3's xcom table (a dag_run row for its foreign key)


# ---------------------------------------------------------------------------------------------
# What runs where
# ---------------------------------------------------------------------------------------------
@dataclass
class Target:
    """One back end of the map, and the throw-away directory the run keeps its files in."""

    name: str
    extra: dict[str, Any]
    home: Path
    run_tag: str
    layout: str = "messages"
    rows: list[list[str]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def env(self, workload: str) -> dict[str, str]:
        """The environment of every process of one workload: its own key namespace and topics."""
        env = dict(os.environ)
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
                "AIRFLOW__PULSARSTATE__KEY_NAMESPACE": self.namespace(workload),
                "AIRFLOW__PULSARSTATE__XCOM_LAYOUT": self.layout,
                "AIRFLOW__PULSARSTATE__XCOM_TOPIC": f"{self.topic_prefix()}-{workload}-xcom",
                "AIRFLOW__PULSARSTATE__STATE_STORE_TOPIC": f"{self.topic_prefix()}-{workload}-state",
                "AIRFLOW_CONN_PULSARSTATE_DEFAULT": json.dumps({"conn_type": "pulsarstate", "extra": self.extra}),
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
            }
        )
        return env

    def namespace(self, workload: str) -> str:
        return f"bxs-{self.run_tag}-{self.name[:3]}-{self.layout[:3]}-{workload}"

    def topic_prefix(self) -> str:
        return f"{TOPIC_ROOT}-{self.run_tag}-{self.name[:3]}-{self.layout[:3]}"

    @property
    def label(self) -> str:
        return f"{self.name} / {self.layout}"


@contextlib.contextmanager
def in_env(env: dict[str, str]) -> Iterator[None]:
    """This process configured like the workload's children (settings and maps read afresh)."""
    from airflow_provider_pulsarstate.xcom.backend import close_stores

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    close_stores()  # forgets the cached [pulsarstate] settings and connection
    try:
        yield
    finally:
        close_stores()
        os.environ.clear()
        os.environ.update(saved)


def progress(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_child(mode: str, spec: dict[str, Any], env: dict[str, str], log: Path, timeout: float) -> str:
    """Run this script as a child (``--child mode``); returns its last stdout line (its result)."""
    with log.open("ab") as err:
        done = subprocess.run(
            [sys.executable, __file__, "--child", mode, json.dumps(spec)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            timeout=timeout,
        )
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"child {mode} exited {done.returncode}; see {log}:\n{_tail(log)}")
    return lines[-1]


def _tail(path: Path, chars: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-chars:]
    return ""


# ---------------------------------------------------------------------------------------------
# Children (``--child``): light at the top, so a spawned or forked child imports only what it needs
# ---------------------------------------------------------------------------------------------
def child_rss(spec: dict[str, Any]) -> None:
    """A fresh task process: one push+pull through the backend (or, ``old``, through the earlier
    single map, which it replays whole); prints its peak RSS."""
    import resource

    from airflow_provider_pulsarstate.xcom import backend

    where = dict(key="return_value", task_id="t", dag_id=spec["dag_id"], run_id=spec["run_id"], map_index=-1)
    if spec.get("old"):
        store = backend.get_store()
        map_key, _ = store.put(
            where["dag_id"], where["run_id"], "t", -1, "return_value", json.dumps(SMALL_VALUE), type_name="str"
        )
        assert store.map.get(map_key, latest=True).json_value() == SMALL_VALUE
    else:
        reference = backend.PulsarXComBackend.serialize_value(SMALL_VALUE, **where)
        assert backend.PulsarXComBackend.deserialize_value(SimpleNamespace(value=reference)) == SMALL_VALUE
    maxrss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    backend.close_stores()
    print(json.dumps({"hwm_kb": _own_peak_kb(), "maxrss_kb": maxrss_kb}), flush=True)


def _own_peak_kb() -> int:
    """This process's own peak RSS (``VmHWM``). Not ``ru_maxrss``: Linux carries that across
    ``execve`` from the forked parent, so a child of a big process reports at least its size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def _ours_work(spec: dict[str, Any]) -> Callable[[int], tuple[float, float]]:
    import airflow.sdk.definitions.connection  # noqa: F401  (Airflow's own: loaded by any connection lookup)
    import airflow.sdk.execution_time.cache  # noqa: F401  (Airflow's own: loaded by any connection lookup)
    import airflow.sdk.execution_time.supervisor  # noqa: F401  (Airflow's own: loaded by any connection lookup)
    import airflow.sdk.serde  # noqa: F401  (Airflow's own: loaded by any XCom push)

    from airflow_provider_pulsarstate.hooks import pulsarstate  # noqa: F401  (what the first push imports)
    from airflow_provider_pulsarstate.xcom.backend import PulsarXComBackend, close_stores

    _refuse_pulsar_before_fork()

    def work(i: int) -> tuple[float, float]:
        value = {"task": i, "rows": 3, "ok": True}
        t0 = time.perf_counter()
        reference = PulsarXComBackend.serialize_value(
            value, key="return_value", task_id=f"t{i}", dag_id=spec["dag_id"], run_id=spec["run_id"], map_index=-1
        )
        t1 = time.perf_counter()
        got = PulsarXComBackend.deserialize_value(SimpleNamespace(value=reference))
        t2 = time.perf_counter()
        if got != value:
            raise AssertionError(f"pulled {got!r}, pushed {value!r}")
        close_stores()  # what the task process does at exit
        return t1 - t0, t2 - t1

    return work


def _refuse_pulsar_before_fork() -> None:
    """The Pulsar client must be loaded after the fork: processes forked after ``import pulsar``
    share its random state, so their readers get the same subscription name and all but one fail
    with ConsumerBusy (not what separate task processes see)."""
    if "pulsar" in sys.modules:
        raise RuntimeError("pulsar was imported before forking the task processes")


def _db_work(spec: dict[str, Any]) -> Callable[[int], tuple[float, float]]:
    import sqlite3

    def work(i: int) -> tuple[float, float]:
        value = json.dumps({"task": i, "rows": 3, "ok": True})
        row = dict(dag_id=spec["dag_id"], run_id=spec["run_id"], task_id=f"t{i}", map_index=-1, key="return_value")
        t0 = time.perf_counter()
        con = sqlite3.connect(spec["db"], timeout=SQLITE_BUSY_TIMEOUT)
        con.execute("PRAGMA foreign_keys=ON")  # Airflow's connect hook (utils/orm_event_handlers.py)
        con.execute("PRAGMA journal_mode=WAL")
        run_pk = con.execute("SELECT id FROM dag_run WHERE dag_id = :dag_id AND run_id = :run_id", row).fetchone()[0]
        con.execute(
            "DELETE FROM xcom WHERE key = :key AND run_id = :run_id AND task_id = :task_id "
            "AND dag_id = :dag_id AND map_index = :map_index",
            row,
        )
        con.execute(
            "INSERT INTO xcom (dag_run_id, task_id, map_index, key, dag_id, run_id, value, timestamp) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, datetime('now'))",
            (run_pk, row["task_id"], -1, row["key"], row["dag_id"], row["run_id"], value),
        )
        con.commit()
        t1 = time.perf_counter()
        got = con.execute(
            "SELECT value FROM xcom WHERE dag_id = :dag_id AND task_id = :task_id AND run_id = :run_id "
            "AND map_index = :map_index AND key = :key",
            row,
        ).fetchone()[0]
        t2 = time.perf_counter()
        con.close()
        if got != value:
            raise AssertionError(f"read {got!r}, wrote {value!r}")
        return t1 - t0, t2 - t1

    return work


def child_fanout(spec: dict[str, Any]) -> None:
    """Import what a task needs once, fork ``n`` task processes, each waits for the go lock,
    pushes and pulls, and leaves ``out/<i>.json``; stragglers past the deadline are killed."""
    work = _ours_work(spec) if spec["kind"] == "ours" else _db_work(spec)
    out, ready = Path(spec["dir"]) / "out", Path(spec["dir"]) / "ready"
    pids: dict[int, int] = {}
    for i in range(spec["n"]):
        pid = os.fork()
        if pid == 0:
            _fanout_task(work, i, spec["go"], ready, out)
        pids[pid] = i
    _reap(pids, time.monotonic() + spec["timeout"])


def _fanout_task(work: Callable[[int], tuple[float, float]], i: int, go: str, ready: Path, out: Path) -> None:
    code = 0
    try:
        (ready / str(i)).touch()
        fd = os.open(go, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_SH)  # blocks until the script releases its exclusive lock
        start = time.time()
        try:
            push, pull = work(i)
            result: dict[str, Any] = {"push": push, "pull": pull, "start": start, "end": time.time()}
        except BaseException as exc:  # noqa: BLE001  (every failure is a counted result)
            result = {
                "error": f"{type(exc).__name__}: {exc}"[:400],
                "start": start,
                "end": time.time(),
                "trace": traceback.format_exc()[-3000:],
            }
        (out / f"{i}.json").write_text(json.dumps(result))
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        os._exit(code)


def _reap(pids: dict[int, int], deadline: float) -> None:
    while pids and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
        else:
            pids.pop(pid, None)
    for pid in pids:  # past the deadline: counted as failures (no result file)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def child_pulls(spec: dict[str, Any]) -> None:
    """Import the backend once, then per sample fork a fresh process that opens the run's map and
    pulls one value (``deserialize_value``); prints the samples (seconds)."""
    from airflow_provider_pulsarstate.hooks import pulsarstate  # noqa: F401
    from airflow_provider_pulsarstate.xcom.backend import PulsarXComBackend, close_stores

    _refuse_pulsar_before_fork()
    samples: list[float] = []
    for _ in range(spec["repeats"]):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            t0 = time.perf_counter()
            got = PulsarXComBackend.deserialize_value(SimpleNamespace(value=spec["reference"]))
            elapsed = time.perf_counter() - t0
            close_stores()
            os.write(write_fd, json.dumps(elapsed if got == spec["value"] else None).encode())
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as pipe:
            answer = json.loads(pipe.read() or "null")
        os.waitpid(pid, 0)
        if answer is None:
            raise SystemExit("a pull returned another value than the one pushed")
        samples.append(answer)
    print(json.dumps(samples), flush=True)


CHILDREN: dict[str, Callable[[dict[str, Any]], None]] = {"rss": child_rss, "fanout": child_fanout, "pulls": child_pulls}


# ---------------------------------------------------------------------------------------------
# Filling the store (this process, through the public APIs)
# ---------------------------------------------------------------------------------------------
def fill_run_maps(
    ns: str,
    xcom_topic: str,
    dag_id: str,
    run_ids: list[str],
    per_run: int,
    value_json: str,
    *,
    threads: int,
    label: str,
) -> None:
    """``per_run`` entries of ``value_json`` in each run's own map (one XComStore per run, the
    writes of a run queued with ``put_async``), ``threads`` runs at a time."""
    from airflow_provider_pulsarstate.engine.recipes.xcom_store import XComRecord, XComStore, run_topic
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    hook = PulsarStateHook()
    backend, base = hook.get_conn(), hook.topic_name(xcom_topic)
    size = len(value_json.encode())

    def one(run_id: str) -> None:
        with XComStore(backend, run_topic(base, ns, dag_id, run_id), namespace=ns) as store:
            futures = [
                store.map.put_async(
                    store.map_key(dag_id, run_id, f"t{j}", -1, "return_value"),
                    XComRecord(value_json, time.time(), size, "str"),
                )
                for j in range(per_run)
            ]
            for future in futures:
                future.result(timeout=600)

    _in_pool(one, run_ids, threads, label, per_run * size)
    hook.close()


def fill_run_messages(
    ns: str,
    xcom_topic: str,
    dag_id: str,
    run_ids: list[str],
    per_run: int,
    value_json: str,
    *,
    threads: int,
    label: str,
) -> None:
    """``per_run`` XCom messages of ``value_json`` in each run's own topic (the messages layout;
    sent pipelined and flushed once per run), ``threads`` runs at a time."""
    from airflow_provider_pulsarstate.engine.offsets import create_topic, open_publisher
    from airflow_provider_pulsarstate.engine.recipes.xcom_messages import (
        XComIdentity,
        XComMessage,
        encode_message,
        message_topic,
    )
    from airflow_provider_pulsarstate.engine.recipes.xcom_store import XComRecord
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    hook = PulsarStateHook()
    backend, base = hook.get_conn(), hook.topic_name(xcom_topic)
    size = len(value_json.encode())

    def one(run_id: str) -> None:
        topic = message_topic(base, ns, dag_id, run_id)
        create_topic(backend, topic)
        with open_publisher(backend, topic, batching=False) as publisher:
            for j in range(per_run):
                message = XComMessage(
                    XComIdentity(ns, dag_id, run_id, f"t{j}", -1, "return_value"),
                    uuid.uuid4().hex,
                    XComRecord(value_json, time.time(), size, "str"),
                )
                publisher.send(encode_message(message))
            publisher.flush(timeout=600)

    _in_pool(one, run_ids, threads, label, per_run * size)
    hook.close()


def fill_runs(layout: str, *args: Any, **kwargs: Any) -> None:
    """Other runs' XComs in the given layout (:func:`fill_run_messages` or :func:`fill_run_maps`)."""
    (fill_run_messages if layout == "messages" else fill_run_maps)(*args, **kwargs)


def fill_single_map(ns: str, xcom_topic: str, dag_id: str, run_ids: list[str], per_run: int, value_json: str) -> None:
    """The same entries in the earlier layout's one deployment-wide map (``xcom_topic`` itself)."""
    from airflow_provider_pulsarstate.engine.recipes.xcom_store import XComRecord, XComStore
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    hook = PulsarStateHook()
    size, last = len(value_json.encode()), time.monotonic()
    with XComStore(hook.get_conn(), hook.topic_name(xcom_topic), namespace=ns) as store:
        for done, run_id in enumerate(run_ids, 1):
            futures = [
                store.map.put_async(
                    store.map_key(dag_id, run_id, f"t{j}", -1, "return_value"),
                    XComRecord(value_json, time.time(), size, "str"),
                )
                for j in range(per_run)
            ]
            for future in futures:
                future.result(timeout=600)
            if time.monotonic() - last > 5 or done == len(run_ids):
                progress(f"old layout: {done}/{len(run_ids)} runs, {done * per_run * size / 2**20:.0f} MiB")
                last = time.monotonic()
    hook.close()


def fill_task_state(mib: float, value_kib: int) -> None:
    """``mib`` of task state of other DAGs (5 DAGs x 2 runs x tasks), through ``update_state``."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook, TaskStateScope

    value = "s" * (value_kib * 1024 - 2)
    count = math.ceil(mib * 1024 / value_kib)
    scopes = [TaskStateScope(f"other_dag_{i % 5}", f"run_{i // 5 % 2}", f"task_{i}", -1) for i in range(count)]
    hook = PulsarStateHook()
    _in_pool(lambda scope: hook.update_state(scope, "blob", lambda _: value), scopes, 1, "task state", value_kib * 1024)
    hook.close()


def _in_pool(fn: Callable[[Any], None], items: list[Any], threads: int, label: str, bytes_each: int) -> None:
    last, t0 = time.monotonic(), time.monotonic()
    with ThreadPoolExecutor(max(1, threads)) as pool:
        for done, future in enumerate(as_completed([pool.submit(fn, item) for item in items]), 1):
            future.result()
            if time.monotonic() - last > 5 or done == len(items):
                progress(
                    f"{label}: {done}/{len(items)} ({done * bytes_each / 2**20:.1f} MiB) in "
                    f"{time.monotonic() - t0:.0f}s"
                )
                last = time.monotonic()


def delete_topics(target: Target) -> None:
    """Delete every topic this run made on the broker (the embedded file goes with its directory)."""
    if not target.name.startswith("pulsar"):
        return
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    with in_env(target.env("cleanup")):
        hook = PulsarStateHook()
        backend = hook.get_conn()
        topics = backend.list_topics(hook.topic_name(target.topic_prefix()))
        for topic in topics:
            with contextlib.suppress(Exception):
                backend.delete_topic(topic)
        left = backend.list_topics(hook.topic_name(target.topic_prefix()))
        hook.close()
    progress(
        f"clean-up: deleted {len(topics) - len(left)} topics" + (f", {len(left)} left: {left[:3]}" if left else "")
    )


# ---------------------------------------------------------------------------------------------
# The three workloads
# ---------------------------------------------------------------------------------------------
def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{_msec(percentile(values, 50))} / {_msec(percentile(values, 99))} ms"


def _msec(seconds: float) -> str:
    ms = 1000 * seconds
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"


def memory_workload(target: Target, args: argparse.Namespace) -> None:
    env = target.env("mem")
    log = target.home / "memory.log"

    def peak_mb(run_id: str, *, old: bool = False) -> float:
        spec = {"dag_id": "bench_memory", "run_id": run_id, "old": old}
        return json.loads(run_child("rss", spec, env, log, timeout=1800))["hwm_kb"] / 1024

    empty = [peak_mb(f"empty-{i}") for i in range(args.mem_repeats)]
    progress(f"memory, empty store: peak RSS {', '.join(f'{m:.0f}' for m in empty)} MB")
    value_json = json.dumps("v" * (args.value_kib * 1024 - 2))
    run_ids = [f"other_run_{i}" for i in range(math.ceil(args.xcom_mib * 1024 / (2 * args.value_kib)))]
    with in_env(env):
        fill_runs(
            target.layout,
            target.namespace("mem"),
            env["AIRFLOW__PULSARSTATE__XCOM_TOPIC"],
            "other_dag",
            run_ids,
            2,
            value_json,
            threads=args.fill_threads,
            label="other runs' XComs",
        )
        if args.state_mib > 0:
            fill_task_state(args.state_mib, args.value_kib)
    filled = [peak_mb(f"filled-{i}") for i in range(args.mem_repeats)]
    progress(f"memory, filled store: peak RSS {', '.join(f'{m:.0f}' for m in filled)} MB")
    base, ours = statistics.median(empty), statistics.median(filled)
    stored = f"{2 * len(run_ids) * args.value_kib / 1024:.0f} MiB XComs of {len(run_ids)} other runs + {args.state_mib:g} MiB state"
    target.rows.append(
        [
            f"memory: fresh process, 1 push+pull of 20 B, {stored} (peak RSS; baseline: empty store)",
            f"{ours:.0f} MB",
            f"{base:.0f} MB",
            f"{ours - base:+.0f} MB",
            "<= +30 MB",
            _verdict(ours - base <= 30),
        ]
    )
    target.raw["memory"] = {"empty_mb": empty, "filled_mb": filled}
    if args.old_layout:
        with in_env(env):
            fill_single_map(
                target.namespace("mem"), env["AIRFLOW__PULSARSTATE__XCOM_TOPIC"], "other_dag", run_ids, 2, value_json
            )
        old = peak_mb("old-layout", old=True)
        target.rows.append(
            [
                "memory, earlier single-map layout, same XComs (reference)",
                f"{old:.0f} MB",
                f"{base:.0f} MB",
                f"{old - base:+.0f} MB",
                "-",
                "-",
            ]
        )
        target.raw["memory"]["old_layout_mb"] = old


def fanout(kind: str, target: Target, args: argparse.Namespace, env: dict[str, str], db: Path | None) -> dict[str, Any]:
    """``args.procs`` forked task processes released at once; their results (missing: failed)."""
    work = Path(tempfile.mkdtemp(prefix=f"fanout-{kind}-", dir=target.home))
    (work / "out").mkdir()
    (work / "ready").mkdir()
    go = work / "go"
    go.touch()
    spec = {
        "kind": kind,
        "n": args.procs,
        "dir": str(work),
        "go": str(go),
        "dag_id": "bench_fanout",
        "run_id": f"fanout_{uuid.uuid4().hex[:8]}",
        "timeout": args.fanout_timeout,
        "db": str(db) if db else "",
    }
    if db is not None:
        _make_xcom_db(db, spec["dag_id"], spec["run_id"])
    log = target.home / f"fanout-{kind}.log"
    with go.open("rb") as lock, log.open("ab") as err:
        fcntl.flock(lock, fcntl.LOCK_EX)
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", "fanout", json.dumps(spec)],
            env=env,
            cwd=ROOT,
            stdout=err,
            stderr=err,
            start_new_session=True,
        )
        try:
            _wait_ready(work / "ready", args.procs, child, kind, args.fanout_timeout)
            released = time.time()
            fcntl.flock(lock, fcntl.LOCK_UN)
            child.wait(timeout=args.fanout_timeout + 120)  # it kills its own stragglers at the deadline
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)  # the fan-out process and its task processes
                child.wait()
    results = [json.loads(p.read_text()) for p in (work / "out").glob("*.json")]
    ok = [r for r in results if "error" in r or "push" in r]
    errors = [r["error"] for r in ok if "error" in r] + ["no result (killed or crashed)"] * (args.procs - len(ok))
    done = [r for r in ok if "push" in r]
    span = max((r["end"] for r in ok), default=released) - released
    progress(
        f"fan-out {kind}: {len(done)}/{args.procs} ok in {span:.1f}s; push p50/p99 "
        f"{_ms([r['push'] for r in done])}" + (f"; first error: {errors[0]}" if errors else "")
    )
    if traces := [r["trace"] for r in ok if "trace" in r]:
        with log.open("a") as out:
            out.write(f"first of {len(traces)} failed task processes:\n{traces[0]}\n")
        progress(f"fan-out {kind}: the first failure's traceback is in {log} (kept with --keep)")
    return {"push": [r["push"] for r in done], "pull": [r["pull"] for r in done], "errors": errors, "span_s": span}


def _wait_ready(ready: Path, n: int, child: subprocess.Popen[bytes], kind: str, timeout: float) -> None:
    t0, last = time.monotonic(), 0.0
    while (count := len(os.listdir(ready))) < n:
        if time.monotonic() - t0 > timeout:
            progress(f"fan-out {kind}: only {count}/{n} task processes ready after {timeout:.0f}s, go anyway")
            return
        if child.poll() is not None:
            raise RuntimeError(f"the {kind} fan-out process exited {child.returncode} before its tasks were ready")
        if time.monotonic() - last > 10:
            progress(f"fan-out {kind}: {count}/{n} task processes ready")
            last = time.monotonic()
        time.sleep(0.1)
    progress(f"fan-out {kind}: {n} task processes ready after {time.monotonic() - t0:.1f}s, go")


def _make_xcom_db(db: Path, dag_id: str, run_id: str) -> None:
    import sqlite3

    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=WAL")
    con.executescript(XCOM_DDL)
    con.execute("INSERT INTO dag_run (dag_id, run_id) VALUES (?, ?)", (dag_id, run_id))
    con.commit()
    con.close()


def fanout_workload(target: Target, args: argparse.Namespace, db_dir: Path) -> None:
    env = target.env("fan")
    db = fanout("db", target, args, env, db_dir / f"airflow-{target.name}-{target.layout}.db")
    ours = fanout("ours", target, args, env, None)
    target.raw["fanout"] = {"ours": ours, "db": db}
    n = args.procs
    target.rows.append(
        [
            f"fan-out: {n} task processes push+pull to one run at once: failures",
            f"{len(ours['errors'])}",
            f"{len(db['errors'])} (DB)",
            "-",
            "0",
            _verdict(not ours["errors"]),
        ]
    )
    if ours["push"] and db["push"]:
        ratio = percentile(ours["push"], 99) / percentile(db["push"], 99)
        target.rows.append(
            [
                f"fan-out: push latency p50 / p99 ({n} at once; baseline: Airflow's DB backend, SQLite)",
                _ms(ours["push"]),
                _ms(db["push"]),
                f"{ratio:.2f}x (p99)",
                "<= 3x",
                _verdict(ratio <= 3),
            ]
        )
        pull = percentile(ours["pull"], 99) / percentile(db["pull"], 99)
        target.rows.append(
            [
                "fan-out: pull latency p50 / p99 (reported)",
                _ms(ours["pull"]),
                _ms(db["pull"]),
                f"{pull:.2f}x (p99)",
                "-",
                "-",
            ]
        )
        target.rows.append(
            [
                "fan-out: wall time from go to the last task done",
                f"{ours['span_s']:.1f} s",
                f"{db['span_s']:.1f} s",
                "-",
                "-",
                "-",
            ]
        )


def pull_workload(target: Target, args: argparse.Namespace) -> None:
    env = target.env("pull")
    value = {"rows": 3, "ok": True, "payload": "p" * 80}
    with in_env(env):
        from airflow_provider_pulsarstate.xcom.backend import PulsarXComBackend

        reference = PulsarXComBackend.serialize_value(
            value, key="return_value", task_id="t", dag_id="bench_pull", run_id="target_run", map_index=-1
        )
    log = target.home / "pull.log"
    per_run, stored, medians = 100, 0, {}
    entry_json = json.dumps({"rows": 1, "payload": "e" * 60})
    for size in (args.entries_small, args.entries):
        runs = [f"other_run_{i}" for i in range(stored // per_run, math.ceil(size / per_run))]
        with in_env(env):
            fill_runs(
                target.layout,
                target.namespace("pull"),
                env["AIRFLOW__PULSARSTATE__XCOM_TOPIC"],
                "other_dag",
                runs,
                per_run,
                entry_json,
                threads=args.fill_threads,
                label=f"other entries (to {size:,})",
            )
        stored = math.ceil(size / per_run) * per_run
        spec = {"reference": reference, "value": value, "repeats": args.pull_repeats}
        samples = json.loads(run_child("pulls", spec, env, log, timeout=1800))
        medians[size] = statistics.median(samples)
        progress(f"pull with {stored:,} other entries: {', '.join(f'{1000 * s:.0f}' for s in samples)} ms")
        target.raw.setdefault("pull", {})[str(stored)] = samples
    small, large = medians[args.entries_small], medians[args.entries]
    opened = "read 1 message by address" if target.layout == "messages" else "open run map + 1 read"
    target.rows.append(
        [
            f"pull (fresh process: {opened}), median of {args.pull_repeats}: "
            f"{args.entries:,} vs {args.entries_small:,} other entries",
            f"{1000 * large:.0f} ms",
            f"{1000 * small:.0f} ms",
            f"{large / small:.2f}x",
            "<= 1.5x",
            _verdict(large / small <= 1.5),
        ]
    )


# ---------------------------------------------------------------------------------------------
def run_target(target: Target, args: argparse.Namespace, db_dir: Path) -> None:
    print(f"\n== {target.label} ({target.extra['service_url']}) ==", flush=True)
    steps = {
        "memory": lambda: memory_workload(target, args),
        "fanout": lambda: fanout_workload(target, args, db_dir),
        "pull": lambda: pull_workload(target, args),
    }
    try:
        for name in args.workloads:
            t0 = time.monotonic()
            try:
                steps[name]()
            except Exception as exc:  # a workload that breaks is a failed row, the others still run
                target.rows.append(
                    [f"{name}: did not complete", f"{type(exc).__name__}: {str(exc)[:300]}", "-", "-", "-", "FAIL"]
                )
                progress(f"{name} failed: {type(exc).__name__}: {exc}")
            progress(f"{name} done in {time.monotonic() - t0:.0f}s, loadavg {os.getloadavg()}")
    finally:
        with contextlib.suppress(Exception):
            delete_topics(target)


def print_table(targets: list[Target]) -> None:
    print("\n| back end / layout | workload | this project | baseline | ratio/delta | target | PASS/FAIL |")
    print("|---|---|---|---|---|---|---|")
    for target in targets:
        for row in target.rows:
            print(f"| {target.label} | " + " | ".join(row) + " |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--backend", choices=["both", "embedded", "pulsar"], default="both")
    p.add_argument(
        "--layouts",
        nargs="+",
        choices=["messages", "map"],
        default=["messages", "map"],
        help="XCom layouts to measure ([pulsarstate] xcom_layout), each against the same DB baseline",
    )
    p.add_argument("--service-url", help="a running broker (default: start the bundled standalone)")
    p.add_argument("--admin-url")
    p.add_argument("--workloads", nargs="+", choices=["memory", "fanout", "pull"], default=["memory", "fanout", "pull"])
    p.add_argument("--procs", type=int, default=200, help="fan-out: task processes at once")
    p.add_argument("--fanout-timeout", type=float, default=600, help="fan-out: seconds before a task counts as failed")
    p.add_argument("--xcom-mib", type=float, default=250, help="memory: other runs' XComs stored (MiB)")
    p.add_argument("--state-mib", type=float, default=50, help="memory: other DAGs' task state stored (MiB)")
    p.add_argument("--value-kib", type=int, default=500, help="memory: size of each stored XCom / state value")
    p.add_argument("--mem-repeats", type=int, default=2, help="memory: fresh processes per case (median)")
    p.add_argument("--old-layout", action="store_true", help="memory: also the earlier single-map layout (slow)")
    p.add_argument("--entries", type=int, default=100_000, help="pull: other entries stored, large case")
    p.add_argument("--entries-small", type=int, default=1_000, help="pull: other entries stored, small case")
    p.add_argument("--pull-repeats", type=int, default=5, help="pull: fresh processes per case (median)")
    p.add_argument("--fill-threads", type=int, default=4, help="run maps written at a time while filling")
    p.add_argument("--json", type=Path, help="also write the raw results here")
    p.add_argument("--keep", action="store_true", help="keep the children's logs (and the embedded file)")
    p.add_argument("--child", nargs=2, metavar=("MODE", "SPEC"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        CHILDREN[args.child[0]](json.loads(args.child[1]))
        return 0
    print_run_header()
    if sys.dont_write_bytecode:
        print(
            "note: PYTHONDONTWRITEBYTECODE is set: every task process compiles the modules it imports "
            "(a deployment has them compiled); set PYTHONPYCACHEPREFIX and unset it for deployment-like figures"
        )
    run_tag = uuid.uuid4().hex[:8]
    home = Path(tempfile.mkdtemp(prefix="bench-xcom-scale-"))
    os.environ.update(Target("setup", {}, home, run_tag).env("setup"))  # before airflow is imported here
    os.environ.pop("AIRFLOW_CONN_PULSARSTATE_DEFAULT", None)
    targets: list[Target] = []
    try:
        with contextlib.ExitStack() as stack:
            for layout in args.layouts:
                if args.backend in ("both", "embedded"):
                    where = home / f"embedded-{layout}"
                    where.mkdir()
                    targets.append(Target("embedded", {"service_url": str(where / "state.db")}, where, run_tag, layout))
                if args.backend in ("both", "pulsar"):
                    if not any(t.name == "pulsar" for t in targets):
                        service_url, admin_url = stack.enter_context(broker_urls(args.service_url, args.admin_url))
                    where = home / f"pulsar-{layout}"
                    where.mkdir()
                    targets.append(
                        Target(
                            "pulsar",
                            {"service_url": service_url, "admin_url": admin_url, "operation_timeout": 30},
                            where,
                            run_tag,
                            layout,
                        )
                    )
            for target in targets:
                run_target(target, args, home)
    finally:
        if args.keep:
            print(f"kept the logs and the embedded file in {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    print(f"\nloadavg at end: {os.getloadavg()}")
    print_table(targets)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine_info(),
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "results": {t.label: t.raw for t in targets},
                },
                indent=1,
            )
        )
    failed = any(row[-1] == "FAIL" for t in targets for row in t.rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
