"""Which of a step's groups the trainer learns from, after `vfkit.advantage` sets advantages.

The advantage itself has one home (`vfkit/advantage.py`, shared with the environment); here the
trainer applies its config (std scaling, truncated = 0) and drops groups that carry no signal:
every rollout failed, or every advantage is zero. The step's metrics count both. The
orchestrator asks the same `group_verdict` when dynamic sampling replaces flat groups.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from vfkit.advantage import ScaleRewards, set_group_advantages
from vfkit.types import State


@dataclass
class GroupCounts:
    """What happened to a step's groups: kept for the loss, or filtered out (and why)."""

    kept: int = 0
    filtered: int = 0  # all advantages zero (no learning signal)
    failed: int = 0  # every rollout of the group errored


Verdict = Literal["signal", "flat", "failed"]


def group_verdict(
    group: list[State], *, scale_rewards: ScaleRewards, zero_truncated: bool
) -> Verdict:
    """Set the group's advantages and say whether it can teach anything: "failed" (every
    rollout errored), "flat" (every advantage zero: all rewards equal) or "signal"."""
    advantages_G = set_group_advantages(
        group, scale_rewards=scale_rewards, zero_truncated=zero_truncated
    )
    if all(s.get("error") for s in group):
        return "failed"
    return "signal" if carries_signal(advantages_G) else "flat"


def carries_signal(advantages: Iterable[float]) -> bool:
    """Whether any advantage is non-zero (beyond float noise): something to learn from."""
    return any(abs(a) >= 1e-8 for a in advantages)


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
        verdict = group_verdict(group, scale_rewards=scale_rewards, zero_truncated=zero_truncated)
        if verdict == "failed":
            counts.failed += 1
        elif verdict == "flat" and filter_zero:
            counts.filtered += 1
        else:
            counts.kept += 1
            kept.append(group)
    return kept, counts
