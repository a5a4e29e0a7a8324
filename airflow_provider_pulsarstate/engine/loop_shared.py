"""Objects made once per event loop and key, off the loop, whatever number of callers ask together."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


async def made_once(
    made: dict[K, V],
    making: dict[K, asyncio.Future[Any]],
    key: K,
    make: Callable[[], Any],
    register: Callable[[Any], V],
) -> V:
    """``made[key]``, after running ``make`` in a worker thread when it is missing.

    Callers arriving while ``make`` runs wait for the same call (shielded: one caller cancelled does
    not cancel it); the first one back registers ``register(result)``. A failed ``make`` is not
    kept: the waiters see its error and the next caller tries again.

    :param made: this loop's registry (key -> registered object).
    :param making: this loop's calls under way (key -> future).
    """
    while key not in made:
        future = making.get(key)
        if future is None:
            future = making[key] = asyncio.ensure_future(asyncio.to_thread(make))
        try:
            await asyncio.shield(future)
        finally:
            if making.get(key) is future and future.done():
                del making[key]  # the first waiter back registers it (or lets the next caller retry)
                if not future.cancelled() and future.exception() is None and key not in made:
                    made[key] = register(future.result())
    return made[key]
