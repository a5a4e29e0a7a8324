"""What every recipe shares: a SharedStateManager underneath and its lifecycle."""

from __future__ import annotations

import sys
from typing import Any

if sys.version_info >= (3, 11):
    from typing import Self
else:  # pragma: no cover
    from typing_extensions import Self

from airflow_provider_pulsarstate.engine.manager import SharedStateManager


class Recipe:
    """Base of the recipes: ``manager`` holds the replicated state; start/close/with delegate to it."""

    manager: SharedStateManager[Any, Any]

    def start(self) -> Self:
        """Replay the log now instead of on first use."""
        self.manager.start()
        return self

    def close(self) -> None:
        """Release the writer and the reader (the back end stays open)."""
        self.manager.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
