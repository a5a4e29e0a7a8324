"""One process pushing XComs through PulsarXComBackend.serialize_value at an agreed moment.

Usage: xcom_push_worker.py <dag_id> <run_id> <go_file> <task_id>... ; opens the store, prints
``ready``, waits until ``go_file`` exists, pushes one value per task from one thread each, and prints
one JSON line per task: {"task_id": ..., "reference": ...}. Configuration comes from the environment.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from airflow_provider_pulsarstate.provider_settings import settings
from airflow_provider_pulsarstate.xcom.backend import PulsarXComBackend, run_store


def main() -> None:
    dag_id, run_id, go_file, *task_ids = sys.argv[1:]
    if settings().xcom_layout == "map":
        with run_store(settings(), dag_id, run_id) as store:
            store.start()  # open (replay) before the go signal, so the pushes themselves race
    print("ready", flush=True)
    results: dict[str, object] = {}

    def push(task_id: str) -> None:
        results[task_id] = PulsarXComBackend.serialize_value(
            {"task": task_id, "at": time.time()},
            key="return_value",
            task_id=task_id,
            dag_id=dag_id,
            run_id=run_id,
            map_index=-1,
        )

    threads = [threading.Thread(target=push, args=(t,)) for t in task_ids]
    while not os.path.exists(go_file):
        time.sleep(0.005)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for task_id in task_ids:
        print(json.dumps({"task_id": task_id, "reference": results[task_id]}), flush=True)


if __name__ == "__main__":
    main()
