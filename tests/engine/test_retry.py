"""``within``: a time bound on an await that never swallows the caller's cancellation."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_pulsarstate.engine.retry import within


def test_a_cancellation_racing_with_completion_still_cancels_the_caller() -> None:
    """The inner await completes and the caller is cancelled in the same loop step (a triggerer
    cancelling a trigger just as a poll returns): ``asyncio.wait_for`` on Python 3.11 returns the
    result and the trigger polls on for ever; ``within`` must raise CancelledError."""

    async def scenario() -> str:
        inner = asyncio.get_running_loop().create_future()
        caller = asyncio.create_task(within(inner, 10))
        await asyncio.sleep(0)  # the caller is now suspended on the inner future
        inner.set_result(42)
        caller.cancel()
        try:
            value = await caller
        except asyncio.CancelledError:
            return "cancelled"
        return f"returned {value}"

    assert asyncio.run(scenario()) == "cancelled"


def test_it_times_out_cancels_the_inner_await_and_passes_results_and_errors_through() -> None:
    async def scenario() -> None:
        inner = asyncio.ensure_future(asyncio.sleep(30))
        with pytest.raises(asyncio.TimeoutError):
            await within(inner, 0.05)
        await asyncio.sleep(0)
        assert inner.cancelled()

        async def value() -> int:
            await asyncio.sleep(0.01)
            return 7

        assert await within(value(), 5) == 7
        assert await within(value(), None) == 7

        async def boom() -> None:
            raise KeyError("partition 3")

        with pytest.raises(KeyError, match="partition 3"):
            await within(boom(), 5)

    asyncio.run(scenario())
