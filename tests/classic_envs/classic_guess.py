"""A classic verifiers 0.1.x multi-turn environment (fixture: runs unmodified in vfkit).

A guessing game in the 0.1.5 style: `env_response` returns (messages, state) and the game ends
when `is_completed(messages, state)` says so. Reward: 1 / guesses taken, 0 when never right.
"""


import verifiers as vf
from datasets import Dataset
from verifiers.types import Messages, State


class GuessEnv(vf.MultiTurnEnv):
    async def setup_state(self, state: State, **kwargs) -> State:
        state["guesses"] = 0
        state["solved"] = False
        return state

    async def is_completed(self, messages: Messages, state: State, **kwargs) -> bool:
        if state["solved"]:
            return True
        return await self.max_turns_reached(state)

    async def env_response(self, messages: Messages, state: State,
                           **kwargs) -> tuple[Messages, State]:
        guess = self.parser.parse_answer(messages) or ""
        state["guesses"] += 1
        target = int(state["answer"])
        try:
            value = int(guess.strip())
        except ValueError:
            return [{"role": "user", "content": "Reply with a number only."}], state
        if value == target:
            state["solved"] = True
            return [{"role": "user", "content": "Correct!"}], state
        hint = "higher" if value < target else "lower"
        return [{"role": "user", "content": f"No, go {hint}."}], state


def load_environment(max_turns: int = 4, **kwargs):
    rows = [{"question": "Guess my number from 1 to 5. Reply with the number only.",
             "answer": str(n)} for n in (2, 3, 4, 5)]

    def solved_reward(state: State, **kwargs) -> float:
        return 1.0 / state["guesses"] if state["solved"] else 0.0

    return GuessEnv(
        dataset=Dataset.from_list(rows),
        rubric=vf.Rubric(funcs=[solved_reward]),
        max_turns=max_turns,
        **kwargs,
    )
