"""arithmetic: procedural arithmetic from reasoning-gym, scored by reasoning-gym itself.

Any reasoning-gym generator works (`generator=`, difficulty as keyword arguments); the default is
`basic_arithmetic` with two one-digit terms and + / -, which a 135M model solves some of the
time. Reward: `correct_answer` = the generator's own `score_answer` on the parsed answer (1.0
exact; reasoning-gym gives partial credit when the right number is inside a longer answer), plus
a format reward (weight 0.2) for one well-formed `<answer>` block. Without tags the last number
of the reply is taken (`strict_format=True`: no answer). The format credit is paid only with
a correct answer, so empty tags or a wrong number earn nothing. Train and eval items come from
different seed ranges, and training items whose question is also an eval question are dropped
(`held_out=False` keeps them): at the default difficulty there are only ~200 distinct problems.

    env = vf.load_environment("arithmetic", max_terms=3, operators=["+", "-", "*"])
"""

from __future__ import annotations

from typing import Any

import reasoning_gym

import vfkit as vf
from vfkit.bridge import v1_exports
from vfkit.parsers.utils import extract_last_number

SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Give only the final number inside <answer></answer> tags."
)
# defaults per generator; anything passed to load_environment overrides them
DIFFICULTY: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                         "operators": ["+", "-"], "allow_parentheses": False,
                         "allow_negation": False},
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
}
EVAL_SEED_OFFSET = 1_000_000


def answer_text(parser: vf.XMLParser, completion, strict: bool) -> str | None:
    """The <answer> content; without tags the last number of the reply (None when strict)."""
    answer = parser.parse_answer(completion)
    if answer is not None or strict:
        return answer
    return extract_last_number(vf.Parser().parse_answer(completion))  # of the last reply


def make_rows(dataset: Any, split: str) -> list[dict]:
    return [{"question": e["question"], "answer": str(e["answer"]),
             "info": {"split": split, "index": i, "generator": e["metadata"]["source_dataset"]}}
            for i, e in enumerate(dataset)]


def load_environment(
    generator: str = "basic_arithmetic",
    num_train_examples: int = 2000,
    num_eval_examples: int = 200,
    seed: int = 0,
    format_weight: float = 0.2,
    strict_format: bool = False,
    max_tokens: int = 64,
    system_prompt: str = SYSTEM_PROMPT,
    held_out: bool = True,
    **difficulty: Any,
) -> vf.Environment:
    """Build the environment from reasoning-gym's `generator` with `difficulty` overrides.

    `held_out`: drop training items whose question is in the eval set, so the eval reward
    measures problems never trained on (at the default difficulty this leaves fewer rows).
    """
    args = {**DIFFICULTY.get(generator, {}), **difficulty}
    gyms = {
        "train": reasoning_gym.create_dataset(generator, size=num_train_examples, seed=seed,
                                              **args),
        # reasoning-gym seeds item i with seed + i: keep the eval range far from the train range
        "eval": reasoning_gym.create_dataset(generator, size=num_eval_examples,
                                             seed=seed + EVAL_SEED_OFFSET, **args),
    }
    parser = vf.XMLParser(["answer"])

    def correct_answer(completion, info: dict) -> float:
        """reasoning-gym's score of the parsed answer against the generated task."""
        gym = gyms[info["split"]]
        response = answer_text(parser, completion, strict_format)
        return float(gym.score_answer(response.strip() if response else None,
                                      gym[info["index"]]))

    tags_reward = parser.get_format_reward_func()

    def format_reward_func(completion, info: dict) -> float:
        """The tags' format credit, only around an answer that earns credit: empty tags or a
        wrong number in perfect tags earn nothing (the cheapest signal to game otherwise)."""
        return tags_reward(completion=completion) if correct_answer(completion, info) else 0.0

    rubric = vf.Rubric(funcs=[correct_answer, format_reward_func],
                       weights=[1.0, format_weight], parser=parser)
    eval_rows = make_rows(gyms["eval"], "eval")
    eval_questions = {row["question"] for row in eval_rows} if held_out else set()
    train_rows = [r for r in make_rows(gyms["train"], "train")
                  if r["question"] not in eval_questions]
    if not train_rows:
        raise ValueError(
            "arithmetic: every training question is also an eval question; raise the difficulty,"
            " lower num_eval_examples, or pass held_out=False"
        )
    return vf.SingleTurnEnv(
        dataset=train_rows, eval_dataset=eval_rows,
        system_prompt=system_prompt, parser=parser, rubric=rubric,
        sampling_args={"max_tokens": max_tokens}, env_id="arithmetic",
    )


# verifiers v1 / prime-rl: `vf.load_taskset("vfkit-arithmetic")` (needs vfkit[verifiers])
__all__, __getattr__ = v1_exports("arithmetic", load_environment)
