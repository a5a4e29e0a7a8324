"""Writers that take a log over from each other at the same moment (FENCE mode), on both back ends.

On Pulsar 4.2.4, ``ExclusiveWithFencing`` producers created concurrently can all be admitted and all
send, and the topic epoch the broker reports can lag one it already granted. A writer that trusted
them could have its acknowledged writes skipped on replay (another candidate's frames judged forged,
or its own judged fenced): two lease candidates both "won" token 1. Every acknowledged write must be
in the log, as every replica replays it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from airflow_provider_pulsarstate import ConnectionConfig, PulsarMap, open_backend

WORKER = Path(__file__).with_name("takeover_worker.py")
WRITERS = 4
ROUNDS = 5
TRIALS = 3


def _trial(config: ConnectionConfig, topic: str) -> tuple[dict[str, str], list[str]]:
    """WRITERS processes start putting at the same instant; returns acknowledged keys and failures."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(dataclasses.asdict(config)), topic, f"w{i}", str(ROUNDS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(WRITERS)
    ]
    for p in procs:
        while not p.stdout.readline().startswith("@ready"):  # type: ignore[union-attr]
            assert p.poll() is None, f"writer {p.pid} died (exit {p.returncode})"
    for p in procs:
        p.stdin.write("go\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
    acknowledged: dict[str, str] = {}
    failed: list[str] = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        for line in out.splitlines():
            if line.startswith("@ack "):
                key = line.split()[1]
                acknowledged[key] = key.split("-")[0]
            elif line.startswith("@failed "):
                failed.append(line[len("@failed ") :])
    return acknowledged, failed


def test_concurrent_takeovers_lose_no_acknowledged_write(backend_config: ConnectionConfig, topic: str) -> None:
    for trial in range(TRIALS):
        log_topic = f"{topic}-{trial}"  # a fresh log each time: the first writers race to create it
        acknowledged, failed = _trial(backend_config, log_topic)
        assert len(acknowledged) >= WRITERS, f"too few writes acknowledged: {acknowledged}, failures: {failed[:3]}"
        backend = open_backend(backend_config)
        try:
            with PulsarMap(backend, log_topic) as replica:
                state: dict[str, Any] = replica.to_dict()
                skipped = replica.manager.stats["corrupt_skipped"]
        finally:
            backend.close()
        missing = sorted(set(acknowledged) - set(state))
        assert not missing, (
            f"trial {trial}: acknowledged but not in the replayed log: {missing} (failures: {failed[:3]})"
        )
        assert all(state[k]["writer"] == w for k, w in acknowledged.items())
        assert skipped == 0, f"trial {trial}: {skipped} genuine entries were skipped as corrupt or forged"
