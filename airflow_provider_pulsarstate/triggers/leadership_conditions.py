"""What a leadership sensor waits for, evaluated on observed leadership (pure: no I/O, no Airflow).

The sensor's pokes (the hook's blocking read) and the trigger's polls (an async probe) hand the
same plain-JSON observations to :func:`evaluate`, so both modes decide alike. Modes:

* ``leader``: an exclusive producer holds the topic (with ``leader_name``: one of that name);
* ``no_leader``: nobody holds it exclusively;
* ``changed``: the topic epoch grew past ``since_epoch`` (a new exclusive producer took the topic
  since that epoch was seen, whether it still holds it or not); a topic that never had one has
  epoch -1 here;
* ``acquire``: wait until a durable lease is won (no topic leadership is evaluated).

A partitioned topic satisfies a mode only when EVERY partition does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MODES: tuple[str, ...] = ("leader", "no_leader", "changed", "acquire")
OBSERVING_MODES: tuple[str, ...] = ("leader", "no_leader", "changed")


class LeadershipConditionError(ValueError):
    """A mode or its options cannot be evaluated (the message names the option and the value)."""


def check_mode(mode: str, *, leader_name: Any = None, since_epoch: Any = None, lease_name: Any = None) -> None:
    """Raise :class:`LeadershipConditionError` for a mode that cannot work with these options
    (templates are not rendered yet: only their presence is checked)."""
    if mode not in MODES:
        raise LeadershipConditionError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if leader_name is not None and mode != "leader":
        raise LeadershipConditionError(f"leader_name applies to mode 'leader' only, not {mode!r}")
    if mode == "changed" and since_epoch is None:
        raise LeadershipConditionError("mode 'changed' needs since_epoch (the topic epoch seen before)")
    if since_epoch is not None and mode != "changed":
        raise LeadershipConditionError(f"since_epoch applies to mode 'changed' only, not {mode!r}")
    if mode == "acquire" and not lease_name:
        raise LeadershipConditionError("mode 'acquire' needs lease_name")
    if lease_name is not None and mode != "acquire":
        raise LeadershipConditionError(f"lease_name applies to mode 'acquire' only, not {mode!r}")


def parse_since_epoch(value: Any) -> int:
    """``since_epoch`` as given or rendered: an int >= -1 or its text; -1, or the text ``None`` /
    ``null`` (a rendered epoch of a topic nobody ever held), means no leader was ever seen."""
    if isinstance(value, str) and value.strip() in ("None", "null"):
        return -1
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise LeadershipConditionError(f"since_epoch must be an integer >= -1 (a topic epoch), got {value!r}")
    return value


def partition_met(
    seen: Mapping[str, Any], mode: str, *, leader_name: str | None = None, since_epoch: int | None = None
) -> bool:
    """Whether one partition's observation (``Leadership.as_json()``) satisfies ``mode``."""
    held = seen.get("access_mode") is not None
    if mode == "leader":
        return held and (leader_name is None or leader_name in (seen.get("leader"), seen.get("writer_name")))
    if mode == "no_leader":
        return not held
    if mode == "changed":
        assert since_epoch is not None
        epoch = seen.get("epoch")
        return (-1 if epoch is None else int(epoch)) > since_epoch
    raise LeadershipConditionError(f"mode {mode!r} is not evaluated on topic leadership")


def evaluate(
    topic: str,
    mode: str,
    partitions: Sequence[Mapping[str, Any]],
    *,
    leader_name: str | None = None,
    since_epoch: Any = None,
) -> dict[str, Any]:
    """The sensor's answer (its XCom) for one observation of every partition of ``topic``::

        {"topic": ..., "mode": "leader", "leader_name": None, "since_epoch": None, "met": True,
         "partitions": [{"partition": None, "leader": "deployment-a", "access_mode": "Exclusive",
                         "epoch": 3, "waiting_publishers": 0, "other_producers": []}]}

    :raises LeadershipConditionError: a bad mode or since_epoch, or no partition observed.
    """
    check_mode(mode, leader_name=leader_name, since_epoch=since_epoch)
    if mode not in OBSERVING_MODES:
        raise LeadershipConditionError(f"mode {mode!r} is not evaluated on topic leadership")
    since = parse_since_epoch(since_epoch) if mode == "changed" else None
    if not partitions:
        raise LeadershipConditionError(f"{topic}: no partition observed")
    seen = [dict(p) for p in partitions]
    met = all(partition_met(p, mode, leader_name=leader_name, since_epoch=since) for p in seen)
    return {
        "topic": topic,
        "mode": mode,
        "leader_name": leader_name,
        "since_epoch": since,
        "met": met,
        "partitions": seen,
    }


def check_result(result: Any) -> dict[str, Any]:
    """Re-decide a result received from elsewhere (a trigger's event): recomputed from its
    observations, never trusted as a verdict.

    :raises LeadershipConditionError: malformed (names the field).
    """
    if not isinstance(result, Mapping):
        raise LeadershipConditionError(f"expected a dict of observed leadership, got {type(result).__name__}")
    partitions = result.get("partitions")
    if not isinstance(partitions, list) or not all(isinstance(p, Mapping) for p in partitions):
        raise LeadershipConditionError(f"field 'partitions' must be a list of observations, got {partitions!r:.200}")
    for p in partitions:
        for field, kind in (("leader", str), ("access_mode", str), ("epoch", int), ("partition", int)):
            v = p.get(field)
            if v is not None and (isinstance(v, bool) or not isinstance(v, kind)):
                raise LeadershipConditionError(f"field {field!r} must be {kind.__name__} or null, got {v!r}")
    return evaluate(
        str(result.get("topic")),
        str(result.get("mode")),
        partitions,
        leader_name=result.get("leader_name"),
        since_epoch=result.get("since_epoch"),
    )


def table(result: Mapping[str, Any]) -> str:
    """The result as a small table for task logs."""
    want = (
        result["mode"]
        + (f" {result['leader_name']!r}" if result.get("leader_name") else "")
        + (f" since epoch {result['since_epoch']}" if result.get("since_epoch") is not None else "")
    )
    lines = [
        f"{result['topic']}: {want}: {'met' if result['met'] else 'not met'}",
        f"{'partition':>9}  {'leader':<32} {'access mode':<20} {'epoch':>6}  others",
    ]
    for p in result["partitions"]:
        part = "-" if p.get("partition") is None else str(p["partition"])
        lines.append(
            f"{part:>9}  {p.get('leader') or '-'!s:<32} {p.get('access_mode') or '-'!s:<20} "
            f"{'-' if p.get('epoch') is None else p['epoch']:>6}  {', '.join(p.get('other_producers') or []) or '-'}"
        )
    return "\n".join(lines)
