"""calculator: tool calls (right, wrong, malformed) through the test server, reward and metrics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from openai import AsyncOpenAI

import vfkit as vf
from vfkit.testing.scripted_server import Reply, TestServer

ENV_DIR = str(Path(__file__).resolve().parents[1])
if ENV_DIR not in sys.path:  # importable from a checkout, installed or not
    sys.path.insert(0, ENV_DIR)

import vfkit_calculator as calculator  # noqa: E402  # after the path line above


def call(name: str, arguments) -> Reply:
    return Reply(tool_calls=[{"name": name, "arguments": arguments}])


async def _run(script) -> tuple[dict, list[dict]]:
    env = vf.load_environment("calculator", num_eval_examples=1)
    row = env.get_eval_dataset()[0]
    assert (row["question"], row["answer"]) == ("What is (10 * 3) - 9?", "21")
    with TestServer(script) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            state = await env.run_rollout(row, client, "m")
    assert {t["function"]["name"] for t in server.requests[0]["tools"]} == {
        "add", "subtract", "multiply", "divide"}
    tool_messages = [m for m in state["completion"] if m["role"] == "tool"]
    return state, tool_messages


def test_tools_compute_and_expressions_are_seeded() -> None:
    assert (calculator.add(2, 3), calculator.subtract(2, 3)) == (5, -1)
    assert (calculator.multiply(4, 2.5), calculator.divide(7, 2)) == (10, 3.5)
    with pytest.raises(ZeroDivisionError):
        calculator.divide(1, 0)
    rows = calculator.make_rows(20, 3, num_operations=3, max_operand=9)
    assert rows == calculator.make_rows(20, 3, num_operations=3, max_operand=9)
    for row in rows:  # the stated answer is the expression's value
        assert eval(row["question"].removeprefix("What is ").rstrip("?")) == int(row["answer"])


async def test_right_answer_with_tool_calls() -> None:
    state, tools = await _run([call("multiply", {"a": 10, "b": 3}),
                               call("subtract", {"a": 30, "b": 9}), "<answer>21</answer>"])
    assert state["error"] is None and state["stop_condition"] == "no_tools_called"
    assert [m["content"] for m in tools] == ["30", "21"]
    assert state["reward"] == 1.0
    assert state["metrics"]["total_tool_calls"] == 2.0
    assert state["metrics"]["multiply_calls"] == 1.0 and state["metrics"]["add_calls"] == 0.0


async def test_wrong_answer_without_tools() -> None:
    state, tools = await _run(["The answer is 20."])
    assert tools == [] and state["reward"] == 0.0
    assert state["metrics"]["total_tool_calls"] == 0.0


async def test_malformed_calls_become_error_messages_and_the_rollout_goes_on() -> None:
    state, tools = await _run([
        call("add", "{not json"), call("power", {"a": 2, "b": 3}),
        call("divide", {"a": 1, "b": 0}), call("multiply", {"a": 10}), "I think it is 21",
    ])
    assert state["error"] is None
    assert [m["content"].split(":")[0] for m in tools] == ["Error"] * 4
    assert "unknown tool 'power'" in tools[1]["content"]
    assert "ZeroDivisionError" in tools[2]["content"]
    assert state["reward"] == 1.0  # the last number of the final reply, no tags needed
    assert state["metrics"]["total_tool_calls"] == 4.0


async def test_running_out_of_turns_scores_zero() -> None:
    state, _ = await _run([call("add", {"a": 1, "b": 1})] * 6)
    assert state["stop_condition"] == "max_turns_reached"
    assert state["reward"] == 0.0
