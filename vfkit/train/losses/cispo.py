"""CISPO: clip the importance-sampling weight (stop-gradient), never the token's gradient.

MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
arXiv:2506.13585, eq. 4-5: loss = -sg(clip(r, 1-eps_low, 1+eps_high)) · A · log pi, averaged
over all tokens of the step. Tokens outside the bound keep a (bounded) gradient, unlike PPO-clip.
The paper leaves the lower bound open: set epsilon >= 1 for that.
"""

from __future__ import annotations

import torch

from vfkit.train.losses.base import LossInputs, LossOutput, importance_weighted, with_kl


def cispo_loss(x: LossInputs) -> LossOutput:
    """Token-level REINFORCE weighted by the clipped, detached importance ratio."""
    ratio_BT = torch.exp(x.log_ratio_BT.detach())
    weight_BT = torch.clamp(ratio_BT, 1 - x.epsilon_low, 1 + x.epsilon_high)
    per_token_BT = -weight_BT * x.advantages_B.unsqueeze(-1) * x.logprobs_BT
    per_token_BT = with_kl(importance_weighted(per_token_BT, x), x)
    clipped_BT = weight_BT != ratio_BT
    return LossOutput((per_token_BT * x.mask_BT).sum() / max(1, x.total_tokens), clipped_BT)
