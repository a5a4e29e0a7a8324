"""The exception hierarchy of the state engine.

Everything the engine raises on purpose derives from :class:`PulsarStateError`, so callers can
catch one root. The subclasses say what went wrong precisely enough to decide what to do next:
retry (:class:`WriterBusyError`, :class:`OperationTimeoutError`), give up on this writer
(:class:`WriterFencedError`), fix the data (:class:`CorruptEntryError`, :class:`SerializationError`)
or fix the configuration (:class:`ConfigurationError`, :class:`BackendUnavailableError`).
"""

from __future__ import annotations

from typing import NamedTuple


class PulsarStateError(Exception):
    """Root of every error raised by airflow_provider_pulsarstate."""


class ConfigurationError(PulsarStateError, ValueError):
    """A connection URL, option or argument is invalid (the message names it)."""


class MissingExtraError(PulsarStateError, ImportError):
    """An optional part was used without its extra installed; the message names the part and
    the ``pip install 'airflow-provider-pulsarstate[...]'`` command that adds it.

    :ivar extra: the extra to install (e.g. ``spark``).
    """

    def __init__(self, message: str, *, extra: str) -> None:
        super().__init__(message)
        self.extra = extra


class AssetURIError(ConfigurationError):
    """A ``pulsar://`` asset URI is not ``pulsar://<tenant>/<namespace>/<topic>``; the message
    names the URI and what is wrong with it.

    :ivar uri: the URI as given.
    """

    def __init__(self, message: str, *, uri: str) -> None:
        super().__init__(message)
        self.uri = uri


class RetentionPolicyError(ConfigurationError):
    """The store would delete a state log (finite retention, or inactive topics deleted) and the
    policy could not be fixed from here. The message names the topic, the setting and the
    ``pulsar-admin`` commands that fix it.

    :ivar topic: the state topic.
    :ivar setting: ``retention`` or ``inactive-topic deletion``.
    """

    def __init__(self, message: str, *, topic: str, setting: str) -> None:
        super().__init__(message)
        self.topic = topic
        self.setting = setting


class LogLostError(PulsarStateError):
    """The log's history is gone: its beginning was deleted, or the topic was recreated under a
    table that existed. Serving the state would serve an empty or partial table, so nothing is
    served; restore the topic (or delete its checkpoint topics to start a new table on purpose).

    :ivar topic: the log topic.
    :ivar found: what was found instead of the expected beginning.
    """

    def __init__(self, *, topic: str, found: str) -> None:
        super().__init__(f"the log of {topic!r} lost its history: {found}")
        self.topic = topic
        self.found = found


class BackendUnavailableError(PulsarStateError):
    """The back end (broker, admin API or state file) could not be reached in time."""


class OperationTimeoutError(PulsarStateError, TimeoutError):
    """A bounded wait ran out (acquiring the writer, catching up, a send)."""


class WriterBusyError(PulsarStateError):
    """Another process holds the exclusive writer of the topic and the caller chose not to wait."""


class WriterFencedError(PulsarStateError):
    """This writer was fenced (a newer epoch took over); it can never append again.

    :ivar topic: the topic whose writer was fenced.
    :ivar epoch: the epoch this writer held.
    """

    def __init__(self, message: str, *, topic: str = "", epoch: int | None = None) -> None:
        super().__init__(message)
        self.topic = topic
        self.epoch = epoch


class WriteId(NamedTuple):
    """Identifies one write: the writing instance's id and the write's sequence number in it.

    Both are stored with the write in the log, which is how an instance finds its own write there.
    """

    writer_id: bytes
    seq: int


class UnknownOutcomeError(PulsarStateError):
    """A write may or may not have reached the log (send time-out, dropped connection, outage).

    A back end raises it for one append; the state manager then looks for the write in the log
    before retrying, so callers see it only when that could not be finished (retries exhausted or
    off, the back end unreachable, or the caller's ``timeout`` ran out while the write was being
    sent). The write is then kept as pending: ask
    :meth:`~airflow_provider_pulsarstate.engine.manager.SharedStateManager.outcome` with
    :attr:`write_id` before sending it again, or it may be applied twice.

    :ivar writer_id: the writing instance's id (16 bytes); None when raised by a back end.
    :ivar seq: the write's sequence number in that instance; None when raised by a back end.
    """

    def __init__(self, message: str, *, writer_id: bytes | None = None, seq: int | None = None) -> None:
        super().__init__(message)
        self.writer_id = writer_id
        self.seq = seq

    @property
    def write_id(self) -> WriteId | None:
        """``WriteId(writer_id, seq)``, or None when the error does not name one write."""
        if self.writer_id is None or self.seq is None:
            return None
        return WriteId(self.writer_id, self.seq)


class CorruptEntryError(PulsarStateError):
    """A log entry could not be decoded or applied, or a frame claims an epoch the back end never granted.

    :ivar topic: the topic holding the entry.
    :ivar position: where it is (an offset, or the back end's position when no offset is known).
    :ivar cause: why it was rejected.
    :ivar epoch: the epoch the frame claims, when that is what is wrong with it (else None).
    """

    def __init__(self, *, topic: str, position: object, cause: str, epoch: int | None = None) -> None:
        super().__init__(f"corrupt entry in topic {topic!r} at {position}: {cause}")
        self.topic = topic
        self.position = position
        self.cause = cause
        self.epoch = epoch


class CheckpointError(PulsarStateError):
    """A checkpoint could not be written or loaded (missing, incomplete, or failing its checksum).

    Loading never depends on it: the state manager logs the error and replays the log instead.

    :ivar topic: the log topic the checkpoint belongs to.
    :ivar cause: what is wrong with it.
    """

    def __init__(self, *, topic: str, cause: str) -> None:
        super().__init__(f"checkpoint of topic {topic!r}: {cause}")
        self.topic = topic
        self.cause = cause


class SerializationError(PulsarStateError, ValueError):
    """A key, value or op could not be serialized; nothing was appended."""


class ValueTooLargeError(SerializationError):
    """A serialized value exceeds the configured limit; nothing was appended."""


class ClosedError(PulsarStateError):
    """The object was closed and cannot be used any more."""


class ViewError(PulsarStateError):
    """Base of the temp-view errors."""


class ViewNotFoundError(ViewError, KeyError):
    """No view with that id exists on the table (never created, or expired and forgotten)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ViewClosedError(ViewError):
    """The view was dropped or expired: it can no longer be staged into or applied."""


class ViewConflictError(ViewError):
    """The table changed since the view's baseline in keys the diff touches.

    :ivar keys: the conflicting keys (sorted). Apply again with ``overwrite=True`` to publish
        anyway, or recreate the view from the new state.
    """

    def __init__(self, message: str, *, keys: list[str]) -> None:
        super().__init__(message)
        self.keys = keys


class ViewScopeError(ViewError, ValueError):
    """A staged key lies outside the view's scope; nothing was published."""


class ViewGuardError(ViewError):
    """Apply stopped by a safety limit (``max_deletes``); nothing was published.

    :ivar deletes: how many deletes the diff would have published.
    """

    def __init__(self, message: str, *, deletes: int) -> None:
        super().__init__(message)
        self.deletes = deletes


class UnknownScopePredicateError(ConfigurationError):
    """A view names a scope predicate that is not registered in this process.

    Predicates are code: they are registered by name with
    :func:`~airflow_provider_pulsarstate.engine.recipes.table.register_scope_predicate`; the log only
    records the name, and nothing named in a log is ever imported.
    """


class ViewStagedRowError(ViewError, ValueError):
    """A row in a view's staging topic is malformed (bad frame, key, kind or value); nothing was published."""


class ViewNotSealedError(ViewError):
    """Apply refused a view that was not sealed (its producer never recorded what it staged)."""


class ViewSealMismatchError(ViewError):
    """The rows in the staging topic do not match the counts the seal recorded; nothing was published."""


class SourceOffsetsConflictError(ViewError):
    """A view consumed a source range that does not start where the table's record ends.

    The view says it consumed ``[start, next)`` of a source partition, but the table records
    ``recorded`` as that partition's next offset: another run consumed (or skipped) that range
    already, and applying the view would count those messages twice (or lose some). Nothing was
    published; recompute the view from the table's recorded offsets.

    :ivar topic, partition: the source partition.
    :ivar start: where the view's range starts.
    :ivar recorded: the table's recorded next offset (None: the table records none).
    """

    def __init__(self, message: str, *, topic: str, partition: int, start: int, recorded: int | None) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.start = start
        self.recorded = recorded


class OffsetError(PulsarStateError):
    """Base of the pull consumer's errors (offsets, partitions, the broker's offset index)."""


class OffsetOutOfRangeError(OffsetError, IndexError):
    """An offset outside the retained range [beginning, end] of a partition, with no reset chosen.

    Nothing was read or committed. ``beginning`` and ``end`` are the partition's range when raised.
    """

    def __init__(self, message: str, *, topic: str, partition: int, offset: int, beginning: int, end: int) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.beginning = beginning
        self.end = end


class OffsetIndexUnavailableError(OffsetError, ConfigurationError):
    """The broker gives no offset index for the topic (its entry-metadata interceptor is off, or the
    entries predate it). The message names the broker settings that turn it on."""


class UnknownTopicError(OffsetError, KeyError):
    """The topic does not exist (asking never creates it)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownPartitionError(OffsetError, KeyError):
    """A partition the topic does not have, or a partitioned topic used without a partition."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class MessageNotFoundError(OffsetError, KeyError):
    """No message at an address (never written there, its topic deleted, or trimmed by retention).

    :ivar topic: the topic; :ivar address: the address asked for.
    """

    def __init__(self, message: str, *, topic: str, address: str) -> None:
        super().__init__(message)
        self.topic = topic
        self.address = address

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class LeaseError(PulsarStateError):
    """Base of the lease and leadership errors (:mod:`~airflow_provider_pulsarstate.engine.recipes.lease`)."""


class LeaseFencedError(LeaseError):
    """A write carried a lease token lower than one the state log has already seen for that lease.

    The holder was superseded (a newer holder acquired the lease and wrote). Nothing of the write
    was applied, now or ever: every replica ignores such a write on replay too.

    :ivar topic: the state log that refused the write.
    :ivar lease: the lease name.
    :ivar token: the token the write carried.
    :ivar newer_token: the highest token the log has seen for that lease.
    """

    def __init__(self, *, topic: str, lease: str, token: int, newer_token: int) -> None:
        super().__init__(
            f"write to {topic} under lease {lease!r} with fencing token {token} refused: the log has seen "
            f"token {newer_token} of that lease (a newer holder took over); nothing was applied"
        )
        self.topic = topic
        self.lease = lease
        self.token = token
        self.newer_token = newer_token


class LeaseLostError(LeaseError):
    """The lease is no longer held under this token (released, or taken over by another holder).

    :ivar lease: the lease name.
    :ivar token: the token the caller holds.
    :ivar current: what the lease log says now (a ``LeaseInfo``), or None when the lease never existed.
    """

    def __init__(self, message: str, *, lease: str, token: int, current: object = None) -> None:
        super().__init__(message)
        self.lease = lease
        self.token = token
        self.current = current


class LeaseTimeoutError(LeaseError, OperationTimeoutError):
    """``acquire`` did not win the lease within its timeout (another holder kept it valid).

    :ivar lease: the lease name.
    :ivar current: the holder's ``LeaseInfo`` as last observed.
    """

    def __init__(self, message: str, *, lease: str, current: object = None) -> None:
        super().__init__(message)
        self.lease = lease
        self.current = current


class LeadershipError(PulsarStateError):
    """Leadership of a topic could not be observed (unknown topic or partition, admin API refused)."""


# ---------------------------------------------------------------------------------- XCom
class XComError(PulsarStateError):
    """Base of the XCom store's errors (engine/recipes/xcom_store.py and the XCom backend)."""


class XComEntryNotFoundError(XComError, KeyError):
    """A reference names an XCom entry the map does not hold (purged, cleaned up, or never written).

    :ivar key: the map key; :ivar topic: the map's topic.
    """

    def __init__(self, message: str, *, key: str, topic: str) -> None:
        super().__init__(message)
        self.key = key
        self.topic = topic

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class XComReferenceError(XComError, ValueError):
    """A stored reference is malformed or points outside this store (another topic or key namespace)."""


class XComValueTooLargeError(XComError, ValueTooLargeError):
    """An XCom value is over ``[pulsarstate] xcom_max_value_bytes`` and ``xcom_oversize`` is ``error``.

    :ivar size: the serialized size in bytes; :ivar limit: the configured limit.
    """

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class XComStoreUnavailableError(XComError):
    """The XCom map could not be read or written (broker or file unreachable, time-out); the
    message names the topic and the key. The value was not stored anywhere else."""


# ---------------------------------------------------------------- table feeds (StateChangeTrigger)
class TableFeedError(PulsarStateError):
    """Base of the table feed's errors (:mod:`~airflow_provider_pulsarstate.engine.recipes.table_feed`)."""


class TableNotFoundError(TableFeedError, KeyError):
    """The table's log holds nothing: the topic does not exist or no one ever wrote to the table.

    :ivar topic: the table's topic.
    """

    def __init__(self, *, topic: str) -> None:
        super().__init__(
            f"table {topic!r} does not exist: its log is empty (no topic, or nothing was ever written to it)"
        )
        self.topic = topic

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CommitNotFoundError(TableFeedError, KeyError):
    """An offset that is not a commit of the table: past its last commit, negative, or a record
    whose writes were all refused (fenced) or skipped as corrupt.

    :ivar topic: the table's topic.
    :ivar offset: the offset asked for.
    :ivar last_offset: the table's last commit offset when it was looked up (-1: none).
    """

    def __init__(self, message: str, *, topic: str, offset: int, last_offset: int) -> None:
        super().__init__(message)
        self.topic = topic
        self.offset = offset
        self.last_offset = last_offset

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class LeaseNotGrantedError(LeaseFencedError):
    """A write carried a fencing token its lease log never granted (a forged or foreign handle).

    Nothing was queued or appended. A subclass of :class:`LeaseFencedError`: either way the
    write must not happen under this handle.

    :ivar topic: the state log the write was meant for.
    :ivar lease: the lease name.
    :ivar token: the token the write carried.
    :ivar lease_log: the lease log the handle names.
    :ivar granted: the last token that lease log granted for the name (0: none).
    """

    def __init__(self, *, topic: str, lease: str, token: int, lease_log: str, granted: int) -> None:
        LeaseError.__init__(
            self,
            f"write to {topic} under lease {lease!r} with fencing token {token} refused: lease log {lease_log} "
            f"never granted that token (the last token it granted for {lease!r} is {granted}); nothing was applied",
        )
        self.topic = topic
        self.lease = lease
        self.token = token
        self.newer_token = granted
        self.lease_log = lease_log
        self.granted = granted
