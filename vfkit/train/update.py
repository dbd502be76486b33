"""A batch's optimizer steps: micro-batches, loss, backward, clip, step (`num_iterations` times).

Gradients accumulate over all micro-batches of a pass; each loss is normalized by the whole
step's token/sequence counts, so the split into micro-batches does not change the update.
Passes after the first reuse the batch (PPO's epochs): their clip is measured from the policy
that began the batch, so the batch's later updates stay in its trust region.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from vfkit.train.batching import MicroBatch, StepPrompts, micro_batches, step_prompts
from vfkit.train.config import TrainerArgs
from vfkit.train.losses import LOSSES, LossInputs
from vfkit.train.policy import (
    StepPrefix,
    base_logprobs,
    first_position,
    step_prefix,
    token_logprobs,
)
from vfkit.train.samples import Sample
from vfkit.train.vision import ImageInputs


@dataclass
class TokenStats:
    """Running sums over the step's loss tokens, turned into per-step metrics."""

    tokens: float = 0.0
    sums: dict[str, float] = field(default_factory=dict)
    ratio_min: float = math.inf
    ratio_max: float = -math.inf

    def add(self, name: str, values_BT: torch.Tensor, mask_BT: torch.Tensor) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + float((values_BT * mask_BT).sum())

    def summary(self) -> dict[str, float]:
        n = max(self.tokens, 1.0)
        out = {k: v / n for k, v in self.sums.items()}
        if self.tokens:
            out["ratio/min"], out["ratio/max"] = self.ratio_min, self.ratio_max
        return out


def micro_batch_loss(
    model: torch.nn.Module, mb: MicroBatch, args: TrainerArgs, totals: tuple[int, int],
    stats: TokenStats, prompts: StepPrefix | None = None,
    proximal_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss of one micro-batch (normalized for the whole step), and the policy's detached
    logprobs of its tokens; records token stats.
    `prompts`: the step's prompts, run once (else a group's prompt runs once here, if shared).
    `proximal_BT`: in passes after the first, the logprobs of the policy that began the batch
    (what the first pass returned): the clip is measured from them, and the sampler's
    importance weight and the ratio mask stay the first pass's."""
    loss_mask_BT = mb.loss_mask_BT[:, 1:]
    first = first_position(loss_mask_BT)  # logits before the first trained token: not needed
    prefix = mb.shared_prefix if shares_prompts(args, model) else 0
    cache = prompts.cache_for(mb.step_group_B) if prompts is not None else None
    logprobs_BT, entropy_BT = token_logprobs(
        model, mb.input_ids_BT, mb.attention_mask_BT, args.temperature, with_entropy=True,
        vision=mb.vision, first=first, prefix=prefix, group_B=mb.group_B, cache=cache,
    )
    before_BT = logprobs_BT.detach() if proximal_BT is None else proximal_BT
    sampling_BT = mb.sampling_logprobs_BT[:, 1:]
    log_ratio_BT = (before_BT - sampling_BT) * loss_mask_BT
    ratio_BT = torch.exp(log_ratio_BT)
    # tokens the sampler and trainer disagree on too much carry no usable gradient: mask them
    in_range_BT = (ratio_BT >= args.mask_ratio_low) & (ratio_BT <= args.mask_ratio_high)
    mask_BT = loss_mask_BT * in_range_BT
    kl_BT = None
    if args.beta > 0:  # k3 estimator of KL(policy ‖ base), Schulman 2020
        log_base_ratio_BT = base_logprobs(
            model, mb.input_ids_BT, mb.attention_mask_BT, args.temperature, mb.vision, first,
            prefix, mb.group_B,
        ) - logprobs_BT
        kl_BT = torch.exp(log_base_ratio_BT) - log_base_ratio_BT - 1
    total_tokens, total_sequences = totals
    # decoupled PPO: the clip is measured from the policy that began the batch (in the first
    # pass, the trainer's own detached logprobs), the sampler's lag by the importance weight
    decoupled = args.ratio_against == "trainer"
    out = LOSSES[args.loss_type](
        LossInputs(
            logprobs_BT=logprobs_BT,
            old_logprobs_BT=before_BT if decoupled else sampling_BT,
            advantages_B=mb.advantages_B, mask_BT=mask_BT, epsilon_low=args.epsilon,
            epsilon_high=args.clip_high, total_tokens=total_tokens,
            total_sequences=total_sequences, max_tokens=args.max_tokens, kl_BT=kl_BT,
            beta=args.beta, weight_BT=ratio_BT if decoupled else None,
        )
    )
    if loss_mask_BT.sum() > 0:
        on = loss_mask_BT.bool()
        stats.tokens += float(loss_mask_BT.sum())
        stats.ratio_min = min(stats.ratio_min, float(ratio_BT[on].min()))
        stats.ratio_max = max(stats.ratio_max, float(ratio_BT[on].max()))
        stats.add("ratio/mean", ratio_BT, loss_mask_BT)
        stats.add("clip/frac", out.clipped_BT.float(), mask_BT)
        stats.add("mask/ratio_frac", (~in_range_BT).float(), loss_mask_BT)
        # k3 estimate of KL(sampler ‖ trainer) on the sampler's tokens: r - 1 - log r
        stats.add("kl/mismatch", ratio_BT - 1 - log_ratio_BT, loss_mask_BT)
        stats.add("entropy", entropy_BT, loss_mask_BT)
        if kl_BT is not None:
            stats.add("kl/base", kl_BT.detach(), loss_mask_BT)
    return out.loss, logprobs_BT.detach()


def shares_prompts(args: TrainerArgs, model: torch.nn.Module) -> bool:
    """Whether a group's prompt runs once per micro-batch (`shared_prompt_forward`): not under
    gradient checkpointing, whose recomputed forward would extend the shared keys again, and
    not under DDP, whose every forward is a collective (buffer broadcast): ranks whose
    micro-batches share differently would make different numbers of forwards and hang."""
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    return args.shared_prompt_forward and not args.gradient_checkpointing and not ddp


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    accelerator,
    samples: list[Sample],
    args: TrainerArgs,
    pad_id: int,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    images: ImageInputs | None = None,
    before_micro_batch: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """Train on `samples` (this rank's share of micro-batches): `num_iterations` optimizer
    steps, then one step of the LR schedule (it counts batches, as `max_steps` does).

    `images`: a vision-language policy's image processor (None for text models).
    `before_micro_batch` runs before each forward (the learner fits its CPU threads there).
    Metrics are the first pass's (comparable whatever `num_iterations` is), plus the later
    passes' clipped share (`clip/frac_reuse`).
    """
    once = shares_prompts(args, model) and images is None
    prompts = step_prompts(samples) if once else None
    batch = Pass(
        micro_batches(
            samples, args.micro_batch_size, pad_id,
            rank=accelerator.process_index, world=accelerator.num_processes,
            device=accelerator.device, images=images, prompts=prompts,
        ),
        prompts, (sum(s.num_loss_tokens for s in samples), len(samples)),
    )
    model.train()
    lr = scheduler.get_last_lr()[0]
    stats, later = TokenStats(), TokenStats()
    loss, grad_norm, proximal = train_pass(
        model, optimizer, accelerator, batch, args, stats, autocast, before_micro_batch)
    for _ in range(args.num_iterations - 1):
        train_pass(model, optimizer, accelerator, batch, args, later, autocast,
                   before_micro_batch, proximal)
    with warnings.catch_warnings():  # torch warns when a filtered-out step skipped optimizer.step
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step()
    metrics = {"loss": loss, "grad_norm": grad_norm, "lr": lr, **stats.summary()}
    if args.num_iterations > 1 and later.tokens:
        metrics["clip/frac_reuse"] = later.summary()["clip/frac"]
    return metrics


@dataclass
class Pass:
    """What every pass over a batch reads: its micro-batches, its prompts (run once a pass,
    when shared) and the whole batch's loss-token and sequence counts."""

    batches: list[MicroBatch]
    prompts: StepPrompts | None
    totals: tuple[int, int]


def train_pass(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, accelerator, batch: Pass,
    args: TrainerArgs, stats: TokenStats,
    autocast: Callable[[], contextlib.AbstractContextManager],
    before_micro_batch: Callable[[], None], proximal: list[torch.Tensor] | None = None,
) -> tuple[float, float, list[torch.Tensor]]:
    """One pass over the batch and one optimizer step: (loss, gradient norm, each micro-batch's
    detached logprobs). `proximal`: the first pass's logprobs, in the passes after it."""
    loss_sum, prefix, logprobs = 0.0, None, []
    if batch.prompts is not None and batch.batches:  # each prompt once for the whole pass
        before_micro_batch()
        with autocast():
            prefix = step_prefix(model, batch.prompts.ids_GP.to(accelerator.device))
    for i, mb in enumerate(batch.batches):
        last = i == len(batch.batches) - 1
        before_micro_batch()
        sync = contextlib.nullcontext() if last else accelerator.no_sync(model)
        with sync:
            with autocast():  # forward in bf16 when asked; backward outside autocast
                loss, logprobs_BT = micro_batch_loss(
                    model, mb, args, batch.totals, stats, prefix,
                    proximal[i] if proximal is not None else None)
            # each rank's loss is its share of the step's sum; DDP averages gradients over ranks
            accelerator.backward(loss * accelerator.num_processes)
        loss_sum += float(loss.detach())
        logprobs.append(logprobs_BT)
    if prefix is not None:  # the prompts' share of the gradient, summed over micro-batches
        prefix.backward()
    grad_norm = 0.0
    if batch.batches:  # a step whose groups were all filtered changes nothing
        max_norm = args.max_grad_norm or math.inf
        params = [p for p in model.parameters() if p.requires_grad]
        grad_norm = float(accelerator.clip_grad_norm_(params, max_norm))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, logprobs
