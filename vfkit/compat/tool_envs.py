"""Classic verifiers 0.1.x ToolEnv / StatefulToolEnv over vfkit's.

On top of vfkit's tool loop (schemas from docstrings, every failure a tool message the model
sees), these accept what 0.1.x code does: `error_formatter(exception) -> str`, the `tool_map`
attribute (name -> function), and a subclass's `call_tool(tool_name, tool_args, tool_call_id)`
override returning the tool message itself (0.1.x's signature; vfkit's own is
`call_tool(name, args, messages, state)` returning the result).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from vfkit.compat.envs import MultiTurnEnv, stop
from vfkit.envs import stateful_tool_env as _stool
from vfkit.envs import tool_env as _tool
from vfkit.envs.async_utils import INTERRUPTS, maybe_await
from vfkit.errors import RolloutError
from vfkit.types import Message, Messages, State


class ToolEnv(MultiTurnEnv, _tool.ToolEnv):
    """Classic ToolEnv: `tools`, `max_turns=10`, optional `error_formatter(exception) -> str`.

        env = vf.ToolEnv(tools=[add], dataset=rows, error_formatter=lambda e: f"error: {e}")
    """

    def __init__(self, tools: Sequence[Callable[..., Any]] | None = None, max_turns: int = 10,
                 error_formatter: Callable[[Exception], str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(tools=tools, max_turns=max_turns, **kwargs)
        self.error_formatter = error_formatter
        self._classic_call_tool = "tool_call_id" in inspect.signature(self.call_tool).parameters

    @property
    def tool_map(self) -> dict[str, Callable[..., Any]]:
        """Classic name of vfkit's `tools` dict (tool name -> function)."""
        return self.tools

    @stop
    async def no_tools_called(self, state: State) -> bool:
        return _tool.ToolEnv.no_tools_called(self, state)

    def format_error(self, name: str, error: Exception) -> str:
        if self.error_formatter is not None:
            return str(self.error_formatter(error))
        return super().format_error(name, error)

    async def run_tool_call(self, call: dict[str, Any], messages: Messages,
                            state: State) -> Message:
        """vfkit's tool call, or a classic `call_tool(tool_name, tool_args, tool_call_id)`."""
        if not self._classic_call_tool:
            return await super().run_tool_call(call, messages, state)
        function, call_id = call.get("function") or {}, call.get("id", "")
        name = function.get("name", "")
        state["tool_calls_made"] = state.get("tool_calls_made", 0) + 1
        try:
            args = _tool.parse_tool_arguments(function.get("arguments"))
            args = await self.classic_tool_args(name, args, messages, state)
            message = await maybe_await(self.call_tool(name, args, call_id))
        except INTERRUPTS:
            raise
        except RolloutError:  # the author's mistake (update_tool_args): ends the rollout
            raise
        except BaseException as e:  # SystemExit too: the model sees it, as with vfkit's tools
            return {"role": "tool", "content": self.format_error(name, e), "tool_call_id": call_id}
        if isinstance(message, dict) and message.get("role") == "tool":
            return message
        return {"role": "tool", "content": _tool.format_result(message), "tool_call_id": call_id}

    async def classic_tool_args(self, name: str, args: dict[str, Any], messages: Messages,
                                state: State) -> dict[str, Any]:
        """The arguments a classic call_tool gets (StatefulToolEnv fills hidden ones)."""
        return args


class StatefulToolEnv(ToolEnv, _stool.StatefulToolEnv):
    """Classic StatefulToolEnv: `add_tool(tool, args_to_skip=[...])` + `update_tool_args`."""

    async def classic_tool_args(self, name: str, args: dict[str, Any], messages: Messages,
                                state: State) -> dict[str, Any]:
        visible = {k: v for k, v in args.items() if k not in self.skipped_args.get(name, [])}
        updated = await maybe_await(self.update_tool_args(name, visible, messages, state))
        return visible if updated is None else updated  # classic's default returned None
