"""The Pulsar back end of the offset contract: offsets are the broker's entry index.

How offsets are found (facts checked on Pulsar 4.2, see :mod:`.pulsar_index`):

* **Start of a pull.** ``getMessageIdByIndex`` gives the entry containing the offset; its headers
  (``HEAD .../ledger/L/entry/E``) give the entry's last offset and message count, so the reader is
  created INCLUSIVE at that entry and the lower offsets of the batch are dropped. The broker answers
  ``-1:-1`` for the first entry and for trimmed offsets: the beginning offset tells them apart
  (below it: :class:`OffsetOutOfRangeError`, never a silent restart). Past the tail it answers
  404: a pull at the end offset waits on a reader placed at the last entry and returns nothing.
* **Offsets of what a reader returns.** The client exposes no index on a Message: an entry that
  directly follows the previous one in the same ledger starts at the previous entry's last offset
  + 1 and holds ``batch_size`` messages (read from the serialized MessageId); any other entry
  (first of a ledger, after a skipped system or chunk entry) has its headers fetched.
* **Reader pool.** Per partition, a bounded LRU of readers keyed by the next offset each would
  return: a caller continuing where it stopped reuses one; idle ones are closed after
  ``reader_idle_timeout`` (checked on every call). Readers are created without holding a lock.
  A bounded offset-to-entry cache per partition saves index look-ups. Like Kafka's fetch buffer,
  a pooled reader may still hand out messages it received before retention trimmed them; a new
  reader never starts below the beginning offset.
* **End offset of a pull.** Exact when the pull reached the tail; otherwise the end offset read
  at most ``END_TTL`` seconds earlier by this log (never below the pull's ``next_offset``).
* **Commits.** The committed offset (the next to consume) is stored exactly in the subscription's
  properties (``pulsarstate.next-offset``, durable on return, may move backwards), written before
  the cursor is moved with ``resetcursor``: every entry wholly below it is acknowledged; the entry
  holding it is acknowledged from the committed message on only while the topic stays loaded
  (the broker keeps a batch-index reset in memory), so after an unload a plain consumer may get the
  lower messages of that one batch again. A message at or after the committed offset is never
  acknowledged. No consumer is created: nothing is prefetched and left unread.
"""

from __future__ import annotations

import base64
from typing import Any

import pulsar

from airflow_provider_pulsarstate.engine.backends.base import partition_topic_name
from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend, unique_subscription
from airflow_provider_pulsarstate.engine.errors import MessageNotFoundError
from airflow_provider_pulsarstate.engine.offsets.base import OffsetLog, PulledMessage, StoredMessage, parse_address
from airflow_provider_pulsarstate.engine.offsets.checks import NOTHING_THERE, message_not_found, not_an_address
from airflow_provider_pulsarstate.engine.offsets.pulsar_commits import SubscriptionCommits
from airflow_provider_pulsarstate.engine.offsets.pulsar_fetch import Fetcher
from airflow_provider_pulsarstate.engine.offsets.pulsar_http import PULSAR_ADDRESS, PULSAR_ADDRESS_FORM
from airflow_provider_pulsarstate.engine.offsets.pulsar_positions import PositionIndex
from airflow_provider_pulsarstate.engine.offsets.pulsar_publisher import (
    PulsarTopicPublisher,
    close_quietly,
    create_pulsar_topic,
    delete_pulsar_topic_if_last,
)
from airflow_provider_pulsarstate.engine.offsets.pulsar_readers import ReaderPool
from airflow_provider_pulsarstate.engine.offsets.pulsar_time import offset_for_time


class PulsarOffsetLog(OffsetLog):
    """One Pulsar topic addressed by the broker's entry index (see the module docstring).

    A façade over its parts, one job each: :class:`~.pulsar_positions.PositionIndex` (partitions,
    beginning and end offsets, the entry holding an offset, and their caches),
    :class:`~.pulsar_readers.ReaderPool` (pooled readers, and the log's open/closed state),
    :class:`~.pulsar_fetch.Fetcher` (pulls), :class:`~.pulsar_commits.SubscriptionCommits`
    (committed offsets) and :mod:`.pulsar_time` (offsets by publish time).

    :param backend: an open :class:`PulsarBackend` (its client and admin API are used, not closed).
    :param topic: the full topic name.
    :param reader_pool_size: readers kept per partition.
    :param reader_idle_timeout: seconds an unused pooled reader is kept.
    :param position_cache_size: offset-to-entry answers kept per partition.
    """

    def __init__(
        self,
        backend: PulsarBackend,
        topic: str,
        *,
        reader_pool_size: int = 8,
        reader_idle_timeout: float = 300.0,
        position_cache_size: int = 1000,
        **unknown: Any,
    ) -> None:
        super().__init__(
            topic,
            {
                "reader_pool_size": reader_pool_size,
                "reader_idle_timeout": reader_idle_timeout,
                "position_cache_size": position_cache_size,
                **unknown,
            },
        )
        self._backend = backend
        self._pool = ReaderPool(topic, pool_size=reader_pool_size, idle_timeout=reader_idle_timeout)
        self._index = PositionIndex(backend, topic, check_open=self._pool.check_open, cache_size=position_cache_size)
        self._fetcher = Fetcher(backend, topic, self._index, self._pool)
        self._commits = SubscriptionCommits(backend, topic, self._index)

    def __repr__(self) -> str:
        return f"PulsarOffsetLog({self.topic!r})"

    @property
    def readers_created(self) -> int:
        """How many readers this log created (pool reuse shows as a count that does not grow)."""
        return self._pool.readers_created

    def pooled_readers(self) -> dict[int, list[int]]:
        """The pooled readers' next offsets per partition (oldest first), for tests and debugging."""
        return self._pool.pooled()

    def open_readers(self) -> int:
        """Readers this log holds open (pooled or in use)."""
        return self._pool.open_count()

    # -- the back end's part of the offset contract (arguments checked by the base class) ------
    def _partition_count(self) -> int:
        return self._index.partition_count()

    def _beginning_offset(self, partition: int) -> int:
        return self._index.beginning(partition)

    def _end_offset(self, partition: int) -> int:
        return self._index.end(partition)

    def _read(
        self, partition: int, offset: int, *, max_messages: int, max_bytes: int, timeout: float
    ) -> tuple[list[PulledMessage], int]:
        return self._fetcher.pull(partition, offset, max_messages=max_messages, max_bytes=max_bytes, timeout=timeout)

    def _offset_for_time(self, partition: int, timestamp: float) -> int | None:
        return offset_for_time(self._index, self.read, partition, timestamp)

    def _commit_at(self, subscription: str, partition: int, next_offset: int) -> None:
        self._commits.commit_at(subscription, partition, next_offset)

    def _committed(self, subscription: str, partition: int) -> int | None:
        return self._commits.committed(subscription, partition)

    def _read_at(self, address: str, *, timeout: float) -> StoredMessage:
        """A short-lived reader placed inclusively at the message id (no index look-up, nothing
        before it is read); an id nothing is at answers at once (the reader's tail check), not
        after ``timeout``."""
        wanted = _message_id_of(address)
        partition = wanted.partition()
        pt = partition_topic_name(self.topic, partition) if partition >= 0 else self.topic
        where = (int(wanted.ledger_id()), int(wanted.entry_id()), int(wanted.batch_index()))
        self._check_open()
        try:
            reader = self._backend.client.create_reader(
                pt, wanted, start_message_id_inclusive=True, receiver_queue_size=1, **unique_subscription()
            )
        except pulsar.PulsarException as exc:
            raise self._backend._unreachable("creating a reader of", pt, exc) from exc
        try:
            if not reader.has_message_available():
                raise self._not_found(address, pt, NOTHING_THERE)
            msg = reader.read_next(max(1, int(timeout * 1000)))
        except pulsar.Timeout as exc:
            raise self._not_found(address, pt, f"nothing arrived within {timeout:.1f}s") from exc
        except pulsar.PulsarException as exc:
            raise self._backend._unreachable("reading", pt, exc) from exc
        finally:
            close_quietly(reader)
        got = msg.message_id()
        if (got.ledger_id(), got.entry_id()) != where[:2] or (where[2] >= 0 and got.batch_index() != where[2]):
            raise self._not_found(address, pt, f"the message there is gone (read {got} instead: trimmed?)")
        return StoredMessage(address, msg.data(), dict(msg.properties()), msg.publish_timestamp() / 1000.0)

    def _not_found(self, address: str, pt: str, why: str) -> MessageNotFoundError:
        return message_not_found(self.topic, address, self._backend.topic_url(pt), why)

    # -- lifecycle ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        self._pool.check_open()

    def close(self) -> None:
        if self._pool.close():
            self._index.clear()


def _message_id_of(address: str) -> Any:
    parsed = parse_address(address, PULSAR_ADDRESS)
    try:
        if parsed is None:
            raise ValueError("not p:<partition>:<base64>")
        return pulsar.MessageId.deserialize(base64.b64decode(parsed[1], validate=True))
    except Exception as exc:
        raise not_an_address(address, "Pulsar", PULSAR_ADDRESS_FORM) from exc


__all__ = ["PulsarOffsetLog", "PulsarTopicPublisher", "create_pulsar_topic", "delete_pulsar_topic_if_last"]
