"""The manager's counters, as a typed record that still reads like the mapping it replaced."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields


@dataclass(slots=True)
class ManagerStats:
    """What a :class:`~airflow_provider_pulsarstate.engine.manager.SharedStateManager` did so far.

    Read a counter as an attribute (``stats.retries``) or by name (``stats["retries"]``);
    ``dict(stats)`` copies them all.
    """

    records_appended: int = 0
    writes_committed: int = 0
    acquisitions: int = 0
    rebuilds: int = 0
    retries: int = 0
    records_replayed: int = 0
    checkpoints_written: int = 0
    checkpoint_loaded_offset: int = -1
    corrupt_skipped: int = 0
    fenced_skipped: int = 0
    unknown_outcomes: int = 0
    listener_errors: int = 0
    follower_errors: int = 0
    committer_errors: int = 0
    handovers: int = 0

    def keys(self) -> list[str]:
        """The counters' names, in a fixed order."""
        return [f.name for f in fields(self)]

    def __getitem__(self, name: str) -> int:
        if name not in _NAMES:
            raise KeyError(name)
        value: int = getattr(self, name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(_NAMES)

    def as_dict(self) -> dict[str, int]:
        """A copy of every counter."""
        return {name: self[name] for name in self.keys()}


_NAMES = frozenset(ManagerStats().keys())
