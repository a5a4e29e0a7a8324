"""Who holds a topic's exclusive writer, observed without taking it (both back ends).

A topic's leader is its exclusive producer (PIP-68): on Pulsar the publisher whose access mode is
``Exclusive``, ``ExclusiveWithFencing`` or ``WaitForExclusive`` in the topic's admin stats, with
the broker's ``topicEpoch``; on the embedded log the holder of the writer lock of the current
epoch (the name its writer recorded with the epoch). A partitioned topic answers per partition.

* :func:`read_leadership` (blocking) and :func:`open_async_leadership_probe` (for triggers: never
  blocks the event loop) return one :class:`Leadership` per partition.
* :class:`AsyncLeaseObserver` describes durable leases (:mod:`~airflow_provider_pulsarstate.engine.recipes.lease`)
  the same way, for triggers waiting until a lease is free.
* Observing is read-only: nothing is created, taken or changed.

An exclusive producer lives only as long as its connection: this is leadership of one process,
not a lease that spans tasks (see :mod:`~airflow_provider_pulsarstate.engine.recipes.lease`).
"""

from __future__ import annotations

import asyncio
import sqlite3
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_pulsarstate.engine.backends import backend_offers
from airflow_provider_pulsarstate.engine.backends.base import Backend, partition_topic_name, writer_base_name
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError, LeadershipError
from airflow_provider_pulsarstate.engine.turns import take_turn
from airflow_provider_pulsarstate.engine.worker_thread import (
    WorkerThread,
    close_on_shared_backend,
    open_on_shared_backend,
)

EXCLUSIVE_MODES = ("Exclusive", "ExclusiveWithFencing", "WaitForExclusive")
"""Access modes of a producer that holds the topic alone (a promoted WaitForExclusive one included)."""


@dataclass(frozen=True)
class Leadership:
    """The exclusive writer of one topic partition, as observed.

    :ivar topic: the topic (for a partitioned topic, the partitioned topic's name).
    :ivar partition: the partition, or None for a non-partitioned topic.
    :ivar leader: the exclusive producer's name; None when nobody holds the topic exclusively (or,
        embedded, when the holder recorded no name: a file written by an older version). A state
        manager's writer shows as its ``writer_name`` with a per-attempt suffix (``name~1a2b3c4d``):
        :attr:`writer_name` strips it.
    :ivar access_mode: the leader's access mode (None: no leader).
    :ivar epoch: the topic epoch (Pulsar ``topicEpoch``; embedded: the writer epoch); None when no
        exclusive producer ever held it. It grows with every new exclusive producer; on Pulsar it
        does not move when the same producer reconnects.
    :ivar waiting_publishers: producers queued for exclusive access (Pulsar ``WaitForExclusive``;
        an in-memory broker counter, reset on broker restart; always 0 embedded).
    :ivar other_producers: names of the other (non-exclusive) producers connected now.
    """

    topic: str
    partition: int | None
    leader: str | None
    access_mode: str | None
    epoch: int | None
    waiting_publishers: int = 0
    other_producers: tuple[str, ...] = ()

    @property
    def writer_name(self) -> str | None:
        """The leader's name as its owner chose it (:attr:`leader` without the per-attempt suffix)."""
        return writer_base_name(self.leader)

    @property
    def has_leader(self) -> bool:
        """Whether an exclusive producer holds this partition now."""
        return self.access_mode is not None

    def as_json(self) -> dict[str, Any]:
        """A plain-JSON dict (for XCom and trigger events)."""
        return {
            "partition": self.partition,
            "leader": self.leader,
            "writer_name": self.writer_name,
            "access_mode": self.access_mode,
            "epoch": self.epoch,
            "waiting_publishers": self.waiting_publishers,
            "other_producers": list(self.other_producers),
        }

    @classmethod
    def from_json(cls, topic: str, value: Mapping[str, Any]) -> Leadership:
        """Inverse of :meth:`as_json` (types checked: a malformed value raises ValueError/TypeError/KeyError)."""
        partition, epoch = value["partition"], value["epoch"]
        leader, mode = value.get("leader"), value.get("access_mode")
        for field, v, kind in (
            ("partition", partition, int),
            ("epoch", epoch, int),
            ("leader", leader, str),
            ("access_mode", mode, str),
        ):
            if v is not None and (not isinstance(v, kind) or isinstance(v, bool)):
                raise TypeError(f"{field} must be {kind.__name__} or None, got {v!r}")
        others = value.get("other_producers") or []
        if not isinstance(others, list) or not all(isinstance(o, str) for o in others):
            raise TypeError(f"other_producers must be a list of names, got {others!r}")
        return cls(topic, partition, leader, mode, epoch, int(value.get("waiting_publishers") or 0), tuple(others))


def leadership_from_stats(topic: str, partition: int | None, stats: Mapping[str, Any] | None) -> Leadership:
    """A :class:`Leadership` from a Pulsar topic's ``GET .../stats`` answer (None: the partition
    has not been created on the broker yet, so nobody holds it)."""
    if stats is None:
        return Leadership(topic, partition, None, None, None)
    leader = mode = None
    others: list[str] = []
    for publisher in stats.get("publishers") or []:
        name, access = publisher.get("producerName"), publisher.get("accessMode")
        if access in EXCLUSIVE_MODES and mode is None:
            leader, mode = name, access
        else:
            others.append(str(name))
    epoch = stats.get("topicEpoch")
    return Leadership(
        topic,
        partition,
        leader,
        mode,
        None if epoch is None else int(epoch),
        int(stats.get("waitingPublishers") or 0),
        tuple(others),
    )


# -------------------------------------------------------------------------------- blocking
def read_leadership(backend: Backend, topic: str) -> list[Leadership]:
    """The leadership of every partition of ``topic`` (one entry, partition None, when not partitioned).

    :raises LeadershipError: the topic does not exist (named).
    :raises BackendUnavailableError: the broker's admin API or the embedded file cannot be reached.
    """
    return backend.underlying().read_leadership(topic)


def pulsar_leadership(store: Any, topic: str) -> list[Leadership]:
    """:func:`read_leadership` on a Pulsar back end: the admin API's topic stats."""
    admin = store.admin
    count = admin.partition_count(topic)
    if count is None:
        raise LeadershipError(f"topic {store.topic_url(topic)} does not exist: no leadership to observe")
    if count == 0:
        resp = admin.request("GET", f"{admin.topic_path(topic)}/stats", ok=(200, 404))
        if resp.status_code == 404:
            raise LeadershipError(f"topic {store.topic_url(topic)} does not exist: no leadership to observe")
        return [leadership_from_stats(topic, None, resp.json())]
    found = []
    for k in range(count):
        resp = admin.request("GET", f"{admin.topic_path(partition_topic_name(topic, k))}/stats", ok=(200, 404))
        found.append(leadership_from_stats(topic, k, resp.json() if resp.status_code == 200 else None))
    return found


def embedded_leadership(backend: Any, topic: str) -> list[Leadership]:
    """:func:`read_leadership` on the embedded log: the epochs and writer names it records."""
    conn = backend.connect()
    try:
        row = conn.execute("SELECT partitions FROM offset_topics WHERE name = ?", (topic,)).fetchone()
        count = int(row[0]) if row else 0
        if count == 0 and not any(
            conn.execute(f"SELECT 1 FROM {table} WHERE {column} = ? LIMIT 1", (topic,)).fetchone()
            for table, column in (("topics", "name"), ("entries", "topic"), ("offset_topics", "name"))
        ):
            raise LeadershipError(f"topic {backend.topic_url(topic)} does not exist: no leadership to observe")
    except sqlite3.Error as exc:
        raise BackendUnavailableError(f"cannot read {backend.topic_url(topic)}: {exc}") from exc
    finally:
        conn.close()
    parts: list[tuple[int | None, str]] = (
        [(k, partition_topic_name(topic, k)) for k in range(count)] if count else [(None, topic)]
    )
    found = []
    for partition, stored in parts:
        epoch, holder, mode, held = backend.writer_lock(stored)
        found.append(
            Leadership(
                topic,
                partition,
                holder if held else None,
                (mode or "Exclusive") if held else None,
                epoch if epoch > 0 else None,
            )
        )
    return found


# -------------------------------------------------------------------------------- async
class AsyncLeadershipProbe(ABC):
    """Leadership observed without blocking an event loop (one per triggerer task)."""

    @abstractmethod
    async def leadership(self, topic: str) -> list[Leadership]:
        """As :func:`read_leadership`."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections (idempotent)."""


class PulsarAsyncLeadershipProbe(AsyncLeadershipProbe):
    """Topic stats over the running loop's shared admin HTTP client (no I/O before first use);
    ``freshness``: seconds an answer shared with the loop's other probes may have been sent before
    a request (see :class:`~airflow_provider_pulsarstate.engine.backends.admin_async.AsyncPulsarAdmin`)."""

    def __init__(self, config: ConnectionConfig, *, freshness: float = 0.0) -> None:
        from airflow_provider_pulsarstate.engine.backends.admin_async import AsyncPulsarAdmin

        self._admin = AsyncPulsarAdmin(config, what="leadership probe", freshness=freshness)

    async def _stats(self, topic: str) -> dict[str, Any] | None:
        from airflow_provider_pulsarstate.engine.backends.admin import PulsarAdmin

        resp = await self._admin.request("GET", f"{PulsarAdmin.topic_path(topic)}/stats", ok=(200, 404))
        return resp.json() if resp.status_code == 200 else None

    async def leadership(self, topic: str) -> list[Leadership]:
        from airflow_provider_pulsarstate.engine.backends.admin import PulsarAdmin

        where = f"topic {topic} (admin {self._admin.shown_url})"
        resp = await self._admin.request("GET", f"{PulsarAdmin.topic_path(topic)}/partitions", ok=(200, 404))
        if resp.status_code == 404:
            raise LeadershipError(f"{where} does not exist: no leadership to observe")
        count = int(resp.json().get("partitions", 0))
        if count == 0:
            stats = await self._stats(topic)
            if stats is None:
                raise LeadershipError(f"{where} does not exist: no leadership to observe")
            return [leadership_from_stats(topic, None, stats)]
        answers = await asyncio.gather(*(self._stats(partition_topic_name(topic, k)) for k in range(count)))
        return [leadership_from_stats(topic, k, stats) for k, stats in enumerate(answers)]

    async def aclose(self) -> None:
        await self._admin.aclose()


class EmbeddedAsyncLeadershipProbe(AsyncLeadershipProbe):
    """The embedded file read on this probe's own worker thread (never asgiref's shared one)."""

    def __init__(self, config: ConnectionConfig) -> None:
        from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend

        self._worker: WorkerThread[Any] = WorkerThread(
            lambda: EmbeddedBackend(config.embedded_path, busy_timeout=config.operation_timeout),
            lambda backend: backend.close(),
            name="pulsarstate-leadership-probe",
            what="this leadership probe",
            share_key=("leadership-probe", config),  # the back end opens a connection per read: thread-safe
        )

    async def leadership(self, topic: str) -> list[Leadership]:
        return await self._worker.run(lambda backend: embedded_leadership(backend, topic))

    async def aclose(self) -> None:
        await self._worker.aclose()


class AsyncLeaseObserver:
    """:meth:`Leases.describe <airflow_provider_pulsarstate.engine.recipes.lease.Leases.describe>`
    awaited without blocking the event loop: the lease log is read on the process-wide pool of
    :mod:`~airflow_provider_pulsarstate.engine.worker_thread` (never asgiref's shared thread),
    through one Leases replica of the lease log shared by every observer of the process.

    The observers of one lease log on one loop also share their reads of the log: a
    :meth:`describe` is answered after a read up to the tail that started at most ``freshness``
    seconds before it (0, the default: one that started after it); describes made together share
    one read, so N deferred sensors on one lease log cost one read per poll, not N.

    Expiry is measured from when THIS observer first saw the last acquire or renew (the lease
    recipe's challenger rule): a lease found held is reported expired only after a full ttl of
    silence observed here. No I/O before the first :meth:`describe`.

    :param config: the connection.
    :param topic: the lease log (a full topic name).
    :param freshness: seconds a shared read of the log may have started before a describe.
    """

    def __init__(self, config: ConnectionConfig, topic: str, *, freshness: float = 0.0) -> None:
        self.topic = topic
        self._key = ("lease-observer", config, topic)
        self._freshness = max(0.0, float(freshness))
        self._worker: WorkerThread[Any] = WorkerThread(
            lambda: _open_leases(config, topic),
            close_on_shared_backend,
            name="pulsarstate-lease-observer",
            what="this lease observer",
            share_key=self._key,  # one replica of the lease log per process
        )

    async def describe(self, name: str) -> Any:
        """The lease's :class:`~airflow_provider_pulsarstate.engine.recipes.lease.LeaseInfo` as the
        lease log says now (None: never acquired there)."""
        loop = asyncio.get_running_loop()
        reads = _LEASE_READS.setdefault(loop, {})
        held = reads.get(self._key)
        if held is None or (held[0] is not None and loop.time() - held[0] >= self._freshness):
            read = loop.create_task(self._read_to_tail(reads))
            read.add_done_callback(_retrieve)
            held = reads[self._key] = (None, read)
        try:
            await asyncio.shield(held[1])
        except asyncio.CancelledError:
            raise
        except Exception:  # the shared read failed (or its observer closed): this observer reads itself
            return await self._worker.run(lambda opened: opened[0].describe(name, latest=True))
        await take_turn()  # the observers one read answered go on a few per turn of the loop
        return await self._worker.run(lambda opened: opened[0].describe(name, latest=False))

    async def _read_to_tail(self, reads: dict[Any, Any]) -> None:
        task = asyncio.current_task()
        if (held := reads.get(self._key)) is not None and held[1] is task:
            reads[self._key] = (asyncio.get_running_loop().time(), task)  # started: later describes may not join
        try:
            await self._worker.run(lambda opened: opened[0].manager.read(lambda state: None, latest=True))
        except BaseException:
            if (held := reads.get(self._key)) is not None and held[1] is task:
                del reads[self._key]  # a failure serves no later describe
            raise

    async def aclose(self) -> None:
        """Close the lease log reader (idempotent; never waits on a read still running)."""
        await self._worker.aclose()


# event loop -> observer share key -> (loop time the read started, None before; the read)
_LEASE_READS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[Any, tuple[float | None, asyncio.Task[None]]]
] = weakref.WeakKeyDictionary()


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: its waiters raise it (or were all cancelled)


def _open_leases(config: ConnectionConfig, topic: str) -> Any:
    from airflow_provider_pulsarstate.engine.recipes.lease import Leases

    return open_on_shared_backend(
        config, lambda backend: Leases(backend, topic, operation_timeout=config.operation_timeout)
    )


def open_async_leadership_probe(config: ConnectionConfig, *, freshness: float = 0.0) -> AsyncLeadershipProbe:
    """An :class:`AsyncLeadershipProbe` for the back end ``config`` selects (no I/O until first use)."""
    return backend_offers(config).open_async_leadership_probe(config, freshness=freshness)


__all__ = [
    "EXCLUSIVE_MODES",
    "AsyncLeadershipProbe",
    "AsyncLeaseObserver",
    "Leadership",
    "leadership_from_stats",
    "open_async_leadership_probe",
    "read_leadership",
]
