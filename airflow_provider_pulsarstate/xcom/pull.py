"""The XCom read path: what a checked reference points at, read (or, for a purge, deleted).

Guarantees: a message is read at its address and checked against the reference's row and writer;
a map entry is read with ``latest=True`` (a value another process pushed is seen); an entry that
is gone raises :class:`XComEntryNotFoundError` naming key and topic; a store that cannot be
reached raises :class:`XComStoreUnavailableError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from airflow_provider_pulsarstate.engine.errors import XComEntryNotFoundError
from airflow_provider_pulsarstate.hooks.pulsarstate import XComIdentity
from airflow_provider_pulsarstate.provider_settings import ProviderSettings
from airflow_provider_pulsarstate.xcom.references import Target
from airflow_provider_pulsarstate.xcom.run_stores import get_store, reaching_the_map, run_messages, run_store


@contextlib.contextmanager
def _target_map_store(settings: ProviderSettings, target: Target) -> Iterator[Any]:
    """The store holding a map reference's entry: its run's, or the legacy map's (``topic`` None)."""
    if target.topic is None:
        yield get_store(settings)
    else:
        with run_store(settings, target.identity[0], target.identity[1]) as store:
            yield store


def read_serialized(settings: ProviderSettings, target: Target) -> Any:
    """The serialized value (``airflow.sdk.serde`` form) a checked reference points at.

    :raises XComEntryNotFoundError: the map has no entry under the key (names it).
    :raises XComStoreUnavailableError: the topic or map could not be read.
    """
    if target.address is not None:
        identity = XComIdentity(settings.key_namespace, *target.identity)
        with (
            reaching_the_map(f"cannot read XCom {target.map_key!r} from {target.topic}"),
            run_messages(settings, target.identity[0], target.identity[1]) as messages,
        ):
            message = messages.read(target.address, identity=identity, writer_id=target.writer_id or "")
        return message.record.json_value()
    with (
        reaching_the_map(f"cannot read XCom {target.map_key!r} from {target.topic or settings.xcom_topic!r}"),
        _target_map_store(settings, target) as store,
    ):
        record = store.map.get(target.map_key, latest=True)
        topic = store.topic
    if record is None:
        raise XComEntryNotFoundError(
            f"XCom entry {target.map_key!r} is not in {topic}: it was purged or cleaned up "
            f"(xcom-cleanup, retention), or its topic was replaced",
            key=target.map_key,
            topic=topic,
        )
    return record.json_value()


def delete_entry(settings: ProviderSettings, target: Target) -> None:
    """Delete the map entry a checked reference points at (a message is immutable: nothing to do;
    clean-up deletes the run's topic).

    :raises XComStoreUnavailableError: the map could not be written.
    """
    if target.address is not None:
        return
    with (
        reaching_the_map(f"cannot purge XCom {target.map_key!r} from {target.topic or settings.xcom_topic!r}"),
        _target_map_store(settings, target) as store,
    ):
        store.delete_key(target.map_key)
