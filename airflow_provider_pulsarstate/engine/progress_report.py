"""Progress lines for long work: counts and rates at a fixed interval, and a summary at the end."""

from __future__ import annotations

import logging
import time


class Progress:
    """Counts work and logs ``what: N unit (R unit/s) k=v`` every ``interval`` seconds.

    :param quiet: log the summary only when the work outlived one interval (routine catch-ups
        stay silent; a long bootstrap always reports).
    """

    def __init__(
        self, logger: logging.Logger, what: str, *, interval: float = 5.0, unit: str = "records", quiet: bool = False
    ) -> None:
        self._log = logger
        self.what = what
        self.unit = unit
        self.interval = interval
        self.quiet = quiet
        self.count = 0
        self._start = self._last = time.monotonic()

    def tick(self, n: int = 1, **fields: object) -> None:
        self.count += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._log.info("%s: %s", self.what, self._line(now, fields))

    def done(self, **fields: object) -> None:
        now = time.monotonic()
        if self.quiet and now - self._start < self.interval:
            return
        self._log.info("%s: done, %s", self.what, self._line(now, fields))

    def _line(self, now: float, fields: dict[str, object]) -> str:
        elapsed = max(now - self._start, 1e-9)
        extra = "".join(f" {k}={v}" for k, v in fields.items())
        return f"{self.count} {self.unit} in {elapsed:.1f}s ({self.count / elapsed:,.0f} {self.unit}/s){extra}"
