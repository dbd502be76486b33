"""StatefulToolEnv: tools that also take hidden arguments filled in from the rollout's state.

A sandbox id, a database handle or a per-rollout secret should not be chosen by the model: the
schema the model sees omits those parameters, and `update_tool_args` supplies them per call:

    def run_sql(query: str, db_path: str) -> str: ...

    class SqlEnv(vf.StatefulToolEnv):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.add_tool(run_sql, args_to_skip=["db_path"])

        async def setup_state(self, state):
            state["db_path"] = make_db(state["info"])
            return state

        def update_tool_args(self, tool_name, tool_args, messages, state):
            return {**tool_args, "db_path": state["db_path"]}

`update_tool_args` is the environment's code, not the model's: when it raises, returns anything
but a dict, or leaves a required hidden argument unset, the rollout ends with an error naming it
(a `RolloutError`), rather than showing the model an error it cannot fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from vfkit.envs.async_utils import INTERRUPTS, error_text, maybe_await
from vfkit.envs.tool_env import ToolEnv
from vfkit.errors import RolloutError
from vfkit.types import Messages, State


class StatefulToolEnv(ToolEnv):
    """A ToolEnv whose tools get hidden arguments from `update_tool_args` (see module doc)."""

    def __init__(self, tools: Iterable[Callable[..., Any]] | None = None, **kwargs: Any) -> None:
        self.skipped_args: dict[str, list[str]] = {}
        self.required_hidden: dict[str, list[str]] = {}
        super().__init__(tools=tools, **kwargs)

    def add_tool(
        self, tool: Callable[..., Any], args_to_skip: Iterable[str] = (), skip: Iterable[str] = ()
    ) -> None:
        """Offer `tool`; `args_to_skip` are hidden from the model and set by update_tool_args."""
        hidden = [*args_to_skip, *skip]
        super().add_tool(tool, skip=hidden)  # a name the tool does not take is a ConfigError
        name = self.oai_tools[-1]["function"]["name"]
        self.skipped_args[name] = hidden
        params = inspect.signature(tool).parameters
        self.required_hidden[name] = [
            arg for arg in hidden if arg in params and params[arg].default is params[arg].empty
        ]

    def update_tool_args(
        self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State
    ) -> dict[str, Any]:
        """Return the arguments to call `tool_name` with (override: inject state; sync or async)."""
        return tool_args

    async def call_tool(
        self, name: str, args: dict[str, Any], messages: Messages, state: State
    ) -> Any:
        if name not in self.tools:
            return await super().call_tool(name, args, messages, state)  # unknown-tool error
        # The model may not set hidden arguments itself, even if it guesses their names.
        visible = {k: v for k, v in args.items() if k not in self.skipped_args.get(name, [])}
        full = await self.updated_tool_args(name, visible, messages, state)
        return await super().call_tool(name, full, messages, state)

    async def updated_tool_args(
        self, name: str, visible: dict[str, Any], messages: Messages, state: State
    ) -> dict[str, Any]:
        """`update_tool_args`'s result, checked; its mistakes are RolloutErrors naming it."""
        hook = f"{type(self).__name__}.update_tool_args"
        try:
            full = await maybe_await(self.update_tool_args(name, visible, messages, state))
        except INTERRUPTS:
            raise
        except BaseException as e:
            raise RolloutError(f"{hook} raised {error_text(e)} (tool {name!r})") from e
        example = (self.skipped_args.get(name) or ["db_path"])[0]
        if not isinstance(full, dict):
            raise RolloutError(
                f"{hook} must return the tool's arguments as a dict, e.g. {{**tool_args, "
                f"{example!r}: ...}}; for tool {name!r} it returned {full!r:.80}"
            )
        missing = [arg for arg in self.required_hidden.get(name, []) if arg not in full]
        if missing:
            raise RolloutError(
                f"{hook} set no value for the hidden argument(s) {missing} of tool {name!r}; "
                f"override update_tool_args to return {{**tool_args, {missing[0]!r}: ...}}"
            )
        return full
