"""The group-relative advantage (GRPO, Shao et al. 2024, arXiv:2402.03300): the one definition.

Every rollout's advantage is its reward minus the mean reward of the *successful* rollouts of its
group, optionally divided by their std. Failed rollouts (state["error"] set) are data, not
zeros: they get advantage 0 and take no part in the baseline. The environment (when it scores a
group) and the trainer (when it builds a batch) both call `set_group_advantages`, so a state
and the per-turn copies in its trajectory always agree.

    set_group_advantages(states)                          # r - mean(r)
    set_group_advantages(states, scale_rewards="group")   # (r - mean) / (std + 1e-4)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, Literal

ScaleRewards = Literal["none", "group"]
STD_EPS = 1e-4


def group_advantages(
    rewards_G: Sequence[float], scale_rewards: ScaleRewards = "none"
) -> list[float]:
    """Reward minus group mean, divided by the group's std when scale_rewards == "group"."""
    if not rewards_G:
        return []
    mean = statistics.fmean(rewards_G)
    advantages_G = [r - mean for r in rewards_G]
    if scale_rewards == "group" and len(rewards_G) > 1:
        std = statistics.pstdev(rewards_G)
        advantages_G = [a / (std + STD_EPS) for a in advantages_G]
    return advantages_G


def set_group_advantages(
    states: Sequence[dict[str, Any]],
    *,
    scale_rewards: ScaleRewards = "none",
    zero_truncated: bool = False,
) -> list[float]:
    """Set state["advantage"] (and each trajectory step's copy) on a scored group; return them.

    `zero_truncated`: truncated rollouts count as reward 0 in the advantage (not in "reward").
    """
    ok = [s for s in states if not s.get("error")]
    rewards_G = [
        0.0 if zero_truncated and s.get("is_truncated") else float(s.get("reward") or 0.0)
        for s in ok
    ]
    by_id = {id(s): a for s, a in zip(ok, group_advantages(rewards_G, scale_rewards), strict=True)}
    for state in states:
        state["advantage"] = by_id.get(id(state), 0.0)
        for step in state.get("trajectory") or []:
            step["reward"], step["advantage"] = state.get("reward"), state["advantage"]
    return [s["advantage"] for s in states]
