"""ToolEnv: the model calls Python functions as OpenAI tools until it answers without a call.

    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: The first number.
            b: The second number.
        \"\"\"
        return a + b

    env = vf.ToolEnv(tools=[add], dataset=rows, rubric=rubric, max_turns=5)

A tool may return an image: a PIL image (or a list of content parts, PIL images allowed among
them) becomes the tool message's content parts, so the model sees the picture in its next turn
(`vfkit.envs.content.tool_content`); text tools are unchanged. vLLM and vf-serve take images in
tool messages; the OpenAI API takes them only from users: `tool_images="user"` keeps each tool
message text and shows the turn's images in one user message after them.

Every way a call can go wrong — arguments that are not JSON, JSON encoded twice, an unknown
tool, a missing argument, a tool that raises — becomes a tool message the model sees
("Error: ..."), and the rollout goes on: the model gets to recover, as it would in production.
A `vfkit.errors.RolloutError` is the exception: it is the environment's own failure, not the
model's, and ends the rollout with that error recorded.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Iterable
from typing import Any

from vfkit.envs.async_utils import INTERRUPTS
from vfkit.envs.content import move_images_to_user, tool_content
from vfkit.envs.multiturn_env import MultiTurnEnv, stop
from vfkit.envs.tool_schema import (
    ToolArgumentError,
    argument_validators,
    function_to_tool_schema,
    validate_arguments,
)
from vfkit.errors import ConfigError, RolloutError
from vfkit.types import Message, Messages, State


class UnknownToolError(LookupError):
    """The model called a tool the environment does not offer."""


def parse_tool_arguments(raw: Any) -> dict[str, Any]:
    """A tool call's arguments as a dict; accepts a dict, JSON, or JSON encoded twice."""
    value = raw
    for _ in range(2):  # a JSON string holding JSON (double-encoded) is unwrapped once
        if not isinstance(value, str):
            break
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ToolArgumentError(f"arguments are not valid JSON ({e.msg}): {raw!r}") from e
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ToolArgumentError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def format_result(result: Any) -> str | list[dict[str, Any]]:
    """Tool results become message content: strings as is, images as image parts, JSON for data,
    str() otherwise (see `tool_content`)."""
    return tool_content(result)


class ToolEnv(MultiTurnEnv):
    """Sends the tools' schemas with each model call and answers each call with its result."""

    def __init__(
        self, tools: Iterable[Callable[..., Any]] | None = None, max_turns: int = 10,
        tool_images: str = "tool", **kwargs: Any,
    ) -> None:
        super().__init__(max_turns=max_turns, **kwargs)
        if self.message_type != "chat":
            raise ConfigError("ToolEnv needs message_type='chat' (tool calls are chat messages)")
        if tool_images not in ("tool", "user"):
            raise ConfigError(f"tool_images must be 'tool' (images in the tool message) or "
                              f"'user' (in a user message after it), not {tool_images!r}")
        self.tool_images = tool_images
        self.tools: dict[str, Callable[..., Any]] = {}
        self.oai_tools: list[dict[str, Any]] = []
        self.tool_validators: dict[str, dict[str, Any]] = {}  # name -> argument -> validator
        for tool in tools or []:
            self.add_tool(tool)

    def add_tool(self, tool: Callable[..., Any], skip: Iterable[str] = ()) -> None:
        """Offer `tool` to the model (its schema hides the parameters named in `skip`)."""
        schema = function_to_tool_schema(tool, skip=skip)
        name = schema["function"]["name"]
        if name in self.tools:
            raise ConfigError(f"two tools are named {name!r}; tool names must be unique")
        self.tools[name] = tool
        self.oai_tools.append(schema)
        self.tool_validators[name] = argument_validators(tool, skip)

    def tools_for(self, state: State) -> list[dict[str, Any]] | None:
        return self.oai_tools or None

    @stop
    def no_tools_called(self, state: State) -> bool:
        """The model answered without calling a tool: the task is done."""
        completion = state["completion"]
        if state["turn"] == 0 or not completion:
            return False
        last = completion[-1]
        return last.get("role") == "assistant" and not last.get("tool_calls")

    async def env_response(self, messages: Messages, state: State) -> list[Message]:
        """One tool message per tool call in the model's last message."""
        calls = messages[-1].get("tool_calls") or []
        replies = [await self.run_tool_call(call, messages, state) for call in calls]
        return move_images_to_user(replies) if self.tool_images == "user" else replies

    async def run_tool_call(
        self, call: dict[str, Any], messages: Messages, state: State
    ) -> Message:
        """Run one tool call; any failure becomes the tool message's error text."""
        function = call.get("function") or {}
        name = function.get("name", "")
        try:
            args = parse_tool_arguments(function.get("arguments"))
            content = format_result(await self.call_tool(name, args, messages, state))
        except (*INTERRUPTS, RolloutError):  # the environment's failure, not the model's
            raise
        except BaseException as e:  # SystemExit too: argparse exits on arguments it rejects
            content = self.format_error(name, e)
        state["tool_calls_made"] = state.get("tool_calls_made", 0) + 1
        return {"role": "tool", "content": content, "tool_call_id": call.get("id", "")}

    async def call_tool(
        self, name: str, args: dict[str, Any], messages: Messages, state: State
    ) -> Any:
        """Call the named tool with `args` (sync tools run in a worker thread)."""
        tool = self.tools.get(name)
        if tool is None:
            raise UnknownToolError(f"unknown tool {name!r}; available tools: {sorted(self.tools)}")
        args = validate_arguments(name, args, self.tool_validators.get(name, {}))
        if inspect.iscoroutinefunction(tool):
            return await tool(**args)
        result = await asyncio.to_thread(tool, **args)
        return await result if inspect.isawaitable(result) else result

    def format_error(self, name: str, error: BaseException) -> str:
        """The text the model sees when its call `name` failed (override to change wording)."""
        if isinstance(error, ToolArgumentError | UnknownToolError):
            return f"Error: {error}"
        return f"Error: tool {name!r} raised {type(error).__name__}: {error}"
