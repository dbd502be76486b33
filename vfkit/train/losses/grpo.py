"""GRPO: PPO-clip on group-relative advantages, each sequence's tokens averaged, then sequences.

Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, eq. 3. Departures: one gradient step per
batch, with the "old" policy the trainer's own before the step plus an importance weight
trainer/sampler (default `ratio_against = "trainer"`), or the sampler (`"sampler"`), so the
async lag and sampler/trainer mismatch are corrected; KL (when beta > 0) uses the k3
estimator of Schulman 2020.
"""

from __future__ import annotations

from vfkit.train.losses.base import LossInputs, LossOutput, ppo_clip


def grpo_loss(x: LossInputs) -> LossOutput:
    """Per-sequence token mean of the clipped objective, summed / sequences in the step."""
    per_token_BT, clipped_BT = ppo_clip(x)
    tokens_B = x.mask_BT.sum(-1).clamp(min=1)
    per_sequence_B = (per_token_BT * x.mask_BT).sum(-1) / tokens_B
    return LossOutput(per_sequence_B.sum() / max(1, x.total_sequences), clipped_BT)
