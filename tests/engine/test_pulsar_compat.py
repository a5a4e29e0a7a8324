"""The pulsar-client internals engine/backends/pulsar_compat.py relies on still look as it assumes:
a client upgrade that changes them fails here, by name, instead of slowing or breaking pulls."""

from __future__ import annotations

import inspect
import uuid

import pulsar
import pytest

from airflow_provider_pulsarstate.engine.backends import pulsar_compat


def test_the_reader_wrapper_keeps_the_raw_reader_where_we_look() -> None:
    source = inspect.getsource(pulsar.Reader)
    assert f"self.{pulsar_compat.RAW_READER_ATTRIBUTE}.read_next(" in source, (
        "pulsar.Reader no longer wraps a raw reader in _reader: update engine/backends/pulsar_compat.py"
    )


def test_the_raw_types_offer_what_the_offset_log_calls() -> None:
    import _pulsar

    missing = [m for m in pulsar_compat.RAW_READER_METHODS if not hasattr(_pulsar.Reader, m)]
    missing += [m for m in pulsar_compat.RAW_MESSAGE_METHODS if not hasattr(_pulsar.Message, m)]
    assert missing == [], f"pulsar-client's raw types lost {missing}: update engine/backends/pulsar_compat.py"


def test_raw_reader_falls_back_when_there_is_none() -> None:
    plain = object()
    assert pulsar_compat.raw_reader(plain) is None
    assert pulsar_compat.raw_reader(plain, plain) is plain


@pytest.mark.pulsar
def test_a_live_reader_hands_out_its_raw_reader(pulsar_broker: object) -> None:
    import _pulsar

    client = pulsar.Client(pulsar_broker.service_url)  # type: ignore[attr-defined]
    try:
        topic = f"persistent://public/default/compat-{uuid.uuid4().hex[:8]}"
        client.create_producer(topic).send(b"x")
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        raw = pulsar_compat.raw_reader(reader)
        assert isinstance(raw, _pulsar.Reader)
        message = raw.read_next(10_000)
        assert isinstance(message, _pulsar.Message) and message.data() == b"x"
        reader.close()
    finally:
        client.close()


def test_the_async_transport_preload_imports_what_anyio_loads_on_a_loop() -> None:
    import importlib
    import sys

    pulsar_compat.preload_async_http_transport()
    assert pulsar_compat.ASYNCIO_TRANSPORT_MODULE in sys.modules
    # anyio's own lookup of the asyncio back end still names that module
    import anyio._core._eventloop as eventloop

    source = inspect.getsource(eventloop)
    assert "_backends._" in source or "anyio._backends." in source, (
        "anyio no longer loads its back ends from anyio._backends: update engine/backends/pulsar_compat.py"
    )
    assert (
        importlib.import_module(pulsar_compat.ASYNCIO_TRANSPORT_MODULE)
        is sys.modules[pulsar_compat.ASYNCIO_TRANSPORT_MODULE]
    )
