"""The vfkit environment's rubric as TRL reward functions, and the one scorer of completions.

TRL calls each reward function with `prompts`, `completions` and the dataset's other columns
(`answer`, `info`, `task`, ...) and `completion_ids`. `rubric_reward_funcs` returns one TRL
function per rubric function, each scored by the rubric itself (so declared-argument passing,
the parser and error handling are vfkit's), with the rubric's weights for TRL's
`reward_weights`. With `stop_ids` set (vfkit's `zero_truncated_completions`, which TRL lacks) a
completion cut at the length limit scores 0 in every function: its advantage is then the one
vfkit gives it. The race's evaluator scores greedy completions with `score_completions`, the
same path.
"""

from __future__ import annotations

import asyncio
from typing import Any

from vfkit.rubrics.rubric import Rubric, Scores
from vfkit.types import Messages


def score_completions(
    rubric: Rubric, rows: list[dict[str, Any]], completions: list[Messages], group_size: int
) -> list[Scores]:
    """The rubric's scores of `completions[i]` as an answer to `rows[i]`.

    Consecutive runs of `group_size` rows form one group (group-level reward functions see it).
    """
    states = [
        {"prompt": row["prompt"], "completion": completion, "answer": row.get("answer", ""),
         "info": row.get("info") or {}, "task": row.get("task", "default"),
         "example_id": row.get("example_id"), "error": None}
        for row, completion in zip(rows, completions, strict=True)
    ]
    groups = [states[i : i + group_size] for i in range(0, len(states), group_size)]

    async def score_all() -> list[list[Scores]]:
        return await asyncio.gather(*(rubric.compute_scores(group) for group in groups))

    return [scores for group in asyncio.run(score_all()) for scores in group]


class RubricRewardFunc:
    """One rubric function as a TRL reward function (TRL logs it under the same name).

    `stop_ids`: when set, a completion whose last token id is not one of them (cut at the
    length limit, TRL's own test of truncation) scores 0.
    """

    def __init__(self, rubric: Rubric, name: str, group_size: int) -> None:
        self.rubric, self.__name__, self.group_size = rubric, name, group_size
        self.stop_ids: frozenset[int] | None = None  # set by the TRL leg (trl_leg.py)

    def __call__(
        self, prompts: list[Messages], completions: list[Messages],
        completion_ids: list[list[int]] | None = None, **columns: Any
    ) -> list[float]:
        rows = [
            {"prompt": prompt, **{k: columns[k][i] for k in ("answer", "info", "task", "example_id")
                                  if k in columns}}
            for i, prompt in enumerate(prompts)
        ]
        scores = score_completions(self.rubric, rows, completions, self.group_size)
        values = [s.metrics[self.__name__] for s in scores]
        if self.stop_ids is None:
            return values
        if completion_ids is None:
            raise ValueError("zero_truncated_completions: TRL passed no completion_ids")
        return [v if ids and ids[-1] in self.stop_ids else 0.0
                for v, ids in zip(values, completion_ids, strict=True)]


def rubric_reward_funcs(rubric: Rubric, group_size: int) -> tuple[list[RubricRewardFunc],
                                                                  list[float]]:
    """TRL `reward_funcs` and `reward_weights` equivalent to `rubric` (no `stop_ids` yet: the
    TRL leg sets them once its trainer knows its end-of-sequence ids)."""
    funcs = [RubricRewardFunc(rubric, name, group_size)
             for name in rubric.get_reward_func_names()]
    return funcs, rubric.get_reward_weights()
