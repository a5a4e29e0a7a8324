"""Drop exclusive producers the broker created after our client gave up on them.

apache/pulsar#25936: when a producer creation times out on the client, the broker may still
create it later. The client never learns of it, so nobody closes it, and it holds the topic's
exclusive access for as long as our connection lives: election is wedged. The broker may act
on the request long after the client's time-out (a paused or overloaded broker acts when it
resumes), so a single check right after the time-out is not enough.

:class:`OrphanSweeper` watches each timed-out creation's ``(topic, producer name)`` in a
background thread for ``watch`` seconds and unloads the topic if the broker lists that name
(unloading drops every producer of the topic; the live ones reconnect at once). Producer names
are unique per attempt, so a name seen in the stats after the client gave up is the orphan.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

ORPHAN_WATCH = 30.0
"""Default seconds a timed-out creation is watched for its orphan."""


class OrphanSweeper:
    """Watches timed-out producer creations and unloads a topic whose orphan appears.

    :param open_admin: makes the admin client the thread uses (its own: a requests session is
        not shared across threads).
    :param watch: seconds each creation is watched.
    :param interval: seconds between looks at the topic stats.

    Thread-safe. The thread starts with the first watched creation and ends when nothing is
    watched or :meth:`close` is called. Best effort: an unreachable broker is retried until the
    watch ends, then logged.
    """

    def __init__(self, open_admin: Callable[[], Any], *, watch: float = ORPHAN_WATCH, interval: float = 0.25) -> None:
        self._open_admin = open_admin
        self._watch = watch
        self._interval = interval
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._watched: dict[tuple[str, str], float] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self.dropped = 0
        """How many orphans were dropped (for tests and metrics)."""

    def watch(self, topic: str, name: str) -> None:
        """Watch ``topic`` for a producer named ``name`` that our client no longer knows."""
        with self._lock:
            if self._closed:
                return
            self._watched[(topic, name)] = time.monotonic() + self._watch
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="pulsarstate-orphan-sweeper", daemon=True)
                self._thread.start()
        self._wake.set()

    def claim(self, topic: str, name: str) -> bool:
        """Stop watching ``(topic, name)`` because we are about to create that producer again (a
        producer of ours the client knows must not be unloaded). True when it was watched: the
        caller then takes over the check for an orphan in its way."""
        with self._lock:
            return self._watched.pop((topic, name), None) is not None

    @property
    def watching(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._watched)

    def _run(self) -> None:
        admin = self._open_admin()
        try:
            while True:
                with self._lock:
                    now = time.monotonic()
                    for key in [k for k, until in self._watched.items() if until <= now]:
                        del self._watched[key]
                    pending = list(self._watched)
                    if not pending or self._closed:
                        self._thread = None
                        return
                by_topic: dict[str, list[str]] = {}
                for topic, name in pending:
                    by_topic.setdefault(topic, []).append(name)
                for topic, names in by_topic.items():
                    self._sweep(admin, topic, names)
                self._wake.wait(self._interval)
                self._wake.clear()
        finally:
            admin.close()

    def _sweep(self, admin: Any, topic: str, names: list[str]) -> None:
        try:
            listed = {p.get("producerName") for p in admin.topic_stats(topic).get("publishers") or []}
            orphans = [name for name in names if name in listed]
            with self._lock:  # a retry may have created the name meanwhile, as a producer we know
                orphans = [name for name in orphans if (topic, name) in self._watched]
            if not orphans:
                return
            log.warning(
                "dropping the orphaned producer(s) %s of %s (unloading the topic; apache/pulsar#25936)", orphans, topic
            )
            admin.unload(topic)
        except Exception as exc:  # the broker may still be unreachable: look again at the next turn
            log.debug("looking for orphaned producers of %s: %s", topic, exc)
            return
        with self._lock:
            for name in orphans:
                self._watched.pop((topic, name), None)
            self.dropped += len(orphans)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._watched.clear()
        self._wake.set()
