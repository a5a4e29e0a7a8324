"""What the metadata DB keeps for an XCom value: the reference's encoding, and its checks.

A row holds a reference (a dict under :data:`REFERENCE_MARKER`: version, topic, key and, for a
message, its address and writer id), or a value kept in the DB wrapped under
:data:`DB_VALUE_MARKER`, so that no stored value can be taken for a reference.

Guarantees: a reference is followed only after :func:`checked_target` found that it names this
deployment's store, the topic its own row gives, and the row Airflow was asked for; nothing in a
reference is imported or executed.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, TypeGuard

from airflow_provider_pulsarstate.engine.errors import XComReferenceError
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook, XComStore, message_topic, run_topic
from airflow_provider_pulsarstate.provider_settings import LEGACY_KEY_NAMESPACE, ProviderSettings
from airflow_provider_pulsarstate.xcom.run_stores import get_store

REFERENCE_MARKER = "__pulsarstate_xcom__"
REFERENCE_VERSION = 3
"""References to an immutable message of the run's topic (``xcom_layout = messages``)."""
MAP_REFERENCE_VERSION = 2
"""References to an entry of the run's map (``xcom_layout = map``)."""
LEGACY_REFERENCE_VERSION = 1
"""References of the earlier layout: one map for the whole deployment (still read, never written)."""
_VERSIONS = (REFERENCE_VERSION, MAP_REFERENCE_VERSION, LEGACY_REFERENCE_VERSION)
DB_VALUE_MARKER = "__pulsarstate_db_value__"
"""Wraps a value kept in the metadata DB, so that no stored value can look like a reference."""

Identity = tuple[str, str, str, int, str]
"""``(dag_id, run_id, task_id, map_index, key)`` of an XCom row."""


def in_db(serialized: Any) -> dict[str, Any]:
    """A serialized value as the row that keeps it in the metadata DB."""
    return {DB_VALUE_MARKER: 1, "value": serialized}


def kept_in_db(value: Any) -> TypeGuard[dict[str, Any]]:
    """Whether a row's value is one :func:`in_db` wrapped."""
    return isinstance(value, dict) and set(value) == {DB_VALUE_MARKER, "value"} and value[DB_VALUE_MARKER] == 1


def is_reference(value: Any) -> TypeGuard[dict[str, Any]]:
    """Whether a row's value is a reference (checked only when followed)."""
    return isinstance(value, dict) and REFERENCE_MARKER in value


def reference(version: int, topic: str, map_key: str, record: Any, **located: str) -> dict[str, Any]:
    """The reference the metadata DB keeps for a stored value: where it is (``located``: a
    message's address and writer), then the record's size, type and write time."""
    return {
        REFERENCE_MARKER: version,
        "topic": topic,
        "key": map_key,
        **located,
        "size": record.size,
        "type": record.type_name,
        "written_at": datetime.datetime.fromtimestamp(record.written_at, datetime.timezone.utc).isoformat(),
    }


@dataclass(frozen=True)
class AskedRow:
    """The XCom row Airflow was asked for (None: any)."""

    dag_id: str | None
    run_id: str | None
    task_id: str | None
    map_index: int | None
    key: str | None

    def mismatch(self, dag_id: str, run_id: str, task_id: str, map_index: int, key: str) -> str | None:
        for name, want, got in (
            ("dag_id", self.dag_id, dag_id),
            ("run_id", self.run_id, run_id),
            ("task_id", self.task_id, task_id),
            ("map_index", self.map_index, map_index),
            ("key", self.key, key),
        ):
            if want is not None and want != got:
                return f"{name} {got!r} (the row is {name} {want!r})"
        return None


@dataclass(frozen=True)
class Target:
    """Where a checked reference points: the run's topic (None: the legacy map), the key and, for
    a message, its address and writer id."""

    topic: str | None
    map_key: str
    identity: Identity
    address: str | None = None
    writer_id: str | None = None


def checked_target(
    reference: dict[str, Any], settings: ProviderSettings, *, asked: AskedRow | None, xcom_key: Any = None
) -> Target:
    """Where a reference points, after checking that it names this deployment's store, that its
    topic is the one its own row gives, and that it is the row Airflow was asked for.

    :raises XComReferenceError: it is malformed, names another topic, or another row (named).
    """
    address, writer = reference.get("address"), reference.get("writer")
    version, topic, map_key = _checked_shape(
        reference.get(REFERENCE_MARKER), reference.get("topic"), reference.get("key"), address, writer
    )
    identity, expected, target_topic = _identity_and_topic(version, map_key, settings)
    if topic != expected:
        raise XComReferenceError(
            f"XCom reference to key {map_key!r} names topic {topic!r}, not the topic of its own run "
            f"{expected!r}: refusing to follow it"
        )
    _check_bound(map_key, identity, asked=asked, xcom_key=xcom_key)
    if version == REFERENCE_VERSION:
        return Target(target_topic, map_key, identity, address=address, writer_id=writer)
    return Target(target_topic, map_key, identity)


def _checked_shape(version: Any, topic: Any, map_key: Any, address: Any, writer: Any) -> tuple[int, str, str]:
    """``(version, topic, key)`` of a known version with the fields it needs, each of the right type."""
    if (
        version not in _VERSIONS
        or isinstance(version, bool)
        or not isinstance(topic, str)
        or not isinstance(map_key, str)
        or (
            version == REFERENCE_VERSION
            and not (isinstance(address, str) and address and isinstance(writer, str) and writer)
        )
    ):
        raise XComReferenceError(
            f"malformed XCom reference (version {version!r}, topic {topic!r}, key {map_key!r}): expected "
            f"version {REFERENCE_VERSION} with string topic, key, address and writer, or {MAP_REFERENCE_VERSION} "
            f"or {LEGACY_REFERENCE_VERSION} with string topic and key"
        )
    return version, topic, map_key


def _identity_and_topic(version: int, map_key: str, settings: ProviderSettings) -> tuple[Identity, str, str | None]:
    """The row a key names, the topic a reference to it must name, and the run topic to read
    (None: the legacy map)."""
    if version == LEGACY_REFERENCE_VERSION:  # written under this namespace or the earlier default
        try:
            identity = XComStore.parse_key_of(settings.key_namespace, map_key)
        except XComReferenceError:
            identity = XComStore.parse_key_of(LEGACY_KEY_NAMESPACE, map_key)
        return identity, get_store(settings).topic, None
    identity = XComStore.parse_key_of(settings.key_namespace, map_key)
    topic_of_run = message_topic if version == REFERENCE_VERSION else run_topic
    expected = topic_of_run(
        PulsarStateHook(settings.conn_id).cached_topic_name(settings.xcom_topic),
        settings.key_namespace,
        identity[0],
        identity[1],
    )
    return identity, expected, expected


def _check_bound(map_key: str, identity: Identity, *, asked: AskedRow | None, xcom_key: Any) -> None:
    """The reference names the row Airflow was asked for, and the row's own key."""
    problem = asked.mismatch(*identity) if asked is not None else None
    if problem is None and isinstance(xcom_key, str) and xcom_key != identity[4]:
        problem = f"key {identity[4]!r} (the row is key {xcom_key!r})"
    if problem is not None:
        raise XComReferenceError(
            f"XCom reference to key {map_key!r} is not bound to its row: it names {problem}; refusing to follow it"
        )
