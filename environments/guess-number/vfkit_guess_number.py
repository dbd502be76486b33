"""guess-number: find a hidden whole number from "higher" / "lower" hints (multi-turn).

Each turn the model guesses; the environment answers "Higher." or "Lower." (or asks again for a
number) until the model names the number or `max_turns` guesses are used up.
Rewards: `found` (weight 1.0) when the last guess is the number; `speed_bonus` (weight 0.5)
= found * (max_turns - guesses) / (max_turns - 1): 1.0 on the first guess, 0 on the last.

    env = vf.load_environment("guess-number", high=50, max_turns=7)
"""

from __future__ import annotations

import random
import re

import vfkit as vf
from vfkit.bridge import v1_exports

INT_RE = re.compile(r"-?\d+")
PROMPT = (
    "I am thinking of a whole number from {low} to {high}. Guess it! Reply with one number inside "
    "<guess></guess> tags. After each wrong guess I will say whether my number is higher or lower. "
    "You have {turns} guesses."
)


def parse_guess(parser: vf.XMLParser, text: str) -> int | None:
    """The number in <guess> tags, else the last whole number of the text, else None."""
    guess = parser.parse(text or "", last=True).guess
    numbers = INT_RE.findall(guess if guess is not None else text or "")
    return int(numbers[-1]) if numbers else None


class GuessNumberEnv(vf.MultiTurnEnv):
    """Answers each wrong guess with a hint; stops when the model names the number."""

    def __init__(self, low: int, high: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.low, self.high = low, high

    def last_guess(self, messages) -> int | None:
        replies = self.parser.get_assistant_messages(messages)
        return parse_guess(self.parser, replies[-1].get("content") or "") if replies else None

    @vf.stop(priority=95)  # before max_tokens_reached: a right guess in a cut-off reply counts
    def guessed_it(self, state: vf.State) -> bool:
        guess = self.last_guess(state["completion"])
        return guess is not None and str(guess) == state["answer"]

    async def env_response(self, messages, state: vf.State) -> list[dict]:
        guess = self.last_guess(messages)
        left = self.max_turns - state["turn"]
        if guess is None:
            text = (f"Please reply with one whole number from {self.low} to {self.high} inside "
                    "<guess></guess> tags.")
        else:
            text = "Higher." if int(state["answer"]) > guess else "Lower."
        return [{"role": "user", "content": f"{text} ({left} guesses left)"}]


def load_environment(
    low: int = 1,
    high: int = 20,
    max_turns: int = 6,
    num_train_examples: int = 1000,
    num_eval_examples: int = 100,
    seed: int = 0,
    max_tokens: int = 32,
) -> vf.Environment:
    """Build the environment; a wider range or fewer turns makes it harder."""
    if low >= high or max_turns < 2:
        raise ValueError(f"need low < high and max_turns >= 2, got {low}, {high}, {max_turns}")

    def rows(n: int, rng_seed: int) -> list[dict]:
        rng = random.Random(rng_seed)
        question = PROMPT.format(low=low, high=high, turns=max_turns)
        return [{"question": question, "answer": str(rng.randint(low, high))} for _ in range(n)]

    parser = vf.XMLParser(["guess"], answer_field="guess")

    def found(state: vf.State) -> float:
        """1.0 when the model's last guess is the hidden number."""
        return 1.0 if state.get("stop_condition") == "guessed_it" else 0.0

    def speed_bonus(state: vf.State) -> float:
        """More for fewer guesses: 1.0 on the first, 0.0 on the last allowed one."""
        if found(state) == 0.0:
            return 0.0
        return (max_turns - state["turn"]) / (max_turns - 1)

    rubric = vf.Rubric(funcs=[found, speed_bonus], weights=[1.0, 0.5], parser=parser)
    return GuessNumberEnv(
        low=low, high=high, max_turns=max_turns, dataset=rows(num_train_examples, seed),
        eval_dataset=rows(num_eval_examples, seed + 1), parser=parser, rubric=rubric,
        sampling_args={"max_tokens": max_tokens}, env_id="guess-number",
    )


# verifiers v1 / prime-rl: `vf.load_taskset("vfkit-guess-number")` (needs vfkit[verifiers])
__all__, __getattr__ = v1_exports("guess-number", load_environment)
