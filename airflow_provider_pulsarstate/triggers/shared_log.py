"""Log lines shared by the triggers of a process: a thousand triggers meeting the same condition
(starting to watch one table, a table not there yet, a broker that does not answer) write one line
per :data:`SHARED_LOG_SECONDS`, not a thousand.

Why it matters in a triggerer: a trigger's log line is written on the event loop's thread, by a
blocking write into the socket the triggerer's supervisor reads between its own work (database
round trips, heartbeats, the log lines of every trigger). A burst of lines while the supervisor is
busy fills that socket, and the next write holds the loop until the supervisor reads again.
A thousand triggers starting together (or retrying together) write such a burst: the loop was
measured blocked 0.5 s inside one of those warnings, in a real triggerer starting 1,000 watchers.

Each call names what the line is about (``key``); the first line for a key is written at once,
the next ones within :data:`SHARED_LOG_SECONDS` are only counted, and the next line written for
that key says how many were left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

SHARED_LOG_SECONDS = 30.0
"""Seconds during which the lines of one key after the first are only counted."""

MAX_KEYS = 1024
"""Keys remembered at most (the oldest are forgotten first: their next line is written)."""


class SharedLog:
    """At most one line per key per ``interval`` seconds on ``logger`` (see the module docstring).

    Not thread-safe: use one per event loop's callers, or from one thread (the triggers' loop).
    """

    def __init__(self, logger: logging.Logger, *, interval: float = SHARED_LOG_SECONDS) -> None:
        self.logger = logger
        self.interval = interval
        self._keys: dict[Hashable, list[float | int]] = {}  # key -> [when last written, left out since]

    def log(self, level: int, key: Hashable, msg: str, *args: object) -> bool:
        """Log ``msg % args`` at ``level``, unless a line for ``key`` was written less than
        ``interval`` seconds ago (then only count it). Returns whether the line was written."""
        if not self.logger.isEnabledFor(level):
            return False
        now = time.monotonic()
        held = self._keys.get(key)
        if held is not None and now - held[0] < self.interval:
            held[1] += 1
            return False
        left_out = int(held[1]) if held is not None else 0
        self._keys.pop(key, None)
        self._keys[key] = [now, 0]
        if len(self._keys) > MAX_KEYS:
            del self._keys[next(iter(self._keys))]
        if left_out:
            msg = f"{msg} (and %d more like it in the last %.0fs)"
            args = (*args, left_out, now - float(held[0]))  # type: ignore[index]
        self.logger.log(level, msg, *args)
        return True

    def info(self, key: Hashable, msg: str, *args: object) -> bool:
        return self.log(logging.INFO, key, msg, *args)

    def warning(self, key: Hashable, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, msg, *args)
