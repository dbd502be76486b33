"""Small async helpers for the rollout engine: sync-or-async calls, error text, blocking runs."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from vfkit.errors import RolloutError

#: Exceptions that stop work rather than report its failure: always propagated. Any other exception
#: from user code (a hook, tool or reward function) is that code's failure and is recorded on its
#: rollout -- SystemExit too (argparse, sys.exit), which would otherwise end the whole batch.
#: GeneratorExit is how a suspended coroutine is closed: catching it would break that.
INTERRUPTS: tuple[type[BaseException], ...] = (
    asyncio.CancelledError, KeyboardInterrupt, GeneratorExit,
)


HOOK_NOTE = "raised in "  # the note `run_hook` adds to an exception: which hook raised it


def error_text(error: BaseException) -> str:
    """How a failure is recorded on a state: "Type: message", plus the hook that raised it
    ("KeyError: 'board' (raised in Guess.env_response)") when `run_hook` noted one."""
    hooks = [n for n in getattr(error, "__notes__", ()) if n.startswith(HOOK_NOTE)]
    return f"{type(error).__name__}: {error}" + (f" ({hooks[0]})" if hooks else "")


async def run_hook(hook: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, awaited when async; an exception it raises is noted with `hook`, the name
    the author knows it by ("Guess.env_response", "stop condition 'solved'"), once: the
    innermost hook names it (a RolloutError names its source itself)."""
    try:
        return await maybe_await(fn(*args))
    except BaseException as e:
        if not isinstance(e, (*INTERRUPTS, RolloutError)) and not any(
            n.startswith(HOOK_NOTE) for n in getattr(e, "__notes__", ())
        ):
            e.add_note(f"{HOOK_NOTE}{hook}")
        raise


async def maybe_await(value: Any) -> Any:
    """The value, awaited first when it is awaitable (hooks may be sync or async)."""
    return await value if inspect.isawaitable(value) else value


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine to completion from sync code, in a worker thread if a loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["out"] = asyncio.run(coro)
        except BaseException as e:
            result["err"] = e

    thread = threading.Thread(target=run, name="vfkit-run-sync")
    thread.start()
    thread.join()
    if "err" in result:
        raise result["err"]
    return result["out"]


@contextlib.asynccontextmanager
async def own_connections(client: Any) -> AsyncIterator[Any]:
    """`client`, or (an AsyncOpenAI on openai's default HTTP client) a copy of it with a
    connection pool of its own, closed on exit.

    A pool belongs to the event loop that opened it. A blocking call (`run_sync`) runs a loop of
    its own and closes it, so a pool shared with the caller's client would leave that client
    dead for its next blocking call ("Event loop is closed"). A client built with a custom
    `http_client` is used as is (its transport settings cannot be copied): reuse it within one
    event loop, or give each blocking call its own.
    """
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    http = getattr(client, "_client", None)  # openai's own pool: AsyncHttpxClientWrapper
    if not isinstance(client, AsyncOpenAI) or type(http).__name__ != "AsyncHttpxClientWrapper":
        yield client
        return
    own = client.copy(http_client=DefaultAsyncHttpxClient())
    try:
        yield own
    finally:
        await own.close()
