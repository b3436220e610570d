"""Test helper: run a coroutine to completion with a deadline.

The asyncio client tests drive whole scenarios in one `asyncio.run`; a hang (a future
never resolved, a worker that never answers) must fail that test after `limit_s`
instead of holding the suite until its global timeout.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine


def run_bounded(coro: Coroutine[Any, Any, Any], limit_s: float) -> Any:
    """`asyncio.run(coro)`, failing with TimeoutError after `limit_s` seconds."""
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, limit_s)
    return asyncio.run(bounded())
