"""``airflow pulsarstate reset-fence`` (both back ends): it goes through the hook, lifts a forged
fence with a record in the table's log, and says what it removed."""

from __future__ import annotations

import argparse
import uuid
from typing import Any

import pytest

from airflow_provider_pulsarstate.cli.commands import get_cli_commands
from airflow_provider_pulsarstate.cli.fence_reset import reset_fence
from airflow_provider_pulsarstate.engine.backends.base import AcquireMode
from airflow_provider_pulsarstate.engine.envelope import RecordKind, decode_fenced_writes, encode_writes
from airflow_provider_pulsarstate.engine.errors import LeaseFencedError
from airflow_provider_pulsarstate.engine.wal import open_writer
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from tests.engine.test_genesis import records


def _args(**values: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"lease_log": None, "conn_id": "pulsarstate_default", **values})


def _forge(hook: PulsarStateHook, topic: str, offset: int, fence: tuple[str, str, int]) -> None:
    """A record under a token no lease log granted, appended with a writer of its own."""
    writer = open_writer(hook.get_conn(), topic, writer_id=uuid.uuid4().bytes, mode=AcquireMode.FENCE, timeout=20)
    try:
        writer.append(RecordKind.DATA, encode_writes([(1, [], fence)]), offset=offset, timeout=20)
    finally:
        writer.close()


def test_reset_fence_is_an_airflow_pulsarstate_subcommand() -> None:
    [group] = get_cli_commands()
    command = {c.name: c for c in group.subcommands}["reset-fence"]
    assert {a.flags[0] for a in command.args} == {"--topic", "--lease", "--lease-log", "--conn-id"}


def test_reset_fence_lifts_a_forged_fence_with_a_record_in_the_log(
    state_backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"fence-{uuid.uuid4().hex[:8]}"
    with PulsarStateHook() as hook:
        topic, lease_topic = hook.topic_name(name), hook.topic_name(f"{name}-leases")
        table, leases = hook.get_map(topic), hook.get_leases(lease_topic)
        first = leases.acquire("nightly", "a", ttl=30.0)
        table.put("k", 1, lease=first)
        [key] = table.manager.fences
        offset = table.manager.applied_offset
        table.close()
        _forge(hook, topic, offset + 1, (key[0], "nightly", 2**62))
        second = leases.acquire("nightly", "b", ttl=30.0, steal=True)
        with pytest.raises(LeaseFencedError):
            hook.get_map(topic).put("k", 2, lease=second)

        reset_fence(_args(topic=name, lease="nightly", lease_log=f"{name}-leases"))
        out = capsys.readouterr().out
        assert f"reset on {topic}" in out and "token 4611686018427387904" in out, out
        data = [r for r in records(hook.get_conn(), topic) if r.kind is RecordKind.DATA]
        assert [f for _, _, f in decode_fenced_writes(data[-1].body)] == [(lease_topic, "nightly", 0)]
        table = hook.get_map(topic)
        table.put("k", 2, lease=second)
        assert table.manager.fences == {key: 2} and table.get("k", latest=True) == 2

        reset_fence(_args(topic=name, lease="nightly"))
        assert "token 2" in capsys.readouterr().out
