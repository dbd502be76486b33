"""A classic verifiers 0.1.8 single-turn environment (fixture: runs unmodified in vfkit).

Arithmetic questions; the model thinks in <think> and answers in <answer>. Written in the style
of verifiers 0.1.8's own examples; nothing here knows about vfkit.
"""

import random

import verifiers as vf
from datasets import Dataset
from verifiers.types import Messages
from verifiers.utils.data_utils import extract_boxed_answer


def make_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
    return rows


def load_environment(num_train_examples: int = 8, num_eval_examples: int = 4, **kwargs):
    parser = vf.XMLParser(fields=["think", "answer"], answer_field="answer")
    system_prompt = f"Think step by step, then answer.\n\nRespond in this format:\n" \
                    f"{parser.get_format_str()}"

    def correct_answer_reward_func(completion: Messages, answer: str, **kwargs) -> float:
        response = parser.parse_answer(completion) or ""
        return 1.0 if extract_boxed_answer(response).strip() == answer else 0.0

    reward_funcs: list[vf.RewardFunc] = [correct_answer_reward_func,
                                         parser.get_format_reward_func()]
    rubric = vf.Rubric(funcs=reward_funcs, weights=[1.0, 0.2], parser=parser)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(make_rows(num_train_examples, seed=0)),
        eval_dataset=Dataset.from_list(make_rows(num_eval_examples, seed=1)),
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
        **kwargs,
    )
