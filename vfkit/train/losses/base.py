"""What every loss receives and returns; shared PPO-style clipping."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossInputs:
    """One micro-batch, tokens aligned with their targets (B sequences × T positions).

    `total_tokens` and `total_sequences` count the whole optimizer step (all micro-batches, all
    ranks) so that summing the micro-batch losses gives the step's loss: gradient accumulation
    does not change the normalization.
    """

    logprobs_BT: torch.Tensor  # trainer logprobs of the sampled tokens (requires grad)
    old_logprobs_BT: torch.Tensor  # what the ratio and its clip are measured against
    advantages_B: torch.Tensor
    mask_BT: torch.Tensor  # float, 1 on tokens the loss trains on
    epsilon_low: float
    epsilon_high: float
    total_tokens: int
    total_sequences: int
    max_tokens: int  # generation budget per turn (Dr. GRPO's constant normalizer)
    kl_BT: torch.Tensor | None = None  # per-token KL to the base model, when beta > 0
    beta: float = 0.0
    weight_BT: torch.Tensor | None = None
    """Detached per-token importance weight old/sampler policy (decoupled PPO); None = 1."""

    @property
    def log_ratio_BT(self) -> torch.Tensor:
        return self.logprobs_BT - self.old_logprobs_BT


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, already normalized for the whole step
    clipped_BT: torch.Tensor  # bool, tokens whose gradient the clip removed or bounded


def ppo_clip(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token -min(r·A, clip(r, 1-eps_low, 1+eps_high)·A) and where the clip was active."""
    ratio_BT = torch.exp(x.log_ratio_BT)
    adv_BT = x.advantages_B.unsqueeze(-1)
    unclipped = ratio_BT * adv_BT
    clipped = torch.clamp(ratio_BT, 1 - x.epsilon_low, 1 + x.epsilon_high) * adv_BT
    per_token_BT = -torch.minimum(unclipped, clipped)
    return with_kl(importance_weighted(per_token_BT, x), x), (clipped < unclipped).detach()


def importance_weighted(per_token_BT: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """Times the behaviour importance weight, when the ratio is not taken against the sampler."""
    return per_token_BT if x.weight_BT is None else per_token_BT * x.weight_BT


def with_kl(per_token_BT: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """Add beta · KL(policy ‖ base) per token when a KL term was computed."""
    if x.kl_BT is None or x.beta == 0:
        return per_token_BT
    return per_token_BT + x.beta * x.kl_BT
