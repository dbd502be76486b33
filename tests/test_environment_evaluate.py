"""Environment.evaluate: generate's keywords, and classic verifiers' evaluate keywords."""

from __future__ import annotations

import re

import pytest

from vfkit.envs.singleturn_env import SingleTurnEnv
from vfkit.errors import ConfigError
from vfkit.rubrics.rubric import Rubric
from vfkit.testing.scripted_server import TestServer

ROWS = [{"question": f"q{i}", "answer": str(i)} for i in range(4)]


def echo_digit(body: dict) -> str:
    return body["messages"][-1]["content"].removeprefix("q")


def exact(completion, answer) -> float:
    return float(completion[-1]["content"] == answer)


def test_state_columns_and_unscored_rollouts():
    env = SingleTurnEnv(dataset=ROWS, rubric=Rubric(funcs=[exact]))
    with TestServer(echo_digit) as srv:
        out = env.evaluate(srv.client(), "m", num_examples=2, state_columns=["turn", "extra"])
        unscored = env.evaluate(srv.client(), "m", num_examples=2, score_rollouts=False)
    assert [(s["turn"], s["extra"]) for s in out.states] == [(1, None), (1, None)]
    assert out.reward == [1.0, 1.0]
    assert [s["reward"] for s in unscored.states] == [None, None]
    assert all(s["metrics"] == {} and s["advantage"] is None for s in unscored.states)
    assert [s["completion"][-1]["content"] for s in unscored.states] == ["0", "1"]


def test_max_concurrent_generation_is_max_concurrent():
    env = SingleTurnEnv(dataset=ROWS)
    with TestServer(echo_digit) as srv:
        srv.delay_next(0.05, n=4)
        env.evaluate(srv.client(), "m", num_examples=4, max_concurrent_generation=1)
    assert srv.max_in_flight == 1  # unbounded otherwise: 4 at once
    with pytest.raises(ConfigError, match=re.escape(
            "evaluate(): max_concurrent=2 and max_concurrent_generation=1 disagree; give one "
            "of them")):
        env.evaluate(srv.client(), "m", max_concurrent=2, max_concurrent_generation=1)


@pytest.mark.parametrize("kwargs", [{"save_results": True}, {"results_path": "out"},
                                    {"push_to_hub": True, "hub_name": "me/x"}])
def test_classic_saving_options_say_what_saves_instead(kwargs):
    env = SingleTurnEnv(dataset=ROWS)
    key = next(iter(kwargs))
    with pytest.raises(ConfigError, match=re.escape(
            f"evaluate({key}=...): vfkit's evaluate() returns the rollouts and saves nothing; "
            "run `vf-eval <env> -m <model>` (it writes outputs/evals/<env>--<model>/<id>/"
            "results.jsonl), or save out.states yourself")):
        env.evaluate(object(), "m", **kwargs)


def test_false_saving_options_pass_and_unknown_keywords_are_type_errors():
    env = SingleTurnEnv(dataset=ROWS)
    with TestServer(echo_digit) as srv:
        out = env.evaluate(srv.client(), "m", num_examples=1, save_results=False)
    assert len(out) == 1
    with pytest.raises(TypeError, match=re.escape(
            "evaluate() got unexpected keyword argument(s) ['temprature']")):
        env.evaluate(object(), "m", temprature=0.5)
