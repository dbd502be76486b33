"""A multi-turn environment: the model guesses a five-letter word from Wordle-style feedback.

    python examples/multiturn_env.py      # plays it with a scripted solver via vfkit's test server

Write `env_response` (the environment's turn) and mark stop conditions with `@vf.stop`; the
rollout loop, token bookkeeping and scoring come from `vf.MultiTurnEnv`. With a real model:
`env.evaluate(AsyncOpenAI(base_url=...), "model-name", num_examples=10)`.
"""

from __future__ import annotations

import asyncio
import re

from openai import AsyncOpenAI

import vfkit as vf
from vfkit.testing.scripted_server import TestServer

WORDS = ["crane", "slate", "pride", "house", "plant", "storm", "blend", "chair", "grape", "mouse"]
RULES = ("Guess my five-letter word. Reply with one word. After each guess I show each letter as "
         "UPPERCASE (right place), lowercase (in the word, wrong place) or '.' (not in the word).")


def feedback(guess: str, secret: str) -> str:
    """'cR..e' style marks for `guess` against `secret`."""
    return "".join(g.upper() if g == s else (g if g in secret else ".")
                   for g, s in zip(guess, secret, strict=True))


def last_word(text: str) -> str | None:
    words = re.findall(r"[a-zA-Z]{5}", text or "")
    return words[-1].lower() if words else None


class WordGuessEnv(vf.MultiTurnEnv):
    """Feedback after every wrong guess; done when the word is found (or turns run out)."""

    async def env_response(self, messages, state):
        guess = last_word(messages[-1]["content"])
        if guess is None:
            return [{"role": "user", "content": "Please reply with one five-letter word."}]
        return [{"role": "user", "content": feedback(guess, state["answer"])}]

    @vf.stop
    def solved(self, state) -> bool:
        replies = [m for m in state["completion"] if m["role"] == "assistant"]
        return bool(replies) and last_word(replies[-1]["content"]) == state["answer"]


def solved_reward(state) -> float:
    return 1.0 if state["stop_condition"] == "solved" else 0.0


def fewer_turns(state) -> float:
    return solved_reward(state) / state["turn"]


env = WordGuessEnv(
    dataset=[{"question": RULES, "answer": w} for w in WORDS], max_turns=6,
    rubric=vf.Rubric(funcs=[solved_reward, fewer_turns], weights=[1.0, 0.5]),
)


def solver(request: dict) -> str:
    """A stand-in model: keep the words consistent with every feedback so far, guess the first."""
    said = [m["content"] for m in request["messages"][1:]]  # guess, feedback, guess, ...
    candidates = WORDS
    for guess, marks in zip(said[0::2], said[1::2], strict=True):
        candidates = [w for w in candidates if feedback(last_word(guess), w) == marks]
    return f"My guess: {candidates[0]}"


async def main() -> None:
    with TestServer(solver) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            out = await env.generate(env.get_dataset(n=3), client, "solver")
    for state in out.states:
        turns = " | ".join(m["content"] for m in state["completion"])
        print(f"{state['answer']}: reward {state['reward']:.2f} in {state['turn']} turns: {turns}")


if __name__ == "__main__":
    asyncio.run(main())
