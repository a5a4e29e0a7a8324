"""Small messages to and from Pulsar over the broker's HTTP API, without a pulsar-client Client.

A process that only appends or reads a few small messages (an Airflow task pushing and pulling its
XComs) pays for a Client far more than for the message: importing ``pulsar`` and starting a Client
costs ~0.3 s of CPU per process, a connection and a producer registration on the broker, against
a few milliseconds for one HTTP request. This module speaks the two endpoints such a process needs,
over one kept-alive ``http.client`` connection (standard library only: no ``pulsar``, no
``requests`` import):

* ``POST /topics/persistent/{tenant}/{ns}/{topic}`` (the broker's REST producer) appends text
  messages; the broker answers each with its ``ledger:entry`` once it is persisted. The REST
  producer registers a STRING schema on the topic, which producers and readers of bytes accept.
* ``GET /admin/v2/persistent/.../ledger/{L}/entry/{E}`` returns one entry's payload and metadata.

Anything these endpoints cannot do exactly (a message over :data:`HTTP_MESSAGE_MAX_BYTES`, bytes
that are not UTF-8, an entry holding a batch or one chunk of a larger message, an answer this
module does not recognise) is reported as ``None`` so that the caller uses the client instead:
this path is only ever a faster way to the same result. Addresses are the client's own
(``p:<partition>:<base64 of the serialized MessageId>``), so either path reads what the other wrote.
"""

from __future__ import annotations

import base64
import encodings.idna  # noqa: F401  (getaddrinfo encodes host names with it: loaded with this module, not by a first push)
import http.client
import json
import threading
from collections.abc import Mapping
from datetime import datetime
from urllib.parse import ParseResult, urlparse

from airflow_provider_pulsarstate.engine.backends.admin import PulsarAdmin
from airflow_provider_pulsarstate.engine.config import ConnectionConfig, redact_url
from airflow_provider_pulsarstate.engine.errors import ConfigurationError, MessageNotFoundError
from airflow_provider_pulsarstate.engine.offsets.base import StoredMessage, format_address, parse_address
from airflow_provider_pulsarstate.engine.offsets.checks import not_an_address
from airflow_provider_pulsarstate.engine.offsets.pulsar_index import read_varint

HTTP_MESSAGE_MAX_BYTES = (1 << 20) + (64 << 10)
"""The largest payload sent over HTTP (a 1 MiB value, the XCom backend's default limit, with its
header line); larger ones go through a producer, which chunks what is over the broker's limit."""
PULSAR_ADDRESS = "p"
"""Addresses on Pulsar: ``p:<partition>:<base64 of the serialized MessageId>`` (partition -1 is
encoded as 0; the id itself says whether the topic is partitioned)."""
PULSAR_ADDRESS_FORM = "p:<partition>:<base64 message id>"
_EXPECTED_HEADERS = ("X-Pulsar-Message-ID",)
_NOT_PLAIN_HEADERS = ("X-Pulsar-num-chunks-from-msg", "X-Pulsar-chunk-id", "X-Pulsar-num-batch-message")
_MAX_REDIRECTS = 3


# --------------------------------------------------------------------------- message ids
def encode_message_id(ledger: int, entry: int, *, partition: int = -1, batch_index: int = -1) -> bytes:
    """The serialized ``MessageIdData`` protobuf, byte for byte what pulsar-client's
    ``MessageId.serialize()`` gives for a plain message (defaults -1 are left out)."""
    out = bytearray()
    out += b"\x08" + _varint(ledger) + b"\x10" + _varint(entry)
    if partition != -1:
        out += b"\x18" + _varint(partition)
    if batch_index != -1:
        out += b"\x20" + _varint(batch_index)
    return bytes(out)


def decode_message_id(data: bytes) -> tuple[int, int, int, int] | None:
    """(ledger, entry, partition, batch index) of a serialized plain message id; None for any
    other shape (a chunked message's id, ack sets, unknown fields): the client reads those."""
    fields: dict[int, int] = {}
    pos = 0
    try:
        while pos < len(data):
            tag, pos = read_varint(data, pos)
            number, wire = tag >> 3, tag & 7
            if wire != 0 or number not in (1, 2, 3, 4, 6) or number in fields:
                return None
            fields[number], pos = read_varint(data, pos)
    except IndexError:
        return None
    if 1 not in fields or 2 not in fields:
        return None
    return fields[1], fields[2], _int32(fields.get(3, -1)), _int32(fields.get(4, -1))


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int32/int64 negatives are 10-byte two's complement varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int32(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def address_of(ledger: int, entry: int, partition: int = -1) -> str:
    """The address a message at ``ledger:entry`` has (as the client's publisher gives it)."""
    return format_address(
        PULSAR_ADDRESS,
        max(partition, 0),
        base64.b64encode(encode_message_id(ledger, entry, partition=partition)).decode(),
    )


def plain_id_of(address: str) -> tuple[int, int, int] | None:
    """(ledger, entry, partition) of a plain, unbatched message's address; None otherwise.

    :raises ConfigurationError: not a Pulsar message address at all.
    """
    parsed = parse_address(address, PULSAR_ADDRESS)
    try:
        if parsed is None:
            raise ValueError
        raw = base64.b64decode(parsed[1], validate=True)
    except ValueError:
        raise not_an_address(address, "Pulsar", PULSAR_ADDRESS_FORM) from None
    decoded = decode_message_id(raw)
    if decoded is None or decoded[3] != -1:
        return None
    return decoded[0], decoded[1], decoded[2]


# --------------------------------------------------------------------------- the channel
class PulsarHttpMessages:
    """Append and read single small messages over the broker's HTTP API (thread-safe; one
    kept-alive connection, re-opened when the broker closed it).

    :param config: the connection (admin URL, token, TLS trust and hostname verification).
    """

    def __init__(self, config: ConnectionConfig) -> None:
        base = urlparse(config.resolved_admin_url)
        if base.scheme not in ("http", "https") or not base.hostname:
            raise ConfigurationError(
                f"admin_url {redact_url(config.resolved_admin_url)!r}{config.field_origin('admin_url')} "
                "is not an http:// or https:// URL"
            )
        self._config = config
        self._base = base
        self._timeout = config.operation_timeout
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if config.auth_token:
            self._headers["Authorization"] = f"Bearer {config.auth_token}"
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._closed = False
        self._producer_only: set[str] = set()  # topics whose HTTP publish was refused once

    def __repr__(self) -> str:
        return f"PulsarHttpMessages({redact_url(self._config.resolved_admin_url)!r})"

    # -- publish -----------------------------------------------------------------------------
    def publish(self, topic: str, payload: bytes, *, properties: Mapping[str, str] | None = None) -> str | None:
        """Append one message to the non-partitioned ``topic`` (created when missing); its address,
        or None when it cannot go over HTTP (too large, not UTF-8 text, a topic whose schema the
        REST producer may not use, an answer not recognised): send it with a producer then.

        A request that got no answer may still have landed; nothing refers to such a message."""
        if len(payload) > HTTP_MESSAGE_MAX_BYTES:
            return None
        try:
            text = bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            return None
        if topic in self._producer_only:
            return None
        body = json.dumps({"messages": [{"payload": text, "properties": dict(properties or {})}]}).encode()
        path = "/topics/" + PulsarAdmin.topic_path(topic)
        for attempt in range(2):
            answer = self._call("POST", path, body)
            if answer is None:
                return None
            status, _headers, data = answer
            if status == 200:
                return _published_address(data)
            if attempt or b"not found" not in data.lower() or not self._create(topic):
                break
        # Refused (a schema the REST producer may not use, no permission, no such endpoint): the
        # producer path reports or overcomes it; this topic is not tried over HTTP again.
        with self._lock:
            self._producer_only.add(topic)
        return None

    def _create(self, topic: str) -> bool:
        answer = self._call("PUT", "/admin/v2/" + PulsarAdmin.topic_path(topic), b"")
        return answer is not None and answer[0] in (200, 204, 409)

    # -- read --------------------------------------------------------------------------------
    def read(self, topic: str, address: str) -> StoredMessage | None:
        """The plain message at ``address``; None when only the client can tell (a batched or
        chunked message, an answer not recognised).

        :raises MessageNotFoundError: the topic does not exist (deleted whole by clean-up).
        :raises ConfigurationError: ``address`` is not a Pulsar message address.
        """
        plain = plain_id_of(address)
        if plain is None:
            return None
        ledger, entry, partition = plain
        pt = f"{topic}-partition-{partition}" if partition >= 0 else topic
        answer = self._call("GET", f"/admin/v2/{PulsarAdmin.topic_path(pt)}/ledger/{ledger}/entry/{entry}", None)
        if answer is None:
            return None
        status, headers, data = answer
        if status == 404 and b"topic" in data.lower() and b"not found" in data.lower():
            raise MessageNotFoundError(
                f"no message at {address} of {pt}: the topic does not exist (deleted?)", topic=topic, address=address
            )
        if status != 200 or headers.get("X-Pulsar-Message-ID") != f"{ledger}:{entry}":
            return None
        meta = _plain_metadata(headers)
        if meta is None:
            return None
        properties, published = meta
        return StoredMessage(address, data, properties, published)

    # -- transport ---------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: bytes | None) -> tuple[int, Mapping[str, str], bytes] | None:
        """(status, headers, body), following redirects to the topic's owner; None when no answer
        came (the caller falls back to the client, which reports the failure in full)."""
        base = self._base
        for _hop in range(_MAX_REDIRECTS + 1):
            try:
                with self._lock:
                    if self._closed:
                        return None
                    status, headers, data = self._exchange(base, method, path, body)
            except (OSError, http.client.HTTPException):
                return None
            if status in (301, 302, 307, 308) and headers.get("Location"):
                target = urlparse(headers["Location"])
                if target.scheme not in ("http", "https") or not target.hostname:
                    return None
                base, path = target, target.path + (f"?{target.query}" if target.query else "")
                continue
            return status, headers, data
        return None

    def _exchange(
        self, base: ParseResult, method: str, path: str, body: bytes | None
    ) -> tuple[int, dict[str, str], bytes]:
        same = base == self._base
        for attempt in range(2):
            conn = self._connection() if same else self._new_connection(base)
            try:
                conn.request(method, path, body=body, headers=self._headers)
                resp = conn.getresponse()
                data = resp.read()
                headers = {k: v for k, v in resp.getheaders()}
                if not same:
                    conn.close()
                return resp.status, headers, data
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A kept-alive connection the broker closed while idle: one fresh try.
                self._drop()
                if attempt or not same:
                    raise
        raise AssertionError("unreachable")

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = self._new_connection(self._base)
        return self._conn

    def _new_connection(self, base: ParseResult) -> http.client.HTTPConnection:
        host = base.hostname or ""  # both URLs were checked to have one
        if base.scheme == "https":
            import ssl  # only for https admin URLs

            context = ssl.create_default_context(cafile=self._config.tls_trust_certs_file_path)
            if not self._config.tls_hostname_verification:
                context.check_hostname = False
            return http.client.HTTPSConnection(host, base.port, timeout=self._timeout, context=context)
        return http.client.HTTPConnection(host, base.port, timeout=self._timeout)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close the connection (idempotent); later calls answer None."""
        with self._lock:
            self._closed = True
            self._drop()


def _published_address(data: bytes) -> str | None:
    """The address of the one message a REST producer answer reports as persisted."""
    try:
        results = json.loads(data)["messagePublishResults"]
        (result,) = results
        if result.get("errorCode", 0) != 0:
            return None
        ledger, entry, partition = (int(part) for part in str(result["messageId"]).split(":"))
    except (ValueError, KeyError, TypeError):
        return None
    return address_of(ledger, entry, partition)


def _plain_metadata(headers: Mapping[str, str]) -> tuple[dict[str, str], float] | None:
    """The properties and publish time of an entry's answer; None unless it is one plain message
    (not batched, chunked, encrypted or compressed) with readable metadata."""
    if (
        any(h in headers for h in _NOT_PLAIN_HEADERS)
        or headers.get("X-Pulsar-Is-Encrypted", "false") != "false"
        or headers.get("X-Pulsar-compression", "NONE") != "NONE"
    ):
        return None
    try:
        properties = json.loads(headers.get("X-Pulsar-PROPERTY") or "{}")
        published = datetime.fromisoformat(headers["X-Pulsar-publish-time"]).timestamp()
    except (KeyError, ValueError):
        return None
    if not isinstance(properties, dict):
        return None
    return {str(k): str(v) for k, v in properties.items()}, published
