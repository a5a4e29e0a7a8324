"""XCom values as immutable messages, one topic per DAG run, each read back by its address.

The layout beside :mod:`.xcom_store` (one PulsarMap per run): a push appends ONE message to the
run's topic (``<base>-<namespace slug>-m<digest of namespace, dag id, run id>``) through a plain
publisher that any number of processes share (no exclusive writer, no replay), and the caller keeps
the message's address (embedded: its position; Pulsar: its message id). A pull reads that one
message (:meth:`~airflow_provider_pulsarstate.engine.offsets.base.OffsetLog.read_at`), whatever
else the run's topic holds. Nothing is ever rewritten or deleted message by message: a value that
nobody refers to any more just stays until its run's topic is deleted whole (clean-up).

Guarantees:

* Every message names its own row: namespace, dag id, run id, task id, map index, key, and a
  writer id unique to the push. :meth:`XComMessageLog.read` refuses (:class:`XComReferenceError`,
  naming the key) a message whose identity or writer id is not the one the caller expects, so an
  address copied from another row, run or deployment reads nothing.
* A value over ``max_value_bytes`` is refused before anything is written (:class:`ValueTooLargeError`
  naming the key and the size); on Pulsar a message over the broker's own limit is split into
  chunks by the client and read back whole.
* The message payload is one JSON header line then the value's JSON text unchanged, so any process
  can read it without Airflow (as :mod:`.xcom_store`)::

    from airflow_provider_pulsarstate import ConnectionConfig, open_backend
    from airflow_provider_pulsarstate.engine.recipes.xcom_messages import XComMessageLog, message_topic

    backend = open_backend(ConnectionConfig(url="pulsar://localhost:6650"))
    topic = message_topic("persistent://public/default/airflow-xcom", "prod", "my_dag", run_id)
    with XComMessageLog(backend, topic, namespace="prod") as log:
        for found in log.scan().messages:
            print(found.message.identity, found.message.record.json_value())
    backend.close()
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import (
    ConfigurationError,
    MessageNotFoundError,
    OperationTimeoutError,
    SerializationError,
    ValueTooLargeError,
    XComEntryNotFoundError,
    XComReferenceError,
)
from airflow_provider_pulsarstate.engine.offsets import last_position, open_offset_log, open_publisher
from airflow_provider_pulsarstate.engine.offsets.base import OffsetLog, TopicPublisher
from airflow_provider_pulsarstate.engine.recipes.scope_topics import is_scope_topic, scope_topic, scope_topic_prefix
from airflow_provider_pulsarstate.engine.recipes.xcom_store import DEFAULT_MAX_RECORD_BYTES, XComRecord, _KeyLayout

if TYPE_CHECKING:
    from airflow_provider_pulsarstate.engine.offsets.base import StoredMessage
    from airflow_provider_pulsarstate.engine.offsets.pulsar_http import PulsarHttpMessages

MESSAGE_KIND = "m"
MESSAGE_FORMAT = 1


def message_topic_prefix(base_topic: str, namespace: str) -> str:
    """The prefix of every run message topic of one key namespace (``<base>-<namespace slug>-m``)."""
    return scope_topic_prefix(base_topic, namespace, MESSAGE_KIND)


def message_topic(base_topic: str, namespace: str, dag_id: str, run_id: str) -> str:
    """The topic of one DAG run's XCom messages (a digest of namespace, dag id and run id)."""
    return scope_topic(base_topic, namespace, MESSAGE_KIND, dag_id, run_id)


def is_message_topic(topic: str, prefix: str) -> bool:
    """Whether ``topic`` is a run's message topic under ``prefix``."""
    return is_scope_topic(topic, prefix)


@dataclass(frozen=True, slots=True)
class XComIdentity:
    """The row a value belongs to."""

    namespace: str
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    key: str

    @property
    def map_key(self) -> str:
        """The canonical key text (``<namespace>/xcom/<dag>/<run>/<task>/<map_index>/<key>``, as
        :mod:`.xcom_store` spells it): what errors and references name."""
        return _KeyLayout(self.namespace).map_key(self.dag_id, self.run_id, self.task_id, self.map_index, self.key)


@dataclass(frozen=True, slots=True)
class XComMessage:
    """One pushed value: its row, the writer id of the push, and the record (as :mod:`.xcom_store`)."""

    identity: XComIdentity
    writer_id: str
    record: XComRecord


@dataclass(frozen=True, slots=True)
class FoundMessage:
    """A message as :meth:`XComMessageLog.scan` found it (``message`` None: not an XCom message).

    :ivar publish_time: the log's own time stamp (seconds): the one clock clean-up judges by.
    """

    publish_time: float
    size: int
    message: XComMessage | None


@dataclass(frozen=True, slots=True)
class RunScan:
    """What :meth:`XComMessageLog.scan` read: the last entry's encoded position (None: empty) and the messages."""

    last: bytes | None
    messages: list[FoundMessage]


def encode_message(message: XComMessage) -> bytes:
    """The payload: a JSON header line (identity, writer, time, size, type, try), then the value text."""
    i, r = message.identity, message.record
    header = {
        "f": MESSAGE_FORMAT,
        "ns": i.namespace,
        "dag": i.dag_id,
        "run": i.run_id,
        "task": i.task_id,
        "mi": i.map_index,
        "key": i.key,
        "w": message.writer_id,
        "t": r.written_at,
        "n": r.size,
        "type": r.type_name,
        "try": r.try_number,
    }
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + r.value_json.encode()


def decode_message(data: bytes) -> XComMessage:
    """The message a payload holds.

    :raises SerializationError: not an XCom message of this format (says what is wrong).
    """
    head, sep, body = bytes(data).partition(b"\n")
    try:
        header = json.loads(head) if sep else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("f") != MESSAGE_FORMAT:
        raise SerializationError("not an XCom message (no header line of format 1)")
    field = _HeaderFields(header, head)
    ns, dag, run, task, key, writer, type_name = (
        field.text(name) for name in ("ns", "dag", "run", "task", "key", "w", "type")
    )
    record = XComRecord(body.decode(), field.number("t"), field.integer("n"), type_name, field.optional_integer("try"))
    return XComMessage(XComIdentity(ns, dag, run, task, field.integer("mi"), key), writer, record)


class _HeaderFields:
    """Typed reads of a message header's fields; any field of the wrong type raises the one
    SerializationError that quotes the header."""

    def __init__(self, header: dict[str, Any], head: bytes) -> None:
        self._header = header
        self._head = head

    def _malformed(self) -> SerializationError:
        return SerializationError(f"XCom message header is malformed: {self._head[:300]!r}")

    def text(self, name: str) -> str:
        value = self._header.get(name)
        if isinstance(value, str) and value:
            return value
        raise self._malformed()

    def integer(self, name: str) -> int:
        value = self._header.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise self._malformed()

    def optional_integer(self, name: str) -> int | None:
        return None if self._header.get(name) is None else self.integer(name)

    def number(self, name: str) -> float:
        value = self._header.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise self._malformed()


class XComMessageLog:
    """The XCom messages of one DAG run's topic: append one, read one by address, scan them all.

    Thread-safe; several processes may append at once. No I/O in the constructor: the publisher is
    opened (and the topic created) at the first :meth:`append`, the reader at the first read.

    With ``http`` (Pulsar), values up to its size limit are appended and read over the broker's
    HTTP API, so a process that pushes and pulls a few small values never starts a Pulsar client;
    anything else (a large value, a chunked message, an answer the HTTP path cannot give exactly)
    goes through ``backend``, which is opened only then. Both paths give the same addresses.

    :param backend: where the topic lives (not closed by :meth:`close`), or a callable giving it
        when first needed.
    :param http: the process's :class:`~airflow_provider_pulsarstate.engine.offsets.pulsar_http.PulsarHttpMessages`
        of the same connection (not closed by :meth:`close`), or None.
    :param topic: the run's topic (:func:`message_topic`).
    :param namespace: the key namespace every message must carry.
    :param max_value_bytes: the largest value text :meth:`append` accepts.
    :param operation_timeout: seconds an append or read may take.
    """

    def __init__(
        self,
        backend: Backend | Callable[[], Backend],
        topic: str,
        *,
        namespace: str,
        max_value_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        operation_timeout: float = 30.0,
        http: PulsarHttpMessages | None = None,
    ) -> None:
        _KeyLayout(namespace)  # validates it
        if max_value_bytes < 1 or not operation_timeout > 0:
            raise ConfigurationError("max_value_bytes must be >= 1 and operation_timeout positive")
        self._backend_or_opener = backend
        self._http = http
        self.topic = topic
        self.namespace = namespace
        self.max_value_bytes = max_value_bytes
        self.operation_timeout = operation_timeout
        self._publisher: TopicPublisher | None = None
        self._log: OffsetLog | None = None
        self._lock = threading.Lock()

    @property
    def backend(self) -> Backend:
        """The back end of the topic (opened now when it was given as a callable)."""
        with self._lock:
            if not isinstance(self._backend_or_opener, Backend):
                self._backend_or_opener = self._backend_or_opener()
            return self._backend_or_opener

    def __enter__(self) -> XComMessageLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ push
    def append(
        self,
        identity: XComIdentity,
        value_json: str,
        *,
        type_name: str,
        try_number: int | None = None,
    ) -> tuple[str, XComMessage]:
        """Append one value; returns its address and the message as written.

        :raises XComReferenceError: ``identity`` is of another namespace or not a valid row.
        :raises ValueTooLargeError: the text is over ``max_value_bytes`` (nothing written).
        :raises SerializationError: ``value_json`` is not a string.
        :raises OperationTimeoutError, BackendUnavailableError: not written in time (it may still land,
            unreferenced: nothing refers to it).
        """
        where = self._own(identity)
        if not isinstance(value_json, str):
            raise SerializationError(
                f"{self.topic}: XCom {where!r}: value_json must be str, got {type(value_json).__name__}"
            )
        size = len(value_json.encode())
        if size > self.max_value_bytes:
            raise ValueTooLargeError(
                f"{self.topic}: XCom {where!r} is {size:,} bytes, over the {self.max_value_bytes:,}-byte limit"
            )
        message = XComMessage(
            identity, uuid.uuid4().hex, XComRecord(value_json, time.time(), size, type_name, try_number)
        )
        payload = encode_message(message)
        address = self._http.publish(self.topic, payload) if self._http is not None else None
        if address is None:
            address = self._publisher_now().publish(payload, timeout=self.operation_timeout)
        return address, message

    def _publisher_now(self) -> TopicPublisher:
        backend = self.backend
        with self._lock:
            if self._publisher is None:
                self._publisher = open_publisher(backend, self.topic, batching=False, chunking=True, create=True)
            return self._publisher

    # ------------------------------------------------------------------ pull
    def read(self, address: str, *, identity: XComIdentity, writer_id: str) -> XComMessage:
        """The message at ``address``, checked to be the push of ``identity`` by ``writer_id``.

        :raises XComEntryNotFoundError: nothing is at the address (its run's topic was cleaned up).
        :raises XComReferenceError: the message there belongs to another row or push, or is not an
            XCom message (names the key); nothing of it is returned.
        """
        where = self._own(identity)
        try:
            stored = self._read_at(address)
        except MessageNotFoundError as exc:
            raise XComEntryNotFoundError(
                f"XCom {where!r} is not at {address} of {self.topic}: its run's values were cleaned up "
                f"(xcom-cleanup, retention) or the topic was replaced ({exc})",
                key=where,
                topic=self.topic,
            ) from exc
        except ConfigurationError as exc:
            raise XComReferenceError(f"XCom reference to key {where!r} has a bad address: {exc}") from exc
        try:
            message = decode_message(stored.value)
        except SerializationError as exc:
            raise XComReferenceError(f"XCom reference to key {where!r} points at {address}, which {exc}") from exc
        if message.identity != identity or message.writer_id != writer_id:
            raise XComReferenceError(
                f"XCom reference to key {where!r} points at {address} of {self.topic}, which holds "
                f"{message.identity.map_key!r} (writer {message.writer_id}): refusing to follow it"
            )
        return message

    def _read_at(self, address: str) -> StoredMessage:
        stored = self._http.read(self.topic, address) if self._http is not None else None
        return stored if stored is not None else self._reader().read_at(address, timeout=self.operation_timeout)

    def _reader(self) -> OffsetLog:
        backend = self.backend
        with self._lock:
            if self._log is None:
                self._log = open_offset_log(backend, self.topic)
            return self._log

    # ------------------------------------------------------------------ clean-up
    def scan(self) -> RunScan:
        """Every message of the topic up to its last entry when the scan started, in order (one
        that is not an XCom message of this format comes with ``message`` None), and that entry's
        position (what :func:`~airflow_provider_pulsarstate.engine.offsets.delete_topic_if_unchanged`
        compares). Reads the whole topic: for clean-up, never for a pull."""
        last = last_position(self.backend, self.topic, timeout=self.operation_timeout)
        found: list[FoundMessage] = []
        if last is None:
            return RunScan(None, found)
        reader = self.backend.create_reader(self.topic)
        try:
            while True:
                entry = reader.read_next(timeout=self.operation_timeout)
                if entry is None:
                    raise OperationTimeoutError(f"{self.topic}: the scan stopped before the last entry it started with")
                try:
                    message: XComMessage | None = decode_message(entry.payload)
                except SerializationError:
                    message = None
                found.append(FoundMessage(entry.publish_time, len(entry.payload), message))
                if self.backend.encode_position(entry.position) == last:
                    return RunScan(last, found)
        finally:
            reader.close()

    def _own(self, identity: XComIdentity) -> str:
        if not isinstance(identity, XComIdentity) or identity.namespace != self.namespace:
            raise XComReferenceError(f"{identity!r} is not an XCom row of namespace {self.namespace!r}")
        return identity.map_key

    def close(self) -> None:
        """Flush and close the publisher and reader (idempotent); the back end stays open."""
        with self._lock:
            publisher, log, self._publisher, self._log = self._publisher, self._log, None, None
        try:
            if publisher is not None:
                publisher.close()
        finally:
            if log is not None:
                log.close()
