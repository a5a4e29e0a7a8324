"""Applies one view, then exits; the test kills it with SIGKILL at a random moment."""

from __future__ import annotations

import json
import sys

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.recipes.table import StateTable

if __name__ == "__main__":
    config = ConnectionConfig(**json.loads(sys.argv[1]))
    table = StateTable(open_backend(config), sys.argv[2], max_frame_bytes=64 * 1024)
    table.start()  # replay first, so that the kill lands in the apply itself
    print("applying", flush=True)
    print(table.apply(sys.argv[3]), flush=True)
