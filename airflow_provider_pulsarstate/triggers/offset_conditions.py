"""What an offset sensor waits for, evaluated on observed offsets (pure: no I/O, no Airflow).

The sensor's pokes and the trigger's polls read offsets differently (a pull consumer, an async
probe) and hand them to :func:`evaluate`, so both modes decide alike. Conditions:

* ``end_offset``: the topic's end offset (last + 1) reaches ``target``;
* ``committed``: the subscription's committed offset (next to consume) reaches ``target``
  (a partition that never committed counts as 0);
* ``lag``: end - committed falls to ``target`` or below (a partition that never committed lags
  by its end offset: everything it ever held);
* ``new_messages``: at least ``target`` messages arrived since the watermark (per partition,
  ``end - watermark``; a partition missing from the watermark counts from 0).

With ``per_partition=False`` the condition is on the sum over partitions; with ``per_partition``
every partition must meet it (an int target), or each partition a dict target names
(``{"0": 120, "3": 80}``). Offsets cross XCom and trigger kwargs as JSON: partitions are string keys.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Condition = Literal["end_offset", "committed", "lag", "new_messages"]
CONDITIONS: tuple[str, ...] = ("end_offset", "committed", "lag", "new_messages")
NEEDS_SUBSCRIPTION = frozenset({"committed", "lag"})

Target = int | dict[int, int]


class ProgressError(ValueError):
    """A target, a watermark or the observed offsets cannot be evaluated (the message names why)."""


def check_condition(condition: str, *, subscription: str | None, per_partition: bool) -> None:
    """Raise :class:`ProgressError` for a condition that cannot be evaluated with these options."""
    if condition not in CONDITIONS:
        raise ProgressError(f"condition must be one of {', '.join(CONDITIONS)}, got {condition!r}")
    if condition in NEEDS_SUBSCRIPTION and not subscription:
        raise ProgressError(f"condition {condition!r} needs a subscription")
    if condition == "new_messages" and per_partition:
        raise ProgressError(
            "condition 'new_messages' counts messages over all partitions: per_partition is not supported"
        )


def _non_negative_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            return int(value.strip())
        raise ProgressError(f"{what} must be a non-negative integer, got {value!r}")
    if value < 0:
        raise ProgressError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def _partition_key(key: Any, what: str) -> int:
    if isinstance(key, bool):
        raise ProgressError(f"{what}: partition {key!r} is not a partition number")
    try:
        partition = int(key)
    except (TypeError, ValueError):
        raise ProgressError(f"{what}: partition {key!r} is not a partition number") from None
    if partition < 0 or str(partition) != str(key).strip():
        raise ProgressError(f"{what}: partition {key!r} is not a partition number")
    return partition


def parse_offsets(value: Any, what: str) -> dict[int, int]:
    """``{partition: offset}`` from a dict with int or numeric-string keys (as JSON gives them)."""
    if not isinstance(value, Mapping):
        raise ProgressError(f"{what} must be a dict of partition -> offset, got {type(value).__name__} {value!r}")
    return {_partition_key(k, what): _non_negative_int(v, f"{what}, partition {k}") for k, v in value.items()}


def parse_target(value: Any, *, what: str = "target") -> Target:
    """A target as given: an int, a dict of partition -> int, or their text (a rendered template:
    ``"120"``, JSON ``{"0": 120}`` or a Python dict literal; literals only, nothing is run).

    :raises ProgressError: anything else, naming the value.
    """
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ProgressError(f"{what} is empty (did the template or XCom render to nothing?)")
        if text.lstrip("-").isdigit():
            return _non_negative_int(int(text), what)
        try:
            value = json.loads(text)
        except ValueError:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise ProgressError(
                    f"{what} {value!r} is neither an integer nor a dict of partition -> offset"
                ) from None
    if isinstance(value, Mapping):
        parsed = parse_offsets(value, what)
        if not parsed:
            raise ProgressError(f"{what} names no partition")
        return parsed
    return _non_negative_int(value, what)


def target_json(target: Target) -> int | dict[str, int]:
    """The target in its JSON form (string partition keys)."""
    return target if isinstance(target, int) else {str(p): t for p, t in sorted(target.items())}


def offsets_json(offsets: Mapping[int, int | None]) -> dict[str, int | None]:
    return {str(p): o for p, o in sorted(offsets.items())}


@dataclass(frozen=True)
class Progress:
    """One evaluation: whether the condition holds, and the numbers behind it.

    :ivar values: per partition, the quantity compared (end, committed, lag or new messages).
    :ivar total: the sum of ``values``.
    """

    topic: str
    condition: str
    target: Target
    per_partition: bool
    met: bool
    end_offsets: dict[int, int]
    committed: dict[int, int | None] | None
    watermark: dict[int, int] | None
    values: dict[int, int]
    total: int

    def as_xcom(self) -> dict[str, Any]:
        """The small JSON dict the sensor returns (partition keys are strings)."""
        out: dict[str, Any] = {
            "topic": self.topic,
            "condition": self.condition,
            "target": target_json(self.target),
            "per_partition": self.per_partition,
            "met": self.met,
            "end_offsets": offsets_json(self.end_offsets),
            "value": self.total,
        }
        if self.committed is not None:
            out["committed"] = offsets_json(self.committed)
        if self.watermark is not None:
            out["watermark"] = offsets_json(self.watermark)
        return out

    def table(self) -> str:
        """A concise table: partition / end / committed / value / target."""
        verb = {"end_offset": ">=", "committed": ">=", "lag": "<=", "new_messages": ">="}[self.condition]
        scope = "each partition" if self.per_partition else "total"
        lines = [
            f"{self.topic}: {self.condition} {verb} {target_json(self.target)} ({scope}): "
            f"{'met' if self.met else 'not met'}",
            f"  {'partition':<10}{'end':>12}{'committed':>12}{self.condition:>14}{'target':>10}",
        ]

        def cell(value: int | None) -> str:
            return "-" if value is None else str(value)

        for p in sorted(self.end_offsets):
            committed = self.committed.get(p) if self.committed is not None else None
            if isinstance(self.target, dict):
                target = self.target.get(p)
            else:
                target = self.target if self.per_partition else None
            lines.append(
                f"  {p:<10}{self.end_offsets[p]:>12}{cell(committed):>12}{self.values[p]:>14}{cell(target):>10}"
            )
        if not self.per_partition:
            lines.append(f"  {'total':<10}{'':>12}{'':>12}{self.total:>14}{cell(self.target):>10}")  # type: ignore[arg-type]
        return "\n".join(lines)


def evaluate(
    *,
    topic: str,
    condition: str,
    target: Target,
    end_offsets: Mapping[int, int],
    committed: Mapping[int, int | None] | None = None,
    watermark: Mapping[int, int] | None = None,
    per_partition: bool = False,
) -> Progress:
    """Decide whether ``condition`` holds for the observed offsets.

    :raises ProgressError: a dict target names a partition the topic does not have, a dict target
        without ``per_partition``... (see the module docstring), a committed offset is missing for
        ``committed``/``lag``, or a watermark lies past a partition's end offset (the topic was
        deleted and recreated, or the watermark belongs to another topic).
    """
    if not end_offsets:
        raise ProgressError(f"topic {topic} reported no partitions")
    partitions = sorted(end_offsets)
    if isinstance(target, dict):
        _check_target_partitions(topic, target, partitions)
        per_partition = True
    if condition in NEEDS_SUBSCRIPTION and committed is None:
        raise ProgressError(f"condition {condition!r} needs the committed offsets")
    values = {
        p: _partition_value(condition, topic, p, end_offsets[p], committed=committed, watermark=watermark)
        for p in partitions
    }
    total = sum(values.values())
    met = _met(condition, target, values, total, per_partition=per_partition)
    return Progress(
        topic=topic,
        condition=condition,
        target=target,
        per_partition=per_partition,
        met=met,
        end_offsets=dict(end_offsets),
        committed=dict(committed) if committed is not None else None,
        watermark=dict(watermark) if watermark is not None else None,
        values=values,
        total=total,
    )


def _check_target_partitions(topic: str, target: dict[int, int], partitions: list[int]) -> None:
    """A dict target names only partitions the topic has."""
    unknown = sorted(set(target) - set(partitions))
    if unknown:
        raise ProgressError(
            f"target names partition(s) {unknown} but topic {topic} has partitions {partitions[0]}..{partitions[-1]}"
        )


def _partition_value(
    condition: str,
    topic: str,
    partition: int,
    end: int,
    *,
    committed: Mapping[int, int | None] | None,
    watermark: Mapping[int, int] | None,
) -> int:
    """The quantity ``condition`` compares for one partition: end, committed, lag or new messages.

    :raises ProgressError: the watermark lies past the partition's end offset.
    """
    if condition == "end_offset":
        return end
    if condition == "committed":
        return (committed or {}).get(partition) or 0
    if condition == "lag":
        return max(0, end - ((committed or {}).get(partition) or 0))
    mark = (watermark or {}).get(partition, 0)
    if mark > end:
        raise ProgressError(
            f"the watermark of {topic} partition {partition} is {mark}, past its end offset {end}: the topic was "
            "recreated or truncated, or the watermark tracks another topic; reset the watermark"
        )
    return end - mark


def _met(condition: str, target: Target, values: dict[int, int], total: int, *, per_partition: bool) -> bool:
    """Whether the values meet the target: each named partition (dict target), every partition
    (``per_partition``), or their total; ``lag`` must fall to the bound, the others reach it."""

    def holds(value: int, bound: int) -> bool:
        return value <= bound if condition == "lag" else value >= bound

    if isinstance(target, dict):
        return all(holds(values[p], t) for p, t in target.items())
    if per_partition:
        return all(holds(value, target) for value in values.values())
    return holds(total, target)
