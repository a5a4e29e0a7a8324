"""Filter and apply functions the message-trigger tests name by dotted path (imported in the triggerer)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any


def only_b(message: dict[str, Any]) -> bool:
    return str(message["payload"]).startswith("b")


def upper(message: dict[str, Any]) -> dict[str, Any]:
    return {"payload": str(message["payload"]).upper(), "key": message["key"]}


def explode_on_poison(message: dict[str, Any]) -> dict[str, Any]:
    if message["payload"] == "poison":
        raise ValueError("poison message")
    return message


async def hold_while_file_exists(message: dict[str, Any]) -> dict[str, Any]:
    """Record the receipt (one line per call in $PULSARSTATE_TEST_RECEIPTS), then wait while
    $PULSARSTATE_TEST_HOLD exists: the event is received but not yet stored (the kill window)."""
    receipts = os.environ.get("PULSARSTATE_TEST_RECEIPTS")
    if receipts:
        with open(receipts, "a") as out:
            out.write(f"{message['payload']}\n")
    hold = os.environ.get("PULSARSTATE_TEST_HOLD")
    while hold and Path(hold).exists():
        await asyncio.sleep(0.1)
    return message
