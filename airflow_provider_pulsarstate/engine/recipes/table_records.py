"""The records a :class:`~airflow_provider_pulsarstate.engine.recipes.table.StateTable` hands out.

Row changes (:class:`TableChange`), the source ranges a view consumed (:class:`SourceRange`), and a
view's metadata, plan and result (:class:`ViewInfo`, :class:`ViewPlan`, :class:`ViewResult`). All
frozen: they describe the log, they do not change it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.engine.recipes.scope_predicates import resolve_predicate
from airflow_provider_pulsarstate.engine.recipes.table_ops import Record

__all__ = ["SourceRange", "TableChange", "ViewInfo", "ViewPlan", "ViewResult", "source_ranges"]


@dataclass(frozen=True)
class TableChange:
    """A committed change to the table, as listeners receive it."""

    type: str  # "set" | "delete"
    key: str
    value: Record | None
    view_id: str | None
    offset: int


@dataclass(frozen=True)
class SourceRange:
    """The offsets of one source partition a view consumed: ``[start, next)``.

    ``start`` is where the table's record said to start (:meth:`StateTable.source_offsets`; the
    partition's beginning when the table records none), ``next`` the offset after the last message
    consumed (the end offset snapshot the job read up to).
    """

    topic: str
    partition: int
    start: int
    next: int

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise ConfigurationError(f"source range: topic must be a non-empty str, got {self.topic!r}")
        for name in ("partition", "start", "next"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigurationError(
                    f"source range of {self.topic}: {name} must be a non-negative int, got {value!r}"
                )
        if self.next < self.start:
            raise ConfigurationError(
                f"source range of {self.topic} partition {self.partition}: next {self.next} is below start {self.start}"
            )

    @property
    def count(self) -> int:
        """Offsets in the range (an upper bound of the messages: offsets may skip numbers)."""
        return self.next - self.start

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "start": self.start, "next": self.next}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceRange:
        """The inverse of :meth:`as_dict` (e.g. from a job's result or an XCom).

        :raises ConfigurationError: missing or extra fields, or bad values.
        """
        if not isinstance(data, Mapping) or set(data) != {"topic", "partition", "start", "next"}:
            raise ConfigurationError(f"a source range needs exactly topic, partition, start, next; got {data!r}")
        return cls(data["topic"], data["partition"], data["start"], data["next"])


def source_ranges(topic: str, start: Mapping[int, int], next_offsets: Mapping[int, int]) -> list[SourceRange]:
    """The ranges ``[start[p], next_offsets[p])`` of every partition of ``topic`` (same partitions in both).

    :raises ConfigurationError: the two mappings name different partitions, or a bad range.
    """
    if set(start) != set(next_offsets):
        raise ConfigurationError(
            f"source ranges of {topic}: start offsets name partitions {sorted(start)}, next offsets {sorted(next_offsets)}"
        )
    return [SourceRange(topic, int(p), int(start[p]), int(next_offsets[p])) for p in sorted(start)]


@dataclass(frozen=True)
class ViewInfo:
    """A view's metadata, as recorded in the table's log."""

    view_id: str
    table: str
    baseline: int
    scope_prefix: str | None
    expires_at: float
    status: str  # "open" | "applied" | "dropped"
    staging_topic: str
    result: dict[str, Any] | None = None
    commit_offset: int = -1
    """Offset of the record that applied (or dropped) the view; -1 while open."""
    sealed: dict[str, int] | None = None
    """Stager id -> rows it staged, as recorded by :meth:`StateTable.seal`; None while unsealed."""
    scope_predicate: str | None = None
    """Name of a registered ``(key) -> bool`` (:func:`register_scope_predicate`) that, with ``scope_prefix``, bounds the view."""
    sources: list[SourceRange] = field(default_factory=list)
    """The source ranges the view consumed, as sealed (empty: a view computed from no source)."""

    def in_scope(self) -> Callable[[str], bool]:
        """The view's scope as a predicate on keys (everything when unscoped)."""
        prefix = self.scope_prefix
        predicate = resolve_predicate(self.scope_predicate, view_id=self.view_id) if self.scope_predicate else None
        if prefix and predicate:
            return lambda key: key.startswith(prefix) and bool(predicate(key))
        if prefix:
            return lambda key: key.startswith(prefix)
        if predicate:
            return lambda key: bool(predicate(key))
        return lambda key: True

    def describe_scope(self) -> str:
        parts = [f"prefix {self.scope_prefix!r}"] if self.scope_prefix else []
        parts += [f"predicate {self.scope_predicate!r}"] if self.scope_predicate else []
        return " and ".join(parts) or "the whole table"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ViewPlan:
    """What apply would publish, counted; nothing was published."""

    view_id: str
    set: int
    delete: int
    unchanged: int
    sample_set: list[str] = field(default_factory=list)
    sample_delete: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    source_conflicts: list[str] = field(default_factory=list)
    """Source partitions whose range does not start at the table's recorded offset (apply would refuse)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ViewResult:
    """What apply published, and at which commit offset."""

    view_id: str
    set: int
    delete: int
    unchanged: int
    commit_offset: int
    already_applied: bool = False
    sample_set: list[str] = field(default_factory=list)
    sample_delete: list[str] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)
    """The source ranges published with the diff (:meth:`SourceRange.as_dict` each)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
