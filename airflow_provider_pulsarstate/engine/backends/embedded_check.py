"""The Test button of an embedded-log connection: can this process use its state file?

Guarantees: nothing is created, written or locked, on any answer. An existing file is opened
read-only and read; a file that does not exist yet is judged by where it would be created.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from airflow_provider_pulsarstate.engine.config import ConnectionConfig


def check_embedded_file(config: ConnectionConfig) -> tuple[bool, str]:
    """``(True, what was found)`` or ``(False, what is wrong with which path)``; never raises.

    Green: the file exists and reads as SQLite; or it does not exist yet and the first write can
    create it (its folder, or the nearest folder above that exists, is a writable directory).
    Red: the path is a directory; an ancestor is a file; the folder that would hold it is not
    writable; an existing file cannot be read.
    """
    path = config.embedded_path
    target = f"embedded state file {path}"
    try:
        if path.is_dir():
            return False, f"{target} is a directory, not a file: point service_url at a file inside it"
        if path.exists():
            return _read(path, target, config.operation_timeout)
        return _creatable(path, target)
    except OSError as exc:
        return False, f"{target}: {type(exc).__name__}: {exc}"


def _creatable(path: Path, target: str) -> tuple[bool, str]:
    folder = path.absolute().parent
    missing: list[Path] = []
    while not folder.exists():
        if folder.is_symlink():  # a dangling link: mkdir would fail on it
            return False, f"{target} cannot be created: {folder} is a broken symbolic link"
        missing.append(folder)
        folder = folder.parent
    if not folder.is_dir():
        return False, f"{target} cannot be created: {folder} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return False, f"{target} cannot be created: folder {folder} is not writable by this process"
    also = f" (with its folder {missing[-1]})" if missing else ""
    return True, f"{target} does not exist yet: it will be created{also} on the first write; nothing was created now"


def _read(path: Path, target: str, timeout: float) -> tuple[bool, str]:
    # mode=ro still creates -wal/-shm beside a WAL database whose writers are all closed;
    # then (no -wal) the file alone is the whole state and immutable=1 reads it without them.
    params = "mode=ro" if Path(f"{path}-wal").exists() else "mode=ro&immutable=1"
    try:
        uri = f"file:{quote(str(path.resolve()))}?{params}"
        conn = sqlite3.connect(uri, uri=True, timeout=timeout)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()
    except Exception as exc:
        return False, f"{target}: {type(exc).__name__}: {exc}"
    return True, f"Read {target}"
