"""guess-number: hints, stop conditions and rewards of multi-turn rollouts via the test server."""

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


async def _play(script, secret: str = "13", **env_args) -> dict:
    env = vf.load_environment("guess-number", num_eval_examples=3, **env_args)
    row = {**env.get_eval_dataset()[0], "answer": secret}
    with TestServer(script) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            return await env.run_rollout(row, client, "m")


def hints(state: dict) -> list[str]:
    return [m["content"] for m in state["completion"] if m["role"] == "user"]


def test_secrets_are_seeded_and_in_range() -> None:
    env = vf.load_environment("guess-number", low=5, high=9, num_train_examples=50)
    answers = env.get_dataset()["answer"]
    assert set(answers) <= {"5", "6", "7", "8", "9"} and len(set(answers)) > 1
    assert answers == vf.load_environment("guess-number", low=5, high=9,
                                          num_train_examples=50).get_dataset()["answer"]
    assert "from 5 to 9" in env.get_dataset()[0]["prompt"][-1]["content"]
    with pytest.raises(ValueError):
        vf.load_environment("guess-number", low=9, high=5)


async def test_found_after_hints_gets_reward_and_speed_bonus() -> None:
    state = await _play(["<guess>10</guess>", "<guess>15</guess>", "<guess>13</guess>"])
    assert state["error"] is None
    assert hints(state) == ["Higher. (5 guesses left)", "Lower. (4 guesses left)"]
    assert state["stop_condition"] == "guessed_it" and state["turn"] == 3
    assert state["metrics"]["speed_bonus"] == pytest.approx(0.6)  # (6 - 3) / (6 - 1)
    assert state["reward"] == pytest.approx(1.3)  # found 1.0 + 0.5 * 0.6


async def test_first_guess_right_gets_the_full_bonus() -> None:
    state = await _play(["13"])  # a bare number is read too
    assert state["reward"] == pytest.approx(1.5)
    assert hints(state) == []


async def test_wrong_guesses_until_turns_run_out_score_zero() -> None:
    state = await _play([f"<guess>{n}</guess>" for n in (1, 2, 3, 4, 5, 6)])
    assert state["stop_condition"] == "max_turns_reached" and state["turn"] == 6
    assert state["reward"] == 0.0
    assert len(hints(state)) == 5 and all(h.startswith("Higher.") for h in hints(state))


async def test_malformed_reply_is_asked_again_and_the_rollout_goes_on() -> None:
    state = await _play(["I do not know", "<guess>13</guess>"])
    assert hints(state)[0].startswith("Please reply with one whole number from 1 to 20")
    assert state["stop_condition"] == "guessed_it"
    assert state["reward"] == pytest.approx(1.0 + 0.5 * 4 / 5)  # found on guess 2 of 6


async def test_binary_search_always_finds_it() -> None:
    def bisect(request: dict) -> str:
        low, high = 1, 20
        said = [m["content"] for m in request["messages"][1:]]  # guess, hint, guess, hint, ...
        for guess_text, hint in zip(said[0::2], said[1::2], strict=True):
            guess = int(re.findall(r"\d+", guess_text)[-1])
            low, high = (guess + 1, high) if hint.startswith("Higher") else (low, guess - 1)
        return f"<guess>{(low + high) // 2}</guess>"

    for secret in ("1", "7", "20"):
        state = await _play(bisect, secret=secret)
        assert state["stop_condition"] == "guessed_it", (secret, hints(state))
        assert state["turn"] <= 5 and state["reward"] >= 1.0
