"""Staggered trigger starts: a triggerer (re)starting a thousand triggers never stalls its loop.

A trigger's start costs the event loop a millisecond or two of plain Python (reading the
connection through Airflow's secrets machinery, parsing it, logging, its first answers). asyncio
runs every task that is ready in one turn of the loop: a thousand triggers whose start steps
become ready together (created together, or woken by one shared read) would hold the loop for a
second or more, and every other trigger's timers with it. A trigger calls :func:`start_turn`
before each such step: at most :data:`STARTS_PER_TURN` steps pass per turn of its event loop, the
others go on in the next turns, in arrival order. Nothing is held across I/O: a start waiting on
the broker never keeps another from starting.
"""

from __future__ import annotations

from airflow_provider_pulsarstate.hooks.pulsarstate import STARTS_PER_TURN, take_turn

__all__ = ["STARTS_PER_TURN", "start_turn"]


async def start_turn() -> None:
    """Wait until this loop lets one more start step through (at once when few are starting);
    the same turns as :func:`~airflow_provider_pulsarstate.engine.turns.take_turn`."""
    await take_turn()
