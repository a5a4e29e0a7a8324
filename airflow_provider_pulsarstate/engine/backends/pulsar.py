"""The Pulsar back end: an exclusive producer per writer, a Reader per cursor, admin REST for epochs.

How the contract is kept:

* **Exclusive writer.** Every writer is an exclusive producer. WAIT first tries ``Exclusive``; when
  the topic is held it queues with ``WaitForExclusive`` (:meth:`PulsarBackend._queue_for_exclusive`):
  the broker hands the topic over the instant the holder closes, and lists the waiter in the
  topic stats (``waitingPublishers``), from which the holder learns to let go
  (:meth:`PulsarWriter.has_waiters`). The wait is bounded by the caller's deadline and runs on a
  client of its own whose connection is dropped when we give up, so an abandoned wait can never
  leave a producer holding the topic; beside a Shared producer (never promoted then,
  apache/pulsar#24516) WAIT polls ``Exclusive`` with back-off instead. FENCE queues likewise for
  up to :data:`FENCE_GRACE` for the holder to let go, then takes the topic over with a
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
from airflow_provider_pulsarstate.engine.backends.orphans import OrphanSweeper
from airflow_provider_pulsarstate.engine.backends.policies import ensure_topic_policies
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

_BUSY = (pulsar.ProducerFenced, pulsar.ProducerBusy)
FENCE_GRACE = 2.0
"""Seconds a FENCE acquisition waits for a live holder to let go before fencing it: a fencing
producer racing a holder's own close was seen to hang its creation for ~60 s (Pulsar 4.2.4), so
fencing is kept for holders that do not let go (a paused or partitioned process)."""
_UNREACHABLE = (pulsar.ConnectError, pulsar.Timeout, pulsar.LookupError, pulsar.ServiceUnitNotReady)
WAITERS_CHECK_MIN = 0.05
WAITERS_CHECK_MAX = 1.0
"""Bounds (seconds) of how often a held writer reads its topic's stats for waiting acquirers: a
stats request costs the broker several ms of CPU, so the interval grows with the writer's idle
time (a tenth of it), from the minimum right after an append to the maximum."""
_RECONNECTING = (pulsar.BrokerMetadataError, pulsar.NotConnected, pulsar.ConnectError, pulsar.ServiceUnitNotReady)
"""A reader's tail check while its consumer re-subscribes (after a broker restart): transient."""


def client_options(cfg: ConnectionConfig) -> dict[str, Any]:
    """The keyword arguments of ``pulsar.Client`` (and ``pulsar.asyncio.Client``) for ``cfg``:
    time-outs, auth token, TLS trust and hostname verification; one place for every client."""
    kwargs: dict[str, Any] = dict(
        operation_timeout_seconds=max(1, round(cfg.operation_timeout)),
        connection_timeout_ms=max(1, int(cfg.operation_timeout * 1000)),
        # The client's own logger, not a Python one: a pulsar.Client holding a Python
        # logger can abort the process at exit (apache/pulsar-client-python#256),
        # which would fail an Airflow task that succeeded.
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
        tls_validate_hostname=cfg.tls_hostname_verification,
    )
    if cfg.auth_token:
        kwargs["authentication"] = pulsar.AuthenticationToken(cfg.auth_token)
    if cfg.tls_trust_certs_file_path:
        kwargs["tls_trust_certs_file_path"] = cfg.tls_trust_certs_file_path
    return kwargs


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
        self._orphans = OrphanSweeper(self._open_admin)
        self._queued: set[pulsar.Client] = set()  # clients of waits for exclusive access under way
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
        mode = AcquireMode(mode)
        access = pulsar.ProducerAccessMode.Exclusive
        # Always named, so that a creation that timed out can be found in the topic stats.
        name = name or default_writer_name()
        deadline = time.monotonic() + timeout
        backoff = Backoff(initial=0.05, maximum=0.5)
        busy_since: float | None = None
        # An earlier call of ours that timed out under this name may have left an orphan behind.
        timed_out = self._orphans.claim(topic, name)
        owner: pulsar.Client | None = None  # the client of a granted wait (the producer lives on it)
        while True:
            try:
                producer = self.client.create_producer(
                    topic, producer_name=name, access_mode=access, **self._writer_options()
                )
                break
            except _BUSY as exc:
                if timed_out and self._drop_orphan(topic, name, wait=0.0):
                    continue  # it was our own orphan in the way
                if mode is AcquireMode.FAIL_FAST:
                    raise WriterBusyError(
                        f"another writer holds {self.topic_url(topic)} ({type(exc).__name__}; {self._blockers(topic, name)})"
                    ) from exc
                if mode is AcquireMode.FENCE:
                    busy_since = busy_since if busy_since is not None else time.monotonic()
                    if time.monotonic() - busy_since >= FENCE_GRACE:
                        self._fence(topic, name)
                        busy_since = None
                if time.monotonic() >= deadline:
                    raise OperationTimeoutError(
                        f"waited {timeout:.1f}s for the writer of {self.topic_url(topic)}; it is still held "
                        f"({self._blockers(topic, name)})"
                    ) from exc
                if mode is AcquireMode.WAIT or busy_since is not None:
                    until = deadline if busy_since is None else min(deadline, busy_since + FENCE_GRACE)
                    granted = self._queue_for_exclusive(topic, name, until=until)
                    if granted is not None:
                        producer, owner = granted
                        break
                backoff.sleep(deadline)
            except pulsar.Timeout as exc:
                # The broker may still create the producer after the client gave up on it
                # (apache/pulsar#25936): make sure no such orphan of ours holds the topic.
                timed_out = True
                if self._drop_orphan(
                    topic, name, wait=min(self.config.operation_timeout, max(2.0, deadline - time.monotonic()))
                ):
                    timed_out = False
                if mode is AcquireMode.FAIL_FAST or time.monotonic() >= deadline:
                    if timed_out:  # the broker may act on it long after this: watch on in the background
                        self._orphans.watch(topic, name)
                    raise self._unreachable("creating the exclusive producer of", topic, exc) from exc
                log.warning("creating the exclusive producer %r of %s timed out; retrying", name, self.topic_url(topic))
                backoff.sleep(deadline)
            except pulsar.ServiceUnitNotReady as exc:  # the topic is being unloaded (an orphan dropped) or moved
                if mode is AcquireMode.FAIL_FAST or time.monotonic() >= deadline:
                    raise self._unreachable("creating the exclusive producer of", topic, exc) from exc
                backoff.sleep(deadline)
            except _UNREACHABLE as exc:
                raise self._unreachable("creating the exclusive producer of", topic, exc) from exc
        try:
            epoch = int(self.admin.topic_stats(topic)["topicEpoch"])
        except Exception:
            # The broker may be unreachable right now (that is why the read failed): a close that
            # fails must neither replace the error with a driver's one nor leave our producer behind.
            try:
                producer.close()
            except Exception as exc:
                log.warning("closing the exclusive producer %r of %s failed: %s", name, self.topic_url(topic), exc)
                if owner is None:  # a producer on a client of its own goes with its connection below
                    self._drop_orphan(topic, name, wait=0.0)
            finally:
                _shutdown_quietly(owner)
            raise
        log.debug("acquired writer %r of %s at epoch %d", name, topic, epoch)
        return self._track(PulsarWriter(self, topic, epoch, producer, owner=owner))

    def _writer_options(self) -> dict[str, Any]:
        """``create_producer`` options of an exclusive writer (besides name and access mode)."""
        return dict(
            batching_enabled=False,
            chunking_enabled=False,
            block_if_queue_full=True,
            max_pending_messages=10000,
            send_timeout_millis=max(1, int(self.config.operation_timeout * 1000)),
        )

    def _queue_for_exclusive(
        self, topic: str, name: str, *, until: float
    ) -> tuple[pulsar.Producer, pulsar.Client] | None:
        """Wait in the broker's queue for exclusive access to ``topic`` until ``until`` (monotonic).

        Returns the producer and the client it lives on (closed with the writer), or None: not
        granted in time, refused (a FENCE takeover fails every waiter), or not queued at all
        because a Shared producer is connected (apache/pulsar#24516: never promoted then) or the
        broker could not be asked; the caller then goes on as without waiting.

        The creation runs on a client of its own, in a thread bounded by ``until`` (the client's
        own time-out, when shorter, ends it earlier). Giving up shuts that client down: its
        connection drops, and with it anything the broker still holds for us, whether created
        just now or still queued (a waiter of a dead connection is dropped the moment the broker
        promotes it). So no abandoned wait can hold the topic.
        """
        try:
            if any(p.get("accessMode") == "Shared" for p in self._publishers(topic)):
                return None
            client = pulsar.Client(self.config.url, **client_options(self.config))
        except Exception as exc:  # noqa: BLE001 - the caller polls instead, and reports what it meets
            log.debug("not queueing for %s: %s", self.topic_url(topic), exc)
            return None
        with self._lock:
            if self._closed:
                _shutdown_quietly(client)
                return None
            self._queued.add(client)
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def create() -> None:
            try:
                outcome["producer"] = client.create_producer(
                    topic,
                    producer_name=name,
                    access_mode=pulsar.ProducerAccessMode.WaitForExclusive,
                    **self._writer_options(),
                )
            except Exception as exc:  # noqa: BLE001 - reported by the waiting thread
                outcome["error"] = exc
            finally:
                done.set()

        threading.Thread(target=create, name="pulsarstate-wait-exclusive", daemon=True).start()
        granted = done.wait(max(0.0, until - time.monotonic())) and "producer" in outcome
        with self._lock:
            self._queued.discard(client)
        if granted:
            return outcome["producer"], client
        _shutdown_quietly(client)
        if "error" in outcome:
            log.debug("waiting for the writer of %s: %s", self.topic_url(topic), outcome["error"])
        return None

    def _fence(self, topic: str, name: str) -> None:
        """Close every producer of ``topic`` (the broker bumps its epoch): a fencing producer that
        is created and closed at once, never written with. Another candidate may take the topic
        before we do; the caller then fences again or gives up at its deadline."""
        fencer_name = f"{name}-fence"
        try:
            fencer = self.client.create_producer(
                topic,
                producer_name=fencer_name,
                access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing,
                batching_enabled=False,
                send_timeout_millis=max(1, int(self.config.operation_timeout * 1000)),
            )
        except _BUSY as exc:  # fenced in turn by a concurrent candidate: the topic was taken over anyway
            log.debug("fencing %s: %s", topic, exc)
            return
        except pulsar.Timeout:  # it may still be created after we gave up (apache/pulsar#25936)
            if not self._drop_orphan(topic, fencer_name, wait=min(self.config.operation_timeout, 2.0)):
                self._orphans.watch(topic, fencer_name)
            return
        except _UNREACHABLE as exc:
            raise self._unreachable("fencing the writer of", topic, exc) from exc
        try:
            fencer.close()
        except pulsar.PulsarException as exc:  # fenced meanwhile or already gone: nothing of ours stays
            log.debug("closing the fencing producer of %s: %s", topic, exc)
        log.info("fenced the writer of %s", self.topic_url(topic))

    def _publishers(self, topic: str) -> list[dict[str, Any]]:
        return list(self.admin.topic_stats(topic).get("publishers") or [])

    def _blockers(self, topic: str, name: str) -> str:
        """Who holds the topic, from its admin stats (best effort: for error messages)."""
        try:
            stats = self.admin.topic_stats(topic)
        except Exception as exc:  # the message is about the acquisition, not this lookup
            return f"its producers could not be listed: {exc}"
        others = [
            f"{p.get('producerName')!r} ({p.get('accessMode', '?')})"
            for p in stats.get("publishers") or []
            if p.get("producerName") != name
        ]
        waiting = int(stats.get("waitingPublishers") or 0)
        held = f"held by {', '.join(others)}" if others else "no producer listed now"
        return held + (f", {waiting} waiting for exclusive access" if waiting else "")

    def _drop_orphan(self, topic: str, name: str, *, wait: float) -> bool:
        """After a timed-out creation: if the broker lists a producer named ``name`` within ``wait``
        seconds (ours, but unknown to the client), unload the topic so the broker drops it (the
        topic's other clients are disconnected too and reconnect at once). True when it was
        dropped. Best effort: an unreachable broker is logged; the caller hands the name to the
        background :class:`OrphanSweeper` when it gives up."""
        try:
            deadline = time.monotonic() + wait
            # the broker may act on the request a little after the client gave up
            while True:
                if any(p.get("producerName") == name for p in self._publishers(topic)):
                    break
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.2)
            log.warning(
                "dropping the orphaned exclusive producer %r of %s (unloading the topic)", name, self.topic_url(topic)
            )
            self.admin.unload(topic)
            return True
        except Exception as exc:
            log.warning("could not check %s for an orphaned producer %r: %s", self.topic_url(topic), name, exc)
            return False

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
        except _UNREACHABLE as exc:
            raise self._unreachable("creating a producer of", topic, exc) from exc
        except _BUSY as exc:
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
        except _UNREACHABLE as exc:
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
            _close_quietly(reader)
        return _entry(msg)

    def ensure_durable(self, topic: str) -> None:
        with self._lock:
            if topic in self._durable:
                return
        ensure_topic_policies(self.admin, topic, timeout=self.config.operation_timeout)
        with self._lock:
            self._durable.add(topic)

    def encode_position(self, position: Any) -> bytes:
        return position.serialize()

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
        self._orphans.close()  # closing the client drops any orphan: it lives on our connection
        with self._lock:
            queued, self._queued = self._queued, set()
        for waiting in queued:  # their waits end at once, granted nothing
            _shutdown_quietly(waiting)
        self._children.close_all()
        _close_quietly(self._client)
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

        def callback_for(i: int):
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
        _close_quietly(producer)  # first: the broker promotes the next waiter as it closes
        owner, self._owner = self._owner, None
        _shutdown_quietly(owner)
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
                return self._get().has_message_available()
            except _RECONNECTING as exc:
                if time.monotonic() >= deadline:
                    raise self.backend._unreachable("checking the tail of", self.topic, exc) from exc
                backoff.sleep(deadline=deadline)
            except pulsar.PulsarException as exc:
                raise self.backend._unreachable("checking the tail of", self.topic, exc) from exc

    def close(self) -> None:
        reader, self._reader = self._reader, None
        self._peeked = None
        _close_quietly(reader)
        self.backend._untrack(self)


def _id_tuple(msg_id: Any) -> tuple[int, int, int, int]:
    return (msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index(), msg_id.partition())


def _entry(msg: pulsar.Message) -> RawEntry:
    return RawEntry(msg.message_id(), msg.data(), msg.publish_timestamp() / 1000.0)


def _shutdown_quietly(client: pulsar.Client | None) -> None:
    """Drop a client's connections at once, without waiting for anything in flight."""
    if client is not None:
        try:
            client.shutdown()
        except pulsar.PulsarException as exc:
            log.debug("shutting a Pulsar client down: %s", exc)


def _close_quietly(resource: pulsar.Client | pulsar.Producer | pulsar.Reader | None) -> None:
    """Close a pulsar-client object; one that is already closed or disconnected is fine."""
    if resource is not None:
        try:
            resource.close()
        except pulsar.PulsarException:
            pass


def unique_subscription() -> dict[str, str]:
    """A reader's subscription prefix unique to this call. The client generates the rest of the
    name from a random generator that a forked child inherits: children of one parent (task
    processes forked by a worker that had imported pulsar) would all ask for the same name, and all
    but one fail with ConsumerBusy."""
    return {"subscription_role_prefix": f"pulsarstate-{uuid.uuid4().hex[:16]}"}
