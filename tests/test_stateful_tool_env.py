"""StatefulToolEnv: hidden tool arguments come from the rollout's state, not from the model."""

from __future__ import annotations

import pytest

from vfkit.envs.stateful_tool_env import StatefulToolEnv
from vfkit.errors import ConfigError
from vfkit.testing.scripted_server import Reply, TestServer

ROWS = [{"question": "Store then read.", "answer": "", "info": {"user": "ada"}}]


def write_note(text: str, store: dict, owner: str) -> str:
    """Save a note.

    Args:
        text: The note.
        store: Hidden: the rollout's note store.
        owner: Hidden: who owns the note.
    """
    store.setdefault(owner, []).append(text)
    return f"saved {len(store[owner])}"


def count_words(text: str) -> int:
    """Count words (a plain tool with no hidden arguments)."""
    return len(text.split())


class NotesEnv(StatefulToolEnv):
    def __init__(self, **kwargs):
        super().__init__(tools=[count_words], **kwargs)
        self.add_tool(write_note, args_to_skip=["store", "owner"])
        self.seen_args: list[dict] = []

    async def setup_state(self, state):
        state["store"] = {}
        return state

    async def update_tool_args(self, tool_name, tool_args, messages, state):
        self.seen_args.append(dict(tool_args))
        if tool_name == "write_note":
            return {**tool_args, "store": state["store"], "owner": state["info"]["user"]}
        return tool_args


def test_hidden_args_are_not_in_the_schema():
    env = NotesEnv(dataset=ROWS)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in env.oai_tools}
    assert set(schemas["write_note"]["properties"]) == {"text"}
    assert schemas["write_note"]["required"] == ["text"]
    assert env.skipped_args == {"count_words": [], "write_note": ["store", "owner"]}


async def test_hidden_args_are_injected_from_state():
    script = [
        Reply(tool_calls=[{"name": "write_note", "arguments": {"text": "hello"}}]),
        # a model guessing a hidden argument does not get to set it
        Reply(tool_calls=[{"name": "write_note", "arguments": {"text": "x", "owner": "eve"}},
                          {"name": "count_words", "arguments": {"text": "a b c"}}]),
        "done",
    ]
    env = NotesEnv(dataset=ROWS)
    with TestServer(script) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    tools_said = [m["content"] for m in state["completion"] if m["role"] == "tool"]
    assert tools_said == ["saved 1", "saved 2", "3"]
    assert state["store"] == {"ada": ["hello", "x"]}
    assert env.seen_args[1] == {"text": "x"}  # "owner" stripped before update_tool_args
    assert all("store" not in t["function"]["parameters"]["properties"]
               for t in srv.requests[0]["tools"])
    assert state["error"] is None and state["stop_condition"] == "no_tools_called"


async def test_unknown_tool_is_reported_without_calling_update():
    env = NotesEnv(dataset=ROWS)
    script = [Reply(tool_calls=[{"name": "delete_all", "arguments": {}}]), "ok"]
    with TestServer(script) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["completion"][1]["content"].startswith("Error: unknown tool 'delete_all'")
    assert env.seen_args == []


class BrokenUpdate(StatefulToolEnv):
    """update_tool_args gets one of the author's mistakes, chosen by `mode`."""

    def __init__(self, mode: str, **kwargs):
        super().__init__(**kwargs)
        self.mode = mode
        self.add_tool(write_note, args_to_skip=["store", "owner"])

    def update_tool_args(self, tool_name, tool_args, messages, state):
        if self.mode == "raises":
            raise KeyError("store")
        if self.mode == "mutates":  # sets the arguments in place and forgets to return them
            tool_args.update(store={}, owner="ada")
            return None
        if self.mode == "string":
            return "store=1"
        return {**tool_args, "store": {}}  # "partial": forgets owner


class NoUpdate(StatefulToolEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_tool(write_note, args_to_skip=["store", "owner"])


@pytest.mark.parametrize(("make_env", "expected"), [
    (lambda: BrokenUpdate("raises", dataset=ROWS),
     "RolloutError: BrokenUpdate.update_tool_args raised KeyError: 'store' (tool 'write_note')"),
    (lambda: BrokenUpdate("mutates", dataset=ROWS),
     "RolloutError: BrokenUpdate.update_tool_args must return the tool's arguments as a dict, "
     "e.g. {**tool_args, 'store': ...}; for tool 'write_note' it returned None"),
    (lambda: BrokenUpdate("string", dataset=ROWS),
     "RolloutError: BrokenUpdate.update_tool_args must return the tool's arguments as a dict, "
     "e.g. {**tool_args, 'store': ...}; for tool 'write_note' it returned 'store=1'"),
    (lambda: BrokenUpdate("partial", dataset=ROWS),
     "RolloutError: BrokenUpdate.update_tool_args set no value for the hidden argument(s) "
     "['owner'] of tool 'write_note'; override update_tool_args to return {**tool_args, "
     "'owner': ...}"),
    (lambda: NoUpdate(dataset=ROWS),
     "RolloutError: NoUpdate.update_tool_args set no value for the hidden argument(s) "
     "['store', 'owner'] of tool 'write_note'; override update_tool_args to return "
     "{**tool_args, 'store': ...}"),
])
async def test_update_tool_args_mistakes_are_rollout_errors_not_tool_messages(make_env, expected):
    env = make_env()
    script = [Reply(tool_calls=[{"name": "write_note", "arguments": {"text": "hi"}}]), "done"]
    with TestServer(script) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["error"] == expected and state["stop_condition"] == "error"
    assert state["reward"] == 0.0
    assert [m["role"] for m in state["completion"]] == ["assistant"]  # no tool message
    assert len(srv.requests) == 1  # the model was not asked to recover from it


def test_a_hidden_argument_the_tool_does_not_take_is_a_construction_error():
    class Typo(StatefulToolEnv):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.add_tool(write_note, args_to_skip=["store", "ownr"])

    with pytest.raises(ConfigError, match=r"tool 'write_note' has no parameter\(s\) \['ownr'\] "
                       r"to hide .*its parameters are \['text', 'store', 'owner'\]"):
        Typo(dataset=ROWS)


async def test_hidden_arguments_with_defaults_or_kwargs_need_no_update():
    def greet(name: str, greeting: str = "hi", **extra) -> str:
        """Greet."""
        return f"{greeting} {name}"

    class Env(StatefulToolEnv):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.add_tool(greet, args_to_skip=["greeting", "trace_id"])  # **extra takes trace_id

    env = Env(dataset=ROWS)  # trace_id is no typo: **extra takes it
    script = [Reply(tool_calls=[{"name": "greet", "arguments": {"name": "ada"}}]), "done"]
    with TestServer(script) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["error"] is None and state["completion"][1]["content"] == "hi ada"
