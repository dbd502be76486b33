"""MultiTurnEnv: env responses, @stop conditions, max_turns, completion mode, max_seq_len."""

from __future__ import annotations

import re

import pytest

from vfkit.envs.multiturn_env import MultiTurnEnv, stop
from vfkit.errors import ConfigError
from vfkit.rubrics.rubric import Rubric
from vfkit.testing.scripted_server import TestServer

ROWS = [{"question": "Guess my number (1-9).", "answer": "3"}]


class GuessEnv(MultiTurnEnv):
    """Says higher/lower until the model guesses the answer."""

    async def env_response(self, messages, state):
        guess = messages[-1]["content"].strip()
        state["solved"] = guess == state["answer"]
        hint = "correct" if state["solved"] else ("higher" if guess < state["answer"] else "lower")
        return [{"role": "user", "content": hint}], state

    @stop
    def solved(self, state) -> bool:
        return state.get("solved", False)


def solved_reward(state) -> float:
    return float(state.get("solved", False))


async def test_turns_alternate_until_the_stop_condition():
    env = GuessEnv(dataset=ROWS, max_turns=10, rubric=Rubric(funcs=[solved_reward]))
    with TestServer(["1", "5", "3", "never asked"]) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert [m["content"] for m in state["completion"]] == [
        "1", "higher", "5", "lower", "3", "correct"
    ]
    assert state["stop_condition"] == "solved" and state["turn"] == 3 and state["reward"] == 1.0
    assert len(state["trajectory"]) == 3 and len(srv.requests) == 3
    # each model call saw the whole conversation so far
    assert srv.requests[2]["messages"][-1] == {"role": "user", "content": "lower"}
    assert state["trajectory"][2]["prompt"] == [*state["prompt"], *state["completion"][:4]]


async def test_max_turns_stops_the_rollout():
    env = GuessEnv(dataset=ROWS, max_turns=2)
    with TestServer("9") as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["stop_condition"] == "max_turns_reached" and state["turn"] == 2
    # the last model turn ends the rollout: no env response after it
    assert [m["role"] for m in state["completion"]] == ["assistant", "user", "assistant"]


@pytest.mark.parametrize("max_turns", [None, "3", 2.5, True])
def test_max_turns_must_be_an_int(max_turns):
    with pytest.raises(ConfigError, match=re.escape(
            f"max_turns must be an int (model turns per rollout; <= 0 means no limit), "
            f"not {max_turns!r}")):
        GuessEnv(dataset=ROWS, max_turns=max_turns)


async def test_max_turns_zero_or_less_means_no_limit():
    env = GuessEnv(dataset=ROWS, max_turns=-1)
    with TestServer(["9"] * 11 + ["3"]) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["turn"] == 12 and state["stop_condition"] == "solved"  # past the default 10


class PriorityEnv(GuessEnv):
    @stop(priority=5)
    async def said_stop(self, state) -> bool:
        return bool(state["completion"]) and "stop" in str(state["completion"][-1]["content"])


async def test_async_stop_with_priority_wins_over_max_turns():
    env = PriorityEnv(dataset=ROWS, max_turns=1)
    with TestServer("stop") as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["stop_condition"] == "said_stop"
    names = [name for name, _ in env.stop_conditions]
    assert names[:2] == ["prompt_too_long", "max_tokens_reached"]
    assert names[-1] == "max_turns_reached"
    assert names.index("said_stop") < names.index("solved")


class CountdownEnv(MultiTurnEnv):
    """Completion mode: the environment appends text; stops after the model writes 'done'."""

    async def setup_state(self, state):
        state["appended"] = 0
        return state

    def env_response(self, messages, state):  # sync hooks work too
        state["appended"] += 1
        return f"\n[env {state['appended']}]\n"

    @stop
    def done(self, state) -> bool:
        return state["completion"].rstrip().endswith("done")


async def test_completion_mode_multi_turn():
    env = CountdownEnv(dataset=[{"prompt": "Count:", "answer": ""}], message_type="completion")
    with TestServer(["one", "two", "done"]) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["completion"] == "one\n[env 1]\ntwo\n[env 2]\ndone"
    assert state["stop_condition"] == "done" and state["appended"] == 2
    assert srv.requests[2]["prompt"] == "Count:one\n[env 1]\ntwo\n[env 2]\n"
    assert [step["completion"] for step in state["trajectory"]] == ["one", "two", "done"]


class EnvSaysEnough(MultiTurnEnv):
    """The environment ends the game itself; its final message is still part of the completion."""

    async def env_response(self, messages, state):
        state["over"] = True
        return [{"role": "user", "content": "game over"}]

    @stop
    def over(self, state) -> bool:
        return state.get("over", False)


async def test_stop_set_by_env_response_ends_before_the_next_model_call():
    env = EnvSaysEnough(dataset=ROWS, max_turns=5)
    with TestServer(["1", "2"]) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["completion"][-1]["content"] == "game over" and state["turn"] == 1
    assert state["stop_condition"] == "over" and len(srv.requests) == 1


async def test_env_response_error_is_recorded_with_partial_state():
    class Broken(MultiTurnEnv):
        async def env_response(self, messages, state):
            raise KeyError("board")

    env = Broken(dataset=ROWS, max_turns=3)
    with TestServer("1") as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["error"] == "KeyError: 'board' (raised in Broken.env_response)"
    assert state["stop_condition"] == "error"
    assert state["turn"] == 1 and state["completion"][0]["content"] == "1"
    assert state["reward"] == 0.0


async def test_system_exit_in_env_response_is_a_rollout_error():
    class Exits(MultiTurnEnv):
        async def env_response(self, messages, state):
            raise SystemExit(1)

    env = Exits(dataset=ROWS, max_turns=3)
    with TestServer("1") as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["error"] == "SystemExit: 1 (raised in Exits.env_response)"
    assert state["stop_condition"] == "error"
    assert state["turn"] == 1 and state["reward"] == 0.0


class Replies(MultiTurnEnv):
    """env_response returns whatever the test gives it."""

    def __init__(self, reply, **kwargs):
        super().__init__(**kwargs)
        self.reply = reply

    def env_response(self, messages, state):
        return self.reply


CHAT_SHAPE = ("Replies.env_response must return a list of messages, each a dict with 'role' "
              "and 'content' (e.g. [{'role': 'user', 'content': 'try again'}]); it returned ")


@pytest.mark.parametrize(("reply", "message_type", "expected"), [
    ("try again", "chat", CHAT_SHAPE + "'try again'"),  # was split into one message per char
    (42, "chat", CHAT_SHAPE + "42"),
    ({"content": "no role"}, "chat",
     CHAT_SHAPE + "{'content': 'no role'} (message 0: {'content': 'no role'})"),
    ([{"role": "user", "content": "ok"}, "and more"], "chat",
     CHAT_SHAPE + "[{'role': 'user', 'content': 'ok'}, 'and more'] (message 1: 'and more')"),
    ([{"role": "user", "content": "try again"}], "completion",
     "Replies.env_response must return a str in completion mode (the text added to the "
     "prompt); it returned [{'role': 'user', 'content': 'try again'}]"),
])
async def test_a_malformed_env_response_is_a_rollout_error_naming_it(reply, message_type, expected):
    env = Replies(reply, dataset=ROWS, max_turns=3, message_type=message_type)
    with TestServer("4") as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["error"] == f"TypeError: {expected}" and state["stop_condition"] == "error"
    assert len(srv.requests) == 1  # nothing malformed was sent to the server
    assert state["turn"] == 1 and state["reward"] == 0.0


@pytest.mark.parametrize(("reply", "message_type"), [
    ({"role": "user", "content": "a lone message"}, "chat"),
    (({"role": "user", "content": "a tuple"},), "chat"),
    (" and", "completion"),
])
async def test_well_formed_env_responses_are_appended(reply, message_type):
    env = Replies(reply, dataset=ROWS, max_turns=2, message_type=message_type)
    with TestServer("4") as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["error"] is None and state["turn"] == 2
    if message_type == "chat":
        assert state["completion"][1]["content"] == srv.requests[1]["messages"][-1]["content"]
    else:
        assert state["completion"] == "4 and4"


class BrokenStop(GuessEnv):
    @stop
    def board_full(self, state) -> bool:
        return state["board"] == []


class ClassicIsCompleted(GuessEnv):
    async def is_completed(self, messages, state, **kwargs):  # classic verifiers' signature
        return len(state["completion"]) >= 3


async def test_a_raising_stop_condition_or_is_completed_names_the_hook():
    with TestServer("1") as srv:
        broken = await BrokenStop(dataset=ROWS).run_rollout(ROWS[0], srv.client(), "m")
        classic = await ClassicIsCompleted(dataset=ROWS).run_rollout(ROWS[0], srv.client(), "m")
    assert broken["error"] == "KeyError: 'board' (raised in stop condition 'board_full')"
    assert classic["error"] == (
        "TypeError: ClassicIsCompleted.is_completed() missing 1 required positional argument: "
        "'state' (raised in ClassicIsCompleted.is_completed)")
    assert broken["stop_condition"] == classic["stop_condition"] == "error"
    assert srv.requests == []


async def test_max_seq_len_caps_max_tokens_and_stops_when_full():
    env = GuessEnv(dataset=ROWS, max_turns=10)
    with TestServer("9" * 10) as srv:
        first = await env.run_rollout(env.get_dataset()[0], srv.client(), "m", {"max_tokens": 50})
        tokens = first["trajectory"][0]["tokens"]
        used = len(tokens["prompt_ids"]) + len(tokens["completion_ids"])
        env.set_max_seq_len(used + 20)
        srv.requests.clear()
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m", {"max_tokens": 50})
    # turn 2: at least `used` tokens are known, so max_tokens = (used + 20) - used = 20
    assert srv.requests[1]["max_tokens"] == 20
    assert state["is_truncated"] and state["error"] is None
    # turn 2's prompt adds the hint's ~26 tokens to `used`: past max_seq_len, so it is marked
    # overlong (ids cut to max_seq_len, completion dropped) and the rollout stops
    assert state["stop_condition"] == "prompt_too_long"
    assert state["trajectory"][1]["tokens"]["overlong_prompt"]
    for step in state["trajectory"]:
        t = step["tokens"]
        assert len(t["prompt_ids"]) + len(t["completion_ids"]) <= used + 20


async def test_known_full_context_stops_without_calling_the_model():
    env = GuessEnv(dataset=ROWS, max_turns=10)
    with TestServer("9") as srv:
        first = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
        tokens = first["trajectory"][0]["tokens"]
        env.set_max_seq_len(len(tokens["prompt_ids"]) + len(tokens["completion_ids"]))
        srv.requests.clear()
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert len(srv.requests) == 1 and state["turn"] == 1  # turn 2 would not fit: not sent
    assert state["stop_condition"] == "prompt_too_long" and state["is_truncated"]
