"""The exception hierarchy of the state engine.

Everything the engine raises on purpose derives from :class:`PulsarStateError`, so callers can
catch one root. The subclasses say what went wrong precisely enough to decide what to do next:
retry (:class:`WriterBusyError`, :class:`OperationTimeoutError`), give up on this writer
(:class:`WriterFencedError`), fix the data (:class:`CorruptEntryError`, :class:`SerializationError`)
or fix the configuration (:class:`ConfigurationError`, :class:`BackendUnavailableError`).
"""

from __future__ import annotations


class PulsarStateError(Exception):
    """Root of every error raised by airflow_provider_pulsarstate."""


class ConfigurationError(PulsarStateError, ValueError):
    """A connection URL, option or argument is invalid (the message names it)."""


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


class UnknownOutcomeError(PulsarStateError):
    """An append may or may not have reached the log (send time-out, dropped connection).

    The engine resolves this itself by looking for the write's (writer id, sequence) in the log
    before retrying; it only surfaces when the caller asked for no retries.
    """


class CorruptEntryError(PulsarStateError):
    """A log entry could not be decoded or applied.

    :ivar topic: the topic holding the entry.
    :ivar position: where it is (an offset, or the back end's position when no offset is known).
    :ivar cause: why it was rejected.
    """

    def __init__(self, *, topic: str, position: object, cause: str) -> None:
        super().__init__(f"corrupt entry in topic {topic!r} at {position}: {cause}")
        self.topic = topic
        self.position = position
        self.cause = cause


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
