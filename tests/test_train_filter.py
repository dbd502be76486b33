"""Leaving zero-advantage groups out of the forward does not change the optimizer step.

`filter_zero_advantage` skips the forward and backward of groups whose advantages are all zero,
but the loss stays normalized over every sequence of the step (`LossTotals`), and a step with
nothing left to forward still lets AdamW step on zero gradients. So a filtered run takes the
steps an unfiltered one (and TRL's GRPOTrainer) would: checked here over three real optimizer
steps on a tiny model, against the whole batch forwarded.

The optimizer here is SGD with momentum and weight decay, not the Learner's AdamW: the claim
is about the step's gradient, and AdamW divides each gradient by its own running scale, which
turns the 1e-7 rounding of a differently summed loss into full-size steps on parameters whose
gradient is ~0. Momentum and decay still make a zero-gradient step move the weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from transformers import get_scheduler

from vfkit.train.config import TrainerArgs
from vfkit.train.policy import load_policy
from vfkit.train.samples import Sample
from vfkit.train.update import LossTotals, policy_update

# No gradient clip: it would clip both of this test's batches to one norm, hiding the old
# filter's rescaling (asserted below). The sampler logprobs are made up (0), so the ratio mask
# is opened wide: every completion token trains.
ARGS = TrainerArgs(learning_rate=0.5, micro_batch_size=2, max_tokens=6, weight_decay=0.01,
                   max_grad_norm=0.0, rollouts_per_example=2, batch_size=4,
                   mask_ratio_low=0.0, mask_ratio_high=1e30)


def _sample(seed: int, advantage: float) -> Sample:
    gen = torch.Generator().manual_seed(seed)
    prompt, completion = torch.randint(3, 200, (5,), generator=gen).tolist(), \
        torch.randint(3, 200, (1 + seed % 5,), generator=gen).tolist()
    return Sample(input_ids=prompt + completion, loss_mask=[0] * 5 + [1] * len(completion),
                  sampling_logprobs=[0.0] * (5 + len(completion)), advantage=advantage)


def _group(seed: int, advantages: tuple[float, float]) -> list[Sample]:
    return [_sample(seed * 10 + i, a) for i, a in enumerate(advantages)]


# (groups with signal, groups all zero): half the groups have signal, then all, then none
STEPS = [
    (_group(1, (1.0, -1.0)), _group(2, (0.0, 0.0))),
    (_group(3, (0.7, -0.7)) + _group(4, (-1.0, 1.0)), []),
    ([], _group(5, (0.0, 0.0)) + _group(6, (0.0, 0.0))),
]


class Run:
    """A LoRA policy, an optimizer and a schedule (fp32, CPU)."""

    def __init__(self, model_path: Path) -> None:
        torch.manual_seed(0)
        model, tokenizer = load_policy(model_path, ARGS)
        with torch.no_grad():  # B = 0 at init: give A a gradient from the first step
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        self.accelerator = Accelerator(cpu=True)
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad],
                                    lr=ARGS.learning_rate, momentum=0.9,
                                    weight_decay=ARGS.weight_decay)
        self.scheduler = get_scheduler("constant", optimizer)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.pad_id = tokenizer.pad_token_id or tokenizer.eos_token_id

    def step(self, samples: list[Sample], totals: LossTotals | None = None) -> None:
        policy_update(self.model, self.optimizer, self.scheduler, self.accelerator, samples,
                      ARGS, self.pad_id, totals=totals)

    def lora(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in self.model.parameters()
                          if p.requires_grad])


@pytest.mark.slow
def test_filtered_steps_equal_the_whole_batchs(tiny_model_path: Path) -> None:
    whole, filtered, unnormalized = (Run(tiny_model_path) for _ in range(3))
    before = whole.lora()
    for i, (signal, zero) in enumerate(STEPS):
        whole.step(signal + zero)
        filtered.step(signal, LossTotals.of(signal, zero))
        unnormalized.step(signal)  # averaged over the kept groups alone: the old filter
        after = whole.lora()
        assert not torch.equal(after, before)  # every step moved the adapter, step 3 included
        torch.testing.assert_close(filtered.lora(), after, rtol=0, atol=1e-6)
        before = after
        if i == 1:  # the old filter scaled each step by its share of groups with signal
            assert (unnormalized.lora() - after).abs().max() > 1e-4

