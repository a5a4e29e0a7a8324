"""Uses the Pulsar back end, closes everything, and exits normally (the test checks the exit code)."""

from __future__ import annotations

import sys

from airflow_provider_pulsarstate import ConnectionConfig, PulsarMap, open_backend

if __name__ == "__main__":
    backend = open_backend(ConnectionConfig(url=sys.argv[1], admin_url=sys.argv[2], operation_timeout=15))
    table = PulsarMap(backend, sys.argv[3], writer_idle_timeout=None)
    table.put("k", 1)
    table.get("k", latest=True)
    table.close()
    backend.close()
