"""The one engine module that relies on parts of other projects with no public API (pulsar-client,
and anyio for the async admin client).

The offset log's pull loop reads the C++ client's reader directly: ``pulsar.Reader.read_next``
builds a ``pulsar.Message`` wrapper per message, a measurable share of a pull's cost (BENCHMARKS.md,
"pull"), and ``close_async`` exists only on the C++ reader. The raw reader is the wrapper's
``_reader`` attribute (pulsar-client 3.x). ``tests/engine/test_pulsar_compat.py`` checks these
assumptions against the installed client, so an upgrade that changes them fails there, by name.
"""

from __future__ import annotations

from typing import Any

RAW_READER_ATTRIBUTE = "_reader"
"""Where ``pulsar.Reader`` keeps the C++ reader it wraps."""

RAW_READER_METHODS = ("read_next", "close_async", "has_message_available")
"""What the offset log calls on the raw reader."""

RAW_MESSAGE_METHODS = ("data", "message_id", "partition_key", "properties", "publish_timestamp")
"""What the offset log calls on the raw messages the raw reader returns."""


def raw_reader(reader: Any, default: Any = None) -> Any:
    """The C++ reader inside a ``pulsar.Reader`` (``default`` when ``reader`` wraps none)."""
    return getattr(reader, RAW_READER_ATTRIBUTE, default)


ASYNCIO_TRANSPORT_MODULE = "anyio._backends._asyncio"
"""The module anyio loads by name at the first network call on an asyncio loop (httpx's first request)."""


def preload_async_http_transport() -> None:
    """Import what an async HTTP client's first request on an asyncio loop would import there
    (anyio's asyncio back end, its TLS streams and thread helpers), so that it is done off the loop:
    on the loop it held a triggerer for 0.4-0.5 s while a thousand probes started."""
    import anyio._backends._asyncio  # noqa: F401
    import anyio.streams.tls  # noqa: F401
    import anyio.to_thread  # noqa: F401
