"""Which of a step's groups the trainer learns from, after `vfkit.advantage` sets advantages.

The advantage itself has one home (`vfkit/advantage.py`, shared with the environment); here the
trainer applies its config (std scaling, truncated = 0) and drops groups that carry no signal:
every rollout failed, or every advantage is zero. The step's metrics count both.
"""

from __future__ import annotations

from dataclasses import dataclass

from vfkit.advantage import ScaleRewards, set_group_advantages
from vfkit.types import State


@dataclass
class GroupCounts:
    """What happened to a step's groups: kept for the loss, or filtered out (and why)."""

    kept: int = 0
    filtered: int = 0  # all advantages zero (no learning signal)
    failed: int = 0  # every rollout of the group errored


def assign_advantages(
    groups: list[list[State]],
    *,
    scale_rewards: ScaleRewards,
    zero_truncated: bool,
    filter_zero: bool,
) -> tuple[list[list[State]], GroupCounts]:
    """Set state["advantage"] on every rollout; return the groups worth training on."""
    counts, kept = GroupCounts(), []
    for group in groups:
        advantages_G = set_group_advantages(
            group, scale_rewards=scale_rewards, zero_truncated=zero_truncated
        )
        if all(s.get("error") for s in group):
            counts.failed += 1
        elif filter_zero and all(abs(a) < 1e-8 for a in advantages_G):
            counts.filtered += 1
        else:
            counts.kept += 1
            kept.append(group)
    return kept, counts
