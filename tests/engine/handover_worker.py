"""One writer of tests/engine/test_writer_handover.py in its own process, as an Airflow task is.

Opens the test's list-of-keys log on the topic with the given manager options, prints ``@ready``,
waits for the start signal (a line on stdin), appends its key once, prints ``@ack <key> <seconds>`` or ``@failed <key>
<error>``, then keeps the map (and so its writer, until it is handed over or idles out) open until
stdin closes, as a task process goes on after its write.
"""

from __future__ import annotations

import json
import sys
import time

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.errors import PulsarStateError
from airflow_provider_pulsarstate.engine.manager import SharedStateManager


def main() -> None:
    config = ConnectionConfig(**json.loads(sys.argv[1]))
    topic, key, options = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    backend = open_backend(config)
    table = SharedStateManager(
        backend, topic, initializer=list, applier=lambda state, key: state.append(key), **options
    )
    table.start()  # replay before the start signal: the writes race, not the bootstraps
    print("@ready", flush=True)
    sys.stdin.readline()
    started = time.monotonic()
    try:
        table.write(lambda state: [key])
    except PulsarStateError as exc:
        print(f"@failed {key} {type(exc).__name__}: {exc}", flush=True)
    else:
        print(f"@ack {key} {time.monotonic() - started:.3f}", flush=True)
    sys.stdin.read()  # held until the test is done with every writer
    table.close()
    backend.close()


if __name__ == "__main__":
    main()
