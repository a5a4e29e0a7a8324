"""The Pulsar back end: an exclusive producer per writer, a Reader per cursor, admin REST for epochs.

How the contract is kept:

* **Exclusive writer** (taken by :mod:`.pulsar_acquire`). Every writer is an exclusive producer.
  WAIT first tries ``Exclusive``; when the topic is held it queues with ``WaitForExclusive``: the broker hands the topic over the instant the holder closes, and lists the waiter in the
  topic stats (``waitingPublishers``), from which the holder learns to let go
  (:meth:`PulsarWriter.has_waiters`). The wait is bounded by the caller's deadline and runs on a
  client of its own whose connection is dropped when we give up, so an abandoned wait can never
  leave a producer holding the topic; beside a Shared producer (never promoted then,
  apache/pulsar#24516) WAIT polls ``Exclusive`` with back-off instead. FENCE queues likewise for
  up to :data:`.pulsar_acquire.FENCE_GRACE` for the holder to let go, then takes the topic over with a
  short-lived ``ExclusiveWithFencing`` producer that is closed at once, and takes Exclusive like
  the others: ``ExclusiveWithFencing`` producers created concurrently can
  all be admitted and all send (seen on Pulsar 4.2.4: three listed as publishers at once, the topic
  epoch reported lower than one already granted), so no fencing producer ever writes.
* **Time-outs.** A producer creation that timed out may still complete on the broker and leave
  an orphaned exclusive producer that nobody can use (apache/pulsar#25936). Every attempt is
  named, the topic stats are checked for that name after a time-out, and an orphan is dropped by
  unloading the topic; WAIT then retries until its deadline.
* **Epochs** are the broker's topic epoch (``topicEpoch`` in the topic stats), read right after the
  producer is created. The broker bumps it for every new exclusive producer and rejects the sends
  of a fenced one, so a fenced writer can never append again.
* **Unknown outcomes.** A send that times out, or a connection that drops, may or may not have
  landed: it surfaces as UnknownOutcomeError and the layer above looks for the write in the log.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pulsar

from airflow_provider_pulsarstate.engine.backends.admin import PulsarAdmin
from airflow_provider_pulsarstate.engine.backends.base import (
    EARLIEST,
    AcquireMode,
    Backend,
    RawEntry,
    RawReader,
    RawWriter,
    default_writer_name,
    is_earliest,
)
from airflow_provider_pulsarstate.engine.backends.children import C, Children
from airflow_provider_pulsarstate.engine.backends.policies import ensure_topic_policies
from airflow_provider_pulsarstate.engine.backends.pulsar_acquire import ExclusiveAcquirer
from airflow_provider_pulsarstate.engine.backends.pulsar_client import (
    BUSY_ERRORS,
    UNREACHABLE_ERRORS,
    client_options,
    close_quietly,
    shutdown_quietly,
)
from airflow_provider_pulsarstate.engine.backends.pulsar_offers import PulsarOffers
from airflow_provider_pulsarstate.engine.config import ConnectionConfig, redact_url
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    OperationTimeoutError,
    UnknownOutcomeError,
    WriterBusyError,
    WriterFencedError,
)
from airflow_provider_pulsarstate.engine.retry import Backoff

log = logging.getLogger(__name__)

WAITERS_CHECK_MIN = 0.05
WAITERS_CHECK_MAX = 1.0
"""Bounds (seconds) of how often a held writer reads its topic's stats for waiting acquirers: a
stats request costs the broker several ms of CPU, so the interval grows with the writer's idle
time (a tenth of it), from the minimum right after an append to the maximum."""


_RECONNECTING = (pulsar.BrokerMetadataError, pulsar.NotConnected, pulsar.ConnectError, pulsar.ServiceUnitNotReady)
"""A reader's tail check while its consumer re-subscribes (after a broker restart): transient."""


class PulsarBackend(PulsarOffers, Backend):
    """A real Pulsar broker.

    The client connects lazily: constructing this object does no network I/O.

    :param config: the connection settings (``kind`` must be ``"pulsar"``).
    """

    def __init__(self, config: ConnectionConfig) -> None:
        if config.kind != "pulsar":
            raise ValueError(f"{redact_url(config.url)!r} is not a pulsar:// URL")
        self.config = config
        self.admin = self._open_admin()
        self._client: pulsar.Client | None = None
        self._lock = threading.Lock()
        self._children = Children()
        self._durable: set[str] = set()  # topics whose retention policies were checked
        self._acquirer = ExclusiveAcquirer(self)
        self._closed = False

    def _open_admin(self) -> PulsarAdmin:
        cfg = self.config
        return PulsarAdmin(
            cfg.resolved_admin_url,
            auth_token=cfg.auth_token,
            tls_trust_certs_file_path=cfg.tls_trust_certs_file_path,
            timeout=cfg.operation_timeout,
            origin=cfg.field_origin("admin_url"),
        )

    @property
    def client(self) -> pulsar.Client:
        """The pulsar-client Client (created on first use)."""
        with self._lock:
            if self._closed:
                raise ClosedError(f"Pulsar back end {redact_url(self.config.url)} is closed")
            if self._client is None:
                cfg = self.config
                kwargs = client_options(cfg)
                try:
                    self._client = pulsar.Client(cfg.url, **kwargs)
                except pulsar.PulsarException as exc:
                    raise BackendUnavailableError(
                        f"cannot create a Pulsar client for {redact_url(cfg.url)}: {exc}"
                    ) from exc
            return self._client

    def topic_url(self, topic: str) -> str:
        return f"{topic} (broker {redact_url(self.config.url)})"

    def _unreachable(self, what: str, topic: str, exc: Exception) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"{what} {self.topic_url(topic)}{self.config.field_origin('service_url')} failed within "
            f"{self.config.operation_timeout:.0f}s: "
            f"{type(exc).__name__}: {exc}"
        )

    def _track(self, child: C) -> C:
        return self._children.track(child)

    def _untrack(self, child: object) -> None:
        self._children.untrack(child)

    # -- writer -----------------------------------------------------------------------------
    def acquire_writer(self, topic: str, *, mode: AcquireMode, timeout: float, name: str | None = None) -> RawWriter:
        # Always named, so that a creation that timed out can be found in the topic stats.
        name = name or default_writer_name()
        producer, owner, epoch = self._acquirer.acquire(topic, mode=mode, timeout=timeout, name=name)
        log.debug("acquired writer %r of %s at epoch %d", name, topic, epoch)
        return self._track(PulsarWriter(self, topic, epoch, producer, owner=owner))

    def current_epoch(self, topic: str) -> int:
        # The broker persists topicEpoch with the topic (it survives unloads and restarts); a topic
        # that never had an exclusive producer reports none.
        epoch = self.admin.topic_stats(topic).get("topicEpoch")
        return -1 if epoch is None else int(epoch)

    def open_shared_writer(self, topic: str, *, compress: bool = False, batching: bool = True) -> RawWriter:
        try:
            producer = self.client.create_producer(
                topic,
                access_mode=pulsar.ProducerAccessMode.Shared,
                # A batching producer holds a lone send back up to 10 ms for company.
                batching_enabled=batching,
                # LZ4 in the client's C++ threads: several times fewer bytes through the broker,
                # decompressed off the Python thread.
                compression_type=pulsar.CompressionType.LZ4 if compress else pulsar.CompressionType.NONE,
                block_if_queue_full=True,
                send_timeout_millis=max(1, int(self.config.operation_timeout * 1000)),
            )
        except UNREACHABLE_ERRORS as exc:
            raise self._unreachable("creating a producer of", topic, exc) from exc
        except BUSY_ERRORS as exc:
            raise WriterBusyError(
                f"{self.topic_url(topic)} has an exclusive writer; it takes no shared appends"
            ) from exc
        return self._track(PulsarWriter(self, topic, -1, producer))

    def delete_topic(self, topic: str) -> None:
        self.admin.delete_topic(topic, force=True)

    def list_topics(self, prefix: str) -> list[str]:
        parts = prefix.removeprefix("persistent://").split("/")
        if not prefix.startswith("persistent://") or len(parts) < 3:
            raise ConfigurationError(f"topic prefix {prefix!r} is not persistent://tenant/namespace/...")
        return sorted(t for t in self.admin.namespace_topics(parts[0], parts[1]) if t.startswith(prefix))

    # -- readers ----------------------------------------------------------------------------
    def create_reader(self, topic: str, *, start: Any = EARLIEST) -> RawReader:
        start_id = pulsar.MessageId.earliest if is_earliest(start) else start
        try:
            reader = self.client.create_reader(
                topic,
                start_id,
                receiver_queue_size=2000,
                start_message_id_inclusive=False,
                **unique_subscription(),
            )
        except UNREACHABLE_ERRORS as exc:
            raise self._unreachable("creating a reader of", topic, exc) from exc
        return self._track(PulsarReader(self, topic, reader))

    def read_last(self, topic: str, *, timeout: float) -> RawEntry | None:
        try:
            return self._read_one(topic, pulsar.MessageId.latest, timeout=timeout)
        except pulsar.Timeout as exc:
            raise OperationTimeoutError(
                f"reading the last entry of {self.topic_url(topic)} took over {timeout:.1f}s"
            ) from exc

    def read_at(self, topic: str, position: Any, *, timeout: float) -> RawEntry | None:
        try:
            entry = self._read_one(topic, position, timeout=timeout)
        except pulsar.Timeout:
            return None
        return entry if entry is not None and _id_tuple(entry.position) == _id_tuple(position) else None

    def _read_one(self, topic: str, start: Any, *, timeout: float) -> RawEntry | None:
        """The entry at ``start`` (inclusive), or None when the topic is missing or has none there.

        Raises pulsar.Timeout for the caller to map; every other client error becomes ours.
        """
        if not self.admin.topic_exists(topic):
            return None  # a client lookup would create it (and a ledger) only to find it empty
        try:
            reader = self.client.create_reader(topic, start, start_message_id_inclusive=True, **unique_subscription())
        except pulsar.TopicNotFound:
            return None  # auto topic creation is off and nobody created it: nothing written yet
        except pulsar.PulsarException as exc:
            raise self._unreachable("creating a reader of", topic, exc) from exc
        try:
            if not reader.has_message_available():
                return None
            msg = reader.read_next(max(1, int(timeout * 1000)))
        except pulsar.Timeout:
            raise
        except pulsar.PulsarException as exc:
            raise self._unreachable("reading", topic, exc) from exc
        finally:
            close_quietly(reader)
        return _entry(msg)

    def ensure_durable(self, topic: str) -> None:
        with self._lock:
            if topic in self._durable:
                return
        ensure_topic_policies(self.admin, topic, timeout=self.config.operation_timeout)
        with self._lock:
            self._durable.add(topic)

    def encode_position(self, position: Any) -> bytes:
        return bytes(position.serialize())

    def decode_position(self, data: bytes) -> Any:
        try:
            return pulsar.MessageId.deserialize(data)
        except Exception as exc:
            raise ValueError(f"not a serialized Pulsar message id: {data!r}") from exc

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._acquirer.close()  # waits for exclusive access end at once, granted nothing
        self._children.close_all()
        close_quietly(self._client)
        self.admin.close()


class PulsarWriter(RawWriter):
    """An exclusive producer holding one topic epoch."""

    def __init__(
        self,
        backend: PulsarBackend,
        topic: str,
        epoch: int,
        producer: pulsar.Producer,
        *,
        owner: pulsar.Client | None = None,
    ) -> None:
        """``owner``: the client the producer lives on when it is not the back end's (a granted
        wait's); shut down with the writer."""
        self.backend = backend
        self.topic = topic
        self.epoch = epoch
        self._producer: pulsar.Producer | None = producer
        self._owner = owner
        self._last_append = time.monotonic()
        self._next_check = 0.0
        self._waiters = False

    def _fenced(self, detail: str) -> WriterFencedError:
        self.close()
        return WriterFencedError(
            f"writer of {self.backend.topic_url(self.topic)} at epoch {self.epoch} was fenced: {detail}",
            topic=self.topic,
            epoch=self.epoch,
        )

    def append(self, payloads: Sequence[bytes], *, timeout: float) -> list[Any]:
        return self.append_async(payloads, timeout=timeout)()

    def append_async(self, payloads: Sequence[bytes], *, timeout: float) -> Callable[[], list[Any]]:
        producer = self._producer
        if producer is None:
            raise WriterFencedError(
                f"writer of {self.topic} at epoch {self.epoch} is closed", topic=self.topic, epoch=self.epoch
            )
        self._last_append = time.monotonic()
        n = len(payloads)
        results: list[Any] = [None] * n
        done = threading.Event()
        remaining = [n]
        guard = threading.Lock()

        def callback_for(i: int) -> Callable[[pulsar.Result, pulsar.MessageId], None]:
            def callback(res: pulsar.Result, msg_id: pulsar.MessageId) -> None:
                results[i] = (res, msg_id)
                with guard:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        done.set()

            return callback

        try:
            for i, payload in enumerate(payloads):
                producer.send_async(payload, callback_for(i))
        except pulsar.ProducerFenced as exc:
            raise self._fenced(str(exc)) from exc
        except pulsar.PulsarException as exc:
            self.close()
            raise UnknownOutcomeError(f"send to {self.topic} failed part-way ({type(exc).__name__}: {exc})") from exc
        deadline = time.monotonic() + timeout + 5.0

        def wait() -> list[Any]:
            if not done.wait(max(0.0, deadline - time.monotonic())):
                self.close()
                raise UnknownOutcomeError(f"no acknowledgement from {self.topic} within {timeout:.1f}s")
            positions = []
            for res, msg_id in results:
                if res == pulsar.Result.ProducerFenced:
                    raise self._fenced("the broker rejected the send")
                if res != pulsar.Result.Ok:
                    self.close()
                    raise UnknownOutcomeError(f"send to {self.topic} ended with {res}; it may or may not have landed")
                positions.append(msg_id)
            return positions

        return wait

    def has_waiters(self) -> bool:
        """Whether the topic stats list a waiting exclusive producer (``waitingPublishers``).

        Asked more often than every :data:`WAITERS_CHECK_MIN` .. :data:`WAITERS_CHECK_MAX`
        seconds (a tenth of the time since the last append), it answers from the last look. A
        waiter whose client gave up may still be listed until the next holder lets go: the holder
        then releases the writer a little early, which is harmless.
        """
        if self._producer is None:
            return False
        now = time.monotonic()
        if now < self._next_check:
            return self._waiters
        try:
            self._waiters = int(self.backend.admin.topic_stats(self.topic).get("waitingPublishers") or 0) > 0
        except Exception as exc:  # noqa: BLE001 - keeping the writer is always safe
            log.debug("checking %s for waiting writers: %s", self.backend.topic_url(self.topic), exc)
            self._waiters = False
        idle = time.monotonic() - self._last_append
        self._next_check = time.monotonic() + min(WAITERS_CHECK_MAX, max(WAITERS_CHECK_MIN, idle / 10))
        return self._waiters

    def close(self) -> None:
        producer, self._producer = self._producer, None
        close_quietly(producer)  # first: the broker promotes the next waiter as it closes
        owner, self._owner = self._owner, None
        shutdown_quietly(owner)
        self.backend._untrack(self)


class PulsarReader(RawReader):
    """A pulsar-client Reader.

    ``has_next`` first takes a message already in the client's receive queue (kept for the next
    ``read_next``) and asks the broker only when the queue is empty: replaying a long topic then
    costs one round trip per empty queue, not one per entry.
    """

    def __init__(self, backend: PulsarBackend, topic: str, reader: pulsar.Reader) -> None:
        self.backend = backend
        self.topic = topic
        self._reader: pulsar.Reader | None = reader
        self._peeked: RawEntry | None = None

    def _get(self) -> pulsar.Reader:
        if self._reader is None:
            raise ClosedError(f"reader of {self.topic} is closed")
        return self._reader

    def _read(self, timeout_millis: int) -> RawEntry | None:
        try:
            msg = self._get().read_next(timeout_millis)
        except pulsar.Timeout:
            return None
        except pulsar.PulsarException as exc:
            raise self.backend._unreachable("reading", self.topic, exc) from exc
        return _entry(msg)

    def read_next(self, *, timeout: float) -> RawEntry | None:
        if self._peeked is not None:
            entry, self._peeked = self._peeked, None
            return entry
        return self._read(max(1, int(timeout * 1000)))

    def has_next(self) -> bool:
        if self._peeked is None:
            self._peeked = self._read(0)  # 0 ms: only what the client already received
        if self._peeked is not None:
            return True
        # Right after a broker restart the client re-subscribes in the background; until it has,
        # the broker answers "Consumer not found" (BrokerMetadataError): retried, not fatal.
        deadline = time.monotonic() + self.backend.config.operation_timeout
        backoff = Backoff(initial=0.05, maximum=1.0)
        while True:
            try:
                return bool(self._get().has_message_available())
            except _RECONNECTING as exc:
                if time.monotonic() >= deadline:
                    raise self.backend._unreachable("checking the tail of", self.topic, exc) from exc
                backoff.sleep(deadline=deadline)
            except pulsar.PulsarException as exc:
                raise self.backend._unreachable("checking the tail of", self.topic, exc) from exc

    def close(self) -> None:
        reader, self._reader = self._reader, None
        self._peeked = None
        close_quietly(reader)
        self.backend._untrack(self)


def _id_tuple(msg_id: Any) -> tuple[int, int, int, int]:
    return (msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index(), msg_id.partition())


def _entry(msg: pulsar.Message) -> RawEntry:
    return RawEntry(msg.message_id(), msg.data(), msg.publish_timestamp() / 1000.0)


def unique_subscription() -> dict[str, str]:
    """A reader's subscription prefix unique to this call. The client generates the rest of the
    name from a random generator that a forked child inherits: children of one parent (task
    processes forked by a worker that had imported pulsar) would all ask for the same name, and all
    but one fail with ConsumerBusy."""
    return {"subscription_role_prefix": f"pulsarstate-{uuid.uuid4().hex[:16]}"}
