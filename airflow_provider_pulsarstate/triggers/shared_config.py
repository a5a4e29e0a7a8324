"""One connection lookup per connection id for the triggers of an event loop.

Reading a connection through Airflow's secrets machinery costs the event loop a few milliseconds
of plain Python each time (and, in a triggerer, a round trip to its supervisor). A thousand
triggers starting together, each reading the same connection, cost the loop seconds of that.
Here the triggers of one loop share the lookup: callers arriving while a lookup runs wait for it,
and its answer serves every caller for :data:`SHARED_CONFIG_SECONDS` after it started. A connection
that is not defined or not valid (:class:`ConfigurationError`) is answered with the same error for
:data:`FAILED_CONFIG_SECONDS`: triggers started one after the other on a misspelt connection id
fail at once instead of each paying a lookup through every secrets backend. Any other failure is
not kept (the next caller looks again). A changed connection therefore reaches every trigger
starting :data:`SHARED_CONFIG_SECONDS` (a newly defined one :data:`FAILED_CONFIG_SECONDS`) or more
after the change; earlier ones may still get the previous answer.
"""

from __future__ import annotations

import asyncio
import weakref

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

SHARED_CONFIG_SECONDS = 30.0
"""Seconds a connection's settings, once read, serve the triggers of the loop that read them."""
FAILED_CONFIG_SECONDS = 5.0
"""Seconds a connection found undefined or invalid is answered with that error without a lookup."""

# event loop -> connection id -> (when the lookup started, the lookup)
_lookups: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[str, tuple[float, asyncio.Task[ConnectionConfig]]]
] = weakref.WeakKeyDictionary()


async def shared_config(hook: PulsarStateHook) -> ConnectionConfig:
    """``await hook.aget_config()``, shared by the callers of this event loop (see the module
    docstring); the same errors, raised to every caller waiting on the failed lookup."""
    loop = asyncio.get_running_loop()
    by_id = _lookups.setdefault(loop, {})
    conn_id = hook.pulsarstate_conn_id
    held = by_id.get(conn_id)
    if held is None or (held[1].done() and loop.time() - held[0] >= _kept_for(held[1])):
        # a task of its own: a caller cancelled meanwhile never cancels the others' lookup
        lookup = loop.create_task(hook.aget_config(), name=f"pulsarstate-connection-lookup {conn_id}")
        held = by_id[conn_id] = (loop.time(), lookup)
        lookup.add_done_callback(lambda task: _forget_failed(by_id, conn_id, task))
    return await asyncio.shield(held[1])


def _kept_for(lookup: asyncio.Task[ConnectionConfig]) -> float:
    """Seconds the answer of a finished lookup is kept (only answers and ConfigurationErrors are)."""
    return FAILED_CONFIG_SECONDS if lookup.exception() is not None else SHARED_CONFIG_SECONDS


def _forget_failed(
    by_id: dict[str, tuple[float, asyncio.Task[ConnectionConfig]]], conn_id: str, task: asyncio.Task[ConnectionConfig]
) -> None:
    # retrieves the exception: no "never retrieved" warning
    if task.cancelled() or (task.exception() is not None and not isinstance(task.exception(), ConfigurationError)):
        held = by_id.get(conn_id)
        if held is not None and held[1] is task:
            del by_id[conn_id]


def forget_shared_configs() -> None:
    """Forget every connection read so far (the next trigger start reads it again)."""
    _lookups.clear()
