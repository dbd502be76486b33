"""The rollout engine: datasets, groups, concurrency, scoring, retries, overflow, failures."""

from __future__ import annotations

import asyncio
import gc
import re
import sys

import pytest

from vfkit.envs.environment import Environment, GenerateOutputs
from vfkit.envs.singleturn_env import SingleTurnEnv
from vfkit.errors import ConfigError
from vfkit.rubrics.rubric import Rubric
from vfkit.testing.scripted_server import TestServer

ROWS = [{"question": f"q{i}", "answer": str(i)} for i in range(6)]


def echo_digit(body: dict) -> str:
    return body["messages"][-1]["content"].removeprefix("q")


def exact(completion, answer) -> float:
    return float(completion[-1]["content"] == answer)


def test_dataset_formatting_and_selection():
    few = [{"role": "user", "content": "q9"}, {"role": "assistant", "content": "9"}]
    env = SingleTurnEnv(dataset=ROWS, system_prompt="S", few_shot=few, env_id="digits")
    row = env.get_dataset()[2]
    assert row["prompt"] == [{"role": "system", "content": "S"}, *few,
                             {"role": "user", "content": "q2"}]
    assert row["example_id"] == 2 and row["task"] == "digits" and row["answer"] == "2"
    assert len(env.get_dataset(n=3)) == 3 and len(env.get_dataset(n=100)) == 6
    shuffled = [r["example_id"] for r in env.get_dataset(n=4, seed=1)]
    assert shuffled == [r["example_id"] for r in env.get_dataset(n=4, seed=1)]
    assert sorted(r["example_id"] for r in env.get_dataset(seed=1)) == list(range(6))
    assert len(env.get_eval_dataset(n=2)) == 2  # falls back to the training rows
    env2 = SingleTurnEnv(dataset=ROWS, eval_dataset=ROWS[:1])
    assert len(env2.get_eval_dataset()) == 1


def test_configuration_errors_name_the_problem():
    with pytest.raises(ConfigError, match="message_type"):
        SingleTurnEnv(dataset=ROWS, message_type="chatty")
    with pytest.raises(ConfigError, match="has no dataset"):
        SingleTurnEnv().get_dataset()
    with pytest.raises(ConfigError, match="neither 'prompt' nor 'question'"):
        SingleTurnEnv(dataset=[{"text": "x"}])


FEW = [{"role": "user", "content": "q9"}, {"role": "assistant", "content": "9"}]


def test_few_shot_in_completion_mode_is_an_error():
    with pytest.raises(ConfigError, match=re.escape(
            "few_shot needs message_type='chat' (it is a list of chat messages); in completion "
            "mode write the examples into system_prompt or the prompt column instead")):
        SingleTurnEnv(dataset=ROWS, few_shot=FEW, message_type="completion")


def test_few_shot_beside_a_prompt_column_is_warned_about(caplog):
    rows = [{"prompt": [{"role": "user", "content": "q0"}], "answer": "0"}]
    with caplog.at_level("WARNING", logger="vfkit.envs.dataset"):
        env = SingleTurnEnv(dataset=rows, few_shot=FEW)
    assert env.get_dataset()[0]["prompt"] == rows[0]["prompt"]  # used as it is
    assert caplog.messages == [
        "few_shot is not used: the dataset has a 'prompt' column, whose prompts are used as "
        "they are; put the examples into those prompts, or give the rows a 'question' column "
        "instead"]


@pytest.mark.parametrize(("questions", "row", "shown"), [
    (["q0", "q1", None], 2, "None (NoneType)"),  # sent a user message without content
    ([3, 4, 5], 0, "3 (int)"),  # a server 400 that named nothing
])
def test_a_question_that_is_not_text_is_an_error_naming_its_row(questions, row, shown):
    with pytest.raises(ConfigError, match=re.escape(
            f"dataset row {row}: 'question' must be a str, not {shown}; convert it (str(...)) "
            "or drop the row")):
        SingleTurnEnv(dataset=[{"question": q} for q in questions])


def test_a_column_of_mixed_types_is_an_error_naming_it_and_two_rows():
    rows = [{"question": "q0", "answer": 4}, {"question": "q1", "answer": "four"}]
    with pytest.raises(ConfigError, match=re.escape(
            "dataset column 'answer' mixes types that Arrow cannot store in one column: row 0 "
            "has 4 (int), row 1 has 'four' (str); give the column one type in every row")):
        SingleTurnEnv(dataset=rows)


async def test_generate_groups_order_advantages_and_on_group():
    env = SingleTurnEnv(dataset=ROWS[:3], rubric=Rubric(funcs=[exact]))
    seen: list[list[int]] = []

    zeros = []

    def reply(body: dict) -> str:  # example 0: one right and one wrong answer
        digit = echo_digit(body)
        if digit == "0":
            zeros.append(1)
            return "0" if len(zeros) == 1 else "wrong"
        return digit

    async def on_group(states):
        seen.append([s["example_id"] for s in states])

    with TestServer(reply) as srv:
        out = await env.generate(env.get_dataset(), srv.client(), "m", rollouts_per_example=2,
                                 on_group=on_group)
    assert isinstance(out, GenerateOutputs) and len(out) == 6
    assert out.example_id == [0, 0, 1, 1, 2, 2]
    assert sorted(seen) == [[0, 0], [1, 1], [2, 2]]
    # group 0 scored {1, 0}: mean 0.5, advantages +0.5 and -0.5; the others all 1: advantage 0
    assert sorted(out.reward[:2]) == [0.0, 1.0] and sorted(out.advantage[:2]) == [-0.5, 0.5]
    assert out.reward[2:] == [1.0, 1.0, 1.0, 1.0] and out.advantage[2:] == [0.0] * 4
    assert set(out.metrics) >= {"exact"} and len(out.metrics["exact"]) == 6


class CountingEnv(SingleTurnEnv):
    """Counts model calls in flight to check the generation semaphore."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.in_flight = self.peak = 0

    async def get_model_response(self, *args, **kwargs):
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await super().get_model_response(*args, **kwargs)
        finally:
            self.in_flight -= 1


async def test_generation_and_scoring_concurrency_are_bounded():
    scoring = {"now": 0, "peak": 0}

    async def slow_reward(completion) -> float:
        scoring["now"] += 1
        scoring["peak"] = max(scoring["peak"], scoring["now"])
        await asyncio.sleep(0.02)
        scoring["now"] -= 1
        return 1.0

    env = CountingEnv(dataset=ROWS, rubric=Rubric(funcs=[slow_reward]))
    with TestServer(echo_digit) as srv:
        srv.delay_next(0.05, n=12)
        out = await env.generate(env.get_dataset(), srv.client(), "m", rollouts_per_example=2,
                                 max_concurrent=3, max_concurrent_scoring=1)
    assert len(out) == 12 and out.reward == [1.0] * 12
    assert env.peak == 3
    assert scoring["peak"] == 2  # one group at a time; the rubric scores its 2 rollouts together


async def test_reward_function_that_raises_scores_zero_and_is_reported():
    def broken(completion) -> float:
        raise RuntimeError("judge down")

    env = SingleTurnEnv(dataset=ROWS[:2], rubric=Rubric(funcs=[exact, broken]))
    with TestServer(echo_digit) as srv:
        out = await env.generate(env.get_dataset(), srv.client(), "m")
    assert out.reward == [1.0, 1.0]  # exact still counts; broken scores 0
    assert out.metrics["broken"] == [0.0, 0.0]
    assert all("judge down" in e for e in out.error)


@pytest.mark.parametrize("answer", [0, False, "0", 0.0])
async def test_falsy_answers_reach_reward_functions_unchanged(answer):
    seen = []

    def record(completion, answer) -> float:
        seen.append(answer)
        return 1.0

    env = SingleTurnEnv(dataset=[{"question": "3-3?", "answer": answer}],
                        rubric=Rubric(funcs=[record]))
    with TestServer("0") as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert seen == [answer] and type(seen[0]) is type(answer)
    assert state["answer"] == answer and state["error"] is None


async def test_math_rubric_grades_a_zero_answer():
    from vfkit.rubrics.math_rubric import MathRubric

    env = SingleTurnEnv(dataset=[{"question": "3-3?", "answer": 0}], rubric=MathRubric())
    with TestServer(r"\boxed{0}") as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["reward"] == 1.0 and state["error"] is None


class FlakyEnv(SingleTurnEnv):
    async def rollout(self, input, client, model, sampling_args):
        if input["example_id"] == 1:
            raise ValueError("sandbox exploded")
        return await super().rollout(input, client, model, sampling_args)


async def test_failed_rollout_is_recorded_and_the_batch_continues():
    env = FlakyEnv(dataset=ROWS[:3], rubric=Rubric(funcs=[exact]))
    with TestServer(echo_digit) as srv:
        out = await env.generate(env.get_dataset(), srv.client(), "m")
    assert out.error == [None, "ValueError: sandbox exploded", None]
    assert out.reward == [1.0, 0.0, 1.0]
    assert out.states[1]["stop_condition"] == "error"


class ExitingEnv(SingleTurnEnv):
    """Calls sys.exit (as argparse does on bad input) from the hook named by `where`."""

    def __init__(self, where: str, **kw):
        super().__init__(**kw)
        self.where = where

    async def rollout(self, input, client, model, sampling_args):
        if self.where == "rollout" and input["example_id"] == 1:
            sys.exit(2)
        return await super().rollout(input, client, model, sampling_args)


def exit_on_1(completion) -> float:
    if completion[-1]["content"] == "1":
        sys.exit("grader quit")
    return 1.0


async def async_exit_on_1(completion) -> float:
    return exit_on_1(completion)


def group_exit(completions) -> list[float]:
    sys.exit(3)


@pytest.mark.parametrize(("where", "funcs", "expected"), [
    ("rollout", [exact], {1: "SystemExit: 2"}),
    ("reward", [exit_on_1], {1: "reward function exit_on_1 raised SystemExit: grader quit"}),
    ("reward", [async_exit_on_1],
     {1: "reward function async_exit_on_1 raised SystemExit: grader quit"}),
    ("reward", [group_exit], dict.fromkeys(range(3), "reward function group_exit raised "
                                           "SystemExit: 3")),
])
def test_system_exit_in_user_code_is_recorded_and_the_batch_goes_on(where, funcs, expected):
    env = ExitingEnv(where, dataset=ROWS[:3], rubric=Rubric(funcs=funcs))
    with TestServer(echo_digit) as srv:
        out = env.evaluate(srv.client(), "m", num_examples=3)  # blocking, as vf-eval runs it
    assert out.error == [expected.get(i) for i in range(3)]
    assert [r for i, r in enumerate(out.reward) if i not in expected] == [1.0] * (3 - len(expected))
    assert all(out.reward[i] == 0.0 for i in expected)


class CustomRolloutEnv(Environment):
    """A hand-written rollout(): forgets `return state` on example 1, returns a bare dict else."""

    async def rollout(self, input, client, model, sampling_args):
        if input["example_id"] == 1:
            return None
        reply = await client.chat.completions.create(model=model, messages=input["prompt"])
        return {"completion": [{"role": "assistant", "content": reply.choices[0].message.content}]}


async def test_a_custom_rollout_may_return_a_bare_dict_but_not_none():
    env = CustomRolloutEnv(dataset=ROWS[:3], rubric=Rubric(funcs=[exact]))
    with TestServer(echo_digit) as srv:
        out = await env.generate(env.get_dataset(), srv.client(), "m")
    assert out.error[1] == ("TypeError: CustomRolloutEnv.rollout() must return the state dict "
                            "(start from self.init_state(input) and return it filled in); it "
                            "returned None (NoneType)")
    assert out.reward == [1.0, 0.0, 1.0] and out.error[0] is None and out.error[2] is None
    # the bare dicts got the keys they lacked from init_state
    assert out.answer == ["0", "1", "2"] and out.example_id == [0, 1, 2]
    assert out.states[2]["timing"]["generation_ms"] > 0 and out.states[2]["prompt"][-1] == (
        {"role": "user", "content": "q2"})


async def test_server_error_without_retries_is_a_rollout_error():
    env = SingleTurnEnv(dataset=ROWS[:2], max_retries=0)
    with TestServer(echo_digit) as srv:
        srv.fail_next(503, message="overloaded")
        out = await env.generate(env.get_dataset(), srv.client(), "m", max_concurrent=1)
    assert out.error[0].startswith("InternalServerError") and "overloaded" in out.error[0]
    assert out.error[1] is None and out.reward[0] == 0.0


@pytest.mark.parametrize("fault", ["429", "500", "timeout"])
async def test_transient_fault_then_success(fault):
    env = SingleTurnEnv(dataset=ROWS[:1], rubric=Rubric(funcs=[exact]), timeout=0.5,
                        max_retries=2)
    with TestServer(echo_digit) as srv:
        if fault == "429":
            srv.fail_next(429, retry_after=0.01)
        elif fault == "500":
            srv.fail_next(500, retry_after=0.01)
        else:
            srv.delay_next(1.5)  # longer than the 0.5 s timeout: the client retries
        state = await env.run_rollout(env.get_dataset()[0], srv.client(max_retries=0), "m")
    assert state["error"] is None and state["reward"] == 1.0
    assert len(srv.requests) == 2


async def test_context_overflow_ends_rollout_as_truncated():
    env = SingleTurnEnv(dataset=[{"question": "x" * 50, "answer": ""}])
    with TestServer("never", max_context=32) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert state["error"] is None and state["is_truncated"]
    assert state["stop_condition"] == "prompt_too_long" and state["trajectory"] == []
    assert state["reward"] == 0.0


async def test_max_seq_len_marks_overlong_prompt_tokens():
    env = SingleTurnEnv(dataset=ROWS[:1])
    env.set_max_seq_len(10)  # the ChatML prompt of "q0" is ~25 tokens
    with TestServer(echo_digit) as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    tokens = state["trajectory"][0]["tokens"]
    assert tokens["overlong_prompt"] and tokens["completion_ids"] == []
    assert len(tokens["prompt_ids"]) == 10
    assert state["is_truncated"] and state["stop_condition"] == "prompt_too_long"


def test_evaluate_is_a_blocking_wrapper():
    env = SingleTurnEnv(dataset=ROWS, rubric=Rubric(funcs=[exact]))
    with TestServer(echo_digit) as srv:
        out = env.evaluate(srv.client(), "m", num_examples=2, rollouts_per_example=3)
    assert len(out) == 6 and out.reward == [1.0] * 6


def test_one_client_serves_several_blocking_evaluate_calls(caplog):
    # earlier tests' clients, collected during this test's loops, would log their own noise
    # (openai closes a collected client's pool on whatever loop is running)
    gc.collect()
    env = SingleTurnEnv(dataset=ROWS, rubric=Rubric(funcs=[exact]))
    with TestServer(echo_digit) as srv, caplog.at_level("WARNING"):
        client = srv.client(max_retries=0)
        outs = [env.evaluate(client, "m", num_examples=2) for _ in range(3)]
        # the caller's client is still open, and usable in a loop of the caller's own
        later = asyncio.run(env.a_evaluate(client, "m", num_examples=1))
    assert [out.error for out in outs] == [[None, None]] * 3
    assert [out.reward for out in outs] == [[1.0, 1.0]] * 3 and later.reward == [1.0]
    assert not client.is_closed()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


async def test_evaluate_inside_a_running_loop_uses_a_thread():
    env = SingleTurnEnv(dataset=ROWS, rubric=Rubric(funcs=[exact]))
    with TestServer(echo_digit) as srv:
        out = env.evaluate(srv.client(), "m", num_examples=1)
        again = await env.a_evaluate(srv.client(), "m", num_examples=2, seed=3)
    assert out.reward == [1.0] and len(again) == 2


async def test_base_environment_needs_a_rollout():
    env = Environment(dataset=ROWS[:1])
    with TestServer("x") as srv:
        state = await env.run_rollout(env.get_dataset()[0], srv.client(), "m")
    assert "NotImplementedError" in state["error"] and state["reward"] == 0.0


async def test_run_group_takes_other_callers_keywords():
    env = SingleTurnEnv(dataset=ROWS[:1], rubric=Rubric(funcs=[exact]), max_retries=0)
    rows = [env.get_dataset()[0]] * 2
    with TestServer(echo_digit) as srv:
        srv.fail_next(500, retry_after=0.01)
        states = await env.run_group(rows, srv.client(), "m", max_retries=1, state_columns=["x"],
                                     gen_sampling_args={"temperature": 0.5})
    assert [s["reward"] for s in states] == [1.0, 1.0]  # the 500 was retried (max_retries=1)
    assert all(r["temperature"] == 0.5 for r in srv.requests)


def test_the_sdk_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, vfkit as vf; vf.ToolEnv; vf.StatefulToolEnv; vf.EnvGroup; "
            "vf.load_environment; import vfkit.testing.scripted_server; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_replace_system_prompt_swaps_the_leading_system_message():
    """The bridge gives a v1 taskset's system-prompt override (GEPA's candidate) to the model
    in place of the environment's own."""
    from vfkit.envs.dataset import replace_system_prompt

    chat = [{"role": "system", "content": "old"}, {"role": "user", "content": "q"}]
    assert replace_system_prompt(chat, "new") == [
        {"role": "system", "content": "new"}, {"role": "user", "content": "q"}]
    assert replace_system_prompt(chat[1:], "new")[0] == {"role": "system", "content": "new"}
    assert replace_system_prompt("q", "new") == "new\n\nq"
