"""What the provider's commands print: a logger-shaped object the clean-ups report through."""

from __future__ import annotations

from typing import Any


class PrintLog:
    """``info(fmt, *values)`` printed to standard output at once (the clean-ups log their table here)."""

    def info(self, fmt: str, *values: Any) -> None:
        print(fmt % values, flush=True)
