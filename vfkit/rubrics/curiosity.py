"""CuriosityRubric: pay for trying a tool while a group rarely uses it; penalise overuse.

Pixel-Reasoner (Su et al., 2025, "Pixel Reasoner: Incentivizing Pixel-Space Reasoning with
Curiosity-Driven Reinforcement Learning") adds two terms to the correctness reward of a rollout y
of prompt x:

    curiosity_bonus(y)  = max(H - RaPR(x), 0) * 1[y uses a tool]    (weight alpha)
    overuse_penalty(y)  = min(N - n_calls(y), 0)                     (weight beta; <= 0)

RaPR(x) is the fraction of x's group of rollouts that call a tool at all. While few rollouts of a
group try the tool (RaPR < H), those that do earn a bonus; once the policy uses it often enough
the bonus vanishes. Each call beyond N costs beta. vfkit counts the tool calls the assistant
messages make (optionally only calls to `tool_names`); rollouts whose generation failed are not
counted in the rate.

    rubric = vf.RubricGroup([correctness, CuriosityRubric(["zoom"], bonus_weight=0.5,
                                                          penalty_weight=0.05)])

Both metrics are recorded unweighted (`curiosity_bonus`, `overuse_penalty`); a weight of 0 keeps
a term as a metric only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vfkit.rubrics.rubric import Rubric
from vfkit.rubrics.tool_rubric import count_tool_calls
from vfkit.types import Messages


class CuriosityRubric(Rubric):
    """Curiosity bonus (group-level) and overuse penalty for tool calls (see module doc).

    >>> import asyncio
    >>> call = {"role": "assistant", "content": "", "tool_calls": [
    ...     {"id": "1", "type": "function", "function": {"name": "zoom", "arguments": "{}"}}]}
    >>> used, unused = {"completion": [call]}, {"completion": [{"role": "assistant"}]}
    >>> group = [used, unused, dict(unused), dict(unused)]  # RaPR = 1/4
    >>> asyncio.run(CuriosityRubric(["zoom"], bonus_weight=1.0).score_group(group))
    >>> round(used["metrics"]["curiosity_bonus"], 3), unused["metrics"]["curiosity_bonus"]
    (0.05, 0.0)
    """

    def __init__(
        self,
        tool_names: Sequence[str] | None = None,
        *,
        bonus_weight: float = 0.5,
        rate_threshold: float = 0.3,
        penalty_weight: float = 0.05,
        max_free_calls: int = 1,
        **kwargs: Any,
    ) -> None:
        if not 0.0 <= rate_threshold <= 1.0:
            raise ValueError(f"rate_threshold (H) is a tool-use rate in [0, 1], "
                             f"got {rate_threshold}")
        if max_free_calls < 0:
            raise ValueError(f"max_free_calls (N) must be >= 0, got {max_free_calls}")
        super().__init__(**kwargs)
        self.tool_names = set(tool_names) if tool_names else None
        self.rate_threshold, self.max_free_calls = rate_threshold, max_free_calls
        self.add_reward_func(self.curiosity_bonus, bonus_weight)
        self.add_reward_func(self.overuse_penalty, penalty_weight)

    def tool_calls(self, completion: Messages) -> int:
        """Calls in `completion` to the counted tools (all tools when none were named)."""
        counts = count_tool_calls(completion)
        if self.tool_names is None:
            return sum(counts.values())
        return sum(n for name, n in counts.items() if name in self.tool_names)

    def curiosity_bonus(self, completions: list[Messages]) -> list[float]:
        """max(H - RaPR, 0) for each rollout that calls a tool, 0 for the others."""
        used = [self.tool_calls(c) > 0 for c in completions]
        rate = sum(used) / len(used) if used else 0.0
        bonus = max(self.rate_threshold - rate, 0.0)
        return [bonus if u else 0.0 for u in used]

    def overuse_penalty(self, completion: Messages) -> float:
        """min(N - calls, 0): minus one per call beyond `max_free_calls`."""
        return float(min(self.max_free_calls - self.tool_calls(completion), 0))
