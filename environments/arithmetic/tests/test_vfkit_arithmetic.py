"""arithmetic: reasoning-gym data, difficulty arguments, and scored rollouts via the test server."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from openai import AsyncOpenAI

import vfkit as vf
from vfkit.testing.scripted_server import TestServer

ENV_DIR = str(Path(__file__).resolve().parents[1])
if ENV_DIR not in sys.path:  # importable from a checkout, installed or not
    sys.path.insert(0, ENV_DIR)


def small_env(**kwargs) -> vf.Environment:
    return vf.load_environment("arithmetic", num_train_examples=20, num_eval_examples=5, **kwargs)


def test_default_tasks_are_two_one_digit_terms() -> None:
    env = small_env()
    rows = env.get_eval_dataset()
    for question in [*env.get_dataset()["question"], *rows["question"]]:
        assert re.fullmatch(r"Calculate \d+ [+-] \d+\.", question), question  # 0..10
    assert env.get_dataset()["question"][:5] != rows["question"]  # other seed range for eval
    assert small_env().get_eval_dataset()["question"] == rows["question"]  # seeded


def test_difficulty_and_generator_arguments() -> None:
    env = small_env(max_terms=3, min_terms=3, operators=["*"])
    assert all(q.count("*") == 2 for q in env.get_dataset()["question"])
    chain = small_env(generator="chain_sum")
    assert chain.get_dataset()[0]["info"]["generator"] == "chain_sum"


async def _score(reply: str, **env_args) -> dict:
    env = small_env(**env_args)
    row = env.get_eval_dataset()[0]
    assert (row["question"], row["answer"]) == ("Calculate 0 - 2.", "-2")
    with TestServer([reply]) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            return await env.run_rollout(row, client, "m")


async def test_right_answer() -> None:
    state = await _score("<answer>-2</answer>")
    assert state["error"] is None
    assert state["reward"] == pytest.approx(1.2)  # correct 1.0 + format 1.0 * 0.2


@pytest.mark.parametrize("reply", ["<answer>5</answer>", "<answer></answer>"])
async def test_tags_around_a_wrong_or_empty_answer_earn_nothing(reply: str) -> None:
    state = await _score(reply)
    assert state["metrics"]["correct_answer"] == 0.0
    assert state["reward"] == 0.0  # no format credit without a right answer (was 0.2)


def test_eval_questions_are_never_trained_on() -> None:
    env = vf.load_environment("arithmetic", num_train_examples=400, num_eval_examples=40)
    train, held = set(env.get_dataset()["question"]), set(env.get_eval_dataset()["question"])
    assert train and not train & held
    overlapping = vf.load_environment("arithmetic", num_train_examples=400,
                                      num_eval_examples=40, held_out=False)
    assert set(overlapping.get_dataset()["question"]) & held  # ~200 problems: they do overlap
    with pytest.raises(ValueError, match="held_out=False"):
        vf.load_environment("arithmetic", num_train_examples=5, num_eval_examples=3000)


async def test_reasoning_gym_partial_credit_is_kept() -> None:
    state = await _score("<answer>-2.0</answer>")  # "-2" inside a 4-char answer: 2/4
    assert state["metrics"]["correct_answer"] == pytest.approx(0.5)


async def test_untagged_reply_uses_the_last_number() -> None:
    state = await _score("0 minus 2 is -2")
    assert state["metrics"]["correct_answer"] == 1.0
    assert state["metrics"]["format_reward_func"] == 0.0


@pytest.mark.parametrize(("reply", "strict"), [("I do not know.", False), ("", False),
                                               ("-2", True), ("<answer>-2", True)])
async def test_malformed_replies_score_zero(reply: str, strict: bool) -> None:
    state = await _score(reply, strict_format=strict)
    assert state["error"] is None
    assert state["reward"] == 0.0


def test_an_untagged_reply_in_content_parts_is_read() -> None:
    from vfkit_arithmetic import answer_text  # a reply as content parts (was a TypeError)

    reply = [{"role": "assistant", "content": [{"type": "text", "text": "0 minus 2 is -2"}]}]
    assert answer_text(vf.XMLParser(["answer"]), reply, strict=False) == "-2"
    assert answer_text(vf.XMLParser(["answer"]), "0 minus 2 is -2", strict=False) == "-2"
