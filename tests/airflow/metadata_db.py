"""Helpers for Airflow metadata DBs (SQLite files) in tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def copy_airflow_db(source: Path, target: Path) -> None:
    """Copy a live SQLite DB through SQLite's backup API. Copying the file would open and close a
    descriptor of it in this process, which drops every POSIX lock this process's own SQLite
    connections hold on it, and can damage it under concurrent writers."""
    src, dst = sqlite3.connect(source, timeout=60), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


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
