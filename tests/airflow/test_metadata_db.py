"""The metadata-DB helpers the Airflow tests rely on: a copy through SQLite's backup API holds
every row, and a damaged file is reported (the shared DB is checked after every test)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.airflow.metadata_db import copy_airflow_db, db_problems


def _make(path: Path, rows: int) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size=1024")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", ((i, f"value-{i}" * 20) for i in range(rows)))
    conn.execute("CREATE INDEX t_v ON t (v)")
    conn.commit()
    conn.close()


def test_a_copy_holds_every_row_while_the_source_stays_open(tmp_path: Path) -> None:
    source, target = tmp_path / "a.db", tmp_path / "b.db"
    _make(source, 2000)
    held = sqlite3.connect(source)  # an open connection of this process, as Airflow's would be
    copy_airflow_db(source, target)
    held.execute("INSERT INTO t VALUES (5000, 'after')")
    held.commit()
    held.close()
    copy = sqlite3.connect(target)
    assert copy.execute("SELECT count(*), max(k) FROM t WHERE k < 5000").fetchone() == (2000, 1999)
    copy.close()
    assert db_problems(source) == [] and db_problems(target) == []


def test_a_damaged_db_is_reported(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    _make(db, 2000)
    data = bytearray(db.read_bytes())
    data[3 * 1024 + 200 : 3 * 1024 + 600] = b"\xff" * 400  # inside a b-tree page, past the header
    db.write_bytes(bytes(data))
    problems = db_problems(db)
    assert problems and problems != ["ok"], problems
