"""Several OS processes update the same keys while writers are SIGKILLed at random moments."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_pulsarstate import ConnectionConfig, PulsarMap, open_backend
from airflow_provider_pulsarstate.engine.envelope import RecordKind, decode_writes
from airflow_provider_pulsarstate.engine.wal import LogReader
from airflow_provider_pulsarstate.testing.harness import wait_until

WORKER = Path(__file__).with_name("chaos_worker.py")
DURATION = float(os.environ.get("PULSARSTATE_CHAOS_SECONDS", "20"))
WORKERS = 4
KEYS = 3


MIN_KILLS = 5
PROGRESS_TIMEOUT = 120.0  # seconds for a new worker's first ack, however busy the CPUs


def _acks(path: Path) -> int:
    """How many writes the worker behind ``path`` saw acknowledged so far."""
    return path.read_text().count("\n") if path.exists() else 0


def spawn(config: ConnectionConfig, topic: str, ack: Path, mode: str) -> subprocess.Popen:
    args = [sys.executable, str(WORKER), json.dumps(dataclasses.asdict(config)), topic, str(ack), mode, str(KEYS)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.slow
def test_sigkilled_writers_lose_nothing_and_apply_nothing_twice(
    backend_config: ConnectionConfig, topic: str, tmp_path: Path
) -> None:
    rng = random.Random(7)
    modes = ["wait", "wait", "wait", "fence"]  # one worker takes the writer over by fencing
    acks = [tmp_path / f"acks-{i}.txt" for i in range(WORKERS)]
    procs = [spawn(backend_config, topic, acks[i], modes[i]) for i in range(WORKERS)]
    kills = 0
    deadline = time.monotonic() + DURATION
    acked_at_spawn = [0] * WORKERS
    try:
        while time.monotonic() < deadline or kills < MIN_KILLS:
            time.sleep(rng.uniform(0.2, 1.2))
            i = rng.randrange(WORKERS)
            # kill a worker only once it has acked since it started: on a busy machine a start-up
            # (imports, connect, the writer) can outlast the random pause, and killing it then
            # would test nothing
            wait_until(
                lambda i=i: _acks(acks[i]) > acked_at_spawn[i],
                timeout=PROGRESS_TIMEOUT,
                what=f"a write of worker {i} ({modes[i]}) acknowledged since it started",
            )
            procs[i].send_signal(signal.SIGKILL)
            procs[i].wait()
            kills += 1
            acked_at_spawn[i] = _acks(acks[i])
            procs[i] = spawn(backend_config, topic, acks[i], modes[i])
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()

    acked = {}
    for path in acks:
        if path.exists():
            for line in path.read_text().splitlines():
                token, key, n = line.split()
                acked[token] = (key, int(n))
    assert kills >= MIN_KILLS and len(acked) >= 20, (kills, len(acked))

    backend = open_backend(backend_config)
    try:
        table = PulsarMap(backend, topic)
        reader = LogReader(backend, topic)
        replay: dict = {}
        tokens: list[str] = []
        while (rec := reader.read_next(timeout=15, drain=True)) is not None:
            if rec.kind is not RecordKind.DATA:
                continue
            for _, ops in decode_writes(rec.body):
                for op in ops:
                    _, key, data = table._deserialize_op(op)
                    value = table._decode(key, data)
                    # every update was generated from the latest state: n grows by exactly one
                    assert value["n"] == replay.get(key, {"n": 0})["n"] + 1, (key, value, replay.get(key))
                    replay[key] = value
                    tokens.append(value["t"])
        reader.close()
        assert len(tokens) == len(set(tokens)), "an update was appended twice"
        in_log = set(tokens)
        lost = [t for t in acked if t not in in_log]
        assert not lost, f"acknowledged updates missing from the log: {lost[:5]}"
        assert table.to_dict(latest=True) == replay  # a fresh instance bootstraps to the replay
        table.close()
    finally:
        backend.close()
    print(f"chaos: {kills} SIGKILLs, {len(acked)} acknowledged updates, {len(tokens)} in the log")
