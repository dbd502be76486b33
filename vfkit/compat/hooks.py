"""Classic `@vf.cleanup` / `@vf.teardown` markers and how a compat environment finds them.

`@cleanup` methods `(self, state)` run after each rollout (even a failed one); `@teardown`
methods `(self)` run once at interpreter exit. Both may be sync or async; higher `priority`
first, ties by name (classic's order).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


def _marker(kind: str) -> Callable[..., Any]:
    def decorator(func: Callable[..., Any] | None = None, *, priority: int = 0) -> Any:
        def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
            setattr(fn, kind, True)
            setattr(fn, f"{kind}_priority", priority)
            return fn

        return mark(func) if func is not None else mark

    decorator.__name__ = kind
    decorator.__doc__ = f"Mark a method as a classic `{kind}` hook (optionally with priority)."
    return decorator


cleanup = _marker("cleanup")
teardown = _marker("teardown")


def marked_methods(obj: Any, kind: str) -> list[Callable[..., Any]]:
    """obj's bound methods marked `kind`, higher priority first, then by name."""
    found = [m for _, m in inspect.getmembers(obj, predicate=inspect.ismethod)
             if getattr(m, kind, False) is True]
    return sorted(found, key=lambda m: (-getattr(m, f"{kind}_priority", 0), m.__name__))


def run_teardown(obj: Any) -> None:
    """Run obj's @teardown hooks (atexit: a failing hook is logged, the others still run)."""
    for method in marked_methods(obj, "teardown"):
        try:
            result = method()
            if inspect.isawaitable(result):
                asyncio.run(result)  # type: ignore[arg-type]  # a coroutine at exit
        except Exception as e:
            logger.warning("teardown %s failed: %s", method.__name__, e)
