"""Taking the exclusive producer of a topic for :meth:`PulsarBackend.acquire_writer
<airflow_provider_pulsarstate.engine.backends.pulsar.PulsarBackend.acquire_writer>`: in the modes
of :class:`~airflow_provider_pulsarstate.engine.backends.base.AcquireMode`, with the broker's
queue for exclusive access, fencing, and orphans of timed-out creations dropped (see
:mod:`.pulsar` for how the contract is kept).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import pulsar

from airflow_provider_pulsarstate.engine.backends.base import AcquireMode
from airflow_provider_pulsarstate.engine.backends.orphans import OrphanSweeper
from airflow_provider_pulsarstate.engine.backends.pulsar_client import (
    BUSY_ERRORS,
    UNREACHABLE_ERRORS,
    client_options,
    shutdown_quietly,
)
from airflow_provider_pulsarstate.engine.errors import OperationTimeoutError, WriterBusyError
from airflow_provider_pulsarstate.engine.retry import Backoff

if TYPE_CHECKING:
    from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend

log = logging.getLogger(__name__)

FENCE_GRACE = 2.0
"""Seconds a FENCE acquisition waits for a live holder to let go before fencing it: a fencing
producer racing a holder's own close was seen to hang its creation for ~60 s (Pulsar 4.2.4), so
fencing is kept for holders that do not let go (a paused or partitioned process)."""


class _Acquisition:
    """One call of :meth:`PulsarBackend.acquire_writer`: what it asked for and how far it got."""

    def __init__(self, topic: str, name: str, mode: AcquireMode, timeout: float, *, timed_out: bool) -> None:
        self.topic = topic
        self.name = name
        self.mode = mode
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.backoff = Backoff(initial=0.05, maximum=0.5)
        self.timed_out = timed_out  # a creation under this name may have left an orphan behind
        self.busy_since: float | None = None  # FENCE: when the holder was first seen

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline


class ExclusiveAcquirer:
    """Takes exclusive producers for one back end. Thread-safe.

    Owns the waits for exclusive access under way (their clients are shut down by :meth:`close`)
    and the background sweeper of orphaned producers.
    """

    def __init__(self, backend: PulsarBackend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._orphans = OrphanSweeper(backend._open_admin)
        self._queued: set[pulsar.Client] = set()  # clients of waits for exclusive access under way
        self._closed = False

    def acquire(
        self, topic: str, *, mode: AcquireMode, timeout: float, name: str
    ) -> tuple[Any, pulsar.Client | None, int]:
        """The exclusive producer of ``topic``, the client it lives on (None: the back end's own;
        else closed with the writer) and the topic epoch it was granted at.

        :raises WriterBusyError: FAIL_FAST and the topic is held.
        :raises OperationTimeoutError: not acquired within ``timeout``.
        :raises BackendUnavailableError: the broker could not be reached.
        """
        attempt = _Acquisition(
            topic,
            name,
            AcquireMode(mode),
            timeout,
            # An earlier call of ours that timed out under this name may have left an orphan behind.
            timed_out=self._orphans.claim(topic, name),
        )
        producer, owner = self._create_exclusive(attempt)
        return producer, owner, self._epoch_of_new_writer(topic, name, producer, owner)

    def _create_exclusive(self, attempt: _Acquisition) -> tuple[Any, pulsar.Client | None]:
        """The exclusive producer, and the client it lives on when a granted wait created it (None:
        our own client), as ``attempt.mode`` says to wait for it."""
        topic, name = attempt.topic, attempt.name
        while True:
            try:
                producer = self._backend.client.create_producer(
                    topic, producer_name=name, access_mode=pulsar.ProducerAccessMode.Exclusive, **self._writer_options()
                )
                return producer, None
            except BUSY_ERRORS as exc:
                granted = self._on_writer_busy(attempt, exc)
                if granted is not None:
                    return granted
            except pulsar.Timeout as exc:
                self._on_create_timeout(attempt, exc)
            except pulsar.ServiceUnitNotReady as exc:  # the topic is being unloaded (an orphan dropped) or moved
                if attempt.mode is AcquireMode.FAIL_FAST or attempt.expired():
                    raise self._backend._unreachable("creating the exclusive producer of", topic, exc) from exc
                attempt.backoff.sleep(attempt.deadline)
            except UNREACHABLE_ERRORS as exc:
                raise self._backend._unreachable("creating the exclusive producer of", topic, exc) from exc

    def _on_writer_busy(self, attempt: _Acquisition, exc: Exception) -> tuple[Any, pulsar.Client | None] | None:
        """Another producer holds the topic: fail (FAIL_FAST, or past the deadline), fence it
        (FENCE, after :data:`FENCE_GRACE`), or wait; a wait the broker granted returns its producer."""
        topic, name, mode = attempt.topic, attempt.name, attempt.mode
        if attempt.timed_out and self._drop_orphan(topic, name, wait=0.0):
            return None  # it was our own orphan in the way: try again at once
        if mode is AcquireMode.FAIL_FAST:
            raise WriterBusyError(
                f"another writer holds {self._backend.topic_url(topic)} ({type(exc).__name__}; {self._blockers(topic, name)})"
            ) from exc
        if mode is AcquireMode.FENCE:
            if attempt.busy_since is None:
                attempt.busy_since = time.monotonic()
            if time.monotonic() - attempt.busy_since >= FENCE_GRACE:
                self._fence(topic, name)
                attempt.busy_since = None
        if attempt.expired():
            raise OperationTimeoutError(
                f"waited {attempt.timeout:.1f}s for the writer of {self._backend.topic_url(topic)}; it is still held "
                f"({self._blockers(topic, name)})"
            ) from exc
        if mode is AcquireMode.WAIT or attempt.busy_since is not None:
            until = (
                attempt.deadline
                if attempt.busy_since is None
                else min(attempt.deadline, attempt.busy_since + FENCE_GRACE)
            )
            granted = self._queue_for_exclusive(topic, name, until=until)
            if granted is not None:
                return granted
        attempt.backoff.sleep(attempt.deadline)
        return None

    def _on_create_timeout(self, attempt: _Acquisition, exc: Exception) -> None:
        """The client gave up creating the producer: the broker may still create it after that
        (apache/pulsar#25936), so make sure no such orphan of ours holds the topic, then retry
        (or raise: FAIL_FAST, or past the deadline)."""
        topic, name = attempt.topic, attempt.name
        attempt.timed_out = not self._drop_orphan(
            topic, name, wait=min(self._backend.config.operation_timeout, max(2.0, attempt.deadline - time.monotonic()))
        )
        if attempt.mode is AcquireMode.FAIL_FAST or attempt.expired():
            if attempt.timed_out:  # the broker may act on it long after this: watch on in the background
                self._orphans.watch(topic, name)
            raise self._backend._unreachable("creating the exclusive producer of", topic, exc) from exc
        log.warning(
            "creating the exclusive producer %r of %s timed out; retrying", name, self._backend.topic_url(topic)
        )
        attempt.backoff.sleep(attempt.deadline)

    def _epoch_of_new_writer(self, topic: str, name: str, producer: Any, owner: pulsar.Client | None) -> int:
        """The topic epoch of a producer just created; on failure the producer is released."""
        try:
            return int(self._backend.admin.topic_stats(topic)["topicEpoch"])
        except Exception:
            # The broker may be unreachable right now (that is why the read failed): a close that
            # fails must neither replace the error with a driver's one nor leave our producer behind.
            try:
                producer.close()
            except Exception as exc:
                log.warning(
                    "closing the exclusive producer %r of %s failed: %s", name, self._backend.topic_url(topic), exc
                )
                if owner is None:  # a producer on a client of its own goes with its connection below
                    self._drop_orphan(topic, name, wait=0.0)
            finally:
                shutdown_quietly(owner)
            raise

    def _writer_options(self) -> dict[str, Any]:
        """``create_producer`` options of an exclusive writer (besides name and access mode)."""
        return dict(
            batching_enabled=False,
            chunking_enabled=False,
            block_if_queue_full=True,
            max_pending_messages=10000,
            send_timeout_millis=max(1, int(self._backend.config.operation_timeout * 1000)),
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
            client = pulsar.Client(self._backend.config.url, **client_options(self._backend.config))
        except Exception as exc:  # noqa: BLE001 - the caller polls instead, and reports what it meets
            log.debug("not queueing for %s: %s", self._backend.topic_url(topic), exc)
            return None
        with self._lock:
            if self._closed:
                shutdown_quietly(client)
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
        shutdown_quietly(client)
        if "error" in outcome:
            log.debug("waiting for the writer of %s: %s", self._backend.topic_url(topic), outcome["error"])
        return None

    def _fence(self, topic: str, name: str) -> None:
        """Close every producer of ``topic`` (the broker bumps its epoch): a fencing producer that
        is created and closed at once, never written with. Another candidate may take the topic
        before we do; the caller then fences again or gives up at its deadline."""
        fencer_name = f"{name}-fence"
        try:
            fencer = self._backend.client.create_producer(
                topic,
                producer_name=fencer_name,
                access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing,
                batching_enabled=False,
                send_timeout_millis=max(1, int(self._backend.config.operation_timeout * 1000)),
            )
        except BUSY_ERRORS as exc:  # fenced in turn by a concurrent candidate: the topic was taken over anyway
            log.debug("fencing %s: %s", topic, exc)
            return
        except pulsar.Timeout:  # it may still be created after we gave up (apache/pulsar#25936)
            if not self._drop_orphan(topic, fencer_name, wait=min(self._backend.config.operation_timeout, 2.0)):
                self._orphans.watch(topic, fencer_name)
            return
        except UNREACHABLE_ERRORS as exc:
            raise self._backend._unreachable("fencing the writer of", topic, exc) from exc
        try:
            fencer.close()
        except pulsar.PulsarException as exc:  # fenced meanwhile or already gone: nothing of ours stays
            log.debug("closing the fencing producer of %s: %s", topic, exc)
        log.info("fenced the writer of %s", self._backend.topic_url(topic))

    def _publishers(self, topic: str) -> list[dict[str, Any]]:
        return list(self._backend.admin.topic_stats(topic).get("publishers") or [])

    def _blockers(self, topic: str, name: str) -> str:
        """Who holds the topic, from its admin stats (best effort: for error messages)."""
        try:
            stats = self._backend.admin.topic_stats(topic)
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
                "dropping the orphaned exclusive producer %r of %s (unloading the topic)",
                name,
                self._backend.topic_url(topic),
            )
            self._backend.admin.unload(topic)
            return True
        except Exception as exc:
            log.warning("could not check %s for an orphaned producer %r: %s", self._backend.topic_url(topic), name, exc)
            return False

    def close(self) -> None:
        """End every wait at once (granted nothing) and stop the orphan sweeper."""
        self._orphans.close()  # closing the client drops any orphan: it lives on our connection
        with self._lock:
            self._closed = True
            queued, self._queued = self._queued, set()
        for waiting in queued:
            shutdown_quietly(waiting)
