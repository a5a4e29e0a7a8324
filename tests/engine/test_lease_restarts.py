"""Fencing tokens strictly increase across broker restarts, on a broker of this module's own.

Restarting the session broker would break the other tests using it, so this module starts a
dedicated one. Over 60 s, and why: each restart takes ~10-20 s (stop, then the standalone's bookie,
metadata store and broker come back on the same ports and data). Measured on 2 shared cores (load
~3): broker start 21 s, the test 42 s (two restarts ~30 s, two ttl waits of 2 s, one worker).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from airflow_provider_pulsarstate import PulsarMap, open_backend
from airflow_provider_pulsarstate.engine.errors import LeaseFencedError, LeaseLostError
from airflow_provider_pulsarstate.engine.recipes.lease import Leases
from tests.conftest import pulsar_config
from tests.engine.test_leases import Worker

pytestmark = pytest.mark.pulsar

TTL = 2.0


@pytest.mark.xdist_group("own-broker")
def test_tokens_strictly_increase_across_broker_restarts(restartable_broker: Any) -> None:
    broker = restartable_broker
    config = pulsar_config(broker, operation_timeout=30.0)
    topic = f"persistent://public/default/leases-{uuid.uuid4().hex[:12]}"
    map_topic = topic + "-guarded"
    opened: list[Any] = []

    def process() -> tuple[Leases, PulsarMap]:
        """What one process holds: its own client, lease replica and guarded map."""
        backend = open_backend(config)
        leases = Leases(backend, topic, poll_interval=0.1)
        table = PulsarMap(backend, map_topic, acquire_mode="fence", writer_idle_timeout=0.05)
        opened.append((leases, table, backend))
        return leases, table

    worker: Worker | None = None
    try:
        a, table_a = process()
        first = a.acquire("job", "a", ttl=TTL)
        assert first.token == 1
        table_a.put("k", "a-1", lease=first)

        broker.restart()  # graceful (SIGTERM)
        info = a.describe("job")  # the same Leases object, reconnected
        assert (info.holder, info.token) == ("a", 1)
        b, table_b = process()  # a new back end: replays the log from the restarted broker
        info = b.describe("job")
        assert (info.holder, info.token, info.held) == ("a", 1, True)
        started = time.monotonic()
        second = b.acquire("job", "b", ttl=TTL, timeout=30)  # a never renews: taken after expiry
        assert second.token == 2
        assert time.monotonic() - started >= TTL * 0.9  # not before a full ttl of observed silence

        # b's acquire returned; the broker dies right away (SIGKILL within the stop): the token
        # must already be durable, or a fresh process would hand out token 2 a second time.
        broker.stop(grace=0)
        broker.start()
        worker = Worker(config, topic, map_topic)  # a fresh process, started after the restart
        worker.ready()
        seen = worker.call(cmd="describe", name="job")["info"]
        assert (seen["holder"], seen["token"]) == ("b", 2), seen

        third = worker.call(cmd="acquire", name="job", holder="c", ttl=TTL, timeout=30)  # after b's expiry
        assert third["lease"]["token"] == 3, third
        assert worker.call(cmd="put", key="k", value="c-3").get("error") is None
        with pytest.raises(LeaseFencedError) as fenced:
            table_b.put("k", "b-2", lease=second)  # the old holder, still believing it holds token 2
        assert fenced.value.token == 2 and fenced.value.newer_token == 3
        with pytest.raises(LeaseFencedError):
            table_a.put("k", "a-1-again", lease=first)
        with pytest.raises(LeaseLostError, match="token 3"):
            b.renew(second)

        c, table_c = process()
        assert c.describe("job").token == 3
        assert table_c.to_dict(latest=True) == {"k": "c-3"}
    finally:
        if worker is not None:
            worker.stop()
        for leases, table, backend in opened:
            table.close()
            leases.close()
            backend.close()
