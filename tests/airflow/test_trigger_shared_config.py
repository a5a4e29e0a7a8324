"""Triggers of one event loop read their connection once, not once each (a thousand triggers
starting together cost the loop seconds of connection lookups otherwise)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.triggers import shared_config
from airflow_provider_pulsarstate.triggers.offsets import OffsetProgressTrigger


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every connection id Airflow was asked for (the real lookup still answers)."""
    asked: list[str] = []
    original = PulsarStateHook.aget_connection

    async def counting(conn_id: str) -> Any:
        asked.append(conn_id)
        return await original(conn_id)

    monkeypatch.setattr(PulsarStateHook, "aget_connection", staticmethod(counting))
    return asked


def _embedded(env_connection: Callable[..., str], tmp_path: Path, conn_id: str) -> str:
    return env_connection(conn_id, extra={"service_url": str(tmp_path / "state.db")})


async def _first_events(triggers: list[Any]) -> list[dict[str, Any]]:
    async def first(trigger: Any) -> dict[str, Any]:
        runner = trigger.run()
        try:
            return (await runner.__anext__()).payload
        finally:
            await runner.aclose()

    return await asyncio.gather(*(first(t) for t in triggers))


def test_triggers_starting_together_read_their_connection_once(
    env_connection: Callable[..., str], tmp_path: Path, lookups: list[str]
) -> None:
    conn_id = _embedded(env_connection, tmp_path, f"ps_shared_{uuid.uuid4().hex[:6]}")
    other = _embedded(env_connection, tmp_path, f"ps_other_{uuid.uuid4().hex[:6]}")
    topic = f"shared-config-{uuid.uuid4().hex[:8]}"
    with PulsarStateHook(conn_id) as hook:
        hook.create_topic(topic)
    triggers = [
        OffsetProgressTrigger(
            topic=topic, condition="end_offset", target=0, pulsarstate_conn_id=conn_id if i % 10 else other
        )
        for i in range(200)
    ]
    events = asyncio.run(_first_events(triggers))
    assert [e["status"] for e in events] == ["success"] * 200, events[:3]
    assert sorted(lookups) == sorted([conn_id, other]), lookups[:5]


def test_an_undefined_connection_is_answered_for_a_while_and_an_old_answer_expires(
    env_connection: Callable[..., str], tmp_path: Path, lookups: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn_id = f"ps_later_{uuid.uuid4().hex[:6]}"
    monkeypatch.setattr(shared_config, "SHARED_CONFIG_SECONDS", 0.3)
    monkeypatch.setattr(shared_config, "FAILED_CONFIG_SECONDS", 0.2)

    async def scenario() -> None:
        hook = PulsarStateHook(conn_id)
        failures = await asyncio.gather(*(shared_config.shared_config(hook) for _ in range(5)), return_exceptions=True)
        assert all(isinstance(f, ConfigurationError) and conn_id in str(f) for f in failures), failures
        assert lookups == [conn_id]  # the five waited on one lookup
        env_connection(conn_id, extra={"service_url": str(tmp_path / "a.db")})
        for _ in range(20):  # triggers started one after the other: the same error, no lookup
            with pytest.raises(ConfigurationError, match=conn_id):
                await shared_config.shared_config(hook)
        assert lookups == [conn_id]
        await asyncio.sleep(0.25)
        first = await shared_config.shared_config(hook)  # the failure expired: read again
        assert first.url.endswith("a.db") and len(lookups) == 2
        env_connection(conn_id, extra={"service_url": str(tmp_path / "b.db")})
        assert (await shared_config.shared_config(hook)).url.endswith("a.db")  # still fresh
        await asyncio.sleep(0.35)
        assert (await shared_config.shared_config(hook)).url.endswith("b.db")  # read again
        assert len(lookups) == 3

    asyncio.run(scenario())


def test_a_lookup_that_fails_otherwise_is_not_kept(
    env_connection: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn_id = _embedded(env_connection, tmp_path, f"ps_flaky_{uuid.uuid4().hex[:6]}")
    original, calls = PulsarStateHook.aget_config, []

    async def flaky(self: PulsarStateHook) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("the supervisor did not answer")
        return await original(self)

    monkeypatch.setattr(PulsarStateHook, "aget_config", flaky)

    async def scenario() -> None:
        hook = PulsarStateHook(conn_id)
        with pytest.raises(OSError, match="supervisor"):
            await shared_config.shared_config(hook)
        assert (await shared_config.shared_config(hook)).kind == "embedded" and len(calls) == 2

    asyncio.run(scenario())


def test_a_cancelled_caller_does_not_cancel_the_others_lookup(
    env_connection: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn_id = _embedded(env_connection, tmp_path, f"ps_cancel_{uuid.uuid4().hex[:6]}")
    original = PulsarStateHook.aget_config

    async def slow(self: PulsarStateHook) -> Any:
        await asyncio.sleep(0.2)
        return await original(self)

    monkeypatch.setattr(PulsarStateHook, "aget_config", slow)

    async def scenario() -> None:
        hook = PulsarStateHook(conn_id)
        first = asyncio.ensure_future(shared_config.shared_config(hook))
        second = asyncio.ensure_future(shared_config.shared_config(hook))
        await asyncio.sleep(0.05)
        first.cancel()
        assert (await second).kind == "embedded"

    asyncio.run(scenario())
