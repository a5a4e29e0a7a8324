"""Helpers for Airflow metadata DBs (SQLite files) in tests."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import subprocess
from pathlib import Path

from airflow_provider_pulsarstate.testing.airflow_processes import copy_sqlite_db


def copy_airflow_db(source: Path, target: Path) -> None:
    """Copy a live SQLite DB through SQLite's backup API. Copying the file would open and close a
    descriptor of it in this process, which drops every POSIX lock this process's own SQLite
    connections hold on it, and can damage it under concurrent writers."""
    copy_sqlite_db(source, target)


def db_problems(path: Path) -> list[str]:
    """What ``PRAGMA quick_check`` finds wrong with the SQLite DB at ``path`` (empty: none)."""
    conn = sqlite3.connect(path, timeout=60)
    try:
        found = [str(row[0]) for row in conn.execute("PRAGMA quick_check")]
    except sqlite3.DatabaseError as exc:
        return [f"{type(exc).__name__}: {exc}"]
    finally:
        conn.close()
    return [] if found == ["ok"] else found


def migrated_template(directory: Path, airflow: str) -> Path:
    """The SQLite DB ``airflow db migrate`` leaves in ``directory`` (an AIRFLOW_HOME of its own),
    made once: processes sharing ``directory`` (pytest-xdist workers) wait for the first one's.
    Copy it with :func:`copy_airflow_db`; a migrated DB names nothing of its AIRFLOW_HOME."""
    directory.mkdir(parents=True, exist_ok=True)
    db, done = directory / "airflow.db", directory / ".migrated"
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            env = {
                **os.environ,
                "AIRFLOW_HOME": str(directory),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{db}",
            }
            result = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True, timeout=600)
            if result.returncode != 0:
                raise RuntimeError(
                    f"airflow db migrate failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
                )
            done.touch()
    return db
