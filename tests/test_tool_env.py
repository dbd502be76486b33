"""ToolEnv: schemas from functions, and every kind of tool call (good and bad) over real HTTP."""

from __future__ import annotations

import functools
import json
import re
from enum import Enum
from typing import Literal

import pytest

from vfkit.envs.tool_env import ToolArgumentError, ToolEnv, parse_tool_arguments
from vfkit.envs.tool_schema import (
    argument_validators,
    function_to_tool_schema,
    parse_docstring,
    validate_arguments,
)
from vfkit.errors import ConfigError
from vfkit.testing.scripted_server import Reply, TestServer
from vfkit.testing.tiny_model import make_tokenizer

ROWS = [{"question": "What is 2+3?", "answer": "5"}]


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number,
            which may be omitted.

    Returns:
        The sum.
    """
    return a + b


def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"boom: {reason}")


async def shout(text: str) -> dict:
    """Upper-case text (an async tool returning data)."""
    return {"text": text.upper()}


class Color(Enum):
    RED = "red"
    BLUE = "blue"


def kitchen_sink(
    names: list[str], mode: Literal["fast", "slow"], color: Color, limit: float | None = None,
    flags: dict | None = None, *rest, **extra,
) -> None:
    """Exercise the type mapping."""


def test_schema_from_signature_and_docstring():
    fn = function_to_tool_schema(add)["function"]
    assert fn["name"] == "add" and fn["description"] == "Add two integers."
    params = fn["parameters"]
    assert params["required"] == ["a"]
    assert params["properties"]["a"] == {"type": "integer", "description": "The first number."}
    assert params["properties"]["b"] == {
        "type": "integer", "description": "The second number, which may be omitted.", "default": 0
    }
    props = function_to_tool_schema(kitchen_sink)["function"]["parameters"]["properties"]
    assert props["names"] == {"type": "array", "items": {"type": "string"}}
    assert props["mode"] == {"enum": ["fast", "slow"]}
    assert props["color"] == {"enum": ["red", "blue"]}
    assert props["limit"] == {"type": "number", "default": None}
    assert props["flags"]["type"] == "object" and set(props) == {
        "names", "mode", "color", "limit", "flags"
    }


def test_arguments_are_checked_and_converted_against_the_type_hints():
    def sink(names: list[str], mode: Literal["fast", "slow"], color: Color,
             limit: float | None = None, anything=None, **extra) -> None:
        """Types the schema expresses are checked; `anything` and **extra are not."""

    validators = argument_validators(sink)
    ok = validate_arguments("sink", {"names": ["a", 7], "mode": "fast", "color": "red",
                                     "limit": "2.5", "anything": object, "other": 1}, validators)
    assert ok == {"names": ["a", "7"], "mode": "fast", "color": Color.RED, "limit": 2.5,
                  "anything": object, "other": 1}
    for args, message in [
        ({"names": "a"}, "argument 'names' of tool 'sink' must be list[str], got 'a'"),
        ({"mode": "medium"}, "argument 'mode' of tool 'sink' must be Literal['fast', 'slow']"),
        ({"color": "green"}, "argument 'color' of tool 'sink' must be Color, got 'green'"),
        ({"limit": "far"}, "argument 'limit' of tool 'sink' must be float | None, got 'far'"),
    ]:
        with pytest.raises(ToolArgumentError, match=re.escape(message)):
            validate_arguments("sink", args, validators)


class Scale:
    """A callable object as a tool (configured per environment)."""

    def __init__(self, factor: int) -> None:
        self.factor = factor

    def __call__(self, x: int) -> int:
        """Scale a number.

        Args:
            x: The number.
        """
        return self.factor * x


async def test_partials_and_callable_objects_are_tools_named_after_their_function():
    env = ToolEnv(tools=[functools.partial(add, b=10), Scale(3)], dataset=ROWS)
    schemas = {t["function"]["name"]: t["function"] for t in env.oai_tools}
    assert schemas["add"]["description"] == "Add two integers."
    assert schemas["add"]["parameters"]["properties"]["b"]["default"] == 10
    assert schemas["Scale"]["parameters"]["properties"] == {
        "x": {"type": "integer", "description": "The number."}}
    script = [Reply(tool_calls=[{"name": "add", "arguments": {"a": "1"}},
                                {"name": "Scale", "arguments": {"x": 2}}]), "done"]
    with TestServer(script) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert [m["content"] for m in state["completion"][1:3]] == ["11", "6"]


@pytest.mark.parametrize("tool", [lambda x: x, type("t", (), {"__call__": lambda self: 1,
                                                             "__name__": "a" * 65})()])
def test_a_tool_name_openai_would_refuse_is_a_construction_error(tool):
    with pytest.raises(ConfigError, match="is not a valid OpenAI tool name"):
        ToolEnv(tools=[tool], dataset=ROWS)


def test_docstring_with_typed_args():
    desc, args = parse_docstring("Find.\n\nArgs:\n    query (str): What to find.\n")
    assert desc == "Find." and args == {"query": "What to find."}


@pytest.mark.parametrize(("raw", "expected"), [
    ('{"a": 1}', {"a": 1}),
    ('"{\\"a\\": 1}"', {"a": 1}),  # JSON encoded twice
    ({"a": 1}, {"a": 1}),
    ("", {}),
    (None, {}),
])
def test_parse_tool_arguments(raw, expected):
    assert parse_tool_arguments(raw) == expected


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"just text"'])
def test_parse_tool_arguments_rejects(raw):
    with pytest.raises(ToolArgumentError):
        parse_tool_arguments(raw)


def call(name: str, arguments) -> Reply:
    return Reply(tool_calls=[{"name": name, "arguments": arguments}])


async def run(script, **env_kwargs):
    env = ToolEnv(tools=[add, explode, shout], dataset=ROWS, **env_kwargs)
    with TestServer(script) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    return state, srv


async def test_valid_tool_call_then_answer():
    state, srv = await run([
        'Let me add.<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
        "The answer is 5.",
    ])
    roles = [m["role"] for m in state["completion"]]
    assert roles == ["assistant", "tool", "assistant"]
    assistant, tool = state["completion"][0], state["completion"][1]
    assert assistant["content"] == "Let me add."
    assert tool == {"role": "tool", "content": "5",
                    "tool_call_id": assistant["tool_calls"][0]["id"]}
    assert state["stop_condition"] == "no_tools_called" and state["error"] is None
    assert [t["function"]["name"] for t in srv.requests[0]["tools"]] == ["add", "explode", "shout"]
    # the tool result reached the model through the chat template
    prompt_text = make_tokenizer().decode(state["trajectory"][1]["tokens"]["prompt_ids"])
    assert "<tool_response>\n5\n</tool_response>" in prompt_text


@pytest.mark.parametrize(("reply", "expected"), [
    (call("add", "{not json"), "Error: arguments are not valid JSON"),
    (call("add", json.dumps(json.dumps({"a": 1, "b": 1}))), "2"),  # double-encoded: accepted
    (call("subtract", {"a": 1}), "Error: unknown tool 'subtract'; available tools: ['add', "),
    (call("explode", {"reason": "test"}), "Error: tool 'explode' raised RuntimeError: boom: test"),
    (call("add", {"b": 1}), "Error: tool 'add' raised TypeError"),
    (call("add", {"a": "18", "b": "33"}), "51"),  # JSON strings for ints: converted, not '1833'
    (call("add", {"a": "two"}), "Error: argument 'a' of tool 'add' must be int, got 'two' "
                                "(Input should be a valid integer, unable to parse string as an "
                                "integer)"),
    (call("add", {"a": 1.5}), "Error: argument 'a' of tool 'add' must be int, got 1.5"),
    (call("shout", {"text": "hi"}), '{"text": "HI"}'),
])
async def test_tool_call_outcomes_become_tool_messages(reply, expected):
    state, _ = await run([reply, "done"])
    tool_msg = state["completion"][1]
    assert tool_msg["role"] == "tool" and tool_msg["content"].startswith(expected)
    # the rollout went on: the model answered after seeing the tool message
    assert state["completion"][-1] == {"role": "assistant", "content": "done"}
    assert state["error"] is None and state["turn"] == 2


def cli(args: str) -> str:
    """A tool that parses a command line: argparse calls sys.exit(2) on arguments it rejects."""
    import argparse

    parser = argparse.ArgumentParser(prog="cli")
    parser.add_argument("--n", type=int, required=True)
    return str(parser.parse_args(args.split()).n * 2)


async def test_a_tool_that_calls_sys_exit_gets_a_tool_message():
    env = ToolEnv(tools=[cli], dataset=ROWS)
    with TestServer([call("cli", {"args": "--m 3"}), "done"]) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["completion"][1]["content"] == "Error: tool 'cli' raised SystemExit: 2"
    assert state["completion"][-1]["content"] == "done" and state["error"] is None


async def test_several_calls_in_one_message_are_answered_in_order():
    two = Reply(tool_calls=[{"name": "add", "arguments": {"a": 1}},
                            {"name": "add", "arguments": {"a": 1, "b": 9}}])
    state, _ = await run([two, "ok"])
    assert [m["content"] for m in state["completion"][1:3]] == ["1", "10"]
    assert state["tool_calls_made"] == 2


async def test_max_turns_ends_a_tool_loop():
    state, srv = await run(lambda body: call("add", {"a": 1}), max_turns=3)
    assert state["stop_condition"] == "max_turns_reached" and len(srv.requests) == 3


def test_tool_env_rejects_completion_mode_and_duplicate_tools():
    with pytest.raises(ConfigError, match="message_type='chat'"):
        ToolEnv(tools=[add], dataset=ROWS, message_type="completion")
    with pytest.raises(ConfigError, match="unique"):
        ToolEnv(tools=[add, add], dataset=ROWS)
