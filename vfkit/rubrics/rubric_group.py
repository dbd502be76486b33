"""RubricGroup: several rubrics scoring the same rollouts; rewards add up, metrics merge."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from vfkit.rubrics.rubric import Rubric, Scores
from vfkit.types import State


class RubricGroup(Rubric):
    """Rubrics combined: reward = sum of the rubrics' rewards; same-named metrics are summed.

    >>> from vfkit.rubrics.tool_rubric import ToolRubric
    >>> group = RubricGroup([Rubric(funcs=[lambda answer: 1.0]), ToolRubric(tools=[])])
    >>> group.get_reward_func_names()
    ['<lambda>', 'total_tool_calls']

    The group may also hold reward functions of its own (`add_reward_func`).
    """

    def __init__(self, rubrics: Sequence[Rubric], **kwargs: Any) -> None:
        if not rubrics:
            raise ValueError("RubricGroup needs at least one rubric")
        self.rubrics = list(rubrics)
        given = kwargs.get("parser") is not None
        if not given:
            kwargs["parser"] = self.rubrics[0].parser
        super().__init__(**kwargs)
        self.parser_given = given

    def set_default_parser(self, parser: Any) -> None:
        """Each rubric built without a parser gets `parser`; so does the group (as its first)."""
        for rubric in self.rubrics:
            rubric.set_default_parser(parser)
        if not self.parser_given:
            self.parser = self.class_objects["parser"] = self.rubrics[0].parser

    def get_reward_func_names(self) -> list[str]:
        """All reward function names: each rubric's, then the group's own."""
        names = [name for rubric in self.rubrics for name in rubric.get_reward_func_names()]
        return names + super().get_reward_func_names()

    def get_reward_funcs(self) -> list[Any]:
        """All reward functions: each rubric's, then the group's own."""
        return [f for rubric in self.rubrics for f in rubric.get_reward_funcs()] + self.funcs

    def get_reward_weights(self) -> list[float]:
        """All weights, aligned with `get_reward_funcs`."""
        return [w for rubric in self.rubrics for w in rubric.get_reward_weights()] + self.weights

    async def compute_scores(self, states: list[State]) -> list[Scores]:
        """Each rubric scores the states concurrently; the results are added up per state."""
        parts = await asyncio.gather(
            super().compute_scores(states), *(r.compute_scores(states) for r in self.rubrics)
        )
        totals = [Scores() for _ in states]
        for part in parts:
            for total, scores in zip(totals, part, strict=True):
                total.merge(scores)
        return totals
