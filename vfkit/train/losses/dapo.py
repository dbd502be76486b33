"""DAPO: token-level policy-gradient loss with decoupled ("clip-higher") ratio bounds.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476, eq. 8: every token of the step weighs the same (sum / total tokens), and
epsilon_high > epsilon lets low-probability tokens rise (the paper uses 0.2 / 0.28).
Its dynamic sampling is `filter_zero_advantage`; overlong filtering is
`mask_truncated_completions`.
"""

from __future__ import annotations

from vfkit.train.losses.base import LossInputs, LossOutput, ppo_clip


def dapo_loss(x: LossInputs) -> LossOutput:
    """Clipped objective summed over all tokens / loss tokens in the step."""
    per_token_BT, clipped_BT = ppo_clip(x)
    return LossOutput((per_token_BT * x.mask_BT).sum() / max(1, x.total_tokens), clipped_BT)
