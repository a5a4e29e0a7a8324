"""One writer of tests/engine/test_concurrent_takeovers.py in its own process: waits for the start
signal (a line on stdin), puts its keys in FENCE mode, prints each acknowledged key (``@ack key``) or failure."""

from __future__ import annotations

import json
import sys

from airflow_provider_pulsarstate import ConnectionConfig, PulsarMap, open_backend
from airflow_provider_pulsarstate.engine.errors import PulsarStateError


def main() -> None:
    config = ConnectionConfig(**json.loads(sys.argv[1]))
    topic, name, rounds = sys.argv[2], sys.argv[3], int(sys.argv[4])
    backend = open_backend(config)
    table = PulsarMap(backend, topic, acquire_mode="fence", writer_idle_timeout=0.01)
    print("@ready", flush=True)
    sys.stdin.readline()  # all start together
    for r in range(rounds):
        key = f"{name}-r{r}"
        try:
            table.put(key, {"writer": name, "round": r})
        except PulsarStateError as exc:  # a contended write may fail: it must then not be in the log
            print(f"@failed {key} {type(exc).__name__}: {exc}", flush=True)
        else:
            print(f"@ack {key}", flush=True)
    table.close()
    backend.close()


if __name__ == "__main__":
    main()
