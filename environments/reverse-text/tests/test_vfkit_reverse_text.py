"""reverse-text: data generation and rollouts scored through the scripted test server."""

from __future__ import annotations

import itertools
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

import vfkit_reverse_text as reverse_text  # noqa: E402  # after the path line above


def reverse_request(request: dict) -> str:
    """A perfect model: reverse the text of the last user message."""
    text = request["messages"][-1]["content"].removeprefix("Reverse this text: ")
    return f"<answer>{text[::-1]}</answer>"


def test_data_is_seeded_and_eval_is_held_out() -> None:
    a = vf.load_environment("reverse-text", num_train_examples=50, num_eval_examples=20)
    b = vf.load_environment("reverse-text", num_train_examples=50, num_eval_examples=20)
    assert a.get_dataset()["answer"] == b.get_dataset()["answer"]
    train, evals = set(a.get_dataset()["answer"]), set(a.get_eval_dataset()["answer"])
    assert len(a.get_dataset()) == 50 and len(a.get_eval_dataset()) == 20
    assert not train & evals
    row = a.get_eval_dataset()[0]
    assert row["answer"] == row["info"]["text"][::-1]
    assert row["prompt"][0]["role"] == "system" and row["task"] == "reverse-text"


def test_word_counts_follow_the_difficulty_args() -> None:
    env = vf.load_environment("reverse-text", num_train_examples=30, min_words=3, max_words=3)
    assert all(len(r["info"]["text"].split()) == 3 for r in env.get_dataset())
    with pytest.raises(ValueError, match="min_words"):
        vf.load_environment("reverse-text", min_words=3, max_words=2)


def test_a_word_range_too_narrow_for_the_asked_size_names_max_words() -> None:
    # 119 one-word texts exist; the defaults ask for 2000 + 200 (the train set shrank to 844)
    with pytest.raises(ValueError, match=re.escape(
            f"reverse-text: min_words=1, max_words=1 allow only {len(reverse_text.WORDS)} "
            "distinct texts, fewer than num_train_examples + num_eval_examples = 2200; raise "
            "max_words, or ask for fewer examples")):
        vf.load_environment("reverse-text", max_words=1)
    small = vf.load_environment("reverse-text", max_words=1, num_train_examples=20,
                                num_eval_examples=20)
    assert len(small.get_dataset()) == 20 and len(small.get_eval_dataset()) == 20


def test_the_default_sizes_are_kept() -> None:
    env = vf.load_environment("reverse-text")
    assert len(env.get_dataset()) == 2000 and len(env.get_eval_dataset()) == 200


def test_lcs_ratio_arithmetic() -> None:
    assert reverse_text.lcs_ratio("olleh", "olleh") == 1.0
    assert reverse_text.lcs_ratio("oll", "olleh") == pytest.approx(0.75)  # 2 * 3 / (3 + 5)
    assert reverse_text.lcs_ratio("xyz", "olleh") == 0.0


def test_echoing_the_input_earns_nothing() -> None:
    """The old plain LCS ratio paid an echo 0.2-0.3; small models learned to copy (issue 12)."""
    env = vf.load_environment("reverse-text", num_train_examples=300, max_words=3)
    texts = [r["info"]["text"] for r in env.get_dataset()] + reverse_text.WORDS
    echo_scores = [reverse_text.reversal_score(t, t[::-1]) for t in texts]
    assert max(echo_scores) < 0.05
    assert reverse_text.lcs_ratio("stone", "enots") == pytest.approx(0.2)  # what an echo got


def test_exact_reversal_scores_one_and_partial_reversals_climb() -> None:
    for text in ["stone", "ocean onion", "rabbit walnut pixel"]:
        target = text[::-1]
        prefixes = [reverse_text.reversal_score(target[:k], target)
                    for k in range(len(target) + 1)]  # the first k characters right
        assert prefixes[-1] == 1.0 and prefixes[0] == 0.0
        assert all(a <= b for a, b in itertools.pairwise(prefixes))
        assert 0.2 < prefixes[len(target) // 2 + 1] < 0.8  # half a reversal: half the credit
        # half reversed, half echoed: still partial credit, below the full reversal
        half = target[: len(target) // 2] + text[len(target) // 2:]
        assert 0.0 < reverse_text.reversal_score(half, target) < 1.0


def test_reversal_score_arithmetic() -> None:
    # echo "ocean onion" vs "noino naeco": ratio 2 * 3 / 22 = 3/11 (the echo level);
    # "noino": ratio 2 * 5 / 16 = 5/8, so (5/8 - 3/11) / (1 - 3/11) = 31/64
    assert reverse_text.reversal_score("noino", "noino naeco") == pytest.approx(31 / 64)
    assert reverse_text.reversal_score("aba", "aba") == 1.0  # a palindrome: plain ratio


async def _score(reply: str, **env_args) -> dict:
    env = vf.load_environment("reverse-text", num_eval_examples=5, **env_args)
    row = {**env.get_eval_dataset()[2]}  # "ocean onion" -> "noino naeco"
    assert row["answer"] == "noino naeco"
    with TestServer([reply]) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            state = await env.run_rollout(row, client, "m")
    assert server.requests[0]["max_tokens"] == 48  # the environment's default sampling args
    return state


async def test_right_answer() -> None:
    state = await _score("<answer>noino naeco</answer>")
    assert state["error"] is None
    assert state["metrics"]["reversal_reward"] == 1.0
    assert state["reward"] == pytest.approx(1.2)  # 1.0 * 1.0 + format 1.0 * 0.2
    assert state["trajectory"][0]["tokens"]["completion_ids"]  # token ids came back


async def test_partly_wrong_answer_gets_partial_credit() -> None:
    state = await _score("<answer>noino</answer>")
    assert state["metrics"]["reversal_reward"] == pytest.approx(31 / 64)  # see the arithmetic test
    assert state["reward"] == pytest.approx(31 / 64 + 0.2)


@pytest.mark.parametrize("reply", ["<answer>ocean onion</answer>", "<answer></answer>"])
async def test_echoed_or_empty_answer_scores_zero_even_in_perfect_tags(reply: str) -> None:
    state = await _score(reply)  # the input not reversed, or nothing at all
    assert state["metrics"]["reversal_reward"] == 0.0
    assert state["metrics"]["format_reward_func"] == 0.0  # no format credit for a gamed answer
    assert state["reward"] == 0.0


async def test_untagged_reply_is_compared_whole_but_gets_no_format_reward() -> None:
    state = await _score("noino naeco")
    assert state["metrics"]["reversal_reward"] == 1.0
    assert state["metrics"]["format_reward_func"] == 0.0
    assert state["reward"] == 1.0


@pytest.mark.parametrize("reply", ["noino naeco", "<answer>noino naeco", "<answer></answer>", ""])
async def test_malformed_answers_get_no_reversal_reward_in_strict_mode(reply: str) -> None:
    state = await _score(reply, strict_format=True)
    assert state["error"] is None
    assert state["metrics"]["reversal_reward"] == 0.0
    assert state["reward"] == 0.0  # and no format credit without reversal credit


async def test_a_perfect_model_scores_full_reward_on_a_batch() -> None:
    env = vf.load_environment("reverse-text", num_eval_examples=6)
    with TestServer(reverse_request) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            out = await env.a_evaluate(client, "m", rollouts_per_example=2)
    assert len(out) == 12
    assert out.reward == pytest.approx([1.2] * 12)


def test_an_untagged_reply_in_content_parts_is_read() -> None:
    reply = [{"role": "assistant", "content": [{"type": "text", "text": "noino <answer>naeco"}]}]
    parser = vf.XMLParser(["answer"])  # content parts: was a TypeError
    assert reverse_text.answer_text(parser, reply, strict=False) == "noino naeco"
    assert reverse_text.answer_text(parser, "noino naeco", strict=False) == "noino naeco"
    assert reverse_text.answer_text(parser, [], strict=False) == ""
