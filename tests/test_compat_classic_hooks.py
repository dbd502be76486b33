"""vfkit.compat.verifiers, continued: classic imports, state keys and hooks that real
verifiers environments use (submodules, final_env_response, self-play, sync clients)."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest
from openai import OpenAI

import vfkit
import vfkit.compat.verifiers as vf
from vfkit.testing.scripted_server import Reply, TestServer


def tool_schema(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


SUBMODULE_IMPORTS = '''
from verifiers.envs.multiturn_env import MultiTurnEnv
from verifiers.parsers import XMLParser
from verifiers.rubrics.judge_rubric import JudgeRubric
from verifiers.types import ChatMessages, ModelResponse
from verifiers.utils.async_utils import maybe_await
from verifiers.utils.data_utils import BOXED_SYSTEM_PROMPT, extract_boxed_answer
from verifiers.utils.tool_utils import convert_func_to_oai_tool


def load_environment():
    import verifiers as vf

    assert MultiTurnEnv is vf.MultiTurnEnv and XMLParser is vf.XMLParser
    assert JudgeRubric is vf.JudgeRubric and "boxed" in BOXED_SYSTEM_PROMPT
    return vf.SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}],
                            system_prompt=BOXED_SYSTEM_PROMPT)
'''


def test_classic_submodule_imports_are_served_or_refused_by_name(tmp_path, monkeypatch) -> None:
    """verifiers' own examples import classes from submodules (verifiers.rubrics.judge_rubric,
    ...): they failed with "No module named", whose advice (install verifiers) cannot help."""
    (tmp_path / "classic_submodules.py").write_text(SUBMODULE_IMPORTS)
    (tmp_path / "classic_unknown_module.py").write_text(
        "from verifiers.utils.message_utils import concat_messages\n")
    (tmp_path / "classic_missing_class.py").write_text(
        "from verifiers.envs.textarena_env import TextArenaEnv\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        env = vfkit.load_environment("classic-submodules")
        assert "boxed" in env.system_prompt
        with pytest.raises(Exception, match=r"verifiers\.utils\.message_utils .*not provided"):
            vfkit.load_environment("classic-unknown-module")
        with pytest.raises(Exception, match="no TextArena bridge exists in vfkit"):
            vfkit.load_environment("classic-missing-class")
    finally:
        for name in ("classic_submodules", "classic_unknown_module", "classic_missing_class"):
            sys.modules.pop(name, None)
    assert not [name for name in sys.modules if name.split(".")[0] == "verifiers"]
    import importlib.util

    assert importlib.util.find_spec("verifiers") is None  # the finder is gone too


def test_classic_maybe_await_takes_the_function_and_its_arguments() -> None:
    from vfkit.compat.verifiers.utils.async_utils import maybe_await

    async def add(a, b):
        return a + b

    assert asyncio.run(maybe_await(add, 1, b=2)) == 3
    assert asyncio.run(maybe_await(lambda a: a * 2, 4)) == 8


def test_env_group_takes_its_environments_positionally_as_classic_examples_do() -> None:
    """verifiers' math_group example: vf.EnvGroup([env1, env2], env_names=[...]). The list
    landed in `oai_tools` and the call failed with "missing argument: 'envs'"."""
    first = vf.SingleTurnEnv(dataset=[{"question": "a?", "answer": "a"}])
    second = vf.SingleTurnEnv(dataset=[{"question": "b?", "answer": "b"}])
    group = vf.EnvGroup([first, second], env_names=["first", "second"])
    assert group.env_names == ["first", "second"] and group.classic_oai_tools is None
    assert sorted(group.get_dataset()["task"]) == ["first", "second"]


class EndsTheGame(vf.MultiTurnEnv):
    """verifiers 0.1.9+: the environment ends a rollout by setting state["final_env_response"]."""

    def __init__(self, returns_it: bool, **kwargs):
        super().__init__(**kwargs)
        self.returns_it = returns_it

    async def env_response(self, messages, state, **kwargs):
        if state["turn"] < 2:
            return [{"role": "user", "content": "again"}]
        state["final_env_response"] = [{"role": "user", "content": "Game over."}]
        return state["final_env_response"] if self.returns_it else []


@pytest.mark.parametrize("returns_it", [True, False])
def test_final_env_response_ends_the_rollout_with_those_messages(returns_it) -> None:
    """It was ignored: the model kept playing until max_turns, and those turns were trained on."""
    env = EndsTheGame(returns_it, dataset=[{"question": "play", "answer": "x"}], max_turns=6)
    with TestServer("move") as srv:
        out = env.evaluate_sync(srv.client(), "m", num_examples=1)
        calls = len(srv.requests)
    state = out.states[0]
    assert calls == 2 and state["stop_condition"] == "has_final_env_response"
    assert [m["content"] for m in state["completion"]] == ["move", "again", "move", "Game over."]


def test_a_sync_client_leaves_no_http_pool_to_a_closed_loop(caplog) -> None:
    """evaluate_sync with a sync OpenAI client ran on an async copy that was never closed: the
    next event loop's garbage collection tried to close it on the dead loop and logged "Task
    exception was never retrieved ... Event loop is closed"."""
    import gc

    gc.collect()  # earlier tests' clients: collected now, outside any loop

    env = vf.SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}])
    with TestServer("ok") as srv:
        env.evaluate_sync(OpenAI(base_url=srv.base_url, api_key="x"), "m", num_examples=1)

    async def a_later_loop() -> None:
        gc.collect()
        await asyncio.sleep(0.2)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(a_later_loop())
    assert "Event loop is closed" not in caplog.text


class SelfPlay(vf.MultiTurnEnv):
    """Classic state keys: `input`, `client` and `model` (the opponent is the same model),
    and `oai_tools` set per rollout (None: this rollout has no tools)."""

    async def setup_state(self, state, **kwargs):
        state["seen"] = state["input"]["question"]
        state["oai_tools"] = None
        return state

    async def env_response(self, messages, state, **kwargs):
        reply = await state["client"].chat.completions.create(
            model=state["model"], messages=[{"role": "user", "content": "your move"}])
        return [{"role": "user", "content": "opponent: " + reply.choices[0].message.content}]


def test_classic_state_keys_input_client_model_and_per_rollout_tools() -> None:
    env = SelfPlay(dataset=[{"question": "play", "answer": "x"}], max_turns=2,
                   oai_tools=[tool_schema("shout")])
    with TestServer("move") as srv:
        state = env.evaluate_sync(srv.client(), "m", num_examples=1).states[0]
        bodies = list(srv.requests)
    assert not state.get("error") and state["seen"] == "play" and state["model"] == "m"
    assert [m["content"] for m in state["completion"]][:2] == ["move", "opponent: move"]
    assert not any(b.get("tools") for b in bodies)  # state["oai_tools"] = None was honoured
    assert "client" not in state  # a live object is not kept in the results


class FlakyGame(vf.MultiTurnEnv):
    """env_response raises for one of the two examples."""

    async def env_response(self, messages, state, **kwargs):
        if state["answer"] == "bad":
            raise RuntimeError("the game engine crashed")
        return [{"role": "user", "content": "again"}]


def test_classic_metadata_leaves_failed_rollouts_out_of_the_average() -> None:
    """A crashed rollout's reward 0 was averaged in (avg 0.5 where every rollout that ran got 1)."""
    rows = [{"question": "q1", "answer": "good"}, {"question": "q2", "answer": "bad"}]
    env = FlakyGame(dataset=rows, max_turns=2, rubric=vf.Rubric(funcs=[lambda completion: 1.0]))
    with TestServer("move") as srv:
        meta = env.evaluate_sync(srv.client(), "m", num_examples=2).metadata
    assert meta["avg_reward"] == 1.0
    assert (meta["scored_rollouts"], meta["errored_rollouts"]) == (1, 1)


def argparse_tool(flag: str) -> str:
    """A tool that parses its input with argparse, which exits on a bad value.

    Args:
        flag: the flag
    """
    raise SystemExit(2)


class ClassicCallTool(vf.ToolEnv):
    async def call_tool(self, tool_name, tool_args, tool_call_id, **kwargs):
        result = self.tool_map[tool_name](**tool_args)
        return {"role": "tool", "content": str(result), "tool_call_id": tool_call_id}


def test_a_classic_tool_that_exits_gets_a_tool_message_and_the_batch_goes_on() -> None:
    env = ClassicCallTool(dataset=[{"question": "q", "answer": "a"}] * 2, tools=[argparse_tool],
                          max_turns=2)
    call = Reply(tool_calls=[{"name": "argparse_tool", "arguments": {"flag": "-x"}}])

    def reply(body):  # a tool call, then "done" once its result is in
        return "done" if body["messages"][-1]["role"] == "tool" else call

    with TestServer(reply) as srv:
        states = env.evaluate_sync(srv.client(), "m", num_examples=2).states
    assert len(states) == 2 and not any(s.get("error") for s in states)
    assert all("SystemExit" in s["completion"][1]["content"] for s in states)


def test_blocking_calls_reuse_one_async_client() -> None:
    env = vf.SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}])
    with TestServer("ok") as srv:
        client = srv.client()
        for _ in range(3):  # each blocking call's loop ends: the client must still work
            states = env.evaluate_sync(client, "m", num_examples=1).states
            assert not states[0].get("error"), states[0]["error"]
