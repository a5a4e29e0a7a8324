"""test_connection of an embedded-log connection whose file does not exist yet: green when the
first write can create it, red naming the path otherwise; it creates nothing in either case."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

EnvConnection = Callable[..., str]


def _tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_mode) for p in root.rglob("*"))


def _test(env_connection: EnvConnection, service_url: str) -> tuple[bool, str]:
    return PulsarStateHook(env_connection("ps_embedded_check", extra={"service_url": service_url})).test_connection()


@pytest.mark.parametrize("spelling", ["path", "file_url", "file_url_localhost"])
def test_a_file_in_a_writable_folder_is_green_and_not_created(
    env_connection: EnvConnection, tmp_path: Path, spelling: str
) -> None:
    path = tmp_path / "state.db"
    url = {"path": str(path), "file_url": f"file://{path}", "file_url_localhost": f"file://localhost{path}"}[spelling]
    before = _tree(tmp_path)
    ok, message = _test(env_connection, url)
    assert ok, message
    assert str(path) in message and "will be created" in message and "on the first write" in message
    assert _tree(tmp_path) == before


def test_a_missing_folder_that_can_be_created_is_green_and_not_created(
    env_connection: EnvConnection, tmp_path: Path
) -> None:
    path = tmp_path / "airflow" / "pulsarstate" / "state.db"
    ok, message = _test(env_connection, str(path))
    assert ok, message
    assert str(path) in message and str(tmp_path / "airflow") in message
    assert list(tmp_path.iterdir()) == []


def test_the_unset_service_url_means_the_default_file_under_airflow_home(
    env_connection: EnvConnection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    ok, message = PulsarStateHook(env_connection("ps_form_default", extra={"service_url": None})).test_connection()
    assert ok, message
    assert str(tmp_path / "pulsarstate" / "state.db") in message
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_is_not_writable_is_red(
    env_connection: EnvConnection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    if os.geteuid() == 0:  # root writes anywhere: let the permission check answer as for any other user
        from airflow_provider_pulsarstate.engine.backends import embedded_check

        real_access = os.access
        monkeypatch.setattr(
            embedded_check.os, "access", lambda p, mode: False if Path(p) == folder else real_access(p, mode)
        )
    try:
        ok, message = _test(env_connection, str(folder / "sub" / "state.db"))
        assert not ok
        assert str(folder / "sub" / "state.db") in message and "not writable" in message
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o700)


def test_a_directory_is_red(env_connection: EnvConnection, tmp_path: Path) -> None:
    ok, message = _test(env_connection, str(tmp_path))
    assert not ok
    assert str(tmp_path) in message and "is a directory" in message
    assert list(tmp_path.iterdir()) == []


def test_a_file_in_the_way_of_the_folder_is_red(env_connection: EnvConnection, tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("")
    ok, message = _test(env_connection, str(tmp_path / "blocker" / "sub" / "state.db"))
    assert not ok
    assert str(tmp_path / "blocker" / "sub" / "state.db") in message and "not a directory" in message
    assert [p.name for p in tmp_path.iterdir()] == ["blocker"]


def test_a_file_url_with_a_host_part_is_red(env_connection: EnvConnection, tmp_path: Path) -> None:
    ok, message = _test(env_connection, f"file://otherhost{tmp_path / 'state.db'}")
    assert not ok
    assert "'ps_embedded_check'" in message and "host part" in message and "'otherhost'" in message
    assert list(tmp_path.iterdir()) == []
