"""`verifiers.utils.async_utils` of 0.1.x: call a function that may be sync or async."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["maybe_await"]


async def maybe_await(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`func(*args, **kwargs)`, awaited when it returns an awaitable (the classic signature:
    the function and its arguments, not a value as `vfkit.envs.async_utils.maybe_await`)."""
    result = func(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result
