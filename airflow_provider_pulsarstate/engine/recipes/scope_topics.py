"""Topics of per-scope maps (a DAG run's XComs, a run's task state, an asset's state), and their
compare-and-delete.

A scope's map lives on ``<base topic>-<namespace slug>-<kind><digest>``: ``kind`` is one letter
(``r`` a DAG run, ``a`` an asset) and the digest (32 hex characters of SHA-256 over the namespace
and the scope's identity, NUL-separated) gives a valid, fixed-length topic for any spelling of the
ids. Listing ``<base>-<slug>-<kind>`` and keeping only names with exactly a digest after it finds a
namespace's maps of one kind (never their checkpoint topics, never another namespace's prefix).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import AcquireMode, Backend

DIGEST_CHARS = 32
RUN_KIND = "r"
ASSET_KIND = "a"
_SLUG = re.compile(r"[^A-Za-z0-9_.-]")


def scope_topic_prefix(base_topic: str, namespace: str, kind: str) -> str:
    """The prefix of every map topic of one kind of one key namespace (``<base>-<slug>-<kind>``)."""
    return f"{base_topic}-{_SLUG.sub('_', namespace)[:40]}-{kind}"


def scope_topic(base_topic: str, namespace: str, kind: str, *identity: str) -> str:
    """The topic of one scope's map: :func:`scope_topic_prefix` and a digest of (namespace, identity)."""
    digest = hashlib.sha256("\0".join((namespace, *identity)).encode()).hexdigest()[:DIGEST_CHARS]
    return scope_topic_prefix(base_topic, namespace, kind) + digest


def is_scope_topic(topic: str, prefix: str) -> bool:
    """Whether ``topic`` is a scope map's log under ``prefix`` (not one of its checkpoint topics)."""
    rest = topic[len(prefix) :]
    return topic.startswith(prefix) and len(rest) == DIGEST_CHARS and all(c in "0123456789abcdef" for c in rest)


def list_scope_topics(backend: Backend, prefix: str) -> list[str]:
    """The existing scope-map topics under ``prefix``, sorted."""
    return [t for t in backend.list_topics(prefix) if is_scope_topic(t, prefix)]


def drop_map_if_unchanged(
    backend: Backend,
    topic: str,
    *,
    read: Callable[[], dict[str, Any]],
    expected: dict[str, Any],
    timeout: float,
) -> bool:
    """Delete a map's topics (the log and its checkpoints) only if ``read()`` (a fresh replay of
    the map, made by the caller) still returns exactly ``expected`` (compare-and-delete). The check
    and the deletion happen while this call holds the map's exclusive writer, so nothing can land
    in between. Returns whether it was deleted.

    :raises OperationTimeoutError: the writer could not be taken within ``timeout``.
    """
    writer = backend.acquire_writer(topic, mode=AcquireMode.WAIT, timeout=timeout)
    try:
        if read() != expected:
            return False
        for name in [topic, *backend.list_topics(topic + "-checkpoint")]:
            backend.delete_topic(name)
        return True
    finally:
        writer.close()
