"""A worker process for the chaos test: increments random keys until killed.

Each increment stores ``{"n": previous n + 1, "t": token}``; after the write is acknowledged the
token is appended (and fsynced) to the worker's ack file. The test kills workers with SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import sys
import uuid

from airflow_provider_pulsarstate import AcquireMode, ConnectionConfig, PulsarMap, open_backend


def main() -> None:
    config = ConnectionConfig(**json.loads(sys.argv[1]))
    topic, ack_path, mode, nkeys = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    run = uuid.uuid4().hex[:8]
    backend = open_backend(config)
    table = PulsarMap(
        backend, topic, acquire_mode=AcquireMode(mode), acquire_timeout=60.0, writer_idle_timeout=0.02, max_retries=50
    )
    with open(ack_path, "a", buffering=1) as acks:
        i = 0
        while True:
            key = f"k{random.randrange(nkeys)}"
            token = f"{run}-{i}"
            value = table.update(key, lambda k, v, token=token: {"n": (v or {"n": 0})["n"] + 1, "t": token})
            acks.write(f"{token} {key} {value['n']}\n")
            os.fsync(acks.fileno())
            i += 1


if __name__ == "__main__":
    main()
