"""A lease candidate in its own process, driven line by line over stdin (one JSON command per
line, one JSON reply per line on stdout). Used by tests/engine/test_leases.py and
tests/engine/test_lease_restarts.py."""

from __future__ import annotations

import json
import sys
import time

from airflow_provider_pulsarstate import ConnectionConfig, PulsarMap, open_backend
from airflow_provider_pulsarstate.engine.errors import PulsarStateError
from airflow_provider_pulsarstate.engine.recipes.lease import Lease, Leases

REPLY = "@reply "  # the Pulsar client may log to stdout too


def main() -> None:
    config = ConnectionConfig(**json.loads(sys.argv[1]))
    topic, map_topic = sys.argv[2], sys.argv[3]
    backend = open_backend(config)
    leases = Leases(backend, topic, poll_interval=0.1).start()
    table = PulsarMap(backend, map_topic, acquire_mode="fence", writer_idle_timeout=0.05)
    lease: Lease | None = None
    print(REPLY + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        reply: dict = {"t0": time.monotonic()}
        try:
            what = cmd["cmd"]
            if what == "acquire":
                lease = leases.acquire(
                    cmd["name"],
                    cmd["holder"],
                    ttl=cmd["ttl"],
                    timeout=cmd.get("timeout"),
                    steal=cmd.get("steal", False),
                )
            elif what == "renew":
                lease = leases.renew(Lease.from_json(cmd["lease"]) if "lease" in cmd else lease)
            elif what == "release":
                reply["released"] = leases.release(lease)
            elif what == "describe":
                info = leases.describe(cmd["name"])
                reply["info"] = info.as_dict() if info is not None else None
            elif what == "put":
                table.put(cmd["key"], cmd["value"], lease=lease)
            elif what == "exit":
                break
            reply["lease"] = lease.to_json() if lease is not None else None
            reply["remaining"] = leases.remaining(lease) if lease is not None else 0.0
        except PulsarStateError as exc:
            reply["error"] = type(exc).__name__
            reply["message"] = str(exc)
            reply["current_holder"] = getattr(getattr(exc, "current", None), "holder", None)
        reply["t1"] = time.monotonic()
        print(REPLY + json.dumps(reply), flush=True)
    table.close()
    leases.close()
    backend.close()


if __name__ == "__main__":
    main()
