"""Calling user functions: only with the keyword arguments they declare, sync or async, bounded.

Reward functions are written like `def f(completion, answer) -> float`; a rubric offers many
arguments and each function receives the ones it names (`**kwargs` receives all).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import ctypes
import functools
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any


def func_name(func: Callable[..., Any]) -> str:
    """The name a function is reported under (metrics keys): `__name__`, unwrapping partials."""
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", None) or type(func).__name__


def _signature_params(func: Callable[..., Any]) -> tuple[frozenset[str], frozenset[str], bool]:
    """(names it accepts by keyword, names it requires, whether it takes **kwargs)."""
    params = inspect.signature(func).parameters.values()
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = frozenset(p.name for p in params if p.kind in keyword_kinds)
    required = frozenset(
        p.name for p in params if p.kind in keyword_kinds and p.default is inspect.Parameter.empty
    )
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return names, required, var_kw


_cached_params = functools.lru_cache(maxsize=4096)(_signature_params)


def signature_params(func: Callable[..., Any]) -> tuple[frozenset[str], frozenset[str], bool]:
    """`_signature_params`, cached for hashable callables (signatures are costly to inspect)."""
    try:
        return _cached_params(func)
    except TypeError:  # unhashable callable object
        return _signature_params(func)


def declares_any(func: Callable[..., Any], names: set[str] | frozenset[str]) -> bool:
    """Whether `func` names any of `names` as a parameter (not counting **kwargs)."""
    return bool(signature_params(func)[0] & names)


def select_kwargs(func: Callable[..., Any], available: dict[str, Any]) -> dict[str, Any]:
    """The subset of `available` that `func` declares (all of it when it takes **kwargs)."""
    names, required, var_kw = signature_params(func)
    missing = sorted(required - available.keys())
    if missing:
        raise TypeError(
            f"{func_name(func)} requires {missing}, which the rubric does not provide; "
            f"declare only these names: {sorted(available)} (or give the rubric the extra "
            "objects as keyword arguments: Rubric(..., name=value))"
        )
    if var_kw:
        return dict(available)
    return {key: value for key, value in available.items() if key in names}


def is_async_callable(func: Callable[..., Any]) -> bool:
    """Whether calling `func` returns a coroutine (async def, partial of one, async __call__)."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - a callable object's async __call__
    )


_RUNNING: collections.Counter[str] = collections.Counter()  # user functions now running


def running_functions() -> list[str]:
    """Names of the user functions (reward functions) running now, e.g. ["slow_judge x3"]: what
    a timed-out batch was waiting for."""
    return [f"{name} x{n}" if n > 1 else name for name, n in sorted(_RUNNING.items()) if n]


async def call_with_declared_args(func: Callable[..., Any], available: dict[str, Any]) -> Any:
    """Call `func` with the arguments it declares; sync functions run in a worker thread.

    The thread keeps the event loop serving other rollouts while a slow or blocking reward
    function (an HTTP call, a sandbox) runs. It is a daemon thread of its own, not the loop's
    executor: a function that never returns must not keep the process from exiting (the
    executor's threads are joined at exit, and a hung one made vf-train unkillable but by
    SIGKILL). At most MAX_THREADS such calls run at once per event loop (a batch of 400
    rollouts used to start 400 threads).
    """
    kwargs = select_kwargs(func, available)
    name = func_name(func)
    _RUNNING[name] += 1
    try:
        if is_async_callable(func):
            return await func(**kwargs)
        result = await _in_daemon_thread(functools.partial(func, **kwargs), name)
        if inspect.isawaitable(result):
            result = await result
        return result
    finally:
        _RUNNING[name] -= 1


#: Sync user functions running at once per event loop: the cap of asyncio's default executor,
#: not its cpu_count() + 4 (6 on 2 cores), so that sync functions that wait on I/O (an HTTP
#: judge) keep many calls in flight; CPU-bound ones are serialised by the GIL anyway.
MAX_THREADS = 32
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary())


def _thread_slots() -> asyncio.Semaphore:
    """This event loop's bound on sync user functions running in threads."""
    loop = asyncio.get_running_loop()
    if loop not in _slots:
        _slots[loop] = asyncio.Semaphore(MAX_THREADS)
    return _slots[loop]


async def _in_daemon_thread(call: Callable[[], Any], name: str) -> Any:
    """`call()` on a new daemon thread (with this task's context variables), awaited here once
    one of the loop's MAX_THREADS slots is free. The slot is given back when the await ends,
    cancelled too: a hung function must not hold one for good."""
    async with _thread_slots():
        return await _start_daemon_thread(call, name)


async def _start_daemon_thread(call: Callable[[], Any], name: str) -> Any:
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            (future.set_result if ok else future.set_exception)(value)

    def target() -> None:
        try:
            outcome = (True, context.run(call))
        except BaseException as exc:  # handed to the awaiting task, as to_thread would
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed while this ran
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=target, daemon=True, name=f"vfkit-fn-{name}"[:60]).start()
    return await future


class _Interrupted(BaseException):
    """Raised inside a runaway worker thread to stop it (BaseException: user code can't eat it)."""


def run_with_timeout(func: Callable[[], Any], timeout_s: float) -> Any:
    """Run `func()` in its own thread; raise TimeoutError after `timeout_s` and stop the thread.

    Works from any thread (unlike signal.alarm, which only works in the main thread). A thread
    stuck inside one long C call stops as soon as control returns to Python code; until then it
    is abandoned as a daemon thread.
    """
    box: dict[str, Any] = {}
    lock = threading.Lock()

    def target() -> None:
        try:
            try:
                box["value"] = func()
            except Exception as exc:
                box["error"] = exc
            finally:
                with lock:
                    box["done"] = True
        except _Interrupted:
            pass

    thread = threading.Thread(target=target, daemon=True, name="vfkit-timeout")
    thread.start()
    thread.join(timeout_s)
    with lock:
        if not box.get("done"):
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident or 0), ctypes.py_object(_Interrupted)
            )
            raise TimeoutError(f"{func_name(func)} did not finish within {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")
